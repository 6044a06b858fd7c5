"""``Topic.fills_skipped_id``: the sequence ids a producer's stored sends jumped over (a batching producer's
delayed messages go ahead of its batch), which dedup must not take for resends, and what the topic keeps of them."""

from __future__ import annotations

from topic_broker.service import SKIPPED_IDS_MAX, SKIPPED_IDS_PRODUCERS_MAX, Topic


def bookkeeping() -> Topic:
    t = Topic.__new__(Topic)  # only the dedup bookkeeping fills_skipped_id reads and writes
    t.last_sequence, t.skipped_ids = {}, {}
    return t


def stored(t: Topic, name: str, seq: int, high: int | None = None) -> bool:
    """A SEND of ``seq`` (to ``high``: a batch) as Topic._publish takes it: whether it filled a skipped id; the
    producer's last id moves to its last one if that is higher."""
    filled = t.fills_skipped_id(name, seq, high)
    last = seq if high is None else high
    if last > t.last_sequence.get(name, -1):
        t.last_sequence[name] = last
    return bool(filled)


def test_skipped_ids_are_filled_once_and_then_forgotten() -> None:
    t = bookkeeping()
    assert [stored(t, "p", seq) for seq in (0, 2, 4)] == [False, False, False]  # the delayed messages
    assert stored(t, "p", 1) and stored(t, "p", 3)  # the batch behind them, and one more
    assert not stored(t, "p", 1)  # a second send of 1: a resend, for dedup to drop
    assert "p" not in t.skipped_ids  # nothing left to remember of p


def test_a_batch_filling_skipped_ids_fills_every_one_up_to_its_last_id_and_its_resend_is_no_fill() -> None:
    t = bookkeeping()
    assert [stored(t, "p", seq) for seq in (0, 2, 4)] == [False, False, False]  # the delayed messages
    assert stored(t, "p", 1, high=5)  # the batch 1, 3, 5 behind them: fills 1 and 3, its last id is 5
    assert "p" not in t.skipped_ids and t.last_sequence["p"] == 5
    assert not stored(t, "p", 1, high=5)  # sent again (a reconnect before its receipt): dedup drops it
    assert not stored(t, "p", 6)  # the next one skips nothing
    assert "p" not in t.skipped_ids


def test_a_fill_takes_the_skipped_ids_its_span_covers_and_returns_them() -> None:
    t = bookkeeping()
    stored(t, "p", 0)
    stored(t, "p", 3)  # skips 1, 2
    stored(t, "p", 6)  # skips 4, 5
    stored(t, "p", 9)  # skips 7, 8
    assert t.fills_skipped_id("p", 2, 7) == ((2, 2), (4, 5), (7, 7))
    assert t.skipped_ids["p"] == [(1, 1), (8, 8)]


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
