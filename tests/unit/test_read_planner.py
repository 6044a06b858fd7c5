"""ReadPlanner: which bookie is asked for which entries, and what a short or failed answer leads to."""

from __future__ import annotations

import pytest

from ledger_client.read_planner import Batch, Outcome, ReadPlanner, Segment, segments

B3 = ("a", "b", "c")


def planner(
    first: int = 0, last: int = 99, *, E: int = 3, Qw: int = 3, n: int = 10, w: int = 4, ens=None
) -> ReadPlanner:
    return ReadPlanner(
        first, last, ens or [(0, B3[:E])], ensemble_size=E, write_quorum=Qw, batch_entries=n, window=w
    )


def spans(batches: list[Batch]) -> list[tuple[int, int, str]]:
    return [(b.first, b.last, b.bookie) for b in batches]


@pytest.mark.parametrize(
    ("ens", "first", "last", "want"),
    [
        ([(0, B3)], 5, 9, [(5, 9)]),
        ([(0, B3), (10, ("d", "b", "c"))], 5, 20, [(5, 9), (10, 20)]),
        ([(0, B3), (10, ("d", "b", "c"))], 12, 20, [(12, 20)]),
        ([(0, B3), (10, ("d", "b", "c"))], 2, 9, [(2, 9)]),
    ],
)
def test_segments_cut_the_ensembles_to_the_range(ens, first, last, want) -> None:
    assert [(s.first, s.last) for s in segments(ens, first, last)] == want


@pytest.mark.parametrize(
    ("E", "Qw", "first", "want"),
    [
        # Qw == E: every bookie holds everything; batches of n go to the bookies in turn
        (3, 3, 0, [(0, 9, "b"), (10, 19, "c"), (20, 29, "a"), (30, 39, "b")]),
        # Qw < E: the longest run a bookie holds from e is Qw entries, on bookie (e + Qw - 1) mod E
        (3, 2, 0, [(0, 1, "b"), (2, 3, "a"), (4, 5, "c"), (6, 7, "b")]),
        (3, 2, 1, [(1, 2, "c"), (3, 4, "b"), (5, 6, "a"), (7, 8, "c")]),
        (3, 1, 0, [(0, 0, "a"), (1, 1, "b"), (2, 2, "c"), (3, 3, "a")]),
    ],
)
def test_batches_spread_over_the_bookies_holding_them_whole(E, Qw, first, want) -> None:
    p = planner(first, E=E, Qw=Qw)
    assert spans(p.next_batches()) == want
    assert p.in_flight == 4 and p.next_batches() == []  # the window is full


def test_every_batch_is_held_whole_by_its_bookie() -> None:
    for E, Qw in [(3, 2), (4, 2), (5, 3), (4, 4)]:
        p = planner(0, 200, E=E, Qw=Qw, n=7, w=1000)
        for b in p.next_batches():
            for e in range(b.first, b.last + 1):
                assert (b.index - e) % E < Qw, (E, Qw, b)


def test_a_batch_never_crosses_an_ensemble_boundary() -> None:
    ens = [(0, B3), (15, ("d", "e", "f"))]
    p = planner(0, 40, n=10, w=10, ens=ens)
    got = spans(p.next_batches())
    assert [(lo, hi) for lo, hi, _ in got] == [(0, 9), (10, 14), (15, 24), (25, 34), (35, 40)]
    assert all(b in B3 for f, _, b in got if f < 15) and all(b in "def" for f, _, b in got if f >= 15)
    assert p.done_planning


def test_read_ahead_waits_for_the_consumer() -> None:
    p = planner(0, 999, n=10, w=2)
    first = p.next_batches()
    assert spans(first) == [(0, 9, "b"), (10, 19, "c")]
    for b in first:
        assert p.on_answer(b, 10, None).retries == []
    assert p.next_batches() == []  # two windows' worth ahead of what was consumed
    p.consumed = 10
    assert spans(p.next_batches()) == [(20, 29, "a")]


@pytest.mark.parametrize(
    ("delivered", "outcome", "want_retries", "want_tried"),
    [
        (10, None, [], None),  # complete
        (4, Outcome.SHORT, [(4, 9, "b")], frozenset()),  # the byte limit: ask the same bookie for the rest
        (0, Outcome.MISSING, [(0, 9, "a")], frozenset({1})),  # failover to the next replica of entry 0
        (0, Outcome.FAILED, [(0, 9, "a")], frozenset({1})),
        (0, Outcome.SHORT, [(0, 9, "a")], frozenset({1})),  # nothing and no reason: a failure too
        (3, Outcome.FAILED, [(3, 9, "a")], frozenset({1})),  # a bad entry mid-batch: fresh failover from it
    ],
)
def test_answers_of_a_full_replication_batch(delivered, outcome, want_retries, want_tried) -> None:
    p = planner(0, 9, n=10)
    [b] = p.next_batches()
    assert b.bookie == "b"
    s = p.on_answer(b, delivered, outcome)
    assert spans(s.retries) == want_retries and s.unreadable is None
    if want_tried is not None:
        assert s.retries[0].tried == want_tried
    assert p.in_flight == len(want_retries)


def test_failover_on_a_striped_ledger_cuts_the_batch_to_what_the_replica_holds() -> None:
    p = planner(0, 1, Qw=2, n=10)
    [b] = p.next_batches()
    assert spans([b]) == [(0, 1, "b")]
    s = p.on_answer(b, 0, Outcome.FAILED, "TIMEOUT")
    # entry 0's other replica is a (which holds 0 but not 1); entry 1 is planned anew: the longest run
    # from 1 is on c
    assert spans(s.retries) == [(0, 0, "a"), (1, 1, "c")]
    assert s.retries[0].tried == frozenset({1}) and s.retries[1].tried == frozenset()
    assert p.in_flight == 2


def test_every_replica_missing_makes_the_entry_unreadable_as_missing() -> None:
    p = planner(0, 4, Qw=2, n=10)
    b = p.next_batches()[0]
    s = p.on_answer(b, 0, Outcome.MISSING, "NO_ENTRY")
    s = p.on_answer(s.retries[0], 0, Outcome.MISSING, "NO_LEDGER")
    assert s.retries == [] and s.unreadable is not None
    assert s.unreadable.entry_id == 0 and s.unreadable.missing
    assert s.unreadable.errors == ("b: NO_ENTRY", "a: NO_LEDGER")


def test_a_failed_replica_makes_the_entry_unavailable_not_missing() -> None:
    p = planner(0, 9, n=10)
    b = p.next_batches()[0]
    s = p.on_answer(b, 0, Outcome.MISSING)
    s = p.on_answer(s.retries[0], 0, Outcome.FAILED, "DIGEST_MISMATCH")
    s = p.on_answer(s.retries[0], 0, Outcome.MISSING)
    assert s.unreadable is not None and not s.unreadable.missing
    assert [e.split(":")[0] for e in s.unreadable.errors] == ["b", "a", "c"]


def test_segment_is_kept_by_retries() -> None:
    seg = Segment(15, 40, ("d", "e", "f"))
    p = planner(15, 40, n=5, ens=[(0, B3), (15, seg.bookies)])
    b = p.next_batches()[0]
    s = p.on_answer(b, 2, Outcome.FAILED)
    assert s.retries[0].segment.bookies == seg.bookies and s.retries[0].first == 17


def test_bad_parameters() -> None:
    with pytest.raises(ValueError):
        planner(n=0)
