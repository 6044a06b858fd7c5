"""The bookie's scrubber over a real RocksDB storage and metadata in memory: damaged entries (bytes flipped, a run
that no longer decodes, a header naming another entry) are taken out of storage and reported with the missing
ones; every digest type the bookie can check is checked; what a worker adds back is stored and reads back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bookie import protocol as p
from bookie.entryformat import DigestType, EntryCodec
from bookie.scrub import Scrubber, check_entry, expected_entries, ranges
from bookie.storage import LedgerInfo, RocksLedgerStorage, run_key
from zk.ledger_metadata import Ensemble, LedgerMetadata, LedgerState, password_digest_of

ME = "10.0.0.1:3181"
KEY = p.master_key(b"pw")


def md(
    lid: int, last: int, digest: str = "CRC32C", e: int = 3, qw: int = 2, closed: bool = True
) -> LedgerMetadata:
    m = LedgerMetadata(
        ledger_id=lid,
        ensemble_size=e,
        write_quorum=qw,
        ack_quorum=2,
        ensembles=(Ensemble(0, (ME, "b:1", "c:1")[:e]),),
        password_digest=password_digest_of(b"pw"),
        digest_type=digest,
    )
    return m.replace(state=LedgerState.CLOSED, last_entry_id=last, length=0) if closed else m


def fill(s: RocksLedgerStorage, m: LedgerMetadata) -> dict[int, bytes]:
    codec = EntryCodec(m.ledger_id, DigestType(m.digest_type), KEY)
    mine = sorted(expected_entries(m.replace(state=LedgerState.CLOSED), ME))
    entries = {e: codec.build(e, e - 1, 0, f"payload-{e}".encode() * 10) for e in mine}
    s.write(((m.ledger_id, e, d) for e, d in entries.items()), [(m.ledger_id, LedgerInfo(master_key=KEY))])
    return entries


def scrubber(s: RocksLedgerStorage, mds: dict[int, LedgerMetadata], reports: list) -> Scrubber:
    return Scrubber(
        bookie_id=ME,
        storage=s,
        ledgers=lambda: list(mds),
        master_key=lambda lid: KEY,
        metadata=mds.get,
        report=lambda lid, ids: reports.append((lid, ids)),
        rate_bytes_per_s=0,
    )


def test_expected_entries_follow_the_write_sets_of_each_fragment() -> None:
    m = md(1, 9)  # E3 Qw2, ME at index 0: entries e with (0 - e) % 3 < 2: 0, 2, 3, 5, 6, 8, 9
    assert sorted(expected_entries(m, ME)) == [0, 2, 3, 5, 6, 8, 9]
    assert expected_entries(md(1, 9, closed=False), ME) == set()
    two = m.replace(ensembles=(Ensemble(0, (ME, "b:1", "c:1")), Ensemble(5, ("d:1", "b:1", "c:1"))))
    assert sorted(expected_entries(two, ME)) == [0, 2, 3]
    assert ranges([5, 3, 4, 9, 1]) == [(1, 1), (3, 5), (9, 9)]


@pytest.mark.parametrize("digest", ["CRC32C", "CRC32", "HMAC"])
def test_flipped_bytes_are_taken_out_and_reported_with_missing_entries(tmp_path: Path, digest: str) -> None:
    s = RocksLedgerStorage(tmp_path / "db")
    try:
        m = md(7, 199, digest)
        entries = fill(s, m)
        # flip one byte of entry 3's payload inside its stored run
        (first, value) = s.runs(7, -1, 1)[0]
        raw = bytearray(value)
        at = raw.find(b"payload-3")
        raw[at] ^= 0xFF
        s._db.put(run_key(7, first), bytes(raw))
        s._runs.clear()
        reports: list = []
        out = asyncio.run(scrubber(s, {7: m}, reports).run_pass())
        assert out.damaged == 1 and out.missing == 1
        assert reports == [(7, [3])]
        assert s.get_entry(7, 3) is None  # NO_ENTRY now, never bad bytes
        assert s.get_entry(7, 2) == entries[2] and s.get_entry(7, 5) == entries[5]
        # what a replication worker adds back is stored (not refused as a re-add) and reads back
        s.write([(7, 3, entries[3])], [])
        assert s.get_entry(7, 3) == entries[3]
        assert s.get_range(7, 2, 6, 1 << 30) == [entries[2], entries[3]]  # stops where entry 4 is not here
        assert s.get_range(7, 5, 6, 1 << 30) == [entries[5], entries[6]]
        again: list = []
        assert asyncio.run(scrubber(s, {7: m}, again).run_pass()).missing == 0 and again == []
    finally:
        s.close()


def test_a_run_that_does_not_decode_and_a_removed_run_are_reported_missing(tmp_path: Path) -> None:
    s = RocksLedgerStorage(tmp_path / "db")
    try:
        m = md(8, 199)
        entries = fill(s, m)
        runs = s.runs(8)
        assert len(runs) >= 3
        s._db.put(run_key(8, runs[0][0]), b"\x01\x00\x00\x00garbage")  # lengths that do not add up
        s._db.delete(run_key(8, runs[1][0]))  # a run gone
        s._runs.clear()
        reports: list = []
        out = asyncio.run(scrubber(s, {8: m}, reports).run_pass())
        lost = [e for e in sorted(entries) if e < runs[2][0]]
        assert reports == [(8, lost)] and out.missing == len(lost)
        assert all(s.get_entry(8, e) is None for e in lost)
    finally:
        s.close()


def test_dummy_digests_get_their_header_checked() -> None:
    assert check_entry(None, 1, 2, EntryCodec(1, DigestType.DUMMY).build(2, 1, 0, b"x")) is None
    assert check_entry(None, 1, 3, EntryCodec(1, DigestType.DUMMY).build(2, 1, 0, b"x")) is not None
    assert check_entry(None, 1, 3, b"short") is not None


def test_open_and_deleted_ledgers_are_skipped(tmp_path: Path) -> None:
    s = RocksLedgerStorage(tmp_path / "db")
    try:
        fill(s, md(9, 20))
        reports: list = []
        mds = {9: md(9, 20, closed=False)}
        out = asyncio.run(scrubber(s, mds, reports).run_pass())
        assert (out.skipped, out.ledgers, reports) == (1, 0, [])
        out = asyncio.run(scrubber(s, {}, reports).run_pass())
        assert out.ledgers == 0 and reports == []
    finally:
        s.close()
