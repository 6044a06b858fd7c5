"""The READ_RANGE batches re-replication reads a fragment with: exactly the lost bookie's entries, each once."""

from __future__ import annotations

import pytest

from ledger_client.rereplication import Fragment
from ledger_client.rereplicator import _runs


def _entries(runs: list[tuple[int, int, int]]) -> list[int]:
    return [e for first, last, step in runs for e in range(first, last + 1, step)]


@pytest.mark.parametrize(("e", "qw"), [(3, 2), (3, 3), (5, 2), (5, 3), (4, 4), (1, 1)])
@pytest.mark.parametrize(("first", "last"), [(0, 0), (0, 9), (7, 1000), (3, 2), (10, 11)])
@pytest.mark.parametrize("batch", [1, 4, 512])
def test_runs_cover_the_lost_bookies_entries_once(e: int, qw: int, first: int, last: int, batch: int) -> None:
    for b in range(e):
        f = Fragment(0, b, first, last, e, qw)
        runs = list(_runs(f, batch))
        got = _entries(runs)
        assert sorted(got) == list(f.entries())
        assert len(got) == len(set(got))
        for lo, hi, step in runs:
            assert first <= lo <= hi <= last and (hi - lo) % step == 0
            assert (hi - lo) // step + 1 <= batch
            # one write set per batch: a step of E (one residue), or Qw == E (every entry on every bookie)
            assert step == e if qw < e else step == 1
