"""Placement: distinct writable bookies, deterministic given the rng, NotEnoughBookiesError otherwise."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger_client.errors import IncorrectParameterError, NotEnoughBookiesError
from ledger_client.placement import choose_ensemble, choose_replacement, replace_failed

BOOKIES = [f"10.0.0.{i}:3181" for i in range(8)]


def test_choose_ensemble_is_distinct_writable_and_not_excluded():
    for seed in range(50):
        ens = choose_ensemble(
            4, BOOKIES, readonly={BOOKIES[0]}, exclude={BOOKIES[1]}, rng=random.Random(seed)
        )
        assert len(ens) == len(set(ens)) == 4
        assert set(ens) <= set(BOOKIES) - {BOOKIES[0], BOOKIES[1]}


def test_choose_ensemble_is_deterministic_given_the_seed_whatever_the_input_order():
    a = choose_ensemble(3, BOOKIES, rng=random.Random(7))
    b = choose_ensemble(3, list(reversed(BOOKIES)), rng=random.Random(7))
    c = choose_ensemble(3, set(BOOKIES), rng=random.Random(7))
    assert a == b == c


def test_choose_ensemble_spreads_over_all_bookies():
    seen = set()
    rng = random.Random(1)
    for _ in range(200):
        seen.update(choose_ensemble(2, BOOKIES, rng=rng))
    assert seen == set(BOOKIES)


def test_not_enough_bookies():
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(3, BOOKIES[:3], readonly={BOOKIES[2]}, rng=random.Random(0))
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(3, BOOKIES[:3], exclude={BOOKIES[0]}, rng=random.Random(0))
    assert sorted(choose_ensemble(3, BOOKIES[:3], rng=random.Random(0))) == sorted(BOOKIES[:3])
    with pytest.raises(IncorrectParameterError):
        choose_ensemble(0, BOOKIES)


def test_choose_replacement_never_picks_a_member_readonly_or_excluded():
    ens = BOOKIES[:3]
    for seed in range(50):
        r = choose_replacement(
            ens, 1, BOOKIES, readonly={BOOKIES[3]}, exclude={BOOKIES[4]}, rng=random.Random(seed)
        )
        assert r in set(BOOKIES[5:])


def test_choose_replacement_fails_without_candidates():
    with pytest.raises(NotEnoughBookiesError):
        choose_replacement(BOOKIES[:3], 0, BOOKIES[:4], readonly={BOOKIES[3]}, rng=random.Random(0))
    with pytest.raises(IncorrectParameterError):
        choose_replacement(BOOKIES[:3], 3, BOOKIES, rng=random.Random(0))


def test_replace_failed_keeps_other_positions_and_picks_distinct_replacements():
    ens = BOOKIES[:4]
    new = replace_failed(ens, {0, 2}, BOOKIES, rng=random.Random(3))
    assert new[1] == ens[1] and new[3] == ens[3]
    assert new[0] not in ens and new[2] not in ens and new[0] != new[2]
    with pytest.raises(NotEnoughBookiesError):
        replace_failed(ens, {0, 1}, BOOKIES[:5], rng=random.Random(3))


@given(
    n=st.integers(1, 8),
    e=st.integers(1, 8),
    ro=st.sets(st.sampled_from(BOOKIES)),
    ex=st.sets(st.sampled_from(BOOKIES)),
    seed=st.integers(0, 2**32),
)
def test_choose_ensemble_property(n, e, ro, ex, seed):
    avail = BOOKIES[:n]
    writable = set(avail) - ro - ex
    if len(writable) < e:
        with pytest.raises(NotEnoughBookiesError):
            choose_ensemble(e, avail, ro, ex, random.Random(seed))
    else:
        ens = choose_ensemble(e, avail, ro, ex, random.Random(seed))
        assert len(set(ens)) == e and set(ens) <= writable
        assert ens == choose_ensemble(e, avail, ro, ex, random.Random(seed))
