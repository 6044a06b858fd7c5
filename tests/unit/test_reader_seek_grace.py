"""A reader's subscription kept by a seek (for its reader to come back to) is dropped READER_SEEK_GRACE_S after
the LATEST seek: a second seek restarts the grace, so the first seek's timer cannot drop the subscription the
reader is about to come back to."""

from __future__ import annotations

import asyncio
import types

import pytest

from topic_broker import service


def _reader_subscription() -> service.SubscriptionRuntime:
    """A non-durable subscription with no consumer (its reader closed by the seek), on a topic of its own."""
    sub = service.SubscriptionRuntime.__new__(service.SubscriptionRuntime)
    sub.topic = types.SimpleNamespace(subscriptions={})  # type: ignore[assignment]
    sub.name = "reader-1"
    sub.cursor = None
    sub.consumers = {}
    sub._seek_grace = None
    return sub


def test_a_second_seek_restarts_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "READER_SEEK_GRACE_S", 0.4)

    async def run() -> list[bool]:
        sub = _reader_subscription()
        subs = sub.topic.subscriptions
        sub.disconnect_consumers(keep=True)  # the first seek
        await asyncio.sleep(0.25)
        subs.pop(sub.name)  # its reader came back and went with the second seek's close (remove_consumer)
        sub.disconnect_consumers(keep=True)  # the second seek
        seen = []
        await asyncio.sleep(0.25)  # past the first seek's grace, within the second's
        seen.append(subs.get(sub.name) is sub)
        await asyncio.sleep(0.4)  # past the second's: nobody came back
        seen.append(subs.get(sub.name) is sub)
        return seen

    assert asyncio.run(run()) == [True, False]
