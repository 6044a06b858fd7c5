"""Runs (bookie/storage.py): how stored entries are grouped into RocksDB values, and the values' format."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookie.storage import RUN_BYTES_MAX, RUN_ENTRIES_MAX, pack_run, plan_runs, run_offsets


def _check(lids: list[int], eids: list[int], sizes: list[int], runs: list[tuple[int, int]]) -> None:
    """The invariants of a plan: the runs tile the rows in order, each is one ledger's consecutive ids within
    one block of RUN_ENTRIES_MAX ids, at most RUN_BYTES_MAX bytes unless it is one entry."""
    if not lids:
        assert runs == []
        return
    assert [a for a, _ in runs] == [0] + [b for _, b in runs[:-1]] and runs[-1][1] == len(lids)
    for a, b in runs:
        assert 0 < b - a <= RUN_ENTRIES_MAX
        assert eids[a] // RUN_ENTRIES_MAX == eids[b - 1] // RUN_ENTRIES_MAX
        assert len(set(lids[a:b])) == 1
        assert eids[a:b] == list(range(eids[a], eids[a] + b - a))
        assert b - a == 1 or sum(sizes[a:b]) <= RUN_BYTES_MAX


def test_one_ledgers_consecutive_entries_are_cut_at_block_boundaries() -> None:
    n = 3 * RUN_ENTRIES_MAX + 5
    runs = plan_runs([9] * n, list(range(100, 100 + n)), [1024] * n)
    assert runs == [(0, 28), (28, 92), (92, 156), (156, n)]  # entries 100-127, 128-191, 192-255, 256-296
    assert plan_runs([9] * n, list(range(128, 128 + n)), [1024] * n) == [
        (0, 64),
        (64, 128),
        (128, 192),
        (192, n),
    ]
    assert plan_runs([9] * 3, [62, 63, 64], [1] * 3) == [(0, 2), (2, 3)]


def test_a_run_ends_at_another_ledger_a_gap_or_its_byte_limit() -> None:
    lids = [1, 1, 2, 2, 2, 1, 1]
    eids = [5, 6, 0, 1, 3, 7, 8]
    assert plan_runs(lids, eids, [10] * 7) == [(0, 2), (2, 4), (4, 5), (5, 7)]
    assert plan_runs([1] * 4, [62, 63, 64, 65], [10] * 4) == [(0, 2), (2, 4)]
    big = RUN_BYTES_MAX // 2
    assert plan_runs([1] * 4, [0, 1, 2, 3], [big, big, big + 1, big]) == [(0, 2), (2, 3), (3, 4)]
    assert plan_runs([1] * 2, [0, 1], [RUN_BYTES_MAX * 3, 1]) == [(0, 1), (1, 2)]  # too big: a run alone
    assert plan_runs([], [], []) == []


def test_entry_ids_out_of_order_are_not_one_run() -> None:
    """Same ledger, first and last ids span exactly n: the fast path must still see the disorder."""
    runs = plan_runs([1] * 4, [0, 2, 1, 3], [10] * 4)
    _check([1] * 4, [0, 2, 1, 3], [10] * 4, runs)
    assert runs == [(0, 1), (1, 2), (2, 3), (3, 4)]


@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 3), st.sampled_from([0, 1, 1000, RUN_BYTES_MAX // 3])),
        max_size=300,
    )
)
def test_plans_keep_their_invariants(rows: list[tuple[int, int, int]]) -> None:
    # rows: (ledger, step to the next entry id, size)
    lids, eids, sizes, e = [], [], [], 0
    for lid, step, size in rows:
        e += step
        lids.append(lid)
        eids.append(e)
        sizes.append(size)
    _check(lids, eids, sizes, plan_runs(lids, eids, sizes))


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=RUN_ENTRIES_MAX))
def test_a_packed_run_gives_back_its_entries(entries: list[bytes]) -> None:
    value = pack_run(entries)
    offsets = run_offsets(value)
    assert len(offsets) == len(entries) + 1
    assert [value[offsets[k] : offsets[k + 1]] for k in range(len(entries))] == entries


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"\x01\x00",
        b"\x00\x00\x00\x00",
        b"\x02\x00\x00\x00\x01\x00\x00\x00",
        pack_run([b"ab", b"c"])[:-1],
    ],
)
def test_a_malformed_run_value_is_an_error_not_a_wrong_entry(value: bytes) -> None:
    with pytest.raises(ValueError):
        run_offsets(value)
