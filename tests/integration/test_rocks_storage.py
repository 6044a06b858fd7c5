"""RocksLedgerStorage on a real RocksDB: layout, the legacy-layout move, and compaction without rewrites."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bookie.storage import (
    INDEX_CF,
    BlobGarbagePolicy,
    LedgerInfo,
    RocksLedgerStorage,
    _supports_direct_io,
    entry_key,
    ledger_key,
    pack_run,
    plan_runs,
    run_entries,
    run_key,
)

KEY = b"k" * 20


def _wait_for_compactions(storage: RocksLedgerStorage, timeout_s: float = 10.0) -> None:
    db = storage._db
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (
            db.property_int_value("rocksdb.compaction-pending") == 0
            and db.property_int_value("rocksdb.num-running-compactions") == 0
        ):
            return
        time.sleep(0.05)
    raise AssertionError("RocksDB compactions did not finish")


def test_round_trip_across_reopen_and_delete(tmp_path: Path) -> None:
    s = RocksLedgerStorage(tmp_path / "db")
    s.write([(1, 0, b"a"), (1, 1, b"b"), (2, 0, b"c")], [(1, LedgerInfo(KEY, lac=0)), (2, LedgerInfo(KEY))])
    s.flush()
    s.close()
    s = RocksLedgerStorage(tmp_path / "db")
    assert s.load_index()[1].lac == 0 and set(s.load_index()) == {1, 2}
    assert s.get_range(1, 0, 9, 1 << 20) == [b"a", b"b"]
    s.delete_ledger(1)
    assert set(s.load_index()) == {2} and s.get_entry(1, 0) is None and s.get_entry(2, 0) == b"c"
    s.close()


def test_index_rows_live_in_their_own_column_family(tmp_path: Path) -> None:
    s = RocksLedgerStorage(tmp_path / "db")
    s.write([(5, 0, b"x")], [(5, LedgerInfo(KEY))])
    s.flush()
    entries_keys = list(s._db.keys())
    index_keys = list(s._index.keys())
    assert entries_keys == [run_key(5, 0)]
    assert index_keys == [ledger_key(5)]
    s.close()


def test_index_rows_of_the_old_layout_are_moved_once(tmp_path: Path) -> None:
    from rocksdict import Options, Rdict

    raw = Rdict(str(tmp_path / "db"), Options(raw_mode=True))
    raw[ledger_key(7)] = LedgerInfo(KEY, fenced=True).to_bytes()
    raw[entry_key(7, 0)] = b"zz"
    raw.close()

    s = RocksLedgerStorage(tmp_path / "db")
    assert s.load_index()[7].fenced
    assert list(s._db.keys()) == [entry_key(7, 0)]  # the row left the entries' key space
    s.close()
    s = RocksLedgerStorage(tmp_path / "db")  # reopening finds nothing more to move and keeps the row
    assert s.load_index()[7].fenced and s.get_entry(7, 0) == b"zz"
    s.close()
    assert INDEX_CF in Rdict.list_cf(str(tmp_path / "db"))


def test_entries_an_older_version_kept_under_their_own_keys_read_beside_runs(tmp_path: Path) -> None:
    """Entries 0-2 written one key each (the layout before runs), 3-5 as a run by this version: one range read
    crosses from one layout into the other, and deleting the ledger removes both."""
    from rocksdict import Options, Rdict

    raw = Rdict(str(tmp_path / "db"), Options(raw_mode=True))
    for e in range(3):
        raw[entry_key(7, e)] = bytes([e]) * 10
    raw.close()
    s = RocksLedgerStorage(tmp_path / "db")
    s.write([(7, e, bytes([e]) * 10) for e in range(3, 6)], [(7, LedgerInfo(KEY))])
    assert s.get_range(7, 0, 9, 1 << 20) == [bytes([e]) * 10 for e in range(6)]
    assert s.get_entry(7, 1) == b"\x01" * 10 and s.get_entry(7, 4) == b"\x04" * 10
    s.delete_ledger(7)
    assert s.get_range(7, 0, 9, 1 << 20) == [] and list(s._db.keys()) == []
    s.close()


def test_runs_overlapping_gaps_and_reads_across_run_boundaries(tmp_path: Path) -> None:
    """Runs as the client's retries and recovery make them: a long run, a shorter one re-adding entries inside
    it (same bytes), a separate run after a gap. Every entry is found whichever run holds it; a range read
    stops at the gap and at ``max_bytes``; a read after a delete finds nothing, however recently it was read."""
    s = RocksLedgerStorage(tmp_path / "db")
    info = [(1, LedgerInfo(KEY))]

    def entry(e: int) -> bytes:
        return e.to_bytes(4, "big") * 25

    s.write([(1, e, entry(e)) for e in range(0, 200)], info)  # runs 0-63, 64-127, 128-191, 192-199
    s.write([(1, e, entry(e)) for e in range(230, 240)], info)  # a block written in pieces: 230-239 ...
    s.write([(1, e, entry(e)) for e in range(240, 250)], info)  # ... and 240-249, neither keyed 192
    s.write([(1, e, entry(e)) for e in range(100, 110)], info)  # a run starting inside 64-127
    s.write([(1, e, entry(e)) for e in range(300, 310)], info)  # after a gap
    for e in (0, 63, 64, 99, 100, 109, 110, 127, 128, 199, 230, 239, 240, 249, 300, 309):
        assert s.get_entry(1, e) == entry(e), e
        s._runs.clear()  # each found by the store, not the cache of runs read
    for e in (200, 229, 250, 255, 299, 310, 10_000):
        assert s.get_entry(1, e) is None, e
    assert s.get_entry(2, 0) is None
    assert s.get_range(1, 50, 1000, 1 << 20) == [entry(e) for e in range(50, 200)]
    assert s.get_range(1, 232, 1000, 1 << 20) == [entry(e) for e in range(232, 250)]
    assert s.get_range(1, 105, 130, 1 << 20) == [entry(e) for e in range(105, 131)]
    assert s.get_range(1, 60, 1000, 1000) == [entry(e) for e in range(60, 70)]  # 100 bytes each
    assert s.get_range(1, 60, 1000, 50) == [entry(60)]  # at least one entry
    # every step-th entry, across runs, overlapping runs and pieces, stopping at the first missing one
    assert s.get_range(1, 50, 1000, 1 << 20, 3) == [entry(e) for e in range(50, 200, 3)]
    assert s.get_range(1, 98, 131, 1 << 20, 2) == [entry(e) for e in range(98, 132, 2)]
    assert s.get_range(1, 230, 1000, 1 << 20, 4) == [entry(e) for e in range(230, 250, 4)]
    assert s.get_range(1, 0, 1000, 1 << 20, 100) == [entry(0), entry(100)]  # 200 is missing
    assert s.get_range(1, 60, 1000, 1000, 3) == [entry(e) for e in range(60, 90, 3)]  # 100 bytes each
    assert s.get_range(1, 201, 1000, 1 << 20, 3) == []
    s.flush()
    s.close()
    s = RocksLedgerStorage(tmp_path / "db")
    assert s.get_range(1, 0, 199, 1 << 30) == [entry(e) for e in range(200)]
    assert s.get_range(1, 300, 400, 1 << 30) == [entry(e) for e in range(300, 310)]
    s.delete_ledger(1)
    assert s.get_entry(1, 5) is None and s.get_range(1, 0, 199, 1 << 30) == []
    s.close()


def test_one_ledgers_entries_are_never_rewritten_by_compaction(tmp_path: Path) -> None:
    """Each write batch also rewrites the ledger's index row. Were the rows in the entries' key space, every
    flushed SST would overlap every other and compaction would merge-rewrite the entries into new files; in
    their own column family the SSTs of one ledger do not overlap and compaction only moves them down."""
    s = RocksLedgerStorage(tmp_path / "db")
    info = LedgerInfo(KEY)
    flushed: set[str] = set()
    eid = 0
    for _ in range(12):  # three times RocksDB's L0 compaction trigger (4 files)
        info.last_entry_id = eid + 99
        s.write([(1, eid + i, b"e" * 1000) for i in range(100)], [(1, info)])
        eid += 100
        s.flush()
        flushed |= {f["name"] for f in s._db.live_files() if f["start_key"].startswith(b"R")}
    _wait_for_compactions(s)
    live = [f for f in s._db.live_files() if f["start_key"].startswith(b"R")]
    assert {f["name"] for f in live} <= flushed, "compaction wrote new entry files"
    runs = sum(len(plan_runs([1] * 100, range(b, b + 100), [1000] * 100)) for b in range(0, 1200, 100))
    assert sum(f["num_entries"] for f in live) == runs
    assert any(f["level"] > 0 for f in live), "no compaction moved anything down"
    assert s.get_range(1, 0, 1199, 1 << 30) == [b"e" * 1000] * 1200
    s.close()


def _bytes_on_disk(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.iterdir() if f.suffix in (".sst", ".blob"))


def test_interleaved_ledgers_are_compacted_without_rewriting_their_entries(tmp_path: Path) -> None:
    """Eight ledgers written together overlap in every flushed SST, so compaction runs; the entries live in
    blob files, written once at flush, and the SSTs it rewrites hold only keys and references."""
    s = RocksLedgerStorage(tmp_path / "db")
    infos = {lid: LedgerInfo(KEY) for lid in range(1, 9)}
    for batch in range(6):
        rows = [(lid, batch * 50 + i, bytes([lid]) * 1000) for i in range(50) for lid in infos]
        s.write(rows, list(infos.items()))
        s.flush()
    _wait_for_compactions(s)
    data = 8 * 300 * 1000
    sst = sum(f["size"] for f in s._db.live_files() if f["start_key"].startswith(b"E"))
    blobs = [f for f in (tmp_path / "db").iterdir() if f.suffix == ".blob"]
    assert blobs and sum(f.stat().st_size for f in blobs) >= data
    assert sst < data // 10, f"{sst} bytes of SSTs for {data} bytes of entries: values are not in blob files"
    for lid in infos:
        assert s.get_range(lid, 0, 299, 1 << 30) == [bytes([lid]) * 1000] * 300
    s.close()


def test_deleting_a_ledger_gives_its_space_back(tmp_path: Path) -> None:
    s = RocksLedgerStorage(tmp_path / "db")
    for lid in (1, 2):
        s.write([(lid, e, bytes([lid]) * 1000) for e in range(2000)], [(lid, LedgerInfo(KEY))])
        s.flush()
    before = _bytes_on_disk(tmp_path / "db")
    s.delete_ledger(1)
    _wait_for_compactions(s)
    after = _bytes_on_disk(tmp_path / "db")
    assert before - after >= 1_500_000, (before, after)
    assert s.get_entry(1, 0) is None and s.get_range(2, 0, 1999, 1 << 30) == [b"\x02" * 1000] * 2000
    s.close()
    s = RocksLedgerStorage(tmp_path / "db")
    assert set(s.load_index()) == {2} and s.get_entry(2, 1999) == b"\x02" * 1000
    s.close()


def _persisted_option(db_dir: Path, name: str) -> str:
    """The value RocksDB itself wrote for option ``name`` in the newest OPTIONS file of ``db_dir``."""
    newest = max(db_dir.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    for line in newest.read_text().splitlines():
        key, _, value = line.strip().partition("=")
        if key == name:
            return value
    raise AssertionError(f"{name} not in {newest}")


@pytest.mark.parametrize(("threads", "jobs"), [(1, "2"), (2, "8"), (3, "12")])
def test_flush_threads_reach_rocksdb(tmp_path: Path, threads: int, jobs: str) -> None:
    s = RocksLedgerStorage(tmp_path / "db", write_buffer_mb=1, flush_threads=threads)
    try:
        assert _persisted_option(tmp_path / "db", "max_background_jobs") == jobs
        s.write([(1, e, bytes([e % 251]) * 1000) for e in range(5000)], [])
        s.flush()
        assert s.get_range(1, 0, 4999, 1 << 30) == [bytes([e % 251]) * 1000 for e in range(5000)]
    finally:
        s.close()


def _entry_bytes_in(storage: RocksLedgerStorage, suffix: str) -> int:
    if suffix == ".sst":
        return sum(f["size"] for f in storage._db.live_files() if f["start_key"].startswith(b"R"))
    return sum(f.stat().st_size for f in storage.directory.iterdir() if f.suffix == suffix)


def test_blob_files_follow_whether_ledgers_interleave(tmp_path: Path) -> None:
    """``auto``: one ledger at a time keeps its entries in the SSTs (no blob CRC, nothing to rewrite); a second
    ledger switches blob files on for the next flush. Entries of both kinds read back, also after reopening."""
    s = RocksLedgerStorage(tmp_path / "db", blob_files="auto", blob_window_s=0.0)  # a window per write
    info = {lid: LedgerInfo(KEY) for lid in (1, 2)}
    for batch in range(4):
        s.write([(1, batch * 100 + i, b"a" * 1000) for i in range(100)], [(1, info[1])])
    assert s.gauges()["blob_files_on"] == 0 and s.gauges()["blob_files_switches"] == 1
    s.flush()
    assert _entry_bytes_in(s, ".blob") == 0
    assert _entry_bytes_in(s, ".sst") >= 400 * 1000, "one ledger's entries are not in its SSTs"
    rows = [(lid, 400 + i, bytes([lid]) * 1000) for i in range(100) for lid in (1, 2)]
    s.write(rows, list(info.items()))
    assert s.gauges()["blob_files_on"] == 1 and s.gauges()["blob_files_switches"] == 2
    s.flush()
    assert _entry_bytes_in(s, ".blob") >= 200 * 1000, "interleaved ledgers' entries are not in blob files"
    s.close()
    s = RocksLedgerStorage(tmp_path / "db", blob_files="on")
    assert s.get_range(1, 0, 499, 1 << 30) == [b"a" * 1000] * 400 + [b"\x01" * 1000] * 100
    assert s.get_range(2, 400, 499, 1 << 30) == [b"\x02" * 1000] * 100
    s.close()


@pytest.mark.parametrize("mode", ["on", "off"])
def test_fixed_blob_file_modes(tmp_path: Path, mode: str) -> None:
    s = RocksLedgerStorage(tmp_path / "db", blob_files=mode, blob_window_s=0.0)
    for batch in range(4):
        s.write([(1, batch * 100 + i, b"a" * 1000) for i in range(100)], [(1, LedgerInfo(KEY))])
    s.flush()
    blob = _entry_bytes_in(s, ".blob")
    assert (blob >= 400 * 1000) if mode == "on" else (blob == 0)
    assert s.gauges()["blob_files_switches"] == 0
    assert s.get_range(1, 0, 399, 1 << 30) == [b"a" * 1000] * 400
    s.close()


def _read_bytes() -> int:
    """Bytes this process (RocksDB's threads included) read from the block layer."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise AssertionError("no read_bytes in /proc/self/io")


@pytest.mark.parametrize("mode", ["on", "off"])
def test_what_deleting_a_ledger_reads(tmp_path: Path, mode: str) -> None:
    """What blob files save a delete: a deleted ledger's blob files are removed unread, while entries kept in
    the SSTs are all read again by the range delete's compaction (direct I/O: no page cache to hide it)."""
    if mode == "off" and not _supports_direct_io(tmp_path):
        pytest.skip(
            "no direct I/O here: compaction reads come from the page cache and /proc/self/io misses them"
        )
    s = RocksLedgerStorage(tmp_path / "db", blob_files=mode, direct_io=True)
    data = 0
    for lid in (1, 2):
        for batch in range(10):
            rows = [(lid, batch * 400 + i, bytes([lid]) * 1000) for i in range(400)]
            s.write(rows, [(lid, LedgerInfo(KEY))])
            data += 400 * 1000
        s.flush()
    before = _read_bytes()
    s.delete_ledger(1)
    _wait_for_compactions(s)
    read = _read_bytes() - before
    if mode == "on":
        assert read < data // 2 // 10, f"deleting read {read} bytes of a ledger of {data // 2} bytes"
    else:
        # all of it but what RocksDB still holds in memory: the block a read or a write's look at the ledger's
        # last run left in the block cache, an SST's tail read when it was opened (a run is ~64 KB here)
        assert read >= data // 2 * 9 // 10, (
            f"deleting read only {read} bytes of a ledger of {data // 2} bytes"
        )
    assert s.get_entry(1, 0) is None and s.get_range(2, 0, 3999, 1 << 30) == [b"\x02" * 1000] * 4000
    s.close()


def test_a_corrupt_run_is_an_error_not_a_wrong_entry(tmp_path: Path) -> None:
    """A run value whose lengths do not add up (a torn or corrupted value) raises, so the bookie answers
    INTERNAL rather than slicing garbage or claiming the entry is absent; other runs still read."""
    s = RocksLedgerStorage(tmp_path / "db")
    s.write([(9, e, b"%d" % e) for e in range(70)], [(9, LedgerInfo(KEY))])
    s._db.put(run_key(9, 0), b"\x03\x00\x00\x00\x05\x00\x00\x00garbage")
    with pytest.raises(ValueError):
        s.get_entry(9, 5)
    with pytest.raises(ValueError):
        s.get_range(9, 0, 69, 1 << 20)
    assert s.get_range(9, 64, 69, 1 << 20) == [b"%d" % e for e in range(64, 70)]
    s.close()


def test_a_shorter_run_never_replaces_a_longer_one_under_the_same_key(tmp_path: Path) -> None:
    """Entries re-added from the start of a block (a recovery writing back from LAC+1 in smaller batches, a
    duplicate within one batch, a journal replay) make a run with the key of one already stored. Entries are
    immutable, so the longer run must stay: written over, the entries only it held would be lost."""
    s = RocksLedgerStorage(tmp_path / "db")
    info = [(1, LedgerInfo(KEY))]

    def rows(first: int, last: int) -> list[tuple[int, int, bytes]]:
        return [(1, e, b"%d" % e) for e in range(first, last + 1)]

    s.write(rows(64, 127), info)
    s.write(rows(64, 80), info)  # a re-add from the block's start, shorter
    assert s.get_range(1, 64, 127, 1 << 20) == [b"%d" % e for e in range(64, 128)]
    s.write(rows(128, 140) + rows(128, 130), info)  # a duplicate within one batch
    assert s.get_range(1, 128, 140, 1 << 20) == [b"%d" % e for e in range(128, 141)]
    s.flush()
    s.close()
    s = RocksLedgerStorage(tmp_path / "db")  # after a restart too (what this storage wrote is not in memory)
    s.write(rows(64, 66) + rows(128, 129), info)
    s._runs.clear()
    assert s.get_range(1, 64, 140, 1 << 20) == [b"%d" % e for e in range(64, 141)]
    s.write(rows(128, 150), info)  # a longer run does replace a shorter one (the same entries, and more)
    s._runs.clear()
    assert s.get_range(1, 64, 150, 1 << 20) == [b"%d" % e for e in range(64, 151)]
    s.close()


def _striped(first: int, last: int, held: tuple[int, ...] = (0, 1), e: int = 3) -> list[int]:
    """The ids of first..last a bookie of an E/Qw ledger receives: those whose residue mod E it holds."""
    return [i for i in range(first, last + 1) if i % e in held]


def _entry(e: int) -> bytes:
    return b"%d:" % e + bytes([e % 251]) * (e % 13)


def _run_values(s: RocksLedgerStorage, ledger_id: int) -> dict[int, list[int]]:
    """The ledger's stored runs: first id -> the ids the run holds."""
    out = {}
    for key, value in s._db.items(from_key=run_key(ledger_id, 0)):
        if not key.startswith(run_key(ledger_id, 0)[:9]):
            break
        first = int.from_bytes(key[9:], "big")
        out[first] = run_entries(first, bytes(value))[0]
    return out


def test_a_striped_ledgers_entries_take_one_value_per_block(tmp_path: Path) -> None:
    """A bookie of an E3/Qw2 ledger receives 2 of every 3 ids, in groups as the journal commits them: each group
    is stored as one run per block of 64 ids it touches (gaps listed in the run), not one run per 2 ids. Every
    entry reads back alone, in a range with the ledger's step (its residues), and a range with step 1 stops at
    the first id it does not hold."""
    s = RocksLedgerStorage(tmp_path / "db")
    info = [(1, LedgerInfo(KEY))]
    ids = _striped(0, 999)
    for g in range(0, len(ids), 100):
        group = ids[g : g + 100]
        s.write([(1, e, _entry(e)) for e in group], info)
    runs = _run_values(s, 1)
    assert sum(map(len, runs.values())) == len(ids)
    assert len(runs) <= 16 + len(ids) // 100  # 16 blocks, and a piece more where a group ends inside one
    assert all(ids[-1] // 64 == ids[0] // 64 for ids in runs.values())
    s.flush()
    s.close()
    s = RocksLedgerStorage(tmp_path / "db")
    for residue in (0, 1):
        assert s.get_range(1, residue, 999, 1 << 20, 3) == [_entry(e) for e in range(residue, 1000, 3)]
    assert s.get_range(1, 2, 999, 1 << 20, 3) == []
    assert s.get_range(1, 0, 999, 1 << 20) == [_entry(0), _entry(1)]
    assert s.get_range(1, 63, 999, 1 << 20) == [_entry(63), _entry(64)]
    capped = s.get_range(1, 90, 999, 200, 3)  # at most 200 bytes
    assert capped == [_entry(e) for e in range(90, 90 + 3 * len(capped), 3)]
    assert sum(map(len, capped)) <= 200 < sum(map(len, capped)) + len(_entry(90 + 3 * len(capped)))
    for e in range(1000):
        s._runs.clear()
        assert s.get_entry(1, e) == (_entry(e) if e % 3 != 2 else None), e
    s.delete_ledger(1)
    assert list(s._db.keys()) == [] and s.get_range(1, 0, 999, 1 << 20, 3) == []
    s.close()


def test_runs_with_gaps_under_one_key_are_merged_never_shortened(tmp_path: Path) -> None:
    """The analogue, with gaps, of 'a shorter run never replaces a longer one': a run written under a key that
    holds a run already keeps every entry either held. A re-add or a journal replay of ids the stored run holds
    changes nothing; a run holding all the stored ids and more replaces it; runs each holding ids the other
    lacks (entries re-added after an ensemble change) become their union."""
    s = RocksLedgerStorage(tmp_path / "db")
    info = [(1, LedgerInfo(KEY))]

    def write(ids: list[int]) -> None:
        s.write([(1, e, _entry(e)) for e in ids], info)

    write(_striped(0, 20))  # 0 1 3 4 ... 19 20
    write([0, 1])  # a re-add of ids the run holds: left as it is
    assert _run_values(s, 1) == {0: _striped(0, 20)}
    write([0, 2, 4, 30])  # 2 and 30 are new, 0 and 4 held: the union
    assert _run_values(s, 1) == {0: sorted({*_striped(0, 20), 2, 30})}
    write(_striped(64, 80) + [64, 65, 66])  # a duplicate within one batch, with an id the first lacks
    assert _run_values(s, 1)[64] == sorted({*_striped(64, 80), 65})
    s.flush()
    s.close()
    s = RocksLedgerStorage(tmp_path / "db")  # after a restart (what this storage wrote is not in memory)
    write(_striped(0, 40) + _striped(64, 90))  # a journal replay reaching further: replaces both
    assert _run_values(s, 1) == {
        0: sorted({*_striped(0, 40), 2, 30}),
        64: sorted({*_striped(64, 90), 65}),
    }
    held = {*_striped(0, 40), 2, 30, *_striped(64, 90), 65}
    for e in range(100):
        s._runs.clear()
        assert s.get_entry(1, e) == (_entry(e) if e in held else None), e
    assert s.get_range(1, 0, 99, 1 << 20) == [_entry(e) for e in range(5)]  # 5 is not held
    assert s.get_range(1, 64, 99, 1 << 20, 2) == [_entry(e) for e in (64, 66)]
    s.close()


def test_runs_of_consecutive_entries_an_older_version_wrote_read_beside_runs_with_gaps(
    tmp_path: Path,
) -> None:
    """A data directory as the version before runs with gaps left it for a striped ledger: runs of 2 consecutive
    entries (format 1: no header version, a nonzero count first). This version reads them, its journal replay
    of the same entries stores runs with gaps over and beside them, new entries go to runs with gaps, and
    a step-3 range read crosses from one kind into the other; deleting the ledger removes both."""
    from rocksdict import Options, Rdict

    raw = Rdict(str(tmp_path / "db"), Options(raw_mode=True))
    old = _striped(0, 200)
    for i in range(0, len(old), 2):
        raw[run_key(5, old[i])] = pack_run([_entry(e) for e in old[i : i + 2]])
    raw.close()
    s = RocksLedgerStorage(tmp_path / "db")
    for residue in (0, 1):
        assert s.get_range(5, residue, 200, 1 << 20, 3) == [_entry(e) for e in range(residue, 201, 3)]
    info = [(5, LedgerInfo(KEY))]
    s.write([(5, e, _entry(e)) for e in _striped(150, 400)], info)  # replay from 150, then new entries
    for residue in (0, 1):
        assert s.get_range(5, residue, 400, 1 << 20, 3) == [_entry(e) for e in range(residue, 401, 3)]
    for e in range(401):
        s._runs.clear()
        assert s.get_entry(5, e) == (_entry(e) if e % 3 != 2 else None), e
    s.delete_ledger(5)
    assert list(s._db.keys()) == []
    s.close()


def _blob_files(s: RocksLedgerStorage) -> set[str]:
    return {f.name for f in s.directory.iterdir() if f.suffix == ".blob"}


def _write_interleaved(s: RocksLedgerStorage, ledgers: range, flushes: int, per_flush: int = 200) -> None:
    infos = {lid: LedgerInfo(KEY) for lid in ledgers}
    for f in range(flushes):
        rows = [(lid, f * per_flush + i, bytes([lid]) * 1000) for i in range(per_flush) for lid in ledgers]
        s.write(rows, list(infos.items()))
        s.flush()


def test_compacting_interleaved_ledgers_copies_no_entry_out_of_its_blob_file(tmp_path: Path) -> None:
    """RocksDB's age-driven blob GC stays off: compactions of overlapping SSTs (which interleaved ledgers make
    all the time) rewrite keys and references only. Every blob file there is was written by a flush."""
    s = RocksLedgerStorage(tmp_path / "db", blob_files="on")
    flushed: set[str] = set()
    infos = {lid: LedgerInfo(KEY) for lid in range(1, 5)}
    for f in range(12):  # three times RocksDB's L0 compaction trigger (4 files)
        rows = [(lid, f * 200 + i, bytes([lid]) * 1000) for i in range(200) for lid in infos]
        s.write(rows, list(infos.items()))
        s.flush()
        flushed |= _blob_files(s)
    _wait_for_compactions(s)
    assert s._db.property_int_value("rocksdb.num-files-at-level0") < 12, "no compaction ran"
    assert _blob_files(s) <= flushed, f"compaction wrote blob files {sorted(_blob_files(s) - flushed)}"
    for lid in infos:
        assert s.get_range(lid, 0, 2399, 1 << 30) == [bytes([lid]) * 1000] * 2400
    s.close()


def test_blob_garbage_of_deleted_ledgers_is_collected_once_due(tmp_path: Path) -> None:
    """A long-lived ledger written beside short-lived ones pins every blob file: deleting the others frees no
    file, only garbage. Below the ratio nothing is copied; at it one pass copies the live entries out, frees the
    rest, and every live entry reads back identical, before and after reopening."""
    s = RocksLedgerStorage(tmp_path / "db", blob_files="on", blob_gc=BlobGarbagePolicy(0.5, 1024 * 1024))
    _write_interleaved(s, range(1, 6), flushes=4)  # 5 ledgers x 800 entries of 1000 bytes, in 4 blob files
    blob, garbage = s.blob_garbage()
    assert blob >= 5 * 800 * 1000 and garbage == 0
    s.delete_ledger(2)  # 20 % garbage: not due
    _wait_for_compactions(s)
    files = _blob_files(s)
    assert 0.15 * blob <= s.blob_garbage()[1] <= 0.25 * blob
    assert s.collect_blob_garbage() is None and _blob_files(s) == files and s.blob_gc_passes == 0
    for lid in (3, 4, 5):
        s.delete_ledger(lid)
    _wait_for_compactions(s)
    assert _blob_files(s) == files, "a blob file holding the live ledger's entries was freed"
    assert s.blob_garbage()[1] >= 0.75 * blob, s.blob_garbage()
    done = s.collect_blob_garbage()
    assert done is not None and done.garbage_bytes_before >= 0.75 * blob
    assert done.garbage_bytes_after == 0 and done.stored_bytes_after <= 0.3 * blob, done
    assert done.reclaimed_bytes >= 0.7 * blob and s.blob_gc_passes == 1
    assert s.blob_gc_reclaimed_bytes == done.reclaimed_bytes
    assert not (_blob_files(s) & files), "old blob files survived the pass"
    assert sum((s.directory / f).stat().st_size for f in _blob_files(s)) <= 0.3 * blob
    assert s.collect_blob_garbage() is None  # nothing left to collect
    assert s.collect_blob_garbage(force=True) is None
    assert s.get_range(1, 0, 799, 1 << 30) == [b"\x01" * 1000] * 800
    assert all(s.get_entry(lid, 0) is None for lid in range(2, 6))
    s.close()
    s = RocksLedgerStorage(tmp_path / "db")
    assert s.get_range(1, 0, 799, 1 << 30) == [b"\x01" * 1000] * 800
    assert set(s.load_index()) == {1}
    s.close()


def test_a_forced_pass_collects_garbage_under_the_ratio_while_writes_go_on(tmp_path: Path) -> None:
    import threading

    s = RocksLedgerStorage(tmp_path / "db", blob_files="on")  # default policy: 0.5 and 64 MiB, never due here
    _write_interleaved(s, range(1, 5), flushes=3)
    s.delete_ledger(4)
    _wait_for_compactions(s)
    assert s.collect_blob_garbage() is None
    stop = threading.Event()
    written: list[int] = []

    def writer() -> (
        None
    ):  # a ledger appended to during the pass, in its own thread as the bookie's loop would
        e = 0
        while not stop.is_set() and e < 20_000:
            s.write([(9, e + i, b"\x09" * 1000) for i in range(100)], [(9, LedgerInfo(KEY))])
            e += 100
            written.append(e)

    t = threading.Thread(target=writer)
    t.start()
    try:
        done = s.collect_blob_garbage(force=True)
    finally:
        stop.set()
        t.join()
    assert done is not None and done.garbage_bytes_before > 0
    assert s.blob_garbage()[1] < done.garbage_bytes_before
    for lid in (1, 2, 3):
        assert s.get_range(lid, 0, 599, 1 << 30) == [bytes([lid]) * 1000] * 600
    n = written[-1]
    assert s.get_range(9, 0, n - 1, 1 << 40) == [b"\x09" * 1000] * n
    s.close()


@pytest.mark.parametrize(
    "after_s", [0.0, 0.2]
)  # as the pass starts, and (usually) halfway through its compaction
def test_closing_during_a_blob_garbage_pass_stops_it_and_loses_nothing(
    tmp_path: Path, after_s: float
) -> None:
    """close() does not wait out a long pass: it stops RocksDB's background work, the pass returns, and after
    reopening every live entry reads back identical (a compaction stopped halfway leaves the last version) and
    a later pass collects the garbage."""
    import threading

    s = RocksLedgerStorage(tmp_path / "db", blob_files="on", blob_gc=BlobGarbagePolicy(0.5, 0))
    _write_interleaved(s, range(1, 5), flushes=6, per_flush=10_000)  # ~240 MB in blob files
    for lid in (2, 3, 4):
        s.delete_ledger(lid)
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(s.collect_blob_garbage()))
    t.start()
    deadline = time.monotonic() + 10
    while not s._gc_lock.locked() and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(after_s)
    s.close()
    t.join(timeout=60)
    assert not t.is_alive() and len(result) == 1
    s = RocksLedgerStorage(tmp_path / "db")
    assert s.get_range(1, 0, 59_999, 1 << 40) == [b"\x01" * 1000] * 60_000
    assert all(s.get_entry(lid, 0) is None for lid in (2, 3, 4)) and set(s.load_index()) == {1}
    if s.blob_garbage()[1]:
        assert s.collect_blob_garbage(force=True) is not None
    assert s.blob_garbage()[1] == 0
    assert s.get_range(1, 0, 59_999, 1 << 40) == [b"\x01" * 1000] * 60_000
    s.close()


def _resident_bytes(paths: list[Path]) -> int:
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sum(map(int, out.split()))


@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs util-linux fincore")
@pytest.mark.parametrize("blob_files", ["on", "off"])
def test_flushed_entries_stay_in_the_page_cache(tmp_path: Path, blob_files: str) -> None:
    """Flushes write through the page cache (synced as they go), so the first read after a write reads memory;
    with ``direct_io`` they bypass it and the first read goes to the disk."""
    if not _supports_direct_io(tmp_path):
        pytest.skip("a memory filesystem: everything is in memory, with or without direct I/O")
    entries = 4000
    for direct, where in ((False, tmp_path / "cached"), (True, tmp_path / "direct")):
        s = RocksLedgerStorage(where, blob_files=blob_files, direct_io=direct)
        for first in range(0, entries, 500):
            rows = [(7, e, bytes([e % 251]) * 1000) for e in range(first, first + 500)]
            s.write(rows, [(7, LedgerInfo(KEY))])
        s.flush()
        files = [f for f in where.iterdir() if f.suffix in (".sst", ".blob")]
        stored = sum(f.stat().st_size for f in files)
        assert stored >= entries * 1000, (stored, files)
        resident = _resident_bytes(files)
        if direct:
            assert resident <= stored // 10, f"{resident} of {stored} bytes cached after a direct-I/O flush"
        else:
            assert resident >= stored * 9 // 10, f"only {resident} of {stored} bytes cached after the flush"
        assert s.get_range(7, 0, entries - 1, 1 << 30) == [bytes([e % 251]) * 1000 for e in range(entries)]
        s.close()


@pytest.mark.parametrize("cache_mb", [64, 0])
def test_flushes_fill_the_block_cache(tmp_path: Path, cache_mb: int) -> None:
    """With a cache (``--storage-cache-mb``), a flush leaves the entries it wrote in RocksDB's block cache, so the
    first read after a write needs no disk; with 0, RocksDB's own cache stays empty until something is read."""
    s = RocksLedgerStorage(tmp_path / "db", cache_mb=cache_mb, blob_files="off")
    try:
        entries = [bytes([e % 251]) * 1000 for e in range(8000)]
        s.write([(1, e, data) for e, data in enumerate(entries)], [(1, LedgerInfo(KEY))])
        s.flush()
        cached = s.gauges()["cache_bytes"]
        if cache_mb:
            assert _persisted_option(tmp_path / "db", "prepopulate_block_cache") == "kFlushOnly"
            assert cached >= 8000 * 1000, cached
        else:
            assert _persisted_option(tmp_path / "db", "prepopulate_block_cache") == "kDisable"
            assert cached < 1000 * 1000, cached
        assert s.get_range(1, 0, 7999, 1 << 30) == entries
    finally:
        s.close()


def test_a_negative_cache_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="storage cache"):
        RocksLedgerStorage(tmp_path / "db", cache_mb=-1)
