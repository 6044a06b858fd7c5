"""The operator's commands after a bookie is lost for good (docs/operations.md, AutoRecovery), against real
ZooKeeper and bookie processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from ledgerstore.cluster import _pid_alive, free_port
from tests.conftest import BookieFactory
from tests.integration.test_cluster_cli import _ls, _ports
from tests.zk_testing import wait_for


def test_decommission_of_a_stopped_bookie_does_not_ask_to_stop_it(bookies: BookieFactory) -> None:
    live, dead = bookies.start_many(2)
    dead.stop()  # SIGTERM: its registration goes, its cookie stays (cluster info: DOWN)
    cmd = [
        sys.executable, "-m", "ledgerstore.cli", "bookie", "decommission", dead.id, "--settle-s", "0",
        "--zk", bookies.zk, "--zk-root", bookies.root,
    ]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cookie deleted (it was not running)" in r.stdout, r.stdout
    assert "stop the bookie now" not in r.stdout
    assert live.alive


def test_cluster_down_names_a_piece_that_was_dead_already(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    r = _ls("cluster", "up", *_ports(state, free_port()))
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        dead = json.loads((state / "cluster.json").read_text())["bookies"][1]
        os.kill(dead["pid"], signal.SIGKILL)
        assert wait_for(lambda: not _pid_alive(dead["pid"]), timeout_s=30)
    finally:
        r = _ls("cluster", "down", "--state-dir", str(state))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 brokers and 1 bookie stopped" in r.stdout, r.stdout
    assert f"(not running already: bookie {dead['id']})" in r.stdout, r.stdout
