"""Faults found in review of the broker's registration, unsubscribe and delete marks (real ZooKeeper, bookies and
brokers in the test's process)."""

from __future__ import annotations

import asyncio

import pytest

import zk
from tests.zk_testing import ZkTarget
from zk import layout
from zk.managed_ledgers import BrokerInfo, BrokerMetadataStore, OwnershipInfo


def test_an_ownership_of_the_same_broker_id_is_taken_over_only_while_registered_here(
    zk_connect: ZkTarget, zk_store: zk.MetadataStore
) -> None:
    """A broker re-registering after a lost session (its id registered meanwhile by another live session, which
    it waits out before exiting) found a topic's ownership znode of that other broker, the same id in another
    session, took it for its own earlier session's and deleted it, taking the topic (fencing the other's ledger),
    then left it unowned once refused. That other session's znode is now only taken over while brokers/<id> is
    this session's."""
    ml = "public/default/persistent/same-id"
    mine = OwnershipInfo(broker_id="x:1", service_url="pulsar://a:1", web_service_url="http://a:2")
    theirs = OwnershipInfo(broker_id="x:1", service_url="pulsar://b:1", web_service_url="http://b:2")
    reg = BrokerInfo(service_url="pulsar://b:1", web_service_url="http://b:2")
    other = zk.MetadataStore.connect(zk_connect.connect_string, zk_connect.root)
    try:
        bms, their_bms = BrokerMetadataStore(zk_store), BrokerMetadataStore(other)

        async def body() -> None:
            await their_bms.register_broker("x:1", reg)
            assert await their_bms.acquire_ownership(ml, theirs) == theirs
            with pytest.raises(zk.MetadataExistsError, match="not taken over"):
                await bms.acquire_ownership(ml, mine)
            assert await bms.get_owner(ml) == theirs
            st = zk_store.stat(layout.topic_ownership_path(ml))
            assert st is not None and st.ephemeral_owner == other.session_id, "the other's znode is left"
            # registered here (that session an earlier one of this broker, gone from brokers/): taken over
            await asyncio.to_thread(other.delete, layout.broker_path("x:1"))
            await bms.register_broker("x:1", reg)
            assert await bms.acquire_ownership(ml, mine) == mine

        asyncio.run(body())
    finally:
        other.close()
