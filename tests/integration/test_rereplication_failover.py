"""Re-replication reads in batches from the surviving replicas and fails over between them: with a second bookie
of the ensemble dead too, every entry still comes from the one left, and the new bookie's copies are its bytes."""

from __future__ import annotations

import asyncio

from bookie import protocol as p
from ledger_client import BookKeeper, ClientConfig
from ledger_client.bookie_conn import connect
from ledger_client.rereplicator import rereplicate_ledger

PW = b"secret"
N = 1500  # several READ_RANGE batches


async def _raw(bookie: str, lid: int, eid: int) -> bytes:
    conn = await connect(bookie)
    try:
        r = await conn.request(
            lambda rid: p.ReadEntryRequest(
                request_id=rid, ledger_id=lid, entry_id=eid, master_key=p.master_key(PW)
            ),
            5.0,
        )
        assert isinstance(r, p.ReadEntryResponse) and r.status == p.Status.OK, (bookie, eid, r)
        return bytes(r.entry)
    finally:
        conn.close()


def test_a_copy_fails_over_to_the_replica_left_and_copies_its_bytes(bookies) -> None:
    procs = bookies.start_many(5)
    by_id = {bp.id: bp for bp in procs}

    async def write() -> tuple[int, tuple[str, ...]]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            h = await bk.create_ledger(3, 3, 2, password=PW)
            await h.append_many([f"entry-{i}-".encode() * 30 for i in range(N)])
            await h.close()
            return h.ledger_id, h.metadata.ensembles[0].bookies
        finally:
            await bk.close()

    lid, ens = asyncio.run(write())
    victim, also_dead, left = ens
    by_id[victim].kill9()
    by_id[also_dead].kill9()  # the first source of a third of the entries (and of the first batch)

    async def recover() -> None:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            r = await rereplicate_ledger(bk, lid, victim, PW)
            assert r.status == "done" and r.entries_copied == N, r
            new = r.replacements[0]
            md = await bk.ledger_metadata(lid)
            assert md.ensembles[0].bookies == (new, also_dead, left)
            for eid in (0, 1, 2, 511, 512, 1024, N - 1):
                assert await _raw(new, lid, eid) == await _raw(left, lid, eid)
        finally:
            await bk.close()

    asyncio.run(recover())
