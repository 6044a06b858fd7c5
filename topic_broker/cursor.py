"""Durable subscriptions: the pure :class:`Cursor` and the persisted :class:`ManagedCursor`.

A cursor is Pulsar's ManagedCursor state: every entry at or before ``mark_delete`` is acknowledged, and so is
every entry inside one of the ``individually_deleted`` closed ranges after it (the "ack holes" are the gaps).
Ranges are kept sorted, disjoint and merged; when the range right after ``mark_delete`` touches it,
``mark_delete`` moves over it. What "right after" means across ledger boundaries is the managed ledger's
knowledge, so the cursor takes a ``next_position`` callable (``ManagedLedger.next_position``).

It also keeps the acked messages of partly acknowledged batches (batch-index acks): a bit mask per entry after
the mark-delete, dropped when the entry is acknowledged whole.

Persisted (``zk.managed_ledgers.CursorInfo`` at ``managed-ledgers/<ml>/cursors/<sub>``) at most once per
``flush_interval_s`` and on close; at most :data:`MAX_STORED_RANGES` ranges are stored (the ones nearest
``mark_delete``; the rest are redelivered after a restart, never lost), with a logged warning.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import enum
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import zk
from topic_broker.managed_ledger import (
    ManagedLedger,
    ManagedLedgerClosedError,
    ManagedLedgerFencedError,
    Position,
)
from zk.client import JsonDict
from zk.managed_ledgers import CursorInfo
from zk.ratelog import LOG_EVERY_S, RateLimitedLog
from zk.versioned import Versioned

log = logging.getLogger(__name__)
#: the delayed saves that ZooKeeper failed (away: every cursor with acks fails every ~10 s): a line a minute for
#: them all, no traceback; the next ack, tick or close saves again
_saves_failing = RateLimitedLog(log, LOG_EVERY_S)

__all__ = [
    "DEFAULT_FLUSH_INTERVAL_S",
    "MAX_STORED_RANGES",
    "SUBSCRIPTION_PROPERTIES_MAX_BYTES",
    "Cursor",
    "SubscriptionPropertiesTooLargeError",
    "InitialPosition",
    "ManagedCursor",
]

MAX_STORED_RANGES = 10_000
DEFAULT_FLUSH_INTERVAL_S = 1.0
#: a stored cursor's take-over write at its open, tried again on a conflict (a previous owner's save between
#: the read and the write) so often before the open gives up (and fences: another owner keeps writing it)
TAKE_OVER_TRIES = 5
#: The most a subscription's properties may take in its cursor's znode (JSON as stored, non-ASCII escaped): a tenth
#: of a znode body, leaving the rest to the ranges. More and every save of the cursor would fail
SUBSCRIPTION_PROPERTIES_MAX_BYTES = 100_000


class SubscriptionPropertiesTooLargeError(ValueError):
    """Subscription properties larger than :data:`SUBSCRIPTION_PROPERTIES_MAX_BYTES`."""


NextPosition = Callable[[Position], Position]


def _plus_one(pos: Position) -> Position:
    return Position(pos.ledger_id, pos.entry_id + 1)


class Cursor:
    """Pure acknowledgement state. ``next_position`` defaults to "same ledger, next entry"."""

    def __init__(
        self,
        mark_delete: Position,
        ranges: Iterable[tuple[Position, Position]] = (),
        next_position: NextPosition = _plus_one,
        batch_acked: Mapping[Position, int] | None = None,
    ) -> None:
        self._md = Position(*mark_delete)
        self._next = next_position
        self._starts: list[Position] = []
        self._ends: list[Position] = []
        self._batch: dict[Position, int] = {}  # entry -> mask of its batch's acked messages
        for start, end in ranges:
            self._add_range(Position(*start), Position(*end))
        self._advance()
        for pos, mask in (batch_acked or {}).items():
            self.ack_batch(pos, mask)

    # -- queries ----------------------------------------------------------------------------------------------
    @property
    def mark_delete(self) -> Position:
        return self._md

    @property
    def individually_deleted(self) -> list[tuple[Position, Position]]:
        return list(zip(self._starts, self._ends, strict=True))

    def is_acked(self, pos: Position) -> bool:
        if pos <= self._md:
            return True
        i = bisect.bisect_right(self._starts, pos) - 1
        return i >= 0 and pos <= self._ends[i]

    @property
    def batch_acked(self) -> dict[Position, int]:
        """The partly acknowledged batches after the mark-delete: entry -> mask of its acked messages."""
        return {p: m for p, m in self._batch.items() if not self.is_acked(p)}

    def set_next_position(self, next_position: NextPosition) -> None:
        self._next = next_position

    # -- changes ----------------------------------------------------------------------------------------------
    def ack_individual(self, pos: Position) -> bool:
        """Acknowledge one entry; True if that changed anything."""
        pos = Position(*pos)
        if self.is_acked(pos):
            return False
        self._batch.pop(pos, None)
        self._add_range(pos, pos)
        self._advance()
        return True

    def ack_cumulative(self, pos: Position) -> bool:
        """Acknowledge everything up to and including ``pos``; True if that changed anything."""
        pos = Position(*pos)
        if pos <= self._md:
            return False
        md = pos
        while self._starts and self._starts[0] <= pos:
            md = max(md, self._ends[0])
            del self._starts[0], self._ends[0]
        self._md = md
        self._advance()
        if self._batch:
            self._batch = self.batch_acked
        return True

    def ack_range(self, start: Position, end: Position) -> bool:
        """Acknowledge every position from ``start`` to ``end``, both included, whether an entry is stored there
        or not (the ids a compaction removed); True if that changed anything."""
        start, end = Position(*start), Position(*end)
        if end < start or end <= self._md:
            return False
        i = bisect.bisect_left(self._ends, start)  # the first range that ends at or after start
        if i < len(self._starts) and self._starts[i] <= start and end <= self._ends[i]:
            return False
        j = i
        while j < len(self._starts) and self._starts[j] <= end:  # the ranges it overlaps are merged into it
            start, end = min(start, self._starts[j]), max(end, self._ends[j])
            j += 1
        del self._starts[i:j], self._ends[i:j]
        for pos in [p for p in self._batch if start <= p <= end]:
            del self._batch[pos]
        self._add_range(start, end)
        self._advance()
        return True

    def ack_batch(self, pos: Position, mask: int) -> bool:
        """Some messages of the batch at ``pos`` acknowledged (bit ``i`` of ``mask``: message ``i``); the entry
        stays unacknowledged. True if that changed anything."""
        pos = Position(*pos)
        if mask <= 0 or self.is_acked(pos):
            return False
        old = self._batch.get(pos, 0)
        if old | mask == old:
            return False
        self._batch[pos] = old | mask
        return True

    def reset(self, mark_delete: Position) -> None:
        """Rewind or skip: everything up to ``mark_delete`` acknowledged, nothing after it."""
        self._md = Position(*mark_delete)
        self._starts.clear()
        self._ends.clear()
        self._batch.clear()

    def _add_range(self, start: Position, end: Position) -> None:
        """Insert ``[start, end]`` (not overlapping an existing range), merging with touching neighbours."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i >= 0 and (self._ends[i] >= start or self._next(self._ends[i]) == start):
            self._ends[i] = max(self._ends[i], end)
            j = i
        else:
            j = i + 1
            self._starts.insert(j, start)
            self._ends.insert(j, end)
        while j + 1 < len(self._starts) and (
            self._starts[j + 1] <= self._ends[j] or self._next(self._ends[j]) == self._starts[j + 1]
        ):
            self._ends[j] = max(self._ends[j], self._ends[j + 1])
            del self._starts[j + 1], self._ends[j + 1]

    def _advance(self) -> None:
        while self._starts and (self._starts[0] <= self._md or self._starts[0] == self._next(self._md)):
            self._md = max(self._md, self._ends[0])
            del self._starts[0], self._ends[0]

    # -- (de)serialisation -------------------------------------------------------------------------------------
    def to_info(
        self,
        *,
        properties: Mapping[str, int] | None = None,
        last_active_ms: int = 0,
        subscription_properties: Mapping[str, str] | None = None,
    ) -> CursorInfo:
        ranges = self.individually_deleted
        if len(ranges) > MAX_STORED_RANGES:
            log.warning(
                "cursor has %d ack ranges; storing the first %d (later acks are redelivered after a restart)",
                len(ranges),
                MAX_STORED_RANGES,
            )
            ranges = ranges[:MAX_STORED_RANGES]
        return CursorInfo(
            mark_delete=(self._md.ledger_id, self._md.entry_id),
            individually_deleted=tuple((s.ledger_id, s.entry_id, e.ledger_id, e.entry_id) for s, e in ranges),
            properties=dict(properties or {}),
            last_active_ms=last_active_ms,
            batch_acked=tuple((p.ledger_id, p.entry_id, m) for p, m in sorted(self.batch_acked.items())),
            subscription_properties=dict(subscription_properties or {}),
        )

    @classmethod
    def from_info(cls, info: CursorInfo, next_position: NextPosition = _plus_one) -> Cursor:
        ranges = [(Position(a, b), Position(c, d)) for a, b, c, d in info.individually_deleted]
        batches = {Position(a, b): m for a, b, m in info.batch_acked}
        return cls(Position(*info.mark_delete), ranges, next_position, batches)

    def to_json(self) -> dict[str, Any]:
        return self.to_info().to_json()

    @classmethod
    def from_json(cls, d: Mapping[str, Any], next_position: NextPosition = _plus_one) -> Cursor:
        return cls.from_info(CursorInfo.from_json(d), next_position)

    def __repr__(self) -> str:
        return f"Cursor(mark_delete={self._md}, ranges={len(self._starts)})"


class InitialPosition(enum.Enum):
    """Where a new subscription starts (Pulsar's ``InitialPosition``)."""

    LATEST = "latest"
    EARLIEST = "earliest"


class ManagedCursor:
    """A durable subscription of a :class:`ManagedLedger`, persisted rate-limited. Build it with :meth:`open`."""

    def __init__(
        self,
        ml: ManagedLedger,
        name: str,
        cursor: Cursor,
        version: int,
        properties: Mapping[str, int],
        flush_interval_s: float,
    ) -> None:
        self.ml = ml
        self.name = name
        self.cursor = cursor
        self.properties: dict[str, int] = dict(properties)
        #: Pulsar's subscription properties (``…/subscription/{sub}/properties``), saved with the cursor
        self.subscription_properties: dict[str, str] = {}
        self.read_position = ml.next_position(cursor.mark_delete)
        self._version = version
        #: the ``last_active_ms`` its znode holds (as far as this instance knows): the subscription expiration
        #: counts a subscription's inactivity from it on a broker that has not seen its consumers
        self.last_active_ms = 0
        self._flush_interval_s = flush_interval_s
        self._dirty = False
        self._last_flush = 0.0
        self._flush_lock = asyncio.Lock()
        self._flush_task: asyncio.Task[None] | None = None
        self._closed = False
        #: writes since the last confirmed one whose outcome is unknown (ZooKeeper did not answer; it may have
        #: applied them): a conflict with one of them is our own write, not another owner's
        self._unconfirmed: list[JsonDict] = []
        #: consumers are attached (the broker sets it); an idle cursor adopts changes others store
        self.active = False
        #: the stored state was adopted by :meth:`refresh`: the dispatcher must restart from the mark-delete
        self.moved = False

    @classmethod
    async def open(
        cls,
        ml: ManagedLedger,
        name: str,
        initial_position: InitialPosition = InitialPosition.LATEST,
        *,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
    ) -> ManagedCursor:
        """Restore the subscription ``name``, or create it at ``initial_position``.

        One cursor object per subscription of ``ml``: the cursor attached to it already (an admin call's, a
        consumer's) is answered, refreshed when idle (another writer, the Spark source's commit, may have moved
        it), and an open of the same name under way is waited for, then its cursor answered. A second object
        of one cursor saved at the version it held after the other's writes: a conflict that fenced the topic
        (an admin skip's save that failed while ZooKeeper was away, saved by its delayed flush after a consumer
        had subscribed and opened the cursor again).

        A stored cursor is written once at once, as it is (a take-over write, which only moves its version on):
        a previous owner of the topic that does not know yet that it lost it (SIGSTOPped past its ZooKeeper
        session, then resumed) saved its acknowledgements at the version it held, over this owner's cursor,
        and this owner's next save then conflicted and fenced the topic here. Now that save conflicts and
        fences the old owner; one it made between our read and our write is read again and taken over."""
        mc = await cls._open_one(ml, name, initial_position, flush_interval_s)
        assert mc is not None  # (created when not stored)
        return mc

    @classmethod
    async def open_stored(
        cls, ml: ManagedLedger, name: str, *, flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S
    ) -> ManagedCursor | None:
        """:meth:`open` of a subscription that exists (its attached cursor refreshed, or its stored one opened);
        None, and nothing created, when ``name`` has no stored cursor. Its znode read once."""
        return await cls._open_one(ml, name, None, flush_interval_s)

    @classmethod
    async def _open_one(
        cls, ml: ManagedLedger, name: str, initial_position: InitialPosition | None, flush_interval_s: float
    ) -> ManagedCursor | None:
        """:meth:`open`; ``initial_position`` None: a stored cursor only (None when there is none)."""
        while True:
            attached = ml.attached_cursor(name)
            if isinstance(attached, ManagedCursor) and not attached._closed:
                if await attached.refresh():
                    return attached
                # its znode is gone (an unsubscribe's delete applied, its reply lost): a ghost whose saves
                # would all fail; dropped, and the subscription opened anew
                if ml.attached_cursor(name) is attached and not attached._closed:
                    attached._abandon()
                continue
            opening = ml.cursor_opens.get(name)
            if opening is None:
                break
            await opening.wait()  # then its cursor is attached (or that open failed: this one tries)
        done = ml.cursor_opens[name] = asyncio.Event()
        try:
            return await cls._open(ml, name, initial_position, flush_interval_s)
        finally:
            if ml.cursor_opens.get(name) is done:
                del ml.cursor_opens[name]
            done.set()

    @classmethod
    async def _open(
        cls, ml: ManagedLedger, name: str, initial_position: InitialPosition | None, flush_interval_s: float
    ) -> ManagedCursor | None:
        stored = await ml.store.get_cursor(ml.name, name)
        for _ in range(TAKE_OVER_TRIES):
            if stored is None:
                break
            try:
                stored = await ml.store.save_cursor(ml.name, name, stored.value, stored.version)
                break
            except (zk.MetadataVersionError, zk.MetadataNotFoundError):
                stored = await ml.store.get_cursor(ml.name, name)
        else:
            raise ml.fence(f"cursor {name} written by another owner while it was opened")
        if stored is not None:
            cursor = Cursor.from_info(stored.value, ml.next_position)
            mc = cls(ml, name, cursor, stored.version, stored.value.properties, flush_interval_s)
            mc.subscription_properties = dict(stored.value.subscription_properties)
            mc.last_active_ms = stored.value.last_active_ms
        elif initial_position is None:
            return None
        else:
            if initial_position is InitialPosition.EARLIEST:
                md = ml.first_position().previous()
            else:
                md = ml.last_confirmed_position()
            mc = cls(ml, name, Cursor(md, (), ml.next_position), -1, {}, flush_interval_s)
            mc._dirty = True
            await mc.flush()
        ml.attach_cursor(mc)
        return mc

    # -- state ------------------------------------------------------------------------------------------------
    @property
    def mark_delete(self) -> Position:
        return self.cursor.mark_delete

    def is_acked(self, pos: Position) -> bool:
        return self.cursor.is_acked(pos)

    def backlog(self) -> int:
        """Entries after the mark-delete up to the last confirmed entry, minus those individually acked."""
        view = self.ml.view()
        total = view.count_entries(self.mark_delete, view.last_position())
        acked = sum(view.count_entries(s.previous(), e) for s, e in self.cursor.individually_deleted)
        return max(0, total - acked)

    def backlog_messages(self) -> int:
        """Messages (not entries: a batch entry holds many) after the mark-delete up to the last confirmed
        entry, minus those of the individually acked entries."""
        ml = self.ml
        last = ml.last_confirmed_position()
        total = ml.count_messages(self.mark_delete, last)
        acked = sum(ml.count_messages(s.previous(), e) for s, e in self.cursor.individually_deleted)
        return max(0, total - acked)

    # -- acknowledgements ----------------------------------------------------------------------------------------
    def ack_individual(self, pos: Position) -> bool:
        changed = self.cursor.ack_individual(pos)
        if changed:
            self._changed()
        return changed

    def ack_cumulative(self, pos: Position) -> bool:
        changed = self.cursor.ack_cumulative(pos)
        if changed:
            self._changed()
        return changed

    def ack_range(self, start: Position, end: Position) -> bool:
        """Every position from ``start`` to ``end`` acknowledged (``Cursor.ack_range``)."""
        changed = self.cursor.ack_range(start, end)
        if changed:
            self._changed()
        return changed

    def ack_batch(self, pos: Position, mask: int) -> bool:
        """Batch-index acks: messages ``mask`` of the batch at ``pos`` acknowledged, persisted with the cursor."""
        changed = self.cursor.ack_batch(pos, mask)
        if changed:
            self._changed()
        return changed

    async def reset(self, position: Position) -> None:
        """Move the subscription so that ``position`` is the next entry delivered (seek / reset-cursor)."""
        self.cursor.reset(Position(*position).previous())
        self.read_position = Position(*position)
        self._dirty = True
        await self.flush()

    async def mark_delete_with(self, position: Position, properties: Mapping[str, int]) -> None:
        """Pulsar's ``markDelete(position, properties)``, saved now (a compare-and-set, as every save): everything
        up to ``position`` acknowledged, the cursor's properties replaced. The compactor records its compacted
        ledger so."""
        self.cursor.reset(Position(*position))
        self.properties = dict(properties)
        self.read_position = self.ml.next_position(self.cursor.mark_delete)
        self._dirty = True
        await self.flush()

    async def set_subscription_properties(self, properties: Mapping[str, str]) -> None:
        """Pulsar's ``updateSubscriptionProperties``: the subscription's properties replaced, saved now; the old
        ones kept if the save fails (:exc:`SubscriptionPropertiesTooLargeError` before it for more than
        :data:`SUBSCRIPTION_PROPERTIES_MAX_BYTES`)."""
        new = dict(properties)
        size = len(json.dumps(new, separators=(",", ":")))
        if size > SUBSCRIPTION_PROPERTIES_MAX_BYTES:
            raise SubscriptionPropertiesTooLargeError(
                f"subscription properties of {size} bytes stored, more than the {SUBSCRIPTION_PROPERTIES_MAX_BYTES}"
                " allowed"
            )
        old, self.subscription_properties = self.subscription_properties, new
        self._dirty = True
        try:
            await self.flush()
        except BaseException:
            if self.subscription_properties is new:  # not saved: later saves carry the old ones, as before
                self.subscription_properties = old
            raise

    async def read_entries(self, max_entries: int) -> list[tuple[Position, bytes]]:
        """The next entries from ``read_position`` on that are not acknowledged yet; advances ``read_position``."""
        if self.read_position <= self.mark_delete:
            self.read_position = self.ml.next_position(self.mark_delete)
        got = await self.ml.read_entries(self.read_position, max_entries)
        if got:
            self.read_position = self.ml.next_position(got[-1][0])
        return [(p, data) for p, data in got if not self.cursor.is_acked(p)]

    def _changed(self) -> None:
        self.cursor.set_next_position(self.ml.next_position)
        self._dirty = True
        if self._flush_task is None and not self._closed:
            self._flush_task = asyncio.get_running_loop().create_task(self._flush_later())

    def touch(self) -> None:
        """Saved with the next delayed flush even if nothing else changed: its ``last_active_ms`` becomes now."""
        if not self._closed:
            self._changed()

    async def _flush_later(self) -> None:
        delay = self._last_flush + self._flush_interval_s - time.monotonic()
        try:
            if delay > 0:
                await asyncio.sleep(delay)
        finally:
            self._flush_task = None
        try:
            await self.flush()
        except (ManagedLedgerFencedError, ManagedLedgerClosedError):
            pass
        except zk.MetadataError as e:
            _saves_failing.warning(
                "ml=%s cursor=%s not saved yet (acks kept, saved later): %s", self.ml.name, self.name, e
            )
        except Exception:  # a task nobody awaits: log; the next ack, tick or close tries again
            log.exception("ml=%s cursor=%s flush failed", self.ml.name, self.name)
        else:
            _saves_failing.reset()

    # -- persistence --------------------------------------------------------------------------------------------
    async def refresh(self) -> bool:
        """An idle cursor with nothing unsaved adopts its znode when someone else wrote it (the Spark topic
        source moves its subscription with ``BrokerMetadataStore.save_cursor``), so retention and the next
        consumer see where it stands now, and the next flush does not conflict with that write.

        False when that znode is gone (an unsubscribe whose delete was applied with its reply lost left this
        cursor attached): its subscription is deleted and its saves would only fail, also those of changes not
        saved yet (acknowledgements its consumer sent after that delete: taken for a live cursor, they kept it
        served, its saves failing, for good)."""
        if self.active or self._closed:
            return True
        async with self._flush_lock:
            stored = await self.ml.store.get_cursor(self.ml.name, self.name)
            if stored is None and self._version >= 0 and not (self.active or self._closed):
                return False
            if stored is None or stored.version == self._version or self._dirty or self.active:
                return True
            self.cursor = Cursor.from_info(stored.value, self.ml.next_position)
            self.properties = dict(stored.value.properties)
            self.subscription_properties = dict(stored.value.subscription_properties)
            self.last_active_ms = stored.value.last_active_ms
            self._version = stored.version
            self.read_position = self.ml.next_position(self.cursor.mark_delete)
            self.moved = True
            log.info(
                "ml=%s cursor=%s moved by another writer to %s", self.ml.name, self.name, self.mark_delete
            )
            return True

    def _abandon(self) -> None:
        """Its subscription is deleted (:meth:`refresh` False): closed and detached, its unsaved changes and delayed
        flush dropped. That flush saved them at the version this cursor held, over the subscription made anew: a
        conflict that fenced the topic, or at version 0 the new cursor overwritten."""
        self._closed = True
        self._dirty = False
        task, self._flush_task = self._flush_task, None
        if task is not None:
            task.cancel()
        self.ml.detach_cursor(self.name)

    async def maybe_flush(self) -> None:
        if self._dirty and time.monotonic() - self._last_flush >= self._flush_interval_s:
            await self.flush()

    async def flush(self) -> None:
        """Write the cursor now if it changed. A conflict means another owner: the managed ledger is fenced."""
        async with self._flush_lock:
            if not self._dirty:
                return
            if self.ml.fenced:
                raise ManagedLedgerFencedError(
                    "cursor not persisted: the topic is fenced", ml_name=self.ml.name
                )
            info = self.cursor.to_info(
                properties=self.properties,
                last_active_ms=int(time.time() * 1000),
                subscription_properties=self.subscription_properties,
            )
            self._dirty = False
            try:
                saved = await self._save(info)
            except BaseException:
                self._dirty = True
                raise
            self._version = saved.version
            self.last_active_ms = info.last_active_ms
            self._unconfirmed.clear()
            self._last_flush = time.monotonic()

    async def _save(self, info: CursorInfo) -> Versioned[CursorInfo]:
        """CAS the cursor at our version. A conflict is another owner's write (the managed ledger is fenced)
        unless the stored cursor is one of our own writes whose reply was lost (ZooKeeper away, the request
        applied when it came back): then its version is ours and the write is made once more on top of it."""
        for _ in range(2):
            try:
                return await self.ml.store.save_cursor(self.ml.name, self.name, info, self._version)
            except (zk.MetadataVersionError, zk.MetadataExistsError) as e:
                stored = (
                    await self.ml.store.get_cursor(self.ml.name, self.name) if self._unconfirmed else None
                )
                # ours only if no write of another came after it: our unknown writes were all made at our
                # version, so one of them at most was applied, moving it on by exactly one (a new owner's
                # take-over write, of the same content as one of ours, moves it one further)
                if (
                    stored is None
                    or stored.value.to_json() not in self._unconfirmed
                    or stored.version != self._version + 1
                ):
                    raise self.ml.fence(f"cursor {self.name} written by another owner") from e
                log.info("ml=%s cursor=%s: a write whose reply was lost was applied", self.ml.name, self.name)
                self._version = stored.version
                self._unconfirmed.clear()
            except zk.MetadataError:
                self._unconfirmed = [*self._unconfirmed[-7:], info.to_json()]
                raise
        raise AssertionError("unreachable: the second conflict fences")

    async def close(self) -> None:
        """Flush and stop the delayed flush."""
        self._closed = True
        task, self._flush_task = self._flush_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if not self.ml.fenced:
            await self.flush()

    async def delete(self) -> None:
        """Remove the subscription (unsubscribe). If its flush or its znode's delete fails, the cursor is left
        attached and open, as it was, and the error raised: the delete can be tried again."""
        try:
            try:
                await self.close()
            except zk.MetadataNotFoundError:
                # its znode is gone already (an earlier delete applied, its reply lost; acks taken since): nothing
                # to save them to, the delete goes on (a retried UNSUBSCRIBE failed here each time)
                self._dirty = False
            await self.ml.delete_cursor(self.name)  # (its mark-delete counted until the znode is gone)
        except BaseException:
            self._closed = False
            self.ml.attach_cursor(self)
            raise
