"""The Spark sources on a user's fourth day: streams under faults and changes. Two streaming queries over one
topic with the same options and their own checkpoints shared one durable subscription (its default name hashed
the options), so each moved the other's; and a query restarted from its checkpoint with its topics changed moved
a new subscription, leaving the old one behind holding retention (the cluster of ``test_user_scenarios``)."""

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
