"""The pure dispatch core of a subscription, driven without sockets or storage."""

from __future__ import annotations

from typing import Any

import pytest

from topic_broker.subscription import (
    ActiveConsumerChanged,
    Command,
    ConsumerAssignError,
    ConsumerBusyError,
    Deliver,
    DispatchEntry,
    HoldDispatch,
    Position,
    Read,
    ReadReplay,
    Subscription,
    SubType,
    acked_mask,
    failover_ring_pick,
    failover_topic_hash,
    murmur3_32,
    unacked_set,
)


class FakeLog:
    """A managed ledger stand-in: entries (1, 0), (1, 1), ... with optional keys and batch sizes."""

    def __init__(self, n: int, keys: list[bytes] | None = None, batch: int = 1) -> None:
        self.entries = [DispatchEntry((1, i), batch, keys[i] if keys else b"", f"m{i}") for i in range(n)]

    def read(self, start: Position, max_entries: int) -> tuple[list[DispatchEntry], Position]:
        got = [e for e in self.entries if e.position >= start][:max_entries]
        nxt = (got[-1].position[0], got[-1].position[1] + 1) if got else start
        return got, nxt

    def get(self, positions: tuple[Position, ...]) -> list[DispatchEntry]:
        want = set(positions)
        return [e for e in self.entries if e.position in want]


def run(sub: Subscription, log: FakeLog, cmds: list[Command]) -> list[Command]:
    """Execute Read/ReadReplay commands against the log until none is left; return everything else."""
    out: list[Command] = []
    queue = list(cmds)
    while queue:
        c = queue.pop(0)
        if isinstance(c, Read):
            entries, nxt = log.read(c.start, c.max_entries)
            queue += sub.on_read(c.epoch, entries, nxt)
        elif isinstance(c, ReadReplay):
            queue += sub.on_replay_read(c.epoch, log.get(c.positions))
        else:
            out.append(c)
    return out


def delivered(cmds: list[Command]) -> list[tuple[int, Position, int]]:
    return [(c.consumer_id, c.entry.position, c.redelivery_count) for c in cmds if isinstance(c, Deliver)]


def test_exclusive_delivers_in_order_within_permits() -> None:
    sub = Subscription(SubType.EXCLUSIVE, read_position=(1, 0))
    log = FakeLog(10)
    assert run(sub, log, sub.add_consumer(1, "a")) == []
    out = delivered(run(sub, log, sub.flow(1, 4)))
    assert out == [(1, (1, i), 0) for i in range(4)]
    assert sub.permits(1) == 0
    out = delivered(run(sub, log, sub.flow(1, 100)))
    assert [p for _, p, _ in out] == [(1, i) for i in range(4, 10)]
    assert sub.caught_up


@pytest.mark.parametrize("sub_type", [SubType.EXCLUSIVE, SubType.SHARED])
def test_a_consumer_whose_connection_takes_no_more_is_sent_nothing_until_it_does(sub_type: SubType) -> None:
    """Not writable (its connection's unsent bytes over the high-water mark): permits start no read, and what a
    read in flight brings waits; writable again, everything is delivered in order."""
    sub = Subscription(sub_type, read_position=(1, 0))
    log = FakeLog(10)
    sub.add_consumer(1, "a")
    reads = sub.flow(1, 5)
    assert [type(c) for c in reads] == [Read]
    assert sub.set_writable(1, False) == []
    assert delivered(run(sub, log, reads)) == []  # what the read in flight brings waits
    assert run(sub, log, sub.flow(1, 1000)) == []  # no read started
    assert sub.set_writable(1, False) == []
    out = delivered(run(sub, log, sub.set_writable(1, True)))
    assert [p for _, p, _ in out] == [(1, i) for i in range(10)]


def test_second_exclusive_consumer_is_busy() -> None:
    sub = Subscription(SubType.EXCLUSIVE)
    sub.add_consumer(1, "a")
    with pytest.raises(ConsumerBusyError):
        sub.add_consumer(2, "b")


def test_other_type_refused_while_consumers_attached() -> None:
    sub = Subscription(SubType.SHARED)
    sub.add_consumer(1, "a")
    with pytest.raises(ConsumerBusyError):
        sub.add_consumer(2, "b", sub_type=SubType.FAILOVER)
    sub.remove_consumer(1)
    sub.add_consumer(2, "b", sub_type=SubType.FAILOVER)
    assert sub.sub_type == SubType.FAILOVER


def test_batch_entry_costs_its_message_count() -> None:
    sub = Subscription(SubType.EXCLUSIVE, read_position=(1, 0))
    log = FakeLog(5, batch=10)
    sub.add_consumer(1, "a")
    out = delivered(run(sub, log, sub.flow(1, 15)))
    # one entry of 10 leaves 5 permits, the next one takes it to -5, then nothing more
    assert [p for _, p, _ in out] == [(1, 0), (1, 1)]
    assert sub.permits(1) == -5


def test_shared_round_robin_within_permits() -> None:
    sub = Subscription(SubType.SHARED, read_position=(1, 0))
    log = FakeLog(6)
    sub.add_consumer(1, "a")
    sub.add_consumer(2, "b")
    run(sub, log, sub.flow(1, 1))
    out = delivered(run(sub, log, sub.flow(2, 10)))
    consumers = [c for c, _, _ in out]
    assert sub.permits(1) == 0
    assert consumers.count(2) == 5
    assert sorted(sub.pending(1) + sub.pending(2)) == [(1, i) for i in range(6)]


def test_consumer_loss_redelivers_to_others_with_count() -> None:
    sub = Subscription(SubType.SHARED, read_position=(1, 0))
    log = FakeLog(4)
    sub.add_consumer(1, "a")
    run(sub, log, sub.flow(1, 4))
    assert sub.pending(1) == [(1, i) for i in range(4)]
    sub.add_consumer(2, "b")
    run(sub, log, sub.flow(2, 10))
    out = delivered(run(sub, log, sub.remove_consumer(1)))
    assert out == [(2, (1, i), 1) for i in range(4)]


@pytest.mark.parametrize("sub_type", list(SubType))
def test_redeliver_named_positions_bumps_count_each_time_on_shared_and_key_shared(sub_type: SubType) -> None:
    """As Pulsar, whose Exclusive and Failover dispatchers have no redelivery tracker: their count stays 0."""
    sub = Subscription(sub_type, read_position=(1, 0))
    log = FakeLog(3)
    sub.add_consumer(1, "a")
    run(sub, log, sub.flow(1, 100))
    counted = sub_type in (SubType.SHARED, SubType.KEY_SHARED)
    for expected in (1, 2, 3):
        out = delivered(run(sub, log, sub.redeliver(1, [(1, 1)])))
        assert out == [(1, (1, 1), expected if counted else 0)]


def test_redeliver_all_resends_in_order_before_new_entries() -> None:
    sub = Subscription(SubType.SHARED, read_position=(1, 0))
    log = FakeLog(3)
    sub.add_consumer(1, "a")
    run(sub, log, sub.flow(1, 100))
    log.entries.append(DispatchEntry((1, 3), 1, b"", "m3"))
    cmds = sub.redeliver(1)
    cmds += sub.on_new_entries()
    out = delivered(run(sub, log, cmds))
    assert [p for _, p, _ in out] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert [r for _, _, r in out] == [1, 1, 1, 0]


def test_individual_and_cumulative_acks() -> None:
    sub = Subscription(SubType.EXCLUSIVE, read_position=(1, 0))
    log = FakeLog(6)
    sub.add_consumer(1, "a")
    run(sub, log, sub.flow(1, 100))
    res = sub.ack_individual([((1, 4), -1, None)])
    assert res.acked == [(1, 4)]
    res = sub.ack_cumulative((1, 2))
    assert sorted(res.acked) == [(1, 0), (1, 1), (1, 2)]
    assert res.mark_delete == (1, 2)
    assert sub.pending(1) == [(1, 3), (1, 5)]
    # nothing acked is redelivered
    out = delivered(run(sub, log, sub.remove_consumer(1) + sub.add_consumer(2, "b") + sub.flow(2, 100)))
    assert [p for _, p, _ in out] == [(1, 3), (1, 5)]


@pytest.mark.parametrize(
    ("acks", "fully_acked"),
    [
        ([((1, 0), 0, None), ((1, 0), 1, None)], []),
        ([((1, 0), 0, None), ((1, 0), 1, None), ((1, 0), 2, None)], [(1, 0)]),
        ([((1, 0), 1, [0b101])], []),
        ([((1, 0), 1, [0])], [(1, 0)]),
        ([((1, 0), -1, None)], [(1, 0)]),
    ],
)
def test_batch_index_acks(acks: list, fully_acked: list[Position]) -> None:
    sub = Subscription(SubType.EXCLUSIVE, read_position=(1, 0))
    log = FakeLog(1, batch=3)
    sub.add_consumer(1, "a")
    run(sub, log, sub.flow(1, 100))
    assert sub.ack_individual(acks).acked == fully_acked


def test_a_partly_acked_batch_is_redelivered_with_the_ack_set_of_what_is_left() -> None:
    """Batch-index acks (ack sets): the acked messages are remembered, a redelivery carries the set of those
    still unacked (the client skips the others), and the set that clears the last one acks the entry."""
    sub = Subscription(SubType.SHARED, read_position=(1, 0))
    log = FakeLog(1, batch=70)
    sub.add_consumer(1, "a")
    first = [c for c in run(sub, log, sub.flow(1, 100)) if isinstance(c, Deliver)]
    assert first[0].ack_set is None
    left = [-1, (1 << 6) - 1]  # 70 messages, all unacked: 64 bits, then 6
    left[0] &= ~0b101  # messages 0 and 2 acked
    assert sub.ack_individual([((1, 0), -1, left)]).acked == []
    again = run(sub, log, sub.remove_consumer(1) + sub.add_consumer(2, "b") + sub.flow(2, 100))
    redelivered = [c for c in again if isinstance(c, Deliver)]
    assert [d.entry.position for d in redelivered] == [(1, 0)]
    assert redelivered[0].ack_set == unacked_set(70, 0b101)
    assert acked_mask(redelivered[0].ack_set, 70) == 0b101
    assert sub.ack_individual([((1, 0), -1, [1 << 1, 0])]).acked == []  # 1 is still unacked
    assert sub.ack_individual([((1, 0), -1, [0, 0])]).acked == [(1, 0)]


def test_partly_acked_batches_are_reported_for_the_cursor_and_restored_from_it() -> None:
    """What the cursor must store (``AckOutcome.batches``) and what a subscription opened on a stored cursor
    starts from (``restore_batch_acks``): the first delivery already carries the ack set of what is left."""
    sub = Subscription(SubType.EXCLUSIVE, read_position=(1, 0))
    log = FakeLog(2, batch=5)
    sub.add_consumer(1, "a")
    run(sub, log, sub.flow(1, 100))
    assert sub.ack_individual([((1, 0), -1, list(unacked_set(5, 0b11)))]).batches == [((1, 0), 0b11)]
    assert sub.ack_individual([((1, 0), 4, None)]).batches == [((1, 0), 0b10011)]
    assert sub.ack_cumulative((1, 1), 2).batches == [((1, 1), 0b111)]
    assert sub.ack_individual([((1, 0), -1, [0])]).batches == []  # the whole entry: nothing partial
    restored = Subscription(SubType.EXCLUSIVE, read_position=(1, 0))
    restored.restore_batch_acks([((1, 0), 0b101)])
    restored.add_consumer(1, "a")
    first = [c for c in run(restored, log, restored.flow(1, 100)) if isinstance(c, Deliver)]
    assert [(d.entry.position, d.ack_set) for d in first] == [((1, 0), unacked_set(5, 0b101)), ((1, 1), None)]


def test_ack_sets_are_signed_64_bit_words() -> None:
    assert unacked_set(3, 0) == (0b111,)
    assert unacked_set(64, 0) == (-1,)
    assert unacked_set(65, 1 << 64) == (-1, 0)
    assert acked_mask((-1, 0), 65) == 1 << 64
    assert acked_mask((0b110,), 3) == 0b001
    assert acked_mask((-1,), 70) == ((1 << 70) - 1) & ~((1 << 64) - 1)  # words not sent: acked


def test_cumulative_ack_inside_a_batch_marks_the_entry_before() -> None:
    sub = Subscription(SubType.EXCLUSIVE, read_position=(1, 0))
    log = FakeLog(3, batch=3)
    sub.add_consumer(1, "a")
    run(sub, log, sub.flow(1, 100))
    res = sub.ack_cumulative((1, 1), 1)
    assert res.acked == [(1, 0)] and res.mark_delete == (1, 0)
    res = sub.ack_cumulative((1, 1), 2)
    assert res.mark_delete == (1, 1)


def test_failover_picks_by_priority_then_name_and_announces() -> None:
    sub = Subscription(SubType.FAILOVER, partition=-1, read_position=(1, 0))
    log = FakeLog(4)
    assert sub.add_consumer(1, "b") == [ActiveConsumerChanged(1, True)]
    cmds = sub.add_consumer(2, "a")
    assert set(cmds) == {ActiveConsumerChanged(1, False), ActiveConsumerChanged(2, True)}
    assert sub.active_consumer == 2
    run(sub, log, sub.flow(1, 100))
    out = delivered(run(sub, log, sub.flow(2, 100)))
    assert {c for c, _, _ in out} == {2}
    cmds = sub.remove_consumer(2)
    assert ActiveConsumerChanged(1, True) in cmds
    out = delivered(run(sub, log, cmds))
    assert out == [(1, (1, i), 0) for i in range(4)]  # Pulsar counts no redeliveries on Failover


def test_failover_partition_index_selects_consumer() -> None:
    sub = Subscription(SubType.FAILOVER, partition=3)
    sub.add_consumer(1, "a")
    sub.add_consumer(2, "b")
    assert sub.active_consumer == 2  # 3 % 2 = 1 -> second by name
    sub.add_consumer(3, "c", priority=-1)  # a lower priority level sorts first
    assert sub.active_consumer == 3  # sorted: c, a, b; 3 % 3 = 0 -> c
    sub2 = Subscription(SubType.FAILOVER, partition=0)
    sub2.add_consumer(1, "a")
    sub2.add_consumer(3, "c", priority=-1)
    assert sub2.active_consumer == 3


def test_failover_partitions_go_to_the_highest_priority_level_only() -> None:
    """As Pulsar's pickAndScheduleActiveConsumer: the partitions are spread over the consumers of the highest
    priority level (the lowest number) alone, by name; a consumer of a lower level is active only once none of
    the highest is left (ConsumerBuilder.priorityLevel: "Broker evenly assigns partitioned topics to highest
    priority consumers")."""
    consumers = [(1, "aaa", 0), (2, "bbb", 0), (3, "bbb", 1), (4, "abb", 1), (5, "aaa", 1)]
    active = []
    for partition in range(5):
        sub = Subscription(SubType.FAILOVER, partition=partition)
        for cid, name, priority in consumers:
            sub.add_consumer(cid, name, priority)
        active.append(sub.active_consumer)
    assert active == [1, 2, 1, 2, 1]
    sub = Subscription(SubType.FAILOVER, partition=2)
    for cid, name, priority in consumers:
        sub.add_consumer(cid, name, priority)
    sub.remove_consumer(1)
    assert sub.active_consumer == 2  # the one left at level 0
    cmds = sub.remove_consumer(2)
    # level 1 by name: aaa, abb, bbb; 2 % 3
    assert sub.active_consumer == 3 and ActiveConsumerChanged(3, True) in cmds


def test_failover_sends_nothing_for_the_delay_after_the_active_consumer_changes() -> None:
    """As Pulsar's scheduleReadOnActiveConsumer (activeConsumerFailoverDelayTimeMillis): after a change of the
    active consumer nothing is read or sent until the hold is released, one hold at a time, and a read under way
    at the change is dropped (read again after it). b subscribing a moment before a (both reconnecting) is sent
    nothing that a then takes over."""
    sub = Subscription(SubType.FAILOVER, read_position=(1, 0))
    sub.failover_delay_s = 1.0
    log = FakeLog(5)
    out = run(sub, log, sub.add_consumer(2, "b") + sub.flow(2, 10))
    assert HoldDispatch(1.0) in out and delivered(out) == []
    out = run(sub, log, sub.add_consumer(1, "a") + sub.flow(1, 10))
    assert sub.active_consumer == 1 and not any(isinstance(c, HoldDispatch) for c in out)
    assert delivered(out) == []
    assert delivered(run(sub, log, sub.release_hold())) == [(1, (1, i), 0) for i in range(5)]
    # a read under way when a leaves is dropped; b is sent the rest after the hold
    log.entries += [DispatchEntry((1, i), 1, b"", f"m{i}") for i in range(5, 8)]
    reads = [c for c in sub.on_new_entries() if isinstance(c, Read)]
    assert reads
    out = sub.remove_consumer(1)
    assert HoldDispatch(1.0) in out and delivered(out) == []
    for r in reads:
        entries, nxt = log.read(r.start, r.max_entries)
        assert sub.on_read(r.epoch, entries, nxt) == []
    out = delivered(run(sub, log, sub.release_hold()))
    assert [p for _, p, _ in out] == [(1, i) for i in range(8)]
    assert {cid for cid, _, _ in out} == {2}
    # without a delay (a core's default) the change dispatches at once
    sub = Subscription(SubType.FAILOVER, read_position=(1, 0))
    out = run(sub, FakeLog(2), sub.add_consumer(1, "a") + sub.flow(1, 10))
    assert len(delivered(out)) == 2


def test_shared_dispatch_prefers_the_highest_priority_level_while_it_has_permits() -> None:
    """Pulsar's Shared dispatch with priority levels, as ConsumerBuilder.priorityLevel documents it: round robin
    over the consumers of the highest level (the lowest number) while one of them has permits, then over the next
    level's; its table (permits 2, 1, 1 at level 0 and 2, 1 at level 1) gives C1, C2, C3, C1, C4, C5, C4."""
    sub = Subscription(SubType.SHARED, read_position=(1, 0))
    log = FakeLog(0)
    for cid, priority in [(1, 0), (2, 0), (3, 0), (4, 1), (5, 1)]:
        run(sub, log, sub.add_consumer(cid, f"c{cid}", priority))
    for cid, permits in [(1, 2), (2, 1), (3, 1), (4, 2), (5, 1)]:
        run(sub, log, sub.flow(cid, permits))
    log.entries = FakeLog(7).entries
    out = delivered(run(sub, log, sub.on_new_entries()))
    assert [cid for cid, _, _ in out] == [1, 2, 3, 1, 4, 5, 4]


def _pulsar_ring_pick(topic: str, names: list[str]) -> int:
    """Pulsar's peekConsumerIndexFromHashRing written as it reads: a map of every name's 100 points (a point two
    names share is the later one's), the first at or after the topic's hash, else the map's first."""
    ring: dict[int, int] = {}
    for i, name in enumerate(names):
        for j in range(100):
            ring[murmur3_32(f"{name}{j}".encode()) & 0x7FFFFFFF] = i
    h = murmur3_32(topic.encode()) & 0x7FFFFFFF
    at_or_after = [p for p in ring if p >= h]
    return ring[min(at_or_after)] if at_or_after else ring[min(ring)]


def test_failover_ring_pick_is_pulsars_ring() -> None:
    import random

    rnd = random.Random(7)
    for _ in range(200):
        names = sorted(f"c-{rnd.randrange(10**6)}" for _ in range(rnd.randint(1, 6)))
        topic = f"persistent://public/default/t-{rnd.randrange(10**9)}"
        assert failover_ring_pick(failover_topic_hash(topic), names) == _pulsar_ring_pick(topic, names)


def test_a_non_partitioned_topics_active_failover_consumer_is_the_rings() -> None:
    """On a non-partitioned topic the active consumer is the one Pulsar's consistent-hash ring of the highest
    priority level's names gives the topic (a multi-topic or regex subscription's topics spread over its
    consumers), not the first by name; a lower level is not on the ring."""
    picked = set()
    for n in range(40):
        topic = f"persistent://public/default/ring-{n}"
        sub = Subscription(SubType.FAILOVER, topic_hash=failover_topic_hash(topic))
        sub.add_consumer(1, "a")
        sub.add_consumer(2, "b")
        sub.add_consumer(3, "c", priority=1)
        expected = ["a", "b"][_pulsar_ring_pick(topic, ["a", "b"])]
        assert {1: "a", 2: "b"}[sub.active_consumer] == expected  # type: ignore[index]
        picked.add(expected)
        sub.remove_consumer(1)
        sub.remove_consumer(2)
        assert sub.active_consumer == 3
    assert picked == {"a", "b"}


def test_key_shared_keeps_each_key_on_one_consumer() -> None:
    keys = [f"k{i % 7}".encode() for i in range(70)]
    sub = Subscription(SubType.KEY_SHARED, read_position=(1, 0))
    log = FakeLog(70, keys=keys)
    sub.add_consumer(1, "a")
    sub.add_consumer(2, "b")
    cmds = sub.flow(1, 1000) + sub.flow(2, 1000)
    out = [c for c in run(sub, log, cmds) if isinstance(c, Deliver)]
    owner: dict[bytes, int] = {}
    for d in out:
        assert owner.setdefault(d.entry.key, d.consumer_id) == d.consumer_id
    assert len(out) == 70
    assert set(owner.values()) == {1, 2}


def test_key_shared_key_stays_while_unacked_then_moves() -> None:
    sub = Subscription(SubType.KEY_SHARED, read_position=(1, 0))
    log = FakeLog(1, keys=[b"k"])
    sub.add_consumer(1, "a")
    run(sub, log, sub.flow(1, 100))
    assert sub.pending(1) == [(1, 0)]
    # a newcomer whose ring share would take "k" does not get it while consumer 1 holds an unacked "k"
    for cid in range(2, 12):
        sub.add_consumer(cid, f"c{cid}")
        sub.flow(cid, 100)
    assert sub.consumer_for_key(b"k") == 1
    sub.ack_individual([((1, 0), -1, None)])
    assert sub.consumer_for_key(b"k") is not None


def test_key_shared_blocked_key_does_not_overtake() -> None:
    keys = [b"x", b"x", b"y"]
    sub = Subscription(SubType.KEY_SHARED, read_position=(1, 0))
    log = FakeLog(3, keys=keys)
    sub.add_consumer(1, "a")
    sub.add_consumer(2, "b")
    owner_x = sub.consumer_for_key(b"x")
    assert owner_x is not None
    other = 2 if owner_x == 1 else 1
    out = delivered(run(sub, log, sub.flow(other, 100)))
    # x entries wait for their consumer; y (if on `other`) goes through
    assert all(p != (1, 0) and p != (1, 1) for _, p, _ in out)
    out = delivered(run(sub, log, sub.flow(owner_x, 100)))
    assert [p for c, p, _ in out if c == owner_x][:2] == [(1, 0), (1, 1)]


def test_key_shared_sticky_ranges() -> None:
    from topic_broker.subscription import key_hash

    h = key_hash(b"k")
    sub = Subscription(SubType.KEY_SHARED)
    sub.add_consumer(1, "a", hash_ranges=[(0, h)])
    with pytest.raises(ConsumerBusyError):
        sub.add_consumer(2, "b", hash_ranges=[(h, 65535)])
    if h < 65535:
        sub.add_consumer(2, "b", hash_ranges=[(h + 1, 65535)])
    assert sub.consumer_for_key(b"k") == 1


def test_key_hash_is_pulsars_murmur3_and_the_sticky_key_its_peek() -> None:
    """Pulsar's Key_Shared hash: Murmur3_32 (the published test vectors), the sign bit cleared, modulo 65536;
    the key an entry is routed by: ordering key, else partition key (base64-decoded when so flagged), else
    NONE_KEY."""
    import base64
    import hashlib

    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker.subscription import KEY_HASH_MURMUR_MAX, key_hash, murmur3_32
    from topic_broker.wire import sticky_key

    assert murmur3_32(b"") == 0
    assert murmur3_32(b"hello") == 0x248BFA47
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723
    assert key_hash(b"orders-eu") == 0x9399  # 0xdda99399 & 0x7fffffff
    assert key_hash(b"x" * 1000) == (murmur3_32(b"x" * 1000) & 0x7FFFFFFF) % 65536
    huge = b"x" * (KEY_HASH_MURMUR_MAX + 1)  # BLAKE2b, not to hold the event loop (docs/broker.md)
    assert key_hash(huge) == int.from_bytes(hashlib.blake2b(huge, digest_size=4).digest(), "big") % 65536
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=0)
    assert sticky_key(md) == b"NONE_KEY"
    md.partition_key = base64.b64encode(b"\x00\xff").decode()
    assert sticky_key(md) == md.partition_key.encode()
    md.partition_key_b64_encoded = True
    assert sticky_key(md) == b"\x00\xff"
    md.ordering_key = b"o"
    assert sticky_key(md) == b"o"


def test_key_shared_modes_do_not_mix_and_bad_sticky_ranges_are_assign_errors() -> None:
    """As Pulsar: another Key_Shared mode or out-of-order setting than the attached consumers' is ConsumerBusy;
    empty, out-of-range or overlapping sticky ranges are ConsumerAssignError (which the client does not retry)."""
    auto = Subscription(SubType.KEY_SHARED)
    auto.add_consumer(1, "a")
    for refused in ({"hash_ranges": [(0, 10)]}, {"out_of_order": True}):
        with pytest.raises(ConsumerBusyError) as e:
            auto.add_consumer(2, "b", **refused)  # type: ignore[arg-type]
        assert not isinstance(e.value, ConsumerAssignError)
    auto.add_consumer(2, "b")
    sticky = Subscription(SubType.KEY_SHARED)
    sticky.add_consumer(1, "a", hash_ranges=[(0, 99)])
    with pytest.raises(ConsumerBusyError, match="AUTO_SPLIT"):
        sticky.add_consumer(2, "b")
    for ranges in ([], [(50, 150)], [(100, 65536)], [(7, 3)]):
        with pytest.raises(ConsumerAssignError):
            sticky.add_consumer(2, "b", hash_ranges=ranges, sticky=True)
    sticky.add_consumer(2, "b", hash_ranges=[(100, 65535)])
    assert sticky.consumer_for_key(b"k") in (1, 2)


def test_reset_drops_reads_in_flight_and_pending() -> None:
    sub = Subscription(SubType.EXCLUSIVE, read_position=(1, 0))
    log = FakeLog(5)
    sub.add_consumer(1, "a")
    cmds = sub.flow(1, 100)
    assert isinstance(cmds[0], Read)
    stale = cmds[0]
    seek = sub.reset((1, 3))
    entries, nxt = log.read(stale.start, stale.max_entries)
    assert sub.on_read(stale.epoch, entries, nxt) == []
    out = delivered(run(sub, log, seek))
    assert [p for _, p, _ in out] == [(1, 3), (1, 4)]


def test_caught_up_waits_for_new_entries() -> None:
    sub = Subscription(SubType.EXCLUSIVE, read_position=(1, 0))
    log = FakeLog(1)
    sub.add_consumer(1, "a")
    run(sub, log, sub.flow(1, 100))
    assert sub.caught_up
    assert sub.flow(1, 1) == []
    log.entries.append(DispatchEntry((1, 1), 1, b"", "m1"))
    out = delivered(run(sub, log, sub.on_new_entries()))
    assert out == [(1, (1, 1), 0)]


def test_replayed_positions_gone_from_the_log_are_dropped() -> None:
    sub = Subscription(SubType.SHARED, read_position=(1, 0))
    log = FakeLog(2)
    sub.add_consumer(1, "a")
    run(sub, log, sub.flow(1, 100))
    log.entries = []  # trimmed
    out = delivered(run(sub, log, sub.redeliver(1)))
    assert out == [] and sub.replay_positions == []


def test_unacked_limit_stops_dispatch_until_acks() -> None:
    sub = Subscription(SubType.SHARED, read_position=(1, 0), unacked_messages_max=2)
    log = FakeLog(5)
    sub.add_consumer(1, "a")
    out = delivered(run(sub, log, sub.flow(1, 100)))
    assert len(out) == 2
    res = sub.ack_individual([((1, 0), -1, None), ((1, 1), -1, None)])
    out = delivered(run(sub, log, res.commands))
    assert [p for _, p, _ in out] == [(1, 2), (1, 3)]


def test_the_subscriptions_unacked_limit_holds_all_its_consumers_until_acks() -> None:
    """maxUnackedMessagesOnSubscription: a Shared subscription whose consumers together hold the limit sends
    nothing more to any of them (blockedSubscriptionOnUnackedMsgs), each under its own limit; an ack lets one
    more go; a consumer leaving gives its messages back to the count; a reset clears it."""
    sub = Subscription(SubType.SHARED, read_position=(1, 0))
    sub.unacked_subscription_max = 3
    log = FakeLog(8)
    sub.add_consumer(1, "a")
    sub.add_consumer(2, "b")
    out = delivered(run(sub, log, sub.flow(1, 100) + sub.flow(2, 100)))
    assert len(out) == 3 and {cid for cid, _, _ in out} == {1, 2}
    assert sub.blocked_subscription_on_unacked() and not sub.blocked_on_unacked(1)
    first = out[0][1]
    out = delivered(run(sub, log, sub.ack_individual([(first, -1, None)]).commands))
    assert len(out) == 1 and sub.blocked_subscription_on_unacked()
    held_by_2 = len(sub.pending(2))
    run(sub, log, sub.remove_consumer(2))  # its messages are the other's to take, within the limit
    assert len(sub.pending(1)) == 3 and sub.blocked_subscription_on_unacked()
    assert held_by_2 > 0
    run(sub, log, sub.reset((1, 0)))
    assert len(sub.pending(1)) == 3


@pytest.mark.parametrize("sub_type", [SubType.EXCLUSIVE, SubType.FAILOVER])
def test_unacked_limit_leaves_exclusive_and_failover_consumers_alone(sub_type: SubType) -> None:
    """As Pulsar, which counts unacked messages on Shared and Key_Shared only (its isIndividualAckMode): an
    Exclusive or Failover consumer past the limit is sent on, so one that acknowledges cumulatively every N
    messages, N over a topic's maxUnackedMessagesOnConsumer, is not stalled for good waiting for the N-th."""
    sub = Subscription(sub_type, read_position=(1, 0), unacked_messages_max=2)
    log = FakeLog(5)
    sub.add_consumer(1, "a")
    out = delivered(run(sub, log, sub.flow(1, 100)))
    assert [p for _, p, _ in out] == [(1, i) for i in range(5)]
    assert not sub.blocked_on_unacked(1)


@pytest.mark.parametrize("sub_type", [SubType.SHARED, SubType.KEY_SHARED])
def test_delayed_entries_wait_for_their_time_without_holding_back_others(sub_type: SubType) -> None:
    sub = Subscription(sub_type, read_position=(1, 0))
    log = FakeLog(3)
    log.entries[0].deliver_at = 5_000
    sub.add_consumer(1, "a")
    cmds = sub.flow(1, 100)
    out: list[Command] = []
    for c in cmds:  # the first read at t = 1000 ms
        assert isinstance(c, Read)
        entries, nxt = log.read(c.start, c.max_entries)
        out += sub.on_read(c.epoch, entries, nxt, now_ms=1_000)
    assert [p for _, p, _ in delivered(run(sub, log, out))] == [(1, 1), (1, 2)]
    assert sub.next_delivery_ms == 5_000 and sub.delayed_count == 1
    assert delivered(run(sub, log, sub.release_delayed(4_999))) == []
    assert [p for _, p, _ in delivered(run(sub, log, sub.release_delayed(5_000)))] == [(1, 0)]
    assert sub.next_delivery_ms is None and sub.delayed_count == 0


def test_exclusive_delivers_a_delayed_entry_at_once_and_a_seek_forgets_delays() -> None:
    ex = Subscription(SubType.EXCLUSIVE, read_position=(1, 0))
    log = FakeLog(1)
    log.entries[0].deliver_at = 5_000
    ex.add_consumer(1, "a")
    (read,) = ex.flow(1, 10)
    assert isinstance(read, Read)
    entries, nxt = log.read(read.start, read.max_entries)
    assert [p for _, p, _ in delivered(ex.on_read(read.epoch, entries, nxt, now_ms=0))] == [(1, 0)]
    sh = Subscription(SubType.SHARED, read_position=(1, 0))
    sh.add_consumer(1, "a")
    (read,) = sh.flow(1, 10)
    assert isinstance(read, Read)
    assert delivered(sh.on_read(read.epoch, entries, nxt, now_ms=0)) == []
    sh.reset((1, 0))
    assert sh.next_delivery_ms is None and sh.delayed_count == 0


def read_at(sub: Subscription, log: FakeLog, reads: list[Command], now_ms: int) -> list[Command]:
    """The first reads executed at ``now_ms`` (delayed delivery decides by it); what they answer."""
    out: list[Command] = []
    for c in reads:
        assert isinstance(c, Read)
        entries, nxt = log.read(c.start, c.max_entries)
        out += sub.on_read(c.epoch, entries, nxt, now_ms=now_ms)
    return out


def test_a_cumulative_move_past_a_delayed_entry_forgets_it() -> None:
    """A skip or expire-messages moves a Shared subscription's mark-delete past an entry held back for delayed
    delivery: released at its time it must not be delivered (it is acknowledged)."""
    sub = Subscription(SubType.SHARED, read_position=(1, 0))
    log = FakeLog(4)
    log.entries[0].deliver_at = 5_000
    log.entries[3].deliver_at = 5_000
    sub.add_consumer(1, "a")
    assert [p for _, p, _ in delivered(run(sub, log, read_at(sub, log, sub.flow(1, 100), 1_000)))] == [
        (1, 1),
        (1, 2),
    ]
    assert sub.delayed_count == 2
    assert delivered(run(sub, log, sub.ack_cumulative((1, 2)).commands)) == []
    assert sub.delayed_count == 1  # (1, 3), after the new mark-delete, is still held
    assert [p for _, p, _ in delivered(run(sub, log, sub.release_delayed(5_000)))] == [(1, 3)]


def test_a_cumulative_move_past_the_read_position_reads_on_from_there() -> None:
    """A skip or expire-messages of a live subscription moves its mark-delete past what the dispatcher has read:
    the next read starts after it (it read every skipped entry again, only to leave it out as acknowledged),
    also when the move comes while a read is under way."""
    sub = Subscription(SubType.EXCLUSIVE, read_position=(1, 0))
    log = FakeLog(20)
    sub.add_consumer(1, "a")
    assert [p for _, p, _ in delivered(run(sub, log, sub.flow(1, 2)))] == [(1, 0), (1, 1)]
    assert delivered(run(sub, log, sub.ack_cumulative((1, 6)).commands)) == []
    assert sub.read_position == (1, 7)
    assert [p for _, p, _ in delivered(run(sub, log, sub.flow(1, 3)))] == [(1, 7), (1, 8), (1, 9)]
    (read,) = sub.flow(1, 2)  # a read under way from (1, 10) when the next move comes
    assert isinstance(read, Read) and read.start == (1, 10)
    sub.ack_cumulative((1, 14))
    entries, nxt = log.read(read.start, read.max_entries)  # (1, 10), (1, 11): the runtime leaves them out
    assert [p for _, p, _ in delivered(run(sub, log, sub.on_read(read.epoch, [], nxt, at_end=False)))] == [
        (1, 15),
        (1, 16),
    ]


class _CountingSubscription(Subscription):
    """Counts the Key_Shared key lookups (which consumer a key goes to) its dispatch makes."""

    lookups = 0

    def _key_target(self, key: bytes) -> int | None:
        self.lookups += 1
        return super()._key_target(key)


def test_key_shared_dispatch_does_not_rescan_the_replay_entries_of_a_stalled_consumer() -> None:
    # consumer 1 takes half the hash space and one message, then stalls: its keys' other entries wait for replay
    n = 1000
    log = FakeLog(n, keys=[f"k{i}".encode() for i in range(n)])
    sub = _CountingSubscription(SubType.KEY_SHARED, read_position=(1, 0))
    sub.add_consumer(1, "slow", hash_ranges=[(0, 32767)])
    sub.add_consumer(2, "fast", hash_ranges=[(32768, 65535)])
    run(sub, log, sub.flow(1, 1) + sub.flow(2, 10 * n))
    waiting = len(sub.replay_positions)
    fast = sub.pending(2)
    assert waiting > 300 and len(fast) > 300 and waiting + len(fast) + 1 == n
    # each ack of the fast consumer dispatches again; the stalled consumer's waiting keys are not looked at
    # each time (they were: 500 acks x 500 entries, about 250,000 lookups)
    sub.lookups = 0
    for pos in fast:
        assert delivered(run(sub, log, sub.ack_individual([(pos, -1, None)]).commands)) == []
    assert sub.lookups <= len(fast)
    # the stalled consumer takes more: everything waiting goes to it, each key in order
    out = delivered(run(sub, log, sub.flow(1, 10 * n)))
    assert len(out) == waiting and {c for c, _, _ in out} == {1} and sub.replay_positions == []


class _WalkCountingSubscription(Subscription):
    """Counts the consumers its dispatch looks at (whether each may be sent something)."""

    walked = 0

    def _ready(self, c: Any) -> bool:
        self.walked += 1
        return super()._ready(c)


def test_a_shared_dispatch_does_not_walk_every_consumer_for_its_budget() -> None:
    """Each dispatch (each SUBSCRIBE, FLOW, ack and read) summed the permits of every consumer: 15,000 SUBSCRIBEs
    of one Shared subscription took 17 s of the broker's event loop. Its budget is kept as permits change."""
    n = 400
    log = FakeLog(n)
    sub = _WalkCountingSubscription(SubType.SHARED, read_position=(1, 0), unacked_messages_max=2)
    for cid in range(n):
        assert sub.add_consumer(cid, f"c{cid}") == []
    assert sub.walked == 0
    # each consumer in turn asks for one message and is sent one: the round robin finds it next in line
    out = []
    for cid in range(n):
        out += delivered(run(sub, log, sub.flow(cid, 1)))
    assert out == [(cid, (1, cid), 0) for cid in range(n)]
    assert sub.walked <= 2 * n, sub.walked  # was n * (n + 1) / 2 and more
    # the budget still follows the limits: a consumer at its unacked limit takes nothing, an ack frees it
    more = FakeLog(n + 2)
    assert delivered(run(sub, more, sub.flow(0, 5))) == [(0, (1, n), 0)]
    assert delivered(run(sub, more, sub.flow(0, 1))) == []  # 2 unacked: at the limit, its permits wait
    assert delivered(run(sub, more, sub.ack_individual([((1, 0), -1, None)]).commands)) == [
        (0, (1, n + 1), 0)
    ]


def test_key_shared_replay_entries_follow_their_key_to_its_new_consumer_once_unpinned() -> None:
    others = range(2, 12)

    def consumers(sub: Subscription) -> None:
        for cid in others:
            sub.add_consumer(cid, f"c{cid}")

    scratch = Subscription(SubType.KEY_SHARED)
    scratch.add_consumer(1, "a")
    consumers(scratch)
    key = next(k for k in (f"key{i}".encode() for i in range(100)) if scratch.consumer_for_key(k) != 1)
    sub = Subscription(SubType.KEY_SHARED, read_position=(1, 0))
    log = FakeLog(3, keys=[key] * 3)
    sub.add_consumer(1, "a")
    assert delivered(run(sub, log, sub.flow(1, 1))) == [(1, (1, 0), 0)]
    consumers(sub)
    cmds: list[Command] = []
    for cid in others:
        cmds += sub.flow(cid, 100)
    # the key is consumer 1's while it holds (1, 0) unacked: its next entries wait, consumer 1 has no permits
    assert delivered(run(sub, log, cmds)) == [] and sub.replay_positions == [(1, 1), (1, 2)]
    # acked, the key goes where the ring puts it now, and its waiting entries with it, in order
    out = delivered(run(sub, log, sub.ack_individual([((1, 0), -1, None)]).commands))
    target = scratch.consumer_for_key(key)
    assert out == [(target, (1, 1), 0), (target, (1, 2), 0)]


@pytest.mark.parametrize("meanwhile", ["close", "redeliver"])
def test_key_shared_replay_read_does_not_overtake_an_older_entry_put_back_meanwhile(meanwhile: str) -> None:
    # consumer 1 holds both entries of a key and asks for the second again: its replay read is in flight when
    # the first comes back too (consumer 1 closes, or the first is redelivered); the second must not go first
    sub = Subscription(SubType.KEY_SHARED, read_position=(1, 0))
    log = FakeLog(2, keys=[b"k"] * 2)
    sub.add_consumer(1, "a")
    assert delivered(run(sub, log, sub.flow(1, 2))) == [(1, (1, 0), 0), (1, (1, 1), 0)]
    sub.add_consumer(2, "b")
    assert run(sub, log, sub.flow(2, 100) + sub.redeliver(1, [(1, 1)])) == []
    in_flight = sub.flow(1, 1)
    assert in_flight == [ReadReplay(0, ((1, 1),))]
    later = sub.remove_consumer(1) if meanwhile == "close" else sub.redeliver(1, [(1, 0)])
    out = delivered(run(sub, log, in_flight + later))
    assert [p for _, p, _ in out] == [(1, 0), (1, 1)] and len({c for c, _, _ in out}) == 1
    assert sub.replay_positions == []


def test_failover_read_in_flight_waits_behind_what_a_change_of_active_consumer_rewound() -> None:
    # "b" holds (1, 0) unacked and a read of (1, 1), (1, 2) for it is in flight when "a" (first by name) takes
    # over: "b"'s entry is rewound for "a", which must get it before what that read brings
    sub = Subscription(SubType.FAILOVER, read_position=(1, 0))
    log = FakeLog(3)
    sub.add_consumer(1, "b")
    assert delivered(run(sub, log, sub.flow(1, 1))) == [(1, (1, 0), 0)]
    in_flight = sub.flow(1, 2)
    assert in_flight == [Read(0, (1, 1), 2)]
    later = sub.add_consumer(2, "a") + sub.flow(2, 10)
    assert sub.active_consumer == 2
    out = delivered(run(sub, log, in_flight + later))
    assert out == [(2, (1, 0), 0), (2, (1, 1), 0), (2, (1, 2), 0)]


def test_key_hash_ranges_cover_the_hash_space_once_and_name_where_each_key_goes() -> None:
    """Pulsar's consumer stats ``keyHashRanges``: auto-split consumers' arcs of the hash ring, together the whole
    space [0, 65535] without overlap, and each key's hash inside the ranges of the consumer it goes to; a sticky
    consumer's are its declared ranges; none on another type."""
    from topic_broker.subscription import key_hash

    sub = Subscription(SubType.KEY_SHARED)
    for cid in (1, 2, 3):
        sub.add_consumer(cid, f"c{cid}")
    ranges = {cid: sub.key_hash_ranges(cid) for cid in (1, 2, 3)}
    assert all(ranges.values())
    covered = sorted(r for rs in ranges.values() for r in rs)
    assert covered[0][0] == 0 and covered[-1][1] == 65535
    assert all(a[1] + 1 == b[0] for a, b in zip(covered, covered[1:], strict=False))
    for i in range(300):
        key = f"key-{i}".encode()
        h = key_hash(key)
        owner = sub.consumer_for_key(key)
        assert owner is not None and any(s <= h <= e for s, e in ranges[owner])
    sticky = Subscription(SubType.KEY_SHARED)
    sticky.add_consumer(1, "a", hash_ranges=[(100, 199), (0, 99), (500, 600)])
    assert sticky.key_hash_ranges(1) == [(0, 199), (500, 600)]
    assert sticky.key_shared_mode() == ("STICKY", False)
    assert sub.key_shared_mode() == ("AUTO_SPLIT", False)
    shared = Subscription(SubType.SHARED)
    shared.add_consumer(1, "a")
    assert shared.key_hash_ranges(1) == [] and shared.key_shared_mode() is None


@pytest.mark.parametrize("sub_type", list(SubType))
def test_redelivered_messages_count_what_a_consumer_asked_again_on_shared_and_key_shared(
    sub_type: SubType,
) -> None:
    """What ``msgRateRedeliver`` is the rate of: the messages (a batch's all) a consumer asked to be sent again,
    counted on Shared and Key_Shared as Pulsar counts them (its Exclusive and Failover consumers keep no pending
    acks to count)."""
    sub = Subscription(sub_type, read_position=(1, 0))
    log = FakeLog(3, batch=4)
    sub.add_consumer(1, "a")
    run(sub, log, sub.flow(1, 100))
    run(sub, log, sub.redeliver(1, [(1, 1), (1, 1), (9, 9)]))  # one pending entry, named twice; one unknown
    run(sub, log, sub.redeliver(1))  # all three
    counted = sub_type in (SubType.SHARED, SubType.KEY_SHARED)
    assert sub.redelivered_messages(1) == (4 + 12 if counted else 0)
    assert sub.redelivered_messages(2) == 0
    assert not sub.blocked_on_unacked(1)


def test_a_consumer_at_the_unacked_limit_is_reported_blocked_until_it_acks() -> None:
    sub = Subscription(SubType.SHARED, read_position=(1, 0), unacked_messages_max=2)
    log = FakeLog(2)
    sub.add_consumer(1, "a")
    run(sub, log, sub.flow(1, 100))
    assert sub.pending(1) == [(1, 0), (1, 1)] and sub.blocked_on_unacked(1)
    run(sub, log, sub.ack_individual([((1, 0), -1, None)]).commands)
    assert sub.pending(1) == [(1, 1)] and not sub.blocked_on_unacked(1)


def test_the_dispatch_core_keeps_its_attributes_in_slots() -> None:
    """Every attribute a subscription sets, dispatching, acknowledging and replaying, is one of its slots: an
    instance dict of 30 names or more (CPython 3.11) made every attribute access of the dispatch a dict lookup."""
    sub = Subscription(SubType.SHARED, read_position=(1, 0))
    log = FakeLog(6, batch=2)
    sub.add_consumer(1, "a")
    sub.add_consumer(2, "b")
    out = delivered(run(sub, log, sub.flow(1, 4) + sub.flow(2, 4)))
    assert out
    sub.ack_individual([(out[0][1], -1, None)])
    run(sub, log, sub.remove_consumer(2))  # its entries replayed to the other
    assert not hasattr(sub, "__dict__")
