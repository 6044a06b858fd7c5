"""The metadata transitions the client's one compare-and-set loop applies (writer close, writer ensemble change,
recovery start and close), and the writer's whole decision on the metadata it re-reads during an ensemble
change: pure, no store."""

from __future__ import annotations

import pytest

from ledger_client import LedgerState
from ledger_client.errors import IllegalStateTransitionError, IncorrectParameterError, LedgerRecoveryError
from ledger_client.handle_state import (
    EnsembleChangeStep,
    HandleEvent,
    ensemble_change_step,
    ensemble_change_transition,
    writer_close_event,
    writer_close_transition,
)
from ledger_client.recovery import (
    Close,
    Segment,
    recovery_close_transition,
    recovery_metadata_decision,
    recovery_start_transition,
)
from zk.ledger_metadata import Ensemble, LedgerMetadata, check_transition, password_digest_of

A = ("b0", "b1", "b2")
Step = EnsembleChangeStep


def meta(
    state: LedgerState = LedgerState.OPEN, ensembles: tuple[Ensemble, ...] = (Ensemble(0, A),)
) -> LedgerMetadata:
    m = LedgerMetadata(
        ledger_id=5,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        ensembles=ensembles,
        password_digest=password_digest_of(b"pw"),
    )
    if state is LedgerState.CLOSED:
        return m.close(9, 100)
    return m.with_state(state)


def test_ledger_state_is_the_metadata_string() -> None:
    assert LedgerState.CLOSED == "CLOSED" and meta().to_json()["state"] == "OPEN"
    assert meta(LedgerState.IN_RECOVERY).state is LedgerState.IN_RECOVERY
    # the decisions take the enum or its value, and refuse anything else
    assert writer_close_event("IN_RECOVERY", -1, 3) is writer_close_event(LedgerState.IN_RECOVERY, -1, 3)
    with pytest.raises(IllegalStateTransitionError):
        writer_close_event("FENCED", -1, 3)
    with pytest.raises(IncorrectParameterError):
        recovery_metadata_decision("closed")


@pytest.mark.parametrize(
    ("state", "last_entry_id", "step"),
    [
        (LedgerState.OPEN, 0, Step.WRITE),
        (LedgerState.IN_RECOVERY, 0, Step.FENCED),
        (LedgerState.CLOSED, 0, Step.FOUND_CLOSED),
    ],
)
def test_ensemble_change_step_by_state(state: LedgerState, last_entry_id: int, step: Step) -> None:
    assert ensemble_change_step(state, 0, A, first_entry_id=4, ensemble=A, tried=()) is step


def test_a_ledger_in_recovery_ends_the_writer_even_after_its_own_write() -> None:
    """The recoverer's OPEN->IN_RECOVERY came after our segment: the writer is fenced, not carrying on."""
    ours = ("b0", "b3", "b2")
    assert (
        ensemble_change_step(LedgerState.OPEN, 4, ours, first_entry_id=4, ensemble=A, tried={ours})
        is Step.ADOPT
    )
    for state, step in ((LedgerState.IN_RECOVERY, Step.FENCED), (LedgerState.CLOSED, Step.FOUND_CLOSED)):
        assert ensemble_change_step(state, 4, ours, first_entry_id=4, ensemble=A, tried={ours}) is step


def test_ensemble_change_step_last_segment() -> None:
    ours, other = ("b0", "b3", "b2"), ("b0", "b4", "b2")
    # another writer's segment (or ours but from another change): the metadata changed under the writer
    assert ensemble_change_step("OPEN", 4, other, first_entry_id=4, ensemble=A, tried={ours}) is Step.CHANGED
    assert ensemble_change_step("OPEN", 2, ours, first_entry_id=4, ensemble=A, tried={ours}) is Step.CHANGED
    # still the pipeline's segment: write
    assert ensemble_change_step("OPEN", 0, A, first_entry_id=4, ensemble=A, tried={ours}) is Step.WRITE


def test_ensemble_change_transition_writes_only_on_write() -> None:
    new = ("b0", "b3", "b2")
    md = meta()
    written, step = ensemble_change_transition(md, first_entry_id=4, ensemble=A, tried={new}, new_bookies=new)
    assert step is Step.WRITE and written is not None
    assert written.ensembles == (Ensemble(0, A), Ensemble(4, new))
    check_transition(md, written)
    again, step = ensemble_change_transition(
        written, first_entry_id=4, ensemble=A, tried={new}, new_bookies=new
    )
    assert (again, step) == (None, Step.ADOPT)
    for state in (LedgerState.IN_RECOVERY, LedgerState.CLOSED):
        found, step = ensemble_change_transition(
            meta(state), first_entry_id=4, ensemble=A, tried={new}, new_bookies=new
        )
        assert found is None and step in (Step.FENCED, Step.FOUND_CLOSED)


def test_writer_close_transition() -> None:
    new, ev = writer_close_transition(meta(), 9, 100)
    assert ev is None and new is not None and new.state is LedgerState.CLOSED
    assert (new.last_entry_id, new.length) == (9, 100)
    assert writer_close_transition(meta(LedgerState.IN_RECOVERY), 9, 100) == (
        None,
        HandleEvent.CLOSE_FOUND_IN_RECOVERY,
    )
    assert writer_close_transition(meta(LedgerState.CLOSED), 9, 100) == (
        None,
        HandleEvent.CLOSE_FOUND_CLOSED_SAME,
    )
    assert writer_close_transition(meta(LedgerState.CLOSED), 8, 90) == (
        None,
        HandleEvent.CLOSE_FOUND_CLOSED_OTHER,
    )


def test_recovery_start_transition() -> None:
    new, d = recovery_start_transition(meta())
    assert d == "mark_in_recovery" and new is not None and new.state is LedgerState.IN_RECOVERY
    assert recovery_start_transition(meta(LedgerState.IN_RECOVERY)) == (None, "proceed")
    assert recovery_start_transition(meta(LedgerState.CLOSED)) == (None, "already_closed")


def test_recovery_close_transition() -> None:
    segs = (Segment(first_entry_id=0, bookies=A), Segment(first_entry_id=5, bookies=("b0", "b3", "b2")))
    close = Close(last_entry_id=7, length=80, ensembles=segs)
    md = meta(LedgerState.IN_RECOVERY)
    new, d = recovery_close_transition(md, close)
    assert d.action == "write" and new is not None
    assert (new.state, new.last_entry_id, new.length) == (LedgerState.CLOSED, 7, 80)
    assert new.ensembles == (Ensemble(0, A), Ensemble(5, ("b0", "b3", "b2")))
    check_transition(md, new)
    # another recoverer closed it first: adopt its close, write nothing
    found, d = recovery_close_transition(meta(LedgerState.CLOSED), close)
    assert found is None and (d.action, d.last_entry_id, d.length) == ("adopt", 9, 100)
    with pytest.raises(LedgerRecoveryError):
        recovery_close_transition(meta(), close)
