"""`cluster status` on a piece that is down: the pid cluster.json recorded runs nothing any more (or, reused, some
other process), so neither the text nor --json gives it as the piece's pid; both keep it as the last one."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerstore.cluster import _pid_alive, _status


def _state(tmp_path: Path, dead: int, live: int) -> None:
    row = {"http_port": 1, "data_dir": str(tmp_path / "b")}
    st = {
        "zk": "127.0.0.1:1",
        "zk_root": "/ledgerstore",
        "bookies": [
            {**row, "id": "127.0.0.1:3181", "pid": dead},
            {**row, "id": "127.0.0.1:3182", "pid": live},
        ],
        "brokers": [
            {
                "id": "broker-0",
                "pid": dead,
                "http_port": 1,
                "service_url": "pulsar://x",
                "web_service_url": "http://x",
            }
        ],
        "autorecovery": {"pid": dead, "metrics_port": 1},
    }
    (tmp_path / "cluster.json").write_text(json.dumps(st))


def _args(tmp_path: Path, as_json: bool) -> argparse.Namespace:
    return argparse.Namespace(
        action="status",
        state_dir=tmp_path,
        json=as_json,
        zk="127.0.0.1:1",
        zk_given=False,
        zk_root="/ledgerstore",
        zk_root_given=False,
    )


def test_a_down_piece_shows_no_pid_but_the_last_one_in_text_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dead, live = proc.pid, subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not _pid_alive(dead)
        _state(tmp_path, dead, live.pid)
        _status(_args(tmp_path, False), tmp_path)
        text = capsys.readouterr().out
        assert f"bookie {'127.0.0.1:3181':<22} pid -       DOWN (was pid {dead})" in text, text
        assert f"bookie {'127.0.0.1:3182':<22} pid {live.pid:<7} up" in text, text
        assert f"broker {'broker-0':<22} pid -       DOWN (was pid {dead})" in text, text
        assert f"autorecovery pid -       DOWN (was pid {dead})" in text, text
        assert f"pid {dead} " not in text

        _status(_args(tmp_path, True), tmp_path)
        out = json.loads(capsys.readouterr().out)
        down = [*out["bookies"][:1], *out["brokers"], out["autorecovery"]]
        assert [(r["alive"], r["pid"], r["last_pid"]) for r in down] == [(False, None, dead)] * 3
        up = out["bookies"][1]
        assert (up["alive"], up["pid"], "last_pid" in up) == (True, live.pid, False)
    finally:
        live.kill()
        live.wait()
