"""Topic compaction: Pulsar's two-phase compactor, its compacted ledger and the view readers get of it.

A compaction writes, into a new ledger (the *compacted ledger*), the latest message of every key up to the
*horizon* (the topic's last entry when the compaction started), and records ``{compacted ledger id, horizon}``
where Pulsar does: in the ``__compaction`` subscription's cursor (``managed-ledgers/<ml>/cursors/__compaction``
in ZooKeeper), whose mark-delete is the horizon and whose property ``CompactedTopicLedger`` is the ledger id,
saved with the cursor's compare-and-set. That cursor is an ordinary durable cursor of the topic, so retention
keeps every ledger after the horizon (what the next compaction reads), and may trim the ones before it (the
compacted ledger holds what a compacted reader needs of them).

The two phases (pure rules :class:`PhaseOne`, :func:`phase_two_entry`), both over the *compacted view* as it
stands (the previous compacted ledger, then the topic's entries after the previous horizon, up to the new one):

1. the latest message id of each key: a message with a key and a payload sets it; one with an empty payload (a
   tombstone) removes the key; messages without a key play no part. A batch is unpacked: each of its messages
   counts on its own (its id is the entry's position and its index in the batch).
2. the entries that hold one of those latest messages are appended to the new ledger, in order, each with its
   original position: a message without a key is kept; a batch keeps its entry (and so the ids of the messages
   it keeps) with the messages it drops marked ``compacted_out`` and emptied; an entry that keeps nothing is
   left out. An entry that cannot be parsed is kept whole.

Then the cursor is saved (a conflict means another owner: the topic is fenced and the new ledger deleted), the
topic's view switches to the new ledger, and the previous compacted ledger is deleted, only after the new one is
recorded. A new owner (after a restart or a move) reads the cursor and serves the same view.

No ledger is left behind by a broker that dies in the middle: the new ledger's id is taken from the id generator
and recorded in the cursor (property ``CompactionLedgerWriting``) before the ledger is created under that id
(BookKeeper's ``createLedgerAdv(ledgerId)``), and the previous one's (``CompactionLedgerSuperseded``) with the new
record until it is deleted. The topic's next owner, when it loads the topic, deletes in the background a recorded
ledger that is not the ``CompactedTopicLedger`` (one never created is found gone) and then drops the record; the
next compaction, which waits for that, does the same for what is still named (a deletion that failed).

Automatic compaction (Pulsar's compaction threshold): every ``--compaction-monitor-interval-s`` the owner of a
topic compacts it when its backlog exceeds the threshold (``zk.managed_ledgers.policy_in_force`` says which one
applies, :func:`compaction_backlog` what is compared, :func:`compaction_due` the decision).

Compacted-ledger entry (ours; Pulsar's holds a RawMessage): ``[ledger id u64][entry id u64][stored entry]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import struct
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import zk
from ledger_client import BookKeeper, LedgerHandle
from ledger_client import errors as LE
from zk.ratelog import LOG_EVERY_S, RateLimitedLog

from . import pulsar_api_pb2 as pb
from . import wire
from .cursor import InitialPosition, ManagedCursor
from .managed_ledger import (
    ManagedLedger,
    ManagedLedgerError,
    ManagedLedgerFencedError,
    Position,
    _create_ledger,
)

log = logging.getLogger(__name__)

__all__ = [
    "COMPACTED_TOPIC_LEDGER_PROPERTY",
    "COMPACTION_SUBSCRIPTION",
    "SUPERSEDED_LEDGER_PROPERTY",
    "TEST_PAUSE_ENV",
    "WRITING_LEDGER_PROPERTY",
    "CompactedView",
    "CompactionStatus",
    "PhaseOne",
    "TopicCompaction",
    "compacted_out_mask",
    "compaction_backlog",
    "compaction_due",
    "last_kept_index",
    "decode_compacted",
    "encode_compacted",
    "phase_two_entry",
]

COMPACTION_SUBSCRIPTION = "__compaction"
COMPACTED_TOPIC_LEDGER_PROPERTY = "CompactedTopicLedger"
#: the ledger a compaction writes, recorded before it is created, and the compacted ledger a recorded one replaced
#: until it is deleted: a crash leaves them named, for the next load or compaction to delete (module docstring)
WRITING_LEDGER_PROPERTY = "CompactionLedgerWriting"
SUPERSEDED_LEDGER_PROPERTY = "CompactionLedgerSuperseded"
_LEFTOVER_PROPERTIES = (WRITING_LEDGER_PROPERTY, SUPERSEDED_LEDGER_PROPERTY)
#: tests only: ``after-create`` or ``after-record`` makes every compaction stop there for good (a broker to kill
#: in the middle of one); unset, as it must be in production, it changes nothing
TEST_PAUSE_ENV = "LEDGERSTORE_TEST_COMPACTION_PAUSE"
COMPONENT = b"compacted-ledger"
_ID = struct.Struct(">qq")
_READ_CHUNK = 500
_POSITION_CACHE = 1024

#: what a phase does with each chunk of the compacted view (up to ``_READ_CHUNK`` entries, in order)
_Visit = Callable[[list[tuple[Position, bytes]]], Awaitable[None]]


class CompactionStatus(enum.Enum):
    """Pulsar's ``LongRunningProcessStatus.Status``, as ``GET …/compaction`` answers it."""

    NOT_RUN = "NOT_RUN"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    ERROR = "ERROR"


class CompactionRunningError(Exception):
    """A compaction of the topic is under way already (``PUT …/compaction`` answers 409)."""


# --- pure rules --------------------------------------------------------------------------------------------------


def compaction_backlog(
    compaction_backlog_bytes: int | None, slowest_backlog_bytes: int | None, total_bytes: int
) -> int:
    """What the threshold is compared with (Pulsar's estimate): the ``__compaction`` cursor's backlog when the
    topic has that cursor (what the next compaction has to read), else, never compacted, the backlog of its
    slowest durable subscription, or the whole topic when it has none (None: no such cursor)."""
    if compaction_backlog_bytes is not None:
        return compaction_backlog_bytes
    if slowest_backlog_bytes is not None:
        return slowest_backlog_bytes
    return total_bytes


def compaction_due(threshold: int, backlog_bytes: int, *, running: bool, serving: bool) -> bool:
    """Whether the monitor starts a compaction now: the threshold is on (> 0) and exceeded, no compaction of the
    topic runs, and the topic is still served here (not unloaded, not fenced)."""
    return serving and not running and threshold > 0 and backlog_bytes > threshold


def encode_compacted(pos: Position, data: bytes | bytearray | memoryview) -> bytes:
    return _ID.pack(pos.ledger_id, pos.entry_id) + bytes(data)


def decode_compacted(raw: bytes) -> tuple[Position, bytes]:
    if len(raw) < _ID.size:
        raise wire.EntryFormatError(f"compacted-ledger entry of {len(raw)} bytes is shorter than its id")
    lid, eid = _ID.unpack_from(raw, 0)
    return Position(lid, eid), raw[_ID.size :]


def _key(meta: pb.MessageMetadata | pb.SingleMessageMetadata) -> str | None:
    if meta.HasField("partition_key") and not meta.null_partition_key:
        return meta.partition_key
    return None


def _messages(data: bytes) -> tuple[pb.MessageMetadata, list[tuple[pb.SingleMessageMetadata | None, bytes]]]:
    """The entry's metadata and messages; raises ``wire.EntryFormatError`` (also for an encrypted batch, whose
    messages cannot be told apart)."""
    md, payload = wire.parse_entry(data, verify_checksum=False)
    if md.HasField("num_messages_in_batch") and md.encryption_keys:
        raise wire.EntryFormatError("an encrypted batch")
    # ZLIB unpacked; LZ4, ZSTD and SNAPPY batches kept whole (pyarrow not run on the loop for every entry)
    return md, list(wire.iter_batch(md, payload, arrow=False))


class PhaseOne:
    """Phase one: the latest ``(position, batch index)`` of every key (batch index −1: not a batch)."""

    def __init__(self) -> None:
        self.latest: dict[str, tuple[Position, int]] = {}
        self.entries = 0

    def add(self, pos: Position, data: bytes) -> None:
        self.entries += 1
        try:
            md, messages = _messages(data)
        except wire.EntryFormatError:
            return  # kept whole by phase two; its keys are unknown
        batch = md.HasField("num_messages_in_batch")
        for index, (single, payload) in enumerate(messages):
            meta = single if single is not None else md
            if single is not None and single.compacted_out:
                continue
            key = _key(meta)
            if key is None:
                continue
            if payload and not meta.null_value:
                self.latest[key] = (pos, index if batch else -1)
            else:
                self.latest.pop(key, None)


def phase_two_entry(latest: dict[str, tuple[Position, int]], pos: Position, data: bytes) -> bytes | None:
    """Phase two: what of the entry at ``pos`` goes into the compacted ledger (the stored entry, rewritten for a
    batch that drops some of its messages), or None."""
    try:
        md, messages = _messages(data)
    except wire.EntryFormatError:
        return data
    if not md.HasField("num_messages_in_batch"):
        key = _key(md)
        return data if key is None or latest.get(key) == (pos, -1) else None
    keep = []
    for index, (single, _payload) in enumerate(messages):
        assert single is not None
        key = _key(single)
        keep.append(not single.compacted_out and (key is None or latest.get(key) == (pos, index)))
    if not any(keep):
        return None
    if all(keep):
        return data
    parts = []
    for kept, (single, payload) in zip(keep, messages, strict=True):
        assert single is not None
        if not kept:
            single.compacted_out = True
            single.payload_size = 0
            payload = b""
        meta = single.SerializeToString()
        parts += [struct.pack(">I", len(meta)), meta, payload]
    md.compression = pb.NONE
    md.ClearField("uncompressed_size")
    return wire.make_entry(md, b"".join(parts))


def compacted_out_mask(data: bytes) -> int:
    """Bit ``i`` set for message ``i`` of a batch entry marked ``compacted_out`` (0: none, or not a batch): the
    dispatcher leaves them out of the message's ack set, so clients that do not read the flag skip them too."""
    try:
        md, messages = _messages(data)
    except wire.EntryFormatError:
        return 0
    if not md.HasField("num_messages_in_batch"):
        return 0
    mask = 0
    for index, (single, _payload) in enumerate(messages):
        if single is not None and single.compacted_out:
            mask |= 1 << index
    return mask


# --- the compacted ledger as readers see it ----------------------------------------------------------------------


class CompactedView:
    """An open compacted ledger and its horizon. Entries are found by original position with a binary search
    over the ledger (positions increase along it), the positions it read kept in a small cache."""

    def __init__(self, handle: LedgerHandle, horizon: Position) -> None:
        self.handle = handle
        self.ledger_id = handle.ledger_id
        self.horizon = horizon
        self.entries = handle.last_add_confirmed + 1
        self._positions: OrderedDict[int, Position] = OrderedDict()

    async def _position_of(self, eid: int) -> Position:
        pos = self._positions.get(eid)
        if pos is None:
            entry = await self.handle.read_entry(eid)
            pos = decode_compacted(entry.data)[0]
            self._positions[eid] = pos
            while len(self._positions) > _POSITION_CACHE:
                self._positions.popitem(last=False)
        return pos

    async def find(self, start: Position) -> int:
        """The first entry id whose original position is at or after ``start`` (``entries`` when none is)."""
        lo, hi = 0, self.entries
        while lo < hi:
            mid = (lo + hi) // 2
            if await self._position_of(mid) < start:
                lo = mid + 1
            else:
                hi = mid
        return lo

    async def read(self, first: int, max_entries: int) -> list[tuple[Position, bytes]]:
        """Up to ``max_entries`` entries from entry id ``first``: (original position, stored entry)."""
        last = min(self.entries - 1, first + max_entries - 1)
        out: list[tuple[Position, bytes]] = []
        if first > last:
            return out
        async for e in self.handle.read(first, last):
            pos, data = decode_compacted(e.data)
            self._positions[e.entry_id] = pos
            out.append((pos, data))
        while len(self._positions) > _POSITION_CACHE:
            self._positions.popitem(last=False)
        return out

    async def read_at(self, pos: Position) -> bytes | None:
        """The entry kept at original position ``pos``, or None (compacted away)."""
        eid = await self.find(pos)
        if eid >= self.entries:
            return None
        got = await self.read(eid, 1)
        return got[0][1] if got and got[0][0] == pos else None

    async def last(self) -> tuple[Position, bytes] | None:
        if self.entries == 0:
            return None
        return (await self.read(self.entries - 1, 1))[0]

    async def close(self) -> None:
        with contextlib.suppress(LE.LedgerError):
            await self.handle.close()


# --- a topic's compaction ----------------------------------------------------------------------------------------


@dataclass
class _Stats:
    compacted_entries: int = 0
    removed_entries: int = 0
    last_duration_s: float = 0.0


class TopicCompaction:
    """A topic's compacted view (None until a compaction recorded one) and the compactor that replaces it."""

    def __init__(
        self,
        ml: ManagedLedger,
        bk: BookKeeper,
        open_cursor: Callable[[], Awaitable[ManagedCursor]] | None = None,
    ) -> None:
        """``open_cursor`` creates the ``__compaction`` cursor when a compaction needs it first (the topic's
        checks it as a new subscription: ``maxSubscriptionsPerTopic``); by default it is simply opened."""
        self.ml = ml
        self.bk = bk
        self._open_cursor = open_cursor or self._open_cursor_unchecked
        self.view: CompactedView | None = None
        self.status = CompactionStatus.NOT_RUN
        self.last_error = ""
        self.stats = _Stats()
        self.failures = RateLimitedLog(log, LOG_EVERY_S)
        self._cursor: ManagedCursor | None = None
        self._task: asyncio.Task[None] | None = None
        self._cleanup: asyncio.Task[None] | None = None  # the leftovers' deletion a load started
        self._closed = False
        self._deleting = False  # the ``__compaction`` subscription is being deleted (no compaction starts)

    async def _open_cursor_unchecked(self) -> ManagedCursor:
        return await ManagedCursor.open(self.ml, COMPACTION_SUBSCRIPTION, InitialPosition.EARLIEST)

    @property
    def horizon(self) -> Position | None:
        return None if self.view is None else self.view.horizon

    def ledger_stats(self) -> dict[str, object]:
        """Pulsar's ``compactedLedger`` of the internal stats (−1 without one)."""
        v = self.view
        if v is None:
            return {"ledgerId": -1, "entries": -1, "size": -1, "offloaded": False}
        return {"ledgerId": v.ledger_id, "entries": v.entries, "size": v.handle.length, "offloaded": False}

    async def load(self) -> None:
        """At open: the ``__compaction`` cursor as stored (attached, so that retention keeps what it needs) and
        the compacted ledger it records. The ledgers it names as written or superseded (left by a broker that
        died in the middle of a compaction) are deleted in the background, the load not waiting for it."""
        stored = await self.ml.store.get_cursor(self.ml.name, COMPACTION_SUBSCRIPTION)
        if stored is None:
            return
        self._cursor = await ManagedCursor.open(self.ml, COMPACTION_SUBSCRIPTION)
        lid = self._cursor.properties.get(COMPACTED_TOPIC_LEDGER_PROPERTY)
        if lid is not None:
            self.view = await self._open_view(lid, self._cursor.mark_delete)
            self.status = CompactionStatus.SUCCESS  # compacted before (Pulsar's says NOT_RUN after a reload)
        if any(k in self._cursor.properties for k in _LEFTOVER_PROPERTIES):
            self._cleanup = asyncio.get_running_loop().create_task(self._delete_leftovers_at_load())

    async def _delete_leftovers_at_load(self) -> None:
        try:
            await self._delete_leftovers()
        except Exception as e:  # still named: the next compaction tries again
            log.warning("ml=%s leftovers of an earlier compaction not deleted at load: %s", self.ml.name, e)

    async def _open_view(self, ledger_id: int, horizon: Position) -> CompactedView:
        try:
            handle = await self.bk.open_ledger(ledger_id, self.ml.config.password, recovery=False)
        except LE.LedgerError as e:
            raise ManagedLedgerError(
                f"cannot open compacted ledger {ledger_id}: {e}", ml_name=self.ml.name
            ) from e
        return CompactedView(handle, horizon)

    @property
    def running(self) -> bool:
        """A compaction runs, or the ``__compaction`` subscription is being deleted (none may start)."""
        return self._deleting or (self._task is not None and not self._task.done())

    @property
    def mark_delete(self) -> Position | None:
        """The ``__compaction`` cursor's mark-delete (the last horizon recorded), None without that cursor."""
        return None if self._cursor is None else self._cursor.mark_delete

    def trigger(self) -> None:
        """Start a compaction in the background; :class:`CompactionRunningError` when one runs already."""
        if self._deleting:
            raise CompactionRunningError(f"The compaction subscription of {self.ml.name} is being deleted")
        if self.running:
            raise CompactionRunningError(f"Compaction already in progress for {self.ml.name}")
        self.status = CompactionStatus.RUNNING
        self.last_error = ""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def wait(self) -> None:
        """Until the compaction under way (if any) ends."""
        task = self._task
        if task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(task)

    async def _run(self) -> None:
        try:
            await self.compact()
        except Exception as e:
            self.status = CompactionStatus.ERROR
            self.last_error = str(e) or type(e).__name__
            # (rate-limited: the compaction monitor starts it again at each interval while it fails)
            self.failures.warning("ml=%s compaction failed: %s", self.ml.name, self.last_error)
        else:
            self.status = CompactionStatus.SUCCESS
            self.failures.reset()

    async def _walk(self, old: CompactedView | None, horizon: Position, visit: _Visit) -> None:
        if old is not None:
            eid = 0
            while eid < old.entries:
                chunk = await old.read(eid, _READ_CHUNK)
                await visit(chunk)
                eid += len(chunk)
            start = self.ml.next_position(old.horizon)
        else:
            start = self.ml.first_position()
        while start <= horizon:
            got = await self.ml.read_entries(start, _READ_CHUNK)
            got = [(p, d) for p, d in got if p <= horizon]
            if not got:
                break
            await visit(got)
            start = self.ml.next_position(got[-1][0])

    async def compact(self) -> None:
        """Run both phases and record the result (module docstring). Nothing to do when nothing was added
        after the previous horizon."""
        started = time.monotonic()
        if self._cleanup is not None:  # the load's deletion of leftovers first: both change the cursor
            await asyncio.wait([self._cleanup])
        ml = self.ml
        cursor = self._cursor
        recorded = None if cursor is None else cursor.properties.get(COMPACTED_TOPIC_LEDGER_PROPERTY)
        if self.view is None and cursor is not None and recorded is not None:
            # recorded, but not opened then (ZooKeeper away): it is the base, since retention may have trimmed
            # what it covers
            self.view = await self._open_view(recorded, cursor.mark_delete)
        await self._delete_leftovers()
        horizon = ml.last_confirmed_position()
        old = self.view
        if horizon.entry_id < 0 or (old is not None and horizon <= old.horizon):
            return
        if self._cursor is None:
            self._cursor = await self._open_cursor()
        cursor = self._cursor
        one = PhaseOne()

        # each chunk's parsing (and a ZLIB batch's inflation, up to 256 MiB an entry) in a worker thread, off the
        # event loop; the phases' state is touched by nothing else meanwhile
        async def first(chunk: list[tuple[Position, bytes]]) -> None:
            def add_all() -> None:
                for pos, data in chunk:
                    one.add(pos, data)

            await asyncio.to_thread(add_all)

        await self._walk(old, horizon, first)
        # the new ledger's id is recorded before the ledger exists (BookKeeper's createLedgerAdv): a crash from
        # here on leaves it named for the next load or compaction to delete
        try:
            ledger_id = await self.bk.new_ledger_id()
        except LE.LedgerError as e:
            raise ManagedLedgerError(f"cannot allocate a ledger id: {e}", ml_name=ml.name) from e
        await cursor.mark_delete_with(
            cursor.mark_delete, {**cursor.properties, WRITING_LEDGER_PROPERTY: ledger_id}
        )
        lh = await _create_ledger(
            self.bk, ml.config, ml.name, COMPONENT, {"compacted-to": str(horizon).encode()}, ledger_id
        )
        await _test_pause("after-create", ml.name, lh.ledger_id)
        kept = 0
        pending: list[bytes] = []

        def kept_of(chunk: list[tuple[Position, bytes]]) -> list[bytes]:
            out = ((pos, phase_two_entry(one.latest, pos, data)) for pos, data in chunk)
            return [encode_compacted(pos, data) for pos, data in out if data is not None]

        async def second(chunk: list[tuple[Position, bytes]]) -> None:
            nonlocal kept
            got = await asyncio.to_thread(kept_of, chunk)
            pending.extend(got)
            kept += len(got)
            while len(pending) >= _READ_CHUNK:
                await lh.append_many(pending[:_READ_CHUNK])
                del pending[:_READ_CHUNK]

        try:
            await self._walk(old, horizon, second)
            if pending:
                await lh.append_many(pending)
            await lh.close()
        except BaseException:
            await self._delete_quietly(lh.ledger_id, lh)
            raise
        await self._record(lh.ledger_id, horizon, None if old is None else old.ledger_id)
        await _test_pause("after-record", ml.name, lh.ledger_id)
        try:
            view = await self._open_view(lh.ledger_id, horizon)
        except ManagedLedgerError:
            self.view = None  # recorded: the next open (or compaction) opens it
            raise
        self.view = view
        self.stats = _Stats(kept, one.entries - kept, time.monotonic() - started)
        log.info(
            "ml=%s compacted %d entries into %d in ledger %d up to %s",
            ml.name,
            one.entries,
            kept,
            lh.ledger_id,
            horizon,
        )
        if old is not None:
            await old.close()
            if await self._delete_quietly(old.ledger_id):
                await self._forget_leftovers(horizon, {COMPACTED_TOPIC_LEDGER_PROPERTY: lh.ledger_id})
        if self._closed:
            await view.close()

    async def _delete_leftovers(self) -> None:
        """Delete the ledgers the cursor names as written or superseded, other than the compacted ledger (what a
        broker that died in the middle of a compaction left), then drop their names; kept named while one is
        not deleted (bookies away), to try again at the next compaction."""
        cursor = self._cursor
        if cursor is None or not any(k in cursor.properties for k in _LEFTOVER_PROPERTIES):
            return
        # what it holds unsaved (an earlier record's undo that failed) stored first: the stored cursor may name
        # as compacted a ledger this one names as written
        await cursor.flush()
        props = dict(cursor.properties)
        adopted = props.get(COMPACTED_TOPIC_LEDGER_PROPERTY)
        for ledger_id in sorted({props[k] for k in _LEFTOVER_PROPERTIES if k in props} - {adopted}):
            log.info(
                "ml=%s deleting compacted ledger %d left by an earlier compaction", self.ml.name, ledger_id
            )
            if not await self._delete_quietly(ledger_id):
                return
        rest = {k: v for k, v in props.items() if k not in _LEFTOVER_PROPERTIES}
        await cursor.mark_delete_with(cursor.mark_delete, rest)

    async def _forget_leftovers(self, horizon: Position, properties: dict[str, int]) -> None:
        """The superseded ledger is deleted: its name is dropped from the cursor (if this save fails, the next
        compaction deletes it again, finds it gone, and drops it)."""
        assert self._cursor is not None
        try:
            await self._cursor.mark_delete_with(horizon, properties)
        except Exception as e:
            log.warning("ml=%s compaction cursor not saved after deleting a ledger: %s", self.ml.name, e)

    async def _record(self, ledger_id: int, horizon: Position, superseded: int | None) -> None:
        """Save ``{ledger_id, horizon}`` (and the ``superseded`` ledger's id, until it is deleted) in the
        ``__compaction`` cursor. On a conflict (another owner: the
        managed ledger is fenced) the ledger is deleted. On any other failure (ZooKeeper did not answer, or the
        topic closed while it waited) the save may have been applied, and the cursor holds the new state as
        unsaved, to save it later: the previous record is saved again (our own lost write is taken over, as
        :class:`ManagedCursor` does) and only once it is stored is the ledger deleted; while it is not, the
        ledger is kept (left over, logged), never deleted while the stored cursor may name it."""
        assert self._cursor is not None
        cursor = self._cursor
        previous = (cursor.mark_delete, dict(cursor.properties))
        record = {COMPACTED_TOPIC_LEDGER_PROPERTY: ledger_id}
        if superseded is not None:
            record[SUPERSEDED_LEDGER_PROPERTY] = superseded
        try:
            await cursor.mark_delete_with(horizon, record)
        except ManagedLedgerFencedError:
            await self._delete_quietly(ledger_id)
            raise
        except BaseException:
            try:
                await cursor.mark_delete_with(*previous)
            except Exception as e:
                log.warning(
                    "ml=%s compacted ledger %d kept: the cursor may name it (%s)", self.ml.name, ledger_id, e
                )
            else:
                await self._delete_quietly(ledger_id)
            raise

    async def _delete_quietly(self, ledger_id: int, lh: LedgerHandle | None = None) -> bool:
        """Delete the ledger; whether it is gone (False: not deleted, logged)."""
        if lh is not None:
            with contextlib.suppress(LE.LedgerError):
                await lh.close()
        try:
            await self.bk.delete_ledger(ledger_id)
        except LE.NoSuchLedgerError:
            pass
        except LE.LedgerError as e:
            log.warning("ml=%s compacted ledger %d not deleted: %s", self.ml.name, ledger_id, e)
            return False
        return True

    async def close(self) -> None:
        """The topic closes: a compaction under way is cancelled (its ledger deleted), the view's handle closed."""
        self._closed = True
        for task in (self._task, self._cleanup):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await task
        if self.view is not None:
            await self.view.close()

    async def delete_subscription(self) -> bool:
        """An admin's DELETE of the ``__compaction`` subscription, as Pulsar's
        (``asyncDeleteCursorWithCleanCompactionLedger``): once the compaction under way has ended (none starts
        meanwhile: :class:`CompactionRunningError`), the compacted ledger goes with the cursor and the topic serves
        no compacted view; the next compaction starts from the first entry. False without that cursor here.

        Never a cursor naming a deleted ledger as compacted (the topic's next load would fail to open it): the
        leftovers of earlier compactions are deleted first, then the compacted ledger is recorded as superseded
        and the view dropped, then it is deleted, then the cursor. A failure on the way (bookies or ZooKeeper
        away) raises with the cursor kept, what it still names deleted by a DELETE again, the next compaction
        or the next load."""
        if self._deleting:
            raise CompactionRunningError(f"The compaction subscription of {self.ml.name} is being deleted")
        self._deleting = True
        try:
            await self.wait()
            if self._cleanup is not None:
                await asyncio.wait([self._cleanup])
            cursor = self._cursor
            if cursor is None:
                return False
            await self._delete_leftovers()
            if any(k in cursor.properties for k in _LEFTOVER_PROPERTIES):
                raise ManagedLedgerError(
                    "a ledger of an earlier compaction could not be deleted", ml_name=self.ml.name
                )
            compacted = cursor.properties.get(COMPACTED_TOPIC_LEDGER_PROPERTY)
            if compacted is not None:
                await cursor.mark_delete_with(cursor.mark_delete, {SUPERSEDED_LEDGER_PROPERTY: compacted})
            view, self.view = self.view, None
            if view is not None:
                await view.close()
            if compacted is not None and not await self._delete_quietly(compacted):
                raise ManagedLedgerError(f"compacted ledger {compacted} not deleted", ml_name=self.ml.name)
            await cursor.delete()  # (its znode too)
            self._cursor = None
            return True
        finally:
            self._deleting = False

    async def delete(self) -> None:
        """The topic is deleted: its compacted ledger goes too, the view's and the one the ``__compaction``
        cursor names, if another (a compaction cancelled after recording its ledger, before serving it)."""
        await self.close()
        ledgers = set() if self.view is None else {self.view.ledger_id}
        self.view = None
        try:
            stored = await self.ml.store.get_cursor(self.ml.name, COMPACTION_SUBSCRIPTION)
        except zk.MetadataError as e:
            log.warning(
                "ml=%s compaction cursor not read: its compacted ledger may stay: %s", self.ml.name, e
            )
        else:
            props = {} if stored is None else stored.value.properties
            for name in (COMPACTED_TOPIC_LEDGER_PROPERTY, *_LEFTOVER_PROPERTIES):
                if name in props:
                    ledgers.add(props[name])
        for ledger_id in sorted(ledgers):
            await self._delete_quietly(ledger_id)


async def _test_pause(point: str, ml_name: str, ledger_id: int) -> None:
    """Tests only (:data:`TEST_PAUSE_ENV`): stop the compaction here for good, logged, for a test to kill the
    broker in the middle of it."""
    if os.environ.get(TEST_PAUSE_ENV) == point:
        log.warning("ml=%s compaction paused %s of ledger %d (%s)", ml_name, point, ledger_id, TEST_PAUSE_ENV)
        await asyncio.Event().wait()


def last_kept_index(data: bytes) -> int:
    """The batch index of the last message a compacted-ledger entry keeps (−1: not a batch)."""
    try:
        md, messages = _messages(data)
    except wire.EntryFormatError:
        return -1
    if not md.HasField("num_messages_in_batch"):
        return -1
    for index in range(len(messages) - 1, -1, -1):  # (the messages parsed once: compacted_out_mask's rule)
        single = messages[index][0]
        if single is None or not single.compacted_out:
            return index
    return -1
