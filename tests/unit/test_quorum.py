"""Quorum math, table-tested for every 5 >= E >= Qw >= Qa >= 1 against brute-force definitions."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookie.protocol import Status
from ledger_client.errors import IncorrectParameterError
from ledger_client.quorum import (
    AckSet,
    CoverageSet,
    answer_for_status,
    unrecoverable_threshold,
    validate_quorum,
    write_set,
)

CONFIGS = [(E, qw, qa) for E in range(1, 6) for qw in range(1, E + 1) for qa in range(1, qw + 1)]


def subsets(items):
    items = list(items)
    return [set(c) for r in range(len(items) + 1) for c in itertools.combinations(items, r)]


def brute_write_set(entry_id, E, qw):
    # The bookies whose distance (mod E) from entry_id's home bookie is < Qw, nearest first.
    return tuple(sorted((j for j in range(E) if (j - entry_id) % E < qw), key=lambda j: (j - entry_id) % E))


def test_configs_cover_all_35_quorum_shapes():
    assert len(CONFIGS) == 35


@pytest.mark.parametrize(("E", "qw", "qa"), CONFIGS)
def test_write_set_matches_brute_force(E, qw, qa):
    for entry_id in range(3 * E + 2):
        ws = write_set(entry_id, E, qw)
        assert ws == brute_write_set(entry_id, E, qw)
        assert len(set(ws)) == qw
    # E write sets, one per start index, and each bookie is in exactly Qw of them.
    sets = {frozenset(write_set(s, E, qw)) for s in range(E)}
    assert len(sets) == (E if qw < E else 1)
    for b in range(E):
        assert sum(b in write_set(s, E, qw) for s in range(E)) == qw


def test_write_set_examples():
    assert write_set(0, 3, 2) == (0, 1)
    assert write_set(2, 3, 2) == (2, 0)
    assert write_set(7, 5, 3) == (2, 3, 4)
    assert write_set(4, 5, 3) == (4, 0, 1)


@pytest.mark.parametrize("bad", [(2, 3, 1), (3, 2, 3), (3, 3, 0), (0, 0, 0)])
def test_validate_quorum_rejects_bad_shapes(bad):
    with pytest.raises(IncorrectParameterError):
        validate_quorum(*bad)


def test_write_set_rejects_negative_entry():
    with pytest.raises(IncorrectParameterError):
        write_set(-1, 3, 2)


@pytest.mark.parametrize(("E", "qw", "qa"), CONFIGS)
def test_ackset_complete_and_impossible_match_brute_force(E, qw, qa):
    for entry_id in range(E):
        ws = write_set(entry_id, E, qw)
        for acked in subsets(ws):
            for failed in subsets(set(ws) - acked):
                s = AckSet(entry_id, E, qw, qa)
                for i in failed:
                    s.fail(i)
                for i in acked:
                    s.ack(i)
                assert s.complete == (len(acked) >= qa)
                assert s.acked == acked and s.failed == failed
                # Impossible iff no Qa-sized group of the write set avoids every failure.
                reachable = any(True for _ in itertools.combinations(set(ws) - failed, qa))
                assert s.impossible == (not reachable)


def test_ackset_ack_is_final_and_rejects_foreign_bookies():
    s = AckSet(0, 3, 3, 2)
    s.ack(1)
    s.fail(1)  # a timeout that lost the race with the ack
    assert s.acked == {1} and s.failed == set()
    s.fail(2)
    s.ack(2)  # a late ack after a failure report still counts
    assert s.complete and s.failed == set()
    s.forget(2)
    assert s.acked == {1} and not s.complete
    with pytest.raises(ValueError):
        AckSet(0, 4, 2, 2).ack(3)


def test_unrecoverable_threshold():
    assert unrecoverable_threshold(3, 2) == 2
    assert unrecoverable_threshold(3, 3) == 1
    assert unrecoverable_threshold(5, 1) == 5


def brute_covered(E, qw, qa, counted):
    """No entry can still gain Qa acks from bookies that have not (countably) answered."""
    silent = [i for i in range(E) if i not in counted]
    for group in itertools.combinations(silent, qa):
        for e in range(E):
            if set(group) <= set(write_set(e, E, qw)):
                return False
    return True


KINDS = ["none", "ok", "error"]


@pytest.mark.parametrize(("E", "qw", "qa"), CONFIGS)
def test_coverage_matches_brute_force(E, qw, qa):
    for assignment in itertools.product(KINDS, repeat=E):
        safe = CoverageSet(E, qw, qa)
        unsafe = CoverageSet(E, qw, qa, _unsafe_count_all_answers=True)
        for i, kind in enumerate(assignment):
            if kind != "none":
                safe.add_response(i, kind)
                unsafe.add_response(i, kind)
        definite = {i for i, k in enumerate(assignment) if k == "ok"}
        anything = {i for i, k in enumerate(assignment) if k != "none"}
        errors = {i for i, k in enumerate(assignment) if k == "error"}
        assert safe.covered() == brute_covered(E, qw, qa, definite), assignment
        assert unsafe.covered() == brute_covered(E, qw, qa, anything), assignment
        # Impossible: even if every silent bookie answers, errors keep some write set uncovered.
        assert safe.impossible() == (not brute_covered(E, qw, qa, set(range(E)) - errors)), assignment
        assert safe.answered == definite and safe.unanswered == set(range(E)) - anything


@pytest.mark.parametrize(("E", "qw", "qa"), CONFIGS)
def test_coverage_needs_qw_minus_qa_plus_1_answers_in_every_write_set(E, qw, qa):
    for answered in subsets(range(E)):
        c = CoverageSet(E, qw, qa)
        for i in answered:
            c.add_response(i, "no_ledger")
        expected = all(len(answered & set(write_set(s, E, qw))) >= qw - qa + 1 for s in range(E))
        assert c.covered() == expected


def test_coverage_e_equals_qw_needs_e_minus_qa_plus_1_responses():
    c = CoverageSet(3, 3, 2)
    c.add_response(0, "no_entry")
    assert not c.covered()
    c.add_response(1, "ok")
    assert c.covered()


def test_coverage_all_kinds():
    for kind in ("ok", "no_entry", "no_ledger", "fenced"):
        c = CoverageSet(1, 1, 1)
        c.add_response(0, kind)
        assert c.covered()
    for kind in ("error", "timeout", "whatever"):
        c = CoverageSet(1, 1, 1)
        c.add_response(0, kind)
        assert not c.covered() and c.impossible()


def test_coverage_definite_answer_is_not_overwritten_by_an_error():
    c = CoverageSet(3, 3, 3)
    c.add_response(0, "ok")
    c.add_response(0, "error")
    assert c.covered()
    d = CoverageSet(3, 3, 3)
    d.add_response(0, "error")
    d.add_response(0, "ok")
    assert d.covered()


def test_coverage_index_out_of_range():
    with pytest.raises(ValueError):
        CoverageSet(3, 2, 2).add_response(3, "ok")


def test_answer_for_status():
    assert answer_for_status(Status.OK) == "ok"
    assert answer_for_status(Status.NO_ENTRY) == "no_entry"
    assert answer_for_status(Status.NO_LEDGER) == "no_ledger"
    assert answer_for_status(Status.FENCED) == "fenced"
    assert answer_for_status(None) == "error"
    for s in (
        Status.UNAUTHORIZED,
        Status.READONLY,
        Status.TOO_MANY_REQUESTS,
        Status.BAD_REQUEST,
        Status.INTERNAL,
    ):
        assert answer_for_status(s) == "error"


@given(
    st.sampled_from(CONFIGS).flatmap(
        lambda c: st.tuples(
            st.just(c), st.lists(st.integers(0, c[0] - 1), unique=True), st.integers(0, 10**6)
        )
    )
)
def test_after_coverage_no_entry_can_reach_ack_quorum_without_an_answered_bookie(args):
    (E, qw, qa), order, entry_id = args
    c = CoverageSet(E, qw, qa)
    for i in order:
        c.add_response(i, "ok")
        if c.covered():
            break
    if c.covered():
        silent = set(range(E)) - c.answered
        assert len(silent & set(write_set(entry_id, E, qw))) < qa
