"""The ledger source's tasks share their Python worker's client: a scan of many partitions opens a ZooKeeper
session per worker, not per partition (each session's start and close are ZooKeeper transactions)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from ledger_client import ClientConfig
from ledger_client.sync import BookKeeper
from zk.acl import resolve_auth

PW = b"secret"


@pytest.fixture
def zxid(bookies: Any) -> Iterator[Any]:
    """ZooKeeper's transaction id now: a probe znode's creation zxid (the probe itself is one transaction). With
    credentials in the environment (the container tier leaves some in this process) the bookies secure the root,
    so the probe authenticates as they do."""
    auth = resolve_auth()
    zk = KazooClient(hosts=bookies.zk, auth_data=[("digest", auth.credential)] if auth else None)
    zk.start(timeout=10)

    def now() -> int:
        path = zk.create(f"{bookies.root}/zxid-probe-", sequence=True, makepath=True)
        return int(zk.exists(path).czxid)

    yield now
    zk.stop()
    zk.close()


def test_a_scan_of_many_partitions_opens_no_zookeeper_session_per_partition(
    bookies: Any, spark: Any, zxid: Any
) -> None:
    from pyspark.sql import functions as F

    bookies.start_many(3)
    bk = BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    lh = bk.create_ledger(3, 2, 2, password=PW)
    data = [f"entry-{i}".encode() * 3 for i in range(240)]
    lh.append_many(data)
    lh.close()
    bk.close()
    df = (
        spark.read.format("ledger")
        .option("zk", bookies.zk)
        .option("zkRoot", bookies.root)
        .option("ledgers", str(lh.ledger_id))
        .option("password", PW.decode())
        .option("entriesPerPartition", 10)  # 24 partitions, 12 tasks in each of local[2]'s workers
        .load()
    )
    assert df.rdd.getNumPartitions() == 24

    transactions = []
    for _ in range(2):
        before = zxid()
        row = df.agg(F.count("*").alias("n"), F.sum(F.crc32("data")).alias("crc")).collect()[0]
        transactions.append(zxid() - before - 1)
        assert (row.n, row.crc) == (len(data), sum(map(zlib.crc32, data)))
    # The planning's own session (its start and close); each worker's first task of this cluster starts one
    # (and may close one of an earlier test's cluster). A session per task was 2 transactions each: 48, 48.
    assert transactions[0] <= 2 + 2 * 2, transactions
    assert transactions[1] <= 2, transactions


@pytest.mark.parametrize("reused", [True, False])
def test_a_task_keeps_its_client_only_in_a_worker_spark_reuses(
    bookies: Any, monkeypatch: pytest.MonkeyPatch, reused: bool
) -> None:
    """A worker Spark does not reuse (spark.python.worker.reuse false: the JVM sets no SPARK_REUSE_WORKER) ends
    after its task, so the task closes its client as before instead of leaving a ZooKeeper session to expire."""
    from pyspark import TaskContext

    from spark import ledger_source
    from spark.ledger_source import LEDGER_SCHEMA, LedgerRange, read_range
    from spark.options import parse_ledger_options

    bookies.start_many(3)
    bk = BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    lh = bk.create_ledger(3, 2, 2, password=PW)
    lh.append_many([b"x"] * 20)
    lh.close()
    bk.close()
    opts = parse_ledger_options(
        {"zk": bookies.zk, "zkroot": bookies.root, "ledgers": str(lh.ledger_id), "password": PW.decode()}
    )
    if reused:
        monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    else:
        monkeypatch.delenv("SPARK_REUSE_WORKER", raising=False)
    TaskContext._setTaskContext(TaskContext())  # as PySpark's worker does for each task
    try:
        rows = sum(
            b.num_rows for b in read_range(opts, LedgerRange(lh.ledger_id, 0, 19, "CLOSED", 0), LEDGER_SCHEMA)
        )
        assert rows == 20
        assert (ledger_source._worker_client is not None) == reused
    finally:
        TaskContext._setTaskContext(None)
        ledger_source._drop_worker_client()
