"""bookie.startcheck: the start-up decisions the bookie and the simulator share."""

from __future__ import annotations

import pytest

from bookie.startcheck import StorageCheck, TailVerdict, storage_check, tail_verdict


@pytest.mark.parametrize(
    ("journal_written", "storage_present", "checkpointed", "expect"),
    [
        (True, True, True, StorageCheck.OK),
        (True, True, False, StorageCheck.OK),
        (
            True,
            False,
            False,
            StorageCheck.OK,
        ),  # nothing dropped from the journal: replay rebuilds the storage
        (True, False, True, StorageCheck.STORAGE_WIPED),  # 911c2b3: entries before the mark are gone
        (False, True, False, StorageCheck.JOURNAL_WIPED),
        (False, False, False, StorageCheck.JOURNAL_WIPED),
    ],
)
def test_storage_check(
    journal_written: bool, storage_present: bool, checkpointed: bool, expect: StorageCheck
) -> None:
    got = storage_check(
        journal_written=journal_written, storage_present=storage_present, journal_checkpointed=checkpointed
    )
    assert got is expect


def test_tail_verdict() -> None:
    assert tail_verdict(last_segment=True, later_batch=False) is TailVerdict.CUT  # a torn final batch
    assert tail_verdict(last_segment=True, later_batch=True) is TailVerdict.DAMAGE  # 31b4e10
    assert tail_verdict(last_segment=False, later_batch=False) is TailVerdict.DAMAGE
    assert tail_verdict(last_segment=False, later_batch=True) is TailVerdict.DAMAGE
