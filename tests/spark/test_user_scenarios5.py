"""The Spark sources' leftovers after their fourth day, one test each: the stream's subscription, its commits,
the topic source's password check, and the jobs' flags. The cluster of ``test_user_scenarios`` (ZooKeeper, 3
bookies, a broker rolling its ledgers every 20 entries); most tests drive the stream reader or its driver side
directly, without a query (Spark tests are slow)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spark import test_user_scenarios as users
from tests.spark.test_user_scenarios import Cluster

pytest.importorskip("pyspark")
cluster = users.cluster  # the module's own cluster, built as that module builds it

#: a port of this module's range where nothing listens (a Spark master that is down)
DOWN_PORT = 28001


@pytest.fixture
def store(cluster: Cluster) -> Iterator[Any]:
    from zk.client import MetadataStore

    s = MetadataStore.connect(cluster.zk, cluster.root)
    try:
        yield s
    finally:
        s.close()


def _ml(local: str) -> str:
    return f"public/default/persistent/{local}"


def _cursors(store: Any, local: str) -> dict[str, Any]:
    """The topic's Spark subscriptions as stored in ZooKeeper: name -> CursorInfo."""
    from zk import layout
    from zk.managed_ledgers import CursorInfo

    out: dict[str, Any] = {}
    try:
        names = store.children(layout.ml_cursors_path(_ml(local)))
    except Exception:  # noqa: BLE001 - no cursors znode: none
        return out
    for encoded in names:
        name = layout.decode_name(encoded)
        v = store.get_optional(layout.ml_cursor_path(_ml(local), name))
        if v is not None and name.startswith("spark-topic-"):
            out[name] = CursorInfo.from_json(v.value)
    return out


def _options(cluster: Cluster, local: str, **more: str) -> Any:
    from spark._topic_options import parse_topic_options

    return parse_topic_options(
        {"zk": cluster.zk, "zkRoot": cluster.root, "topic": local, "startingOffsets": "earliest", **more},
        streaming=True,
    )


def test_a_new_streams_subscription_exists_at_its_start_when_its_first_batch_reads(
    cluster: Cluster, spark: Any, store: Any, tmp_path: Path
) -> None:
    """The first batch (batch 0) of a new AvailableNow stream finds the query's subscription stored at the
    stream's start (everything it reads is backlog that retention keeps); before, the subscription was made
    at that batch's commit, after it had read (batch 0 saw none)."""
    local = "first-batch"
    users.produce(cluster, local, 10, batching_enabled=False)
    time.sleep(1.5)  # the explicit LAC
    seen: dict[int, dict[str, Any]] = {}
    q = (
        spark.readStream.format("topic")
        .option("zk", cluster.zk)
        .option("zkRoot", cluster.root)
        .options(topic=local, startingOffsets="earliest")
        .load()
        .writeStream.foreachBatch(
            lambda df, b: seen.setdefault(b, {**_cursors(store, local), "n": df.count()})
        )
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        q.awaitTermination(180)
    finally:
        q.stop()
    first = seen[0]
    assert first.pop("n") == 10
    (sub,) = first
    assert first[sub].mark_delete[1] == -1, first  # before the first entry of the first ledger
    assert _cursors(store, local)[sub].mark_delete == (first[sub].mark_delete[0], 9)


def test_a_new_name_no_logged_batch_named_is_deleted_when_the_stream_stops(
    cluster: Cluster, store: Any
) -> None:
    """A new query's subscription is made at its initial offset; stopped before Spark logged a batch naming
    it, the query leaves it behind no more (restarted, it would take another name); once a batch naming it is
    planned (logged in the checkpoint), it stays."""
    from spark.topic_source import TOPIC_SCHEMA, TopicStreamReader

    local = "unlogged"
    users.produce(cluster, local, 5, batching_enabled=False)
    time.sleep(1.5)
    r = TopicStreamReader(_options(cluster, local), TOPIC_SCHEMA)
    r.initialOffset()
    assert len(_cursors(store, local)) == 1
    r.stop()
    assert _cursors(store, local) == {}
    r = TopicStreamReader(_options(cluster, local), TOPIC_SCHEMA)
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert len(r.partitions(start, end)) == 1
    r.stop()
    assert list(_cursors(store, local)) == [end["subscription"]]


def test_a_commit_after_the_topic_was_deleted_makes_nothing_again(cluster: Cluster, store: Any) -> None:
    """The topic is deleted between a trigger's metadata read and its commit: the commit writes nothing
    (before: the cursor znode was created with its parents, the topic's managed-ledger znode among them,
    empty, where the topic then seemed to exist)."""
    from spark.topic_source import _Driver
    from zk import layout

    local = "gone-before-commit"
    users.produce(cluster, local, 5, batching_enabled=False)
    time.sleep(1.5)
    drv = _Driver(_options(cluster, local))
    try:
        drv.subscription = "spark-topic-0000000000000001"
        (part,) = drv.partitions()
        lid = drv.snapshot(part).earliest()[0]
        cluster.admin("DELETE", f"/admin/v2/persistent/public/default/{local}?force=true")
        assert not store.exists(layout.ml_info_path(part.ml_name))
        assert drv.commit(part, (lid, 2)) is False
        assert not store.exists(layout.ml_info_path(part.ml_name))
    finally:
        drv.close()


def test_a_commit_keeps_the_subscription_properties_the_admin_set(cluster: Cluster, store: Any) -> None:
    """Properties set on the query's subscription through the admin REST (``PUT …/subscription/{sub}/
    properties``) are still there after the query's next commit (before: the commit wrote the cursor without
    them)."""
    from spark.topic_source import _Driver

    local = "kept-properties"
    users.produce(cluster, local, 5, batching_enabled=False)
    time.sleep(1.5)
    sub = "spark-topic-0000000000000002"
    drv = _Driver(_options(cluster, local))
    try:
        drv.subscription = sub
        (part,) = drv.partitions()
        lid = drv.snapshot(part).earliest()[0]
        assert drv.commit(part, (lid, 1))
        path = f"/admin/v2/persistent/public/default/{local}/subscription/{sub}/properties"
        cluster.admin("PUT", path, {"owner": "billing"})
        assert _cursors(store, local)[sub].subscription_properties == {"owner": "billing"}
        assert drv.commit(part, (lid, 3))
    finally:
        drv.close()
    stored = _cursors(store, local)[sub]
    assert stored.mark_delete == (lid, 3) and stored.subscription_properties == {"owner": "billing"}


def test_planning_hashes_the_password_once_for_the_query_not_once_per_ledger(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic of several closed ledgers and an open one: planning checks the password against one ledger (a
    salted PBKDF2, about 40 ms each), and the client's open of the current ledger checks that one; before,
    every closed ledger of the chain was checked too (what the process remembers as checked counts them).
    A wrong password still fails naming the first ledger."""
    from spark._topic_options import TopicOptionError
    from spark.topic_source import _Driver
    from zk import ledger_metadata

    local = "many-ledgers"
    users.produce(cluster, local, 90, batching_enabled=False)
    time.sleep(1.5)
    monkeypatch.setattr(ledger_metadata, "_VERIFIED", {})
    drv = _Driver(_options(cluster, local))
    try:
        (part,) = drv.partitions()
        snap = drv.snapshot(part)
    finally:
        drv.close()
    closed = [s.ledger_id for s in snap.ledgers if s.closed]
    assert len(closed) >= 3 and not snap.ledgers[-1].closed, snap
    assert len(ledger_metadata._VERIFIED) == 2  # the first ledger's check and the open ledger's
    drv = _Driver(_options(cluster, local, password="secret"))
    try:
        with pytest.raises(TopicOptionError, match=f"wrong password for ledger {closed[0]} of "):
            drv.snapshot(drv.partitions()[0])
    finally:
        drv.close()


def test_bench_spark_against_a_spark_master_that_is_down_fails_at_once_in_one_line(tmp_path: Path) -> None:
    """``bench spark --master spark://…`` where nothing listens: exit 5 and one line naming the master, before
    it makes a cluster (before: it made and wrote one, then Spark tried the master for about a minute)."""
    master = f"spark://127.0.0.1:{DOWN_PORT}"
    argv = ["bench", "spark", "--size-mb", "1", "--runs", "1", "--master", master]
    r = subprocess.run(
        [sys.executable, "-m", "ledgerstore.cli", *argv],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    said = f"no Spark master answers at {master} (127.0.0.1:{DOWN_PORT}: Connection refused): is it running?"
    assert (r.returncode, r.stderr.splitlines()) == (5, [f"ledgerstore: {said} (--master)"]), r.stderr[-2000:]


def test_the_topic_jobs_take_crypto_failure_action() -> None:
    """``ledgerstore spark topic-volume --crypto-failure-action discard`` hands the topic source
    ``cryptoFailureAction=DISCARD`` (there was no way to give it); a wrong value is a usage error, and the
    source's advice names the flag."""
    from ledgerstore.cli import UsageError, build_parser
    from ledgerstore.spark_cmd import _in_flags, job_options
    from spark._topic_options import parse_topic_options

    parser = build_parser()
    args = parser.parse_args(["spark", "topic-volume", "--topics", "t", "--crypto-failure-action", "discard"])
    opts = job_options(args).topic_source_options()
    assert opts["cryptoFailureAction"] == "DISCARD"
    assert parse_topic_options(opts, streaming=False).crypto_failure_action == "DISCARD"
    default = job_options(parser.parse_args(["spark", "topic-volume", "--topics", "t"]))
    assert "cryptoFailureAction" not in default.topic_source_options()
    with pytest.raises(UsageError, match="--crypto-failure-action: invalid choice: 'DECRYPT'"):
        parser.parse_args(["spark", "topic-volume", "--crypto-failure-action", "decrypt"])
    line = (
        "CryptoFailureError: t: entry 5:0 is end-to-end encrypted (keys: k) and the topic source holds no keys "
        "to decrypt it: set option cryptoFailureAction=DISCARD to skip encrypted messages or CONSUME to read"
    )
    assert "give --crypto-failure-action DISCARD to skip" in _in_flags(line)
