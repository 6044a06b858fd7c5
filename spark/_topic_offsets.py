"""Pure position arithmetic of the ``topic`` source over one partition's ledger chain (no I/O).

A partition's *snapshot* is its managed ledger's ledger list as the driver saw it, oldest first: ``(ledger id,
readable entries, bytes, closed)``. ``readable entries`` of a closed ledger is its entry count; of the open last
ledger it is LAC + 1 (entries past the LAC are never read).

An *offset* of a partition is a position ``(ledger id, entry id)``: the next entry to read. A range of a
partition is ``start <= p < end``. Positions compare as tuples; ``(L, n)`` at the end of a closed ledger ``L`` and
``(next ledger, 0)`` denote the same point, and :func:`advance` prefers the latter once a successor exists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EARLIEST",
    "STARTING_TIME_KEY",
    "SUBSCRIPTION_KEY",
    "LedgerSlot",
    "Snapshot",
    "advance",
    "allot",
    "count_between",
    "entry_ranges",
    "missing_ledger_is_loss",
]

Pos = tuple[int, int]

#: The offset of a partition that has no ledger yet: everything it will ever hold is after it.
EARLIEST: Pos = (-1, 0)

#: The key of a stream's offset (beside the partitions' positions, whose names start ``persistent://``) that
#: holds the name of the durable subscription the query moves: kept in the query's checkpoint with its offsets.
SUBSCRIPTION_KEY = "subscription"

#: A stream's offset key for the ``startingTime`` its query started with (ms; 0: none): kept in every batch's
#: end from the initial offset on, so a restart from the checkpoint filters as the query began, whatever its
#: options say now (a starting option applies to a new query only, as Kafka's and pulsar-spark's do). Absent: an
#: offset logged before 08e79b5, whose batches filter by the option, as they did then.
STARTING_TIME_KEY = "startingTime"


@dataclass(frozen=True, slots=True)
class LedgerSlot:
    ledger_id: int
    entries: int  # readable entries (closed: all; open: LAC + 1)
    size: int  # bytes of those entries (closed: exact; open: estimated)
    closed: bool

    @property
    def avg_entry_size(self) -> float:
        return self.size / self.entries if self.entries > 0 and self.size > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One partition's ledgers, oldest first (ids strictly increasing)."""

    ledgers: tuple[LedgerSlot, ...] = ()

    def ids(self) -> list[int]:
        return [s.ledger_id for s in self.ledgers]

    def slot(self, ledger_id: int) -> LedgerSlot | None:
        for s in self.ledgers:
            if s.ledger_id == ledger_id:
                return s
        return None

    def earliest(self) -> Pos:
        """The first position of the oldest ledger (what ``earliest`` means), or :data:`EARLIEST`."""
        return (self.ledgers[0].ledger_id, 0) if self.ledgers else EARLIEST

    def latest(self) -> Pos:
        """The position after the newest readable entry (what ``latest`` means)."""
        if not self.ledgers:
            return EARLIEST
        last = self.ledgers[-1]
        return (last.ledger_id, last.entries)

    def covers(self, pos: Pos) -> bool:
        """Whether every entry before ``pos`` that still exists is readable in this snapshot."""
        if pos[0] < 0:
            return True
        s = self.slot(pos[0])
        return s is not None and pos[1] <= s.entries

    def lost_ledgers(self, start: Pos) -> list[int]:
        """``[start ledger]`` when ``start`` names a ledger that is no longer in the chain but some ledger at or
        after it is (or the chain moved past it): the entries of that ledger from ``start`` on may be gone.
        Whether they really are is :func:`missing_ledger_is_loss`'s question."""
        lid = start[0]
        if lid < 0 or not self.ledgers or self.slot(lid) is not None:
            return []
        return [lid]


def count_between(snap: Snapshot, start: Pos, end: Pos) -> int:
    """Readable entries ``p`` with ``start <= p < end`` in the snapshot."""
    count = 0
    for s in snap.ledgers:
        lid, n = s.ledger_id, s.entries
        lo = 0 if lid > start[0] else (start[1] if lid == start[0] else n)
        hi = n if lid < end[0] else (min(end[1], n) if lid == end[0] else 0)
        count += max(0, hi - max(lo, 0))
    return count


def entry_ranges(snap: Snapshot, start: Pos, end: Pos, max_entries: int) -> list[tuple[int, int, int]]:
    """``(ledger id, first entry, last entry)`` inclusive ranges covering ``start <= p < end``, each at most
    ``max_entries`` long, in order."""
    if max_entries < 1:
        raise ValueError("max_entries must be >= 1")
    out: list[tuple[int, int, int]] = []
    for s in snap.ledgers:
        lid, n = s.ledger_id, s.entries
        lo = 0 if lid > start[0] else (start[1] if lid == start[0] else n)
        hi = n if lid < end[0] else (min(end[1], n) if lid == end[0] else 0)
        lo = max(lo, 0)
        while lo < hi:
            last = min(lo + max_entries, hi) - 1
            out.append((lid, lo, last))
            lo = last + 1
    return out


def advance(snap: Snapshot, start: Pos, entries: int, cap: Pos | None = None) -> Pos:
    """The position after admitting up to ``entries`` readable entries from ``start`` (never beyond ``cap``
    nor the snapshot's end). ``start`` itself when nothing is admitted. Ending at the end of a closed ledger that
    has a successor gives ``(successor, 0)``."""
    limit_end = snap.latest() if cap is None else min(cap, snap.latest())
    available = count_between(snap, start, limit_end)
    take = min(entries, available)
    if take <= 0:
        return start
    pos = start
    ledgers = snap.ledgers
    for i, s in enumerate(ledgers):
        lid, n = s.ledger_id, s.entries
        if lid < pos[0]:
            continue
        lo = max(pos[1], 0) if lid == pos[0] else 0
        room = max(0, n - lo)
        if take < room:
            return (lid, lo + take)
        take -= room
        pos = (lid, n)
        if take == 0:
            if s.closed and i + 1 < len(ledgers):
                return (ledgers[i + 1].ledger_id, 0)
            return pos
    return pos


def _avg_size(snap: Snapshot, default: float = 1024.0) -> float:
    sizes = [s.avg_entry_size for s in snap.ledgers if s.avg_entry_size > 0]
    return sum(sizes) / len(sizes) if sizes else default


def bytes_between(snap: Snapshot, start: Pos, end: Pos) -> float:
    """Estimated bytes of ``start <= p < end``: each ledger's entries at its average entry size."""
    fallback = _avg_size(snap)
    total = 0.0
    for s in snap.ledgers:
        n = count_between(Snapshot((s,)), start, end)
        total += n * (s.avg_entry_size or fallback)
    return total


def entries_within_bytes(snap: Snapshot, start: Pos, end: Pos, budget: float) -> int:
    """How many entries from ``start`` (before ``end``) fit ``budget`` estimated bytes (at least one when any
    entry is available and the budget is positive)."""
    fallback = _avg_size(snap)
    taken = 0
    for s in snap.ledgers:
        n = count_between(Snapshot((s,)), start, end)
        if n == 0:
            continue
        size = s.avg_entry_size or fallback
        fit = int(budget // size) if size > 0 else n
        if fit < n:
            return max(taken + fit, 1)
        taken += n
        budget -= n * size
    return taken


def allot(backlogs: Mapping[str, float], budget: float) -> dict[str, float]:
    """Share ``budget`` among partitions in proportion to their backlogs (Kafka's rateLimit split), each at most
    its backlog; the rounding remainder goes to the largest backlogs first so the total is spent."""
    total = sum(backlogs.values())
    if total <= budget:
        return dict(backlogs)
    share = {k: float(int(budget * v / total)) for k, v in backlogs.items()}
    rest = budget - sum(share.values())
    for k in sorted(backlogs, key=lambda k: (-backlogs[k], k)):
        if rest < 1:
            break
        extra = min(backlogs[k] - share[k], float(int(rest)))
        share[k] += extra
        rest -= extra
    return share


def missing_ledger_is_loss(
    start: Pos,
    known_closed: Mapping[int, int],
    committed_mark_delete: Pos | None,
    chain: Sequence[int] = (),
) -> bool:
    """``start`` lies in a ledger that is gone. Not a loss when that ledger is known to have ended at or before
    ``start`` (``known_closed``: ledger id -> entries of a closed ledger seen earlier), or when our own durable
    subscription already acknowledged everything before ``start``: the broker trims only ledgers every cursor
    has consumed, so the ledger ended there. Nor when a ledger older than it is still in ``chain`` (the
    partition's ledger ids now): retention and deletes take a chain's oldest ledgers first, so a ledger gone from
    its middle was dropped by a new owner because it held no entry (``ManagedLedger.open`` drops the empty ledgers
    it finds: the one a broker killed had just rolled to, which a query's offset may name at entry 0).
    Otherwise its entries from ``start`` on were deleted unread."""
    lid, entry = start
    if lid in known_closed:
        return known_closed[lid] > entry
    if any(older < lid for older in chain):
        return False
    return not (committed_mark_delete is not None and committed_mark_delete >= (lid, entry - 1))


def resolve_start(snap: Snapshot, start: Pos) -> Pos:
    """``start`` moved onto the chain: a gone ledger's position becomes the next existing ledger's first."""
    if start[0] < 0 or snap.slot(start[0]) is not None:
        return start
    for s in snap.ledgers:
        if s.ledger_id > start[0]:
            return (s.ledger_id, 0)
    return snap.latest() if snap.ledgers else start


def positions_json(offsets: Mapping[str, Pos]) -> dict[str, list[int]]:
    return {k: [int(v[0]), int(v[1])] for k, v in sorted(offsets.items())}


def positions_from_json(d: Mapping[str, Any]) -> dict[str, Pos]:
    """The partitions' positions of an offset (its :data:`SUBSCRIPTION_KEY` and :data:`STARTING_TIME_KEY` left
    out)."""
    return {
        str(k): (int(v[0]), int(v[1])) for k, v in d.items() if k not in (SUBSCRIPTION_KEY, STARTING_TIME_KEY)
    }
