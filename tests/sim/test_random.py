"""Random schedules: 2,000 seeds of the default profile (plus a few hundred of each directed profile) per run.

The seeds are fixed so CI is repeatable; ``LEDGERSTORE_SIM_SEED_START`` shifts the window (e.g. a nightly job
can set it to the date) and ``LEDGERSTORE_SIM_SEEDS`` resizes it. A failure lists every failing seed of its
chunk with the command that replays it (``python -m tests.sim --seed S --verbose`` prints the trace).
Violations caused by known, reported core bugs (``checker.KNOWN_BUGS``) do not fail these tests; see
``test_known_bugs.py``.
"""

from __future__ import annotations

import os

import pytest

from .schedule import run

START = int(os.environ.get("LEDGERSTORE_SIM_SEED_START", "0"))
SEEDS = int(os.environ.get("LEDGERSTORE_SIM_SEEDS", "2000"))
CHUNK = 100


def _chunks(n: int, start: int) -> list[range]:
    return [range(s, min(s + CHUNK, start + n)) for s in range(start, start + n, CHUNK)]


def _run_chunk(seeds: range, profile: str) -> None:
    failures = [out for out in (run(seed, profile) for seed in seeds) if not out.ok]
    assert not failures, "\n".join(out.report() for out in failures)


@pytest.mark.parametrize("seeds", _chunks(SEEDS, START), ids=lambda r: f"seeds{r.start}-{r.stop - 1}")
def test_random_schedules(seeds: range) -> None:
    _run_chunk(seeds, "default")


@pytest.mark.parametrize(
    "profile",
    [
        "fence-race",
        "out-of-order",
        "disk-faults",
        "concurrent-recovery",
        "read-errors",
        "batched",
        "storage-faults",
        "slow-reads",
    ],
)
def test_directed_profiles_are_clean_without_mutations(profile: str) -> None:
    """The profiles the mutation tests search must not fail on the real system either."""
    _run_chunk(range(START, START + 300), profile)
