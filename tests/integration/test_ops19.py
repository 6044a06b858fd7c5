"""Operator procedures of docs/operations.md against real ZooKeeper, bookie and broker processes."""

from __future__ import annotations

import time

import pytest

from ledger_client import ClientConfig
from ledger_client.sync import BookKeeper
from tests.broker_testing import Brokers
from tests.integration.test_broker_admin import ok
from tests.integration.test_broker_compaction import wait_for
from tests.integration.test_broker_pulsar_client import client, topic_name
from zk.underreplication import UnderReplicationManager

pulsar = pytest.importorskip("pulsar")


def test_a_topics_open_ledger_on_a_bookie_being_decommissioned_is_rolled_off_it(bookies, tmp_path) -> None:
    """`bookie decommission` waits for every open ledger naming the bookie to be closed, and a topic's ledger
    stayed open until its rollover (50,000 entries, 2 GiB or 4 h): on a lightly loaded topic the decommission
    ran into its 1 h timeout. The broker's housekeeping now rolls a ledger naming a decommissioning bookie,
    when the other bookies can take a new one."""
    bookies.start_many(4)
    b = Brokers(bookies, tmp_path)
    try:
        bp = b.start("--tick-interval-s", "1")
        t = topic_name()
        c = client(bp)
        consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = c.create_producer(f"persistent://public/default/{t}")
        producer.send(b"before")
        path = f"/admin/v2/persistent/public/default/{t}/internalStats"
        first = ok(bp, "GET", path)["ledgers"][-1]["ledgerId"]
        bk = BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            on = sorted({x for ens in bk.ledger_metadata(first).ensembles for x in ens.bookies})
            UnderReplicationManager(bk._bk.store).start_decommission(on[0])
            wait_for("a new ledger", lambda: ok(bp, "GET", path)["ledgers"][-1]["ledgerId"] != first, 15)
            second = ok(bp, "GET", path)["ledgers"][-1]["ledgerId"]
            now_on = {x for ens in bk.ledger_metadata(second).ensembles for x in ens.bookies}
            assert on[0] not in now_on
            assert bk.ledger_metadata(first).is_closed
            # a second bookie draining leaves 2 others for an ensemble of 3: the ledger stays (writes go on)
            UnderReplicationManager(bk._bk.store).start_decommission(sorted(now_on)[0])
            time.sleep(3)
            assert ok(bp, "GET", path)["ledgers"][-1]["ledgerId"] == second
        finally:
            bk.close()
        producer.send(b"after")
        assert [consumer.receive(timeout_millis=10_000).data() for _ in range(2)] == [b"before", b"after"]
        c.close()
    finally:
        b.stop_all()


def test_a_bookies_journal_moved_to_its_own_disk_is_recorded_by_updatecookie(bookies, tmp_path) -> None:
    """The journal moved onto its own disk (docs/operations.md advises it) was a cookie mismatch whose only way
    out was to drain, wipe and format the bookie, and `bookie updatecookie` said 'nothing to do' (same id). It
    now records the moved directories; the bookie starts on them with its entries."""
    import shutil

    from tests.integration.test_cluster_cli import _ls

    bp = bookies.start()
    bk = BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    lh = bk.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1)
    for i in range(10):
        lh.append(b"e%d" % i)
    lh.close()
    bp.stop()
    journal = tmp_path / "journal-disk" / "journal"
    journal.parent.mkdir()
    shutil.move(bp.data_dir / "journal", journal)
    moved = bookies.start("--journal-dir", str(journal), data_dir=bp.data_dir, port=bp.port, wait=False)
    assert moved.wait_exit(30) == 3
    assert "bookie updatecookie --bookie-id" in moved.log_tail(5)
    zk = ["--zk", bookies.zk, "--zk-root", bookies.root]
    args = ["--bookie-id", bp.id, "--data-dir", str(bp.data_dir), "--journal-dir", str(journal)]
    r = _ls("bookie", "updatecookie", *args, *zk)
    assert r.returncode == 0 and "recorded the moved directories" in r.stdout, r.stdout + r.stderr
    bookies.start("--journal-dir", str(journal), data_dir=bp.data_dir, port=bp.port)
    rh = bk.open_ledger(lh.ledger_id, recovery=False)
    assert [e.data for e in rh.read(0, 9)] == [b"e%d" % i for i in range(10)]
    r = _ls("bookie", "updatecookie", *args, *zk)
    assert "nothing to do" in r.stdout, r.stdout + r.stderr
    bk.close()


def test_cluster_status_tells_a_decommissioned_bookie_from_a_down_one(tmp_path) -> None:
    """After `bookie decommission` and the stop the page asks for, `cluster status` listed the bookie DOWN and
    exited 1 for as long as the cluster ran, as for a crash. It now says decommissioned and exits 0; a bookie down
    otherwise is still exit 1."""
    import json as _json

    from ledgerstore.cluster import free_port
    from tests.integration.test_cluster_cli import _ls, _ports

    state = tmp_path / "cluster"
    r = _ls("cluster", "up", *_ports(state, free_port()))
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        st = _json.loads((state / "cluster.json").read_text())
        zk = ["--zk", st["zk"], "--zk-root", st.get("zk_root", "/ledgerstore")]
        gone = st["bookies"][1]["id"]
        r = _ls("bookie", "decommission", gone, "--settle-s", "0", *zk)
        assert r.returncode == 0, r.stdout + r.stderr
        _ls("cluster", "stop", "bookie-1", "--state-dir", str(state))
        r = _ls("cluster", "status", "--state-dir", str(state))
        assert r.returncode == 0, r.stdout + r.stderr
        assert (
            f"{gone}" in r.stdout
            and "DOWN (decommissioned: its data moved, cookie deleted; was pid " in r.stdout
        )
        _ls("cluster", "stop", "bookie-0", "--state-dir", str(state))
        r = _ls("cluster", "status", "--state-dir", str(state))
        assert r.returncode == 1, r.stdout + r.stderr
        assert r.stdout.count("decommissioned") == 1, r.stdout
    finally:
        _ls("cluster", "down", "--state-dir", str(state))
