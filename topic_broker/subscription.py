"""Dispatch state of one subscription: a pure core (no sockets, clocks, asyncio or storage).

The service drives it like this (h11 style: events in, commands out)::

    sub = Subscription(SubType.SHARED, partition=-1)
    cmds = sub.add_consumer(consumer_id, name, priority)     # ConsumerBusyError for a 2nd Exclusive
    cmds = sub.flow(consumer_id, permits)                    # FLOW
    execute cmds:
      Read(epoch, start, max_entries)   read up to max_entries entries from `start` (an ML position, inclusive);
                                        answer with sub.on_read(epoch, entries, next_start)
                                        (entries the cursor already acked left out; [] = caught up: the
                                        service calls sub.on_new_entries() on the next append)
      ReadReplay(epoch, positions)      read those positions again -> sub.on_replay_read(epoch, entries)
                                        (positions gone from the ML simply missing from `entries`)
      Deliver(consumer_id, entry, redelivery_count)   send MESSAGE
      ActiveConsumerChanged(consumer_id, is_active)   send ACTIVE_CONSUMER_CHANGE (Failover)
      HoldDispatch(delay_s)             Failover's active consumer changed (failover_delay_s > 0): nothing is
                                        dispatched until the service calls sub.release_hold() after delay_s
    sub.ack_individual(...) / sub.ack_cumulative(...) -> AckOutcome: what the cursor must record, plus commands
    sub.redeliver(consumer_id, positions | None)     REDELIVER_UNACKNOWLEDGED_MESSAGES (None = all)
    sub.remove_consumer(consumer_id)                 the consumer's unacked messages are redelivered to others
    sub.reset(start)                                 SEEK / reset-cursor: forget everything in flight

Rules (Pulsar's, as the official client expects them):

- Permits are charged per message: an entry holding a batch of N costs N. An entry is never split; a consumer
  with at least one permit may receive an entry larger than its permits (its permits go negative, as in Pulsar).
- Exclusive: one consumer; a second one is refused (ConsumerBusy). Failover: every consumer is attached but one
  is active: consumers sorted by (priority, name), index = partition % the number of consumers of the highest
  priority level (the lowest number; Pulsar's rule); on a non-partitioned topic the one of those that Pulsar's
  consistent-hash ring of their names gives the topic's name (:func:`failover_ring_pick`).
  Exclusive and Failover deliver in position order, and replays (redeliveries) go before new entries.
- Shared: round robin over the consumers that have permits. Key_Shared: an entry's key (``wire.sticky_key``:
  ordering key, else partition key, else NONE_KEY) maps to one consumer through a hash ring (auto split) or the
  consumer's declared hash ranges (sticky), by Pulsar's hash of the key (:func:`key_hash`); a key stays with
  the consumer that holds unacked messages of it, so a key is never on two consumers at once, and an entry
  never overtakes an earlier entry of its key waiting for replay.
  A consumer of another Key_Shared mode (sticky / auto split) or out-of-order setting than the attached ones is
  refused (ConsumerBusy); sticky ranges that are empty, outside [0, 65535] or overlap another consumer's are
  refused with ConsumerAssignError, which the client does not retry.
- Every dispatched entry is pending on its consumer until acked. A lost consumer's pending entries, and those
  named by a redelivery request, go to the replay set with their redelivery count raised by one (on Shared and
  Key_Shared; Pulsar counts no redeliveries on Exclusive and Failover, whose count stays 0).
- Acks are subscription-wide (a reconnected client acks with a new consumer id). A batch entry is acked when
  every message of it is (batch indices, or an empty ack set), or by a cumulative ack at or past it. The
  messages of a batch acked so far (batch-index acks) are remembered while the subscription lives: a batch
  delivered again carries the ack set of the messages still unacked, so the client skips the others.
- Delayed delivery (Pulsar's, Shared and Key_Shared only): an entry read with ``deliver_at`` later than the
  read's ``now_ms`` is held back (no permits spent, not pending on anyone) until :meth:`release_delayed`, then
  goes to the replay set. Exclusive and Failover deliver at once, as in Pulsar.
- At most one read is in flight; a read started before a reset is recognised by its epoch and dropped.
"""

from __future__ import annotations

import bisect
import enum
import functools
import hashlib
import heapq
import itertools
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_READ_ENTRIES_MAX",
    "DEFAULT_REPLAY_ENTRIES_MAX",
    "DEFAULT_UNACKED_MESSAGES_MAX",
    "DEFAULT_UNACKED_SUBSCRIPTION_MAX",
    "HASH_RANGE_SIZE",
    "KEY_HASH_MURMUR_MAX",
    "AckOutcome",
    "ActiveConsumerChanged",
    "Command",
    "ConsumerBusyError",
    "Deliver",
    "DispatchEntry",
    "Position",
    "Read",
    "ReadReplay",
    "SubType",
    "Subscription",
    "acked_mask",
    "key_hash",
    "merge_ranges",
    "murmur3_32",
    "unacked_set",
]

Position = tuple[int, int]

#: Entries asked of the managed ledger per read.
DEFAULT_READ_ENTRIES_MAX = 100
#: Replay entries beyond which no new entries are read (Key_Shared with a stalled consumer).
DEFAULT_REPLAY_ENTRIES_MAX = 10_000
#: Pulsar's maxUnackedMessagesPerConsumer: a consumer holding this many unacked messages receives nothing more.
DEFAULT_UNACKED_MESSAGES_MAX = 50_000
#: Pulsar's maxUnackedMessagesPerSubscription: a Shared or Key_Shared subscription whose consumers together hold
#: this many unacked messages sends nothing more to any of them.
DEFAULT_UNACKED_SUBSCRIPTION_MAX = 200_000
#: Key_Shared hash space (Pulsar's DEFAULT_HASH_RANGE_SIZE).
HASH_RANGE_SIZE = 65536
#: Points per consumer on the auto-split hash ring.
RING_POINTS_PER_CONSUMER = 100


class SubType(enum.IntEnum):
    """Pulsar's CommandSubscribe.SubType."""

    EXCLUSIVE = 0
    SHARED = 1
    FAILOVER = 2
    KEY_SHARED = 3


#: The types whose consumers acknowledge each message, the ones the unacked limit binds (Pulsar's
#: ``Subscription.isIndividualAckMode``).
_INDIVIDUAL_ACK = frozenset({SubType.SHARED, SubType.KEY_SHARED})


class ConsumerBusyError(Exception):
    """The subscription refuses this consumer (Pulsar's ConsumerBusy)."""


class ConsumerAssignError(ConsumerBusyError):
    """Key_Shared sticky hash ranges the subscription cannot give this consumer (Pulsar's ConsumerAssignError)."""


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 (x86, 32 bits) of ``data``, unsigned."""
    m = 0xFFFFFFFF
    h = seed & m
    n = len(data) // 4
    for k in struct.unpack_from(f"<{n}I", data):
        k = (k * 0xCC9E2D51) & m
        k = ((k << 15) | (k >> 17)) & m
        h ^= (k * 0x1B873593) & m
        h = ((h << 13) | (h >> 19)) & m
        h = (h * 5 + 0xE6546B64) & m
    tail = data[4 * n :]
    if tail:
        k = (int.from_bytes(tail, "little") * 0xCC9E2D51) & m
        k = ((k << 15) | (k >> 17)) & m
        h ^= (k * 0x1B873593) & m
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & m
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & m
    return h ^ (h >> 16)


#: Keys longer than this are hashed with BLAKE2b, not Murmur3: this pure-Python Murmur3 takes about 0.15 µs a
#: byte on the event loop (0.6 ms at the bound; a 5 MB key would hold the loop most of a second).
KEY_HASH_MURMUR_MAX = 4096


def _pulsar_key_hash(key: bytes) -> int:
    """Pulsar's Murmur3_32Hash of a key (the sign bit cleared), modulo the range size."""
    return (murmur3_32(key) & 0x7FFFFFFF) % HASH_RANGE_SIZE


_short_key_hash = functools.lru_cache(maxsize=4096)(_pulsar_key_hash)


def key_hash(key: bytes) -> int:
    """The Key_Shared hash of a key, in [0, HASH_RANGE_SIZE): Pulsar's (its ``Murmur3_32Hash``, the sign bit
    cleared, modulo the range size), so sticky hash ranges take the keys they take with Pulsar's broker; a key
    over KEY_HASH_MURMUR_MAX bytes gets a BLAKE2b hash instead."""
    if len(key) <= 256:
        return _short_key_hash(key)
    if len(key) <= KEY_HASH_MURMUR_MAX:
        return _pulsar_key_hash(key)
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "big") % HASH_RANGE_SIZE


#: Pulsar's CONSUMER_CONSISTENT_HASH_REPLICAS: each consumer's points on a non-partitioned topic's Failover ring.
FAILOVER_RING_POINTS = 100


def _hash31(data: bytes) -> int:
    """Pulsar's Murmur3_32Hash (the sign bit cleared); over KEY_HASH_MURMUR_MAX bytes BLAKE2b, as key_hash."""
    if len(data) <= KEY_HASH_MURMUR_MAX:
        return murmur3_32(data) & 0x7FFFFFFF
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "big") & 0x7FFFFFFF


def failover_topic_hash(topic: str) -> int:
    """Where a non-partitioned topic (its full name, ``persistent://t/ns/x``) sits on the Failover ring."""
    return _hash31(topic.encode())


@functools.lru_cache(maxsize=4096)
def _failover_points(name: str) -> tuple[int, ...]:
    """A consumer's points on the Failover ring, sorted: Pulsar's hashes of the name followed by 0..99."""
    return tuple(sorted(_hash31(f"{name}{j}".encode()) for j in range(FAILOVER_RING_POINTS)))


def failover_ring_pick(topic_hash: int, names: Sequence[str]) -> int:
    """The index in ``names`` (the highest priority level's consumers, in their order) of a non-partitioned
    topic's active Failover consumer, as Pulsar's peekConsumerIndexFromHashRing: the first point at or after the
    topic's hash, else the ring's first point; a point two names share is the later one's."""
    after: tuple[int, int] | None = None
    first: tuple[int, int] | None = None
    for i, name in enumerate(names):
        points = _failover_points(name)
        j = bisect.bisect_left(points, topic_hash)
        if j < len(points) and (after is None or (points[j], -i) < after):
            after = (points[j], -i)
        if first is None or (points[0], -i) < first:
            first = (points[0], -i)
    assert first is not None
    return -(after or first)[1]


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Closed integer ranges sorted, with those that overlap or touch made one (a Key_Shared consumer's hash
    ranges; the form ``Topic.skipped_ids`` keeps, whose binary searches need the ranges sorted and apart)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def acked_mask(ack_set: Sequence[int], num_messages: int) -> int:
    """The messages an ack set marks acknowledged, as a bit mask (bit i: message i): its clear bits below
    ``num_messages`` (bit i is bit i % 64 of word i // 64, as Java's ``BitSet.toLongArray``). Whole-int bit
    operations: a batch of 1,000 messages acked one by one costs microseconds an ack, not a loop over it."""
    unacked = 0
    for k, word in enumerate(ack_set):
        unacked |= (word & 0xFFFF_FFFF_FFFF_FFFF) << (64 * k)
    return ~unacked & ((1 << num_messages) - 1)


def cumulative_batch_index(ack_set: Sequence[int]) -> int:
    """The batch index a cumulative ack with ``ack_set`` stops at (the C++ client with batch-index acks sends
    the unacked messages, all those after it, instead of a batch index): the message before the first unacked
    one; -1 when the first message is unacked (nothing of that batch acknowledged)."""
    unacked = 0
    for k, word in enumerate(ack_set):
        unacked |= (word & 0xFFFF_FFFF_FFFF_FFFF) << (64 * k)
    if not unacked:
        raise ValueError("an ack set without unacked messages acknowledges the whole entry")
    return (unacked & -unacked).bit_length() - 2


def unacked_set(num_messages: int, acked: int) -> tuple[int, ...]:
    """The ack set of a batch of ``num_messages`` whose messages in the bit mask ``acked`` are acknowledged: a
    bit set for each message still unacknowledged, as signed 64-bit words (protobuf ``int64``)."""
    bits = ((1 << num_messages) - 1) & ~acked
    words = []
    for _ in range((num_messages + 63) // 64):
        w = bits & 0xFFFF_FFFF_FFFF_FFFF
        words.append(w - (1 << 64) if w >= 1 << 63 else w)
        bits >>= 64
    return tuple(words)


@dataclass(slots=True)
class DispatchEntry:
    """What the dispatcher needs of one stored entry; ``data`` is opaque to it (the stored bytes)."""

    position: Position
    num_messages: int = 1
    key: bytes = b""
    data: Any = None
    deliver_at: int | None = (
        None  # the message's deliver_at_time (Unix ms): delayed delivery on Shared/Key_Shared
    )


# -- commands -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Read:
    epoch: int
    start: Position
    max_entries: int


@dataclass(frozen=True, slots=True)
class ReadReplay:
    epoch: int
    positions: tuple[Position, ...]


@dataclass(frozen=True, slots=True)
class Deliver:
    consumer_id: int
    entry: DispatchEntry
    redelivery_count: int
    #: a batch some of whose messages are acknowledged: Pulsar's ack set (a bit set of the messages still
    #: unacknowledged, as 64-bit words), which the client uses to skip the others; None: deliver them all
    ack_set: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class ActiveConsumerChanged:
    consumer_id: int
    is_active: bool


@dataclass(frozen=True, slots=True)
class HoldDispatch:
    """Failover: the active consumer changed; call :meth:`Subscription.release_hold` after ``delay_s``."""

    delay_s: float


Command = Read | ReadReplay | Deliver | ActiveConsumerChanged | HoldDispatch


@dataclass(slots=True)
class AckOutcome:
    """``acked``: entries now fully acked (for the cursor's individual acks); ``mark_delete``: a cumulative
    ack's new mark-delete position (the entry before a partially acked batch); ``batches``: partly acked
    batches whose acked messages grew, (entry, mask of all its acked messages), for the cursor to persist;
    ``commands``: dispatch that the freed permits/keys allow."""

    acked: list[Position] = field(default_factory=list)
    mark_delete: Position | None = None
    batches: list[tuple[Position, int]] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)


@dataclass(slots=True)
class _Consumer:
    consumer_id: int
    name: str
    priority: int
    seq: int
    permits: int = 0
    unacked_messages: int = 0
    #: position -> number of messages, in dispatch order
    pending: dict[Position, int] = field(default_factory=dict)
    #: declared Key_Shared sticky ranges (inclusive), empty for auto split
    hash_ranges: tuple[tuple[int, int], ...] = ()
    #: Key_Shared mode sticky (else auto split) and allowOutOfOrderDelivery, as the consumer declared them
    sticky: bool = False
    out_of_order: bool = False
    #: its connection takes more now (its unsent bytes under the high-water mark): else it is sent nothing
    writable: bool = True
    #: messages it asked to be sent again (REDELIVER_UNACKNOWLEDGED_MESSAGES) on Shared and Key_Shared, where
    #: Pulsar counts them (its ``msgRateRedeliver``); a batch counts its messages
    redelivered_messages: int = 0


@dataclass(slots=True)
class _Info:
    num_messages: int
    key: bytes


class Subscription:
    # Slotted: the dispatch reads a dozen of these for every entry delivered, and CPython 3.11 reads and writes
    # an instance's attributes as fast inline values only while its class's instances have fewer than 30
    # names; at 31 (here since the subscription's unacked limit) every access fell back to a dict lookup,
    # some 10 % of the dispatch core's time per entry.
    __slots__ = (
        "sub_type",
        "partition",
        "read_position",
        "read_entries_max",
        "replay_entries_max",
        "_unacked_messages_max",
        "unacked_subscription_max",
        "_unacked_total",
        "_ready_permits",
        "epoch",
        "reading",
        "caught_up",
        "_consumers",
        "_seq",
        "_active",
        "_rr",
        "_rr_next",
        "_owner",
        "_info",
        "_replay",
        "_replay_keys",
        "_replay_target",
        "_replay_by_target",
        "_redeliveries",
        "_batch_acks",
        "_delayed",
        "_delayed_heap",
        "_key_owner",
        "_key_pending",
        "_ring",
        "_reading_replay",
        "_messages_per_entry",
        "topic_hash",
        "_levels",
        "failover_delay_s",
        "_holding",
    )

    def __init__(
        self,
        sub_type: SubType,
        *,
        partition: int = -1,
        read_position: Position = (0, 0),
        read_entries_max: int = DEFAULT_READ_ENTRIES_MAX,
        replay_entries_max: int = DEFAULT_REPLAY_ENTRIES_MAX,
        unacked_messages_max: int = DEFAULT_UNACKED_MESSAGES_MAX,
        topic_hash: int | None = None,
    ) -> None:
        assert read_entries_max > 0
        self.sub_type = sub_type
        self.partition = partition
        # a non-partitioned topic's place on the Failover ring (failover_topic_hash of its name); None (a core
        # made without its topic's name) takes the first consumer by (priority, name) instead
        self.topic_hash = topic_hash
        # Failover: after the active consumer changes, nothing is dispatched for this long (Pulsar's
        # activeConsumerFailoverDelayTimeMillis); 0: at once
        self.failover_delay_s = 0.0
        self._holding = False
        self.read_position: Position = read_position
        self.read_entries_max = read_entries_max
        self.replay_entries_max = replay_entries_max
        self._unacked_messages_max = unacked_messages_max
        self.unacked_subscription_max = DEFAULT_UNACKED_SUBSCRIPTION_MAX
        self._unacked_total = 0  # the consumers' unacked_messages together (kept with each one's)
        # the permits of the consumers that may be sent something, the subscription's limit aside (each one's
        # _permits_counted, kept with its permits, writability and unacked messages): a Shared or Key_Shared
        # dispatch's budget, which summed every consumer's permits at each dispatch (each SUBSCRIBE, FLOW, ack
        # and read): quadratic in consumers, 15,000 SUBSCRIBEs of one subscription took 17 s of the event loop
        self._ready_permits = 0
        self.epoch = 0
        self.reading = False
        self.caught_up = False
        self._consumers: dict[int, _Consumer] = {}
        self._seq = 0
        self._active: int | None = None
        self._rr: list[int] = []  # Shared round-robin order
        self._rr_next = 0
        self._levels: dict[int, int] = {}  # consumers per priority level (Shared prefers the highest)
        self._owner: dict[Position, int] = {}  # pending position -> consumer id
        self._info: dict[Position, _Info] = {}  # pending and replay positions
        self._replay: set[Position] = set()
        # Key_Shared: each key's replay entries in position order, and the keys by the consumer they go to (None:
        # none now), so that a dispatch looks only at the keys of consumers that can take something
        self._replay_keys: dict[bytes, list[Position]] = {}
        self._replay_target: dict[bytes, int | None] = {}
        self._replay_by_target: dict[int | None, dict[bytes, None]] = {}
        self._redeliveries: dict[Position, int] = {}
        self._batch_acks: dict[Position, int] = {}  # a batch's acked messages, as a bit mask
        self._delayed: dict[Position, int] = {}  # delayed delivery: position -> deliver_at (Unix ms)
        self._delayed_heap: list[tuple[int, Position]] = []
        self._key_owner: dict[bytes, int] = {}
        self._key_pending: dict[bytes, int] = {}
        self._ring: list[tuple[int, int]] = []  # (point, consumer id)
        self._reading_replay: tuple[Position, ...] = ()  # the positions of the replay read in flight
        self._messages_per_entry = 1  # the batch size seen in the last read (sizes the next)

    @property
    def unacked_messages_max(self) -> int:
        """A consumer holding this many unacknowledged messages is sent nothing more (Shared and Key_Shared)."""
        return self._unacked_messages_max

    @unacked_messages_max.setter
    def unacked_messages_max(self, value: int) -> None:
        self._unacked_messages_max = value
        self._ready_permits = sum(self._permits_counted(c) for c in self._consumers.values())

    # -- introspection --------------------------------------------------------------------------------------

    @property
    def consumer_ids(self) -> list[int]:
        return list(self._consumers)

    @property
    def active_consumer(self) -> int | None:
        return self._active

    def permits(self, consumer_id: int) -> int:
        return self._consumers[consumer_id].permits

    def pending(self, consumer_id: int) -> list[Position]:
        return list(self._consumers[consumer_id].pending)

    def unacked_messages(self, consumer_id: int) -> int:
        return self._consumers[consumer_id].unacked_messages

    @property
    def replay_positions(self) -> list[Position]:
        return sorted(self._replay)

    def consumer_of(self, position: Position) -> int | None:
        """The consumer ``position`` was sent to and that has not acknowledged it, or None."""
        return self._owner.get(position)

    def redelivery_count(self, position: Position) -> int:
        return self._redeliveries.get(position, 0)

    def redelivered_messages(self, consumer_id: int) -> int:
        """Messages this consumer asked to be sent again, on Shared and Key_Shared (0 on the others, as Pulsar
        counts them): what its ``msgRateRedeliver`` is the rate of."""
        c = self._consumers.get(consumer_id)
        return 0 if c is None else c.redelivered_messages

    def blocked_on_unacked(self, consumer_id: int) -> bool:
        """The consumer holds ``unacked_messages_max`` unacknowledged messages: it is sent nothing more until it
        acknowledges some (Pulsar's ``blockedConsumerOnUnackedMsgs``). Shared and Key_Shared only, as Pulsar
        (:meth:`_ready`)."""
        c = self._consumers[consumer_id]
        return c.unacked_messages >= self._unacked_messages_max and self.sub_type in _INDIVIDUAL_ACK

    def blocked_subscription_on_unacked(self) -> bool:
        """The consumers together hold ``unacked_subscription_max`` unacknowledged messages: none is sent anything
        more until some are acknowledged (Pulsar's ``blockedSubscriptionOnUnackedMsgs``). Shared and Key_Shared
        only, as the consumers' limit."""
        if self.sub_type not in _INDIVIDUAL_ACK:
            return False
        return self._unacked_total >= self.unacked_subscription_max

    def key_shared_mode(self) -> tuple[str, bool] | None:
        """A Key_Shared subscription's mode (``STICKY`` or ``AUTO_SPLIT``) and allowOutOfOrderDelivery, as its
        consumers declared them (all alike); None for another type or without consumers."""
        if self.sub_type != SubType.KEY_SHARED or not self._consumers:
            return None
        c = next(iter(self._consumers.values()))
        return ("STICKY" if c.sticky else "AUTO_SPLIT"), c.out_of_order

    def key_hash_ranges(self, consumer_id: int) -> list[tuple[int, int]]:
        """Key_Shared: the hash ranges (inclusive, in order, adjacent ones merged) whose keys go to this
        consumer, what Pulsar's consumer stats show as ``keyHashRanges``: a sticky consumer's declared ranges; an
        auto-split consumer's arcs of the hash ring (a point's arc runs from the point before it, excluded, to
        it; the hashes past the last point wrap around to the first point's consumer). Empty for another type."""
        if self.sub_type != SubType.KEY_SHARED or consumer_id not in self._consumers:
            return []
        c = self._consumers[consumer_id]
        if c.hash_ranges:
            return merge_ranges(c.hash_ranges)
        ring = self._ring
        arcs: list[tuple[int, int]] = []
        start = 0
        for point, cid in ring:
            if cid == consumer_id and start <= point:
                arcs.append((start, point))
            start = max(start, point + 1)
        if ring and ring[0][1] == consumer_id and start < HASH_RANGE_SIZE:
            arcs.append((start, HASH_RANGE_SIZE - 1))
        return merge_ranges(arcs)

    def consumer_for_key(self, key: bytes) -> int | None:
        """Key_Shared: the consumer a new entry with this key would go to."""
        return self._key_target(key)

    # -- consumers ------------------------------------------------------------------------------------------

    def add_consumer(
        self,
        consumer_id: int,
        name: str = "",
        priority: int = 0,
        *,
        sub_type: SubType | None = None,
        hash_ranges: Sequence[tuple[int, int]] = (),
        sticky: bool | None = None,
        out_of_order: bool = False,
    ) -> list[Command]:
        """Attach a consumer; ``sticky`` (default: whether ``hash_ranges`` are given) and ``out_of_order`` are its
        Key_Shared mode and allowOutOfOrderDelivery."""
        sticky = bool(hash_ranges) if sticky is None else sticky
        if consumer_id in self._consumers:
            raise ConsumerBusyError(f"consumer id {consumer_id} already attached")
        if sub_type is not None and sub_type != self.sub_type:
            if self._consumers:
                raise ConsumerBusyError(
                    f"subscription is of type {self.sub_type.name}, not {SubType(sub_type).name}"
                )
            self.sub_type = sub_type
        if self.sub_type == SubType.EXCLUSIVE and self._consumers:
            raise ConsumerBusyError("Exclusive consumer is already connected")
        if self.sub_type == SubType.KEY_SHARED:
            self._check_key_shared_mode(sticky, out_of_order, hash_ranges)
        for start, end in hash_ranges:
            if not 0 <= start <= end < HASH_RANGE_SIZE:
                raise ConsumerAssignError(f"hash range [{start}, {end}] outside [0, {HASH_RANGE_SIZE})")
            for other in self._consumers.values():
                for s2, e2 in other.hash_ranges:
                    if start <= e2 and s2 <= end:
                        raise ConsumerAssignError(
                            f"hash range [{start}, {end}] overlaps consumer {other.name}"
                        )
        self._seq += 1
        c = _Consumer(
            consumer_id,
            name,
            priority,
            self._seq,
            hash_ranges=tuple(hash_ranges),
            sticky=sticky,
            out_of_order=out_of_order,
        )
        self._consumers[consumer_id] = c
        self._rr.append(consumer_id)
        self._levels[priority] = self._levels.get(priority, 0) + 1
        cmds: list[Command] = []
        if self.sub_type == SubType.KEY_SHARED and not c.hash_ranges:
            self._ring_add(c)
        self._reindex_replay()
        if self.sub_type in (SubType.EXCLUSIVE, SubType.FAILOVER):
            cmds += self._elect(announce_to=consumer_id)
        return cmds + self._dispatch()

    def _check_key_shared_mode(
        self, sticky: bool, out_of_order: bool, hash_ranges: Sequence[tuple[int, int]]
    ) -> None:
        """As Pulsar: every consumer of a Key_Shared subscription has the mode and out-of-order setting of those
        attached (ConsumerBusy), and a sticky consumer declares ranges (ConsumerAssignError)."""
        other = next(iter(self._consumers.values()), None)
        if other is not None and other.sticky != sticky:
            modes = ["STICKY" if m else "AUTO_SPLIT" for m in (other.sticky, sticky)]
            raise ConsumerBusyError(
                f"Subscription is of different type. Active subscription key_shared mode of '{modes[0]}' is "
                f"different than the connecting consumer's key_shared mode '{modes[1]}'."
            )
        if other is not None and other.out_of_order != out_of_order:
            raise ConsumerBusyError(
                "Subscription is of different type. Active subscription "
                + ("allows" if other.out_of_order else "does not allow")
                + " out of order delivery while the connecting consumer "
                + ("does not allow it." if other.out_of_order else "allows it.")
            )
        if sticky and not hash_ranges:
            raise ConsumerAssignError("Ranges for KeyShared policy must not be empty.")

    def remove_consumer(self, consumer_id: int) -> list[Command]:
        c = self._consumers.pop(consumer_id, None)
        if c is None:
            return []
        self._ready_permits -= self._permits_counted(c)
        self._rr.remove(consumer_id)
        if self._levels[c.priority] > 1:
            self._levels[c.priority] -= 1
        else:
            del self._levels[c.priority]
        if self._ring:
            self._ring = [(p, cid) for p, cid in self._ring if cid != consumer_id]
        self._to_replay(c, list(c.pending), bump=True)
        self._reindex_replay()
        cmds: list[Command] = []
        if self._active == consumer_id:
            self._active = None
        if self.sub_type in (SubType.EXCLUSIVE, SubType.FAILOVER):
            cmds += self._elect()
        return cmds + self._dispatch()

    def release_hold(self) -> list[Command]:
        """The Failover hold after an active consumer change (:class:`HoldDispatch`) is over: dispatch again."""
        if not self._holding:
            return []
        self._holding = False
        return self._dispatch()

    def flow(self, consumer_id: int, permits: int) -> list[Command]:
        c = self._consumers.get(consumer_id)
        if c is None or permits <= 0:
            return []
        before = self._permits_counted(c)
        c.permits += permits
        self._ready_permits += self._permits_counted(c) - before
        return self._dispatch()

    def set_writable(self, consumer_id: int, writable: bool) -> list[Command]:
        """Whether the consumer's connection takes more (its unsent bytes under the high-water mark). One that does
        not is sent nothing and no read is started for it (what it is sent waits in the replay set), as Pulsar's
        dispatchers skip a consumer whose channel is not writable; writable again, dispatch resumes."""
        c = self._consumers.get(consumer_id)
        if c is None or c.writable == writable:
            return []
        before = self._permits_counted(c)
        c.writable = writable
        self._ready_permits += self._permits_counted(c) - before
        return self._dispatch() if writable else []

    # -- reads ----------------------------------------------------------------------------------------------

    def on_new_entries(self) -> list[Command]:
        """The managed ledger has new entries past where this subscription caught up."""
        if not self.caught_up:
            return []
        self.caught_up = False
        return self._dispatch()

    def on_read(
        self,
        epoch: int,
        entries: Sequence[DispatchEntry],
        next_start: Position,
        *,
        at_end: bool | None = None,
        now_ms: float | None = None,
    ) -> list[Command]:
        """``at_end``: the read found nothing to read (defaults to "no entries"; pass False when entries were
        read but all were already acked and left out). ``now_ms`` (Unix ms): on Shared and Key_Shared, entries
        whose ``deliver_at`` is later are held back until :meth:`release_delayed` (None: nothing is held)."""
        if epoch != self.epoch:
            return []
        self.reading = False
        # (later than next_start when an acknowledgement moved it past the read meanwhile)
        self.read_position = max(self.read_position, next_start)
        if (not entries) if at_end is None else at_end:
            self.caught_up = True
        if entries:  # size the next read by the batch size seen (Pulsar's avgMessagesPerEntry)
            self._messages_per_entry = max(1, sum(e.num_messages for e in entries) // len(entries))
        if now_ms is not None and self.sub_type in (SubType.SHARED, SubType.KEY_SHARED):
            entries = [e for e in entries if not self._delay(e, now_ms)]
        cmds: list[Command] = []
        self._assign(entries, cmds, replay=False)
        return cmds + self._dispatch()

    # -- delayed delivery -----------------------------------------------------------------------------------

    def _delay(self, e: DispatchEntry, now_ms: float) -> bool:
        """Hold ``e`` back if it is not due (Pulsar delays only on Shared and Key_Shared)."""
        if e.deliver_at is None or e.deliver_at <= now_ms:
            return False
        self._info[e.position] = _Info(e.num_messages, e.key)
        self._delayed[e.position] = e.deliver_at
        heapq.heappush(self._delayed_heap, (e.deliver_at, e.position))
        return True

    @property
    def next_delivery_ms(self) -> int | None:
        """When the earliest held-back entry is due (Unix ms), or None."""
        heap = self._delayed_heap
        while heap and self._delayed.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # released or reset since
        return heap[0][0] if heap else None

    def release_delayed(self, now_ms: float) -> list[Command]:
        """Entries due by ``now_ms`` go to the replay set (read again and dispatched as redeliveries are)."""
        heap = self._delayed_heap
        while heap and heap[0][0] <= now_ms:
            at, pos = heapq.heappop(heap)
            if self._delayed.get(pos) == at:
                del self._delayed[pos]
                self._add_replay(pos)
        return self._dispatch()

    @property
    def delayed_count(self) -> int:
        return len(self._delayed)

    def on_replay_read(self, epoch: int, entries: Sequence[DispatchEntry]) -> list[Command]:
        if epoch != self.epoch:
            return []
        self.reading = False
        found = {e.position for e in entries}
        for pos in self._reading_replay:
            if pos not in found and pos in self._replay:  # gone from the ML (trimmed): nothing to deliver
                self._drop_replay(pos)
                self._info.pop(pos, None)
        self._reading_replay = ()
        cmds: list[Command] = []
        wanted = [e for e in entries if e.position in self._replay]
        for e in wanted:
            self._drop_replay(e.position)
        self._assign(wanted, cmds, replay=True)
        return cmds + self._dispatch()

    def on_read_failed(self, epoch: int) -> list[Command]:
        """A read failed (the service retries later by calling :meth:`resume`)."""
        if epoch == self.epoch:
            self.reading = False
            self._reading_replay = ()
        return []

    def resume(self) -> list[Command]:
        return self._dispatch()

    # -- acks -----------------------------------------------------------------------------------------------

    def ack_individual(self, acks: Iterable[tuple[Position, int, Sequence[int] | None]]) -> AckOutcome:
        """Each ack is (position, batch index or -1, ack set or None). An ack set is Pulsar's bit set of the
        batch's messages still unacked: all zero means the whole entry is acked."""
        out = AckOutcome()
        for pos, batch_index, ack_set in acks:
            if ack_set is not None:
                if any(ack_set):
                    # part of a batch (batch-index acks): remembered, so a redelivery skips those messages;
                    # the entry stays pending until its last message is acked
                    info = self._info.get(pos)
                    n = info.num_messages if info is not None else 64 * len(ack_set)
                    done = self._batch_acks.get(pos, 0) | acked_mask(ack_set, n)
                    self._batch_acks[pos] = done
                    if info is None or done.bit_count() < info.num_messages:
                        out.batches.append((pos, done))
                        continue
            elif batch_index >= 0:
                info = self._info.get(pos)
                if info is None or info.num_messages <= 1:
                    if info is None and batch_index > 0:
                        continue  # unknown batch size: wait for the whole-entry ack
                else:
                    done = self._batch_acks.get(pos, 0) | (1 << batch_index)
                    self._batch_acks[pos] = done
                    if done.bit_count() < info.num_messages:
                        out.batches.append((pos, done))
                        continue
            self._ack_entry(pos)
            out.acked.append(pos)
        out.commands = self._dispatch()
        return out

    def ack_cumulative(self, position: Position, batch_index: int = -1) -> AckOutcome:
        """Acks every entry before ``position``, and ``position`` itself unless the ack stops inside its
        batch (then the mark-delete position is the entry before it)."""
        info = self._info.get(position)
        whole = batch_index < 0 or info is None or batch_index >= info.num_messages - 1
        out = AckOutcome()
        for pos in [p for p in self._owner if p < position] + [p for p in self._replay if p < position]:
            if pos in self._owner or pos in self._replay:
                self._ack_entry(pos)
                out.acked.append(pos)
        # an entry held back for delayed delivery goes too (a skip or expire-messages moving a Shared
        # subscription past it): released later it was read again and delivered although acknowledged
        for pos in [p for p in self._delayed if p < position or (whole and p == position)]:
            del self._delayed[pos]
            self._info.pop(pos, None)
        if whole:
            if position in self._owner or position in self._replay:
                self._ack_entry(position)
                out.acked.append(position)
            out.mark_delete = position
            # moved past what was read (a skip or expire-messages): read on after it, not through what it skipped
            self.read_position = max(self.read_position, (position[0], position[1] + 1))
        else:
            done = self._batch_acks.get(position, 0) | ((1 << (batch_index + 1)) - 1)
            self._batch_acks[position] = done
            out.batches.append((position, done))
            out.mark_delete = (position[0], position[1] - 1)
        out.commands = self._dispatch()
        return out

    def restore_batch_acks(self, acked: Iterable[tuple[Position, int]]) -> None:
        """Adopt the partly acknowledged batches a durable cursor stored (entry -> mask of acked messages), so
        that their redelivery after a restart or a topic move carries the ack set of the others only."""
        for pos, mask in acked:
            self._batch_acks[pos] = self._batch_acks.get(pos, 0) | mask

    def _ack_entry(self, pos: Position) -> None:
        self._batch_acks.pop(pos, None)
        self._redeliveries.pop(pos, None)
        cid = self._owner.pop(pos, None)
        if cid is not None:
            c = self._consumers[cid]
            before = self._permits_counted(c)
            n = c.pending.pop(pos)
            c.unacked_messages -= n
            self._unacked_total -= n
            self._ready_permits += self._permits_counted(c) - before
            self._unpin_key(pos)
        if pos in self._replay:
            self._drop_replay(pos)
        self._info.pop(pos, None)

    # -- redelivery -----------------------------------------------------------------------------------------

    def redeliver(self, consumer_id: int, positions: Iterable[Position] | None = None) -> list[Command]:
        """REDELIVER_UNACKNOWLEDGED_MESSAGES: the named (or all) unacked entries of this consumer are sent
        again, each with its redelivery count raised."""
        c = self._consumers.get(consumer_id)
        if c is None:
            return []
        chosen = list(c.pending) if positions is None else [p for p in positions if p in c.pending]
        if self.sub_type in (SubType.SHARED, SubType.KEY_SHARED):
            c.redelivered_messages += sum(c.pending[p] for p in dict.fromkeys(chosen))
        self._to_replay(c, chosen, bump=True)
        return self._dispatch()

    def reset(self, start: Position) -> list[Command]:
        """Seek: forget pending, replays and reads in flight; the next read starts at ``start``."""
        self.epoch += 1
        self.reading = False
        self.caught_up = False
        self._reading_replay = ()
        self.read_position = start
        for c in self._consumers.values():
            c.pending.clear()
            c.unacked_messages = 0
        self._unacked_total = 0
        self._ready_permits = sum(self._permits_counted(c) for c in self._consumers.values())
        self._owner.clear()
        self._info.clear()
        self._replay.clear()
        self._replay_keys.clear()
        self._replay_target.clear()
        self._replay_by_target.clear()
        self._redeliveries.clear()
        self._batch_acks.clear()
        self._delayed.clear()
        self._delayed_heap.clear()
        self._key_owner.clear()
        self._key_pending.clear()
        return self._dispatch()

    def _to_replay(self, c: _Consumer, positions: Iterable[Position], *, bump: bool) -> None:
        # (a consumer being removed is no longer counted in _ready_permits)
        counted = self._consumers.get(c.consumer_id) is c
        before = self._permits_counted(c) if counted else 0
        self._rewind(c, positions, bump=bump)
        if counted:
            self._ready_permits += self._permits_counted(c) - before

    def _rewind(self, c: _Consumer, positions: Iterable[Position], *, bump: bool) -> None:
        for pos in positions:
            n = c.pending.pop(pos, None)
            if n is None:
                continue
            c.unacked_messages -= n
            self._unacked_total -= n
            del self._owner[pos]
            self._unpin_key(pos)
            if bump and self.sub_type in (SubType.SHARED, SubType.KEY_SHARED):
                # Pulsar counts redeliveries on Shared and Key_Shared only (an Exclusive or Failover dispatcher
                # has no redelivery tracker): there the count stays 0, and a dead-letter policy never fires
                self._redeliveries[pos] = self._redeliveries.get(pos, 0) + 1
            self._add_replay(pos)

    def _add_replay(self, pos: Position) -> None:
        if pos in self._replay:
            return
        self._replay.add(pos)
        if self.sub_type == SubType.KEY_SHARED:
            key = self._info[pos].key
            held = self._replay_keys.get(key)
            if held is None:
                self._replay_keys[key] = [pos]
                self._index_replay_key(key)
            else:
                bisect.insort(held, pos)

    def _drop_replay(self, pos: Position) -> None:
        if pos not in self._replay:
            return
        self._replay.discard(pos)
        info = self._info.get(pos)
        key = info.key if info is not None else b""
        held = self._replay_keys.get(key) if info is not None else None
        if held is None:
            return
        i = bisect.bisect_left(held, pos)
        if i < len(held) and held[i] == pos:
            del held[i]
        if not held:
            del self._replay_keys[key]
            self._unindex_replay_key(key, self._replay_target.pop(key))

    def _index_replay_key(self, key: bytes) -> None:
        target = self._key_target(key)
        self._replay_target[key] = target
        self._replay_by_target.setdefault(target, {})[key] = None

    def _unindex_replay_key(self, key: bytes, target: int | None) -> None:
        keys = self._replay_by_target[target]
        del keys[key]
        if not keys:
            del self._replay_by_target[target]

    def _retarget_replay_key(self, key: bytes) -> None:
        """The consumer a key with replay entries goes to may have changed (its messages all acked or
        redelivered: it is no longer pinned to the consumer that held them)."""
        if key not in self._replay_target:
            return
        old = self._replay_target[key]
        new = self._key_target(key)
        if new != old:
            self._unindex_replay_key(key, old)
            self._replay_target[key] = new
            self._replay_by_target.setdefault(new, {})[key] = None

    def _reindex_replay(self) -> None:
        """Key_Shared: the replay entries indexed again after consumers came or went (hash ranges and the ring
        changed) or the subscription's type changed."""
        self._replay_keys.clear()
        self._replay_target.clear()
        self._replay_by_target.clear()
        if self.sub_type != SubType.KEY_SHARED:
            return
        for pos in sorted(self._replay):
            key = self._info[pos].key
            held = self._replay_keys.get(key)
            if held is None:
                self._replay_keys[key] = [pos]
            else:
                held.append(pos)
        for key in self._replay_keys:
            self._index_replay_key(key)

    # -- dispatch -------------------------------------------------------------------------------------------

    def _permits_counted(self, c: _Consumer) -> int:
        """What ``c`` adds to ``_ready_permits``: its permits if it may be sent something, the subscription's
        unacked limit aside (:meth:`_ready` on Shared and Key_Shared), else 0."""
        if c.writable and c.permits > 0 and c.unacked_messages < self._unacked_messages_max:
            return c.permits
        return 0

    def _ready(self, c: _Consumer) -> bool:
        # the unacked limit binds Shared and Key_Shared consumers only, as Pulsar's (isIndividualAckMode): an
        # Exclusive or Failover one acknowledging cumulatively every N messages, N over the limit, would wait
        # for the N-th for ever
        # (run for every consumer at every delivery: the common case, under both limits, costs two comparisons)
        if not (c.writable and c.permits > 0):
            return False
        if (
            c.unacked_messages < self._unacked_messages_max
            and self._unacked_total < self.unacked_subscription_max
        ):
            return True
        return self.sub_type not in _INDIVIDUAL_ACK

    def _dispatch(self) -> list[Command]:
        if self.reading or not self._consumers:
            return []
        if self.sub_type in (SubType.EXCLUSIVE, SubType.FAILOVER):
            active = self._consumers.get(self._active) if self._active is not None else None
            if active is None or self._holding or not self._ready(active):
                return []
            budget = active.permits
            if self._replay:
                positions = tuple(heapq.nsmallest(min(budget, self.read_entries_max), self._replay))
                return self._start_replay(positions)
        else:
            # Shared and Key_Shared: _ready's sum, kept as consumers change (not a walk of them all at each dispatch)
            budget = self._ready_permits if self._unacked_total < self.unacked_subscription_max else 0
            if budget <= 0:
                return []
            if self._replay:
                positions = self._replay_candidates(min(budget, self.read_entries_max))
                if positions:
                    return self._start_replay(positions)
                if len(self._replay) >= self.replay_entries_max:
                    return []
        if self.caught_up:
            return []
        self.reading = True
        wanted = max(1, budget // max(1, self._messages_per_entry))
        return [Read(self.epoch, self.read_position, min(wanted, self.read_entries_max))]

    def _start_replay(self, positions: tuple[Position, ...]) -> list[Command]:
        self.reading = True
        self._reading_replay = positions
        return [ReadReplay(self.epoch, positions)]

    def _replay_candidates(self, limit: int) -> tuple[Position, ...]:
        if self.sub_type == SubType.SHARED:
            return tuple(heapq.nsmallest(limit, self._replay))
        # Key_Shared: the oldest replay entries of the keys whose consumer can take something now. A key's entries
        # all go to one consumer, so a key whose consumer cannot is skipped whole (its order kept); the keys of
        # a stalled consumer are not looked at (they were, at each dispatch: each ack, each FLOW, each read)
        lists = [
            self._replay_keys[key]
            for cid, keys in self._replay_by_target.items()
            if cid is not None and (c := self._consumers.get(cid)) is not None and self._ready(c)
            for key in keys
        ]
        if not lists:
            return ()
        if len(lists) == 1:
            return tuple(lists[0][:limit])
        return tuple(itertools.islice(heapq.merge(*lists), limit))

    def _assign(self, entries: Sequence[DispatchEntry], cmds: list[Command], *, replay: bool) -> None:
        t = self.sub_type
        if t in (SubType.EXCLUSIVE, SubType.FAILOVER):
            active = self._consumers.get(self._active) if self._active is not None else None
            # an older entry put back while this read was in flight (the active consumer changed and the old
            # one's unacked entries were rewound, or a redelivery) goes first: what was read waits behind it
            oldest = min(self._replay, default=None)
            parking = False
            for e in entries:
                if (
                    parking
                    or active is None
                    or active.permits <= 0
                    or not active.writable
                    or (oldest is not None and oldest < e.position)
                ):
                    parking = True
                    self._park(e)  # later entries park too: replays go first, so the order holds
                else:
                    self._send(active, e, cmds)
        elif t == SubType.SHARED:
            for e in entries:
                c = self._next_shared()
                if c is None:
                    self._park(e)
                else:
                    self._send(c, e, cmds)
        else:
            blocked: set[bytes] = set()
            for e in entries:
                key = e.key
                # a key with an older entry waiting goes no further: a new entry waits behind it, and so does a
                # replayed one whose key had an older entry put back while the replay was read (its consumer
                # closed, or it was redelivered meanwhile), which would otherwise be sent after it
                held = self._replay_keys.get(key)
                if key in blocked or (held is not None and (not replay or held[0] < e.position)):
                    blocked.add(key)
                    self._park(e)
                    continue
                cid = self._key_target(key)
                kc = self._consumers.get(cid) if cid is not None else None
                if kc is None or not self._ready(kc):
                    blocked.add(key)
                    self._park(e)
                else:
                    self._send(kc, e, cmds)

    def _park(self, e: DispatchEntry) -> None:
        """Not deliverable now: remember it for replay (keeping what the dispatcher knows of it)."""
        self._info[e.position] = _Info(e.num_messages, e.key)
        self._add_replay(e.position)

    def _send(self, c: _Consumer, e: DispatchEntry, cmds: list[Command]) -> None:
        pos = e.position
        self._info[pos] = _Info(e.num_messages, e.key)
        before = self._permits_counted(c)
        c.pending[pos] = e.num_messages
        c.unacked_messages += e.num_messages
        self._unacked_total += e.num_messages
        c.permits -= e.num_messages
        self._ready_permits += self._permits_counted(c) - before
        self._owner[pos] = c.consumer_id
        if self.sub_type == SubType.KEY_SHARED:
            self._key_owner[e.key] = c.consumer_id
            if e.key in self._replay_target:
                self._retarget_replay_key(e.key)
            self._key_pending[e.key] = self._key_pending.get(e.key, 0) + 1
        acked = self._batch_acks.get(pos)
        ack_set = unacked_set(e.num_messages, acked) if acked and e.num_messages > 1 else None
        cmds.append(Deliver(c.consumer_id, e, self._redeliveries.get(pos, 0), ack_set))

    def _next_shared(self) -> _Consumer | None:
        n = len(self._rr)
        level = None
        if len(self._levels) > 1:
            # as Pulsar's Shared dispatcher: the highest priority level (the lowest number) that has a consumer
            # ready, round robin within it (one level: every consumer, no walk for it)
            level = min((c.priority for c in self._consumers.values() if self._ready(c)), default=None)
            if level is None:
                return None
        for i in range(n):
            cid = self._rr[(self._rr_next + i) % n]
            c = self._consumers[cid]
            if self._ready(c) and (level is None or c.priority == level):
                self._rr_next = (self._rr_next + i + 1) % n
                return c
        return None

    # -- Failover / Exclusive election ----------------------------------------------------------------------

    def _elect(self, announce_to: int | None = None) -> list[Command]:
        """Pick the active consumer; announce a change to everyone, or the current state to a newcomer."""
        if not self._consumers:
            self._active = None
            return []
        ordered = sorted(self._consumers.values(), key=lambda c: (c.priority, c.name, c.seq))
        # as Pulsar's pickAndScheduleActiveConsumer: the partitions go to the consumers of the highest priority
        # level (the lowest number) alone; one of a lower level is active only when none of the highest is left
        top = sum(1 for c in ordered if c.priority == ordered[0].priority)
        if self.partition >= 0:
            index = self.partition % top
        elif self.topic_hash is not None and top > 1:
            # a non-partitioned topic: Pulsar's consistent-hash ring of those consumers' names, so that the topics
            # of a multi-topic or regex Failover subscription are spread over its consumers
            index = failover_ring_pick(self.topic_hash, [c.name for c in ordered[:top]])
        else:
            index = 0
        new = ordered[index].consumer_id
        if self.sub_type == SubType.EXCLUSIVE:
            self._active = new
            return []
        old = self._active
        cmds: list[Command] = []
        if new != old:
            if old is not None and old in self._consumers:
                prev = self._consumers[old]
                # Pulsar rewinds the cursor on a switch: the new active consumer gets what the old one had not
                # acked, in order (the old consumer's late acks still count).
                self._to_replay(prev, list(prev.pending), bump=False)
            self._active = new
            cmds += [ActiveConsumerChanged(cid, cid == new) for cid in self._consumers]
            if self.sub_type == SubType.FAILOVER and self.failover_delay_s > 0 and not self._holding:
                # as Pulsar's scheduleReadOnActiveConsumer: nothing goes out for a while, so that a consumer
                # reconnecting a moment after another (both after an owner change) is not sent what the
                # other then takes over (it stayed in the first one's receive queue and came out there
                # again once the other left); a read under way is dropped (read again after the hold)
                self._holding = True
                self.epoch += 1
                self.reading = False
                self._reading_replay = ()
                cmds.append(HoldDispatch(self.failover_delay_s))
        elif announce_to is not None:
            cmds.append(ActiveConsumerChanged(announce_to, announce_to == new))
        return cmds

    # -- Key_Shared -----------------------------------------------------------------------------------------

    def _ring_add(self, c: _Consumer) -> None:
        for i in range(RING_POINTS_PER_CONSUMER):
            point = key_hash(f"{c.name}#{c.consumer_id}#{i}".encode())
            bisect.insort(self._ring, (point, c.consumer_id))

    def _key_target(self, key: bytes) -> int | None:
        owner = self._key_owner.get(key)
        if owner is not None and owner in self._consumers:
            return owner
        h = key_hash(key)
        for c in self._consumers.values():
            for start, end in c.hash_ranges:
                if start <= h <= end:
                    return c.consumer_id
        if not self._ring:
            return None
        i = bisect.bisect_left(self._ring, (h, -1))
        return self._ring[i % len(self._ring)][1]

    def _unpin_key(self, pos: Position) -> None:
        if self.sub_type != SubType.KEY_SHARED:
            return
        info = self._info.get(pos)
        if info is None:
            return
        left = self._key_pending.get(info.key, 0) - 1
        if left > 0:
            self._key_pending[info.key] = left
        else:
            self._key_pending.pop(info.key, None)
            self._key_owner.pop(info.key, None)
            if info.key in self._replay_target:
                self._retarget_replay_key(info.key)
