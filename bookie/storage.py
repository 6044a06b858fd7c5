"""Ledger storage: entries and the ledger index, behind one small interface.

``RocksLedgerStorage`` keeps everything in one RocksDB (``rocksdict``, raw mode) with RocksDB's own WAL off,
because the journal is the write-ahead log: whatever RocksDB loses in a crash is replayed from the journal,
and a checkpoint (``flush``) happens before the journal mark advances.

Keys (all integers big-endian, so RocksDB's order is (ledger, entry) order):

    default column family:  b"E" + u64 ledger_id + u64 entry_id -> entry bytes, exactly as the client built them
    column family "index":  b"L" + u64 ledger_id                -> ledger index row (see ``LedgerInfo.to_bytes``)

The index rows live in their own column family because every write batch rewrites them: in the entries' key
space they would make every flushed SST span from its first entry key to the ``L`` rows, so all SSTs would
overlap and RocksDB would merge-rewrite every entry again and again in compaction (measured: 3.1 GB of compaction
writes for 1.9 GB of entries in 20 s). Alone, a ledger's entries arrive in key order, flushed SSTs do not overlap,
and compaction moves them down without rewriting them.

Entries of ``BLOB_MIN_BYTES`` or more are kept in RocksDB's blob files (BlobDB): a flush writes the values once,
sequentially, into a blob file, and the SSTs hold only keys and blob references. Many ledgers written at once
interleave in every memtable, so their SSTs do overlap and are compacted, but compaction then rewrites ~30-byte
references instead of the entries (measured with 16 ledgers over 20 s: 1.6 GB of compaction writes without blob
files, 24 MB with them). This is BookKeeper's entry-log design inside RocksDB: values in append-only files, an
index beside them. It has a price: RocksDB checksums every blob record with a CRC32C, and rocksdict's build
computes it in software (~1 GB/s), so a flush into blob files costs ~1.5 us more CPU per 1 KiB entry than a flush
that keeps the values in the SST (measured: 3.6-4.2 against 2.2-2.5 us per entry, write and flush together).
When a bookie is writing one ledger only, its flushed SSTs never overlap (keys rise) and compaction moves them
down without rewriting them, so mode ``auto`` (``ValueSeparation``) puts values in blob files only while ledgers
interleave: as soon as a second ledger is written, blob files are switched on (RocksDB's mutable option
``enable_blob_files``, applied from the next flush), and off again after two quiet windows in which only one
ledger was written. Both kinds of files are read alike. It is not the default because deleting a ledger then
costs more than it saves: the range delete's compaction must read every entry kept in the SSTs, where a
blob file whose entries are all deleted is just removed (measured, 300k 1 KiB entries per ledger: write + flush
2.5-2.8 against 3.4-3.9 us per entry, but delete 2.1-2.4 against 0.5; over an entry's life 4.6-5.2 against
3.9-4.4). ``auto`` suits ledgers that are kept, or a bookie whose ingest CPU matters more than its deletes'.

Deleting a ledger range-deletes its keys and compacts that key range at once, so its SSTs go and blob files left
without live references are deleted; blob garbage collection relocates what still lives in the oldest quarter
of blob files during compaction.

``MemoryLedgerStorage`` implements the same interface in memory for the simulator and unit tests.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .protocol import MASTER_KEY_LEN

log = logging.getLogger("ledgerstore.bookie.storage")

_ENTRY_KEY = struct.Struct(">cQQ")
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


class LedgerStorage(Protocol):
    def load_index(self) -> dict[int, LedgerInfo]: ...

    def write(
        self, entries: Iterable[tuple[int, int, bytes]], ledgers: Iterable[tuple[int, LedgerInfo]]
    ) -> None:
        """Store entries and index rows together (one batch)."""

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None: ...

    def get_range(self, ledger_id: int, first: int, last: int, max_bytes: int) -> list[bytes]: ...

    def delete_ledger(self, ledger_id: int) -> None: ...

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

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self.entries.get((ledger_id, entry_id))

    def get_range(self, ledger_id: int, first: int, last: int, max_bytes: int) -> list[bytes]:
        out: list[bytes] = []
        size = 0
        for eid in range(first, last + 1):
            data = self.entries.get((ledger_id, eid))
            if data is None or (out and size + len(data) > max_bytes):
                break
            out.append(data)
            size += len(data)
        return out

    def delete_ledger(self, ledger_id: int) -> None:
        self.index.pop(ledger_id, None)
        for key in [k for k in self.entries if k[0] == ledger_id]:
            del self.entries[key]

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


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
MEMTABLES_MAX = 8
BLOB_MIN_BYTES = 256
BLOB_FILE_BYTES = 256 * 1024 * 1024


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


class RocksLedgerStorage:
    """RocksDB-backed storage (``rocksdict`` in raw mode, WAL off: the journal is the WAL)."""

    def __init__(
        self,
        directory: Path,
        *,
        write_buffer_mb: int = 64,
        write_rate_mb: int = 0,
        flush_threads: int = 1,
        blob_files: str = "on",
        blob_window_s: float = 1.0,
    ) -> None:
        from rocksdict import DBCompressionType, Options, Rdict, WriteOptions

        directory.mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.increase_parallelism(2)
        if flush_threads > 1:
            # RocksDB runs max(1, jobs / 4) memtable flushes at once. A flush writes its 128 KiB direct-I/O
            # requests one after another, so one flush thread is bounded by the disk's write latency: with the
            # journal on its own device (``--journal-dir``), 3/3/2 at ~65k entries/s outran it and memtables
            # piled up into write delays; two flush threads held the rate (docs/BENCHMARKS.md, session 6).
            opts.set_max_background_jobs(4 * flush_threads)
        opts.set_write_buffer_size(write_buffer_mb * 1024 * 1024)
        # Up to MEMTABLES_MAX memtables: one filling while others flush. RocksDB delays writes once all but one
        # are full, and rocksdict holds the GIL through a delayed write, so the whole bookie (loop and journal
        # thread) stops: with 4, direct-I/O flushes sharing the disk with the journal fell behind for moments
        # and 0.2-0.8 s of delays per 16 s made adds take 40-70 ms in episodes; with 8, none in the same runs.
        opts.set_max_write_buffer_number(MEMTABLES_MAX)
        # Entries are opaque and usually incompressible (or compressed by the application): compressing them
        # on flush costs CPU the bookie's loop needs.
        opts.set_compression_type(DBCompressionType.none())
        # Flushes and compactions write with direct I/O in 128 KiB requests. Through the page cache, a memtable
        # flush lands on the device as one 64 MiB burst at the SST's fsync, and every journal fdatasync queued
        # behind it waits 30-100 ms; small direct writes interleave with the journal's (measured: journal
        # fsyncs over 10 ms went from ~6 % to < 0.5 %, add p99 from ~80 ms to 15-25 ms at ~105k adds/s).
        if _supports_direct_io(directory):
            opts.set_use_direct_io_for_flush_and_compaction(True)
            opts.set_writable_file_max_buffer_size(DIRECT_WRITE_BYTES)
        else:
            log.warning(
                "%s does not support direct I/O: storage flushes go through the page cache", directory
            )
        if write_rate_mb > 0:
            # Opt-in: RocksDB's rate limiter paces flushes and compactions further, but when it falls behind,
            # writes stall, and a stalled write holds the GIL (rocksdict), which stops the whole bookie.
            opts.set_ratelimiter(write_rate_mb * 1024 * 1024, 10_000, 10)
        self._separation = ValueSeparation(blob_files, window_s=blob_window_s)
        opts.set_enable_blob_files(self._separation.enabled)
        opts.set_min_blob_size(BLOB_MIN_BYTES)
        opts.set_blob_file_size(BLOB_FILE_BYTES)
        opts.set_enable_blob_gc(True)
        index_opts = Options(raw_mode=True)
        index_opts.set_write_buffer_size(4 * 1024 * 1024)
        self._db = Rdict(str(directory), opts, column_families={INDEX_CF: index_opts})
        self._index = self._db.get_column_family(INDEX_CF)
        self._index_cf = self._db.get_column_family_handle(INDEX_CF)
        self._wo = WriteOptions()
        self._wo.disable_wal = True  # type: ignore[method-assign,assignment]  # a property; stubs are wrong
        self.directory = directory
        self._move_legacy_index_rows()

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
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        pack = _ENTRY_KEY.pack
        for lid, eid, data in entries:
            wb.put(pack(b"E", lid, eid), data)
        index_cf = self._index_cf
        lids = []
        for lid, info in ledgers:
            wb.put(ledger_key(lid), info.to_bytes(), index_cf)
            lids.append(lid)
        self._db.write(wb, self._wo)
        if self._separation.mode != "auto":
            return
        switch = self._separation.observe(lids, time.monotonic())
        if switch is not None:
            self._db.set_options({"enable_blob_files": "true" if switch else "false"})
            log.info("%s: %s", self.directory, "ledgers interleave: entries go to blob files" if switch
                     else "one ledger at a time: entries stay in the SSTs")  # fmt: skip

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        v = self._db.get(entry_key(ledger_id, entry_id))
        return bytes(v) if v is not None else None

    def get_range(self, ledger_id: int, first: int, last: int, max_bytes: int) -> list[bytes]:
        out: list[bytes] = []
        size = 0
        it = self._db.iter()
        it.seek(entry_key(ledger_id, first))
        expect = first
        while it.valid() and expect <= last:
            key = it.key()
            if len(key) != _ENTRY_KEY.size or key[:1] != b"E":
                break
            _, lid, eid = _ENTRY_KEY.unpack(key)
            if lid != ledger_id or eid != expect:
                break
            data = bytes(it.value())
            if out and size + len(data) > max_bytes:
                break
            out.append(data)
            size += len(data)
            expect += 1
            it.next()
        del it
        return out

    def delete_ledger(self, ledger_id: int) -> None:
        from rocksdict import WriteBatch, WriteOptions

        wb = WriteBatch(raw_mode=True)
        wb.delete_range(entry_key(ledger_id, 0), entry_key(ledger_id, _U64_MAX))
        wb.delete(entry_key(ledger_id, _U64_MAX))
        wb.delete(ledger_key(ledger_id), self._index_cf)
        # Deletes are made durable at once (WAL on): a deleted ledger must not reappear after a crash
        # unless the journal replays it, and the journal only replays records after the last checkpoint.
        wo = WriteOptions()
        wo.sync = True  # type: ignore[method-assign,assignment]
        self._db.write(wb, wo)
        # Give the space back now (GC runs in a thread; compaction releases the GIL): SSTs holding only this
        # ledger are dropped, the others rewritten without it, and blob files left unreferenced are deleted.
        self._db.compact_range(entry_key(ledger_id, 0), entry_key(ledger_id, _U64_MAX))

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
            "blob_files_on": int(self._separation.enabled),
            "blob_files_switches": self._separation.switches,
        }

    def close(self) -> None:
        # The column family's Rdict holds the database open too: drop it first, or the LOCK stays held.
        del self._index, self._index_cf
        self._db.close()
