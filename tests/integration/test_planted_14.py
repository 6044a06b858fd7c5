"""Tests for the bugs planted in the audit of 0260c38..89e0dc0 (docs/architecture.md §11) that the tests of the
time let through: each fails with its bug planted and passes without it. Real ZooKeeper, bookies and brokers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import zk
from tests.broker_testing import Brokers, before_first_call, broker, cluster, in_process_broker  # noqa: F401
from tests.conftest import BookieFactory
from tests.integration.test_namespace_delete_races import _namespace_on_a_broker, _status
from tests.integration.test_ops17 import in_process_bookie


def _put_readonly(http_port: int, readonly: bool) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/api/v1/bookie/state/readonly",
        data=json.dumps({"readOnly": readonly}).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_an_operator_cannot_make_a_failed_or_full_bookie_writable(
    zk_server, zk_root: str, tmp_path: Path
) -> None:
    """PUT /api/v1/bookie/state/readonly {"readOnly": false} (`bookie readonly ID --off`) is refused 409, the
    bookie left read-only, when it failed (its journal's write failed) or its disk is over
    --disk-usage-threshold: made writable so, it took adds on a journal that fails, or filled its disk to the
    end. Planted without either check: 200 and writable. A real bookie in this process."""

    async def run() -> None:
        async with in_process_bookie(zk_server, zk_root, tmp_path / "failed") as b:
            port = b.config.http_port
            b.fail("journal write failed: OSError(5, 'Input/output error')")
            status, body = await asyncio.to_thread(_put_readonly, port, False)
            assert status == 409 and "failed" in body["error"], (status, body)
            assert b.core.readonly
        async with in_process_bookie(zk_server, zk_root, tmp_path / "full") as b:
            port = b.config.http_port
            status, body = await asyncio.to_thread(_put_readonly, port, True)
            assert status == 200 and body == {"readOnly": True}, (status, body)
            b.config = dataclasses.replace(b.config, disk_usage_threshold=1e-9, disk_usage_lwm=1e-10)
            status, body = await asyncio.to_thread(_put_readonly, port, False)
            assert status == 409 and "--disk-usage-threshold" in body["error"], (status, body)
            assert b.core.readonly

    asyncio.run(run())


def test_sigint_stops_a_bookie_cleanly(bookies: BookieFactory) -> None:
    """Ctrl-C on a bookie in the foreground (SIGINT) stops it as SIGTERM does: unregistered at once, 'stopped'
    in its log, exit 0. Planted with SIGINT left out of the stop signals: it was ignored where the run ignores
    it (started in the background) or died on a KeyboardInterrupt, still registered until its session expired."""
    from zk import BookieRegistry, MetadataStore

    bp = bookies.start()
    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        assert bp.proc is not None and bp.id in BookieRegistry(store).available()
        bp.proc.send_signal(signal.SIGINT)
        assert bp.wait_exit(30) == 0, bp.log_tail(20)
        assert bp.id not in BookieRegistry(store).available(), "unregistered at once, as on SIGTERM"
        assert "stopped" in bp.log_tail(10)
    finally:
        store.close()


def test_a_namespace_delete_whose_look_for_topics_fails_takes_its_mark_back(cluster: Brokers) -> None:  # noqa: F811
    """A namespace delete whose look for topics after its mark fails (ZooKeeper's connection lost) answers an
    error and takes the mark back: the namespace is as it was, and topics are made in it. Planted with the
    failure not counted as 'busy': the mark stayed, "deleted" for good, every new topic of the namespace
    refused ('Namespace not found') by a delete that had not happened."""
    with _namespace_on_a_broker(cluster) as (service, run, port, ns):
        store = service.meta.store
        real_children = store.achildren
        looks: list[str] = []

        async def second_look_fails(path: str) -> list[str]:
            if path == f"topics/public/{ns}/persistent":
                looks.append(path)
                if len(looks) == 2:  # the look after the mark
                    raise zk.MetadataConnectionError("connection lost", path=path)
            return await real_children(path)  # type: ignore[no-any-return]

        store.achildren = second_look_fails
        try:
            status, _ = _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")
        finally:
            del store.achildren
        assert status >= 500 and len(looks) == 2, (status, looks)
        status, policies = _status(port, "GET", f"/admin/v2/namespaces/public/{ns}")
        assert status == 200 and policies["deleted"] is False, policies
        assert _status(port, "PUT", f"/admin/v2/persistent/public/{ns}/after/partitions", 2)[0] == 204


def test_a_new_bookie_whose_http_port_is_in_use_writes_no_cookie(
    zk_server, zk_root: str, tmp_path: Path
) -> None:
    """A new bookie whose --http-port another process listens on is refused before its cookie is written, as for
    its --port. Planted with the admin port left out of the check: the HTTP listener's bind failed after the
    cookie, the id left DOWN for good in ZooKeeper and its directory refused (cookie mismatch) at the start with
    the port corrected. A real bookie in this process."""
    import socket

    from bookie import main as bookie_main
    from ledgerstore.cluster import free_port
    from zk import MetadataStore
    from zk.cookies import read_zk_cookie

    squatter = socket.create_server(("127.0.0.1", 0))
    busy = squatter.getsockname()[1]
    cfg = bookie_main.BookieConfig(
        zk=zk_server.connect_string,
        zk_root=zk_root,
        data_dir=tmp_path / "b",
        port=free_port(),
        http_port=busy,
        init_cluster=True,
    )
    b = bookie_main.Bookie(cfg)
    store = MetadataStore.connect(zk_server.connect_string, root=zk_root)

    async def start() -> BaseException | None:
        try:
            await b.start()
        except BaseException as e:
            return e
        finally:
            await b.stop()
        return None

    try:
        refused = asyncio.run(start())
        assert isinstance(refused, bookie_main.StartRefusal), refused
        assert f"port {busy} (--http-port)" in str(refused)
        assert read_zk_cookie(store, cfg.id) is None
    finally:
        squatter.close()
        store.close()


def test_a_topic_create_after_its_namespace_was_marked_since_the_read_is_refused(zk_store: Any) -> None:
    """The create of a topic's managed-ledger znode checks, in its transaction, that the namespace's policies are
    at the version it read: a delete's mark written between the read and the create makes it read again and be
    refused (NamespaceGoneError), nothing created, the directories it made removed. Planted with the check at
    any version (-1): created, a topic left in a namespace whose delete found none; planted without the removal:
    managed-ledgers/<tenant>/<namespace>/persistent left behind, empty. Real ZooKeeper; the mark written in that window."""
    import pytest

    from zk.managed_ledgers import (
        BrokerMetadataStore,
        ManagedLedgerInfo,
        NamespaceGoneError,
        NamespacePolicies,
    )

    meta = BrokerMetadataStore(zk_store, namespaces=True)

    async def run() -> None:
        await meta.set_policies("public", "marked", NamespacePolicies())

        async def mark() -> None:
            await meta.update_policies("public", "marked", lambda q: dataclasses.replace(q, deleted=True))

        with before_first_call(zk_store, "acreate_checked", mark) as marks, pytest.raises(NamespaceGoneError):
            await meta.create_ml_info("public/marked/persistent/t", ManagedLedgerInfo())
        assert marks == [None]  # (the mark written in the window, not failed)
        assert await meta.get_ml_info("public/marked/persistent/t") is None
        assert not zk_store.exists("managed-ledgers/public/marked"), (
            "the directories the create made, removed"
        )

    asyncio.run(run())


def test_a_partition_created_after_its_partitioned_topic_was_marked_since_the_read_is_refused(
    zk_store: Any,
) -> None:
    """A partition's managed ledger is created only while its partitioned topic is not marked deleted, checked in
    the create's transaction at the version read: a delete's mark written between the read and the create makes
    it read again and be refused (PartitionedTopicGoneError), nothing created. Planted with the mark not looked
    at: the partition made under the delete (a producer's open of it), left behind once the delete had passed
    it. Real ZooKeeper; the mark written in that window."""
    import pytest

    from zk.managed_ledgers import (
        BrokerMetadataStore,
        ManagedLedgerInfo,
        NamespacePolicies,
        PartitionedTopicGoneError,
    )

    meta = BrokerMetadataStore(zk_store, namespaces=True)

    async def run() -> None:
        await meta.set_policies("public", "parted", NamespacePolicies())
        await meta.create_partitioned_topic("public/parted/persistent/t", 2)

        async def mark() -> int:
            return await meta.mark_partitioned_deleted("public/parted/persistent/t")

        with (
            before_first_call(zk_store, "acreate_checked", mark) as marks,
            pytest.raises(PartitionedTopicGoneError),
        ):
            await meta.create_ml_info("public/parted/persistent/t-partition-1", ManagedLedgerInfo())
        assert marks == [2]
        assert await meta.get_ml_info("public/parted/persistent/t-partition-1") is None

    asyncio.run(run())


def test_a_partitioned_delete_refused_for_a_producer_takes_its_mark_back(cluster: Brokers) -> None:  # noqa: F811
    """DELETE …/partitions refused 412 (a partition has a producer, no force) takes back the mark it wrote
    first: the partitioned topic grows again and its partitions open. Planted with the mark left: a topic
    nobody deleted that can never grow (409 'being deleted') nor have a partition made. An in-process broker
    (real ZooKeeper, 3 bookies) and a producer on a raw connection."""
    import socket

    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import wire
    from topic_broker.server import BrokerServer

    T = pb.BaseCommand

    with _namespace_on_a_broker(cluster) as (service, run, port, ns):
        base = f"/admin/v2/persistent/public/{ns}/kept/partitions"
        assert _status(port, "PUT", base, 2)[0] == 204
        server = BrokerServer(service)
        run(server.start())
        with contextlib.closing(socket.create_connection(("127.0.0.1", service.config.port), 30)) as conn:
            conn.sendall(
                wire.encode_command(
                    T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20))
                )
                + wire.encode_command(
                    T(
                        type=T.PRODUCER,
                        producer=pb.CommandProducer(
                            topic=f"persistent://public/{ns}/kept-partition-0", producer_id=1, request_id=1
                        ),
                    )
                )
            )
            decoder, seen = wire.FrameDecoder(), list[int]()
            while T.PRODUCER_SUCCESS not in seen:
                data = conn.recv(1 << 16)
                assert data, seen
                seen += [f.command.type for f in decoder.feed(data)]
            assert _status(port, "DELETE", base)[0] == 412
        run(server.stop())
        status, body = _status(port, "POST", base, 3)
        assert status == 204, (status, body)
        assert _status(port, "GET", base)[1]["partitions"] == 3


def test_a_producer_of_a_topic_whose_delete_is_stuck_is_told_to_retry(
    cluster: Brokers,  # noqa: F811
    monkeypatch: Any,
) -> None:
    """A PRODUCER of a topic whose delete is held past CLOSE_WAIT_S is answered ServiceNotReady, which
    pulsar-client retries, so the producer is made once the delete ended. Planted with TopicNotFound (as the
    namespace's refusal): the client takes it as final and the producer fails with what it had pending. An
    in-process broker (real ZooKeeper, 3 bookies), the PRODUCER on a connection of the broker's own port."""
    import uuid

    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import service as service_mod
    from topic_broker import wire
    from topic_broker.names import TopicName
    from topic_broker.server import BrokerServer

    T = pb.BaseCommand
    monkeypatch.setattr(service_mod, "CLOSE_WAIT_S", 0.3)
    with in_process_broker(cluster) as (service, run):
        server = BrokerServer(service)
        run(server.start())
        meta = service.meta
        name = TopicName.parse(f"persistent://public/default/stuck-{uuid.uuid4().hex[:8]}")
        run(service.get_topic(name))
        real_delete_ml = meta.delete_ml
        answers: list[int] = []

        async def producer_answer() -> int:
            reader, writer = await asyncio.open_connection("127.0.0.1", service.config.port)
            connect = T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20))
            producer = T(
                type=T.PRODUCER, producer=pb.CommandProducer(topic=str(name), producer_id=1, request_id=1)
            )
            writer.write(wire.encode_command(connect) + wire.encode_command(producer))
            decoder = wire.FrameDecoder()
            try:
                while True:
                    data = await asyncio.wait_for(reader.read(1 << 16), 30)
                    assert data
                    for f in decoder.feed(data):
                        if f.command.type == T.ERROR:
                            return int(f.command.error.error)
                        if f.command.type == T.PRODUCER_SUCCESS:
                            return -1
            finally:
                writer.close()

        async def producer_then_delete(ml_name: str) -> None:
            if ml_name == name.ml_name and not answers:
                answers.append(await producer_answer())
            await real_delete_ml(ml_name)

        meta.delete_ml = producer_then_delete
        try:
            assert run(service.delete_topic(name))
        finally:
            del meta.delete_ml
            run(server.stop())
        assert answers == [pb.ServiceNotReady], answers


def test_a_namespace_clear_backlog_reads_the_stored_positions_to_the_entry(broker: Any) -> None:  # noqa: F811
    """A namespace's clearBacklog/{sub} over topics nobody serves goes by their stored records: a subscription
    one entry short of the end (2 of 3 acknowledged) has a backlog, cleared (its topic opened); one at the last
    entry exactly (3 of 3) has none, its topic not opened. Planted with the last entry taken one early: the
    backlog of 1 left; planted with a position at the end counted as a backlog: the topic opened for nothing
    (the cost cf0c8ee took away). A broker process (real ZooKeeper, 3 bookies) and pulsar-client."""
    import uuid

    import pulsar

    from tests.integration.test_broker_client_features3 import admin
    from tests.integration.test_broker_client_features4 import wait_for
    from zk.client import MetadataStore

    bp = broker
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/{ns}/t"
    admin(bp, "PUT", f"/admin/v2/namespaces/public/{ns}")
    c = pulsar.Client(bp.service_url)
    try:
        consumers = {sub: c.subscribe(topic, sub) for sub in ("short", "end")}
        producer = c.create_producer(topic)
        for _ in range(3):
            producer.send(b"m")
        for sub, acked in (("short", 2), ("end", 3)):
            for _ in range(acked):
                consumers[sub].acknowledge(consumers[sub].receive(10_000))
            consumers[sub].close()
        producer.close()
    finally:
        c.close()
    store = MetadataStore.connect(bp.zk, bp.zk_root)
    try:

        def owned() -> list[str]:
            return store.children_many([f"ownership/public/{ns}/persistent"]).popitem()[1] or []

        def unload() -> None:
            admin(bp, "PUT", f"/admin/v2/namespaces/public/{ns}/unload")
            wait_for(lambda: not owned(), "the topic let go")

        unload()
        admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog/end")
        assert owned() == [], "at the end: nothing to clear, not opened"
        admin(bp, "POST", f"/admin/v2/namespaces/public/{ns}/clearBacklog/short")
        stats = admin(bp, "GET", f"/admin/v2/persistent/public/{ns}/t/stats")["subscriptions"]
        assert stats["short"]["msgBacklog"] == 0, stats
    finally:
        store.close()


def test_concurrent_grants_of_two_roles_on_a_namespace_both_kept(cluster: Brokers) -> None:  # noqa: F811
    """Two admins granting two roles on one namespace at once: both grants stored. Planted with the grant's
    change made on the policies the handler read before its write (not on those stored at the conflict): the
    first grant's retry wrote back the permissions it had read and the second role's grant was lost. An
    in-process broker (real ZooKeeper, 3 bookies), the first write held until the second is done."""
    import threading
    import uuid

    from tests.integration.test_namespace_policy_writes import _call
    from topic_broker.admin import AdminServer

    with in_process_broker(cluster) as (service, run):
        admin = AdminServer(service)
        run(admin.start())
        try:
            port = service.config.http_port
            ns = f"ns-{uuid.uuid4().hex[:8]}"
            base = f"/admin/v2/namespaces/public/{ns}"
            _call(port, "PUT", base)
            store = service.meta.store
            original_set = store.set
            held, release = threading.Event(), threading.Event()

            def gated_set(path: str, value: Any, version: int) -> Any:
                if (
                    path.endswith(f"/{ns}")
                    and "role-a" in (value.get("permissions") or {})
                    and not held.is_set()
                ):
                    held.set()
                    assert release.wait(20)
                return original_set(path, value, version)

            store.set = gated_set
            first = threading.Thread(
                target=_call, args=(port, "POST", f"{base}/permissions/role-a", ["produce"])
            )
            first.start()
            try:
                assert held.wait(20), "the first grant's write reached the store"
                _call(port, "POST", f"{base}/permissions/role-b", ["consume"])
            finally:
                release.set()
                first.join(30)
            del store.set
            assert _call(port, "GET", f"{base}/permissions") == {"role-a": ["produce"], "role-b": ["consume"]}
        finally:
            run(admin.stop())


def test_a_namespace_policy_change_keeps_the_fields_this_version_does_not_know(zk_store: Any) -> None:
    """update_policies writes one admin's change over the policies stored, keeping fields this version does
    not know (written by a newer broker during a rolling upgrade). Planted with the record written from the
    parsed policies alone: the newer broker's fields dropped by any older broker's change. Real ZooKeeper."""
    from zk import layout
    from zk.managed_ledgers import BrokerMetadataStore, NamespacePolicies

    meta = BrokerMetadataStore(zk_store, namespaces=True)

    async def run() -> None:
        await meta.set_policies("public", "mixed", NamespacePolicies())
        path = layout.namespace_policies_path("public", "mixed")
        await zk_store.aupdate(path, lambda cur: {**cur, "a_newer_field": {"on": True}})
        p = await meta.update_policies(
            "public", "mixed", lambda q: dataclasses.replace(q, message_ttl_in_seconds=9)
        )
        assert p.message_ttl_in_seconds == 9
        stored = await zk_store.aget_optional(path)
        assert stored is not None and stored.value["a_newer_field"] == {"on": True}, stored

    asyncio.run(run())


def test_a_topic_deleted_then_made_again_opens_past_a_stuck_close_as_any_other(
    cluster: Brokers,  # noqa: F811
    monkeypatch: Any,
) -> None:
    """A topic deleted here, then made again and served, then unloaded with its close stuck past CLOSE_WAIT_S:
    its open goes on as any topic's does (a stuck close does not keep a topic unserved). Planted with the
    deleted topic never leaving the deletes under way: that open refused TopicDeletingError for as long as
    the broker ran (and one entry kept per topic ever deleted). An in-process broker (real ZooKeeper, 3
    bookies)."""
    import uuid

    from tests.integration.test_broker_gone_connection import _serving
    from topic_broker import service as service_mod
    from topic_broker.names import TopicName

    monkeypatch.setattr(service_mod, "CLOSE_WAIT_S", 0.3)
    with _serving(cluster) as (service, run):
        name = TopicName.parse(f"persistent://public/default/again-{uuid.uuid4().hex[:8]}")
        run(service.get_topic(name))
        assert run(service.delete_topic(name))
        old = run(service.get_topic(name))  # made again
        stuck = asyncio.Event()
        close = old.ml.close

        async def stuck_close() -> None:
            await stuck.wait()
            await close()

        old.ml.close = stuck_close
        assert run(service.unload(name))
        try:
            new = run(service.get_topic(name))  # after CLOSE_WAIT_S, the close still under way
            assert new is not old
        finally:

            async def let_go() -> None:
                stuck.set()
                await asyncio.sleep(0.2)

            run(let_go())


def test_cluster_up_again_with_another_bookie_http_port_says_which_runs(tmp_path: Path) -> None:
    """`cluster up` on a running state directory given another --bookie-http-port says the one that runs (a
    script would call the bookies' admin API where nothing listens). Planted with the comparison made only when
    the option is not given: nothing said for it, and a line about it whenever it was left out."""
    from ledgerstore.cluster import free_port
    from tests.integration.test_cluster_cli import _ls, _ports

    state = tmp_path / "cluster"
    http = free_port()
    first = _ports(state, http)
    r = _ls("cluster", "up", *first)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        other = [*first[: first.index("--bookie-http-port")], "--bookie-http-port", str(free_port())]
        r = _ls("cluster", "up", *other)
        assert r.returncode == 0 and "cluster already running" in r.stdout, r.stdout + r.stderr
        assert f"(not as asked: it runs with --bookie-http-port {http}, as " in r.stderr, r.stderr
    finally:
        _ls("cluster", "down", "--state-dir", str(state))
