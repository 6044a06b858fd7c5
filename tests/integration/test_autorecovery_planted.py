"""AutoRecovery's worker against live bookies and ZooKeeper, on a case a reviewer's planted bug got past the other
tests with (see the planted-bug audit in ``docs/architecture.md`` §11): entries a live bookie lost, copied back
to it in place, are paced by the rereplication throttle like any other copy."""

from __future__ import annotations

import asyncio

from autorecovery.config import AutoRecoveryConfig
from autorecovery.metrics import Metrics
from autorecovery.worker import ReplicationWorker
from bookie import protocol as p
from bookie.storage import RocksLedgerStorage, run_key
from ledger_client import BookKeeper, ClientConfig
from ledger_client.client import _meta
from tests.integration.rawbookie import RawBookie
from zk.underreplication import UnderReplicationManager

PW = b"pw"
RATE = 10 * 2**20  # bytes/s: far above what the test copies, so the worker never waits
LEDGERS = 10


async def _write_ledger(bookies, entries: int, repeat: int = 1) -> tuple[int, str]:
    """A closed E3/Qw3/Qa2 ledger of ``entries`` entries; returns its id and its ensemble's first bookie."""
    bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    try:
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        for i in range(entries):
            await lh.append(b"entry-%d-" % i * repeat)
        await lh.close()
        return lh.ledger_id, lh.metadata.ensembles[0].bookies[0]
    finally:
        await bk.close()


async def _plain_add(bookie: str, lid: int, eid: int) -> p.Status:
    """A writer's add (not a recovery add) of entry ``eid`` of ``lid`` straight to ``bookie``."""
    raw = await RawBookie.open(bookie)
    try:
        return await raw.add(lid, eid, key=p.master_key(PW))
    finally:
        raw.close()


async def _unregistered(bk: BookKeeper, gone: set[str]) -> None:
    """Until none of ``gone`` is registered (a stopped bookie's znode goes with its session)."""
    for _ in range(300):
        if not gone & set(await _meta(bk.registry.all)):
            return
        await asyncio.sleep(0.1)


def test_a_repair_in_place_takes_every_byte_it_copies_from_the_throttle(bookies) -> None:
    procs = bookies.start_many(3)
    by_id = {bp.id: bp for bp in procs}
    cfg = ClientConfig(zk_root=bookies.root)

    lid, victim = asyncio.run(_write_ledger(bookies, 130, repeat=20))
    bp = by_id[victim]
    bp.stop()  # the bookie loses entries 64..127 (the runs stored in that block of ids), is repaired in place
    s = RocksLedgerStorage(bp.data_dir / "ledgers")
    try:
        for first, _ in s.runs(lid, 63, 1000):
            if first < 128:
                s._db.delete(run_key(lid, first))
        s.flush()
    finally:
        s.close()
    bp.start()

    async def repair() -> tuple[str, int, int, float]:
        bk = await BookKeeper.connect(bookies.zk, config=cfg)
        try:
            manager = UnderReplicationManager(bk.store)
            await _meta(lambda: manager.mark(lid, [victim]))
            config = AutoRecoveryConfig(
                zk=bookies.zk, zk_root=bookies.root, passwords=(PW,), throttle_bytes_per_s=RATE
            )
            metrics = Metrics()
            worker = ReplicationWorker(
                bk, manager, config, metrics, "planted", clock=lambda: 0.0
            )  # no refill
            out = await worker.process(lid)
            return out.status, out.entries_copied, metrics.rereplicated_bytes_total, worker._bucket.tokens
        finally:
            await bk.close()

    status, copied, nbytes, tokens = asyncio.run(repair())
    assert (status, copied) == ("replicated", 64)
    assert nbytes > 64 * 20 * 8 and RATE - tokens == nbytes


def test_two_bookies_of_one_ensemble_lost_together_get_two_different_replacements(bookies) -> None:
    """Each replacement of a ledger's lost bookies is chosen against the ensemble with the earlier ones already
    in it: two lost bookies of one ensemble never get the same replacement (whose swap the metadata refuses,
    leaving the ledger under-replicated). With one bookie left to each of them, a collision is a coin flip
    per ledger; ten ledgers. The copies to the replacements take every byte from the rereplication throttle."""
    procs = bookies.start_many(5)
    by_id = {bp.id: bp for bp in procs}
    cfg = ClientConfig(zk_root=bookies.root)

    async def write() -> tuple[list[int], tuple[str, str]]:
        bk = await BookKeeper.connect(bookies.zk, config=cfg)
        try:
            out: list[int] = []
            pair: tuple[str, str] | None = None
            for _ in range(200):
                lh = await bk.create_ledger(3, 3, 2, password=PW)
                ens = set(lh.metadata.ensembles[0].bookies)
                if pair is None:
                    pair = tuple(sorted(ens))[:2]  # type: ignore[assignment]
                if set(pair) <= ens:
                    for i in range(20):
                        await lh.append(b"entry-%d" % i)
                    out.append(lh.ledger_id)
                await lh.close()
                if len(out) == LEDGERS:
                    break
            assert pair is not None and len(out) == LEDGERS
            return out, pair
        finally:
            await bk.close()

    ledgers, lost = asyncio.run(write())
    for b in lost:
        by_id[b].stop()

    metrics = Metrics()

    async def recover() -> tuple[list[tuple[str, str]], float]:
        bk = await BookKeeper.connect(bookies.zk, config=cfg)
        try:
            manager = UnderReplicationManager(bk.store)
            config = AutoRecoveryConfig(
                zk=bookies.zk, zk_root=bookies.root, passwords=(PW,), throttle_bytes_per_s=RATE
            )
            worker = ReplicationWorker(bk, manager, config, metrics, "planted", clock=lambda: 0.0)
            await _unregistered(bk, set(lost))
            out = []
            for lid in ledgers:
                await _meta(lambda lid=lid: manager.mark(lid, list(lost)))
                o = await worker.process(lid)
                out.append((o.status, o.why))
            return out, worker._bucket.tokens
        finally:
            await bk.close()

    outcomes, tokens = asyncio.run(recover())
    assert outcomes == [("replicated", "")] * LEDGERS
    assert (
        metrics.rereplicated_entries_total == LEDGERS * 2 * 20
        and RATE - tokens == metrics.rereplicated_bytes_total
    )


def test_a_copy_that_fails_keeps_the_mark_and_the_next_pass_completes(bookies) -> None:
    """The mark of a ledger is cleared only after its copy and metadata update: a copy that fails (here: no
    bookie to take the lost one's place) leaves it for the next pass, which completes once a bookie joins; the
    closed ledger's replacement is fenced for it."""
    procs = bookies.start_many(3)
    cfg = ClientConfig(zk_root=bookies.root)

    lid, lost = asyncio.run(_write_ledger(bookies, 20))
    next(bp for bp in procs if bp.id == lost).stop()

    async def attempt(mark: bool) -> tuple[str, bool, tuple[str, ...]]:
        bk = await BookKeeper.connect(bookies.zk, config=cfg)
        try:
            manager = UnderReplicationManager(bk.store)
            await _unregistered(bk, {lost})
            if mark:
                await _meta(lambda: manager.mark(lid, [lost]))
            config = AutoRecoveryConfig(zk=bookies.zk, zk_root=bookies.root, passwords=(PW,))
            o = await ReplicationWorker(bk, manager, config, Metrics(), "planted").process(lid)
            kept = await _meta(lambda: manager.get(lid)) is not None
            md = await bk.ledger_metadata(lid)
            return o.status, kept, md.ensembles[0].bookies
        finally:
            await bk.close()

    status, kept, ensemble = asyncio.run(attempt(mark=True))
    assert (status, kept) == ("failed", True) and lost in ensemble
    bookies.start()
    before_ensemble = ensemble
    status, kept, ensemble = asyncio.run(attempt(mark=False))
    assert (status, kept) == ("replicated", False) and lost not in ensemble
    # the replacement was fenced for the ledger before the swap: an add there (a writer that missed the close) is
    # refused, as on the bookies that were in the ensemble when it closed
    (target,) = set(ensemble) - set(before_ensemble)
    assert asyncio.run(_plain_add(target, lid, 20)) == p.Status.FENCED


def test_the_check_marks_a_live_bookie_that_lost_a_whole_ledger(bookies) -> None:
    """The auditor's check reads entries a live bookie should hold: one that answers it has no such ledger at all
    (NO_LEDGER: the ledger's every entry and its key gone) is marked as lacking them, as one answering
    NO_ENTRY is."""
    from autorecovery.auditor import Auditor, read_all_metadata
    from bookie.storage import RocksLedgerStorage

    procs = bookies.start_many(3)
    lid, victim = asyncio.run(_write_ledger(bookies, 20))
    bp = next(bp for bp in procs if bp.id == victim)
    bp.stop()
    s = RocksLedgerStorage(bp.data_dir / "ledgers")
    try:
        s.delete_ledger(lid)
        s.flush()
    finally:
        s.close()
    bp.start()

    async def check() -> tuple[dict[int, set[str]], tuple[str, ...] | None]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            manager = UnderReplicationManager(bk.store)
            config = AutoRecoveryConfig(zk=bookies.zk, zk_root=bookies.root, passwords=(PW,))
            auditor = Auditor(bk, manager, config, Metrics(), "planted")
            ledgers = await _meta(lambda: read_all_metadata(bk))
            found = await auditor.check(ledgers, set(await _meta(bk.registry.all)))
            mark = await _meta(lambda: manager.get(lid))
            return found, None if mark is None else mark.value.missing
        finally:
            await bk.close()

    found, missing = asyncio.run(check())
    assert found == {lid: {victim}} and missing is not None and victim in missing


def test_a_mark_that_changes_during_the_copy_is_kept_for_another_pass(bookies) -> None:
    """The worker clears the mark at the version it read: when the auditor adds to it during the copy (another
    bookie found lacking entries), the mark stays, naming that bookie, for another pass."""
    procs = bookies.start_many(4)
    lid, lost = asyncio.run(_write_ledger(bookies, 20))
    next(bp for bp in procs if bp.id == lost).stop()

    async def run() -> tuple[str, tuple[str, ...] | None, str]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            manager = UnderReplicationManager(bk.store)
            await _unregistered(bk, {lost})
            await _meta(lambda: manager.mark(lid, [lost]))
            md = await bk.ledger_metadata(lid)
            other = next(b for b in md.ensembles[0].bookies if b != lost)
            config = AutoRecoveryConfig(zk=bookies.zk, zk_root=bookies.root, passwords=(PW,))
            worker = ReplicationWorker(bk, manager, config, Metrics(), "planted")
            throttle = worker._throttle

            async def auditor_marks_meanwhile(nbytes: int) -> None:
                await _meta(lambda: manager.mark(lid, [other]))
                await throttle(nbytes)

            worker._throttle = auditor_marks_meanwhile  # type: ignore[method-assign]
            o = await worker.process(lid)
            mark = await _meta(lambda: manager.get(lid))
            return o.status, None if mark is None else mark.value.missing, other
        finally:
            await bk.close()

    status, missing, other = asyncio.run(run())
    assert status == "replicated" and missing is not None and other in missing


def test_an_audit_marks_again_a_ledger_whose_mark_went_while_it_still_names_a_lost_bookie(bookies) -> None:
    """The auditor keeps every lost bookie that ledgers still name: an audit (periodic, or requested) marks again
    a ledger whose mark went (cleared by hand, or by a worker that failed to say so) while it still names one."""
    from autorecovery.auditor import Auditor

    procs = bookies.start_many(4)
    lid, lost = asyncio.run(_write_ledger(bookies, 20))
    next(bp for bp in procs if bp.id == lost).stop()

    async def run() -> tuple[bool, bool, bool]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            manager = UnderReplicationManager(bk.store)
            await _unregistered(bk, {lost})
            config = AutoRecoveryConfig(zk=bookies.zk, zk_root=bookies.root, passwords=(PW,))
            auditor = Auditor(bk, manager, config, Metrics(), "planted")
            await auditor.step()  # elected; the lost bookie's ledgers marked at once (no delay)
            marked = await _meta(lambda: manager.get(lid)) is not None
            await _meta(lambda: manager.clear(lid))
            await auditor.step()  # no audit due: nothing marked
            quiet = await _meta(lambda: manager.get(lid)) is None
            await _meta(manager.request_audit)
            await auditor.step()
            again = await _meta(lambda: manager.get(lid)) is not None
            return marked, quiet, again
        finally:
            await bk.close()

    assert asyncio.run(run()) == (True, True, True)
