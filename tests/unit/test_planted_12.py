"""Tests for the bugs planted in the audit of 2026-11-30 against 0260c38 that the tests of the time let through
(docs/architecture.md §11): each fails with its bug planted and passes without it. No cluster: the broker's own
code on what it is given."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.test_reader_seek_grace import _reader_subscription
from topic_broker import service


def test_a_reader_that_came_back_within_the_grace_keeps_its_subscription(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader's subscription kept by a seek is dropped at the end of the grace only if its reader has not come
    back to it: one whose reader is attached again by then stays (dropped, the reader would be left on a
    subscription gone from its topic, which no longer dispatches to it nor sees its acknowledgements)."""
    monkeypatch.setattr(service, "READER_SEEK_GRACE_S", 0.2)

    async def run() -> bool:
        sub = _reader_subscription()
        sub.disconnect_consumers(keep=True)  # the seek
        sub.consumers = {1: object()}  # type: ignore[dict-item]  # its reader came back (add_consumer)
        await asyncio.sleep(0.4)  # past the grace
        return sub.topic.subscriptions.get(sub.name) is sub

    assert asyncio.run(run())
