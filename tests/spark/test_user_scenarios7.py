"""What a Spark user's day found in the topic source's admission control. The cluster of
``test_user_scenarios`` (ZooKeeper, 3 bookies, a broker rolling its ledgers every 20 entries); the stream reader
is driven directly, as Spark calls it, without a query."""

from __future__ import annotations

import time

import pytest

from tests.spark import test_user_scenarios as users
from tests.spark.test_user_scenarios import Cluster
from tests.spark.test_user_scenarios5 import _options

pytest.importorskip("pyspark")
pulsar = pytest.importorskip("pulsar")
cluster = users.cluster  # the module's own cluster, built as that module builds it


def test_max_bytes_per_trigger_counts_an_open_ledgers_entries_at_their_size(cluster: Cluster) -> None:
    """10 messages of 20,000 bytes in a topic's only ledger, still open (the broker rolls it at 20 entries):
    maxBytesPerTrigger=50000 admits 2 of them. Before, an open ledger's size was its metadata's, 0 until it
    closes, and its entries were counted at 1 KiB each: the first batch took all 10 (200,000 bytes)."""
    from pyspark.sql.streaming.datasource import ReadMaxBytes

    from spark._topic_offsets import positions_from_json
    from spark.topic_source import TOPIC_SCHEMA, TopicStreamReader

    topic = "big-entries-open-ledger"
    client = cluster.client()
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(10):
            producer.send(bytes([i]) * 20_000)
        producer.close()
    finally:
        client.close()
    time.sleep(1.5)  # the explicit LAC
    opts = _options(cluster, topic, startingOffsets="earliest", maxBytesPerTrigger="50000")
    r = TopicStreamReader(opts, TOPIC_SCHEMA)
    try:
        start = r.initialOffset()
        (snap,) = r._snaps.values()
        assert [s.closed for s in snap.ledgers] == [False] and snap.ledgers[0].entries == 10
        assert 195_000 <= snap.ledgers[0].size <= 205_000  # payloads and their Pulsar metadata
        end = r.latestOffset(start, ReadMaxBytes(50_000))
        (begin,) = positions_from_json(start).values()
        (stop,) = positions_from_json(end).values()
        assert stop[0] == begin[0] and stop[1] - begin[1] == 2
    finally:
        r.stop()


def _send(cluster: Cluster, topic: str, n: int) -> None:
    client = cluster.client()
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(n):
            producer.send(f"m{i}".encode())
        producer.close()
    finally:
        client.close()


def test_a_stream_given_a_starting_time_still_ahead_reads_nothing_published_before_it(
    cluster: Cluster,
) -> None:
    """startingTime 3 s ahead when a new stream starts: its first batch holds the 2 messages published after that
    time, not the 3 published between the query's start and it. The start position is the latest entry when
    the query starts (no entry was published at or after the time yet); before, every message from there on
    made a row (5, 3 of them published before startingTime)."""
    from spark._topic_options import parse_topic_options
    from spark.topic_source import TOPIC_SCHEMA, TopicStreamReader, read_range

    topic = "starting-time-ahead"
    _send(cluster, topic, 4)
    time.sleep(1.5)  # the explicit LAC
    at = int(time.time() * 1000) + 3000
    opts = parse_topic_options(
        {"zk": cluster.zk, "zkRoot": cluster.root, "topic": topic, "startingTime": str(at)}, streaming=True
    )
    r = TopicStreamReader(opts, TOPIC_SCHEMA)
    try:
        start = r.initialOffset()
        _send(cluster, topic, 3)
        time.sleep(max(0.0, at / 1000 + 0.05 - time.time()))
        _send(cluster, topic, 2)
        time.sleep(1.5)
        end = r.latestOffset(start, r.getDefaultReadLimit())
        rows = [
            x
            for p in r.partitions(start, end)
            for b in read_range(r.opts, p, TOPIC_SCHEMA)
            for x in b.to_pylist()
        ]
        assert [bytes(x["value"]) for x in rows] == [b"m0", b"m1"]
        assert all(x["__publishTime"].timestamp() * 1000 >= at for x in rows)
    finally:
        r.stop()
