"""Garbage collection of deleted ledgers: what a bookie may delete, decided so that it cannot be tricked.

BookKeeper's ``GarbageCollectorThread`` with ``verifyMetadataOnGc``. A pass:

1. snapshots the ledgers this bookie stores (each with a fingerprint of its index row);
2. reads the ``ledgers`` parent node: missing or without children while this bookie stores ledgers, the pass
   stops with an error (``refused``): an empty listing is far more likely an operator's mistake, an attack or
   a wrong ``--zk-root`` than every ledger of the cluster deleted at once, and deleting on it is unrecoverable;
3. lists the ledger ids in metadata; a stored ledger absent from the listing is only a *candidate*;
4. reads each candidate's own znode: only a definite "no such node" lets it go (a listing that came back short
   never deletes anything; a ZooKeeper error stops the pass);
5. deletes at most ``deletions_max`` ledgers per pass (``bound_hits`` counts passes that stopped there; the
   rest wait for the next pass), and only a ledger whose index row is still the one snapshotted: an add or
   fence since the snapshot means somebody uses the id now, so it is left to a later pass;
6. deletes the confirmed ledgers ``DELETE_BATCH`` at a time: one storage call per batch (one durable write
   batch of range deletes and at most one compaction), the fingerprints checked again just before it.

``should_stop`` is asked before every step that waits (the bookie is stopping, or the HTTP caller that asked
for the pass went away); a stopped pass deletes nothing more. The metadata and the deletion are injected
(``MetadataView``, ``delete``), so tests drive a pass without ZooKeeper or RocksDB.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger("ledgerstore.bookie.gc")

DEFAULT_GC_DELETIONS_MAX = 1000  # ledgers deleted per pass at most
# Ledgers deleted in one storage call: one RocksDB write batch of range deletes and at most one compaction. One
# compaction per ledger flushed a memtable each time (docs/benchmarks-history.md, "Deleting ledgers in
# batches").
DELETE_BATCH = 256
VERIFY_CHUNK = 64  # candidates whose znodes are read in one worker-thread call


class MetadataView(Protocol):
    def ledgers_parent(self) -> list[str] | None:
        """Children of the ``ledgers`` node; None when the node does not exist."""

    def list_ids(self) -> list[int]:
        """Every ledger id in metadata (may come back short: never trusted to delete)."""

    def ledger_exists(self, ledger_id: int) -> bool:
        """A direct read of that ledger's znode: False only for "no such node"; raises on any error."""


@dataclass(slots=True)
class GcStats:
    passes: int = 0
    deleted: int = 0
    delete_batches: int = 0  # storage deletions (each of up to DELETE_BATCH ledgers)
    refused: int = 0  # passes stopped because the ledgers parent node was missing or empty
    listed_short: int = 0  # candidates whose znode exists although the listing lacked them
    in_use: int = 0  # candidates whose index row changed since the snapshot (left for later)
    bound_hits: int = 0
    stopped: int = 0  # passes cut short by should_stop
    errors: int = 0  # passes stopped by a metadata error
    last_refusal: str = ""


@dataclass(frozen=True, slots=True)
class GcPass:
    candidates: int = 0
    deleted: tuple[int, ...] = ()
    kept: tuple[int, ...] = ()  # absent from the listing but present on a direct read
    refused: str = ""
    bound_hit: bool = False
    stopped: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "candidates": self.candidates,
            "deleted": list(self.deleted),
            "kept_listed_short": list(self.kept),
            "refused": self.refused or None,
            "bound_hit": self.bound_hit,
            "stopped": self.stopped,
        }


def fingerprint(info: Any) -> tuple[Any, ...]:
    """What must not have changed between the snapshot and a deletion (the object and its index row)."""
    return (id(info), info.fenced, info.lac, info.explicit_lac, info.last_entry_id, info.master_key)


@dataclass(slots=True)
class LedgerCollector:
    metadata: MetadataView
    local: Callable[[], Mapping[int, Any]]  # the bookie's ledger index (ledger id -> LedgerInfo)
    delete: Callable[[list[int]], None]  # a batch of ledgers, blocking: runs in a worker thread
    deletions_max: int = DEFAULT_GC_DELETIONS_MAX
    bookie_id: str = ""
    stats: GcStats = field(default_factory=GcStats)
    _lock: asyncio.Lock | None = None
    _busy: asyncio.Future[None] | None = None  # the deletion running in a worker thread

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) for a deletion under way: a pass whose caller was cancelled leaves its
        current deletion running in its thread, and storage must not close under it. True once idle."""
        busy = self._busy
        if busy is None or busy.done():
            return True
        try:
            await asyncio.wait_for(asyncio.shield(busy), timeout_s)
        except TimeoutError:
            return False
        except Exception:
            return True
        return True

    async def _delete(self, ledger_ids: list[int]) -> None:
        busy = asyncio.get_running_loop().run_in_executor(None, self.delete, ledger_ids)
        self._busy = busy
        await asyncio.shield(busy)  # cancelled: the thread goes on; wait_idle waits for it

    def _unchanged(self, local: Mapping[int, Any], lid: int, snapshot: Mapping[int, Any]) -> bool:
        """Whether the ledger is still stored with the snapshotted index row (else it is gone already, or in
        use again: kept, and counted)."""
        info = local.get(lid)
        if info is None:
            return False  # gone already
        if fingerprint(info) != snapshot[lid]:
            self.stats.in_use += 1
            log.info("bookie=%s gc: ledger %d changed since the snapshot: kept", self.bookie_id, lid)
            return False
        return True

    async def _delete_batch(self, ready: list[int], snapshot: Mapping[int, Any], deleted: list[int]) -> None:
        """Delete ``ready`` (confirmed gone from metadata) in one storage call, but only those whose index row
        is still the snapshotted one now (checked with no wait between the check and the call)."""
        local = self.local()
        batch = [lid for lid in ready if self._unchanged(local, lid, snapshot)]
        ready.clear()
        if not batch:
            return
        log.info(
            "bookie=%s gc: deleting %d ledgers %d..%d (their znodes do not exist)",
            self.bookie_id, len(batch), batch[0], batch[-1],
        )  # fmt: skip
        log.debug("bookie=%s gc: deleting ledgers %s", self.bookie_id, batch)
        await self._delete(batch)
        deleted.extend(batch)
        self.stats.deleted += len(batch)
        self.stats.delete_batches += 1

    async def run_pass(self, should_stop: Callable[[], bool] = lambda: False) -> GcPass:
        """One pass (passes never overlap: a second caller waits for the running one, then runs its own)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            await self.wait_idle(float("inf"))
            self.stats.passes += 1
            try:
                result = await self._pass(should_stop)
            except asyncio.CancelledError:  # the HTTP caller went away (aiohttp cancels its handler)
                self.stats.stopped += 1
                log.info("bookie=%s gc: pass stopped: its caller went away", self.bookie_id)
                raise
            except Exception:
                self.stats.errors += 1
                raise
            if result.stopped:
                self.stats.stopped += 1
            return result

    async def _pass(self, should_stop: Callable[[], bool]) -> GcPass:
        snapshot = {lid: fingerprint(info) for lid, info in self.local().items()}
        if not snapshot:
            return GcPass()
        md = self.metadata
        parent = await asyncio.to_thread(md.ledgers_parent)
        if not parent:
            why = "the ledgers node is missing" if parent is None else "the ledgers node has no children"
            self.stats.refused += 1
            self.stats.last_refusal = why
            log.error(
                "bookie=%s gc refused: %s in metadata while this bookie stores %d ledgers; deleting nothing "
                "(a wrong --zk-root, a damaged or tampered ZooKeeper?)",
                self.bookie_id,
                why,
                len(snapshot),
            )
            return GcPass(refused=why)
        if should_stop():
            return GcPass(stopped=True)
        listed = set(await asyncio.to_thread(md.list_ids))
        candidates = sorted(set(snapshot) - listed)
        deleted: list[int] = []
        ready: list[int] = []  # confirmed gone, not deleted yet
        kept: list[int] = []
        bound_hit = False
        for i in range(0, len(candidates), VERIFY_CHUNK):
            if should_stop():
                return GcPass(len(candidates), tuple(deleted), tuple(kept), stopped=True)
            chunk = candidates[i : i + VERIFY_CHUNK]
            exists = await asyncio.to_thread(_exist_all, md, chunk)
            for lid, present in zip(chunk, exists, strict=True):
                if present:
                    kept.append(lid)
                    self.stats.listed_short += 1
                    log.warning(
                        "bookie=%s gc: ledger %d missing from the listing but its znode exists: kept",
                        self.bookie_id,
                        lid,
                    )
                    continue
                if len(deleted) + len(ready) >= self.deletions_max:
                    bound_hit = True
                    break
                if not self._unchanged(self.local(), lid, snapshot):
                    continue
                ready.append(lid)
                if len(ready) >= DELETE_BATCH:
                    if should_stop():
                        return GcPass(len(candidates), tuple(deleted), tuple(kept), stopped=True)
                    await self._delete_batch(ready, snapshot, deleted)
            if bound_hit:
                break
        if ready:
            if should_stop():
                return GcPass(len(candidates), tuple(deleted), tuple(kept), stopped=True)
            await self._delete_batch(ready, snapshot, deleted)
        if bound_hit:
            self.stats.bound_hits += 1
            log.warning(
                "bookie=%s gc: deleted %d ledgers, the most one pass may (--gc-deletions-max); the rest wait "
                "for the next pass",
                self.bookie_id,
                len(deleted),
            )
        return GcPass(len(candidates), tuple(deleted), tuple(kept), bound_hit=bound_hit)


def _exist_all(md: MetadataView, ledger_ids: list[int]) -> list[bool]:
    return [md.ledger_exists(lid) for lid in ledger_ids]


class ZkMetadataView:
    """``MetadataView`` over a ``zk.MetadataStore`` (blocking calls, for worker threads)."""

    def __init__(self, store: Any) -> None:
        from zk import LedgerMetadataStore

        self.store = store
        self.ledgers = LedgerMetadataStore(store)

    def ledgers_parent(self) -> list[str] | None:
        from zk import layout
        from zk.errors import MetadataNotFoundError

        try:
            return list(self.store.children(layout.LEDGERS))
        except MetadataNotFoundError:
            return None

    def list_ids(self) -> list[int]:
        return list(self.ledgers.list())

    def ledger_exists(self, ledger_id: int) -> bool:
        from zk import layout

        if not 0 <= ledger_id <= layout.MAX_LEDGER_ID:
            return False  # no ledger has such an id (a stranger's add or fence named it: the wire's is a u64)
        return bool(self.store.exists(layout.ledger_path(ledger_id)))
