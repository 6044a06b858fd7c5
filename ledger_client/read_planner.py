"""Sequential reads as batched READ_RANGE requests: the pure decisions (which entries to ask which bookie for,
what to do with a short or failed answer), no I/O. ``LedgerHandle._read_range`` drives it.

A READ_RANGE to bookie ``j`` returns the *consecutive* entries it stores from ``first`` on, stopping at the first
one it does not hold (bookie/core.py, docs/protocol.md). Bookie ``j`` of an ensemble stores entry ``e`` iff
``(j - e) mod E < Qw``, so from ``lo`` it holds a run of ``((j - lo) mod E) + 1`` entries (unbounded when
``Qw == E``). A batch is therefore a range that its bookie holds whole, inside one ensemble:

* ``Qw == E``: batches of ``batch_entries``, handed to the ensemble's bookies in turn;
* ``Qw < E``: the longest run from ``lo`` is ``Qw`` entries, on bookie ``(lo + Qw - 1) mod E`` — successive
  batches land on successive bookies, so each serves its share.

An answer of ``n`` verified entries settles ``lo .. lo+n-1``. The rest of the batch is asked again: from the same
bookie when the answer was merely short (the byte limit), otherwise from the next replica of its first entry not
yet tried (failover), the batch cut to what that bookie holds and the remainder planned anew. When every replica
of an entry failed, the read of that entry is :class:`Unreadable` (all said "no such entry": ``missing``).
At most ``window`` batches are in flight, and none starts more than ``window * batch_entries`` entries past
what the reader has consumed (read-ahead, not read-everything).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field


class Outcome(enum.Enum):
    SHORT = "short"  # fewer entries than asked, and no reason to think the next one is not there
    MISSING = "missing"  # NO_ENTRY / NO_LEDGER for the first entry not delivered
    FAILED = "failed"  # unreachable, timed out, an error status, or a digest mismatch


@dataclass(frozen=True, slots=True)
class Segment:
    """The bookies of one ensemble, storing entries ``first`` .. ``last`` (inclusive)."""

    first: int
    last: int
    bookies: tuple[str, ...]


@dataclass(slots=True, eq=False)
class Batch:
    """Ask ``bookie`` (index ``index`` in ``segment``) for entries ``first`` .. ``last``."""

    first: int
    last: int
    segment: Segment
    index: int
    # bookie indices that already failed entry ``first`` (and how many of them said it does not exist), with why
    tried: frozenset[int] = frozenset()
    missing: int = 0
    errors: tuple[str, ...] = ()

    @property
    def bookie(self) -> str:
        return self.segment.bookies[self.index]


@dataclass(frozen=True, slots=True)
class Unreadable:
    """No replica returned ``entry_id``: ``missing`` when every one of them said it does not have it."""

    entry_id: int
    missing: bool
    errors: tuple[str, ...]


@dataclass(slots=True)
class Settled:
    """What an answer decided: entries delivered, batches to send now, or an entry nobody could return."""

    retries: list[Batch] = field(default_factory=list)
    unreadable: Unreadable | None = None


def segments(ensembles: Sequence[tuple[int, Sequence[str]]], first: int, last: int) -> list[Segment]:
    """The ensembles (``(first_entry_id, bookies)``, ascending) cut to ``first .. last``."""
    out = []
    for k, (start, bookies) in enumerate(ensembles):
        end = ensembles[k + 1][0] - 1 if k + 1 < len(ensembles) else last
        lo, hi = max(start, first), min(end, last)
        if lo <= hi:
            out.append(Segment(lo, hi, tuple(bookies)))
    return out


class ReadPlanner:
    def __init__(
        self,
        first: int,
        last: int,
        ensembles: Sequence[tuple[int, Sequence[str]]],
        *,
        ensemble_size: int,
        write_quorum: int,
        batch_entries: int,
        window: int,
    ) -> None:
        if batch_entries < 1 or window < 1:
            raise ValueError("batch_entries and window must be >= 1")
        self.E = ensemble_size
        self.Qw = write_quorum
        self.batch_entries = batch_entries
        self.window = window
        self._segments = deque(segments(ensembles, first, last))
        self._next = first  # first entry not yet planned
        self._turn = 0  # Qw == E: the bookie of the next batch, in turn
        self.in_flight = 0
        self.consumed = first  # the reader has taken every entry before this one

    # -- planning -----------------------------------------------------------------------------------------
    def holds_from(self, index: int, entry_id: int) -> int:
        """How many consecutive entries from ``entry_id`` bookie ``index`` stores (in one ensemble)."""
        if self.Qw >= self.E:
            return 1 << 62
        d = (index - entry_id) % self.E
        return d + 1 if d < self.Qw else 0

    def _primary(self, entry_id: int) -> int:
        if self.Qw >= self.E:
            self._turn = (self._turn + 1) % self.E
            return self._turn
        return (entry_id + self.Qw - 1) % self.E

    def _batch(self, lo: int, hi: int, seg: Segment, index: int, **kw: object) -> Batch:
        n = min(self.batch_entries, self.holds_from(index, lo), hi - lo + 1)
        return Batch(lo, lo + n - 1, seg, index, **kw)  # type: ignore[arg-type]

    def next_batches(self) -> list[Batch]:
        """New batches to send now (read-ahead up to ``window`` in flight)."""
        out: list[Batch] = []
        horizon = self.consumed + self.window * self.batch_entries
        while self._segments and self.in_flight < self.window and self._next < horizon:
            seg = self._segments[0]
            b = self._batch(self._next, seg.last, seg, self._primary(self._next))
            self._next = b.last + 1
            if self._next > seg.last:
                self._segments.popleft()
                if self._segments:
                    self._next = self._segments[0].first
            self.in_flight += 1
            out.append(b)
        return out

    @property
    def done_planning(self) -> bool:
        return not self._segments

    # -- answers -----------------------------------------------------------------------------------------
    def on_answer(self, batch: Batch, delivered: int, outcome: Outcome | None, why: str = "") -> Settled:
        """``delivered`` verified entries from ``batch.first`` came back; ``outcome`` says why not all of
        them (None when the batch is complete)."""
        self.in_flight -= 1
        res = Settled()
        lo = batch.first + delivered
        if lo > batch.last:
            return res
        seg = batch.segment
        if outcome is None:
            outcome = Outcome.SHORT
        if delivered > 0 and outcome is Outcome.SHORT:
            res.retries.append(self._retry(Batch(lo, batch.last, seg, batch.index)))
            return res
        tried: frozenset[int]
        errors: tuple[str, ...]
        if delivered > 0:  # the bookie failed a later entry of its batch: a fresh failover for that one
            tried, missing, errors = frozenset(), 0, ()
        else:
            tried, missing, errors = batch.tried, batch.missing, batch.errors
        if outcome is Outcome.SHORT:  # nothing at all, yet no error: count it as a failure of this bookie
            outcome = Outcome.FAILED
        tried |= {batch.index}
        missing += outcome is Outcome.MISSING
        errors = (*errors, f"{batch.bookie}: {why or outcome.value}")
        for index in self._replicas(lo):
            if index not in tried:
                b = self._batch(lo, batch.last, seg, index, tried=tried, missing=missing, errors=errors)
                res.retries.append(self._retry(b))
                if b.last < batch.last:  # the part this replica does not hold: planned as new
                    rest = self._batch(b.last + 1, batch.last, seg, self._primary(b.last + 1))
                    res.retries.append(self._retry(rest))
                    if rest.last < batch.last:
                        res.retries.extend(
                            self._retry(x) for x in self._split(rest.last + 1, batch.last, seg)
                        )
                return res
        res.unreadable = Unreadable(lo, missing == len(self._replicas(lo)), errors)
        return res

    def _split(self, lo: int, hi: int, seg: Segment) -> list[Batch]:
        out = []
        while lo <= hi:
            b = self._batch(lo, hi, seg, self._primary(lo))
            out.append(b)
            lo = b.last + 1
        return out

    def _retry(self, b: Batch) -> Batch:
        self.in_flight += 1
        return b

    def _replicas(self, entry_id: int) -> list[int]:
        """The write set of ``entry_id`` as indices in its ensemble."""
        return [(entry_id + i) % self.E for i in range(self.Qw)]
