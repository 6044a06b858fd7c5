"""Ledger storage: entries and the ledger index, behind one small interface.

``RocksLedgerStorage`` keeps everything in one RocksDB (``rocksdict``, raw mode) with RocksDB's own WAL off,
because the journal is the write-ahead log: whatever RocksDB loses in a crash is replayed from the journal,
and a checkpoint (``flush``) happens before the journal mark advances.

Keys (all integers big-endian, so RocksDB's order is (ledger, entry) order):

    default column family:  b"R" + u64 ledger_id + u64 first entry_id -> a run (``pack_run``)
    column family "index":  b"L" + u64 ledger_id                -> ledger index row (see ``LedgerInfo.to_bytes``)

A run is up to ``RUN_ENTRIES_MAX`` (64) entries of one ledger within one block of 64 entry ids (runs never cross
a multiple of 64), stored exactly as the client built them, in one value keyed by the first id it holds;
``plan_runs`` cuts every storage write into runs, at block boundaries, where ids stop rising, at another ledger
and at ``RUN_BYTES_MAX``. A run's value has one of two formats, told apart by its first u32 (little-endian):

    format 1, consecutive entries:  u32 count (>= 1), count x u32 entry length, the entries
    format 2, entries with gaps:    u32 0, u32 2 (the format), u64 bitmap (bit i: the block's first id + i is
                                    held), popcount x u32 entry length, the entries in id order

Format 1 is all an older version wrote (and still what a run of consecutive ids is written as); format 2 is
for a bookie of a ledger striped with Qw < E, which receives Qw of every E ids: cut at every gap, as the older
version did, its runs held Qw entries each (2 for E3/Qw2), one RocksDB value per ~2 entries served by a range
read; with the gaps listed a block written in one go is one value (~43 entries for E3/Qw2). An older version
reading a format 2 run fails loudly (a count of 0 is not a run for it), never returns a wrong entry; going back to
one after writing striped ledgers means re-replicating them. A format 2 run must start with its key's id (the
bitmap's lowest bit), else it is an error like any malformed value.
One key per run instead of one per entry is most of what RocksDB costs per entry (the write batch, the memtable's
skip list, the flush's per-record work, a blob record with its CRC32C and a blob reference in the SST): write +
flush of 1 KiB entries costs clearly less CPU per entry in runs of 16-256 than one key each
(docs/benchmarks-history.md, "Entries stored in runs"). A read gets the run keyed by its entry's block's first
id, and only when that run does not hold the entry (its block was
written in pieces, or that id is not this bookie's) seeks backward (``seek_for_prev`` to the entry's key; a run
starting more than 64 ids earlier cannot hold it, which bounds the scan when runs overlap, as re-added entries
make them); it keeps the last ``RUNS_CACHED`` runs it decoded, so reading a ledger entry by entry reads each run
once. A run is at most ``RUN_BYTES_MAX`` (256 KiB) unless it is one larger entry (or the union below), which
bounds what a one-entry read must fetch. Entries an older version stored one key each (``b"E" + ledger +
entry``) are still read, and deleted with their ledger.

A write never takes an entry out of storage. A run written under a key that holds a run already (a re-add, a
duplicate in one batch, a journal replay: entries are immutable) is dropped when the stored run holds all its
ids, replaces it when it holds all the stored ids (a replay reaching further), and otherwise (runs with gaps can
each hold ids the other lacks, e.g. entries re-added after an ensemble change) both become one run, their union,
the stored entry kept where both hold an id. For runs of consecutive ids this is the older rule "a shorter run
never replaces a longer one under the same key". Replaying the journal is therefore idempotent whatever the
group boundaries were: runs under other keys may overlap stored ones, and reads find each entry in whichever run
holds it.

The index rows live in their own column family because every write batch rewrites them: in the entries' key
space they would make every flushed SST span from its first entry key to the ``L`` rows, so all SSTs would
overlap and RocksDB would merge-rewrite every entry again and again in compaction (measured:
docs/benchmarks-history.md, "Index column family, direct I/O, blob files"). Alone, a ledger's entries arrive in
key order, flushed SSTs do not overlap,
and compaction moves them down without rewriting them.

Entries of ``BLOB_MIN_BYTES`` or more are kept in RocksDB's blob files (BlobDB): a flush writes the values once,
sequentially, into a blob file, and the SSTs hold only keys and blob references. Many ledgers written at once
interleave in every memtable, so their SSTs do overlap and are compacted, but compaction then rewrites ~30-byte
references instead of the entries (with 16 ledgers written at once, a small fraction of the compaction writes
without blob files: docs/benchmarks-history.md, "Index column family, direct I/O, blob files"). This is
BookKeeper's entry-log design inside RocksDB: values in append-only files, an index beside them. It has a price:
RocksDB checksums every blob record with a CRC32C, and rocksdict's build computes it in software, so a flush
into blob files costs more CPU than a flush that keeps the values in the SST (write and flush together per 1 KiB
entry, one key per entry and in runs: docs/benchmarks-history.md, "Where the CPU goes" and "Entries stored in
runs").
When a bookie is writing one ledger only, its flushed SSTs never overlap (keys rise) and compaction moves them
down without rewriting them, so mode ``auto`` (``ValueSeparation``) puts values in blob files only while ledgers
interleave: as soon as a second ledger is written, blob files are switched on (RocksDB's mutable option
``enable_blob_files``, applied from the next flush), and off again after two quiet windows in which only one
ledger was written. Both kinds of files are read alike. ``auto`` is the default: deleting a ledger kept in the
SSTs costs more (its range delete's compaction reads every entry again, where a blob file whose entries are all
deleted is just removed), but with entries stored in runs it no longer costs more than it saves over an entry's
life (write + flush and delete: docs/benchmarks-history.md, "Entries stored in runs"); with one key per entry
blob files were the cheaper, and ``on`` was the default).

Deleting ledgers range-deletes their keys, a batch of ledgers in one durable write batch (all or none after a
crash), and compacts once per batch, over the span of those that held entries (``delete_ledgers``), so their SSTs
go and blob files left without live references are deleted. A blob file that also holds live entries keeps its deleted ones as garbage
until ``collect_blob_garbage`` copies the live ones out, which it does once garbage is a large enough share of
the blob files (``BlobGarbagePolicy``; the bookie asks after each garbage-collection round).

``MemoryLedgerStorage`` implements the same interface in memory for the simulator and unit tests.
"""

from __future__ import annotations

import array
import bisect
import itertools
import logging
import operator
import os
import shutil
import struct
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .protocol import MASTER_KEY_LEN

log = logging.getLogger("ledgerstore.bookie.storage")

_ENTRY_KEY = struct.Struct(">cQQ")
_RUN_PREFIX_LEN = 9  # b"R" + u64 ledger id: a ledger's run keys share it
_RUN_FIRST = struct.Struct(">Q")  # a run key's first entry id, after the prefix
_LEDGER_KEY = struct.Struct(">cQ")
# flags (bit0 fenced), master key, lac, explicit lac, last entry id, blob length; blob follows
_INDEX_ROW = struct.Struct(f">B{MASTER_KEY_LEN}sqqqH")
_U64_MAX = 2**64 - 1


@dataclass(slots=True)
class LedgerInfo:
    """What a bookie knows of one ledger (kept in memory, persisted as the index row)."""

    master_key: bytes
    fenced: bool = False
    lac: int = -1  # max LAC piggybacked on stored entries
    explicit_lac: int = -1
    lac_blob: bytes = b""
    last_entry_id: int = -1  # highest entry id stored

    def to_bytes(self) -> bytes:
        return (
            _INDEX_ROW.pack(
                1 if self.fenced else 0,
                self.master_key,
                self.lac,
                self.explicit_lac,
                self.last_entry_id,
                len(self.lac_blob),
            )
            + self.lac_blob
        )

    @classmethod
    def from_bytes(cls, raw: bytes) -> LedgerInfo:
        flags, key, lac, elac, last, n = _INDEX_ROW.unpack_from(raw)
        blob = bytes(raw[_INDEX_ROW.size : _INDEX_ROW.size + n])
        return cls(
            master_key=key,
            fenced=bool(flags & 1),
            lac=lac,
            explicit_lac=elac,
            lac_blob=blob,
            last_entry_id=last,
        )


def entry_key(ledger_id: int, entry_id: int) -> bytes:
    return _ENTRY_KEY.pack(b"E", ledger_id, entry_id)


def ledger_key(ledger_id: int) -> bytes:
    return _LEDGER_KEY.pack(b"L", ledger_id)


def run_key(ledger_id: int, first_entry_id: int) -> bytes:
    return _ENTRY_KEY.pack(b"R", ledger_id, first_entry_id)


# A run: up to RUN_ENTRIES_MAX entries of one ledger within one block of RUN_ENTRIES_MAX ids, as one value of at
# most RUN_BYTES_MAX bytes (an entry larger than that is a run of its own).
RUN_ENTRIES_MAX = 64
RUN_BYTES_MAX = 256 * 1024
_RUN_COUNT = struct.Struct("<I")
# A run with gaps (format 2): u32 0 (a consecutive run's count, never 0), u32 format, u64 bitmap of its ids
_GAP_HEAD = struct.Struct("<IIQ")
RUN_FORMAT_GAPS = 2
_LITTLE_ENDIAN = sys.byteorder == "little"


def plan_runs(lids: Sequence[int], eids: Sequence[int], sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Split rows (columns: ledger ids, entry ids, entry sizes) into runs, as [start, end) row ranges: a run's
    rows are one ledger's rising entry ids within one block of ``RUN_ENTRIES_MAX`` ids (gaps allowed: a bookie
    of a ledger striped with Qw < E receives Qw of every E ids), and their sizes add up to at most
    ``RUN_BYTES_MAX`` unless the run is one entry. A block written in one go is one run, keyed by the first id
    it holds there. Pure."""
    n = len(lids)
    if not n:
        return []
    e0, en = eids[0], eids[-1]
    if lids.count(lids[0]) == n and max(sizes) * RUN_ENTRIES_MAX <= RUN_BYTES_MAX:
        # the common case (one connection's adds to one ledger): cut at block boundaries alone
        if en - e0 == n - 1 and tuple(eids) == tuple(range(e0, e0 + n)):  # consecutive
            cuts = [0, *range((-e0) % RUN_ENTRIES_MAX or RUN_ENTRIES_MAX, n, RUN_ENTRIES_MAX), n]
            return list(itertools.pairwise(cuts))
        if all(map(operator.lt, eids[:-1], eids[1:])):  # rising, with gaps
            cuts, i = [0], 0
            while (nxt := eids[i] - eids[i] % RUN_ENTRIES_MAX + RUN_ENTRIES_MAX) <= en:
                i = bisect.bisect_left(eids, nxt, i)
                cuts.append(i)
            cuts.append(n)
            return list(itertools.pairwise(cuts))
    runs = []
    start, size = 0, sizes[0]
    for i in range(1, n):
        if (
            lids[i] != lids[i - 1]
            or eids[i] <= eids[i - 1]
            or eids[i] // RUN_ENTRIES_MAX != eids[i - 1] // RUN_ENTRIES_MAX
            or size + sizes[i] > RUN_BYTES_MAX
        ):
            runs.append((start, i))
            start, size = i, 0
        size += sizes[i]
    runs.append((start, n))
    return runs


def _lengths(entries: Sequence[bytes]) -> bytes:
    lens = array.array("I", map(len, entries))
    if not _LITTLE_ENDIAN:
        lens.byteswap()
    return lens.tobytes()


def pack_run(entries: Sequence[bytes]) -> bytes:
    """A run of consecutive entries (format 1): u32 count, the u32 length of each entry (little-endian), then
    the entries."""
    parts = [_RUN_COUNT.pack(len(entries)), _lengths(entries)]
    parts += entries
    return b"".join(parts)


def pack_block_run(eids: Sequence[int], entries: Sequence[bytes]) -> bytes:
    """A run of the rising entry ids ``eids`` of one block of ``RUN_ENTRIES_MAX`` ids: format 1 when they are
    consecutive, else format 2 (u32 0, u32 2, u64 bitmap of the ids held, bit i = the block's first id + i,
    then the entries' u32 lengths and the entries, as format 1)."""
    first, last = eids[0], eids[-1]
    if last - first == len(eids) - 1:
        return pack_run(entries)
    base = first - first % RUN_ENTRIES_MAX
    if last - base >= RUN_ENTRIES_MAX:
        raise ValueError(f"entry ids {first}..{last} are not within one block of {RUN_ENTRIES_MAX}")
    bitmap, prev = 0, first - 1
    for e in eids:
        if e <= prev:
            raise ValueError(f"entry ids of a run must rise: {e} after {prev}")
        bitmap |= 1 << (e - base)
        prev = e
    parts = [_GAP_HEAD.pack(0, RUN_FORMAT_GAPS, bitmap), _lengths(entries)]
    parts += entries
    return b"".join(parts)


def _offsets(value: bytes, head: int, n: int) -> Sequence[int]:
    end = head + 4 * n
    if n == 0 or len(value) < end:
        raise ValueError(f"run value of {len(value)} bytes cannot hold {n} entry lengths")
    lens = _RUN_LENS.get(n)
    if lens is None:  # one struct per count (runs hold at most RUN_ENTRIES_MAX entries, but accept more)
        if len(_RUN_LENS) >= 2 * RUN_ENTRIES_MAX:
            _RUN_LENS.clear()
        lens = _RUN_LENS[n] = struct.Struct(f"<{n}I")
    sizes = lens.unpack_from(value, head)
    w = sizes[0]
    offsets: Sequence[int]
    if w and sizes.count(w) == n:  # entries of one size (the usual run): the offsets are arithmetic, a range
        offsets = range(end, end + (n + 1) * w, w)
    else:
        offsets = list(itertools.accumulate(sizes, initial=end))
    if offsets[-1] != len(value):
        raise ValueError(f"run value of {len(value)} bytes, its entries' lengths add up to {offsets[-1]}")
    return offsets


def run_offsets(value: bytes) -> Sequence[int]:
    """Where each entry of a packed run of consecutive entries (format 1) starts in ``value``, and where the
    last one ends (count + 1 offsets; a ``range`` when the entries are of one size). Raises ``ValueError`` on a
    value that is not a well-formed such run."""
    if len(value) < _RUN_COUNT.size:
        raise ValueError("run value shorter than its count")
    (n,) = _RUN_COUNT.unpack_from(value)
    return _offsets(value, _RUN_COUNT.size, n)


def decode_run(first: int, value: bytes) -> tuple[int, Sequence[int], list[int] | None]:
    """A stored run keyed by entry id ``first``, either format: (its last entry id, ``run_offsets``, slots).
    Slots is None for consecutive entries (entry ``e`` is the run's ``e - first``-th), else slot ``e - first``
    is entry ``e``'s position in the run, -1 where the run has no such entry. Raises ``ValueError`` on a value
    that is not a well-formed run, or whose first id is not its key's."""
    if len(value) >= _GAP_HEAD.size and value[:4] == b"\0\0\0\0":
        _, fmt, bitmap = _GAP_HEAD.unpack_from(value)
        if fmt != RUN_FORMAT_GAPS:
            raise ValueError(f"run of unknown format {fmt}")
        rel = first % RUN_ENTRIES_MAX
        if not bitmap >> rel & 1 or bitmap & ((1 << rel) - 1):
            raise ValueError(f"run keyed {first} does not start there (ids bitmap {bitmap:#x})")
        bits = bitmap >> rel
        slots = _SLOTS.get(bits)
        if slots is None:  # a striped ledger's blocks repeat a few patterns: each is worked out once
            slots = [-1] * bits.bit_length()
            k = 0
            for i in range(len(slots)):
                if bits >> i & 1:
                    slots[i] = k
                    k += 1
            if len(_SLOTS) >= _SLOTS_MAX:
                _SLOTS.clear()
            _SLOTS[bits] = slots
        return first + len(slots) - 1, _offsets(value, _GAP_HEAD.size, bits.bit_count()), slots
    offsets = run_offsets(value)
    return first + len(offsets) - 2, offsets, None


def run_entries(first: int, value: bytes) -> tuple[list[int], list[bytes]]:
    """A stored run's entry ids and entries (either format)."""
    last, offsets, slots = decode_run(first, value)
    ids = (
        list(range(first, last + 1)) if slots is None else [first + i for i, k in enumerate(slots) if k >= 0]
    )
    return ids, [value[offsets[k] : offsets[k + 1]] for k in range(len(ids))]


_RUN_LENS: dict[int, struct.Struct] = {}  # entry count -> the struct of a run's entry lengths
_SLOTS: dict[int, list[int]] = {}  # a run's id bitmap from its first id -> its slots (shared: never changed)
_SLOTS_MAX = 4096

# A decoded stored run: (first entry id, last entry id, value, offsets, slots), as ``decode_run`` gives them
_Decoded = tuple[int, int, bytes, Sequence[int], list[int] | None]
#: a piece of a range read (``RocksLedgerStorage.range_runs``): a run's value, its entries' offsets, the positions
#: of the entries asked for
RangePiece = tuple[bytes, Sequence[int], Sequence[int]]


def _decode(first: int, value: bytes) -> _Decoded:
    last, offsets, slots = decode_run(first, value)
    return first, last, value, offsets, slots


def _holds(run: _Decoded, entry_id: int) -> bool:
    first, last, _, _, slots = run
    return first <= entry_id <= last and (slots is None or slots[entry_id - first] >= 0)


Ints = Sequence[int]
LedgerRows = Iterable[tuple[int, LedgerInfo]]


def entry_columns(rows: Iterable[tuple[int, int, bytes]]) -> tuple[Ints, Ints, Sequence[bytes]]:
    """(ledger id, entry id, entry) rows as three columns."""
    cols = tuple(zip(*rows, strict=True))
    return (cols[0], cols[1], cols[2]) if cols else ((), (), ())


class LedgerStorage(Protocol):
    def load_index(self) -> dict[int, LedgerInfo]: ...

    def write(
        self, entries: Iterable[tuple[int, int, bytes]], ledgers: Iterable[tuple[int, LedgerInfo]]
    ) -> None:
        """Store entries and index rows together (one batch)."""

    def write_columns(self, lids: Ints, eids: Ints, entries: Sequence[bytes], ledgers: LedgerRows) -> None:
        """``write`` with the entries given as columns (ledger ids, entry ids, entries)."""

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None: ...

    def get_range(
        self, ledger_id: int, first: int, last: int, max_bytes: int, step: int = 1
    ) -> list[bytes]: ...

    def delete_ledger(self, ledger_id: int) -> None: ...

    def delete_ledgers(self, ledger_ids: Sequence[int]) -> None:
        """Delete several ledgers at once: all of them, or (after a crash) none."""

    def flush(self) -> None:
        """Make everything written so far durable (the checkpoint)."""

    def close(self) -> None: ...


class MemoryLedgerStorage:
    """In-memory storage with the same interface (simulator and unit tests)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int], bytes] = {}
        self.index: dict[int, bytes] = {}

    def load_index(self) -> dict[int, LedgerInfo]:
        return {lid: LedgerInfo.from_bytes(raw) for lid, raw in self.index.items()}

    def write(
        self, entries: Iterable[tuple[int, int, bytes]], ledgers: Iterable[tuple[int, LedgerInfo]]
    ) -> None:
        for lid, eid, data in entries:
            self.entries[(lid, eid)] = data
        for lid, info in ledgers:
            self.index[lid] = info.to_bytes()

    def write_columns(self, lids: Ints, eids: Ints, entries: Sequence[bytes], ledgers: LedgerRows) -> None:
        self.write(zip(lids, eids, entries, strict=True), ledgers)

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self.entries.get((ledger_id, entry_id))

    def get_range(self, ledger_id: int, first: int, last: int, max_bytes: int, step: int = 1) -> list[bytes]:
        out: list[bytes] = []
        size = 0
        for eid in range(first, last + 1, step):
            data = self.entries.get((ledger_id, eid))
            if data is None or (out and size + len(data) > max_bytes):
                break
            out.append(data)
            size += len(data)
        return out

    def delete_ledger(self, ledger_id: int) -> None:
        self.delete_ledgers([ledger_id])

    def delete_ledgers(self, ledger_ids: Sequence[int]) -> None:
        gone = set(ledger_ids)
        for lid in gone:
            self.index.pop(lid, None)
        for key in [k for k in self.entries if k[0] in gone]:
            del self.entries[key]

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def storage_present(directory: Path) -> bool:
    """``directory`` holds a RocksDB (its ``CURRENT`` file names the live manifest; RocksDB writes it when it
    creates the database, and a directory whose database files were deleted has none)."""
    return (directory / "CURRENT").exists()


def _supports_direct_io(directory: Path) -> bool:
    """Whether files in ``directory`` can be opened with O_DIRECT (tmpfs, for one, refuses it)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    probe = directory / ".direct-io-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | flag, 0o600)
    except OSError:
        return False
    os.close(fd)
    probe.unlink(missing_ok=True)
    return True


INDEX_CF = "index"
DIRECT_WRITE_BYTES = 128 * 1024
FLUSH_SYNC_BYTES = 1024 * 1024
MEMTABLES_MAX = 8
BLOB_MIN_BYTES = 256
BLOB_FILE_BYTES = 256 * 1024 * 1024
RUNS_CACHED = 16
DEFAULT_CACHE_MB = 256


class ValueSeparation:
    """When RocksDB should keep entries in blob files rather than in the SSTs (pure; see the module docstring).

    ``mode``: ``auto`` (blob files while more than one ledger is being written), ``on`` (always), ``off``
    (never). ``observe(ledger_ids, now)`` is told the ledgers of each storage write and returns the new setting
    when it changes (None otherwise). In ``auto``, a window of ``window_s`` seconds that saw two or more ledgers
    switches blob files on at once; ``quiet_windows`` consecutive windows with at most one ledger switch them
    off. It starts on: until the workload is known, interleaved ledgers are the safe assumption.
    """

    MODES = ("auto", "on", "off")
    __slots__ = (
        "mode",
        "window_s",
        "quiet_windows",
        "enabled",
        "switches",
        "_start",
        "_first",
        "_many",
        "_quiet",
    )

    def __init__(self, mode: str = "auto", *, window_s: float = 1.0, quiet_windows: int = 2) -> None:
        if mode not in self.MODES:
            raise ValueError(f"blob-file mode must be one of {', '.join(self.MODES)}, not {mode!r}")
        self.mode = mode
        self.window_s = window_s
        self.quiet_windows = max(1, quiet_windows)
        self.enabled = mode != "off"
        self.switches = 0
        self._start: float | None = None
        self._first: int | None = None  # the one ledger of the current window so far
        self._many = False  # the current window saw two or more ledgers
        self._quiet = 0  # consecutive finished windows with at most one ledger

    def observe(self, ledger_ids: Iterable[int], now: float) -> bool | None:
        if self.mode != "auto":
            return None
        if self._start is None:
            self._start = now
        elif now - self._start >= self.window_s:
            self._quiet = 0 if self._many else self._quiet + 1
            self._start, self._first, self._many = now, None, False
        if not self._many:
            for lid in ledger_ids:
                if self._first is None:
                    self._first = lid
                elif lid != self._first:
                    self._many = True
                    self._quiet = 0
                    break
        want = self._many or (self.enabled and self._quiet < self.quiet_windows)
        if want == self.enabled:
            return None
        self.enabled = want
        self.switches += 1
        return want


class BlobGarbagePolicy:
    """When a bookie should collect the garbage in its blob files (pure; see ``collect_blob_garbage``).

    RocksDB's own blob garbage collection is driven by age: with it on, every compaction relocates the live blobs
    of the oldest ``age cutoff`` of blob files, garbage or not. Ledgers written at once overlap in every flushed SST,
    so compactions run all the time, and live entries were reread and rewritten over and over (with 4 ledgers at
    once the compaction threads took a good part of a core per bookie, and the rate fell with it:
    docs/benchmarks-history.md, "Entries stored in runs", several ledgers at once). Garbage only appears when a
    ledger is deleted (or a run is replaced by a longer one), so, like
    BookKeeper's entry-log compaction, collection is driven by the share of garbage: a pass is due once the
    blob files' garbage is at least ``ratio`` of the bytes stored (blob files and SSTs: a pass rewrites both) and
    at least ``min_bytes``. A pass copies what is live, at most ``(1 - ratio) / ratio`` bytes per byte it frees
    (1 at the default 0.5), and between passes storage holds at most ``1 / (1 - ratio)`` times the live entries'
    bytes (2x at 0.5) plus ``min_bytes``. A pass needs free disk space for its copies: ``room`` asks for the live
    bytes plus a margin, and without it the pass waits (the deleted entries stay, nothing live is at risk).
    """

    __slots__ = ("ratio", "min_bytes")
    ROOM_MARGIN_BYTES = 256 * 1024 * 1024

    def __init__(self, ratio: float = 0.5, min_bytes: int = 64 * 1024 * 1024) -> None:
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"blob garbage ratio must be in (0, 1], not {ratio!r}")
        if min_bytes < 0:
            raise ValueError(f"blob garbage minimum must be >= 0 bytes, not {min_bytes!r}")
        self.ratio = ratio
        self.min_bytes = min_bytes

    def due(self, stored_bytes: int, garbage_bytes: int) -> bool:
        """``stored_bytes``: blob files and SSTs of the entries; ``garbage_bytes``: the blob files' garbage."""
        return (
            garbage_bytes > 0
            and garbage_bytes >= self.min_bytes
            and garbage_bytes >= self.ratio * stored_bytes
        )

    def room(self, stored_bytes: int, garbage_bytes: int, free_bytes: int) -> bool:
        """Whether the disk has room for a pass: its copies of what is live, and a margin for writes meanwhile."""
        return free_bytes >= max(0, stored_bytes - garbage_bytes) + self.ROOM_MARGIN_BYTES


@dataclass(frozen=True)
class BlobGcPass:
    """What one blob garbage collection pass did (``RocksLedgerStorage.collect_blob_garbage``): the entries'
    bytes stored (blob files and SSTs) and the blob files' garbage, before and after."""

    stored_bytes_before: int
    garbage_bytes_before: int
    stored_bytes_after: int
    garbage_bytes_after: int
    seconds: float

    @property
    def reclaimed_bytes(self) -> int:
        return max(0, self.stored_bytes_before - self.stored_bytes_after)


class RocksLedgerStorage:
    """RocksDB-backed storage (``rocksdict`` in raw mode, WAL off: the journal is the WAL)."""

    def __init__(
        self,
        directory: Path,
        *,
        write_buffer_mb: int = 64,
        write_rate_mb: int = 0,
        flush_threads: int = 1,
        blob_files: str = "auto",
        blob_window_s: float = 1.0,
        blob_gc: BlobGarbagePolicy | None = None,
        direct_io: bool = True,
        cache_mb: int = DEFAULT_CACHE_MB,
    ) -> None:
        from rocksdict import (
            BlockBasedOptions,
            Cache,
            DBCompressionType,
            Options,
            Rdict,
            ReadOptions,
            WriteOptions,
        )

        directory.mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.increase_parallelism(2)
        if flush_threads > 1:
            # RocksDB runs max(1, jobs / 4) memtable flushes at once. A flush writes its 128 KiB direct-I/O
            # requests one after another, so one flush thread is bounded by the disk's write latency: with the
            # journal on its own device (``--journal-dir``), 3/3/2 outran it and memtables piled up into write
            # delays; two flush threads held the rate (docs/benchmarks-history.md, "Where the disk's time
            # goes").
            opts.set_max_background_jobs(4 * flush_threads)
        opts.set_write_buffer_size(write_buffer_mb * 1024 * 1024)
        # Up to MEMTABLES_MAX memtables: one filling while others flush. RocksDB delays writes once all but one
        # are full, and rocksdict holds the GIL through a delayed write, so the whole bookie (loop and journal
        # thread) stops: with 4, direct-I/O flushes sharing the disk with the journal fell behind for moments
        # and the delays made adds take tens of ms in episodes; with 8, none in the same runs
        # (docs/benchmarks-history.md, "Index column family, direct I/O, blob files").
        opts.set_max_write_buffer_number(MEMTABLES_MAX)
        # Entries are opaque and usually incompressible (or compressed by the application): compressing them
        # on flush costs CPU the bookie's loop needs.
        opts.set_compression_type(DBCompressionType.none())
        # Reads of a ledger are mostly sequential (range reads, catch-up readers): let the kernel read ahead in
        # SST and blob files rather than have RocksDB advise random access: a range read of entries just
        # flushed costs a fraction of what it did (docs/benchmarks-history.md, "Strided READ_RANGE for Qw < E").
        opts.set_advise_random_on_open(False)
        # Flushes and compactions write with direct I/O in 128 KiB requests (``direct_io``, the default): a
        # memtable flush never has more than one request in flight in front of the journal's fdatasyncs on a
        # shared disk, and never lands on the device as one 64 MiB burst at the SST's fsync
        # (docs/benchmarks-history.md, "Index column family, direct I/O, blob files"). Without it they write
        # through the page cache, syncing every FLUSH_SYNC_BYTES as they go (sync_file_range): the entries just
        # flushed stay cached, so the first read after a write (a catch-up reader, a Spark scan, recovery) reads
        # memory and costs each bookie about half the CPU ("Flushes through the page cache"); but the writeback
        # it queues delays the journal's syncs, and the write tail under load grows about 3x ("Flushes through
        # the page cache: the write side"). ``--storage-flush-io`` chooses.
        if direct_io and _supports_direct_io(directory):
            opts.set_use_direct_io_for_flush_and_compaction(True)
            opts.set_writable_file_max_buffer_size(DIRECT_WRITE_BYTES)
        else:
            if direct_io:
                log.warning(
                    "%s does not support direct I/O: storage flushes go through the page cache", directory
                )
            opts.set_bytes_per_sync(FLUSH_SYNC_BYTES)
        if cache_mb < 0:
            raise ValueError(f"storage cache must be >= 0 MiB, not {cache_mb!r}")
        if cache_mb > 0:
            # The entries' block cache, which each flush fills with the blocks it writes (RocksDB's
            # ``prepopulate_block_cache=kFlushOnly``, set once the database is open): with flushes written around
            # the page cache (direct I/O), the first read after a write (a catch-up reader, a Spark scan,
            # recovery) would otherwise read every run back from the disk, at about twice the bookie's CPU per
            # entry; from the cache it costs about half (docs/benchmarks-history.md, "A block cache the flushes
            # fill"). RocksDB's automatic iterator read-ahead still reads the file beside cached blocks (turned
            # off, reads of blocks not in the cache were 40 % slower). Compaction outputs are not added, and
            # entries kept in blob files (ledgers written interleaved) are not either: rocksdict sets no blob
            # cache.
            table = BlockBasedOptions()
            table.set_block_cache(Cache(cache_mb * 1024 * 1024))
            opts.set_block_based_table_factory(table)
        if write_rate_mb > 0:
            # Opt-in: RocksDB's rate limiter paces flushes and compactions further, but when it falls behind,
            # writes stall, and a stalled write holds the GIL (rocksdict), which stops the whole bookie.
            opts.set_ratelimiter(write_rate_mb * 1024 * 1024, 10_000, 10)
        self._separation = ValueSeparation(blob_files, window_s=blob_window_s)
        opts.set_enable_blob_files(self._separation.enabled)
        opts.set_min_blob_size(BLOB_MIN_BYTES)
        opts.set_blob_file_size(BLOB_FILE_BYTES)
        # RocksDB's age-driven blob GC stays off: collect_blob_garbage turns it on for a pass when garbage is due.
        opts.set_enable_blob_gc(False)
        self.blob_gc = blob_gc or BlobGarbagePolicy()
        self._gc_lock = threading.Lock()
        self._closing = False
        self.blob_gc_passes = 0
        self.blob_gc_reclaimed_bytes = 0
        self.blob_gc_no_room = 0  # passes due but not run: too little free disk space
        self.deleted_ledgers = 0
        self.delete_batches = 0  # durable write batches of range deletes (delete_ledgers calls)
        self.delete_compactions = 0  # compactions after them: at most one per batch
        index_opts = Options(raw_mode=True)
        index_opts.set_write_buffer_size(4 * 1024 * 1024)
        self._db = Rdict(str(directory), opts, column_families={INDEX_CF: index_opts})
        self._index = self._db.get_column_family(INDEX_CF)
        self._index_cf = self._db.get_column_family_handle(INDEX_CF)
        if cache_mb > 0:
            self._db.set_options({"block_based_table_factory": "{prepopulate_block_cache=kFlushOnly;}"})
        self._wo = WriteOptions()
        self._wo.disable_wal = True  # type: ignore[method-assign,assignment]  # a property; stubs are wrong
        # Range reads walk the runs without RocksDB's checksums (see get_range)
        self._range_read = ReadOptions()
        self._range_read.set_verify_checksums(False)
        self.directory = directory
        self._move_legacy_index_rows()
        # recently read runs, newest last: (ledger id, first entry id) -> the decoded run
        self._runs: OrderedDict[tuple[int, int], _Decoded] = OrderedDict()
        self._runs_lock = threading.Lock()
        # ledger id -> the first entry id of its last run in key order (see _top_run), for the ledgers written
        self._tops: dict[int, int] = {}
        self._legacy_keys = self._has_entry_keys()

    def _has_entry_keys(self) -> bool:
        """Whether an older version left entries under their own keys (read, never written, by this one)."""
        it = self._db.iter()
        it.seek(b"E")
        found = it.valid() and it.key()[:1] == b"E"
        del it
        return found

    def _move_legacy_index_rows(self) -> None:
        """Move index rows an older version kept beside the entries into the index column family."""
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        moved = 0
        it = self._db.iter()
        it.seek(b"L")
        while it.valid() and it.key().startswith(b"L"):
            wb.put(it.key(), it.value(), self._index_cf)
            wb.delete(it.key())
            moved += 1
            it.next()
        del it
        if moved:
            self._db.write(wb)  # WAL on: the move is durable before anything else happens
            log.info(
                "%s: moved %d ledger index rows into the %r column family", self.directory, moved, INDEX_CF
            )

    def load_index(self) -> dict[int, LedgerInfo]:
        out: dict[int, LedgerInfo] = {}
        it = self._index.iter()
        it.seek(b"L")
        while it.valid():
            key = it.key()
            if not key.startswith(b"L"):
                break
            (_, lid) = _LEDGER_KEY.unpack(key)
            out[lid] = LedgerInfo.from_bytes(it.value())
            it.next()
        del it
        return out

    def write(
        self, entries: Iterable[tuple[int, int, bytes]], ledgers: Iterable[tuple[int, LedgerInfo]]
    ) -> None:
        self.write_columns(*entry_columns(entries), ledgers)

    def write_columns(self, lids: Ints, eids: Ints, entries: Sequence[bytes], ledgers: LedgerRows) -> None:
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        key = _ENTRY_KEY.pack
        tops = self._tops
        batch_tops: dict[int, int] = {}
        batch_runs: dict[bytes, tuple[Sequence[int], Sequence[bytes]]] = {}  # key -> the run this batch puts
        for a, b in plan_runs(lids, eids, list(map(len, entries))):
            lid, first = lids[a], eids[a]
            k = key(b"R", lid, first)
            top = batch_tops.get(lid)
            if top is None:
                top = batch_tops[lid] = tops[lid] if lid in tops else self._top_run(lid)
            run_ids, run = eids[a:b], entries[a:b]
            if first > top:  # appending past every run of the ledger: no run has this key yet
                batch_tops[lid] = first
            else:
                merged = self._merge_run(k, first, run_ids, run, batch_runs)
                if merged is None:
                    continue  # entries are immutable: the run already there holds these and maybe more
                run_ids, run = merged
            wb.put(k, pack_block_run(run_ids, run))
            batch_runs[k] = (run_ids, run)
        index_cf = self._index_cf
        lids_written = []
        for lid, info in ledgers:
            wb.put(ledger_key(lid), info.to_bytes(), index_cf)
            lids_written.append(lid)
        self._db.write(wb, self._wo)
        tops.update(batch_tops)
        if self._separation.mode != "auto":
            return
        switch = self._separation.observe(lids_written, time.monotonic())
        if switch is not None:
            self._db.set_options({"enable_blob_files": "true" if switch else "false"})
            log.info("%s: %s", self.directory, "ledgers interleave: entries go to blob files" if switch
                     else "one ledger at a time: entries stay in the SSTs")  # fmt: skip

    def _top_run(self, ledger_id: int) -> int:
        """The first entry id of the ledger's last run in key order (-1 when it has none): a run starting after
        it is new. Read from RocksDB once per ledger, then kept in ``_tops`` by ``write_columns``."""
        it = self._db.iter()
        try:
            it.seek_for_prev(run_key(ledger_id, _U64_MAX))
            if it.valid():
                key = it.key()
                if len(key) == _ENTRY_KEY.size and key[:1] == b"R":
                    _, lid, first = _ENTRY_KEY.unpack(key)
                    if lid == ledger_id:
                        return int(first)
            return -1
        finally:
            del it

    def _merge_run(
        self,
        key: bytes,
        first: int,
        eids: Sequence[int],
        entries: Sequence[bytes],
        batch_runs: dict[bytes, tuple[Sequence[int], Sequence[bytes]]],
    ) -> tuple[Sequence[int], Sequence[bytes]] | None:
        """What to put at ``key`` for a new run (``eids``, ``entries``) when a run may be there already (put
        earlier in this batch, or stored): None when that run holds every id of the new one (a re-add, a
        duplicate, a journal replay: entries are immutable), else the union of both, so a put never takes an
        entry out of storage. Consecutive runs with one key start at one id, so there the longer holds the
        shorter's entries and simply stays or replaces it; runs with gaps may each hold ids the other lacks (a
        recovery re-adding entries after an ensemble change), and then both are kept in one run. Where both hold
        an id the stored entry stays."""
        held = batch_runs.get(key)
        if held is None:
            raw = self._db.get(key)
            if raw is None:
                return eids, entries
            held = run_entries(first, bytes(raw))
        held_ids, held_entries = held
        have = set(held_ids)
        if have.issuperset(eids):
            return None
        if have.issubset(eids):
            return eids, entries
        union = dict(zip(eids, entries, strict=True))
        union.update(zip(held_ids, held_entries, strict=True))
        ids = sorted(union)
        return ids, [union[e] for e in ids]

    def _run_at(self, ledger_id: int, entry_id: int) -> _Decoded | None:
        """The stored run holding ``entry_id`` (first id, last id, value, offsets, slots: see ``decode_run``),
        or None. Usually one ``get``: the run keyed by the first id of the entry's block. Otherwise (the block
        was written in pieces, or its first id is one this bookie does not hold) a bounded backward scan: a run
        holds at most ``RUN_ENTRIES_MAX`` entries, so only runs starting within that many ids before
        ``entry_id`` can hold it."""
        with self._runs_lock:
            for cached_key, run in reversed(self._runs.items()):
                if cached_key[0] == ledger_id and _holds(run, entry_id):
                    self._runs.move_to_end(cached_key)
                    return run
        block = entry_id - entry_id % RUN_ENTRIES_MAX
        raw = self._db.get(run_key(ledger_id, block))
        if raw is not None:
            run = _decode(block, bytes(raw))
            if _holds(run, entry_id):
                return self._remember(ledger_id, run)
        it = self._db.iter()
        try:
            it.seek_for_prev(run_key(ledger_id, entry_id))
            while it.valid():
                key = it.key()
                if len(key) != _ENTRY_KEY.size or key[:1] != b"R":
                    return None
                _, lid, first = _ENTRY_KEY.unpack(key)
                if lid != ledger_id or first <= entry_id - RUN_ENTRIES_MAX:
                    return None
                run = _decode(first, bytes(it.value()))
                if _holds(run, entry_id):
                    return self._remember(ledger_id, run)
                it.prev()
            return None
        finally:
            del it

    def _remember(self, ledger_id: int, run: _Decoded) -> _Decoded:
        with self._runs_lock:
            self._runs[(ledger_id, run[0])] = run
            if len(self._runs) > RUNS_CACHED:
                self._runs.popitem(last=False)
        return run

    def _legacy_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        """An entry an older version stored under its own key (``entry_key``)."""
        if not self._legacy_keys:
            return None
        v = self._db.get(entry_key(ledger_id, entry_id))
        return bytes(v) if v is not None else None

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        run = self._run_at(ledger_id, entry_id)
        if run is None:
            return self._legacy_entry(ledger_id, entry_id)
        first, _, value, offsets, slots = run
        k = entry_id - first if slots is None else slots[entry_id - first]
        return value[offsets[k] : offsets[k + 1]]

    def get_range(self, ledger_id: int, first: int, last: int, max_bytes: int, step: int = 1) -> list[bytes]:
        """Entries ``first``, ``first + step``, ... up to ``last``, stopping at the first missing one, at most
        ``max_bytes`` of them (at least one when there is one): the pieces of ``range_runs`` cut out."""
        out: list[bytes] = []
        size = 0
        for value, offsets, picked in self.range_runs(ledger_id, first, last, step):
            for k in picked:
                a, b = offsets[k], offsets[k + 1]
                if out and size + b - a > max_bytes:
                    return out
                out.append(value[a:b])
                size += b - a
        return out

    def range_runs(self, ledger_id: int, first: int, last: int, step: int = 1) -> Iterator[RangePiece]:
        """The entries ``first``, ``first + step``, ... up to ``last``, stopping at the first missing one, as
        they lie in the stored runs, one piece per run, lazily: ``(value, offsets, picked)``, the next entries
        being ``value[offsets[k]:offsets[k + 1]]`` for ``k`` in ``picked`` (a ``range`` or a list). A reader
        stops the walk by no longer asking (``get_range`` at its byte limit); the bookie's READ_RANGE builds
        its reply from the pieces without cutting out each entry (``protocol.encode_read_range_pieces``).

        One iterator walks the ledger's runs in key order from the run holding ``first``: each run is fetched
        and decoded once, however many of the asked-for entries it holds (a bookie of a striped ledger, Qw < E,
        holds ~64 * Qw / E entries of each block in one run with gaps, and a step of E picks ~64 / E of them; runs
        an older version wrote for it held Qw consecutive entries, one picked from each). An entry not in the
        run the walk reached (overlapping runs: entries re-added after a block was written in pieces) is looked
        up on its own (``_run_at``), and entries an older version stored one key each are read one by one.

        The walk reads without RocksDB's block and blob checksums: rocksdict's build computes them in software,
        most of what a run costs to fetch from a blob file (docs/benchmarks-history.md, "Strided READ_RANGE for
        Qw < E"). What they guard is guarded anyway:
        every entry carries a digest of its header and payload that the reader verifies (a damaged entry is a
        digest mismatch there, and the reader turns to another replica), and a damaged run header fails
        ``run_offsets`` (lengths that do not add up): INTERNAL. An entry the walk does not find is looked up
        again with checksums (``_run_at``), so damage never passes for a missing entry."""
        e = first
        prefix = run_key(ledger_id, 0)[:_RUN_PREFIX_LEN]
        unpack_first = _RUN_FIRST.unpack_from
        it = self._db.iter(self._range_read)
        try:
            it.seek_for_prev(run_key(ledger_id, e))
            if not it.valid() or it.key()[:_RUN_PREFIX_LEN] != prefix:
                it.seek(run_key(ledger_id, e))
            while e <= last:
                key = it.key() if it.valid() else b""
                run: _Decoded | None = None
                if key[:_RUN_PREFIX_LEN] == prefix and unpack_first(key, _RUN_PREFIX_LEN)[0] <= e:
                    (rf,) = unpack_first(key, _RUN_PREFIX_LEN)
                    value = bytes(it.value())
                    rl, offsets, slots = decode_run(rf, value)
                    it.next()
                    if e > rl:
                        continue  # a run before e (where the walk started, or overlapped by a longer one)
                    if slots is None or slots[e - rf] >= 0:
                        run = rf, rl, value, offsets, slots
                if run is None:  # the walk has no run holding e (runs overlap): look it up on its own
                    run = self._run_at(ledger_id, e)
                    if run is None:
                        data = self._legacy_entry(ledger_id, e)
                        if data is None:
                            return
                        yield data, [0, len(data)], range(1)
                        e += step
                        continue
                rf, rl, value, offsets, slots = run
                stop = min(last, rl)
                picked: Sequence[int]
                if slots is None:
                    picked = range(e - rf, stop - rf + 1, step)
                else:
                    picked = slots[e - rf : stop - rf + 1 : step]
                    if -1 in picked:  # not in this run from there: the next turn looks for it elsewhere
                        picked = picked[: picked.index(-1)]
                yield value, offsets, picked
                e += len(picked) * step
        finally:
            del it

    def runs(self, ledger_id: int, after: int = -1, limit: int = 64) -> list[tuple[int, bytes]]:
        """Up to ``limit`` of the ledger's stored runs whose first entry id is above ``after``, in key order, as
        (first entry id, raw value): undecoded, so a damaged run is seen as it is (the scrubber's walk)."""
        prefix = run_key(ledger_id, 0)[:_RUN_PREFIX_LEN]
        out: list[tuple[int, bytes]] = []
        it = self._db.iter()
        try:
            it.seek(run_key(ledger_id, after + 1))
            while it.valid() and len(out) < limit:
                key = it.key()
                if key[:_RUN_PREFIX_LEN] != prefix or len(key) != _ENTRY_KEY.size:
                    break
                out.append((_RUN_FIRST.unpack_from(key, _RUN_PREFIX_LEN)[0], bytes(it.value())))
                it.next()
        finally:
            del it
        return out

    def drop_entries(self, ledger_id: int, first: int, entry_ids: Iterable[int] | None) -> int:
        """Take ``entry_ids`` (every entry when None, or when the run does not decode) out of the run keyed
        ``first``: the scrubber's answer to damage, so that reads answer NO_ENTRY instead of bad bytes and a
        replication worker can add the entries again (an add never replaces an entry a run holds). The rest
        of the run stays, keyed by its first remaining id. Returns how many entries went; written durably."""
        from rocksdict import WriteBatch

        key = run_key(ledger_id, first)
        raw = self._db.get(key)
        if raw is None:
            return 0
        try:
            ids, entries = run_entries(first, bytes(raw))
        except ValueError:
            ids, entries = [], []
        drop = set(ids) if entry_ids is None else set(entry_ids)
        keep = [(e, d) for e, d in zip(ids, entries, strict=True) if e not in drop]
        wb = WriteBatch(raw_mode=True)
        wb.delete(key)
        if keep:
            kept_ids, kept = [e for e, _ in keep], [d for _, d in keep]
            new_key = run_key(ledger_id, kept_ids[0])
            if new_key != key:
                merged = self._merge_run(new_key, kept_ids[0], kept_ids, kept, {})
                if merged is not None:
                    wb.put(new_key, pack_block_run(*merged))
            else:
                wb.put(new_key, pack_block_run(kept_ids, kept))
        self._write_synced(wb, ledger_id)
        return max(len(ids) - len(keep), 1 if not ids else 0)

    def _write_synced(self, wb: Any, ledger_ids: int | Sequence[int]) -> None:
        """Write ``wb`` durably at once (WAL on, synced), then forget what is cached of those ledgers' runs."""
        from rocksdict import WriteOptions

        wo = WriteOptions()
        wo.sync = True  # type: ignore[method-assign,assignment]
        self._db.write(wb, wo)
        gone = {ledger_ids} if isinstance(ledger_ids, int) else set(ledger_ids)
        for lid in gone:
            self._tops.pop(lid, None)
        with self._runs_lock:
            for cached in [k for k in self._runs if k[0] in gone]:
                del self._runs[cached]

    def delete_ledger(self, ledger_id: int) -> None:
        self.delete_ledgers([ledger_id])

    def delete_ledgers(self, ledger_ids: Sequence[int]) -> None:
        """Delete these ledgers (entries and index rows) in one durable RocksDB write batch of range deletes, then
        compact once, over the key range from the first to the last of them that held entries (none when none
        did: a ledger that was only fenced has an index row alone). The batch is atomic: after a crash every
        ledger of it is either whole or gone. One compaction per ledger cost a memtable flush each (the range
        tombstone is in the memtable), so deleting many one by one took far longer (``gc.DELETE_BATCH``;
        docs/benchmarks-history.md, "Deleting ledgers in batches")."""
        from rocksdict import WriteBatch

        ids = sorted(set(ledger_ids))
        if not ids:
            return
        with_entries = [lid for lid in ids if self._holds_keys(lid)]
        wb = WriteBatch(raw_mode=True)
        for ledger_id in ids:
            for key in (run_key, entry_key):
                wb.delete_range(key(ledger_id, 0), key(ledger_id, _U64_MAX))
                wb.delete(key(ledger_id, _U64_MAX))
            wb.delete(ledger_key(ledger_id), self._index_cf)
        # Deletes are made durable at once (WAL on): a deleted ledger must not reappear after a crash
        # unless the journal replays it, and the journal only replays records after the last checkpoint.
        self._write_synced(wb, ids)
        self.deleted_ledgers += len(ids)
        self.delete_batches += 1
        if not with_entries:
            return
        # Give the space back now (GC runs in a thread; compaction releases the GIL): SSTs holding only these
        # ledgers are dropped, the others rewritten without them, and blob files left unreferenced are deleted.
        # One compaction over the batch's span: live ledgers between them are rewritten too (in blob files, only
        # their references), which their keys' way down the levels would cost later anyway.
        lo, hi = with_entries[0], with_entries[-1]
        self.delete_compactions += 1
        self._db.compact_range(run_key(lo, 0), run_key(hi, _U64_MAX))
        if self._legacy_keys:
            self._db.compact_range(entry_key(lo, 0), entry_key(hi, _U64_MAX))

    def _holds_keys(self, ledger_id: int) -> bool:
        """Whether the ledger has any entry key (a run, or an older version's entry key): one seek each."""
        it = self._db.iter()
        try:
            for key in (run_key, entry_key) if self._legacy_keys else (run_key,):
                start = key(ledger_id, 0)
                it.seek(start)
                if it.valid() and it.key()[:_RUN_PREFIX_LEN] == start[:_RUN_PREFIX_LEN]:
                    return True
        finally:
            del it
        return False

    def blob_garbage(self) -> tuple[int, int]:
        """(bytes of the entries' blob files and SSTs, bytes of the blob files no key refers to any more), from
        RocksDB's counters."""
        prop = self._db.property_int_value
        stored = (prop("rocksdb.live-blob-file-size") or 0) + (prop("rocksdb.total-sst-files-size") or 0)
        return stored, prop("rocksdb.live-blob-file-garbage-size") or 0

    def collect_blob_garbage(self, *, force: bool = False) -> BlobGcPass | None:
        """Collect the blob files' garbage when ``blob_gc`` says it is due (or whenever there is some, with
        ``force``), and the disk has room for it; None when no pass ran. Blocking, for a worker thread: RocksDB
        releases the GIL while it compacts. A pass is a manual compaction of every entry key with RocksDB's blob
        GC on for all blob files: the SSTs are rewritten, each live entry in a blob file is copied to a new blob
        file, and the old files are deleted. Writes and reads go on meanwhile (the compaction is not exclusive).
        """
        from rocksdict import BottommostLevelCompaction, CompactOptions

        if self._closing or not self._gc_lock.acquire(blocking=False):
            return None  # closing, or a pass is running already
        try:
            stored, garbage = self.blob_garbage()
            if not (self.blob_gc.due(stored, garbage) or (force and garbage > 0)):
                return None
            free = shutil.disk_usage(self.directory).free
            if not self.blob_gc.room(stored, garbage, free):
                self.blob_gc_no_room += 1
                log.warning(
                    "%s: blob garbage (%.1f MiB) not collected: a pass would copy %.1f MiB and %.1f MiB are free",
                    self.directory, garbage / 2**20, (stored - garbage) / 2**20, free / 2**20,
                )  # fmt: skip
                return None
            log.info(
                "%s: collecting blob garbage: %.1f of %.1f MiB stored", self.directory,
                garbage / 2**20, stored / 2**20,
            )  # fmt: skip
            start = time.monotonic()
            co = CompactOptions()
            co.set_bottommost_level_compaction(BottommostLevelCompaction.force())
            co.set_exclusive_manual_compaction(False)  # automatic compactions go on: no write stalls
            self._db.set_options(
                {"enable_blob_garbage_collection": "true", "blob_garbage_collection_age_cutoff": "1.0"}
            )
            try:
                self._db.compact_range(None, None, co)
            except Exception:
                if not self._closing:
                    raise
            finally:
                if not self._closing:
                    self._db.set_options({"enable_blob_garbage_collection": "false"})
            if (
                self._closing
            ):  # stopped by close(): RocksDB returns from the compaction, with or without an error
                log.info("%s: blob garbage pass stopped: closing", self.directory)
                return None
            done = BlobGcPass(stored, garbage, *self.blob_garbage(), time.monotonic() - start)
            self.blob_gc_passes += 1
            self.blob_gc_reclaimed_bytes += done.reclaimed_bytes
            log.info(
                "%s: blob garbage collected in %.2fs: stored %.1f -> %.1f MiB", self.directory,
                done.seconds, stored / 2**20, done.stored_bytes_after / 2**20,
            )  # fmt: skip
            return done
        finally:
            self._gc_lock.release()

    def flush(self) -> None:
        self._db.flush(True)
        self._index.flush(True)

    def gauges(self) -> dict[str, int]:
        """RocksDB's own view of the entries column family (cheap in-memory properties, for /metrics)."""
        prop = self._db.property_int_value
        delayed = (prop("rocksdb.actual-delayed-write-rate") or 0) > 0 or bool(
            prop("rocksdb.is-write-stopped")
        )
        return {
            "memtables_waiting": prop("rocksdb.num-immutable-mem-table") or 0,
            "writes_delayed": int(delayed),
            "sst_bytes": prop("rocksdb.total-sst-files-size") or 0,
            "blob_bytes": prop("rocksdb.live-blob-file-size") or 0,
            "blob_garbage_bytes": prop("rocksdb.live-blob-file-garbage-size") or 0,
            "cache_bytes": prop("rocksdb.block-cache-usage") or 0,
            "blob_files_on": int(self._separation.enabled),
            "blob_files_switches": self._separation.switches,
        }

    def close(self) -> None:
        self._closing = True
        if not self._gc_lock.acquire(blocking=False):
            # A blob garbage pass is running in a worker thread: stop it rather than wait for it (a pass can
            # take minutes). RocksDB drops the unfinished compaction's output; what it finished stays, and the
            # garbage left is collected by a later pass.
            log.info("%s: stopping a blob garbage pass to close", self.directory)
            self._db.cancel_all_background(True)
            self._gc_lock.acquire()
            cancelled = True
        else:
            cancelled = False
        # (the lock stays held: no pass starts after this)
        # The column family's Rdict holds the database open too: drop it first, or the LOCK stays held.
        del self._index, self._index_cf
        try:
            self._db.close()
        except Exception as e:
            # After cancel_all_background, RocksDB closes but reports its last flush as "shutdown in progress".
            # Nothing is lost: the bookie checkpoints storage before it closes it, and the journal replays any
            # entry written after the last checkpoint.
            if not cancelled:
                raise
            log.info("%s: closed after stopping background work (%s)", self.directory, e)
