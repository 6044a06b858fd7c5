"""More of the operator's bad day against real ZooKeeper and processes: a bookie whose identity check fails, and
a broker, an AutoRecovery process or a ledger command pointed at a mistyped --zk-root, each get one clear line and
the usual exit status, with nothing left behind."""

from __future__ import annotations

from pathlib import Path

from ledgerstore import cli
from ledgerstore.cluster import BookieProcess, free_port
from tests.conftest import BookieFactory


def _refusal(bp: BookieProcess) -> str:
    """The one line a bookie that refused to start logged, after checking that it logged nothing more about it
    (no traceback, no 'shutting down' of a bookie that never ran)."""
    log = bp.log_tail(100)
    assert "Traceback" not in log and "shutting down" not in log and " stopped\n" not in log + "\n", log
    lines = [line for line in log.splitlines() if "refusing to start" in line]
    assert len(lines) == 1, log
    return lines[0]


def test_a_bookie_whose_cookie_does_not_match_refuses_in_one_line_with_the_cookie_status(
    bookies: BookieFactory, tmp_path: Path
) -> None:
    """A damaged COOKIE file in a data directory ended the bookie with a traceback-free but unlogged 'ledgerstore:
    COOKIE_MISMATCH: ...' and exit status 1; a cookie that belongs to another process logged its refusal and
    then 'shutting down' and 'stopped' as if the bookie had run. Both are now the refusal of any other check:
    one 'refusing to start: cookie mismatch: ...' line, exit status 3."""
    first = bookies.start()
    damaged = tmp_path / "damaged"
    (damaged / "journal").mkdir(parents=True)
    (damaged / "journal" / "COOKIE").write_text("not a cookie\n")
    second_id = BookieProcess(
        zk=bookies.zk,
        zk_root=bookies.root,
        data_dir=tmp_path / "other",
        port=free_port(),
        http_port=free_port(),
    )
    second_id.bookie_id = first.id  # the running bookie's id, with directories that are not its
    for bp, why in (
        (
            BookieProcess(
                zk=bookies.zk, zk_root=bookies.root, data_dir=damaged, port=free_port(), http_port=free_port()
            ),
            "cookie file",
        ),
        (second_id, f"bookie {first.id} is running already"),
    ):
        bp.start(wait=False)
        assert bp.wait_exit(60) == cli.EXIT_COOKIE_MISMATCH, bp.log_tail(50)
        line = _refusal(bp)
        assert f"refusing to start: cookie mismatch: {why}" in line, line
    assert first.healthy()
