"""Tests for the bugs planted in the audit of 2026-11-29 against c654dde that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of the heap freeze, the shared liveness PING, the HTTP hardening,
the admin's new stats and routes, and the Spark stream's subscription and deleted topics"): each fails with its
bug planted and passes without it. No broker, bookie or Spark."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import types

import pytest
from aiohttp.test_utils import TestClient, TestServer

import bookie.server
from bookie.auth import TokenVerifier
from bookie.core import BookieCore
from bookie.memjournal import ManualScheduler, MemoryJournal
from bookie.server import AdminAuth, BookieServer, admin_app
from bookie.storage import MemoryLedgerStorage
from topic_broker import sub_ops
from topic_broker.cursor import Cursor, ManagedCursor
from topic_broker.managed_ledger import ManagedLedgerFencedError, Position
from topic_broker.service import _Creation, _Creations
from topic_broker.subscription import HASH_RANGE_SIZE, Subscription, SubType, key_hash


def test_the_heap_is_collected_before_it_is_frozen_so_garbage_is_not_kept_for_ever() -> None:
    """``freeze_heap_once`` collects before ``gc.freeze()``: a reference cycle already dropped (garbage the
    collector had not reached yet) is freed, not moved to the permanent generation where nothing frees it. In a
    fresh process with the collector paused, so that the cycle is garbage when the heap is frozen."""
    script = (
        "import gc, weakref\n"
        "from ledger_client.client import freeze_heap_once\n"
        "class Node: pass\n"
        "gc.disable()\n"
        "a, b = Node(), Node()\n"
        "a.other, b.other = b, a\n"
        "ref = weakref.ref(a)\n"
        "del a, b\n"
        "assert ref() is not None\n"
        "assert freeze_heap_once()\n"
        "gc.enable()\n"
        "gc.collect()\n"
        "print(ref() is None)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["True"]


def test_a_connections_creations_are_forgotten_once_handled() -> None:
    """A PRODUCER or SUBSCRIBE handled (created, refused or closed meanwhile) leaves nothing behind in its
    connection's creations: a long-lived connection whose client creates producers with new ids (as the clients
    do, one id per producer) would otherwise keep an entry for every id it ever used."""
    creations = _Creations()
    seen: list[bool] = []

    async def create(c: _Creation) -> None:
        await asyncio.sleep(0)
        seen.append(c.closed)

    async def main() -> None:
        for i in range(100):
            await creations.run(i, create)
        closed = creations.run(100, create)
        creations.close(100)
        await closed

    asyncio.run(main())
    assert seen == [False] * 100 + [True]
    assert creations._by_id == {}


def test_a_bookies_refused_admin_requests_log_one_line_a_stranger_cannot_split(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admin requests refused for want of a token are logged at most one line per interval (a stranger retrying
    in a loop does not flood the log), that line counting the ones not logged, and the path is written as a
    literal: a ``%0A`` in it (a line break once decoded) writes no line of the stranger's own."""
    monkeypatch.setattr(bookie.server, "_LOG_REFUSALS_EVERY_S", 3600.0)  # however slow the requests
    server = BookieServer(BookieCore(MemoryLedgerStorage(), MemoryJournal().append, ManualScheduler()))
    auth = AdminAuth(verifier=TokenVerifier(b"k" * 32), read="all")
    app = admin_app(server, info=dict, auth=auth)

    async def main() -> list[int]:
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            statuses = []
            for _ in range(20):
                async with client.get("/api/v1/x%0A2026-11-29 WARNING forged line") as r:
                    statuses.append(r.status)
            return statuses

    with caplog.at_level(logging.WARNING, logger="ledgerstore.bookie.server"):
        assert asyncio.run(main()) == [401] * 20
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert server.admin_refused == 20
    assert len(lines) == 1, lines
    assert "\n" not in lines[0] and "\\n" in lines[0], lines


def test_a_method_a_bookies_admin_route_does_not_take_is_refused_405_naming_the_allowed_ones() -> None:
    """``DELETE /api/v1/info``: 405 as JSON, with the ``Allow`` header RFC 9110 requires (the methods the route
    takes), kept when the refusal is written as JSON."""
    server = BookieServer(BookieCore(MemoryLedgerStorage(), MemoryJournal().append, ManualScheduler()))
    app = admin_app(server, info=dict)

    async def main() -> tuple[int, str, dict[str, str]]:
        async with (
            TestClient(TestServer(app, host="127.0.0.1")) as client,
            client.delete("/api/v1/info") as r,
        ):
            return r.status, r.headers.get("Allow", ""), await r.json()

    status, allow, body = asyncio.run(main())
    assert (status, sorted(allow.replace(" ", "").split(","))) == (405, ["GET", "HEAD"])
    assert "DELETE is not allowed here" in body["error"]


def test_the_hashes_past_the_last_point_of_the_ring_are_shown_in_the_first_points_consumers_ranges() -> None:
    """Key_Shared auto-split ``keyHashRanges``: the hashes past the ring's last point wrap around to the consumer
    of its first point, and its stats say so: every key's hash lies in the ranges of the consumer it goes to,
    those of the few hashes after the last point included (20,000 keys, some of them there)."""
    sub = Subscription(SubType.KEY_SHARED)
    for cid in (1, 2, 3):
        sub.add_consumer(cid, f"c{cid}")
    ranges = {cid: sub.key_hash_ranges(cid) for cid in (1, 2, 3)}
    last_point = max(hi for rs in ranges.values() for _lo, hi in rs if hi < HASH_RANGE_SIZE - 1)
    past = 0
    for i in range(20_000):
        key = f"key-{i}".encode()
        h, target = key_hash(key), sub.consumer_for_key(key)
        assert target is not None and any(lo <= h <= hi for lo, hi in ranges[target]), (key, h, target)
        past += h > last_point
    assert past > 0  # the wrap-around was checked


def test_subscription_properties_not_saved_leave_the_old_ones_for_later_saves() -> None:
    """``PUT …/subscription/{sub}/properties`` whose save fails (here the topic fenced: another broker owns it)
    leaves the old properties on the cursor, so its later saves carry them, not the ones never stored."""
    ml = types.SimpleNamespace(
        name="public/default/persistent/t",
        fenced=True,
        next_position=lambda p: Position(p.ledger_id, p.entry_id + 1),
    )
    mc = ManagedCursor(ml, "s", Cursor(Position(1, 0)), 0, {}, 1.0)  # type: ignore[arg-type]
    mc.subscription_properties = {"owner": "billing"}
    with pytest.raises(ManagedLedgerFencedError):
        asyncio.run(mc.set_subscription_properties({"owner": "payments"}))
    assert mc.subscription_properties == {"owner": "billing"}


def test_a_backlog_of_entries_larger_than_a_read_is_counted_whole() -> None:
    """Entries over ``SCAN_READ_BYTES`` (an entry of a 5 MiB message and its metadata) are read one at a time,
    each counted: the scan's next read asks for one entry at least, never none (which read nothing and ended the
    scan after the first entry)."""
    big = b"\x00" * (sub_ops.SCAN_READ_BYTES + 1024)
    asked: list[int] = []

    async def read(pos: Position, n: int) -> list[tuple[Position, bytes]]:
        asked.append(n)
        return [(Position(1, e), big) for e in range(pos.entry_id, min(pos.entry_id + n, 5))]

    scan = asyncio.run(
        sub_ops.scan_backlog(
            read,
            lambda p: Position(p.ledger_id, p.entry_id + 1),
            Position(1, 0),
            [],
            max_entries=100,
            deadline=1e18,
        )
    )
    assert (scan.entries, scan.messages, scan.aborted) == (5, 5, False)
    assert max(asked) == 1
