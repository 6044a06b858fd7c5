"""The managed ledger's cache of recently appended entries (pure)."""

from __future__ import annotations

from topic_broker.managed_ledger import EntryCache, Position


def test_take_returns_the_cached_run_and_where_it_stops() -> None:
    c = EntryCache(1000)
    for eid in range(5):
        c.put(7, eid, b"e%d" % eid)
    out: list[tuple[Position, bytes]] = []
    assert c.take(7, 1, 3, out) == 4
    assert out == [(Position(7, 1), b"e1"), (Position(7, 2), b"e2"), (Position(7, 3), b"e3")]
    out.clear()
    assert c.take(7, 3, 9, out) == 5  # entries 5.. are not there: read them elsewhere
    assert [p.entry_id for p, _ in out] == [3, 4]
    assert c.take(8, 0, 3, out) == 0  # another ledger


def test_the_oldest_entries_leave_first_when_over_the_byte_limit() -> None:
    c = EntryCache(100)
    for eid in range(10):
        c.put(1, eid, bytes(30))
    assert len(c) == 3 and c.size_bytes == 90
    out: list[tuple[Position, bytes]] = []
    assert c.take(1, 0, 9, out) == 0
    assert c.take(1, 7, 9, out) == 10
    c.put(1, 10, bytes(101))  # larger than the whole cache: not kept, nothing evicted for it
    assert len(c) == 3
    c.clear()
    assert len(c) == 0 and c.size_bytes == 0
