"""Moving a durable subscription by hand, as Pulsar's admin does: peek, skip, expire-messages and message TTL.

The rules are pure and take a :class:`LedgerView` (the positions of the stored entries) and a :class:`Cursor`
(what the subscription acknowledged):

- :func:`nth_unacked`: the n-th entry after the mark-delete that is not acknowledged yet (Pulsar's
  ``getNthEntry`` with individually deleted entries excluded): what ``peek`` shows at position n.
- :func:`skip_target`: the mark-delete after skipping n such entries (all of them when there are fewer).
- :func:`entry_expired` and :func:`last_expired`: the newest entry after the mark-delete published more than a
  TTL ago, found by a binary search over the publish times (Pulsar's expiry monitor, ``findNewestMatching``).
- :func:`truncate`: every subscription's backlog dropped and the ledgers before a new one deleted (Pulsar's
  ``truncate``).
- :func:`analyze_backlog`: the entries and messages of the backlog counted by reading it, bounded by a number
  of entries and a time (Pulsar's ``analyzeBacklog``); moves nothing.

:func:`skip` and :func:`expire` apply a new mark-delete on the topic's owner (:func:`advance`): to the live
subscription's cursor and its dispatcher (entries before it are dropped from what its consumers hold
pending, and never read again), or to the stored cursor of an idle one; saved before they return. They hold
the topic's subscription-opening lock meanwhile, so that a consumer subscribing to the idle subscription at
that moment opens its cursor from what they saved (not from the version before, whose next save would
conflict and fence the topic).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import wire
from .compaction import COMPACTION_SUBSCRIPTION
from .cursor import Cursor, ManagedCursor
from .managed_ledger import LedgerView, Position

if TYPE_CHECKING:
    from .service import SubscriptionRuntime, Topic

__all__ = [
    "BacklogScan",
    "NotDurableError",
    "ReservedSubscriptionError",
    "SubscriptionNotFoundError",
    "advance",
    "analyze_backlog",
    "check_movable",
    "delete",
    "delete_inactive",
    "entry_expired",
    "expire",
    "expire_all",
    "last_expired",
    "nth_unacked",
    "peek",
    "scan_backlog",
    "skip",
    "skip_target",
    "subscription_cursor",
    "truncate",
]

#: Pulsar's defaults for a backlog scan: subscriptionBacklogScanMaxEntries, subscriptionBacklogScanMaxTimeMs,
#: and the entries and bytes read at a time (dispatcherMaxReadBatchSize, dispatcherMaxReadSizeBytes)
SCAN_MAX_ENTRIES = 10_000
SCAN_MAX_TIME_S = 120.0
SCAN_READ_BATCH = 100
SCAN_READ_BYTES = 5 * 1024 * 1024

#: before every stored position: ``count_entries(_ORIGIN, p)`` is the number of entries at or before ``p``
_ORIGIN = Position(-1, -1)


class SubscriptionNotFoundError(Exception):
    pass


class NotDurableError(Exception):
    """A reader's (non-durable) subscription: it has no stored position to move."""


class ReservedSubscriptionError(Exception):
    """The compactor's subscription (``__compaction``): its mark-delete is the compaction horizon, which only the
    compactor moves; moved by hand, the entries it passed over were never compacted, and once retention let their
    ledgers go they were gone from the compacted view."""


def check_movable(sub: str) -> None:
    """Raises :class:`ReservedSubscriptionError` for the compactor's subscription."""
    if sub == COMPACTION_SUBSCRIPTION:
        raise ReservedSubscriptionError(sub)


def _entries_upto(view: LedgerView, pos: Position) -> int:
    return view.count_entries(_ORIGIN, pos)


def nth_unacked(view: LedgerView, cursor: Cursor, n: int) -> Position | None:
    """The ``n``-th (1 = the first) stored entry after the mark-delete that is not individually acknowledged;
    None when there are fewer."""
    if n < 1:
        raise ValueError(f"n must be 1 or more, got {n}")
    total = view.total_entries()
    index = _entries_upto(view, cursor.mark_delete)  # the index of the first entry after the mark-delete
    remaining = n
    for start, end in cursor.individually_deleted:
        gap = _entries_upto(view, start.previous()) - index  # unacknowledged entries before this range
        if remaining <= gap:
            return view.position_at(index + remaining - 1)
        remaining -= max(gap, 0)
        index = max(index, _entries_upto(view, end))
    at = index + remaining - 1
    return view.position_at(at) if at < total else None


def skip_target(view: LedgerView, cursor: Cursor, n: int) -> Position:
    """The mark-delete once ``n`` unacknowledged entries are skipped: the n-th of them, or the last stored entry
    when there are fewer (then nothing is left). ``n`` 0 leaves it where it is."""
    if n < 0:
        raise ValueError(f"n must be 0 or more, got {n}")
    if n == 0:
        return cursor.mark_delete
    found = nth_unacked(view, cursor, n)
    return found if found is not None else max(cursor.mark_delete, view.last_position())


def entry_expired(entry: bytes, now_ms: int, ttl_s: int) -> bool:
    """Pulsar's ``isEntryExpired``: a TTL of 0 expires nothing; else the entry expired when it was published more
    than ``ttl_s`` seconds before ``now_ms``. An entry whose metadata cannot be read does not expire."""
    if ttl_s == 0:
        return False
    try:
        published = wire.entry_publish_time(entry)
    except wire.EntryFormatError:
        return False
    return now_ms > published + ttl_s * 1000


def first_after(view: LedgerView, pos: Position) -> Position | None:
    """The first stored entry after ``pos`` (a mark-delete); None when there is none yet."""
    index = _entries_upto(view, pos)
    return view.position_at(index) if index < view.total_entries() else None


async def last_expired(
    view: LedgerView,
    mark_delete: Position,
    read: Callable[[Position], Awaitable[bytes]],
    now_ms: int,
    ttl_s: int,
) -> Position | None:
    """The newest entry after ``mark_delete`` that expired (:func:`entry_expired`), by a binary search over the
    entries (publish times grow along the log, as Pulsar assumes); None when the first one after it has not."""
    lo = _entries_upto(view, mark_delete)
    first, hi = lo, view.total_entries()
    while lo < hi:
        mid = (lo + hi) // 2
        if entry_expired(await read(view.position_at(mid)), now_ms, ttl_s):
            lo = mid + 1
        else:
            hi = mid
    return view.position_at(lo - 1) if lo > first else None


async def subscription_cursor(topic: Topic, sub: str) -> tuple[SubscriptionRuntime | None, ManagedCursor]:
    """The live subscription (None when it has no dispatcher here) and its durable cursor, as stored now (an
    idle one opened and attached, or the one attached refreshed: ``ManagedCursor.open``, whose cursor a consumer
    subscribing later takes too; the caller holds the topic's subscription-opening lock, so that none attaches
    while it is moved).
    Raises :class:`SubscriptionNotFoundError`, or :class:`NotDurableError` for a reader's subscription."""
    rt = topic.subscriptions.get(sub)
    if rt is not None:
        if rt.cursor is None:
            raise NotDurableError(sub)
        # idle: another writer may have moved it (adopted, as a consumer would); its znode gone (an UNSUBSCRIBE
        # whose delete was applied with its reply lost, its consumer gone without a retry), the subscription is
        # deleted: it leaves the topic's list (stats, GET subscriptions), and the stored cursor is looked up
        # below, which drops the ghost cursor (closed, detached) and finds none (404)
        if rt.consumers or await rt.cursor.refresh():
            return rt, rt.cursor
        if topic.subscriptions.get(sub) is rt:
            topic.subscriptions.pop(sub)
    mc = await ManagedCursor.open_stored(topic.ml, sub)  # (attached: refreshed, the same)
    if mc is None:
        raise SubscriptionNotFoundError(sub)
    return None, mc


async def peek(topic: Topic, sub: str, n: int) -> Position | None:
    """Pulsar's ``peekMessages``: the position of the subscription's ``n``-th unacknowledged entry
    (:func:`nth_unacked`), None when it has fewer; moves nothing."""
    async with topic._opening_subscription:
        _rt, mc = await subscription_cursor(topic, sub)
        return nth_unacked(topic.ml.view(), mc.cursor, n)


@dataclass
class BacklogScan:
    """What :func:`analyze_backlog` counted: entries, messages (a batch's members each), the first and last
    entry read, and whether it stopped at its limit of entries or time with more of the backlog left."""

    entries: int = 0
    messages: int = 0
    first: Position | None = None
    last: Position | None = None
    aborted: bool = False


def _acked(ranges: Sequence[tuple[Position, Position]], starts: Sequence[Position], pos: Position) -> bool:
    """``pos`` lies in one of the sorted, disjoint closed ``ranges`` (``starts``: their lower ends)."""
    i = bisect.bisect_right(starts, pos) - 1
    return i >= 0 and pos <= ranges[i][1]


async def analyze_backlog(
    topic: Topic,
    sub: str,
    start: Position | None = None,
    *,
    max_entries: int = SCAN_MAX_ENTRIES,
    max_time_s: float = SCAN_MAX_TIME_S,
) -> BacklogScan:
    """Pulsar's ``analyzeBacklog``: the subscription's unacknowledged entries (after its mark-delete, or from
    ``start`` on, individually acknowledged ones passed over) read a few at a time and counted,
    at most ``max_entries`` of them and for at most ``max_time_s``; moves nothing and keeps no entry."""
    async with topic._opening_subscription:
        _rt, mc = await subscription_cursor(topic, sub)
        mark_delete = mc.mark_delete
        ranges = list(mc.cursor.individually_deleted)
    ml = topic.ml
    first = ml.next_position(mark_delete)
    return await scan_backlog(
        ml.read_entries,
        ml.next_position,
        first if start is None else max(start, first),
        ranges,
        max_entries=max_entries,
        deadline=time.monotonic() + max_time_s,
    )


async def scan_backlog(
    read: Callable[[Position, int], Awaitable[list[tuple[Position, bytes]]]],
    next_position: Callable[[Position], Position],
    start: Position,
    acked: Sequence[tuple[Position, Position]],
    *,
    max_entries: int,
    deadline: float,
) -> BacklogScan:
    """The entries ``read`` gives from ``start`` on, counted (those in the sorted closed ``acked`` ranges passed
    over) until there are no more, ``max_entries`` were counted or ``time.monotonic()`` passed ``deadline``;
    ``aborted`` when it stopped with more entries left to read. Read at most ``SCAN_READ_BATCH`` entries at a
    time, and about ``SCAN_READ_BYTES``: one entry first, then as many as the last read's entries' mean size
    fits (a backlog of 5 MB entries is read one at a time, not 100)."""
    starts = [s for s, _e in acked]
    pos = start
    scan = BacklogScan()
    ask = 1
    while True:
        batch = await read(pos, ask)
        if not batch:
            return scan
        size = sum(len(entry) for _p, entry in batch)
        ask = max(1, min(SCAN_READ_BATCH, SCAN_READ_BYTES * len(batch) // max(1, size)))
        if scan.entries >= max_entries or time.monotonic() > deadline:
            scan.aborted = True
            return scan
        for p, entry in batch:
            if scan.entries >= max_entries:
                break
            pos = next_position(p)
            if _acked(acked, starts, p):
                continue
            try:
                md, _payload = wire.parse_entry(entry, verify_checksum=False)
                n = wire.entry_message_count(md)
            except wire.EntryFormatError:
                n = 1
            scan.entries += 1
            scan.messages += n
            scan.first = scan.first or p
            scan.last = p


async def advance(rt: SubscriptionRuntime | None, mc: ManagedCursor, mark_delete: Position) -> bool:
    """Everything up to ``mark_delete`` acknowledged (acks after it kept) and saved; the dispatcher drops what its
    consumers hold before it. False when the subscription was there already."""
    if mark_delete <= mc.mark_delete:
        return False
    mc.ack_cumulative(mark_delete)
    if rt is not None:
        rt.execute(rt.core.ack_cumulative(mark_delete).commands)
    await mc.flush()
    return True


async def _move(
    topic: Topic, sub: str, target: Callable[[ManagedCursor], Awaitable[Position | None]]
) -> bool:
    """The subscription's mark-delete moved to ``target(cursor)`` (None: left alone), with no subscription
    opening on the topic meanwhile; True when it moved. The compactor's is refused (:func:`check_movable`)."""
    check_movable(sub)
    async with topic._opening_subscription:
        rt, mc = await subscription_cursor(topic, sub)
        found = await target(mc)
        return found is not None and await advance(rt, mc, found)


async def skip(topic: Topic, sub: str, n: int) -> bool:
    """Pulsar's ``skipMessages``: the next ``n`` unacknowledged entries acknowledged (:func:`skip_target`)."""

    async def target(mc: ManagedCursor) -> Position:
        return skip_target(topic.ml.view(), mc.cursor, n)

    return await _move(topic, sub, target)


async def expire(topic: Topic, sub: str, ttl_s: int, now_ms: int) -> bool:
    """Pulsar's ``expireMessages``: the subscription acknowledges everything up to the newest entry published
    more than ``ttl_s`` seconds before ``now_ms``; True when it moved."""
    ml = topic.ml

    async def target(mc: ManagedCursor) -> Position | None:
        return await last_expired(ml.view(), mc.mark_delete, ml.read_entry, now_ms, ttl_s)

    return await _move(topic, sub, target)


async def expire_all(topic: Topic, ttl_s: int, now_ms: int) -> list[str]:
    """:func:`expire` for each durable subscription of the topic but the compactor's (whose mark-delete records
    the compacted ledger); the subscriptions that moved. One deleted meanwhile is passed over."""
    live = {s for s, rt in topic.subscriptions.items() if rt.durable}
    stored = set(await topic.ml.store.list_cursors(topic.ml.name))
    moved = []
    for sub in sorted((live | stored) - {COMPACTION_SUBSCRIPTION}):
        try:
            if await expire(topic, sub, ttl_s, now_ms):
                moved.append(sub)
        except SubscriptionNotFoundError:
            continue
    return moved


async def delete(topic: Topic, sub: str, rt: SubscriptionRuntime | None) -> None:
    """The subscription removed (unsubscribe): its dispatcher ``rt`` (whose consumers the caller closed, or
    None when it has none here) dropped, its cursor closed and detached and its znode deleted
    (:meth:`ManagedLedger.delete_cursor`). With no dispatcher, the cursor an admin call opened is closed too:
    detached only, its delayed flush (an admin skip whose save had failed) saved it after the delete, at the
    version it held, over the cursor a consumer subscribing again had created: a conflict that fenced the
    topic."""
    if rt is not None:
        topic.subscriptions.pop(sub, None)
        cursor = rt.cursor
    else:
        attached = topic.ml.attached_cursor(sub)
        cursor = attached if isinstance(attached, ManagedCursor) else None
    if cursor is not None:
        await cursor.delete()
    await topic.ml.delete_cursor(sub)


async def delete_inactive(
    topic: Topic, expiration_ms: int, now_ms: int, seen_ms: dict[str, int]
) -> list[str]:
    """Pulsar's subscription expiration (``subscriptionExpirationTimeMinutes``): each durable subscription but
    the compactor's that has no consumer here and was last active more than ``expiration_ms`` before ``now_ms``
    is deleted. Last active: the latest of its cursor's stored ``last_active_ms`` (written with each save of
    its position), ``seen_ms[sub]``, when the caller last saw a consumer on it, and when its last consumer left
    it here (``idle_since_ms``); a cursor stored without that time (0) counts as active when first checked
    (``seen_ms`` records it). Checked again under the topic's subscription lock, which a consumer subscribing
    holds until it is attached: a subscription a consumer attaches to meanwhile is kept. The deleted ones."""
    ml = topic.ml
    deleted = []
    for sub in sorted(set(await ml.store.list_cursors(ml.name)) - {COMPACTION_SUBSCRIPTION}):
        rt = topic.subscriptions.get(sub)
        if rt is not None and (rt.consumers or not rt.durable):
            continue
        stored = await ml.store.get_cursor(ml.name, sub)
        if stored is None:
            continue
        last = stored.value.last_active_ms or seen_ms.setdefault(sub, now_ms)
        if now_ms - max(last, seen_ms.get(sub, 0)) <= expiration_ms:
            continue
        async with topic._opening_subscription:  # no consumer attaching meanwhile
            rt = topic.subscriptions.get(sub)
            if rt is not None and (rt.consumers or now_ms - rt.idle_since_ms <= expiration_ms):
                continue
            await delete(topic, sub, rt)
        deleted.append(sub)
    return deleted


async def truncate(topic: Topic) -> list[int]:
    """Pulsar's ``truncate``: every durable subscription (live or idle, the compactor's too, as Pulsar clears each
    cursor's backlog) acknowledges everything up to the last confirmed entry, saved; then the managed ledger rolls
    over and deletes the ledgers before the new one (:meth:`ManagedLedger.truncate`). Returns the deleted ids."""
    ml = topic.ml
    live = {s for s, rt in topic.subscriptions.items() if rt.durable}
    stored = set(await ml.store.list_cursors(ml.name))
    for sub in sorted(live | stored):
        async with topic._opening_subscription:
            try:
                rt, mc = await subscription_cursor(topic, sub)
            except (SubscriptionNotFoundError, NotDurableError):
                continue  # deleted meanwhile
            await advance(rt, mc, ml.last_confirmed_position())
    return await ml.truncate()
