"""A topic's delete and its creation again at once: an in-process broker (real ZooKeeper, 3 bookies), the
topic's open (what a producer disconnected by the delete makes as it reconnects) started while the delete is held
just before it removes the managed ledger's znode."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp
import pytest

from tests.broker_testing import Brokers, before_first_call, cluster, in_process_broker  # noqa: F401
from topic_broker import service as service_mod
from topic_broker.admin import AdminServer
from topic_broker.names import TopicName
from zk import layout


def test_a_topic_opened_again_while_it_is_deleted_is_a_new_topic_with_its_own_storage(
    cluster: Brokers,  # noqa: F811
) -> None:
    """The open waits for the delete, then makes the topic anew: served, its managed-ledger znode holding the
    ledger it writes to, its ownership this broker's, the deleted topic's ledgers gone (before: the open went on
    during the delete, on the ledger list being deleted, so the topic was served with no managed-ledger znode (a
    message acknowledged to it lost) and, once the delete released it, no ownership)."""
    with in_process_broker(cluster) as (service, run):
        meta, store = service.meta, service.meta.store
        name = TopicName.parse(f"persistent://public/default/again-{uuid.uuid4().hex[:8]}")
        old = run(service.get_topic(name))
        old_ledgers = [li.ledger_id for li in old.ml.info.ledgers]
        real_delete_ml = meta.delete_ml
        opened: list[asyncio.Task[Any]] = []

        async def open_again_then_delete(ml_name: str) -> None:
            if ml_name == name.ml_name and not opened:
                opened.append(asyncio.get_running_loop().create_task(service.get_topic(name)))
                await asyncio.wait(opened, timeout=3)  # as far as the open goes while the delete waits
            await real_delete_ml(ml_name)

        meta.delete_ml = open_again_then_delete
        try:
            assert run(service.delete_topic(name))
        finally:
            del meta.delete_ml

        async def reopened() -> Any:
            return await opened[0]

        new = run(reopened())
        assert new is not old and not new.unloaded
        assert service._served(str(name)) is new
        info = run(meta.get_ml_info(name.ml_name))
        assert info is not None, "the served topic's managed-ledger znode"
        assert new.ml.current_ledger_id in [li.ledger_id for li in info.value.ledgers]
        owner = run(meta.get_owner(name.ml_name))
        assert owner is not None and owner.broker_id == service.config.id
        assert not set(old_ledgers) & {li.ledger_id for li in info.value.ledgers}
        assert not [lid for lid in old_ledgers if store.exists(layout.ledger_path(lid))]  # deleted


def test_a_partitioned_topic_grown_while_it_is_deleted_leaves_no_partition(cluster: Brokers) -> None:  # noqa: F811
    """A partitioned topic of 2 deleted, its partition count grown to 4 by another admin after its partitions
    were deleted: the update refused (409), nothing of the topic left (before: 204, and the managed ledgers of
    partitions 2 and 3 left behind, of a topic that no longer existed)."""
    with in_process_broker(cluster) as (service, run):
        admin = AdminServer(service)
        run(admin.start())
        try:
            meta, store, port = service.meta, service.meta.store, service.config.http_port
            local = f"grown-{uuid.uuid4().hex[:8]}"
            url = f"http://127.0.0.1:{port}/admin/v2/persistent/public/default/{local}/partitions"

            async def create() -> int:
                async with aiohttp.ClientSession() as http, http.put(url, json=2) as r:
                    return r.status

            assert run(create()) == 204

            async def grow() -> int:
                async with aiohttp.ClientSession() as http, http.post(url, json=4) as r:
                    return r.status

            async def delete() -> int:
                async with aiohttp.ClientSession() as http, http.delete(url) as r:
                    return r.status

            with before_first_call(meta, "delete_partitioned_topic", grow) as grown:
                assert run(delete()) == 204
            assert grown == [409]
            left = store.children("managed-ledgers/public/default/persistent")
            assert [n for n in left if n.startswith(f"{local}-partition-")] == []
            assert not store.exists(f"topics/public/default/persistent/{local}")
        finally:
            run(admin.stop())


def test_an_open_during_a_delete_stuck_past_the_wait_is_refused_not_opened_on_it(
    cluster: Brokers,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A delete held past CLOSE_WAIT_S (its bookies slow): an open of the topic then is refused, TopicDeletingError
    (a client's ServiceNotReady, retried), and opens a new topic once the delete ended (before: it opened anyway on
    the ledger list being deleted, served with no managed-ledger znode)."""
    monkeypatch.setattr(service_mod, "CLOSE_WAIT_S", 0.3)
    with in_process_broker(cluster) as (service, run):
        meta = service.meta
        name = TopicName.parse(f"persistent://public/default/stuck-{uuid.uuid4().hex[:8]}")
        run(service.get_topic(name))
        ours = lambda ml_name: ml_name == name.ml_name  # noqa: E731
        with before_first_call(meta, "delete_ml", lambda: service.get_topic(name), when=ours) as opened:
            assert run(service.delete_topic(name))
        assert isinstance(opened[0], service_mod.TopicDeletingError), opened
        new = run(service.get_topic(name))
        info = run(meta.get_ml_info(name.ml_name))
        assert info is not None and new.ml.current_ledger_id in [li.ledger_id for li in info.value.ledgers]


def test_an_open_past_the_wait_while_a_delete_releases_its_ownership_is_refused(
    cluster: Brokers,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A delete whose last step, the ownership's release, is held past CLOSE_WAIT_S: an open of the topic then is
    refused, TopicDeletingError (retried by a client), and the topic opened after holds its ownership (before: the
    delete counted as ended before its release, so the open went on, took the znode still there as its own, and
    the release then deleted it: the topic served here with no ownership for another broker's lookup to take)."""
    monkeypatch.setattr(service_mod, "CLOSE_WAIT_S", 0.3)
    with in_process_broker(cluster) as (service, run):
        meta = service.meta
        name = TopicName.parse(f"persistent://public/default/release-{uuid.uuid4().hex[:8]}")
        run(service.get_topic(name))
        ours = lambda ml_name, broker_id: ml_name == name.ml_name  # noqa: E731
        with before_first_call(
            meta, "release_ownership", lambda: service.get_topic(name), when=ours
        ) as opened:
            assert run(service.delete_topic(name))
        assert isinstance(opened[0], service_mod.TopicDeletingError), opened
        run(service.get_topic(name))
        owner = run(meta.get_owner(name.ml_name))
        assert owner is not None and owner.broker_id == service.config.id
