"""The broker's liveness check of a connection (``Session.answers_ping``, a producer name's holder pinged) while
the connection is not read for the requests it has held (``Session.held``)."""

from __future__ import annotations

import asyncio
from collections import deque

from tests.unit.test_broker_connection import connected
from topic_broker.service import Session


def _session(writable: bool) -> Session:
    s = Session.__new__(Session)  # only what answers_ping and its end read and write
    s.peer, s.conn, s.writable, s.closed = (
        "test",
        connected(now=0.0, keepalive_interval_s=30.0),
        writable,
        False,
    )
    s.producers, s.publish_paused, s.publish_bytes = {}, False, 0
    s.held = deque()
    s.flush = lambda: None  # type: ignore[method-assign]
    s._liveness, s._liveness_frames, s._liveness_timer = None, 0, None
    s._flush_scheduled = False
    return s


def test_a_check_whose_connection_holds_requests_before_its_ping_is_answered_cannot_tell() -> None:
    """A check began on a connection read as usual (its PING sent), then requests were held and reading stopped,
    so the PONG could not be seen: its time up, it answered False (the client dead, its producer's name given to
    another and the connection closed) though the client took what it was sent. It cannot tell: True; and False
    still when the connection takes nothing either."""

    async def check(writable: bool) -> bool:
        s = _session(writable)
        answer = asyncio.ensure_future(s.answers_ping(0.05))
        await asyncio.sleep(0)  # the PING sent, the connection read
        s.held.append(object())  # type: ignore[arg-type]  # then a request held: not read any more
        s.writable = writable
        return await answer

    assert asyncio.run(check(True)) is True  # before: False
    assert asyncio.run(check(False)) is False
