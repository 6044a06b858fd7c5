"""Bugs the simulator found in the cores: a regression test each.

While a bug is open its test is marked ``xfail(strict=True)`` and ``tests/sim/checker.py`` ``KNOWN_BUGS``
holds its signature (so random schedules go on past it and still check the rest). Once fixed, the test
XPASSes and fails the suite on purpose: drop the marker and the ``KNOWN_BUGS`` entry.

1. recovery-close-replace-and-append (found by random schedule 224 of an early version of the default profile;
   fixed in ``zk.ledger_metadata.check_transition``): ``LedgerRecovery`` keeps write-back ensemble changes
   local and writes them with the close. A first change at the last segment's own first entry *replaces* that
   segment, a later one *appends*; ``check_transition`` refused "replacing the last ensemble and appending
   another in one write", so every such close CAS failed and the ledger stayed IN_RECOVERY.
"""

from __future__ import annotations

from pathlib import Path

from bookie.entryformat import DigestType, EntryCodec
from bookie.protocol import Status
from ledger_client.recovery import ChangeEnsemble, Close, Command, LedgerRecovery
from zk.ledger_metadata import Ensemble, LedgerMetadata, LedgerState, check_transition, password_digest_of

from .checker import KNOWN_BUGS
from .scripted import add, dump, make_world, once, recover_at, writer


def _of(cmds: list[Command], cls: type) -> list:
    return [c for c in cmds if isinstance(c, cls)]


def test_recovery_close_after_two_write_back_ensemble_changes_is_a_legal_metadata_write() -> None:
    """Pure cores, no simulator. Last segment [b0,b1,b3] from e5 (an ensemble change with nothing pending,
    the #2615 shape) and LAC 3 on the bookies: recovery starts at 4. e5 is recovered, its write-back to b3
    fails -> replacement segment from e5 (replaces the last one); e6 is recovered, its write-back to b1 fails
    -> a new segment from e6 (appended). e7 is unrecoverable: Close(6) with both changes."""
    md = LedgerMetadata(
        ledger_id=1,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        ensembles=(Ensemble(0, ("b0", "b1", "b2")), Ensemble(5, ("b0", "b1", "b3"))),
        password_digest=password_digest_of(b""),
        ctime_ms=0,
        state=LedgerState.IN_RECOVERY,
    )
    codec = EntryCodec(1, DigestType.CRC32C)
    rec = LedgerRecovery(ensemble_size=3, write_quorum=3, ack_quorum=2, ensembles=md.ensembles, read_window=1)
    rec.start()
    rec.on_fence_response(0, Status.NO_ENTRY, 3)
    rec.on_fence_response(1, Status.NO_ENTRY, 3)
    assert rec.start_entry_id == 4
    rec.on_read_response(5, 0, Status.OK, codec.build(5, 4, 6, b"x"))
    (ce,) = _of(rec.on_recovery_add_response(5, "b3", None), ChangeEnsemble)
    rec.on_ensemble_changed(ce.plan.first_entry_id, ("b0", "b1", "b4"))  # replaces the segment from e5
    for b in ("b0", "b1", "b4"):
        rec.on_recovery_add_response(5, b, Status.OK)
    rec.on_read_response(6, 0, Status.OK, codec.build(6, 4, 7, b"y"))
    (ce,) = _of(rec.on_recovery_add_response(6, "b1", None), ChangeEnsemble)
    rec.on_ensemble_changed(ce.plan.first_entry_id, ("b0", "b5", "b4"))  # appends a segment from e6
    for b in ("b0", "b5", "b4"):
        rec.on_recovery_add_response(6, b, Status.OK)
    cmds: list[Command] = []
    for i in (0, 1, 2):
        cmds += rec.on_read_response(7, i, Status.NO_ENTRY)
    (close,) = _of(cmds, Close)
    assert [s.first_entry_id for s in close.ensembles] == [0, 5, 6]
    closed = md.replace(
        state="CLOSED",
        last_entry_id=close.last_entry_id,
        length=close.length,
        ensembles=tuple(Ensemble(s.first_entry_id, s.bookies) for s in close.ensembles),
    )
    check_transition(md, closed)  # raised MetadataTransitionError before the fix


def test_simulated_recovery_with_two_write_back_ensemble_changes_closes_the_ledger() -> None:
    """The same through the simulator (the shape random schedules found, e.g. seed 224 of an earlier
    version of the default profile). E=Qw=Qa=2. w0's adds of e5, e6 to b1 are lost: the ensemble changes at
    e5 (b1 -> a spare) with e5, e6 pending, which then complete; every header carries LAC -1, so recovery
    starts at 4. Write-back of e5 to the spare is lost -> the segment from e5 is replaced; write-back of e6
    to b0 is lost -> a segment from e6 is appended. The close CAS is refused."""
    w = make_world(6, 2, 2, 2, strict=True, request_timeout_s=0.5)
    once(w, add("w0", "b1", 5), "drop")
    once(w, add("w0", "b1", 6), "drop")
    once(w, lambda s, d, m: d != "b0" and add(s, d, 5, recovery=True)(s, d, m), "drop")
    once(w, add("x0", "b0", 6, recovery=True), "drop")
    wr = writer(w, ["b0", "b1"], 7, close_when_done=False)
    recover_at(w, 1.5, wr)
    w.run(6.0)
    assert not w.checker.violations, dump(w)
    md = w.meta.ledgers[1].value
    assert md.state == "CLOSED" and [e.first_entry_id for e in md.ensembles] == [0, 5, 6], dump(w)


def test_every_open_known_bug_has_a_test_here() -> None:
    source = Path(__file__).read_text()
    assert all(name in source for name in KNOWN_BUGS), sorted(KNOWN_BUGS)
