"""ZooKeeper digest ACLs: credentials from the environment or the caller, secured znodes, refused strangers and
wrong passwords, and the migration of an open tree (``zk.acl.secure_tree``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.security import OPEN_ACL_UNSAFE

from tests.zk_testing import (
    TEST_SESSION_TIMEOUT_S,
    TEST_ZK_AUTH,
    ZkTarget,
    expire_session,
    zk_auth,  # noqa: F401 - the fixture
)
from zk import layout
from zk.acl import (
    ENV_AUTH,
    ENV_AUTH_FILE,
    ZkAuth,
    cli_secure,
    resolve_auth,
    secure_tree,
    stranger_probe,
)
from zk.client import MetadataStore
from zk.errors import MetadataAuthError

AUTH = ZkAuth("ops", "s3cret:with:colons")


def _connect(t: ZkTarget, **kw: object) -> MetadataStore:
    return MetadataStore.connect(t.connect_string, t.root, session_timeout_s=TEST_SESSION_TIMEOUT_S, **kw)  # type: ignore[arg-type]


def _walk(store: MetadataStore, rel: str = "") -> list[str]:
    out = [rel]
    for name in store.children(rel):
        out.extend(_walk(store, f"{rel}/{name}" if rel else name))
    return out


def _is_digest_only(store: MetadataStore, rel: str, auth: ZkAuth) -> bool:
    acl, _ = store.get_acl(rel)
    return [(a.perms, a.id.scheme, a.id.id) for a in acl] == [(31, "digest", auth.digest_id)]


# --- credentials --------------------------------------------------------------------------------------------


def test_credentials_come_from_the_argument_then_the_environment_then_a_file(tmp_path: Path) -> None:
    f = tmp_path / "zk-auth"
    f.write_text("fileuser:filepass\n")
    assert resolve_auth(None, {}) is None
    assert resolve_auth(None, {ENV_AUTH: "u:p:q"}) == ZkAuth("u", "p:q")
    assert resolve_auth(None, {ENV_AUTH_FILE: str(f)}) == ZkAuth("fileuser", "filepass")
    assert resolve_auth(None, {ENV_AUTH: "u:p", ENV_AUTH_FILE: str(f)}) == ZkAuth("u", "p")
    assert resolve_auth(("a", "b"), {ENV_AUTH: "u:p"}) == ZkAuth("a", "b")
    assert resolve_auth("a:b", {}) == ZkAuth("a", "b")
    assert resolve_auth(False, {ENV_AUTH: "u:p"}) is None
    assert "filepass" not in repr(resolve_auth(None, {ENV_AUTH_FILE: str(f)}))
    for bad in ("nocolon", ":p", "u:", "a b:c"):
        with pytest.raises(MetadataAuthError):
            resolve_auth(None, {ENV_AUTH: bad})
    with pytest.raises(MetadataAuthError, match="cannot read"):
        resolve_auth(None, {ENV_AUTH_FILE: str(tmp_path / "missing")})


def test_without_credentials_znodes_stay_open(zk_connect: ZkTarget) -> None:
    with _connect(zk_connect, auth=False) as s:
        s.create("a/b", {"x": 1})
        assert s.auth is None and s.acl_mode == "open"
        for rel in ("", "a", "a/b"):
            assert s.get_acl(rel)[0] == OPEN_ACL_UNSAFE


def test_a_fresh_root_made_with_credentials_is_secured_parents_included(zk_server, zk_root: str) -> None:
    deep = ZkTarget(zk_server.connect_string, f"{zk_root}/nested/root")
    with _connect(deep, auth=AUTH) as s:
        assert s.acl_mode == "secured"
        s.create(layout.ledger_path(12345), {"x": 1})
        s.create("bookies/available/b1", {"x": 1}, ephemeral=True)
        s.create("seq/n-", {"x": 1}, sequence=True)
        s.ensure("a/b/c")
        s.update("idgen", lambda v: {**v, "next_id": 2}, default={"next_id": 1})
        paths = _walk(s)
        assert len(paths) > 12
        assert all(_is_digest_only(s, rel, AUTH) for rel in paths), paths
    with MetadataStore.connect(zk_server.connect_string, zk_root, auth=AUTH) as top:
        assert _is_digest_only(top, "", AUTH)  # the intermediate parents too
        assert _is_digest_only(top, "nested", AUTH)


@pytest.mark.usefixtures("zk_auth")
def test_credentials_from_the_environment_reach_every_store(zk_connect: ZkTarget) -> None:
    with _connect(zk_connect) as s:  # no argument: LEDGERSTORE_ZK_AUTH
        assert s.auth == TEST_ZK_AUTH and s.acl_mode == "secured"
        s.create("x", {"v": 1})
        assert _is_digest_only(s, "x", TEST_ZK_AUTH)


# --- strangers and wrong passwords --------------------------------------------------------------------------


def test_a_process_without_or_with_wrong_credentials_fails_at_connect_not_later(zk_connect: ZkTarget) -> None:
    with _connect(zk_connect, auth=AUTH) as s:
        s.create("ledgers/x", {"v": 1})
    for auth, what in (
        (False, "no credentials"),
        (ZkAuth("ops", "wrong"), "wrong password"),
        (("eve", "x"), "refused user .eve."),
    ):
        t0 = time.monotonic()
        with pytest.raises(MetadataAuthError, match=what) as ei:
            _connect(zk_connect, auth=auth, timeout_s=5)
        assert time.monotonic() - t0 < 5
        assert ei.value.code == "METADATA_AUTH" and not ei.value.retriable
        assert ei.value.path == zk_connect.root
    # the same refusal on a single operation is translated too (a stranger's store on the parent of the root)
    with MetadataStore.connect(zk_connect.connect_string, "/", auth=False) as outsider:
        with pytest.raises(MetadataAuthError):
            outsider.get(zk_connect.root.lstrip("/") + "/ledgers/x")
        with pytest.raises(MetadataAuthError):
            outsider.create(zk_connect.root.lstrip("/") + "/evil", {"v": 1})


def test_a_secured_store_keeps_its_rights_across_a_session_expiry(zk_connect: ZkTarget) -> None:
    with _connect(zk_connect, auth=AUTH) as s:
        s.create("a", {"v": 1})
        expire_session(s)
        assert s.get("a").value["v"] == 1  # kazoo re-sent the credentials on the new session
        s.create("b", {"v": 2}, ephemeral=True)
        assert _is_digest_only(s, "b", AUTH)


# --- migrating an open tree ---------------------------------------------------------------------------------


def test_securing_an_open_tree_while_its_processes_move_to_credentials(
    zk_connect: ZkTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = _connect(zk_connect, auth=False)  # a process not yet restarted
    new = _connect(zk_connect, auth=AUTH)  # a process restarted with credentials
    try:
        old.create(layout.ledger_path(1), {"v": 1})
        old.create("bookies/available/b1", {"v": 1}, ephemeral=True)
        assert new.acl_mode == "migrating"  # the root is still open
        # step 1: new znodes are digest + world, so processes without credentials still read them
        new.create(layout.ledger_path(2), {"v": 2})
        assert old.get(layout.ledger_path(2)).value["v"] == 2
        acl, _ = new.get_acl(layout.ledger_path(2))
        assert {a.id.scheme for a in acl} == {"digest", "world"}
        before = _walk(new)
        # a dry run counts and changes nothing
        dry = secure_tree(new, dry_run=True)
        assert dry.changed == len(before) and dry.already == 0
        assert stranger_probe(zk_connect.connect_string, zk_connect.root).readable == ("",)
        # step 2: secure (root first), once processes noticed, nothing of theirs stays open
        rep = secure_tree(new, settle_s=0)
        assert rep.visited == len(before) and rep.changed == len(before)
        assert all(_is_digest_only(new, rel, AUTH) for rel in _walk(new))
        assert secure_tree(new, settle_s=0).changed == 0  # idempotent
        # a running store in migrating mode notices the secured root (within ACL_REFRESH_S; here at once)
        monkeypatch.setattr("zk.client.ACL_REFRESH_S", 0.0)
        new.create("later", {"v": 3})
        assert new.acl_mode == "secured" and _is_digest_only(new, "later", AUTH)
        # step 3: a stranger reads nothing, the process left without credentials included
        probe = stranger_probe(zk_connect.connect_string, zk_connect.root, ["", *new.children("")])
        assert probe.secured and len(probe.checked) > 3
        with pytest.raises(MetadataAuthError):
            old.get(layout.ledger_path(1))
    finally:
        old.close()
        new.close()


def test_secure_tree_needs_credentials_and_the_second_pass_catches_late_znodes(zk_connect: ZkTarget) -> None:
    with _connect(zk_connect, auth=False) as open_store:
        open_store.create("x", {"v": 1})
        with pytest.raises(MetadataAuthError, match="needs credentials"):
            secure_tree(open_store)
    with _connect(zk_connect, auth=AUTH) as s:
        rep = secure_tree(s, settle_s=0.2)
        assert rep.passes == 2 and rep.changed == 2  # root and x, in the first pass


def test_a_stranger_kazoo_client_is_refused_everything(zk_connect: ZkTarget) -> None:
    with _connect(zk_connect, auth=AUTH) as s:
        s.create("ledgers/x", {"v": 1})
    raw = KazooClient(hosts=zk_connect.connect_string)
    raw.start(timeout=10)
    try:
        from kazoo.exceptions import NoAuthError

        r = zk_connect.root
        for op in (
            lambda: raw.get(r),
            lambda: raw.get_children(r),
            lambda: raw.get(f"{r}/ledgers/x"),
            lambda: raw.set(f"{r}/ledgers/x", b"{}"),
            lambda: raw.delete(f"{r}/ledgers/x"),
            lambda: raw.create(f"{r}/ledgers/y", b"{}"),
            lambda: raw.create(f"{r}/new", b"{}"),
            lambda: raw.set_acls(f"{r}/ledgers/x", OPEN_ACL_UNSAFE),
            lambda: raw.get_acls(f"{r}/ledgers/x"),
        ):
            with pytest.raises(NoAuthError):
                op()
    finally:
        raw.stop()
        raw.close()


def test_the_zk_secure_command_dry_run_then_secure_then_verify(zk_connect: ZkTarget) -> None:
    with _connect(zk_connect, auth=False) as s:
        s.create(layout.ledger_path(7), {"v": 1})
        s.create("cookies/b1", {"v": 1})
    human, data = cli_secure(*zk_connect, auth="ops:pw", dry_run=True)
    assert data["dry_run"] and data["changed"] == data["visited"] and data["visited"] == 9
    assert "would change 9" in human and data["stranger_readable"] == ["", "cookies", "ledgers"]
    human, data = cli_secure(*zk_connect, auth="ops:pw", settle_s=0)
    assert data["changed"] == 9 and data["stranger_readable"] == [] and "reads nothing" in human
    _, data = cli_secure(*zk_connect, auth="ops:pw", settle_s=0)
    assert data["changed"] == 0 and data["already"] == 9
    with pytest.raises(MetadataAuthError, match="no credentials"):
        cli_secure(*zk_connect, auth=False, settle_s=0)
