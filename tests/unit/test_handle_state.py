"""The ledger handle's transition table, driven with no I/O at all."""

from __future__ import annotations

import pytest

from ledger_client.errors import (
    IllegalStateTransitionError,
    LedgerClosedError,
    LedgerError,
    LedgerFencedError,
    NotEnoughBookiesError,
)
from ledger_client.handle_state import (
    TRANSITIONS,
    HandleEvent,
    HandleState,
    HandleStateMachine,
    ensemble_change_event,
    transition,
    writer_close_event,
)

S, Ev = HandleState, HandleEvent


def test_writer_happy_path():
    m = HandleStateMachine()
    assert m.handle(Ev.APPEND) is S.OPEN
    assert m.handle(Ev.ENSEMBLE_CHANGE_START) is S.OPEN
    assert m.handle(Ev.APPEND) is S.OPEN  # appends continue while the ensemble changes
    assert m.handle(Ev.ENSEMBLE_CHANGE_DONE) is S.OPEN
    assert m.handle(Ev.CLOSE_START) is S.CLOSING
    with pytest.raises(LedgerClosedError):
        m.handle(Ev.APPEND)
    assert m.state is S.CLOSING
    assert m.handle(Ev.ENSEMBLE_CHANGE_START) is S.CLOSING  # pending adds still draining
    assert m.handle(Ev.CLOSE_DONE) is S.CLOSED
    with pytest.raises(LedgerClosedError):
        m.check_append()
    assert m.handle(Ev.CLOSE_START) is S.CLOSED  # idempotent close


def test_fenced_is_terminal_and_every_later_append_or_close_raises_it():
    m = HandleStateMachine(ledger_id=9)
    assert m.handle(Ev.FENCED) is S.ERROR
    assert isinstance(m.error, LedgerFencedError) and m.error.ledger_id == 9
    with pytest.raises(LedgerFencedError):
        m.handle(Ev.APPEND)
    with pytest.raises(LedgerFencedError):
        m.handle(Ev.CLOSE_START)
    assert m.handle(Ev.FAILED, error=NotEnoughBookiesError()) is S.ERROR
    assert isinstance(m.error, LedgerFencedError)  # the first error stands


def test_failed_carries_its_error():
    m = HandleStateMachine()
    err = NotEnoughBookiesError("no bookies")
    m.handle(Ev.FAILED, error=err)
    with pytest.raises(NotEnoughBookiesError):
        m.check_append()
    with pytest.raises(IllegalStateTransitionError):
        HandleStateMachine().handle(Ev.FAILED)


@pytest.mark.parametrize(
    ("found", "found_last", "ours", "event", "final", "err"),
    [
        ("OPEN", -1, 5, None, None, None),
        ("IN_RECOVERY", -1, 5, Ev.CLOSE_FOUND_IN_RECOVERY, S.ERROR, LedgerFencedError),
        ("CLOSED", 5, 5, Ev.CLOSE_FOUND_CLOSED_SAME, S.CLOSED, None),
        ("CLOSED", 7, 5, Ev.CLOSE_FOUND_CLOSED_OTHER, S.ERROR, LedgerFencedError),
    ],
)
def test_writer_close_versus_concurrent_recovery(found, found_last, ours, event, final, err):
    assert writer_close_event(found, found_last, ours) is event
    if event is None:
        return  # OPEN: the writer does the CAS itself, then feeds CLOSE_DONE
    m = HandleStateMachine()
    m.handle(Ev.CLOSE_START)
    assert m.handle(event) is final
    if err is not None:
        assert isinstance(m.error, err)


def test_ensemble_change_cas_outcomes():
    assert ensemble_change_event("OPEN") is None
    m = HandleStateMachine()
    m.handle(Ev.ENSEMBLE_CHANGE_START)
    m.handle(ensemble_change_event("IN_RECOVERY"))
    assert isinstance(m.error, LedgerFencedError)
    m = HandleStateMachine()
    m.handle(ensemble_change_event("CLOSED"))
    assert isinstance(m.error, LedgerClosedError)
    with pytest.raises(IllegalStateTransitionError):
        ensemble_change_event("BOGUS")
    with pytest.raises(IllegalStateTransitionError):
        writer_close_event("BOGUS", 0, 0)


def test_recovering_reader():
    m = HandleStateMachine(S.IN_RECOVERY)
    with pytest.raises(LedgerClosedError):
        m.handle(Ev.APPEND)
    assert m.handle(Ev.ENSEMBLE_CHANGE_START) is S.IN_RECOVERY
    assert m.handle(Ev.ENSEMBLE_CHANGE_DONE) is S.IN_RECOVERY
    assert m.handle(Ev.RECOVERY_DONE) is S.CLOSED


def test_illegal_events_are_driver_bugs():
    with pytest.raises(IllegalStateTransitionError):
        HandleStateMachine().handle(Ev.CLOSE_DONE)  # no close started
    with pytest.raises(IllegalStateTransitionError):
        HandleStateMachine().handle(Ev.RECOVERY_DONE)
    with pytest.raises(IllegalStateTransitionError):
        HandleStateMachine(S.CLOSED).handle(Ev.ENSEMBLE_CHANGE_START)
    with pytest.raises(IllegalStateTransitionError):
        HandleStateMachine(S.ERROR)


def test_table_is_total_over_every_state_and_event():
    for state in HandleState:
        for event in HandleEvent:
            try:
                out = transition(state, event)
            except IllegalStateTransitionError:
                assert (state, event) not in TRANSITIONS
                continue
            assert isinstance(out, HandleState) or issubclass(out, LedgerError)


def test_closed_is_only_reached_by_a_successful_close_or_recovery():
    into_closed = {ev for (st, ev), nxt in TRANSITIONS.items() if nxt is S.CLOSED and st is not S.CLOSED}
    assert into_closed == {Ev.CLOSE_DONE, Ev.CLOSE_FOUND_CLOSED_SAME, Ev.RECOVERY_DONE}
    # Nothing ever leaves CLOSED or ERROR.
    assert all(
        nxt in (S.CLOSED,) or not isinstance(nxt, HandleState)
        for (st, _), nxt in TRANSITIONS.items()
        if st is S.CLOSED
    )
    for event in HandleEvent:
        assert transition(S.ERROR, event) in (S.ERROR, LedgerError)
