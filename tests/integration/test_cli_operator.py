"""The operator's bad day with the cluster commands, against real ZooKeeper and bookie processes: pieces of a
`cluster up` cluster stopped under it get one clear line and the right exit status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from ledgerstore import cli
from ledgerstore.cluster import free_port
from tests.integration.test_cluster_cli import _ports
from zk import launcher


def _ls(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerstore.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_cluster_status_says_once_that_zookeeper_is_unreachable_and_exits_unavailable(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    r = _ls("cluster", "up", *_ports(state, free_port()))
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        zk = json.loads((state / "cluster.json").read_text())["zk"]
        pid = launcher.status(state).pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # there but not answering
        try:
            s = _ls("cluster", "status", "--state-dir", str(state))
        finally:
            os.kill(pid, signal.SIGCONT)
        assert s.returncode == cli.EXIT_UNAVAILABLE, s.stdout + s.stderr
        assert s.stdout.count("ZooKeeper") == 1, s.stdout
        assert f"ZooKeeper {zk} UNREACHABLE: no session within" in s.stdout, s.stdout
        assert "bookie" in s.stdout  # the processes are still listed
        assert launcher.cli_stop(state)  # gone: the line says how to start it again
        s = _ls("cluster", "status", "--state-dir", str(state), "--json")
        assert s.returncode == cli.EXIT_UNAVAILABLE, s.stdout + s.stderr
        out = json.loads(s.stdout)
        assert out["zk_reachable"] is False, out
        assert f"`ledgerstore zk start --state-dir {state} --port {zk.rpartition(':')[2]}`" in out["zk_error"]
        s = _ls("cluster", "status", "--state-dir", str(state))
        assert s.stdout.splitlines()[0].startswith(f"ZooKeeper {zk} UNREACHABLE: not running"), s.stdout
        launcher.cli_start(state, int(zk.rpartition(":")[2]))
        s = _ls("cluster", "status", "--state-dir", str(state), "--json")
        assert s.returncode == 0 and json.loads(s.stdout)["zk_reachable"] is True, s.stdout + s.stderr
    finally:
        d = _ls("cluster", "down", "--state-dir", str(state))
        assert d.returncode == 0, d.stdout + d.stderr
