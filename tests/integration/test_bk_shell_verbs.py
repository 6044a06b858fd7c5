"""BookKeeper's shell verbs as `ledgerstore` commands, against real bookie processes: cluster info, bookie
lastmark, bookie sanity (bookiesanity), bookie updatecookie and bookie recover -l."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ledger_client.sync import BookKeeper


def _ls(bookies, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ledgerstore.cli", *args, "--zk", bookies.zk, "--zk-root", bookies.root]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _write_closed(bookies, n: int = 20, e: int = 3, w: int = 2, a: int = 2) -> int:
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    try:
        lh = bk.create_ledger(ensemble_size=e, write_quorum=w, ack_quorum=a, password=b"pw")
        lh.append_many([f"e{i}".encode() for i in range(n)])
        lh.close()
        return int(lh.ledger_id)
    finally:
        bk.close()


def test_cluster_info_counts_and_names_a_down_bookie(bookies) -> None:
    procs = bookies.start_many(3)
    lid = _write_closed(bookies)
    procs[2].stop()
    r = _ls(bookies, "cluster", "info", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["instance_id"]
    assert sorted(info["bookies"]["writable"]) == sorted(p.id for p in procs[:2])
    assert info["bookies"]["readonly"] == [] and info["bookies"]["down"] == [procs[2].id]
    assert info["ledgers"] >= 1 and info["brokers"] == []
    r = _ls(bookies, "cluster", "info")
    assert r.returncode == 0 and f"{procs[2].id}  DOWN" in r.stdout and "ledgers: " in r.stdout
    assert lid


def test_lastmark_reads_each_bookies_checkpoint_mark(bookies) -> None:
    procs = bookies.start_many(2)
    r = _ls(bookies, "bookie", "lastmark", "--json")
    assert r.returncode == 0, r.stderr
    marks = json.loads(r.stdout)
    assert sorted(marks) == sorted(p.id for p in procs)
    for p in procs:
        m = marks[p.id]
        assert m["journal_dir"] == str(p.data_dir / "journal")
        assert m["segment"] >= 0 and m["offset"] > 0 and m["file"].endswith(".jnl")
    r = _ls(bookies, "bookie", "lastmark", "--bookie-id", procs[0].id)
    assert r.returncode == 0 and r.stdout.startswith(f"{procs[0].id}: ") and "offset" in r.stdout
    assert _ls(bookies, "bookie", "lastmark", "--bookie-id", "10.9.9.9:1").returncode != 0


def test_sanity_writes_reads_and_deletes_on_each_bookie_alone(bookies) -> None:
    procs = bookies.start_many(2)
    r = _ls(bookies, "bookie", "sanity", "--json", "-n", "25")
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)
    assert sorted(results) == sorted(p.id for p in procs)
    assert all(v["ok"] and v["entries"] == 25 for v in results.values())
    r = _ls(bookies, "ledger", "list", "--json")
    assert json.loads(r.stdout) == []  # every sanity ledger deleted
    r = _ls(bookies, "bookie", "sanity", "--bookie-id", procs[1].id)
    assert r.returncode == 0 and r.stdout.startswith(f"{procs[1].id}: OK")


def _stop_and_wait_unregistered(bookies, bp) -> None:
    """Stop a bookie and wait until its registration is gone (a stop that had to kill leaves it until the
    session times out)."""
    import time

    bp.stop()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = _ls(bookies, "ledger", "bookies", "--json")
        if r.returncode == 0 and bp.id not in json.dumps(json.loads(r.stdout)):
            return
        time.sleep(0.5)
    raise AssertionError(f"{bp.id} still registered 30 s after it stopped")


def test_updatecookie_gives_a_stopped_bookie_a_new_id(bookies, tmp_path: Path) -> None:
    procs = bookies.start_many(3)
    lid = _write_closed(bookies, e=3, w=3, a=3)
    old = procs[0]
    r = _ls(bookies, "bookie", "updatecookie", "--bookie-id", "127.0.0.1:1", "--data-dir", str(old.data_dir))
    assert r.returncode != 0 and "running" in r.stderr  # registered: refused
    _stop_and_wait_unregistered(bookies, old)
    new_port = old.port  # same port, new id: a renamed host (an alias of 127.0.0.1)
    new_id = f"localhost:{new_port}"
    r = _ls(
        bookies,
        "bookie",
        "updatecookie",
        "--bookie-id",
        new_id,
        "--data-dir",
        str(old.data_dir),
        "--update-ledgers",
        "--dry-run",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["changed"] is False and plan["ledgers_naming_old_id"] == [lid]
    # a dry run changed nothing: the bookie still starts under its old id
    old.start()
    _stop_and_wait_unregistered(bookies, old)
    r = _ls(
        bookies,
        "bookie",
        "updatecookie",
        "--bookie-id",
        new_id,
        "--data-dir",
        str(old.data_dir),
        "--update-ledgers",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    assert done["changed"] is True and done["closed_ledgers_renamed"] == [lid]
    # the old id no longer starts on this data (its cookie is gone) ...
    old.bookie_id = None
    renamed = bookies.start(data_dir=old.data_dir, port=new_port, bookie_id=new_id)
    # ... the new one does, and serves the ledger's entries it held under the new name
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    try:
        md = bk.ledger_metadata(lid)
        assert new_id in md.ensembles[0].bookies and old.id not in md.ensembles[0].bookies
    finally:
        bk.close()
    for p in procs[1:]:
        p.stop()  # only the renamed bookie can answer now: Qa 3 of 3 wrote every entry there
    r = _ls(bookies, "ledger", "read", str(lid), "--password", "pw", "--json")
    assert r.returncode == 0, r.stderr
    assert [row["data"] for row in json.loads(r.stdout)] == [f"e{i}" for i in range(20)]
    assert renamed.healthy()


def test_recover_one_ledger_of_a_lost_bookie(bookies) -> None:
    procs = bookies.start_many(4)
    lid = _write_closed(bookies, e=3, w=3, a=3)
    other = _write_closed(bookies, e=3, w=3, a=3)
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    try:
        md = bk.ledger_metadata(lid)
        lost = md.ensembles[0].bookies[0]
        was_in_other = lost in bk.ledger_metadata(other).ensembles[0].bookies
    finally:
        bk.close()
    next(p for p in procs if p.id == lost).stop()
    r = _ls(bookies, "bookie", "recover", lost, "-l", str(lid), "--password", "pw", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [x["ledger_id"] for x in out["ledgers"]] == [lid] and out["ledgers"][0]["status"] == "done"
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    try:
        assert lost not in bk.ledger_metadata(lid).ensembles[0].bookies
        # only the named ledger was touched
        assert (lost in bk.ledger_metadata(other).ensembles[0].bookies) == was_in_other
    finally:
        bk.close()
