"""The pure cursor, and the pure managed-ledger rules it relies on (positions across ledgers, rollover, retention)."""

from __future__ import annotations

import json
import logging

import pytest

from topic_broker.cursor import MAX_STORED_RANGES, Cursor
from topic_broker.managed_ledger import (
    LedgerView,
    ManagedLedgerConfig,
    Position,
    ledgers_to_trim,
    should_rollover,
)
from topic_broker.subscription import cumulative_batch_index, unacked_set
from zk import MetadataFormatError
from zk.managed_ledgers import CursorInfo, LedgerInfo, ManagedLedgerInfo

P = Position
# ledger 3: 3 entries, ledger 5: 2 entries, ledger 9 (current): 4 confirmed
VIEW = LedgerView(((3, 3), (5, 2), (9, 4)))


# --- cursor -------------------------------------------------------------------------------------------------------


def test_individual_acks_merge_and_advance_mark_delete() -> None:
    c = Cursor(P(1, -1))
    assert c.ack_individual(P(1, 2)) and c.ack_individual(P(1, 4))
    assert c.individually_deleted == [(P(1, 2), P(1, 2)), (P(1, 4), P(1, 4))]
    c.ack_individual(P(1, 3))
    assert c.individually_deleted == [(P(1, 2), P(1, 4))] and c.mark_delete == P(1, -1)
    assert c.is_acked(P(1, 3)) and not c.is_acked(P(1, 0)) and not c.is_acked(P(1, 5))
    c.ack_individual(P(1, 1))
    assert c.mark_delete == P(1, -1)
    c.ack_individual(P(1, 0))
    assert c.mark_delete == P(1, 4) and c.individually_deleted == []
    assert not c.ack_individual(P(1, 2)), "an acked entry acked again changes nothing"


def test_cumulative_ack_swallows_ranges_it_reaches() -> None:
    c = Cursor(P(1, -1))
    for e in (3, 4, 7, 9):
        c.ack_individual(P(1, e))
    assert c.ack_cumulative(P(1, 3))
    assert c.mark_delete == P(1, 4) and c.individually_deleted == [(P(1, 7), P(1, 7)), (P(1, 9), P(1, 9))]
    assert not c.ack_cumulative(P(1, 2))
    c.ack_cumulative(P(1, 8))
    assert c.mark_delete == P(1, 9) and c.individually_deleted == []


def test_mark_delete_crosses_ledger_boundary_with_ml_knowledge() -> None:
    c = Cursor(P(3, -1), (), VIEW.next_position)
    c.ack_individual(P(5, 0))
    c.ack_individual(P(3, 1))
    c.ack_individual(P(3, 2))
    assert c.individually_deleted == [(P(3, 1), P(5, 0))], "ledger 3 ends at entry 2; ledger 5 follows"
    c.ack_individual(P(3, 0))
    assert c.mark_delete == P(5, 0)


def test_a_range_ack_covers_positions_with_or_without_entries_and_merges_what_it_overlaps() -> None:
    """What a compaction removed, acknowledged as ranges (``(9, -1)``: up to the end of the ledgers before 9)."""
    c = Cursor(P(3, -1), next_position=VIEW.next_position)
    c.ack_individual(P(5, 1))
    c.ack_individual(P(9, 2))
    c.ack_batch(P(9, 1), 0b01)
    assert c.ack_range(P(3, 1), P(9, -1))  # over (5, 1) and ledger 5's end
    assert c.individually_deleted == [(P(3, 1), P(9, -1)), (P(9, 2), P(9, 2))]
    assert not c.ack_range(P(5, 0), P(5, 1))  # inside it: nothing changes
    assert c.ack_range(P(9, 0), P(9, 1))  # touches both neighbours: one range, the batch's partial acks gone
    assert c.individually_deleted == [(P(3, 1), P(9, 2))] and c.batch_acked == {}
    assert c.ack_range(P(3, 0), P(3, 0))  # the gap after the mark-delete: it moves over everything
    assert c.mark_delete == P(9, 2) and c.individually_deleted == []
    assert not c.ack_range(P(3, 0), P(9, 2)) and not c.ack_range(P(9, 5), P(9, 4))


def test_reset_moves_mark_delete_and_forgets_acks() -> None:
    c = Cursor(P(1, 5))
    c.ack_individual(P(1, 8))
    c.reset(P(1, 1))
    assert c.mark_delete == P(1, 1) and c.individually_deleted == []
    assert not c.is_acked(P(1, 2))


def test_json_round_trip_keeps_state() -> None:
    c = Cursor(P(2, 4))
    for e in (6, 7, 10):
        c.ack_individual(P(2, e))
    body = json.loads(json.dumps(c.to_json()))
    assert body["mark_delete"] == [2, 4] and body["individually_deleted"] == [[2, 6, 2, 7], [2, 10, 2, 10]]
    d = Cursor.from_json({**body, "format_version": 1})
    assert d.mark_delete == c.mark_delete and d.individually_deleted == c.individually_deleted
    info = CursorInfo.from_json(body)
    assert CursorInfo.from_json(info.to_json()) == info


def test_batch_acks_are_stored_until_their_entry_is_acked_and_old_cursors_load_without_them() -> None:
    c = Cursor(P(2, 4))
    assert c.ack_batch(P(2, 6), 0b101) and c.ack_batch(P(2, 8), 0b1)
    assert not c.ack_batch(P(2, 6), 0b1)  # nothing new
    assert c.ack_batch(P(2, 6), 0b10)
    assert not c.ack_batch(P(2, 3), 0b1)  # before the mark-delete: already acked whole
    assert not c.is_acked(P(2, 6))
    body = json.loads(json.dumps(c.to_json()))
    assert body["batch_acked"] == [[2, 6, 0b111], [2, 8, 0b1]]
    d = Cursor.from_json(body)
    assert d.batch_acked == {P(2, 6): 0b111, P(2, 8): 0b1}
    d.ack_individual(P(2, 8))  # the whole entry acked: its batch mask goes
    d.ack_cumulative(P(2, 6))
    assert d.batch_acked == {} and "batch_acked" not in d.to_json()
    old = {"mark_delete": [2, 4], "individually_deleted": [], "properties": {}, "last_active_ms": 0}
    assert Cursor.from_json(old).batch_acked == {}  # stored before batch acks were
    c.reset(P(2, 4))
    assert c.batch_acked == {}
    for bad in ([[2, 6]], [[2, 6, 0]], [[2, 6, "7"]], [[2, 6, True]]):
        with pytest.raises(MetadataFormatError, match="batch_acked"):
            CursorInfo.from_json({**old, "batch_acked": bad})


def test_subscription_properties_are_stored_when_set_and_old_cursors_load_without_them() -> None:
    """Pulsar's subscription properties (strings) go with the cursor's record, only when there are some."""
    c = Cursor(P(2, 4))
    info = c.to_info(subscription_properties={"owner": "billing", "tier": "gold"})
    body = json.loads(json.dumps(info.to_json()))
    assert body["subscription_properties"] == {"owner": "billing", "tier": "gold"}
    assert CursorInfo.from_json(body) == info
    assert "subscription_properties" not in c.to_info().to_json()
    old = {"mark_delete": [2, 4], "individually_deleted": [], "properties": {}, "last_active_ms": 0}
    assert CursorInfo.from_json(old).subscription_properties == {}
    with pytest.raises(MetadataFormatError, match="subscription_properties"):
        CursorInfo.from_json({**old, "subscription_properties": ["owner"]})


def test_a_cumulative_ack_set_stops_before_the_first_unacked_message() -> None:
    assert cumulative_batch_index(unacked_set(10, 0b1111)) == 3
    assert cumulative_batch_index(unacked_set(10, 0)) == -1
    assert cumulative_batch_index(unacked_set(130, (1 << 100) - 1)) == 99  # in the second word
    with pytest.raises(ValueError, match="whole entry"):
        cumulative_batch_index([0, 0])


def test_stored_ranges_are_capped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    c = Cursor(P(1, -1))
    for e in range(1, 2 * (MAX_STORED_RANGES + 5), 2):
        c.ack_individual(P(1, e))
    with caplog.at_level(logging.WARNING):
        info = c.to_info()
    assert len(info.individually_deleted) == MAX_STORED_RANGES
    assert info.individually_deleted[0] == (1, 1, 1, 1), "the ranges nearest mark-delete are kept"
    assert "ack ranges" in caplog.text
    restored = Cursor.from_info(info)
    assert not restored.is_acked(P(1, 2 * MAX_STORED_RANGES + 5)), "dropped acks are redelivered, not lost"


# --- positions across ledgers -----------------------------------------------------------------------------------


def test_next_position_skips_to_next_ledger_at_the_end_of_a_closed_one() -> None:
    assert VIEW.next_position(P(3, 1)) == P(3, 2)
    assert VIEW.next_position(P(3, 2)) == P(5, 0)
    assert VIEW.next_position(P(5, 1)) == P(9, 0)
    assert VIEW.next_position(P(9, 3)) == P(9, 4), "the current ledger continues"
    assert VIEW.next_position(P(4, 7)) == P(5, 0), "a trimmed or unknown ledger moves on"
    assert VIEW.next_position(P(3, -1)) == P(3, 0)


def test_first_last_resolve_and_counts() -> None:
    assert VIEW.first_position() == P(3, 0) and VIEW.last_position() == P(9, 3)
    assert (
        VIEW.resolve(P(3, 3)) == P(5, 0)
        and VIEW.resolve(P(9, 4)) is None
        and VIEW.resolve(P(0, 0)) == P(3, 0)
    )
    assert VIEW.count_entries(P(3, -1), P(9, 3)) == 9
    assert VIEW.count_entries(P(3, 1), P(5, 0)) == 2
    assert VIEW.count_entries(P(5, 1), P(5, 1)) == 0
    assert [VIEW.position_at(i) for i in (0, 3, 5, 8)] == [P(3, 0), P(5, 0), P(9, 0), P(9, 3)]
    empty = LedgerView(((7, 0),))
    assert empty.first_position() == P(7, 0) and empty.last_position() == P(7, -1)


# --- rollover and retention rules -------------------------------------------------------------------------------

CFG = ManagedLedgerConfig(
    max_entries_per_ledger=10, max_size_per_ledger_bytes=1000, min_rollover_time_s=5, max_rollover_time_s=60
)


@pytest.mark.parametrize(
    ("entries", "size", "age", "roll"),
    [
        (0, 0, 1000, False),  # never roll an empty ledger
        (10, 0, 6, True),  # entries limit, older than the minimum
        (10, 0, 4, False),  # entries limit but younger than the minimum
        (1, 1000, 6, True),  # size limit
        (1, 10, 61, True),  # an idle ledger past the maximum age
        (1, 10, 30, False),
    ],
)
def test_should_rollover(entries: int, size: int, age: float, roll: bool) -> None:
    assert should_rollover(CFG, entries, size, age) is roll


def _li(lid: int, entries: int, size: int, ts: int) -> LedgerInfo:
    return LedgerInfo(ledger_id=lid, entries=entries, size=size, timestamp_ms=ts)


LEDGERS = [_li(1, 10, 100, 1_000), _li(2, 10, 100, 2_000), _li(3, 10, 100, 3_000), _li(4, 0, 0, 0)]


def _trim(md: Position | None, t: float, s: int, now_ms: int = 10_000) -> list[int]:
    return ledgers_to_trim(
        LEDGERS,
        current_ledger_id=4,
        current_size=50,
        slowest_mark_delete=md,
        retention_time_s=t,
        retention_size_bytes=s,
        now_ms=now_ms,
    )


def test_trim_only_fully_consumed_ledgers_never_the_current() -> None:
    assert _trim(P(2, 8), 0, 0) == [1], "ledger 2 is not fully consumed"
    assert _trim(P(2, 9), 0, 0) == [1, 2]
    assert _trim(None, 0, 0) == [1, 2, 3], "without cursors everything but the current ledger is consumed"


def test_trim_keeps_a_terminated_managed_ledgers_last_ledger() -> None:
    """Pulsar's terminate leaves its closed ledger current, never trimmed; here it rolls over, so the ledger of
    the terminated position is kept by name."""
    kept = ledgers_to_trim(
        LEDGERS,
        current_ledger_id=4,
        current_size=0,
        slowest_mark_delete=None,
        retention_time_s=0,
        retention_size_bytes=0,
        now_ms=10_000,
        terminated_ledger_id=3,
    )
    assert kept == [1, 2]


def test_trim_respects_retention_time_or_size() -> None:
    assert _trim(None, 7.5, -1) == [1, 2], "ledgers closed more than 7.5 s ago"
    assert _trim(None, -1, 250) == [1], (
        "keeps at least 250 bytes: 350 total, 250 left after deleting ledger 1"
    )
    assert _trim(None, -1, 150) == [1, 2]
    assert _trim(None, 7.5, 150) == [1, 2], "either limit lets a consumed ledger go"
    assert _trim(None, -1, -1) == [], "infinite retention"
    assert _trim(None, 100, 10_000) == []


def test_ml_info_json_round_trip() -> None:
    info = ManagedLedgerInfo(ledgers=tuple(LEDGERS), properties={"dedup/p": "7"})
    body = json.loads(json.dumps(info.to_json()))
    assert ManagedLedgerInfo.from_json(body) == info
