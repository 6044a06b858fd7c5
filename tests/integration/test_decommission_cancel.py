"""``ledgerstore bookie decommission ID --cancel``: a decommission whose command died leaves the bookie's
decommissioning mark (placement keeps new ledgers off it) and drain marks; cancelling removes both, so the
bookie takes new ledgers again. Real ZooKeeper, bookie processes and a ``bookie decommission`` process killed
with SIGKILL mid-drain."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from ledger_client import BookKeeper, ClientConfig
from ledger_client import errors as E
from tests.integration.test_autorecovery import PW, _cli, _marks, _write_ledgers
from zk import MetadataStore
from zk.underreplication import UnderReplicationManager


async def _create(bookies, ensemble: int) -> None:
    bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    try:
        lh = await bk.create_ledger(ensemble, 2, 2, password=PW)
        await lh.append(b"x")
        await lh.close()
    finally:
        await bk.close()


def test_cancel_ends_a_decommission_whose_command_died(bookies) -> None:
    procs = bookies.start_many(4)  # no AutoRecovery: only the decommission command drains
    victim = procs[0].id
    asyncio.run(_write_ledgers(bookies, 6, open_every=100))
    cmd = [
        sys.executable, "-m", "ledgerstore.cli", "bookie", "decommission", victim, "--password", PW.decode(),
        "--throttle-mb", "0.002", "--zk", bookies.zk, "--zk-root", bookies.root,
    ]  # fmt: skip
    dec = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        m = UnderReplicationManager(store)
        deadline = time.monotonic() + 60
        while not (m.decommissioning() and m.locks()):  # marked, and copying (slowly) under a lock
            assert dec.poll() is None and time.monotonic() < deadline, (
                "the decommission did not start copying"
            )
            time.sleep(0.1)
        dec.kill()  # the command dies mid-drain
        dec.wait(10)
        assert m.decommissioning() == {victim}
        assert any(victim in mark["drain"] for mark in _marks(bookies))
        with pytest.raises(E.NotEnoughBookiesError):  # placement leaves the bookie out
            asyncio.run(_create(bookies, 4))

        r = _cli(bookies, "bookie", "decommission", victim, "--cancel", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["cancelled"] and out["was_decommissioning"] and out["ledgers"]
        assert not m.decommissioning()
        assert not any(victim in mark["drain"] for mark in _marks(bookies))
        status = json.loads(_cli(bookies, "autorecovery", "status", "--json").stdout)
        assert status["decommissioning"] == []
        asyncio.run(_create(bookies, 4))  # the bookie takes new ledgers again

        again = _cli(bookies, "bookie", "decommission", victim, "--cancel", "--json")
        assert again.returncode == 4, again.stdout  # nothing left to cancel: not found
    finally:
        if dec.poll() is None:
            dec.kill()
        store.close()
