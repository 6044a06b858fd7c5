"""Broker logic that planted single-line bugs got past the other tests: each test here fails with such a bug.

The audit that found them is described in docs/architecture.md §11 (the topic broker's planted-bug audit)."""

from __future__ import annotations

from tests.unit.test_subscription import FakeLog, delivered, run
from topic_broker.cursor import Cursor
from topic_broker.managed_ledger import Position
from topic_broker.subscription import (
    HASH_RANGE_SIZE,
    ActiveConsumerChanged,
    Deliver,
    Subscription,
    SubType,
    key_hash,
)

P = Position


def test_every_entry_of_an_ack_range_is_acked_its_last_one_and_a_lone_entry_included() -> None:
    """The dispatcher leaves out of every read what ``is_acked`` says is acknowledged (a reconnected consumer or
    a new owner reads from the mark-delete on): an entry at the end of an ack range, or acked alone, that it
    missed would be delivered again."""
    c = Cursor(P(1, -1))
    for e in (2, 3, 4, 7):
        c.ack_individual(P(1, e))
    assert c.individually_deleted == [(P(1, 2), P(1, 4)), (P(1, 7), P(1, 7))]
    restored = Cursor.from_info(c.to_info())
    for cursor in (c, restored):
        assert [e for e in range(10) if cursor.is_acked(P(1, e))] == [2, 3, 4, 7]
    assert not c.ack_individual(P(1, 4)) and not c.ack_individual(P(1, 7)), "acked already"


def test_a_failover_switch_hands_the_old_active_consumers_unacked_entries_to_the_new_one_in_order() -> None:
    """A consumer that sorts first joins a Failover subscription: it becomes active and gets, first and in
    order, what the previous active consumer (still attached) had not acknowledged, as Pulsar rewinds the
    cursor on a switch."""
    sub = Subscription(SubType.FAILOVER, read_position=(1, 0))
    log = FakeLog(4)
    sub.add_consumer(1, "b")
    assert [p for _, p, _ in delivered(run(sub, log, sub.flow(1, 2)))] == [(1, 0), (1, 1)]
    cmds = sub.add_consumer(2, "a")
    assert ActiveConsumerChanged(2, True) in cmds and sub.active_consumer == 2
    run(sub, log, cmds)
    assert sub.pending(1) == []
    out = delivered(run(sub, log, sub.flow(2, 10)))
    assert out == [(2, (1, i), 0) for i in range(4)]


def _key(lower_half: bool) -> bytes:
    """A key whose Key_Shared hash falls in the lower (or upper) half of the hash space."""
    return next(
        k for i in range(1000) if (key_hash(k := f"k{i}".encode()) < HASH_RANGE_SIZE // 2) == lower_half
    )


def test_a_key_shared_entry_read_while_its_key_waits_for_replay_does_not_overtake_it() -> None:
    """Consumer 1 (key x) has no permits, so x's redelivery waits; consumer 2's permits start a read, and
    consumer 1's permits arrive while it is in flight. The x entry that read brings must queue behind the
    redelivery, not go first: Key_Shared keeps each key's order."""
    x, y = _key(True), _key(False)
    sub = Subscription(SubType.KEY_SHARED, read_position=(1, 0))
    log = FakeLog(3, keys=[x, y, x])
    sub.add_consumer(1, "a", hash_ranges=[(0, HASH_RANGE_SIZE // 2 - 1)])
    sub.add_consumer(2, "b", hash_ranges=[(HASH_RANGE_SIZE // 2, HASH_RANGE_SIZE - 1)])
    assert delivered(run(sub, log, sub.flow(1, 1))) == [(1, (1, 0), 0)]
    assert sub.redeliver(1, [(1, 0)]) == []  # consumer 1 has no permits left: (1, 0) waits
    read = sub.flow(2, 10)  # a read of what follows, not executed yet
    assert sub.flow(1, 10) == []  # arrives while the read is in flight
    out = [c for c in run(sub, log, read) if isinstance(c, Deliver)]
    assert [(d.consumer_id, d.entry.position, d.redelivery_count) for d in out if d.consumer_id == 1] == [
        (1, (1, 0), 1),
        (1, (1, 2), 0),
    ]
    assert [d.entry.position for d in out if d.consumer_id == 2] == [(1, 1)]
