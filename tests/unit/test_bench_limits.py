"""``machine_limits`` (the probes ``bench bookie`` and ``bench ledger`` run before their runs) leaves the caller's
event loop policy as it found it, so that ``bench ledger --loop asyncio`` measures asyncio's own loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ledgerstore import bench


def test_machine_limits_keeps_the_event_loop_policy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    loops: list[str] = []

    async def loopback() -> float:
        loops.append(type(asyncio.get_running_loop()).__module__)
        return 1.0

    monkeypatch.setattr(bench, "fsync_rate", lambda directory: 1.0)
    monkeypatch.setattr(bench, "sequential_write_rate", lambda directory, overwrite=False: 1.0)
    monkeypatch.setattr(bench, "_loopback_rate", loopback)
    monkeypatch.delenv("LEDGERSTORE_NO_UVLOOP", raising=False)
    policy = asyncio.DefaultEventLoopPolicy()
    asyncio.set_event_loop_policy(policy)
    try:
        limits = bench.machine_limits(tmp_path)
        assert asyncio.get_event_loop_policy() is policy
    finally:
        asyncio.set_event_loop_policy(None)
    assert limits["loopback_framed_1k_msgs_per_s"] == 1
    pytest.importorskip("uvloop")
    assert loops == ["uvloop"]  # the loopback probe itself still runs on uvloop, as before
