"""The bookie wire protocol: a pure codec (bytes in, messages out), shared by the bookie and the client.

Every frame is::

    u32 frame_len            bytes that follow this field (FRAME_HEADER.size .. FRAME_SIZE_MAX)
    u8  version              PROTOCOL_VERSION
    u8  op                   OpCode
    u16 flags                Flag bits (requests) / 0 (responses)
    u64 request_id           chosen by the client, echoed by the bookie
    ... body                 per op and direction, see docs/protocol.md

Requests and responses share the header; the direction is implied by who sends. All integers are big-endian.
Entry ids and LACs are signed 64-bit (``-1`` = none / "last"). Master keys are ``MASTER_KEY_LEN`` bytes.

:class:`FrameDecoder` is fed arbitrary chunks and yields whole messages; any malformed input raises
:class:`ProtocolError` (and never anything else), after which the connection must be closed.
"""

from __future__ import annotations

import array
import enum
import hashlib
import itertools
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = 1
MASTER_KEY_LEN = 20
ENTRY_SIZE_MAX = 5 * 1024 * 1024
FRAME_SIZE_MAX = ENTRY_SIZE_MAX + 4096
READ_RANGE_BYTES_MAX = 8 * 1024 * 1024

_LEN = struct.Struct(">I")
FRAME_HEADER = struct.Struct(">BBHQ")  # version, op, flags, request_id (after the u32 length)
_HDR_FULL = struct.Struct(">IBBHQ")


class ProtocolError(ValueError):
    """A frame that cannot be decoded. The connection that sent it must be closed."""


class OpCode(enum.IntEnum):
    ADD_ENTRY = 1
    READ_ENTRY = 2
    READ_LAC = 3
    WRITE_LAC = 4
    READ_RANGE = 5
    BOOKIE_INFO = 6
    AUTH = 7  # the first frame of a connection: a credential, and the features each side speaks


class Flag(enum.IntFlag):
    NONE = 0
    RECOVERY_ADD = 1  # ADD_ENTRY: bypass the fence (ledger recovery writes back entries)
    FENCE = 2  # READ_ENTRY: fence the ledger (persisted before the reply)
    LONG_POLL = 4  # READ_ENTRY -1: wait until LAC > previous_lac or timeout


class Status(enum.IntEnum):
    OK = 0
    NO_LEDGER = 1
    NO_ENTRY = 2
    FENCED = 3
    UNAUTHORIZED = 4
    READONLY = 5
    TOO_MANY_REQUESTS = 6
    BAD_REQUEST = 7
    INTERNAL = 8


LAST_ENTRY = -1  # READ_ENTRY entry id meaning "the last entry this bookie has" (with its LAC)


class AuthMethod(enum.IntEnum):
    NONE = 0  # no credential: only the features (what a client without a token may send)
    TOKEN = 1  # an HS256 JWT (``bookie.auth``), ASCII


class AuthMode(enum.IntEnum):
    """What the bookie does with credentials (AUTH response)."""

    OFF = 0  # no secret configured: credentials are not checked, every request is served
    OPTIONAL = 1  # a secret: a credential sent is checked (a bad one is refused), none is allowed
    REQUIRED = 2  # a secret and --auth-required: nothing but AUTH is served before a good credential


class Feature(enum.IntFlag):
    """Protocol features a side speaks (AUTH request and response), beyond version 1's base."""

    NONE = 0
    READ_RANGE_STEP = 1  # READ_RANGE's optional step
    AUTH = 2  # the AUTH op


#: What this codec speaks (the client and the bookie both send it).
FEATURES = Feature.READ_RANGE_STEP | Feature.AUTH
#: An AUTH request's credential is at most this long (a token far larger than any honest one is refused
#: by the codec, so checking one costs a bounded amount of work).
AUTH_CREDENTIAL_MAX = 4096
AUTH_SUBJECT_MAX = 256


def master_key(password: bytes) -> bytes:
    """The ledger's master key, derived from its password (as BookKeeper: SHA-1 over "ledger" + password)."""
    return hashlib.sha1(b"ledger" + password).digest()


# ---------------------------------------------------------------------------------------------------------
# Messages: small frozen dataclasses, keyword-only.


@dataclass(frozen=True, slots=True, kw_only=True)
class AddEntryRequest:
    request_id: int
    ledger_id: int
    entry_id: int
    master_key: bytes
    entry: bytes  # the client-built entry (header + digest + payload), stored as given
    flags: int = 0

    op = OpCode.ADD_ENTRY


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadEntryRequest:
    request_id: int
    ledger_id: int
    entry_id: int  # LAST_ENTRY (-1) = the last entry and the LAC
    master_key: bytes
    flags: int = 0
    previous_lac: int = -1  # LONG_POLL: answer once the LAC exceeds this
    timeout_ms: int = 0  # LONG_POLL: answer anyway after this long

    op = OpCode.READ_ENTRY


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadLacRequest:
    request_id: int
    ledger_id: int
    master_key: bytes
    flags: int = 0

    op = OpCode.READ_LAC


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteLacRequest:
    request_id: int
    ledger_id: int
    lac: int
    master_key: bytes
    lac_blob: bytes  # client-built, digest-protected encoding of the explicit LAC
    flags: int = 0

    op = OpCode.WRITE_LAC


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadRangeRequest:
    request_id: int
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    master_key: bytes
    max_bytes: int = READ_RANGE_BYTES_MAX
    flags: int = 0
    # entries first, first + step, first + 2*step, ... up to last (1: consecutive). Sent as an optional trailing
    # u32 only when not 1, so requests of clients that predate it keep their layout and meaning.
    step: int = 1

    op = OpCode.READ_RANGE


@dataclass(frozen=True, slots=True, kw_only=True)
class BookieInfoRequest:
    request_id: int
    flags: int = 0

    op = OpCode.BOOKIE_INFO


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthRequest:
    request_id: int
    method: AuthMethod = AuthMethod.NONE
    credential: bytes = b""  # the token's ASCII bytes (empty with method NONE)
    features: int = FEATURES
    flags: int = 0

    op = OpCode.AUTH


@dataclass(frozen=True, slots=True, kw_only=True)
class AddEntryResponse:
    request_id: int
    status: Status
    ledger_id: int
    entry_id: int

    op = OpCode.ADD_ENTRY


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadEntryResponse:
    request_id: int
    status: Status
    ledger_id: int
    entry_id: int
    lac: int = -1  # the bookie's known LAC for the ledger
    entry: bytes = b""  # the stored entry bytes when status is OK

    op = OpCode.READ_ENTRY


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadLacResponse:
    request_id: int
    status: Status
    ledger_id: int
    lac: int = -1  # max LAC piggybacked on stored entries
    explicit_lac: int = -1
    lac_blob: bytes = b""  # the last WRITE_LAC blob, if any

    op = OpCode.READ_LAC


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteLacResponse:
    request_id: int
    status: Status
    ledger_id: int

    op = OpCode.WRITE_LAC


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadRangeResponse:
    request_id: int
    status: Status
    ledger_id: int
    first_entry_id: int
    # the entries first_entry_id, + step, + 2*step, ... as the request asked, possibly fewer than asked
    entries: tuple[bytes, ...] = ()

    op = OpCode.READ_RANGE


@dataclass(frozen=True, slots=True)
class ReadRangeSpans:
    """A READ_RANGE response left in its frame (``decode_read_range``): entry ``k`` is
    ``data[bounds[2k]:bounds[2k + 1]]``. The client's read path verifies entries straight from ``data``."""

    request_id: int
    status: Status
    ledger_id: int
    first_entry_id: int
    data: bytes
    bounds: list[int]

    op = OpCode.READ_RANGE


@dataclass(frozen=True, slots=True, kw_only=True)
class BookieInfoResponse:
    request_id: int
    status: Status
    free_bytes: int = 0
    total_bytes: int = 0
    readonly: bool = False
    bookie_id: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    op = OpCode.BOOKIE_INFO


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthResponse:
    request_id: int
    status: Status  # OK, or UNAUTHORIZED (then the bookie closes the connection)
    mode: AuthMode = AuthMode.OFF
    features: int = FEATURES
    subject: str = ""  # the verified principal ("" when nothing was verified)

    op = OpCode.AUTH


Request = (
    AddEntryRequest
    | ReadEntryRequest
    | ReadLacRequest
    | WriteLacRequest
    | ReadRangeRequest
    | BookieInfoRequest
    | AuthRequest
)
Response = (
    AddEntryResponse
    | ReadEntryResponse
    | ReadLacResponse
    | WriteLacResponse
    | ReadRangeResponse
    | BookieInfoResponse
    | AuthResponse
)

# ---------------------------------------------------------------------------------------------------------
# Body layouts.

_KEY = f"{MASTER_KEY_LEN}s"
_ADD_REQ = struct.Struct(f">Qq{_KEY}")  # ledger, entry, key; entry bytes follow
_READ_REQ = struct.Struct(f">Qq{_KEY}qI")  # ledger, entry, key, previous_lac, timeout_ms
_READ_LAC_REQ = struct.Struct(f">Q{_KEY}")
_WRITE_LAC_REQ = struct.Struct(f">Qq{_KEY}")  # blob follows
_READ_RANGE_REQ = struct.Struct(f">Qqq{_KEY}I")
_READ_RANGE_STEP = struct.Struct(">I")  # optional, after _READ_RANGE_REQ: the step (absent = 1)

_ADD_RESP = struct.Struct(">BQq")  # status, ledger, entry
_READ_RESP = struct.Struct(">BQqq")  # status, ledger, entry, lac; entry bytes follow
_READ_LAC_RESP = struct.Struct(">BQqq")  # status, ledger, lac, explicit lac; blob follows
_WRITE_LAC_RESP = struct.Struct(">BQ")
_READ_RANGE_RESP = struct.Struct(">BQqI")  # status, ledger, first, count; then count x (u32 len, bytes)
_BOOKIE_INFO_RESP = struct.Struct(
    ">BQQBH"
)  # status, free, total, readonly, id len; id, then u32 extra len + pairs
_U32 = struct.Struct(">I")
#: Bytes of entries a READ_RANGE reply can carry within FRAME_SIZE_MAX (before each entry's u32 length)
READ_RANGE_REPLY_BYTES_MAX = FRAME_SIZE_MAX - FRAME_HEADER.size - _READ_RANGE_RESP.size
_AUTH_REQ = struct.Struct(">BI")  # method, features; credential follows
_AUTH_RESP = struct.Struct(">BBIH")  # status, mode, features, subject length; subject follows


def _frame(op: int, flags: int, request_id: int, body: bytes) -> bytes:
    n = FRAME_HEADER.size + len(body)
    if n > FRAME_SIZE_MAX:
        raise ProtocolError(f"frame of {n} bytes exceeds FRAME_SIZE_MAX={FRAME_SIZE_MAX}")
    return _HDR_FULL.pack(n, PROTOCOL_VERSION, op, flags, request_id) + body


def encode_add_request(
    request_id: int, ledger_id: int, entry_id: int, key: bytes, entry: bytes, flags: int = 0
) -> bytes:
    """Fast path for the hottest message (no dataclass allocation)."""
    n = FRAME_HEADER.size + _ADD_REQ.size + len(entry)
    if n > FRAME_SIZE_MAX or len(key) != MASTER_KEY_LEN:
        raise ProtocolError("add request too large or master key of wrong length")
    return b"".join(
        (
            _HDR_FULL.pack(n, PROTOCOL_VERSION, OpCode.ADD_ENTRY, flags, request_id),
            _ADD_REQ.pack(ledger_id, entry_id, key),
            entry,
        )
    )


def add_request_body(ledger_id: int, entry_id: int, key: bytes, entry: bytes) -> bytes:
    """The body of an ADD_ENTRY request; with ``add_request_frame`` one body serves every replica's frame."""
    if len(key) != MASTER_KEY_LEN:
        raise ProtocolError("master key of wrong length")
    return _ADD_REQ.pack(ledger_id, entry_id, key) + entry


def add_request_frame(request_id: int, flags: int, body: bytes) -> bytes:
    n = FRAME_HEADER.size + len(body)
    if n > FRAME_SIZE_MAX:
        raise ProtocolError(f"frame of {n} bytes exceeds FRAME_SIZE_MAX={FRAME_SIZE_MAX}")
    return _HDR_FULL.pack(n, PROTOCOL_VERSION, OpCode.ADD_ENTRY, flags, request_id) + body


def _check_key(key: bytes) -> None:
    if len(key) != MASTER_KEY_LEN:
        raise ProtocolError(f"master key must be {MASTER_KEY_LEN} bytes, got {len(key)}")


def encode(msg: Request | Response) -> bytes:
    """Encode one message into one frame."""
    rid = msg.request_id
    if isinstance(msg, AddEntryRequest):
        return encode_add_request(rid, msg.ledger_id, msg.entry_id, msg.master_key, msg.entry, msg.flags)
    if isinstance(msg, ReadEntryRequest):
        _check_key(msg.master_key)
        body = _READ_REQ.pack(msg.ledger_id, msg.entry_id, msg.master_key, msg.previous_lac, msg.timeout_ms)
        return _frame(msg.op, msg.flags, rid, body)
    if isinstance(msg, ReadLacRequest):
        _check_key(msg.master_key)
        return _frame(msg.op, msg.flags, rid, _READ_LAC_REQ.pack(msg.ledger_id, msg.master_key))
    if isinstance(msg, WriteLacRequest):
        _check_key(msg.master_key)
        body = _WRITE_LAC_REQ.pack(msg.ledger_id, msg.lac, msg.master_key) + msg.lac_blob
        return _frame(msg.op, msg.flags, rid, body)
    if isinstance(msg, ReadRangeRequest):
        _check_key(msg.master_key)
        body = _READ_RANGE_REQ.pack(
            msg.ledger_id, msg.first_entry_id, msg.last_entry_id, msg.master_key, msg.max_bytes
        )
        if msg.step != 1:
            body += _READ_RANGE_STEP.pack(msg.step)
        return _frame(msg.op, msg.flags, rid, body)
    if isinstance(msg, BookieInfoRequest):
        return _frame(msg.op, msg.flags, rid, b"")
    if isinstance(msg, AuthRequest):
        _check_auth(msg.method, msg.credential, msg.features)
        return _frame(msg.op, msg.flags, rid, _AUTH_REQ.pack(msg.method, msg.features) + msg.credential)
    if isinstance(msg, AddEntryResponse):
        return encode_add_response(rid, msg.status, msg.ledger_id, msg.entry_id)
    if isinstance(msg, ReadEntryResponse):
        body = _READ_RESP.pack(msg.status, msg.ledger_id, msg.entry_id, msg.lac) + msg.entry
        return _frame(msg.op, 0, rid, body)
    if isinstance(msg, ReadLacResponse):
        body = _READ_LAC_RESP.pack(msg.status, msg.ledger_id, msg.lac, msg.explicit_lac) + msg.lac_blob
        return _frame(msg.op, 0, rid, body)
    if isinstance(msg, WriteLacResponse):
        return _frame(msg.op, 0, rid, _WRITE_LAC_RESP.pack(msg.status, msg.ledger_id))
    if isinstance(msg, ReadRangeResponse):
        return encode_read_range_response(rid, msg.status, msg.ledger_id, msg.first_entry_id, msg.entries)
    if isinstance(msg, BookieInfoResponse):
        bid = msg.bookie_id.encode()
        parts = [
            _BOOKIE_INFO_RESP.pack(msg.status, msg.free_bytes, msg.total_bytes, int(msg.readonly), len(bid))
        ]
        parts.append(bid)
        extra = b"\n".join(f"{k}={v}".encode() for k, v in sorted(msg.extra.items()))
        parts.append(_U32.pack(len(extra)))
        parts.append(extra)
        return _frame(msg.op, 0, rid, b"".join(parts))
    if isinstance(msg, AuthResponse):
        subject = msg.subject.encode()
        if len(subject) > AUTH_SUBJECT_MAX or not 0 <= msg.features < 2**32:
            raise ProtocolError("AUTH response: subject too long or features out of range")
        body = _AUTH_RESP.pack(msg.status, msg.mode, msg.features, len(subject)) + subject
        return _frame(msg.op, 0, rid, body)
    raise TypeError(f"not a protocol message: {msg!r}")


def _check_auth(method: int, credential: bytes, features: int) -> None:
    if method not in AuthMethod._value2member_map_:
        raise ProtocolError(f"AUTH: unknown method {method}")
    if len(credential) > AUTH_CREDENTIAL_MAX:
        raise ProtocolError(f"AUTH: credential of {len(credential)} bytes (at most {AUTH_CREDENTIAL_MAX})")
    if method == AuthMethod.NONE and credential:
        raise ProtocolError("AUTH: method NONE carries no credential")
    if method == AuthMethod.TOKEN and not credential:
        raise ProtocolError("AUTH: method TOKEN needs a token")
    if not 0 <= features < 2**32:
        raise ProtocolError("AUTH: features out of range")


def encode_read_range_response(
    request_id: int, status: int, ledger_id: int, first_entry_id: int, entries: Sequence[bytes]
) -> bytes:
    """A READ_RANGE response frame (the bookie's path: no message object, one join)."""
    n = len(entries)
    lens = list(map(len, entries))
    size = _READ_RANGE_RESP.size + 4 * n + sum(lens)
    if FRAME_HEADER.size + size > FRAME_SIZE_MAX:
        raise ProtocolError(
            f"frame of {FRAME_HEADER.size + size} bytes exceeds FRAME_SIZE_MAX={FRAME_SIZE_MAX}"
        )
    cells: list[bytes] = [b""] * (2 * n + 2)
    cells[0] = _HDR_FULL.pack(FRAME_HEADER.size + size, PROTOCOL_VERSION, OpCode.READ_RANGE, 0, request_id)
    cells[1] = _READ_RANGE_RESP.pack(status, ledger_id, first_entry_id, n)
    cells[2::2] = map(_U32.pack, lens)  # each entry's u32 length, then the entry
    cells[3::2] = entries
    return b"".join(cells)


#: a piece of a range read: a stored run's value, its entries' offsets, the positions of the entries asked for
#: (``RocksLedgerStorage.range_runs``)
RangePiece = tuple[bytes, Sequence[int], Sequence[int]]


def encode_read_range_pieces(
    request_id: int,
    ledger_id: int,
    first_entry_id: int,
    pieces: Iterator[RangePiece],
    max_bytes: int,
    asked: int,
) -> tuple[bytes | bytearray, int, int, bool]:
    """An OK READ_RANGE response frame of the entries of ``pieces`` (at most ``asked``), at most ``max_bytes`` of
    them (at least one) and as many as fit one frame: the frame ``encode_read_range_response`` builds of those
    entries, as (frame, entries, their bytes, whether the frame limit cut them). Takes no piece past
    ``max_bytes`` (a storage walk then reads no further). No entries: (b"", 0, 0, False), for a NO_ENTRY.

    While every piece's entries have one size and lie evenly spaced in their run (a ledger of same-size
    entries: runs of consecutive entries, or a striped bookie's residues read with a step), the frame is laid
    out for them at the first piece and each piece is copied in as one strided block (numpy) as it comes, so a
    run's value is let go at once: no per-entry ``bytes``, length or join. Otherwise (or without numpy) the
    entries are cut out one by one and joined."""
    np: Any
    try:
        import numpy as np
    except ImportError:  # numpy is optional for a bookie: every reply is joined entry by entry
        np = None
    head = _HDR_FULL.size + _READ_RANGE_RESP.size
    frame = bytearray()
    rows: Any = None  # the frame's entries as rows of u32 length + entry, while they are of one size
    width = 0
    entries: list[bytes] | None = None  # once they are not: every entry cut out
    n = size = 0
    for value, offsets, picked in pieces:
        m = len(picked)
        if entries is None:
            k0 = picked[0]
            a = offsets[k0]
            w = offsets[k0 + 1] - a
            d = picked[1] - k0 if m > 1 else 1
            span = (m - 1) * d + 2  # the offsets from the first picked entry's to the last one's end
            if (
                np is not None
                and w > 0
                and (rows is None or w == width)
                and (type(picked) is range or picked == list(range(k0, k0 + m * d, d)))
                and (type(offsets) is range or offsets[k0 : k0 + span] == list(range(a, a + span * w, w)))
            ):
                if rows is None:
                    width = w
                    cap = max(1, min(asked, max_bytes // w))
                    frame = bytearray(head + cap * (4 + w))
                    rows = np.frombuffer(frame, np.uint8, offset=head).reshape(cap, 4 + w)
                    rows[:, :4] = np.frombuffer(_U32.pack(w), np.uint8)
                m = min(m, len(rows) - n)
                rows[n : n + m, 4:] = np.ndarray((m, w), np.uint8, value, a, (d * w, 1))
                n += m
                size += m * w
                if n == len(rows):
                    break
                continue
            entries = _frame_entries(frame, head, width, n)
            rows = None
        for k in picked:
            a, b = offsets[k], offsets[k + 1]
            if n and size + b - a > max_bytes:
                break
            entries.append(value[a:b])
            n += 1
            size += b - a
        else:
            continue
        break
    if entries is None and 4 * n + size > READ_RANGE_REPLY_BYTES_MAX:  # (only a request past the limits)
        entries = _frame_entries(frame, head, width, n)
    rows = None  # (lets the frame be resized)
    if entries is not None:
        fit = read_range_entries_fitting(entries)
        if fit < n:
            del entries[fit:]
            size = sum(map(len, entries))
        if not entries:
            return b"", 0, 0, False
        joined = encode_read_range_response(request_id, Status.OK, ledger_id, first_entry_id, entries)
        return joined, len(entries), size, fit < n
    if not n:
        return b"", 0, 0, False
    del frame[head + n * (4 + width) :]
    _HDR_FULL.pack_into(frame, 0, len(frame) - 4, PROTOCOL_VERSION, OpCode.READ_RANGE, 0, request_id)
    _READ_RANGE_RESP.pack_into(frame, _HDR_FULL.size, Status.OK, ledger_id, first_entry_id, n)
    return frame, n, size, False


def _frame_entries(frame: bytearray, head: int, width: int, n: int) -> list[bytes]:
    """The ``n`` entries of ``width`` bytes laid out in ``frame`` from ``head`` (each after its u32 length)."""
    view = memoryview(frame)
    try:
        return [bytes(view[i : i + width]) for i in range(head + 4, head + n * (4 + width), 4 + width)]
    finally:
        view.release()


def read_range_entries_fitting(entries: Sequence[bytes]) -> int:
    """How many of ``entries``, from the first, fit one READ_RANGE reply frame (at least one: an entry always
    fits, as its ADD_ENTRY frame did)."""
    room = READ_RANGE_REPLY_BYTES_MAX
    if 4 * len(entries) + sum(map(len, entries)) <= room:  # the usual case: no walk per entry
        return len(entries)
    for n, e in enumerate(entries):
        room -= 4 + len(e)
        if room < 0:
            return max(1, n)
    return len(entries)


_ADD_RESP_FRAME = struct.Struct(">IBBHQBQq")
ADD_RESP_FRAME = _ADD_RESP_FRAME  # a whole ADD_ENTRY response frame: u32 len, version, op, flags, rid, body
ADD_RESP_FRAME_SIZE = _ADD_RESP_FRAME.size
#: frame header + ADD_ENTRY request body before the entry bytes (used by EntryCodec.add_frame_builder)
ADD_FRAME_PREFIX = struct.Struct(f">IBBHQQq{MASTER_KEY_LEN}s")
_ADD_RESP_LEN = FRAME_HEADER.size + _ADD_RESP.size
# the first 6 bytes (u32 length, version, op) of every ADD_ENTRY response frame
_ADD_RESP_PREFIX = struct.pack(">IBB", _ADD_RESP_LEN, PROTOCOL_VERSION, OpCode.ADD_ENTRY)
#: Request ids from this value up are a client's "listened" adds (``ledger_client.bookie_conn.ADD_RID_BASE``):
#: ``FrameDecoder.take_add_acks`` recognises them by their two top bytes not both being zero.
LISTENED_RID_MIN = 1 << 48
# take_add_acks: offsets in an ADD_ENTRY response frame of the bytes every OK response shares (u32 len,
# version, op, flags; status), of the ledger id, and of the entry id
_ACK_SAME_OFFSETS = (*range(0, 8), 16)
_ACK_LEDGER_AT = 17
_ACK_EID_AT = 25
_OK = 0
_LITTLE_ENDIAN = sys.byteorder == "little"


def _gather_i64(buf: bytes | bytearray, at: int, m: int, count: int) -> array.array[int]:
    """The big-endian i64 at offset ``at`` of each of ``count`` ADD_ENTRY response frames in ``buf[:m]``."""
    size = ADD_RESP_FRAME_SIZE
    col = bytearray(8 * count)
    for k in range(8):  # gather the column into one contiguous array, byte by byte
        col[k::8] = buf[at + k : m : size]
    out = array.array("q")
    out.frombytes(col)
    if _LITTLE_ENDIAN:
        out.byteswap()
    return out


_LEN_VER_OP = struct.Struct(">IBB")
_ADD_MIN_FRAME = _HDR_FULL.size + _ADD_REQ.size  # an ADD_ENTRY frame with an empty entry
# ADD_ENTRY frame length -> row struct for take_add_requests
_ADD_ROWS: dict[int, struct.Struct] = {}
# (ADD_ENTRY frame length, entry head format) -> struct of take_add_run's heads
_ADD_HEADS: dict[tuple[int, str], struct.Struct] = {}


def encode_add_response(request_id: int, status: int, ledger_id: int, entry_id: int) -> bytes:
    return _ADD_RESP_FRAME.pack(
        _ADD_RESP_LEN, PROTOCOL_VERSION, OpCode.ADD_ENTRY, 0, request_id, status, ledger_id, entry_id
    )


def encode_add_responses(rids: Sequence[int], status: int, lids: Sequence[int], eids: Sequence[int]) -> bytes:
    """A group's ADD_ENTRY responses, all with ``status``: the same bytes as ``encode_add_response`` of each
    (request id, ledger id, entry id) joined, built column by column (a frame template repeated, then each
    8-byte field written one byte column at a time, a strided slice each) rather than frame by frame: a bookie
    answers each wave of adds this way."""
    n = len(rids)
    if len(lids) != n or len(eids) != n:
        raise ValueError(f"{n} request ids, {len(lids)} ledger ids, {len(eids)} entry ids")
    if n < _RESP_COLUMNS_MIN:
        return b"".join(map(encode_add_response, rids, itertools.repeat(status, n), lids, eids))
    one_ledger = lids.count(lids[0]) == n
    buf = bytearray(encode_add_response(0, status, lids[0] if one_ledger else 0, 0)) * n
    _put_u64_column(buf, _RESP_RID_AT, rids, "Q")
    if not one_ledger:
        _put_u64_column(buf, _RESP_LID_AT, lids, "Q")
    _put_u64_column(buf, _RESP_EID_AT, eids, "q")
    return bytes(buf)


# where encode_add_responses writes each 8-byte field of an ADD_ENTRY response frame (">IBBHQBQq")
_RESP_RID_AT, _RESP_LID_AT, _RESP_EID_AT = 8, 17, 25
_RESP_COLUMNS_MIN = 8  # fewer responses than this: frame by frame


def _put_u64_column(buf: bytearray, offset: int, values: Sequence[int], code: str) -> None:
    """Write ``values`` big-endian (array ``code`` "Q" or "q") at ``offset`` of each ADD_ENTRY response frame."""
    col = array.array(code, values)
    if sys.byteorder == "little":
        col.byteswap()
    raw = col.tobytes()
    for k in range(8):
        buf[offset + k :: ADD_RESP_FRAME_SIZE] = raw[k::8]


# ---------------------------------------------------------------------------------------------------------
# Decoding.


def _status(v: int) -> Status:
    try:
        return Status(v)
    except ValueError:
        raise ProtocolError(f"unknown status {v}") from None


def _need(body: memoryview, n: int, what: str) -> None:
    if len(body) < n:
        raise ProtocolError(f"{what}: body of {len(body)} bytes, need at least {n}")


def _exact(body: memoryview, n: int, what: str) -> None:
    if len(body) != n:
        raise ProtocolError(f"{what}: body of {len(body)} bytes, expected {n}")


def decode_request(op: int, flags: int, rid: int, body: memoryview) -> Request:
    if op == OpCode.ADD_ENTRY:
        _need(body, _ADD_REQ.size, "ADD_ENTRY")
        ledger, entry, key = _ADD_REQ.unpack_from(body)
        return AddEntryRequest(
            request_id=rid,
            ledger_id=ledger,
            entry_id=entry,
            master_key=key,
            entry=bytes(body[_ADD_REQ.size :]),
            flags=flags,
        )
    if op == OpCode.READ_ENTRY:
        _exact(body, _READ_REQ.size, "READ_ENTRY")
        ledger, entry, key, prev, timeout = _READ_REQ.unpack_from(body)
        return ReadEntryRequest(
            request_id=rid,
            ledger_id=ledger,
            entry_id=entry,
            master_key=key,
            flags=flags,
            previous_lac=prev,
            timeout_ms=timeout,
        )
    if op == OpCode.READ_LAC:
        _exact(body, _READ_LAC_REQ.size, "READ_LAC")
        ledger, key = _READ_LAC_REQ.unpack_from(body)
        return ReadLacRequest(request_id=rid, ledger_id=ledger, master_key=key, flags=flags)
    if op == OpCode.WRITE_LAC:
        _need(body, _WRITE_LAC_REQ.size, "WRITE_LAC")
        ledger, lac, key = _WRITE_LAC_REQ.unpack_from(body)
        return WriteLacRequest(
            request_id=rid,
            ledger_id=ledger,
            lac=lac,
            master_key=key,
            lac_blob=bytes(body[_WRITE_LAC_REQ.size :]),
            flags=flags,
        )
    if op == OpCode.READ_RANGE:
        step = 1
        if len(body) == _READ_RANGE_REQ.size + _READ_RANGE_STEP.size:
            (step,) = _READ_RANGE_STEP.unpack_from(body, _READ_RANGE_REQ.size)
            if step == 1:
                raise ProtocolError("READ_RANGE: a step of 1 is sent by leaving the step out")
        else:
            _exact(body, _READ_RANGE_REQ.size, "READ_RANGE")
        ledger, first, last, key, max_bytes = _READ_RANGE_REQ.unpack_from(body)
        return ReadRangeRequest(
            request_id=rid,
            ledger_id=ledger,
            first_entry_id=first,
            last_entry_id=last,
            master_key=key,
            max_bytes=max_bytes,
            flags=flags,
            step=step,
        )
    if op == OpCode.BOOKIE_INFO:
        _exact(body, 0, "BOOKIE_INFO")
        return BookieInfoRequest(request_id=rid, flags=flags)
    if op == OpCode.AUTH:
        _need(body, _AUTH_REQ.size, "AUTH")
        method, features = _AUTH_REQ.unpack_from(body)
        credential = bytes(body[_AUTH_REQ.size :])
        _check_auth(method, credential, features)
        return AuthRequest(
            request_id=rid, method=AuthMethod(method), credential=credential, features=features, flags=flags
        )
    raise ProtocolError(f"unknown op code {op}")


def decode_response(op: int, flags: int, rid: int, body: memoryview) -> Response:
    if op == OpCode.ADD_ENTRY:
        _exact(body, _ADD_RESP.size, "ADD_ENTRY response")
        st, ledger, entry = _ADD_RESP.unpack_from(body)
        return AddEntryResponse(request_id=rid, status=_status(st), ledger_id=ledger, entry_id=entry)
    if op == OpCode.READ_ENTRY:
        _need(body, _READ_RESP.size, "READ_ENTRY response")
        st, ledger, entry, lac = _READ_RESP.unpack_from(body)
        return ReadEntryResponse(
            request_id=rid,
            status=_status(st),
            ledger_id=ledger,
            entry_id=entry,
            lac=lac,
            entry=bytes(body[_READ_RESP.size :]),
        )
    if op == OpCode.READ_LAC:
        _need(body, _READ_LAC_RESP.size, "READ_LAC response")
        st, ledger, lac, elac = _READ_LAC_RESP.unpack_from(body)
        return ReadLacResponse(
            request_id=rid,
            status=_status(st),
            ledger_id=ledger,
            lac=lac,
            explicit_lac=elac,
            lac_blob=bytes(body[_READ_LAC_RESP.size :]),
        )
    if op == OpCode.WRITE_LAC:
        _exact(body, _WRITE_LAC_RESP.size, "WRITE_LAC response")
        st, ledger = _WRITE_LAC_RESP.unpack_from(body)
        return WriteLacResponse(request_id=rid, status=_status(st), ledger_id=ledger)
    if op == OpCode.READ_RANGE:
        data = bytes(body)
        r = decode_read_range(rid, data, 0, len(data))
        bounds = r.bounds
        return ReadRangeResponse(
            request_id=rid,
            status=r.status,
            ledger_id=r.ledger_id,
            first_entry_id=r.first_entry_id,
            entries=tuple(data[bounds[k] : bounds[k + 1]] for k in range(0, len(bounds), 2)),
        )
    if op == OpCode.BOOKIE_INFO:
        _need(body, _BOOKIE_INFO_RESP.size, "BOOKIE_INFO response")
        st, free, total, ro, idlen = _BOOKIE_INFO_RESP.unpack_from(body)
        pos = _BOOKIE_INFO_RESP.size
        _need(body[pos:], idlen + 4, "BOOKIE_INFO id")
        try:
            bid = bytes(body[pos : pos + idlen]).decode()
            pos += idlen
            (n,) = _U32.unpack_from(body, pos)
            pos += 4
            _exact(body[pos:], n, "BOOKIE_INFO extra")
            extra: dict[str, str] = {}
            raw = bytes(body[pos:]).decode()
        except UnicodeDecodeError as e:
            raise ProtocolError(f"BOOKIE_INFO: bad text: {e}") from None
        for line in raw.split("\n") if raw else ():
            k, sep, v = line.partition("=")
            if not sep:
                raise ProtocolError("BOOKIE_INFO: bad extra pair")
            extra[k] = v
        return BookieInfoResponse(
            request_id=rid,
            status=_status(st),
            free_bytes=free,
            total_bytes=total,
            readonly=bool(ro),
            bookie_id=bid,
            extra=extra,
        )
    if op == OpCode.AUTH:
        _need(body, _AUTH_RESP.size, "AUTH response")
        st, mode, features, n = _AUTH_RESP.unpack_from(body)
        _exact(body[_AUTH_RESP.size :], n, "AUTH response subject")
        if n > AUTH_SUBJECT_MAX:
            raise ProtocolError(f"AUTH response: subject of {n} bytes")
        try:
            subject = bytes(body[_AUTH_RESP.size :]).decode()
            auth_mode = AuthMode(mode)
        except (UnicodeDecodeError, ValueError) as e:
            raise ProtocolError(f"AUTH response: {e}") from None
        return AuthResponse(
            request_id=rid, status=_status(st), mode=auth_mode, features=features, subject=subject
        )
    raise ProtocolError(f"unknown op code {op}")


def decode_read_range(rid: int, data: bytes, start: int, end: int) -> ReadRangeSpans:
    """A READ_RANGE response body, ``data[start:end]``, decoded in one pass without copying its entries: their
    spans in ``data`` (the read path's fast decode; ``decode_response`` copies them out)."""
    if end - start < _READ_RANGE_RESP.size:
        raise ProtocolError(f"READ_RANGE response: body of {end - start} bytes, need {_READ_RANGE_RESP.size}")
    st, ledger, first, count = _READ_RANGE_RESP.unpack_from(data, start)
    pos = start + _READ_RANGE_RESP.size
    if count > (end - pos) // 4:
        raise ProtocolError(f"READ_RANGE response: {count} entries cannot fit {end - pos} bytes")
    bounds = [0] * (2 * count)
    if count and _evenly_spaced(data, pos, end, count):
        stride = (end - pos) // count  # every entry of the same size: the spans are arithmetic
        bounds[0::2] = range(pos + 4, end + 4, stride)
        bounds[1::2] = range(pos + stride, end + 1, stride)
        return ReadRangeSpans(rid, _status(st), ledger, first, data, bounds)
    unpack = _U32.unpack_from
    try:
        for k in range(0, 2 * count, 2):
            (n,) = unpack(data, pos)
            pos += 4
            bounds[k] = pos
            pos += n
            bounds[k + 1] = pos
    except struct.error:
        pos = end + 1  # a length field past the data: an overrun, reported below
    # positions only grow, so an entry (or a length field) reaching past the body leaves pos past its end
    if pos != end:
        raise ProtocolError(
            "READ_RANGE response: entries overrun the body" if pos > end else "trailing bytes"
        )
    return ReadRangeSpans(rid, _status(st), ledger, first, data, bounds)


#: a frame at least this large is gathered from its chunks and joined once (``FrameDecoder.feed``), not grown
_GATHER_MIN = 64 * 1024


def _evenly_spaced(data: bytes, pos: int, end: int, count: int) -> bool:
    """Whether ``data[pos:end]`` is ``count`` entries of one size, each after its u32 length: the length fields
    are compared byte by byte as four strided slices (C loops, none per entry in Python)."""
    span = end - pos
    if span % count:
        return False
    stride = span // count
    if stride < 4 or _U32.unpack_from(data, pos)[0] != stride - 4:
        return False
    field = (stride - 4).to_bytes(4, "big")
    return all(data[pos + i : end : stride] == field[i : i + 1] * count for i in range(4))


class FrameDecoder:
    """Incremental frame splitter: ``feed(chunk)`` then iterate ``frames()`` (pure, no I/O).

    Raises :class:`ProtocolError` on an oversized, undersized or wrong-version frame; after that the stream
    is unusable (there is no way to resynchronise a length-prefixed stream).
    """

    __slots__ = ("_buf", "_parts", "_parts_len", "_need", "frame_size_max", "broken")

    def __init__(self, frame_size_max: int = FRAME_SIZE_MAX) -> None:
        # a received chunk is kept as it came (bytes, no copy) while nothing else is buffered; a partial frame
        # left over is kept in a bytearray that later chunks extend, unless it is a large one: then the chunks
        # are gathered in _parts (the first of them stays in _buf) and joined once, into bytes, when the frame
        # is whole (_need bytes)
        self._buf: bytes | bytearray = b""
        self._parts: list[bytes | bytearray] = []
        self._parts_len = 0
        self._need = 0
        self.frame_size_max = frame_size_max
        self.broken = False

    def feed(self, data: bytes) -> None:
        parts = self._parts
        if parts:
            parts.append(data)
            self._parts_len += len(data)
            if self._parts_len >= self._need:
                self._buf = b"".join(parts)
                self._parts = []
            return
        buf = self._buf
        if not buf and type(data) is bytes:
            self._buf = data
            return
        n = len(buf)
        if n >= 4:
            need = 4 + _LEN.unpack_from(buf)[0]
            if _GATHER_MIN <= need <= 4 + self.frame_size_max and n < need:
                if n + len(data) >= need:
                    self._buf = b"".join((buf, data))
                else:
                    self._parts, self._parts_len, self._need = [buf, data], n + len(data), need
                return
        if type(buf) is bytearray:
            buf += data
        else:
            grown = bytearray(buf)
            grown += data
            self._buf = grown

    def _consume(self, m: int) -> None:
        """Drop the first ``m`` buffered bytes."""
        buf = self._buf
        if m >= len(buf):
            self._buf = b""
        elif type(buf) is bytearray:
            del buf[:m]
        else:
            self._buf = bytearray(memoryview(buf)[m:])

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame (a partial frame in progress)."""
        return self._parts_len if self._parts else len(self._buf)

    def frames_raw(self) -> Iterator[tuple[int, int, int, bytes, int, int]]:
        """Yield (op, flags, request_id, data, body_start, body_end) for each whole frame buffered.

        ``data`` is one immutable snapshot shared by the frames of this call (one copy for the lot): the body
        is ``data[body_start:body_end]``. Hot paths slice only what they keep.
        """
        if self.broken:
            raise ProtocolError("decoder already failed")
        buf = self._buf
        n = len(buf)
        end = 0
        error: ProtocolError | None = None
        while n - end >= 4:  # find the whole frames first (headers only), then copy them once
            (length,) = _LEN.unpack_from(buf, end)
            if length < FRAME_HEADER.size or length > self.frame_size_max:
                error = ProtocolError(
                    f"frame length {length} outside [{FRAME_HEADER.size}, {self.frame_size_max}]"
                )
                break
            if n - end < 4 + length:
                break
            end += 4 + length
        if end:
            if type(buf) is bytes:  # (immutable: the frames are read where they lie, whatever follows them)
                data = buf
            else:
                with memoryview(buf) as mv:
                    data = bytes(mv[:end])
            self._consume(end)
            pos = 0
            hdr = _HDR_FULL.unpack_from
            while pos < end:
                length, version, op, flags, rid = hdr(data, pos)
                if version != PROTOCOL_VERSION:
                    self.broken = True
                    self._buf = b""
                    raise ProtocolError(f"unsupported protocol version {version}")
                body_start = pos + _HDR_FULL.size
                pos += 4 + length
                yield op, flags, rid, data, body_start, pos
        if error is not None:
            self.broken = True
            raise error

    def take_add_requests(self) -> list[tuple[int, int, int, int, bytes, bytes]] | None:
        """Fast path for bookies: the run of whole ADD_ENTRY request frames of one size at the start of the
        buffer (the common case under load: a client pipelining same-size entries), consumed and unpacked in
        one ``iter_unpack`` pass as (flags, request_id, ledger_id, entry_id, master_key, entry) rows.
        Returns None, leaving the buffer alone, when the first buffered frame is not a whole ADD_ENTRY frame
        (``frames_raw`` then handles what is there, including any error)."""
        run = self.take_add_run()
        return None if run is None else run[0]

    def take_add_run(
        self, entry_head: struct.Struct | None = None
    ) -> tuple[list[tuple[int, int, int, int, bytes, bytes]], list[tuple[Any, ...]] | None] | None:
        """``take_add_requests``, and with ``entry_head`` also that struct unpacked from the start of each
        entry of the run (in one more ``iter_unpack`` pass over the same bytes): (rows, heads), heads None
        when the run's entries are shorter than ``entry_head``."""
        buf = self._buf
        n = len(buf)
        if n < _ADD_MIN_FRAME or self.broken:
            return None
        length, version, op = _LEN_VER_OP.unpack_from(buf)
        if op != OpCode.ADD_ENTRY or version != PROTOCOL_VERSION:
            return None
        if length < _ADD_MIN_FRAME - 4 or length > self.frame_size_max:
            return None
        size = 4 + length
        count = n // size
        if not count:
            return None
        row_struct = _ADD_ROWS.get(length)
        if row_struct is None:
            if len(_ADD_ROWS) >= 64:
                _ADD_ROWS.clear()
            row_struct = _ADD_ROWS[length] = struct.Struct(f">6xHQQq{_KEY}{size - _ADD_MIN_FRAME}s")
        m = count * size
        # the run: the frames whose u32 length, version and op (6 bytes) equal the first frame's
        for k in range(6):  # column by column (a strided slice each), not frame by frame
            if buf[k:m:size].count(buf[k]) != count:  # another frame follows the run: stop before it
                prefix = buf[:6]
                count = 1
                while count * size < m and buf[count * size : count * size + 6] == prefix:
                    count += 1
                m = count * size
                break
        heads: list[tuple[Any, ...]] | None = None
        with memoryview(buf) as mv:
            run = mv[:m]
            rows = list(row_struct.iter_unpack(run))
            if entry_head is not None and size - _ADD_MIN_FRAME >= entry_head.size:
                key = (length, entry_head.format)
                head_struct = _ADD_HEADS.get(key)
                if head_struct is None:
                    if len(_ADD_HEADS) >= 64:
                        _ADD_HEADS.clear()
                    if entry_head.format[:1] not in (">", "!"):
                        raise ValueError("entry_head must be a big-endian (standard size) struct")
                    fmt = entry_head.format[1:]
                    rest = size - _ADD_MIN_FRAME - entry_head.size
                    head_struct = _ADD_HEADS[key] = struct.Struct(f">{_ADD_MIN_FRAME}x{fmt}{rest}x")
                heads = list(head_struct.iter_unpack(run))
            run.release()
        self._consume(m)
        return rows, heads

    def take_leading_add_responses(self) -> list[tuple[int, int, int, int, int, int, int, int]]:
        """Fast path for clients: consume and return, unpacked as (len, version, op, flags, request_id, status,
        ledger, entry) rows, the whole ADD_ENTRY responses at the front of the buffer, up to the first other or
        partial frame, which stay buffered for ``frames_raw``. Under load a received chunk usually ends inside
        a frame."""
        buf = self._buf
        size = ADD_RESP_FRAME_SIZE
        count = len(buf) // size
        if not count or self.broken or buf[:6] != _ADD_RESP_PREFIX:
            return []  # (the first frame decides: a buffer of other frames is not unpacked)
        m = count * size
        # the run of frames whose u32 length, version and op (6 bytes) are an ADD_ENTRY response's: when the
        # last whole-frame slot starts like one, check every slot column by column; else walk frame by frame
        if buf[m - size : m - size + 6] != _ADD_RESP_PREFIX or any(
            buf[k:m:size].count(buf[k]) != count for k in range(6)
        ):
            count = 1
            while count * size < m and buf[count * size : count * size + 6] == _ADD_RESP_PREFIX:
                count += 1
            m = count * size
        with memoryview(buf) as mv:
            rows = list(_ADD_RESP_FRAME.iter_unpack(mv[:m]))
        self._consume(m)
        return rows

    def take_add_acks(self) -> tuple[int, array.array[int]] | None:
        """Fast path for clients: when every whole frame buffered is an OK ADD_ENTRY response of one ledger
        to a listened add (request id >= ``LISTENED_RID_MIN``) — a writer's acks, the common case under load —
        consume them and return (ledger id, their entry ids in arrival order). Otherwise return None and leave
        the buffer alone (``take_leading_add_responses`` and ``frames_raw`` then take what is there).

        Works on the raw bytes column by column (one strided slice per byte offset, the same cost whatever
        the number of frames), not frame by frame."""
        groups = self._take_acks(many=False)
        return None if groups is None else groups[0]

    def take_add_ack_groups(self) -> list[tuple[int, array.array[int]]] | None:
        """``take_add_acks`` for chunks that may interleave several ledgers' acks (their writers' handles share
        the connection): one (ledger id, entry ids in arrival order) per ledger, in the order the ledgers first
        appear. Ledgers' acks usually come in runs (a handle sends its adds in one write), which are found in
        C (``itertools.groupby`` over the gathered ledger ids), not row by row in Python."""
        return self._take_acks(many=True)

    def _take_acks(self, *, many: bool) -> list[tuple[int, array.array[int]]] | None:
        buf = self._buf
        size = ADD_RESP_FRAME_SIZE
        count = len(buf) // size
        if not count or self.broken:
            return None
        length, version, op, _, rid, status, ledger_id, _ = _ADD_RESP_FRAME.unpack_from(buf)
        if (
            length != size - 4
            or version != PROTOCOL_VERSION
            or op != OpCode.ADD_ENTRY
            or status != _OK
            or rid < LISTENED_RID_MIN
        ):
            return None
        m = count * size
        for k in _ACK_SAME_OFFSETS:  # every frame's byte k equals the first frame's
            if buf[k:m:size].count(buf[k]) != count:
                return None
        # rid >= 2**48 <=> its top two bytes are not both zero: check one of them is nonzero in every frame
        if 0 in buf[9:m:size] and 0 in buf[8:m:size]:
            return None  # (also when only a mix would do: rare enough to leave to the slower path)
        one_ledger = True
        for k in range(_ACK_LEDGER_AT, _ACK_LEDGER_AT + 8):
            if buf[k:m:size].count(buf[k]) != count:
                if not many:
                    return None
                one_ledger = False
                break
        eids = _gather_i64(buf, _ACK_EID_AT, m, count)
        if one_ledger:
            groups = [(ledger_id, eids)]
        else:
            by_ledger: dict[int, array.array[int]] = {}
            at = 0
            for lid, run in itertools.groupby(_gather_i64(buf, _ACK_LEDGER_AT, m, count)):
                n = len(list(run))
                got = by_ledger.get(lid)
                if got is None:
                    by_ledger[lid] = eids[at : at + n]
                else:
                    got.extend(eids[at : at + n])
                at += n
            groups = list(by_ledger.items())
        self._consume(m)
        return groups

    def frames(self) -> Iterator[tuple[int, int, int, memoryview]]:
        """Yield (op, flags, request_id, body) for each whole frame buffered."""
        for op, flags, rid, data, a, b in self.frames_raw():
            yield op, flags, rid, memoryview(data)[a:b]

    def requests(self) -> Iterator[Request]:
        for op, flags, rid, body in self.frames():
            yield decode_request(op, flags, rid, body)

    def responses(self) -> Iterator[Response]:
        for op, flags, rid, body in self.frames():
            yield decode_response(op, flags, rid, body)


def decode_one_request(frame: bytes) -> Request:
    """Decode exactly one whole frame (used by tests and tools)."""
    d = FrameDecoder()
    d.feed(frame)
    out = list(d.requests())
    if len(out) != 1 or d.buffered:
        raise ProtocolError("expected exactly one whole frame")
    return out[0]


def decode_one_response(frame: bytes) -> Response:
    d = FrameDecoder()
    d.feed(frame)
    out = list(d.responses())
    if len(out) != 1 or d.buffered:
        raise ProtocolError("expected exactly one whole frame")
    return out[0]
