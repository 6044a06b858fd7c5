"""The broker fault run's workload and nemesis.

:class:`TopicWorkload`: keyed producers (the official ``pulsar-client``, asynchronous sends) on a partitioned
topic and durable subscriptions whose consumers receive and acknowledge each message, recording a history for
``broker_checker.check``. Bounded: producers stop at a time limit or a message count, whichever comes first, and
the drain stops when every acknowledged message was received by every subscription or at its deadline.

:class:`BrokerNemesis`: a seeded schedule (drawn up front, printed on failure) of broker faults: kill -9 then a
restart on the same port and broker id, and SIGSTOP for longer than the ZooKeeper session timeout then SIGCONT.
At most one broker is faulty at a time, so the other always serves.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulsar

from ledgerstore.cluster import BrokerProcess
from tests.faults.broker_checker import Consume, MsgId, Produce


def partition_of(topic_name: str, fallback: int) -> int:
    head, sep, tail = topic_name.rpartition("-partition-")
    return int(tail) if sep and tail.isdigit() else fallback


def msg_id_of(mid: Any) -> MsgId:
    return (int(mid.ledger_id()), int(mid.entry_id()), int(mid.batch_index()))


@dataclass
class TopicWorkload:
    service_url: str  # e.g. "pulsar://127.0.0.1:p1,127.0.0.1:p2": lookups go to any live broker
    topic: str
    subscriptions: Sequence[tuple[str, pulsar.ConsumerType, int]]  # (name, type, consumers)
    rng: random.Random
    keys: int = 8
    producers: int = 2
    max_messages: int = 6000
    rate_per_s: float = 150.0
    send_timeout_ms: int = 30_000
    produces: list[Produce] = field(default_factory=list)
    consumes: list[Consume] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _order: itertools.count[int] = field(default_factory=itertools.count)
    _stop_producing: threading.Event = field(default_factory=threading.Event)
    _stop_consuming: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _producer_threads: list[threading.Thread] = field(default_factory=list)
    _clients: list[pulsar.Client] = field(default_factory=list)
    _pending: dict[str, Produce] = field(default_factory=dict)
    _sent: int = 0

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self, produce_for_s: float) -> None:
        """Subscribe first (so every message is for the subscriptions), then produce for ``produce_for_s``."""
        cc = self._client()
        for sub, kind, n in self.subscriptions:
            for i in range(n):
                consumer = cc.subscribe(
                    self.topic,
                    sub,
                    consumer_type=kind,
                    consumer_name=f"{sub}-c{i}",
                    initial_position=pulsar.InitialPosition.Earliest,
                    receiver_queue_size=200,
                )
                self._spawn(self._consume, consumer, sub, f"{sub}-c{i}")
        until = time.monotonic() + produce_for_s
        for i in range(self.producers):
            pc = self._client()
            producer = pc.create_producer(
                self.topic,
                producer_name=f"w{i}-{self.rng.randrange(1 << 30):x}",
                send_timeout_millis=self.send_timeout_ms,
                batching_enabled=self.rng.random() < 0.5,
                batching_max_publish_delay_ms=5,
                max_pending_messages=500,
                block_if_queue_full=True,
            )
            self._producer_threads.append(
                self._spawn(
                    self._produce, producer, f"w{i}", until, random.Random(self.rng.randrange(1 << 32))
                )
            )

    def _client(self) -> pulsar.Client:
        c = pulsar.Client(self.service_url, operation_timeout_seconds=20, io_threads=1)
        self._clients.append(c)
        return c

    def _spawn(self, fn: Any, *args: Any) -> threading.Thread:
        t = threading.Thread(target=fn, args=args, daemon=True)
        self._threads.append(t)
        t.start()
        return t

    def wait_produced(self, timeout_s: float) -> None:
        """Producers stop by themselves; wait for them and for every answer (ack, error or send timeout)."""
        deadline = time.monotonic() + timeout_s
        for t in self._producer_threads:
            t.join(max(0.0, deadline - time.monotonic()))
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending:
                    return
            time.sleep(0.1)

    def drain(self, timeout_s: float) -> bool:
        """Consume until every subscription received every acknowledged message (True), or the deadline."""
        deadline = time.monotonic() + timeout_s
        subs = [s for s, _, _ in self.subscriptions]
        while time.monotonic() < deadline:
            with self._lock:
                acked = {p.value for p in self.produces if p.msg_id is not None}
                got: dict[str, set[str]] = {s: set() for s in subs}
                for c in self.consumes:
                    got[c.subscription].add(c.value)
            if all(acked <= got[s] for s in subs):
                time.sleep(0.5)  # let the last acks go out
                return True
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        self._stop_producing.set()
        self._stop_consuming.set()
        for t in self._threads:
            t.join(5)
        for c in self._clients:
            with contextlib.suppress(Exception):
                c.close()

    def history(self) -> tuple[list[Produce], list[Consume]]:
        with self._lock:
            return [*self.produces, *self._pending.values()], list(self.consumes)

    # -- producers and consumers ---------------------------------------------------------------------------------
    def _produce(self, producer: Any, name: str, until: float, rng: random.Random) -> None:
        seq = itertools.count()
        try:
            while time.monotonic() < until and not self._stop_producing.is_set():
                with self._lock:
                    if self._sent >= self.max_messages:
                        break
                    self._sent += 1
                i = next(seq)
                key = f"k{rng.randrange(self.keys)}"
                value = f"{name}-{i}"
                with self._lock:
                    self._pending[value] = Produce(name, i, key, value)
                try:
                    producer.send_async(value.encode(), self._callback(value), partition_key=key)
                except Exception as e:  # a full queue or a closed producer: answered now
                    self._answer(value, None, None, f"{type(e).__name__}: {e}")
                time.sleep(rng.expovariate(self.rate_per_s / max(1, self.producers)))
        except Exception as e:
            self.errors.append(f"{name}: {type(e).__name__}: {e}")

    def _callback(self, value: str) -> Any:
        def cb(res: Any, mid: Any) -> None:
            if res == pulsar.Result.Ok:
                self._answer(value, int(mid.partition()), msg_id_of(mid), None)
            else:
                self._answer(value, None, None, str(res))

        return cb

    def _answer(self, value: str, part: int | None, mid: MsgId | None, error: str | None) -> None:
        with self._lock:
            p = self._pending.pop(value, None)
            if p is None:
                return
            self.produces.append(Produce(p.producer, p.seq, p.key, p.value, part, mid, error))

    def _consume(self, consumer: Any, sub: str, name: str) -> None:
        while not self._stop_consuming.is_set():
            try:
                m = consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            except Exception as e:
                self.errors.append(f"{name} receive: {type(e).__name__}: {e}")
                time.sleep(0.2)
                continue
            mid = m.message_id()
            rec = Consume(
                sub,
                name,
                partition_of(m.topic_name(), int(mid.partition())),
                msg_id_of(mid),
                m.partition_key(),
                m.data().decode(errors="replace"),
                int(m.redelivery_count()),
            )
            with self._lock:
                self.consumes.append(
                    Consume(
                        rec.subscription,
                        rec.consumer,
                        rec.partition,
                        rec.msg_id,
                        rec.key,
                        rec.value,
                        rec.redelivery_count,
                        next(self._order),
                    )
                )
            with contextlib.suppress(Exception):
                consumer.acknowledge(m)


# -- the nemesis --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    at_s: float  # after the start of the fault phase
    kind: str  # "kill9" | "pause"
    target: int  # broker index
    duration_s: float

    def __str__(self) -> str:
        return f"t+{self.at_s:.1f}s {self.kind} broker#{self.target} for {self.duration_s:.1f}s"


def draw_schedule(rng: random.Random, span_s: float, n_brokers: int, session_timeout_s: float) -> list[Fault]:
    """Faults one after the other (never two brokers at once) within ``span_s``; at least one kill -9 and one
    pause longer than the session timeout, in a seeded order."""
    kinds = ["kill9", "pause"]
    rng.shuffle(kinds)
    out: list[Fault] = []
    t = rng.uniform(2.0, 4.0)
    while True:
        kind = kinds[len(out)] if len(out) < len(kinds) else rng.choice(("kill9", "pause"))
        dur = rng.uniform(0.5, 3.0) if kind == "kill9" else session_timeout_s + rng.uniform(1.5, 3.0)
        if t + dur > span_s and len(out) >= len(kinds):
            break
        out.append(Fault(round(t, 2), kind, rng.randrange(n_brokers), round(dur, 2)))
        # after a fault, give the survivor time to take the topics and the clients time to move
        t += dur + session_timeout_s + rng.uniform(3.0, 6.0)
    return out


@dataclass
class BrokerNemesis:
    brokers: list[BrokerProcess]
    schedule: list[Fault]
    log: list[str] = field(default_factory=list)

    def run(self, t0: float, stop: threading.Event | None = None) -> None:
        for f in self.schedule:
            if not self._sleep_until(t0 + f.at_s, stop):
                return
            bp = self.brokers[f.target]
            self.log.append(f"{time.monotonic() - t0:6.1f}s {f.kind} {bp.id}")
            if f.kind == "kill9":
                bp.kill9()
                self._sleep_until(time.monotonic() + f.duration_s, stop)
                bp.start(wait=True, timeout_s=30)
            else:
                bp.pause()
                self._sleep_until(time.monotonic() + f.duration_s, stop)
                bp.resume()
            self.log.append(f"{time.monotonic() - t0:6.1f}s healed {bp.id}")

    @staticmethod
    def _sleep_until(t: float, stop: threading.Event | None) -> bool:
        while time.monotonic() < t:
            if stop is not None and stop.is_set():
                return False
            time.sleep(0.05)
        return True

    def heal_all(self) -> None:
        for bp in self.brokers:
            if bp.alive:
                bp.resume()
            else:
                bp.start(wait=True, timeout_s=30)
