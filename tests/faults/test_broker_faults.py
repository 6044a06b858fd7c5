"""The broker fault run (invariant 8): real ZooKeeper, 3 bookie processes, 2 broker processes; keyed producers
(the official ``pulsar-client``) on a 3-partition topic, a Failover subscription (2 consumers) and an Exclusive
one consuming and acknowledging; a seeded nemesis kill -9s brokers (restarting them on the same port and id) and
SIGSTOPs one for longer than its ZooKeeper session timeout, then SIGCONTs it. Then heal, drain and check the
history with ``broker_checker.check``: every acknowledged message received by both subscriptions at its
acknowledged id, first deliveries in id order per key and partition, nothing received that was never sent.

Bounded: ``LEDGERSTORE_BROKER_NEMESIS_S`` seconds of produce + faults (default 35), the drain ≤ 30 s; ≈ 60–80 s on
2 cores. Reproduce a schedule with ``LEDGERSTORE_BROKER_NEMESIS_SEED=<seed>`` (printed at the start and on
failure; the schedule and the workload's keys follow the seed, thread and network timing do not).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.broker_testing import start_broker
from tests.faults.broker_checker import check
from tests.faults.broker_workload import BrokerNemesis, TopicWorkload, draw_schedule

pulsar = pytest.importorskip("pulsar")

SESSION_TIMEOUT_S = 4.0
PARTITIONS = 3


def create_partitioned(bookies, topic: str, n: int) -> None:
    from topic_broker.names import TopicName
    from zk import MetadataStore
    from zk.managed_ledgers import BrokerMetadataStore

    async def create() -> None:
        store = MetadataStore.connect(bookies.zk, root=bookies.root)
        try:
            await BrokerMetadataStore(store).create_partitioned_topic(TopicName.parse(topic).ml_name, n)
        finally:
            store.close()

    asyncio.run(create())


@pytest.mark.timeout(170)
def test_broker_faults(bookies, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seed = int(os.environ.get("LEDGERSTORE_BROKER_NEMESIS_SEED") or random.SystemRandom().randrange(1 << 32))
    span_s = float(os.environ.get("LEDGERSTORE_BROKER_NEMESIS_S", "35"))
    rng = random.Random(seed)
    schedule = draw_schedule(random.Random(rng.randrange(1 << 32)), span_s, 2, SESSION_TIMEOUT_S)
    with capsys.disabled():
        print(f"\nbroker nemesis seed={seed}: " + "; ".join(map(str, schedule)))
    t_begin = time.monotonic()
    bookies.start_many(3)
    brokers = [start_broker(bookies, tmp_path, SESSION_TIMEOUT_S) for _ in range(2)]
    for bp in brokers:
        bp.wait_ready(60)
    topic = f"faults-{uuid.uuid4().hex[:8]}"
    create_partitioned(bookies, topic, PARTITIONS)
    url = "pulsar://" + ",".join(f"127.0.0.1:{bp.port}" for bp in brokers)
    subs = [("fo", pulsar.ConsumerType.Failover, 2), ("ex", pulsar.ConsumerType.Exclusive, 1)]
    wl = TopicWorkload(url, topic, subs, random.Random(rng.randrange(1 << 32)))
    nemesis = BrokerNemesis(brokers, schedule)
    stop = threading.Event()
    timing: dict[str, float] = {}
    try:
        wl.start(produce_for_s=span_s)
        t0 = time.monotonic()
        timing["setup"] = t0 - t_begin
        nem = threading.Thread(target=nemesis.run, args=(t0, stop), daemon=True)
        nem.start()
        nem.join(span_s + 40)
        stop.set()
        nem.join(35)
        nemesis.heal_all()
        timing["faults"] = time.monotonic() - t0
        wl.wait_produced(timeout_s=max(5.0, t0 + span_s + 35 - time.monotonic()))
        t1 = time.monotonic()
        drained = wl.drain(timeout_s=30)
        timing["drain"] = time.monotonic() - t1
        produces, consumes = wl.history()
        result = check(produces, consumes, [s for s, _, _ in subs])
        timing["total"] = time.monotonic() - t_begin
        (tmp_path / "history.jsonl").write_text(
            "".join(json.dumps(r.to_json()) + "\n" for r in produces)
            + "".join(json.dumps(r.to_json()) + "\n" for r in consumes)
        )
        summary = (
            f"broker nemesis seed={seed} ({', '.join(f'{k} {v:.1f}s' for k, v in timing.items())})\n"
            f"  schedule: {'; '.join(map(str, schedule))}\n"
            f"  nemesis:  {' | '.join(nemesis.log)}\n"
            f"  {result.report()}"
        )
        with capsys.disabled():
            print(summary)
        if not result.ok or not drained:
            logs = "\n".join(f"--- {bp.id}\n{bp.log_tail(25)}" for bp in brokers)
            pytest.fail(
                f"{'not drained in 30s; ' if not drained else ''}history in {tmp_path / 'history.jsonl'}\n"
                f"{summary}\nworkload errors: {wl.errors[:5]}\n{logs}"
            )
        assert result.stats["acked"] >= 300, summary
        assert any("kill9" in x for x in nemesis.log) and any("pause" in x for x in nemesis.log), summary
    finally:
        stop.set()
        wl.stop()
        for bp in brokers:
            if bp.alive:
                bp.resume()
            try:
                bp.stop()
            except Exception:
                bp.kill9()
