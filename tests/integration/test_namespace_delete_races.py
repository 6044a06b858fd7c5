"""A namespace's delete and a topic's creation in it at once: an in-process broker and its admin HTTP port (real
ZooKeeper, 3 bookies), the other call made in the window between one call's check and its write (a wrapper of
the broker's metadata read that makes it there). Nothing of the topic may be left in a namespace deleted."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import types
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import pytest

import zk
from tests.broker_testing import Brokers, cluster, in_process_broker  # noqa: F401
from topic_broker.admin import AdminServer
from topic_broker.names import TopicName
from topic_broker.service import NamespaceNotFoundError


def _status(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else (b"" if method != "GET" else None)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read()
            return r.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@contextlib.contextmanager
def _namespace_on_a_broker(cluster: Brokers) -> Iterator[tuple[Any, Callable[[Any], Any], int, str]]:  # noqa: F811
    """An in-process broker with its admin HTTP port, and a new namespace public/<ns> made there: (the broker,
    its ``run``, the port, ns)."""
    with in_process_broker(cluster) as (service, run):
        admin = AdminServer(service)
        run(admin.start())
        try:
            port, ns = service.config.http_port, f"ns-{uuid.uuid4().hex[:8]}"
            assert _status(port, "PUT", f"/admin/v2/namespaces/public/{ns}")[0] == 204
            yield service, run, port, ns
        finally:
            run(admin.stop())


def _left(store: Any, ns: str) -> list[str]:
    """What is stored of namespace ``public/ns`` under the broker's roots (the namespace deleted: nothing)."""
    return [
        f"{root}/public/{ns}"
        for root in ("managed-ledgers", "topics", "ownership", "namespaces")
        if store.exists(f"{root}/public/{ns}")
    ]


def test_topics_created_while_the_namespace_is_deleted_are_refused(cluster: Brokers) -> None:  # noqa: F811
    """A producer's topic (its open, as a PRODUCER makes it) and an admin's partitioned topic created after the
    delete looked for topics (its last listing, of partitioned topics): each refused, the delete 204 and nothing
    of them left (before: both created, 204, and their managed ledgers, the partitioned topic and the ownership
    left in the namespace)."""
    with _namespace_on_a_broker(cluster) as (service, run, port, ns):
        store = service.meta.store
        topic = TopicName.parse(f"persistent://public/{ns}/produced")
        outcome: dict[str, Any] = {}
        looks: list[str] = []
        real_children = store.achildren

        async def list_then_others_create(path: str) -> list[str]:
            try:
                found = await real_children(path)
            except zk.MetadataNotFoundError as e:  # (no topic made yet: no directory)
                found = e
            if path == f"topics/public/{ns}/persistent":
                looks.append(path)
            if len(looks) == 2 and not outcome:  # the last look, after the mark (the first is before it)
                try:
                    outcome["open"] = await service.get_topic(topic)
                except Exception as e:
                    outcome["open"] = e
                async with aiohttp.ClientSession() as http:
                    url = f"http://127.0.0.1:{port}/admin/v2/persistent/public/{ns}/parted/partitions"
                    async with http.put(url, json=2) as r:
                        outcome["partitioned"] = r.status
            if isinstance(found, Exception):
                raise found
            return found  # type: ignore[no-any-return]

        store.achildren = list_then_others_create
        try:
            status, _ = _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")
        finally:
            del store.achildren
        assert status == 204
        assert isinstance(outcome["open"], Exception), outcome
        assert outcome["partitioned"] == 404
        assert str(topic) not in service.topics
        assert _left(store, ns) == []
        assert _status(port, "GET", f"/admin/v2/namespaces/public/{ns}")[0] == 404


def test_an_open_that_read_the_namespace_before_its_delete_creates_nothing(cluster: Brokers) -> None:  # noqa: F811
    """A producer's open of a topic that read its namespace's policies, then the whole delete of the namespace,
    then the open goes on: refused (Namespace not found), no managed ledger, ledger or ownership left (before:
    the topic opened and served, its managed-ledger znode, its ledger and its ownership in a namespace gone)."""
    with _namespace_on_a_broker(cluster) as (service, run, port, ns):
        meta, store = service.meta, service.meta.store
        topic = TopicName.parse(f"persistent://public/{ns}/late")
        real_get = meta.get_policies
        deleted: list[int] = []

        async def read_then_namespace_deleted(tenant: str, namespace: str) -> Any:
            found = await real_get(tenant, namespace)
            if namespace == ns and not deleted:
                deleted.append(0)
                url = f"http://127.0.0.1:{port}/admin/v2/namespaces/public/{ns}"
                async with aiohttp.ClientSession() as http, http.delete(url) as r:
                    deleted[0] = r.status
            return found

        meta.get_policies = read_then_namespace_deleted
        try:
            with pytest.raises(NamespaceNotFoundError):
                run(service.get_topic(topic))  # what a producer's PRODUCER makes
        finally:
            del meta.get_policies
        assert deleted == [204]
        assert str(topic) not in service.topics
        assert _left(store, ns) == []


def test_a_namespace_with_a_topic_is_not_deleted_and_stays_usable(cluster: Brokers) -> None:  # noqa: F811
    """A topic made before the delete: 409, and the delete's mark taken back (topics are created there again)."""
    with _namespace_on_a_broker(cluster) as (service, run, port, ns):
        base = f"/admin/v2/persistent/public/{ns}"
        assert _status(port, "PUT", f"{base}/a")[0] == 204
        status, body = _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")
        assert (status, body) == (409, {"reason": "Cannot delete non empty namespace"})
        assert _status(port, "GET", f"/admin/v2/namespaces/public/{ns}")[1]["deleted"] is False
        assert _status(port, "PUT", f"{base}/b")[0] == 204
        assert _status(port, "PUT", f"{base}/c/partitions", 2)[0] == 204


def test_a_marked_namespace_refuses_only_new_topics(cluster: Brokers) -> None:  # noqa: F811
    """While a namespace's delete mark stands, a topic that exists opens and is looked up (its clients reconnecting
    meanwhile are not refused: pulsar-client gives up on TopicNotFound), and a new one is refused; a delete of a
    namespace with topics answers 409 without marking it at all (before: the existing topic's open and lookup
    refused "Namespace not found", and every such delete set the mark)."""
    with _namespace_on_a_broker(cluster) as (service, run, port, ns):
        meta = service.meta
        assert _status(port, "PUT", f"/admin/v2/persistent/public/{ns}/old")[0] == 204
        assert _status(port, "PUT", f"/admin/v2/persistent/public/{ns}/parted/partitions", 2)[0] == 204
        marks: list[Any] = []
        real_update = meta.update_policies

        async def recording_update(tenant: str, namespace: str, change: Any) -> Any:
            marks.append(namespace)
            return await real_update(tenant, namespace, change)

        meta.update_policies = recording_update
        try:
            assert _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")[0] == 409
        finally:
            del meta.update_policies
        assert marks == []

        run(meta.update_policies("public", ns, lambda q: dataclasses.replace(q, deleted=True)))
        session = types.SimpleNamespace(conn=types.SimpleNamespace(principal=None))
        for local in ("old", "parted", "parted-partition-1"):
            name = TopicName.parse(f"persistent://public/{ns}/{local}")
            assert run(service._lookup_refusal(session, name, "LOOKUP"))[0] is None, local
        assert run(service.get_topic(TopicName.parse(f"persistent://public/{ns}/old"))) is not None
        new = TopicName.parse(f"persistent://public/{ns}/new")
        assert run(service._lookup_refusal(session, new, "LOOKUP"))[0] is not None
        with pytest.raises(NamespaceNotFoundError):
            run(service.get_topic(new))


def test_a_delete_left_marked_is_finished_or_taken_back_and_one_runs_at_a_time(cluster: Brokers) -> None:  # noqa: F811
    """A mark a delete left standing (its broker died between the mark and the delete): the next delete takes it
    back when the namespace has topics (409; before, the mark stayed, every new topic refused for good) and
    finishes the delete when it has none. A second delete while one runs is 409 'being deleted' and leaves the
    first's mark (before: it ran beside it, and its failure took that mark back); so is one of a partitioned
    topic."""
    with _namespace_on_a_broker(cluster) as (service, run, port, ns):
        meta, base = service.meta, f"/admin/v2/persistent/public/{ns}"
        assert _status(port, "PUT", f"{base}/old")[0] == 204
        run(meta.update_policies("public", ns, lambda q: dataclasses.replace(q, deleted=True)))
        assert _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")[0] == 409
        assert _status(port, "GET", f"/admin/v2/namespaces/public/{ns}")[1]["deleted"] is False
        assert _status(port, "PUT", f"{base}/new")[0] == 204

        assert _status(port, "PUT", f"{base}/parted/partitions", 2)[0] == 204
        real_mark, seen = meta.mark_partitioned_deleted, []

        async def mark_then_delete_again(ml_name: str, deleted: bool = True) -> int:
            n = await real_mark(ml_name, deleted)
            if not seen:
                url = f"http://127.0.0.1:{port}{base}/parted/partitions"
                async with aiohttp.ClientSession() as http, http.delete(url) as r:
                    seen.append((r.status, (await r.json())["reason"]))
                seen.append((await store.aget(f"topics/{ml_name}")).value.get("deleted"))
            return n

        store = meta.store
        meta.mark_partitioned_deleted = mark_then_delete_again
        try:
            assert _status(port, "DELETE", f"{base}/parted/partitions")[0] == 204
        finally:
            del meta.mark_partitioned_deleted
        assert seen == [
            (409, f"Partitioned topic persistent://public/{ns}/parted is being deleted; try again"),
            True,
        ]

        for local in ("old", "new"):
            assert _status(port, "DELETE", f"{base}/{local}")[0] == 204
        real_children, again = store.achildren, []

        async def list_then_delete_again(path: str) -> list[str]:
            if path == f"topics/public/{ns}/persistent" and not again:
                url = f"http://127.0.0.1:{port}/admin/v2/namespaces/public/{ns}"
                async with aiohttp.ClientSession() as http, http.delete(url) as r:
                    again.append((r.status, (await r.json())["reason"]))
            return await real_children(path)  # type: ignore[no-any-return]

        run(meta.update_policies("public", ns, lambda q: dataclasses.replace(q, deleted=True)))  # left marked
        store.achildren = list_then_delete_again
        try:
            assert _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")[0] == 204
        finally:
            del store.achildren
        assert again == [(409, f"Namespace public/{ns} is being deleted; try again")]
        assert _left(store, ns) == []
