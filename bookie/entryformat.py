"""Entry format: built by the client, stored by bookies as given, verified by readers.

Layout (big-endian)::

    u64 ledger_id | i64 entry_id | i64 lac (LAC at send time) | u64 length (cumulative ledger length)
    digest (DIGEST_LEN[type] bytes, over header + payload)
    payload

Bookies only look at the header (``peek_header``) to learn the piggybacked LAC; they never check digests.
The explicit-LAC blob written by WRITE_LAC is ``u64 ledger_id | i64 lac | digest``.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import crc32c as _crc32c

from .protocol import ADD_FRAME_PREFIX as _ADD_FRAME_PREFIX
from .protocol import FRAME_SIZE_MAX as _FRAME_SIZE_MAX
from .protocol import MASTER_KEY_LEN as _MASTER_KEY_LEN
from .protocol import PROTOCOL_VERSION as _VERSION
from .protocol import OpCode as _OpCode
from .protocol import ProtocolError as _ProtocolError

_ADD_PREFIX_LEN = _ADD_FRAME_PREFIX.size - 4  # frame_len counts the bytes after itself
_OP_ADD = int(_OpCode.ADD_ENTRY)

#: Where the entry starts in an ADD_ENTRY frame (after the frame header and the request's ledger/entry/key).
ADD_FRAME_ENTRY_OFFSET = _ADD_FRAME_PREFIX.size

HEADER = struct.Struct(">QqqQ")
# An ADD_ENTRY frame up to the digest: frame header, request fields, entry header (add_frame_builder).
_ADD_FRAME_HEAD = struct.Struct(_ADD_FRAME_PREFIX.format + HEADER.format.lstrip(">"))
_HEADER_AT = _ADD_FRAME_PREFIX.size
HEADER_LEN = HEADER.size  # 32
_LAC_BLOB = struct.Struct(">Qq")
_CRC = struct.Struct(">I")
# a CRC32C entry's ledger id, entry id and digest (skipping the LAC and length): verify_spans' one unpack
_HEAD_CRC = struct.Struct(">Qq16xI")
assert _HEAD_CRC.size == HEADER.size + 4


class DigestType(enum.Enum):
    CRC32C = "CRC32C"
    CRC32 = "CRC32"
    HMAC = "HMAC"  # HMAC-SHA256 keyed by the master key
    DUMMY = "DUMMY"


DIGEST_LEN = {DigestType.CRC32C: 4, DigestType.CRC32: 4, DigestType.HMAC: 32, DigestType.DUMMY: 0}


class DigestMismatchError(ValueError):
    """An entry whose digest does not match its bytes (corruption or a wrong digest type/key)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EntryHeader:
    ledger_id: int
    entry_id: int
    lac: int
    length: int


def peek_header(entry: bytes | memoryview) -> EntryHeader:
    if len(entry) < HEADER_LEN:
        raise ValueError(f"entry of {len(entry)} bytes is shorter than its {HEADER_LEN}-byte header")
    lid, eid, lac, length = HEADER.unpack_from(entry)
    return EntryHeader(ledger_id=lid, entry_id=eid, lac=lac, length=length)


def peek_lac(entry: bytes | memoryview) -> int:
    """The LAC piggybacked in an entry (bookie fast path; -1 when the entry is too short to carry one)."""
    if len(entry) < HEADER_LEN:
        return -1
    return int(struct.unpack_from(">q", entry, 16)[0])


def _digest(kind: DigestType, key: bytes, data: bytes) -> bytes:
    if kind is DigestType.CRC32C:
        return _crc32c.crc32c(data).to_bytes(4, "big")
    if kind is DigestType.CRC32:
        return zlib.crc32(data).to_bytes(4, "big")
    if kind is DigestType.HMAC:
        return hmac.new(key, data, hashlib.sha256).digest()
    return b""


class EntryCodec:
    """Builds and verifies entries of one ledger (one digest type and key)."""

    __slots__ = ("ledger_id", "digest_type", "key", "_dlen")

    def __init__(self, ledger_id: int, digest_type: DigestType, key: bytes = b"") -> None:
        self.ledger_id = ledger_id
        self.digest_type = digest_type
        self.key = key
        self._dlen = DIGEST_LEN[digest_type]

    def build(self, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
        header = HEADER.pack(self.ledger_id, entry_id, lac, length)
        if self.digest_type is DigestType.CRC32C:
            # crc32c is incremental: digest(header + payload) without concatenating first.
            c = _crc32c.crc32c(payload, _crc32c.crc32c(header))
            return b"".join((header, c.to_bytes(4, "big"), payload))
        d = _digest(self.digest_type, self.key, header + payload)
        return b"".join((header, d, payload))

    def add_frame_builder(self, key: bytes, flags: int = 0) -> Callable[[int, int, int, int, bytes], bytes]:
        """``build(request_id, entry_id, lac, length, payload) -> ADD_ENTRY frame`` for this ledger and master
        key: the writer's hot path (one pack for the frame and entry headers, one copy of the payload; the
        same frame goes to every bookie of the write set). The entry is ``frame[ADD_FRAME_ENTRY_OFFSET:]``."""
        if len(key) != _MASTER_KEY_LEN:
            raise _ProtocolError(f"master key must be {_MASTER_KEY_LEN} bytes, got {len(key)}")
        ledger_id = self.ledger_id
        pack = _ADD_FRAME_HEAD.pack
        fixed = _ADD_PREFIX_LEN + HEADER_LEN + self._dlen  # frame length without the payload
        limit = _FRAME_SIZE_MAX - fixed
        join = b"".join
        if self.digest_type is DigestType.CRC32C:
            crc = _crc32c.crc32c

            def digest(header: bytes, payload: bytes) -> bytes:  # incremental: no header + payload copy
                return crc(payload, crc(header)).to_bytes(4, "big")
        else:
            kind, dkey = self.digest_type, self.key

            def digest(header: bytes, payload: bytes) -> bytes:
                return _digest(kind, dkey, header + payload)

        def build(request_id: int, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
            n = len(payload)
            if n > limit:
                raise _ProtocolError(f"add frame of {fixed + n} bytes exceeds FRAME_SIZE_MAX")
            head = pack(
                fixed + n, _VERSION, _OP_ADD, flags, request_id, ledger_id, entry_id, key,
                ledger_id, entry_id, lac, length,
            )  # fmt: skip
            return join((head, digest(head[_HEADER_AT:], payload), payload))

        return build

    def verify(self, entry: bytes, expected_entry_id: int | None = None) -> tuple[EntryHeader, bytes]:
        """Return (header, payload) or raise DigestMismatchError."""
        n = HEADER_LEN + self._dlen
        if len(entry) < n:
            raise DigestMismatchError(f"entry of {len(entry)} bytes is shorter than header+digest ({n})")
        lid, eid, lac, length = HEADER.unpack_from(entry)
        if lid != self.ledger_id:
            raise DigestMismatchError(f"entry belongs to ledger {lid}, expected {self.ledger_id}")
        if expected_entry_id is not None and eid != expected_entry_id:
            raise DigestMismatchError(f"entry id {eid}, expected {expected_entry_id}")
        payload = entry[n:]
        if self.digest_type is DigestType.CRC32C:
            with memoryview(entry) as mv:
                ok = (
                    _crc32c.crc32c(payload, _crc32c.crc32c(mv[:HEADER_LEN]))
                    == _CRC.unpack_from(entry, HEADER_LEN)[0]
                )
        else:
            want = _digest(self.digest_type, self.key, bytes(entry[:HEADER_LEN]) + payload)
            ok = hmac.compare_digest(bytes(entry[HEADER_LEN:n]), want)
        if not ok:
            raise DigestMismatchError(f"digest mismatch for ledger {lid} entry {eid}")
        return EntryHeader(ledger_id=lid, entry_id=eid, lac=lac, length=length), bytes(payload)

    def verify_spans(
        self, data: bytes, bounds: Sequence[int], entry_id: int, step: int = 1
    ) -> tuple[list[bytes], str | None]:
        """Verify the entries ``data[bounds[2k]:bounds[2k + 1]]`` (a READ_RANGE reply left in its frame,
        ``protocol.decode_read_range``), expected to be entries ``entry_id``, ``entry_id + step``, ...: their
        payloads up to the first that fails, and why it failed (None when none did). The read path's hot loop:
        no copy but the payload, one header unpack and two CRC32C calls per entry (for CRC32C ledgers)."""
        out: list[bytes] = []
        if self.digest_type is not DigestType.CRC32C:
            for k in range(0, len(bounds), 2):
                try:
                    out.append(self.verify(data[bounds[k] : bounds[k + 1]], entry_id)[1])
                except DigestMismatchError as e:
                    return out, str(e)
                entry_id += step
            return out, None
        crc = _crc32c.crc32c
        head = _HEAD_CRC.unpack_from
        lid_want = self.ledger_id
        fixed = _HEAD_CRC.size
        with memoryview(data) as mv:
            for k in range(0, len(bounds), 2):
                a = bounds[k]
                b = bounds[k + 1]
                if b - a < fixed:
                    return out, f"entry {entry_id}: {b - a} bytes, shorter than header+digest ({fixed})"
                lid, eid, digest = head(data, a)
                if lid != lid_want or eid != entry_id:
                    return out, f"entry {entry_id}: header names ledger {lid} entry {eid}"
                payload = data[a + fixed : b]
                if crc(payload, crc(mv[a : a + HEADER_LEN])) != digest:
                    return out, f"digest mismatch for ledger {lid} entry {eid}"
                out.append(payload)
                entry_id += step
        return out, None

    def build_lac(self, lac: int) -> bytes:
        body = _LAC_BLOB.pack(self.ledger_id, lac)
        return body + _digest(self.digest_type, self.key, body)

    def verify_lac(self, blob: bytes) -> int:
        n = _LAC_BLOB.size
        if len(blob) != n + self._dlen:
            raise DigestMismatchError("explicit LAC blob of wrong size")
        lid, lac = _LAC_BLOB.unpack_from(blob)
        if lid != self.ledger_id or not hmac.compare_digest(
            blob[n:], _digest(self.digest_type, self.key, blob[:n])
        ):
            raise DigestMismatchError("explicit LAC blob digest mismatch")
        return int(lac)
