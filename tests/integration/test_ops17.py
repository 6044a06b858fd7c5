"""An operator's signals and mistakes against real ZooKeeper, bookie and broker processes (docs/operations.md)."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from ledgerstore.cluster import BrokerProcess, free_port
from tests.broker_testing import Brokers
from tests.conftest import BookieFactory
from tests.integration.test_cluster_cli import _ls, _ports


@contextlib.asynccontextmanager
async def in_process_bookie(zk_server: Any, zk_root: str, data_dir: Path) -> AsyncIterator[Any]:
    """A real bookie started in the test's process (its ZooKeeper the test's), stopped after."""
    from bookie import main as bookie_main

    cfg = bookie_main.BookieConfig(
        zk=zk_server.connect_string,
        zk_root=zk_root,
        data_dir=data_dir,
        port=free_port(),
        http_port=free_port(),
        init_cluster=True,
    )
    b = bookie_main.Bookie(cfg)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


@contextlib.contextmanager
def _sighup_default() -> Iterator[None]:
    """SIGHUP at its default in this process while a server starts, so the server sees it so: a server started
    where SIGHUP is ignored (a test run under nohup) keeps it ignored, as it should, and would not stop on it."""
    old = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, old)


def test_sighup_stops_a_bookie_cleanly(bookies: BookieFactory) -> None:
    """A bookie whose terminal closed stops as on SIGTERM: unregistered at once, journal closed, exit 0. It died
    on the signal before (Python's default), still registered until its session expired, with no log line."""
    from zk import BookieRegistry, MetadataStore

    with _sighup_default():
        bp = bookies.start()
    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        assert bp.id in BookieRegistry(store).available()
        assert bp.proc is not None
        bp.proc.send_signal(signal.SIGHUP)
        assert bp.wait_exit(30) == 0, bp.log_tail(20)
        assert bp.id not in BookieRegistry(store).available(), "unregistered at once, as on SIGTERM"
        log = bp.log_tail(10)
        assert "SIGHUP" in log and "stopped" in log, log
    finally:
        store.close()


def test_sighup_stops_a_broker_cleanly(cluster: Brokers) -> None:
    with _sighup_default():
        broker = cluster.start()
    assert broker.proc is not None
    broker.proc.send_signal(signal.SIGHUP)
    assert broker.wait_exit(30) == 0, broker.log_tail(20)
    log = broker.log_tail(20)
    assert "SIGHUP" in log and "shutting down" in log and "stopped in" in log, log


def test_a_new_bookie_on_a_port_in_use_writes_no_cookie(bookies: BookieFactory) -> None:
    """A typo'd --port that another process listens on: refused in one line naming the port and flag, with no
    cookie written. The bind failed after the cookie before: `cluster info` then showed the id DOWN for good, and
    the start with the port corrected was refused as a cookie mismatch of the same data directory."""
    from zk import MetadataStore
    from zk.cookies import read_zk_cookie

    squatter = socket.create_server(("127.0.0.1", free_port()))
    busy = squatter.getsockname()[1]
    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        bookies.start()  # the cluster exists: the refusal is not a new cluster's
        data_dir = bookies.tmp / "typo"
        bp = bookies.start(data_dir=data_dir, port=busy, wait=False)
        assert bp.wait_exit(30) == 1
        log = bp.log_tail(5)
        assert f"refusing to start: port {busy} (--port) on 127.0.0.1 in use by another process" in log, log
        assert "Traceback" not in log
        assert read_zk_cookie(store, bp.id) is None
        fixed = bookies.start(data_dir=data_dir)  # the same directory, a free port
        assert fixed.alive
    finally:
        squatter.close()
        store.close()


def test_a_second_broker_on_a_running_brokers_port_leaves_its_registration(broker: BrokerProcess) -> None:
    """A second `broker serve` with the running broker's --port (its id): refused before registering. It
    registered first before, deleting the running broker's brokers/<id> ("a stale registration") for its own,
    then failed to bind and exited: once its session expired `cluster info` said `brokers: 0`, the broker serving
    on unregistered."""
    from zk import MetadataStore, layout

    store = MetadataStore.connect(broker.zk, root=broker.zk_root)
    try:
        before = store.stat(layout.broker_path(broker.id))
        assert before is not None and before.ephemeral
        second = BrokerProcess(
            zk=broker.zk,
            zk_root=broker.zk_root,
            port=broker.port,
            http_port=free_port(),
            log_path=broker.log_path.with_name("second.log") if broker.log_path else None,
        ).start(wait=False)
        assert second.wait_exit(30) == 1
        log = second.log_tail(5)
        assert (
            f"refusing to start: port {broker.port} (--port) on 0.0.0.0 in use by another process" in log
        ), log
        after = store.stat(layout.broker_path(broker.id))
        assert after is not None and after.ephemeral_owner == before.ephemeral_owner, "the running broker's"
        assert broker.alive
    finally:
        store.close()


def test_an_operator_makes_a_bookie_read_only_and_writable_again(bookies: BookieFactory) -> None:
    """`bookie readonly ID` (PUT /api/v1/bookie/state/readonly, BookKeeper's): registered read-only, adds
    refused, kept over disk checks (which made a bookie writable again whenever its disk had room); --off
    undoes it. There was no way to do it but filling the disk."""
    from zk import BookieRegistry, MetadataStore

    bp = bookies.start()

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "ledgerstore.cli", *argv, "--zk", bookies.zk, "--zk-root", bookies.root]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        reg = BookieRegistry(store)
        r = cli("bookie", "readonly", bp.id)
        assert r.returncode == 0 and f"bookie {bp.id}: read-only" in r.stdout, r.stdout + r.stderr
        time.sleep(2.5)  # disk checks (one a second): the disk has room, the operator's word stands
        assert bp.id in reg.readonly() and bp.id not in reg.available()
        r = cli("ledger", "write", "-E", "1", "-W", "1", "-A", "1", "-n", "1")
        assert r.returncode == 5 and "NOT_ENOUGH_BOOKIES" in r.stderr, r.stdout + r.stderr
        assert f"(read-only: ['{bp.id}']" in r.stderr, r.stderr  # it said "read-only: []"
        r = cli("bookie", "readonly", bp.id, "--off")
        assert r.returncode == 0 and f"bookie {bp.id}: writable" in r.stdout, r.stdout + r.stderr
        deadline = time.monotonic() + 10
        while bp.id not in reg.available() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert bp.id in reg.available()
        r = cli("ledger", "write", "-E", "1", "-W", "1", "-A", "1", "-n", "1")
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        store.close()


def test_cluster_up_on_a_running_cluster_says_which_ports_it_runs_with(tmp_path: Path) -> None:
    """`cluster up` again on a running state directory with other ports is a no-op (exit 0) that said only
    "cluster already running … ZooKeeper …": a script then used the ports it had asked for, where nothing ran."""
    state = tmp_path / "cluster"
    first = _ports(state, free_port())
    r = _ls("cluster", "up", *first)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        again = _ls("cluster", "up", *first)
        assert again.returncode == 0 and "not as asked" not in again.stderr, again.stderr
        base = first[first.index("--base-port") + 1]
        other = [*first[: first.index("--base-port")], "--base-port", str(free_port()), *first[-2:]]
        r = _ls("cluster", "up", *other, "--bookies", "3")
        assert r.returncode == 0 and "cluster already running" in r.stdout, r.stdout + r.stderr
        assert f"(not as asked: it runs with --bookies 2, --base-port {base}, as " in r.stderr, r.stderr
    finally:
        _ls("cluster", "down", "--state-dir", str(state))


def test_a_bookies_uptime_survives_its_clock_stepped_back(
    zk_server, zk_root: str, tmp_path: Path, monkeypatch
) -> None:
    """/api/v1/info's uptime_s was wall-clock time since the start: a clock stepped back an hour (NTP, an
    operator's `date -s`) made it -3600. A real bookie (in this process, its ZooKeeper real), the clock stepped."""
    import asyncio

    from bookie import main as bookie_main

    async def run() -> float:
        async with in_process_bookie(zk_server, zk_root, tmp_path / "b") as b:
            try:
                wall = time.time
                monkeypatch.setattr(bookie_main.time, "time", lambda: wall() - 3600)
                return float(b.info()["uptime_s"])
            finally:
                monkeypatch.undo()

    assert 0 <= asyncio.run(run()) < 600
