"""ReadPlanner: which bookie is asked for which entries, and what a short or failed answer leads to; ReadyRuns:
the answers' pieces handed to the reader as runs of consecutive entries."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger_client.read_planner import Batch, Outcome, ReadPlanner, ReadyRuns, Rivals, Segment, segments

B3 = ("a", "b", "c")


def planner(
    first: int = 0, last: int = 99, *, E: int = 3, Qw: int = 3, n: int = 10, w: int = 4, ens=None
) -> ReadPlanner:
    return ReadPlanner(
        first, last, ens or [(0, B3[:E])], ensemble_size=E, write_quorum=Qw, batch_entries=n, window=w
    )


def spans(batches: list[Batch]) -> list[tuple[int, int, str]]:
    return [(b.first, b.last, b.bookie) for b in batches]


def strided(batches: list[Batch]) -> list[tuple[int, int, int, str]]:
    return [(b.first, b.last, b.step, b.bookie) for b in batches]


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


def test_full_replication_batches_go_to_the_bookies_in_turn() -> None:
    p = planner(0, E=3, Qw=3)
    assert strided(p.next_batches()) == [(0, 9, 1, "b"), (10, 19, 1, "c"), (20, 29, 1, "a"), (30, 39, 1, "b")]
    assert p.in_flight == 4 and p.next_batches() == []  # the window is full


@pytest.mark.parametrize(
    ("E", "Qw", "first", "want"),
    [
        # Qw < E: a stretch of n * E entries, one batch of step E per residue, on (r + Qw - 1) mod E
        (3, 2, 0, [(0, 27, 3, "b"), (1, 28, 3, "c"), (2, 29, 3, "a")]),
        (3, 2, 1, [(1, 28, 3, "c"), (2, 29, 3, "a"), (3, 30, 3, "b")]),
        (3, 1, 0, [(0, 27, 3, "a"), (1, 28, 3, "b"), (2, 29, 3, "c")]),
    ],
)
def test_a_striped_stretch_is_one_batch_per_bookie(E, Qw, first, want) -> None:
    p = planner(first, E=E, Qw=Qw, w=3)
    assert strided(p.next_batches()) == want
    assert p.in_flight == 3 and p.next_batches() == []  # the window is full


def test_a_stretch_goes_out_whole_even_past_the_window() -> None:
    p = planner(0, E=3, Qw=2, w=4)
    assert len(p.next_batches()) == 6 and p.in_flight == 6  # two stretches: the first left room for more


def test_every_batch_is_held_whole_by_its_bookie_and_every_entry_is_asked_once() -> None:
    for E, Qw in [(3, 2), (4, 2), (5, 3), (4, 4), (3, 1), (5, 5)]:
        for first, last in [(0, 200), (7, 7), (5, 9), (13, 1000)]:
            p = planner(first, last, E=E, Qw=Qw, n=7, w=1000)
            asked = []
            for b in p.next_batches():
                assert b.count == len(range(b.first, b.last + 1, b.step))
                for e in range(b.first, b.last + 1, b.step):
                    assert p.holds(b.index, e), (E, Qw, b)
                    asked.append(e)
            assert sorted(asked) == list(range(first, last + 1)), (E, Qw, first, last)


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


def test_failover_on_a_striped_ledger_moves_the_rest_of_the_batch_to_the_other_replica() -> None:
    p = planner(0, 29, Qw=2, n=10, w=3)
    b = p.next_batches()[0]
    assert strided([b]) == [(0, 27, 3, "b")]
    s = p.on_answer(b, 0, Outcome.FAILED, "TIMEOUT")
    # entry 0's write set is a, b: a holds every entry of residue 0 too
    assert strided(s.retries) == [(0, 27, 3, "a")] and s.retries[0].tried == frozenset({1})
    s = p.on_answer(s.retries[0], 4, Outcome.SHORT)  # the byte limit: the rest from the same bookie
    assert strided(s.retries) == [(12, 27, 3, "a")] and s.retries[0].tried == frozenset()
    s = p.on_answer(s.retries[0], 2, Outcome.MISSING, "NO_ENTRY")  # 18 missing on a: fresh failover from 18
    assert strided(s.retries) == [(18, 27, 3, "b")] and s.retries[0].tried == frozenset({0})
    assert p.in_flight == 3


def test_every_replica_missing_makes_the_entry_unreadable_as_missing() -> None:
    p = planner(0, 4, Qw=2, n=10)
    b = p.next_batches()[0]
    assert strided([b]) == [(0, 3, 3, "b")]
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


def _payload(e: int) -> bytes:
    return e.to_bytes(4, "big")


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([(3, 3), (3, 2), (5, 2), (4, 1)]),
    st.integers(0, 20),
    st.integers(0, 120),
    st.integers(1, 8),
    st.integers(0, 2**32),
)
def test_ready_runs_hand_out_every_entry_once_in_order_whatever_the_answers(
    shape, first, n, batch, seed
) -> None:
    """Answers (short ones included, retried from where they stopped) arrive in any order; the reader takes
    runs from where it is: it gets every entry of first..last once, in order, and only what was filed."""
    E, Qw = shape
    last = first + n
    rng = random.Random(seed)
    pl = ReadPlanner(first, last, [(0, ("a", "b", "c", "d", "e")[:E])], ensemble_size=E, write_quorum=Qw,
                     batch_entries=batch, window=3)  # fmt: skip
    ready = ReadyRuns(pl.step)
    waiting = pl.next_batches()
    got: list[bytes] = []
    nxt = first
    while nxt <= last:
        if waiting and rng.random() < 0.7:
            b = waiting.pop(rng.randrange(len(waiting)))
            k = rng.randint(1, b.count)  # a short answer is asked again for the rest
            ready.add(b.first, [_payload(e) for e in range(b.first, b.last + 1, b.step)][:k])
            waiting += pl.on_answer(b, k, None if k == b.count else Outcome.SHORT).retries
        run = ready.take(nxt, last)
        got += run
        nxt += len(run)
        pl.consumed = nxt
        waiting += pl.next_batches()
        assert waiting or run or nxt > last or len(ready)
    assert got == [_payload(e) for e in range(first, last + 1)]
    assert len(ready) == 0


def test_ready_runs_take_stops_at_the_first_entry_not_filed() -> None:
    r = ReadyRuns(3)
    r.add(10, [b"10", b"13", b"16"])
    r.add(12, [b"12", b"15"])
    assert r.take(10, 99) == [b"10"]  # 11 missing
    r.add(11, [b"11"])
    assert r.take(11, 99) == [b"11", b"12", b"13"]  # 14 missing (11's piece ended)
    r.add(14, [b"14", b"17"])
    assert r.take(14, 16) == [b"14", b"15", b"16"]  # up to last
    assert r.take(17, 99) == [b"17"] and len(r) == 0
    one = ReadyRuns(1)
    one.add(0, [b"0", b"1", b"2"])
    assert one.take(0, 1) == [b"0", b"1"] and one.take(2, 9) == [b"2"] and one.take(3, 9) == []


def test_ready_runs_hand_out_pieces_of_rows_as_rows() -> None:
    """Pieces of rows (``verify_spans(rows=True)``) of one width come out as one array, interleaved as lists
    are; a stretch with a list piece or rows of another width comes out as a list of the same payloads."""
    np = pytest.importorskip("numpy")

    def rows(ids: list[int], width: int = 4) -> object:
        return np.array([list(i.to_bytes(width, "big")) for i in ids], dtype=np.uint8)

    def payloads(out: object) -> list[bytes]:
        return out if isinstance(out, list) else [bytes(r) for r in out]  # type: ignore[union-attr]

    r = ReadyRuns(3)
    r.add(10, rows([10, 13, 16]))
    r.add(11, rows([11, 14]))
    r.add(12, rows([12, 15]))
    out = r.take(10, 99)
    assert not isinstance(out, list) and out.shape == (7, 4)  # up to 16 (17 not filed)
    assert payloads(out) == [i.to_bytes(4, "big") for i in range(10, 17)]
    r.add(17, [(17).to_bytes(4, "big")])  # a list piece
    r.add(18, rows([18], width=4))
    out = r.take(17, 18)
    assert isinstance(out, list) and out == [i.to_bytes(4, "big") for i in (17, 18)] and len(r) == 0
    r.add(19, rows([19], width=4))
    r.add(20, rows([20], width=8))
    assert r.take(19, 20) == [(19).to_bytes(4, "big"), (20).to_bytes(8, "big")]
    one = ReadyRuns(1)
    one.add(0, rows([0, 1, 2]))
    assert payloads(one.take(0, 1)) == [(0).to_bytes(4, "big"), (1).to_bytes(4, "big")]
    assert payloads(one.take(2, 9)) == [(2).to_bytes(4, "big")] and one.take(3, 9) == []


@pytest.mark.parametrize("E,Qw", [(3, 2), (4, 2), (5, 3), (3, 3), (5, 5)])
def test_a_last_resort_bookie_gets_no_batch_and_is_the_last_failover(E: int, Qw: int) -> None:
    """A bookie a read timed out on lately (``last_resort``) is planned no batch while another replica holds
    its entries, and failover tries it last; the whole range is still covered."""
    bookies = tuple(f"b{i}" for i in range(E))
    for slow in bookies:
        pl = ReadPlanner(0, 999, [(0, bookies)], ensemble_size=E, write_quorum=Qw, batch_entries=7, window=4,
                         last_resort=frozenset({slow}))  # fmt: skip
        covered: set[int] = set()
        while batches := pl.next_batches():
            for b in batches:
                assert b.bookie != slow
                assert all(pl.holds(b.index, e) for e in range(b.first, b.last + 1, b.step))
                covered.update(range(b.first, b.last + 1, b.step))
                assert not pl.on_answer(b, b.count, None).retries
                pl.consumed = max(pl.consumed, b.last + 1)
        assert covered == set(range(1000))
        pl = ReadPlanner(0, 99, [(0, bookies)], ensemble_size=E, write_quorum=Qw, batch_entries=7, window=4,
                         last_resort=frozenset({slow}))  # fmt: skip
        b = pl.next_batches()[0]
        order = [b.bookie]
        while retries := pl.on_answer(b, 0, Outcome.FAILED, "TIMEOUT").retries:
            b = retries[0]
            order.append(b.bookie)
        assert len(order) == Qw and (slow not in order or order[-1] == slow), order


# -- speculative reads -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("E,Qw", [(3, 2), (3, 3), (5, 3)])
def test_a_silent_batch_is_asked_of_each_other_replica_once_in_turn(E: int, Qw: int) -> None:
    """An unanswered batch's speculative copies go to the other replicas of its entries, each once, slow ones
    last, none while its bookie answered other requests meanwhile, and they add nothing to ``in_flight``."""
    bookies = tuple(f"b{i}" for i in range(E))
    pl = ReadPlanner(0, 99, [(0, bookies)], ensemble_size=E, write_quorum=Qw, batch_entries=7, window=4)
    b = pl.next_batches()[0]
    in_flight = pl.in_flight
    assert pl.speculate(b, answered_since=True) is None  # busy, not hung
    asked = [b.index]
    s = b
    while (nxt := pl.speculate(s, answered_since=False)) is not None:
        assert (nxt.first, nxt.last, nxt.step) == (b.first, b.last, b.step) and nxt.index not in asked
        assert all(pl.holds(nxt.index, e) for e in range(b.first, b.last + 1, b.step))
        asked.append(nxt.index)
        s = nxt
    assert sorted(asked) == sorted(pl._replicas(b.first)) and pl.in_flight == in_flight
    # with a slow replica among the others, it is asked last
    slow = next(bookies[i] for i in pl._replicas(b.first) if i != b.index)
    pl.mark_slow(slow)
    order, s = [], b
    while (nxt := pl.speculate(s, answered_since=False)) is not None:
        order.append(nxt.bookie)
        s = nxt
    assert order[-1] == slow


def test_the_first_copy_to_deliver_settles_the_batch_once() -> None:
    """Batch and speculative copy both out: the copy delivers everything, which settles the batch (no retry,
    ``in_flight`` back to what it was before the batch)."""
    pl = planner(0, 9, E=3, Qw=3, n=10, w=1)
    (b,) = pl.next_batches()
    copy = pl.speculate(b, answered_since=False)
    assert copy is not None and copy.bookie != b.bookie
    res = pl.on_answer(copy, copy.count, None)
    assert not res.retries and res.unreadable is None and pl.in_flight == 0


@pytest.mark.parametrize("outcome", [Outcome.MISSING, Outcome.FAILED, Outcome.SHORT])
def test_a_copy_failing_beside_its_rival_is_counted_where_the_last_one_fails_over(outcome: Outcome) -> None:
    """The hung bookie's copy is still out when the speculative one says "no such entry" (or fails): no
    failover yet; once the hung one fails too, failover goes to the third replica, and when that one misses
    the entry as well, the entry is missing on every replica (``NoSuchEntryError``, the end of an unconfirmed
    read), not unreadable."""
    pl = planner(0, 9, E=3, Qw=3, n=10, w=1)
    (b,) = pl.next_batches()
    copy = pl.speculate(b, answered_since=False)
    assert copy is not None
    pl.on_rival_failed(copy, [b], outcome, "NO_ENTRY")
    assert copy.index in b.tried and b.missing == (outcome is Outcome.MISSING)
    res = pl.on_answer(b, 0, Outcome.MISSING, "NO_ENTRY")  # (the hung bookie woke up)
    (third,) = res.retries
    assert third.index not in (b.index, copy.index)
    res = pl.on_answer(third, 0, Outcome.MISSING, "NO_ENTRY")
    assert res.unreadable is not None and not res.retries
    assert res.unreadable.missing is (outcome is Outcome.MISSING)
    assert len(res.unreadable.errors) == 3


def test_rivals_settle_drop_and_rearm_as_the_batch_reader_needs() -> None:
    """``Rivals``: a copy that fails while its rival is out does not settle the batch and hands the speculative
    timer back to the rival left (86a776a); the copy that delivers settles it, the rival asked before it is dropped
    and its bookie is slow; a copy asked after the winner is dropped without being called slow."""
    pl = planner(n=4, w=1)
    (b,) = pl.next_batches()
    rivals = Rivals()
    c1 = pl.speculate(b, answered_since=False)
    assert c1 is not None
    rivals.add(b, c1)
    assert not rivals.speculates(b) and rivals.speculates(c1)
    v = rivals.on_answer(c1, 0, Outcome.FAILED, "refused", waiting={b})
    assert not v.settles and v.rearm is b and not v.drop
    assert c1.index in b.tried and rivals.speculates(b)
    c2 = pl.speculate(b, answered_since=False)
    assert c2 is not None and c2.index not in (b.index, c1.index)
    rivals.add(b, c2)
    v = rivals.on_answer(c2, 4, None, "", waiting={b})
    assert v.settles and v.drop == [b] and v.slow == [b.bookie] and v.rearm is None
    # the winner asked first: the copy after it is dropped, its bookie not slow
    (b2,) = planner(n=4, w=1).next_batches()
    c = pl.speculate(b2, answered_since=False)
    assert c is not None
    rivals.add(b2, c)
    v = rivals.on_answer(b2, 4, None, "", waiting={c})
    assert v.settles and v.drop == [c] and v.slow == []
