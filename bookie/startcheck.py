"""The bookie's start-up decisions about its own disks, as pure functions (no I/O).

``bookie.main`` gathers the facts from the directories (``journal.never_written``, ``storage.storage_present``,
``journal.stored_mark``) and the journal's replay gathers them from a segment's bytes (``journal._later_batch``);
both then ask these functions, and the deterministic simulator (tests/sim) asks the very same ones about its
simulated disks, so the rules themselves are what it checks.

* :func:`storage_check`: a bookie whose cookies match may still have lost a directory's contents. A journal
  with no segment and no mark lost what it acknowledged since its last checkpoint (911c2b3's sibling,
  JournalWipedRefusal); a ledger storage that is gone while the journal's mark is past its start lost what the
  checkpoints dropped from the journal (911c2b3). Either way an empty bookie would answer NO_ENTRY/NO_LEDGER
  for entries it acknowledged, so it must not start.
* :func:`tail_verdict`: replay stopped early in a segment (a short or checksum-failing record). Only the last
  segment can end in a torn tail, and only in the batch in flight when the process died: one batch is written
  at a time, after the one before it was synced and acknowledged. So with a later batch on disk past the damage
  it is damage to acknowledged records, not a torn tail, and cutting it would lose them (31b4e10).
"""

from __future__ import annotations

import enum

__all__ = ["StorageCheck", "TailVerdict", "storage_check", "tail_verdict"]


class StorageCheck(enum.Enum):
    OK = "ok"
    JOURNAL_WIPED = "journal wiped"  # cookie kept, journal gone: refuse
    STORAGE_WIPED = "storage wiped"  # cookie kept, ledger storage gone after a checkpoint: refuse


def storage_check(
    *, journal_written: bool, storage_present: bool, journal_checkpointed: bool
) -> StorageCheck:
    """What a bookie whose cookies match (not a new one) may do with its directories.

    ``journal_written``: the journal directory holds a segment or a mark; ``storage_present``: the ledger
    directory holds its storage; ``journal_checkpointed``: the journal's mark is past its start (records before
    it may have been dropped from the journal, their entries living in the storage only)."""
    if not journal_written:
        return StorageCheck.JOURNAL_WIPED
    if not storage_present and journal_checkpointed:
        return StorageCheck.STORAGE_WIPED
    # storage gone with the mark at the journal's start: nothing was dropped, the replay rebuilds it all
    return StorageCheck.OK


class TailVerdict(enum.Enum):
    CUT = "cut"  # a torn tail: truncate the segment where the scan stopped
    DAMAGE = "damage"  # acknowledged records are damaged: refuse, leave the file as it is


def tail_verdict(*, last_segment: bool, later_batch: bool) -> TailVerdict:
    """What replay does with a segment whose scan stopped before its end.

    ``last_segment``: it is the journal's newest segment (only that one was being written); ``later_batch``:
    a whole record of a batch written after the one holding the stop point is on disk past it."""
    if not last_segment or later_batch:
        return TailVerdict.DAMAGE
    return TailVerdict.CUT
