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
import itertools
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import sub as _sub
from typing import Any, Literal, overload

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


_HEADS_STRUCTS: dict[tuple[int, int], struct.Struct] = {}


def _heads_struct(gap: int, n: int) -> struct.Struct:
    """One ``struct`` reading the ledger id, entry id and CRC32C digest of ``n`` entries spaced ``gap`` bytes
    apart (from one entry's payload to the next entry's header): ``verify_spans``' one unpack per reply."""
    s = _HEADS_STRUCTS.get((gap, n))
    if s is None:
        if len(_HEADS_STRUCTS) >= 64:
            _HEADS_STRUCTS.clear()
        one = _HEAD_CRC.format.lstrip(">")
        s = _HEADS_STRUCTS[(gap, n)] = struct.Struct(">" + f"{one}{gap}x" * (n - 1) + one)
    return s


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

    @overload
    def verify_spans(
        self, data: bytes, bounds: Sequence[int], entry_id: int, step: int = 1, rows: Literal[False] = False
    ) -> tuple[list[bytes], str | None]: ...

    @overload
    def verify_spans(
        self, data: bytes, bounds: Sequence[int], entry_id: int, step: int, rows: bool
    ) -> tuple[Any, str | None]: ...

    def verify_spans(
        self, data: bytes, bounds: Sequence[int], entry_id: int, step: int = 1, rows: bool = False
    ) -> tuple[Any, str | None]:
        """Verify the entries ``data[bounds[2k]:bounds[2k + 1]]`` (a READ_RANGE reply left in its frame,
        ``protocol.decode_read_range``), expected to be entries ``entry_id``, ``entry_id + step``, ...: their
        payloads up to the first that fails, and why it failed (None when none did). The read path's hot loop,
        for CRC32C ledgers run column-wise: every header unpacked by one call (one ``struct`` for the lot when
        the entries are evenly spaced, as a reply of same-size entries is), the ids compared as whole tuples,
        and the payload slices and both CRC32C calls of every entry done by ``map`` (no bytecode per entry).

        The payloads are a list of ``bytes``; with ``rows`` (needs numpy), those of evenly spaced entries (one
        size: the usual reply) are instead one read-only 2-D uint8 array, a row per entry, viewing ``data``
        where the payloads lie: no object and no copy per entry (the digests are computed over views), for a
        consumer that gathers them into columns (the Spark ledger source)."""
        if self.digest_type is not DigestType.CRC32C:
            out: list[bytes] = []
            for k in range(0, len(bounds), 2):
                try:
                    out.append(self.verify(data[bounds[k] : bounds[k + 1]], entry_id)[1])
                except DigestMismatchError as e:
                    return out, str(e)
                entry_id += step
            return out, None
        starts = bounds[0::2]
        ends = bounds[1::2]
        n = len(starts)
        if not n:
            return [], None
        fixed = _HEAD_CRC.size
        why: str | None = None
        if min(map(_sub, ends, starts)) < fixed:  # an entry too short for a header: verify up to it
            n = next(k for k in range(n) if ends[k] - starts[k] < fixed)
            why = f"entry {entry_id + n * step}: {ends[n] - starts[n]} bytes, shorter than header+digest ({fixed})"
            starts, ends = starts[:n], ends[:n]
        a0 = starts[0] if n else 0
        stride = starts[1] - a0 if n > 1 else 1
        size = ends[0] - a0 if n else fixed
        even = (
            n > 0
            and stride >= size
            and starts == list(range(a0, a0 + n * stride, stride))
            and ends == list(range(a0 + size, a0 + size + n * stride, stride))
        )
        if even:
            heads = _heads_struct(stride - fixed, n).unpack_from(data, a0)
            lids, eids, digests = heads[0::3], heads[1::3], heads[2::3]
            p_starts: Sequence[int] = range(a0 + fixed, a0 + fixed + n * stride, stride)
            h_ends: Sequence[int] = range(a0 + HEADER_LEN, a0 + HEADER_LEN + n * stride, stride)
        else:
            parsed = list(map(_HEAD_CRC.unpack_from, itertools.repeat(data, n), starts))
            lids, eids, digests = (tuple(c) for c in zip(*parsed, strict=True)) if n else ((), (), ())
            p_starts = [a + fixed for a in starts]
            h_ends = [a + HEADER_LEN for a in starts]
        good = n
        want = tuple(range(entry_id, entry_id + n * step, step))
        if lids != (self.ledger_id,) * n or eids != want:
            good = next(k for k in range(n) if lids[k] != self.ledger_id or eids[k] != want[k])
            why = f"entry {want[good]}: header names ledger {lids[good]} entry {eids[good]}"
        get = data.__getitem__
        as_rows = rows and even
        cut: Callable[[slice], Any] = memoryview(data).__getitem__ if as_rows else get  # (a view: no copy)
        payloads = list(map(cut, map(slice, p_starts[:good], ends[:good])))
        crc = _crc32c.crc32c
        crcs = list(map(crc, payloads, map(crc, map(get, map(slice, starts[:good], h_ends[:good])))))
        if crcs != list(digests[:good]):
            good = next(k for k in range(good) if crcs[k] != digests[k])
            why = f"digest mismatch for ledger {lids[good]} entry {eids[good]}"
            del payloads[good:]
        if as_rows:
            import numpy as np

            # entry k is data[a0 + k * stride:][:size]; its payload follows the header and digest
            flat = np.frombuffer(data, np.uint8, count=(n - 1) * stride + size, offset=a0)
            block = np.lib.stride_tricks.as_strided(
                flat, shape=(n, size), strides=(stride, 1), writeable=False
            )
            return block[:good, fixed:], why
        return payloads, why

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
