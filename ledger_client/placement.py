"""Bookie placement: which bookies form an ensemble, and which replaces a failed one.

Pure and deterministic given a :class:`random.Random`: candidates are sorted before drawing, so the result
does not depend on set iteration order (string hashing is randomised per process) — the simulator replays
a seed exactly. Without ``racks`` the policy is BookKeeper's default one (uniformly random among writable
bookies). With ``racks`` (bookie id -> ``/region/rack``; a bookie not in the map is in
``zk.racks.DEFAULT_RACK``) it is rack-aware, as BookKeeper's ``RackawareEnsemblePlacementPolicy``:

* an ensemble spans at least ``min(min_racks, racks with a candidate, ensemble size)`` racks, the bookies drawn
  as evenly from the racks as they allow;
* neighbouring ensemble positions (cyclically) sit in different racks whenever the drawn racks allow it. Write
  sets are runs of Qw consecutive positions (``quorum.write_set``), so with Qw >= 2 no write set sits in one
  rack when that can be avoided, whatever Qw;
* a replacement (ensemble change, re-replication) keeps the ensemble at the rack count it needs first, then
  avoids the racks of the position's neighbours, then draws at random among the best.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence, Set

from zk.racks import DEFAULT_RACK

from .errors import IncorrectParameterError, NotEnoughBookiesError

__all__ = ["DEFAULT_MIN_RACKS", "choose_ensemble", "choose_replacement", "rack_of", "replace_failed"]

#: BookKeeper's ``minNumRacksPerWriteQuorum`` default is 2.
DEFAULT_MIN_RACKS = 2


def rack_of(bookie: str, racks: Mapping[str, str]) -> str:
    return racks.get(bookie, DEFAULT_RACK)


def _rack_aware_ensemble(
    pool: list[str], size: int, racks: Mapping[str, str], rng: random.Random
) -> list[str]:
    by_rack: dict[str, list[str]] = {}
    for b in pool:  # pool is sorted: the draw depends on the rng only
        by_rack.setdefault(rack_of(b, racks), []).append(b)
    for members in by_rack.values():
        rng.shuffle(members)
    order = sorted(by_rack)
    rng.shuffle(order)
    # As even a share per rack as capacities allow: one bookie per rack per round.
    share = dict.fromkeys(order, 0)
    left = size
    while left:
        for r in order:
            if left and share[r] < len(by_rack[r]):
                share[r] += 1
                left -= 1
    # Arrange so that neighbours (cyclically) differ in rack where possible: each step takes the rack with the
    # most left to place that is not the previous one (ties by the shuffled order); the last also avoids the first.
    out: list[str] = []
    taken = dict.fromkeys(order, 0)
    rank = {r: i for i, r in enumerate(order)}
    while len(out) < size:
        prev = rack_of(out[-1], racks) if out else None
        first = rack_of(out[0], racks) if out else None
        last_step = len(out) == size - 1
        cands = [r for r in order if taken[r] < share[r]]

        def key(
            r: str, prev: str | None = prev, first: str | None = first, last_step: bool = last_step
        ) -> tuple:
            return (r == prev, last_step and r == first, -(share[r] - taken[r]), rank[r])

        r = min(cands, key=key)
        out.append(by_rack[r][taken[r]])
        taken[r] += 1
    return out


def _candidates(available: Iterable[str], readonly: Set[str], exclude: Set[str]) -> list[str]:
    return sorted(set(available) - set(readonly) - set(exclude))


def choose_ensemble(
    ensemble_size: int,
    available: Iterable[str],
    readonly: Set[str] = frozenset(),
    exclude: Set[str] = frozenset(),
    rng: random.Random | None = None,
    *,
    racks: Mapping[str, str] | None = None,
) -> list[str]:
    """``ensemble_size`` distinct writable bookies (available, not read-only, not excluded), in random order
    (with ``racks``: spread over racks, see the module docstring).

    Raises :class:`NotEnoughBookiesError` when fewer qualify. ``rng`` defaults to a fresh ``random.Random()``.
    """
    if ensemble_size < 1:
        raise IncorrectParameterError(f"ensemble size must be >= 1, got {ensemble_size}")
    pool = _candidates(available, readonly, exclude)
    if len(pool) < ensemble_size:
        raise NotEnoughBookiesError(
            f"need {ensemble_size} writable bookies, have {len(pool)}: {pool} "
            f"(read-only: {sorted(readonly)}, excluded: {sorted(exclude)})"
        )
    if racks is not None:
        return _rack_aware_ensemble(pool, ensemble_size, racks, rng or random.Random())
    return (rng or random.Random()).sample(pool, ensemble_size)


def choose_replacement(
    ensemble: Sequence[str],
    failed_index: int,
    available: Iterable[str],
    readonly: Set[str] = frozenset(),
    exclude: Set[str] = frozenset(),
    rng: random.Random | None = None,
    *,
    racks: Mapping[str, str] | None = None,
    min_racks: int = DEFAULT_MIN_RACKS,
) -> str:
    """A writable bookie to take ``ensemble[failed_index]``'s place: never a current member of ``ensemble``
    (including the failed bookie itself), never read-only or excluded. :class:`NotEnoughBookiesError` if none.
    """
    if not 0 <= failed_index < len(ensemble):
        raise IncorrectParameterError(f"failed index {failed_index} outside an ensemble of {len(ensemble)}")
    pool = _candidates(available, readonly, set(exclude) | set(ensemble))
    if not pool:
        raise NotEnoughBookiesError(
            f"no replacement for {ensemble[failed_index]} (index {failed_index}) in ensemble {list(ensemble)}"
        )
    if racks is None:
        return (rng or random.Random()).choice(pool)
    return (rng or random.Random()).choice(_best_replacements(ensemble, failed_index, pool, racks, min_racks))


def _best_replacements(
    ensemble: Sequence[str], index: int, pool: list[str], racks: Mapping[str, str], min_racks: int
) -> list[str]:
    others = [rack_of(b, racks) for i, b in enumerate(ensemble) if i != index]
    racks_now = set(others)
    reachable = len(racks_now | {rack_of(b, racks) for b in pool})
    need = min(min_racks, reachable, len(ensemble))
    n = len(ensemble)
    neighbours = {rack_of(ensemble[(index + d) % n], racks) for d in (-1, 1) if (index + d) % n != index}

    def key(b: str) -> tuple[int, int]:
        r = rack_of(b, racks)
        return (max(0, need - len(racks_now | {r})), int(r in neighbours))

    best = min(key(b) for b in pool)
    return [b for b in pool if key(b) == best]


def replace_failed(
    ensemble: Sequence[str],
    failed_indices: Iterable[int],
    available: Iterable[str],
    readonly: Set[str] = frozenset(),
    exclude: Set[str] = frozenset(),
    rng: random.Random | None = None,
    *,
    racks: Mapping[str, str] | None = None,
    min_racks: int = DEFAULT_MIN_RACKS,
) -> list[str]:
    """The ensemble with every failed index replaced by a distinct new bookie (indices in ascending order).

    Bookies at other indices keep their place. All or nothing: :class:`NotEnoughBookiesError` if any failed
    index cannot be replaced.
    """
    rng = rng or random.Random()
    new = list(ensemble)
    chosen: set[str] = set()
    for i in sorted(set(failed_indices)):
        # Exclude the original members too: a failed bookie must not come back at another index.
        new[i] = choose_replacement(
            new,
            i,
            available,
            readonly,
            set(exclude) | chosen | set(ensemble),
            rng,
            racks=racks,
            min_racks=min_racks,
        )
        chosen.add(new[i])
    return new
