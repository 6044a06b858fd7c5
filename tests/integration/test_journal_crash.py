"""Crash test of the bookie journal: a writer process is killed with SIGKILL at random moments; every record
it acknowledged (done(None)) must replay afterwards, with its exact bytes."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bookie.journal import Journal, RecordType

REPO = Path(__file__).resolve().parents[2]

# The child: replays (and so cuts any torn tail left by the previous kill), starts, then appends forever in
# bursts of random size. Each acknowledged entry id is printed (after done(None)) on its own line; now and then
# it checkpoints the current mark synchronously and prints "C" first, so ids printed before a "C" line may
# legitimately be gone from the replay, and ids printed after the last "C" must all be there.
CHILD = r"""
import asyncio, os, random, sys
from pathlib import Path
from bookie.journal import Journal, RecordType

def payload(i):
    return i.to_bytes(8, "big") * (i % 3000 + 1)

async def main():
    d, base, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rnd = random.Random(seed)
    j = Journal(d, segment_bytes=512 * 1024, max_wait_ms=1)
    for _ in j.replay():
        pass
    await j.start()
    acked = 0

    def checkpoint():
        os.write(1, b"C\n")
        j.checkpoint(j.mark)

    def make(i):
        def cb(exc):
            nonlocal acked
            if exc is None:
                os.write(1, b"%d\n" % i)
                acked += 1
                if acked % 3000 == 0:
                    # after the whole batch's callbacks: j.mark covers exactly the ids printed so far
                    asyncio.get_running_loop().call_soon(checkpoint)
            else:
                os.write(2, b"failed %d: %r\n" % (i, exc))
        return cb

    i = base
    reused = 0
    os.write(1, b"S\n")
    while True:
        if j.stats["segments_reused"] > reused:  # segments written over old ones: their tails are old records
            reused = int(j.stats["segments_reused"])
            os.write(1, b"U\n")
        for _ in range(rnd.randint(1, 300)):
            j.append(RecordType.ENTRY, 5, i, payload(i), make(i))
            i += 1
        if j.pending_records > 3000:
            await j.flush()
        await asyncio.sleep(rnd.choice([0, 0, 0, 0.0005]))

asyncio.run(main())
"""


def payload(i: int) -> bytes:
    return i.to_bytes(8, "big") * (i % 3000 + 1)


def run_and_kill(directory: Path, base: int, seed: int, delay: float) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), str(base), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    started = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode().strip()
            if line == "S":
                started.set()
            lines.append(line)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    if not started.wait(30):
        proc.kill()
        raise AssertionError(f"writer did not start: {proc.stderr.read().decode()}")
    time.sleep(delay)
    assert proc.poll() is None, f"writer died by itself: {proc.stderr.read().decode()}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    t.join(30)
    err = proc.stderr.read().decode()
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, err)
    assert "failed" not in err, err
    return lines


def check_replay(directory: Path, lines: list[str], seed: int) -> int:
    """Replay a copy of ``directory`` (the original keeps its torn tail for the next writer to cut) and check
    every id acknowledged after the last checkpoint is there with its bytes. Returns how many were checked."""
    last_c = max((k for k, x in enumerate(lines) if x == "C"), default=-1)
    must_have = [int(x) for x in lines[last_c + 1 :] if x.isdigit()]
    copy = directory.parent / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(directory, copy)
    replayed = list(Journal(copy).replay())
    ids = [r.entry_id for r in replayed]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), f"replay out of order (seed {seed})"
    missing = set(must_have) - set(ids)
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]} (seed {seed})"
    for r in replayed:
        assert r.type == RecordType.ENTRY and r.ledger_id == 5
        assert r.data == payload(r.entry_id), f"entry {r.entry_id} has wrong bytes (seed {seed})"
    return len(must_have)


def test_kill_9_never_loses_acknowledged_records(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    directory = tmp_path / "journal"
    all_lines: list[str] = []
    checked = 0
    for rnd_no in range(6):
        lines = run_and_kill(directory, rnd_no * 10_000_000, seed + rnd_no, rnd.uniform(0.05, 0.8))
        assert any(x.isdigit() for x in lines), f"round {rnd_no}: nothing acknowledged (seed {seed})"
        all_lines += lines
        acked = [int(x) for x in all_lines if x.isdigit()]
        assert acked == sorted(acked), f"acknowledgements out of order (seed {seed})"
        checked += check_replay(directory, all_lines, seed)
    assert checked > 0, f"no acknowledgement was ever checked (seed {seed})"
    assert "U" in all_lines, f"no segment was ever written over an old one (seed {seed})"
