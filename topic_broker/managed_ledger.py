"""``ManagedLedger``: a topic (or partition) as an ordered chain of ledgers, Pulsar's ManagedLedger.

The ledger list lives at ``managed-ledgers/<ml name>`` (``zk.managed_ledgers.ManagedLedgerInfo``); only the last
ledger may be open and only the owner writes it. Every change of the list is a compare-and-set: a conflict means
another broker took the topic over, and this instance is *fenced* (it acknowledges nothing more, invariant 9).

Opening as the new owner (``ManagedLedger.open``): read (or create) the list, recovery-open the last ledger
(which fences the previous owner's writer on the bookies and closes the ledger), record its entries and size,
drop empty ledgers, create a fresh ledger and CAS the list. Ledgers dropped are deleted after the CAS.

Rollover (pure rule :func:`should_rollover`, Pulsar's ``currentLedgerIsFull``): the current ledger is full when
it holds ``max_entries_per_ledger`` entries or ``max_size_per_ledger_bytes`` bytes, or is older than
``max_rollover_time_s``; it is then rolled once it is older than ``min_rollover_time_s``. An empty ledger is never
rolled. Appends check before they are sent; ``tick()`` (the broker calls it periodically) rolls idle ledgers.

Retention (pure rule :func:`ledgers_to_trim`, Pulsar's ``internalTrimLedgers``): walking ledgers oldest first and
never the current one, a ledger is deleted when it is fully consumed by the slowest cursor (its last entry is at
or before the slowest mark-delete; every ledger when there is no cursor) **and** either its retention time expired
(closed longer ago than ``retention_time_s``) or the data that would remain without it and all older ledgers is
still at least ``retention_size_bytes``. The walk stops at the first ledger that is kept. A negative limit is
unlimited (that condition never holds); 0 / 0 deletes ledgers as soon as they are consumed. A terminated managed
ledger keeps the ledger of its terminated position too, whatever retention says: Pulsar's terminate closes its
current ledger and opens none, and trimming never takes the current ledger, while here the terminate rolls over.

Errors::

    ManagedLedgerError                 MANAGED_LEDGER     (retriable: an append failed, the ledger is replaced)
    ├── ManagedLedgerFencedError       ML_FENCED          another owner took over: stop serving the topic
    └── ManagedLedgerClosedError       ML_CLOSED          closed or deleted by its owner
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, NamedTuple, Protocol

import zk
from ledger_client import BookKeeper, LedgerHandle
from ledger_client import errors as LE
from zk.managed_ledgers import BrokerMetadataStore, LedgerInfo, ManagedLedgerInfo

log = logging.getLogger(__name__)

__all__ = [
    "AppendCallback",
    "QueuedEntry",
    "DEFAULT_ACK_QUORUM",
    "DEFAULT_ENSEMBLE_SIZE",
    "DEFAULT_MAX_ENTRIES_PER_LEDGER",
    "DEFAULT_MAX_ROLLOVER_TIME_S",
    "DEFAULT_MAX_SIZE_PER_LEDGER_BYTES",
    "DEFAULT_MIN_ROLLOVER_TIME_S",
    "DEFAULT_WRITE_QUORUM",
    "LedgerView",
    "ManagedLedger",
    "ManagedLedgerClosedError",
    "ManagedLedgerTerminatedError",
    "ManagedLedgerConfig",
    "ManagedLedgerError",
    "ManagedLedgerFencedError",
    "Position",
    "ledgers_to_trim",
    "should_rollover",
]

DEFAULT_ENSEMBLE_SIZE = 2  # Pulsar's managedLedgerDefaultEnsembleSize / WriteQuorum / AckQuorum
DEFAULT_WRITE_QUORUM = 2
DEFAULT_ACK_QUORUM = 2
DEFAULT_MAX_ENTRIES_PER_LEDGER = 50_000
DEFAULT_MAX_SIZE_PER_LEDGER_BYTES = 2 * 1024**3
DEFAULT_MIN_ROLLOVER_TIME_S = 10 * 60.0
DEFAULT_MAX_ROLLOVER_TIME_S = 4 * 3600.0
DEFAULT_RETENTION_TIME_S = 0.0
DEFAULT_RETENTION_SIZE_BYTES = 0
DEFAULT_READ_HANDLES_MAX = 64
DEFAULT_READ_ENTRIES_MAX = 10_000
DEFAULT_ENTRY_CACHE_BYTES = 4 * 1024**2  # Pulsar's managed-ledger cache, per managed ledger here

APPLICATION = b"ledgerstore-broker"
COMPONENT = b"managed-ledger"


#: The first wait after a failed rollover (no new ledger: too few bookies, ZooKeeper away) before it is tried again;
#: each further failure doubles it, up to ROLLOVER_RETRY_MAX_S
ROLLOVER_RETRY_MIN_S = 0.5
ROLLOVER_RETRY_MAX_S = 5.0


class ManagedLedgerError(Exception):
    code: ClassVar[str] = "MANAGED_LEDGER"
    retriable: ClassVar[bool] = True

    def __init__(self, message: str, *, ml_name: str | None = None) -> None:
        super().__init__(message if ml_name is None else f"{message} (managed ledger {ml_name})")
        self.ml_name = ml_name


class ManagedLedgerFencedError(ManagedLedgerError):
    code = "ML_FENCED"
    retriable = False


class ManagedLedgerClosedError(ManagedLedgerError):
    code = "ML_CLOSED"
    retriable = False


class ManagedLedgerTerminatedError(ManagedLedgerError):
    """Terminated (:meth:`ManagedLedger.terminate`): nothing is appended any more, by any owner."""

    code = "ML_TERMINATED"
    retriable = False


class Position(NamedTuple):
    """(ledger id, entry id): Pulsar's MessageIdData. ``(l, -1)`` is "before the first entry of ledger l"."""

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    def previous(self) -> Position:
        """The position a cursor's mark-delete takes so that its next entry is this one."""
        return Position(self.ledger_id, self.entry_id - 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class ManagedLedgerConfig:
    ensemble_size: int = DEFAULT_ENSEMBLE_SIZE
    write_quorum: int = DEFAULT_WRITE_QUORUM
    ack_quorum: int = DEFAULT_ACK_QUORUM
    password: bytes = b""
    max_entries_per_ledger: int = DEFAULT_MAX_ENTRIES_PER_LEDGER
    max_size_per_ledger_bytes: int = DEFAULT_MAX_SIZE_PER_LEDGER_BYTES
    min_rollover_time_s: float = DEFAULT_MIN_ROLLOVER_TIME_S
    max_rollover_time_s: float = DEFAULT_MAX_ROLLOVER_TIME_S
    retention_time_s: float = DEFAULT_RETENTION_TIME_S
    retention_size_bytes: int = DEFAULT_RETENTION_SIZE_BYTES
    read_handles_max: int = DEFAULT_READ_HANDLES_MAX
    entry_cache_bytes: int = DEFAULT_ENTRY_CACHE_BYTES

    def __post_init__(self) -> None:
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise ValueError("need ensemble_size >= write_quorum >= ack_quorum >= 1")
        if self.max_entries_per_ledger < 1 or self.max_size_per_ledger_bytes < 1:
            raise ValueError("rollover limits must be positive")
        if not 0 <= self.min_rollover_time_s <= self.max_rollover_time_s:
            raise ValueError("need 0 <= min_rollover_time_s <= max_rollover_time_s")
        if self.read_handles_max < 1:
            raise ValueError("read_handles_max must be at least 1")


# --- pure rules ------------------------------------------------------------------------------------------------


class EntryCache:
    """The entries this owner appended most recently, by position, up to ``max_bytes`` (the oldest leave
    first): consumers at the tail read them from here instead of from the bookies, as from Pulsar's
    managed-ledger cache. Holds only durable entries (put once acknowledged), as they were appended."""

    __slots__ = ("_entries", "_bytes", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        size = len(data)
        if size > self.max_bytes:
            return
        entries = self._entries
        entries[ledger_id, entry_id] = data
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._bytes -= len(entries.popitem(last=False)[1])

    def take(self, ledger_id: int, first: int, last: int, out: list[tuple[Position, bytes]]) -> int:
        """Append the cached run of entries ``first``..``last`` of ``ledger_id`` to ``out`` (stopping at the
        first one not cached); returns the next entry id to read elsewhere."""
        get = self._entries.get
        eid = first
        while eid <= last:
            data = get((ledger_id, eid))
            if data is None:
                break
            out.append((Position(ledger_id, eid), data))
            eid += 1
        return eid

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0


def should_rollover(config: ManagedLedgerConfig, entries: int, size_bytes: int, age_s: float) -> bool:
    """Pulsar's ``currentLedgerIsFull``: space or max age reached, and older than the minimum; never when empty."""
    if entries <= 0:
        return False
    space = entries >= config.max_entries_per_ledger or size_bytes >= config.max_size_per_ledger_bytes
    if not (space or age_s >= config.max_rollover_time_s):
        return False
    return config.min_rollover_time_s <= 0 or age_s > config.min_rollover_time_s


def _consumed(li: LedgerInfo, mark_delete: Position | None) -> bool:
    if mark_delete is None:
        return True
    if li.ledger_id != mark_delete.ledger_id:
        return li.ledger_id < mark_delete.ledger_id
    return mark_delete.entry_id >= li.entries - 1


def ledgers_to_trim(
    ledgers: Sequence[LedgerInfo],
    *,
    current_ledger_id: int,
    current_size: int,
    slowest_mark_delete: Position | None,
    retention_time_s: float,
    retention_size_bytes: int,
    now_ms: int,
    terminated_ledger_id: int | None = None,
) -> list[int]:
    """The ledgers retention lets go (see the module docstring for the rule), oldest first. A terminated managed
    ledger's ``terminated_ledger_id`` (the ledger of its terminated position) is kept as the current one is."""
    total = current_size + sum(li.size for li in ledgers if li.ledger_id != current_ledger_id)
    to_delete_size = 0
    out: list[int] = []
    for li in ledgers:
        if li.ledger_id in (current_ledger_id, terminated_ledger_id) or not _consumed(
            li, slowest_mark_delete
        ):
            break
        to_delete_size += li.size
        expired = retention_time_s >= 0 and now_ms - li.timestamp_ms > retention_time_s * 1000
        over_size = retention_size_bytes >= 0 and total - to_delete_size >= retention_size_bytes
        if not (expired or over_size):
            break
        out.append(li.ledger_id)
    return out


@dataclass(frozen=True, slots=True)
class LedgerView:
    """A snapshot of the ledger chain: ``(ledger id, entries)`` oldest first; the last is the current ledger
    (its entries = LAC + 1). Position arithmetic across ledger boundaries, pure."""

    ledgers: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        assert self.ledgers, "a managed ledger always has a current ledger"

    @property
    def current_ledger_id(self) -> int:
        return self.ledgers[-1][0]

    def entries_in(self, ledger_id: int) -> int:
        for lid, n in self.ledgers:
            if lid == ledger_id:
                return n
        return 0

    def first_position(self) -> Position:
        """The oldest stored entry, or the next one to be written when there is none."""
        for lid, n in self.ledgers:
            if n > 0:
                return Position(lid, 0)
        lid, n = self.ledgers[-1]
        return Position(lid, n)

    def last_position(self) -> Position:
        """The newest confirmed entry; ``(first ledger, -1)`` when there is none."""
        for lid, n in reversed(self.ledgers):
            if n > 0:
                return Position(lid, n - 1)
        return Position(self.ledgers[0][0], -1)

    def next_position(self, pos: Position) -> Position:
        """The position after ``pos``, skipping to the next ledger at the end of a closed one."""
        cur = self.current_ledger_id
        for lid, n in self.ledgers:
            if lid == pos.ledger_id and (pos.entry_id + 1 < n or lid == cur):
                return Position(lid, pos.entry_id + 1)
            if lid > pos.ledger_id and (n > 0 or lid == cur):
                return Position(lid, 0)
        return Position(pos.ledger_id, pos.entry_id + 1)

    def resolve(self, start: Position) -> Position | None:
        """The first stored (confirmed) position at or after ``start``; None when there is none yet."""
        for lid, n in self.ledgers:
            if lid == start.ledger_id and max(start.entry_id, 0) < n:
                return Position(lid, max(start.entry_id, 0))
            if lid > start.ledger_id and n > 0:
                return Position(lid, 0)
        return None

    def count_entries(self, after: Position, upto: Position) -> int:
        """Entries at positions ``p`` with ``after < p <= upto``."""
        count = 0
        for lid, n in self.ledgers:
            lo = 0 if lid > after.ledger_id else (after.entry_id + 1 if lid == after.ledger_id else n)
            hi = n - 1 if lid < upto.ledger_id else (upto.entry_id if lid == upto.ledger_id else -1)
            count += max(0, min(hi, n - 1) - max(lo, 0) + 1)
        return count

    def total_entries(self) -> int:
        return sum(n for _, n in self.ledgers)

    def position_at(self, index: int) -> Position:
        """The ``index``-th stored entry (0 = the oldest)."""
        for lid, n in self.ledgers:
            if index < n:
                return Position(lid, index)
            index -= n
        raise IndexError("position index beyond the last entry")


def _min_position(positions: Iterable[Position]) -> Position | None:
    return min(positions, default=None)


# --- the managed ledger ------------------------------------------------------------------------------------------


#: Called once per appended entry: its position when durable, else the error that failed it.
AppendCallback = Callable[["Position | None", "ManagedLedgerError | None"], None]
#: An entry to append, its callback, and how many messages it holds (a client batch holds many).
QueuedEntry = tuple[bytes, AppendCallback, int]
LE_AddCallback = Callable[[int, "LE.LedgerError | None"], None]


class CursorHook(Protocol):
    """What the managed ledger needs of an attached cursor (``topic_broker.cursor.ManagedCursor``)."""

    name: str

    @property
    def mark_delete(self) -> Position: ...

    async def maybe_flush(self) -> None: ...

    async def refresh(self) -> bool:
        """Adopt the stored state if someone else moved the cursor's znode while it is idle here; False when
        that znode is gone (deleted)."""
        ...

    async def close(self) -> None: ...


_OPEN, _FENCED, _CLOSED = "open", "fenced", "closed"


class ManagedLedger:
    """Build it with :meth:`open`. Not thread-safe: use it from one event loop."""

    def __init__(
        self,
        bk: BookKeeper,
        store: BrokerMetadataStore,
        name: str,
        config: ManagedLedgerConfig,
        info: zk.Versioned[ManagedLedgerInfo],
        current: LedgerHandle,
        stored_marks: Mapping[str, Position],
        clock: Callable[[], float],
    ) -> None:
        self.bk = bk
        self.store = store
        self.name = name
        self.config = config
        self.retention_time_s = config.retention_time_s
        self.retention_size_bytes = config.retention_size_bytes
        self._clock = clock
        self._info = info
        self._current = current
        self._current_created_s = clock()
        self._current_entries = 0
        self._current_size = 0
        self._current_messages = array("I")  # messages of each entry sent to the current ledger
        # Per-entry message counts of closed ledgers this owner wrote or counted (dropped when trimmed); other
        # ledgers are known by their LedgerInfo.messages total (0: one per entry)
        self._entry_messages: dict[int, array[int]] = {}
        self._current_failed = False
        #: the current ledger's closed record once a rollover closed it: a rollover that failed after the close
        #: (no new ledger: too few bookies) is retried at the next append, and closes it no second time
        self._closed: LedgerInfo | None = None
        #: called before each write of the ledger list: the owner's last chance to ``set_property`` what it
        #: keeps up to date lazily (the topic's skipped sequence ids)
        self.before_list_write: Callable[[], None] | None = None
        self._rollover_wait_s = 0.0  # after a failed rollover: the wait before the next try, and when that is
        self._rollover_retry_at = 0.0
        self._rollover_error = ""
        self._cache = EntryCache(config.entry_cache_bytes)
        #: (current ledger, its last entry acknowledged and handed to its callback): what read_cached serves up to
        self._added = (current.ledger_id, current.last_add_confirmed)
        self._added_size = current.length  # bytes of the current ledger's entries acknowledged so far
        self._state = _OPEN
        self._fence_reason = ""
        self._submit_lock = asyncio.Lock()  # FIFO: appends are sent in call order; rollover holds it
        self._meta_lock = asyncio.Lock()  # one change of the ledger list at a time
        self._read_handles: OrderedDict[int, LedgerHandle] = OrderedDict()
        self._cursors: dict[str, CursorHook] = {}
        #: cursor opens under way (``ManagedCursor.open``): name -> set when it is over; another open of the name
        #: waits for it and takes the cursor it attached, so that a subscription has one cursor object
        self.cursor_opens: dict[str, asyncio.Event] = {}
        # Mark-delete positions of persisted cursors nobody attached yet: retention must respect them too.
        self._stored_marks: dict[str, Position] = dict(stored_marks)
        # cursor znodes deleted (delete_cursor) while refresh_cursors ran: name -> the count of deletes then, so
        # that a refresh which read one before it went does not bring its mark back (cleared with no refresh left)
        self._cursor_deletes = 0
        self._deleted_cursors: dict[str, int] = {}
        self._refreshes = 0
        self._pending_properties: dict[str, str] = {}

    # -- opening ----------------------------------------------------------------------------------------------
    @classmethod
    async def open(
        cls,
        bk: BookKeeper,
        store: BrokerMetadataStore,
        name: str,
        config: ManagedLedgerConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> ManagedLedger:
        """Open ``name`` as its new owner (fencing any previous owner). Raises ManagedLedgerFencedError when
        another broker changed the ledger list meanwhile."""
        config = config or ManagedLedgerConfig()
        zk.layout.check_ml_name(name)
        versioned = await store.get_ml_info(name)
        if versioned is None:
            try:
                versioned = await store.create_ml_info(name, ManagedLedgerInfo())
            except zk.MetadataExistsError:
                versioned = await store.get_ml_info(name)
                if versioned is None:
                    raise ManagedLedgerFencedError("created and deleted concurrently", ml_name=name) from None
        ledgers = list(versioned.value.ledgers)
        now_ms = int(clock() * 1000)
        if ledgers:
            ledgers[-1] = await _recover_last(bk, config, name, ledgers[-1], now_ms)
        dropped = [li.ledger_id for li in ledgers if li.entries == 0]
        kept = [li for li in ledgers if li.entries > 0]
        lh = await _create_ledger(bk, config, name)
        new_info = replace(versioned.value, ledgers=(*kept, LedgerInfo(ledger_id=lh.ledger_id)))
        try:
            versioned = await store.set_ml_info(name, new_info, versioned.version)
        except zk.MetadataError as e:
            await _discard_ledger(bk, lh)
            if isinstance(e, zk.MetadataVersionError):
                raise ManagedLedgerFencedError("another owner changed the ledger list", ml_name=name) from e
            raise ManagedLedgerError(f"cannot record the new ledger: {e}", ml_name=name) from e
        for lid in dropped:
            await _delete_ledger_quietly(bk, lid)
        marks: dict[str, Position] = {}
        for sub in await store.list_cursors(name):
            ci = await store.get_cursor(name, sub)
            if ci is not None:
                marks[sub] = Position(*ci.value.mark_delete)
        log.info(
            "ml=%s opened: ledgers=%s current=%d dropped_empty=%s",
            name,
            [li.ledger_id for li in kept],
            lh.ledger_id,
            dropped,
        )
        return cls(bk, store, name, config, versioned, lh, marks, clock)

    # -- state ------------------------------------------------------------------------------------------------
    @property
    def fenced(self) -> bool:
        return self._state == _FENCED

    @property
    def closed(self) -> bool:
        return self._state != _OPEN

    @property
    def info(self) -> ManagedLedgerInfo:
        """The ledger list as last written (the current ledger's entries/size are 0 there)."""
        return self._info.value

    @property
    def properties(self) -> Mapping[str, str]:
        return {**self._info.value.properties, **self._pending_properties}

    @property
    def current_ledger_id(self) -> int:
        return self._current.ledger_id

    @property
    def current_size(self) -> int:
        """Bytes appended to the current ledger (sent; the closed ledgers' sizes are in :attr:`info`)."""
        return self._current_size

    @property
    def total_size(self) -> int:
        """Bytes of every ledger (Pulsar's ``totalSize``): the closed ones as recorded, the current one as sent."""
        return self._current_size + sum(li.size for li in self._info.value.ledgers[:-1])

    def _check_writable(self) -> None:
        if self._state == _FENCED:
            raise ManagedLedgerFencedError(f"fenced: {self._fence_reason}", ml_name=self.name)
        if self._state == _CLOSED:
            raise ManagedLedgerClosedError("closed", ml_name=self.name)
        if self._info.value.terminated_position is not None:
            raise ManagedLedgerTerminatedError("terminated", ml_name=self.name)

    @property
    def terminated_position(self) -> Position | None:
        """The last entry of a terminated managed ledger (stored, so every later owner knows it); else None."""
        tp = self._info.value.terminated_position
        return None if tp is None else Position(*tp)

    async def terminate(self) -> Position:
        """Pulsar's terminate: nothing is appended after the entries stored now. The current ledger is rolled
        over first (so the appends sent before are durable and counted), then its last entry is recorded as the
        ledger list's ``terminated_position``. Answers that position, again when terminated already."""
        async with self._submit_lock:
            done = self.terminated_position
            if done is not None:
                return done
            self._check_writable()
            await self._rollover_locked()
            last = self.view().last_position()
            async with self._meta_lock:
                tp = (last.ledger_id, last.entry_id)
                self._info = zk.Versioned(
                    replace(self._info.value, terminated_position=tp), self._info.version
                )
                await self._cas(self._info.value.ledgers)
        log.info("ml=%s terminated at %s", self.name, last)
        return last

    def fence(self, reason: str) -> ManagedLedgerFencedError:
        if self._state == _OPEN:
            self._state = _FENCED
            self._fence_reason = reason
            log.warning("ml=%s fenced: %s", self.name, reason)
        return ManagedLedgerFencedError(f"fenced: {self._fence_reason or reason}", ml_name=self.name)

    def view(self) -> LedgerView:
        """A snapshot of the chain; the current ledger counts its confirmed entries (LAC + 1)."""
        cur = self._current
        closed = tuple((li.ledger_id, li.entries) for li in self._info.value.ledgers[:-1])
        return LedgerView((*closed, (cur.ledger_id, cur.last_add_confirmed + 1)))

    # -- appending ----------------------------------------------------------------------------------------------
    async def append(self, entry: bytes) -> Position:
        """Append one entry; returns its position once it is durable (acknowledged in order)."""
        fut = await self.append_future(entry)
        return await fut

    async def append_many(self, entries: Iterable[bytes]) -> list[Position]:
        futs = [await self.append_future(e) for e in entries]
        return list(await asyncio.gather(*futs))

    async def append_future(self, entry: bytes) -> asyncio.Future[Position]:
        """Send one entry (in call order) and return a future of its position; waits while the ledger client
        applies back-pressure or a rollover is under way."""
        fut: asyncio.Future[Position] = asyncio.get_running_loop().create_future()

        def done(pos: Position | None, error: ManagedLedgerError | None) -> None:
            if fut.done():
                return
            if error is None:
                assert pos is not None
                fut.set_result(pos)
            else:
                fut.set_exception(error)

        await self.append_from(deque([(entry, done, 1)]))
        return fut

    async def append_from(self, queue: deque[QueuedEntry]) -> None:
        """Send the entries of ``queue`` from its left in order, removing each once it is sent, until it is
        empty (entries queued meanwhile included); each one's callback runs once, on the event loop, with its
        position when it is durable or with the error that failed it. One lock acquisition for all: the
        broker's per-topic appender hands over everything that arrived since its last turn. Raises (the
        failing entry left at the head of ``queue``, its callback not called) when the managed ledger is
        fenced or closed or the ledger client refuses the entry."""
        self._check_writable()
        async with self._submit_lock:
            config, clock = self.config, self._clock
            while queue:
                self._check_writable()
                entry, callback, messages = queue[0]
                if self._current_failed or should_rollover(
                    config, self._current_entries, self._current_size, clock() - self._current_created_s
                ):
                    await self._rollover_locked()
                lh = self._current
                lid = lh.ledger_id
                try:
                    await lh.append_callback(entry, self._on_added(lid, entry, callback))
                except LE.LedgerError as e:
                    raise self._write_failed(lid, e) from e
                queue.popleft()
                self._current_entries += 1
                self._current_size += len(entry)
                self._current_messages.append(max(1, messages))

    def _on_added(self, ledger_id: int, entry: bytes, callback: AppendCallback) -> LE_AddCallback:
        put = self._cache.put

        def added(entry_id: int, error: LE.LedgerError | None) -> None:
            if error is None:
                put(ledger_id, entry_id, entry)
                if ledger_id == self._added[0]:
                    self._added = (ledger_id, entry_id)
                    self._added_size += len(entry)
                callback(Position(ledger_id, entry_id), None)
            else:
                callback(None, self._write_failed(ledger_id, error))

        return added

    def _write_failed(self, ledger_id: int, error: LE.LedgerError) -> ManagedLedgerError:
        if isinstance(error, LE.LedgerFencedError | LE.LedgerClosedError):
            return self.fence(f"ledger {ledger_id}: {error}")
        if ledger_id == self._current.ledger_id and not self._current_failed:
            log.warning(
                "ml=%s ledger=%d append failed, replacing the ledger: %s", self.name, ledger_id, error
            )
            self._current_failed = True
        return ManagedLedgerError(f"append to ledger {ledger_id} failed: {error}", ml_name=self.name)

    def set_property(self, key: str, value: str) -> None:
        """Recorded with the next change of the ledger list (rollover, close), e.g. ``dedup/<producer>``."""
        self._pending_properties[key] = value

    async def save_properties(self) -> None:
        """Write the properties set since the last change of the ledger list now, with the list as it stands
        (a failure fences, as any write of the list does)."""
        if self.before_list_write is not None:
            self.before_list_write()
        async with self._meta_lock:
            if self._pending_properties and self._state == _OPEN:
                await self._cas(self._info.value.ledgers)

    # -- rollover -----------------------------------------------------------------------------------------------
    async def maybe_rollover(self, *, draining: Iterable[str] = ()) -> bool:
        """Roll the current ledger if the rollover rule says so (an idle topic's ledger ages too), or at once
        when it names a bookie of ``draining`` (being decommissioned: the decommission waits for every open
        ledger on it to be closed, and a topic's ledger may stay open for hours); a terminated one's is left as
        it is (it holds nothing)."""
        if self._state != _OPEN or self._info.value.terminated_position is not None:
            return False
        async with self._submit_lock:
            age = self._clock() - self._current_created_s
            drained = self._current_on(draining)
            if self._state != _OPEN or not (
                self._current_failed
                or drained
                or should_rollover(self.config, self._current_entries, self._current_size, age)
            ):
                return False
            if drained:
                log.info(
                    "ml=%s ledger=%d names %s, being decommissioned: rolling over",
                    self.name,
                    self._current.ledger_id,
                    ", ".join(drained),
                )
            await self._rollover_locked()
            return True

    def _current_on(self, bookies: Iterable[str]) -> list[str]:
        """The bookies of ``bookies`` that the current ledger's ensembles name."""
        wanted = set(bookies)
        if not wanted:
            return []
        return sorted(wanted & {b for ens in self._current.metadata.ensembles for b in ens.bookies})

    async def _rollover_locked(self) -> None:
        """Roll over now, or fail at once while a failed rollover waits for its next try: each failure doubles
        the wait (``ROLLOVER_RETRY_MIN_S`` to ``ROLLOVER_RETRY_MAX_S``), so that a topic short of bookies does not
        retry (and log) at every append its producers send again."""
        now = self._clock()
        if now < self._rollover_retry_at:
            raise ManagedLedgerError(
                f"no new ledger yet ({self._rollover_error}); next try in {self._rollover_retry_at - now:.1f} s",
                ml_name=self.name,
            )
        try:
            await self._rollover_attempt()
        except ManagedLedgerFencedError:
            raise
        except (ManagedLedgerError, LE.LedgerError) as e:
            wait = min(ROLLOVER_RETRY_MAX_S, max(ROLLOVER_RETRY_MIN_S, 2 * self._rollover_wait_s))
            self._rollover_wait_s = wait
            self._rollover_retry_at = self._clock() + wait
            self._rollover_error = str(e)
            raise
        self._rollover_wait_s = self._rollover_retry_at = 0.0

    async def _rollover_attempt(self) -> None:
        async with self._meta_lock:
            old = self._current
            closed = await self._close_current()
            new = await _create_ledger(self.bk, self.config, self.name)
            ledgers = [*self._info.value.ledgers[:-1]]
            if closed.entries > 0:
                ledgers.append(closed)
            ledgers.append(LedgerInfo(ledger_id=new.ledger_id))
            try:
                await self._cas(ledgers)
            except ManagedLedgerError:
                await _discard_ledger(self.bk, new)
                raise
            if closed.entries > 0:
                self._entry_messages[closed.ledger_id] = self._current_messages[: closed.entries]
            self._current = new
            self._added = (new.ledger_id, -1)
            self._added_size = 0
            self._current_created_s = self._clock()
            self._current_entries = self._current_size = 0
            self._current_messages = array("I")
            self._current_failed = False
            log.info(
                "ml=%s rolled over: ledger=%d closed entries=%d size=%d, new ledger=%d",
                self.name,
                old.ledger_id,
                closed.entries,
                closed.size,
                new.ledger_id,
            )
            if closed.entries == 0:
                await _delete_ledger_quietly(self.bk, closed.ledger_id)

    async def _close_current(self) -> LedgerInfo:
        """Close the current ledger (after its pending appends); a ledger whose writes failed is closed by a
        recovery open instead. Returns its closed record.

        The record of a ledger closed by recovery ends at the last entry acknowledged here, as a writer's close
        does: the recovery may find entries after it (written to some bookies before an add failed), whose
        appends were failed to their callers. A broker's producers send those again to the next ledger, so
        counting them here stored their messages twice (deduplication had forgotten their sequence ids with the
        failure, as Pulsar does).

        Closed once: a retry of a rollover that failed after this (no new ledger) gets the same record. Before,
        each retry closed a failed ledger by recovery again, several times a second per topic while bookies
        were short."""
        lh = self._current
        if self._closed is not None and self._closed.ledger_id == lh.ledger_id:
            return self._closed
        try:
            await lh.close()
            entries, size = lh.last_add_confirmed + 1, lh.length
        except (LE.LedgerFencedError, LE.LedgerClosedError) as e:
            raise self.fence(f"ledger {lh.ledger_id} closed by another client: {e}") from e
        except LE.LedgerError as e:
            log.warning(
                "ml=%s ledger=%d close failed (%s); closing it by recovery", self.name, lh.ledger_id, e
            )
            try:
                rh = await self.bk.open_ledger(lh.ledger_id, self.config.password, recovery=True)
            except LE.LedgerError as e2:
                raise ManagedLedgerError(
                    f"cannot close ledger {lh.ledger_id}: {e2}", ml_name=self.name
                ) from e2
            entries, size = rh.last_add_confirmed + 1, rh.length
            await rh.close()
            if self._added[0] == lh.ledger_id and self._added[1] + 1 < entries:
                log.warning(
                    "ml=%s ledger=%d closed by recovery with entries %d-%d, which failed here: left out",
                    self.name,
                    lh.ledger_id,
                    self._added[1] + 1,
                    entries - 1,
                )
                entries, size = self._added[1] + 1, self._added_size
        self._closed = LedgerInfo(
            ledger_id=lh.ledger_id,
            entries=entries,
            size=size,
            timestamp_ms=int(self._clock() * 1000),
            messages=sum(self._current_messages[:entries]),
        )
        return self._closed

    async def _cas(self, ledgers: Sequence[LedgerInfo]) -> None:
        """Write the new ledger list (and pending properties) at the version we hold; any failure fences."""
        if self.before_list_write is not None:
            self.before_list_write()
        props = {**self._info.value.properties, **self._pending_properties}
        new = replace(self._info.value, ledgers=tuple(ledgers), properties=props)
        try:
            self._info = await self.store.set_ml_info(self.name, new, self._info.version)
        except zk.MetadataVersionError as e:
            raise self.fence("another owner changed the ledger list") from e
        except zk.MetadataError as e:
            # A lost reply may hide a successful write: we cannot know our version any more. Stop serving;
            # the broker reopens the topic (which fences this instance's ledger anyway).
            raise self.fence(f"ledger list update failed: {e}") from e
        self._pending_properties.clear()

    # -- reading ------------------------------------------------------------------------------------------------
    async def read_entries(self, start: Position, max_entries: int) -> list[tuple[Position, bytes]]:
        """Up to ``max_entries`` confirmed entries from ``start`` on (moving on to the next ledger where one
        ends); fewer, or none, at the end."""
        if max_entries <= 0:
            return []
        max_entries = min(max_entries, DEFAULT_READ_ENTRIES_MAX)
        view = self.view()
        out: list[tuple[Position, bytes]] = []
        pos = view.resolve(start)
        while pos is not None and len(out) < max_entries:
            lid = pos.ledger_id
            last = min(view.entries_in(lid) - 1, pos.entry_id + max_entries - len(out) - 1)
            first = self._cache.take(lid, pos.entry_id, last, out)
            if first <= last:
                handle = await self._handle_for(lid)
                try:
                    async for e in handle.read(first, last):
                        out.append((Position(lid, e.entry_id), e.data))
                except LE.LedgerError as e:
                    raise ManagedLedgerError(f"read of ledger {lid} failed: {e}", ml_name=self.name) from e
            pos = view.resolve(Position(lid, last + 1))
        return out

    def read_cached(
        self, start: Position, max_entries: int
    ) -> tuple[list[tuple[Position, bytes]], bool] | None:
        """A read at the tail served at once, without a task: up to ``max_entries`` entries of the current
        ledger from ``start`` on, as far as their appends are acknowledged, all from the cache; with True
        when they reach the last acknowledged entry (``([], True)`` when ``start`` is just past it). None
        when the read must take :meth:`read_entries` (another ledger, an entry not cached, not open)."""
        lid, last = self._added
        if start[0] != lid or self._state != _OPEN or max_entries <= 0:
            return None
        first = start[1]
        if first > last:
            return ([], True) if first == last + 1 else None
        end = min(last, first + min(max_entries, DEFAULT_READ_ENTRIES_MAX) - 1)
        out: list[tuple[Position, bytes]] = []
        if self._cache.take(lid, first, end, out) <= end:
            return None
        return out, end == last

    def current_entry_messages(self, ledger_id: int, entry_id: int) -> int | None:
        """Messages in an entry this owner appended to the current ledger (its SEND's count), None for any
        other entry: the dispatcher's count without parsing the entry's metadata."""
        counts = self._current_messages
        if ledger_id != self._current.ledger_id or not 0 <= entry_id < len(counts):
            return None
        return counts[entry_id]

    async def read_entry(self, pos: Position) -> bytes:
        got = await self.read_entries(pos, 1)
        if not got or got[0][0] != pos:
            raise ManagedLedgerError(f"no entry at {pos}", ml_name=self.name)
        return got[0][1]

    async def _handle_for(self, ledger_id: int) -> LedgerHandle:
        if ledger_id == self._current.ledger_id:
            return self._current
        rh = self._read_handles.get(ledger_id)
        if rh is not None:
            self._read_handles.move_to_end(ledger_id)
            return rh
        try:
            rh = await self.bk.open_ledger(ledger_id, self.config.password, recovery=False)
        except LE.LedgerError as e:
            raise ManagedLedgerError(f"cannot open ledger {ledger_id}: {e}", ml_name=self.name) from e
        self._read_handles[ledger_id] = rh
        while len(self._read_handles) > self.config.read_handles_max:
            _, old = self._read_handles.popitem(last=False)
            await old.close()
        return rh

    async def find_first(self, predicate: Callable[[bytes], bool]) -> Position | None:
        """Binary search for the first entry whose bytes satisfy ``predicate`` (which must be False, then True
        along the log, e.g. "published at or after T"); None when no entry does."""
        view = self.view()
        lo, hi = 0, view.total_entries()
        total = hi
        while lo < hi:
            mid = (lo + hi) // 2
            if predicate(await self.read_entry(view.position_at(mid))):
                hi = mid
            else:
                lo = mid + 1
        return None if lo == total else view.position_at(lo)

    # -- positions ----------------------------------------------------------------------------------------------
    def last_confirmed_position(self) -> Position:
        return self.view().last_position()

    def first_position(self) -> Position:
        return self.view().first_position()

    def next_position(self, pos: Position) -> Position:
        if pos[0] == self._current.ledger_id:  # the newest ledger's next entry: asked on every cursor ack
            return Position(pos[0], pos[1] + 1)
        return self.view().next_position(pos)

    def count_entries(self, after: Position, upto: Position) -> int:
        return self.view().count_entries(after, upto)

    # -- messages and bytes between positions (backlogs) --------------------------------------------------------
    def record_messages(self, ledger_id: int, counts: Sequence[int]) -> None:
        """Per-entry message counts of a closed ledger found by reading it (a ledger recovered from the
        previous owner); its total is written with the next change of the ledger list."""
        ledgers = self._info.value.ledgers
        if ledger_id == self._current.ledger_id or not any(li.ledger_id == ledger_id for li in ledgers):
            return
        self._entry_messages[ledger_id] = array("I", (max(1, n) for n in counts))
        total = sum(self._entry_messages[ledger_id])
        new = tuple(replace(li, messages=total) if li.ledger_id == ledger_id else li for li in ledgers)
        self._info = zk.Versioned(replace(self._info.value, ledgers=new), self._info.version)

    def count_messages(self, after: Position, upto: Position) -> int:
        """Messages in the entries at positions ``p`` with ``after < p <= upto``: exact where the entries'
        counts are known (what this owner wrote or counted), else from the ledger's total, else one per entry."""
        return self._count(after, upto, self._ledger_messages)

    def estimate_bytes(self, after: Position, upto: Position) -> int:
        """Bytes of the entries after ``after`` up to ``upto``: whole ledgers by their size, a part of one by
        its average entry size (as Pulsar estimates a backlog's size)."""

        def part(lid: int, lo: int, hi: int, n: int) -> int:
            size = self._current_size if lid == self._current.ledger_id else self._ledger_size(lid)
            entries = self._current_entries if lid == self._current.ledger_id else n
            return (
                size if (lo, hi) == (0, n - 1) and entries == n else size * (hi - lo + 1) // max(1, entries)
            )

        return self._count(after, upto, part)

    def _ledger_size(self, ledger_id: int) -> int:
        for li in self._info.value.ledgers:
            if li.ledger_id == ledger_id:
                return li.size
        return 0

    def _ledger_messages(self, lid: int, lo: int, hi: int, n: int) -> int:
        counts = self._current_messages if lid == self._current.ledger_id else self._entry_messages.get(lid)
        if counts is not None and len(counts) > hi:
            return sum(counts[lo : hi + 1])
        total = next((li.messages for li in self._info.value.ledgers if li.ledger_id == lid), 0)
        if total <= 0 or n <= 0:
            return hi - lo + 1
        return total if (lo, hi) == (0, n - 1) else max(hi - lo + 1, round(total * (hi - lo + 1) / n))

    def _count(self, after: Position, upto: Position, part: Callable[[int, int, int, int], int]) -> int:
        total = 0
        for lid, n in self.view().ledgers:
            lo = 0 if lid > after.ledger_id else (after.entry_id + 1 if lid == after.ledger_id else n)
            hi = n - 1 if lid < upto.ledger_id else (upto.entry_id if lid == upto.ledger_id else -1)
            lo, hi = max(lo, 0), min(hi, n - 1)
            if hi >= lo:
                total += part(lid, lo, hi, n)
        return total

    # -- cursors ------------------------------------------------------------------------------------------------
    def attached_cursor(self, name: str) -> CursorHook | None:
        return self._cursors.get(name)

    def attach_cursor(self, cursor: CursorHook) -> None:
        self._cursors[cursor.name] = cursor
        self._stored_marks.pop(cursor.name, None)

    def detach_cursor(self, name: str) -> None:
        self._cursors.pop(name, None)
        self._stored_marks.pop(name, None)

    async def delete_cursor(self, name: str) -> None:
        """Delete the cursor ``name``'s znode (an unsubscribe), detached first. Its mark-delete still counts (as
        a stored cursor's: the backlog quotas, retention) until the znode is gone, so that a delete that fails
        (ZooKeeper away, up to its request timeout) lets no producer in over a quota meanwhile; once it is gone
        no refresh of the cursors under way brings the mark back."""
        attached = self._cursors.pop(name, None)
        if attached is not None:
            self._stored_marks[name] = attached.mark_delete
        await self.store.delete_cursor(self.name, name)
        self._stored_marks.pop(name, None)
        if self._refreshes:
            self._cursor_deletes += 1
            self._deleted_cursors[name] = self._cursor_deletes

    def slowest_mark_delete(self) -> Position | None:
        """The smallest mark-delete of all cursors (attached or only persisted); None without cursors."""
        return _min_position([*(c.mark_delete for c in self._cursors.values()), *self._stored_marks.values()])

    @property
    def cursors(self) -> Mapping[str, CursorHook]:
        return dict(self._cursors)

    # -- retention ----------------------------------------------------------------------------------------------
    async def trim(
        self, slowest_mark_delete: Position | None, retention_time_s: float, retention_size_bytes: int
    ) -> list[int]:
        """Delete the ledgers retention lets go (module docstring); returns their ids."""
        if self._state != _OPEN:
            return []
        async with self._meta_lock:
            if self._state != _OPEN:
                return []
            ledgers = self._info.value.ledgers
            doomed = ledgers_to_trim(
                ledgers,
                current_ledger_id=self._current.ledger_id,
                current_size=self._current_size,
                slowest_mark_delete=slowest_mark_delete,
                retention_time_s=retention_time_s,
                retention_size_bytes=retention_size_bytes,
                now_ms=int(self._clock() * 1000),
                terminated_ledger_id=self._terminated_ledger_id(),
            )
            if not doomed:
                return []
            gone = set(doomed)
            await self._cas([li for li in ledgers if li.ledger_id not in gone])
        for lid in doomed:
            self._entry_messages.pop(lid, None)
            rh = self._read_handles.pop(lid, None)
            if rh is not None:
                await rh.close()
            await _delete_ledger_quietly(self.bk, lid)
        log.info("ml=%s trimmed ledgers %s", self.name, doomed)
        return doomed

    async def truncate(self) -> list[int]:
        """Pulsar's ManagedLedger truncate, once the caller moved every cursor to the last confirmed entry: the
        current ledger rolled over (when it holds entries and the ledger is not terminated), then every ledger
        before the new current one that no cursor (attached or stored) still needs deleted, whatever retention
        says; returns their ids."""
        if self._state != _OPEN:
            raise ManagedLedgerClosedError("managed ledger is not open", ml_name=self.name)
        if self._info.value.terminated_position is None:
            async with self._submit_lock:
                if self._state == _OPEN and self._current_entries > 0:
                    await self._rollover_locked()
        await self.refresh_cursors()
        return await self.trim(self.slowest_mark_delete(), 0, 0)

    async def refresh_cursors(self) -> None:
        """Read every cursor's znode again. Others may create or move a durable subscription's cursor at any
        time (the Spark topic source saves its subscription with ``BrokerMetadataStore.save_cursor``), so
        what was read at open is not enough for retention: unattached cursors' mark-deletes are replaced by
        what is stored now, and idle attached cursors adopt a stored state that moved."""
        self._refreshes += 1
        since = self._cursor_deletes
        try:
            names = await self.store.list_cursors(self.name)
            marks: dict[str, Position] = {}
            for sub in names:
                attached = self._cursors.get(sub)
                if attached is not None:
                    await attached.refresh()
                    continue
                stored = await self.store.get_cursor(self.name, sub)
                if stored is not None:
                    marks[sub] = Position(*stored.value.mark_delete)
            # (a cursor deleted since its znode was read here: an unsubscribe, its mark not to come back)
            self._stored_marks = {
                sub: m for sub, m in marks.items() if self._deleted_cursors.get(sub, 0) <= since
            }
        finally:
            self._refreshes -= 1
            if not self._refreshes:
                self._deleted_cursors.clear()

    async def trim_by_retention(self) -> list[int]:
        """:meth:`trim` with the cursors as stored now and this managed ledger's retention; the cursors are
        read only when retention could let a ledger go at all."""
        if self._state != _OPEN or not self._trimmable(None):
            return []
        await self.refresh_cursors()
        return await self.trim(self.slowest_mark_delete(), self.retention_time_s, self.retention_size_bytes)

    def _trimmable(self, slowest_mark_delete: Position | None) -> list[int]:
        return ledgers_to_trim(
            self._info.value.ledgers,
            current_ledger_id=self._current.ledger_id,
            current_size=self._current_size,
            slowest_mark_delete=slowest_mark_delete,
            retention_time_s=self.retention_time_s,
            retention_size_bytes=self.retention_size_bytes,
            now_ms=int(self._clock() * 1000),
            terminated_ledger_id=self._terminated_ledger_id(),
        )

    def _terminated_ledger_id(self) -> int | None:
        """The ledger holding a terminated managed ledger's last entry, which stays: Pulsar's terminate closes the
        current ledger and opens none, and the current ledger is never trimmed."""
        tp = self._info.value.terminated_position
        return None if tp is None else tp[0]

    async def tick(self, *, rollover: bool = True, draining: Iterable[str] = ()) -> None:
        """Periodic housekeeping (the broker calls it, e.g. every few seconds): roll an aged, full or failed
        ledger, or one naming a bookie of ``draining`` (unless told not to: no new ledger could be created),
        flush cursors, trim by retention (idle topics included). A fenced instance raises
        ``ManagedLedgerFencedError``, however it was fenced (a cursor's delayed flush finds the conflict with
        nobody to tell), so that its owner stops serving the topic."""
        if self._state == _FENCED:
            raise ManagedLedgerFencedError(f"fenced: {self._fence_reason}", ml_name=self.name)
        if self._state != _OPEN:
            return
        if rollover:
            await self.maybe_rollover(draining=draining)
        for c in list(self._cursors.values()):
            await c.maybe_flush()
        await self.trim_by_retention()

    # -- closing ------------------------------------------------------------------------------------------------
    async def close(self) -> None:
        """Flush cursors, close the current ledger and record it (a fenced instance only releases resources)."""
        for c in list(self._cursors.values()):
            with contextlib.suppress(ManagedLedgerError):
                await c.close()
        async with self._submit_lock, self._meta_lock:
            if self._state == _OPEN:
                try:
                    closed = await self._close_current()
                    await self._cas([*self._info.value.ledgers[:-1], closed])
                finally:
                    if self._state == _OPEN:
                        self._state = _CLOSED
            else:
                with contextlib.suppress(LE.LedgerError):
                    await self._current.close()
        self._cache.clear()
        await self._release_read_handles()

    async def delete(self) -> None:
        """Remove the topic's storage: every ledger (metadata and bookie data), cursors and the znode."""
        async with self._submit_lock, self._meta_lock:
            was_fenced = self._state == _FENCED
            self._state = _CLOSED
            with contextlib.suppress(LE.LedgerError):
                await self._current.close()
            await self._release_read_handles()
            if was_fenced:
                raise ManagedLedgerFencedError("only the owner deletes a managed ledger", ml_name=self.name)
            ids = {li.ledger_id for li in self._info.value.ledgers} | {self._current.ledger_id}
            await self.store.delete_ml(self.name)
            for lid in sorted(ids):
                await _delete_ledger_quietly(self.bk, lid)
        self._cursors.clear()
        self._stored_marks.clear()
        log.info("ml=%s deleted", self.name)

    async def _release_read_handles(self) -> None:
        while self._read_handles:
            _, rh = self._read_handles.popitem()
            await rh.close()


# --- helpers -----------------------------------------------------------------------------------------------------


async def _create_ledger(
    bk: BookKeeper,
    config: ManagedLedgerConfig,
    name: str,
    component: bytes = COMPONENT,
    extra: Mapping[str, bytes] | None = None,
    ledger_id: int | None = None,
) -> LedgerHandle:
    """A ledger of the managed ledger ``name`` (or, with another ``component``, one that belongs to it: its
    compacted ledger), with ``extra`` custom metadata (and the id ``ledger_id``, one ``bk.new_ledger_id()`` gave,
    or a fresh one)."""
    try:
        return await bk.create_ledger(
            config.ensemble_size,
            config.write_quorum,
            config.ack_quorum,
            password=config.password,
            custom_metadata={
                "application": APPLICATION,
                "component": component,
                "managed-ledger": name.encode(),
                **(extra or {}),
            },
            ledger_id=ledger_id,
        )
    except LE.LedgerError as e:
        raise ManagedLedgerError(f"cannot create a ledger: {e}", ml_name=name) from e


async def _recover_last(
    bk: BookKeeper, config: ManagedLedgerConfig, name: str, last: LedgerInfo, now_ms: int
) -> LedgerInfo:
    """Recovery-open (fence and close) the previous owner's last ledger; its closed record."""
    try:
        rh = await bk.open_ledger(last.ledger_id, config.password, recovery=True)
    except LE.NoSuchLedgerError:
        log.warning("ml=%s ledger=%d in the list does not exist; dropping it", name, last.ledger_id)
        return replace(last, entries=0, size=0)
    except LE.LedgerError as e:
        raise ManagedLedgerError(f"cannot recover ledger {last.ledger_id}: {e}", ml_name=name) from e
    entries, size = rh.last_add_confirmed + 1, rh.length
    await rh.close()
    return LedgerInfo(
        ledger_id=last.ledger_id, entries=entries, size=size, timestamp_ms=last.timestamp_ms or now_ms
    )


async def _delete_ledger_quietly(bk: BookKeeper, ledger_id: int) -> None:
    try:
        await bk.delete_ledger(ledger_id)
    except LE.NoSuchLedgerError:
        pass
    except LE.LedgerError as e:  # leaked: the ledger is no longer listed, an operator may delete it
        log.warning("ledger=%d delete failed (no longer in any managed ledger): %s", ledger_id, e)


async def _discard_ledger(bk: BookKeeper, lh: LedgerHandle) -> None:
    with contextlib.suppress(LE.LedgerError):
        await lh.close()
    await _delete_ledger_quietly(bk, lh.ledger_id)
