"""A ledger whose re-replication keeps failing (every copy of an entry down) is said once a minute per worker, not
at every pass (a pass a second): the first failure at once, the next after LOG_EVERY_S, and at once again after a
pass that succeeded. A ledger whose mark is gone leaves no limiter behind."""

from __future__ import annotations

import asyncio
import logging

import pytest

from autorecovery.config import AutoRecoveryConfig
from autorecovery.metrics import Metrics
from autorecovery.worker import Outcome, ReplicationWorker
from ledger_client import BookKeeper, ClientConfig
from ledger_client import errors as E
from ledger_client.client import _meta
from zk.ratelog import LOG_EVERY_S
from zk.underreplication import UnderReplicationManager


class _Unreadable(ReplicationWorker):
    """The real worker, locks and marks in the real ZooKeeper, whose copy fails while ``failing`` is set."""

    failing = True

    async def _process_locked(self, ledger_id: int) -> Outcome:
        if self.failing:
            raise E.LedgerError(f"ledger {ledger_id} entry 7: no readable copy (b1: down; b2: down)")
        return Outcome(ledger_id, "replicated")


def test_a_ledger_that_keeps_failing_is_said_once_a_minute(bookies, caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]

    async def passes() -> list[str]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            manager = UnderReplicationManager(bk.store)
            await _meta(lambda: manager.mark(42, ["127.0.0.1:1"]))
            config = AutoRecoveryConfig(zk=bookies.zk, zk_root=bookies.root)
            worker = _Unreadable(bk, manager, config, Metrics(), "rate", clock=lambda: now[0])
            seen = []
            for step in (0.0, 1.0, 1.0, LOG_EVERY_S, 1.0, "ok", 1.0, 1.0):
                if step == "ok":
                    worker.failing = False
                    assert (await worker.process(42)).status == "replicated"
                    worker.failing = True
                    continue
                now[0] += float(step)
                caplog.clear()
                assert (await worker.process(42)).status == "failed"
                seen.append(sum("re-replication failed" in r.getMessage() for r in caplog.records))
            assert 42 in worker._failing
            await _meta(lambda: manager.clear(42))  # the ledger deleted (its mark with it): its limiter goes
            await worker.run_once()
            assert 42 not in worker._failing
            return seen
        finally:
            await bk.close()

    with caplog.at_level(logging.WARNING, logger="autorecovery.worker"):
        said = asyncio.run(passes())
    # failures at t=0 (said), +1, +1 (quiet), +60 (said), +1 (quiet), a success, then +1 (said: a new run), +1
    assert said == [1, 0, 0, 1, 0, 1, 0]
