"""The pure rules of peek, skip and message expiry (topic_broker/sub_ops.py), the message TTL policy and flag."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import time

import pytest

from bookie.config_file import ConfigError
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import sub_ops, wire
from topic_broker.admin import pulsar_date
from topic_broker.cursor import Cursor
from topic_broker.main import add_serve_arguments, config_from_args
from topic_broker.managed_ledger import LedgerView, Position
from topic_broker.service import BrokerConfig
from topic_broker.sub_ops import entry_expired, last_expired, nth_unacked, scan_backlog, skip_target
from zk import MetadataFormatError
from zk.managed_ledgers import NamespacePolicies

P = Position
# ledger 3: 3 entries, ledger 5: none, ledger 7: 2 entries, ledger 9 (current): 4 confirmed
VIEW = LedgerView(((3, 3), (5, 0), (7, 2), (9, 4)))
ORDER = [P(3, 0), P(3, 1), P(3, 2), P(7, 0), P(7, 1), P(9, 0), P(9, 1), P(9, 2), P(9, 3)]


def cursor(md: Position, *acked: Position) -> Cursor:
    c = Cursor(md, (), VIEW.next_position)
    for p in acked:
        c.ack_individual(p)
    return c


def test_nth_unacked_counts_entries_after_the_mark_delete_across_ledgers() -> None:
    c = cursor(P(3, -1))
    assert [nth_unacked(VIEW, c, n) for n in range(1, 10)] == ORDER
    assert nth_unacked(VIEW, c, 10) is None
    assert nth_unacked(VIEW, cursor(P(3, 2)), 1) == P(7, 0)  # the end of a ledger, an empty one skipped
    assert nth_unacked(VIEW, cursor(P(9, 3)), 1) is None
    # a mark-delete in a ledger retention removed: counting starts at the oldest stored entry
    assert nth_unacked(VIEW, cursor(P(1, 40)), 1) == P(3, 0)
    with pytest.raises(ValueError):
        nth_unacked(VIEW, c, 0)


def test_nth_unacked_leaves_out_individually_acknowledged_entries() -> None:
    c = cursor(P(3, 0), P(3, 2), P(7, 0), P(9, 1))
    unacked = [p for p in ORDER if p > P(3, 0) and p not in (P(3, 2), P(7, 0), P(9, 1))]
    assert [nth_unacked(VIEW, c, n) for n in range(1, len(unacked) + 1)] == unacked
    assert nth_unacked(VIEW, c, len(unacked) + 1) is None
    # acks that reach the last entry leave nothing after them
    assert nth_unacked(VIEW, cursor(P(9, 1), P(9, 3)), 2) is None


def test_skip_target_moves_over_n_unacked_entries_or_to_the_end() -> None:
    c = cursor(P(3, 0), P(3, 2), P(7, 0))
    assert skip_target(VIEW, c, 0) == P(3, 0)
    assert skip_target(VIEW, c, 1) == P(3, 1)
    assert skip_target(VIEW, c, 2) == P(7, 1)  # over the acked (3, 2) and (7, 0)
    assert skip_target(VIEW, c, 50) == P(9, 3)
    empty = LedgerView(((4, 0),))
    assert skip_target(empty, Cursor(P(4, -1)), 3) == P(4, -1)
    with pytest.raises(ValueError):
        skip_target(VIEW, c, -1)


def entry(publish_ms: int) -> bytes:
    return wire.make_entry(
        pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=publish_ms), b"x"
    )


def _batch(n: int) -> bytes:
    return wire.make_entry(
        pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, num_messages_in_batch=n), b"x"
    )


async def _read_view(pos: Position, n: int) -> list[tuple[Position, bytes]]:
    """VIEW's entries from ``pos`` on, at most ``n``: each a batch of (its entry id + 1) messages."""
    out: list[tuple[Position, bytes]] = []
    at = VIEW.resolve(pos)
    while at is not None and len(out) < n and at <= ORDER[-1]:
        out.append((at, _batch(at.entry_id + 1)))
        at = VIEW.resolve(VIEW.next_position(at))
    return out


def _scan(start: Position, acked: list[tuple[Position, Position]], max_entries: int) -> sub_ops.BacklogScan:
    deadline = time.monotonic() + 60
    return asyncio.run(
        scan_backlog(_read_view, VIEW.next_position, start, acked, max_entries=max_entries, deadline=deadline)
    )


def test_scan_backlog_counts_batched_messages_skips_acks_and_stops_at_its_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every entry after the start, across ledgers (an empty one passed), its batch's messages each; entries in
    acknowledged ranges left out; at most ``max_entries`` (then ``aborted``, unless nothing was left), read a few
    at a time (a backlog is never read whole); an expired deadline aborts before the next read."""
    monkeypatch.setattr(sub_ops, "SCAN_READ_BATCH", 2)
    whole = _scan(P(3, 0), [], 100)
    assert (whole.entries, whole.messages, whole.aborted) == (9, 6 + 3 + 10, False)
    assert (whole.first, whole.last) == (P(3, 0), P(9, 3))
    acked = _scan(P(3, 0), [(P(3, 1), P(7, 0)), (P(9, 1), P(9, 1))], 100)
    assert (acked.entries, acked.messages, acked.first, acked.last) == (
        5,
        1 + 2 + 1 + 3 + 4,
        P(3, 0),
        P(9, 3),
    )
    limited = _scan(P(3, 0), [], 4)
    assert (limited.entries, limited.messages, limited.last, limited.aborted) == (
        4,
        1 + 2 + 3 + 1,
        P(7, 0),
        True,
    )
    exact = _scan(P(9, 0), [], 4)
    assert (exact.entries, exact.aborted) == (4, False)
    late = asyncio.run(scan_backlog(_read_view, VIEW.next_position, P(3, 0), [], max_entries=9, deadline=0.0))
    assert (late.entries, late.aborted) == (0, True)


def test_entry_expired_is_pulsars_rule() -> None:
    now = 1_000_000
    assert entry_expired(entry(now - 10_001), now, 10)
    assert not entry_expired(entry(now - 10_000), now, 10)  # exactly the TTL old: not yet
    assert not entry_expired(entry(0), now, 0)  # a TTL of 0 expires nothing
    assert not entry_expired(b"not an entry", now, 10)


def test_last_expired_finds_the_newest_expired_entry_after_the_mark_delete() -> None:
    published = dict(zip(ORDER, [100, 200, 300, 400, 500, 600, 700, 800, 900], strict=True))
    reads: list[Position] = []

    async def read(p: Position) -> bytes:
        reads.append(p)
        return entry(published[p])

    def run(md: Position, now_ms: int, ttl_s: int = 1) -> Position | None:
        return asyncio.run(last_expired(VIEW, md, read, now_ms, ttl_s))

    assert run(P(3, -1), 1_000 + 450) == P(7, 0)  # published at 400, the newest before 450
    assert run(P(3, -1), 1_000 + 5_000) == P(9, 3)  # all of them
    assert run(P(3, -1), 1_000 + 50) is None  # none yet
    assert run(P(7, 1), 1_000 + 450) is None  # those expired are behind the mark-delete already
    assert run(P(3, 0), 1_000 + 250) == P(3, 1)
    reads.clear()
    run(P(3, -1), 1_000 + 650)
    assert len(reads) <= 4  # a binary search, not a scan


def test_message_ttl_policy_is_stored_as_pulsars_field() -> None:
    assert NamespacePolicies().message_ttl_in_seconds is None
    p = NamespacePolicies(message_ttl_in_seconds=3600)
    assert p.to_json()["message_ttl_in_seconds"] == 3600
    assert NamespacePolicies.from_json(p.to_json()) == p
    # a removal is written as null (it replaces the old value); older znodes have no field at all
    assert NamespacePolicies.from_json(NamespacePolicies().to_json()).message_ttl_in_seconds is None
    assert NamespacePolicies.from_json({}).message_ttl_in_seconds is None
    for bad in (-1, "60"):
        with pytest.raises(MetadataFormatError, match="message_ttl_in_seconds"):
            NamespacePolicies.from_json({"message_ttl_in_seconds": bad})


@pytest.mark.parametrize("check", ["message_expiry", "subscription_expiry"])
def test_expiry_check_interval_flags(check: str) -> None:
    """--message-expiry-check-interval-s and --subscription-expiry-check-interval-s: Pulsar's
    messageExpiryCheckIntervalInMinutes and subscriptionExpiryCheckIntervalInMinutes, 5 minutes by default."""

    def config(*argv: str) -> BrokerConfig:
        p = argparse.ArgumentParser()
        add_serve_arguments(p)
        return config_from_args(p.parse_args(list(argv)))

    flag, field = f"--{check.replace('_', '-')}-check-interval-s", f"{check}_check_interval_s"
    assert getattr(config(), field) == 300.0  # Pulsar's 5 minutes
    assert getattr(config(flag, "0.5"), field) == 0.5
    for bad in ("0", "-1"):
        with pytest.raises(ConfigError, match=flag):
            config(flag, bad)


def test_publish_time_header_is_written_as_pulsars_date_formatter() -> None:
    # pulsar-admin reads X-Pulsar-publish-time with DateFormatter.parse (ISO 8601 with an offset)
    assert pulsar_date(0) == "1970-01-01T00:00:00.000Z"
    assert pulsar_date(1_764_357_300_042) == "2025-11-28T19:15:00.042Z"
    back = datetime.datetime.fromisoformat(pulsar_date(1_764_357_300_042))
    assert int(back.timestamp() * 1000) == 1_764_357_300_042
    # past year 9999 (a client's time, any u64), as Java's ISO_OFFSET_DATE_TIME writes it (checked with jshell)
    assert pulsar_date(253_402_300_799_999) == "9999-12-31T23:59:59.999Z"
    assert pulsar_date(1_700_000_000_123_456) == "+55840-11-08T22:15:23.456Z"
    assert pulsar_date(2**63 - 1) == "+292278994-08-17T07:12:55.807Z"


def test_scan_backlog_reads_large_entries_a_few_at_a_time() -> None:
    """A backlog of large entries is read about ``SCAN_READ_BYTES`` at a time (Pulsar's
    dispatcherMaxReadSizeBytes), never ``SCAN_READ_BATCH`` entries of them at once; small entries still go
    ``SCAN_READ_BATCH`` at a time."""
    for entry_size, most in ((2 * 1024 * 1024, 2), (1024, sub_ops.SCAN_READ_BATCH)):
        big = b"\x00" * entry_size
        counts: list[int] = []

        async def read(pos: Position, n: int, big: bytes = big, counts: list[int] = counts) -> list:
            got = [(P(1, e), big) for e in range(pos.entry_id, min(pos.entry_id + n, 300))]
            counts.append(len(got))
            return got

        scan = asyncio.run(
            scan_backlog(
                read, lambda p: P(p.ledger_id, p.entry_id + 1), P(1, 0), [], max_entries=1000, deadline=1e18
            )
        )
        assert (scan.entries, scan.messages, scan.aborted) == (300, 300, False)
        assert max(counts) == most
