"""Decommission a live bookie (BookKeeper's ``decommissionbookie``, but with the bookie still up): every ledger
naming it is marked with it to *drain*; workers (this one, and any AutoRecovery process) copy its entries to
other bookies, reading from it first, and swap them in; once no ledger names it, its cookie is deleted.

While it drains, ``bookies/decommissioning/<id>`` keeps new ensembles and replacements off it (the client's
placement and AutoRecovery leave it out). An OPEN ledger naming it is left to its writer until it is closed
(writes keep going to the bookie meanwhile: nothing fails). A ledger created on it meanwhile (by a client that
chose its ensemble just before the mark) is found by the next pass and drained too. When the bookie is still
registered at the end, the mark stays, so no ledger lands on it before it is stopped; a new cookie for its id
(the bookie formatted and started again) removes the mark.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ledger_client.client import BookKeeper, _meta
from zk import cookies
from zk.underreplication import UnderReplicationManager

from .auditor import read_all_metadata
from .config import AutoRecoveryConfig
from .metrics import Metrics
from .policy import bookies_in
from .worker import ReplicationWorker

__all__ = ["DecommissionResult", "decommission"]


@dataclass
class DecommissionResult:
    bookie: str
    complete: bool
    ledgers_moved: list[int] = field(default_factory=list)
    entries_copied: int = 0
    bytes_copied: int = 0
    waiting: dict[int, str] = field(default_factory=dict)  # ledger -> why it still names the bookie
    cookie_deleted: bool = False
    seconds: float = 0.0


async def decommission(
    bk: BookKeeper,
    bookie: str,
    config: AutoRecoveryConfig,
    *,
    timeout_s: float = 3600.0,
    on_progress: Callable[[int, int], None] = lambda done, total: None,
) -> DecommissionResult:
    started = time.monotonic()
    manager = UnderReplicationManager(bk.store)
    metrics = Metrics()
    worker = ReplicationWorker(bk, manager, config, metrics, f"decommission-{bookie}")
    await _meta(functools.partial(manager.start_decommission, bookie))
    result = DecommissionResult(bookie, complete=False)
    seen: set[int] = set()
    while True:
        ledgers = await _meta(functools.partial(read_all_metadata, bk))
        naming = sorted(lid for lid, md in ledgers.items() if bookie in bookies_in(md))
        seen |= set(naming)
        on_progress(len(seen) - len(naming), len(seen))
        if not naming:
            break
        result.waiting = {}
        for lid in naming:
            mark = await _meta(functools.partial(manager.get, lid))
            if mark is None or bookie not in mark.value.drain:
                await _meta(functools.partial(manager.mark, lid, (), [bookie]))
            out = await worker.process(lid)
            if out.status == "replicated" and bookie in out.replacements:
                result.ledgers_moved.append(lid)
            elif out.status not in ("replicated", "cleared"):
                result.waiting[lid] = out.why or out.status
        if time.monotonic() - started > timeout_s:
            break
        if result.waiting:
            await asyncio.sleep(config.poll_interval_s)
    else:  # pragma: no cover - the loop only breaks
        pass
    result.entries_copied = metrics.rereplicated_entries_total
    result.bytes_copied = metrics.rereplicated_bytes_total
    result.complete = not naming
    if result.complete:
        result.waiting = {}
        result.cookie_deleted = await _meta(functools.partial(cookies.delete_zk_cookie, bk.store, bookie))
        if bookie not in await _meta(bk.registry.all):
            await _meta(functools.partial(manager.end_decommission, bookie))
    result.seconds = time.monotonic() - started
    return result
