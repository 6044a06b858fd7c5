"""Deleting many ledgers from a real RocksDB: one range-delete write batch and at most one compaction per
``DELETE_BATCH`` ledgers, and afterwards the deleted ledgers answer NO_LEDGER while the kept ones read as before."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bookie import protocol as p
from bookie.core import BookieCore
from bookie.entryformat import DigestType, EntryCodec
from bookie.gc import DELETE_BATCH, LedgerCollector
from bookie.memjournal import ManualScheduler, MemoryJournal
from bookie.storage import RocksLedgerStorage

KEY = p.master_key(b"secret")


class Listing:
    """Metadata that holds exactly ``ids`` (the listing and each znode agree)."""

    def __init__(self, ids: set[int]) -> None:
        self.ids = ids

    def ledgers_parent(self) -> list[str] | None:
        return [f"L{lid:010d}" for lid in sorted(self.ids)]

    def list_ids(self) -> list[int]:
        return sorted(self.ids)

    def ledger_exists(self, ledger_id: int) -> bool:
        return ledger_id in self.ids


class Bookie:
    def __init__(self, storage: RocksLedgerStorage) -> None:
        self.storage = storage
        self.journal = MemoryJournal()
        self.sched = ManualScheduler()
        self.core = BookieCore(storage, self.journal.append, self.sched)
        self.replies: list[p.Response] = []
        self.rid = 0

    def reply(self, frame: bytes) -> None:
        self.replies.append(p.decode_one_response(frame))

    def add(self, ledger: int, entry: int) -> None:
        self.rid += 1
        data = EntryCodec(ledger, DigestType.CRC32C).build(entry, -1, 10 * (entry + 1), b"e%d" % entry)
        self.core.add_entry(self.rid, ledger, entry, KEY, data, 0, self.reply)

    def request(self, req: p.Request) -> p.Response:
        self.core.handle(req, self.reply)
        self.settle()
        return self.replies[-1]

    def read(self, ledger: int, entry: int) -> p.Response:
        self.rid += 1
        return self.request(
            p.ReadEntryRequest(
                request_id=self.rid,
                ledger_id=ledger,
                entry_id=entry,
                master_key=KEY,
                flags=0,
                previous_lac=-1,
            )
        )

    def fence(self, ledger: int) -> None:
        self.rid += 1
        req = p.ReadEntryRequest(
            request_id=self.rid,
            ledger_id=ledger,
            entry_id=-1,
            master_key=KEY,
            flags=p.Flag.FENCE,
            previous_lac=-1,
        )
        self.core.handle(req, self.reply)

    def settle(self) -> None:
        self.journal.sync()
        self.sched.run_ready()
        self.core.flush_pending()


def test_deleting_2000_ledgers_is_one_write_batch_and_one_compaction_per_batch(tmp_path: Path) -> None:
    storage = RocksLedgerStorage(tmp_path / "db")
    b = Bookie(storage)
    written = range(1, 2101)  # every 21st ledger stays; the rest (2000) are deleted from metadata
    kept = {lid for lid in written if lid % 21 == 0}
    fenced = range(50_000, 50_300)  # unknown ids fenced by a stranger: index rows alone, collected too
    try:
        for lid in written:
            for e in range(3):
                b.add(lid, e)
        for lid in fenced:
            b.fence(lid)
        b.settle()
        storage.flush()
        assert set(storage.load_index()) == set(written) | set(fenced)
        doomed = sorted((set(written) - kept) | set(fenced))
        collector = LedgerCollector(
            metadata=Listing(kept),
            local=lambda: b.core.ledgers,
            delete=b.core.delete_ledgers,
            deletions_max=10_000,
        )
        t0 = time.monotonic()
        result = asyncio.run(collector.run_pass())
        took = time.monotonic() - t0
        assert sorted(result.deleted) == doomed and not result.bound_hit and not result.stopped
        batches = -(-len(doomed) // DELETE_BATCH)
        assert storage.delete_batches == collector.stats.delete_batches == batches
        assert storage.deleted_ledgers == len(doomed)
        # the last batch holds only fenced ids (no entries): no compaction for it
        assert storage.delete_compactions == batches - 1
        assert took < 30, took  # one compaction per ledger took minutes
        for lid in doomed:
            reply = b.read(lid, 0)
            assert reply.status in (p.Status.NO_LEDGER, p.Status.NO_ENTRY), (lid, reply.status)
            assert storage.get_entry(lid, 0) is None and storage.get_range(lid, 0, 2, 1 << 20) == []
        for lid in kept:
            for e in range(3):
                reply = b.read(lid, e)
                assert isinstance(reply, p.ReadEntryResponse) and reply.status == p.Status.OK
                assert EntryCodec(lid, DigestType.CRC32C).verify(reply.entry, e)[1] == b"e%d" % e
        assert set(storage.load_index()) == kept
        # the deletions were durable at once: a reopen (no flush since) finds only the kept ledgers
        storage.close()
        storage = RocksLedgerStorage(tmp_path / "db")
        assert set(storage.load_index()) == kept
        assert all(storage.get_entry(lid, 0) is None for lid in doomed[::50])
        assert all(storage.get_range(lid, 0, 2, 1 << 20) != [] for lid in kept)
    finally:
        storage.close()


def test_delete_ledgers_compacts_only_when_some_ledger_held_entries(tmp_path: Path) -> None:
    s = RocksLedgerStorage(tmp_path / "db")
    try:
        from bookie.storage import LedgerInfo

        s.write([(1, 0, b"a"), (3, 0, b"c")], [(lid, LedgerInfo(KEY)) for lid in (1, 2, 3, 4)])
        s.delete_ledgers([2, 4])  # index rows alone
        assert (s.delete_batches, s.delete_compactions) == (1, 0)
        s.delete_ledgers([3, 1])
        assert (s.delete_batches, s.delete_compactions) == (2, 1)
        assert s.load_index() == {} and s.get_entry(1, 0) is None and s.get_entry(3, 0) is None
    finally:
        s.close()
