"""Scrubbing with real processes: bytes flipped in a stopped bookie's RocksDB values and a run removed; the bookie,
restarted, finds both, marks the ledger under-replicated naming itself and the entry ranges, and AutoRecovery
copies the entries back from another replica: a read from that bookie alone returns the right bytes. Also a
bookie's ``--rack`` registered at start and shown by ``ledgerstore ledger metadata``."""

from __future__ import annotations

import asyncio
import json
import time

from bookie import protocol as p
from bookie.storage import RocksLedgerStorage, run_entries, run_key
from ledger_client import BookKeeper
from tests.integration.test_autorecovery import PW, AutoRecoveryProcess, _cli, _client, _marks, payload
from tests.integration.test_rereplication import _raw_read

ENTRIES = 400
SCRUB = ("--scrub-interval-s", "1", "--scrub-rate-mb", "64")


async def _write(bookies) -> tuple[int, tuple[str, ...]]:
    bk = await BookKeeper.connect(bookies.zk, config=_client(bookies))
    try:
        lh = await bk.create_ledger(3, 2, 2, password=PW)
        for i in range(ENTRIES):
            await lh.append(payload(lh.ledger_id, i))
        await lh.close()
        return lh.ledger_id, lh.metadata.ensembles[0].bookies
    finally:
        await bk.close()


def _damage(data_dir, lid: int) -> tuple[int, list[int]]:
    """Flip a payload byte of one entry of the first run and remove the third run; returns (the damaged entry,
    the removed run's entries)."""
    s = RocksLedgerStorage(data_dir / "ledgers")
    try:
        runs = s.runs(lid, -1, 3)
        first, value = runs[0]
        ids, _ = run_entries(first, value)
        victim = ids[len(ids) // 2]
        raw = bytearray(value)
        at = raw.find(payload(lid, victim))
        assert at > 0
        raw[at + 5] ^= 0x55
        s._db.put(run_key(lid, first), bytes(raw))
        gone_first, gone_value = runs[2]
        gone = run_entries(gone_first, gone_value)[0]
        s._db.delete(run_key(lid, gone_first))
        s.flush()
    finally:
        s.close()
    return victim, gone


def test_a_damaged_entry_and_a_removed_run_are_repaired_from_another_replica(bookies, tmp_path) -> None:
    procs = [bookies.start(*SCRUB, "--rack", f"/region-{i % 2}/rack-{i}", wait=False) for i in range(3)]
    for bp in procs:
        bp.wait_healthy(60)
    by_id = {bp.id: bp for bp in procs}
    ar = AutoRecoveryProcess(bookies, tmp_path, "a")
    try:
        lid, ensemble = asyncio.run(_write(bookies))
        r = _cli(bookies, "ledger", "metadata", str(lid), "--json")
        assert r.returncode == 0, r.stderr
        racks = json.loads(r.stdout)["racks"]
        assert racks == {
            b: f"/region-{procs.index(by_id[b]) % 2}/rack-{procs.index(by_id[b])}" for b in ensemble
        }
        human = _cli(bookies, "ledger", "metadata", str(lid)).stdout
        assert f"{ensemble[0]} ({racks[ensemble[0]]})" in human

        target = by_id[ensemble[0]]
        time.sleep(2)  # a clean pass first: nothing marked
        assert not _marks(bookies)
        target.stop()
        damaged, gone = _damage(target.data_dir, lid)
        t0 = time.monotonic()
        target.start()
        expect = [damaged, *gone]

        async def reads() -> list[bytes | None]:
            out = []
            for eid in expect:
                r = await _raw_read(target.id, lid, eid)
                out.append(bytes(r.entry) if r.status == p.Status.OK else None)
            return out

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = asyncio.run(reads())
            if all(g is not None and g.endswith(payload(lid, e)) for g, e in zip(got, expect, strict=True)):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"not repaired: {got}")
        took = time.monotonic() - t0
        deadline = time.monotonic() + 20
        while _marks(bookies) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _marks(bookies)
        log = target.log_path or target.data_dir.parent / f"bookie-{target.port}.log"
        text = log.read_text()
        assert f"ledger={lid} entry={damaged} damaged" in text
        assert f"repaired on {target.id}" in ar.log.read_text()
        # the entries are identical on both replicas (byte for byte, digest included)
        for eid in expect:
            copies = [asyncio.run(_raw_read(b, lid, eid)) for b in ensemble if b != target.id]
            mine = asyncio.run(_raw_read(target.id, lid, eid))
            assert any(bytes(c.entry) == bytes(mine.entry) for c in copies if c.status == p.Status.OK)
        print(f"repaired {len(expect)} entries {took:.1f}s after the restart")
    finally:
        ar.stop()
