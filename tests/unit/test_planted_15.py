"""Tests for the bugs planted in the audit of 89e0dc0..856c42e (docs/architecture.md §11) that the tests of the
time let through: each fails with its bug planted and passes without it. No cluster: a real BrokerService (not
started) and its per-topic ownership lock."""

from __future__ import annotations

import asyncio

from topic_broker.service import BrokerConfig, BrokerService


def test_a_topics_ownership_changes_run_one_at_a_time_and_leave_no_lock_behind() -> None:
    """_ownership_change (an open's or a lookup's take of a topic's ownership znode, a close's release of it):
    with one change under way and a second waiting, a third arriving once the first ended waits for the second
    too; with none left, the topic's lock is dropped. Planted with the lock dropped whenever a change ends: the
    third got a new lock and ran beside the second (a take beside a release, the znode deleted under the topic
    served); planted without the count of users: a lock kept for every topic ever opened."""

    async def run() -> None:
        service = BrokerService(BrokerConfig())
        inside: list[str] = []
        both: list[set[str]] = []

        async def change(who: str, hold: asyncio.Event) -> None:
            async with service._ownership_change("persistent://public/default/t"):
                inside.append(who)
                both.append(set(inside))
                await hold.wait()
                inside.remove(who)

        first_hold, second_hold, third_hold = asyncio.Event(), asyncio.Event(), asyncio.Event()
        first = asyncio.ensure_future(change("first", first_hold))
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(change("second", second_hold))
        await asyncio.sleep(0.01)
        first_hold.set()
        await first
        third = asyncio.ensure_future(change("third", third_hold))
        await asyncio.sleep(0.05)
        assert inside == ["second"], inside  # the third waits
        second_hold.set()
        third_hold.set()
        await asyncio.gather(second, third)
        assert all(len(s) == 1 for s in both), both
        assert service._ownership_locks == {}

    asyncio.run(run())
