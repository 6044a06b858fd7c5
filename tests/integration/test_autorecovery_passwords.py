"""AutoRecovery and a ledger whose password it was not given: the mark stays (nothing can copy the entries), and
the process says so in its log, once per ledger, instead of passing over the ledger in silence pass after pass
(``ledger underreplicated`` then listed it for ever with no reason anywhere). A ledger with a configured password
beside it is re-replicated as usual."""

from __future__ import annotations

import asyncio
import time

from ledger_client import BookKeeper, ClientConfig
from tests.integration.test_autorecovery import PW, AutoRecoveryProcess, _marks
from tests.zk_testing import wait_for

OTHER_PW = b"not-given-to-autorecovery"


async def _two_ledgers(bookies, ensemble: list[str]) -> tuple[int, int]:
    """Two closed E2/Qw2/Qa2 ledgers on ``ensemble``: one with AutoRecovery's password, one with another."""
    bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    try:
        out = []
        for pw in (PW, OTHER_PW):
            lh = await bk.create_ledger(2, 2, 2, password=pw, bookies=ensemble)
            for i in range(20):
                await lh.append(b"entry-%d" % i)
            await lh.close()
            out.append(lh.ledger_id)
        return out[0], out[1]
    finally:
        await bk.close()


async def _names(bookies, lid: int, bookie: str) -> bool:
    bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    try:
        md = await bk.ledger_metadata(lid)
        return any(bookie in ens.bookies for ens in md.ensembles)
    finally:
        await bk.close()


def test_a_marked_ledger_with_a_password_autorecovery_lacks_is_logged_once_and_stays_marked(
    bookies, tmp_path
) -> None:
    procs = bookies.start_many(3)
    victim, peer = procs[0], procs[1]
    known, unknown = asyncio.run(_two_ledgers(bookies, [victim.id, peer.id]))
    ar = AutoRecoveryProcess(bookies, tmp_path, "pw")
    try:
        victim.stop()  # unregisters at once: the auditor marks both ledgers
        assert wait_for(lambda: not asyncio.run(_names(bookies, known, victim.id)), 60, 0.3)
        # 2: "pw" and the empty password (the brokers' ledgers'), always tried beside the ones given (dc5e322)
        line = f"ledger={unknown} stays marked: none of the 2 configured passwords is its"
        assert wait_for(lambda: line in ar.log.read_text(), 30, 0.2), ar.log.read_text()[-3000:]
        time.sleep(2)  # several more passes of the worker (--poll-interval-s 0.3)
        assert ar.log.read_text().count(line) == 1, ar.log.read_text()[-3000:]
        assert [m["ledger_id"] for m in _marks(bookies)] == [unknown]
        assert asyncio.run(_names(bookies, unknown, victim.id))
    finally:
        ar.stop()
