"""The ``topic`` source as its users meet it: topics written by the official ``pulsar-client`` through a broker
process (batching, compression, keys, properties, event times), read in Spark and compared column by column with
what was sent and with what a Pulsar reader of the same topic sees.

One cluster (ZooKeeper, 3 bookies, one broker) per module; the broker rolls its ledgers every 20 entries and runs
with Pulsar's default of no deduplication; the namespace keeps everything (infinite retention), since no
subscription holds the data the tests read."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import start_broker
from tests.conftest import BookieFactory
from tests.zk_testing import unique_root

pulsar = pytest.importorskip("pulsar")

EVENT0 = 1_700_000_000_000
ORDER = ("__ledgerId", "__entryId", "__batchIndex")


class Cluster:
    def __init__(self, bookies: BookieFactory, broker: BrokerProcess) -> None:
        self.bookies = bookies
        self.broker = broker
        self.zk = bookies.zk
        self.root = bookies.root

    def admin(self, method: str, path: str, body: object = None) -> bytes:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.broker.http_port}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            data: bytes = resp.read()
            return data

    def wait_trimmed(self, topic_path: str, past_ledger: int) -> list[tuple[int, int]]:
        """Wait (up to 30 s) until the broker's retention has trimmed the topic's ledgers up to ``past_ledger``
        (its first ledger is a later one); the (ledgerId, entries) of the ledgers left, trimmed or not."""
        deadline = time.monotonic() + 30
        while True:
            stats = json.loads(self.admin("GET", f"/admin/v2/persistent/{topic_path}/internalStats"))
            if stats["ledgers"][0]["ledgerId"] > past_ledger or time.monotonic() > deadline:
                return [(led["ledgerId"], led["entries"]) for led in stats["ledgers"]]
            time.sleep(0.5)

    def client(self) -> Any:
        return pulsar.Client(
            self.broker.service_url,
            operation_timeout_seconds=15,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )

    def read(self, spark: Any, **options: str) -> Any:
        return (
            spark.read.format("topic")
            .option("zk", self.zk)
            .option("zkRoot", self.root)
            .options(**options)
            .load()
        )

    def available_now(self, spark: Any, where: Path, **options: str) -> int:
        """A stream from the earliest entry to parquet under ``where`` (its checkpoint beside it), run with
        ``Trigger.AvailableNow`` to its end; the rows it read."""
        q = (
            spark.readStream.format("topic")
            .option("zk", self.zk)
            .option("zkRoot", self.root)
            .option("startingOffsets", "earliest")
            .options(**options)
            .load()
            .writeStream.format("parquet")
            .option("checkpointLocation", str(where / "ck"))
            .trigger(availableNow=True)
            .start(str(where / "out"))
        )
        try:
            q.awaitTermination(180)
        finally:
            q.stop()
        return sum(int(pp["numInputRows"]) for pp in q.recentProgress)


@pytest.fixture(scope="module")
def cluster(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("users")
    bookies = BookieFactory(zk_server.connect_string, unique_root(), tmp)
    bookies.start_many(3)
    broker = start_broker(
        bookies,
        tmp,
        10.0,
        *("--max-entries-per-ledger", "20", "--min-rollover-time-s", "0", "--tick-interval-s", "1"),
        *("--max-message-size", "300000", "--no-dedup"),
    )
    try:
        broker.wait_ready(60)
        c = Cluster(bookies, broker)
        c.admin(
            "POST",
            "/admin/v2/namespaces/public/default/retention",
            {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1},
        )
        yield c
    finally:
        try:
            broker.stop()
        finally:
            bookies.stop_all()


Sent = tuple[Any, bytes, str | None, dict[str, str], int]  # message id, value, key, properties, event time


def produce(c: Cluster, topic: str, n: int, **producer: Any) -> list[Sent]:
    """``n`` messages, every one with a different mix of key, properties and event time; their send ids."""
    client = c.client()
    try:
        p = client.create_producer(topic, **producer)
        done: dict[int, Any] = {}
        out: list[tuple[bytes, str | None, dict[str, str], int]] = []
        for i in range(n):
            value = f"{topic}-{i}-".encode() * (1 + i % 5)
            key = None if i % 4 == 0 else f"k{i % 3}"
            props = {} if i % 3 == 0 else {"i": str(i), "t": "x"}
            event = 0 if i % 2 == 0 else EVENT0 + i
            kw: dict[str, Any] = {"properties": props}
            if key is not None:
                kw["partition_key"] = key
            if event:
                kw["event_timestamp"] = event
            p.send_async(value, lambda res, mid, i=i: done.__setitem__(i, (res, mid)), **kw)
            out.append((value, key, props, event))
        p.flush()
        deadline = time.monotonic() + 30
        while len(done) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        p.close()
    finally:
        client.close()
    assert all(done[i][0] == pulsar.Result.Ok for i in range(n))
    return [(done[i][1], *out[i]) for i in range(n)]


def reader_view(c: Cluster, topic: str, n: int) -> list[Any]:
    """What a Pulsar reader of the topic receives from its start (``n`` messages)."""
    client = c.client()
    try:
        r = client.create_reader(topic, pulsar.MessageId.earliest)
        got = [r.read_next(10_000) for _ in range(n)]
        r.close()
        return got
    finally:
        client.close()


def read_all(c: Cluster, spark: Any, n: int, **options: str) -> list[Any]:
    """The rows of a read once all ``n`` acknowledged messages are readable: the broker's ledger is open and
    Spark reads it to the bookies' LAC, which the broker's explicit LAC brings to the last acknowledged entry
    within half a second of the last write."""
    deadline = time.monotonic() + 15
    while True:
        rows: list[Any] = c.read(spark, **options).orderBy(*ORDER).collect()
        if len(rows) >= n or time.monotonic() > deadline:
            return rows
        time.sleep(0.3)


def ms(ts: Any) -> int:
    return int(ts.timestamp() * 1000 + 0.5)


def check_rows(rows: list[Any], sent: list[Sent], seen: list[Any], topic: str) -> None:
    assert len(rows) == len(sent) == len(seen)
    for r, (mid, value, key, props, event), m in zip(rows, sent, seen, strict=True):
        assert m.message_id() == mid and m.data() == value
        assert bytes(r["value"]) == value
        assert r["__key"] == key
        assert dict(r["__messageProperties"]) == props
        assert (ms(r["__eventTime"]) if r["__eventTime"] is not None else 0) == event
        assert ms(r["__publishTime"]) == m.publish_timestamp()
        assert pulsar.MessageId.deserialize(bytes(r["__messageId"])) == mid
        assert (r["__ledgerId"], r["__entryId"], r["__batchIndex"]) == (
            mid.ledger_id(),
            mid.entry_id(),
            mid.batch_index(),
        )
        assert r["__topic"] == topic and r["__partition"] == -1


@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
@pytest.mark.parametrize("compression", ["LZ4", "ZSTD", "ZLib", "SNAPPY"])
def test_compressed_topics_read_back_message_by_message(
    cluster: Cluster, spark: Any, compression: str, batching: bool
) -> None:
    topic = f"persistent://public/default/{compression.lower()}-{'b' if batching else 's'}"
    sent = produce(
        cluster,
        topic,
        30,
        compression_type=getattr(pulsar.CompressionType, compression),
        batching_enabled=batching,
        batching_max_messages=6,
        batching_max_publish_delay_ms=50,
    )
    seen = reader_view(cluster, topic, len(sent))
    rows = read_all(cluster, spark, len(sent), topic=topic)
    check_rows(rows, sent, seen, topic)
    if batching:
        assert any(r["__batchIndex"] > 0 for r in rows), "some entries are batches of several messages"


def test_chunked_messages_read_as_one_row_each_across_ranges_ledgers_and_micro_batches(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    """Messages larger than the broker's 300 kB limit, sent LZ4-compressed in chunks of one entry each, 2 small
    messages first so that a chunked message straddles the broker's 20-entry ledgers."""
    import random

    topic = "persistent://public/default/chunked"
    rnd = random.Random(7)
    values = [b"s0", b"s1"]
    for i in range(7):
        values += [rnd.randbytes(700_000 + 1000 * i), f"s{i + 2}".encode()]
    client = cluster.client()
    try:
        p = client.create_producer(
            topic,
            batching_enabled=False,
            chunking_enabled=True,
            compression_type=pulsar.CompressionType.LZ4,
        )
        ids = [p.send(v) for v in values]
        p.close()
    finally:
        client.close()
    big = [i for i, v in enumerate(values) if len(v) > 1000]
    assert all(str(ids[i]).count(";") == 1 for i in big), "the big messages were sent in chunks"
    assert len({ids[i].ledger_id() for i in range(len(values))}) > 1
    straddling = [i for i in big if str(ids[i]).split(";")[0].split(",")[0] != str(ids[i].ledger_id())]
    assert straddling, f"a chunked message spans two ledgers: {[str(x) for x in ids]}"

    def check(rows: list[Any]) -> None:
        assert [bytes(r["value"]) for r in rows] == values
        assert [pulsar.MessageId.deserialize(bytes(r["__messageId"])) for r in rows] == ids
        assert [(r["__ledgerId"], r["__entryId"]) for r in rows] == [
            (m.ledger_id(), m.entry_id()) for m in ids
        ]

    check(read_all(cluster, spark, len(values), topic=topic))
    # one Spark partition per 2 entries: most big messages end in a range after their first chunk
    check(read_all(cluster, spark, len(values), topic=topic, entriesPerPartition="2"))
    # a stream admitting one entry per micro-batch: every message arrives whole in the batch of its last chunk
    assert cluster.available_now(spark, tmp_path, topic=topic, maxEntriesPerTrigger="1") == len(values)
    check(spark.read.parquet(str(tmp_path / "out")).orderBy(*ORDER).collect())


def test_a_stream_whose_unread_ledgers_were_trimmed_fails_until_told_to_skip_them(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    """Retention 0 (Pulsar's default) in a namespace of its own: once the stream's subscription is deleted and
    the application's consumer acknowledged everything, the broker trims ledgers the stream never read. Every
    restart from the checkpoint then fails naming the lost ledger (an AvailableNow restart once put the
    subscription back before the check and carried on), until ``failOnDataLoss`` is false."""
    from pyspark.errors import StreamingQueryException

    cluster.admin("PUT", "/admin/v2/tenants/trim", {"allowedClusters": ["ledgerstore"], "adminRoles": []})
    cluster.admin("PUT", "/admin/v2/namespaces/trim/ns", {})
    topic = "persistent://trim/ns/t"
    client = cluster.client()
    try:
        app = client.subscribe(topic, "app", initial_position=pulsar.InitialPosition.Earliest)
        p = client.create_producer(topic, batching_enabled=False)

        def send(n: int, tag: str) -> None:
            for i in range(n):
                p.send(f"{tag}{i}".encode())

        def ack(n: int) -> None:
            for _ in range(n):
                app.acknowledge(app.receive(10_000))

        send(30, "a")  # the application's subscription holds them until the stream's exists
        time.sleep(1.5)  # the explicit LAC: the stream's first run sees all 30

        def run(**options: str) -> int:
            return cluster.available_now(
                spark, tmp_path, topic=topic, subscriptionName="spark-trim", **options
            )

        assert run() == 30
        stats = json.loads(cluster.admin("GET", "/admin/v2/persistent/trim/ns/t/internalStats"))
        first_ledgers = [led["ledgerId"] for led in stats["ledgers"]]
        assert "spark-trim" in stats["cursors"] and len(first_ledgers) == 2
        send(25, "b")
        ack(55)
        cluster.admin("DELETE", "/admin/v2/persistent/trim/ns/t/subscription/spark-trim")
        left = cluster.wait_trimmed("trim/ns/t", first_ledgers[-1])
        assert left[0][0] > first_ledgers[-1], f"the broker trimmed the stream's ledgers: {left}"
        for _attempt in range(2):
            with pytest.raises(StreamingQueryException, match=f"ledger {first_ledgers[-1]} was deleted"):
                run()
        assert run(failOnDataLoss="false") == 15
    finally:
        client.close()


def test_a_stream_refuses_an_applications_subscription_and_keeps_its_own(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    """``subscriptionName`` naming the subscription of a live consumer: the query fails naming the option and
    leaves the cursor alone (moving it made the broker take the write for another owner's and stop serving the
    topic). A name of the query's own is created once and used again by the next run."""
    from pyspark.errors import StreamingQueryException

    topic = "persistent://public/default/shared-sub"
    path = "/admin/v2/persistent/public/default/shared-sub/internalStats"
    client = cluster.client()
    try:
        app = client.subscribe(topic, "app", initial_position=pulsar.InitialPosition.Earliest)
        p = client.create_producer(topic, batching_enabled=False)
        for i in range(25):
            p.send(f"m{i}".encode())
        time.sleep(1.5)  # the explicit LAC
        before = json.loads(cluster.admin("GET", path))["cursors"]["app"]["markDeletePosition"]

        def run(sub: str, n: int) -> int:
            return cluster.available_now(
                spark, tmp_path / f"{sub}-{n}", topic=topic, subscriptionName=sub, maxEntriesPerTrigger="10"
            )

        with pytest.raises(StreamingQueryException, match="option 'subscriptionName'.*'app'"):
            run("app", 0)
        stats = json.loads(cluster.admin("GET", path))
        assert stats["cursors"]["app"]["markDeletePosition"] == before
        for _ in range(25):  # the application's consumer still gets everything, from its own position
            app.acknowledge(app.receive(10_000))
        assert run("spark-own", 0) == 25 and run("spark-own", 1) == 25
        assert set(json.loads(cluster.admin("GET", path))["cursors"]) == {"app", "spark-own"}
    finally:
        client.close()


def test_a_stream_over_a_growing_partitioned_topic_resumes_exactly_and_leaves_no_backlog(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    """AvailableNow runs from one checkpoint over a partitioned topic that gains a partition between them, 20
    entries a micro-batch, across the broker's ledger rollovers: each message once, and the query's one
    subscription on every partition (the new one included) acknowledges everything (the broker's stats say so)."""
    base = "growing"
    topic = f"persistent://public/default/{base}"
    cluster.admin("PUT", f"/admin/v2/persistent/public/default/{base}/partitions", 2)
    client = cluster.client()
    values: list[bytes] = []
    try:
        p = client.create_producer(topic, batching_enabled=False)

        def send(n: int) -> None:
            for _ in range(n):
                values.append(f"v{len(values)}".encode())
                p.send_async(values[-1], lambda res, mid: None)
            p.flush()
            time.sleep(1.5)  # the explicit LAC

        send(90)
        assert cluster.available_now(spark, tmp_path, topic=base, maxEntriesPerTrigger="20") == 90
        cluster.admin("POST", f"/admin/v2/persistent/public/default/{base}/partitions", 3)
        p.close()
        p = client.create_producer(topic, batching_enabled=False)
        send(90)
        assert cluster.available_now(spark, tmp_path, topic=base, maxEntriesPerTrigger="20") == 90
    finally:
        client.close()
    rows = spark.read.parquet(str(tmp_path / "out")).select("value", "__partition").collect()
    assert sorted(bytes(r["value"]) for r in rows) == sorted(values)
    assert {r["__partition"] for r in rows} == {0, 1, 2}
    subs = []
    for i in range(3):
        stats = json.loads(
            cluster.admin("GET", f"/admin/v2/persistent/public/default/{base}-partition-{i}/stats")
        )
        subs.append({name: s["msgBacklog"] for name, s in stats["subscriptions"].items()})
    assert len({tuple(s) for s in subs}) == 1 and all(list(s.values()) == [0] for s in subs), subs
