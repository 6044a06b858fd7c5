"""A bookie that runs itself anew once its full disk had room, and finds the disk full again before its storage
reopened (something else filled it meanwhile), waits for room instead of exiting: it is still the same process,
it says why in one line, and once there is room it starts and serves every acknowledged entry. An operator's start
on a full disk is still refused (tests/integration/test_bookie_disk_full2.py)."""

from __future__ import annotations

import time
from pathlib import Path

from bookie.main import RESTARTED_FOR_ROOM_ENV
from tests.integration.test_bookie_disk_full import small_fs  # noqa: F401 (a fixture)
from tests.integration.test_bookie_disk_full2 import killed_with_journal_entries_on_a_full_disk, read_all_back


def test_a_restart_of_its_own_that_meets_a_full_disk_again_waits_for_room(bookies, small_fs: Path) -> None:  # noqa: F811
    bp, filler = killed_with_journal_entries_on_a_full_disk(bookies, small_fs, 6)
    # as _exec_self runs it anew after "the disk has room again"
    bp.env[RESTARTED_FOR_ROOM_ENV] = "1"
    bp.start(wait=False)
    deadline = time.monotonic() + 60
    while "the disk filled again before storage reopened" not in bp.log_tail(50):
        assert bp.alive, bp.log_tail(50)
        assert time.monotonic() < deadline, bp.log_tail(50)
        time.sleep(0.2)
    time.sleep(2)  # it keeps waiting: no exit, no refusal, no traceback
    assert bp.alive, bp.log_tail(50)
    log = bp.log_tail(400)
    assert "refusing to start" not in log and "Traceback" not in log, log[-3000:]
    pid = bp.proc.pid if bp.proc else None
    filler.unlink()
    bp.wait_healthy(60)
    assert bp.proc is not None and bp.proc.pid == pid  # the same process started, once there was room
    read_all_back(bp, 6)
