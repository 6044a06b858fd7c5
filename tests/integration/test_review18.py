"""Faults found in review: a real bookie in the test's process on the test ZooKeeper."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from tests.broker_testing import cluster  # noqa: F401
from tests.integration.test_ops17 import in_process_bookie
from tests.zk_testing import failing_deletes, wait_for


async def _registered_readonly(store: Any, bookie_id: str, expected: bool, within_s: float) -> bool:
    """Is ``bookie_id`` registered under bookies/readonly, once it is as ``expected`` or ``within_s`` passed?"""
    from zk import BookieRegistry

    reg = BookieRegistry(store)
    deadline = time.monotonic() + within_s
    while True:
        readonly = bookie_id in await asyncio.to_thread(reg.readonly)
        available = bookie_id in await asyncio.to_thread(reg.available)
        if (readonly, available) == (expected, not expected) or time.monotonic() >= deadline:
            return readonly
        await asyncio.sleep(0.1)


def test_a_bookie_made_read_only_and_writable_within_a_registration_ends_registered_writable(
    zk_server: Any, zk_root: str, tmp_path: Path
) -> None:
    """`bookie readonly ID` then `--off` (or a disk check's flip) while the first registration's ZooKeeper write
    was under way: the second saw the first's registration not yet recorded and started none, and the first then
    recorded read-only: a writable bookie listed under bookies/readonly for good (no new ledger chose it)."""
    from zk import MetadataStore

    async def run() -> tuple[bool, bool]:
        async with in_process_bookie(zk_server, zk_root, tmp_path / "b") as b:
            store = MetadataStore.connect(zk_server.connect_string, root=zk_root)
            try:
                real = b.registry.register
                entered, go = threading.Event(), threading.Event()

                def held(bookie_id: str, info: Any, readonly: bool = False) -> None:
                    if (
                        readonly
                    ):  # the read-only registration's write, held until the bookie is writable again
                        entered.set()
                        go.wait(10)
                    real(bookie_id, info, readonly)

                b.registry.register = held
                assert b.set_admin_readonly(True) == ""
                assert await asyncio.to_thread(entered.wait, 10)
                assert b.set_admin_readonly(False) == ""
                go.set()
                return bool(b.core.readonly), await _registered_readonly(store, b.config.id, False, 3)
            finally:
                store.close()

    core_readonly, registered_readonly = asyncio.run(run())
    assert not core_readonly
    assert not registered_readonly, "writable, but registered under bookies/readonly"


def _refused_with_no_cookie(zk_server: Any, zk_root: str, tmp_path: Path, match: str, **config: Any) -> None:
    """A new bookie of ``config`` refuses to start (StartRefusal matching ``match``) and writes no cookie."""
    import pytest

    from bookie import main as bookie_main
    from zk import MetadataStore, read_zk_cookie

    cfg = bookie_main.BookieConfig(
        zk=zk_server.connect_string, zk_root=zk_root, data_dir=tmp_path / "b", init_cluster=True, **config
    )

    async def run() -> None:
        b = bookie_main.Bookie(cfg)
        try:
            await b.start()
        finally:
            await b.stop()

    with pytest.raises(bookie_main.StartRefusal, match=match):
        asyncio.run(run())
    store = MetadataStore.connect(zk_server.connect_string, root=zk_root)
    try:
        assert read_zk_cookie(store, cfg.id) is None
    finally:
        store.close()


def test_a_new_bookie_given_one_port_for_both_listeners_writes_no_cookie(
    zk_server: Any, zk_root: str, tmp_path: Path
) -> None:
    """`bookie serve --port P --http-port P` (a typo): each port was tried free on its own, so the cookie was
    written, then the second listener's bind failed; the cookie named the id for good (the start with --port
    corrected was refused as a cookie mismatch). Refused before, nothing written."""
    from ledgerstore.cluster import free_port

    port = free_port()
    _refused_with_no_cookie(
        zk_server,
        zk_root,
        tmp_path,
        f"port {port} given to both --port and --http-port",
        port=port,
        http_port=port,
    )


def test_a_broker_given_one_port_for_both_listeners_registers_nothing(bookies: Any, tmp_path: Path) -> None:
    """`broker serve --port P --http-port P`: each port was tried free on its own, so the broker registered, then
    its second listener's bind failed and it exited with its registration left for its session's length."""
    from ledgerstore.cluster import BrokerProcess, free_port
    from zk import MetadataStore, layout

    bookies.start()
    port = free_port()
    bp = BrokerProcess(
        zk=bookies.zk, zk_root=bookies.root, port=port, http_port=port, log_path=tmp_path / "broker.log"
    ).start(wait=False)
    assert bp.wait_exit(30) == 1
    log = bp.log_tail(5)
    assert f"refusing to start: port {port} given to both --port and --http-port" in log, log
    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        assert store.stat(layout.broker_path(bp.id)) is None
    finally:
        store.close()


def test_a_namespace_delete_whose_end_could_not_free_its_znode_does_not_refuse_every_later_one(
    cluster: Any,  # noqa: F811
    monkeypatch: Any,
) -> None:
    """A namespace delete holds the ephemeral deleting/<namespace> znode (be66aed) and removes it as it ends;
    with ZooKeeper failing that removal (a connection lost, the session kept), the znode stayed with the broker's
    session, and every later delete of the namespace was 409 '… is being deleted; try again' for as long as the
    broker ran. This broker's own znode of no delete running here is a leftover, taken over (the background
    removal's first try put off past the test's end)."""
    from tests.integration.test_namespace_delete_races import _left, _namespace_on_a_broker, _status
    from topic_broker import admin

    monkeypatch.setattr(admin, "DELETING_RETRY_S", (60.0, 60.0))
    with _namespace_on_a_broker(cluster) as (service, _run, port, ns):
        store = service.meta.store
        topic = f"/admin/v2/persistent/public/{ns}/t"
        assert _status(port, "PUT", topic)[0] == 204
        with failing_deletes(store, "deleting/") as failed:
            status, _body = _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")
            assert failed and status != 204  # (409 non empty, then its znode's removal failed)
            assert store.exists(failed[0]), "its znode stayed"
            assert _status(port, "DELETE", topic)[0] == 204
            status, body = _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")
            assert status == 204, (status, body)
            assert _left(store, ns) == [] and not store.exists(failed[0])


def test_a_namespace_delete_whose_end_could_not_free_its_znode_frees_it_once_zookeeper_answers(
    cluster: Any,  # noqa: F811
) -> None:
    """The same failed removal of deleting/<namespace> (ZooKeeper failing twice, the session kept): ae63992 let
    only a delete run again on that broker take the znode over, so a delete sent to any other broker was 409
    '… is being deleted; try again' for as long as this one ran. The znode is now removed in the background once
    ZooKeeper answers, with no delete run again."""
    from tests.integration.test_namespace_delete_races import _namespace_on_a_broker, _status

    with _namespace_on_a_broker(cluster) as (service, _run, port, ns):
        store = service.meta.store
        assert _status(port, "PUT", f"/admin/v2/persistent/public/{ns}/t")[0] == 204
        with failing_deletes(store, "deleting/", times=2) as failed:
            status, _body = _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")
            assert failed and status != 204  # (409 non empty, then its znode's removal failed)
            wait_for(lambda: not store.exists(failed[0]), 5, 0.1)
            assert len(failed) == 2, failed  # the first background try failed too
            assert not store.exists(failed[0]), "its znode stayed with no delete run again"


def test_a_bookie_whose_read_only_registration_gave_up_registers_so_once_zookeeper_is_back(
    zk_server: Any, zk_root: str, tmp_path: Path, monkeypatch: Any
) -> None:
    """A bookie going read-only (a full disk, an operator) while ZooKeeper is unreachable past REGISTER_RETRY_S:
    its registration gave up, and nothing tried again once ZooKeeper was back (the registry re-registers the
    state last written, writable): a read-only bookie listed under bookies/available, chosen for new ledgers,
    until its next change. The disk check now registers it again while what is registered is not what it is."""
    from bookie import main as bookie_main
    from zk import MetadataStore
    from zk.errors import MetadataConnectionError

    monkeypatch.setattr(bookie_main, "REGISTER_RETRY_S", 0.3)

    async def run() -> tuple[bool, bool]:
        async with in_process_bookie(zk_server, zk_root, tmp_path / "b") as b:
            store = MetadataStore.connect(zk_server.connect_string, root=zk_root)
            try:
                real = b.registry.register
                away = [True]

                def unreachable(bookie_id: str, info: Any, readonly: bool = False) -> None:
                    if away[0]:
                        raise MetadataConnectionError("ZooKeeper unreachable (made by the test)")
                    real(bookie_id, info, readonly)

                b.registry.register = unreachable
                assert b.set_admin_readonly(True) == ""
                await asyncio.sleep(1.0)  # its registration's retries given up
                away[0] = False  # ZooKeeper back
                return bool(b.core.readonly), await _registered_readonly(store, b.config.id, True, 4)
            finally:
                store.close()

    core_readonly, registered_readonly = asyncio.run(run())
    assert core_readonly
    assert registered_readonly, "read-only, but registered under bookies/available"


def test_a_new_bookie_whose_address_is_not_this_hosts_writes_no_cookie(
    zk_server: Any, zk_root: str, tmp_path: Path
) -> None:
    """`bookie serve --advertised-address 10.255.255.1` (a typo, an address this host does not have): the ports
    gate counted only a port in use, so the cookie (id 10.255.255.1:PORT) was written and the listener's bind then
    failed ('Cannot assign requested address'); the start with the address corrected, a new id, was refused as a
    cookie mismatch on the same directories. Refused before, nothing written."""
    from ledgerstore.cluster import free_port

    port = free_port()
    _refused_with_no_cookie(
        zk_server,
        zk_root,
        tmp_path,
        f"cannot listen on 10.255.255.1: port {port} \\(--port\\): ",
        port=port,
        http_port=free_port(),
        advertised_address="10.255.255.1",
    )


def test_a_broker_whose_listen_address_is_not_this_hosts_registers_nothing(
    bookies: Any, tmp_path: Path
) -> None:
    """`broker serve --listen-address 10.255.255.1` (an address this host does not have): it registered, then
    its listener's bind failed ('cannot assign requested address'). Refused before it registers, exit 1."""
    from ledgerstore.cluster import BrokerProcess, free_port

    bookies.start()
    bp = BrokerProcess(
        zk=bookies.zk,
        zk_root=bookies.root,
        port=free_port(),
        http_port=free_port(),
        log_path=tmp_path / "broker.log",
        extra_args=["--listen-address", "10.255.255.1"],
    ).start(wait=False)
    assert bp.wait_exit(30) == 1
    log = bp.log_tail(5)
    assert f"refusing to start: cannot listen on 10.255.255.1: port {bp.port} (--port): " in log, log


def test_a_new_bookie_whose_address_does_not_resolve_writes_no_cookie(
    zk_server: Any, zk_root: str, tmp_path: Path
) -> None:
    """`bookie serve --advertised-address bookie-7.invalid` (a host name that does not resolve): the ports gate
    skipped a port whose address it could not look up, so the cookie was written and the listener then failed on
    the name. Refused before, nothing written."""
    from ledgerstore.cluster import free_port

    port = free_port()
    _refused_with_no_cookie(
        zk_server,
        zk_root,
        tmp_path,
        f"cannot listen on bookie-7.invalid: port {port} \\(--port\\): ",
        port=port,
        http_port=free_port(),
        advertised_address="bookie-7.invalid",
    )
