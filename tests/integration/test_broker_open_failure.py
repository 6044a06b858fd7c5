"""A topic whose open failed after it took the topic's ownership (ZooKeeper failing the read of its policies,
its tail ledger unreadable) lets the ownership go: it held it until the broker stopped, every other broker's
lookup of the topic routed here, and nothing here served it. In-process broker, real ZooKeeper and bookies; the
failure raised once in place of the read."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

import zk
from tests.broker_testing import Brokers
from tests.integration.test_broker_gone_connection import _serving
from topic_broker import service as service_mod
from topic_broker.managed_ledger import ManagedLedgerError
from topic_broker.names import TopicName


async def _policies_unreadable(*args: Any) -> Any:
    raise zk.MetadataError("ZooKeeper connection lost")


async def _tail_unreadable(self: Any) -> None:
    raise ManagedLedgerError("no readable copy of the tail ledger")


@pytest.mark.parametrize("step", ["policies", "tail"])
def test_an_open_that_failed_after_taking_ownership_lets_it_go(
    cluster: Brokers, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    with _serving(cluster) as (service, run):
        name = TopicName.parse(f"persistent://public/default/open-fails-{uuid.uuid4().hex[:8]}")
        with monkeypatch.context() as m:
            if step == "policies":
                m.setattr(service.meta, "get_topic_policies", _policies_unreadable)
            else:
                m.setattr(service_mod.Topic, "scan_tail", _tail_unreadable)
            with pytest.raises((zk.MetadataError, ManagedLedgerError)):
                run(service.get_topic(name))
        assert run(service.meta.get_owner(name.ml_name)) is None  # before: this broker's, until it stopped
        assert run(service.get_topic(name)).name == name  # opened once the failure is gone


def test_a_close_that_ends_after_the_topic_opened_again_leaves_its_ownership(
    cluster: Brokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic unloaded whose close is stuck (its ledger's close waiting on bookies) past CLOSE_WAIT_S is opened
    again meanwhile (an open waits that long, then opens anyway), on the ownership znode the old instance still
    held; the old close, ending later, released that znode: the topic served here with no ownership, which any
    broker's lookup could then take. Its release leaves a znode an instance opened since holds."""
    monkeypatch.setattr(service_mod, "CLOSE_WAIT_S", 0.5)
    with _serving(cluster) as (service, run):
        name = TopicName.parse(f"persistent://public/default/reopened-{uuid.uuid4().hex[:8]}")
        old = run(service.get_topic(name))
        stuck = asyncio.Event()
        close = old.ml.close

        async def stuck_close() -> None:
            await stuck.wait()
            await close()

        old.ml.close = stuck_close
        assert run(service.unload(name))
        new = run(service.get_topic(name))  # after CLOSE_WAIT_S, the old close still under way
        assert new is not old

        async def let_go() -> None:
            stuck.set()
            for _ in range(100):  # the old close ends
                if str(name) not in service._closing:
                    return
                await asyncio.sleep(0.05)

        run(let_go())
        owner = run(service.meta.get_owner(name.ml_name))
        assert owner is not None and owner.broker_id == service.config.id  # before: None


def test_a_close_stuck_in_its_ownership_release_leaves_the_reopened_topics_znode(
    cluster: Brokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic unloaded whose close has looked (the topic not open here) and is in its release's ZooKeeper round
    trips past CLOSE_WAIT_S, when the topic is opened again: the open took the znode still there as its own, and
    the release then deleted it (served here with no ownership). Now the open's take waits for the release and
    makes the znode anew."""
    monkeypatch.setattr(service_mod, "CLOSE_WAIT_S", 0.3)
    with _serving(cluster) as (service, run):
        name = TopicName.parse(f"persistent://public/default/released-{uuid.uuid4().hex[:8]}")
        old = run(service.get_topic(name))
        meta, reopened = service.meta, []
        release = meta.release_ownership

        async def release_after_a_reopen(ml_name: str, broker_id: str) -> bool:
            if not reopened:  # the topic opened again during the release (an open past CLOSE_WAIT_S)
                reopened.append(asyncio.ensure_future(service.get_topic(name)))
                await asyncio.wait([reopened[0]], timeout=3.0)  # (opened, or waiting for this release)
            return await release(ml_name, broker_id)

        meta.release_ownership = release_after_a_reopen
        try:
            assert run(service.unload(name))

            async def reopen() -> Any:
                for _ in range(200):  # the topic opened again and the old close ended
                    if reopened and reopened[0].done() and str(name) not in service._closing:
                        return reopened[0].result()
                    await asyncio.sleep(0.05)
                return None

            new = run(reopen())
        finally:
            del meta.release_ownership
        assert new is not None and new is not old
        owner = run(meta.get_owner(name.ml_name))
        assert owner is not None and owner.broker_id == service.config.id  # before: None
