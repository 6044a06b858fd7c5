"""Bookie placement: which bookies form an ensemble, and which replaces a failed one.

Pure and deterministic given a :class:`random.Random`: candidates are sorted before drawing, so the result
does not depend on set iteration order (string hashing is randomised per process) — the simulator replays
a seed exactly. The policy is BookKeeper's default one (uniformly random among writable bookies); rack or
region awareness can be added behind the same functions.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence, Set

from .errors import IncorrectParameterError, NotEnoughBookiesError

__all__ = ["choose_ensemble", "choose_replacement", "replace_failed"]


def _candidates(available: Iterable[str], readonly: Set[str], exclude: Set[str]) -> list[str]:
    return sorted(set(available) - set(readonly) - set(exclude))


def choose_ensemble(
    ensemble_size: int,
    available: Iterable[str],
    readonly: Set[str] = frozenset(),
    exclude: Set[str] = frozenset(),
    rng: random.Random | None = None,
) -> list[str]:
    """``ensemble_size`` distinct writable bookies (available, not read-only, not excluded), in random order.

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
    return (rng or random.Random()).sample(pool, ensemble_size)


def choose_replacement(
    ensemble: Sequence[str],
    failed_index: int,
    available: Iterable[str],
    readonly: Set[str] = frozenset(),
    exclude: Set[str] = frozenset(),
    rng: random.Random | None = None,
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
    return (rng or random.Random()).choice(pool)


def replace_failed(
    ensemble: Sequence[str],
    failed_indices: Iterable[int],
    available: Iterable[str],
    readonly: Set[str] = frozenset(),
    exclude: Set[str] = frozenset(),
    rng: random.Random | None = None,
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
        new[i] = choose_replacement(new, i, available, readonly, set(exclude) | chosen | set(ensemble), rng)
        chosen.add(new[i])
    return new
