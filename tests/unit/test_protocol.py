"""The wire codec: round trips, fuzzing, and malformed input always raising ProtocolError."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie import protocol as p

i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
u64 = st.integers(min_value=0, max_value=2**64 - 1)
u32 = st.integers(min_value=0, max_value=2**32 - 1)
key = st.binary(min_size=p.MASTER_KEY_LEN, max_size=p.MASTER_KEY_LEN)
flags = st.integers(min_value=0, max_value=0xFFFF)
status = st.sampled_from(list(p.Status))
blob = st.binary(max_size=512)

#: one strategy per request type (tests/unit/test_protocol_fuzz.py fuzzes each)
REQUEST_STRATEGIES = (
    st.builds(
        p.AddEntryRequest,
        request_id=u64,
        ledger_id=u64,
        entry_id=i64,
        master_key=key,
        entry=blob,
        flags=flags,
    ),
    st.builds(
        p.ReadEntryRequest,
        request_id=u64,
        ledger_id=u64,
        entry_id=i64,
        master_key=key,
        flags=flags,
        previous_lac=i64,
        timeout_ms=u32,
    ),
    st.builds(p.ReadLacRequest, request_id=u64, ledger_id=u64, master_key=key, flags=flags),
    st.builds(
        p.WriteLacRequest, request_id=u64, ledger_id=u64, lac=i64, master_key=key, lac_blob=blob, flags=flags
    ),
    st.builds(
        p.ReadRangeRequest,
        request_id=u64,
        ledger_id=u64,
        first_entry_id=i64,
        last_entry_id=i64,
        master_key=key,
        max_bytes=u32,
        flags=flags,
        step=st.one_of(st.just(1), u32),
    ),
    st.builds(p.BookieInfoRequest, request_id=u64, flags=flags),
    st.builds(p.AuthRequest, request_id=u64, method=st.just(p.AuthMethod.NONE), features=u32, flags=flags),
    st.builds(
        p.AuthRequest,
        request_id=u64,
        method=st.just(p.AuthMethod.TOKEN),
        credential=st.binary(min_size=1, max_size=p.AUTH_CREDENTIAL_MAX),
        features=u32,
        flags=flags,
    ),
)
requests = st.one_of(REQUEST_STRATEGIES)
text = st.text(alphabet=st.characters(blacklist_characters="\n=", blacklist_categories=("Cs",)), max_size=20)
#: one strategy per response type
RESPONSE_STRATEGIES = (
    st.builds(p.AddEntryResponse, request_id=u64, status=status, ledger_id=u64, entry_id=i64),
    st.builds(
        p.ReadEntryResponse, request_id=u64, status=status, ledger_id=u64, entry_id=i64, lac=i64, entry=blob
    ),
    st.builds(
        p.ReadLacResponse,
        request_id=u64,
        status=status,
        ledger_id=u64,
        lac=i64,
        explicit_lac=i64,
        lac_blob=blob,
    ),
    st.builds(p.WriteLacResponse, request_id=u64, status=status, ledger_id=u64),
    st.builds(
        p.ReadRangeResponse,
        request_id=u64,
        status=status,
        ledger_id=u64,
        first_entry_id=i64,
        entries=st.lists(blob, max_size=5).map(tuple),
    ),
    st.builds(
        p.BookieInfoResponse,
        request_id=u64,
        status=status,
        free_bytes=u64,
        total_bytes=u64,
        readonly=st.booleans(),
        bookie_id=text,
        extra=st.dictionaries(text.filter(bool), text, max_size=3),
    ),
    st.builds(
        p.AuthResponse,
        request_id=u64,
        status=status,
        mode=st.sampled_from(list(p.AuthMode)),
        features=u32,
        subject=st.text(max_size=p.AUTH_SUBJECT_MAX // 4),
    ),
)
responses = st.one_of(RESPONSE_STRATEGIES)


@given(requests)
def test_request_encode_decode_is_identity(msg: p.Request) -> None:
    assert p.decode_one_request(p.encode(msg)) == msg


@given(responses)
def test_response_encode_decode_is_identity(msg: p.Response) -> None:
    assert p.decode_one_response(p.encode(msg)) == msg


@given(st.lists(requests, min_size=1, max_size=8), st.data())
def test_decoder_reassembles_frames_split_at_any_point(msgs: list[p.Request], data: st.DataObject) -> None:
    stream = b"".join(p.encode(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    dec = p.FrameDecoder()
    out: list[p.Request] = []
    prev = 0
    for c in [*cuts, len(stream)]:
        dec.feed(stream[prev:c])
        prev = c
        out.extend(dec.requests())
    assert out == msgs
    assert dec.buffered == 0


@given(st.lists(requests, min_size=1, max_size=8), st.data())
def test_decoder_keeps_no_reference_to_a_callers_mutable_chunk(
    msgs: list[p.Request], data: st.DataObject
) -> None:
    """A bytes chunk may be kept as it came (immutable); a bytearray chunk is copied, so the caller reusing its
    buffer cannot change frames still buffered. Each chunk is fed, partly consumed, then overwritten."""
    stream = b"".join(p.encode(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    dec = p.FrameDecoder()
    out: list[p.Request] = []
    prev = 0
    for i, c in enumerate([*cuts, len(stream)]):
        chunk = bytearray(stream[prev:c]) if i % 2 else stream[prev:c]
        dec.feed(chunk)  # type: ignore[arg-type]
        prev = c
        out.extend(dec.requests())
        if isinstance(chunk, bytearray):
            chunk[:] = b"\xff" * len(chunk)
    assert out == msgs
    assert dec.buffered == 0


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_any_bytes_either_decode_or_raise_protocol_error(raw: bytes) -> None:
    for decode in (p.FrameDecoder.requests, p.FrameDecoder.responses):
        dec = p.FrameDecoder()
        dec.feed(raw)
        try:
            list(decode(dec))
        except p.ProtocolError:
            pass


@settings(max_examples=300)
@given(requests, st.integers(min_value=0, max_value=2000), st.integers(min_value=0, max_value=255))
def test_mutated_frames_never_raise_anything_but_protocol_error(msg: p.Request, pos: int, byte: int) -> None:
    frame = bytearray(p.encode(msg))
    frame[pos % len(frame)] = byte
    dec = p.FrameDecoder()
    dec.feed(bytes(frame))
    try:
        list(dec.requests())
    except p.ProtocolError:
        pass


def test_oversized_frame_is_refused_before_buffering_it() -> None:
    dec = p.FrameDecoder(frame_size_max=1024)
    dec.feed((5000).to_bytes(4, "big") + b"\x01")
    with pytest.raises(p.ProtocolError, match="frame length"):
        list(dec.frames())
    with pytest.raises(p.ProtocolError):
        list(dec.frames())


def test_wrong_version_is_refused() -> None:
    frame = bytearray(p.encode(p.BookieInfoRequest(request_id=1)))
    frame[4] = 99
    with pytest.raises(p.ProtocolError, match="version"):
        p.decode_one_request(bytes(frame))


def test_unknown_op_and_short_bodies_are_refused() -> None:
    frame = bytearray(p.encode(p.BookieInfoRequest(request_id=1)))
    frame[5] = 77
    with pytest.raises(p.ProtocolError, match="unknown op"):
        p.decode_one_request(bytes(frame))
    read = p.encode(p.ReadLacRequest(request_id=1, ledger_id=1, master_key=b"k" * p.MASTER_KEY_LEN))
    short = (len(read) - 4 - 1).to_bytes(4, "big") + read[4:-1]
    with pytest.raises(p.ProtocolError, match="READ_LAC"):
        p.decode_one_request(short)


def test_encoding_refuses_a_wrong_length_master_key() -> None:
    with pytest.raises(p.ProtocolError):
        p.encode(p.ReadLacRequest(request_id=1, ledger_id=1, master_key=b"short"))


def test_master_key_depends_on_password() -> None:
    assert p.master_key(b"a") != p.master_key(b"b")
    assert len(p.master_key(b"a")) == p.MASTER_KEY_LEN


def test_add_request_frame_from_a_shared_body_equals_the_generic_encoding() -> None:
    key = p.master_key(b"k")
    body = p.add_request_body(3, 9, key, b"entry-bytes")
    assert p.add_request_frame(77, p.Flag.RECOVERY_ADD, body) == p.encode_add_request(
        77, 3, 9, key, b"entry-bytes", p.Flag.RECOVERY_ADD
    )


def _add_frames(ledger: int, first: int, n: int, size: int) -> list[bytes]:
    key = p.master_key(b"k")
    return [p.encode_add_request(100 + i, ledger, first + i, key, bytes([i % 256]) * size) for i in range(n)]


@given(
    st.lists(st.sampled_from(["add64", "add10", "read"]), min_size=1, max_size=12),
    st.lists(st.integers(0, 2000), max_size=5),
)
def test_take_add_requests_then_frames_raw_see_every_frame_once_in_order(
    kinds: list[str], cuts: list[int]
) -> None:
    """The bookie's fast path: runs of same-size adds come out as rows, the rest through frames_raw; together
    they yield every frame exactly once, in order, however the stream is split."""
    frames = []
    for i, kind in enumerate(kinds):
        if kind == "read":
            frames.append(p.encode(p.ReadLacRequest(request_id=100 + i, ledger_id=3, master_key=b"k" * 20)))
        else:
            size = 64 if kind == "add64" else 10
            frames.append(p.encode_add_request(100 + i, 3, i, b"k" * 20, bytes([i]) * size))
    stream = b"".join(frames)
    dec = p.FrameDecoder()
    seen: list[tuple[int, int, bytes]] = []
    prev = 0
    for c in [*sorted(c % (len(stream) + 1) for c in cuts), len(stream)]:
        dec.feed(stream[prev:c])
        prev = c
        while True:
            rows = dec.take_add_requests()
            if rows is not None:
                seen.extend((int(p.OpCode.ADD_ENTRY), r[1], r[5]) for r in rows)
            progressed = False
            for op, _flags, rid, buf, a, b in dec.frames_raw():
                progressed = True
                body = bytes(buf[a:b])
                seen.append((op, rid, body[36:] if op == p.OpCode.ADD_ENTRY else b""))
            if not progressed:
                break
    assert dec.buffered == 0
    want = [
        (int(p.OpCode.ADD_ENTRY), 100 + i, bytes([i]) * (64 if k == "add64" else 10))
        if k != "read"
        else (int(p.OpCode.READ_LAC), 100 + i, b"")
        for i, k in enumerate(kinds)
    ]
    assert seen == want


def test_take_add_requests_unpacks_fields_and_stops_at_another_size() -> None:
    run = _add_frames(7, 0, 5, 40)
    other = _add_frames(7, 5, 1, 41)
    dec = p.FrameDecoder()
    dec.feed(b"".join(run + other) + run[0][:10])
    rows = dec.take_add_requests()
    assert rows is not None and len(rows) == 5
    assert rows == [(0, 100 + i, 7, i, p.master_key(b"k"), bytes([i]) * 40) for i in range(5)]
    rows = dec.take_add_requests()
    assert rows is not None and [r[3] for r in rows] == [5]
    assert dec.take_add_requests() is None and dec.buffered == 10


def test_take_add_requests_leaves_bad_frames_to_frames_raw() -> None:
    frame = _add_frames(1, 0, 1, 8)[0]
    for bad in (b"\x00\x00\x00\x02xx", bytes([0, 0, 0, len(frame) - 4, 9]) + frame[5:]):
        dec = p.FrameDecoder()
        dec.feed(bad)
        assert dec.take_add_requests() is None
        with pytest.raises(p.ProtocolError):
            list(dec.frames_raw())


def test_a_read_range_of_step_one_keeps_the_layout_of_older_clients() -> None:
    key = b"k" * p.MASTER_KEY_LEN
    plain = p.ReadRangeRequest(request_id=1, ledger_id=2, first_entry_id=3, last_entry_id=9, master_key=key)
    strided = p.ReadRangeRequest(
        request_id=1, ledger_id=2, first_entry_id=3, last_entry_id=9, master_key=key, step=3
    )
    assert len(p.encode(strided)) == len(p.encode(plain)) + 4
    assert p.decode_one_request(p.encode(plain)).step == 1
    # a step of 1 written out is not a valid frame: one meaning, one encoding
    frame = bytearray(p.encode(strided))
    frame[-4:] = (1).to_bytes(4, "big")
    with pytest.raises(p.ProtocolError, match="step"):
        p.decode_one_request(bytes(frame))


@given(
    st.builds(
        p.ReadRangeResponse,
        request_id=u64,
        status=status,
        ledger_id=u64,
        first_entry_id=i64,
        entries=st.lists(blob, max_size=5).map(tuple),
    ),
    st.binary(max_size=8),
    st.binary(max_size=8),
)
def test_decode_read_range_finds_the_entries_in_place(
    msg: p.ReadRangeResponse, before: bytes, after: bytes
) -> None:
    frame = p.encode(msg)
    data = before + frame[4 + p.FRAME_HEADER.size :] + after  # the body among other bytes
    end = len(data) - len(after)
    r = p.decode_read_range(msg.request_id, data, len(before), end)
    assert (r.status, r.ledger_id, r.first_entry_id) == (msg.status, msg.ledger_id, msg.first_entry_id)
    assert tuple(data[r.bounds[k] : r.bounds[k + 1]] for k in range(0, len(r.bounds), 2)) == msg.entries


@settings(max_examples=300)
@given(
    st.lists(blob, max_size=4),
    st.integers(min_value=0, max_value=2000),
    st.integers(0, 255),
    st.binary(max_size=8),
)
def test_decode_read_range_of_mutated_bodies_raises_only_protocol_error(
    entries: list[bytes], pos: int, byte: int, after: bytes
) -> None:
    frame = p.encode(
        p.ReadRangeResponse(
            request_id=1, status=p.Status.OK, ledger_id=1, first_entry_id=0, entries=tuple(entries)
        )
    )
    body = bytearray(frame[4 + p.FRAME_HEADER.size :])
    body[pos % len(body)] = byte
    data = bytes(body) + after
    try:
        r = p.decode_read_range(1, data, 0, len(body))
    except p.ProtocolError:
        return
    assert all(r.bounds[k] <= r.bounds[k + 1] <= len(body) for k in range(0, len(r.bounds), 2))


def test_leading_add_responses_leave_a_buffer_of_other_frames_alone() -> None:
    rng = p.encode(
        p.ReadRangeResponse(
            request_id=9, status=p.Status.OK, ledger_id=1, first_entry_id=0, entries=(b"x" * 5000,)
        )
    )
    ack = p.encode_add_response(1, p.Status.OK, 1, 0)
    dec = p.FrameDecoder()
    dec.feed(rng + ack)
    assert dec.take_leading_add_responses() == [] and dec.buffered == len(rng) + len(ack)
    dec = p.FrameDecoder()
    dec.feed(ack * 3 + rng + ack)
    assert [r[4] for r in dec.take_leading_add_responses()] == [1, 1, 1]
    assert dec.buffered == len(rng) + len(ack)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([10, 3_000, 70_000, 300_000]), min_size=1, max_size=6),
    st.lists(st.integers(1, 200_000), min_size=1, max_size=40),
)
def test_frames_of_any_size_cut_anywhere_come_out_whole_and_in_order(sizes, cuts) -> None:
    """Large frames are gathered from their chunks and joined once; small ones grow a buffer: either way the
    frames come out whole, in order, and ``buffered`` counts what is held."""
    frames = [
        p.encode(
            p.ReadRangeResponse(
                request_id=k, status=p.Status.OK, ledger_id=1, first_entry_id=0, entries=(bytes([k]) * n,)
            )
        )
        for k, n in enumerate(sizes)
    ]
    stream = b"".join(frames)
    dec = p.FrameDecoder()
    got: list[bytes] = []
    pos = 0
    for cut in [*cuts, len(stream)]:
        chunk = stream[pos : pos + cut]
        pos += len(chunk)
        dec.feed(chunk)
        got += [bytes(data[a - p.FRAME_HEADER.size - 4 : b]) for _, _, _, data, a, b in dec.frames_raw()]
        assert dec.buffered == pos - sum(map(len, got))
        if pos == len(stream):
            break
    assert got == frames


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 512])
@pytest.mark.parametrize("one_ledger", [True, False])
def test_encode_add_responses_is_each_response_joined(n: int, one_ledger: bool) -> None:
    """The column-by-column encoding gives the bytes of encoding each response, at the fields' extremes too."""
    rids = [(i * 0x9E3779B97F4A7C15) % 2**64 for i in range(n)]
    lids = [2**64 - 1 if one_ledger else (i * 7919) % 2**64 for i in range(n)]
    eids = [(-1 if i % 3 == 0 else 2**63 - 1 - i) for i in range(n)]
    for status in (p.Status.OK, p.Status.FENCED):
        want = b"".join(
            p.encode_add_response(r, status, lid, e) for r, lid, e in zip(rids, lids, eids, strict=True)
        )
        assert p.encode_add_responses(rids, status, lids, eids) == want
        # and a client's decoder reads them back
        dec = p.FrameDecoder()
        dec.feed(want)
        got = dec.take_leading_add_responses()
        assert [(row[4], row[5], row[6], row[7]) for row in got] == list(
            zip(rids, [status] * n, lids, eids, strict=True)
        )


def test_encode_add_responses_refuses_columns_of_different_lengths() -> None:
    with pytest.raises(ValueError, match="3 request ids, 2 ledger ids"):
        p.encode_add_responses([1, 2, 3], p.Status.OK, [1, 1], [1, 2, 3])
