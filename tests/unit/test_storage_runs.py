"""Runs (bookie/storage.py): how stored entries are grouped into RocksDB values, and the values' two formats
(consecutive entries; entries of one block with gaps, listed by a bitmap)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookie.storage import (
    RUN_BYTES_MAX,
    RUN_ENTRIES_MAX,
    decode_run,
    pack_block_run,
    pack_run,
    plan_runs,
    run_entries,
    run_offsets,
)


def _check(lids: list[int], eids: list[int], sizes: list[int], runs: list[tuple[int, int]]) -> None:
    """The invariants of a plan: the runs tile the rows in order, each is one ledger's rising ids within one
    block of RUN_ENTRIES_MAX ids, at most RUN_BYTES_MAX bytes unless it is one entry; a run ends only where the
    next row could not join it."""
    if not lids:
        assert runs == []
        return
    assert [a for a, _ in runs] == [0] + [b for _, b in runs[:-1]] and runs[-1][1] == len(lids)
    for a, b in runs:
        assert 0 < b - a <= RUN_ENTRIES_MAX
        assert eids[a] // RUN_ENTRIES_MAX == eids[b - 1] // RUN_ENTRIES_MAX
        assert len(set(lids[a:b])) == 1
        assert all(x < y for x, y in zip(eids[a : b - 1], eids[a + 1 : b], strict=True))
        assert b - a == 1 or sum(sizes[a:b]) <= RUN_BYTES_MAX
    for (a, b), (c, _) in zip(runs, runs[1:], strict=False):
        assert (
            lids[c] != lids[b - 1]
            or eids[c] <= eids[b - 1]
            or eids[c] // RUN_ENTRIES_MAX != eids[b - 1] // RUN_ENTRIES_MAX
            or sum(sizes[a : c + 1]) > RUN_BYTES_MAX
        ), (a, b)


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


def test_a_striped_ledgers_entries_are_cut_at_block_boundaries_gaps_included() -> None:
    """A bookie of an E3/Qw2 ledger receives 2 of every 3 ids: one run per block of 64 ids (~43 entries)."""
    eids = [e for e in range(10, 300) if e % 3 != 2]
    runs = plan_runs([4] * len(eids), eids, [1024] * len(eids))
    _check([4] * len(eids), eids, [1024] * len(eids), runs)
    assert [(eids[a], eids[b - 1]) for a, b in runs] == [
        (10, 63),
        (64, 127),
        (129, 190),
        (192, 255),
        (256, 298),
    ]
    assert plan_runs([4] * 3, [3, 63, 64], [1] * 3) == [(0, 2), (2, 3)]


def test_a_run_ends_at_another_ledger_falling_ids_a_block_or_its_byte_limit() -> None:
    lids = [1, 1, 2, 2, 2, 1, 1]
    eids = [5, 6, 0, 1, 3, 7, 8]
    assert plan_runs(lids, eids, [10] * 7) == [(0, 2), (2, 5), (5, 7)]  # a gap does not end a run
    assert plan_runs([1] * 4, [62, 63, 64, 65], [10] * 4) == [(0, 2), (2, 4)]
    big = RUN_BYTES_MAX // 2
    assert plan_runs([1] * 4, [0, 1, 2, 3], [big, big, big + 1, big]) == [(0, 2), (2, 3), (3, 4)]
    assert plan_runs([1] * 2, [0, 1], [RUN_BYTES_MAX * 3, 1]) == [(0, 1), (1, 2)]  # too big: a run alone
    assert plan_runs([], [], []) == []


def test_entry_ids_out_of_order_are_not_one_run() -> None:
    """Same ledger, first and last ids span exactly n: the fast path must still see the disorder."""
    runs = plan_runs([1] * 4, [0, 2, 1, 3], [10] * 4)
    _check([1] * 4, [0, 2, 1, 3], [10] * 4, runs)
    assert runs == [(0, 2), (2, 4)]
    assert plan_runs([1] * 4, [0, 5, 5, 9], [10] * 4) == [(0, 2), (2, 4)]  # a duplicate is not rising


@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(-2, 3), st.sampled_from([0, 1, 1000, RUN_BYTES_MAX // 3])),
        max_size=300,
    )
)
def test_plans_keep_their_invariants(rows: list[tuple[int, int, int]]) -> None:
    # rows: (ledger, step to the next entry id, size)
    lids, eids, sizes, e = [], [], [], 0
    for lid, step, size in rows:
        e = max(0, e + step)
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


@given(st.integers(0, 2**40), st.sets(st.integers(0, RUN_ENTRIES_MAX - 1), min_size=1), st.data())
def test_a_run_of_one_block_gives_back_its_ids_and_entries(
    block: int, rels: set[int], data: st.DataObject
) -> None:
    base = block * RUN_ENTRIES_MAX
    eids = [base + r for r in sorted(rels)]
    entries = [data.draw(st.binary(max_size=50)) for _ in eids]
    value = pack_block_run(eids, entries)
    consecutive = eids[-1] - eids[0] == len(eids) - 1
    assert (value[:4] == b"\0\0\0\0") != consecutive  # format 1 unless there are gaps
    assert run_entries(eids[0], value) == (eids, entries)
    last, offsets, slots = decode_run(eids[0], value)
    assert last == eids[-1] and len(offsets) == len(eids) + 1
    assert (
        slots is None
        if consecutive
        else [i for i, k in enumerate(slots) if k >= 0] == [e - eids[0] for e in eids]
    )


def test_a_run_with_gaps_must_lie_in_one_block_and_rise() -> None:
    with pytest.raises(ValueError):
        pack_block_run([60, 66], [b"a", b"b"])
    with pytest.raises(ValueError):
        pack_block_run([5, 3, 9], [b"a", b"b", b"c"])


_GAPPED = pack_block_run(
    [2, 5], [b"ab", b"c"]
)  # format 2: u32 0, u32 2, u64 bitmap 0b100100, lengths, entries


@pytest.mark.parametrize(
    "first, value",
    [
        (2, _GAPPED[:-1]),  # lengths do not add up
        (2, _GAPPED[:4] + b"\x03" + _GAPPED[5:]),  # an unknown format
        (3, _GAPPED),  # keyed at an id it does not start with
        (0, _GAPPED),
        (2, _GAPPED[:8] + b"\x24\x00\x00\x00\x00\x00\x00\x01" + _GAPPED[16:]),  # more ids than lengths
        (2, _GAPPED[:16]),
    ],
)
def test_a_malformed_run_with_gaps_is_an_error_not_a_wrong_entry(first: int, value: bytes) -> None:
    with pytest.raises(ValueError):
        decode_run(first, value)
