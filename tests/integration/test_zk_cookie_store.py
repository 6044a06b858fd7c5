"""Cookies and the cluster instance id against a real ZooKeeper."""

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.zk_testing import TEST_ZK_AUTH, ZkTarget
from zk.client import MetadataStore
from zk.cookies import (
    Cookie,
    CookieVerdict,
    NoClusterError,
    delete_local_cookie,
    delete_zk_cookie,
    ensure_cookies,
    existing_instance_id,
    instance_id,
    read_local_cookie,
    read_zk_cookie,
    write_zk_cookie,
)
from zk.errors import CookieMismatchError, MetadataExistsError, MetadataNotFoundError, MetadataVersionError

BID = "127.0.0.1:3181"


def test_instance_id_created_once_concurrently(zk_connect: ZkTarget) -> None:
    stores = [MetadataStore.connect(*zk_connect) for _ in range(4)]
    try:
        with pytest.raises(MetadataNotFoundError):
            instance_id(stores[0], create=False)
        got: list[str] = []
        lock = threading.Lock()
        barrier = threading.Barrier(8)

        def worker(i: int) -> None:
            barrier.wait()
            iid = instance_id(stores[i % 4])
            with lock:
                got.append(iid)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(got) == 8 and len(set(got)) == 1
        assert instance_id(stores[0], create=False) == got[0]
    finally:
        for s in stores:
            s.close()


def test_zk_cookie_crud(zk_store: MetadataStore) -> None:
    c = Cookie(BID, "/j", ("/l",), "inst")
    assert read_zk_cookie(zk_store, BID) is None
    assert write_zk_cookie(zk_store, c).version == 0
    with pytest.raises(MetadataExistsError):
        write_zk_cookie(zk_store, c)
    c2 = Cookie(BID, "/j", ("/l", "/l2"), "inst")
    assert write_zk_cookie(zk_store, c2, version=0).version == 1
    with pytest.raises(MetadataVersionError):
        write_zk_cookie(zk_store, c, version=0)
    v = read_zk_cookie(zk_store, BID)
    assert v is not None and v.value == c2 and v.version == 1
    assert delete_zk_cookie(zk_store, BID) and not delete_zk_cookie(zk_store, BID)


def test_ensure_cookies_lifecycle(zk_store: MetadataStore, tmp_path: Path) -> None:
    journal, l1, l2 = (str(tmp_path / n) for n in ("journal", "l1", "l2"))
    expected = Cookie(BID, journal, (l1, l2), instance_id(zk_store))
    assert ensure_cookies(zk_store, expected) is CookieVerdict.NEW
    for d in (journal, l1, l2):
        assert read_local_cookie(d) == expected
    zk_cookie = read_zk_cookie(zk_store, BID)
    assert zk_cookie is not None and zk_cookie.value == expected
    assert ensure_cookies(zk_store, expected) is CookieVerdict.OK  # restart

    # a wiped ledger directory is refused with the operator hint
    delete_local_cookie(l2)
    with pytest.raises(CookieMismatchError, match="wiped or swapped") as ei:
        ensure_cookies(zk_store, expected)
    assert f"ledgerstore bookie format --delete-cookie --bookie-id {BID}" in str(ei.value)
    assert read_local_cookie(l2) is None  # nothing was (re)written

    # the operator formats the bookie on purpose: then it starts as new
    for d in (journal, l1):
        delete_local_cookie(d)
    delete_zk_cookie(zk_store, BID)
    assert ensure_cookies(zk_store, expected) is CookieVerdict.NEW

    # pointing the bookie at another cluster (a different root = different instance id) is refused
    other = MetadataStore.connect(zk_store.connect_string, zk_store.root + "-other")
    try:
        with pytest.raises(CookieMismatchError, match="no cookie in ZooKeeper"):
            ensure_cookies(other, Cookie(BID, journal, (l1, l2), instance_id(other)))
    finally:
        other.delete("", recursive=True)
        other.close()

    # a changed directory list is refused
    with pytest.raises(CookieMismatchError, match="added, removed or moved"):
        ensure_cookies(zk_store, Cookie(BID, journal, (l1,), expected.instance_id))


def test_ensure_cookies_race_same_id_different_dirs(zk_store: MetadataStore, tmp_path: Path) -> None:
    iid = instance_id(zk_store)
    a = Cookie(BID, str(tmp_path / "a"), (str(tmp_path / "a"),), iid)
    b = Cookie(BID, str(tmp_path / "b"), (str(tmp_path / "b"),), iid)
    assert ensure_cookies(zk_store, a) is CookieVerdict.NEW
    with pytest.raises(CookieMismatchError):
        ensure_cookies(zk_store, b)  # b's dirs are empty, but ZooKeeper knows the bookie id


def test_a_new_cookie_ends_the_ids_decommission_mark(zk_store: MetadataStore) -> None:
    from zk.underreplication import UnderReplicationManager

    manager = UnderReplicationManager(zk_store)
    manager.start_decommission(BID)
    c = Cookie(BID, "/j", ("/l",), "inst")
    write_zk_cookie(zk_store, c)
    assert manager.decommissioning() == set()
    manager.start_decommission(BID)
    # an update is no new bookie
    write_zk_cookie(zk_store, Cookie(BID, "/j", ("/l", "/l2"), "inst"), version=0)
    assert manager.decommissioning() == {BID}


def test_a_mistyped_nested_zk_root_beside_a_cluster_is_refused_naming_it(zk_connect: ZkTarget) -> None:
    """Clusters under nested roots (``/ledgerstore/prod``): a --zk-root mistyped in its last step
    (``/ledgerstore/prdo``) was taken for a new deployment, only the top-level roots being looked at, so a
    broker, AutoRecovery or ledger command ran against an empty cluster there; it is refused like a mistyped
    top-level root, naming the sibling that holds a cluster, and the typo's znodes are removed again."""
    zk, root = zk_connect
    with MetadataStore.connect(zk, f"{root}/prod") as prod:
        instance_id(prod)
    with MetadataStore.connect(zk, f"{root}/prdo") as typo, pytest.raises(NoClusterError) as refused:
        existing_instance_id(typo)
    assert f"no cluster under --zk-root {root}/prdo" in str(refused.value), refused.value
    assert f"{root}/prod" in str(refused.value).split("clusters there:")[1], refused.value
    with MetadataStore.connect(zk, root) as top:
        assert top.children("") == ["prod"]
    # a typo in an earlier step (/ledgerstroe/prod): the cluster is a grandchild of another top-level znode
    with MetadataStore.connect(zk, f"{root}x/prod") as typo, pytest.raises(NoClusterError) as refused:
        existing_instance_id(typo)
    assert f"{root}/prod" in str(refused.value).split("clusters there:")[1], refused.value
    with MetadataStore.connect(zk, "/") as top:  # its parent, which the connection made too, went with it
        leftover = top.exists(f"{root}x".lstrip("/"))
        top.delete(f"{root}x".lstrip("/"), recursive=True, missing_ok=True)
    assert not leftover, f"{root}x left behind"


def test_a_command_refused_on_a_mistyped_nested_root_leaves_zookeeper_as_it_found_it(
    zk_connect: ZkTarget,
) -> None:
    """`ledger list --zk-root /ledgerstroe/prod` (a real command, a real ZooKeeper): the connection makes the
    root and its missing ancestors; refused, the command removes all it made, and none of what was there before
    (an empty znode above, the cluster beside)."""
    zk, root = zk_connect
    with MetadataStore.connect(zk, f"{root}/prod") as prod:
        instance_id(prod)
    with MetadataStore.connect(zk, "/") as top:
        top.create(f"{root}y".lstrip("/"), {})  # an empty znode someone made: found, so kept
    try:
        # and the commands that read or write the cluster's metadata directly (they said all was well there, and
        # `autorecovery disable` wrote its switch where no auditor reads it)
        verbs = (("ledger", "list"), ("cluster", "info"), ("autorecovery", "disable"), ("bookie", "racks"))
        for typo, verb in zip(
            (f"{root}x/prod", f"{root}y/prod", f"{root}/prod/ledgers-x/x", f"{root}/prdo"), verbs, strict=True
        ):
            r = subprocess.run(
                [sys.executable, "-m", "ledgerstore.cli", *verb, "--zk", zk, "--zk-root", typo],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.returncode == 4 and f"no cluster under --zk-root {typo}" in r.stderr, (verb, r.stderr)
        with MetadataStore.connect(zk, "/") as top:
            assert not top.exists(f"{root}x".lstrip("/"))
            assert top.exists(f"{root}y".lstrip("/")) and top.children(f"{root}y".lstrip("/")) == []
            assert "ledgers-x" not in top.children(f"{root}/prod".lstrip("/"))
            assert top.children(root.lstrip("/")) == ["prod"]
            assert top.exists(f"{root}/prod/INSTANCEID".lstrip("/"))
    finally:
        with MetadataStore.connect(zk, "/") as top:
            for path in (f"{root}x", f"{root}y"):
                top.delete(path.lstrip("/"), recursive=True, missing_ok=True)


def test_a_command_refused_on_a_mistyped_root_that_was_there_deletes_nothing_under_it(
    zk_connect: ZkTarget,
) -> None:
    """`ledger list --zk-root` a root that another process made (empty znodes below it, as a cluster being set up
    or another tool has) and that looks like a typo of a cluster's: refused, and none of those znodes deleted,
    since this command did not make them."""
    zk, root = zk_connect
    with MetadataStore.connect(zk, f"{root}/prod") as prod:
        instance_id(prod)
    typo = f"{root}/prd"
    with MetadataStore.connect(zk, "/") as top:
        top.ensure(f"{typo}/locks/lease".lstrip("/"))  # bodiless, as a directory znode
    try:
        r = subprocess.run(
            [sys.executable, "-m", "ledgerstore.cli", "ledger", "list", "--zk", zk, "--zk-root", typo],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 4 and f"no cluster under --zk-root {typo}" in r.stderr, r.stderr
        with MetadataStore.connect(zk, "/") as top:
            assert top.exists(f"{typo}/locks/lease".lstrip("/")), "another process's znode deleted"
    finally:
        with MetadataStore.connect(zk, "/") as top:
            top.delete(typo.lstrip("/"), recursive=True, missing_ok=True)


def test_another_cluster_beside_one_is_no_typo_and_starts(zk_connect: ZkTarget) -> None:
    """One ZooKeeper serving several clusters (a root per team, per test run): a root that is no typo of a
    cluster's (``looks_mistyped``) is a new deployment's, whose first bookies create it, not a refusal; a
    broker or a ledger command started there first sees no cluster yet and says so, as on an empty ZooKeeper."""
    zk, root = zk_connect
    with MetadataStore.connect(zk, f"{root}/team-1") as one:
        instance_id(one)
    for other in (f"{root}/team-2", f"{root}/payments"):
        with MetadataStore.connect(zk, other) as store:
            assert existing_instance_id(store) is None
    with MetadataStore.connect(zk, f"{root}/team-l") as typo, pytest.raises(NoClusterError):
        existing_instance_id(typo)


def test_a_mistyped_nested_root_is_refused_beside_a_tree_it_cannot_read(zk_connect: ZkTarget) -> None:
    """A ZooKeeper holding another deployment's secured tree (digest ACLs of other credentials): the look for a
    cluster a root is a typo of listed the top-level znodes' children in one batch, which that tree's NoAuth
    failed as a whole, so ``/ledgerstroe/prod`` beside ``/ledgerstore/prod`` was taken for a new cluster; the
    readable ones are still looked at."""
    zk, root = zk_connect
    with MetadataStore.connect(zk, f"{root}/prod", auth=False) as prod:
        instance_id(prod)
    secured = f"{root}-secured"
    with MetadataStore.connect(zk, secured, auth=TEST_ZK_AUTH) as s:
        s.create("x", {"v": 1})
    try:
        with (
            MetadataStore.connect(zk, f"{root}x/prod", auth=False) as typo,
            pytest.raises(NoClusterError) as refused,
        ):
            existing_instance_id(typo)
        assert f"{root}/prod" in str(refused.value).split("clusters there:")[1], refused.value
    finally:
        with MetadataStore.connect(zk, "/", auth=TEST_ZK_AUTH) as top:
            for path in (secured, f"{root}x"):
                top.delete(path.lstrip("/"), recursive=True, missing_ok=True)
