"""`ledgerstore cluster up|status|down` as a user runs it: real ZooKeeper and bookie processes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

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
