"""The ``topic`` source as a user meets it on an afternoon: a wrong ``password`` fails at plan time naming the
option, a partition named twice in ``topics`` is read once, and a compacted topic reads as before. One cluster
(ZooKeeper, 3 bookies, one broker whose managed ledgers have the empty password, ledgers of 20 entries) for the
module, as in ``test_user_scenarios``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark import test_user_scenarios as users
from tests.spark.test_user_scenarios import Cluster, produce

pulsar = pytest.importorskip("pulsar")
cluster = users.cluster  # the module's own cluster, built as that module builds it


def test_a_wrong_password_fails_at_plan_time_naming_the_option(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    """Closed ledgers and the open one alike: the batch read fails when it plans (before any task runs), and so
    does a stream when it starts; each names option 'password' and the ledger."""
    from pyspark.errors import StreamingQueryException

    topic = "persistent://public/default/pw"
    produce(cluster, topic, 30)  # ledgers of 20 entries: one closed, one open
    time.sleep(1.5)
    rows = cluster.read(spark, topic=topic).collect()
    ledgers = sorted({r["__ledgerId"] for r in rows})
    assert len(rows) == 30 and len(ledgers) == 2
    named = f"option 'password': wrong password for ledger {ledgers[0]} of {topic}"  # the closed one
    with pytest.raises(Exception, match=named):
        cluster.read(spark, topic=topic, password="secret").collect()
    with pytest.raises(StreamingQueryException, match=named):
        cluster.available_now(spark, tmp_path, topic=topic, password="secret")


def test_a_partition_named_twice_is_read_once(cluster: Cluster, spark: Any) -> None:
    """``topics`` naming a partitioned topic and one of its partitions (or one partition twice under two
    spellings) reads each partition once: it read partition 1 twice, every one of its messages a duplicate row."""
    base = "twice"
    topic = f"persistent://public/default/{base}"
    cluster.admin("PUT", f"/admin/v2/persistent/public/default/{base}/partitions", 2)
    produce(cluster, topic, 40)
    time.sleep(1.5)  # the explicit LAC
    for topics in (f"{base},{base}-partition-1", f"{base}-partition-1,{topic}-partition-1,{base}"):
        rows = cluster.read(spark, topics=topics).select("__messageId", "__partition").collect()
        assert len(rows) == 40 and len({bytes(r["__messageId"]) for r in rows}) == 40, topics
        assert {r["__partition"] for r in rows} == {0, 1}


def test_a_compacted_topic_reads_its_ledgers_as_they_are(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    """After ``topic compact``, the batch read and a stream resumed from its checkpoint read the topic's own
    ledgers (every message, none from the compacted ledger) beside the ``__compaction`` cursor, which they leave
    where the compactor put it."""
    path = "/admin/v2/persistent/public/default/compacted"
    topic = "persistent://public/default/compacted"
    produce(
        cluster, topic, 30, batching_enabled=True, batching_max_messages=4, batching_max_publish_delay_ms=20
    )
    time.sleep(1.5)  # the explicit LAC
    assert cluster.available_now(spark, tmp_path, topic=topic) == 30
    cluster.admin("PUT", path + "/compaction")
    deadline = time.monotonic() + 60
    while (status := json.loads(cluster.admin("GET", path + "/compaction"))["status"]) == "RUNNING":
        assert time.monotonic() < deadline, "compaction still running"
        time.sleep(0.3)
    assert status == "SUCCESS"
    before = json.loads(cluster.admin("GET", path + "/internalStats"))
    compacted = before["compactedLedger"]["ledgerId"]
    produce(cluster, topic, 10)
    time.sleep(1.5)
    assert cluster.available_now(spark, tmp_path, topic=topic) == 10
    rows = cluster.read(spark, topic=topic).select("__messageId", "__ledgerId").collect()
    assert len(rows) == 40 and len({bytes(r["__messageId"]) for r in rows}) == 40
    assert compacted not in {r["__ledgerId"] for r in rows}
    assert spark.read.parquet(str(tmp_path / "out")).count() == 40
    after = json.loads(cluster.admin("GET", path + "/internalStats"))
    assert (
        after["cursors"]["__compaction"]["markDeletePosition"]
        == (before["cursors"]["__compaction"]["markDeletePosition"])
    )
