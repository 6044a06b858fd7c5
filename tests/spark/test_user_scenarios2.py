"""The Spark sources on a user's second day: a stream's subscription that the message TTL (or an operator's skip)
moved past what the query had read, and the broker then trimmed, is a loss ``failOnDataLoss`` reports, and a
topic deleted and made again under a stopped stream is named with the subscription that went with it; an end at
or before the start, or a time in seconds, is refused naming the option; a job's refusal names its flags; a job
on a Spark cluster reads a secured cluster with the command's credentials. One cluster (ZooKeeper, 3 bookies, one
broker, ledgers of 20 entries) for the module, as in ``test_user_scenarios``, and the secured one of
``test_secured_cluster``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark import test_jobs_cli_errors as jobs_cli
from tests.spark import test_secured_cluster as secured_cluster
from tests.spark import test_standalone_cluster as standalone_cluster
from tests.spark import test_user_scenarios as users
from tests.spark.test_secured_cluster import Secured
from tests.spark.test_standalone_cluster import StandaloneCluster
from tests.spark.test_user_scenarios import Cluster

pulsar = pytest.importorskip("pulsar")
cluster = users.cluster  # the module's own cluster, built as that module builds it
secured = (
    secured_cluster.secured
)  # a cluster with token-checking bookies and ZooKeeper ACLs, as that module's
standalone = standalone_cluster.standalone  # a Spark master and worker from the pyspark install


def test_a_stream_whose_subscription_the_ttl_moved_past_unread_ledgers_fails_on_the_loss(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    """The stream reads 10 messages and stops; 45 more come (three ledgers in all), then every subscription's
    messages expire (``expire-messages-all-subscriptions``, what a namespace's message TTL does each check)
    and retention 0 trims the ledgers the stream never read. The restart fails naming the ledger its
    checkpoint stands in (it read the 15 messages left and lost 30 silently: the check took the subscription's
    position, which the TTL had moved, for the query's own), until ``failOnDataLoss`` is false."""
    from pyspark.errors import StreamingQueryException

    cluster.admin("PUT", "/admin/v2/tenants/ttl", {"allowedClusters": ["ledgerstore"], "adminRoles": []})
    cluster.admin("PUT", "/admin/v2/namespaces/ttl/ns", {})
    topic = "persistent://ttl/ns/t"
    client = cluster.client()
    try:
        p = client.create_producer(topic, batching_enabled=False)
        for i in range(10):
            p.send(f"a{i}".encode())
        time.sleep(1.5)  # the explicit LAC: the stream's first run sees all 10

        def run(**options: str) -> int:
            return cluster.available_now(
                spark, tmp_path, topic=topic, subscriptionName="spark-ttl", **options
            )

        assert run() == 10
        first = json.loads(cluster.admin("GET", "/admin/v2/persistent/ttl/ns/t/internalStats"))["ledgers"]
        assert len(first) == 1
        for i in range(45):
            p.send(f"b{i}".encode())
        time.sleep(1.5)  # every message published over a second ago
        moved = cluster.admin("POST", "/admin/v2/persistent/ttl/ns/t/all_subscription/expireMessages/1")
        assert moved is not None
        left = cluster.wait_trimmed("ttl/ns/t", first[0]["ledgerId"] + 1)
        assert len(left) == 1 and left[0][0] > first[0]["ledgerId"], f"the broker trimmed: {left}"
        with pytest.raises(StreamingQueryException, match=f"ledger {first[0]['ledgerId']} was deleted"):
            run()
        assert run(failOnDataLoss="false") == 15
    finally:
        client.close()


def test_an_end_at_or_before_the_start_fails_when_the_dataframe_is_defined(
    cluster: Cluster, spark: Any
) -> None:
    """``endingTime`` not after ``startingTime`` (the two swapped), or an ``endingOffsets`` position at or before
    the partition's ``startingOffsets`` one, reads nothing: refused naming the option, as ``endingOffsets``
    'earliest' is (both gave an empty DataFrame without a word)."""
    topic = "persistent://public/default/ends"
    ids = users.produce(cluster, topic, 10, batching_enabled=False)
    time.sleep(1.5)  # the explicit LAC
    t0, t1 = ids[2][0], ids[7][0]
    first = [t0.ledger_id(), t0.entry_id()]
    assert cluster.read(spark, topic=topic, startingOffsets=json.dumps({topic: first})).count() == 8
    publish = sorted(users.ms(r["__publishTime"]) for r in cluster.read(spark, topic=topic).collect())
    with pytest.raises(Exception, match=f"option 'endingTime': {publish[0]} is not after startingTime"):
        cluster.read(spark, topic=topic, startingTime=str(publish[-1]), endingTime=str(publish[0]))
    for end in ([t0.ledger_id(), t0.entry_id()], [t0.ledger_id(), 0]):
        with pytest.raises(
            Exception, match=f"option 'endingOffsets': {re.escape(str(end))} of {topic} is not"
        ):
            cluster.read(
                spark,
                topic=topic,
                startingOffsets=json.dumps({topic: first}),
                endingOffsets=json.dumps({topic: end}),
            )
    ending = json.dumps({topic: [t1.ledger_id(), t1.entry_id()]})
    assert (
        cluster.read(
            spark, topic=topic, startingOffsets=json.dumps({topic: first}), endingOffsets=ending
        ).count()
        == 5
    )


def test_a_job_over_ledgers_of_two_passwords_names_the_flag_that_selects_them(
    cluster: Cluster, tmp_path: Path
) -> None:
    """``ledgerstore spark ledger-health`` over a ledger of the empty password and one of another: the refusal
    speaks of the job's flags throughout; its advice said "select the ones it opens with option 'ledgers'", a
    source option no job has."""
    from ledger_client import ClientConfig
    from ledger_client.sync import BookKeeper

    bk = BookKeeper.connect(cluster.zk, config=ClientConfig(zk_root=cluster.root))
    try:
        ids = []
        for password in (b"", b"other"):
            lh = bk.create_ledger(3, 2, 2, password=password)
            lh.append_many([b"x" * 10] * 3)
            lh.close()
            ids.append(int(lh.ledger_id))
    finally:
        bk.close()
    r = jobs_cli.ledgerstore(
        cluster.bookies, "ledger-health", "--ledgers", f"{ids[0]},{ids[1]}", "--out", str(tmp_path)
    )
    assert r.returncode != 0
    assert f"option --password: wrong password for ledger {ids[1]}" in r.stderr, r.stderr[-2000:]
    assert "select the ones it opens with option --ledgers" in r.stderr, r.stderr[-2000:]


def test_a_job_on_a_spark_cluster_reads_a_secured_cluster_with_the_commands_credentials(
    secured: Secured, standalone: StandaloneCluster, tmp_path: Path
) -> None:
    """``ledgerstore spark topic-volume --master spark://… --auth-token-file FILE``, ZooKeeper's credentials in
    the command's environment (``LEDGERSTORE_ZK_AUTH_FILE``), against bookies with ``--auth-required`` and
    ZooKeeper ACLs: the executors, on a worker whose environment holds no credentials, read every message. The
    job set none of the sources' credential options, so only the driver had them: its plan passed and every
    task failed on the worker."""
    cmd = [
        sys.executable, "-m", "ledgerstore.cli", "spark", "topic-volume", "--topics", secured_cluster.BASE,
        "--master", standalone.url, "--zk", secured.bookies.zk, "--zk-root", secured.bookies.root,
        "--auth-token-file", secured.files["token"], "--out", str(tmp_path / "report"), "--json",
        "--conf", "spark.executor.memory=512m", "--conf", "spark.driver.memory=512m",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in secured_cluster.CREDENTIAL_VARS}
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        LEDGERSTORE_ZK_AUTH_FILE=secured.files["zk"],
    )
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    topics = json.loads(run.stdout)["tables"]["Topics (sizes in bytes, lag = publish - event time in ms)"]
    assert [r["messages"] for r in topics] == [secured_cluster.N]
    assert list((standalone.tmp / "work").glob("app-*/*/stderr")), "no executor ran on the worker"


def test_a_topic_deleted_and_created_again_under_a_stopped_stream_is_named_with_its_subscription(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    """A stream reads a topic to its end and stops; the topic is deleted (its subscriptions with it) and made
    again. The restart cannot tell whether the old ledger held more: it fails, saying the subscription that
    would vouch for what it read is gone and that such a topic lost nothing (it said only "was deleted before
    entry 10 on was read"); ``failOnDataLoss=false`` then reads the new topic from its start."""
    from pyspark.errors import StreamingQueryException

    topic = "persistent://public/default/again"
    users.produce(cluster, topic, 10, batching_enabled=False)
    time.sleep(1.5)  # the explicit LAC

    def run(**options: str) -> int:
        return cluster.available_now(spark, tmp_path, topic=topic, subscriptionName="spark-again", **options)

    assert run() == 10
    cluster.admin("DELETE", "/admin/v2/persistent/public/default/again?force=true")
    users.produce(cluster, topic, 4, batching_enabled=False)
    time.sleep(1.5)
    with pytest.raises(
        StreamingQueryException, match="subscription spark-again, which vouches for what it read, is gone"
    ):
        run()
    assert run(failOnDataLoss="false") == 4


def test_a_time_in_seconds_is_refused_naming_the_option(spark: Any) -> None:
    """``startingTime=1700000000`` (seconds, as ``date +%s`` gives) is a publish time of January 1970 in
    milliseconds: the read started at the earliest message and read everything, without a word. Refused when
    the DataFrame is defined, naming the option and the milliseconds meant; ``5`` and milliseconds stay valid."""

    def reader() -> Any:  # a DataFrameReader keeps every option set on it: a new one each time
        return spark.read.format("topic").option("zk", "127.0.0.1:1").option("topic", "t")

    for option in ("startingTime", "endingTime"):
        with pytest.raises(
            Exception, match=f"option '{option}': 1700000000 looks like seconds .* 1700000000000"
        ):
            reader().option(option, "1700000000").load()
    reader().option("startingTime", "5").option("endingTime", "1700000000000").load()  # defined, not run
