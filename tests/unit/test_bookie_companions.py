"""A bookie's companions (bookie/main.py; AutoRecovery is one): one that fails to start is left out and the bookie
serves on; one whose stop hangs holds up the bookie's shutdown no longer than COMPANION_STOP_TIMEOUT_S."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bookie import main as bookie_main
from bookie.main import Bookie, BookieConfig


class Service:
    def __init__(self, name: str, *, start_fails: bool = False, stop_hangs: bool = False) -> None:
        self.name = name
        self.start_fails, self.stop_hangs = start_fails, stop_hangs
        self.started = self.stopped = False

    async def start(self, bookie: Bookie) -> None:
        if self.start_fails:
            raise OSError("ZooKeeper unreachable")
        self.started = True

    async def stop(self) -> None:
        if self.stop_hangs:
            await asyncio.sleep(3600)
        self.stopped = True


def test_a_companion_that_fails_to_start_is_left_out_and_stopped(tmp_path: Path) -> None:
    bookie = Bookie(BookieConfig(zk="127.0.0.1:1", data_dir=tmp_path))
    ok, bad = Service("ok"), Service("bad", start_fails=True)
    running = asyncio.run(bookie_main._start_companions(bookie, [bad, ok]))
    assert running == [ok] and ok.started and bad.stopped


def test_a_companion_whose_stop_hangs_is_given_up_after_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bookie_main, "COMPANION_STOP_TIMEOUT_S", 0.2)
    t0 = time.monotonic()
    asyncio.run(bookie_main._stop_companion("b:1", Service("stuck", stop_hangs=True)))
    assert time.monotonic() - t0 < 2
