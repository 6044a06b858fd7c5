"""The launcher against a real ZooKeeper process (private servers: these tests stop and pause them)."""

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.zk_testing import make_test_server
from zk.client import MetadataStore
from zk.errors import MetadataConnectionError
from zk.launcher import (
    ZooKeeperLaunchError,
    cli_start,
    cli_stop,
    four_letter,
    free_port,
    server_mode,
    status,
)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_start_ready_stop_cleans_up() -> None:
    server = make_test_server()
    with server:
        assert server.connect_string == f"127.0.0.1:{server.port}"
        assert server.is_ready()
        assert four_letter("127.0.0.1", server.port, "ruok") == "imok"
        assert "Mode: standalone" in server.four_letter("srvr")
        cfg = server.config_path.read_text()
        assert "clientPortAddress=127.0.0.1" in cfg and "admin.enableServer=false" in cfg
        assert "tickTime=500" in cfg and "forceSync" not in cfg  # durable by default
        assert "maxClientCnxns=200" in cfg  # bounded per address, not 0 (unlimited)
        data_dir, pid = server.data_dir, server.pid
        assert pid is not None and server.log_path.exists()
    assert not server.running
    assert not data_dir.exists()  # temp dir removed
    assert not _listening(server.port)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_force_sync_off_is_opt_in(tmp_path: Path) -> None:
    server = make_test_server(data_dir=tmp_path, force_sync=False)
    with server:
        assert "forceSync=no" in server.config_path.read_text()
    assert tmp_path.exists()  # a given data dir is kept


def test_restart_keeps_data_and_port_pause_resume(tmp_path: Path) -> None:
    server = make_test_server(data_dir=tmp_path / "zk")
    with server:
        port = server.port
        with MetadataStore.connect(server.connect_string, "/r") as s:
            s.create("kept", {"v": 1})
        server.restart()
        assert server.port == port and server.is_ready()
        with MetadataStore.connect(server.connect_string, "/r") as s:
            assert s.get("kept").value["v"] == 1
        server.pause()
        assert server_mode("127.0.0.1", port, timeout=0.5) is None
        server.resume()
        assert server_mode("127.0.0.1", port, timeout=2) == "standalone"
        server.kill()
        assert not server.running
        server.start()
        with MetadataStore.connect(server.connect_string, "/r") as s:
            assert s.get("kept").value["v"] == 1  # survived kill -9 (forceSync on)


def test_stop_while_paused(tmp_path: Path) -> None:
    server = make_test_server(data_dir=tmp_path)
    server.start()
    server.pause()
    t0 = time.monotonic()
    server.stop(timeout_s=5)
    assert not server.running and time.monotonic() - t0 < 5


def test_startup_failure_reports_log_tail(tmp_path: Path) -> None:
    server = make_test_server(
        data_dir=tmp_path, classpath=str(tmp_path / "missing.jar"), startup_timeout_s=10
    )
    t0 = time.monotonic()
    with pytest.raises(ZooKeeperLaunchError) as ei:
        server.start()
    assert time.monotonic() - t0 < 10
    assert "QuorumPeerMain" in str(ei.value)  # java's own complaint, from the log tail


def test_port_in_use_is_refused(tmp_path: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        with pytest.raises(ZooKeeperLaunchError, match="already in use"):
            make_test_server(data_dir=tmp_path, port=port).start()


def test_daemon_start_status_stop(tmp_path: Path) -> None:
    state = tmp_path / "state"
    port = free_port()
    assert not status(state).running
    cs = cli_start(state, port)
    try:
        assert cs == f"127.0.0.1:{port}"
        st = status(state)
        assert st.running and st.mode == "standalone" and st.port == port and st.pid
        assert (state / "zookeeper.pid").read_text().strip() == str(st.pid)
        assert cli_start(state, port) == cs  # idempotent
        with pytest.raises(ZooKeeperLaunchError, match="already runs"):
            cli_start(state, free_port())
        with MetadataStore.connect(cs, "/d") as s:
            s.create("x", {"v": 1})
    finally:
        assert cli_stop(state) is True
    assert not status(state).running and not (state / "zookeeper.pid").exists()
    assert not _listening(port)
    assert cli_stop(state) is False
    # stale pid file (process gone) is ignored; data survives a daemon restart
    (state / "zookeeper.pid").write_text("999999\n")
    cs = cli_start(state, port)
    try:
        with MetadataStore.connect(cs, "/d") as s:
            assert s.get("x").value["v"] == 1
    finally:
        assert cli_stop(state)


def test_daemon_stop_kills_a_stuck_server(tmp_path: Path) -> None:
    from zk.launcher import stop_daemon

    state = tmp_path / "state"
    cli_start(state, free_port())
    pid = status(state).pid
    assert pid is not None
    os.killpg(pid, signal.SIGSTOP)  # stop_daemon must SIGCONT/SIGTERM, or SIGKILL
    assert stop_daemon(state, timeout_s=3)
    assert not status(state).running


def test_connections_per_address_are_bounded() -> None:
    with make_test_server(max_client_cnxns=3) as server:
        stores = [MetadataStore.connect(server.connect_string, "/t", timeout_s=5) for _ in range(3)]
        try:
            with pytest.raises(MetadataConnectionError):
                MetadataStore.connect(server.connect_string, "/t", timeout_s=2)
            stores.pop().close()  # a slot frees up: the next one gets in
            stores.append(MetadataStore.connect(server.connect_string, "/t", timeout_s=5))
        finally:
            for s in stores:
                s.close()
        assert "Too many connections from /127.0.0.1" in server.log_path.read_text()
