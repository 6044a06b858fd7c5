"""The ``topic`` source as a user meets it on an afternoon: a wrong ``password`` fails at plan time naming the
option, and a partition named twice in ``topics`` is read once. One cluster (ZooKeeper, 3 bookies, one broker
whose managed ledgers have the empty password, ledgers of 20 entries) for the module, as in
``test_user_scenarios``."""

from __future__ import annotations

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
