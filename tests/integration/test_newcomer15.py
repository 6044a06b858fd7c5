"""The operator's commands after a bookie is lost for good (docs/operations.md, AutoRecovery), against real
ZooKeeper and bookie processes."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import BookieFactory


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
