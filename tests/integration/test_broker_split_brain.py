"""Split brain (invariant 9): the owner broker is cut from ZooKeeper (SIGSTOP longer than its session timeout)
while a producer keeps sending; the other broker takes the topic and fences the owner's last ledger; after
SIGCONT the old owner acknowledges nothing more, and the client moves to the new owner."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.broker_testing import start_broker
from tests.faults.broker_checker import Consume, Produce, check
from tests.faults.broker_workload import msg_id_of

pulsar = pytest.importorskip("pulsar")

SESSION_TIMEOUT_S = 4.0


def zk_read(bookies, fn: Any) -> Any:
    from zk import MetadataStore
    from zk.managed_ledgers import BrokerMetadataStore

    async def go() -> Any:
        store = MetadataStore.connect(bookies.zk, root=bookies.root)
        try:
            return await fn(BrokerMetadataStore(store))
        finally:
            store.close()

    return asyncio.run(go())


class Sender:
    """Sends ``m-<i>`` every ``gap_s`` (asynchronously) until stopped; records each answer and its time."""

    def __init__(self, producer: Any, gap_s: float = 0.02) -> None:
        self.producer = producer
        self.gap_s = gap_s
        self.lock = threading.Lock()
        self.sent: list[tuple[str, float]] = []
        self.answers: dict[str, tuple[Any, float, str | None]] = {}  # value -> (msg id, time, error)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            value = f"m-{i}"
            i += 1
            with self.lock:
                self.sent.append((value, time.monotonic()))
            self.producer.send_async(value.encode(), self._cb(value))
            time.sleep(self.gap_s)

    def _cb(self, value: str) -> Any:
        def cb(res: Any, mid: Any) -> None:
            now = time.monotonic()
            with self.lock:
                if res == pulsar.Result.Ok:
                    self.answers[value] = (msg_id_of(mid), now, None)
                else:
                    self.answers[value] = (None, now, str(res))

        return cb

    def acked(self) -> dict[str, tuple[tuple[int, int, int], float]]:
        with self.lock:
            return {v: (m, t) for v, (m, t, e) in self.answers.items() if m is not None}

    def pending(self) -> int:
        with self.lock:
            return len(self.sent) - len(self.answers)


@pytest.mark.timeout(150)
def test_owner_cut_from_zookeeper_is_fenced_and_acknowledges_nothing_more(bookies, tmp_path: Path) -> None:
    bookies.start_many(3)
    brokers = [
        start_broker(bookies, tmp_path, SESSION_TIMEOUT_S),
        start_broker(bookies, tmp_path, SESSION_TIMEOUT_S),
    ]
    for bp in brokers:
        bp.wait_ready(60)
    topic = f"split-{uuid.uuid4().hex[:8]}"
    ml_name = f"public/default/persistent/{topic}"
    url = "pulsar://" + ",".join(f"127.0.0.1:{bp.port}" for bp in brokers)
    producer_client = pulsar.Client(url, operation_timeout_seconds=30)
    consumer_client: Any = None
    b1 = brokers[0]
    try:
        producer = producer_client.create_producer(topic, send_timeout_millis=60_000, batching_enabled=False)
        owner = zk_read(bookies, lambda m: m.get_owner(ml_name))
        assert owner is not None
        # b1: the owner the lookup chose; b2: the other one
        b1, b2 = sorted(brokers, key=lambda bp: bp.id != owner.broker_id)
        assert b1.id == owner.broker_id
        consumer_client = pulsar.Client(b2.service_url, operation_timeout_seconds=30)
        sender = Sender(producer)
        sender.thread.start()
        time.sleep(2.0)
        before = sender.acked()
        assert before, "nothing acknowledged before the pause"
        old_ledgers = {m[0] for m, _ in before.values()}
        assert len(old_ledgers) == 1
        (l_old,) = old_ledgers

        # cut b1 from ZooKeeper: its session expires, its ownership znode goes away
        b1.pause()
        t_pause = time.monotonic()
        deadline = t_pause + SESSION_TIMEOUT_S + 15
        while zk_read(bookies, lambda m: m.get_owner(ml_name)) is not None:
            assert time.monotonic() < deadline, "b1's ownership outlived its session"
            time.sleep(0.2)
        # the other broker takes the topic: a consumer there opens its managed ledger (fencing b1's ledger)
        consumer = consumer_client.subscribe(
            topic,
            "s",
            consumer_type=pulsar.ConsumerType.Exclusive,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        t_taken = time.monotonic()
        owner = zk_read(bookies, lambda m: m.get_owner(ml_name))
        assert owner is not None and owner.broker_id == b2.id
        info = zk_read(bookies, lambda m: m.get_ml_info(ml_name)).value
        fenced_ledger = {li.ledger_id: li for li in info.ledgers}[l_old]
        assert fenced_ledger.entries > 0  # closed by b2's recovery, with what b1 had acknowledged
        acked_while_paused = {v for v, (_, t) in sender.acked().items() if t > t_pause + 0.5}
        assert not acked_while_paused, (
            f"acknowledged while the owner was stopped: {sorted(acked_while_paused)[:5]}"
        )
        assert sender.pending() > 0, "the producer should have sends waiting on the stopped owner"

        b1.resume()
        t_resume = time.monotonic()
        time.sleep(3.0)  # the producer keeps sending: its sends must land on b2 now
        deadline = time.monotonic() + 60
        while not any(t > t_resume and m[0] != l_old for m, t in sender.acked().values()):
            assert time.monotonic() < deadline, "the producer never moved to the new owner"
            time.sleep(0.2)
        time.sleep(1.0)
        sender.stop.set()
        sender.thread.join(5)
        deadline = time.monotonic() + 60
        while sender.pending() and time.monotonic() < deadline:
            time.sleep(0.1)
        acked = sender.acked()

        # the consumer on the new owner reads every acknowledged message, at its acknowledged id
        consumes: list[Consume] = []
        want = set(acked)
        read_deadline = time.monotonic() + 30
        while want - {c.value for c in consumes} and time.monotonic() < read_deadline:
            try:
                m = consumer.receive(timeout_millis=500)
            except pulsar.Timeout:
                continue
            consumes.append(
                Consume("s", "c", -1, msg_id_of(m.message_id()), "", m.data().decode(), 0, len(consumes))
            )
            consumer.acknowledge(m)
        produces = [
            Produce("p", int(v[2:]), "", v, -1, acked[v][0] if v in acked else None, None)
            for v, _ in sender.sent
        ]
        result = check(produces, consumes, ["s"])
        logs = f"--- b1\n{b1.log_tail(40)}\n--- b2\n{b2.log_tail(20)}"
        assert result.ok, f"{result.report()}\n{logs}"

        # nothing acknowledged in b1's ledger beyond what the new owner's fence closed it at
        in_old = sorted(m[1] for m, _ in acked.values() if m[0] == l_old)
        assert in_old and in_old[-1] < fenced_ledger.entries, (in_old[-5:], fenced_ledger)
        # after the takeover every acknowledgement is for the new owner's ledgers
        late = {v: m for v, (m, t) in acked.items() if t > t_taken and m[0] == l_old}
        assert all(m[1] < fenced_ledger.entries for m in late.values()), late
        # b1, resumed, may still pass on its bookies' acks of entries its ledger holds below the fence (they
        # are the new owner's too: the consumer above read them); everything else is the new owner's
        after = [m for m, t in acked.values() if t > t_resume]
        assert any(m[0] > l_old for m in after), after
        assert all(m[0] > l_old or m[1] < fenced_ledger.entries for m in after), after
        owner = zk_read(bookies, lambda m: m.get_owner(ml_name))
        assert owner is not None and owner.broker_id == b2.id, owner
        # b1 stopped serving the topic; whatever it tried to append after the takeover was refused as fenced
        log1 = b1.log_path.read_text(errors="replace") if b1.log_path else ""
        assert f"stops serving topic=persistent://public/default/{topic}" in log1, logs
        assert f"ml={ml_name} fenced" in log1 or "ZooKeeper session lost" in log1, logs
        assert b1.alive and b2.alive
    finally:
        if b1.alive:
            b1.resume()
        producer_client.close()
        if consumer_client is not None:
            consumer_client.close()
        for bp in brokers:
            try:
                bp.stop()
            except Exception:
                bp.kill9()
