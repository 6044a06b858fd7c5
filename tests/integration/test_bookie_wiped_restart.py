"""A bookie restarted on a wiped (or swapped) disk moments after it crashed: its old process's registration
outlives it by a ZooKeeper session, so the refusal was only 'running already ... a second bookie needs its own
--port or --bookie-id', which sent the operator of a replaced disk after a second process that did not exist.
The refusal now also says what the directories show: no cookie where ZooKeeper has one, and what to do."""

from __future__ import annotations

from pathlib import Path

from ledgerstore import cli
from ledgerstore.cluster import BookieProcess, free_port
from tests.conftest import BookieFactory
from tests.integration.test_cli_operator2 import _refusal


def test_a_bookie_on_a_wiped_disk_while_its_id_is_registered_says_the_disk_looks_wiped(
    bookies: BookieFactory, tmp_path: Path
) -> None:
    # The running bookie stands for the crashed one whose registration has not expired yet (that lasts up to a
    # session after a kill -9): the same id, the same port, and an empty data directory (the wiped disk).
    first = bookies.start()
    wiped = tmp_path / "wiped"
    wiped.mkdir()
    again = BookieProcess(
        zk=bookies.zk,
        zk_root=bookies.root,
        data_dir=wiped,
        port=first.port,
        http_port=free_port(),
        log_path=tmp_path / "again.log",
    )
    again.start(wait=False)
    assert again.wait_exit(60) == cli.EXIT_COOKIE_MISMATCH, again.log_tail(50)
    line = _refusal(again)
    assert f"refusing to start: cookie mismatch: bookie {first.id} is running already" in line, line
    assert f"has no cookie in ['{wiped.resolve() / 'journal'}'" in line, line
    assert "looks wiped or swapped" in line, line
    assert f"ledgerstore bookie format --delete-cookie --bookie-id {first.id}" in line, line
    assert first.healthy()
