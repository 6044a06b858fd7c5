"""Tests for the bugs planted in the audit of 2026-11-29 against f2903da that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of the SEND checks, the producer-name liveness check, topic
stats, the admin's new routes and headers, and the Spark source's encryption and password hand-over"): each fails
with its bug planted and passes without it. The cluster of ``test_user_scenarios``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.spark import test_user_scenarios as users
from tests.spark.test_user_scenarios import Cluster

pytest.importorskip("pyspark")
cluster = users.cluster  # the module's own cluster (ZooKeeper, 3 bookies, a broker)


def test_topic_volume_over_named_topics_without_messages_says_there_are_none(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    """``--topics`` naming only a topic without messages: its row of zeros, and the note that the selected
    topics hold no messages (the rows of zeros are no messages)."""
    from spark.jobs import JOBS, JobOptions

    client = cluster.client()
    try:
        client.create_producer("persistent://public/default/planted8-empty").close()
    finally:
        client.close()
    opts = JobOptions(zk=cluster.zk, zk_root=cluster.root, topics="planted8-empty", out_dir=tmp_path)
    result = JOBS["topic-volume"].run(spark, opts)
    assert [r["messages"] for r in result.tables[0].as_dicts()] == [0]
    assert "no messages in the selected topics" in result.notes, result.notes
