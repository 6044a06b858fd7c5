"""`ledger read` as a person reads it: one line per entry whatever its bytes, and a range that cannot be read
named as such rather than an empty answer with exit 0. Real ZooKeeper and bookie processes."""

from __future__ import annotations

import json
import subprocess
import sys

from ledger_client.sync import BookKeeper
from ledgerstore import cli
from tests.conftest import BookieFactory


def _ls(bookies: BookieFactory, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ledgerstore.cli", *args, "--zk", bookies.zk, "--zk-root", bookies.root]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_ledger_read_prints_one_line_per_entry_and_refuses_a_range_it_cannot_read(
    bookies: BookieFactory,
) -> None:
    bookies.start_many(2)
    entries = [b"two\nlines", b"\x1b[2Jcleared", b"tab\there\r", b"\xff\xfe not utf-8", "é ok".encode()]
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    try:
        lh = bk.create_ledger(ensemble_size=2, write_quorum=2, ack_quorum=2, password=b"")
        for e in entries:
            lh.append(e)
        lh.close()
        lid = str(lh.ledger_id)
    finally:
        bk.close()

    r = _ls(bookies, "ledger", "read", lid)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "0\ttwo\\nlines",
        "1\t\\x1b[2Jcleared",
        "2\ttab\\there\\r",
        "3\t\\xff\\xfe not utf-8",
        "4\té ok",
    ]
    r = _ls(bookies, "ledger", "read", lid, "--bookie", bookies.procs[0].id, "--first", "0", "--last", "0")
    assert r.returncode == 0 and r.stdout == "0\tOK\ttwo\\nlines\n", r.stdout + r.stderr
    # --json keeps the data as it was (escaped by JSON alone)
    assert json.loads(_ls(bookies, "ledger", "read", lid, "--json").stdout)[0]["data"] == "two\nlines"

    r = _ls(bookies, "ledger", "read", lid, "--first", "3", "--last", "1")
    assert r.returncode == cli.EXIT_USAGE and "--last 1 is before --first 3" in r.stderr, r.stdout + r.stderr
    r = _ls(bookies, "ledger", "read", lid, "--first", "9")
    assert r.returncode == cli.EXIT_ERROR and r.stdout == "", r.stdout + r.stderr
    assert "--first 9 is past ledger" in r.stderr and "0..4" in r.stderr, r.stderr
