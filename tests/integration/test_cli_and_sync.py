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
    r = _ls(bookies, "ledger", "delete", str(lid))  # without the password: refused, nothing deleted
    assert r.returncode != 0 and "UNAUTHORIZED" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert _ls(bookies, "ledger", "metadata", str(lid)).returncode == 0
    r = _ls(bookies, "ledger", "delete", str(lid), "--password", "pw")
    assert r.returncode == 0, r.stderr
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
        assert bk.cluster_initialized()
    finally:
        bk.close()
    with BookKeeper.connect(bookies.zk, zk_root=bookies.root + "-typo") as other:
        assert not other.cluster_initialized()


def test_bookie_gc_deletes_absent_ledgers_and_collects_blob_garbage_on_every_bookie(bookies) -> None:
    import time
    import urllib.error
    import urllib.request

    # frequent checkpoints: the entries reach blob files (two ledgers interleave) before the delete; the
    # bookies' own GC round is an hour away, so `bookie gc` does the deleting as well
    procs = [bookies.start("--gc-interval-s", "3600", "--checkpoint-interval-s", "0.2") for _ in range(2)]
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    try:
        doomed = bk.create_ledger(ensemble_size=2, write_quorum=2, ack_quorum=2, password=b"p")
        kept = bk.create_ledger(ensemble_size=2, write_quorum=2, ack_quorum=2, password=b"p")
        for i in range(100):
            doomed.append_many([b"d" * 1000] * 5)
            kept.append_many([b"k%04d" % i + b"k" * 995])
        doomed.close()
        kept.close()
        time.sleep(0.5)  # a checkpoint or two
        bk.delete_ledger(doomed.ledger_id)
        r = _ls(bookies, "bookie", "gc", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert sorted(out) == sorted(bp.id for bp in procs)
        for result in out.values():
            assert result["blob_gc_pass"]["reclaimed_bytes"] >= 300_000, result
            assert result["blob_garbage_bytes"] == 0
        r = _ls(bookies, "bookie", "gc", "--bookie-id", procs[0].id)
        assert r.returncode == 0, r.stderr
        assert (
            r.stdout.startswith(f"{procs[0].id}: no blob garbage pass (stored ") and r.stdout.count("\n") == 1
        )
        assert "blob garbage 0.0 MiB" in r.stdout
        for bp in procs:  # `bookie gc` deleted the ledger from the bookies too
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{bp.http_port}/api/v1/ledgers/{doomed.ledger_id}")
                raise AssertionError(f"{bp.id} still has ledger {doomed.ledger_id}")
            except urllib.error.HTTPError as e:
                assert e.code == 404
        r = _ls(bookies, "bookie", "gc", "--bookie-id", "nosuch:1")
        assert r.returncode != 0 and "not registered" in r.stderr and "nosuch:1" in r.stderr
        rh = bk.open_ledger(kept.ledger_id, password=b"p")
        assert [e.data for e in rh.read(0, 99)] == [b"k%04d" % i + b"k" * 995 for i in range(100)]
    finally:
        bk.close()


def test_ledger_read_of_an_open_ledger_leaves_it_open_and_its_writer_appending(bookies) -> None:
    bookies.start_many(3)
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    try:
        lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw")
        for i in range(20):  # one at a time: each add carries the LAC of the one before it to the bookies
            lh.append(b"e%d" % i)
        r = _ls(bookies, "ledger", "read", str(lh.ledger_id), "--password", "pw", "--json")
        assert r.returncode == 0, r.stderr
        rows = json.loads(r.stdout)
        # an open ledger reads up to its LAC, which trails the last add by at most the in-flight piggyback
        assert [row["entry_id"] for row in rows] == list(range(len(rows))) and len(rows) >= 19
        md = json.loads(_ls(bookies, "ledger", "metadata", str(lh.ledger_id), "--json").stdout)
        assert md["state"] == "OPEN"
        assert lh.append(b"after the read") == 20  # the writer was not fenced

        r = _ls(bookies, "ledger", "read", str(lh.ledger_id), "--password", "pw", "--recover", "--json")
        assert r.returncode == 0, r.stderr
        assert [row["entry_id"] for row in json.loads(r.stdout)] == list(range(21))
        md = json.loads(_ls(bookies, "ledger", "metadata", str(lh.ledger_id), "--json").stdout)
        assert md["state"] == "CLOSED" and md["last_entry_id"] == 20
    finally:
        bk.close()


def test_ledger_read_of_one_bookie_shows_that_replicas_copy_and_a_dead_replica(bookies) -> None:
    procs = bookies.start_many(3)
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    try:
        lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw")
        lh.append_many([b"e%d" % i for i in range(9)])
        lh.close()
        bookie = lh.metadata.ensembles[0].bookies[0]
        r = _ls(
            bookies, "ledger", "read", str(lh.ledger_id), "--password", "pw", "--bookie", bookie, "--json"
        )
        assert r.returncode == 0, r.stderr
        rows = json.loads(r.stdout)
        # E3/Qw2: the first bookie of the ensemble holds entries 0, 2, 3, 5, 6, 8 (write sets (e+i) mod 3)
        assert [row["entry_id"] for row in rows] == [0, 2, 3, 5, 6, 8]
        assert all(row["status"] == "OK" and row["data"] == f"e{row['entry_id']}" for row in rows)

        next(bp for bp in procs if bp.id == bookie).kill9()
        r = _ls(
            bookies, "ledger", "read", str(lh.ledger_id), "--password", "pw", "--bookie", bookie, "--json"
        )
        assert r.returncode == 1
        assert {row["status"] for row in json.loads(r.stdout)} == {"UNREACHABLE"}
        r = _ls(bookies, "ledger", "read", str(lh.ledger_id), "--password", "pw", "--bookie", "10.0.0.1:1")
        assert r.returncode == 4 and "in no ensemble" in r.stderr
    finally:
        bk.close()
