"""A decommission does not end before a ledger placed on a view older than its mark can show up: a client that
read the placement inputs just before the mark creates its ledger on the bookie after the decommission's first
pass found nothing; the pass that ends it runs ``--settle-s`` after the mark and drains that ledger too. Real
ZooKeeper, bookie processes and a ``bookie decommission`` process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

from ledger_client import BookKeeper, ClientConfig
from tests.integration.test_autorecovery import PW, _names, payload
from zk import MetadataStore
from zk.underreplication import UnderReplicationManager

SETTLE_S = 8.0


async def _write_on(bookies, ensemble: list[str], n: int) -> int:
    """A ledger on ``ensemble`` chosen by the caller, as a client whose placement view predates the mark."""
    bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    try:
        lh = await bk.create_ledger(3, 2, 2, password=PW, bookies=ensemble)
        for i in range(n):
            await lh.append(payload(lh.ledger_id, i))
        await lh.close()
        return int(lh.ledger_id)
    finally:
        await bk.close()


async def _read_all(bookies, lid: int, n: int) -> list[bytes]:
    bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    try:
        h = await bk.open_ledger(lid, password=PW, recovery=False)
        return [e.data async for e in h.read(0, n - 1)]
    finally:
        await bk.close()


def test_a_ledger_placed_on_a_view_older_than_the_mark_is_drained_too(bookies) -> None:
    procs = bookies.start_many(4)  # no AutoRecovery: only the decommission command drains
    victim = procs[0].id
    cmd = [
        sys.executable, "-m", "ledgerstore.cli", "bookie", "decommission", victim, "--password", PW.decode(),
        "--settle-s", str(SETTLE_S), "--timeout-s", "90", "--zk", bookies.zk, "--zk-root", bookies.root, "--json",
    ]  # fmt: skip
    dec = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        deadline = time.monotonic() + 30
        while victim not in UnderReplicationManager(store).decommissioning():
            assert dec.poll() is None and time.monotonic() < deadline, dec.communicate()
            time.sleep(0.05)
        time.sleep(1.0)  # the decommission's first pass has found nothing naming the bookie
        lid = asyncio.run(_write_on(bookies, [victim, procs[1].id, procs[2].id], 30))
        out, err = dec.communicate(timeout=120)
    finally:
        if dec.poll() is None:
            dec.kill()
        store.close()
    assert dec.returncode == 0, (out, err)
    result = json.loads(out)
    assert result["complete"] and lid in result["ledgers_moved"] and result["seconds"] >= SETTLE_S, result
    assert not asyncio.run(_names(bookies, victim))
    procs[0].stop()  # it holds nothing needed any more
    assert asyncio.run(_read_all(bookies, lid, 30)) == [payload(lid, i) for i in range(30)]
