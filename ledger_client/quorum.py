"""Quorum math, pure and table-tested (BookKeeper's DistributionSchedule / AckSet / coverage).

Notation: E = ensemble size, Qw = write quorum, Qa = ack quorum, with E >= Qw >= Qa >= 1. Bookies are named
by their *index* in an ensemble (0..E-1); mapping indices to bookie ids is the caller's business.

- :func:`write_set`: entry ``e`` is stored on bookie indices ``(e + i) % E`` for ``i`` in ``0..Qw-1``.
- :class:`AckSet`: the acks of one entry; complete at >= Qa acks of its write set, impossible once more than
  Qw - Qa of its write set failed.
- :class:`CoverageSet`: answers to a request sent to every bookie of an ensemble (fencing read, read LAC).
  Covered when no write set can still hold Qa bookies that have not given a definite answer — i.e. every one
  of the E write sets has >= Qw - Qa + 1 definite answers. After a fencing read reaches coverage no entry
  can gain an ack quorum from unfenced bookies alone.
"""

from __future__ import annotations

from typing import Final, Literal

from bookie.protocol import Status

from .errors import IncorrectParameterError

__all__ = [
    "DEFINITE_ANSWERS",
    "AckSet",
    "Answer",
    "CoverageSet",
    "answer_for_status",
    "unrecoverable_threshold",
    "validate_quorum",
    "write_set",
]


def validate_quorum(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    """Raise :class:`IncorrectParameterError` unless E >= Qw >= Qa >= 1."""
    if not (ensemble_size >= write_quorum >= ack_quorum >= 1):
        raise IncorrectParameterError(
            f"need ensemble_size >= write_quorum >= ack_quorum >= 1, "
            f"got E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}"
        )


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """Bookie indices storing ``entry_id``: ``(entry_id + i) % E`` for ``i`` in ``0..Qw-1`` (in that order)."""
    if entry_id < 0:
        raise IncorrectParameterError(f"entry id must be >= 0, got {entry_id}")
    if not (ensemble_size >= write_quorum >= 1):
        raise IncorrectParameterError(f"need E >= Qw >= 1, got E={ensemble_size} Qw={write_quorum}")
    first = entry_id % ensemble_size
    return tuple((first + i) % ensemble_size for i in range(write_quorum))


def unrecoverable_threshold(write_quorum: int, ack_quorum: int) -> int:
    """Answers needed to be sure: Qw - Qa + 1.

    With that many NO_ENTRY/NO_LEDGER answers (from fenced bookies) an entry can be on at most Qa - 1 bookies
    of its write set, so it was never acknowledged and never will be. With that many definite answers in every
    write set, a fencing read has coverage.
    """
    return write_quorum - ack_quorum + 1


class AckSet:
    """The add responses of one entry, by bookie index.

    An ack is final (the bookie fsynced the entry): a later failure report for the same index (a timeout that
    fired after the ack, say) is ignored. A failure followed by an ack counts as an ack.
    """

    __slots__ = ("entry_id", "ensemble_size", "write_quorum", "ack_quorum", "write_set", "_acked", "_failed")

    def __init__(
        self,
        entry_id: int,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        *,
        precomputed_write_set: tuple[int, ...] | None = None,
    ) -> None:
        if precomputed_write_set is None:  # callers passing one validated the quorum already (hot path)
            validate_quorum(ensemble_size, write_quorum, ack_quorum)
            precomputed_write_set = write_set(entry_id, ensemble_size, write_quorum)
        self.entry_id = entry_id
        self.ensemble_size = ensemble_size
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.write_set: tuple[int, ...] = precomputed_write_set
        self._acked: set[int] = set()
        self._failed: set[int] = set()

    def _check(self, index: int) -> None:
        # A response from a bookie outside the write set is a bug in the caller's index mapping.
        if index not in self.write_set:
            raise ValueError(
                f"bookie index {index} is not in the write set {self.write_set} of entry {self.entry_id}"
            )

    def ack(self, index: int) -> bool:
        """Record an ack; return whether the entry is now complete."""
        self._check(index)
        self._acked.add(index)
        self._failed.discard(index)
        return self.complete

    def fail(self, index: int) -> bool:
        """Record a failure (ignored if that bookie already acked); return whether the quorum is impossible."""
        self._check(index)
        if index not in self._acked:
            self._failed.add(index)
        return self.impossible

    def forget(self, index: int) -> None:
        """Drop everything known about ``index`` (its bookie was replaced by an ensemble change)."""
        self._check(index)
        self._acked.discard(index)
        self._failed.discard(index)

    def has_acked(self, index: int) -> bool:
        return index in self._acked

    @property
    def acked(self) -> frozenset[int]:
        return frozenset(self._acked)

    @property
    def failed(self) -> frozenset[int]:
        return frozenset(self._failed)

    @property
    def complete(self) -> bool:
        return len(self._acked) >= self.ack_quorum

    @property
    def impossible(self) -> bool:
        """More than Qw - Qa of the write set failed: Qa acks can no longer be reached."""
        return len(self._failed) > self.write_quorum - self.ack_quorum

    def __repr__(self) -> str:
        return f"AckSet(entry={self.entry_id}, acked={sorted(self._acked)}, failed={sorted(self._failed)})"


Answer = Literal["ok", "no_entry", "no_ledger", "fenced", "error"]

#: Answers that say something definite about what a bookie holds (it processed the request). A fenced answer
#: means the bookie is fenced, which is what a fencing read wants. Anything else — ``"error"``, a timeout, an
#: unknown kind — says nothing and never counts toward coverage.
DEFINITE_ANSWERS: Final = frozenset({"ok", "no_entry", "no_ledger", "fenced"})


def answer_for_status(status: Status | None) -> Answer:
    """Map a bookie status (``None`` = no response: timeout or connection lost) to a coverage answer."""
    if status is None:
        return "error"
    return _ANSWER_FOR_STATUS.get(Status(status), "error")


_ANSWER_FOR_STATUS: Final[dict[Status, Answer]] = {
    Status.OK: "ok",
    Status.NO_ENTRY: "no_entry",
    Status.NO_LEDGER: "no_ledger",
    Status.FENCED: "fenced",
}


class CoverageSet:
    """Answers from the bookies of one ensemble to a request sent to all of them.

    ``covered()`` once, for every write set (E of them, one per start index), the bookies without a definite
    answer number fewer than Qa. ``impossible()`` once some write set has Qa bookies that answered with an
    error: each bookie is asked once, so coverage can then never be reached in this round.

    ``_unsafe_count_all_answers=True`` counts errors as answers. It is WRONG (a bookie that failed to fence
    can still ack the old writer's adds) and exists only so the correctness harness can prove it catches the
    resulting violation. Never set it outside tests.
    """

    __slots__ = ("ensemble_size", "write_quorum", "ack_quorum", "_answers", "_unsafe", "_write_sets")

    def __init__(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        *,
        _unsafe_count_all_answers: bool = False,
    ) -> None:
        validate_quorum(ensemble_size, write_quorum, ack_quorum)
        self.ensemble_size = ensemble_size
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self._answers: dict[int, str] = {}
        self._unsafe = _unsafe_count_all_answers
        self._write_sets = [write_set(s, ensemble_size, write_quorum) for s in range(ensemble_size)]

    def add_response(self, bookie_index: int, kind: str) -> None:
        """Record the answer of one bookie. A definite answer is final; an error may be followed by one."""
        if not 0 <= bookie_index < self.ensemble_size:
            raise ValueError(f"bookie index {bookie_index} outside ensemble of {self.ensemble_size}")
        if self._answers.get(bookie_index) in DEFINITE_ANSWERS:
            return
        self._answers[bookie_index] = kind if kind in DEFINITE_ANSWERS else "error"

    def answer(self, bookie_index: int) -> str | None:
        return self._answers.get(bookie_index)

    def _counts(self, index: int) -> bool:
        kind = self._answers.get(index)
        return kind is not None and (self._unsafe or kind in DEFINITE_ANSWERS)

    @property
    def answered(self) -> frozenset[int]:
        """Indices whose answer counts toward coverage."""
        return frozenset(i for i in self._answers if self._counts(i))

    @property
    def unanswered(self) -> frozenset[int]:
        """Indices that have not answered at all (requests still in flight)."""
        return frozenset(i for i in range(self.ensemble_size) if i not in self._answers)

    def covered(self) -> bool:
        qa = self.ack_quorum
        return all(sum(1 for i in ws if not self._counts(i)) < qa for ws in self._write_sets)

    def impossible(self) -> bool:
        if self._unsafe:
            return False  # every answer counts: waiting for the rest can always cover
        qa = self.ack_quorum
        return any(sum(1 for i in ws if self._answers.get(i) == "error") >= qa for ws in self._write_sets)

    def __repr__(self) -> str:
        return f"CoverageSet(E={self.ensemble_size}, Qw={self.write_quorum}, Qa={self.ack_quorum}, {self._answers})"
