"""Retention trims ledgers and bookie storage shrinks: a topic with small rollover limits under the namespace
retention 0 / 0, consumed and acknowledged, then left idle: the broker's tick rolls the last ledger and deletes
every consumed ledger from the metadata; the bookies' garbage collection (``PUT /api/v1/gc``) then drops their
data, and the ledger client answers NoSuchLedger for them."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from ledger_client import BookKeeper, ClientConfig
from ledger_client.errors import NoSuchLedgerError
from tests.broker_testing import start_broker

pulsar = pytest.importorskip("pulsar")

ENTRIES_PER_LEDGER = 10
MAX_ROLLOVER_S = 3.0
PAYLOAD = 4096


def http(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def bookie_ledgers(bp: Any) -> set[int]:
    return {
        row["ledger_id"] for row in http("GET", f"http://127.0.0.1:{bp.http_port}/api/v1/ledgers")["ledgers"]
    }


def gc_all(bookies: Any) -> int:
    """A garbage-collection round on every bookie now; their stored bytes in all."""
    return sum(
        http("PUT", f"http://127.0.0.1:{bp.http_port}/api/v1/gc")["stored_bytes"] for bp in bookies.procs
    )


def ml_ledgers(bookies: Any, ml_name: str) -> list[int]:
    from zk import MetadataStore
    from zk.managed_ledgers import BrokerMetadataStore

    async def go() -> list[int]:
        store = MetadataStore.connect(bookies.zk, root=bookies.root)
        try:
            v = await BrokerMetadataStore(store).get_ml_info(ml_name)
            return [] if v is None else [li.ledger_id for li in v.value.ledgers]
        finally:
            store.close()

    return asyncio.run(go())


def set_retention_zero(bookies: Any) -> None:
    """The namespace policy retention 0 / 0 (Pulsar's default, set explicitly): consumed ledgers go at once."""
    import dataclasses

    from zk import MetadataStore
    from zk.managed_ledgers import BrokerMetadataStore, NamespacePolicies

    async def go() -> None:
        store = MetadataStore.connect(bookies.zk, root=bookies.root)
        try:
            meta = BrokerMetadataStore(store)
            p = await meta.get_policies("public", "default") or NamespacePolicies()
            await meta.set_policies(
                "public", "default", dataclasses.replace(p, retention_time_minutes=0, retention_size_mb=0)
            )
        finally:
            store.close()

    asyncio.run(go())


def unreadable(bookies: Any, ledgers: list[int]) -> dict[int, str]:
    """Each ledger's answer from the ledger client: listed? opened? (deleted ones: NoSuchLedger)."""

    async def go() -> dict[int, str]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            listed = set(await bk.list_ledgers())
            out: dict[int, str] = {}
            for lid in ledgers:
                try:
                    rh = await bk.open_ledger(lid, b"", recovery=False)
                    out[lid] = f"opened (listed={lid in listed}, last_entry_id={rh.metadata.last_entry_id})"
                    await rh.close()
                except NoSuchLedgerError:
                    out[lid] = "NoSuchLedger" if lid not in listed else "NoSuchLedger but listed"
            return out
        finally:
            await bk.close()

    return asyncio.run(go())


@pytest.mark.timeout(120)
def test_retention_trims_consumed_ledgers_of_an_idle_topic_and_bookie_storage_shrinks(
    bookies, tmp_path: Path
) -> None:
    bookies.start_many(3, "--checkpoint-interval-s", "1")  # entries reach the storage's files quickly
    broker = start_broker(
        bookies,
        tmp_path,
        10.0,
        "--max-entries-per-ledger",
        str(ENTRIES_PER_LEDGER),
        "--min-rollover-time-s",
        "0",
        "--max-rollover-time-s",
        f"{MAX_ROLLOVER_S:g}",
    )
    broker.wait_ready(60)
    admin = f"http://127.0.0.1:{broker.http_port}/admin/v2"
    set_retention_zero(bookies)
    topic = f"ret-{uuid.uuid4().hex[:8]}"
    ml_name = f"public/default/persistent/{topic}"
    c = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = c.create_producer(topic, batching_enabled=False)
        n = 5 * ENTRIES_PER_LEDGER + 5
        ids = [producer.send(bytes([i % 251]) * PAYLOAD) for i in range(n)]
        produced_ledgers = sorted({m.ledger_id() for m in ids})
        assert len(produced_ledgers) >= 5, produced_ledgers
        listed = ml_ledgers(bookies, ml_name)
        assert set(produced_ledgers) <= set(listed), (produced_ledgers, listed)
        # nothing is trimmed while the subscription has not consumed them
        time.sleep(6.0)  # at least one tick of the broker
        assert set(produced_ledgers) <= set(ml_ledgers(bookies, ml_name))
        on_bookies = set().union(*(bookie_ledgers(bp) for bp in bookies.procs))
        assert set(produced_ledgers) <= on_bookies
        deadline = time.monotonic() + 20
        while (stored_before := gc_all(bookies)) < n * PAYLOAD:  # each entry on 2 of 3 bookies (Qw 2)
            assert time.monotonic() < deadline, f"the bookies stored {stored_before} bytes only"
            time.sleep(0.5)

        for _ in range(n):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        # idle from here on: the tick rolls the last ledger (older than the max rollover time) and trims
        deadline = time.monotonic() + 40
        while True:
            now_listed = ml_ledgers(bookies, ml_name)
            if not set(produced_ledgers) & set(now_listed):
                break
            assert time.monotonic() < deadline, (
                f"ledgers {sorted(set(produced_ledgers) & set(now_listed))} still listed after the consume "
                f"(list {now_listed})\n{broker.log_tail(20)}"
            )
            time.sleep(0.5)
        assert len(now_listed) == 1, now_listed  # only the new, empty current ledger remains
        try:
            stats = http("GET", f"{admin}/persistent/public/default/{topic}/internalStats")
        except urllib.error.URLError:
            stats = None  # a broker without its admin port
        if stats is not None:
            assert [x["ledgerId"] for x in stats["ledgers"]] == now_listed, stats

        # gone from the ledger metadata: the ledger client answers NoSuchLedger
        answers = unreadable(bookies, produced_ledgers)
        assert all(a == "NoSuchLedger" for a in answers.values()), answers
        # and from the bookies once they collect
        stored_after = gc_all(bookies)
        left = {bp.id: bookie_ledgers(bp) & set(produced_ledgers) for bp in bookies.procs}
        assert not any(left.values()), left
        assert stored_after < stored_before - (n - ENTRIES_PER_LEDGER) * PAYLOAD, (
            stored_before,
            stored_after,
        )
        # the topic still works after the trim
        producer.send(b"after")
        assert consumer.receive(timeout_millis=10_000).data() == b"after"
    finally:
        c.close()
        broker.stop()
