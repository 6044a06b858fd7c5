"""``LedgerHandle.wait_for_lac``'s speculative LAC read when the bookie it goes to fails at once. Real ZooKeeper and
bookie processes."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from tests.integration.test_planted_16 import lac_19_and_a_reader


def test_a_speculative_lac_read_failing_at_once_asks_the_next_bookie_at_once(
    bookies: Any, monkeypatch: Any
) -> None:
    """The long poll on a hung (SIGSTOPped) bookie, overdue, makes the next bookie be asked for the LAC; that one
    is dead (killed: refused at once), so the third is asked at once and answers: the call takes the poll's 4 s
    and the speculative 0.5 s. Before, the loop went back to waiting for the hung bookie's poll as if it had just
    been sent, 4.5 s more (9 s in all), before it asked the third."""
    # (a token in the environment has a new connection send AUTH first, which the hung bookie never answers)
    monkeypatch.delenv("LEDGERSTORE_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("LEDGERSTORE_AUTH_TOKEN_FILE", raising=False)
    procs = bookies.start_many(3)

    async def go() -> float:
        bk, lh, reader, rh = await lac_19_and_a_reader(bookies)
        ensemble = list(lh.metadata.last_ensemble.bookies)
        hung, dead = (next(bp for bp in procs if bp.id == b) for b in ensemble[:2])
        monkeypatch.setattr(random, "shuffle", lambda xs: xs.sort(key=ensemble.index))  # asked in that order
        dead.kill9()
        hung.pause()
        try:
            began = time.monotonic()
            assert await asyncio.wait_for(rh.wait_for_lac(19, 4.0), 30) == 19
            return time.monotonic() - began
        finally:
            hung.resume()
            await reader.close()
            await bk.close()

    took = asyncio.run(go())
    assert took < 7.0, f"{took:.1f} s: the third bookie was not asked once the speculative read failed"
