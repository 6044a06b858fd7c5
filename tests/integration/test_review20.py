"""Review findings on AutoRecovery and the broker, each against real ZooKeeper and bookie processes."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from typing import Any

import pulsar
import pytest

from autorecovery.auditor import CHECK_READS_IN_FLIGHT, Auditor, read_all_metadata
from autorecovery.config import AutoRecoveryConfig
from autorecovery.metrics import Metrics
from ledger_client import BookKeeper, ClientConfig
from ledger_client.client import _meta
from tests.broker_testing import Brokers, cluster  # noqa: F401
from tests.integration.test_broker_gone_connection import _serving
from topic_broker.names import TopicName
from zk import MetadataConnectionError
from zk.managed_ledgers import BacklogQuota
from zk.underreplication import UnderReplicationManager

PW = b"pw"
LEDGERS = 40  # closed 3/3/2 ledgers of 2 entries: the check asks each bookie for 2 entries of each, 80 in all


def test_the_check_asks_a_bookie_that_did_not_answer_nothing_more(bookies) -> None:
    """A registered bookie that hangs (SIGSTOP: a stalled disk) held the check for one read timeout per wave of
    reads to it: every one of its reads waited out ``read_timeout_s`` in one of the CHECK_READS_IN_FLIGHT slots,
    so with a few hundred ledgers the check, and the auditor's step behind it (which marks a lost bookie's
    ledgers), took minutes. Once a read of it found no answer, its other reads are skipped this check."""
    procs = bookies.start_many(3)

    async def go() -> tuple[Counter[str], dict[int, set[str]], str]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            for _ in range(LEDGERS):
                lh = await bk.create_ledger(3, 3, 2, password=PW)
                await lh.append(b"a")
                await lh.append(b"b")
                await lh.close()
        finally:
            await bk.close()
        auditor_bk = await BookKeeper.connect(
            bookies.zk, config=ClientConfig(zk_root=bookies.root, read_timeout_s=1.0)
        )
        hung = procs[0]
        try:
            asked: Counter[str] = Counter()
            ask = auditor_bk._ask

            async def counted(bookie, build, timeout_s=None):  # type: ignore[no-untyped-def]
                asked[bookie] += 1
                return await ask(bookie, build, timeout_s)

            auditor_bk._ask = counted  # type: ignore[method-assign]
            config = AutoRecoveryConfig(zk=bookies.zk, zk_root=bookies.root, passwords=(PW,))
            auditor = Auditor(auditor_bk, UnderReplicationManager(auditor_bk.store), config, Metrics(), "a")
            ledgers = await _meta(lambda: read_all_metadata(auditor_bk))
            registered = {bp.id for bp in procs}
            assert await auditor.check(ledgers, registered) == {}  # (the auditor's connections open)
            hung.pause()  # the next check's, with the bookie still registered
            asked.clear()
            began = time.monotonic()
            found = await auditor.check(ledgers, registered)
            print(f"check took {time.monotonic() - began:.1f} s")
            return asked, found, hung.id
        finally:
            hung.resume()
            await auditor_bk.close()

    asked, found, hung = asyncio.run(go())
    print("reads asked per bookie:", dict(asked))
    assert found == {}
    assert all(n == 2 * LEDGERS for b, n in asked.items() if b != hung) and len(asked) == 3
    # only the reads already in flight when the first one timed out (at most one slot each)
    assert 1 <= asked[hung] <= CHECK_READS_IN_FLIGHT


def _topic_over_its_quota(service: Any, client: pulsar.Client) -> tuple[Any, pulsar.Consumer]:
    """A topic whose only subscription, "s", holds a backlog over its 10-byte producer_exception quota."""
    name = f"persistent://public/default/unsubquota-{uuid.uuid4().hex[:8]}"
    consumer = client.subscribe(name, "s")
    client.create_producer(name).send(b"m" * 1000)
    topic = service._served(str(TopicName.parse(name)))
    topic.quota = BacklogQuota(limit_size=10, policy="producer_exception")
    return topic, consumer


def test_a_cursor_being_deleted_still_counts_for_the_backlog_quota(cluster: Brokers) -> None:  # noqa: F811
    """An UNSUBSCRIBE whose cursor's znode delete waits (ZooKeeper away, up to its request timeout) and fails: its
    backlog still counts while it waits, so no producer is let in over the quota meanwhile (before: the cursor,
    detached first, was not counted, quota_exceeded answered None, and the tick lifted the quota until the
    delete had failed and the cursor came back)."""
    with _serving(cluster) as (service, _run):
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            topic, consumer = _topic_over_its_quota(service, client)
            meta = service.meta
            during: list[Any] = []

            async def fails(ml_name: str, sub: str) -> None:
                during.append(await service.quota_exceeded(topic, evict=False))
                raise MetadataConnectionError("connection lost (made by the test)")

            meta.delete_cursor = fails
            try:
                with pytest.raises(pulsar.PulsarException):
                    consumer.unsubscribe()
            finally:
                del meta.delete_cursor
            assert len(during) == 1 and during[0] is not None, during
            assert _run(service.quota_exceeded(topic, evict=False)) is not None
        finally:
            client.close()


def test_a_refresh_of_the_cursors_during_an_unsubscribe_does_not_bring_its_mark_back(
    cluster: Brokers,  # noqa: F811
) -> None:
    """The cursors are read again (a tick's retention, an eviction) while an UNSUBSCRIBE deletes one: the refresh
    read its znode before it went and ended after. The subscription is gone and so is its backlog (before: the
    refresh put its mark back among the stored cursors', where it stayed until the next refresh, which retention
    makes only while a ledger could go: the topic kept refusing producers over a quota for a subscription that no
    longer existed, and retention kept its ledgers)."""
    with _serving(cluster) as (service, run):
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            topic, consumer = _topic_over_its_quota(service, client)
            meta = service.meta
            real_delete, real_get = meta.delete_cursor, meta.get_cursor
            refreshes: list[Any] = []

            async def during_a_refresh(ml_name: str, sub: str) -> None:
                read, release = asyncio.Event(), asyncio.Event()

                async def get(ml_name_: str, sub_: str) -> Any:
                    stored = await real_get(ml_name_, sub_)
                    if sub_ == sub:
                        read.set()
                        await release.wait()
                    return stored

                meta.get_cursor = get
                refreshes.append(asyncio.ensure_future(topic.ml.refresh_cursors()))
                await read.wait()
                del meta.get_cursor
                await real_delete(ml_name, sub)
                asyncio.get_running_loop().call_soon(release.set)  # (the refresh ends after the delete's end)

            meta.delete_cursor = during_a_refresh
            try:
                consumer.unsubscribe()
            finally:
                del meta.delete_cursor

            async def settled() -> None:
                await asyncio.gather(*refreshes)

            run(settled())
            assert len(refreshes) == 1
            assert topic.ml.slowest_mark_delete() is None
            assert run(service.quota_exceeded(topic, evict=False)) is None
        finally:
            client.close()
