"""Verifying a READ_RANGE reply's entries where they lie (``EntryCodec.verify_spans``): the column-wise checks
give what checking each entry with ``EntryCodec.verify`` gives, for replies of same-size entries (one header
unpack for the lot) and of mixed sizes, and stop at the first bad entry."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie import protocol as p
from bookie.entryformat import DigestMismatchError, DigestType, EntryCodec

LEDGER = 42


def _reply(entries: list[bytes], first: int = 0) -> tuple[bytes, list[int]]:
    """A READ_RANGE reply's frame and the entries' spans in it (``decode_read_range``)."""
    frame = p.encode(
        p.ReadRangeResponse(
            request_id=1, status=p.Status.OK, ledger_id=LEDGER, first_entry_id=first, entries=tuple(entries)
        )
    )
    r = p.decode_read_range(1, frame, 4 + p.FRAME_HEADER.size, len(frame))
    assert [frame[r.bounds[k] : r.bounds[k + 1]] for k in range(0, len(r.bounds), 2)] == entries
    return frame, r.bounds


def _one_by_one(codec: EntryCodec, entries: list[bytes], first: int, step: int) -> tuple[list[bytes], bool]:
    out = []
    for k, e in enumerate(entries):
        try:
            out.append(codec.verify(e, first + k * step)[1])
        except DigestMismatchError:
            return out, False
    return out, True


def _damaged_reply(
    codec: EntryCodec, sizes: list[int], same: bool, bad: int, what: str, first: int, step: int
) -> tuple[list[bytes], bytes, list[int]]:
    """Entries of ``sizes`` (all of the first size when ``same``) from ``first`` by ``step``, entry
    ``bad % len`` damaged (its payload, digest, entry id or ledger id, or cut short; ``none``: left), and
    their reply's frame and spans."""
    if same:
        sizes = [sizes[0]] * len(sizes)
    entries = [codec.build(first + k * step, k, k, bytes([k]) * n) for k, n in enumerate(sizes)]
    bad %= len(entries)
    e = bytearray(entries[bad])
    if what == "payload" and len(e) > 36:
        e[-1] ^= 1
    elif what == "digest":
        e[32] ^= 0x80
    elif what == "entry_id":
        e[15] ^= 1
    elif what == "ledger_id":
        e[7] ^= 1
    elif what == "truncate":
        del e[30:]
    entries[bad] = bytes(e)
    frame, bounds = _reply(entries, first)
    return entries, frame, bounds


@pytest.mark.parametrize("digest", list(DigestType))
@pytest.mark.parametrize("sizes", [[1024] * 7, [0, 5, 1024, 3], [100], []])
@pytest.mark.parametrize("step", [1, 3])
def test_verify_spans_returns_every_payload_of_a_good_reply(digest, sizes, step) -> None:
    codec = EntryCodec(LEDGER, digest, b"k" * 20)
    first = 10
    entries = [codec.build(first + k * step, 0, 0, bytes([k]) * n) for k, n in enumerate(sizes)]
    frame, bounds = _reply(entries, first)
    payloads, why = codec.verify_spans(frame, bounds, first, step)
    assert why is None
    assert payloads == [bytes([k]) * n for k, n in enumerate(sizes)]
    assert all(type(x) is bytes for x in payloads)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 64), min_size=1, max_size=12),
    st.booleans(),
    st.integers(0, 11),
    st.sampled_from(["payload", "digest", "entry_id", "ledger_id", "truncate"]),
    st.sampled_from([DigestType.CRC32C, DigestType.CRC32]),
)
def test_verify_spans_stops_at_the_first_bad_entry_like_verify(sizes, same, bad, what, digest) -> None:
    codec = EntryCodec(LEDGER, digest)
    first, step = 5, 3
    entries, frame, bounds = _damaged_reply(codec, sizes, same, bad, what, first, step)
    payloads, why = codec.verify_spans(frame, bounds, first, step)
    want, ok = _one_by_one(codec, entries, first, step)
    assert payloads == want
    assert (why is None) == ok


def test_evenly_spaced_reply_decodes_to_the_same_spans_as_a_walk() -> None:
    entries = [bytes([k]) * 300 for k in range(9)]
    frame, bounds = _reply(entries)
    entries[4] = entries[4][:-1] + b"xy"  # one longer entry: no longer evenly spaced
    frame2, bounds2 = _reply(entries)
    assert bounds2[:9] == bounds[:9] and bounds2[9] == bounds[9] + 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 80), min_size=1, max_size=10),
    st.booleans(),
    st.integers(0, 9),
    st.sampled_from(["none", "payload", "entry_id", "truncate"]),
    st.sampled_from([1, 3]),
)
def test_verify_spans_rows_are_the_payloads_of_a_reply_of_one_size(sizes, same, bad, what, step) -> None:
    """``rows=True``: a reply of same-size entries gives its payloads as a 2-D array viewing the reply (a row
    each, up to the first bad entry, the same reason); any other reply gives the list of ``rows=False``."""
    np = pytest.importorskip("numpy")
    codec = EntryCodec(LEDGER, DigestType.CRC32C)
    first = 7
    entries, frame, bounds = _damaged_reply(codec, sizes, same, bad, what, first, step)
    want, why = codec.verify_spans(frame, bounds, first, step)
    got, why_rows = codec.verify_spans(frame, bounds, first, step, rows=True)
    assert why_rows == why
    if isinstance(got, list):
        assert got == want
        assert not (same and what == "none" and len(entries) > 1)  # a good reply of one size comes as rows
    else:
        assert got.dtype == np.uint8 and got.ndim == 2 and not got.flags.writeable
        assert [bytes(r) for r in got] == want
        assert got.base is not None  # a view of the reply, not a copy
