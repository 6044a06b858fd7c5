"""The Spark sources' leftovers after their fifth day, and what a Spark user's day on a cluster with faults
found. The cluster of ``test_user_scenarios`` (ZooKeeper, 3 bookies, a broker rolling its ledgers every 20
entries, infinite retention); the tests drive the stream reader directly, without a query (Spark tests are
slow), as Spark calls it."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.spark import test_user_scenarios as users
from tests.spark.test_user_scenarios import Cluster
from tests.spark.test_user_scenarios5 import _cursors, _options, store

pytest.importorskip("pyspark")
cluster = users.cluster  # the module's own cluster, built as that module builds it
__all__ = ["store"]  # the fixture, used by name


def _reader(cluster: Cluster, topic: str, **more: str) -> Any:
    from spark.topic_source import TOPIC_SCHEMA, TopicStreamReader

    return TopicStreamReader(_options(cluster, topic, **more), TOPIC_SCHEMA)


def test_a_partition_empty_at_the_start_gets_the_subscription_there_too(cluster: Cluster, store: Any) -> None:
    """A 2-partition topic whose partition 1 has no entry (no ledger) when a new stream starts: the
    subscription is made on it too, at (-1, -1), before every ledger it will have, and the broker counts what
    is written there as its backlog (before: partition 1 got it only at the first commit, and retention could
    trim what was written there meanwhile)."""
    base = "empty-at-start"
    cluster.admin("PUT", f"/admin/v2/persistent/public/default/{base}/partitions", 2)
    users.produce(cluster, f"{base}-partition-0", 5, batching_enabled=False)
    time.sleep(1.5)  # the explicit LAC
    r = _reader(cluster, base)
    try:
        r.initialOffset()
        (sub,) = _cursors(store, f"{base}-partition-0")
        assert _cursors(store, f"{base}-partition-1")[sub].mark_delete == (-1, -1)
        users.produce(cluster, f"{base}-partition-1", 3, batching_enabled=False)
        stats = json.loads(
            cluster.admin("GET", f"/admin/v2/persistent/public/default/{base}-partition-1/stats")
        )
        assert stats["subscriptions"][sub]["msgBacklog"] == 3, stats["subscriptions"]
    finally:
        r.stop()


def test_a_name_latest_offset_gave_stays_when_the_stream_stops_before_planning_it(
    cluster: Cluster, store: Any
) -> None:
    """Spark logs batch 0's end (naming the new subscription) as soon as latestOffset gives it, and plans the
    batch after: a query stopped in between keeps its name (before: stop() deleted the subscription the
    checkpoint names). The restart, asked for an initial offset again to re-run that batch 0, makes another
    new name, which is deleted as soon as the logged batch shows it is not the query's (before: it held
    retention at the start until the query stopped)."""
    local = "logged-not-planned"
    users.produce(cluster, local, 5, batching_enabled=False)
    time.sleep(1.5)
    r = _reader(cluster, local)
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    r.stop()
    logged = end["subscription"]
    assert list(_cursors(store, local)) == [logged]
    again = _reader(cluster, local)
    try:
        restart = again.initialOffset()
        assert len(_cursors(store, local)) == 2
        assert len(again.partitions(restart, end)) == 1
        assert list(_cursors(store, local)) == [logged]
    finally:
        again.stop()
    assert list(_cursors(store, local)) == [logged]


def test_a_named_subscription_the_partition_update_copied_to_a_new_partition_is_the_querys(
    cluster: Cluster, store: Any
) -> None:
    """A stream with ``subscriptionName`` over a partitioned topic that grows: the partition update makes the
    topic's subscriptions on the new partition (at its start, without their properties, as Pulsar's does), and
    the query takes that copy of its own subscription as its own and moves it (before: its next trigger failed,
    'subscription ... of <topic>-partition-2 exists and was not created by a Spark topic query', and the query
    stopped for good)."""
    from spark.topic_source import SPARK_CURSOR_PROPERTY

    base = "grown-named"
    cluster.admin("PUT", f"/admin/v2/persistent/public/default/{base}/partitions", 2)
    r = _reader(cluster, base, subscriptionName="named-query")
    try:
        start = r.initialOffset()
        cluster.admin("POST", f"/admin/v2/persistent/public/default/{base}/partitions", 3)
        users.produce(cluster, f"{base}-partition-2", 4, batching_enabled=False)
        time.sleep(1.5)
        end = r.latestOffset(start, r.getDefaultReadLimit())
        new = f"persistent://public/default/{base}-partition-2"
        assert sum(t.last_entry_id - t.first_entry_id + 1 for t in r.partitions(start, end)) == 4
        r.commit(end)
    finally:
        r.stop()
    from zk import layout
    from zk.managed_ledgers import CursorInfo

    v = store.get_optional(
        layout.ml_cursor_path(f"public/default/persistent/{base}-partition-2", "named-query")
    )
    cursor = CursorInfo.from_json(v.value)
    assert SPARK_CURSOR_PROPERTY in cursor.properties and cursor.mark_delete == (end[new][0], end[new][1] - 1)


def test_a_new_stream_starting_in_a_trimmed_ledger_is_a_data_loss(cluster: Cluster, store: Any) -> None:
    """``startingOffsets`` JSON naming a position in a ledger that is gone (the topic truncated, as retention
    trims) fails a new stream at its start with failOnDataLoss true, as a batch read fails; false starts at the
    next ledger. Before, the subscription the stream makes at its start vouched at its first batch that the
    ledger had ended there, and an AvailableNow run read nothing and finished without a word."""
    from spark.topic_source import TopicDataLossError

    local = "trimmed-start"
    users.produce(cluster, local, 45, batching_enabled=False)
    time.sleep(1.5)
    stats = json.loads(cluster.admin("GET", f"/admin/v2/persistent/public/default/{local}/internalStats"))
    first = stats["ledgers"][0]["ledgerId"]
    cluster.admin("DELETE", f"/admin/v2/persistent/public/default/{local}/truncate")
    start = json.dumps({f"persistent://public/default/{local}": [first, 10]})
    r = _reader(cluster, local, startingOffsets=start)
    try:
        with pytest.raises(
            TopicDataLossError, match=f"ledger {first} was deleted before entry 10 on was read"
        ):
            r.initialOffset()
    finally:
        r.stop()
    r = _reader(cluster, local, startingOffsets=start, failOnDataLoss="false")
    try:
        (pos,) = [p for k, p in r.initialOffset().items() if k not in ("subscription", "startingTime")]
        assert pos[0] > first and pos[1] == 0, pos
    finally:
        r.stop()


def test_spark_asking_again_for_the_initial_offset_gets_the_same_start(cluster: Cluster, store: Any) -> None:
    """Spark asks for a new query's initial offset when it chooses batch 0's end and again when it runs the
    batch (its start): with startingOffsets=latest the second answer was the newer latest, and batch 0 read
    nothing of what was written between the two (here 3 messages, its whole range), the subscription moved
    past them too."""
    local = "latest-asked-twice"
    users.produce(cluster, local, 5, batching_enabled=False)
    time.sleep(1.5)
    r = _reader(cluster, local, startingOffsets="latest")
    try:
        first = r.initialOffset()
        users.produce(cluster, local, 3, batching_enabled=False)
        time.sleep(1.5)
        end = r.latestOffset(first, r.getDefaultReadLimit())
        again = r.initialOffset()
        assert again == first
        assert sum(t.last_entry_id - t.first_entry_id + 1 for t in r.partitions(again, end)) == 3
    finally:
        r.stop()


def _batch_0_logged_then_stopped(cluster: Cluster, local: str, **more: str) -> tuple[Any, Any]:
    """A stream from latest over 5 messages, 3 more written, batch 0's end logged (latestOffset), the stream
    stopped before the batch committed, 2 more written; then a new reader (``more`` its options) and the first
    run's start and logged end."""
    users.produce(cluster, local, 5, batching_enabled=False)
    time.sleep(1.5)
    r = _reader(cluster, local, startingOffsets="latest", **more)
    start = r.initialOffset()
    users.produce(cluster, local, 3, batching_enabled=False)
    time.sleep(1.5)
    end = r.latestOffset(start, r.getDefaultReadLimit())
    r.stop()
    users.produce(cluster, local, 2, batching_enabled=False)
    time.sleep(1.5)
    return _reader(cluster, local, startingOffsets="latest", **more), (start, end)


def test_a_restart_running_a_logged_batch_0_from_latest_starts_where_the_first_run_did(
    cluster: Cluster, store: Any
) -> None:
    """startingOffsets=latest, the query stopped after Spark logged batch 0's end (latestOffset) and before it
    committed the batch: the restart runs batch 0 again and asks for an initial offset again, a newer latest.
    The batch starts where the first run's subscription was made (its start) and covers the 3 messages written
    before the logged end (before: it started at the newer latest, past that end, 2 messages later, and
    covered nothing)."""
    local = "latest-restarted-before-commit"
    again, (start, end) = _batch_0_logged_then_stopped(cluster, local)
    try:
        restart = again.initialOffset()
        assert restart != start
        ranges = again.partitions(restart, end)
        assert [(t.ledger_id, t.first_entry_id, t.last_entry_id) for t in ranges] == [
            (start[f"persistent://public/default/{local}"][0], 5, 7)
        ]
        assert list(_cursors(store, local)) == [end["subscription"]]
    finally:
        again.stop()


def test_a_restart_running_a_logged_batch_0_of_a_named_subscription_starts_where_the_first_run_did(
    cluster: Cluster, store: Any
) -> None:
    """The same restart with ``subscriptionName``: the named subscription was made at the first run's start,
    and the restart's initial offset moves it to the newer latest; batch 0 is planned from where it stood
    before (the 3 messages before the logged end; before: from the newer latest, nothing). A batch 0 of the
    restart's own (an end its latestOffset gave) starts at its own initial offset, as a new query's does."""
    local = "named-latest-restarted-before-commit"
    again, (start, end) = _batch_0_logged_then_stopped(cluster, local, subscriptionName="etl-restarted")
    ledger = start[f"persistent://public/default/{local}"][0]
    try:
        restart = again.initialOffset()
        assert restart != start
        ranges = again.partitions(restart, end)
        assert [(t.ledger_id, t.first_entry_id, t.last_entry_id) for t in ranges] == [(ledger, 5, 7)]
        users.produce(cluster, local, 1, batching_enabled=False)
        time.sleep(1.5)
        own = again.latestOffset(restart, again.getDefaultReadLimit())
        ranges = again.partitions(restart, own)
        assert [(t.ledger_id, t.first_entry_id, t.last_entry_id) for t in ranges] == [(ledger, 10, 10)]
    finally:
        again.stop()
