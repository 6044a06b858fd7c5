"""Review findings on AutoRecovery, each against real ZooKeeper and bookie processes."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from autorecovery.auditor import CHECK_READS_IN_FLIGHT, Auditor, read_all_metadata
from autorecovery.config import AutoRecoveryConfig
from autorecovery.metrics import Metrics
from ledger_client import BookKeeper, ClientConfig
from ledger_client.client import _meta
from zk.underreplication import UnderReplicationManager

PW = b"pw"
LEDGERS = 40  # closed 3/3/2 ledgers of 2 entries: the check asks each bookie for 2 entries of each, 80 in all


def test_the_check_asks_a_bookie_that_did_not_answer_nothing_more(bookies) -> None:
    """A registered bookie that hangs (SIGSTOP: a stalled disk) held the check for one read timeout per wave of
    reads to it: every one of its reads waited out ``read_timeout_s`` in one of the CHECK_READS_IN_FLIGHT slots,
    so with a few hundred ledgers the check, and the auditor's step behind it (which marks a lost bookie's
    ledgers), took minutes. Once a read of it found no answer, its other reads are skipped this check."""
    procs = bookies.start_many(3)

    async def go() -> tuple[Counter[str], dict[int, set[str]], str]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            for _ in range(LEDGERS):
                lh = await bk.create_ledger(3, 3, 2, password=PW)
                await lh.append(b"a")
                await lh.append(b"b")
                await lh.close()
        finally:
            await bk.close()
        auditor_bk = await BookKeeper.connect(
            bookies.zk, config=ClientConfig(zk_root=bookies.root, read_timeout_s=1.0)
        )
        hung = procs[0]
        try:
            asked: Counter[str] = Counter()
            ask = auditor_bk._ask

            async def counted(bookie, build, timeout_s=None):  # type: ignore[no-untyped-def]
                asked[bookie] += 1
                return await ask(bookie, build, timeout_s)

            auditor_bk._ask = counted  # type: ignore[method-assign]
            config = AutoRecoveryConfig(zk=bookies.zk, zk_root=bookies.root, passwords=(PW,))
            auditor = Auditor(auditor_bk, UnderReplicationManager(auditor_bk.store), config, Metrics(), "a")
            ledgers = await _meta(lambda: read_all_metadata(auditor_bk))
            registered = {bp.id for bp in procs}
            assert await auditor.check(ledgers, registered) == {}  # (the auditor's connections open)
            hung.pause()  # the next check's, with the bookie still registered
            asked.clear()
            began = time.monotonic()
            found = await auditor.check(ledgers, registered)
            print(f"check took {time.monotonic() - began:.1f} s")
            return asked, found, hung.id
        finally:
            hung.resume()
            await auditor_bk.close()

    asked, found, hung = asyncio.run(go())
    print("reads asked per bookie:", dict(asked))
    assert found == {}
    assert all(n == 2 * LEDGERS for b, n in asked.items() if b != hung) and len(asked) == 3
    # only the reads already in flight when the first one timed out (at most one slot each)
    assert 1 <= asked[hung] <= CHECK_READS_IN_FLIGHT
