"""A bookie's READ_RANGE reply built from the stored runs (``protocol.encode_read_range_pieces``) is the frame the
entry-by-entry encoding gives for the same entries: same-size entries laid out as strided blocks, mixed sizes,
the byte limit, the frame limit and a bookie without numpy alike."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie import protocol as p
from bookie.storage import RUN_ENTRIES_MAX, decode_run, pack_block_run


def _piece(first: int, entries: list[bytes], gap: int, start: int, step: int) -> p.RangePiece:
    """A stored run of ``entries`` from id ``first`` (with ``gap``: every ``gap``-th id left out, a striped
    bookie's run), the entries at positions ``start``, ``start + step``, ... picked."""
    ids = [first + i for i in range(len(entries) * 2) if not gap or (i + 1) % gap][: len(entries)]
    value = pack_block_run(ids, entries)
    _, offsets, _ = decode_run(first, value)
    return value, offsets, range(start, len(entries), step)


def _reference(pieces: list[p.RangePiece], max_bytes: int) -> list[bytes]:
    """What ``get_range`` gives: the entries cut out one by one, at most ``max_bytes`` (at least one)."""
    out: list[bytes] = []
    size = 0
    for value, offsets, picked in pieces:
        for k in picked:
            e = value[offsets[k] : offsets[k + 1]]
            if out and size + len(e) > max_bytes:
                return out
            out.append(e)
            size += len(e)
    return out


def _pieces_of(pieces: list[p.RangePiece], as_lists: bool) -> Iterator[p.RangePiece]:
    for value, offsets, picked in pieces:
        yield value, offsets, list(picked) if as_lists else picked


def _check(pieces: list[p.RangePiece], max_bytes: int, as_lists: bool = False) -> tuple[int, bool]:
    asked = sum(len(picked) for _, _, picked in pieces)
    frame, n, size, trimmed = p.encode_read_range_pieces(
        9, 7, 100, _pieces_of(pieces, as_lists), max_bytes, asked
    )
    want = _reference(pieces, max_bytes)
    fit = p.read_range_entries_fitting(want)
    assert trimmed == (fit < len(want))
    want = want[:fit]
    assert (n, size) == (len(want), sum(map(len, want)))
    assert bytes(frame) == (p.encode_read_range_response(9, p.Status.OK, 7, 100, want) if want else b"")
    return n, trimmed


@settings(max_examples=300, deadline=None)
@given(
    runs=st.lists(
        st.tuples(
            st.integers(1, RUN_ENTRIES_MAX // 2),  # entries in the run
            st.sampled_from([0, 2, 3]),  # gaps: none, every 2nd id, every 3rd id left out
            st.integers(0, 3),  # first position picked
            st.integers(1, 3),  # step between positions
        ),
        min_size=0,
        max_size=5,
    ),
    width=st.integers(1, 40),
    mixed=st.booleans(),
    max_bytes=st.integers(1, 3000),
    as_lists=st.booleans(),
)
def test_the_frame_is_the_entry_by_entry_encoding(
    runs: list[tuple[int, int, int, int]], width: int, mixed: bool, max_bytes: int, as_lists: bool
) -> None:
    pieces = []
    serial = 0
    for j, (count, gap, start, step) in enumerate(runs):
        entries = []
        for _ in range(count):
            serial += 1
            size = width + (serial % 3 if mixed and j == len(runs) // 2 else 0)
            entries.append(bytes([serial % 251]) * size)
        piece = _piece(j * RUN_ENTRIES_MAX, entries, gap, min(start, count - 1), step)
        pieces.append(piece)
    _check(pieces, max_bytes, as_lists)


def test_an_empty_walk_is_no_entry() -> None:
    assert p.encode_read_range_pieces(1, 7, 0, iter(()), 1 << 20, 10) == (b"", 0, 0, False)


def test_the_byte_limit_stops_the_walk() -> None:
    """Once the entries taken fill ``max_bytes``, no further run is asked for (the storage reads no further)."""
    taken = []

    def walk() -> Iterator[p.RangePiece]:
        for j in range(10):
            taken.append(j)
            yield _piece(j * RUN_ENTRIES_MAX, [bytes([j]) * 100] * 10, 0, 0, 1)

    frame, n, size, trimmed = p.encode_read_range_pieces(1, 7, 0, walk(), 2500, 100)
    assert (n, size, trimmed, taken) == (25, 2500, False, [0, 1, 2])
    assert len(frame) == p._HDR_FULL.size + p._READ_RANGE_RESP.size + 25 * 104


@pytest.mark.parametrize("mixed", [False, True])
def test_entries_past_the_frame_limit_are_cut_and_counted(mixed: bool) -> None:
    big = p.ENTRY_SIZE_MAX // 4
    entries = [b"a" * (big + (i % 2 if mixed else 0)) for i in range(8)]
    n, trimmed = _check([_piece(0, entries, 0, 0, 1)], p.READ_RANGE_BYTES_MAX)
    assert trimmed and n == 4


def test_without_numpy_the_frame_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "numpy", None)  # import numpy raises ImportError
    entries = [bytes([i]) * 50 for i in range(30)]
    _check([_piece(0, entries, 3, 1, 2), _piece(64, entries, 0, 0, 1)], 1 << 20)
