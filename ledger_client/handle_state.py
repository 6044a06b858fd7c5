"""The life cycle of a ledger handle: one transition table (h11 style), pure.

States::

    OPEN         a writer: appends accepted
    CLOSING      a writer's close() began: no new appends; pending ones drain, then the close CAS
    CLOSED       closed by us (writer close done, or a recovering reader finished recovery)
    IN_RECOVERY  a recovering reader's handle while recovery runs
    ERROR        terminal: every later append/close raises the error that caused it

Ensemble changes do not change the handle state (they run inside OPEN, CLOSING and IN_RECOVERY; whether one
is in flight is the write pipeline's business), but the table says where they are legal.

Writer close versus concurrent recovery — the rule (the safe one):
BookKeeper's Java client overwrites IN_RECOVERY with CLOSED when a writer closes, although its documentation
says the writer should fail. We fail. The writer's close CAS predicate is "state is OPEN"; re-reading on a
version conflict, it maps what it finds with :func:`writer_close_event`:

- OPEN → CAS OPEN→CLOSED(last_entry_id = our LAC, length); once it succeeds ``CLOSE_DONE`` → CLOSED.
- IN_RECOVERY → a recoverer fenced us; it alone decides last_entry_id. The writer does NOT touch the metadata
  and fails: ``CLOSE_FOUND_IN_RECOVERY`` → ERROR(LedgerFencedError).
- CLOSED with last_entry_id == our LAC → the outcome we wanted (recovery agreed, or our own CAS was applied
  before a lost reply): ``CLOSE_FOUND_CLOSED_SAME`` → CLOSED.
- CLOSED with another last_entry_id → somebody else closed the ledger differently: ERROR(LedgerFencedError).

An ensemble change CAS (predicate: OPEN) that finds IN_RECOVERY is ``FENCED``; one that finds CLOSED is
``FOUND_CLOSED`` → ERROR(LedgerClosedError) (:func:`ensemble_change_event`). What the writer does with the
metadata it (re-)reads during an ensemble change, all of it, is :func:`ensemble_change_step`; the metadata writes
of the close and of an ensemble change are :func:`writer_close_transition` and
:func:`ensemble_change_transition`, the transitions the client's one compare-and-set loop applies.

:func:`transition` is the table lookup; :class:`HandleStateMachine` applies it and raises refusals.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence

from zk.ledger_metadata import LedgerMetadata, LedgerState

from .errors import (
    IllegalStateTransitionError,
    LedgerClosedError,
    LedgerError,
    LedgerFencedError,
)

__all__ = [
    "TRANSITIONS",
    "EnsembleChangeStep",
    "HandleEvent",
    "HandleState",
    "HandleStateMachine",
    "ensemble_change_event",
    "ensemble_change_step",
    "ensemble_change_transition",
    "ledger_state",
    "transition",
    "writer_close_event",
    "writer_close_transition",
]


class HandleState(enum.Enum):
    OPEN = "OPEN"
    CLOSING = "CLOSING"
    CLOSED = "CLOSED"
    IN_RECOVERY = "IN_RECOVERY"
    ERROR = "ERROR"


class HandleEvent(enum.Enum):
    APPEND = "APPEND"  # a caller wants to append
    ENSEMBLE_CHANGE_START = "ENSEMBLE_CHANGE_START"
    ENSEMBLE_CHANGE_DONE = "ENSEMBLE_CHANGE_DONE"
    FENCED = "FENCED"  # a bookie answered FENCED, or a metadata CAS found IN_RECOVERY
    FOUND_CLOSED = "FOUND_CLOSED"  # an ensemble change CAS found the ledger CLOSED by someone else
    FAILED = "FAILED"  # another terminal error (UNAUTHORIZED, NOT_ENOUGH_BOOKIES, ...): give it
    CLOSE_START = "CLOSE_START"
    CLOSE_DONE = "CLOSE_DONE"  # the writer's close CAS OPEN->CLOSED succeeded
    CLOSE_FOUND_IN_RECOVERY = "CLOSE_FOUND_IN_RECOVERY"
    CLOSE_FOUND_CLOSED_SAME = "CLOSE_FOUND_CLOSED_SAME"  # CLOSED with last_entry_id == our LAC
    CLOSE_FOUND_CLOSED_OTHER = "CLOSE_FOUND_CLOSED_OTHER"  # CLOSED with another last_entry_id
    RECOVERY_DONE = "RECOVERY_DONE"  # a recovering reader closed the ledger (or adopted a close)


S, E = HandleState, HandleEvent

# (state, event) -> next state, or the LedgerError class the event is refused with (state unchanged).
# Pairs not in the table are bugs in the driver: IllegalStateTransitionError. ERROR is handled apart: it
# absorbs everything and refuses APPEND/CLOSE_START with the error that caused it.
TRANSITIONS: dict[tuple[HandleState, HandleEvent], HandleState | type[LedgerError]] = {
    (S.OPEN, E.APPEND): S.OPEN,
    (S.OPEN, E.ENSEMBLE_CHANGE_START): S.OPEN,
    (S.OPEN, E.ENSEMBLE_CHANGE_DONE): S.OPEN,
    (S.OPEN, E.FENCED): S.ERROR,
    (S.OPEN, E.FOUND_CLOSED): S.ERROR,
    (S.OPEN, E.FAILED): S.ERROR,
    (S.OPEN, E.CLOSE_START): S.CLOSING,
    #
    (S.CLOSING, E.APPEND): LedgerClosedError,
    (S.CLOSING, E.ENSEMBLE_CHANGE_START): S.CLOSING,  # pending adds still draining
    (S.CLOSING, E.ENSEMBLE_CHANGE_DONE): S.CLOSING,
    (S.CLOSING, E.FENCED): S.ERROR,
    (S.CLOSING, E.FOUND_CLOSED): S.ERROR,
    (S.CLOSING, E.FAILED): S.ERROR,
    (S.CLOSING, E.CLOSE_START): S.CLOSING,  # a second close() joins the first
    (S.CLOSING, E.CLOSE_DONE): S.CLOSED,
    (S.CLOSING, E.CLOSE_FOUND_IN_RECOVERY): S.ERROR,
    (S.CLOSING, E.CLOSE_FOUND_CLOSED_SAME): S.CLOSED,
    (S.CLOSING, E.CLOSE_FOUND_CLOSED_OTHER): S.ERROR,
    #
    (S.CLOSED, E.APPEND): LedgerClosedError,
    (S.CLOSED, E.CLOSE_START): S.CLOSED,  # close() is idempotent
    #
    (S.IN_RECOVERY, E.APPEND): LedgerClosedError,  # a recovering reader never writes
    (S.IN_RECOVERY, E.ENSEMBLE_CHANGE_START): S.IN_RECOVERY,  # write-back replaced a bookie
    (S.IN_RECOVERY, E.ENSEMBLE_CHANGE_DONE): S.IN_RECOVERY,
    (S.IN_RECOVERY, E.FAILED): S.ERROR,
    (S.IN_RECOVERY, E.RECOVERY_DONE): S.CLOSED,
}

# The error an event that leads to ERROR leaves behind (FAILED carries its own).
_ERROR_FOR_EVENT: dict[HandleEvent, type[LedgerError]] = {
    E.FENCED: LedgerFencedError,
    E.FOUND_CLOSED: LedgerClosedError,
    E.CLOSE_FOUND_IN_RECOVERY: LedgerFencedError,
    E.CLOSE_FOUND_CLOSED_OTHER: LedgerFencedError,
}

del S, E


def transition(state: HandleState, event: HandleEvent) -> HandleState | type[LedgerError]:
    """The table lookup: the next state, or the error class the event is refused with."""
    if state is HandleState.ERROR:
        if event in (HandleEvent.APPEND, HandleEvent.CLOSE_START):
            return LedgerError  # refused with the stored error (see HandleStateMachine)
        return HandleState.ERROR
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalStateTransitionError(
            f"event {event.name} is not allowed in state {state.name}"
        ) from None


class HandleStateMachine:
    """Applies :data:`TRANSITIONS`; ``handle`` returns the new state or raises the refusal."""

    __slots__ = ("state", "error", "ledger_id")

    def __init__(self, initial: HandleState = HandleState.OPEN, *, ledger_id: int | None = None) -> None:
        if initial not in (HandleState.OPEN, HandleState.IN_RECOVERY, HandleState.CLOSED):
            raise IllegalStateTransitionError(f"a handle cannot start {initial.name}")
        self.state: HandleState = initial
        self.error: LedgerError | None = None
        self.ledger_id = ledger_id

    def handle(self, event: HandleEvent, *, error: LedgerError | None = None) -> HandleState:
        """Apply ``event``. ``error`` is required with FAILED and optional (more specific) otherwise."""
        if event is HandleEvent.FAILED and error is None:
            raise IllegalStateTransitionError("FAILED needs the error")
        if self.state is HandleState.ERROR:
            assert self.error is not None
            if event in (HandleEvent.APPEND, HandleEvent.CLOSE_START):
                raise self.error
            return self.state  # the first error stands
        nxt = transition(self.state, event)
        if not isinstance(nxt, HandleState):
            raise nxt(
                f"{event.name.lower()} refused: ledger handle is {self.state.name}", ledger_id=self.ledger_id
            )
        if nxt is HandleState.ERROR:
            self.error = error or _ERROR_FOR_EVENT.get(event, LedgerError)(
                f"{event.name.lower()} while {self.state.name}", ledger_id=self.ledger_id
            )
        self.state = nxt
        return nxt

    def check_append(self) -> None:
        """Raise unless an append is allowed now (does not change the state)."""
        if self.state is HandleState.ERROR:
            assert self.error is not None
            raise self.error
        nxt = transition(self.state, HandleEvent.APPEND)
        if not isinstance(nxt, HandleState):
            raise nxt(f"append refused: ledger handle is {self.state.name}", ledger_id=self.ledger_id)

    def __repr__(self) -> str:
        return f"HandleStateMachine({self.state.name}, error={self.error!r})"


def ledger_state(found_state: LedgerState | str) -> LedgerState:
    """The metadata state ``found_state`` (a ``LedgerState`` or its string value) as a ``LedgerState``."""
    try:
        return LedgerState(found_state)
    except ValueError:
        raise IllegalStateTransitionError(f"unknown ledger state {found_state!r}") from None


def writer_close_event(
    found_state: LedgerState | str, found_last_entry_id: int, our_last_add_confirmed: int
) -> HandleEvent | None:
    """What the writer's close makes of the metadata it (re-)read.

    ``None``: the ledger is OPEN — CAS it to CLOSED(our LAC, length) now; on success feed ``CLOSE_DONE``, on a
    version conflict re-read and ask again. Otherwise the event to feed (the metadata is left alone).
    """
    state = ledger_state(found_state)
    if state is LedgerState.OPEN:
        return None
    if state is LedgerState.IN_RECOVERY:
        return HandleEvent.CLOSE_FOUND_IN_RECOVERY
    if found_last_entry_id == our_last_add_confirmed:
        return HandleEvent.CLOSE_FOUND_CLOSED_SAME
    return HandleEvent.CLOSE_FOUND_CLOSED_OTHER


def ensemble_change_event(found_state: LedgerState | str) -> HandleEvent | None:
    """What a writer's ensemble change makes of the metadata it (re-)read.

    ``None``: OPEN — CAS the new segment now (also check the failed bookies are still in the last segment);
    on success feed ``ENSEMBLE_CHANGE_DONE``. Otherwise the event to feed.
    """
    state = ledger_state(found_state)
    if state is LedgerState.OPEN:
        return None
    if state is LedgerState.IN_RECOVERY:
        return HandleEvent.FENCED
    return HandleEvent.FOUND_CLOSED


def writer_close_transition(
    md: LedgerMetadata, last_add_confirmed: int, length: int
) -> tuple[LedgerMetadata | None, HandleEvent | None]:
    """The writer's close as a metadata transition: ``(md closed at our LAC and length, None)`` while the ledger
    is OPEN (once written, feed ``CLOSE_DONE``), else ``(None, the event to feed)`` (:func:`writer_close_event`;
    the metadata is left alone)."""
    ev = writer_close_event(md.state, md.last_entry_id, last_add_confirmed)
    if ev is None:
        return md.close(last_add_confirmed, length), None
    return None, ev


class EnsembleChangeStep(enum.Enum):
    """What a writer's ensemble change does with the metadata it (re-)read (:func:`ensemble_change_step`)."""

    WRITE = "WRITE"  # OPEN, last segment still the pipeline's: CAS the new segment on this version
    ADOPT = (
        "ADOPT"  # the last segment is one this change tried: its write was applied, only the reply was lost
    )
    FENCED = "FENCED"  # IN_RECOVERY: a recoverer fenced the ledger; fail (LedgerFencedError)
    FOUND_CLOSED = "FOUND_CLOSED"  # CLOSED by someone else: fail (LedgerClosedError)
    CHANGED = "CHANGED"  # OPEN but the last segment is not ours: another writer changed it; fail (fenced)


def ensemble_change_step(
    found_state: LedgerState | str,
    found_last_first_entry_id: int,
    found_last_bookies: Sequence[str],
    *,
    first_entry_id: int,
    ensemble: Sequence[str],
    tried: Collection[tuple[str, ...]],
) -> EnsembleChangeStep:
    """The writer's whole decision on the metadata it (re-)read while changing its ensemble.

    Args:
        found_state, found_last_first_entry_id, found_last_bookies: the metadata's state and last segment.
        first_entry_id: where the new segment starts (``EnsembleChangePlan.first_entry_id``).
        ensemble: the pipeline's ensemble (the last segment as the writer knows it).
        tried: the segments this change has tried to write (a lost reply may hide that one was applied).

    Returns:
        The step: WRITE or ADOPT go on; FENCED, FOUND_CLOSED and CHANGED end the writer. The state comes first
        (:func:`ensemble_change_event`): a ledger IN_RECOVERY fails the writer even if one of its own writes
        reached the metadata before the recoverer's.
    """
    ev = ensemble_change_event(found_state)
    if ev is HandleEvent.FENCED:
        return EnsembleChangeStep.FENCED
    if ev is HandleEvent.FOUND_CLOSED:
        return EnsembleChangeStep.FOUND_CLOSED
    last = tuple(found_last_bookies)
    if found_last_first_entry_id == first_entry_id and last in tried:
        return EnsembleChangeStep.ADOPT
    if last != tuple(ensemble):
        return EnsembleChangeStep.CHANGED
    return EnsembleChangeStep.WRITE


def ensemble_change_transition(
    md: LedgerMetadata,
    *,
    first_entry_id: int,
    ensemble: Sequence[str],
    tried: Collection[tuple[str, ...]],
    new_bookies: Sequence[str],
) -> tuple[LedgerMetadata | None, EnsembleChangeStep]:
    """An ensemble change as a metadata transition: ``md`` with the segment ``new_bookies`` from
    ``first_entry_id`` when :func:`ensemble_change_step` says WRITE, else nothing to write and the step."""
    last = md.last_ensemble
    step = ensemble_change_step(
        md.state,
        last.first_entry_id,
        last.bookies,
        first_entry_id=first_entry_id,
        ensemble=ensemble,
        tried=tried,
    )
    if step is EnsembleChangeStep.WRITE:
        return md.with_new_ensemble(first_entry_id, new_bookies), step
    return None, step
