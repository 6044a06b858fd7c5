"""Bugs the fault run found, reproduced deterministically with the pure cores (no processes, no timing).

Each test asserts the correct behaviour; they were strict xfails until the fixes landed and now guard against
regressions.
"""

from __future__ import annotations

import asyncio

from bookie.entryformat import DigestType, EntryCodec
from bookie.protocol import Status, master_key
from ledger_client import BookKeeper, ClientConfig
from ledger_client.recovery import ChangeEnsemble, Close, LedgerRecovery, RecoveryAdd
from zk.ledger_metadata import Ensemble, LedgerMetadata, LedgerState, check_transition, password_digest_of

A, B, C, D, E = (f"127.0.0.1:{p}" for p in (3181, 3182, 3183, 3184, 3185))
LID = 46


def _entry(codec: EntryCodec, eid: int) -> bytes:
    data = b"x" * 10
    return codec.build(eid, eid - 1, 10 * (eid + 1), data)


def test_recovery_close_after_replace_and_append_write_back_changes_is_a_legal_metadata_write() -> None:
    codec = EntryCodec(LID, DigestType.CRC32C, master_key(b"pw"))
    rec = LedgerRecovery(ensemble_size=3, write_quorum=2, ack_quorum=2, ensembles=[Ensemble(0, (A, B, C))])
    rec.start()
    for i in range(3):
        rec.on_fence_response(i, Status.OK, -1)  # nothing confirmed: start = -1, read from entry 0
    cmds = []
    for eid in (0, 1):  # entries 0 and 1 were written (write sets {A,B} and {B,C}); entry 2 never was
        ws = (0, 1) if eid == 0 else (1, 2)
        cmds += rec.on_read_response(eid, ws[0], Status.OK, _entry(codec, eid))
    cmds += rec.on_read_response(2, 2, Status.NO_ENTRY)
    adds = [c for c in cmds if isinstance(c, RecoveryAdd)]
    assert {(c.entry_id, c.bookie) for c in adds} == {(0, A), (0, B), (1, B), (1, C)}
    # Write-back of entry 0: A is down -> ensemble change at entry 0 = the segment's first entry (replace).
    cmds = rec.on_recovery_add_response(0, A, None)
    change = next(c for c in cmds if isinstance(c, ChangeEnsemble))
    assert change.plan.first_entry_id == 0
    cmds = rec.on_ensemble_changed(0, (D, B, C))
    cmds += rec.on_recovery_add_response(0, B, Status.OK)
    cmds += rec.on_recovery_add_response(0, D, Status.OK)
    # Write-back of entry 1: C is down too -> a second change at entry 1 (append).
    cmds += rec.on_recovery_add_response(1, B, Status.OK)
    cmds += rec.on_recovery_add_response(1, C, None)
    change = next(c for c in cmds if isinstance(c, ChangeEnsemble))
    assert change.plan.first_entry_id == 1
    cmds = rec.on_ensemble_changed(1, (D, B, E))
    assert [(c.entry_id, c.bookie) for c in cmds if isinstance(c, RecoveryAdd)] == [(1, E)]
    cmds = rec.on_recovery_add_response(1, E, Status.OK)
    close = next(c for c in cmds if isinstance(c, Close))
    assert close.last_entry_id == 1
    assert [(s.first_entry_id, tuple(s.bookies)) for s in close.ensembles] == [(0, (D, B, C)), (1, (D, B, E))]

    old = LedgerMetadata(
        ledger_id=LID,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        ensembles=(Ensemble(0, (A, B, C)),),
        password_digest=password_digest_of(b"pw"),
        state=LedgerState.IN_RECOVERY,
        ctime_ms=1,
    )
    new = old.replace(
        state="CLOSED",
        last_entry_id=close.last_entry_id,
        length=close.length,
        ensembles=tuple(Ensemble(s.first_entry_id, tuple(s.bookies)) for s in close.ensembles),
    )
    check_transition(
        old, new
    )  # raises MetadataTransitionError: "replacing the last ensemble and appending …"


def test_tailing_reader_reads_entries_written_after_an_ensemble_change(bookies) -> None:
    procs = bookies.start_many(5)

    async def go() -> None:
        cfg = ClientConfig(zk_root=bookies.root, add_timeout_s=1.0)
        bk = await BookKeeper.connect(bookies.zk, config=cfg)
        rbk = await BookKeeper.connect(bookies.zk, config=cfg)
        try:
            lh = await bk.create_ledger(3, 2, 2, password=b"pw")
            for i in range(10):
                await lh.append(b"e%d" % i)
            rh = await rbk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
            first = lh.metadata.last_ensemble.bookies
            paused = [bp for bp in procs if bp.id in first[:2]]
            for bp in paused:
                bp.pause()
            try:
                futs = [await lh.append_future(b"e%d" % i) for i in range(10, 40)]
                assert await asyncio.wait_for(asyncio.gather(*futs), 30) == list(range(10, 40))
            finally:
                for bp in paused:
                    bp.resume()
            for i in range(40, 45):  # these carry LAC 39+ to the new ensemble's bookies
                await lh.append(b"e%d" % i)
            last = lh.metadata.last_ensemble.bookies
            # Bookies 0 and 1 were replaced (so entries 40..44 with write set {0, 1}, e.g. 42, are not on them);
            # one is gone for good, so the reader's LAC read needs bookie 2, which stayed and knows LAC 43.
            assert not set(first[:2]) & set(last), (first, last)
            paused[0].kill9()
            lac = await rh.read_last_add_confirmed()
            assert lac >= 42, lac
            got = [e.data async for e in rh.read(0, lac)]
            assert got == [b"e%d" % i for i in range(lac + 1)]
        finally:
            await bk.close()
            await rbk.close()

    asyncio.run(go())
