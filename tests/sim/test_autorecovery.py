"""AutoRecovery in the simulator: under crash and partition schedules every entry <= the last entry stays on >= Qa
live bookies once recovery is done (invariant 2), and a worker that swaps the new bookie into the metadata
before copying is caught."""

from __future__ import annotations

import pytest

from .autorecovery import run_autorecovery


@pytest.mark.parametrize("chunk", range(4))
def test_recovery_keeps_every_entry_on_qa_live_bookies(chunk: int) -> None:
    copied = 0
    for seed in range(chunk * 50, chunk * 50 + 50):
        out = run_autorecovery(seed)
        assert out.ok, out.report()
        copied += out.copied
    assert copied > 0


def test_same_seed_same_trace() -> None:
    assert run_autorecovery(7).trace == run_autorecovery(7).trace


def test_a_worker_that_swaps_before_copying_is_caught() -> None:
    for seed in range(300):
        out = run_autorecovery(seed, "swap-before-copy")
        if out.ok:
            continue
        assert any(v.startswith("2:") for v in out.violations), out.report()
        assert run_autorecovery(seed).ok
        print(f"swap-before-copy: seed={seed}: {[v for v in out.violations if v.startswith('2:')][0]}")
        return
    pytest.fail("swap-before-copy: no violation in 300 seeds")
