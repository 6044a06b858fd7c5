"""Tests for the bugs planted in the audit of 2026-11-28 against 2d54aad that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of subscriptions, retention and the metadata layer"): each
fails with its bug planted and passes without it."""

from __future__ import annotations

import asyncio

import pytest

from bookie.gc import LedgerCollector
from spark._topic_offsets import LedgerSlot, Snapshot, allot, resolve_start
from tests.unit.test_gc_batches import Info, Metadata
from tests.unit.test_subscription import FakeLog, run
from topic_broker.managed_ledger import ledgers_to_trim
from topic_broker.names import InvalidTopicName, TopicName
from topic_broker.subscription import Deliver, Subscription, SubType, unacked_set
from zk import MetadataFormatError
from zk.managed_ledgers import LedgerInfo, ManagedLedgerInfo

# ---- topic names (topic_broker/names.py) ----


@pytest.mark.parametrize(
    "name", ["../default/t", "public/../t", "./default/t", "public/./t", "persistent://../default/t"]
)
def test_a_tenant_or_namespace_named_dot_or_dot_dot_is_an_invalid_topic_name(name: str) -> None:
    """Pulsar's name rule lets dots through; ``.`` and ``..`` are refused as the name's own error, before they
    reach a ZooKeeper path."""
    with pytest.raises(InvalidTopicName):
        TopicName.parse(name)


@pytest.mark.parametrize("code", [*range(0x20), 0x7F])
def test_every_control_character_in_a_local_name_is_refused(code: int) -> None:
    with pytest.raises(InvalidTopicName, match="control character"):
        TopicName.parse(f"public/default/a{chr(code)}b")


# ---- retention (topic_broker/managed_ledger.py) ----


def test_a_retention_time_of_zero_lets_consumed_ledgers_go_at_once_whatever_the_size_limit() -> None:
    """Retention lets a consumed ledger go when it is older than the retention time or the rest is over the
    size: a time of 0 (a namespace's ``retention_time_minutes`` 0 with a size of its own) keeps nothing
    consumed, however far below the size the topic is."""
    ledgers = [LedgerInfo(ledger_id=i, entries=10, size=100, timestamp_ms=1_000 * i) for i in (1, 2, 3)]
    trim = ledgers_to_trim(
        [*ledgers, LedgerInfo(ledger_id=4)],
        current_ledger_id=4,
        current_size=50,
        slowest_mark_delete=None,
        retention_time_s=0,
        retention_size_bytes=1 << 30,
        now_ms=10_000,
    )
    assert trim == [1, 2, 3]


# ---- the managed ledger's ledger list (zk/managed_ledgers.py) ----


def test_a_ledger_list_naming_a_ledger_twice_is_refused() -> None:
    """A damaged or hand-edited ledger list that names a ledger twice (its entries would be read, delivered and
    counted twice) is refused as a format error, as one out of order is."""
    one = {"ledger_id": 7, "entries": 3, "size": 30, "timestamp_ms": 1}
    with pytest.raises(MetadataFormatError, match="strictly increasing"):
        ManagedLedgerInfo.from_json({"ledgers": [one, one, {"ledger_id": 9}]})
    assert len(ManagedLedgerInfo.from_json({"ledgers": [one, {"ledger_id": 9}]}).ledgers) == 2


# ---- the Spark topic source's offsets (spark/_topic_offsets.py) ----


def test_a_start_in_a_ledger_newer_than_every_listed_one_resolves_to_the_end_not_the_start() -> None:
    """A start whose ledger is not listed and is newer than every ledger that is (a snapshot older than the
    offset): the stream goes on from the end of what is listed, never from the earliest entry, which read
    everything again."""
    snap = Snapshot((LedgerSlot(3, 5, 50, True), LedgerSlot(5, 2, 20, True)))
    assert resolve_start(snap, (9, 0)) == (5, 2)
    assert resolve_start(snap, (4, 1)) == (5, 0)
    assert resolve_start(snap, (3, 2)) == (3, 2)


def test_a_budget_is_shared_with_each_partition_at_most_its_backlog_and_all_of_it_spent() -> None:
    """maxEntriesPerTrigger shared in proportion to the backlogs: the rounding remainder goes to the largest
    backlogs first, never past a partition's backlog, and the whole budget is spent."""
    backlogs = {"a": 2.0, "b": 1.0, "c": 1.0, "d": 1.0, "e": 1.0}
    share = allot(backlogs, 4.0)
    assert sum(share.values()) == 4.0
    assert all(share[k] <= backlogs[k] for k in backlogs), share
    assert share["a"] == 2.0


# ---- the bookie's GC (bookie/gc.py) ----


class _NoLedgers(Metadata):
    def __init__(self, parent: list[str] | None) -> None:
        super().__init__(set())
        self.parent = parent

    def ledgers_parent(self) -> list[str] | None:
        return self.parent


@pytest.mark.parametrize("parent", [[], None])
def test_gc_deletes_nothing_when_the_ledgers_node_is_empty_or_missing(parent: list[str] | None) -> None:
    """A bookie that stores ledgers while ZooKeeper's ledgers node is empty (a wrong ``--zk-root``, a ZooKeeper
    wiped or tampered with) refuses the pass: it deletes nothing and says why."""
    local = {lid: Info() for lid in (1, 2, 3)}
    deleted: list[int] = []
    c = LedgerCollector(_NoLedgers(parent), lambda: local, deleted.extend)
    result = asyncio.run(c.run_pass())
    assert deleted == [] and result.refused and c.stats.refused == 1
    assert ("no children" if parent == [] else "missing") in result.refused


# ---- the dispatcher (topic_broker/subscription.py) ----


def test_a_seek_back_delivers_a_partly_acked_batch_whole_again() -> None:
    """A seek moves the subscription (its cursor reset: no acks after the target): a batch whose messages 0 and 2
    were acked before comes back with all its messages, not with the ack set of those left then."""
    sub = Subscription(SubType.EXCLUSIVE, read_position=(1, 0))
    log = FakeLog(2, batch=5)
    sub.add_consumer(1, "a")
    run(sub, log, sub.flow(1, 100))
    assert sub.ack_individual([((1, 0), -1, list(unacked_set(5, 0b101)))]).batches == [((1, 0), 0b101)]
    again = [c for c in run(sub, log, sub.reset((1, 0)) + sub.flow(1, 100)) if isinstance(c, Deliver)]
    assert [(d.entry.position, d.ack_set) for d in again] == [((1, 0), None), ((1, 1), None)]
