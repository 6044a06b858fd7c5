"""What a Spark user's day found in the topic source: a stream's startingTime across a restart from its checkpoint.
The cluster of ``test_user_scenarios`` (ZooKeeper, 3 bookies, a broker rolling its ledgers every 20 entries); the
stream readers are driven directly, as Spark calls them, without a query."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.spark import test_user_scenarios as users
from tests.spark.test_user_scenarios import Cluster
from tests.spark.test_user_scenarios7 import _send

pytest.importorskip("pyspark")
pulsar = pytest.importorskip("pulsar")
cluster = users.cluster  # the module's own cluster, built as that module builds it


def _rows(r: Any, start: dict[str, Any], end: dict[str, Any]) -> list[bytes]:
    from spark.topic_source import TOPIC_SCHEMA, read_range

    return [
        bytes(x["value"])
        for p in r.partitions(start, end)
        for b in read_range(r.opts, p, TOPIC_SCHEMA)
        for x in b.to_pylist()
    ]


def test_a_restarted_stream_keeps_the_starting_time_it_began_with(cluster: Cluster) -> None:
    """A stream started with startingTime T reads 3 messages, commits and stops; 2 more are written; the query
    restarted from its checkpoint with startingTime moved an hour ahead, or removed, reads those 2: a starting
    option applies to a new query only (Kafka's and pulsar-spark's sources ignore it once a checkpoint has
    offsets), and the checkpoint's offsets keep T. Before, every restarted batch filtered by the option's time
    now: the hour-ahead restart read 0 of the 2, silently, and committed past them."""
    from spark._topic_options import parse_topic_options
    from spark.topic_source import TOPIC_SCHEMA, TopicStreamReader

    topic = "starting-time-restart"

    def reader(**more: str) -> TopicStreamReader:
        base = {"zk": cluster.zk, "zkRoot": cluster.root, "topic": topic}
        return TopicStreamReader(parse_topic_options({**base, **more}, streaming=True), TOPIC_SCHEMA)

    at = int(time.time() * 1000) - 1000
    _send(cluster, topic, 3)
    time.sleep(1.5)  # the explicit LAC
    r = reader(startingTime=str(at))
    try:
        start = r.initialOffset()
        assert start["startingTime"] == at
        end = r.latestOffset(start, r.getDefaultReadLimit())
        assert end["startingTime"] == at
        assert _rows(r, start, end) == [b"m0", b"m1", b"m2"]
        r.commit(end)
    finally:
        r.stop()
    _send(cluster, topic, 2)
    time.sleep(1.5)
    ahead = str(int(time.time() * 1000) + 3_600_000)
    for more in ({"startingTime": ahead}, {}):
        r = reader(**more)  # a restart: Spark hands the checkpoint's last end as the start
        try:
            nxt = r.latestOffset(end, r.getDefaultReadLimit())
            assert nxt["startingTime"] == at
            assert _rows(r, end, nxt) == [b"m0", b"m1"]
        finally:
            r.stop()


def test_a_stream_restarted_from_offsets_without_the_starting_time_filters_by_the_option_as_before(
    cluster: Cluster,
) -> None:
    """A stream started before 08e79b5 with startingTime an hour ahead logged offsets without "startingTime"; 2
    messages written meanwhile; restarted from that checkpoint with the same option: before 08e79b5 every batch
    filtered by the option (0 rows), 08e79b5 filtered nothing (both rows, published before the time). Such an
    offset filters by the option again; a new query started without startingTime keeps 0, so adding the option
    on its restart still filters nothing."""
    from spark._topic_options import parse_topic_options
    from spark.topic_source import TOPIC_SCHEMA, TopicStreamReader

    topic = "starting-time-old-checkpoint"

    def reader(**more: str) -> TopicStreamReader:
        base = {"zk": cluster.zk, "zkRoot": cluster.root, "topic": topic}
        return TopicStreamReader(parse_topic_options({**base, **more}, streaming=True), TOPIC_SCHEMA)

    _send(cluster, topic, 1)
    time.sleep(1.5)  # the explicit LAC
    ahead = str(int(time.time() * 1000) + 3_600_000)
    r, plain = reader(startingTime=ahead), reader()
    try:
        old = {k: v for k, v in r.initialOffset().items() if k != "startingTime"}  # as logged before 08e79b5
        start = plain.initialOffset()
        assert start["startingTime"] == 0
    finally:
        r.stop()
        plain.stop()
    _send(cluster, topic, 2)
    time.sleep(1.5)
    r = reader(startingTime=ahead)  # the restart, the same option
    try:
        nxt = r.latestOffset(old, r.getDefaultReadLimit())
        assert "startingTime" not in nxt
        assert _rows(r, old, nxt) == []
        nxt = r.latestOffset(start, r.getDefaultReadLimit())
        assert nxt["startingTime"] == 0
        assert _rows(r, start, nxt) == [b"m0", b"m1"]
    finally:
        r.stop()


def test_a_topic_read_with_two_of_three_bookies_down_names_the_topic_the_ledger_and_the_bookies(
    cluster: Cluster,
) -> None:
    """30 messages (a closed ledger of 20, the current one of 10, ensembles of 3 bookies writing 2 copies), 2 of the
    3 bookies stopped: the batch plan fails naming the topic, the current ledger and its 3 bookies, the 2 stopped
    ones as not registered; a task reading the closed ledger (planned before the stop) says the same of it.
    Before, the plan failed with the ledger client's '[BOOKIE_UNAVAILABLE] not enough bookies answered to learn
    the LAC (ledger=2)', naming neither the topic nor a bookie, and the task with 'entry 2 unreadable from every
    replica: <2 bookies>: BOOKIE_UNAVAILABLE (ledger=1, entry=2)', not naming the topic."""
    from spark._topic_options import parse_topic_options
    from spark.topic_source import TOPIC_SCHEMA, TopicReader, read_range

    topic = "two-bookies-down"
    _send(cluster, topic, 30)
    time.sleep(1.5)  # the explicit LAC
    opts = parse_topic_options({"zk": cluster.zk, "zkRoot": cluster.root, "topic": topic}, streaming=False)
    ranges = TopicReader(opts, TOPIC_SCHEMA).partitions()
    closed, current = ranges[0], ranges[-1]
    assert (closed.first_entry_id, closed.last_entry_id) == (0, 19) and current.ledger_id != closed.ledger_id
    down = cluster.bookies.procs[:2]
    for bp in down:
        bp.stop()
    try:
        with pytest.raises(Exception) as planned:
            TopicReader(opts, TOPIC_SCHEMA).partitions()
        with pytest.raises(Exception) as read:
            for _ in read_range(opts, closed, TOPIC_SCHEMA):
                pass
    finally:
        for bp in down:
            bp.start(wait=True)
    for err, ledger in ((planned, current.ledger_id), (read, closed.ledger_id)):
        text = str(err.value)
        assert f"persistent://public/default/{topic}: ledger {ledger} could not be read" in text, text
        assert "bookies tried: " in text and "2 of 3 not registered" in text, text
        for bp in down:
            assert f"{bp.id} (not registered)" in text, text


def test_a_ledger_read_with_two_of_three_bookies_down_names_the_bookies(cluster: Cluster) -> None:
    """The ledger source, the same fault: an open ledger and a closed one (3 bookies, 2 copies of each entry), 2
    bookies stopped: the plan of the open one and a task over the closed one (planned before the stop) each name
    the ledger and the bookies tried, the 2 stopped ones as not registered. Before, the plan said 'ledger N: cannot
    learn how far to read: [BOOKIE_UNAVAILABLE] not enough bookies answered to learn the LAC' and no bookie, and
    the task gave the client's bare error."""
    from ledger_client import ClientConfig
    from ledger_client.sync import BookKeeper
    from spark.ledger_source import LEDGER_SCHEMA, LedgerRange, LedgerReader, read_range
    from spark.options import parse_ledger_options

    client = BookKeeper.connect(cluster.zk, config=ClientConfig(zk_root=cluster.root))
    try:
        closed = client.create_ledger(3, 2, 2, password=b"pw")
        live = client.create_ledger(3, 2, 2, password=b"pw")
        for lh in (closed, live):
            lh.append_many([b"e%d" % i for i in range(12)])
        closed.close()

        def opts(ledgers: int) -> Any:
            return parse_ledger_options(
                {"zk": cluster.zk, "zkRoot": cluster.root, "ledgers": str(ledgers), "password": "pw"}
            )

        ranges = [r for r in LedgerReader(opts(closed.ledger_id), LEDGER_SCHEMA).partitions()]
        assert [type(r) for r in ranges] == [LedgerRange]
        down = cluster.bookies.procs[:2]
        for bp in down:
            bp.stop()
        try:
            with pytest.raises(Exception) as planned:
                LedgerReader(opts(live.ledger_id), LEDGER_SCHEMA).partitions()
            with pytest.raises(Exception) as read:
                for _ in read_range(opts(closed.ledger_id), ranges[0], LEDGER_SCHEMA):
                    pass
        finally:
            for bp in down:
                bp.start(wait=True)
        live.close()
    finally:
        client.close()
    for err, ledger in ((planned, live.ledger_id), (read, closed.ledger_id)):
        text = str(err.value)
        assert re.search(rf"\bledger {ledger}\b", text) and "bookies tried: " in text, text
        assert "2 of 3 not registered" in text, text
        for bp in down:
            assert f"{bp.id} (not registered)" in text, text
