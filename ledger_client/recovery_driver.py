"""The recovery driver: runs a ``LedgerRecovery`` (the pure core, ``recovery``) over the network.

``recover(lh)`` is what ``open_ledger(recovery=True)`` runs for a ledger that is not CLOSED: the metadata's
OPEN→IN_RECOVERY (``recovery_start_transition``), then :class:`RecoveryDriver` executes the core's commands (fence
reads, recovery reads, write-backs, replacement choices) and feeds the answers back until the core's ``Close``, then
IN_RECOVERY→CLOSED (``recovery_close_transition``); both metadata writes go through the one compare-and-set loop
(``metadata.update_metadata``). A failed attempt is retried from fresh metadata (fences are permanent).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bookie import protocol as p
from bookie.entryformat import DigestMismatchError as _RawDigestMismatch
from bookie.entryformat import peek_header
from zk.backoff import backoff

from . import errors as E
from .metadata import read_metadata, update_metadata
from .recovery import (
    ChangeEnsemble,
    Close,
    FenceRead,
    LedgerRecovery,
    LengthRead,
    RecoveryAdd,
    RecoveryFailed,
    RecoveryRead,
    recovery_close_transition,
    recovery_start_transition,
)

if TYPE_CHECKING:
    from .client import LedgerHandle

log = logging.getLogger("ledgerstore.client")

__all__ = ["RecoveryDriver", "recover"]


async def recover(lh: LedgerHandle) -> None:
    """Recover and close the ledger of a reading handle, retrying (from fresh metadata) up to
    ``recovery_attempts_max`` times.

    Raises:
        LedgerRecoveryError: the last attempt's error (not enough bookies answered, no progress, ...).
        NoSuchLedgerError, MetadataStoreError: from the metadata store.
    """
    cfg = lh.bk.config
    last_error: E.LedgerError | None = None
    pauses = backoff(0.4, 2.0)
    for attempt in range(cfg.recovery_attempts_max):
        if attempt:
            await asyncio.sleep(next(pauses))
        try:
            await _recover_once(lh)
            return
        except E.LedgerRecoveryError as e:
            last_error = e
            # the caller reports the last attempt's error: the ones before it, retried, are not news (with no
            # bookie up, a broker closing a topic's ledger every tick logged five lines each time)
            log.debug("ledger=%d recovery attempt %d failed: %s", lh.ledger_id, attempt + 1, e)
            lh._versioned = await read_metadata(lh.bk.ledgers, lh.ledger_id)
    assert last_error is not None
    raise last_error


async def _recover_once(lh: LedgerHandle) -> None:
    # 1. OPEN -> IN_RECOVERY (CAS), or proceed, or nothing to do.
    lh._versioned, decision = await update_metadata(
        lh.bk.ledgers, lh.ledger_id, recovery_start_transition, lh._versioned
    )
    md = lh._versioned.value
    if decision == "already_closed":
        lh._lac = md.last_entry_id
        return
    rec = LedgerRecovery(
        ensemble_size=md.ensemble_size,
        write_quorum=md.write_quorum,
        ack_quorum=md.ack_quorum,
        ensembles=md.ensembles,
    )
    close = await RecoveryDriver(lh, rec).run()
    # 2. Close: IN_RECOVERY -> CLOSED (concurrent recoverers converge on the first CAS).
    lh._versioned, d = await update_metadata(
        lh.bk.ledgers,
        lh.ledger_id,
        functools.partial(recovery_close_transition, close=close),
        lh._versioned,
    )
    lh._lac = d.last_entry_id
    if d.action == "adopt":
        log.info("ledger=%d already closed by another recoverer at %d", lh.ledger_id, d.last_entry_id)
        return
    log.info(
        "ledger=%d recovered and closed: last_entry_id=%d length=%d",
        lh.ledger_id,
        d.last_entry_id,
        d.length,
    )


class RecoveryDriver:
    """Executes a ``LedgerRecovery``'s commands over the network and feeds the answers back."""

    def __init__(self, lh: LedgerHandle, rec: LedgerRecovery) -> None:
        self.lh = lh
        self.rec = rec
        self.loop = lh._loop
        self.queue: asyncio.Queue[Callable[[], list[Any]]] = asyncio.Queue()
        self.tasks: set[asyncio.Task[None]] = set()
        self.writes: set[asyncio.Task[None]] = set()  # RecoveryAdds not answered yet

    async def run(self) -> Close:
        self._execute(self.rec.start())
        timeout = self.lh.bk.config.read_timeout_s * 6
        try:
            while True:
                try:
                    event = await asyncio.wait_for(self.queue.get(), timeout)
                except TimeoutError:
                    raise E.LedgerRecoveryError(
                        "recovery made no progress", ledger_id=self.lh.ledger_id
                    ) from None
                result = self._execute(event())
                if result is not None:
                    await self._finish_writes()
                    return result
        finally:
            for t in self.tasks:
                t.cancel()

    async def _finish_writes(self) -> None:
        """Before the close, let the write-backs still in flight finish (at most ``add_timeout_s``). Qa acks
        are all the close needs, but the others are part of it too: a replacement of a write-back ensemble
        change gets its resends in the same step as the close when the entries already had Qa from the bookies
        that stayed, and the close names it for those entries. Cancelled unsent, they would be missing there,
        and the entries one copy short of the write quorum with nothing to tell the re-replication."""
        if self.writes:
            await asyncio.wait(set(self.writes), timeout=self.lh.bk.config.add_timeout_s)

    def _execute(self, cmds: list[Any]) -> Close | None:
        for cmd in cmds:
            if isinstance(cmd, Close):
                return cmd
            if isinstance(cmd, RecoveryFailed):
                raise (
                    cmd.error
                    if isinstance(cmd.error, E.LedgerRecoveryError)
                    else E.LedgerRecoveryError(str(cmd.error), ledger_id=self.lh.ledger_id)
                )
            t = self._spawn(self._run_command(cmd))
            if isinstance(cmd, RecoveryAdd):
                self.writes.add(t)
                t.add_done_callback(self.writes.discard)
        return None

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        t = self.loop.create_task(coro)
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)
        return t

    async def _request(self, bookie: str, build: Callable[[int], p.Request]) -> p.Response | None:
        """One request of recovery; None for no answer, which UNAUTHORIZED counts as: the metadata accepted
        the password, so such a bookie holds another key for the ledger and is not fenced for ours."""
        r = await self.lh.bk._ask_or_none(bookie, build)
        if isinstance(r, p.ReadEntryResponse) and r.status == p.Status.UNAUTHORIZED:
            self.lh.bk.report_unauthorized(bookie, self.lh.ledger_id, "a recovery read")
            return None
        return r

    def _valid(self, entry: bytes, entry_id: int) -> bool:
        try:
            self.lh._codec.verify(entry, entry_id)
        except _RawDigestMismatch:
            return False
        return True

    async def _run_command(self, cmd: Any) -> None:
        lh = self.lh
        lid, key = lh.ledger_id, lh._key
        rec = self.rec
        if isinstance(cmd, FenceRead):
            r = await self._request(
                cmd.bookie,
                lambda rid: p.ReadEntryRequest(
                    request_id=rid, ledger_id=lid, entry_id=p.LAST_ENTRY, master_key=key, flags=p.Flag.FENCE
                ),
            )
            status, lac = _read_status(r)
            if isinstance(r, p.ReadEntryResponse) and r.status == p.Status.OK:
                with contextlib.suppress(Exception):
                    lac = max(lac, peek_header(r.entry).lac)
            self.queue.put_nowait(lambda: rec.on_fence_response(cmd.bookie_index, status, lac))
        elif isinstance(cmd, RecoveryRead):
            flags = p.Flag.FENCE if cmd.fence else 0
            for idx, bookie in zip(cmd.bookie_indices, cmd.bookies, strict=True):
                self._spawn(self._recovery_read(cmd.entry_id, idx, bookie, flags))
        elif isinstance(cmd, LengthRead):
            for bookie in cmd.bookies:
                self._spawn(self._length_read(cmd.entry_id, bookie))
        elif isinstance(cmd, RecoveryAdd):
            r = await self._request(
                cmd.bookie,
                lambda rid: p.AddEntryRequest(
                    request_id=rid,
                    ledger_id=lid,
                    entry_id=cmd.entry_id,
                    master_key=key,
                    entry=cmd.entry,
                    flags=p.Flag.RECOVERY_ADD,
                ),
            )
            st = r.status if r is not None else None
            self.queue.put_nowait(lambda: rec.on_recovery_add_response(cmd.entry_id, cmd.bookie, st))
        elif isinstance(cmd, ChangeEnsemble):
            try:
                new = await self.lh.bk._replacements(cmd.ensemble, sorted(cmd.plan.failed_indices))
            except E.LedgerError as e:
                err = e
                self.queue.put_nowait(lambda: rec.on_ensemble_change_failed(err))
                return
            self.queue.put_nowait(lambda: rec.on_ensemble_changed(cmd.plan.first_entry_id, new))
        else:  # pragma: no cover
            raise TypeError(cmd)

    async def _recovery_read(self, entry_id: int, idx: int, bookie: str, flags: int) -> None:
        lid, key = self.lh.ledger_id, self.lh._key
        r = await self._request(
            bookie,
            lambda rid: p.ReadEntryRequest(
                request_id=rid, ledger_id=lid, entry_id=entry_id, master_key=key, flags=flags
            ),
        )
        status, _ = _read_status(r)
        data = r.entry if isinstance(r, p.ReadEntryResponse) else b""
        valid = status != p.Status.OK or self._valid(data, entry_id)
        self.queue.put_nowait(lambda: self.rec.on_read_response(entry_id, idx, status, data, valid))

    async def _length_read(self, entry_id: int, bookie: str) -> None:
        lid, key = self.lh.ledger_id, self.lh._key
        r = await self._request(
            bookie,
            lambda rid: p.ReadEntryRequest(request_id=rid, ledger_id=lid, entry_id=entry_id, master_key=key),
        )
        status, _ = _read_status(r)
        data = r.entry if isinstance(r, p.ReadEntryResponse) else b""
        valid = status != p.Status.OK or self._valid(data, entry_id)
        self.queue.put_nowait(lambda: self.rec.on_length_response(entry_id, bookie, status, data, valid))


def _read_status(r: p.Response | None) -> tuple[p.Status | None, int]:
    if r is None:
        return None, -1
    assert isinstance(r, p.ReadEntryResponse)
    return r.status, r.lac
