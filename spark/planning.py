"""Pure planning for the ``ledger`` source and the jobs: entry ranges per partition, replicas per bookie.

Nothing here does I/O; the source feeds it metadata it read on the driver.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

__all__ = ["bookies_tried", "entry_ranges", "readable_last_entry", "replicas_per_bookie"]


def bookies_tried(
    ensembles: Sequence[tuple[int, Sequence[str]]], first: int, registered: set[str] | None
) -> str:
    """What a read error of a ledger says of its bookies: those of the ensembles (``(first entry, bookies)``, in
    order) holding entries ``first`` on, each not in ``registered`` (None: unknown) marked, and how many are not:
    ``bookies tried: A, B (not registered); 1 of 2 not registered: start them, or wait for AutoRecovery``."""
    held = [b for i, (_, b) in enumerate(ensembles) if i + 1 == len(ensembles) or ensembles[i + 1][0] > first]
    tried = list(dict.fromkeys(x for bs in held for x in bs))
    down = [b for b in tried if registered is not None and b not in registered]
    text = "bookies tried: " + (
        ", ".join(f"{b} (not registered)" if b in down else b for b in tried) or "none"
    )
    if down:
        text += f"; {len(down)} of {len(tried)} not registered: start them, or wait for AutoRecovery"
    return text


def readable_last_entry(state: str, last_entry_id: int, lac: int) -> int:
    """The last entry a scan reads: ``last_entry_id`` of a CLOSED ledger, the LAC of any other (never beyond it:
    entries past the LAC may still be rewritten by recovery)."""
    return last_entry_id if state == "CLOSED" else lac


def entry_ranges(
    last_entry_id: int, entries_per_partition: int, first_entry_id: int = 0
) -> list[tuple[int, int]]:
    """Inclusive ranges ``(first, last)`` covering ``first_entry_id..last_entry_id``, each at most
    ``entries_per_partition`` long; none for an empty ledger."""
    if entries_per_partition < 1:
        raise ValueError(f"entries_per_partition must be >= 1, got {entries_per_partition}")
    out: list[tuple[int, int]] = []
    lo = first_entry_id
    while lo <= last_entry_id:
        hi = min(lo + entries_per_partition - 1, last_entry_id)
        out.append((lo, hi))
        lo = hi + 1
    return out


def _count_in_residue_window(lo: int, hi: int, modulus: int, start: int, width: int) -> int:
    """How many e in lo..hi have (e - start) mod modulus < width."""
    if hi < lo:
        return 0
    n = hi - lo + 1
    full, rest = divmod(n, modulus)
    count = full * min(width, modulus)
    first = (lo - start) % modulus
    count += sum(1 for k in range(rest) if (first + k) % modulus < width)
    return count


def replicas_per_bookie(
    ensembles: Sequence[tuple[int, Sequence[str]]], write_quorum: int, last_entry_id: int
) -> Counter[str]:
    """Entry replicas each bookie holds by the placement rule: entry e of an ensemble goes to bookies
    ``(e + i) mod E`` for ``i < Qw``. ``ensembles`` are ``(first_entry_id, bookies)`` in order; entries
    ``0..last_entry_id`` are counted. The counts sum to ``Qw * (last_entry_id + 1)``."""
    counts: Counter[str] = Counter()
    for k, (first, bookies) in enumerate(ensembles):
        end = ensembles[k + 1][0] - 1 if k + 1 < len(ensembles) else last_entry_id
        end = min(end, last_entry_id)
        size = len(bookies)
        for idx, bookie in enumerate(bookies):
            # bookie idx stores e iff (idx - e) mod E < Qw, i.e. e in the window of Qw ids ending at idx
            n = _count_in_residue_window(first, end, size, idx - write_quorum + 1, write_quorum)
            if n:
                counts[bookie] += n
    return counts
