"""The `ledgerstore` command and the blocking client facade, against real processes."""

from __future__ import annotations

import json
import subprocess
import sys

from ledger_client.sync import BookKeeper


def _ls(bookies, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ledgerstore.cli", *args, "--zk", bookies.zk, "--zk-root", bookies.root]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_shell_verbs_round_trip(bookies) -> None:
    procs = bookies.start_many(3)
    r = _ls(bookies, "ledger", "bookies", "--json")
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(r.stdout)["writable"]) == sorted(bp.id for bp in procs)

    r = _ls(bookies, "ledger", "simpletest", "--entries", "300", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["verified"] is True and out["entries"] == 300

    r = _ls(bookies, "ledger", "write", "-n", "50", "--password", "pw", "--json")
    assert r.returncode == 0, r.stderr
    lid = json.loads(r.stdout)["ledger_id"]
    r = _ls(bookies, "ledger", "metadata", str(lid), "--json")
    md = json.loads(r.stdout)
    assert md["state"] == "CLOSED" and md["last_entry_id"] == 49
    r = _ls(bookies, "ledger", "read", str(lid), "--password", "pw", "--json")
    rows = json.loads(r.stdout)
    assert [row["entry_id"] for row in rows] == list(range(50))
    r = _ls(bookies, "ledger", "list", "--json")
    assert lid in [row["ledger_id"] for row in json.loads(r.stdout)]
    r = _ls(bookies, "ledger", "read", str(lid), "--password", "wrong")
    assert r.returncode != 0 and "UNAUTHORIZED" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _ls(bookies, "ledger", "delete", str(lid))
    assert r.returncode == 0
    r = _ls(bookies, "ledger", "metadata", str(lid))
    assert r.returncode != 0 and "does not exist" in r.stderr


def test_sync_facade_same_names_as_async(bookies) -> None:
    bookies.start_many(3)
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    try:
        lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"p")
        assert lh.append(b"zero") == 0
        assert lh.append_many([b"one", b"two"]) == [1, 2]
        rh = bk.open_ledger(lh.ledger_id, password=b"p", recovery=False)
        assert rh.read_last_add_confirmed() >= 0  # the LAC piggybacked on entries trails the last add
        lh.close()
        rh = bk.open_ledger(lh.ledger_id, password=b"p", recovery=True)
        assert [e.data for e in rh.read(0, rh.last_add_confirmed)] == [b"zero", b"one", b"two"]
        assert lh.ledger_id in bk.list_ledgers()
        bk.delete_ledger(lh.ledger_id)
    finally:
        bk.close()
