"""The broker history checker (invariant 8) on planted histories: a clean history with repeats passes, and each
violation kind is caught; the last test checks every kind has a test here."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.faults.broker_checker import KINDS, Consume, MsgId, Produce, check

COVERED: set[str] = set()


def catches(*kinds: str) -> Any:
    COVERED.update(kinds)
    return lambda fn: fn


class H:
    """A synthetic history: producer p0 sends; sub ``s`` receives in the order of the calls."""

    def __init__(self) -> None:
        self.produces: list[Produce] = []
        self.consumes: list[Consume] = []
        self._seq = itertools.count()
        self._order = itertools.count()

    def send(
        self,
        value: str,
        key: str = "k",
        mid: MsgId | None = None,
        part: int = 0,
        error: str | None = None,
        producer: str = "p0",
    ) -> Produce:
        p = Produce(producer, next(self._seq), key, value, part, mid, error)
        self.produces.append(p)
        return p

    def recv(
        self,
        value: str,
        mid: MsgId,
        key: str = "k",
        part: int = 0,
        sub: str = "s",
        consumer: str = "c0",
        redelivery: int = 0,
    ) -> None:
        self.consumes.append(Consume(sub, consumer, part, mid, key, value, redelivery, next(self._order)))

    def check(self, subs: tuple[str, ...] = ("s",), **kw: Any) -> Any:
        return check(self.produces, self.consumes, subs, **kw)


def clean() -> H:
    """Two keys on two partitions, a rollover (ledger 5 → 9), a rewind after a reconnect (repeats), a failed
    send that was never stored, and a timed-out send that was stored anyway."""
    h = H()
    h.send("a0", "a", (5, 0, -1))
    h.send("b0", "b", (7, 0, -1), part=1)
    h.send("a1", "a", (5, 1, -1))
    h.send("a2", "a", (9, 0, -1))
    h.send("x", "a", None, error="timeout")
    h.send("a3", "a", None)  # never answered, yet stored
    for val, key, mid, part in [
        ("a0", "a", (5, 0, -1), 0),
        ("b0", "b", (7, 0, -1), 1),
        ("a1", "a", (5, 1, -1), 0),
    ]:
        h.recv(val, mid, key, part)
    # the consumer reconnects: everything after the mark-delete position comes again, then new messages
    h.recv("a1", (5, 1, -1), "a", redelivery=1)
    h.recv("a2", (9, 0, -1), "a")
    h.recv("a3", (9, 1, -1), "a")
    return h


def test_a_clean_history_with_repeats_passes_and_counts_them() -> None:
    r = clean().check()
    assert r.ok, r.report()
    assert r.stats["acked"] == 4
    assert r.stats["failed"] == 1 and r.stats["unanswered"] == 1
    assert r.stats["duplicates"] == {"s": 1}
    assert r.stats["first_deliveries"] == {"s": 5}
    assert r.stats["received_unacked"] == 1
    assert r.stats["max_redelivery_count"] == {"s": 1}


def test_batch_indexes_order_messages_within_an_entry() -> None:
    h = H()
    for i in range(3):
        h.send(f"m{i}", mid=(3, 0, i))
    for i in range(3):
        h.recv(f"m{i}", (3, 0, i))
    assert h.check().ok


@catches("lost")
def test_acked_message_never_received() -> None:
    h = clean()
    h.send("a4", "a", (9, 2, -1))
    r = h.check()
    assert r.kinds() == {"lost": 1}
    assert "'a4'" in r.violations[0].detail


@catches("lost")
def test_each_durable_subscription_must_receive_everything() -> None:
    h = clean()
    r = h.check(subs=("s", "other"))
    assert r.kinds() == {"lost": 4}
    assert all(v.detail.startswith("other:") for v in r.violations)


@catches("lost")
def test_received_only_at_another_id_than_acknowledged_is_lost() -> None:
    h = H()
    h.send("m", mid=(4, 0, -1))
    h.recv("m", (4, 1, -1))
    r = h.check()
    assert r.kinds() == {"lost": 1}
    assert "p0@4:1" in r.violations[0].detail


@catches("lost")
def test_a_resend_acknowledged_as_a_duplicate_must_be_received_somewhere() -> None:
    h = H()
    h.send("m0", mid=(4, 0, -1))
    h.send("m1", mid=(-1, -1, -1))  # dedup: stored by the broker that died before its receipt left
    h.send("m2", mid=(4, 2, -1))
    h.recv("m0", (4, 0, -1))
    h.recv("m1", (4, 1, -1))
    h.recv("m2", (4, 2, -1))
    r = h.check()
    assert r.ok, r.report()
    assert r.stats["acked_as_duplicate"] == 1
    h.consumes.pop(1)
    r = h.check()
    assert r.kinds() == {"lost": 1}
    assert "'m1'" in r.violations[0].detail


@catches("phantom")
def test_received_message_nobody_sent() -> None:
    h = clean()
    h.recv("ghost", (9, 5, -1), "a")
    assert h.check().kinds() == {"phantom": 1}


@catches("wrong_key")
def test_received_with_another_key() -> None:
    h = H()
    h.send("m", "k1", (4, 0, -1))
    h.recv("m", (4, 0, -1), key="k2")
    assert h.check().kinds() == {"wrong_key": 1}


@catches("conflict")
def test_two_values_at_one_message_id() -> None:
    h = H()
    h.send("m1", mid=(4, 0, -1))
    h.send("m2", mid=(4, 0, -1))  # a second owner acked on a ledger position already taken
    h.recv("m1", (4, 0, -1))
    r = h.check()
    assert r.kinds()["conflict"] == 1
    assert r.kinds()["lost"] == 1


@catches("conflict")
def test_received_value_differs_from_the_one_acked_there() -> None:
    h = H()
    h.send("m1", mid=(4, 0, -1))
    h.send("m2")
    h.recv("m2", (4, 0, -1))
    assert h.check().kinds() == {"conflict": 1, "lost": 1}


@catches("out_of_order")
def test_first_delivery_after_a_later_message_of_its_key() -> None:
    h = H()
    for i in range(3):
        h.send(f"m{i}", mid=(4, i, -1))
    h.recv("m0", (4, 0, -1))
    h.recv("m2", (4, 2, -1))
    h.recv("m1", (4, 1, -1))  # first seen after m2: reordered, not a repeat
    r = h.check()
    assert r.kinds() == {"out_of_order": 1}
    assert "'m1'" in r.violations[0].detail


@catches("out_of_order")
def test_order_is_across_the_consumers_of_a_subscription_and_across_ledgers() -> None:
    h = H()
    h.send("m0", mid=(4, 0, -1))
    h.send("m1", mid=(8, 0, -1))
    h.recv("m1", (8, 0, -1), consumer="c1")  # the failover consumer got the new ledger first
    h.recv("m0", (4, 0, -1), consumer="c0")
    assert h.check().kinds() == {"out_of_order": 1}


def test_other_keys_partitions_and_subscriptions_do_not_constrain_order() -> None:
    h = H()
    h.send("a", "k1", (4, 1, -1))
    h.send("b", "k2", (4, 0, -1))
    h.send("c", "k1", (2, 0, -1), part=1)
    h.recv("a", (4, 1, -1), "k1")
    h.recv("b", (4, 0, -1), "k2")
    h.recv("c", (2, 0, -1), "k1", part=1)
    for val, key, mid, part in [
        ("c", "k1", (2, 0, -1), 1),
        ("b", "k2", (4, 0, -1), 0),
        ("a", "k1", (4, 1, -1), 0),
    ]:
        h.recv(val, mid, key, part, sub="t")
    r = h.check(subs=("s", "t"))
    assert r.ok, r.report()


def test_a_rewind_may_repeat_in_any_order_what_was_delivered() -> None:
    h = H()
    for i in range(3):
        h.send(f"m{i}", mid=(4, i, -1))
    for i in (0, 1, 2, 1, 0, 2, 2):
        h.recv(f"m{i}", (4, i, -1), redelivery=1 if i < 2 else 0)
    r = h.check()
    assert r.ok, r.report()
    assert r.stats["duplicates"] == {"s": 4}


@catches("ack_order")
def test_a_producers_acks_out_of_its_send_order() -> None:
    h = H()
    h.send("m0", mid=(4, 1, -1))
    h.send("m1", mid=(4, 0, -1))
    h.recv("m1", (4, 0, -1))
    h.recv("m0", (4, 1, -1))
    assert h.check().kinds() == {"ack_order": 1}


@catches("dedup_failed")
def test_one_send_stored_twice_is_a_statistic_or_with_dedup_a_violation() -> None:
    h = H()
    h.send("m0", mid=(4, 1, -1))
    h.recv("m0", (4, 0, -1))  # the first attempt, stored before its broker died
    h.recv("m0", (4, 1, -1))  # the resend, acknowledged
    r = h.check()
    assert r.ok, r.report()
    assert r.stats["stored_twice"] == 1
    assert h.check(expect_dedup=True).kinds() == {"dedup_failed": 1}


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_a_test(kind: str) -> None:
    assert kind in COVERED
