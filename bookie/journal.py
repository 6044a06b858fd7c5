"""The bookie journal: an append-only, group-committed write-ahead log.

Every add (and every master key, fence and explicit LAC) is appended here and acknowledged only after its
record is fsynced; ledger storage (RocksDB, WAL off) is made durable lazily and a checkpoint then lets the
journal forget everything before a mark.

On-disk format (all integers big-endian)
----------------------------------------
Segment files ``<directory>/<16 lower-case hex digits seq>.jnl``, ``seq`` starting at 1 and increasing by one
per segment (a gap is corruption). A new segment is created by every ``start()`` and on rotation. Each file
starts with a 16-byte header::

    b"LSJN" | u16 version (3; 1 and 2 are still read) | u16 reserved (0) | u64 seq   (seq must match the name)

followed by records::

    u32 body_len | u32 crc32c(type byte + body, seeded) | u8 type | body

The CRC of a version-2 or -3 segment starts from ``seed(seq) = crc32c(u64 seq)`` (version 1: from 0), so a record
left over from an earlier use of a recycled file never checks out in its new segment (see "Recycling").

    ENTRY=1         body: u64 ledger_id | i64 entry_id | entry bytes
    MASTER_KEY=2    body: u64 ledger_id | key bytes
    FENCE=3         body: u64 ledger_id                (| data, normally empty)
    EXPLICIT_LAC=4  body: u64 ledger_id | i64 lac      | blob bytes
    ENTRIES=5       body: u32 n | n x u32 entry length | the n entries, concatenated
                    (a group of adds in one record; each entry names its ledger and entry id in its own first
                    16 bytes, the entry header, so replay yields them as n ENTRY records)
    SEGMENT_END=6   body: u64 seq of the next segment (version 2 and later; written on rotation and on close:
                    replay stops reading the segment there and never yields it)
    PADDING=7       body: zero bytes, as many as it takes (version 3): ends every batch on a ``ALIGNMENT``
                    boundary; replay skips it (see "Alignment")

New types either carry ``u64 ledger_id | i64 id | data`` (add them to ``_WITH_ID``) or ``u64 ledger_id | data``
(ENTRIES is the one exception).
A record with a valid CRC but an unknown type stops replay with ``JournalError`` (written by a newer version).

``<directory>/lastmark`` (written atomically: temp file + fsync + rename + directory fsync)::

    b"LSJM" | u16 version (1) | u16 reserved | u64 seq | u64 offset | u32 crc32c(of the preceding 24 bytes)

Replay and crash rules
----------------------
Replay yields every whole record at or after the persisted mark, in order. A short or CRC-failing record in
the *last* segment is a torn tail (a batch that was being written when the process or machine died, never
acknowledged): replay stops there, truncates the file to the last whole record and fsyncs it. The same in any
older segment raises ``JournalCorruptError``: those records were acknowledged. So does one in the last segment
with a later batch's record after it (a whole record on a boundary right after a whole PADDING record past the
damage, :func:`_later_batch`): one batch is in flight at a time, so the damaged one had been synced and
acknowledged, and cutting there would drop every record after it. A last segment holding no more
than a partial header is a segment whose creation was interrupted (nothing in it was ever acknowledged) and
is deleted. Segments wholly before the mark are deleted by replay too, so a crash between writing the mark
and deleting segments is finished on the next start.

Recycling
---------
Writing into blocks a file already has is much cheaper than growing a file: each fdatasync of a growing file
also commits the filesystem's allocation metadata (measured on ext4 for 64 KiB to 4 MiB writes + fdatasync:
docs/benchmarks-history.md, "Journal segments written over"). So a checkpoint does not delete segments it
no longer needs: it renames up to ``reuse_segments`` of them to ``<seq>-<unique>.free``, and a rotation renames a free
file to the new segment's name, overwrites its header and writes records over the old ones (BookKeeper's
``journalReuseFiles``). What lies beyond the last record is then an older segment's data, not end-of-file:

* the seeded CRC makes those old records fail, so the *last* segment ends at them like at a torn tail;
* an older segment (and the last one on a clean close) ends with a SEGMENT_END record, so replay knows it
  reached the end and is not reading a corrupt acknowledged record;
* a crash after renaming a free file but before its new header is durable leaves a last segment whose header
  names an older seq: nothing was written to it yet, so replay recycles it again.

Preallocation
-------------
The same cost applies to a fresh segment at low load: each lone batch's fdatasync also writes the inode (the file
grew), two device writes in turn instead of one. So when the journal is idle (a batch completed and nothing is
queued) and less than ``PREALLOC_LOW_BYTES`` of written-ahead space remains in the segment, the writer thread
writes zeros over the next ``preallocate_bytes`` and fdatasyncs them (BookKeeper's ``journalPreAllocSizeMB``);
records then overwrite blocks the file already has. Records appended meanwhile wait for that job like for a
batch in flight (a few ms, once per ``preallocate_bytes`` of journal). A loaded journal is never idle and writes
as before; a recycled segment is written ahead already. Replay meets the zeros after the last record of the last
segment: an all-zero record header ends that segment like a torn tail (and is cut off). A full disk just stops
the preallocation.

Alignment
---------
Every batch ends with a PADDING record that makes it end on a 4 KiB boundary (BookKeeper's
``journalAlignmentSize``), so every batch after a segment's first starts on one too. Without it a batch ends
mid-page: its fdatasync writes that page, and the next batch writes it again; and when the file is a recycled
one whose old pages are no longer cached, ``pwrite`` first *reads* the old page it only partly overwrites,
synchronously, on the journal's critical path (a block-layer trace under load found them). Three journal-like
writers beside three storage-like ones wrote more and synced faster with the padding
(docs/benchmarks-history.md, "Where the disk's time goes"). The cost is under 4 KiB per batch.

Direct I/O
----------
So every batch but a segment's first starts and ends on a page boundary, and the writer thread writes those with
``O_DIRECT`` (a second descriptor of the segment, from a page-aligned buffer the batch is copied into): nothing
reads a journal before a restart, so its pages need not pass through the page cache, and the ``fdatasync`` that
follows has no dirty pages to find and write back, only the device's cache to flush. Zeros written ahead go the
same way. Other writes (a segment's header and first batch, the SEGMENT_END record, truncations) stay buffered.
It is on when the filesystem accepts ``O_DIRECT`` (tmpfs does not) and the journal syncs, aligns and drops its
pages (``--no-journal-direct-io`` turns it off); a write refused with EINVAL turns it off for good. Replay reads
through the page cache as before (the kernel keeps the two views coherent).

Group commit
------------
``append`` adds the record to an in-memory ``bytearray`` and its callback to a list; nothing else happens per
record. The commit adapts to the load, with no fixed timer (BookKeeper's ``journalFlushWhenQueueEmpty``):

* **Idle writer** (no batch in flight): the first record of a batch asks for a look at the next loop iteration,
  after the loop has handled everything it read in this one. If no more records came meanwhile the batch goes
  at once; while more keep coming (each look finds new ones) it waits for them, one loop iteration at a time,
  for at most ``max_wait_ms`` from its oldest record. A lone record thus waits one loop iteration, not a timer.
* **Busy writer** (a batch in flight): records appended meanwhile form the next batch, which starts when the
  previous one completes, before that batch's callbacks run. Under load there is always one fsync in flight
  and the batch size follows the fsync time.
* **Under load** (the last batch held ``LOADED_BATCH_BYTES`` or more), both wait until the oldest record has
  waited ``max_wait_ms`` (one ``call_at`` timer): batches of a loaded journal gather what a few loop iterations
  bring, so fewer fsyncs share the disk and the CPU (without it, more bookie CPU per entry and a lower rate with
  many appends in flight on a busy machine: docs/benchmarks-history.md, "Low-load latency and appends written
  the obvious way" and "A lone add with the journal written ahead"). Light traffic never waits.
* ``flush_bytes`` buffered start a batch at once (when the writer is idle).

A batch is written (``pwrite`` + ``fdatasync``, which release the GIL) by a dedicated single-thread executor,
except on the idle path when it holds at most ``sync_inline_bytes`` and the last fsync took at most
``INLINE_FSYNC_MAX_S``: then the loop thread writes and syncs it itself. Nothing else is queued at that moment
(only one batch is ever in flight, so records arriving during the fsync could not be synced sooner), and the
two thread hand-offs of the executor (loop -> writer thread -> loop, each a wake-up that waits for a CPU on a
busy machine) are gone from a lone add's latency. On a slow or contended disk blocking the loop for a whole
fsync costs more than the hand-offs (the loop could not read, store or answer meanwhile), so a slow fsync sends
the next batches to the thread until one is fast again. Callbacks run on the event loop, in append order,
after the batch's fsync returned.

Errors: if a batch's write or fsync fails, the file is truncated back to the last good offset (and fsynced),
and ``done(exc)`` is called for every record of that batch *and* for every record appended before the failure
was observed on the loop (they would follow a hole). Records appended afterwards are tried again normally, so
the journal recovers by itself once, e.g., space is freed. If even the truncation fails, every later batch
first retries it and fails with the error until it succeeds.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import enum
import errno
import functools
import logging
import mmap
import os
import re
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c as _crc32c_mod

from .startcheck import TailVerdict, tail_verdict
from .storage import _supports_direct_io

__all__ = [
    "ALIGNMENT",
    "Journal",
    "JournalClosedError",
    "JournalCorruptError",
    "JournalError",
    "JournalMark",
    "JournalRecord",
    "RecordType",
    "SEGMENT_HEADER_LEN",
    "bench_journal",
    "bench_journal_async",
    "crc_seed",
    "mark_new_journal",
    "never_written",
    "stored_mark",
]

logger = logging.getLogger(__name__)

_crc = _crc32c_mod.crc32c

SEGMENT_MAGIC = b"LSJN"
SEGMENT_VERSION = 3
_READABLE_VERSIONS = (1, 2, 3)
ALIGNMENT = 4096  # every batch ends on this boundary (a PADDING record fills the gap)
_SEG_HDR = struct.Struct(">4sHHQ")
SEGMENT_HEADER_LEN = _SEG_HDR.size  # 16

_MARK_MAGIC = b"LSJM"
_MARK_VERSION = 1
_MARK = struct.Struct(">4sHHQQ")
_MARK_CRC = struct.Struct(">I")
MARK_FILE = "lastmark"

_LEN_CRC = struct.Struct(">II")  # body_len, crc
_REC_HDR = struct.Struct(">IIB")  # body_len, crc, type
_REC_HDR_LEN = _REC_HDR.size  # 9
_ID_PREFIX = struct.Struct(">BQq")  # type, ledger_id, id
_LEDGER_PREFIX = struct.Struct(">BQ")  # type, ledger_id
_LEDGER_ID = struct.Struct(">Qq")
_LEDGER = struct.Struct(">Q")

_U32 = struct.Struct(">I")
_PADDING_TYPE = b"\x07"
_ENTRIES_HDR = bytes(8) + b"\x05"  # u32 len, u32 crc (both patched in place), type ENTRIES (5)
_ENTRY_IDS = struct.Struct(">Qq")  # the first 16 bytes of an entry (its header): ledger id, entry id
_BIG_ENDIAN = sys.byteorder == "big"
assert array.array("I").itemsize == 4, "array('I') must hold u32"

_SEGMENT_NAME = re.compile(r"^([0-9a-f]{16})\.jnl$")
_FREE_NAME = re.compile(r"^([0-9a-f]{16})-[0-9a-f]+\.free$")
_U64 = struct.Struct(">Q")
_READ_CHUNK = 1 << 20
#: an idle batch is synced on the loop thread only while fsyncs take at most this long (see "Group commit")
INLINE_FSYNC_MAX_S = 0.0005
#: a batch of at least this many bytes (before padding) means the journal is loaded (see "Group commit")
LOADED_BATCH_BYTES = 16 * 1024
#: an idle journal writes zeros ahead once less than this much written-ahead space is left (see "Preallocation")
PREALLOC_LOW_BYTES = 1024 * 1024
#: synced journal pages are dropped from the page cache once this many have built up (and at a seal)
DROP_PAGES_BYTES = 256 * 1024
#: after a failed preallocation (a full disk) none is tried for this long
PREALLOC_RETRY_S = 10.0
_ZEROS = bytes(256 * 1024)
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_DIRECT_ALIGN = 4096  # O_DIRECT offsets, sizes and buffers: a multiple of the page (and of any block size)
_DIRECT_BUF_MIN = 1024 * 1024


#: what a segment scan reports on an all-zero record header: the end of what was written, not damage
ZEROS_AHEAD = "zeros written ahead"


class RecordType(enum.IntEnum):
    ENTRY = 1
    MASTER_KEY = 2
    FENCE = 3
    EXPLICIT_LAC = 4
    ENTRIES = 5
    SEGMENT_END = 6
    PADDING = 7


def crc_seed(seq: int, version: int = SEGMENT_VERSION) -> int:
    """The value every record CRC of segment ``seq`` starts from (0 in version-1 segments)."""
    return _crc(_U64.pack(seq)) if version >= 2 else 0


# record types whose body is ``u64 ledger_id | i64 id | data`` (the others: ``u64 ledger_id | data``)
_WITH_ID: frozenset[int] = frozenset({RecordType.ENTRY, RecordType.EXPLICIT_LAC})
_TYPES: dict[int, RecordType] = {int(t): t for t in RecordType}


# Freeing a whole segment's extents at once makes one big filesystem-journal commit, and every journal fdatasync
# that needs a commit (each one that grows the segment being written) waits behind it: on ext4, each
# checkpoint's unlink of ~1 GiB of segments stalled adds (docs/benchmarks-history.md, "Index column family,
# direct I/O, blob files"). Shrinking a segment in steps
# with a pause between them spreads that work over many small commits.
DELETE_STEP_BYTES = 8 * 1024 * 1024
DELETE_STEP_PAUSE_S = 0.005


def never_written(directory: Path) -> bool:
    """No segment and no checkpoint mark in ``directory``: no journal there. A new bookie writes a mark there
    before its cookie (:func:`mark_new_journal`), so a directory holding its cookie and neither of these is a
    journal that was deleted. Free segment files (``<seq>-<hex>.free``, retired segments kept to be written
    over) do not count: nothing in them is replayed, and ``rm journal/*.jnl journal/lastmark`` leaves them."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return True
    return not any(n == MARK_FILE or _SEGMENT_NAME.match(n) for n in names)


def mark_new_journal(directory: Path) -> None:
    """A new bookie's journal directory given its checkpoint mark, the start of an empty journal, before its
    cookie is written there: a directory holding its cookie then always holds a mark (:func:`never_written`),
    however early its first start stopped (its ledger storage would not open, it was killed): such a start
    acknowledged nothing, and was refused at the next as a journal deleted."""
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / MARK_FILE).exists():
        _store_mark(directory, JournalMark(0, 0), fsync=True, fsync_dir=_fsync_dir)


def stored_mark(directory: Path) -> JournalMark:
    """``directory``'s checkpoint mark: (0, 0), the start of the journal, when it holds none."""
    path = directory / MARK_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return JournalMark(0, 0)
    if len(raw) != _MARK.size + _MARK_CRC.size:
        raise JournalCorruptError(f"{path}: {len(raw)} bytes, expected {_MARK.size + _MARK_CRC.size}")
    magic, version, _, seq, offset = _MARK.unpack_from(raw)
    (crc,) = _MARK_CRC.unpack_from(raw, _MARK.size)
    if magic != _MARK_MAGIC or _crc(raw[: _MARK.size]) != crc:
        raise JournalCorruptError(f"{path}: bad magic or checksum")
    if version != _MARK_VERSION:
        raise JournalError(f"{path}: unsupported version {version}")
    return JournalMark(seq, offset)


def _store_mark(
    directory: Path, mark: JournalMark, *, fsync: bool, fsync_dir: Callable[[Path], None]
) -> None:
    """``mark`` written as ``directory``'s checkpoint mark, atomically (a temp file renamed over it)."""
    raw = _MARK.pack(_MARK_MAGIC, _MARK_VERSION, 0, mark.seq, mark.offset)
    raw += _MARK_CRC.pack(_crc(raw))
    tmp = directory / (MARK_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        _pwrite_all(fd, raw, 0)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / MARK_FILE)
    fsync_dir(directory)


def _shrink_gently(path: Path, step: int, pause_s: float) -> None:
    """Truncate ``path`` to zero ``step`` bytes at a time, sleeping ``pause_s`` between steps (checkpoint thread
    only: the segment is below the persisted mark, so replay would delete it anyway if this is interrupted)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        while size > step:
            size -= step
            os.ftruncate(fd, size)
            time.sleep(pause_s)
    finally:
        os.close(fd)


class JournalError(Exception):
    """Base class of journal errors."""


class JournalCorruptError(JournalError):
    """Acknowledged journal data is damaged or missing (never silently dropped)."""


class JournalClosedError(JournalError):
    """An append on a journal that is closing or closed."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JournalRecord:
    type: RecordType
    ledger_id: int
    entry_id: int  # -1 for types without an id
    data: bytes


@dataclass(frozen=True, order=True, slots=True)
class JournalMark:
    """A position in the journal: segment ``seq`` and byte ``offset`` in it (ordered by (seq, offset))."""

    seq: int
    offset: int


Done = Callable[[BaseException | None], None]

_NEW, _RUNNING, _CLOSING, _CLOSED = range(4)


def _noop_done(exc: BaseException | None) -> None:
    pass


def _no_fsync(fd: int) -> None:
    return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _no_fsync_dir(path: Path) -> None:
    return None


_IOV_MAX = 1024  # Linux: pwritev takes at most this many buffers


def _pwritev_all(fd: int, pieces: list[bytes | bytearray], size: int, offset: int) -> None:
    """Write ``pieces`` (``size`` bytes) at ``offset``: one pwritev when it takes them all, else the rest
    joined (a short write, or more pieces than one call takes)."""
    done = 0
    if len(pieces) <= _IOV_MAX:
        done = os.pwritev(fd, pieces, offset)
        if done == size:
            return
    _pwrite_all(fd, memoryview(b"".join(pieces))[done:], offset + done)


def _pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    with memoryview(data) as mv:
        n = len(mv)
        pos = 0
        while pos < n:
            pos += os.pwrite(fd, mv[pos:], offset + pos)


def _later_batch(path: Path, start: int, seed: int) -> int | None:
    """The offset of a record a batch later than the one holding offset ``start`` wrote to the segment ``path``
    (records' CRCs seeded with ``seed``), or None. A batch ends with a PADDING record that ends it on an
    ``ALIGNMENT`` boundary (unless it ends on one already), and one batch is in flight at a time: a whole record
    on a boundary past ``start`` right after a whole PADDING record that begins at or past ``start`` is from a
    batch written after the one holding ``start`` was synced. A torn tail has none: past the last batch are
    zeros written ahead, or a recycled file's records, whose CRC seed is another segment's."""

    def whole(mv: memoryview, pos: int, size: int) -> tuple[int, int] | None:  # (type, end) of a whole record
        blen, crc, rtype = _REC_HDR.unpack_from(mv, pos)
        end = pos + _REC_HDR_LEN + blen
        if not (blen or crc or rtype) or end > size or _crc(mv[pos + 8 : end], seed) != crc:
            return None
        return rtype, end

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= start + _REC_HDR_LEN:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            mv = memoryview(mm)
            try:
                for a in range((start // ALIGNMENT + 1) * ALIGNMENT, size - _REC_HDR_LEN + 1, ALIGNMENT):
                    # the padding's body is zeros after its header's type byte (never 0): one candidate only,
                    # checked before the record at ``a`` (whose length, read from garbage, could be anything)
                    before = mm[max(start, a - ALIGNMENT - _REC_HDR_LEN) : a]
                    pad = a - _REC_HDR_LEN - (len(before) - len(before.rstrip(b"\0")))
                    if (
                        pad >= start
                        and mm[pad + _REC_HDR_LEN - 1] == RecordType.PADDING
                        and int.from_bytes(mm[pad : pad + 4], "big") == a - pad - _REC_HDR_LEN
                        and whole(mv, pad, size) == (RecordType.PADDING, a)
                        and whole(mv, a, size) is not None
                    ):
                        return a
            finally:
                mv.release()
    return None


class _SegmentScan:
    """Iterates the whole records of one segment from ``start``; afterwards ``end`` is the offset just after
    the last whole record, ``ended`` whether a SEGMENT_END record stopped the scan, and ``problem`` describes
    what stopped it early (None at a clean end). Record CRCs start from ``seed``."""

    def __init__(self, path: Path, start: int, seed: int = 0) -> None:
        self.path = path
        self.start = start
        self.seed = seed
        self.end = start
        self.ended = False
        self.problem: str | None = None

    def __iter__(self) -> Iterator[JournalRecord]:
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(self.start)
            buf = b""
            pos = 0  # parse position in buf
            base = self.start  # file offset of buf[0]
            eof = False
            mv = memoryview(buf)
            while True:
                if len(buf) - pos < _REC_HDR_LEN and not eof:
                    buf, base, eof = self._refill(f, buf, pos, base, _REC_HDR_LEN)
                    pos = 0
                    mv = memoryview(buf)
                avail = len(buf) - pos
                if avail == 0:
                    return
                if avail < _REC_HDR_LEN:
                    self.problem = f"short record header ({avail} of {_REC_HDR_LEN} bytes)"
                    return
                blen, crc, rtype = _REC_HDR.unpack_from(buf, pos)
                if not (blen or crc or rtype):
                    self.problem = ZEROS_AHEAD
                    return
                need = _REC_HDR_LEN + blen
                if base + pos + need > size:
                    self.problem = f"short record ({size - base - pos} of {need} bytes)"
                    return
                if avail < need and not eof:
                    buf, base, eof = self._refill(f, buf, pos, base, need)
                    pos = 0
                    mv = memoryview(buf)
                    avail = len(buf)
                if avail < need:
                    self.problem = f"short record ({avail} of {need} bytes)"
                    return
                body = pos + _REC_HDR_LEN
                end = body + blen
                if _crc(mv[pos + 8 : end], self.seed) != crc:
                    self.problem = "crc mismatch"
                    return
                if rtype == RecordType.SEGMENT_END:
                    self.ended = True
                    return
                if rtype == RecordType.PADDING:
                    pos = end
                    self.end = base + pos
                    continue
                t = _TYPES.get(rtype)
                if t is None:
                    raise JournalError(
                        f"{self.path}: unknown record type {rtype} at offset {base + pos} "
                        "(written by a newer version?)"
                    )
                if rtype == RecordType.ENTRIES:
                    entries = _split_entries(mv[body:end])
                    if entries is None:
                        self.problem = "ENTRIES record body is inconsistent"
                        return
                    pos = end
                    self.end = base + pos
                    unpack_ids = _ENTRY_IDS.unpack_from
                    for data in entries:
                        lid, eid = unpack_ids(data)
                        yield JournalRecord(type=RecordType.ENTRY, ledger_id=lid, entry_id=eid, data=data)
                    continue
                if rtype in _WITH_ID:
                    if blen < 16:
                        self.problem = f"{t.name} record body of {blen} bytes is too short"
                        return
                    lid, eid = _LEDGER_ID.unpack_from(buf, body)
                    data = bytes(mv[body + 16 : end])
                else:
                    if blen < 8:
                        self.problem = f"{t.name} record body of {blen} bytes is too short"
                        return
                    (lid,) = _LEDGER.unpack_from(buf, body)
                    eid = -1
                    data = bytes(mv[body + 8 : end])
                pos = end
                self.end = base + pos
                yield JournalRecord(type=t, ledger_id=lid, entry_id=eid, data=data)

    @staticmethod
    def _refill(f: Any, buf: bytes, pos: int, base: int, need: int) -> tuple[bytes, int, bool]:
        rest = buf[pos:]
        base += pos
        parts = [rest]
        have = len(rest)
        eof = False
        while have < need:
            chunk = f.read(max(_READ_CHUNK, need - have))
            if not chunk:
                eof = True
                break
            parts.append(chunk)
            have += len(chunk)
        return b"".join(parts), base, eof


def _split_entries(body: memoryview) -> list[bytes] | None:
    """The entries of an ENTRIES record body, or None if the body does not parse."""
    if len(body) < 4:
        return None
    (n,) = _U32.unpack_from(body)
    start = 4 + 4 * n
    if start > len(body):
        return None
    lens = array.array("I")
    lens.frombytes(body[4:start])
    if not _BIG_ENDIAN:
        lens.byteswap()
    if start + sum(lens) != len(body) or (n and min(lens) < _ENTRY_IDS.size):
        return None
    out = []
    pos = start
    for ln in lens:
        out.append(bytes(body[pos : pos + ln]))
        pos += ln
    return out


class Journal:
    """See the module docstring. Replay (synchronous) before ``start()``; then append from the loop thread.

    ``directory`` is the journal directory itself (segments and ``lastmark`` live directly in it).
    ``reuse_segments``: how many segments a checkpoint keeps (as ``<seq>-<unique>.free``) for later segments to be
    written over (0: delete them all). Only segments of at least half ``segment_bytes`` are kept.
    ``alignment``: every batch ends on a multiple of it (a PADDING record fills the gap; 0: no padding).
    ``on_sync(bytes, fsync_seconds)`` runs on the event loop after each successful batch. ``fsync=False``
    skips every fsync (tests, benchmarks; nothing is durable then). Tests may replace ``_fsync`` (called with
    a segment fd from the writer thread) and ``_fsync_dir`` (called with the directory path).
    """

    def __init__(
        self,
        directory: Path,
        *,
        max_wait_ms: float = 1.0,
        flush_bytes: int = 512 * 1024,
        sync_inline_bytes: int = 8 * 1024,
        segment_bytes: int = 256 * 1024 * 1024,
        reuse_segments: int = 4,
        preallocate_bytes: int = 2 * 1024 * 1024,
        alignment: int = ALIGNMENT,
        fsync: bool = True,
        remove_pages_from_cache: bool = True,
        direct_io: bool = True,
        on_sync: Callable[[int, float], None] | None = None,
    ) -> None:
        if max_wait_ms < 0:
            raise ValueError("max_wait_ms must be >= 0")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._max_wait = max_wait_ms / 1000.0
        self._flush_bytes = max(1, int(flush_bytes))
        self._sync_inline = max(0, int(sync_inline_bytes))
        self._segment_bytes = max(SEGMENT_HEADER_LEN + 1, int(segment_bytes))
        self._reuse = max(0, int(reuse_segments))
        self._prealloc = max(0, int(preallocate_bytes)) if fsync else 0
        if alignment < 0:
            raise ValueError("alignment must be >= 0")
        self._alignment = int(alignment)
        self._fsync_enabled = fsync
        self._drop_pages = fsync and remove_pages_from_cache and hasattr(os, "posix_fadvise")
        # aligned batches bypass the page cache (see "Direct I/O"); pages a user asked to keep need the cache
        self._direct = (
            fsync
            and remove_pages_from_cache
            and direct_io
            and self._alignment > 0
            and _supports_direct_io(self.directory)
        )
        self._dfd = -1  # the current segment opened with O_DIRECT (writer thread)
        self._dfd_seq = -1
        self._dbuf: mmap.mmap | None = None  # page-aligned staging buffer for direct writes
        self._zbuf: mmap.mmap | None = None  # page-aligned zeros for preallocation
        # overridable (tests inject hooks): fsync of a segment fd, fsync of the directory
        self._fsync: Callable[[int], None] = os.fdatasync if fsync else _no_fsync
        self._fsync_dir: Callable[[Path], None] = _fsync_dir if fsync else _no_fsync_dir
        self._on_sync = on_sync
        #: told of every failure: ``on_error(exc, False)`` when a batch's write or fsync failed (its records'
        #: callbacks got ``exc``), ``on_error(exc, True)`` when a completion callback raised on a durable record
        #: (that callback was then called again with ``exc``, so its request is answered with an error)
        self.on_error: Callable[[BaseException, bool], None] | None = None
        self.stats: dict[str, float] = {
            "records": 0,  # records acknowledged (done(None))
            "bytes": 0,  # bytes written and synced
            "syncs": 0,  # batches written and fsynced
            "failed_records": 0,
            "failed_syncs": 0,
            "last_fsync_s": 0.0,
            "max_fsync_s": 0.0,
            "total_fsync_s": 0.0,
            "total_write_s": 0.0,  # in pwrite (copying batches into the page cache)
            "total_idle_s": 0.0,  # writer idle between the end of one batch and the start of the next
            "last_batch_records": 0,
            "max_batch_records": 0,
            "inline_syncs": 0,  # batches written and fsynced on the loop thread (the idle path)
            "direct_writes": 0,  # batches written with O_DIRECT (see "Direct I/O")
            "preallocations": 0,  # zeros written ahead in an idle moment (see "Preallocation")
            "preallocated_bytes": 0,
            "segments_created": 0,  # new files
            "segments_reused": 0,  # free files written over
            "segments_recycled": 0,  # old segments kept as free files
            "segments_deleted": 0,
            "torn_tails": 0,
        }
        self._state = _NEW
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None
        # loop-thread state
        # the next batch, as the pieces the writer hands to one pwritev (entries are joined once per group,
        # never copied again on the loop thread), and its length
        self._pieces: list[bytes | bytearray] = []
        self._buf_len = 0
        self._cbs: list[Done] = []
        self._oldest = 0.0  # loop time of the oldest record in the batch
        # the idle path: a look at the next loop iteration is scheduled; appends so far / at the last look
        self._look_scheduled = False
        self._timer: asyncio.TimerHandle | None = None  # under load: when the batch's oldest record is due
        self._loaded = False  # the last batch held LOADED_BATCH_BYTES or more
        self._arrivals = 0
        self._arrivals_seen = 0
        self._io_busy = False
        self._appended = 0
        self._finished = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        # where the batches handed to the writer end (segment, offset), and the segment and CRC seed of the batch
        self._w_seq = 0
        self._w_off = 0
        self._buf_seq = 0
        self._seed = 0
        # writer-thread state (touched by the loop only while no batch is in flight)
        self._fd = -1
        self._seq = 0
        self._offset = 0
        self._broken: BaseException | None = None
        self._idle_since = 0.0  # perf_counter when the last batch ended (0: none yet)
        # the current segment file's bytes written so far (records, zeros, an old segment's)
        self._alloc_end = 0
        self._prealloc_after = 0.0  # monotonic time before which no preallocation is tried (after a failure)
        self._zeroed = False  # zeros were written ahead in the current segment (its seal cuts them)
        self._dropped_to = 0  # the current segment's pages before this offset were dropped from the cache
        # replay / checkpoint
        self._ckpt_lock = threading.Lock()
        self._pool_lock = threading.Lock()  # guards _free (checkpoint thread and writer thread)
        #: asked before keeping a segment as a free file (the bookie says no while its disk is short of space)
        self.may_reuse: Callable[[], bool] | None = None
        self._free: list[Path] = [
            self.directory / n for n in sorted(os.listdir(self.directory)) if _FREE_NAME.match(n)
        ]
        self._persisted = self._load_mark()
        self._mark = self._persisted
        self._replayed = False
        self._next_seq = max(1, self._persisted.seq + 1)

    # ------------------------------------------------------------------ files

    def _seg_path(self, seq: int) -> Path:
        return self.directory / f"{seq:016x}.jnl"

    def _list_segments(self) -> list[int]:
        seqs = []
        for name in os.listdir(self.directory):
            m = _SEGMENT_NAME.match(name)
            if m:
                seqs.append(int(m.group(1), 16))
        seqs.sort()
        return seqs

    def _load_mark(self) -> JournalMark:
        return stored_mark(self.directory)

    def _write_mark(self, mark: JournalMark) -> None:
        _store_mark(self.directory, mark, fsync=self._fsync_enabled, fsync_dir=self._fsync_dir)

    def _check_header(self, path: Path, seq: int) -> tuple[str | None, int, bool]:
        """(None if the segment header is valid else what is wrong with it, its version, whether the header
        is a valid one of an *older* segment: a recycled file whose new header never became durable)."""
        with open(path, "rb") as f:
            raw = f.read(SEGMENT_HEADER_LEN)
        if len(raw) < SEGMENT_HEADER_LEN:
            return f"short segment header ({len(raw)} bytes)", 0, False
        magic, version, _, hseq = _SEG_HDR.unpack(raw)
        if magic != SEGMENT_MAGIC:
            return f"bad segment magic {magic!r}", 0, False
        if version not in _READABLE_VERSIONS:
            raise JournalError(f"{path}: unsupported segment version {version}")
        if hseq != seq:
            return f"header seq {hseq} does not match the file name", version, hseq < seq
        return None, version, False

    def _retire(self, seq: int, *, gently: bool = False) -> None:
        """A segment no longer needed: keep it as a free file to write over, or delete it (pool full, or too
        small to be worth keeping)."""
        path = self._seg_path(seq)
        with self._pool_lock:
            if len(self._free) < self._reuse and (self.may_reuse is None or self.may_reuse()):
                try:
                    big = os.path.getsize(path) >= self._segment_bytes // 2
                    if big:
                        # unique: an unfinished segment dropped by replay leaves its number to the next one
                        free = self.directory / f"{seq:016x}-{time.time_ns():x}.free"
                        os.rename(path, free)
                except FileNotFoundError:
                    return
                if big:
                    self._free.append(free)
                    self.stats["segments_recycled"] += 1
                    return
        self._delete_segment(seq, gently=gently)

    def release_free_segments(self) -> int:
        """Delete every free file (the disk is short of space); returns how many. Thread-safe."""
        with self._pool_lock:
            free, self._free = self._free, []
        for path in free:
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            self.stats["segments_deleted"] += 1
        return len(free)

    def _take_free(self) -> Path | None:
        with self._pool_lock:
            return self._free.pop(0) if self._free else None

    def _delete_segment(self, seq: int, *, gently: bool = False) -> None:
        """Delete a segment; ``gently`` (a checkpoint, with fsyncs running) shrinks it in steps first (see
        ``_shrink_gently``). Replay deletes at once: nothing is being acknowledged yet."""
        path = self._seg_path(seq)
        try:
            if gently:
                _shrink_gently(path, DELETE_STEP_BYTES, DELETE_STEP_PAUSE_S)
            os.unlink(path)
            self.stats["segments_deleted"] += 1
        except FileNotFoundError:
            pass

    # ------------------------------------------------------------------ replay

    def replay(self) -> Iterator[JournalRecord]:
        """Yield every whole record after the checkpoint mark, in order (see the module docstring)."""
        if self._state != _NEW:
            raise RuntimeError("replay() must run before start()")
        mark = self._persisted
        segs = self._list_segments()
        for seq in [s for s in segs if s < mark.seq]:  # finish an interrupted checkpoint
            self._retire(seq)
        segs = [s for s in segs if s >= mark.seq]
        if mark.seq and (not segs or segs[0] != mark.seq):
            raise JournalCorruptError(
                f"{self.directory}: segment {mark.seq:016x}.jnl holding the checkpoint mark {mark} is missing"
            )
        for a, b in zip(segs, segs[1:], strict=False):
            if b != a + 1:
                raise JournalCorruptError(
                    f"{self.directory}: segments {a + 1:016x}..{b - 1:016x} are missing"
                )
        end = mark
        next_seq = max(self._next_seq, (segs[-1] + 1) if segs else 1)
        for i, seq in enumerate(segs):
            last = i == len(segs) - 1
            path = self._seg_path(seq)
            size = path.stat().st_size
            bad, version, older = self._check_header(path, seq)
            if bad is not None:
                if last and seq != mark.seq and (size <= SEGMENT_HEADER_LEN or older):
                    # its creation (or the renaming of a free file to it) was interrupted: nothing in it
                    # was ever acknowledged
                    logger.warning("journal: %s: %s; dropping the unfinished segment", path, bad)
                    self._retire(seq)
                    self._fsync_dir(self.directory)
                    next_seq = seq  # the next segment takes its number: no gap
                    continue
                raise JournalCorruptError(f"{path}: {bad}")
            start = mark.offset if seq == mark.seq else SEGMENT_HEADER_LEN
            start = max(start, SEGMENT_HEADER_LEN)
            if start > size:
                raise JournalCorruptError(f"{path}: {size} bytes, shorter than the checkpoint mark {mark}")
            scan = _SegmentScan(path, start, crc_seed(seq, version))
            yield from scan
            if scan.problem is not None:
                later = _later_batch(path, scan.end, crc_seed(seq, version)) if last else None
                if tail_verdict(last_segment=last, later_batch=later is not None) is TailVerdict.DAMAGE:
                    if not last:
                        raise JournalCorruptError(
                            f"{path}: {scan.problem} at offset {scan.end} (not the last segment)"
                        )
                    # not a torn tail: a batch written after the one that stops the scan is on disk, and the
                    # journal writes a batch only once the one before it was fsynced (and acknowledged)
                    raise JournalCorruptError(
                        f"{path}: {scan.problem} at offset {scan.end} of the last segment, but a later batch's "
                        f"record follows at offset {later}: the records there were synced and acknowledged, so "
                        "this is damage, not a torn tail, and cutting it would lose them. Restore the journal; if "
                        "it cannot be, wipe the bookie's data directories, delete its cookie (`ledgerstore bookie "
                        "format --delete-cookie`) and let its ledgers be re-replicated"
                    )
                if scan.problem == ZEROS_AHEAD:
                    logger.info(
                        "journal: %s ends at offset %d; cutting the zeros written ahead", path, scan.end
                    )
                else:
                    logger.warning(
                        "journal: %s: torn tail (%s) at offset %d of %d; truncating to %d",
                        path,
                        scan.problem,
                        scan.end,
                        size,
                        scan.end,
                    )
                    self.stats["torn_tails"] += 1
            if last:
                # cut a torn tail, and make what replay saw durable before a later segment is acknowledged
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    if scan.problem is not None:
                        os.ftruncate(fd, scan.end)
                    self._fsync(fd)
                finally:
                    os.close(fd)
            end = JournalMark(seq, scan.end)
        self._mark = end
        self._next_seq = next_seq
        self._replayed = True

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open a new segment for appends (runs a positioning replay first if replay() was not drained)."""
        if self._state != _NEW:
            raise RuntimeError("journal already started")
        if not self._replayed:
            for _ in self.replay():
                pass
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal")
        seq = self._next_seq
        await loop.run_in_executor(self._executor, self._io_open, seq)
        self._mark = JournalMark(seq, SEGMENT_HEADER_LEN)
        self._w_seq, self._w_off = seq, SEGMENT_HEADER_LEN
        self._state = _RUNNING

    async def flush(self) -> None:
        """Write and fsync everything appended so far now; return when all their callbacks have run.

        Write errors are reported through the records' callbacks (and ``stats``), not raised here."""
        if self._state not in (_RUNNING, _CLOSING):
            return
        target = self._appended
        if self._finished >= target:
            return
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append((target, fut))
        if not self._io_busy and self._buf_len:
            self._start_batch()
        await fut

    async def close(self) -> None:
        """Flush, fsync and close the current segment. Later appends fail with JournalClosedError."""
        if self._state == _NEW:
            self._state = _CLOSED
            return
        if self._state != _RUNNING:
            return
        self._state = _CLOSING
        await self.flush()
        assert self._loop is not None and self._executor is not None
        await self._loop.run_in_executor(self._executor, self._io_close)
        self._executor.shutdown(wait=False)
        self._state = _CLOSED

    @property
    def mark(self) -> JournalMark:
        """Position just after the last fsynced record (segment seq, offset)."""
        return self._mark

    @property
    def persisted_mark(self) -> JournalMark:
        """The last checkpointed mark (where the next replay starts)."""
        return self._persisted

    @property
    def pending_records(self) -> int:
        """Records appended but not yet acknowledged or failed."""
        return self._appended - self._finished

    def checkpoint(self, mark: JournalMark) -> None:
        """Everything up to ``mark`` is durable elsewhere: persist the mark, delete older segments.

        Thread-safe; idempotent; a mark older than the persisted one only re-runs the deletion."""
        with self._ckpt_lock:
            if mark > self._mark:
                raise ValueError(f"checkpoint mark {mark} is beyond the journal's mark {self._mark}")
            if mark > self._persisted:
                self._write_mark(mark)
                self._persisted = mark
            for seq in self._list_segments():
                if seq < self._persisted.seq:
                    self._retire(seq, gently=True)

    # ------------------------------------------------------------------ append path (loop thread)

    def append(
        self,
        rtype: RecordType,
        ledger_id: int,
        entry_id: int,
        data: bytes,
        done: Done,
    ) -> None:
        """Queue one record; ``done(None)`` runs on the loop once it (and all before it) is fsynced."""
        self.append_many([(rtype, ledger_id, entry_id, data)], done)

    def append_many(self, records: list[tuple[int, int, int, bytes]], done: Done) -> None:
        """Queue several records (rtype, ledger_id, entry_id, data) with ONE completion: ``done`` runs once
        every record of the group (and all before it) is fsynced. The group always lands in one batch."""
        self._append(records, [], done)

    def append_entries(
        self, entries: list[bytes], done: Done, records: list[tuple[int, int, int, bytes]] | None = None
    ) -> None:
        """Queue ``records`` (as ``append_many``) and then every entry of ``entries`` as ONE ENTRIES record,
        with one completion. Each entry must start with its 16-byte (ledger id, entry id) header."""
        self._append(records or [], entries, done)

    def _append(self, records: list[tuple[int, int, int, bytes]], entries: list[bytes], done: Done) -> None:
        nrec = len(records) + (1 if entries else 0)
        if not nrec:
            self._loop_call_soon(done, None)
            return
        if self._state != _RUNNING:
            if self._loop is None:
                raise RuntimeError("journal not started")
            self._loop.call_soon(done, JournalClosedError("journal is closed"))
            return
        if not self._buf_len:
            loop = self._loop
            assert loop is not None
            self._oldest = loop.time()
            # This batch's place is known now (every earlier byte is handed over): it opens the next segment
            # when the current one is full, and its CRCs are seeded with its segment's seq.
            if self._w_off >= self._segment_bytes:
                self._w_seq += 1
                self._w_off = SEGMENT_HEADER_LEN
            if self._buf_seq != self._w_seq:
                self._buf_seq = self._w_seq
                self._seed = crc_seed(self._w_seq)
        pieces = self._pieces
        if records:
            packed = bytearray()
            self._pack_records(packed, records, self._seed)
            pieces.append(packed)
            self._buf_len += len(packed)
        if entries:
            head, body = self._pack_entries(entries, self._seed)
            pieces.append(head)
            pieces.append(body)
            self._buf_len += len(head) + len(body)
        # One real callback first, no-ops for the rest: per-record counters stay right, and ``done`` runs
        # when the batch holding the whole group is durable (the group is never split across batches).
        self._cbs.append(done)
        if nrec > 1:
            self._cbs.extend([_noop_done] * (nrec - 1))
        self._appended += nrec
        self._arrivals += 1
        if self._io_busy:
            return  # the batch in flight starts this one when it completes
        if self._buf_len >= self._flush_bytes:
            self._start_batch()
        elif not self._look_scheduled:
            self._look_scheduled = True
            self._arrivals_seen = self._arrivals
            loop = self._loop
            assert loop is not None
            loop.call_soon(self._look)

    @staticmethod
    def _pack_entries(entries: list[bytes], seed: int) -> tuple[bytearray, bytes]:
        """One ENTRIES record as (its header, count and lengths; the entries joined): written one after the
        other, they are the record."""
        lens = array.array("I", map(len, entries))
        if not _BIG_ENDIAN:
            lens.byteswap()
        head = bytearray(_ENTRIES_HDR)
        head += _U32.pack(len(entries))
        head += lens.tobytes()
        body = b"".join(entries)
        with memoryview(head) as mv:
            crc = _crc(body, _crc(mv[8:], seed))
        _LEN_CRC.pack_into(head, 0, len(head) + len(body) - _REC_HDR_LEN, crc)
        return head, body

    @staticmethod
    def _pack_records(buf: bytearray, records: list[tuple[int, int, int, bytes]], seed: int) -> None:
        id_pack, ledger_pack, head_pack = _ID_PREFIX.pack, _LEDGER_PREFIX.pack, _LEN_CRC.pack
        for rtype, ledger_id, entry_id, data in records:
            if rtype in _WITH_ID:
                prefix = id_pack(rtype, ledger_id, entry_id)
            else:
                prefix = ledger_pack(rtype, ledger_id)
            buf += head_pack(len(prefix) - 1 + len(data), _crc(data, _crc(prefix, seed)))
            buf += prefix
            buf += data

    @staticmethod
    def _pad(buf: bytearray, start: int, seed: int, alignment: int) -> None:
        """Append one PADDING record to ``buf`` (a batch to be written at file offset ``start``) so that the
        batch ends on an ``alignment`` boundary; nothing when it already does."""
        gap = -(start + len(buf)) % alignment
        if not gap:
            return
        if gap < _REC_HDR_LEN:  # too small for a record header: pad to the boundary after the next one
            gap += alignment
        body = bytes(gap - _REC_HDR_LEN)
        buf += _REC_HDR.pack(len(body), _crc(body, _crc(_PADDING_TYPE, seed)), RecordType.PADDING)
        buf += body

    def _loop_call_soon(self, fn: Done, arg: BaseException | None) -> None:
        assert self._loop is not None
        self._loop.call_soon(fn, arg)

    def _look(self) -> None:
        """The idle path's look, one loop iteration after a batch's first record (see "Group commit"): go now
        unless more records keep arriving and the oldest has waited less than ``max_wait_ms``."""
        self._look_scheduled = False
        if self._io_busy or not self._buf_len or self._state not in (_RUNNING, _CLOSING):
            return
        loop = self._loop
        assert loop is not None
        waited = loop.time() - self._oldest
        if waited < self._max_wait:
            if self._arrivals != self._arrivals_seen:
                self._arrivals_seen = self._arrivals
                self._look_scheduled = True
                loop.call_soon(self._look)
                return
            if self._loaded:
                self._wait_until_due()
                return
        self._start_batch(inline_ok=True)

    def _wait_until_due(self) -> None:
        """Under load: start the batch once its oldest record has waited ``max_wait_ms``."""
        if self._timer is None:
            loop = self._loop
            assert loop is not None
            self._timer = loop.call_at(self._oldest + self._max_wait, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if not self._io_busy and self._buf_len:
            self._start_batch()

    def _start_batch(self, inline_ok: bool = False) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pieces, size, cbs = self._pieces, self._buf_len, self._cbs
        self._loaded = size >= LOADED_BATCH_BYTES
        self._pieces = []
        self._buf_len = 0
        self._cbs = []
        self._io_busy = True
        if self._alignment:
            pad = bytearray()
            self._pad(pad, self._w_off + size, self._seed, self._alignment)
            if pad:
                pieces.append(pad)
                size += len(pad)
        seq, offset = self._buf_seq, self._w_off
        self._w_off += size
        if inline_ok and size <= self._sync_inline and self.stats["last_fsync_s"] <= INLINE_FSYNC_MAX_S:
            # the idle path, a small batch: write and sync it here (no hand-off to the writer thread and back)
            self.stats["inline_syncs"] += 1
            try:
                result = self._io_write(pieces, size, seq, offset)
            except BaseException as exc:
                self._batch_finished(cbs, size, None, exc)
            else:
                self._batch_finished(cbs, size, result, None)
            return
        loop = self._loop
        assert loop is not None
        fut = loop.run_in_executor(self._executor, self._io_write, pieces, size, seq, offset)
        fut.add_done_callback(functools.partial(self._on_batch_done, cbs, size))

    def _on_batch_done(
        self, cbs: list[Done], nbytes: int, fut: asyncio.Future[tuple[int, int, float]]
    ) -> None:
        if fut.cancelled():
            self._batch_finished(cbs, nbytes, None, asyncio.CancelledError())
        elif (exc := fut.exception()) is not None:
            self._batch_finished(cbs, nbytes, None, exc)
        else:
            self._batch_finished(cbs, nbytes, fut.result(), None)

    def _batch_finished(
        self,
        cbs: list[Done],
        nbytes: int,
        result: tuple[int, int, float] | None,
        exc: BaseException | None,
    ) -> None:
        self._io_busy = False
        st = self.stats
        if result is not None:
            seq, offset, dt = result
            self._mark = JournalMark(seq, offset)
            n = len(cbs)
            st["records"] += n
            st["bytes"] += nbytes
            st["syncs"] += 1
            st["last_fsync_s"] = dt
            st["total_fsync_s"] += dt
            if dt > st["max_fsync_s"]:
                st["max_fsync_s"] = dt
            st["last_batch_records"] = n
            if n > st["max_batch_records"]:
                st["max_batch_records"] = n
            # The next batch goes to the disk before this one's callbacks run (they store the entries in
            # RocksDB and write the replies, time the disk would otherwise sit idle).
            self._maybe_next()
            for cb in cbs:
                try:
                    cb(None)
                except Exception as cb_exc:
                    self._callback_failed(cb, cb_exc)
            if self._on_sync is not None:
                try:
                    self._on_sync(nbytes, dt)
                except Exception:
                    logger.exception("journal: on_sync hook failed")
        else:
            assert exc is not None
            # fail the batch and everything appended before the failure was seen: they would follow a hole
            failed = cbs
            if self._cbs:
                failed = cbs + self._cbs
                self._pieces = []
                self._buf_len = 0
                self._cbs = []
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
            # the writer cut the file back to where the failed batch began: later batches start there
            self._w_seq, self._w_off = self._seq, self._offset
            n = len(failed)
            st["failed_records"] += n
            st["failed_syncs"] += 1
            logger.error("journal: write/fsync failed (%s); failing %d records", exc, n)
            for cb in failed:
                try:
                    cb(exc)
                except Exception:
                    logger.exception("journal: completion callback failed")
            self._report(exc, False)
        self._finished += n
        if self._waiters:
            done_upto = self._finished
            keep = []
            for target, w in self._waiters:
                if target <= done_upto:
                    if not w.done():
                        w.set_result(None)
                else:
                    keep.append((target, w))
            self._waiters = keep
        self._maybe_next()
        if result is not None:
            self._maybe_preallocate()

    def _maybe_preallocate(self) -> None:
        """Idle (no batch in flight, nothing queued) and close to the end of the written-ahead space: write zeros
        ahead on the writer thread; records appended meanwhile wait for it like for a batch (see
        "Preallocation")."""
        if (
            not self._prealloc
            or self._io_busy
            or self._buf_len
            or self._state != _RUNNING
            or self._alloc_end - self._w_off >= PREALLOC_LOW_BYTES
            or self._alloc_end >= self._segment_bytes
            or self._w_off >= self._segment_bytes
        ):
            return
        loop = self._loop
        assert loop is not None
        if loop.time() < self._prealloc_after:
            return
        self._io_busy = True
        fut = loop.run_in_executor(self._executor, self._io_preallocate, self._w_seq)
        fut.add_done_callback(self._on_preallocated)

    def _on_preallocated(self, fut: asyncio.Future[int]) -> None:
        self._io_busy = False
        if fut.cancelled():
            pass
        elif (exc := fut.exception()) is not None:
            loop = self._loop
            assert loop is not None
            self._prealloc_after = loop.time() + PREALLOC_RETRY_S
            logger.warning(
                "journal: preallocating segment space failed (%s); retrying in %.0fs", exc, PREALLOC_RETRY_S
            )
        elif n := fut.result():
            self.stats["preallocations"] += 1
            self.stats["preallocated_bytes"] += n
        if self._buf_len and not self._loaded:
            self._start_batch(inline_ok=True)  # what came meanwhile is idle traffic: the idle path's batch
        else:
            self._maybe_next()

    def _callback_failed(self, cb: Done, exc: Exception) -> None:
        """A completion callback raised on a durable record (storing it failed): never a silent hang. The callback
        is called again with the error, so whatever it answers is an error (it had not answered yet: answering is
        its last step), and ``on_error`` is told."""
        self.stats["callback_errors"] = self.stats.get("callback_errors", 0) + 1
        if self.on_error is None:  # else its owner says it (the bookie: one line as it fails)
            logger.error(
                "journal: completion callback failed on a durable record: %r; answering it with the error",
                exc,
            )
        try:
            cb(exc)
        except Exception:
            logger.exception("journal: completion callback failed again with the error")
        self._report(exc, True)

    def _report(self, exc: BaseException, in_callback: bool) -> None:
        if self.on_error is not None:
            try:
                self.on_error(exc, in_callback)
            except Exception:
                logger.exception("journal: on_error hook failed")

    def _maybe_next(self) -> None:
        """A batch completed: the records appended while it was in flight go now (they waited a whole fsync),
        unless the journal is loaded and the oldest of them is not due yet."""
        if self._io_busy or not self._buf_len:
            return
        if self._loaded and not self._waiters and self._buf_len < self._flush_bytes:
            loop = self._loop
            assert loop is not None
            if loop.time() - self._oldest < self._max_wait:
                self._wait_until_due()
                return
        self._start_batch()

    # ------------------------------------------------------------------ writer thread

    def _create_segment(self, seq: int) -> int:
        """Segment ``seq`` with its header durable: a free file written over when there is one, else new."""
        path = self._seg_path(seq)
        free = self._take_free()
        if free is not None:
            try:
                os.rename(free, path)
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            except OSError as e:
                logger.warning("journal: reusing %s failed (%s); creating a new segment", free, e)
                free = None
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        if free is None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            _pwrite_all(fd, _SEG_HDR.pack(SEGMENT_MAGIC, SEGMENT_VERSION, 0, seq), 0)
            self._fsync(fd)
            self._fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(path)
            except OSError:
                pass
            raise
        self.stats["segments_reused" if free is not None else "segments_created"] += 1
        self._alloc_end = os.fstat(fd).st_size  # a recycled file is written ahead already
        self._dropped_to = 0
        self._zeroed = False
        return fd

    def _seal(self) -> None:
        """Write a SEGMENT_END record after the current segment's last record and fsync it (it is not counted
        in ``_offset``: records written later, if the rotation fails, go over it)."""
        end = bytearray()
        self._pack_records(end, [(RecordType.SEGMENT_END, self._seq + 1, -1, b"")], crc_seed(self._seq))
        try:
            _pwrite_all(self._fd, end, self._offset)
            if self._zeroed:  # a sealed segment keeps no zeros written ahead
                os.ftruncate(self._fd, self._offset + len(end))
            self._fsync(self._fd)
        except BaseException as exc:
            self._cut_back(exc)
            raise

    def _cut_back(self, exc: BaseException) -> None:
        """After a failed write: truncate the segment to ``_offset`` (the end of the last good batch)."""
        try:
            os.ftruncate(self._fd, self._offset)
            self._alloc_end = min(self._alloc_end, self._offset)
            self._fsync(self._fd)
        except BaseException:
            self._broken = exc
            logger.exception(
                "journal: truncating %s back to %d failed", self._seg_path(self._seq), self._offset
            )

    def _io_open(self, seq: int) -> None:
        self._fd = self._create_segment(seq)
        self._seq = seq
        self._offset = SEGMENT_HEADER_LEN

    def _io_rotate(self) -> None:
        # the current segment's records were all fsynced by their batches
        self._seal()
        fd = self._create_segment(self._seq + 1)
        old = self._fd
        self._fd = fd
        self._seq += 1
        self._offset = SEGMENT_HEADER_LEN
        try:
            os.close(old)
        except OSError:
            logger.exception("journal: closing the previous segment failed")

    def _io_repair(self) -> None:
        os.ftruncate(self._fd, self._offset)
        self._alloc_end = self._offset
        self._fsync(self._fd)
        self._broken = None

    def _io_write(
        self, pieces: list[bytes | bytearray], size: int, seq: int, offset: int
    ) -> tuple[int, int, float]:
        """Write (``pieces``, ``size`` bytes in all) and fsync one batch at (``seq``, ``offset``), the place
        the loop planned for it."""
        if self._broken is not None:
            self._io_repair()
        if seq != self._seq:
            self._io_rotate()
        if (seq, offset) != (self._seq, self._offset):
            raise JournalError(
                f"journal: batch planned at {seq}/{offset}, the writer is at {self._seq}/{self._offset}"
            )
        fd = self._fd
        start = self._offset
        st = self.stats
        tw = time.perf_counter()
        if self._idle_since:
            st["total_idle_s"] += tw - self._idle_since
        try:
            if self._direct and not (start | size) % _DIRECT_ALIGN:
                self._write_direct(pieces, size, start)
            else:
                _pwritev_all(fd, pieces, size, start)
            t0 = time.perf_counter()
            self._fsync(fd)
            t1 = time.perf_counter()
        except BaseException as exc:
            self._idle_since = 0.0
            self._cut_back(exc)
            raise
        self._idle_since = t1
        st["total_write_s"] += t0 - tw
        self._offset = start + size
        if self._offset - self._dropped_to >= DROP_PAGES_BYTES:
            self._drop_written()
        return self._seq, self._offset, t1 - t0

    def _direct_fd(self) -> int:
        """The current segment opened with O_DIRECT (beside ``_fd``, which the buffered writes use)."""
        if self._dfd_seq != self._seq:
            self._close_direct()
            self._dfd = os.open(self._seg_path(self._seq), os.O_WRONLY | _O_DIRECT | os.O_CLOEXEC)
            self._dfd_seq = self._seq
        return self._dfd

    def _close_direct(self) -> None:
        if self._dfd >= 0:
            fd, self._dfd, self._dfd_seq = self._dfd, -1, -1
            with contextlib.suppress(OSError):
                os.close(fd)

    def _write_direct(self, pieces: list[bytes | bytearray], size: int, start: int) -> None:
        """Write one aligned batch with O_DIRECT: copied into a page-aligned buffer (O_DIRECT needs one), then
        one pwrite (``_pwrite_direct``, which writes it through the page cache if O_DIRECT is refused)."""
        buf = self._dbuf
        if buf is None or len(buf) < size:
            if buf is not None:
                buf.close()
            buf = self._dbuf = mmap.mmap(-1, max(size, _DIRECT_BUF_MIN))
        with memoryview(buf) as mv:
            pos = 0
            for piece in pieces:
                n = len(piece)
                mv[pos : pos + n] = piece
                pos += n
            if self._pwrite_direct(mv[:size], start):
                self.stats["direct_writes"] += 1

    def _pwrite_direct(self, data: memoryview, offset: int) -> bool:
        """Write ``data`` (page-aligned, in memory and on disk) at ``offset`` with one O_DIRECT pwrite (the rest
        of a short one through the page cache); whether it went that way. A filesystem that refuses O_DIRECT
        (EINVAL) turns direct I/O off for good, with one warning, and ``data`` is written through the page cache:
        the caller's write happens either way."""
        try:
            done = os.pwrite(self._direct_fd(), data, offset)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            logger.warning("journal: O_DIRECT writes refused (%s); writing through the page cache", e)
            self._direct = False
            self._close_direct()
            _pwrite_all(self._fd, data, offset)
            return False
        if done < len(data):
            _pwrite_all(self._fd, data[done:], offset + done)
        return True

    def _drop_written(self) -> None:
        """Drop the synced batches' pages from the page cache (nothing reads them before a restart), in steps
        of ``DROP_PAGES_BYTES`` rather than a syscall per batch, and at a seal."""
        start, end = self._dropped_to, self._offset
        self._dropped_to = end
        if self._drop_pages and end > start:
            with contextlib.suppress(OSError):
                os.posix_fadvise(self._fd, start, end - start, os.POSIX_FADV_DONTNEED)

    def _io_preallocate(self, seq: int) -> int:
        """Write zeros after the written-ahead space of segment ``seq`` (if it is still the current one) and
        fdatasync them; the number of bytes written."""
        if self._fd < 0 or self._broken is not None or seq != self._seq:
            return 0
        start = max(self._alloc_end, self._offset)
        end = min(start + self._prealloc, self._segment_bytes)
        if end <= start:
            return 0
        fd = self._fd
        pos = start
        if self._direct and not (start | end) % _DIRECT_ALIGN:
            if self._zbuf is None:
                self._zbuf = mmap.mmap(-1, len(_ZEROS))  # anonymous memory: zeros, page-aligned
            with memoryview(self._zbuf) as zeros:
                while pos < end and self._direct:  # (refused: the rest through the page cache)
                    n = min(len(zeros), end - pos)
                    self._pwrite_direct(zeros[:n], pos)
                    pos += n
        while pos < end:
            pos += os.pwrite(fd, memoryview(_ZEROS)[: min(len(_ZEROS), end - pos)], pos)
        self._zeroed = True
        self._fsync(fd)
        self._alloc_end = end
        if self._drop_pages:
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
        return end - start

    def _io_close(self) -> None:
        if self._fd < 0:
            return
        try:
            if self._broken is not None:
                self._io_repair()
            self._seal()  # replay then knows the segment ended here (what follows may be older data)
        except OSError:
            logger.exception("journal: final fsync of %s failed", self._seg_path(self._seq))
        finally:
            self._close_direct()
            os.close(self._fd)
            self._fd = -1


# ---------------------------------------------------------------------- micro-benchmark


class _BenchState:
    __slots__ = ("acked", "failed", "outstanding", "low", "wake", "latencies")

    def __init__(self, low: int) -> None:
        self.acked = 0
        self.failed = 0
        self.outstanding = 0
        self.low = low
        self.wake: asyncio.Event | None = None
        self.latencies: list[float] = []

    def done(self, exc: BaseException | None) -> None:
        if exc is None:
            self.acked += 1
        else:
            self.failed += 1
        self.outstanding -= 1
        if self.wake is not None and self.outstanding <= self.low:
            self.wake.set()

    def done_timed(self, t0: float, exc: BaseException | None) -> None:
        self.latencies.append(time.perf_counter() - t0)
        self.done(exc)


async def bench_journal_async(
    directory: Path | str,
    n: int,
    size: int,
    *,
    max_wait_ms: float = 1.0,
    flush_bytes: int = 512 * 1024,
    fsync: bool = True,
    window: int = 4096,
    burst: int = 64,
    rate: float | None = None,
) -> dict[str, float]:
    """Append ``n`` ENTRY records of ``size`` bytes as fast as the loop allows (``burst`` per loop iteration,
    at most ``window`` unacknowledged, like many pipelining clients) and report throughput and batching.

    With ``rate`` (records/s) the appends are paced to that offered load instead, to measure latency at it."""
    j = Journal(Path(directory), max_wait_ms=max_wait_ms, flush_bytes=flush_bytes, fsync=fsync)
    for _ in j.replay():
        pass
    await j.start()
    payload = os.urandom(size)
    st = _BenchState(window // 2)
    st.wake = asyncio.Event()
    append = j.append
    entry = RecordType.ENTRY
    done = st.done
    perf = time.perf_counter
    t_start = perf()
    i = 0
    while i < n:
        if st.outstanding >= window:
            st.wake.clear()
            await st.wake.wait()
        k = min(burst, n - i)
        if rate is not None:
            k = min(k, int((perf() - t_start) * rate) + 1 - i)
            if k <= 0:
                await asyncio.sleep(0.0002)
                continue
        append(entry, 1, i, payload, functools.partial(st.done_timed, perf()))
        for eid in range(i + 1, i + k):
            append(entry, 1, eid, payload, done)
        st.outstanding += k
        i += k
        await asyncio.sleep(0)
    await j.flush()
    elapsed = perf() - t_start
    stats = dict(j.stats)
    await j.close()
    lat = sorted(st.latencies)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000.0 if lat else 0.0

    syncs = stats["syncs"] or 1
    return {
        "records": n,
        "size": size,
        "seconds": elapsed,
        "records_per_s": n / elapsed if elapsed > 0 else 0.0,
        "mib_per_s": n * size / elapsed / (1 << 20) if elapsed > 0 else 0.0,
        "acked": st.acked,
        "failed": st.failed,
        "fsyncs": stats["syncs"],
        "mean_batch_records": stats["records"] / syncs,
        "mean_batch_kib": stats["bytes"] / syncs / 1024.0,
        "max_batch_records": stats["max_batch_records"],
        "fsync_mean_ms": stats["total_fsync_s"] / syncs * 1000.0,
        "fsync_max_ms": stats["max_fsync_s"] * 1000.0,
        "latency_p50_ms": pct(0.50),
        "latency_p99_ms": pct(0.99),
    }


def bench_journal(
    directory: Path | str, n: int, size: int, *, use_uvloop: bool = False, **kw: Any
) -> dict[str, float]:
    """Synchronous wrapper of ``bench_journal_async`` (runs its own event loop; uvloop if asked and installed)."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if use_uvloop:
        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:
            factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(bench_journal_async(directory, n, size, **kw))
