"""AutoRecovery's decisions, pure: fed with metadata, registrations and time, they say what to mark, what to check
and what a worker does with a mark. The auditor and the workers (``auditor.py``, ``worker.py``) only carry them
out; the simulator and ``tests/unit/test_autorecovery_policy.py`` drive them with no ZooKeeper and no bookie.

Lost bookies (:class:`LostBookieTracker`): a bookie that ledgers name (or that was registered) and that is not
registered is *missing* from the moment it is first seen so; once missing for ``lost_bookie_recovery_delay_s``
it is *lost* and every ledger naming it is marked (:func:`ledgers_to_mark`). One that registers again before then
is forgotten: nothing is marked. Delay 0 (the default, as BookKeeper's) marks at once.

The check (:func:`entries_to_check`) asks each live bookie of a fragment for entries it should store: the first
and last of its share of the fragment (``sample``) or all of them (``all``). A live bookie answering NO_ENTRY or
NO_LEDGER is marked as missing those entries.

A worker holding a mark (:func:`decide`):

* ledger gone, or none of the mark's bookies in its ensembles -> ``clear``;
* CLOSED -> ``replicate``: each named bookie that is gone, read-only or being drained is *replaced* (its entries
  copied to a bookie the placement policy picks, then one CAS swaps the replacements in); a named bookie that is
  registered and writable (found lacking entries by the check) is *repaired in place* (the entries it lacks
  are copied back to it; no metadata change);
* OPEN or IN_RECOVERY with a missing bookie in its last ensemble: within the grace period ``wait`` (the writer,
  if alive, replaces it by an ensemble change); after it ``recover`` (fence and close, as BookKeeper's worker
  does with a ledger still open after the grace period), then replicate;
* OPEN with the mark's gone bookies only in earlier ensembles (the writer changed ensemble: it is alive) ->
  ``replicate`` their sealed fragments (every entry there was acknowledged) and swap them in, while the writer
  goes on in its last ensemble (``zk.ledger_metadata.check_transition`` admits that swap in an OPEN ledger);
* OPEN with only drained or live bookies marked, or IN_RECOVERY: ``wait`` for the close.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field

from ledger_client.rereplication import Fragment
from zk.ledger_metadata import LedgerMetadata
from zk.underreplication import UnderReplicationMark

__all__ = [
    "Action",
    "Decision",
    "LostBookieTracker",
    "TokenBucket",
    "bookies_in",
    "decide",
    "entries_to_check",
    "fragments_of",
    "ledgers_to_mark",
]


class LostBookieTracker:
    """Which bookies are lost, given what is registered over time (times in seconds, any monotonic clock)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.missing_since: dict[str, float] = {}
        self.marked: set[str] = set()
        self._seen: set[str] = set()

    def observe(self, registered: Set[str], referenced: Iterable[str], now: float) -> set[str]:
        """Record who is registered now and which bookies ledgers name; returns the bookies that came back
        (their pending loss is cancelled)."""
        self._seen |= set(registered) | set(referenced)
        missing = self._seen - set(registered)
        back = set(self.missing_since) - missing
        for b in back:
            del self.missing_since[b]
            self.marked.discard(b)
        for b in missing:
            self.missing_since.setdefault(b, now)
        return back

    def forget(self, bookie: str) -> None:
        """``bookie`` is named by no ledger and not registered: stop tracking it."""
        self._seen.discard(bookie)
        self.missing_since.pop(bookie, None)
        self.marked.discard(bookie)

    def due(self, now: float) -> set[str]:
        """Bookies missing for at least the delay whose ledgers are not marked yet."""
        return {b for b, t in self.missing_since.items() if now - t >= self.delay_s} - self.marked

    def pending(self, now: float) -> dict[str, float]:
        """Missing bookies still within the delay -> seconds left."""
        return {b: self.delay_s - (now - t) for b, t in self.missing_since.items() if now - t < self.delay_s}


def bookies_in(md: LedgerMetadata) -> set[str]:
    return {b for ens in md.ensembles for b in ens.bookies}


def ledgers_to_mark(ledgers: Mapping[int, LedgerMetadata], lost: Set[str]) -> dict[int, set[str]]:
    """Ledger id -> the lost bookies it names, for every ledger naming one."""
    out = {}
    for lid, md in ledgers.items():
        hit = bookies_in(md) & lost
        if hit:
            out[lid] = hit
    return out


def fragments_of(md: LedgerMetadata, bookie_index_of: Mapping[int, int] | None = None) -> list[Fragment]:
    """Every sealed fragment of every bookie position: ``(ensemble k, index i)`` with its entry range. A CLOSED
    ledger's fragments end at its last entry; an OPEN one's last ensemble is not sealed and is left out."""
    ens = md.ensembles
    out = []
    for k, ensemble in enumerate(ens):
        if k + 1 < len(ens):
            last = ens[k + 1].first_entry_id - 1
        elif md.is_closed:
            last = md.last_entry_id
        else:
            continue
        if md.is_closed:
            last = min(last, md.last_entry_id)
        for i in range(len(ensemble.bookies)):
            out.append(Fragment(k, i, ensemble.first_entry_id, last, md.ensemble_size, md.write_quorum))
    return out


def entries_to_check(md: LedgerMetadata, live: Set[str], all_entries: bool = False) -> dict[str, list[int]]:
    """Bookie -> entry ids to read from it: for each sealed fragment of a live bookie, the first and last entry
    it stores (or every one with ``all_entries``)."""
    out: dict[str, list[int]] = {}
    for f in fragments_of(md):
        bookie = md.ensembles[f.ensemble_index].bookies[f.bookie_index]
        if bookie not in live:
            continue
        ids = list(f.entries())
        if not ids:
            continue
        want = ids if all_entries else sorted({ids[0], ids[-1]})
        out.setdefault(bookie, []).extend(want)
    return {b: sorted(set(ids)) for b, ids in out.items()}


class Action(enum.StrEnum):
    CLEAR = "clear"
    WAIT = "wait"
    RECOVER = "recover"
    REPLICATE = "replicate"


@dataclass(frozen=True)
class Decision:
    action: Action
    replace: frozenset[str] = field(default_factory=frozenset)  # bookies whose entries go to a new bookie
    repair: frozenset[str] = field(
        default_factory=frozenset
    )  # live bookies that get their missing entries back
    why: str = ""


def decide(
    md: LedgerMetadata | None,
    mark: UnderReplicationMark,
    writable: Set[str],
    registered: Set[str],
    now_ms: int,
    grace_ms: int,
) -> Decision:
    """What a worker holding ``mark`` does (see the module docstring). ``writable`` and ``registered`` are the
    registered bookies (writable ones, and all of them)."""
    if md is None:
        return Decision(Action.CLEAR, why="ledger deleted")
    named = bookies_in(md)
    missing = set(mark.missing) & named
    drain = set(mark.drain) & named
    if not missing and not drain:
        return Decision(Action.CLEAR, why="no marked bookie is in the ledger's ensembles any more")
    if not md.is_closed:
        gone_in_last = (missing - writable) & set(md.last_ensemble.bookies)
        if gone_in_last:
            age = now_ms - mark.ctime_ms
            if age < grace_ms:
                return Decision(
                    Action.WAIT,
                    why=f"open; grace period for its writer ({(grace_ms - age) / 1000:.1f}s left)",
                )
            return Decision(
                Action.RECOVER, why=f"still open after the grace period with {sorted(gone_in_last)} gone"
            )
        sealed_gone = missing - writable  # none in the last ensemble: only in sealed ones
        if sealed_gone and md.state.value == "OPEN":
            return Decision(Action.REPLICATE, frozenset(sealed_gone), frozenset())
        return Decision(
            Action.WAIT,
            why="open, its writer alive, no gone bookie marked in a sealed ensemble: waiting for it to close",
        )
    replace = drain | {b for b in missing if b not in writable}
    repair = missing - replace
    return Decision(Action.REPLICATE, frozenset(replace), frozenset(repair))


class TokenBucket:
    """Bytes per second with a burst of one second's worth; ``rate <= 0`` means no limit. Times in seconds."""

    def __init__(self, rate_bytes_per_s: float, now: float) -> None:
        self.rate = rate_bytes_per_s
        self.tokens = max(rate_bytes_per_s, 0.0)
        self.updated = now

    def take(self, nbytes: int, now: float) -> float:
        """Take ``nbytes``; returns how long to wait before sending them (0 when within the rate)."""
        if self.rate <= 0:
            return 0.0
        self.tokens = min(self.rate, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        self.tokens -= nbytes
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate
