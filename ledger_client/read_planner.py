"""Sequential reads as batched READ_RANGE requests: the pure decisions (which entries to ask which bookie for,
what to do with a short or failed answer), no I/O. ``LedgerHandle._read_range`` drives it.

A READ_RANGE to a bookie names ``first``, ``last`` and a ``step`` and returns the entries ``first``,
``first + step``, ... it stores, stopping at the first one it does not hold (bookie/core.py, docs/protocol.md).
Bookie ``j`` of an ensemble stores entry ``e`` iff ``(j - e) mod E < Qw``, so it holds every entry of one
residue mod E or none of them. A batch is therefore a set of entries its bookie holds whole, inside one ensemble:

* ``Qw == E``: ``batch_entries`` consecutive entries (step 1), handed to the ensemble's bookies in turn;
* ``Qw < E``: a *stretch* of ``batch_entries * E`` consecutive entries is cut into ``E`` batches of step ``E``,
  one per residue, each on the bookie ``(r + Qw - 1) mod E`` of that residue's write set — one request per
  bookie per stretch, each bookie serving its share (every bookie holds ``Qw`` of the ``E`` residues).

An answer of ``n`` verified entries settles the batch's first ``n``. The rest of the batch is asked again: from
the same bookie when the answer was merely short (the byte limit), otherwise from the next replica of its first
entry not yet tried (failover) — that replica holds the whole rest, as every entry of a batch has the same write
set. When every replica of an entry failed, the read of that entry is :class:`Unreadable` (all said "no such
entry": ``missing``). At most ``window`` batches are in flight (a stretch's ``E`` go together), and none starts
more than ``window * batch_entries`` entries past what the reader has consumed (read-ahead, not read-everything).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any


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
    """Ask ``bookie`` (index ``index`` in ``segment``) for entries ``first``, ``first + step``, ... ``last``."""

    first: int
    last: int
    segment: Segment
    index: int
    step: int = 1
    # bookie indices that already failed entry ``first`` (and how many of them said it does not exist), with why;
    # for a speculative batch also the replicas still being asked beside it (``ReadPlanner.speculate``)
    tried: frozenset[int] = frozenset()
    missing: int = 0
    errors: tuple[str, ...] = ()

    @property
    def bookie(self) -> str:
        return self.segment.bookies[self.index]

    @property
    def count(self) -> int:
        """How many entries the batch asks for."""
        return (self.last - self.first) // self.step + 1


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
        last_resort: frozenset[str] = frozenset(),
    ) -> None:
        """``last_resort``: bookies to ask only when no other replica of an entry is left (a read timed out on
        them lately): a batch goes to another replica of its entries, and failover tries them last."""
        if batch_entries < 1 or window < 1:
            raise ValueError("batch_entries and window must be >= 1")
        self.E = ensemble_size
        self.Qw = write_quorum
        # Qw < E: a batch takes one residue mod E (whose write set holds it whole); Qw == E: consecutive entries
        self.step = ensemble_size if write_quorum < ensemble_size else 1
        self.batch_entries = batch_entries
        self.window = window
        self._segments = deque(segments(ensembles, first, last))
        self._next = first  # first entry not yet planned
        self._turn = 0  # Qw == E: the bookie of the next batch, in turn
        self.in_flight = 0
        self.consumed = first  # the reader has taken every entry before this one
        self.last_resort = last_resort

    # -- planning -----------------------------------------------------------------------------------------
    def holds(self, index: int, entry_id: int) -> bool:
        """Whether bookie ``index`` of an ensemble stores ``entry_id``."""
        return (index - entry_id) % self.E < self.Qw

    def _primary(self, entry_id: int, seg: Segment) -> int:
        if self.step == 1:
            self._turn = (self._turn + 1) % self.E
            if self.last_resort:
                turns = [(self._turn + k) % self.E for k in range(self.E)]
                self._turn = next((i for i in turns if seg.bookies[i] not in self.last_resort), self._turn)
            return self._turn
        index = (entry_id + self.Qw - 1) % self.E
        if self.last_resort and seg.bookies[index] in self.last_resort:
            others = [i for i in self._replicas(entry_id) if seg.bookies[i] not in self.last_resort]
            return others[-1] if others else index
        return index

    def next_batches(self) -> list[Batch]:
        """New batches to send now (read-ahead up to ``window`` in flight)."""
        out: list[Batch] = []
        horizon = self.consumed + self.window * self.batch_entries
        step = self.step
        while self._segments and self.in_flight < self.window and self._next < horizon:
            seg = self._segments[0]
            lo = self._next
            hi = min(seg.last, lo + self.batch_entries * step - 1)
            for first in range(lo, min(lo + step, hi + 1)):  # (one batch when step is 1)
                out.append(Batch(first, hi - (hi - first) % step, seg, self._primary(first, seg), step))
                self.in_flight += 1
            self._next = hi + 1
            if self._next > seg.last:
                self._segments.popleft()
                if self._segments:
                    self._next = self._segments[0].first
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
        step = batch.step
        lo = batch.first + delivered * step
        if lo > batch.last:
            return res
        seg = batch.segment
        if outcome is None:
            outcome = Outcome.SHORT
        if delivered > 0 and outcome is Outcome.SHORT:
            res.retries.append(self._retry(Batch(lo, batch.last, seg, batch.index, step)))
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
        replicas = self._replicas(lo)
        if self.last_resort:  # (stable: the usual order otherwise)
            replicas.sort(key=lambda i: seg.bookies[i] in self.last_resort)
        for index in replicas:
            if index not in tried:
                # (every entry of the rest has lo's write set: step is E, or Qw == E)
                b = Batch(lo, batch.last, seg, index, step, tried=tried, missing=missing, errors=errors)
                res.retries.append(self._retry(b))
                return res
        res.unreadable = Unreadable(lo, missing == len(replicas), errors)
        return res

    # -- speculative reads (BookKeeper's speculativeReadTimeout) ------------------------------------------
    def speculate(self, batch: Batch, answered_since: bool) -> Batch | None:
        """``batch`` has had no answer for the speculative timeout: the same request to the next replica of its
        entries not yet asked (those in ``last_resort`` last), to go out *beside* it; the first of them to
        deliver wins (``on_answer`` with it) and the others are dropped. None when its bookie answered other
        requests of this read since it was sent (busy, not hung: BookKeeper speculates only when it heard
        from none of the bookies asked) or when every replica was asked already. A speculative batch does not
        count in ``in_flight``: the request it stands beside is already counted."""
        if answered_since:
            return None
        asked = batch.tried | {batch.index}
        replicas = self._replicas(batch.first)
        if self.last_resort:  # (stable: the usual order otherwise)
            replicas.sort(key=lambda i: batch.segment.bookies[i] in self.last_resort)
        for index in replicas:
            if index not in asked:
                return Batch(
                    batch.first,
                    batch.last,
                    batch.segment,
                    index,
                    batch.step,
                    tried=asked,
                    missing=batch.missing,
                    errors=batch.errors,
                )
        return None

    def mark_slow(self, bookie: str) -> None:
        """``bookie`` timed out or lost to a speculative read: this read's later batches and failovers ask it
        last too (``last_resort``)."""
        if bookie not in self.last_resort:
            self.last_resort = self.last_resort | {bookie}

    @staticmethod
    def on_rival_failed(failed: Batch, rivals: Sequence[Batch], outcome: Outcome, why: str = "") -> None:
        """``failed`` brought nothing (``outcome``) while ``rivals`` (the same entries asked of other
        replicas, speculatively) are still out: no failover yet, the failure is counted on each rival (its
        bookie tried, a "no such entry" counted once), so whichever is answered last fails over (``on_answer``)
        from every replica asked."""
        if outcome is Outcome.SHORT:
            outcome = Outcome.FAILED
        note = f"{failed.bookie}: {why or outcome.value}"
        for r in rivals:
            r.missing += outcome is Outcome.MISSING
            r.tried = r.tried | {failed.index}
            r.errors = (*r.errors, note)

    def _retry(self, b: Batch) -> Batch:
        self.in_flight += 1
        return b

    def _replicas(self, entry_id: int) -> list[int]:
        """The write set of ``entry_id`` as indices in its ensemble."""
        return [(entry_id + i) % self.E for i in range(self.Qw)]


@dataclass(slots=True)
class RivalVerdict:
    """What an answer to a batch asked of several replicas at once means (``Rivals.on_answer``): whether it
    settles the batch (goes to ``ReadPlanner.on_answer``); the other copies to stop waiting for (their answers
    are never used, so no entry is handed out twice), and the bookies of those asked before it (slow); or, when
    it brought nothing while copies are still out, the copy that speculates on now (``rearm``: the failed one
    was the newest, whose timer went with it)."""

    settles: bool = True
    drop: list[Batch] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)
    rearm: Batch | None = None


class Rivals:
    """The speculative copies of batches: a batch and the copies ``ReadPlanner.speculate`` sent beside it share
    one list, in the order they were sent; only the newest speculates on. The pure bookkeeping
    ``BatchReader`` (and the simulator) drive; ``waiting`` is the requests still without an answer."""

    __slots__ = ("_groups", "_unsafe_keep_losers")

    def __init__(self) -> None:
        self._groups: dict[Batch, list[Batch]] = {}
        self._unsafe_keep_losers = False  # (test-only: the copies a settled batch leaves out are not dropped)

    def speculates(self, b: Batch) -> bool:
        """Whether ``b``'s speculative timer may ask another replica (it is the newest copy of its batch)."""
        group = self._groups.get(b)
        return group is None or group[-1] is b

    def add(self, b: Batch, copy: Batch) -> None:
        """``copy`` (``ReadPlanner.speculate(b)``) goes out beside ``b``."""
        group = self._groups.get(b)
        if group is None:
            group = self._groups[b] = [b]
        group.append(copy)
        self._groups[copy] = group

    def on_answer(
        self, b: Batch, delivered: int, outcome: Outcome | None, why: str, waiting: Container[Batch]
    ) -> RivalVerdict:
        """``b`` was answered (``delivered`` entries; ``waiting`` no longer holds it)."""
        v = RivalVerdict()
        group = self._groups.pop(b, None)
        if group is None:
            return v
        rivals = [r for r in group if r is not b and r in waiting]
        if rivals and delivered == 0:  # nothing from b while the same entries are still asked elsewhere
            ReadPlanner.on_rival_failed(b, rivals, outcome or Outcome.FAILED, why)
            group.remove(b)
            newest = group[-1]
            if newest in waiting:
                # (b may have been the newest, the one that speculates on: a copy that failed at once, e.g. its
                # bookie down, must not leave the batch waiting out the read timeout on a hung one)
                v.rearm = newest
            v.settles = False
            return v
        # b settles the batch (the first to deliver, or the last one asked): the others are dropped, so no entry
        # is handed out twice; a bookie asked before b and still silent is slow
        asked_before = True
        for r in group:
            if r is b:
                asked_before = False
                continue
            if self._unsafe_keep_losers:
                continue
            self._groups.pop(r, None)
            if r in waiting:
                v.drop.append(r)
                if asked_before:
                    v.slow.append(r.bookie)
        return v


class ReadyRuns:
    """Verified entries waiting for the reader, filed as the pieces the answers brought (no object per entry):
    piece ``first -> payloads`` holds entries ``first``, ``first + step``, ... (``step`` is the planner's). ``take``
    hands out the longest run of consecutive entries ready from a given id, interleaving the ``step`` pieces
    of a stretch with one slice assignment each, and files what is left of a piece under its next entry id.

    A piece is a list of payloads, or (``EntryCodec.verify_spans(rows=True)``) a 2-D array of one row per
    entry; pieces of rows of one width are handed out as such an array (interleaved row-wise), any other mix as
    a list."""

    __slots__ = ("step", "_pieces")

    def __init__(self, step: int) -> None:
        self.step = step
        self._pieces: dict[int, Any] = {}

    def add(self, first: int, payloads: Any) -> None:
        if len(payloads):
            self._pieces[first] = payloads

    def __len__(self) -> int:
        """How many entries are filed."""
        return sum(map(len, self._pieces.values()))

    def take(self, nxt: int, last: int) -> Any:
        """The payloads of entries ``nxt``, ``nxt + 1``, ... up to ``last`` or the first one not ready (a list,
        or rows: see the class)."""
        pieces = self._pieces
        step = self.step
        if step == 1:
            piece = pieces.pop(nxt, None)
            if piece is None:
                return []
            want = last - nxt + 1
            if len(piece) > want:
                pieces[nxt + want] = piece[want:]
                piece = piece[:want]
            return piece
        # entry nxt + j is entry j // step of the piece at nxt + j % step: ready while j // step < its length
        n = last - nxt + 1
        for k in range(step):
            n = min(n, len(pieces.get(nxt + k, ())) * step + k)
        if n <= 0:
            return []
        taken: list[Any] = []
        for k in range(min(step, n)):
            piece = pieces.pop(nxt + k)
            c = (n - k + step - 1) // step
            if len(piece) > c:
                pieces[nxt + k + c * step] = piece[c:]
                piece = piece[:c]
            taken.append(piece)
        if not any(isinstance(p, list) for p in taken) and len({p.shape[1] for p in taken}) == 1:
            import numpy as np

            rows = np.empty((n, taken[0].shape[1]), np.uint8)
            for k, piece in enumerate(taken):
                rows[k::step] = piece
            return rows
        out: list[bytes] = [b""] * n
        for k, piece in enumerate(taken):
            out[k::step] = (
                piece if isinstance(piece, list) else list(map(bytes, piece))
            )  # (rows of two widths)
        return out
