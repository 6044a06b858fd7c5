"""A compaction whose record (the ``__compaction`` cursor's save of its compacted ledger) fails, against real
ZooKeeper and bookie processes: the compacted ledger the stored cursor names, or will name, must never be
deleted, or the next owner of the topic cannot open it (``cannot open compacted ledger``) and cannot serve the
topic at all.

Found by reading: the compactor set the cursor's new state (horizon, ledger) in memory, its save failed
(ZooKeeper away), the compactor deleted the new ledger, and the cursor, still holding that state as unsaved,
saved it at the topic's next tick or close."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import zk
from ledger_client import BookKeeper, ClientConfig
from ledger_client import errors as LE
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.compaction import (
    COMPACTED_TOPIC_LEDGER_PROPERTY,
    COMPACTION_SUBSCRIPTION,
    TopicCompaction,
    decode_compacted,
)
from topic_broker.managed_ledger import ManagedLedger, ManagedLedgerConfig, ManagedLedgerError
from zk import layout
from zk.managed_ledgers import BrokerMetadataStore

ML = "public/default/persistent/compaction-record"
SMALL = dict(ensemble_size=2, write_quorum=2, ack_quorum=2, min_rollover_time_s=0.0)


def keyed(key: str, value: bytes) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key=key)
    return wire.make_entry(md, value)


async def keyed_topic(
    bk: BookKeeper,
) -> tuple[BrokerMetadataStore, ManagedLedgerConfig, ManagedLedger, TopicCompaction]:
    """The topic's managed ledger with 4 messages of 2 keys, and its compaction (not run yet)."""
    store = BrokerMetadataStore(bk.store)
    config = ManagedLedgerConfig(**SMALL)
    ml = await ManagedLedger.open(bk, store, ML, config)
    for i in range(4):
        await ml.append(keyed(f"k{i % 2}", b"v%d" % i))
    return store, config, ml, TopicCompaction(ml, bk)


async def compacted_then_more(
    bk: BookKeeper,
) -> tuple[BrokerMetadataStore, ManagedLedgerConfig, ManagedLedger, TopicCompaction]:
    """:func:`keyed_topic` compacted once, then 4 more messages of the 2 keys."""
    store, config, ml, comp = await keyed_topic(bk)
    await comp.compact()
    for i in range(4, 8):
        await ml.append(keyed(f"k{i % 2}", b"v%d" % i))
    return store, config, ml, comp


async def recorded_ledger(store: BrokerMetadataStore) -> Any:
    """The compacted ledger the stored ``__compaction`` cursor of the topic names."""
    stored = await store.get_cursor(ML, COMPACTION_SUBSCRIPTION)
    assert stored is not None
    return stored.value.properties[COMPACTED_TOPIC_LEDGER_PROPERTY]


async def assert_ledger_exists(bk: BookKeeper, ledger_id: int, password: bytes) -> None:
    handle = await bk.open_ledger(ledger_id, password, recovery=False)
    await handle.close()


@pytest.mark.parametrize("applied", [False, True], ids=["refused", "reply-lost"])
def test_a_compaction_whose_record_fails_leaves_the_topic_loadable_with_the_ledger_its_cursor_names(
    bookies, applied: bool
) -> None:
    bookies.start_many(2)

    async def body() -> None:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            store, config, ml, comp = await keyed_topic(bk)
            await comp.compact()
            assert comp.view is not None
            first = comp.view.ledger_id
            for i in range(4, 8):
                await ml.append(keyed(f"k{i % 2}", b"v%d" % i))

            # 1. the save that records the second compaction fails once: ZooKeeper applied nothing, or applied
            # it and its reply was lost
            cursor_path = layout.ml_cursor_path(ML, COMPACTION_SUBSCRIPTION)
            real_set = bk.store.aset
            created: list[int] = []
            real_create = bk.create_ledger

            async def remember(*args: Any, **kwargs: Any) -> Any:
                lh = await real_create(*args, **kwargs)
                created.append(lh.ledger_id)
                return lh

            saves = 0

            async def away(path: str, value: Any, version: int) -> Any:
                nonlocal saves
                saves += path == cursor_path
                if path != cursor_path or saves == 1:  # (the first names the ledger being written)
                    return await real_set(path, value, version)
                bk.store.aset = real_set  # type: ignore[method-assign]
                if applied:
                    await real_set(path, value, version)
                raise zk.MetadataConnectionError("ZooKeeper did not answer within 10s")

            bk.store.aset = away  # type: ignore[method-assign]
            bk.create_ledger = remember  # type: ignore[method-assign]
            with pytest.raises(zk.MetadataConnectionError):
                await comp.compact()
            assert bk.store.aset == real_set
            bk.create_ledger = real_create  # type: ignore[method-assign]
            assert comp.view is not None and comp.view.ledger_id == first  # still the first compaction's view
            assert len(created) == 1 and saves == 2

            # 2. the topic is closed (its cursors saved) and opened by a new owner, which opens the ledger the
            # stored cursor names
            await comp.close()
            await ml.close()
            recorded = await recorded_ledger(store)
            await assert_ledger_exists(bk, recorded, config.password)
            ml2 = await ManagedLedger.open(bk, store, ML, config)
            comp2 = TopicCompaction(ml2, bk)
            await comp2.load()
            assert comp2.view is not None and comp2.view.ledger_id == recorded
            assert recorded == first  # the previous record saved again
            with pytest.raises(LE.NoSuchLedgerError):  # and the failed compaction's ledger deleted
                await bk.open_ledger(created[0], config.password, recovery=False)
            await comp2.compact()  # and compacts again
            assert comp2.view is not None and comp2.view.horizon == ml2.last_confirmed_position()
            await comp2.close()
            await ml2.close()
        finally:
            await bk.close()

    asyncio.run(body())


def test_a_topic_deleted_while_its_compaction_opens_the_ledger_it_recorded_leaves_no_ledger(bookies) -> None:
    """The topic deleted (its compaction cancelled) after the compaction recorded its new ledger and while it
    opened it: the new ledger went with the topic, as the previous one did."""
    bookies.start_many(2)

    async def body() -> None:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            store, config, ml, comp = await keyed_topic(bk)
            real_open = bk.open_ledger
            opening = asyncio.Event()

            async def slow_open(*args: Any, **kwargs: Any) -> Any:
                opening.set()
                await asyncio.sleep(30)  # (the topic is deleted meanwhile)
                return await real_open(*args, **kwargs)

            bk.open_ledger = slow_open  # type: ignore[method-assign]
            comp.trigger()
            await asyncio.wait_for(opening.wait(), 30)
            bk.open_ledger = real_open  # type: ignore[method-assign]
            recorded = await recorded_ledger(store)
            await comp.delete()
            await ml.delete()
            with pytest.raises(LE.NoSuchLedgerError):
                await bk.open_ledger(recorded, config.password, recovery=False)
        finally:
            await bk.close()

    asyncio.run(body())


def test_a_recorded_compacted_ledger_that_could_not_be_opened_is_the_base_of_the_next_compaction(
    bookies,
) -> None:
    """ZooKeeper away just after the compaction recorded its ledger: opening it failed, the view stayed empty.
    Retention may trim what the recorded ledger covers; the next compaction starts from that ledger (it used to
    start from the topic's first entry, so the keys only the trimmed ledger held were lost)."""
    bookies.start_many(2)

    async def body() -> None:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            store = BrokerMetadataStore(bk.store)
            config = ManagedLedgerConfig(**SMALL, max_entries_per_ledger=4, retention_time_s=0)
            ml = await ManagedLedger.open(bk, store, ML, config)
            for i in range(4):
                await ml.append(keyed(f"k{i % 2}", b"v%d" % i))
            first_ledger = ml.first_position().ledger_id
            await ml.append(keyed("k2", b"v4"))  # in the next ledger
            assert ml.last_confirmed_position().ledger_id != first_ledger
            comp = TopicCompaction(ml, bk)
            real_open = bk.open_ledger

            async def away(*args: Any, **kwargs: Any) -> Any:
                raise LE.LedgerError("ZooKeeper did not answer within 10s")

            bk.open_ledger = away  # type: ignore[method-assign]
            with pytest.raises(ManagedLedgerError):
                await comp.compact()
            bk.open_ledger = real_open  # type: ignore[method-assign]
            assert comp.view is None
            await ml.trim_by_retention()
            assert ml.first_position().ledger_id != first_ledger  # what the recorded ledger covers is trimmed
            await ml.append(keyed("k3", b"v5"))
            await comp.compact()
            assert comp.view is not None
            kept = [
                decode_compacted(e.data)[1]
                for e in [x async for x in comp.view.handle.read(0, comp.view.entries - 1)]
            ]
            assert [bytes(wire.parse_entry(d, verify_checksum=False)[1]) for d in kept] == [
                b"v2",
                b"v3",
                b"v4",
                b"v5",
            ]
            await comp.close()
            await ml.close()
        finally:
            await bk.close()

    asyncio.run(body())


def test_leftovers_are_not_deleted_while_the_cursor_holds_an_unsaved_record(bookies) -> None:
    """The record of a compaction applied with its reply lost, its undo not saved (the stored cursor names the
    new ledger as compacted, the cursor in memory as being written): the next compaction, ZooKeeper still away
    for the cursor, deletes nothing, since the ledger it would delete is the one the stored cursor names."""
    bookies.start_many(2)

    async def body() -> None:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            store, config, ml, comp = await compacted_then_more(bk)
            cursor_path = layout.ml_cursor_path(ML, COMPACTION_SUBSCRIPTION)
            real_set = bk.store.aset
            saves = 0

            async def away(path: str, value: Any, version: int) -> Any:
                nonlocal saves
                saves += path == cursor_path
                if path != cursor_path or saves == 1:  # (the first names the ledger being written)
                    return await real_set(path, value, version)
                if saves == 2:
                    await real_set(path, value, version)  # the record applied, its reply lost
                raise zk.MetadataConnectionError("ZooKeeper did not answer within 10s")

            bk.store.aset = away  # type: ignore[method-assign]
            with pytest.raises(zk.MetadataConnectionError):
                await comp.compact()
            with pytest.raises(zk.MetadataConnectionError):
                await comp.compact()  # ZooKeeper still away for the cursor
            bk.store.aset = real_set  # type: ignore[method-assign]
            await assert_ledger_exists(bk, await recorded_ledger(store), config.password)  # not deleted
            await comp.close()
            await ml.close()
        finally:
            await bk.close()

    asyncio.run(body())


async def gone(bk: BookKeeper, ledger_id: int, password: bytes) -> None:
    """Until the ledger is deleted."""
    while True:
        try:
            await assert_ledger_exists(bk, ledger_id, password)
        except LE.NoSuchLedgerError:
            return
        await asyncio.sleep(0.1)


def test_a_broker_dead_just_after_its_compaction_created_its_ledger_leaves_no_ledger(bookies) -> None:
    """The broker dies the moment its compaction's new ledger exists (before anything else is saved): the stored
    cursor names that ledger already (its id was recorded before the ledger was created), so the next owner
    deletes it when it loads the topic, without holding the load up. Created first and named after, as it was,
    it stayed in the ledger list for good; named, it waited for the topic's next compaction."""
    bookies.start_many(2)

    async def body() -> None:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            store, config, ml, comp = await compacted_then_more(bk)
            real_create = bk.create_ledger
            created: list[int] = []
            named: list[bool] = []

            async def then_die(*args: Any, **kwargs: Any) -> Any:
                lh = await real_create(*args, **kwargs)
                stored = await store.get_cursor(ML, COMPACTION_SUBSCRIPTION)
                assert stored is not None
                named.append(lh.ledger_id in stored.value.properties.values())
                created.append(lh.ledger_id)
                await asyncio.Event().wait()  # the broker is gone: nothing after this runs
                return lh

            bk.create_ledger = then_die  # type: ignore[method-assign]
            dying = asyncio.create_task(comp.compact())
            while not created:
                assert not dying.done()
                await asyncio.sleep(0.05)
            bk.create_ledger = real_create  # type: ignore[method-assign]
            assert named == [True]  # the stored cursor named the ledger the moment it existed

            # the next owner takes the topic over: its load deletes the leftover in the background (the load
            # does not wait for the deletion, held here until the load is over), and no compaction is needed
            ml2 = await ManagedLedger.open(bk, store, ML, config)
            comp2 = TopicCompaction(ml2, bk)
            real_delete = bk.delete_ledger
            loaded = asyncio.Event()

            async def after_load(*args: Any, **kwargs: Any) -> Any:
                await loaded.wait()
                return await real_delete(*args, **kwargs)

            bk.delete_ledger = after_load  # type: ignore[method-assign]
            await asyncio.wait_for(comp2.load(), 30)
            loaded.set()
            await asyncio.wait_for(gone(bk, created[0], config.password), 30)
            bk.delete_ledger = real_delete  # type: ignore[method-assign]
            adopted = await recorded_ledger(store)
            assert comp2.view is not None and comp2.view.ledger_id == adopted
            await assert_ledger_exists(bk, adopted, config.password)  # the compacted ledger in force stays
            await ml2.append(keyed("k2", b"v8"))
            await comp2.compact()
            stored = await store.get_cursor(ML, COMPACTION_SUBSCRIPTION)
            assert stored is not None and list(stored.value.properties) == [COMPACTED_TOPIC_LEDGER_PROPERTY]
            assert (
                comp2.view is not None
                and comp2.view.ledger_id == stored.value.properties[COMPACTED_TOPIC_LEDGER_PROPERTY]
            )
            dying.cancel()
            await comp2.close()
            await ml2.close()
        finally:
            await bk.close()

    asyncio.run(body())
