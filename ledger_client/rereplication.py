"""Re-replication of a lost bookie's share of a CLOSED ledger (BookKeeper's ``recover`` / AutoRecovery), pure.

When a bookie is gone for good, every ledger fragment it held has one copy fewer than its write quorum. For each
fragment (the entries one ensemble covers) that holds the bookie, ``lost_fragments`` says which entries that
bookie stored: entry ``e`` is on ensemble index ``i`` when ``i`` is in its write set, ``(i - e) mod E < Qw``.
The re-replicator reads each from another bookie of its write set, writes it as is (the client's bytes, digest
included) to a replacement bookie that is not in the ensemble, and only then swaps the replacement in at the
lost bookie's position (``swapped``), one metadata CAS for the ledger. The metadata rule it relies on is
``zk.ledger_metadata.check_bookie_swap``: in a CLOSED ledger a bookie may be swapped in place for one not in
the ensemble, nothing else may change. Only CLOSED ledgers are re-replicated: an open ledger's writer replaces
failed bookies itself (ensemble change), and recovery closes an abandoned one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from zk.ledger_metadata import Ensemble, LedgerMetadata, LedgerState

__all__ = ["Fragment", "lost_fragments", "swapped"]


@dataclass(frozen=True)
class Fragment:
    """The part of ensemble ``ensemble_index`` (entries ``first_entry_id..last_entry_id``, empty when last <
    first) that the lost bookie at ``bookie_index`` held, in a ledger of ``ensemble_size`` / ``write_quorum``."""

    ensemble_index: int
    bookie_index: int
    first_entry_id: int
    last_entry_id: int
    ensemble_size: int
    write_quorum: int

    def entries(self) -> Iterator[int]:
        """The entry ids of this fragment stored on the lost bookie, ascending."""
        e_size, qw, b = self.ensemble_size, self.write_quorum, self.bookie_index
        for e in range(self.first_entry_id, self.last_entry_id + 1):
            if (b - e) % e_size < qw:
                yield e


def lost_fragments(md: LedgerMetadata, bookie: str) -> list[Fragment]:
    """Every fragment of a CLOSED ledger that ``bookie`` is in, with the entries it stored (maybe none); of an
    OPEN ledger only the sealed ones (every ensemble but the last, whose entries were all acknowledged before the
    writer changed ensemble). A ledger IN_RECOVERY has none: its recoverer decides where it ends."""
    if md.state is LedgerState.IN_RECOVERY:
        raise ValueError(f"ledger {md.ledger_id} is IN_RECOVERY: it is re-replicated once closed")
    out = []
    ens = md.ensembles
    for k, ensemble in enumerate(ens):
        if bookie not in ensemble.bookies or (k + 1 == len(ens) and not md.is_closed):
            continue
        last = ens[k + 1].first_entry_id - 1 if k + 1 < len(ens) else md.last_entry_id
        out.append(
            Fragment(
                ensemble_index=k,
                bookie_index=ensemble.bookies.index(bookie),
                first_entry_id=ensemble.first_entry_id,
                last_entry_id=min(last, md.last_entry_id) if md.is_closed else last,
                ensemble_size=md.ensemble_size,
                write_quorum=md.write_quorum,
            )
        )
    return out


def swapped(md: LedgerMetadata, bookie: str, replacements: Mapping[int, str]) -> LedgerMetadata:
    """``md`` with ``bookie`` replaced, in the ensembles ``replacements`` names (ensemble index -> new bookie),
    at its own position. Raises ``ValueError`` when ``bookie`` is no longer there (metadata changed meanwhile:
    the caller re-reads and plans again) or a replacement is already in the ensemble."""
    ensembles = list(md.ensembles)
    for k, new in replacements.items():
        ensemble = ensembles[k]
        if bookie not in ensemble.bookies:
            raise ValueError(f"ledger {md.ledger_id}: {bookie} is no longer in ensemble {k}")
        if new in ensemble.bookies:
            raise ValueError(f"ledger {md.ledger_id}: {new} is already in ensemble {k}")
        bookies = tuple(new if b == bookie else b for b in ensemble.bookies)
        ensembles[k] = Ensemble(ensemble.first_entry_id, bookies)
    return md.replace(ensembles=tuple(ensembles))
