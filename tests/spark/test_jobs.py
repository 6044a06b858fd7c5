"""The analysis jobs over a live cluster, in the session's local[2] Spark."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ledger_client import ClientConfig
from ledger_client.sync import BookKeeper
from spark.jobs import JOBS, JobOptions

PW = "pw"


def _write(bk: BookKeeper) -> tuple[int, int]:
    small = bk.create_ledger(3, 2, 2, password=PW.encode())
    small.append_many([b"s" * 100] * 300)
    small.close()
    mixed = bk.create_ledger(3, 3, 2, password=PW.encode())
    mixed.append_many([b"m" * (10 if i % 10 else 5000) for i in range(200)])  # one in ten is big
    # the second stays open: wait until the bookies know its LAC (the writer sends it within 0.5 s)
    reader = bk.open_ledger(mixed.ledger_id, PW.encode(), recovery=False)
    deadline = time.monotonic() + 10
    while reader.read_last_add_confirmed() < 199 and time.monotonic() < deadline:
        time.sleep(0.1)
    return small.ledger_id, mixed.ledger_id


def test_ledger_health_and_entry_sizes_jobs_report_and_chart(
    bookies: Any, spark: Any, tmp_path: Path
) -> None:
    procs = bookies.start_many(3)
    writer = BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    small, mixed = _write(writer)
    opts = JobOptions(zk=bookies.zk, zk_root=bookies.root, password=PW, out_dir=tmp_path)

    health = JOBS["ledger-health"].run(spark, opts)
    ledgers = {r["ledger"]: r for r in health.tables[0].as_dicts()}
    assert ledgers[small]["entries"] == 300 and ledgers[small]["bytes"] == 300 * 100
    assert ledgers[small]["state"] == "CLOSED" and ledgers[small]["ensemble changes"] == 0
    assert ledgers[mixed]["state"] == "OPEN" and ledgers[mixed]["entries"] == 200
    per_bookie = {r["bookie"]: r for r in health.tables[1].as_dicts()}
    assert set(per_bookie) == {bp.id for bp in procs}
    # 300 entries x Qw 2 + (>=199) entries x Qw 3, evenly spread over three bookies
    assert sum(r["replicas"] for r in per_bookie.values()) == 600 + 3 * ledgers[mixed]["entries"]
    assert all(r["status"] == "writable" for r in per_bookie.values())
    assert health.chart == tmp_path / "ledger-health.png" and health.chart.stat().st_size > 1000
    assert "Entry replicas per bookie" in health.render()

    sizes = JOBS["entry-sizes"].run(spark, opts)
    rows = {r["ledger"]: r for r in sizes.tables[0].as_dicts()}
    assert (rows[small]["p50"], rows[small]["p99"], rows[small]["max"]) == (100, 100, 100)
    assert rows[mixed]["p50"] == 10 and rows[mixed]["p99"] == 5000 and rows[mixed]["min"] == 10
    assert rows["all"]["entries"] == 300 + rows[mixed]["entries"]
    dist = {r[0]: r[1] for r in sizes.tables[1].rows}
    assert dist["64-127"] == 300 and dist["4096-8191"] == 20
    assert sizes.chart is not None and sizes.chart.stat().st_size > 1000
    writer.close()


def _produce(pulsar: Any, service_url: str, topic: str, messages: list[tuple[bytes, str, int]]) -> None:
    """Send (value, key, event time ms) messages with the pulsar-client, batching on, and wait for every ack."""
    c = pulsar.Client(service_url, operation_timeout_seconds=15)
    try:
        p = c.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=10)
        for value, key, event in messages:
            p.send_async(value, None, partition_key=key, event_timestamp=event)
        p.flush()
        p.close()
    finally:
        c.close()


def test_topic_volume_job_over_messages_produced_through_a_broker(
    bookies: Any, spark: Any, tmp_path: Path
) -> None:
    pulsar = pytest.importorskip("pulsar")
    from ledgerstore.cluster import BrokerProcess, free_port
    from spark.jobs import demo_summary

    bookies.start_many(3)
    bp = BrokerProcess(
        zk=bookies.zk,
        zk_root=bookies.root,
        port=free_port(),
        http_port=free_port(),
        log_path=tmp_path / "broker.log",
    )
    bp.start()
    lag_ms = 5_000
    try:
        now = int(time.time() * 1000)
        # orders: 400 messages of 100 B, half of them with key "hot", the rest over 4 keys; events 5 s old
        orders = [
            (b"o" * 100, "hot" if i % 2 == 0 else f"k{i % 4 // 2 + 2 * (i % 8 // 4)}", now - lag_ms)
            for i in range(400)
        ]
        # clicks: 200 messages, one in ten 1,000 B, the rest 10 B; one key
        clicks = [(b"c" * (1000 if i % 10 == 0 else 10), "user", now - lag_ms) for i in range(200)]
        _produce(pulsar, bp.service_url, "persistent://public/default/orders", orders)
        _produce(pulsar, bp.service_url, "persistent://public/default/clicks", clicks)
    finally:
        bp.stop()  # closes the topics' ledgers: every message is readable
    done = time.time() * 1000

    opts = JobOptions(zk=bookies.zk, zk_root=bookies.root, out_dir=tmp_path / "out")
    result = JOBS["topic-volume"].run(spark, opts)
    topics = {r["topic"]: r for r in result.tables[0].as_dicts()}
    assert set(topics) == {"persistent://public/default/orders", "persistent://public/default/clicks"}
    o, c = topics["persistent://public/default/orders"], topics["persistent://public/default/clicks"]
    assert (o["messages"], o["bytes"], o["size p50"], o["size p99"]) == (400, 40_000, 100, 100)
    assert (c["messages"], c["bytes"], c["size p50"], c["size p99"]) == (200, 20 * 1000 + 180 * 10, 10, 1000)
    assert o["with event time"] == 400 and o["keys"] == 5 and c["keys"] == 1
    # publish time is stamped when sent: the lag is the 5 s the events were backdated, plus the sending
    for t in (o, c):
        assert lag_ms <= t["lag p50"] <= t["lag max"] <= lag_ms + (done - now)
    minutes = result.tables[1].as_dicts()
    assert sum(r["messages"] for r in minutes if r["topic"] == o["topic"]) == 400
    assert {r["topic"] for r in minutes} == set(topics) and all(len(r["minute"]) == 16 for r in minutes)
    keys = [r for r in result.tables[2].as_dicts() if r["topic"] == o["topic"]]
    assert keys[0]["key"] == "hot" and keys[0]["messages"] == 200 and keys[0]["share %"] == 50.0
    assert len(keys) == 5 and sum(k["messages"] for k in keys) == 400
    assert result.chart == tmp_path / "out" / "topic-volume.png" and result.chart.stat().st_size > 1000

    # one topic by name, through what the demo calls (it runs in the session already active here)
    text = demo_summary(bookies.zk, bookies.root, tmp_path / "demo", topics=["clicks"])
    assert "persistent://public/default/clicks" in text and "orders" not in text
    assert "Top keys" in text and (tmp_path / "demo" / "topic-volume.txt").read_text().strip() == text
    assert (tmp_path / "demo" / "topic-volume.png").exists()
    # and by pattern
    only = JOBS["topic-volume"].run(spark, replace(opts, topics_pattern="ord.*"))
    assert [r[0] for r in only.tables[0].rows] == ["persistent://public/default/orders"]
