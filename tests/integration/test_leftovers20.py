"""Ownership directories of deleted namespaces: removed once their last ownership znode is gone, even when its
broker was killed -9 (real ZooKeeper; broker processes and bookies for the kill)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from typing import Any

import pytest

from tests.broker_testing import Brokers, cluster  # noqa: F401
from tests.integration.test_broker_admin import ledgerstore
from tests.integration.test_broker_client_features3 import admin
from tests.zk_testing import ZkTarget, wait_for
from zk import layout
from zk.client import MetadataStore
from zk.managed_ledgers import BrokerMetadataStore, OwnershipInfo


def test_a_namespace_deleted_while_a_killed_brokers_lookup_held_an_ownership_leaves_no_directories(
    cluster: Brokers,  # noqa: F811
) -> None:
    """A broker takes a topic's ownership for a lookup (nobody opens the topic), its namespace is deleted (no
    topic exists: the delete goes on, and the ownership directories, not empty, stay), and the broker is killed
    -9: its znode goes with its session and nothing ever released it, so ``ownership/public/<ns>`` and its
    ``persistent`` stayed for good. The next broker's start removes them."""
    first = cluster.start()
    ns = f"ns-{uuid.uuid4().hex[:8]}"
    admin(first, "PUT", f"/admin/v2/namespaces/public/{ns}")
    url = f"http://127.0.0.1:{first.http_port}/lookup/v2/topic/persistent/public/{ns}/looked-up"
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
    with MetadataStore.connect(cluster.bookies.zk, cluster.bookies.root) as store:
        assert store.children(f"ownership/public/{ns}/persistent") == ["looked-up"]
        admin(first, "DELETE", f"/admin/v2/namespaces/public/{ns}")
        first.kill9()
        assert wait_for(lambda: not store.children(f"ownership/public/{ns}/persistent"), 30)
        assert store.exists(f"ownership/public/{ns}/persistent")  # left behind by the dead broker
        cluster.start()
        assert wait_for(lambda: not store.exists(f"ownership/public/{ns}"), 10), (
            "its ownership directories stay"
        )
        assert ns not in store.children("ownership/public")


def test_tidy_ownership_dirs_removes_only_what_is_empty_and_whose_namespace_is_gone(
    zk_connect: ZkTarget, zk_store: MetadataStore
) -> None:
    """An existing namespace's empty directories stay, a deleted namespace's stay while an ownership znode is
    held in them and go with it, and a deleted tenant's directory goes once it has nothing under it."""
    meta = BrokerMetadataStore(zk_store, namespaces=True)
    zk_store.create(layout.namespace_policies_path("public", "alive"), {})
    zk_store.ensure("ownership/public/alive/persistent")
    zk_store.ensure("ownership/public/gone/persistent")
    zk_store.ensure("ownership/old-tenant/ns/persistent")
    with MetadataStore.connect(zk_connect.connect_string, zk_connect.root) as holder:
        holder.create("ownership/public/gone/persistent/held", {"brokerId": "b"}, ephemeral=True)
        assert (
            asyncio.run(meta.tidy_ownership_dirs()) == 3
        )  # ownership/old-tenant/ns/persistent, ns, old-tenant
        assert zk_store.children("ownership/public/gone/persistent") == ["held"]
    assert asyncio.run(meta.tidy_ownership_dirs()) == 2
    assert sorted(zk_store.children("ownership")) == ["public"]
    assert zk_store.children("ownership/public") == ["alive"]
    assert zk_store.exists("ownership/public/alive/persistent")
    assert asyncio.run(meta.tidy_ownership_dirs()) == 0


def test_an_ownership_whose_directories_go_as_it_is_created_is_taken(
    zk_store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tidy-up (or a delete's pruning) that removes the directories an ownership znode is being created in:
    ZooKeeper answers the create NoNode, and the ownership is taken with its directories made again (before,
    the lookup failed with MetadataNotFoundError)."""
    meta = BrokerMetadataStore(zk_store, namespaces=True)
    real = zk_store.acreate
    calls: list[str] = []

    async def directories_gone_first(path: str, value: Any, **kwargs: Any) -> str:
        calls.append(path)
        if len(calls) == 1:  # the directories removed between kazoo's making them and the create
            await zk_store.adelete("ownership/public/racing/persistent")
            return await real(path, value, **kwargs, makepath=False)
        return await real(path, value, **kwargs)

    zk_store.ensure("ownership/public/racing/persistent")
    monkeypatch.setattr(zk_store, "acreate", directories_gone_first)
    me = OwnershipInfo(
        broker_id="b1", service_url="pulsar://127.0.0.1:1", web_service_url="http://127.0.0.1:2"
    )
    assert asyncio.run(meta.acquire_ownership("public/racing/persistent/t", me)) == me
    assert len(calls) == 2
    assert zk_store.children("ownership/public/racing/persistent") == ["t"]


def test_topic_unload_closes_each_partition_of_a_partitioned_topic(cluster: Brokers) -> None:  # noqa: F811
    """`ledgerstore topic unload` (pulsar-admin's ``topics unload``): a partitioned topic's partitions, opened by a
    producer, are closed where served (their ownership let go); the REST's ``PUT …/unload`` on the partitioned
    topic was 404 'Topic … not found'. A plain topic likewise; one that does not exist is exit 4 (not found)."""
    bp = cluster.start()
    t = f"unload-{uuid.uuid4().hex[:8]}"
    url = ["--url", f"http://127.0.0.1:{bp.http_port}"]
    svc = ["--service-url", bp.service_url]
    assert ledgerstore("topic", "create", t, "--partitions", "2", *url).returncode == 0
    r = ledgerstore("topic", "produce", t, "-m", "x", "-n", "4", *url, *svc)
    assert r.returncode == 0, r.stderr
    owned = "ownership/public/default/persistent"
    parts = [f"{t}-partition-{i}" for i in range(2)]
    with MetadataStore.connect(cluster.bookies.zk, cluster.bookies.root) as store:
        assert set(parts) <= set(store.children(owned))
        r = ledgerstore("topic", "unload", t, *url, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {
            "topic": f"persistent://public/default/{t}",
            "unloaded": True,
            "partitions": 2,
        }
        assert wait_for(lambda: not set(parts) & set(store.children(owned)), 10), store.children(owned)
        plain = f"{t}-plain"
        assert ledgerstore("topic", "produce", plain, "-m", "x", *url, *svc).returncode == 0
        assert plain in store.children(owned)
        r = ledgerstore("topic", "unload", plain, *url)
        assert (r.returncode, r.stdout.strip()) == (0, f"unloaded persistent://public/default/{plain}")
        assert wait_for(lambda: plain not in store.children(owned), 10)
    r = ledgerstore("topic", "unload", f"{t}-nothing", *url)
    assert r.returncode == 4 and "404 Topic" in r.stderr, (r.returncode, r.stdout, r.stderr)
