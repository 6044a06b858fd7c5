"""Codec fuzzing with a budget that matters: every request and response type, the AUTH step included, mutated
(bytes overwritten, inserted, deleted, the frame cut or its length field changed) and fed through every decoding
path the bookie and the client use (generic decode, the add fast paths, the in-place READ_RANGE decode). Any input
either decodes or raises ``ProtocolError``, never anything else; a frame that decodes re-encodes to itself.

Budget: ``FUZZ_EXAMPLES`` per message type and direction (15 strategies), a few seconds in all; raise it locally with
``LEDGERSTORE_FUZZ_EXAMPLES``.
"""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookie import protocol as p
from bookie.auth import TokenVerifier, create_token
from bookie.server import ServerAuth
from tests.unit.test_protocol import REQUEST_STRATEGIES, RESPONSE_STRATEGIES

FUZZ_EXAMPLES = int(os.environ.get("LEDGERSTORE_FUZZ_EXAMPLES", "300"))
_FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

REQUEST_TYPES = [
    p.AddEntryRequest,
    p.ReadEntryRequest,
    p.ReadLacRequest,
    p.WriteLacRequest,
    p.ReadRangeRequest,
    p.BookieInfoRequest,
    p.AuthRequest,
]
RESPONSE_TYPES = [
    p.AddEntryResponse,
    p.ReadEntryResponse,
    p.ReadLacResponse,
    p.WriteLacResponse,
    p.ReadRangeResponse,
    p.BookieInfoResponse,
    p.AuthResponse,
]

# one edit of a frame: (kind, position, byte, count)
edits = st.lists(
    st.tuples(
        st.sampled_from(["set", "insert", "delete", "cut", "length"]),
        st.integers(0, 10_000),
        st.integers(0, 255),
        st.integers(1, 16),
    ),
    min_size=1,
    max_size=4,
)


def _mutate(frame: bytes, ops: list[tuple[str, int, int, int]]) -> bytes:
    buf = bytearray(frame)
    for kind, pos, byte, count in ops:
        at = pos % (len(buf) + 1)
        if kind == "set" and buf:
            buf[at % len(buf)] = byte
        elif kind == "insert":
            buf[at:at] = bytes([byte]) * count
        elif kind == "delete":
            del buf[at : at + count]
        elif kind == "cut":
            del buf[at:]
        elif kind == "length" and len(buf) >= 4:
            # a length field that says more, or less, than follows (or something absurd)
            (n,) = struct.unpack_from(">I", buf)
            n = [n + count, max(0, n - count), byte << 24, 0][count % 4]
            struct.pack_into(">I", buf, 0, n & 0xFFFFFFFF)  # (a length near 2**32, plus count, wraps)
    return bytes(buf)


def _decode_all(data: bytes, *, requests_side: bool) -> None:
    """Every path a peer's bytes take; only ProtocolError may come out."""
    dec = p.FrameDecoder()
    dec.feed(data)
    try:
        if requests_side:
            dec.take_add_run(struct.Struct(">Qqq"))
            for op, flags, rid, buf, a, b in dec.frames_raw():
                p.decode_request(op, flags, rid, memoryview(buf)[a:b])
        else:
            dec.take_add_ack_groups()
            dec.take_leading_add_responses()
            for op, flags, rid, buf, a, b in dec.frames_raw():
                if op == p.OpCode.READ_RANGE:
                    p.decode_read_range(rid, buf, a, b)
                p.decode_response(op, flags, rid, memoryview(buf)[a:b])
    except p.ProtocolError:
        pass


@pytest.mark.parametrize(
    "strategy", REQUEST_STRATEGIES, ids=[t.__name__ for t in REQUEST_TYPES] + ["AuthToken"]
)
def test_every_request_type_round_trips_and_mutations_raise_only_protocol_error(
    strategy: st.SearchStrategy[p.Request],
) -> None:
    @_FUZZ
    @given(strategy, edits)
    def run(msg: p.Request, ops: list[tuple[str, int, int, int]]) -> None:
        frame = p.encode(msg)
        assert p.decode_one_request(frame) == msg
        _decode_all(_mutate(frame, ops), requests_side=True)
        _decode_all(frame + _mutate(frame, ops), requests_side=True)  # a good frame, then a bad one

    run()


@pytest.mark.parametrize("strategy", RESPONSE_STRATEGIES, ids=[t.__name__ for t in RESPONSE_TYPES])
def test_every_response_type_round_trips_and_mutations_raise_only_protocol_error(
    strategy: st.SearchStrategy[p.Response],
) -> None:
    @_FUZZ
    @given(strategy, edits)
    def run(msg: p.Response, ops: list[tuple[str, int, int, int]]) -> None:
        frame = p.encode(msg)
        assert p.decode_one_response(frame) == msg
        _decode_all(_mutate(frame, ops), requests_side=False)
        _decode_all(frame + _mutate(frame, ops), requests_side=False)

    run()


SECRET = b"s" * 32


@_FUZZ
@given(st.binary(min_size=1, max_size=600), st.sampled_from(list(p.AuthMethod)))
def test_auth_step_refuses_any_credential_but_a_good_token(credential: bytes, method: p.AuthMethod) -> None:
    """The bookie's check of an AUTH request: random credentials (mutated good tokens included) are refused
    UNAUTHORIZED, never an exception; with auth off nothing is checked."""
    auth = ServerAuth(verifier=TokenVerifier(SECRET), required=True)
    cred = credential if method == p.AuthMethod.TOKEN else b""
    req = p.AuthRequest(request_id=1, method=method, credential=cred)
    status, subject, why = auth.check(req)
    assert status == p.Status.UNAUTHORIZED and not subject and why
    assert ServerAuth().check(req)[0] == p.Status.OK


@_FUZZ
@given(st.integers(0, 200), st.integers(0, 255))
def test_a_token_with_any_byte_changed_is_refused(pos: int, byte: int) -> None:
    token = create_token(SECRET, "writer", expires_in_s=3600).encode()
    mutated = bytearray(token)
    mutated[pos % len(mutated)] = byte
    auth = ServerAuth(verifier=TokenVerifier(SECRET), required=True)
    status, subject, _ = auth.check(
        p.AuthRequest(request_id=1, method=p.AuthMethod.TOKEN, credential=bytes(mutated))
    )
    if bytes(mutated) == token:
        assert (status, subject) == (p.Status.OK, "writer")
    else:
        # (a change in the signature's last character's unused low bits can leave its bytes unchanged)
        assert (
            status == p.Status.UNAUTHORIZED or bytes(mutated).rsplit(b".", 1)[0] == token.rsplit(b".", 1)[0]
        )


def test_auth_request_bounds_are_enforced_both_ways() -> None:
    too_long = p.AuthRequest(
        request_id=1, method=p.AuthMethod.TOKEN, credential=b"x" * (p.AUTH_CREDENTIAL_MAX + 1)
    )
    with pytest.raises(p.ProtocolError, match="credential"):
        p.encode(too_long)
    with pytest.raises(p.ProtocolError, match="NONE"):
        p.encode(p.AuthRequest(request_id=1, method=p.AuthMethod.NONE, credential=b"t"))
    # a hand-made frame with an unknown method, and one with a credential over the bound
    body = struct.pack(">BI", 9, 0)
    frame = struct.pack(">IBBHQ", 12 + len(body), p.PROTOCOL_VERSION, p.OpCode.AUTH, 0, 1) + body
    with pytest.raises(p.ProtocolError, match="method"):
        p.decode_one_request(frame)
    body = struct.pack(">BI", 1, 0) + b"x" * (p.AUTH_CREDENTIAL_MAX + 1)
    frame = struct.pack(">IBBHQ", 12 + len(body), p.PROTOCOL_VERSION, p.OpCode.AUTH, 0, 1) + body
    with pytest.raises(p.ProtocolError, match="credential"):
        p.decode_one_request(frame)


def test_read_range_replies_fit_the_frame_limit() -> None:
    big = b"e" * (p.ENTRY_SIZE_MAX - 100)
    entries = [big, b"x" * 100_000, b"y"]
    n = p.read_range_entries_fitting(entries)
    assert n == 1
    p.encode_read_range_response(1, p.Status.OK, 1, 0, entries[:n])  # fits
    small = [b"z" * 1000] * 10_000  # 10 MB of small entries: cut where the frame is full
    n = p.read_range_entries_fitting(small)
    frame = p.encode_read_range_response(1, p.Status.OK, 1, 0, small[:n])
    assert len(frame) - 4 <= p.FRAME_SIZE_MAX
    with pytest.raises(p.ProtocolError):
        p.encode_read_range_response(1, p.Status.OK, 1, 0, small[: n + 1])


def test_read_range_fitting_at_the_exact_limit() -> None:
    """Entries filling the reply to the byte all fit; one byte more leaves the last one out."""
    room = p.READ_RANGE_REPLY_BYTES_MAX
    n = 64
    size = room // n - 4
    exact = [b"a" * size] * (n - 1) + [b"b" * (room - (n - 1) * (size + 4) - 4)]
    assert 4 * n + sum(map(len, exact)) == room
    assert p.read_range_entries_fitting(exact) == n
    over = [*exact[:-1], exact[-1] + b"c"]
    assert p.read_range_entries_fitting(over) == n - 1
    assert p.read_range_entries_fitting([]) == 0
