"""The auditor (BookKeeper's ``Auditor``): elected through ZooKeeper, it marks ledgers under-replicated.

Election: every process that may audit creates an ephemeral sequential znode under ``underreplicated/auditor``;
the lowest is the auditor. When its session ends (process killed, partitioned past its session timeout) its znode
goes and the next one is the auditor, with no state to hand over: the marks are in ZooKeeper, and a new
auditor starts the loss delay of every missing bookie afresh (it cannot know since when it was missing; erring
late rather than marking early).

While elected and enabled it watches the bookie registry (``bookies/available``, ``bookies/readonly``) and, per
``policy.LostBookieTracker``, marks every ledger naming a bookie gone for longer than the delay. Every
``audit_interval_s``, and whenever ``underreplicated/audit-request`` changes, it also runs the check: it reads
from each live bookie entries it should hold (``policy.entries_to_check``) and marks the ledgers whose bookie
answers that it has none.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from bookie import protocol as p
from ledger_client import errors as E
from ledger_client.client import BookKeeper, _meta
from zk import layout
from zk.ledger_metadata import LedgerMetadata
from zk.ratelog import LOG_EVERY_S, RateLimitedLog
from zk.underreplication import AUDIT_REQUEST, UnderReplicationManager

from .config import AutoRecoveryConfig
from .metrics import Metrics
from .passwords import PasswordBook
from .policy import LostBookieTracker, bookies_in, entries_to_check, ledgers_to_mark

__all__ = ["Auditor", "read_all_metadata"]

log = logging.getLogger(__name__)

CHECK_READS_IN_FLIGHT = 32


def read_all_metadata(bk: BookKeeper) -> dict[int, LedgerMetadata]:
    """Every ledger's metadata (blocking; pipelined reads)."""
    ids = bk.ledgers.list()
    paths = {layout.ledger_path(i): i for i in ids}
    bodies = bk.store.get_many(list(paths))
    out = {}
    for path, lid in paths.items():
        v = bodies.get(path)
        if v is not None:
            out[lid] = LedgerMetadata.from_json(v.value)
    return out


class Auditor:
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
        self.tracker = LostBookieTracker(config.lost_bookie_recovery_delay_s)
        self._name: str | None = None
        self._elected = False
        self._last_check = clock()
        self._last_request: Any = None
        self._passwords = PasswordBook(config.passwords)

    @property
    def elected(self) -> bool:
        return self._elected

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def kick(*_: object) -> None:
            loop.call_soon_threadsafe(wake.set)

        cancels: list[Callable[[], None]] = []
        try:
            for watch in (
                self.bk.registry.watch_available,
                self.bk.registry.watch_readonly,
                self.manager.watch_election,
                self.manager.watch_audit_requests,
            ):
                cancels.append(await _meta(functools.partial(watch, kick)))
            req = await _meta(functools.partial(self.bk.store.get_optional, AUDIT_REQUEST))
            self._last_request = None if req is None else req.value.get("requested_ms")
            failing = RateLimitedLog(log, LOG_EVERY_S)  # (ZooKeeper away: a line a minute, not per pass)
            while not stop.is_set():
                wake.clear()
                timeout = self.config.poll_interval_s
                with failing.catching((E.LedgerError, OSError, ValueError), "auditor %s", self.owner):
                    timeout = await self.step()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_first(wake, stop), max(0.05, timeout))
        finally:
            for cancel in cancels:
                cancel()
            self.metrics.is_auditor = 0

    async def _ensure_volunteered(self) -> bool:
        names = await _meta(self.manager.candidates)
        if self._name is None or self._name not in names:  # first time, or our session expired
            self._name = await _meta(functools.partial(self.manager.volunteer, self.owner))
            names = await _meta(self.manager.candidates)
        elected = bool(names) and names[0] == self._name
        if elected != self._elected:
            log.info("auditor %s: %s", self.owner, "elected" if elected else "standing by")
            if elected:  # a fresh start: delays count from now, a check runs after a full interval
                self.tracker = LostBookieTracker(self.config.lost_bookie_recovery_delay_s)
                self._last_check = self._clock()
        self._elected = elected
        self.metrics.is_auditor = int(elected)
        return elected

    async def step(self) -> float:
        """One look; returns how long to wait at most before the next (watches wake it earlier)."""
        if not await self._ensure_volunteered():
            return self.config.poll_interval_s
        if not await _meta(self.manager.enabled):
            return self.config.poll_interval_s
        now = self._clock()
        registered = set(await _meta(self.bk.registry.all))
        first = not self.tracker._seen
        ledgers: dict[int, LedgerMetadata] | None = None
        if first:
            ledgers = await _meta(functools.partial(read_all_metadata, self.bk))
        referenced = set().union(*(bookies_in(md) for md in ledgers.values())) if ledgers else set()
        was_missing, was_marked = set(self.tracker.missing_since), set(self.tracker.marked)
        back = self.tracker.observe(registered, referenced, now)
        for b in sorted(back - was_marked):
            log.info("auditor: bookie %s is back before its loss delay ran out: nothing marked", b)
        for b in sorted(back & was_marked):  # (a restart longer than the delay: the workers find it back)
            log.info(
                "auditor: bookie %s is back after its ledgers were marked: the workers copy what it lacks", b
            )
        for b in sorted(set(self.tracker.missing_since) - was_missing):
            log.info(
                "auditor: bookie %s is gone: its ledgers are marked under-replicated in %g s unless it comes back",
                b,
                self.tracker.delay_s,
            )
        due = self.tracker.due(now)
        if due:
            if ledgers is None:
                ledgers = await _meta(functools.partial(read_all_metadata, self.bk))
            await self._mark_lost(ledgers, due)
        req = await _meta(functools.partial(self.bk.store.get_optional, AUDIT_REQUEST))
        requested = None if req is None else req.value.get("requested_ms")
        if requested != self._last_request or now - self._last_check >= self.config.audit_interval_s:
            self._last_request = requested
            self._last_check = now
            if ledgers is None:
                ledgers = await _meta(functools.partial(read_all_metadata, self.bk))
            await self._mark_lost(ledgers, set(self.tracker.missing_since) - set(self.tracker.pending(now)))
            await self.check(ledgers, registered)
        pending = self.tracker.pending(self._clock())
        wait = min([self.config.poll_interval_s, *pending.values()])
        return max(0.05, wait)

    async def _mark_lost(self, ledgers: dict[int, LedgerMetadata], lost: set[str]) -> None:
        if not lost:
            return
        self.metrics.audits_total += 1
        marks = ledgers_to_mark(ledgers, lost)
        for lid, bookies in sorted(marks.items()):
            await _meta(functools.partial(self.manager.mark, lid, sorted(bookies)))
            self.metrics.ledgers_marked_total += 1
        log.info(
            "auditor: bookies %s lost: marked %d ledgers under-replicated %s",
            sorted(lost),
            len(marks),
            sorted(marks)[:20],
        )
        self.tracker.marked |= lost
        referenced = set().union(*(bookies_in(md) for md in ledgers.values())) if ledgers else set()
        for b in lost - referenced:
            self.tracker.forget(b)

    async def check(self, ledgers: dict[int, LedgerMetadata], registered: set[str]) -> dict[int, set[str]]:
        """Read from live bookies entries they should hold; mark ledgers whose bookies lack some. Returns the
        ledger id -> bookies found lacking entries."""
        self.metrics.checks_total += 1
        sem = asyncio.Semaphore(CHECK_READS_IN_FLIGHT)
        found: dict[int, set[str]] = {}
        # A bookie that did not answer one read (hung: a stalled disk, SIGSTOP; or unreachable) is asked nothing
        # more this check: each of its reads would wait out read_timeout_s holding a slot of the reads in flight,
        # so the check (and the auditor's step behind it, marking lost bookies' ledgers) took about its reads /
        # CHECK_READS_IN_FLIGHT x read_timeout_s, minutes with a few hundred ledgers. Nothing is learnt from it
        # anyway: the next check asks it again.
        unanswered: dict[str, str] = {}

        async def probe(lid: int, key: bytes, bookie: str, eid: int) -> None:
            async with sem:
                if bookie in unanswered:
                    return
                try:
                    r = await self.bk._ask(
                        bookie,
                        lambda rid: p.ReadEntryRequest(
                            request_id=rid, ledger_id=lid, entry_id=eid, master_key=key
                        ),
                    )
                except E.LedgerError as e:
                    unanswered.setdefault(bookie, str(e))
                    return
            if r.status in (p.Status.NO_ENTRY, p.Status.NO_LEDGER):
                found.setdefault(lid, set()).add(bookie)

        jobs = []
        for lid, md in sorted(ledgers.items()):
            wanted = entries_to_check(md, registered, self.config.check_all_entries)
            if not wanted:
                continue
            pw = await self._passwords.of(md)
            if pw is None:
                log.warning("auditor: ledger=%d not checked: none of the configured passwords is its", lid)
                continue
            key = p.master_key(pw)
            for bookie, ids in wanted.items():
                jobs += [probe(lid, key, bookie, eid) for eid in ids]
        for start in range(0, len(jobs), 4 * CHECK_READS_IN_FLIGHT):
            await asyncio.gather(*jobs[start : start + 4 * CHECK_READS_IN_FLIGHT])
        for bookie, why in sorted(unanswered.items()):
            log.warning("auditor: bookie %s not checked this pass: it did not answer (%s)", bookie, why)
        for lid, bookies in sorted(found.items()):
            await _meta(functools.partial(self.manager.mark, lid, sorted(bookies)))
            self.metrics.ledgers_marked_total += 1
            log.warning(
                "auditor: ledger=%d bookies %s lack entries they should hold: marked", lid, sorted(bookies)
            )
        return found


async def _first(*events: asyncio.Event) -> None:
    tasks = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
