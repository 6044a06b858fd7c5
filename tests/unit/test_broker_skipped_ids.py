"""``Topic.fills_skipped_id``: the sequence ids a producer's stored sends jumped over (a batching producer's
delayed messages go ahead of its batch), which dedup must not take for resends, and what the topic keeps of them."""

from __future__ import annotations

from topic_broker.service import SKIPPED_IDS_MAX, SKIPPED_IDS_PRODUCERS_MAX, Topic


def bookkeeping() -> Topic:
    t = Topic.__new__(Topic)  # only the dedup bookkeeping fills_skipped_id reads and writes
    t.last_sequence, t.skipped_ids = {}, {}
    return t


def stored(t: Topic, name: str, seq: int) -> bool:
    """A SEND of ``seq`` as Topic._publish takes it: whether it filled a skipped id (else it moves the last id)."""
    filled = t.fills_skipped_id(name, seq)
    if not filled and seq > t.last_sequence.get(name, -1):
        t.last_sequence[name] = seq
    return filled


def test_skipped_ids_are_filled_once_and_then_forgotten() -> None:
    t = bookkeeping()
    assert [stored(t, "p", seq) for seq in (0, 2, 4)] == [False, False, False]  # the delayed messages
    assert stored(t, "p", 1) and stored(t, "p", 3)  # the batch behind them, and one more
    assert not stored(t, "p", 1)  # a second send of 1: a resend, for dedup to drop
    assert "p" not in t.skipped_ids  # nothing left to remember of p


def test_the_producer_names_remembered_are_bounded_the_oldest_forgotten() -> None:
    t = bookkeeping()
    for i in range(SKIPPED_IDS_PRODUCERS_MAX + 1):
        stored(t, f"p{i}", 5)  # each skips 0..4
    assert len(t.skipped_ids) == SKIPPED_IDS_PRODUCERS_MAX
    assert "p0" not in t.skipped_ids and f"p{SKIPPED_IDS_PRODUCERS_MAX}" in t.skipped_ids


def test_the_ranges_remembered_stay_bounded_when_fills_split_them() -> None:
    t = bookkeeping()
    stored(t, "p", 10 * SKIPPED_IDS_MAX)  # one range, 0 .. 10 * SKIPPED_IDS_MAX - 1
    for seq in range(1, 4 * SKIPPED_IDS_MAX, 2):  # each fill splits the range it falls in
        assert stored(t, "p", seq)
    assert len(t.skipped_ids["p"]) <= SKIPPED_IDS_MAX
