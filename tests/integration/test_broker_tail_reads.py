"""The managed ledger's tail reads served from its cache without a task (``ManagedLedger.read_cached``),
against real ZooKeeper and bookie processes."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from ledger_client import BookKeeper, ClientConfig
from topic_broker.managed_ledger import ManagedLedger, ManagedLedgerConfig, Position
from zk.managed_ledgers import BrokerMetadataStore

ML = "public/default/persistent/tail"


def test_read_cached_serves_the_acknowledged_tail_and_declines_the_rest(bookies: Any) -> None:
    bookies.start_many(2)

    async def go() -> None:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            cfg = ManagedLedgerConfig(
                ensemble_size=2,
                write_quorum=2,
                ack_quorum=2,
                min_rollover_time_s=0.0,
                max_entries_per_ledger=5,
            )
            ml = await ManagedLedger.open(bk, BrokerMetadataStore(bk.store), ML, cfg)
            lid = ml.current_ledger_id
            assert ml.read_cached(Position(lid, 0), 10) == ([], True), "nothing appended: at the end"
            positions = [await ml.append(f"e{i}".encode()) for i in range(3)]
            assert [p.ledger_id for p in positions] == [lid] * 3
            got = ml.read_cached(Position(lid, 0), 10)
            assert got == ([(positions[i], f"e{i}".encode()) for i in range(3)], True)
            assert ml.read_cached(Position(lid, 1), 1) == ([(positions[1], b"e1")], False), "more after it"
            assert ml.read_cached(Position(lid, 3), 10) == ([], True), "just past the last: at the end"
            assert ml.read_cached(Position(lid, 4), 10) is None, "not a position at the tail"
            assert ml.read_cached(Position(lid, 0), 0) is None
            assert [ml.current_entry_messages(lid, i) for i in range(4)] == [1, 1, 1, None]
            done: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
            await ml.append_from(deque([(b"batch", lambda pos, _e: done.set_result(pos), 31)]))
            assert (await done).entry_id == 3 and ml.current_entry_messages(lid, 3) == 31
            assert ml.current_entry_messages(lid + 1000, 0) is None
            positions.append(await done)
            more = [await ml.append(f"f{i}".encode()) for i in range(3)]  # 5 a ledger: f1 starts the next
            new = ml.current_ledger_id
            assert new != lid and [p.ledger_id for p in more] == [lid, new, new]
            assert ml.current_entry_messages(lid, 3) is None, "no longer the current ledger"
            tail = [(more[1], b"f1"), (more[2], b"f2")]
            assert ml.read_cached(Position(lid, 0), 10) is None, "a closed ledger is read the usual way"
            assert (await ml.read_entries(Position(lid, 0), 10))[0] == (positions[0], b"e0")
            assert ml.read_cached(Position(new, 0), 10) == (tail, True)
            assert ml.next_position(Position(new, 7)) == Position(new, 8), (
                "the current ledger: its next entry"
            )
            assert ml.next_position(Position(lid, 4)) == Position(new, 0), "the end of a closed ledger"
            assert ml.next_position(Position(lid, 2)) == Position(lid, 3)
            ml._cache.clear()  # an entry no longer cached: the read goes to the bookies
            assert ml.read_cached(Position(new, 0), 10) is None
            assert await ml.read_entries(Position(new, 0), 10) == tail
            await ml.close()
            assert ml.read_cached(Position(new, 2), 10) is None, "closed"
        finally:
            await bk.close()

    asyncio.run(go())
