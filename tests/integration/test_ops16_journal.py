"""A bookie whose journal was deleted while its cookie file was left: it must refuse to start, not serve the
entries it acknowledged since its last checkpoint as missing."""

from __future__ import annotations

from tests.integration.test_bookie_storage_wiped import wrote_500


def test_a_journal_deleted_but_its_cookie_left_is_refused_not_served_as_empty(bookies) -> None:
    bp = bookies.start("--checkpoint-interval-s", "3600")  # the entries stay in the journal only
    wrote_500(bp)
    bp.kill9()
    journal = bp.data_dir / "journal"
    for f in journal.iterdir():  # the segments and the mark, as `rm journal/*.jnl journal/lastmark` would
        if f.name != "COOKIE":
            f.unlink()
    bp.start(wait=False)
    assert bp.wait_exit(30) == 3  # before the fix: it started and answered NO_LEDGER for the 500 entries
    log = bp.started_log_tail(5)
    assert "holds its cookie but no journal" in log and "bookie format --delete-cookie" in log, log
