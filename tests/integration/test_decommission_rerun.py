"""``ledgerstore bookie decommission ID`` run again for a bookie whose decommission finished while it still ran
(its cookie deleted, its ``bookies/decommissioning`` mark kept until it stops) and which has since been stopped:
the cluster still lists it as being decommissioned, so it is not a typo. Real ZooKeeper, one bookie process."""

from __future__ import annotations

import json

from tests.conftest import BookieFactory
from tests.integration.test_autorecovery import _cli
from zk import MetadataStore
from zk.underreplication import UnderReplicationManager


def test_a_decommission_run_again_after_the_bookie_stopped_ends_its_mark(bookies: BookieFactory) -> None:
    """Its mark left (no registration, no cookie), the command was refused, exit 4, with 'no bookie X: not
    registered, no cookie (check the id; known bookies: X, …)', naming the bookie it said did not exist. It now
    runs: no ledger names the bookie, so it is decommissioned at once and its mark goes (exit 0)."""
    bookies.start()
    gone = "127.0.0.1:1"  # decommissioned while running, then stopped: only its mark is left
    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        m = UnderReplicationManager(store)
        m.start_decommission(gone)
        r = _cli(bookies, "bookie", "decommission", gone, "--settle-s", "0", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        out = json.loads(r.stdout)
        assert out["complete"] and out["ledgers_moved"] == [], out
        assert gone not in m.decommissioning()
    finally:
        store.close()
