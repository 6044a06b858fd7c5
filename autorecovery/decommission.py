"""Decommission a live bookie (BookKeeper's ``decommissionbookie``, but with the bookie still up): every ledger
naming it is marked with it to *drain*; workers (this one, and any AutoRecovery process) copy its entries to
other bookies, reading from it first, and swap them in; once no ledger names it, its cookie is deleted.

While it drains, ``bookies/decommissioning/<id>`` keeps new ensembles and replacements off it (the client's
placement and AutoRecovery leave it out). An OPEN ledger naming it is left to its writer until it is closed
(writes keep going to the bookie meanwhile: nothing fails). A ledger created on it meanwhile (by a client that
chose its ensemble just before the mark) is found by the next pass and drained too: a client reads the placement
inputs just before its metadata write, so the pass that may end the decommission runs at least ``settle_s``
(default ``DEFAULT_SETTLE_S``, twice a client's ZooKeeper request timeout) after the mark was written, and a
ledger or ensemble change placed on a view older than the mark is seen by it. When the bookie is still
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

__all__ = ["DEFAULT_SETTLE_S", "DecommissionResult", "decommission", "settle_wait"]

DEFAULT_SETTLE_S = 30.0


def settle_wait(marked_at: float, now: float, settle_s: float) -> float:
    """How long before a pass that finds no ledger naming the bookie may end the decommission (0: now)."""
    return max(0.0, marked_at + settle_s - now)


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
    settle_s: float = DEFAULT_SETTLE_S,
) -> DecommissionResult:
    started = time.monotonic()
    manager = UnderReplicationManager(bk.store)
    metrics = Metrics()
    worker = ReplicationWorker(bk, manager, config, metrics, f"decommission-{bookie}")
    await _meta(functools.partial(manager.start_decommission, bookie))
    marked_at = time.monotonic()
    result = DecommissionResult(bookie, complete=False)
    seen: set[int] = set()
    settled = False
    while True:
        ledgers = await _meta(functools.partial(read_all_metadata, bk))
        naming = sorted(lid for lid, md in ledgers.items() if bookie in bookies_in(md))
        seen |= set(naming)
        on_progress(len(seen) - len(naming), len(seen))
        if not naming:
            wait = settle_wait(marked_at, time.monotonic(), settle_s)
            settled = wait <= 0
            if settled or time.monotonic() + wait - started > timeout_s:
                break
            await asyncio.sleep(wait)  # then one more pass: a placement made on a view older than the mark
            continue
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
    result.complete = not naming and settled
    if result.complete:
        result.waiting = {}
        result.cookie_deleted = await _meta(functools.partial(cookies.delete_zk_cookie, bk.store, bookie))
        if bookie not in await _meta(bk.registry.all):
            await _meta(functools.partial(manager.end_decommission, bookie))
    result.seconds = time.monotonic() - started
    return result
