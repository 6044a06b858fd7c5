"""`ledgerstore cluster up|status|down|stop|start` as a user runs it: real ZooKeeper, bookie and AutoRecovery
processes; the state file as this version writes it and as older versions wrote it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerstore.cluster import _pid_alive as _alive
from ledgerstore.cluster import free_port


def _ls(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerstore.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _ports(state: Path, bookie_http: int) -> list[str]:
    return [
        "--state-dir", str(state),
        "--bookies", "2",
        "--brokers", "0",
        "--no-autorecovery",
        "--zk-port", str(free_port()),
        "--base-port", str(free_port()),
        "--bookie-http-port", str(bookie_http),
    ]  # fmt: skip


def test_cluster_up_refuses_a_port_in_use_and_names_it_then_starts_on_free_ones(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    with socket.socket() as holder:  # another program on the port the second bookie's HTTP would take
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        r = _ls("cluster", "up", *_ports(state, taken - 1))
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"{taken} (bookie-1's admin HTTP port (--bookie-http-port))" in r.stderr + r.stdout
        assert not (state / "cluster.json").exists()  # nothing was started
    http = free_port()
    r = _ls("cluster", "up", *_ports(state, http))
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        st = json.loads((state / "cluster.json").read_text())
        assert [b["http_port"] for b in st["bookies"]] == [http, http + 1]
        s = _ls("cluster", "status", "--state-dir", str(state), "--json")
        assert s.returncode == 0, s.stderr
        rows = json.loads(s.stdout)["bookies"]
        assert [(b["alive"], b["health"]["status"], b["http_port"]) for b in rows] == [
            (True, "ok", http),
            (True, "ok", http + 1),
        ]
    finally:
        d = _ls("cluster", "down", "--state-dir", str(state))
        assert d.returncode == 0, d.stdout + d.stderr


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """2 bookies and a standalone AutoRecovery process; `down` at the end unless the test did it."""
    state = tmp_path / "cluster"
    request.addfinalizer(
        lambda: (state / "cluster.json").exists() and _ls("cluster", "down", "--state-dir", str(state))
    )
    ar = ("--autorecovery-process", "--autorecovery-port", str(free_port()))
    r = _ls("cluster", "up", *_ports(state, free_port()), *ar)
    assert r.returncode == 0, r.stdout + r.stderr
    return state


def test_zk_and_zk_root_other_than_the_recorded_ones_are_refused_not_ignored(cluster: Path) -> None:
    """`cluster stop bookie-0 --zk OTHER` stopped the state file's bookie whatever --zk said: a --zk or --zk-root
    given to a command on a recorded cluster must name its own (a check for scripts that pass them everywhere)."""
    st = json.loads((cluster / "cluster.json").read_text())
    at = ("--state-dir", str(cluster))
    pid = st["bookies"][0]["pid"]
    for command in (
        ("stop", "bookie-0", "--zk", "127.0.0.1:1"),
        ("restart", "bookie-0", "--kill", "--zk-root", "/elsewhere"),
        ("start", "autorecovery", "--zk=127.0.0.1:1", "--zk-root", st["zk_root"]),
        ("status", "--zk-root", "/elsewhere"),
        ("down", "--zk", "127.0.0.1:1"),
    ):
        r = _ls("cluster", *command, *at)
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        assert (
            f"acts on the cluster {cluster}/cluster.json records (ZooKeeper {st['zk']}, root" in r.stderr
        ), r.stderr
        assert _alive(pid), command
    # the recorded ones, given, are accepted (before the subcommand too, as every global option)
    r = _ls("--zk", st["zk"], "cluster", "status", "--zk-root", st["zk_root"] + "/", *at)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _ls("cluster", "stop", "bookie-0", "--zk", st["zk"], *at)
    assert r.returncode == 0 and not _alive(pid), r.stdout + r.stderr
