"""AutoRecovery's decisions with no ZooKeeper and no bookie: lost-bookie delays, what to mark, what the check
reads, what a worker does with a mark, the throttle; and rack-aware placement as tables."""

from __future__ import annotations

import random

import pytest

from autorecovery.policy import (
    Action,
    LostBookieTracker,
    TokenBucket,
    decide,
    entries_to_check,
    ledgers_to_mark,
)
from ledger_client.placement import choose_ensemble, choose_replacement, rack_of, replace_failed
from zk.ledger_metadata import Ensemble, LedgerMetadata, LedgerState, password_digest_of
from zk.racks import DEFAULT_RACK, check_rack
from zk.underreplication import UnderReplicationMark

DIGEST = password_digest_of(b"")


def md(
    lid: int, ensembles: list[tuple[int, tuple[str, ...]]], closed_at: int | None = None, qw: int = 2
) -> LedgerMetadata:
    m = LedgerMetadata(
        ledger_id=lid,
        ensemble_size=len(ensembles[0][1]),
        write_quorum=qw,
        ack_quorum=2,
        ensembles=tuple(Ensemble(first, bookies) for first, bookies in ensembles),
        password_digest=DIGEST,
    )
    if closed_at is not None:
        m = m.replace(state=LedgerState.CLOSED, last_entry_id=closed_at, length=10 * (closed_at + 1))
    return m


def mark(
    lid: int, missing: tuple[str, ...] = (), drain: tuple[str, ...] = (), ctime_ms: int = 0
) -> UnderReplicationMark:
    return UnderReplicationMark(ledger_id=lid, missing=missing, drain=drain, ctime_ms=ctime_ms)


# --- lost bookies -------------------------------------------------------------------------------------------


def test_a_bookie_is_lost_only_after_the_delay_and_one_back_sooner_is_forgotten() -> None:
    t = LostBookieTracker(delay_s=10)
    t.observe({"a", "b", "c"}, set(), now=0)
    t.observe({"a", "b"}, set(), now=1)
    assert t.due(5) == set() and t.pending(5) == {"c": 6}
    assert t.observe({"a", "b", "c"}, set(), now=8) == {"c"}  # back within the delay
    assert t.due(100) == set()
    t.observe({"a", "b"}, set(), now=20)
    assert t.due(29) == set() and t.due(30) == {"c"}  # the delay counts afresh from the new loss
    t.marked.add("c")
    assert t.due(40) == set()


def test_delay_zero_marks_at_once_and_bookies_named_only_by_ledgers_count() -> None:
    t = LostBookieTracker(delay_s=0)
    t.observe({"a"}, {"a", "gone-before-we-started"}, now=0)
    assert t.due(0) == {"gone-before-we-started"}


def test_ledgers_to_mark_names_each_ledger_with_its_lost_bookies() -> None:
    ledgers = {
        1: md(1, [(0, ("a", "b", "c"))], closed_at=9),
        2: md(2, [(0, ("a", "b", "d")), (5, ("e", "b", "d"))]),
        3: md(3, [(0, ("b", "c", "e"))], closed_at=0),
    }
    assert ledgers_to_mark(ledgers, {"a", "x"}) == {1: {"a"}, 2: {"a"}}
    assert ledgers_to_mark(ledgers, {"e", "c"}) == {1: {"c"}, 2: {"e"}, 3: {"c", "e"}}


# --- the check --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("all_entries", "expected"),
    [
        # E3/Qw2, entries 0..9: index 0 holds 0,2,3,5,6,8,9; index 1 holds 0,1,3,4,6,7,9; index 2 1,2,4,5,7,8
        (False, {"a": [0, 9], "b": [0, 9], "c": [1, 8]}),
        (True, {"a": [0, 2, 3, 5, 6, 8, 9], "b": [0, 1, 3, 4, 6, 7, 9], "c": [1, 2, 4, 5, 7, 8]}),
    ],
)
def test_the_check_reads_first_and_last_or_every_entry_a_live_bookie_holds(all_entries, expected) -> None:
    m = md(1, [(0, ("a", "b", "c"))], closed_at=9)
    assert entries_to_check(m, {"a", "b", "c"}, all_entries) == expected
    assert "c" not in entries_to_check(m, {"a", "b"}, all_entries)  # a bookie not registered is not asked


def test_the_check_leaves_an_open_ledgers_last_ensemble_alone() -> None:
    m = md(1, [(0, ("a", "b", "c")), (4, ("a", "b", "d"))])
    got = entries_to_check(m, {"a", "b", "c", "d"})
    assert "d" not in got and got["c"] == [1, 2]  # entries 0..3 of the sealed ensemble


# --- the worker's decision ----------------------------------------------------------------------------------

CLOSED = md(7, [(0, ("a", "b", "c")), (5, ("a", "d", "c"))], closed_at=9)
OPEN_LAST = md(8, [(0, ("a", "b", "c"))])
OPEN_EARLIER = md(9, [(0, ("a", "b", "c")), (5, ("e", "b", "c"))])
LIVE = {"b", "c", "d", "e"}


@pytest.mark.parametrize(
    ("metadata", "m", "writable", "now_ms", "action", "replace", "repair"),
    [
        (None, mark(7, ("a",)), LIVE, 0, Action.CLEAR, set(), set()),
        (CLOSED, mark(7, ("x",)), LIVE, 0, Action.CLEAR, set(), set()),  # not in its ensembles any more
        (CLOSED, mark(7, ("a",)), LIVE, 0, Action.REPLICATE, {"a"}, set()),
        (CLOSED, mark(7, ("a", "d")), LIVE, 0, Action.REPLICATE, {"a"}, {"d"}),  # d is up: repaired in place
        (
            CLOSED,
            mark(7, ("d",)),
            LIVE - {"d"},
            0,
            Action.REPLICATE,
            {"d"},
            set(),
        ),  # read-only or gone: replaced
        (CLOSED, mark(7, (), ("c",)), LIVE, 0, Action.REPLICATE, {"c"}, set()),  # drained though up
        (OPEN_LAST, mark(8, ("a",), ctime_ms=1000), LIVE, 2000, Action.WAIT, set(), set()),  # grace period
        (OPEN_LAST, mark(8, ("a",), ctime_ms=1000), LIVE, 4000, Action.RECOVER, set(), set()),  # writer gone
        # writer alive, a gone in a sealed ensemble only: its fragment is re-replicated while the writer writes
        (OPEN_EARLIER, mark(9, ("a",), ctime_ms=0), LIVE, 0, Action.REPLICATE, {"a"}, set()),
        (
            OPEN_EARLIER,
            mark(9, ("b",), ctime_ms=0),
            LIVE,
            0,
            Action.WAIT,
            set(),
            set(),
        ),  # b up: repaired once closed
        (
            OPEN_EARLIER,
            mark(9, (), ("c",), ctime_ms=0),
            LIVE,
            0,
            Action.WAIT,
            set(),
            set(),
        ),  # drain: once closed
        (OPEN_LAST, mark(8, (), ("b",), ctime_ms=0), LIVE, 10**9, Action.WAIT, set(), set()),  # drain waits
    ],
)
def test_what_a_worker_does_with_a_mark(metadata, m, writable, now_ms, action, replace, repair) -> None:
    d = decide(metadata, m, writable, writable | {"ro"}, now_ms, grace_ms=3000)
    assert (d.action, set(d.replace), set(d.repair)) == (action, replace, repair), d.why


def test_the_throttle_spends_a_second_of_burst_then_paces() -> None:
    b = TokenBucket(1000, now=0)
    assert b.take(1000, 0) == 0
    assert b.take(500, 0) == pytest.approx(0.5)
    assert b.take(100, 10) == 0  # refilled, capped at one second's worth
    assert TokenBucket(0, now=0).take(10**9, 0) == 0  # no limit


# --- rack-aware placement -----------------------------------------------------------------------------------


def racks_of(spec: dict[str, int]) -> dict[str, str]:
    """{"/r/a": 2, "/r/b": 1} -> {"/r/a-0": "/r/a", "/r/a-1": "/r/a", "/r/b-0": "/r/b"}"""
    return {f"{rack}-{i}": rack for rack, n in spec.items() for i in range(n)}


@pytest.mark.parametrize(
    ("spec", "size", "min_racks_spanned", "neighbours_may_share"),
    [
        ({"/a/1": 3, "/a/2": 3, "/a/3": 3}, 3, 3, False),
        ({"/a/1": 5, "/a/2": 5}, 3, 2, True),  # 3 positions, 2 racks: one pair of neighbours must share
        ({"/a/1": 5, "/a/2": 5}, 4, 2, False),
        ({"/a/1": 5, "/a/2": 1}, 3, 2, True),
        ({"/a/1": 4}, 3, 1, True),  # one rack: it cannot be avoided
        ({"/a/1": 2, "/a/2": 2, "/a/3": 2, "/a/4": 2}, 5, 4, False),
    ],
)
def test_rack_aware_ensembles_span_racks_and_keep_neighbours_apart(
    spec, size, min_racks_spanned, neighbours_may_share
) -> None:
    racks = racks_of(spec)
    for seed in range(30):
        ens = choose_ensemble(size, racks, rng=random.Random(seed), racks=racks)
        assert len(set(ens)) == size
        got = [racks[b] for b in ens]
        assert len(set(got)) >= min_racks_spanned
        shared = sum(got[i] == got[(i + 1) % size] for i in range(size))
        if not neighbours_may_share:
            assert shared == 0, ens
        else:
            # never more sharing than the rack counts force
            assert shared <= size - len(set(got)) or len(set(got)) == 1


def test_rack_aware_ensembles_are_deterministic_given_the_seed() -> None:
    racks = racks_of({"/a/1": 3, "/a/2": 3})
    assert choose_ensemble(4, racks, rng=random.Random(3), racks=racks) == choose_ensemble(
        4, list(reversed(list(racks))), rng=random.Random(3), racks=racks
    )


@pytest.mark.parametrize(
    ("ensemble", "index", "spare", "want_rack"),
    [
        # b's neighbours are in /a/1 and /a/2: the replacement comes from /a/3
        (["/a/1-0", "/a/2-0", "/a/2-1"], 1, ["/a/1-1", "/a/2-2", "/a/3-0"], "/a/3"),
        # the ensemble would fall to one rack: a bookie of another rack is taken
        (["/a/1-0", "/a/1-1", "/a/2-0"], 2, ["/a/1-2", "/a/2-1"], "/a/2"),
        # only the failed bookie's rack has spares: taken (no rack is better than no bookie)
        (["/a/1-0", "/a/2-0", "/a/3-0"], 0, ["/a/3-1"], "/a/3"),
    ],
)
def test_rack_aware_replacements(ensemble, index, spare, want_rack) -> None:
    racks = {b: b.rsplit("-", 1)[0] for b in ensemble + spare}
    for seed in range(20):
        got = choose_replacement(ensemble, index, spare, rng=random.Random(seed), racks=racks)
        assert racks[got] == want_rack


def test_replace_failed_with_racks_keeps_other_positions_and_unknown_bookies_are_in_the_default_rack() -> (
    None
):
    racks = {"x": "/r/1", "y": "/r/2"}
    new = replace_failed(["x", "y", "z"], [2], ["x", "y", "z", "w", "v"], racks=racks, rng=random.Random(1))
    assert new[:2] == ["x", "y"] and new[2] in {"w", "v"}
    assert rack_of("w", racks) == DEFAULT_RACK


def test_without_racks_placement_is_unchanged() -> None:
    pool = [f"b{i}" for i in range(6)]
    assert choose_ensemble(3, pool, rng=random.Random(5)) == random.Random(5).sample(sorted(pool), 3)


@pytest.mark.parametrize("bad", ["", "rack", "/", "/a//b", "/a/ b"])
def test_rack_names_are_checked(bad) -> None:
    with pytest.raises(ValueError):
        check_rack(bad)
    assert check_rack("/region-1/rack-2") == "/region-1/rack-2"


def test_a_cancelled_decommission_takes_the_bookie_out_of_the_drain_list_only() -> None:
    mark = UnderReplicationMark(ledger_id=7, missing=("a:1",), drain=("b:1", "c:1"), count=2, ctime_ms=5)
    out = mark.undrained("b:1")
    assert out.drain == ("c:1",) and out.missing == ("a:1",) and (out.count, out.ctime_ms) == (2, 5)
    assert mark.undrained("a:1") == mark  # a missing bookie stays missing
    assert (
        not UnderReplicationMark(ledger_id=7, drain=("b:1",)).undrained("b:1").bookies
    )  # nothing left: cleared


def test_a_decommission_ends_no_sooner_than_the_settle_time_after_its_mark() -> None:
    from autorecovery.decommission import settle_wait

    assert settle_wait(marked_at=100.0, now=101.0, settle_s=30.0) == 29.0
    assert settle_wait(marked_at=100.0, now=130.0, settle_s=30.0) == 0.0
    assert settle_wait(marked_at=100.0, now=500.0, settle_s=0.0) == 0.0
