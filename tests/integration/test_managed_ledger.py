"""ManagedLedger and ManagedCursor against real ZooKeeper and real bookie processes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import zk
from ledger_client import BookKeeper, ClientConfig
from topic_broker.cursor import InitialPosition, ManagedCursor
from topic_broker.managed_ledger import (
    ManagedLedger,
    ManagedLedgerConfig,
    ManagedLedgerError,
    ManagedLedgerFencedError,
    Position,
)
from zk.managed_ledgers import BrokerInfo, BrokerMetadataStore, OwnershipInfo

ML = "public/default/persistent/orders"
SMALL = dict(ensemble_size=2, write_quorum=2, ack_quorum=2, min_rollover_time_s=0.0)


def payload(i: int) -> bytes:
    return f"m-{i:05d}".encode()


def run(bookies: Any, body: Callable[[BookKeeper, BrokerMetadataStore], Awaitable[None]]) -> None:
    bookies.start_many(3)

    async def go() -> None:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            await body(bk, BrokerMetadataStore(bk.store))
        finally:
            await bk.close()

    asyncio.run(go())


def test_append_and_read_across_rollovers(bookies) -> None:
    async def body(bk: BookKeeper, store: BrokerMetadataStore) -> None:
        cfg = ManagedLedgerConfig(max_entries_per_ledger=7, **SMALL)
        ml = await ManagedLedger.open(bk, store, ML, cfg)
        futs = [await ml.append_future(payload(i)) for i in range(30)]
        positions = list(await asyncio.gather(*futs))
        assert positions == sorted(positions) and len(set(positions)) == 30
        assert len({p.ledger_id for p in positions}) == 5, "7 entries per ledger"
        got = await ml.read_entries(Position(0, 0), 100)
        assert [d for _, d in got] == [payload(i) for i in range(30)]
        assert [p for p, _ in got] == positions
        part = await ml.read_entries(positions[5], 4)  # crosses the first ledger boundary
        assert [p for p, _ in part] == positions[5:9]
        assert ml.last_confirmed_position() == positions[-1]
        assert ml.count_entries(positions[0], positions[-1]) == 29
        assert await ml.find_first(lambda b: b >= payload(17)) == positions[17]
        assert await ml.find_first(lambda b: b > payload(99)) is None
        await ml.close()
        info = (await store.get_ml_info(ML)).value
        assert sum(li.entries for li in info.ledgers) == 30
        md = await bk.ledger_metadata(info.ledgers[0].ledger_id)
        assert md.custom_metadata == {
            "application": b"ledgerstore-broker",
            "component": b"managed-ledger",
            "managed-ledger": ML.encode(),
        }
        # a new owner reads everything back, and the closed empty ledger of the first owner is dropped
        ml2 = await ManagedLedger.open(bk, store, ML, cfg)
        assert [d for _, d in await ml2.read_entries(Position(0, 0), 100)] == [payload(i) for i in range(30)]
        assert all(li.entries > 0 for li in ml2.info.ledgers[:-1])
        await ml2.close()

    run(bookies, body)


def test_new_owner_fences_the_old_one(bookies) -> None:
    async def body(bk: BookKeeper, store: BrokerMetadataStore) -> None:
        cfg = ManagedLedgerConfig(**SMALL)
        old = await ManagedLedger.open(bk, store, ML, cfg)
        acked = [await old.append(payload(i)) for i in range(10)]
        bk2 = await BookKeeper.connect(
            bk.store.connect_string, config=ClientConfig(zk_root=bk.config.zk_root)
        )
        try:
            new = await ManagedLedger.open(bk2, BrokerMetadataStore(bk2.store), ML, cfg)
            with pytest.raises(ManagedLedgerFencedError):
                await old.append(payload(99))
            assert old.fenced
            with pytest.raises(ManagedLedgerFencedError):
                await old.append(payload(100))
            assert (await new.append(b"after")) > acked[-1]
            got = [d for _, d in await new.read_entries(Position(0, 0), 100)]
            assert got == [payload(i) for i in range(10)] + [b"after"], (
                "every acked entry survives, nothing else"
            )
            await old.close()  # a fenced instance only releases resources
            assert new.info.ledgers[-1].ledger_id == new.current_ledger_id
            await new.close()
        finally:
            await bk2.close()

    run(bookies, body)


def test_open_drops_empty_ledgers_and_deletes_them(bookies) -> None:
    async def body(bk: BookKeeper, store: BrokerMetadataStore) -> None:
        cfg = ManagedLedgerConfig(**SMALL)
        ml = await ManagedLedger.open(bk, store, ML, cfg)
        empty = ml.current_ledger_id
        await ml.close()
        ml = await ManagedLedger.open(bk, store, ML, cfg)  # the previous owner's ledger never got an entry
        assert [li.ledger_id for li in ml.info.ledgers] == [ml.current_ledger_id]
        assert empty not in await bk.list_ledgers()
        await ml.close()

    run(bookies, body)


def test_trim_by_retention_deletes_consumed_ledgers(bookies) -> None:
    async def body(bk: BookKeeper, store: BrokerMetadataStore) -> None:
        cfg = ManagedLedgerConfig(max_entries_per_ledger=5, **SMALL)
        ml = await ManagedLedger.open(bk, store, ML, cfg)
        cur = await ManagedCursor.open(ml, "sub", InitialPosition.EARLIEST)
        positions = [await ml.append(payload(i)) for i in range(16)]  # ledgers of 5, 5, 5, 1
        ledger_ids = sorted({p.ledger_id for p in positions})
        assert await ml.trim(ml.slowest_mark_delete(), 0, 0) == [], "nothing consumed yet"
        cur.ack_cumulative(positions[7])
        assert await ml.trim(ml.slowest_mark_delete(), -1, -1) == [], "infinite retention"
        assert await ml.trim(ml.slowest_mark_delete(), 3600, 10**9) == [], "within retention"
        assert await ml.trim(ml.slowest_mark_delete(), 0, 0) == [ledger_ids[0]]
        assert ledger_ids[0] not in await bk.list_ledgers(), "the ledger's metadata and data are deleted"
        assert [p for p, _ in await ml.read_entries(Position(0, 0), 3)] == positions[5:8]
        assert cur.backlog() == 8
        await ml.close()

    run(bookies, body)


def test_cursor_persists_and_restores(bookies) -> None:
    async def body(bk: BookKeeper, store: BrokerMetadataStore) -> None:
        cfg = ManagedLedgerConfig(max_entries_per_ledger=4, **SMALL)
        ml = await ManagedLedger.open(bk, store, ML, cfg)
        positions = [await ml.append(payload(i)) for i in range(10)]
        latest = await ManagedCursor.open(ml, "late", InitialPosition.LATEST, flush_interval_s=0.2)
        cur = await ManagedCursor.open(ml, "sub", InitialPosition.EARLIEST, flush_interval_s=0.2)
        assert latest.backlog() == 0 and cur.backlog() == 10
        assert [p for p, _ in await cur.read_entries(3)] == positions[:3]
        cur.ack_cumulative(positions[2])
        cur.ack_individual(positions[5])
        cur.ack_individual(positions[4])
        assert cur.backlog() == 5
        await asyncio.sleep(0.6)  # the rate-limited flush runs
        stored = (await store.get_cursor(ML, "sub")).value
        assert Position(*stored.mark_delete) == positions[2]
        assert stored.individually_deleted == ((*positions[4], *positions[5]),)
        cur.ack_individual(positions[3])  # mark-delete moves over the range, across the ledger boundary
        assert cur.mark_delete == positions[5]
        await ml.close()  # flushes cursors
        ml = await ManagedLedger.open(bk, store, ML, cfg)
        cur = await ManagedCursor.open(ml, "sub")
        assert cur.mark_delete == positions[5] and cur.backlog() == 4
        assert [p for p, _ in await cur.read_entries(10)] == positions[6:]
        await cur.reset(positions[1])
        assert cur.backlog() == 9 and (await store.get_cursor(ML, "sub")).value.mark_delete == positions[0]
        assert sorted(await store.list_cursors(ML)) == ["late", "sub"]
        await ml.delete()
        assert await store.get_ml_info(ML) is None
        assert not set(p.ledger_id for p in positions) & set(await bk.list_ledgers())

    run(bookies, body)


def test_idle_topic_rolls_over_and_trims_on_tick(bookies) -> None:
    async def body(bk: BookKeeper, store: BrokerMetadataStore) -> None:
        cfg = ManagedLedgerConfig(max_rollover_time_s=0.5, **SMALL)
        ml = await ManagedLedger.open(bk, store, ML, cfg)
        first = ml.current_ledger_id
        await ml.tick()
        assert ml.current_ledger_id == first, "an empty ledger is never rolled"
        pos = [await ml.append(payload(i)) for i in range(3)]
        await ml.tick()
        assert ml.current_ledger_id == first, "too young"
        await asyncio.sleep(0.6)
        await ml.tick()  # rolls the aged ledger; no cursor and retention 0/0, so it is trimmed right away
        assert ml.current_ledger_id != first
        assert first not in [li.ledger_id for li in ml.info.ledgers]
        assert first not in await bk.list_ledgers()
        assert await ml.read_entries(pos[0], 10) == []
        await ml.close()

    run(bookies, body)


def test_ownership_is_first_come_and_ephemeral(bookies) -> None:
    async def body(bk: BookKeeper, store: BrokerMetadataStore) -> None:
        a = OwnershipInfo(broker_id="a:1", service_url="pulsar://a:1", web_service_url="http://a:2")
        b = OwnershipInfo(broker_id="b:1", service_url="pulsar://b:1", web_service_url="http://b:2")
        assert await store.acquire_ownership(ML, a) == a
        other = zk.MetadataStore.connect(bk.store.connect_string, bk.config.zk_root)
        try:
            assert await BrokerMetadataStore(other).acquire_ownership(ML, b) == a
        finally:
            other.close()
        assert not await store.release_ownership(ML, "b:1")
        assert await store.release_ownership(ML, "a:1")
        assert await store.get_owner(ML) is None
        policies = await store.ensure_default_namespace()
        assert policies.retention_time_minutes == 0 and not policies.deduplication_enabled
        await store.create_partitioned_topic(ML, 3)
        await store.update_partitions(ML, 5)
        assert (await store.get_partitions(ML)).partitions == 5

    run(bookies, body)


def test_a_rollover_retried_while_bookies_are_short_backs_off_and_recovers(bookies, caplog) -> None:
    """A bookie of the ensemble dies with no spare (E3 on 3 bookies): the current ledger's writes fail, and it
    can be neither closed by recovery (its write-back needs a third bookie) nor replaced. Appends sent again at
    once fail at once, without another recovery (before, each one retried it: about ten a second per topic on a
    broker, each logged); once the bookie is back the next try after the wait rolls over and appends go on."""
    procs = bookies.start_many(3)

    async def go() -> None:
        cfg = ClientConfig(zk_root=bookies.root, add_timeout_s=1.0, ensemble_change_timeout_s=1.0)
        bk = await BookKeeper.connect(bookies.zk, config=cfg)
        try:
            store = BrokerMetadataStore(bk.store)
            ml = await ManagedLedger.open(
                bk, store, ML, ManagedLedgerConfig(ensemble_size=3, write_quorum=2, ack_quorum=2)
            )
            await ml.append(payload(0))
            procs[0].kill9()
            errors = []
            for i in range(1, 8):
                try:
                    await asyncio.wait_for(ml.append(payload(i)), 30)
                except ManagedLedgerError as e:
                    errors.append(str(e))
            assert len(errors) >= 5, errors
            assert any("next try in" in e for e in errors), errors
            recoveries = [r for r in caplog.records if "closing it by recovery" in r.getMessage()]
            assert len(recoveries) == 1, [r.getMessage() for r in recoveries]
            procs[0].start(wait=True)
            for _ in range(120):
                try:
                    await asyncio.wait_for(ml.append(b"after"), 30)
                    break
                except ManagedLedgerError:
                    await asyncio.sleep(0.5)
            else:
                raise AssertionError("no append succeeded after the bookie came back")
            await ml.close()
            info = (await store.get_ml_info(ML)).value
            assert info.ledgers[-1].entries == 1  # b"after", in a new ledger
        finally:
            await bk.close()

    with caplog.at_level("WARNING", logger="topic_broker.managed_ledger"):
        asyncio.run(go())


def test_a_broker_id_registered_by_another_live_session_is_refused(bookies) -> None:
    """A second broker started with the id of one that runs (another process, another host) took over its
    registration; it is refused after waiting for a crashed one's to go, and the first's stays. The same
    session's registration is updated; once the first is gone, the id registers."""

    async def body(bk: BookKeeper, store: BrokerMetadataStore) -> None:
        first = BrokerInfo(service_url="pulsar://a:1", web_service_url="http://a:2")
        second = BrokerInfo(service_url="pulsar://b:1", web_service_url="http://b:2")
        await store.register_broker("dup:1", first)
        await store.register_broker("dup:1", first)  # our own session's: kept
        other = zk.MetadataStore.connect(bk.store.connect_string, bk.config.zk_root)
        try:
            with pytest.raises(zk.MetadataExistsError, match="another live ZooKeeper session"):
                await BrokerMetadataStore(other).register_broker("dup:1", second, stale_wait_s=0.5)
            assert (await store.list_brokers())[
                "dup:1"
            ].service_url == first.service_url  # before: the second's
            await BrokerMetadataStore(other).unregister_broker("dup:1")  # (the refused broker's stop)
            assert (await store.list_brokers())["dup:1"].service_url == first.service_url
            await store.unregister_broker("dup:1")
            await BrokerMetadataStore(other).register_broker("dup:1", second, stale_wait_s=0.5)
            assert (await store.list_brokers())["dup:1"].service_url == second.service_url
        finally:
            other.close()

    run(bookies, body)
