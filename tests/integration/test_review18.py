"""Faults found in review: a real bookie in the test's process on the test ZooKeeper."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from tests.integration.test_ops17 import in_process_bookie


def test_a_bookie_made_read_only_and_writable_within_a_registration_ends_registered_writable(
    zk_server: Any, zk_root: str, tmp_path: Path
) -> None:
    """`bookie readonly ID` then `--off` (or a disk check's flip) while the first registration's ZooKeeper write
    was under way: the second saw the first's registration not yet recorded and started none, and the first then
    recorded read-only: a writable bookie listed under bookies/readonly for good (no new ledger chose it)."""
    from zk import BookieRegistry, MetadataStore

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
                reg, bid = BookieRegistry(store), b.config.id
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    if bid in await asyncio.to_thread(reg.available) and bid not in await asyncio.to_thread(
                        reg.readonly
                    ):
                        break
                    await asyncio.sleep(0.1)
                return bool(b.core.readonly), bid in await asyncio.to_thread(reg.readonly)
            finally:
                store.close()

    core_readonly, registered_readonly = asyncio.run(run())
    assert not core_readonly
    assert not registered_readonly, "writable, but registered under bookies/readonly"


def test_a_new_bookie_given_one_port_for_both_listeners_writes_no_cookie(
    zk_server: Any, zk_root: str, tmp_path: Path
) -> None:
    """`bookie serve --port P --http-port P` (a typo): each port was tried free on its own, so the cookie was
    written, then the second listener's bind failed; the cookie named the id for good (the start with --port
    corrected was refused as a cookie mismatch). Refused before, nothing written."""
    import pytest

    from bookie import main as bookie_main
    from ledgerstore.cluster import free_port
    from zk import MetadataStore, read_zk_cookie

    port = free_port()
    cfg = bookie_main.BookieConfig(
        zk=zk_server.connect_string,
        zk_root=zk_root,
        data_dir=tmp_path / "b",
        port=port,
        http_port=port,
        init_cluster=True,
    )

    async def run() -> None:
        b = bookie_main.Bookie(cfg)
        try:
            await b.start()
        finally:
            await b.stop()

    with pytest.raises(bookie_main.StartRefusal, match=f"port {port} given to both --port and --http-port"):
        asyncio.run(run())
    store = MetadataStore.connect(zk_server.connect_string, root=zk_root)
    try:
        assert read_zk_cookie(store, cfg.id) is None
    finally:
        store.close()


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
