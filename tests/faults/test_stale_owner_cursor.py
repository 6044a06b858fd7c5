"""Two owners of one topic: the old one (SIGSTOPped past its ZooKeeper session, then resumed) must write no
cursor once the new owner has opened it. Real ZooKeeper and bookie processes, the two owners' managed ledgers
in this process (each with its own ledger client and ZooKeeper session), so the order of their writes is the
test's: the old owner's acknowledgements taken but not yet saved when it stopped are saved by its delayed
flush (or its topic's close) when it resumes, after the new owner opened the cursor."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import zk
from ledger_client import BookKeeper, ClientConfig
from topic_broker.cursor import InitialPosition, ManagedCursor
from topic_broker.managed_ledger import ManagedLedger, ManagedLedgerConfig, ManagedLedgerFencedError, Position
from zk.managed_ledgers import BrokerMetadataStore

ML = "public/default/persistent/stale-owner"
CFG = ManagedLedgerConfig(ensemble_size=2, write_quorum=2, ack_quorum=2, min_rollover_time_s=0.0)


def two_owners(bookies: Any, body: Callable[[BookKeeper, BookKeeper], Awaitable[None]]) -> None:
    """``body(old, new)``: two ledger clients, each with its own ZooKeeper session, as two brokers have."""
    bookies.start_many(3)

    async def go() -> None:
        cfg = ClientConfig(zk_root=bookies.root)
        bk_old = await BookKeeper.connect(bookies.zk, config=cfg)
        bk_new = await BookKeeper.connect(bookies.zk, config=cfg)
        try:
            await body(bk_old, bk_new)
        finally:
            await bk_old.close()
            await bk_new.close()

    asyncio.run(go())


async def unanswered_save(bk: BookKeeper, cursor: ManagedCursor, ack: Position, *, applied: bool) -> None:
    """``ack`` taken and saved with ZooKeeper's reply lost (``applied``: the write was made) or not sent at all:
    the save raises MetadataConnectionError, as when ZooKeeper goes away."""
    real_set = bk.store.aset

    async def no_answer(path: str, value: Any, version: int) -> Any:
        if applied:
            await real_set(path, value, version)
        raise zk.MetadataConnectionError("ZooKeeper did not answer within 10s (the reply was lost)")

    bk.store.aset = no_answer  # type: ignore[method-assign]
    try:
        cursor.ack_cumulative(ack)
        with pytest.raises(zk.MetadataConnectionError):
            await cursor.flush()
    finally:
        bk.store.aset = real_set  # type: ignore[method-assign]


@pytest.mark.timeout(60)
def test_the_old_owner_resumed_writes_no_cursor_after_the_new_owner_opened_it(bookies) -> None:
    async def body(bk_old: BookKeeper, bk_new: BookKeeper) -> None:
        store_old, store_new = BrokerMetadataStore(bk_old.store), BrokerMetadataStore(bk_new.store)
        old = await ManagedLedger.open(bk_old, store_old, ML, CFG)
        positions = [await old.append(f"m{i}".encode()) for i in range(10)]
        cur_old = await ManagedCursor.open(old, "sub", InitialPosition.EARLIEST, flush_interval_s=3600)
        cur_old.ack_cumulative(positions[2])
        await cur_old.flush()
        cur_old.ack_cumulative(positions[5])  # taken just before the stop, not saved yet

        new = await ManagedLedger.open(bk_new, store_new, ML, CFG)  # fences the old owner's ledger
        cur_new = await ManagedCursor.open(new, "sub", flush_interval_s=3600)
        assert cur_new.mark_delete == positions[2]

        # the old owner resumes: its delayed flush (or its topic's close) saves the cursor
        with pytest.raises(ManagedLedgerFencedError):
            await cur_old.flush()
        stored: Any = await store_new.get_cursor(ML, "sub")
        assert Position(*stored.value.mark_delete) == positions[2], "the old owner wrote the cursor"

        cur_new.ack_cumulative(positions[3])  # the new owner's consumer goes on, unfenced
        await cur_new.flush()
        assert not new.fenced
        stored = await store_new.get_cursor(ML, "sub")
        assert Position(*stored.value.mark_delete) == positions[3]
        assert await new.append(b"after") > positions[-1]
        await new.close()
        await old.close()

    two_owners(bookies, body)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("then_one_not_sent", [False, True], ids=["one-in-doubt", "two-in-doubt"])
def test_the_old_owners_save_whose_reply_was_lost_does_not_take_over_the_new_owners_cursor(
    bookies, then_one_not_sent: bool
) -> None:
    """The old owner's last save was applied but its reply lost (stopped before reading it): the new owner's
    take-over write stores that same content. The old owner's next save must not take it for its own. Nor
    when a second save (ZooKeeper gone) was not applied: both are in doubt, but they were CAS writes at one
    version, so one at most moved it on, and the take-over's version is one further."""

    async def body(bk_old: BookKeeper, bk_new: BookKeeper) -> None:
        store_new = BrokerMetadataStore(bk_new.store)
        old = await ManagedLedger.open(bk_old, BrokerMetadataStore(bk_old.store), ML, CFG)
        positions = [await old.append(f"m{i}".encode()) for i in range(6)]
        cur_old = await ManagedCursor.open(old, "sub", InitialPosition.EARLIEST, flush_interval_s=3600)
        await unanswered_save(bk_old, cur_old, positions[1], applied=True)
        if then_one_not_sent:
            await unanswered_save(bk_old, cur_old, positions[2], applied=False)

        new = await ManagedLedger.open(bk_new, store_new, ML, CFG)
        cur_new = await ManagedCursor.open(new, "sub", flush_interval_s=3600)
        assert cur_new.mark_delete == positions[1]

        cur_old.ack_cumulative(positions[3])
        with pytest.raises(ManagedLedgerFencedError):
            await cur_old.flush()
        cur_new.ack_cumulative(positions[2])
        await cur_new.flush()
        assert not new.fenced
        stored: Any = await store_new.get_cursor(ML, "sub")
        assert Position(*stored.value.mark_delete) == positions[2]
        await new.close()
        await old.close()

    two_owners(bookies, body)
