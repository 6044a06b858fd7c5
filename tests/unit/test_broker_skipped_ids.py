"""``Topic.fills_skipped_id``: the sequence ids a producer's stored sends jumped over (a batching producer's
delayed messages go ahead of its batch), which dedup must not take for resends, and what the topic keeps of them."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from topic_broker.service import (
    SKIPPED_IDS_MAX,
    SKIPPED_IDS_PERSISTED_MAX,
    SKIPPED_IDS_PRODUCERS_MAX,
    SKIPPED_IDS_PROPERTY,
    Topic,
    merge_ranges,
    subtract_ranges,
)


class _Properties:
    """The managed ledger's properties as the dedup bookkeeping uses them (set now, written with the list)."""

    def __init__(self, properties: dict[str, str] | None = None) -> None:
        self.properties = dict(properties or {})

    def set_property(self, key: str, value: str) -> None:
        self.properties[key] = value


def bookkeeping(properties: dict[str, str] | None = None) -> Topic:
    t = Topic.__new__(Topic)  # only the dedup bookkeeping fills_skipped_id reads and writes
    t.last_sequence, t.skipped_ids, t._skipped_dirty = {}, {}, set()
    t.key = "persistent://public/default/t"
    t.ml = _Properties(properties)  # type: ignore[assignment]
    return t


def recorded(t: Topic, name: str = "p") -> Any:
    t.record_skipped_ids()  # as the managed ledger calls it before writing its list
    return t.ml.properties.get(SKIPPED_IDS_PROPERTY + name)


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


def test_the_skipped_ids_are_recorded_in_the_topics_properties_until_filled() -> None:
    t = bookkeeping()
    for seq in (0, 2, 4):
        stored(t, "p", seq)
    assert recorded(t) == "1-1,3-3"
    assert stored(t, "p", 1)
    assert recorded(t) == "3-3"
    assert stored(t, "p", 3, high=5)
    assert recorded(t) == ""  # all filled: cleared, not left for the next owner
    stored(t, "q", 0)
    assert recorded(t, "q") is None  # a producer that skips nothing writes nothing


def test_a_new_owner_starts_from_the_recorded_skipped_ids_and_the_batch_fills_them() -> None:
    """A clean restart or an unload: the delayed 0, 2, 4 stored, the batch 1, 3, 5 still in the client. With
    the last id at 4 and no skipped ids, the next owner took the batch for a resend and dropped it."""
    old = bookkeeping()
    for seq in (0, 2, 4):
        stored(old, "p", seq)
    old.record_skipped_ids()  # the close writes the ledger list
    new = bookkeeping(old.ml.properties)
    new.last_sequence["p"] = 4  # dedup/p, recorded with the same list
    new.restore_skipped_ids()
    assert new.skipped_ids == {"p": [(1, 1), (3, 3)]}
    assert stored(new, "p", 1, high=5)
    assert not stored(new, "p", 1, high=5)  # and its resend is one


def test_the_recorded_ranges_are_bounded_and_a_value_that_does_not_parse_is_ignored() -> None:
    t = bookkeeping()
    for seq in range(0, 4 * SKIPPED_IDS_PERSISTED_MAX, 2):
        stored(t, "p", seq)
    assert len(recorded(t).split(",")) == SKIPPED_IDS_PERSISTED_MAX
    assert recorded(t).endswith(f"{4 * SKIPPED_IDS_PERSISTED_MAX - 3}-{4 * SKIPPED_IDS_PERSISTED_MAX - 3}")
    bad = bookkeeping({SKIPPED_IDS_PROPERTY + "p": "1-x", SKIPPED_IDS_PROPERTY + "q": "3-3,7-9"})
    bad.restore_skipped_ids()
    assert bad.skipped_ids == {"q": [(3, 3), (7, 9)]}


def test_a_producer_forgotten_over_the_bound_is_cleared_from_the_properties_too() -> None:
    t = bookkeeping()
    stored(t, "p0", 5)
    assert recorded(t, "p0") == "0-4"  # written with a ledger list
    for i in range(1, SKIPPED_IDS_PRODUCERS_MAX + 1):
        stored(t, f"p{i}", 5)
    assert recorded(t, "p0") == "" and recorded(t, "p1") == "0-4"


def test_the_tail_ledgers_sends_take_out_the_recorded_ids_they_filled_and_add_the_gaps_above() -> None:
    """After a kill -9: the properties hold what the owner knew at its last rollover; the tail ledger holds
    what it stored since (a fill of 3, a send of 9 that jumped over 7 and 8)."""
    t = bookkeeping({SKIPPED_IDS_PROPERTY + "p": "1-1,3-3"})
    t.restore_skipped_ids()
    t._learn_skipped_ids("p", 6, [(3, 3), (9, 9)])
    assert t.skipped_ids == {"p": [(1, 1), (7, 8)]}
    assert recorded(t) == "1-1,7-8"
    t._learn_skipped_ids("p", 9, [(1, 1), (7, 8)])  # all filled
    assert "p" not in t.skipped_ids and recorded(t) == ""


def _reference_fill(
    ranges: list[tuple[int, int]], last: int, seq: int, high: int | None
) -> tuple[list[tuple[int, int]], tuple[tuple[int, int], ...]]:
    """fills_skipped_id as a walk of every range (what the binary searches must agree with)."""
    if seq > last + 1:
        kept = [r for r in ranges if r[1] <= last] + [(last + 1, seq - 1)]
        return kept[-SKIPPED_IDS_MAX:], ()
    if not any(lo <= seq <= hi for lo, hi in ranges):
        return ranges, ()
    high = seq if high is None or high < seq else high
    kept, taken = [], []
    for lo, hi in ranges:
        if hi < seq or lo > high:
            kept.append((lo, hi))
            continue
        taken.append((max(lo, seq), min(hi, high)))
        kept.extend(r for r in ((lo, seq - 1), (high + 1, hi)) if r[0] <= r[1])
    return kept[-SKIPPED_IDS_MAX:], tuple(taken)


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8), st.booleans()), min_size=1, max_size=60))
def test_the_binary_searches_agree_with_a_walk_of_every_range(sends: list[tuple[int, int, bool]]) -> None:
    """Sends of ids in any order, batches of any span, some of them failing (the last id goes back and the ids a
    fill took are put back, as Topic._appended does): the same answers and the same ranges left as the walk."""
    t = bookkeeping()
    model: list[tuple[int, int]] = []
    for seq, span, fails in sends:
        high = seq + span if span else None
        last = t.last_sequence.get("p", -1)
        model, want = _reference_fill(model, last, seq, high)
        assert t.fills_skipped_id("p", seq, high) == want
        assert t.skipped_ids.get("p", []) == model
        end = seq if high is None else high
        if fails and want:  # (Topic._appended puts back the ids a failed fill took, and only then merges)
            model = merge_ranges([*model, *want])
            t._skipped_ranges("p")[:] = merge_ranges([*t.skipped_ids.get("p", []), *want])
        elif end > last:
            t.last_sequence["p"] = end


def test_merge_ranges_sorts_and_joins_what_overlaps_or_touches() -> None:
    assert merge_ranges([(7, 9), (1, 2), (3, 3), (8, 12), (20, 20)]) == [(1, 3), (7, 12), (20, 20)]
    assert merge_ranges([]) == []


_RANGES = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 6)).map(lambda t: (t[0], t[0] + t[1])), max_size=12
)


@given(_RANGES, _RANGES)
def test_subtract_ranges_leaves_exactly_the_ids_no_span_covers(ranges, spans) -> None:
    ids = {i for lo, hi in ranges for i in range(lo, hi + 1)} - {
        i for lo, hi in spans for i in range(lo, hi + 1)
    }
    got = subtract_ranges(ranges, spans)
    assert {i for lo, hi in got for i in range(lo, hi + 1)} == ids
    assert got == merge_ranges(got)  # sorted and apart, as skipped_ids keeps them
