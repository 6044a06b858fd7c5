"""Replication workers (BookKeeper's ``ReplicationWorker``): the I/O that carries out ``policy.decide``.

A worker takes a marked ledger under its ephemeral lock, reads the mark and the metadata, and per the decision
clears the mark, leaves it (an open ledger's grace period, a live writer), recovery-opens the ledger (fence and
close), or copies: the entries a replaced bookie held are read in READ_RANGE batches from other bookies of their
write sets (verified against their digests; a drained bookie is read first) and written unchanged, pipelined, with
RECOVERY_ADD to the replacement the rack-aware placement picks (``ledger_client.rereplicator.copy_fragment``,
the throttle taken as they are sent), the replacement fenced for the ledger, and only then one metadata CAS swaps
every replacement in (``ledger_client.rereplication.swapped``). The metadata never names a bookie before it holds its
entries. An OPEN ledger whose writer is alive gets its sealed fragments copied the same way, with no fence (its
writer may later choose the replacement for its last ensemble). A live bookie found lacking entries gets them back in place (no metadata change). The mark is cleared
at the version read, then the lock released. A worker that dies leaves the mark; its lock goes with its
ZooKeeper session, and another worker starts over (entries are immutable: copying again writes the same bytes).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bookie import protocol as p
from bookie.entryformat import DigestType, EntryCodec
from ledger_client import errors as E
from ledger_client.client import BookKeeper
from ledger_client.metadata import _meta, update_metadata
from ledger_client.placement import choose_replacement
from ledger_client.quorum import write_set
from ledger_client.rereplication import lost_fragments, swapped
from ledger_client.rereplicator import _fence, _read_verified, _write, copy_fragment
from zk import racks as zk_racks
from zk.ledger_metadata import LedgerMetadata
from zk.ratelog import LOG_EVERY_S, Every, RateLimitedLog
from zk.underreplication import UnderReplicationManager

from .config import AutoRecoveryConfig
from .metrics import Metrics
from .passwords import PasswordBook
from .policy import Action, Decision, TokenBucket, decide

__all__ = ["Outcome", "ReplicationWorker"]

log = logging.getLogger(__name__)

COPIES_IN_FLIGHT = 16


@dataclass
class Outcome:
    """What one pass over a marked ledger did: ``status`` is ``locked`` (another worker has it), ``gone`` (no
    mark), ``cleared``, ``waiting``, ``replicated``, ``disabled`` or ``failed``."""

    ledger_id: int
    status: str
    entries_copied: int = 0
    replacements: dict[str, dict[int, str]] = field(default_factory=dict)  # bookie -> ensemble index -> new
    why: str = ""


class ReplicationWorker:
    def __init__(
        self,
        bk: BookKeeper,
        manager: UnderReplicationManager,
        config: AutoRecoveryConfig,
        metrics: Metrics,
        owner: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bk = bk
        self.manager = manager
        self.config = config
        self.metrics = metrics
        self.owner = owner
        self._clock = clock
        self._bucket = TokenBucket(config.throttle_bytes_per_s, clock())
        self._passwords = PasswordBook(config.passwords)
        self._said_no_password: set[int] = set()  # ledgers whose missing password was logged (once each)
        # ledgers whose re-replication keeps failing (both copies of an entry down): a line a minute each, not
        # one per pass (a pass a second)
        self._failing: dict[int, Every] = {}

    async def _zk(self, fn: Callable[..., object], *args: object) -> object:
        return await _meta(functools.partial(fn, *args))

    # --- the loop ---------------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        failing = RateLimitedLog(log, LOG_EVERY_S)  # (ZooKeeper away: a line a minute, not per pass)
        while not stop.is_set():
            worked = 0
            with failing.catching((E.LedgerError, OSError), "replication worker %s", self.owner):
                worked = await self.run_once()
            if not worked:
                try:
                    await asyncio.wait_for(stop.wait(), self.config.poll_interval_s)
                except TimeoutError:
                    pass

    async def run_once(self) -> int:
        """One pass over the marks not locked by others; returns how many ledgers it re-replicated or cleared."""
        if not await _meta(self.manager.enabled):
            return 0
        ids = await _meta(self.manager.list_ids)
        locked = await _meta(self.manager.locks)
        for gone in self._failing.keys() - set(ids):  # marks cleared or ledgers deleted: their limiters go
            del self._failing[gone]
        done = 0
        for lid in ids:
            if lid in locked:
                continue
            out = await self.process(lid)
            if out.status in ("cleared", "replicated"):
                done += 1
        return done

    # --- one ledger -------------------------------------------------------------------------------------------

    async def process(self, ledger_id: int) -> Outcome:
        if not await _meta(functools.partial(self.manager.try_lock, ledger_id, self.owner)):
            return Outcome(ledger_id, "locked")
        try:
            out = await self._process_locked(ledger_id)
        except (E.LedgerError, ValueError) as e:
            every = self._failing.setdefault(ledger_id, Every(LOG_EVERY_S, clock=self._clock))
            if every.due():
                log.warning(
                    "ledger=%d re-replication failed (mark kept; said again at most once a minute): %s",
                    ledger_id,
                    e,
                )
            return Outcome(ledger_id, "failed", why=str(e))
        else:
            self._failing.pop(ledger_id, None)
            return out
        finally:
            try:
                await _meta(functools.partial(self.manager.unlock, ledger_id))
            except E.LedgerError as e:  # the session's end releases it anyway
                log.warning("ledger=%d lock not released: %s", ledger_id, e)

    async def _read_md(self, ledger_id: int) -> LedgerMetadata | None:
        try:
            md: LedgerMetadata = await self.bk.ledger_metadata(ledger_id)
            return md
        except E.NoSuchLedgerError:
            return None

    async def _process_locked(self, ledger_id: int) -> Outcome:
        mark = await _meta(functools.partial(self.manager.get, ledger_id))
        if mark is None:
            return Outcome(ledger_id, "gone")
        recovered = False
        while True:
            md = await self._read_md(ledger_id)
            writable = set(await _meta(self.bk.registry.available))
            registered = set(await _meta(self.bk.registry.all))
            d = decide(
                md,
                mark.value,
                writable,
                registered,
                int(time.time() * 1000),
                int(self.config.open_ledger_rereplication_grace_period_s * 1000),
            )
            if d.action is Action.CLEAR:
                await _meta(functools.partial(self.manager.clear, ledger_id, mark.version))
                log.info("ledger=%d mark cleared: %s", ledger_id, d.why)
                return Outcome(ledger_id, "cleared", why=d.why)
            if d.action is Action.WAIT:
                return Outcome(ledger_id, "waiting", why=d.why)
            assert md is not None
            password = await self._passwords.of(md)
            if password is None:
                if ledger_id not in self._said_no_password:
                    self._said_no_password.add(ledger_id)
                    log.warning(
                        "ledger=%d stays marked: none of the %d configured passwords is its (give it with "
                        "--password, in a bookie --autorecovery-password)",
                        ledger_id,
                        len(self.config.passwords),
                    )
                return Outcome(ledger_id, "failed", why="none of the configured passwords is the ledger's")
            if d.action is Action.RECOVER:
                if recovered:
                    return Outcome(ledger_id, "failed", why="still open after recovery")
                log.info("ledger=%d %s: recovery-opening it (fence and close)", ledger_id, d.why)
                await self.bk.open_ledger(ledger_id, password, recovery=True)
                recovered = True
                continue
            out = await self._replicate(md, d, password)
            cleared = await _meta(functools.partial(self.manager.clear, ledger_id, mark.version))
            if not cleared:
                log.info("ledger=%d mark changed while re-replicating: kept for another pass", ledger_id)
            self.metrics.ledgers_rereplicated_total += 1
            return out

    async def _throttle(self, nbytes: int) -> None:
        wait = self._bucket.take(nbytes, self._clock())
        if wait > 0:
            await asyncio.sleep(wait)

    def _copied(self, entries: int, nbytes: int) -> None:
        self.metrics.rereplicated_entries_total += entries
        self.metrics.rereplicated_bytes_total += nbytes

    async def _copy_entry(
        self, codec: EntryCodec, key: bytes, eid: int, sources: list[str], target: str
    ) -> None:
        entry = await _read_verified(self.bk, codec, key, eid, sources)
        await self._throttle(len(entry))
        await _write(self.bk, codec.ledger_id, key, target, eid, entry)
        self.metrics.rereplicated_entries_total += 1
        self.metrics.rereplicated_bytes_total += len(entry)

    async def _bounded(self, jobs: list[Callable[[], object]]) -> None:
        sem = asyncio.Semaphore(COPIES_IN_FLIGHT)

        async def one(job: Callable[[], object]) -> None:
            async with sem:
                await job()  # type: ignore[misc]

        for start in range(0, len(jobs), 4 * COPIES_IN_FLIGHT):  # never a task per entry of a huge ledger
            await asyncio.gather(*(one(j) for j in jobs[start : start + 4 * COPIES_IN_FLIGHT]))

    async def _replicate(self, md: LedgerMetadata, d: Decision, password: bytes) -> Outcome:
        lid = md.ledger_id
        key = p.master_key(password)
        codec = EntryCodec(lid, DigestType(md.digest_type), key)
        writable = set(await _meta(self.bk.registry.available))
        registered = set(await _meta(self.bk.registry.all))
        racks = await _meta(functools.partial(zk_racks.racks, self.bk.store))
        draining = await _meta(self.manager.decommissioning)
        out = Outcome(lid, "replicated")

        def sources_for(eid: int, ensemble: tuple[str, ...], leaving: str) -> list[str]:
            members = [ensemble[i] for i in write_set(eid, md.ensemble_size, md.write_quorum)]
            others = [b for b in members if b != leaving and b not in d.replace]
            # a drained bookie still holds its entries: read them from it first, sparing the others
            first = [leaving] if leaving in registered and leaving in d.replace else []
            live = sorted(others, key=lambda b: b not in registered)
            return first + live

        # Bookies that lack some entries but stay: copy back what they lack.
        for bookie in sorted(d.repair):
            jobs: list[Callable[[], object]] = []
            for f in lost_fragments(md, bookie):
                ensemble = md.ensembles[f.ensemble_index].bookies
                for eid in f.entries():
                    jobs.append(
                        functools.partial(self._repair_entry, codec, key, eid, ensemble, bookie, sources_for)
                    )
            before = self.metrics.rereplicated_entries_total
            await self._bounded(jobs)
            out.entries_copied += self.metrics.rereplicated_entries_total - before
            await _fence(self.bk, lid, key, bookie)
            log.info("ledger=%d repaired on %s: %d entries copied back", lid, bookie, out.entries_copied)

        # Bookies to replace: copy their share to new bookies, fence them, then one CAS.
        planned = [list(e.bookies) for e in md.ensembles]
        for bookie in sorted(d.replace):
            chosen: dict[int, str] = {}
            for f in lost_fragments(md, bookie):
                ensemble = md.ensembles[f.ensemble_index].bookies
                target = choose_replacement(
                    planned[f.ensemble_index],
                    f.bookie_index,
                    writable,
                    exclude=set(d.replace) | draining | set(ensemble),
                    racks=racks,
                    min_racks=self.config.min_racks,
                )
                planned[f.ensemble_index][f.bookie_index] = target
                chosen[f.ensemble_index] = target
                out.entries_copied += await copy_fragment(
                    self.bk,
                    codec,
                    key,
                    f,
                    target,
                    functools.partial(sources_for, ensemble=ensemble, leaving=bookie),
                    throttle=self._throttle,
                    on_copied=self._copied,
                )
                if md.is_closed:  # an OPEN ledger's writer may yet choose the target: never fence it there
                    await _fence(self.bk, lid, key, target)
            out.replacements[bookie] = chosen

        if out.replacements:

            def transform(cur: LedgerMetadata) -> tuple[LedgerMetadata, None]:
                for bookie, chosen in out.replacements.items():
                    cur = swapped(cur, bookie, chosen)
                return cur, None

            await update_metadata(self.bk.ledgers, lid, transform)
        log.info(
            "ledger=%d re-replicated: %d entries copied, replaced %s, repaired %s",
            lid,
            out.entries_copied,
            {b: dict(c) for b, c in out.replacements.items()},
            sorted(d.repair),
        )
        return out

    async def _repair_entry(
        self,
        codec: EntryCodec,
        key: bytes,
        eid: int,
        ensemble: tuple[str, ...],
        bookie: str,
        sources_for: Callable[[int, tuple[str, ...], str], list[str]],
    ) -> None:
        lid = codec.ledger_id
        r = await self.bk._ask_or_none(
            bookie,
            lambda rid: p.ReadEntryRequest(request_id=rid, ledger_id=lid, entry_id=eid, master_key=key),
        )
        if r is not None and r.status not in (p.Status.NO_ENTRY, p.Status.NO_LEDGER):
            return  # present (or unreadable for another reason: not this pass's business)
        await self._copy_entry(codec, key, eid, sources_for(eid, ensemble, bookie), bookie)
