"""The history checker of the broker's fault run (docs/architecture.md §10, invariant 8): a pure function of what
the producers were told and what the consumers received.

Inputs
------
* :class:`Produce`: one send attempt: its unique ``value``, ``key``, the ``producer`` and that producer's send
  order ``seq``, and the outcome: the acknowledged message id ``msg_id`` (with its ``partition``) or an ``error``
  (neither: no answer before the end, e.g. a send timeout that never fired).
* :class:`Consume`: one message handed to the application: ``subscription``, ``consumer``, ``partition``,
  ``msg_id``, ``key``, ``value``, ``redelivery_count``, and ``order``, a sequence number over every receive of the
  run (the receive order; one process records them, so it is total).

A message id is ``(ledger id, entry id, batch index)`` (batch index −1 for a message outside a batch); ids of
one partition are totally ordered by that tuple (Pulsar's order: ledgers of a managed ledger are created in
increasing id order).

Violation kinds (``check``)
--------------------------
* ``lost``         an acknowledged produce was never received, at its acknowledged id, by a durable subscription
                   in ``subscriptions`` (at-least-once per subscription). A send acknowledged with id ``-1:-1``
                   (Pulsar's answer to a resend its dedup found stored already) must be received at some id.
* ``phantom``      a received value no producer ever sent (acknowledged or not)
* ``wrong_key``    a received value arrived with another key than it was sent with
* ``conflict``     two different values were received (or acknowledged) at one (partition, message id)
* ``out_of_order`` per (subscription, partition, key), the *first* delivery of each message must come in
                   message id order: a message first delivered after a later message of its key was delivered is
                   a reorder. A *repeat* (a message delivered again, whatever its redelivery count: after a
                   consumer reconnect, a failover, a broker restart, a negative ack) may go back, but only to
                   something already delivered; it never counts as a first delivery. This is what Pulsar gives an
                   Exclusive or Failover subscription (a rewind to the mark-delete position redelivers in order,
                   possibly repeating).
* ``ack_order``    one producer's acknowledged sends of one key on one partition got message ids out of its send
                   order (a producer's messages are stored in the order it sent them)
* ``dedup_failed`` (only with ``expect_dedup``) one sent value stored at two message ids

Statistics (``stats``): acknowledged, failed and unanswered produces; receives, first deliveries, repeats
(duplicates) and the largest redelivery count per subscription; values stored twice; values received that were
never acknowledged (their send timed out or failed, yet they were stored: allowed, at-least-once).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("lost", "phantom", "wrong_key", "conflict", "out_of_order", "ack_order", "dedup_failed")

MsgId = tuple[int, int, int]  # (ledger id, entry id, batch index)


@dataclass(frozen=True, slots=True)
class Produce:
    producer: str
    seq: int
    key: str
    value: str
    partition: int | None = None
    msg_id: MsgId | None = None
    error: str | None = None

    @property
    def acked(self) -> bool:
        return self.msg_id is not None

    @property
    def acked_as_duplicate(self) -> bool:
        """Acknowledged with id -1:-1: the broker's dedup found it stored already (a resend), as Pulsar does."""
        return self.msg_id is not None and self.msg_id[0] < 0

    def to_json(self) -> dict[str, Any]:
        return {
            "op": "produce",
            "producer": self.producer,
            "seq": self.seq,
            "key": self.key,
            "value": self.value,
            "partition": self.partition,
            "msg_id": list(self.msg_id) if self.msg_id is not None else None,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class Consume:
    subscription: str
    consumer: str
    partition: int
    msg_id: MsgId
    key: str
    value: str
    redelivery_count: int = 0
    order: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "op": "consume",
            "subscription": self.subscription,
            "consumer": self.consumer,
            "partition": self.partition,
            "msg_id": list(self.msg_id),
            "key": self.key,
            "value": self.value,
            "redelivery_count": self.redelivery_count,
            "order": self.order,
        }


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass
class Result:
    violations: list[Violation] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def kinds(self) -> Counter[str]:
        return Counter(v.kind for v in self.violations)

    def report(self, limit: int = 3) -> str:
        lines = [f"stats: {self.stats}"]
        by_kind: dict[str, list[Violation]] = defaultdict(list)
        for v in self.violations:
            by_kind[v.kind].append(v)
        for kind, vs in by_kind.items():
            lines.append(f"{len(vs)} x {kind}")
            lines += [f"    {v.detail}" for v in vs[:limit]]
        return "\n".join(lines)


def _fmt(m: MsgId) -> str:
    return f"{m[0]}:{m[1]}" + (f":{m[2]}" if m[2] >= 0 else "")


def check(
    produces: Iterable[Produce],
    consumes: Iterable[Consume],
    subscriptions: Sequence[str],
    *,
    expect_dedup: bool = False,
) -> Result:
    """Every violation of invariant 8 in one run's history (module docstring), and statistics."""
    res = Result()
    out = res.violations

    def v(kind: str, detail: str) -> None:
        out.append(Violation(kind, detail))

    prods = list(produces)
    cons = sorted(consumes, key=lambda c: c.order)
    by_value: dict[str, Produce] = {}
    for p in prods:
        by_value[p.value] = p

    # -- what sits where: one value per (partition, id) -----------------------------------------------------
    at: dict[tuple[int, MsgId], str] = {}

    def place(part: int, mid: MsgId, value: str, who: str) -> None:
        prev = at.setdefault((part, mid), value)
        if prev != value:
            v("conflict", f"partition {part} id {_fmt(mid)} holds {prev!r} and {value!r} ({who})")

    for p in prods:
        if p.msg_id is not None and not p.acked_as_duplicate:
            place(p.partition if p.partition is not None else -1, p.msg_id, p.value, f"ack to {p.producer}")
    stored_at: dict[str, set[tuple[int, MsgId]]] = defaultdict(set)
    for c in cons:
        place(c.partition, c.msg_id, c.value, f"received by {c.subscription}/{c.consumer}")
        stored_at[c.value].add((c.partition, c.msg_id))
        sent = by_value.get(c.value)
        if sent is None:
            v(
                "phantom",
                f"{c.subscription}/{c.consumer} received {c.value!r} at {_fmt(c.msg_id)}: never sent",
            )
        elif sent.key != c.key:
            v("wrong_key", f"{c.value!r} sent with key {sent.key!r}, received with key {c.key!r}")

    # -- at least once per durable subscription, at the acknowledged id -----------------------------------
    received: dict[str, dict[str, set[tuple[int, MsgId]]]] = defaultdict(lambda: defaultdict(set))
    for c in cons:
        received[c.subscription][c.value].add((c.partition, c.msg_id))
    for sub in subscriptions:
        got = received.get(sub, {})
        for p in prods:
            if p.msg_id is None:
                continue
            where = got.get(p.value, set())
            want = (p.partition if p.partition is not None else -1, p.msg_id)
            if (want not in where) if not p.acked_as_duplicate else not where:
                seen = ", ".join(f"p{a}@{_fmt(b)}" for a, b in sorted(where)) or "never"
                v(
                    "lost",
                    f"{sub}: {p.value!r} (key {p.key!r}) acked at partition {want[0]} id {_fmt(p.msg_id)}; "
                    f"received: {seen}",
                )

    # -- a producer's acks follow its send order (per key and partition) ----------------------------------
    last_ack: dict[tuple[str, int, str], Produce] = {}
    firm = (p for p in prods if p.msg_id is not None and not p.acked_as_duplicate)
    for p in sorted(firm, key=lambda p: (p.producer, p.seq)):
        assert p.msg_id is not None
        k = (p.producer, p.partition if p.partition is not None else -1, p.key)
        prev = last_ack.get(k)
        if prev is not None and prev.msg_id is not None and p.msg_id <= prev.msg_id:
            v(
                "ack_order",
                f"{p.producer} sent {prev.value!r} (seq {prev.seq}) before {p.value!r} (seq {p.seq}) "
                f"but they were acked at {_fmt(prev.msg_id)} and {_fmt(p.msg_id)}",
            )
        last_ack[k] = p

    # -- first deliveries in id order per (subscription, partition, key) ----------------------------------
    delivered: dict[tuple[str, int, str], set[MsgId]] = defaultdict(set)
    highest: dict[tuple[str, int, str], Consume] = {}
    firsts: Counter[str] = Counter()
    repeats: Counter[str] = Counter()
    max_redelivery: dict[str, int] = defaultdict(int)
    for c in cons:
        k = (c.subscription, c.partition, c.key)
        max_redelivery[c.subscription] = max(max_redelivery[c.subscription], c.redelivery_count)
        if c.msg_id in delivered[k]:
            repeats[c.subscription] += 1
            continue
        delivered[k].add(c.msg_id)
        firsts[c.subscription] += 1
        hi = highest.get(k)
        if hi is not None and c.msg_id < hi.msg_id:
            v(
                "out_of_order",
                f"{c.subscription} partition {c.partition} key {c.key!r}: {c.value!r} at {_fmt(c.msg_id)} "
                f"first delivered (to {c.consumer}, receive #{c.order}) after {hi.value!r} at "
                f"{_fmt(hi.msg_id)} (to {hi.consumer}, receive #{hi.order})",
            )
        else:
            highest[k] = c

    # -- statistics ------------------------------------------------------------------------------------------
    twice = {val: sorted(w) for val, w in stored_at.items() if len(w) > 1}
    if expect_dedup:
        for val, w in sorted(twice.items()):
            v("dedup_failed", f"{val!r} stored at " + ", ".join(f"p{a}@{_fmt(b)}" for a, b in w))
    acked_values = {p.value for p in prods if p.msg_id is not None}
    res.stats = {
        "produced": len(prods),
        "acked": len(acked_values),
        "acked_as_duplicate": sum(1 for p in prods if p.acked_as_duplicate),
        "failed": sum(1 for p in prods if p.msg_id is None and p.error is not None),
        "unanswered": sum(1 for p in prods if p.msg_id is None and p.error is None),
        "received": dict(Counter(c.subscription for c in cons)),
        "first_deliveries": dict(firsts),
        "duplicates": dict(repeats),
        "max_redelivery_count": dict(max_redelivery),
        "stored_twice": len(twice),
        "received_unacked": len({c.value for c in cons if c.value in by_value} - acked_values),
    }
    return res
