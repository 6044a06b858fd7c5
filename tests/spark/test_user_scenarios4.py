"""The Spark sources on a user's fourth day: streams under faults and changes. Two streaming queries over one
topic with the same options and their own checkpoints shared one durable subscription (its default name hashed
the options), so each moved the other's; and a query restarted from its checkpoint with its topics changed moved
a new subscription, leaving the old one behind holding retention. A topic deleted under a running stream failed
it as a mistyped option, whatever failOnDataLoss said (the cluster of ``test_user_scenarios``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark import test_user_scenarios as users
from tests.spark.test_user_scenarios import Cluster

pytest.importorskip("pyspark")
cluster = (
    users.cluster
)  # the module's own cluster (ZooKeeper, 3 bookies, a broker), built as that module builds it


def _backlogs(cluster: Cluster, local: str) -> dict[str, int]:
    """The topic's Spark subscriptions and their backlogs, as the broker's stats give them."""
    stats = json.loads(cluster.admin("GET", f"/admin/v2/persistent/public/default/{local}/stats"))
    return {n: s["msgBacklog"] for n, s in stats["subscriptions"].items() if n.startswith("spark-topic-")}


def test_two_queries_of_one_topic_move_their_own_subscriptions_and_a_changed_restart_keeps_its_own(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    """Queries A and B, the same options (default subscription name), their own checkpoints: A reads 30
    messages, 20 more come, B reads all 50. A's subscription still has the 20 as backlog and B's none (before:
    one subscription for both, B's commits moved A's past what A had not read, and retention could trim it
    unread). A restarted from its checkpoint with a second topic reads the 20 and that topic's 5 on the same
    subscription (before: a new one, the old one left with its backlog for good)."""
    users.produce(cluster, "twoq", 30, batching_enabled=False)
    users.produce(cluster, "twoq-more", 5, batching_enabled=False)
    time.sleep(1.5)  # the explicit LAC
    assert cluster.available_now(spark, tmp_path / "a", topic="twoq") == 30
    (a_sub,) = _backlogs(cluster, "twoq")
    users.produce(cluster, "twoq", 20, batching_enabled=False)
    time.sleep(1.5)
    assert cluster.available_now(spark, tmp_path / "b", topic="twoq") == 50
    subs = _backlogs(cluster, "twoq")
    assert len(subs) == 2 and subs[a_sub] == 20, subs
    assert cluster.available_now(spark, tmp_path / "a", topics="twoq,twoq-more") == 25
    assert _backlogs(cluster, "twoq") == dict.fromkeys(subs, 0)
    assert _backlogs(cluster, "twoq-more") == {a_sub: 0}


def test_a_topic_deleted_under_a_running_stream_fails_as_a_loss_or_is_skipped(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    """A ProcessingTime stream has read a topic's 10 messages when the topic is deleted. The stream failed with
    "topic source option 'topic': topic … does not exist", as if the query named a topic that never was, and so
    did one with failOnDataLoss=false. Now failOnDataLoss=true fails saying the topic was deleted while the query
    read it; false goes on and reads the topic made again from its start."""
    from pyspark.errors import StreamingQueryException

    for fail in ("true", "false"):
        local = f"gone-{fail}"
        users.produce(cluster, local, 10, batching_enabled=False)
        time.sleep(1.5)  # the explicit LAC
        got: list[bytes] = []
        q = (
            spark.readStream.format("topic")
            .option("zk", cluster.zk)
            .option("zkRoot", cluster.root)
            .options(topic=local, startingOffsets="earliest", failOnDataLoss=fail)
            .load()
            .writeStream.foreachBatch(
                lambda df, _b, got=got: got.extend(bytes(r["value"]) for r in df.collect())
            )
            .option("checkpointLocation", str(tmp_path / local))
            .trigger(processingTime="1 second")
            .start()
        )
        try:
            _wait(lambda got=got: len(got) == 10, "the first messages")
            cluster.admin("DELETE", f"/admin/v2/persistent/public/default/{local}?force=true")
            if fail == "true":
                with pytest.raises(
                    StreamingQueryException, match=f"{local}: was deleted while the query read it"
                ):
                    q.awaitTermination(120)
            else:
                time.sleep(3)  # a few triggers without the topic
                users.produce(cluster, local, 4, batching_enabled=False)
                _wait(lambda got=got: len(got) == 14, "the messages of the topic made again")
                assert q.isActive
        finally:
            q.stop()


def _wait(check: Any, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
