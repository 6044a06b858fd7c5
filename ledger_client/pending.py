"""The write pipeline of one ledger handle: a pure core (no sockets, clocks or asyncio).

The I/O layer drives it like this::

    if not pipe.has_capacity: wait (backpressure the caller)
    add = pipe.next_entry(len(payload))            # entry id, cumulative length, LAC to piggyback
    data = codec.build(add.entry_id, add.lac, add.length, payload)    # keep `data` until the entry completes
    for index, bookie in pipe.targets(add.entry_id): send ADD_ENTRY(data) to bookie
    on a response:           progress = pipe.on_ack(entry_id, bookie, status)
    on a batch of OK acks from one bookie:  progress = pipe.on_acks(bookie, entry_ids)   (same as on_ack per id)
    on a timeout / no reply: progress = pipe.on_timeout(entry_id, bookie)    (or on_bookie_error(bookie))
    progress.completed -> resolve those appends (already in entry-id order); progress.failed -> fail them
                          with progress.error (terminal: the pipeline refuses everything afterwards)
    if pipe.needs_ensemble_change and not pipe.changing_ensemble:
        plan = pipe.ensemble_change_plan()         # first_entry_id = LAC + 1, failed indices; LAC freezes
        choose replacements, CAS the metadata (OPEN and failed bookies still in the last ensemble), then
        result = pipe.apply_new_ensemble(plan.first_entry_id, new_bookies)
        send result.resends; resolve result.completed
        (CAS found IN_RECOVERY -> pipe.fail(LedgerFencedError); CLOSED -> pipe.fail(LedgerClosedError);
         no replacement -> pipe.fail(NotEnoughBookiesError); a lost CAS race -> re-read, call plan() again)

Rules (docs/architecture.md §8):

- Entry ids are assigned contiguously from LAC + 1. An entry completes at >= Qa acks of its write set, and is
  reported only once every earlier entry has completed, so acks and the LAC advance strictly in order.
- FENCED or UNAUTHORIZED from any bookie is terminal: every pending entry fails with that error.
- Any other failure (a status, a timeout, a lost connection) marks that bookie *index* failed; the ensemble
  must change. The failed index gets no new sends until it is replaced.
- While an ensemble change is in flight (``ensemble_change_plan()`` .. ``apply_new_ensemble()``) no entry
  completes: the LAC is frozen so that the new segment's first entry id (LAC + 1 at plan time) is still LAC + 1
  when it is applied. Otherwise an entry could complete with an ack from a bookie that the new segment, which
  covers that entry, no longer contains — leaving it on fewer than Qa bookies of its covering ensemble.
  Acks keep being recorded during the freeze and count when it ends.
- On ``apply_new_ensemble``, for every pending entry (all are >= first_entry_id) acks from replaced indices are
  forgotten (the old bookie's copy lives in a segment that no longer covers the entry) and the entry is resent
  to each replacement in its write set. Acks from bookies that stayed still count.

Responses are matched to the current ensemble by bookie id; a response from a bookie that is no longer in the
ensemble is ignored. (If a replaced bookie comes back later at another index its late ack is still true — it
does store that entry — so counting it is sound.)

``_unsafe_ack_out_of_order=True`` reports entries as completed as soon as they reach Qa even when an earlier
entry has not: WRONG, for the correctness harness only (the LAC itself still advances contiguously).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from bookie.protocol import Status

from .errors import (
    IllegalStateTransitionError,
    IncorrectParameterError,
    LedgerError,
    error_for_status,
)
from .quorum import validate_quorum, write_set

__all__ = [
    "DEFAULT_OUTSTANDING_ADDS_MAX",
    "EnsembleChangePlan",
    "EnsembleChangeResult",
    "PendingAdd",
    "PipelineFullError",
    "Progress",
    "Resend",
    "Target",
    "WritePipeline",
]

DEFAULT_OUTSTANDING_ADDS_MAX = 1000

#: Statuses after which this writer can never succeed: the pipeline fails as a whole.
TERMINAL_STATUSES = frozenset({Status.FENCED, Status.UNAUTHORIZED})


class PipelineFullError(RuntimeError):
    """``next_entry`` with ``outstanding_adds_max`` entries pending. Internal: check ``has_capacity`` first."""


class PendingAdd(NamedTuple):  # a NamedTuple: created once per append (hot path)
    entry_id: int
    payload_len: int
    length: int  # cumulative ledger length including this entry (goes into the entry header)
    lac: int  # the LAC to piggyback in this entry's header (the pipeline's LAC when the id was assigned)


class Target(NamedTuple):
    bookie_index: int
    bookie: str


class Resend(NamedTuple):
    entry_id: int
    bookie_index: int
    bookie: str


class EnsembleChangePlan(NamedTuple):
    first_entry_id: int  # the new segment's first entry id = LAC + 1
    failed_indices: frozenset[int]
    failed_bookies: tuple[str, ...]  # bookie ids at failed_indices, in index order (for the CAS predicate)


@dataclass(frozen=True, slots=True)
class Progress:
    """What an event decided. ``completed`` ascending; ``failed`` entries all fail with ``error``."""

    completed: tuple[int, ...] = ()
    failed: tuple[int, ...] = ()
    error: LedgerError | None = None


_NOTHING = Progress()


@dataclass(frozen=True, slots=True)
class EnsembleChangeResult:
    resends: tuple[Resend, ...]
    completed: tuple[int, ...]  # entries that completed once the LAC unfroze (ascending)


class WritePipeline:
    """Pending adds of one ledger handle (see the module docstring for the protocol)."""

    def __init__(
        self,
        *,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        ensemble: list[str] | tuple[str, ...],
        last_add_confirmed: int = -1,
        length: int = 0,
        outstanding_adds_max: int = DEFAULT_OUTSTANDING_ADDS_MAX,
        _unsafe_ack_out_of_order: bool = False,
    ) -> None:
        validate_quorum(ensemble_size, write_quorum, ack_quorum)
        if outstanding_adds_max < 1:
            raise IncorrectParameterError(f"outstanding_adds_max must be >= 1, got {outstanding_adds_max}")
        if last_add_confirmed < -1 or length < 0:
            raise IncorrectParameterError(
                f"bad start: last_add_confirmed={last_add_confirmed} length={length}"
            )
        self.ensemble_size = ensemble_size
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.outstanding_adds_max = outstanding_adds_max
        self._ensemble: tuple[str, ...] = ()
        self._index_of: dict[str, int] = {}
        self._set_ensemble(ensemble)
        self._lac = last_add_confirmed
        self._length = length  # cumulative length through the LAC
        self._next_entry_id = last_add_confirmed + 1
        self._next_length = length
        # The pending entries are exactly LAC + 1 .. next_entry_id - 1 (ids are assigned in order and leave in
        # order, as the LAC advances). Per entry (hot path: plain ints, no object per entry):
        # _pending[eid]: bitmask of the bookie indices whose ack counts for it (insertion order == id order;
        # an ack is final: a later failure report for that index is ignored; an ack from a replaced index is
        # forgotten by the ensemble change); _lengths[eid - LAC - 1]: its cumulative ledger length.
        self._pending: dict[int, int] = {}
        self._lengths: list[int] = []
        self._reported: set[int] = set()  # completed early (only in _unsafe_ack_out_of_order mode)
        self._failed: set[int] = set()
        self._changing = False
        self._error: LedgerError | None = None
        self._unsafe_out_of_order = _unsafe_ack_out_of_order
        # Write sets repeat with period E: compute them (and their bitmasks) once (hot path).
        self._write_sets = tuple(write_set(i, ensemble_size, write_quorum) for i in range(ensemble_size))
        self._write_masks = tuple(sum(1 << i for i in ws) for ws in self._write_sets)
        self._every_write_set_full = write_quorum == ensemble_size  # every index is in every write set

    # -- introspection ----------------------------------------------------------------------------------

    @property
    def lac(self) -> int:
        """Highest entry id such that it and every earlier entry completed (-1 when none)."""
        return self._lac

    @property
    def length(self) -> int:
        """Cumulative ledger length through the LAC."""
        return self._length

    @property
    def next_entry_id(self) -> int:
        return self._next_entry_id

    @property
    def ensemble(self) -> tuple[str, ...]:
        return self._ensemble

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    @property
    def pending_entry_ids(self) -> tuple[int, ...]:
        return tuple(self._pending)

    @property
    def has_capacity(self) -> bool:
        return self._error is None and len(self._pending) < self.outstanding_adds_max

    @property
    def error(self) -> LedgerError | None:
        """The terminal error, once the pipeline failed."""
        return self._error

    @property
    def failed_indices(self) -> frozenset[int]:
        return frozenset(self._failed)

    @property
    def needs_ensemble_change(self) -> bool:
        return self._error is None and bool(self._failed)

    @property
    def changing_ensemble(self) -> bool:
        return self._changing

    def acked_indices(self, entry_id: int) -> frozenset[int]:
        """Indices whose ack currently counts for a pending entry (empty if not pending)."""
        acked = self._pending.get(entry_id)
        if acked is None:
            return frozenset()
        return frozenset(i for i in range(self.ensemble_size) if acked >> i & 1)

    # -- appends ----------------------------------------------------------------------------------------

    def next_entry(self, payload_len: int) -> PendingAdd:
        """Assign the next entry id. Raises the terminal error, or PipelineFullError when at the bound."""
        eid, length, lac = self.assign(payload_len)
        return PendingAdd(eid, payload_len, length, lac)

    def assign(self, payload_len: int) -> tuple[int, int, int]:
        """``next_entry`` as a plain ``(entry_id, length, lac)`` tuple (the I/O layer's hot path)."""
        if self._error is not None:
            raise self._error
        if payload_len < 0:
            raise IncorrectParameterError(f"payload length must be >= 0, got {payload_len}")
        pending = self._pending
        if len(pending) >= self.outstanding_adds_max:
            raise PipelineFullError(f"{len(pending)} adds outstanding (max {self.outstanding_adds_max})")
        eid = self._next_entry_id
        self._next_entry_id = eid + 1
        length = self._next_length = self._next_length + payload_len
        pending[eid] = 0
        self._lengths.append(length)
        return eid, length, self._lac

    def targets(self, entry_id: int) -> list[Target]:
        """Where to send a pending entry now: its write set in the current ensemble, minus failed indices
        (those get the entry as a resend once replaced)."""
        ws = self._write_sets[entry_id % self.ensemble_size]
        ens = self._ensemble
        if not self._failed:
            return [Target(i, ens[i]) for i in ws]
        return [Target(i, ens[i]) for i in ws if i not in self._failed]

    # -- responses --------------------------------------------------------------------------------------

    def on_ack(self, entry_id: int, bookie: str, status: Status | None) -> Progress:
        """An add response (``None`` = no response: timeout or connection lost)."""
        if self._error is not None:
            return _NOTHING
        if status is not None and not isinstance(status, Status):
            status = Status(status)
        if status is Status.OK:
            acked = self._pending.get(entry_id)
            idx = self._index_of.get(bookie)
            if acked is None or idx is None:
                return _NOTHING  # completed already, or a replaced bookie's late answer
            bit = 1 << idx
            if not self._write_masks[entry_id % self.ensemble_size] & bit:
                return _NOTHING
            acked |= bit
            self._pending[entry_id] = acked
            complete = acked.bit_count() >= self.ack_quorum
            if (not complete or entry_id != self._lac + 1) and not self._unsafe_out_of_order:
                return (
                    _NOTHING  # nothing can complete: this entry is short of Qa, or an earlier one is pending
                )
            return self._advance()
        if status in TERMINAL_STATUSES:
            assert status is not None
            return self.fail(error_for_status(status, entry_id=entry_id, bookie=bookie))
        self._record_failure(entry_id, bookie)
        return _NOTHING

    def on_acks(self, bookie: str, entry_ids: Iterable[int]) -> Progress:
        """OK acks from one bookie for several entries (one batch of responses): the same outcome as
        ``on_ack(entry_id, bookie, Status.OK)`` for each id in turn, with the completions reported together
        (still ascending)."""
        if self._error is not None:
            return _NOTHING
        idx = self._index_of.get(bookie)
        if idx is None:
            return _NOTHING  # a replaced bookie's late answers
        bit = 1 << idx
        pending = self._pending
        if self._every_write_set_full:
            for eid in entry_ids:
                acked = pending.get(eid)
                if acked is not None:  # else completed already
                    pending[eid] = acked | bit
        else:
            masks = self._write_masks
            e = self.ensemble_size
            for eid in entry_ids:
                acked = pending.get(eid)
                if acked is not None and masks[eid % e] & bit:  # else completed, or not in its write set
                    pending[eid] = acked | bit
        if not self._unsafe_out_of_order:
            # only the head can start an advance (it may have completed before this batch, during a freeze)
            acked = pending.get(self._lac + 1)
            if acked is None or acked.bit_count() < self.ack_quorum:
                return _NOTHING
        return self._advance()

    def on_timeout(self, entry_id: int, bookie: str) -> Progress:
        """The add of ``entry_id`` to ``bookie`` got no answer in time.

        Cancel the timer when the response arrives: for an entry already completed the pipeline cannot tell
        a late timeout from a real one and replaces the bookie (costs an ensemble change, never safety).
        """
        return self.on_ack(entry_id, bookie, None)

    def on_bookie_error(self, bookie: str) -> Progress:
        """The connection to ``bookie`` is lost: its index needs replacing."""
        idx = self._index_of.get(bookie)
        if self._error is None and idx is not None:
            self._failed.add(idx)
        return Progress()

    def waiting_on(self, bookie: str) -> tuple[int, ...]:
        """Pending entries whose write set holds ``bookie`` (in the current ensemble) without its ack yet."""
        idx = self._index_of.get(bookie)
        if self._error is not None or idx is None:
            return ()
        bit = 1 << idx
        masks, e = self._write_masks, self.ensemble_size
        return tuple(eid for eid, acked in self._pending.items() if masks[eid % e] & bit and not acked & bit)

    def _record_failure(self, entry_id: int, bookie: str) -> None:
        idx = self._index_of.get(bookie)
        if idx is None or not 0 <= entry_id < self._next_entry_id:
            return  # a replaced bookie, or an entry never sent
        if idx not in write_set(entry_id, self.ensemble_size, self.write_quorum):
            return
        acked = self._pending.get(entry_id)
        if acked is not None and acked >> idx & 1:
            return  # an ack is final; this failure report lost a race with it
        # A failure on an already completed entry still removes the bookie (BookKeeper's delayed write
        # failure): later entries in its write sets must not depend on it.
        self._failed.add(idx)

    def fail(self, error: LedgerError) -> Progress:
        """Enter the terminal error state: every pending entry fails with ``error``."""
        if self._error is not None:
            return Progress()
        self._error = error
        reported = self._reported
        failed = tuple(eid for eid in self._pending if eid not in reported)
        self._pending.clear()
        self._lengths.clear()
        reported.clear()
        self._failed.clear()
        self._changing = False
        return Progress(failed=failed, error=error)

    def _advance(self) -> Progress:
        if self._changing:
            return _NOTHING  # LAC frozen during an ensemble change (see the module docstring)
        pending = self._pending
        qa = self.ack_quorum
        old = lac = self._lac
        while (acked := pending.get(lac + 1)) is not None and acked.bit_count() >= qa:
            lac += 1
            del pending[lac]
        if lac == old and not self._unsafe_out_of_order:
            return _NOTHING
        done = range(old + 1, lac + 1)
        if lac != old:
            self._lac = lac
            lengths = self._lengths
            n = lac - old
            self._length = lengths[n - 1]
            del lengths[:n]
        reported = self._reported
        if self._unsafe_out_of_order:
            completed = [eid for eid in done if eid not in reported]
            reported.difference_update(done)
            for eid, acked in pending.items():
                if acked.bit_count() >= qa and eid not in reported:
                    reported.add(eid)
                    completed.append(eid)
            return Progress(completed=tuple(completed)) if completed else _NOTHING
        return Progress(completed=tuple(done))

    # -- ensemble change --------------------------------------------------------------------------------

    def ensemble_change_plan(self) -> EnsembleChangePlan:
        """Start (or restart, after a lost CAS race) an ensemble change. Freezes the LAC until applied."""
        if self._error is not None:
            raise self._error
        if not self._failed:
            raise IllegalStateTransitionError("no failed bookie: no ensemble change needed")
        self._changing = True
        failed = sorted(self._failed)
        return EnsembleChangePlan(
            first_entry_id=self._lac + 1,
            failed_indices=frozenset(failed),
            failed_bookies=tuple(self._ensemble[i] for i in failed),
        )

    def cancel_ensemble_change(self) -> Progress:
        """Give up the change in flight without applying it (failed indices stay failed). Unfreezes the LAC."""
        self._changing = False
        return self._advance() if self._error is None else Progress()

    def apply_new_ensemble(
        self, first_entry_id: int, bookies: list[str] | tuple[str, ...]
    ) -> EnsembleChangeResult:
        """The metadata now has a segment ``bookies`` from ``first_entry_id``; return the resends to do."""
        if self._error is not None:
            raise self._error
        if not self._changing:
            raise IllegalStateTransitionError("apply_new_ensemble without ensemble_change_plan")
        if first_entry_id != self._lac + 1:
            raise IllegalStateTransitionError(
                f"new segment must start at LAC+1={self._lac + 1}, got {first_entry_id}"
            )
        # By construction (LAC frozen since the plan): nothing below the new segment is still pending.
        assert all(eid >= first_entry_id for eid in self._pending), "pending entry below the new segment"
        old = self._ensemble
        self._set_ensemble(bookies)
        replaced = {i for i in range(self.ensemble_size) if old[i] != self._ensemble[i]}
        self._failed -= replaced
        self._changing = False
        resends: list[Resend] = []
        pending = self._pending
        for eid, acked in pending.items():
            for i in self._write_sets[eid % self.ensemble_size]:
                if i in replaced:
                    acked &= ~(1 << i)  # that bookie's copy is in a segment that no longer covers the entry
                    resends.append(Resend(eid, i, self._ensemble[i]))
            pending[eid] = acked
        return EnsembleChangeResult(resends=tuple(resends), completed=self._advance().completed)

    def _set_ensemble(self, bookies: list[str] | tuple[str, ...]) -> None:
        bookies = tuple(bookies)
        if len(bookies) != self.ensemble_size:
            raise IncorrectParameterError(
                f"ensemble of {len(bookies)} bookies, expected {self.ensemble_size}"
            )
        if len(set(bookies)) != len(bookies):
            raise IncorrectParameterError(f"ensemble has duplicate bookies: {bookies}")
        self._ensemble = bookies
        self._index_of = {b: i for i, b in enumerate(bookies)}

    def __repr__(self) -> str:
        return (
            f"WritePipeline(lac={self._lac}, next={self._next_entry_id}, pending={len(self._pending)}, "
            f"failed={sorted(self._failed)}, changing={self._changing}, error={self._error!r})"
        )
