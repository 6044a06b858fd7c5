"""Ledger recovery (fence, read the tail, write it back, close): a pure state machine.

docs/architecture.md §8, with BookKeeper's fixes for #2614 (recovery reads fence) and #2615 (the recovery
start is never below the last segment's first entry - 1). The I/O layer feeds events and executes the commands
each call returns (h11 style; no sockets, clocks or asyncio here)::

    metadata: recovery_metadata_decision(state) -> "mark_in_recovery" (CAS OPEN->IN_RECOVERY, then start)
              | "proceed" | "already_closed" (nothing to do)
    rec = LedgerRecovery(ensemble_size=E, write_quorum=Qw, ack_quorum=Qa, ensembles=metadata.ensembles)
    cmds = rec.start()
    loop: execute cmds; feed each answer to the matching on_* method, which returns more cmds
          until a Close (CAS IN_RECOVERY->CLOSED, see recovery_close_decision) or RecoveryFailed (retry later,
          from a fresh LedgerRecovery; the ledger stays IN_RECOVERY and fences are permanent).

Commands and the events that answer them::

    FenceRead(bookie_index, bookie)          READ_ENTRY(-1, FENCE)   -> on_fence_response(index, status, lac)
    RecoveryRead(entry_id, indices, fence)   READ_ENTRY(e[, FENCE])  -> on_read_response(e, index, status, entry, valid)
                                             to each bookie listed
    LengthRead(entry_id, bookies)            READ_ENTRY(e)           -> on_length_response(e, bookie, status, entry, valid)
    RecoveryAdd(entry_id, index, bookie, entry) ADD_ENTRY(RECOVERY_ADD) -> on_recovery_add_response(e, bookie, status)
    ChangeEnsemble(plan, ensemble)           pick replacements for the failed indices (placement); do NOT
                                             write metadata -> on_ensemble_changed(first, bookies)
                                             or on_ensemble_change_failed(error)
    Close(last_entry_id, length, ensembles)  CAS IN_RECOVERY->CLOSED writing these three fields together
    RecoveryFailed(error)                    give up this attempt

``status`` is a :class:`bookie.protocol.Status`, or ``None`` for no answer (timeout, connection lost). For
reads, ``valid=False`` says the I/O layer found the entry's digest wrong: such an answer counts as an error.

Decisions:

1. Fencing: a fencing read to every bookie of the last segment; done at coverage (every write set has
   >= Qw - Qa + 1 definite answers: OK, NO_ENTRY, NO_LEDGER or FENCED). ``start`` = max(highest LAC reported,
   first entry of the last segment - 1). If coverage has become impossible: RecoveryFailed.
2. Reading from start + 1, up to ``read_window`` entries in flight (reads and write-backs together): an entry
   is *recoverable* on its first valid OK copy, *unrecoverable* on >= Qw - Qa + 1 NO_ENTRY/NO_LEDGER answers,
   and the attempt fails when its whole write set answered without deciding. Decisions are consumed in entry
   order: the ledger ends just before the FIRST unrecoverable entry, whatever was found after it.
   Every recovery read carries FENCE (#2614): a bookie whose fencing read was lost would otherwise answer
   NO_ENTRY and *then* accept the old writer's add, turning an entry declared unrecoverable into an acked one.
3. Write-back: each recovered entry, in order, through a :class:`~ledger_client.pending.WritePipeline` with
   RECOVERY_ADD to its write set until Qa acks; bookie failures there cause ensemble changes like a writer's,
   except that the new segment is kept *locally* and reaches the metadata only with the close CAS (as
   BookKeeper does in recovery). Writing it earlier would be unsafe: a concurrent recoverer reading that
   metadata would read entries >= the new segment's start from a replacement that does not hold them yet,
   count its NO_ENTRY, and could cut an acknowledged entry whose other copy was on the replaced bookie.
   The bytes written back are *exactly the bytes read*. BookKeeper re-encodes recovered entries (new digest,
   the recovering handle's LAC); we do not, because (a) every replica of an entry stays byte-identical, so
   readers get the same bytes from any bookie (§10.3); (b) the original header's LAC is a valid, if
   conservative, LAC and its cumulative length is already right, since recovered entries are contiguous;
   (c) the recovery core needs no digest key. The I/O layer must not rebuild them.
4. Close(last_entry_id, length, ensembles): once the end is known and every recovered entry has Qa
   write-back acks. ``ensembles`` is the full segment list to write (the original one plus any write-back
   ensemble change; a change starting at the last segment's own first entry replaces that segment).
   ``length`` is the cumulative length in the header of entry ``last_entry_id`` (the header's length IS the
   ledger length after that entry): the last recovered entry if any; otherwise entry ``start`` itself,
   fetched by a LengthRead from its covering segment (for start = first of last segment - 1 that is the
   previous segment); 0 when the ledger is empty.

Reads always go to the *original* last segment (the one fenced), even after a write-back ensemble change:
a replacement bookie holds nothing and is not fenced, so its NO_ENTRY would prove nothing.

Test-only switches (they make recovery WRONG; for the correctness harness): ``fence_on_recovery_reads=False``
(reproduces #2614) and ``_unsafe_count_all_answers=True`` (fencing coverage counts errors).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

from bookie.entryformat import peek_header
from bookie.protocol import Status
from zk.ledger_metadata import Ensemble, LedgerMetadata, LedgerState

from .errors import (
    IllegalStateTransitionError,
    IncorrectParameterError,
    LedgerError,
    LedgerRecoveryError,
)
from .pending import EnsembleChangePlan, Progress, WritePipeline
from .quorum import (
    DEFINITE_ANSWERS,
    CoverageSet,
    answer_for_status,
    unrecoverable_threshold,
    validate_quorum,
    write_set,
)

__all__ = [
    "DEFAULT_RECOVERY_READ_WINDOW",
    "ChangeEnsemble",
    "Close",
    "CloseDecision",
    "Command",
    "FenceRead",
    "LedgerRecovery",
    "LengthRead",
    "Phase",
    "RecoveryAdd",
    "RecoveryFailed",
    "RecoveryRead",
    "Segment",
    "SegmentLike",
    "recovery_close_decision",
    "recovery_close_transition",
    "recovery_metadata_decision",
    "recovery_start_transition",
]

DEFAULT_RECOVERY_READ_WINDOW = 16  # entries read or written back at once


class SegmentLike(Protocol):
    """Anything with ``first_entry_id`` and ``bookies`` (e.g. the metadata's Ensemble records)."""

    @property
    def first_entry_id(self) -> int: ...

    @property
    def bookies(self) -> Sequence[str]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    first_entry_id: int
    bookies: tuple[str, ...]


# -- commands -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class FenceRead:
    """READ_ENTRY(entry -1, flags FENCE) to one bookie of the last segment."""

    bookie_index: int
    bookie: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryRead:
    """READ_ENTRY(entry_id) to each listed bookie of the last segment, with FENCE when ``fence``."""

    entry_id: int
    bookie_indices: tuple[int, ...]
    bookies: tuple[str, ...]  # bookies[k] is at bookie_indices[k]
    fence: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthRead:
    """Plain READ_ENTRY(entry_id) to each listed bookie (a committed entry; only its header length is used)."""

    entry_id: int
    bookies: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryAdd:
    """ADD_ENTRY(entry_id, entry, flags RECOVERY_ADD) to one bookie. ``entry`` is sent as is."""

    entry_id: int
    bookie_index: int
    bookie: str
    entry: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeEnsemble:
    """Choose replacements for ``plan.failed_indices`` of ``ensemble`` (entries from ``plan.first_entry_id``
    on), excluding every bookie of ``ensemble``; answer with ``on_ensemble_changed``. No metadata write."""

    plan: EnsembleChangePlan
    ensemble: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Close:
    """CAS the metadata IN_RECOVERY -> CLOSED with these values (see :func:`recovery_close_decision`)."""

    last_entry_id: int
    length: int
    ensembles: tuple[Segment, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryFailed:
    error: LedgerError


Command = FenceRead | RecoveryRead | LengthRead | RecoveryAdd | ChangeEnsemble | Close | RecoveryFailed


class Phase(enum.Enum):
    NEW = "NEW"
    FENCING = "FENCING"
    READING = "READING"  # reading the tail (write-backs run alongside)
    FINISHING = "FINISHING"  # end known; waiting for write-backs and/or the length
    DONE = "DONE"  # Close emitted
    FAILED = "FAILED"  # RecoveryFailed emitted


class _Read:
    __slots__ = ("entry_id", "indices", "answered", "no_entry", "data", "decision")

    def __init__(self, entry_id: int, indices: tuple[int, ...]) -> None:
        self.entry_id = entry_id
        self.indices = indices
        self.answered: set[int] = set()
        self.no_entry: set[int] = set()
        self.data: bytes | None = None
        self.decision: Literal["recoverable", "unrecoverable", "failed"] | None = None


def _header_matches(entry: bytes, entry_id: int) -> int | None:
    """The cumulative length in ``entry``'s header, or None if it is not a header of ``entry_id``."""
    try:
        header = peek_header(entry)
    except ValueError:
        return None
    return header.length if header.entry_id == entry_id else None


class LedgerRecovery:
    """One recovery attempt of one ledger (see the module docstring)."""

    def __init__(
        self,
        *,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        ensembles: Sequence[SegmentLike],
        read_window: int = DEFAULT_RECOVERY_READ_WINDOW,
        fence_on_recovery_reads: bool = True,
        _unsafe_count_all_answers: bool = False,
    ) -> None:
        validate_quorum(ensemble_size, write_quorum, ack_quorum)
        if not ensembles:
            raise IncorrectParameterError("a ledger has at least one segment")
        firsts = [s.first_entry_id for s in ensembles]
        if firsts[0] != 0 or any(b <= a for a, b in zip(firsts, firsts[1:], strict=False)):
            raise IncorrectParameterError(f"segment first entry ids must start at 0 and increase: {firsts}")
        for s in ensembles:
            if len(s.bookies) != ensemble_size or len(set(s.bookies)) != ensemble_size:
                raise IncorrectParameterError(
                    f"segment {list(s.bookies)} is not {ensemble_size} distinct bookies"
                )
        if read_window < 1:
            raise IncorrectParameterError(f"read_window must be >= 1, got {read_window}")
        self.ensemble_size = ensemble_size
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.read_window = read_window
        self.fence_on_recovery_reads = fence_on_recovery_reads
        self._segments = [
            Segment(first_entry_id=s.first_entry_id, bookies=tuple(s.bookies)) for s in ensembles
        ]
        self._last = self._segments[-1]
        self._coverage = CoverageSet(
            ensemble_size, write_quorum, ack_quorum, _unsafe_count_all_answers=_unsafe_count_all_answers
        )
        self._threshold = unrecoverable_threshold(write_quorum, ack_quorum)
        self._phase = Phase.NEW
        self._max_lac = -1
        self._start: int | None = None
        self._pipeline: WritePipeline | None = None
        self._reads: dict[int, _Read] = {}
        self._next_read = 0
        self._frontier = 0  # the next entry id whose decision is consumed (in order)
        self._stop_before: int | None = None  # lowest entry id found unrecoverable: never read at or past it
        self._data: dict[int, bytes] = {}  # recovered entries not yet written back to Qa (for resends)
        self._last_entry_id: int | None = None
        self._length: int | None = None
        self._length_read: _Read | None = None
        self._length_bookies: tuple[str, ...] = ()
        self._error: LedgerError | None = None
        self._closing_segments: list[Segment] = list(self._segments)

    # -- introspection ----------------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def start_entry_id(self) -> int | None:
        """max(highest LAC, first entry of the last segment - 1), once fencing reached coverage."""
        return self._start

    @property
    def last_entry_id(self) -> int | None:
        """The ledger's last entry id, once the first unrecoverable entry was found."""
        return self._last_entry_id

    @property
    def length(self) -> int | None:
        return self._length

    @property
    def error(self) -> LedgerError | None:
        return self._error

    @property
    def ensemble(self) -> tuple[str, ...]:
        """The current write-back ensemble (the last segment, as changed by write-back ensemble changes)."""
        return self._pipeline.ensemble if self._pipeline is not None else self._last.bookies

    @property
    def ensembles(self) -> tuple[Segment, ...]:
        """The segment list as the close will write it (original plus local write-back changes)."""
        return tuple(self._closing_segments)

    @property
    def written_back(self) -> int:
        """Highest entry id written back to Qa (or the start)."""
        return self._pipeline.lac if self._pipeline is not None else -1

    # -- phase 1: fencing -------------------------------------------------------------------------------

    def start(self) -> list[Command]:
        if self._phase is not Phase.NEW:
            raise IllegalStateTransitionError(f"start() in phase {self._phase.name}")
        self._phase = Phase.FENCING
        return [FenceRead(bookie_index=i, bookie=b) for i, b in enumerate(self._last.bookies)]

    def on_fence_response(self, bookie_index: int, status: Status | None, lac: int = -1) -> list[Command]:
        """Answer to a FenceRead. OK/NO_ENTRY carry the bookie's LAC; NO_LEDGER means LAC -1."""
        if self._phase is not Phase.FENCING:
            return []  # late answers after coverage carry nothing we still need
        answer = answer_for_status(status)
        if self._coverage.answer(bookie_index) not in DEFINITE_ANSWERS and answer in ("ok", "no_entry"):
            self._max_lac = max(self._max_lac, lac)
        self._coverage.add_response(bookie_index, answer)
        if self._coverage.covered():
            # #2615: entries before the last segment's first entry were all confirmed when that segment was
            # created, even if no bookie of the last segment ever saw a LAC that high.
            self._start = max(self._max_lac, self._last.first_entry_id - 1)
            self._phase = Phase.READING
            self._pipeline = WritePipeline(
                ensemble_size=self.ensemble_size,
                write_quorum=self.write_quorum,
                ack_quorum=self.ack_quorum,
                ensemble=self._last.bookies,
                last_add_confirmed=self._start,
                outstanding_adds_max=self.read_window,
            )
            self._next_read = self._frontier = self._start + 1
            return self._issue_reads()
        if self._coverage.impossible():
            return self._fail(f"fencing cannot reach coverage: answers {self._describe_coverage()}")
        return []

    def _describe_coverage(self) -> dict[int, str | None]:
        return {i: self._coverage.answer(i) for i in range(self.ensemble_size)}

    # -- phase 2: reading -------------------------------------------------------------------------------

    def _issue_reads(self) -> list[Command]:
        assert self._pipeline is not None
        out: list[Command] = []
        while (
            self._phase is Phase.READING
            and (self._stop_before is None or self._next_read < self._stop_before)
            and len(self._reads) + self._pipeline.outstanding < self.read_window
        ):
            eid = self._next_read
            self._next_read += 1
            ws = write_set(eid, self.ensemble_size, self.write_quorum)
            self._reads[eid] = _Read(eid, ws)
            out.append(
                RecoveryRead(
                    entry_id=eid,
                    bookie_indices=ws,
                    bookies=tuple(self._last.bookies[i] for i in ws),
                    fence=self.fence_on_recovery_reads,
                )
            )
        return out

    def on_read_response(
        self, entry_id: int, bookie_index: int, status: Status | None, entry: bytes = b"", valid: bool = True
    ) -> list[Command]:
        """Answer of one bookie to a RecoveryRead. ``valid=False``: the digest check failed (an error)."""
        if self._phase is not Phase.READING:
            return []
        rd = self._reads.get(entry_id)
        if (
            rd is None
            or rd.decision is not None
            or bookie_index not in rd.indices
            or bookie_index in rd.answered
        ):
            return []  # decided already, never asked, or a duplicate: the first answer of a bookie stands
        rd.answered.add(bookie_index)
        st = Status(status) if status is not None else None
        if st is Status.OK and valid and _header_matches(entry, entry_id) is not None:
            rd.decision = "recoverable"
            rd.data = bytes(entry)
        elif st in (Status.NO_ENTRY, Status.NO_LEDGER):
            rd.no_entry.add(bookie_index)
            if len(rd.no_entry) >= self._threshold:
                rd.decision = "unrecoverable"
                if self._stop_before is None or entry_id < self._stop_before:
                    self._stop_before = entry_id
        if rd.decision is None and len(rd.answered) == len(rd.indices):
            rd.decision = "failed"
        return self._consume()

    def _consume(self) -> list[Command]:
        """Consume decisions in entry order from the frontier; write back recovered entries; read on."""
        assert self._pipeline is not None
        out: list[Command] = []
        while self._phase is Phase.READING:
            rd = self._reads.get(self._frontier)
            if rd is None or rd.decision is None:
                break
            if rd.decision == "failed":
                return out + self._fail(f"entry {rd.entry_id}: no decision from its write set {rd.indices}")
            if rd.decision == "unrecoverable":
                self._end(rd.entry_id - 1)
                break
            assert rd.data is not None
            del self._reads[rd.entry_id]
            self._frontier += 1
            add = self._pipeline.next_entry(0)
            assert add.entry_id == rd.entry_id, (add.entry_id, rd.entry_id)
            self._data[rd.entry_id] = rd.data
            length = _header_matches(rd.data, rd.entry_id)
            assert length is not None
            self._length = length  # the ledger length after the last recovered entry so far
            for t in self._pipeline.targets(rd.entry_id):
                out.append(
                    RecoveryAdd(
                        entry_id=rd.entry_id, bookie_index=t.bookie_index, bookie=t.bookie, entry=rd.data
                    )
                )
        out += self._issue_reads()
        return out + self._maybe_finish()

    def _end(self, last_entry_id: int) -> None:
        assert self._start is not None
        self._last_entry_id = last_entry_id
        self._reads.clear()  # whatever was found past the first unrecoverable entry is not in the ledger
        self._phase = Phase.FINISHING
        if last_entry_id == self._start:
            self._length = 0 if last_entry_id < 0 else None  # None: a LengthRead will fetch it

    # -- the length of a ledger that gained no entry in recovery ------------------------------------------

    def _length_read_command(self) -> LengthRead:
        eid = self._last_entry_id
        assert eid is not None and eid >= 0
        seg = next(s for s in reversed(self._segments) if s.first_entry_id <= eid)
        ws = write_set(eid, self.ensemble_size, self.write_quorum)
        self._length_bookies = tuple(seg.bookies[i] for i in ws)
        self._length_read = _Read(eid, ws)
        return LengthRead(entry_id=eid, bookies=self._length_bookies)

    def on_length_response(
        self, entry_id: int, bookie: str, status: Status | None, entry: bytes = b"", valid: bool = True
    ) -> list[Command]:
        rd = self._length_read
        if (
            self._phase is not Phase.FINISHING
            or rd is None
            or entry_id != rd.entry_id
            or self._length is not None
        ):
            return []
        if bookie not in self._length_bookies:
            return []
        idx = rd.indices[self._length_bookies.index(bookie)]
        if idx in rd.answered:
            return []
        rd.answered.add(idx)
        st = Status(status) if status is not None else None
        length = _header_matches(entry, entry_id) if st is Status.OK and valid else None
        if length is not None:
            self._length = length
            return self._maybe_finish()
        if len(rd.answered) == len(rd.indices):
            # A confirmed entry that no bookie of its write set returns: retry later (or data was lost).
            return self._fail(
                f"entry {entry_id} (the recovery start) is unreadable on {self._length_bookies}"
            )
        return []

    # -- phase 3: write-back ----------------------------------------------------------------------------

    def on_recovery_add_response(self, entry_id: int, bookie: str, status: Status | None) -> list[Command]:
        """Answer to a RecoveryAdd (``None`` = timeout or connection lost)."""
        if self._phase not in (Phase.READING, Phase.FINISHING) or self._pipeline is None:
            return []
        return self._after_write_progress(self._pipeline.on_ack(entry_id, bookie, status))

    def on_recovery_add_timeout(self, entry_id: int, bookie: str) -> list[Command]:
        return self.on_recovery_add_response(entry_id, bookie, None)

    def on_ensemble_changed(self, first_entry_id: int, bookies: Sequence[str]) -> list[Command]:
        """The write-back segment from ``first_entry_id`` is now ``bookies`` in the metadata."""
        if self._phase not in (Phase.READING, Phase.FINISHING) or self._pipeline is None:
            return []
        result = self._pipeline.apply_new_ensemble(first_entry_id, tuple(bookies))
        new = Segment(first_entry_id=first_entry_id, bookies=tuple(bookies))
        if self._closing_segments[-1].first_entry_id == first_entry_id:
            self._closing_segments[-1] = new  # nothing was written to the segment it replaces
        else:
            assert self._closing_segments[-1].first_entry_id < first_entry_id
            self._closing_segments.append(new)
        out: list[Command] = [
            RecoveryAdd(
                entry_id=r.entry_id,
                bookie_index=r.bookie_index,
                bookie=r.bookie,
                entry=self._data[r.entry_id],
            )
            for r in result.resends
        ]
        return out + self._after_write_progress(Progress(completed=result.completed))

    def on_ensemble_change_failed(self, error: LedgerError) -> list[Command]:
        if self._phase not in (Phase.READING, Phase.FINISHING):
            return []
        return self._fail(f"write-back ensemble change failed: {error}", cause=error)

    def _after_write_progress(self, progress: Progress) -> list[Command]:
        assert self._pipeline is not None
        if progress.error is not None:
            return self._fail(f"write-back failed: {progress.error}", cause=progress.error)
        for eid in progress.completed:
            self._data.pop(eid, None)
        out: list[Command] = []
        if self._pipeline.needs_ensemble_change and not self._pipeline.changing_ensemble:
            plan = self._pipeline.ensemble_change_plan()
            out.append(ChangeEnsemble(plan=plan, ensemble=self._pipeline.ensemble))
        if self._phase is Phase.READING:
            out += self._issue_reads()  # write-backs finishing free window space
        return out + self._maybe_finish()

    # -- phase 4: close ---------------------------------------------------------------------------------

    def _maybe_finish(self) -> list[Command]:
        if self._phase is not Phase.FINISHING:
            return []
        assert self._pipeline is not None and self._last_entry_id is not None
        if self._length is None:
            if self._length_read is None:
                return [self._length_read_command()]
            return []
        if self._pipeline.lac != self._last_entry_id:
            return []  # write-backs still short of Qa
        assert not self._data and self._pipeline.outstanding == 0
        self._phase = Phase.DONE
        return [Close(last_entry_id=self._last_entry_id, length=self._length, ensembles=self.ensembles)]

    def _fail(self, why: str, cause: LedgerError | None = None) -> list[Command]:
        error = LedgerRecoveryError(why)
        if cause is not None:
            error.__cause__ = cause
        self._error = error
        self._phase = Phase.FAILED
        self._reads.clear()
        self._data.clear()
        return [RecoveryFailed(error=error)]


# -- metadata decisions (pure) ------------------------------------------------------------------------------

RecoveryStart = Literal["mark_in_recovery", "proceed", "already_closed"]


def recovery_metadata_decision(state: LedgerState | str) -> RecoveryStart:
    """What a recovering opener does with the ledger metadata it just read.

    - ``OPEN`` → ``"mark_in_recovery"``: CAS OPEN→IN_RECOVERY (on a version conflict re-read and ask again),
      then run :class:`LedgerRecovery`.
    - ``IN_RECOVERY`` → ``"proceed"``: another recoverer (or an earlier attempt) started; recover anyway — the
      close CAS makes concurrent recoverers converge.
    - ``CLOSED`` → ``"already_closed"``: use the metadata's last_entry_id; nothing to recover.
    """
    try:
        found = LedgerState(state)
    except ValueError:
        raise IncorrectParameterError(f"unknown ledger state {state!r}") from None
    if found is LedgerState.OPEN:
        return "mark_in_recovery"
    if found is LedgerState.IN_RECOVERY:
        return "proceed"
    return "already_closed"


class CloseDecision(NamedTuple):
    action: Literal[
        "write", "adopt"
    ]  # write: CAS IN_RECOVERY->CLOSED with these values; adopt: already closed
    last_entry_id: int
    length: int


def recovery_close_decision(
    *,
    current_state: LedgerState | str,
    current_last_entry_id: int,
    current_length: int,
    last_entry_id: int,
    length: int,
) -> CloseDecision:
    """How to close after recovery, given the metadata as (re-)read.

    IN_RECOVERY → write ours (CAS on the version just read; on a conflict re-read and decide again).
    CLOSED → another recoverer won the first CAS: adopt its last_entry_id and length, so all converge
    (§10.6). OPEN cannot happen (metadata never goes back to OPEN): LedgerRecoveryError.
    """
    if current_state == LedgerState.IN_RECOVERY:
        return CloseDecision("write", last_entry_id, length)
    if current_state == LedgerState.CLOSED:
        return CloseDecision("adopt", current_last_entry_id, current_length)
    raise LedgerRecoveryError(f"ledger is {current_state} while closing after recovery")


def recovery_start_transition(md: LedgerMetadata) -> tuple[LedgerMetadata | None, RecoveryStart]:
    """The recovering opener's first metadata transition (:func:`recovery_metadata_decision`): ``md`` marked
    IN_RECOVERY while it is OPEN, else nothing to write."""
    decision = recovery_metadata_decision(md.state)
    if decision == "mark_in_recovery":
        return md.with_state(LedgerState.IN_RECOVERY), decision
    return None, decision


def recovery_close_transition(
    md: LedgerMetadata, close: Close
) -> tuple[LedgerMetadata | None, CloseDecision]:
    """Recovery's close as a metadata transition (:func:`recovery_close_decision`): while IN_RECOVERY, ``md``
    CLOSED with the ``Close``'s last entry, length and segments (its write-back ensemble changes); once CLOSED by
    another recoverer, nothing to write (adopt its close). Raises ``LedgerRecoveryError`` on OPEN."""
    d = recovery_close_decision(
        current_state=md.state,
        current_last_entry_id=md.last_entry_id,
        current_length=md.length,
        last_entry_id=close.last_entry_id,
        length=close.length,
    )
    if d.action == "adopt":
        return None, d
    new = md.replace(
        state=LedgerState.CLOSED,
        last_entry_id=close.last_entry_id,
        length=close.length,
        ensembles=tuple(Ensemble(s.first_entry_id, tuple(s.bookies)) for s in close.ensembles),
    )
    return new, d
