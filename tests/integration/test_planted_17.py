"""Tests for the bugs planted in the audit of 1eb8e2e..ad7e892 (docs/architecture.md §11) that the tests of the
time let through: each fails with its bug planted and passes without it. Real ZooKeeper, bookies and brokers."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import zk
from ledger_client import ClientConfig
from tests.broker_testing import Brokers, swapped
from tests.integration.test_broker_admin import ok
from tests.integration.test_broker_gone_connection import _serving
from tests.integration.test_broker_pulsar_client import client
from tests.integration.test_one_cursor_per_subscription import _on_a_managed_ledger
from topic_broker.cursor import InitialPosition, ManagedCursor
from topic_broker.managed_ledger import Position

pulsar = pytest.importorskip("pulsar")


def test_an_open_whose_take_over_write_meets_another_writers_save_or_delete_reads_again(bookies: Any) -> None:
    """A stored cursor's open writes it once as it is (the take-over write, 6ece08c), at the version it read. A
    save of another writer (the previous owner's last one) between that read and the write makes the write
    conflict: the open reads again and takes that save over, rather than fencing the topic at the first
    conflict. A delete there (an unsubscribe) makes it fail as not found: the subscription is then created anew
    at its initial position, rather than the open failing. Planted: one try only (fenced), the not-found
    failure not caught (the open raised MetadataNotFoundError)."""

    async def body(store: Any, ml: Any, name: str, positions: list[Any]) -> None:
        for sub in ("moved", "deleted"):
            mc = await ManagedCursor.open(ml, sub, InitialPosition.EARLIEST)
            mc.ack_cumulative(positions[0])
            await mc.flush()
            ml.detach_cursor(sub)  # stored only, as a new owner finds it
        get = store.get_cursor
        meddled: list[str] = []

        async def another_writer_after_the_read(ml_name: str, sub: str) -> Any:
            stored = await get(ml_name, sub)
            if stored is not None and sub not in meddled:
                meddled.append(sub)
                if sub == "moved":  # the previous owner's last save
                    moved = replace(stored.value, mark_delete=tuple(positions[1]))
                    await store.save_cursor(ml_name, sub, moved, stored.version)
                else:
                    await store.delete_cursor(ml_name, sub)
            return stored

        with swapped(store, "get_cursor", another_writer_after_the_read):
            moved = await ManagedCursor.open(ml, "moved", InitialPosition.EARLIEST)
            fresh = await ManagedCursor.open(ml, "deleted", InitialPosition.EARLIEST)
        assert meddled == ["moved", "deleted"]
        assert not ml.fenced
        assert moved.mark_delete == positions[1]  # the other writer's save, taken over
        assert fresh.mark_delete == ml.first_position().previous()  # created anew at its initial position
        for mc, at in ((moved, positions[2]), (fresh, positions[0])):
            mc.ack_cumulative(at)
            await mc.flush()
            assert Position(*(await store.get_cursor(name, mc.name)).value.mark_delete) == at
        assert not ml.fenced

    _on_a_managed_ledger(bookies, body)


def test_an_open_after_a_lost_reply_delete_of_a_subscription_never_acknowledged_makes_a_fresh_cursor(
    bookies: Any,
) -> None:
    """The ghost-cursor rule (c20bda1) for a subscription created and deleted before any acknowledgement: its
    cursor was stored once, at version 0. An unsubscribe whose znode delete was applied with its reply lost left
    it attached; the next open must not answer it (each of its saves would fail, no znode: the acks kept only in
    memory). Planted: a ghost recognised only past version 0."""

    async def body(store: Any, ml: Any, name: str, positions: list[Any]) -> None:
        ghost = await ManagedCursor.open(ml, "s", InitialPosition.EARLIEST)
        assert ghost._version == 0  # created, never saved again
        delete = store.delete_cursor

        async def applied_reply_lost(*args: Any) -> None:
            await delete(*args)
            raise zk.MetadataConnectionError("ZooKeeper did not answer within 10s")

        with swapped(store, "delete_cursor", applied_reply_lost), pytest.raises(zk.MetadataConnectionError):
            await ghost.delete()
        fresh = await ManagedCursor.open(ml, "s", InitialPosition.EARLIEST)
        assert fresh is not ghost and ml.cursors["s"] is fresh
        fresh.ack_cumulative(positions[1])
        await fresh.flush()
        assert Position(*(await store.get_cursor(name, "s")).value.mark_delete) == positions[1]

    _on_a_managed_ledger(bookies, body)


def test_servers_given_the_previous_secret_take_its_tokens_during_a_rotation(
    bookies: Any, tmp_path: Path
) -> None:
    """A rotation's rolling restart (docs/operations.md, 'Rotating the secret'): bookies and a broker restarted
    with --auth-secret-file NEW --auth-previous-secret-file OLD, and --auth-required, take the tokens handed out
    before: the broker's own for the bookies (it writes its ledgers with it) and a client's. Planted: the bookie's
    or the broker's previous secret dropped (the broker's ledgers refused by the bookies, the client refused)."""
    from bookie.auth import create_token, new_secret
    from tests.broker_testing import produce_consume, start_broker
    from tests.integration.test_broker_auth import _write_secret

    old, new = new_secret(), new_secret()
    old_file, new_file = _write_secret(tmp_path / "old", old), _write_secret(tmp_path / "new", new)
    rotating = ("--auth-secret-file", str(new_file), "--auth-previous-secret-file", str(old_file))
    bookies.start_many(3, *rotating, "--auth-required")
    broker_token = tmp_path / "broker.token"
    broker_token.write_text(create_token(old, "broker"))  # handed out before the rotation
    bp = start_broker(
        bookies,
        tmp_path,
        4,
        *rotating,
        "--auth-required",
        "--superuser-roles",
        "admin",
        "--bookie-auth-token-file",
        str(broker_token),
    )
    try:
        bp.wait_ready(60)
        for secret in (old, new):
            client = pulsar.Client(
                bp.service_url,
                authentication=pulsar.AuthenticationToken(create_token(secret, "admin")),
                operation_timeout_seconds=10,
            )
            try:
                topic = f"persistent://public/default/rotation-{uuid.uuid4().hex[:8]}"
                assert produce_consume(client, topic) == [f"m-{i}".encode() for i in range(5)]
            finally:
                client.close()
    finally:
        bp.stop()


def test_a_terminated_topics_last_ledger_stays_through_a_truncate(cluster: Brokers) -> None:
    """The terminated ledger's rule (c36de49) in the trim itself, not only in the check whether retention could
    let a ledger go: a truncate (pulsar-admin topics truncate) trims without that check, and took the ledger of
    the terminated position with it, where Pulsar's truncate keeps its current ledger, which is that one: a
    reader from the earliest then read nothing. Planted: the rule dropped from ManagedLedger.trim."""
    bp = cluster.start()
    t = f"term-{uuid.uuid4().hex[:8]}"
    full = f"persistent://public/default/{t}"
    with contextlib.closing(client(bp)) as c:
        producer = c.create_producer(full, batching_enabled=False)
        for i in range(3):
            producer.send(f"m-{i}".encode())
        last = ok(bp, "POST", f"/admin/v2/persistent/public/default/{t}/terminate")
        ok(bp, "DELETE", f"/admin/v2/persistent/public/default/{t}/truncate")
        ledgers = [
            li["ledgerId"]
            for li in ok(bp, "GET", f"/admin/v2/persistent/public/default/{t}/internalStats")["ledgers"]
        ]
        assert last["ledgerId"] in ledgers
        reader = c.create_reader(full, pulsar.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(timeout_millis=10_000).data())
        assert got == [f"m-{i}".encode() for i in range(3)]


def test_a_topic_named_at_a_partitioned_topics_count_is_counted(zk_store: Any) -> None:
    """``maxTopicsPerNamespace`` 2 with partitioned topic x of 1 partition: ``x-partition-1`` (the index equal to
    the count, the first past it) is a topic of its own, counted; then ``x-partition-2`` is refused. Planted:
    ``count_topics`` counting only indexes over the count (x-partition-1 left out, x-partition-2 made: 3 topics)."""
    from zk.managed_ledgers import BrokerMetadataStore, ManagedLedgerInfo, NamespacePolicies, TopicsLimitError

    meta = BrokerMetadataStore(zk_store, namespaces=True)

    async def run() -> None:
        await meta.set_policies("public", "edge", NamespacePolicies(max_topics_per_namespace=2))
        await meta.create_partitioned_topic("public/edge/persistent/x", 1)
        await meta.create_ml_info("public/edge/persistent/x-partition-1", ManagedLedgerInfo())
        assert await meta.count_topics("public", "edge") == 2
        with pytest.raises(TopicsLimitError):
            await meta.create_ml_info("public/edge/persistent/x-partition-2", ManagedLedgerInfo())
        assert await meta.get_ml_info("public/edge/persistent/x-partition-2") is None

    asyncio.run(run())


def test_max_subscriptions_per_topic_counts_the_readers_served(cluster: Brokers) -> None:
    """``maxSubscriptionsPerTopic`` 2 counts the readers' (non-durable) subscriptions being served beside the
    stored cursors, as Pulsar's count of the topic's subscriptions: with a reader and subscription a, b is
    refused NotAllowedError; the reader closed, b is made. Planted: the stored cursors alone counted."""
    bp = cluster.start()
    ns = f"subs-{uuid.uuid4().hex[:8]}"
    ok(bp, "PUT", f"/admin/v2/namespaces/public/{ns}")
    ok(bp, "POST", f"/admin/v2/namespaces/public/{ns}/maxSubscriptionsPerTopic", 2)
    full = f"persistent://public/{ns}/t"
    with contextlib.closing(client(bp)) as c:
        c.create_producer(full).send(b"m")
        reader = c.create_reader(full, pulsar.MessageId.earliest)
        a = c.subscribe(full, "a")
        with pytest.raises(pulsar.NotAllowedError):
            c.subscribe(full, "b")
        reader.close()
        b = c.subscribe(full, "b")
        a.close()
        b.close()


def test_an_unsubscribed_cursors_mark_goes_with_its_znode(cluster: Brokers) -> None:
    """An UNSUBSCRIBE's cursor counts for the backlog quota and retention while its znode is deleted (c2f7d89),
    and not a moment after: once the znode is gone, its mark goes from the stored cursors' too. Planted: the
    mark left there (the topic refused producers over its quota for a subscription that no longer existed, and
    retention kept its ledgers, until a later read of the cursors, which retention makes only while a ledger
    could go)."""
    from tests.integration.test_review20 import _topic_over_its_quota

    with _serving(cluster) as (service, run):
        c = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            topic, consumer = _topic_over_its_quota(service, c)
            assert run(service.quota_exceeded(topic, evict=False)) is not None
            consumer.unsubscribe()
            assert topic.ml.slowest_mark_delete() is None
            assert run(service.quota_exceeded(topic, evict=False)) is None
        finally:
            c.close()


def _warned_out_of_files(caplog: pytest.LogCaptureFixture, what: str) -> bool:
    return any(
        f"{what}: all of its " in r.getMessage() and "open files in use" in r.getMessage()
        for r in caplog.records
    )


def test_a_broker_and_a_bookie_out_of_file_descriptors_say_so_from_their_loops(
    bookies: Any, cluster: Brokers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The out-of-descriptors warning (e5626e5) is said by the servers' own loops: the broker's housekeeping tick
    and the bookie's disk check, each with its OpenFilesWatch. Here each watch lists a descriptor directory that
    cannot be listed, as when the process is out of descriptors. Planted: the bookie's or the broker's check not
    called (the server silent, dropping every new connection)."""
    import logging

    from bookie import main as bookie_main
    from bookie.server_gate import OpenFilesWatch
    from ledgerstore.cluster import free_port
    from tests.broker_testing import in_process_broker

    gone = str(tmp_path / "no-fd-dir")
    caplog.set_level(
        logging.WARNING, logger="ledgerstore.bookie.server"
    )  # (the simulator quiets it in-process)
    with in_process_broker(cluster, tick_interval_s=0.2) as (service, _run):
        service._open_files = OpenFilesWatch("broker=out-of-files", fd_dir=gone)
        deadline = time.monotonic() + 10
        while not _warned_out_of_files(caplog, "broker=out-of-files") and time.monotonic() < deadline:
            time.sleep(0.1)
    assert _warned_out_of_files(caplog, "broker=out-of-files")

    cfg = bookie_main.BookieConfig(
        zk=bookies.zk, zk_root=bookies.root, data_dir=tmp_path / "b", port=free_port(), http_port=free_port()
    )
    b = bookie_main.Bookie(cfg)

    async def run() -> None:
        await b.start()
        try:
            b._open_files = OpenFilesWatch("bookie=out-of-files", fd_dir=gone)
            deadline = time.monotonic() + 10
            while not _warned_out_of_files(caplog, "bookie=out-of-files") and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            await b.stop()

    asyncio.run(run())
    assert _warned_out_of_files(caplog, "bookie=out-of-files")


def test_a_spark_workers_client_is_dropped_after_a_failed_task_and_replaced_for_another_cluster(
    bookies: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reused Python worker's tasks share one client (77223d2) only while they read the same cluster with the
    same credentials and settings, and only after tasks that ended well: a failed task's client (reads left in
    flight on its loop) is closed, and a task of another cluster or credentials connects its own (the kept one
    replaced). Planted: a failed task's client kept; the key not compared (a task read with the client of other
    options)."""
    pytest.importorskip("pyspark")
    from pyspark import TaskContext

    from ledger_client.sync import BookKeeper as SyncBookKeeper
    from spark import ledger_source
    from spark.ledger_source import LEDGER_SCHEMA, LedgerRange, read_range
    from spark.options import parse_ledger_options

    bookies.start_many(3)
    bk = SyncBookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    lh = bk.create_ledger(3, 2, 2, password=b"pw")
    lh.append_many([b"x"] * 20)
    lh.close()
    bk.close()

    def opts(**more: str) -> Any:
        given = {"zk": bookies.zk, "zkroot": bookies.root, "ledgers": str(lh.ledger_id), "password": "pw"}
        return parse_ledger_options({**given, **more})

    def rows(o: Any, last: int = 19) -> int:
        return sum(
            b.num_rows for b in read_range(o, LedgerRange(lh.ledger_id, 0, last, "CLOSED", 0), LEDGER_SCHEMA)
        )

    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    TaskContext._setTaskContext(TaskContext())  # as PySpark's worker does for each task
    try:
        assert rows(opts()) == 20
        kept = ledger_source._worker_client
        assert kept is not None
        with pytest.raises(Exception):  # noqa: B017  (entries past the ledger's last: the task fails)
            rows(opts(), last=39)
        assert ledger_source._worker_client is None
        assert rows(opts()) == 20
        first = ledger_source._worker_client
        assert first is not None
        assert rows(opts(readtimeoutms="7000")) == 20  # other settings: a client of its own
        assert ledger_source._worker_client is not None and ledger_source._worker_client[2] is not first[2]
    finally:
        TaskContext._setTaskContext(None)
        ledger_source._drop_worker_client()


def test_unload_of_a_partitioned_topic_passes_over_a_partition_never_made(cluster: Brokers) -> None:
    """`topic unload` of a partitioned topic unloads each partition on its owner (e46b0a1); a partition whose
    managed ledger was never made (nobody produced to it or subscribed to it yet) is passed over, as Pulsar's
    unload does, and the others are unloaded: 204. Planted: that partition's 404 failing the whole unload."""
    from tests.integration.test_broker_admin import call
    from zk import MetadataStore
    from zk.managed_ledgers import BrokerMetadataStore

    bp = cluster.start()
    t = f"unload-{uuid.uuid4().hex[:8]}"
    store = MetadataStore.connect(cluster.bookies.zk, root=cluster.bookies.root)
    try:
        asyncio.run(BrokerMetadataStore(store).create_partitioned_topic(f"public/default/persistent/{t}", 2))
    finally:
        store.close()
    with contextlib.closing(client(bp)) as c:
        producer = c.create_producer(f"persistent://public/default/{t}-partition-0")
        producer.send(b"before")
        status, body, _ = call(bp, "PUT", f"/admin/v2/persistent/public/default/{t}/unload")
        assert status == 204, body
        producer.send(b"after")  # (its client reconnected)
        stats = ok(bp, "GET", f"/admin/v2/persistent/public/default/{t}-partition-0/internalStats")
        assert stats["entriesAddedCounter"] >= 1
