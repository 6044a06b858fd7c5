"""Bookie rules that planted bugs showed unguarded (docs/architecture.md §11, "The bookie's and the ledger
client's planted-bug audit"): each test here fails with one of those bugs in ``bookie/``."""

from __future__ import annotations

import asyncio

from bookie import protocol as p
from bookie.entryformat import DigestType, EntryCodec
from bookie.gc import LedgerCollector
from ledger_client.bookie_conn import BookieConnection
from ledger_client.read_conn import ReadConnection
from tests.unit.test_bookie_core import KEY, Rig
from tests.unit.test_gc_batches import Info, Metadata


def _read_lac(r: Rig, ledger: int) -> p.ReadLacResponse:
    r.rid += 1
    r.core.handle(p.ReadLacRequest(request_id=r.rid, ledger_id=ledger, master_key=KEY), r.reply)
    resp = r.replies[-1]
    assert isinstance(resp, p.ReadLacResponse)
    return resp


def test_read_lac_reports_the_highest_piggybacked_lac_exactly_before_and_after_a_restart() -> None:
    r = Rig()
    for e in range(3):
        r.add(1, e, lac=e - 1)  # entry e confirms e - 1
    r.settle()
    resp = _read_lac(r, 1)
    assert (resp.status, resp.lac, resp.explicit_lac) == (p.Status.OK, 1, -1)
    resp = _read_lac(r.restart(), 1)
    assert (resp.status, resp.lac, resp.explicit_lac) == (p.Status.OK, 1, -1)
    resp = _read_lac(r, 2)
    assert (resp.status, resp.lac, resp.explicit_lac) == (p.Status.NO_LEDGER, -1, -1)


def test_the_explicit_lac_never_goes_back_and_survives_a_restart() -> None:
    """Two WRITE_LACs arriving out of order (the writer sends one every ``explicit_lac_interval_s``, over
    different connections after a reconnect): the lower one changes nothing; a restart replays the higher."""
    r = Rig()
    for e in range(6):
        r.add(1, e, lac=e - 1)
    r.settle()
    codec = EntryCodec(1, DigestType.CRC32C)
    for lac in (4, 2):
        r.rid += 1
        req = p.WriteLacRequest(
            request_id=r.rid, ledger_id=1, lac=lac, master_key=KEY, lac_blob=codec.build_lac(lac)
        )
        r.core.handle(req, r.reply)
        r.settle()
        assert isinstance(r.replies[-1], p.WriteLacResponse) and r.replies[-1].status == p.Status.OK
    for rig in (r, r.restart()):
        resp = _read_lac(rig, 1)
        assert (resp.status, resp.lac, resp.explicit_lac) == (p.Status.OK, 4, 4)
        assert codec.verify_lac(resp.lac_blob) == 4


def test_a_late_range_reply_after_a_timeout_reaches_no_other_request() -> None:
    """The reader forgets a READ_RANGE that timed out and may send the next batch on the same connection: the
    late reply to the first must not be taken for the second's (each reply goes by its request id only)."""

    async def go() -> None:
        conn = ReadConnection("127.0.0.1:1")
        got: dict[int, list[tuple[int, int]]] = {1: [], 2: []}

        def request(rid: int, first: int) -> None:
            req = p.ReadRangeRequest(
                request_id=rid, ledger_id=7, first_entry_id=first, last_entry_id=first + 9, master_key=KEY
            )
            conn.send_read_range(
                req, lambda resp, exc: got[rid].append((resp.request_id, resp.first_entry_id))
            )

        request(1, 0)
        request(2, 10)
        conn.forget(1)  # timed out
        for rid, first in ((1, 0), (2, 10)):
            conn.data_received(p.encode_read_range_response(rid, p.Status.OK, 7, first, [b"x" * 20]))
        assert got == {1: [], 2: [(2, 10)]}

    asyncio.run(go())


def test_a_late_reply_after_a_timeout_reaches_no_other_request_of_the_connection() -> None:
    """The same for a bookie connection's other requests (a LAC read that timed out, then another): the late
    reply is dropped, and the pending request gets its own."""

    async def go() -> None:
        conn = BookieConnection("127.0.0.1:1")
        got: dict[int, list[int]] = {1: [], 2: []}
        for rid in (1, 2):
            req = p.ReadEntryRequest(request_id=rid, ledger_id=7, entry_id=rid, master_key=KEY)
            conn.send_frame(rid, p.encode(req), lambda resp, exc, rid=rid: got[rid].append(resp.entry_id))
        conn.forget(1)  # timed out
        for rid in (1, 2):
            resp = p.ReadEntryResponse(
                request_id=rid, status=p.Status.OK, ledger_id=7, entry_id=rid, lac=0, entry=b"x"
            )
            conn.data_received(p.encode(resp))
        assert got == {1: [], 2: [2]}

    asyncio.run(go())


def test_a_restart_replays_the_last_entry_and_lac_so_reads_of_the_last_entry_and_ranges_reach_them() -> None:
    """The journal replay is the only record of entries added since the last checkpoint: it must advance the
    ledger's last entry id and LAC as the adds did (a range read stops at the last entry id the bookie knows, and
    a recovery asks for the last entry)."""
    r = Rig()
    for e in range(5):
        r.add(1, e, lac=e - 1)
    r.settle()
    r2 = r.restart()
    r2.read(1, p.LAST_ENTRY)
    resp = r2.replies[-1]
    assert isinstance(resp, p.ReadEntryResponse)
    assert (resp.status, resp.entry_id, resp.lac) == (p.Status.OK, 4, 3)
    req = p.ReadRangeRequest(request_id=99, ledger_id=1, first_entry_id=0, last_entry_id=10, master_key=KEY)
    r2.core.handle(req, r2.reply)
    rng = r2.replies[-1]
    assert isinstance(rng, p.ReadRangeResponse) and rng.status == p.Status.OK
    codec = EntryCodec(1, DigestType.CRC32C)
    assert [codec.verify(e)[0].entry_id for e in rng.entries] == [0, 1, 2, 3, 4]


def test_gc_keeps_a_ledger_a_short_listing_left_out_whose_znode_exists() -> None:
    """A ledger listing may come back short (a ZooKeeper child listing is not a snapshot of the znodes): a ledger
    it leaves out is deleted only once its own znode is confirmed gone."""

    class ShortListing(Metadata):
        def list_ids(self) -> list[int]:
            return [lid for lid in super().list_ids() if lid != 2]

    local = {lid: Info() for lid in (1, 2, 3)}
    deleted: list[int] = []

    def delete(ids: list[int]) -> None:
        deleted.extend(ids)
        for lid in ids:
            del local[lid]

    c = LedgerCollector(ShortListing({1, 2}), lambda: local, delete)
    result = asyncio.run(c.run_pass())
    assert deleted == [3] and sorted(local) == [1, 2]
    assert result.kept == (2,) and c.stats.listed_short == 1
