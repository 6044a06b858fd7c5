"""A seed replays bit for bit: same trace in one process, and across processes with different string-hash
seeds (no set-of-strings iteration order leaks into a schedule)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from .__main__ import main
from .schedule import run

ROOT = Path(__file__).resolve().parents[2]


def _digest(seed: int) -> str:
    out = run(seed, trace=True)
    assert out.trace is not None
    return hashlib.sha256("\n".join(out.trace).encode()).hexdigest()


def test_same_seed_same_trace_in_process() -> None:
    assert _digest(7) == _digest(7)
    assert _digest(7) != _digest(8)


def test_same_seed_same_trace_across_hash_seeds() -> None:
    def digests(hash_seed: str) -> str:
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        r = subprocess.run(
            [sys.executable, "-m", "tests.sim", "--seeds", "4", "--start", "30", "--digest"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    a, b = digests("1"), digests("2")
    assert a.count("digest=") == 4 and a == b


def test_cli_reports_the_seed_and_the_command_that_reproduces_a_failure(capsys) -> None:
    assert main(["--seeds", "5", "--profile", "out-of-order", "--mutation", "ack-out-of-order"]) == 1
    out = capsys.readouterr().out
    assert "seed=0 " in out
    assert "reproduce: python -m tests.sim --seed 0 --profile out-of-order --mutation ack-out-of-order" in out
