"""A ``topic`` stream as a user runs one through faults: a ProcessingTime query writing with foreachBatch (one
directory per batch id, overwritten when Spark runs a batch again) over a partitioned topic the official
``pulsar-client`` writes through two brokers that roll their ledgers every 10 entries, while a bookie of the
current ledger is killed with SIGKILL (and restarted) and the broker owning a partition is killed too (the other
takes the topic over); the query is stopped and restarted from its checkpoint with ``maxEntriesPerTrigger``.
The sink holds every acknowledged message exactly once, by the message's own id. And, made deterministic, the
bug that scenario found: a stream stopped at entry 0 of the empty ledger a killed broker had just rolled to."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ledger_client import ClientConfig
from ledger_client.sync import BookKeeper
from tests.broker_testing import Brokers
from tests.spark.test_user_scenarios import Cluster

pulsar = pytest.importorskip("pulsar")

TOPIC = "faults"


def _stream(spark: Any, bookies: Any, **options: str) -> Any:
    """The topic from its earliest entry as a stream."""
    reader = spark.readStream.format("topic").option("zk", bookies.zk).option("zkRoot", bookies.root)
    return reader.option("topic", TOPIC).option("startingOffsets", "earliest").options(**options).load()


def _wait(check: Callable[[], bool], what: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_a_stream_through_bookie_and_broker_kills_and_a_restart_holds_each_message_once(
    bookies: Any, spark: Any, tmp_path: Path
) -> None:
    bks = bookies.start_many(4)
    brokers = Brokers(bookies, tmp_path)
    args = ("--max-entries-per-ledger", "10", "--min-rollover-time-s", "0", "--tick-interval-s", "1")
    b1, b2 = brokers.start(*args), brokers.start(*args)
    ns = "/admin/v2/namespaces/public/default"
    admin = Cluster(bookies, b1).admin
    admin("POST", f"{ns}/retention", {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
    admin("PUT", f"/admin/v2/persistent/public/default/{TOPIC}/partitions", 2)
    client = pulsar.Client(
        f"pulsar://127.0.0.1:{b1.port},127.0.0.1:{b2.port}",
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    sink = tmp_path / "sink"
    acked: list[int] = []
    queries: list[Any] = []
    try:
        producer = client.create_producer(
            f"persistent://public/default/{TOPIC}", batching_max_publish_delay_ms=5, send_timeout_millis=0
        )

        def produce(n: int) -> None:  # acknowledged, in batches of a few messages
            first = len(acked)
            results: dict[int, Any] = {}
            for i in range(first, first + n):
                producer.send_async(f"id-{i}".encode(), lambda res, _mid, i=i: results.__setitem__(i, res))
            producer.flush()
            _wait(lambda: len(results) == n, "the sends' receipts")
            assert set(results.values()) == {pulsar.Result.Ok}
            acked.extend(range(first, first + n))

        def write(df: Any, batch_id: int) -> None:
            df.select("value").write.mode("overwrite").parquet(str(sink / f"batch={batch_id}"))

        def start(**options: str) -> Any:
            queries.append(
                _stream(spark, bookies, **options)
                .writeStream.foreachBatch(write)
                .option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(processingTime="1 second")
                .start()
            )
            return queries[-1]

        def ids() -> list[int]:
            if not sink.exists():
                return []
            rows = spark.read.schema("value binary").parquet(str(sink)).collect()
            return [int(bytes(r["value"])[3:]) for r in rows]

        def caught_up() -> bool:
            return len(ids()) >= len(acked)

        produce(200)
        q = start()
        _wait(caught_up, "the first messages in the sink")
        with BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root)) as bk:
            current = bk.ledger_metadata(max(bk.list_ledgers())).ensembles[-1].bookies
        victim = next(b for b in bks if b.id in current)
        victim.kill9()
        produce(200)  # the brokers replace the bookie in their ledgers' ensembles
        _wait(caught_up, "the messages written without the bookie")
        q.stop()
        victim.start()
        owner = json.loads(admin("GET", f"/lookup/v2/topic/persistent/public/default/{TOPIC}-partition-0"))
        dead = b1 if owner["brokerUrl"].endswith(f":{b1.port}") else b2
        dead.kill9()
        produce(200)  # partition 0 through the other broker once it took the topic over
        q = start(maxEntriesPerTrigger="7")
        _wait(caught_up, "the messages written after the broker's kill")
        q.stop()
        got = Counter(ids())
        assert sorted(got) == acked and set(got.values()) == {1}
    finally:
        for q in queries:
            q.stop()
        client.close()
        brokers.stop_all()


def test_a_stream_stopped_at_the_ledger_a_killed_broker_had_just_rolled_to_resumes_without_a_loss(
    bookies: Any, spark: Any, tmp_path: Path
) -> None:
    """The broker rolls its full ledger at a tick: the topic's current ledger is a new, empty one, and a stream
    that read everything ends its batch at entry 0 of it, stopped before it committed that to its subscription.
    The broker is killed; the next owner drops that empty ledger (``ManagedLedger.open``) and writes a new one.
    The stream restarted from its checkpoint reads the new messages: it failed with 'ledger N was deleted before
    entry 0 on was read', a TopicDataLossError, though that ledger never held an entry."""
    bookies.start_many(3)
    brokers = Brokers(bookies, tmp_path)
    args = ("--max-entries-per-ledger", "5", "--min-rollover-time-s", "0", "--tick-interval-s", "1")
    b1 = brokers.start(*args)
    admin = Cluster(bookies, b1).admin
    admin(
        "POST",
        "/admin/v2/namespaces/public/default/retention",
        {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1},
    )
    internal = f"/admin/v2/persistent/public/default/{TOPIC}/internalStats"
    sink = tmp_path / "sink"
    queries: list[Any] = []

    def produce(url: str, first: int) -> None:
        client = pulsar.Client(
            url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
        )
        try:
            producer = client.create_producer(f"persistent://public/default/{TOPIC}", batching_enabled=False)
            for i in range(first, first + 5):
                producer.send(f"id-{i}".encode())
        finally:
            client.close()

    def start(trigger: dict[str, Any]) -> Any:
        queries.append(
            _stream(spark, bookies)
            .writeStream.format("parquet")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(**trigger)
            .start(str(sink))
        )
        return queries[-1]

    try:
        produce(b1.service_url, 0)
        _wait(
            lambda: [li["entries"] for li in json.loads(admin("GET", internal))["ledgers"]] == [5, 0],
            "the rollover to an empty ledger",
        )
        q = start({"processingTime": "1 hour"})  # one batch now, the next planned (and committed) much later
        _wait(lambda: bool(q.recentProgress) and q.recentProgress[-1]["numInputRows"] == 5, "the first batch")
        q.stop()
        b1.kill9()
        b2 = brokers.start(*args)
        produce(b2.service_url, 5)  # b2 owns the topic: the empty ledger dropped, a new one written
        q = start({"availableNow": True})
        q.awaitTermination(120)
        assert q.exception() is None
        rows = spark.read.parquet(str(sink)).collect()
        assert sorted(bytes(r["value"]) for r in rows) == sorted(f"id-{i}".encode() for i in range(10))
    finally:
        for q in queries:
            q.stop()
        brokers.stop_all()
