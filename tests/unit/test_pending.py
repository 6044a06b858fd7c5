"""The write pipeline core: in-order completion, backpressure, fencing, ensemble change."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie.protocol import Status
from ledger_client.errors import (
    IllegalStateTransitionError,
    IncorrectParameterError,
    LedgerFencedError,
    NotEnoughBookiesError,
    UnauthorizedError,
)
from ledger_client.pending import PipelineFullError, Resend, Target, WritePipeline
from ledger_client.quorum import write_set

OK = Status.OK


def pipe(E=3, qw=3, qa=2, ens=("b0", "b1", "b2"), **kw) -> WritePipeline:
    return WritePipeline(ensemble_size=E, write_quorum=qw, ack_quorum=qa, ensemble=list(ens), **kw)


def test_entry_ids_are_contiguous_with_cumulative_length_and_piggybacked_lac():
    p = pipe(last_add_confirmed=4, length=100)
    a = p.next_entry(10)
    b = p.next_entry(5)
    assert (a.entry_id, a.length, a.lac) == (5, 110, 4)
    assert (b.entry_id, b.length, b.lac) == (6, 115, 4)
    p.on_ack(5, "b0", OK)
    p.on_ack(5, "b1", OK)
    assert (p.lac, p.length) == (5, 110)
    c = p.next_entry(0)
    assert (c.entry_id, c.length, c.lac) == (7, 115, 5)


def test_targets_are_the_write_set_in_the_current_ensemble():
    p = pipe(E=4, qw=2, qa=2, ens=("a", "b", "c", "d"))
    for _ in range(5):
        p.next_entry(1)
    assert p.targets(0) == [Target(0, "a"), Target(1, "b")]
    assert p.targets(3) == [Target(3, "d"), Target(0, "a")]


def test_completion_is_in_entry_order_even_when_acks_arrive_out_of_order():
    p = pipe()
    for _ in range(3):
        p.next_entry(1)
    assert p.on_ack(2, "b0", OK).completed == ()
    assert p.on_ack(2, "b1", OK).completed == ()  # entry 2 has Qa acks but 0 and 1 have not
    assert p.on_ack(1, "b2", OK).completed == ()
    assert p.on_ack(1, "b0", OK).completed == ()
    assert p.lac == -1
    assert p.on_ack(0, "b1", OK).completed == ()
    assert p.on_ack(0, "b2", OK).completed == (0, 1, 2)
    assert p.lac == 2 and p.outstanding == 0
    assert p.on_ack(0, "b0", OK).completed == ()  # late third ack: ignored


def test_unsafe_switch_acks_out_of_order_but_lac_stays_contiguous():
    p = pipe(_unsafe_ack_out_of_order=True)
    for _ in range(2):
        p.next_entry(1)
    p.on_ack(1, "b0", OK)
    assert p.on_ack(1, "b1", OK).completed == (1,)
    assert p.lac == -1
    p.on_ack(0, "b0", OK)
    assert p.on_ack(0, "b1", OK).completed == (0,)  # 1 is not reported twice
    assert p.lac == 1


def test_backpressure_bound():
    p = pipe(outstanding_adds_max=2)
    p.next_entry(1)
    p.next_entry(1)
    assert not p.has_capacity
    with pytest.raises(PipelineFullError):
        p.next_entry(1)
    p.on_ack(0, "b0", OK)
    p.on_ack(0, "b1", OK)
    assert p.has_capacity
    assert p.next_entry(1).entry_id == 2
    with pytest.raises(IncorrectParameterError):
        pipe(outstanding_adds_max=0)


@pytest.mark.parametrize(
    ("status", "err"), [(Status.FENCED, LedgerFencedError), (Status.UNAUTHORIZED, UnauthorizedError)]
)
def test_fenced_or_unauthorized_fails_every_pending_entry(status, err):
    p = pipe()
    for _ in range(4):
        p.next_entry(1)
    p.on_ack(0, "b0", OK)
    p.on_ack(0, "b1", OK)  # entry 0 completes
    p.on_ack(2, "b0", OK)
    p.on_ack(2, "b1", OK)  # entry 2 reached Qa but waits for 1
    progress = p.on_ack(1, "b2", status)
    assert progress.failed == (1, 2, 3)
    assert isinstance(progress.error, err)
    assert p.error is progress.error and not p.has_capacity and not p.needs_ensemble_change
    with pytest.raises(err):
        p.next_entry(1)
    assert p.on_ack(3, "b0", OK).completed == ()  # nothing completes afterwards
    assert p.lac == 0


@pytest.mark.parametrize(
    "status",
    [None, Status.READONLY, Status.TOO_MANY_REQUESTS, Status.INTERNAL, Status.BAD_REQUEST, Status.NO_LEDGER],
)
def test_other_failures_ask_for_an_ensemble_change(status):
    p = pipe()
    p.next_entry(1)
    p.on_ack(0, "b1", status)
    assert p.needs_ensemble_change and p.failed_indices == {1}
    assert p.error is None


def test_timeout_after_an_ack_is_ignored_but_failure_of_a_completed_entry_replaces_the_bookie():
    p = pipe()
    p.next_entry(1)
    p.next_entry(1)
    p.on_ack(1, "b0", OK)
    p.on_timeout(1, "b0")  # lost the race with the ack
    assert not p.needs_ensemble_change
    p.on_ack(0, "b0", OK)
    p.on_ack(0, "b1", OK)
    p.on_timeout(0, "b2")  # entry 0 is complete; b2 is still slow or dead
    assert p.failed_indices == {2}


def test_failed_index_gets_no_new_sends_until_replaced():
    p = pipe()
    p.next_entry(1)
    p.on_bookie_error("b1")
    p.next_entry(1)
    assert p.targets(1) == [Target(2, "b2"), Target(0, "b0")]  # write set (1, 2, 0) without 1


def test_ensemble_change_resends_exactly_the_pending_entries_of_the_replaced_index_and_keeps_acked_ones():
    p = pipe(E=4, qw=2, qa=2, ens=("a", "b", "c", "d"))
    for _ in range(6):
        p.next_entry(1)
    # Entry 0 on (a,b) and 1 on (b,c) complete; entry 2 on (c,d) gets only c; c then fails on entry 5.
    for eid, bookies in ((0, "ab"), (1, "bc")):
        for b in bookies:
            p.on_ack(eid, b, OK)
    assert p.lac == 1
    p.on_ack(2, "c", OK)
    p.on_ack(5, "c", None)
    p.on_ack(4, "a", OK)
    assert p.needs_ensemble_change
    plan = p.ensemble_change_plan()
    assert plan.first_entry_id == 2 and plan.failed_indices == {2} and plan.failed_bookies == ("c",)
    result = p.apply_new_ensemble(2, ["a", "b", "x", "d"])
    # Pending entries 2..5; write sets containing index 2: entry 2 (2,3), entry 1 is done, entry 5 is (1,2).
    expected = [Resend(e, 2, "x") for e in range(2, 6) if 2 in write_set(e, 4, 2)]
    assert list(result.resends) == expected == [Resend(2, 2, "x"), Resend(5, 2, "x")]
    assert result.completed == ()
    assert p.lac == 1 and not p.needs_ensemble_change and p.ensemble == ("a", "b", "x", "d")
    # c's ack of entry 2 no longer counts: d alone is not enough, x's copy is needed.
    assert p.acked_indices(2) == set()
    assert p.on_ack(2, "d", OK).completed == ()
    assert p.on_ack(2, "x", OK).completed == (2,)
    # a's ack of entry 4 (index 0, not replaced) still counts.
    assert p.acked_indices(4) == {0}


def test_ack_from_a_replaced_bookie_is_not_counted():
    p = pipe()
    p.next_entry(1)
    p.on_ack(0, "b0", OK)
    p.on_ack(0, "b1", None)
    p.ensemble_change_plan()
    p.apply_new_ensemble(0, ["b0", "n1", "b2"])
    assert p.on_ack(0, "b1", OK).completed == ()  # late ack from the replaced bookie
    assert p.acked_indices(0) == {0}
    assert p.on_ack(0, "n1", OK).completed == (0,)


def test_lac_is_frozen_during_an_ensemble_change_and_completions_come_with_apply():
    p = pipe()
    p.next_entry(1)
    p.next_entry(1)
    p.on_ack(0, "b2", None)
    plan = p.ensemble_change_plan()
    assert plan.first_entry_id == 0
    p.on_ack(0, "b0", OK)
    assert p.on_ack(0, "b1", OK).completed == ()  # Qa reached, but the LAC is frozen
    p.on_ack(1, "b1", OK)
    p.on_ack(1, "b2", OK)  # b2 is being replaced: this ack will not count
    assert p.lac == -1
    assert p.ensemble_change_plan().first_entry_id == 0  # re-plan after a lost CAS race: same start
    result = p.apply_new_ensemble(0, ["b0", "b1", "z"])
    assert result.completed == (0,)
    assert set(result.resends) == {Resend(0, 2, "z"), Resend(1, 2, "z")}
    assert p.on_ack(1, "z", OK).completed == (1,)


def test_cancel_ensemble_change_unfreezes():
    p = pipe()
    p.next_entry(1)
    p.on_ack(0, "b2", None)
    p.ensemble_change_plan()
    p.on_ack(0, "b0", OK)
    p.on_ack(0, "b1", OK)
    assert p.cancel_ensemble_change().completed == (0,)
    assert p.needs_ensemble_change  # b2 still failed


def test_ensemble_change_preconditions():
    p = pipe()
    with pytest.raises(IllegalStateTransitionError):
        p.ensemble_change_plan()  # nothing failed
    p.next_entry(1)
    p.on_ack(0, "b0", None)
    with pytest.raises(IllegalStateTransitionError):
        p.apply_new_ensemble(0, ["x", "b1", "b2"])  # no plan
    p.ensemble_change_plan()
    with pytest.raises(IllegalStateTransitionError):
        p.apply_new_ensemble(1, ["x", "b1", "b2"])  # not LAC + 1
    with pytest.raises(IncorrectParameterError):
        p.apply_new_ensemble(0, ["x", "x", "b2"])
    err = NotEnoughBookiesError("none left")
    progress = p.fail(err)
    assert progress.failed == (0,) and progress.error is err
    with pytest.raises(NotEnoughBookiesError):
        p.ensemble_change_plan()


def test_second_failure_during_a_change_needs_another_change():
    p = pipe()
    p.next_entry(1)
    p.on_ack(0, "b0", None)
    plan = p.ensemble_change_plan()
    p.on_ack(0, "b1", None)
    assert plan.failed_indices == {0}
    result = p.apply_new_ensemble(0, ["x", "b1", "b2"])
    assert result.resends == (Resend(0, 0, "x"),)
    assert p.needs_ensemble_change and p.failed_indices == {1}
    assert p.ensemble_change_plan().failed_indices == {1}


@settings(max_examples=200, deadline=None)
@given(
    shape=st.sampled_from(
        [(E, qw, qa) for E in range(1, 6) for qw in range(1, E + 1) for qa in range(1, qw + 1)]
    ),
    n=st.integers(1, 12),
    seed=st.integers(0, 2**32),
)
def test_completion_order_and_quorum_under_random_acks_and_ensemble_changes(shape, n, seed):
    E, qw, qa = shape
    rng = random.Random(seed)
    names = iter(f"n{i}" for i in range(1000))
    ens = [next(names) for _ in range(E)]
    p = WritePipeline(ensemble_size=E, write_quorum=qw, ack_quorum=qa, ensemble=ens)
    inflight = []  # (entry, bookie) requests
    for _ in range(n):
        add = p.next_entry(1)
        inflight += [(add.entry_id, t.bookie) for t in p.targets(add.entry_id)]
    completed: list[int] = []
    holders: dict[int, set[str]] = {e: set() for e in range(n)}  # bookies that stored the entry
    segments = [(0, tuple(ens))]
    steps = 0
    plan = None
    while (inflight or p.needs_ensemble_change or plan) and steps < 10_000:
        steps += 1
        if p.needs_ensemble_change and not p.changing_ensemble and rng.random() < 0.3:
            plan = p.ensemble_change_plan()  # the metadata CAS is "in flight" while acks keep arriving
            continue
        if plan is not None and (not inflight or rng.random() < 0.3):
            new = list(p.ensemble)
            for i in plan.failed_indices:
                new[i] = next(names)
            res = p.apply_new_ensemble(plan.first_entry_id, new)
            if segments[-1][0] == plan.first_entry_id:
                segments[-1] = (plan.first_entry_id, tuple(new))
            else:
                segments.append((plan.first_entry_id, tuple(new)))
            completed += res.completed
            inflight += [(r.entry_id, r.bookie) for r in res.resends]
            plan = None
            continue
        if not inflight:
            continue
        eid, bookie = inflight.pop(rng.randrange(len(inflight)))
        if rng.random() < 0.15:
            completed += p.on_ack(eid, bookie, None).completed
        else:
            holders[eid].add(bookie)
            completed += p.on_ack(eid, bookie, OK).completed
    assert completed == list(range(len(completed)))  # strictly in order, no duplicates
    assert p.lac == len(completed) - 1
    for e in completed:  # every acked entry is on >= Qa bookies of the segment that covers it
        seg = [b for first, b in segments if first <= e][-1]
        stored = {seg[i] for i in write_set(e, E, qw)} & holders[e]
        assert len(stored) >= qa, (e, seg, holders[e])


# -- batch acks (the I/O layer's fast path) ---------------------------------------------------------------


def _snapshot(p: WritePipeline) -> tuple:
    return (
        p.lac,
        p.length,
        p.next_entry_id,
        p.pending_entry_ids,
        p.failed_indices,
        p.changing_ensemble,
        p.ensemble,
        type(p.error),
        tuple(p.acked_indices(e) for e in p.pending_entry_ids),
        tuple(p.waiting_on(b) for b in p.ensemble),
    )


@settings(max_examples=300, deadline=None)
@given(
    shape=st.sampled_from([(1, 1, 1), (2, 2, 1), (3, 2, 2), (3, 3, 2), (3, 3, 3), (4, 3, 2), (5, 3, 2)]),
    data=st.data(),
)
def test_on_acks_equals_on_ack_per_entry(shape, data):
    """``on_acks(bookie, ids)`` ends in the same state and reports the same completions (same order) as
    ``on_ack(id, bookie, OK)`` for each id, across failures, freezes and ensemble changes."""
    E, qw, qa = shape
    ens = [f"b{i}" for i in range(E)]
    batch = pipe(E, qw, qa, ens, outstanding_adds_max=12)
    single = pipe(E, qw, qa, ens, outstanding_adds_max=12)
    spare = iter(f"s{i}" for i in range(1000))
    done_batch: list[int] = []
    done_single: list[int] = []
    for _ in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.sampled_from(["add", "add", "acks", "acks", "acks", "fail", "change", "fence"]))
        if op == "add" and batch.has_capacity:
            assert batch.next_entry(3) == single.next_entry(3)
        elif op == "acks":
            known = list(ens) + ["gone"]
            bookie = data.draw(st.sampled_from(known))
            hi = batch.next_entry_id + 2
            ids = data.draw(st.lists(st.integers(-1, hi), max_size=12))
            done_batch += batch.on_acks(bookie, ids).completed
            for eid in ids:
                done_single += single.on_ack(eid, bookie, OK).completed
        elif op == "fail" and batch.pending_entry_ids:
            eid = data.draw(st.sampled_from(batch.pending_entry_ids))
            bookie = data.draw(st.sampled_from(ens))
            status = data.draw(st.sampled_from([None, Status.READONLY, Status.INTERNAL]))
            batch.on_ack(eid, bookie, status)
            single.on_ack(eid, bookie, status)
        elif op == "change" and batch.needs_ensemble_change:
            if not batch.changing_ensemble:
                plan = batch.ensemble_change_plan()
                assert single.ensemble_change_plan() == plan
            elif data.draw(st.booleans()):
                plan = batch.ensemble_change_plan()  # restart after a lost race
                single.ensemble_change_plan()
                new = list(batch.ensemble)
                for i in plan.failed_indices:
                    new[i] = next(spare)
                a = batch.apply_new_ensemble(plan.first_entry_id, new)
                b = single.apply_new_ensemble(plan.first_entry_id, new)
                assert a == b
                done_batch += a.completed
                done_single += b.completed
                ens = new
            else:
                done_batch += batch.cancel_ensemble_change().completed
                done_single += single.cancel_ensemble_change().completed
        elif op == "fence" and data.draw(st.integers(0, 9)) == 0:
            err = LedgerFencedError("fenced")
            assert batch.fail(err).failed == single.fail(err).failed
        assert done_batch == done_single
        assert _snapshot(batch) == _snapshot(single)
    assert done_batch == sorted(done_batch) and len(set(done_batch)) == len(done_batch)


def test_on_acks_counts_only_the_write_set_and_ignores_duplicates_and_replaced_bookies():
    p = pipe(E=4, qw=2, qa=2, ens=("a", "b", "c", "d"))
    for _ in range(4):
        p.next_entry(1)
    assert p.on_acks("a", [0, 0, 1, 2, 3, 99, -1]).completed == ()  # a is in the write sets of 0 and 3
    assert p.acked_indices(0) == {0} and p.acked_indices(1) == set() and p.acked_indices(3) == {0}
    assert p.on_acks("nobody", [0, 1]).completed == ()
    assert p.on_acks("b", [1, 0]).completed == (0,)  # 1 still needs c
    assert p.on_acks("c", [1, 2]).completed == (1,)
    assert p.on_acks("d", [2, 3]).completed == (2, 3)
    assert p.lac == 3 and p.outstanding == 0


def test_on_acks_during_a_freeze_are_recorded_and_complete_with_apply():
    p = pipe()
    for _ in range(3):
        p.next_entry(1)
    p.on_ack(2, "b2", None)
    plan = p.ensemble_change_plan()
    assert p.on_acks("b0", [0, 1, 2]).completed == ()
    assert p.on_acks("b1", [0, 1, 2]).completed == ()
    assert p.lac == -1
    result = p.apply_new_ensemble(plan.first_entry_id, ["b0", "b1", "x"])
    assert result.completed == (0, 1, 2)


def test_waiting_on_lists_pending_entries_without_that_bookies_ack():
    p = pipe(E=3, qw=2, qa=2)
    for _ in range(4):
        p.next_entry(1)  # write sets: 0:(0,1) 1:(1,2) 2:(2,0) 3:(0,1)
    assert p.waiting_on("b0") == (0, 2, 3)
    p.on_acks("b0", [0, 3])
    assert p.waiting_on("b0") == (2,)
    assert p.waiting_on("elsewhere") == ()
    p.fail(LedgerFencedError("fenced"))
    assert p.waiting_on("b0") == ()


def test_assign_is_next_entry_as_a_plain_tuple():
    a, b = pipe(last_add_confirmed=2, length=10), pipe(last_add_confirmed=2, length=10)
    for n in (4, 0, 7):
        add = a.next_entry(n)
        assert b.assign(n) == (add.entry_id, add.length, add.lac)
    full = pipe(outstanding_adds_max=1)
    full.assign(1)
    with pytest.raises(PipelineFullError):
        full.assign(1)
    with pytest.raises(IncorrectParameterError):
        pipe().assign(-1)
