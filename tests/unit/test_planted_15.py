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


def test_get_schema_requests_are_begun_a_few_at_a_time_as_topic_lists_are() -> None:
    """GET_SCHEMA's answer (a topic's schema) has no size bound, as GET_TOPICS_OF_NAMESPACE's has none: a
    connection that pipelines them has LARGE_ANSWERS_IN_FLIGHT_MAX begun at once, the rest held in order and begun
    as those are answered. Planted with GET_SCHEMA left out of the bound: all begun at once, each queuing a schema
    for a peer that may read none (up to REQUESTS_IN_FLIGHT_MAX of them)."""
    from tests.unit.test_planted_14 import T, _Transport
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import wire
    from topic_broker.server import BrokerProtocol, BrokerServer
    from topic_broker.service import LARGE_ANSWERS_IN_FLIGHT_MAX, Session

    async def main() -> None:
        service = BrokerService(BrokerConfig())
        began: list[int] = []
        answer = asyncio.Event()

        async def held(s: Session, r: object) -> None:
            began.append(r.body.request_id)  # type: ignore[attr-defined]
            await answer.wait()

        service.on_get_schema = held  # type: ignore[method-assign]
        transport = _Transport()
        protocol = BrokerProtocol(service, BrokerServer(service).gate, BrokerServer(service))
        protocol.connection_made(transport)
        s = protocol.session
        assert s is not None
        connect = T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20))
        s.data_received(wire.encode_command(connect))
        n = LARGE_ANSWERS_IN_FLIGHT_MAX + 4
        s.data_received(
            b"".join(
                wire.encode_command(
                    T(
                        type=T.GET_SCHEMA,
                        getSchema=pb.CommandGetSchema(topic="persistent://public/default/t", request_id=i),
                    )
                )
                for i in range(n)
            )
        )
        await asyncio.sleep(0.01)
        assert began == list(range(LARGE_ANSWERS_IN_FLIGHT_MAX)) and len(s.held) == 4, began
        answer.set()
        await asyncio.sleep(0.05)
        assert began == list(range(n)) and not s.held and s.in_flight == 0
        protocol.connection_lost(None)

    asyncio.run(main())


def test_a_read_errors_bookies_tried_are_those_holding_the_entries_read() -> None:
    """spark.planning.bookies_tried (b6b8885): of a ledger whose ensemble changed at entry 10 (A, B, C then A, B,
    D), a read from entry 12 names A, B and D, the one not registered marked; a read from 0 names all four.
    Planted with every ensemble's bookies named whatever the entries read: C, which holds none of entries 12 on,
    was named (and counted 'not registered') for the operator to start."""
    from spark.planning import bookies_tried

    ensembles = [(0, ["A", "B", "C"]), (10, ["A", "B", "D"])]
    assert bookies_tried(ensembles, 12, {"A", "B"}) == (
        "bookies tried: A, B, D (not registered); 1 of 3 not registered: start them, or wait for AutoRecovery"
    )
    assert bookies_tried(ensembles, 0, None) == "bookies tried: A, B, C, D"
