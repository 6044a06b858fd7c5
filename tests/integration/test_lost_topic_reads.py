"""A topic that stops being served here (unloaded, or its ZooKeeper session lost) while a read for one of its
subscriptions is under way: the read's entries go to nobody. The old topic's dispatcher kept its consumers, and the
late read delivered them to the consumer id the client had subscribed again with: those messages came twice."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pulsar
import pytest

from tests.broker_testing import Brokers, cluster, in_process_broker  # noqa: F401
from tests.integration.test_broker_pulsar_client import drain, quiet_logger, receive_or_none, topic_name
from topic_broker.managed_ledger import ManagedLedger, ManagedLedgerError
from topic_broker.names import TopicName
from topic_broker.server import BrokerServer


def _until(cond: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


async def _loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


@pytest.mark.parametrize("fails", [False, True])
def test_a_read_under_way_when_the_topic_is_lost_delivers_nothing(
    cluster: Brokers,  # noqa: F811
    monkeypatch: Any,
    fails: bool,
) -> None:
    """``fails``: the held read fails, and so does any later read of the old topic (its bookies unreachable from
    here, its ledgers deleted by the new owner). The old topic's dispatcher reads nothing more: it kept its
    consumers' permits, read on after the late read (from the bookies: its managed ledger closed, its cache
    cleared) and, a read failing, tried again every second for ever."""
    with in_process_broker(cluster, tick_interval_s=1.0) as (service, run):
        loop = run(_loop())
        server = BrokerServer(service)
        run(server.start())
        c = pulsar.Client(service.config.service_url, operation_timeout_seconds=30, logger=quiet_logger())
        held: list[asyncio.Future[None]] = []
        lost: list[Any] = []  # the topic let go
        late_reads: list[Any] = []  # reads of its managed ledger after it was let go
        try:
            t = topic_name()
            p = c.create_producer(t, batching_enabled=False)
            for i in range(5):
                p.send(f"m{i}".encode())
            p.close()
            assert run(service.unload(TopicName.parse(t)))  # (the next open reads from the bookies)
            read_entries = ManagedLedger.read_entries

            async def holding(self: ManagedLedger, start: Any, max_entries: int) -> Any:
                if lost and self is lost[0].ml:
                    late_reads.append(start)
                    if fails:
                        raise ManagedLedgerError("a test's read failure", ml_name=self.name)
                got = await read_entries(self, start, max_entries)
                # the dispatcher's first read (the open reads the entries before): handed over when the test says
                if not held and start[1] == 0 and max_entries > 1 and service.served_topics():
                    held.append(loop.create_future())
                    await held[0]
                    if fails:
                        raise ManagedLedgerError("a test's read failure", ml_name=self.name)
                return got

            monkeypatch.setattr(ManagedLedger, "read_entries", holding)
            subscribed: list[Any] = []  # (the SUBSCRIBE is answered after the dispatcher's first read)
            sub = threading.Thread(
                target=lambda: subscribed.append(
                    c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
                ),
                daemon=True,
            )
            sub.start()
            _until(lambda: bool(held), "the dispatcher's read")
            (old,) = service.served_topics()
            loop.call_soon_threadsafe(service.topic_lost, old, "a test")
            _until(
                lambda: any(
                    s.consumers
                    for x in service.served_topics()
                    if x is not old
                    for s in x.subscriptions.values()
                ),
                "the consumer subscribed again to the topic opened again",
            )
            lost.append(old)
            loop.call_soon_threadsafe(held[0].set_result, None)
            sub.join(60)
            (consumer,) = subscribed
            assert [m.data() for m in drain(consumer, 5, timeout_ms=30_000)] == [
                f"m{i}".encode() for i in range(5)
            ]
            extra = receive_or_none(consumer, 2_000)
            assert extra is None, f"delivered twice: {extra.data()!r}"
            assert late_reads == [], f"the topic let go read on: {late_reads}"
        finally:
            if held and not held[0].done():
                loop.call_soon_threadsafe(held[0].set_result, None)
            c.close()
            run(server.stop())
