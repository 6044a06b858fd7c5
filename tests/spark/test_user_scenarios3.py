"""The Spark sources on a user's third day: odd data and many ledgers. A scan of many small ledgers
(``ledgers=all`` over thousands) spent most of its planning in the password check, a salted PBKDF2 of ~40 ms
per ledger, one ledger after the other, and each task hashed its ledgers' passwords once more. ``topic-volume``
over a topic without messages left it out of its table, and printed ``None`` where nothing was measured (the
cluster of ``test_user_scenarios`` for it)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import zk.ledger_metadata as ledger_metadata
from ledger_client import ClientConfig
from ledger_client.sync import BookKeeper
from tests.conftest import BookieFactory
from tests.spark import test_user_scenarios as users
from tests.spark.test_user_scenarios import Cluster

pytest.importorskip("pyspark")
cluster = (
    users.cluster
)  # the module's own cluster (ZooKeeper, 3 bookies, a broker), built as that module builds it


def test_planning_checks_the_passwords_on_threads_and_the_tasks_do_not_hash_them_again(
    bookies: BookieFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four closed ledgers of password ``pw``: planning hashes the password on at least two threads at once (a
    hash waits for a second one, up to 30 s), and reading every planned range in this process, its memo of
    checked passwords emptied as in a fresh executor, hashes nothing (before: planning hashed on the planning
    thread alone, and each range hashed its ledger's password again: 4 hashes)."""
    from spark.ledger_source import LEDGER_SCHEMA, plan_partitions, read_range
    from spark.options import parse_ledger_options

    bookies.start_many(3)
    bk = BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    ids = []
    try:
        for i in range(4):
            h = bk.create_ledger(password=b"pw")
            h.append_many([f"{i}-{j}".encode() * j for j in range(3)])  # sizes 0, 3, 6: odd ones too
            h.close()
            ids.append(h.ledger_id)
    finally:
        bk.close()
    opts = parse_ledger_options(
        {"zk": bookies.zk, "zkRoot": bookies.root, "password": "pw", "ledgers": ",".join(map(str, ids))}
    )
    real = ledger_metadata.hashlib.pbkdf2_hmac
    together = threading.Barrier(2, timeout=30)
    hashed_on: list[int] = []

    def pbkdf2(*args: Any) -> bytes:
        hashed_on.append(threading.get_ident())
        with contextlib.suppress(threading.BrokenBarrierError):
            together.wait()  # a second check runs meanwhile, or this waits 30 s and breaks the barrier
        return real(*args)

    monkeypatch.setattr(ledger_metadata, "_VERIFIED", {})
    monkeypatch.setattr(ledger_metadata.hashlib, "pbkdf2_hmac", pbkdf2)
    parts = plan_partitions(opts)
    assert len(hashed_on) == 4 and len(set(hashed_on)) >= 2, f"planning hashed on threads {hashed_on}"
    assert [p.ledger_id for p in parts] == ids

    ledger_metadata._VERIFIED.clear()  # a task's process, which has checked nothing
    hashed_on.clear()
    rows = [
        (p.ledger_id, bytes(d))
        for p in parts
        for b in read_range(opts, p, LEDGER_SCHEMA)
        for d in b.column("data").to_pylist()
    ]
    assert rows == [(lid, f"{i}-{j}".encode() * j) for i, lid in enumerate(ids) for j in range(3)]
    assert hashed_on == [], "the tasks hashed the password planning had checked"


def test_topic_volume_lists_a_named_topic_without_messages_and_prints_no_none(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    """``--topics keyless,empty``: 5 messages without keys or event times in one, none in the other. Both have a
    row (the empty one of zeros), the cells with nothing to measure print ``-``, the chart is drawn (before:
    the empty topic had no row and the lag cells read ``None``)."""
    from spark.jobs import JOBS, JobOptions

    client = cluster.client()
    try:
        p = client.create_producer("persistent://public/default/keyless", batching_enabled=False)
        for i in range(5):
            p.send(b"v" * (i + 1))
        client.create_producer("persistent://public/default/empty").close()
    finally:
        client.close()
    opts = JobOptions(zk=cluster.zk, zk_root=cluster.root, topics="keyless,empty", out_dir=tmp_path)
    deadline = time.monotonic() + 30
    while True:  # the explicit LAC brings the last message to the readers within about a second
        result = JOBS["topic-volume"].run(spark, opts)
        rows = {r["topic"]: r for r in result.tables[0].as_dicts()}
        keyless = rows.get("persistent://public/default/keyless", {})
        if keyless.get("messages") == 5 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert keyless["messages"] == 5 and keyless["keys"] == 0 and keyless["lag p50"] is None
    assert rows["persistent://public/default/empty"]["messages"] == 0, rows
    text = result.render()
    assert "None" not in text and result.tables[2].rows == []
    assert result.chart is not None and result.chart.stat().st_size > 1000


def test_the_demo_summary_falls_back_to_ledger_health_when_its_topic_is_empty(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    """The demo's summary over a topic without messages (its row of zeros is not a message) reports its ledger
    instead (with the row of zeros alone, it returned the empty topic's table)."""
    from spark.jobs import demo_summary

    client = cluster.client()
    try:
        client.create_producer("persistent://public/default/demo-empty").close()
    finally:
        client.close()
    bk = BookKeeper.connect(cluster.zk, config=ClientConfig(zk_root=cluster.root))
    try:
        h = bk.create_ledger(password=b"")
        h.append_many([b"e"] * 3)
        h.close()
    finally:
        bk.close()
    text = demo_summary(cluster.zk, cluster.root, tmp_path, topics=["demo-empty"], ledgers=[h.ledger_id])
    assert "no messages left in demo-empty" in text and "Entry replicas per bookie" in text


def test_a_job_against_a_spark_master_that_is_down_fails_at_once_in_one_line(tmp_path: Path) -> None:
    """``--master spark://…`` where nothing listens: exit 5 and one line naming the master, before a JVM starts
    (before: Spark tried for about a minute, printed pages of JVM traces, and ended with 'Cannot call methods
    on a stopped SparkContext')."""
    import subprocess
    import sys

    from ledgerstore.cluster import free_port

    master = f"spark://127.0.0.1:{free_port()}"
    r = subprocess.run(
        [sys.executable, "-m", "ledgerstore.cli", "spark", "entry-sizes", "--master", master],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert r.returncode == 5, r.stderr[-2000:]
    assert r.stderr.strip() == (
        f"ledgerstore: no Spark master answers at {master} ({master[8:]}: Connection refused): is it running? "
        "(--master or $LEDGERSTORE_SPARK_MASTER)"
    )
