"""The ``topic`` data source against live bookies and ZooKeeper: topic data is written as Pulsar-format entries
straight into managed ledgers (small rollover limits, so it spans ledgers), then read through a local[2] Spark."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ledger_client import BookKeeper, ClientConfig
from spark._topic_offsets import (
    EARLIEST,
    LedgerSlot,
    Snapshot,
    advance,
    allot,
    count_between,
    entry_ranges,
    missing_ledger_is_loss,
)
from spark._topic_options import TopicOptionError, parse_topic_options
from topic_broker import pulsar_api_pb2 as pb
from topic_broker.managed_ledger import ManagedLedger, ManagedLedgerConfig, Position
from topic_broker.names import TopicName
from topic_broker.wire import make_entry
from zk.managed_ledgers import BrokerMetadataStore

PW = "mlpw"
T0 = 1_700_000_000_000  # publish time of message 0, ms
_T = TypeVar("_T")


# --- writing topics: a managed ledger owned by a small in-test "broker" ----------------------------------------------


class Msg:
    """One expected row."""

    def __init__(
        self, value: bytes, key: str | None, props: dict[str, str], event: int, publish: int
    ) -> None:
        self.value, self.key, self.props, self.event, self.publish = value, key, props, event, publish
        self.pos: tuple[int, int, int] = (0, 0, -1)  # ledger, entry, batch index

    def row(self, topic: str, partition: int) -> tuple[Any, ...]:
        return (
            self.value,
            self.key,
            topic,
            self.publish,
            self.event or None,
            self.props,
            partition,
            *self.pos,
        )


def _meta(seq: int, publish: int, key: str | None, props: dict[str, str], event: int) -> pb.MessageMetadata:
    m = pb.MessageMetadata(producer_name="test-producer", sequence_id=seq, publish_time=publish)
    if key is not None:
        m.partition_key = key
    for k, v in props.items():
        m.properties.add(key=k, value=v)
    if event:
        m.event_time = event
    return m


def _entry(seq: int, msgs: list[Msg], batch: bool) -> bytes:
    """A non-batch entry (one message) or a batch entry of ``msgs`` (metadata of each in its single metadata)."""
    if not batch:
        (m,) = msgs
        return make_entry(_meta(seq, m.publish, m.key, m.props, m.event), m.value)
    meta = _meta(seq, msgs[0].publish, None, {}, 0)
    meta.num_messages_in_batch = len(msgs)
    body = b""
    for m in msgs:
        single = pb.SingleMessageMetadata(payload_size=len(m.value))
        if m.key is not None:
            single.partition_key = m.key
        for k, v in m.props.items():
            single.properties.add(key=k, value=v)
        if m.event:
            single.event_time = m.event
        raw = single.SerializeToString()
        body += struct.pack(">I", len(raw)) + raw + m.value
    return make_entry(meta, body)


class Broker:
    """Owns managed ledgers on a background event loop (as the broker would) for the test's writes."""

    def __init__(self, bookies: Any, max_entries_per_ledger: int = 7) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.bk: BookKeeper = self.run(
            BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root, add_timeout_s=5.0))
        )
        self.store = BrokerMetadataStore(self.bk.store)
        self.run(self.store.ensure_default_namespace())  # as a broker does at start
        self.cfg = ManagedLedgerConfig(
            ensemble_size=2,
            write_quorum=2,
            ack_quorum=2,
            min_rollover_time_s=0.0,
            max_entries_per_ledger=max_entries_per_ledger,
            password=PW.encode(),
        )
        self.mls: dict[str, ManagedLedger] = {}
        self.seq = 0

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def ml(self, topic: str) -> ManagedLedger:
        name = TopicName.parse(topic).ml_name
        if name not in self.mls:
            self.mls[name] = self.run(ManagedLedger.open(self.bk, self.store, name, self.cfg))
        return self.mls[name]

    def write(self, topic: str, n_entries: int, tag: str, batch_every: int = 3) -> list[Msg]:
        """``n_entries`` entries; every ``batch_every``-th is a batch of 3 messages. Returns the messages."""
        ml = self.ml(topic)
        out: list[Msg] = []
        for i in range(n_entries):
            self.seq += 1
            publish = T0 + self.seq * 10
            batch = batch_every > 0 and i % batch_every == batch_every - 1
            msgs = [
                Msg(
                    f"{tag}-{i}-{j}".encode() * (1 + (i + j) % 4),
                    None if (i + j) % 5 == 0 else f"k{(i + j) % 7}",
                    {} if (i + j) % 2 else {"i": str(i), "tag": tag},
                    0 if (i + j) % 3 == 0 else publish - 5,
                    publish,
                )
                for j in range(3 if batch else 1)
            ]
            pos: Position = self.run(ml.append(_entry(self.seq, msgs, batch)))
            for j, m in enumerate(msgs):
                m.pos = (pos.ledger_id, pos.entry_id, j if batch else -1)
            out += msgs
        return out

    def close_topic(self, topic: str) -> None:
        name = TopicName.parse(topic).ml_name
        ml = self.mls.pop(name, None)
        if ml is not None:
            self.run(ml.close())

    def partitioned(self, topic: str, n: int, grow: bool = False) -> None:
        name = TopicName.parse(topic).ml_name
        if grow:
            self.run(self.store.update_partitions(name, n))
        else:
            self.run(self.store.create_partitioned_topic(name, n))

    def cursor(self, topic: str, sub: str) -> tuple[int, int] | None:
        v = self.run(self.store.get_cursor(TopicName.parse(topic).ml_name, sub))
        return None if v is None else v.value.mark_delete

    def close(self) -> None:
        for name in list(self.mls):
            self.run(self.mls.pop(name).close())
        self.run(self.bk.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def broker(bookies: Any) -> Iterator[Broker]:
    bookies.start_many(3)
    b = Broker(bookies)
    yield b
    b.close()


def read(spark: Any, bookies: Any, **options: Any) -> Any:
    r = (
        spark.read.format("topic")
        .option("zk", bookies.zk)
        .option("zkRoot", bookies.root)
        .option("password", PW)
    )
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


COLS = [
    "value",
    "__key",
    "__topic",
    "__publishTime",
    "__eventTime",
    "__messageProperties",
    "__partition",
    "__ledgerId",
    "__entryId",
    "__batchIndex",
]


def rows(df: Any) -> list[tuple[Any, ...]]:
    out = []
    for value, key, topic, publish, event, props, part, lid, eid, bidx in df.select(*COLS).collect():
        ms = None if event is None else int(event.timestamp() * 1000 + 0.5)
        out.append(
            (
                bytes(value),
                key,
                topic,
                int(publish.timestamp() * 1000 + 0.5),
                ms,
                dict(props),
                part,
                lid,
                eid,
                bidx,
            )
        )
    return sorted(out, key=lambda t: (t[2], t[7], t[8], t[9]))


def expected(msgs: list[Msg], topic: str, partition: int = -1) -> list[tuple[Any, ...]]:
    return sorted((m.row(topic, partition) for m in msgs), key=lambda t: (t[2], t[7], t[8], t[9]))


# --- batch ---------------------------------------------------------------------------------------------------------


def test_batch_reads_every_message_with_offsets_and_times_and_never_fences_the_owner(
    broker: Broker, bookies: Any, spark: Any
) -> None:
    topic = "persistent://public/default/orders"
    msgs = broker.write(topic, 40, "a")  # 40 entries, 7 per ledger: 6 ledgers; 13 batches of 3
    broker.close_topic(topic)
    live = broker.write(topic, 9, "b")  # the owner keeps its ledger open while Spark reads
    ledgers = sorted({m.pos[0] for m in msgs + live})
    assert len(ledgers) >= 7

    df = read(spark, bookies, topic="orders", entriesPerPartition=4, maxRecordsPerBatch=5)
    got = rows(df)
    # the open ledger reads to its LAC: every acknowledged entry but possibly the last one
    want = expected(msgs + live, topic)
    assert got == want[: len(got)] and len(got) >= len(want) - 3
    assert len(msgs) == 40 + 13 * 2

    from pulsar import MessageId  # what pulsar-spark users do with __messageId

    r = (
        df.where("__batchIndex = 1")
        .orderBy("__ledgerId", "__entryId")
        .select("__messageId", "__ledgerId", "__entryId")
        .first()
    )
    mid = MessageId.deserialize(bytes(r[0]))
    assert (mid.ledger_id(), mid.entry_id(), mid.batch_index(), mid.partition()) == (r[1], r[2], 1, -1)

    # the scan fenced nothing: the owner appends on and closes normally, and then everything reads exactly
    more = broker.write(topic, 2, "c")
    broker.close_topic(topic)
    assert rows(read(spark, bookies, topic=topic)) == expected(msgs + live + more, topic)

    # explicit offsets: start inclusive, end exclusive; they cross ledger boundaries
    first, last = msgs[10].pos, msgs[50].pos
    window = [m for m in msgs if first[:2] <= m.pos[:2] < last[:2]]
    offsets = lambda p: json.dumps({topic: [p[0], p[1]]})  # noqa: E731
    df = read(spark, bookies, topic=topic, startingOffsets=offsets(first), endingOffsets=offsets(last))
    assert rows(df) == expected(window, topic)
    # publish times: [startingTime, endingTime)
    t1, t2 = msgs[12].publish, msgs[44].publish
    df = read(spark, bookies, topics=f"{topic}", startingTime=t1, endingTime=t2)
    assert rows(df) == expected([m for m in msgs if t1 <= m.publish < t2], topic)
    with pytest.raises(Exception, match="option 'startingOffsets': 'latest' would read nothing"):
        read(spark, bookies, topic=topic, startingOffsets="latest").count()


def test_partitioned_topic_by_name_and_by_pattern(broker: Broker, bookies: Any, spark: Any) -> None:
    broker.partitioned("clicks", 3)
    written = {}
    for i in range(3):
        name = f"persistent://public/default/clicks-partition-{i}"
        written[i] = broker.write(name, 5 + 4 * i, f"p{i}")
        broker.close_topic(name)
    other = broker.write("views", 4, "v")
    broker.close_topic("views")
    want = [
        r
        for i in range(3)
        for r in expected(written[i], f"persistent://public/default/clicks-partition-{i}", i)
    ]
    assert rows(read(spark, bookies, topic="clicks")) == sorted(want, key=lambda t: (t[2], t[7], t[8], t[9]))
    by_pattern = rows(read(spark, bookies, topicsPattern="persistent://public/default/c.*"))
    assert by_pattern == rows(read(spark, bookies, topic="clicks"))
    both = read(spark, bookies, topicsPattern="public/default/(clicks|views)")
    assert both.count() == len(want) + len(other)
    # a pattern or a name in a namespace that does not exist says so (a typo would otherwise read nothing)
    with pytest.raises(Exception, match="namespace nosuch/ns does not exist"):
        read(spark, bookies, topicsPattern="persistent://nosuch/ns/c.*").count()
    with pytest.raises(Exception, match="nor does its namespace nosuch/ns"):
        read(spark, bookies, topic="persistent://nosuch/ns/clicks").count()
    assert read(spark, bookies, topicsPattern="public/default/nothing-matches.*").count() == 0
    one = read(spark, bookies, topics="clicks-partition-0,clicks-partition-2")
    assert {r[0] for r in one.groupBy("__partition").count().collect()} == {0, 2}


# --- streaming ------------------------------------------------------------------------------------------------------


def _run_available_now(spark: Any, bookies: Any, out: Path, ck: Path, **options: Any) -> Any:
    r = spark.readStream.format("topic").option("zk", bookies.zk).option("zkRoot", bookies.root)
    r = r.option("password", PW)
    for k, v in options.items():
        r = r.option(k, str(v))
    q = (
        r.load()
        .writeStream.format("parquet")
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start(str(out))
    )
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    return q


def test_streaming_available_now_resumes_from_the_checkpoint_no_gaps_no_duplicates_and_commits(
    broker: Broker, bookies: Any, spark: Any, tmp_path: Path
) -> None:
    topic = "persistent://public/default/events"
    parts = [f"{topic}-partition-{i}" for i in range(3)]
    broker.partitioned("events", 2)
    phase1 = {p: broker.write(p, 12, f"one{i}") for i, p in enumerate(parts[:2])}
    out, ck = tmp_path / "out", tmp_path / "ck"
    opts = dict(
        topic="events", startingOffsets="earliest", maxEntriesPerTrigger=6, subscriptionName="spark-events"
    )

    q = _run_available_now(spark, bookies, out, ck, **opts)
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    assert len(batches) == 4, [p["numInputRows"] for p in q.recentProgress]  # 24 entries, 6 per trigger
    got = rows(spark.read.parquet(str(out)))
    assert got == sorted(
        [r for i, p in enumerate(parts[:2]) for r in expected(phase1[p], p, i)],
        key=lambda t: (t[2], t[7], t[8], t[9]),
    )
    # the subscription's cursor stands on the last entry read of every partition
    for p in parts[:2]:
        assert broker.cursor(p, "spark-events") == phase1[p][-1].pos[:2]

    # more data: a rollover on the existing partitions (a new owner) and a new partition
    for p in parts[:2]:
        broker.close_topic(p)
    broker.partitioned("events", 3, grow=True)
    phase2 = {p: broker.write(p, 9, f"two{i}") for i, p in enumerate(parts)}
    for p in parts:
        broker.close_topic(p)
    assert phase2[parts[0]][0].pos[0] > phase1[parts[0]][-1].pos[0]
    _run_available_now(spark, bookies, out, ck, **opts)
    got = rows(spark.read.parquet(str(out)))
    want = [r for i, p in enumerate(parts) for r in expected(phase1.get(p, []) + phase2[p], p, i)]
    assert got == sorted(want, key=lambda t: (t[2], t[7], t[8], t[9])), "no duplicates, no gaps"
    for p in parts:
        assert broker.cursor(p, "spark-events") == phase2[p][-1].pos[:2]

    # nothing new: a third run reads nothing and leaves everything as it was
    q = _run_available_now(spark, bookies, out, ck, **opts)
    assert sum(p["numInputRows"] for p in q.recentProgress) == 0
    assert len(rows(spark.read.parquet(str(out)))) == len(want)
    for p in parts:
        assert broker.cursor(p, "spark-events") == phase2[p][-1].pos[:2]


# --- data loss ------------------------------------------------------------------------------------------------------


def test_a_ledger_deleted_under_a_query_fails_or_is_skipped_by_fail_on_data_loss(
    broker: Broker, bookies: Any
) -> None:
    from spark.topic_source import TOPIC_SCHEMA, TopicDataLossError, TopicDataSource

    topic = "persistent://public/default/trimmed"
    msgs = broker.write(topic, 20, "t")
    broker.close_topic(topic)
    ledgers = sorted({m.pos[0] for m in msgs})
    base = {"zk": bookies.zk, "zkRoot": bookies.root, "password": PW, "topic": topic}
    strict = TopicDataSource(dict(base)).reader(TOPIC_SCHEMA)
    lenient = TopicDataSource({**base, "failOnDataLoss": "false"}).reader(TOPIC_SCHEMA)
    parts = strict.partitions()
    assert sorted({p.ledger_id for p in parts}) == ledgers
    gone = ledgers[0]
    trim_first_ledger(broker, topic)  # what retention does: off the ledger list, then deleted
    n = sum(b.num_rows for p in parts for b in lenient.read(p))
    assert n == len([m for m in msgs if m.pos[0] != gone])
    lost = next(p for p in parts if p.ledger_id == gone)
    with pytest.raises(TopicDataLossError, match=f"ledger {gone} was deleted"):
        list(strict.read(lost))
    # a start position inside a ledger that is gone (not consumed by our subscription) is loss at plan time
    start = json.dumps({topic: [gone, 2]})
    with pytest.raises(TopicDataLossError, match=f"ledger {gone}"):
        TopicDataSource({**base, "startingOffsets": start}).reader(TOPIC_SCHEMA).partitions()
    skipped = TopicDataSource({**base, "startingOffsets": start, "failOnDataLoss": "false"}).reader(
        TOPIC_SCHEMA
    )
    assert {p.ledger_id for p in skipped.partitions()} == {lid for lid in ledgers if lid > gone}
    # 'earliest' is what still exists: no loss
    assert {p.ledger_id for p in TopicDataSource(dict(base)).reader(TOPIC_SCHEMA).partitions()} == set(
        ledgers[1:]
    )


def trim_first_ledger(broker: Broker, topic: str) -> int:
    from dataclasses import replace

    name = TopicName.parse(topic).ml_name

    async def go() -> int:
        v = await broker.store.get_ml_info(name)
        assert v is not None
        first = v.value.ledgers[0].ledger_id
        await broker.store.set_ml_info(name, replace(v.value, ledgers=v.value.ledgers[1:]), v.version)
        await broker.bk.delete_ledger(first)
        return first

    return broker.run(go())


# --- options and pure position arithmetic (no cluster) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({}, "topic"),
        ({"topic": "a", "topics": "b"}, "topics"),
        ({"topic": "non-persistent://public/default/x"}, "topic"),
        ({"topics": "a,,b"}, "topics"),
        ({"topicsPattern": "(unclosed"}, "topicsPattern"),
        ({"topic": "a", "startingOffsets": "soonest"}, "startingOffsets"),
        ({"topic": "a", "startingOffsets": '{"a": [1]}'}, "startingOffsets"),
        ({"topic": "a", "endingOffsets": "earliest"}, "endingOffsets"),
        ({"topic": "a", "startingOffsets": "latest"}, "startingOffsets"),  # a batch query: reads nothing
        ({"topic": "a", "startingOffsets": '{"a": "latest"}'}, "startingOffsets"),
        ({"topic": "a", "startingOffsets": "earliest", "startingTime": "5"}, "startingTime"),
        ({"topic": "a", "endingTime": "yesterday"}, "endingTime"),
        ({"topic": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"topic": "a", "maxEntriesPerTrigger": "0"}, "maxEntriesPerTrigger"),
        ({"topic": "a", "maxBytesPerTrigger": "lots"}, "maxBytesPerTrigger"),
        ({"topic": "a", "zk": "nohost"}, "zk"),
        ({"topic": "a", "service.url": "x:6650"}, "service.url"),  # pulsar-spark's, taken when well formed
        ({"topic": "a", "serviceUrl": "pulsar://x:6650"}, "serviceurl"),
    ],
)
def test_bad_options_fail_when_the_dataframe_is_defined_naming_the_option(
    spark: Any, options: dict[str, str], named: str
) -> None:
    r = spark.read.format("topic")
    for k, v in options.items():
        r = r.option(k, v)
    with pytest.raises(Exception, match=f"option '{named}'"):
        r.load()


def test_streaming_options_and_the_default_subscription_is_stable() -> None:
    with pytest.raises(TopicOptionError, match="option 'endingOffsets'"):
        parse_topic_options({"topic": "a", "endingOffsets": "latest"}, streaming=True)
    a = parse_topic_options({"topic": "a", "startingOffsets": "earliest"}, streaming=True)
    b = parse_topic_options(
        {"topic": "persistent://public/default/a", "startingoffsets": "earliest"}, streaming=True
    )
    c = parse_topic_options({"topic": "b", "startingOffsets": "earliest"}, streaming=True)
    assert a.subscription == b.subscription != c.subscription
    assert a.subscription.startswith("spark-topic-") and not a.subscription_explicit
    assert parse_topic_options({"topic": "a"}, streaming=True).starting.kind == "latest"
    assert parse_topic_options({"topic": "a"}, streaming=False).starting.kind == "earliest"
    # 'latest' starts a stream; a batch reads up to the latest entry, so from 'latest' it would read nothing
    latest_of_a = '{"a": "latest"}'
    # partitions a JSON start does not name start at the query's default, as pulsar-spark's
    for streaming, default in ((True, "latest"), (False, "earliest")):
        spec = parse_topic_options({"topic": "a", "startingOffsets": '{"a": [1, 2]}'}, streaming=streaming)
        assert spec.starting.default == default
    assert parse_topic_options(
        {"topic": "a", "startingOffsets": latest_of_a}, streaming=True
    ).starting.positions
    for value in ("latest", " LATEST ", latest_of_a):
        with pytest.raises(TopicOptionError, match="option 'startingOffsets': 'latest' .*would read nothing"):
            parse_topic_options({"topic": "a", "startingOffsets": value}, streaming=False)


def test_position_arithmetic_across_ledgers() -> None:
    snap = Snapshot((LedgerSlot(3, 5, 500, True), LedgerSlot(7, 4, 4000, True), LedgerSlot(9, 2, 0, False)))
    assert snap.earliest() == (3, 0) and snap.latest() == (9, 2)
    assert count_between(snap, (3, 2), (9, 1)) == 3 + 4 + 1
    assert count_between(snap, EARLIEST, snap.latest()) == 11
    assert advance(snap, (3, 2), 3) == (7, 0), "the end of a closed ledger moves onto its successor"
    assert advance(snap, (3, 2), 4) == (7, 1)
    assert advance(snap, (3, 2), 100) == (9, 2)
    assert advance(snap, (3, 2), 100, cap=(7, 3)) == (7, 3)
    assert advance(snap, (9, 2), 5) == (9, 2), "nothing new: the start itself"
    assert entry_ranges(snap, (3, 3), (9, 1), 3) == [(3, 3, 4), (7, 0, 2), (7, 3, 3), (9, 0, 0)]
    assert allot({"a": 10, "b": 30, "c": 0}, 8) == {"a": 2.0, "b": 6.0, "c": 0.0}
    assert allot({"a": 1, "b": 1}, 1) == {"a": 0.0, "b": 1.0} or allot({"a": 1, "b": 1}, 1) == {
        "a": 1.0,
        "b": 0.0,
    }
    assert allot({"a": 3, "b": 4}, 100) == {"a": 3, "b": 4}
    # a ledger gone from the chain: consumed (known to have ended there, or acked by our subscription) or lost
    assert snap.lost_ledgers((5, 2)) == [5] and snap.lost_ledgers((7, 2)) == []
    assert not missing_ledger_is_loss((5, 4), {5: 4}, None)
    assert missing_ledger_is_loss((5, 2), {5: 4}, (5, 1))
    assert not missing_ledger_is_loss((5, 2), {}, (5, 1))
    assert missing_ledger_is_loss((5, 2), {}, (5, 0))
    assert missing_ledger_is_loss((5, 2), {}, None)
    # gone from the middle of the chain (ledger 3 still there): dropped empty by a new owner, never trimmed
    assert not missing_ledger_is_loss((5, 0), {}, None, [3, 7]) and missing_ledger_is_loss(
        (5, 0), {}, None, [7]
    )


def test_byte_budgets_use_each_ledgers_average_entry_size() -> None:
    from spark._topic_offsets import bytes_between, entries_within_bytes

    snap = Snapshot((LedgerSlot(3, 5, 500, True), LedgerSlot(7, 4, 4000, True), LedgerSlot(9, 2, 0, False)))
    # ledger 3: 100 B/entry, ledger 7: 1000 B/entry, open ledger 9 (size unknown): the average of the others
    assert bytes_between(snap, (3, 0), (7, 2)) == 5 * 100 + 2 * 1000
    assert bytes_between(snap, (9, 0), (9, 2)) == 2 * 550
    assert entries_within_bytes(snap, (3, 0), snap.latest(), 2500) == 5 + 2
    assert entries_within_bytes(snap, (7, 0), snap.latest(), 10) == 1, "always at least one entry"


# --- end to end: the real pulsar-client through a broker process ----------------------------------------------------


def test_messages_produced_through_a_broker_read_back_with_their_message_ids(
    bookies: Any, spark: Any, tmp_path: Path
) -> None:
    pulsar = pytest.importorskip("pulsar")
    from tests.broker_testing import start_broker

    bookies.start_many(3)
    bp = start_broker(bookies, tmp_path, 10.0)  # the default session timeout
    bp.wait_ready(60)
    topic = "persistent://public/default/e2e"
    sent: dict[tuple[int, int, int], tuple[bytes, str, dict[str, str], int]] = {}
    try:
        c = pulsar.Client(bp.service_url, operation_timeout_seconds=15)
        try:
            for batching in (False, True):
                p = c.create_producer(topic, batching_enabled=batching, batching_max_publish_delay_ms=20)
                futures: list[Any] = []
                for i in range(60):
                    value = f"{batching}-{i}".encode()
                    props = {"n": str(i)}
                    key = f"key-{i % 4}"
                    event = T0 + i

                    def done(
                        res: Any,
                        mid: Any,
                        v: bytes = value,
                        k: str = key,
                        pr: dict[str, str] = props,
                        e: int = event,
                        out: list[Any] = futures,
                    ) -> None:
                        out.append((mid, v, k, pr, e))

                    p.send_async(value, done, properties=props, partition_key=key, event_timestamp=event)
                p.flush()
                p.close()
                for mid, v, k, pr, e in futures:
                    sent[(mid.ledger_id(), mid.entry_id(), mid.batch_index())] = (v, k, pr, e)
            # One more entry after the batch: it carries the batch's entry id as the LAC, so a reader of the open
            # ledger (which stops at the LAC) sees the batch even if it is read before the next explicit LAC.
            c.create_producer(topic).send(b"tail")
        finally:
            c.close()
        assert len(sent) == 120
        df = (
            spark.read.format("topic")
            .option("zk", bookies.zk)
            .option("zkRoot", bookies.root)
            .option("topic", "e2e")
        )
        cols = [
            "__ledgerId",
            "__entryId",
            "__batchIndex",
            "value",
            "__key",
            "__messageProperties",
            "__eventTime",
        ]
        got = {
            (lid, eid, bidx): (bytes(v), k, dict(pr), int(ev.timestamp() * 1000 + 0.5))
            for lid, eid, bidx, v, k, pr, ev in df.load().select(*cols).collect()
            if bytes(v) != b"tail"
        }
        # the broker's ledger is open: Spark reads to its LAC, every acknowledged entry but perhaps the last
        assert got.items() <= sent.items() and len(got) >= len(sent) - 60
        assert any(b >= 0 for _, _, b in got), "the batched producer's entries unpack into messages"
    finally:
        bp.stop()
    # the broker closed its ledger on shutdown: now everything reads
    df = (
        spark.read.format("topic")
        .option("zk", bookies.zk)
        .option("zkRoot", bookies.root)
        .option("topic", "e2e")
    )
    assert df.load().count() == 121  # and the tail message
