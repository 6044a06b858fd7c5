"""The writer's send path: what a writer ``LedgerHandle`` does between ``append`` and the acknowledgement.

Built for throughput: one ADD_ENTRY frame per entry (a request id from the pool's client-wide add counter) goes
to every bookie of the entry's write set; while no bookie failed and every connection is open, the frames of one
event-loop iteration leave in one write per connection (``_Routes``). A writer handle is the pool's
``AddListener`` for its ledger, so each received chunk of acks reaches ``WritePipeline.on_acks`` (the pure core,
``pending``) in one call; a lost connection is reported to the handle, which fails that bookie if it still waits
for one of its acks. Timeouts are swept periodically (not one timer per request): an add not answered by a bookie
within ``add_timeout_s`` counts as that bookie's failure, which triggers an ensemble change; its metadata write is
``handle_state.ensemble_change_transition`` through the one compare-and-set loop (``metadata.update_metadata``).

``WriterSendPath`` is a base class of ``LedgerHandle`` rather than an object the handle holds, so the append
fast path costs no extra attribute lookup or call layer per entry.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from bookie import protocol as p
from bookie.entryformat import EntryCodec

from . import errors as E
from .bookie_conn import ADD_RID_BASE, AddRow, BookieConnection
from .handle_state import (
    EnsembleChangeStep,
    HandleEvent,
    HandleState,
    HandleStateMachine,
    ensemble_change_transition,
)
from .metadata import update_metadata
from .pending import Progress, WritePipeline
from .quorum import write_set

if TYPE_CHECKING:
    from .client import BookKeeper

log = logging.getLogger("ledgerstore.client")

__all__ = ["AddCallback", "WriterSendPath"]

_STATUS = {int(s): s for s in p.Status}
_OK = int(p.Status.OK)
_FRAME_HEADER_LEN = 4 + p.FRAME_HEADER.size  # u32 length + version, op, flags, request id
#: The largest entry payload a bookie takes (its frame limit less the entry header and digest)
ENTRY_PAYLOAD_MAX = p.ENTRY_SIZE_MAX - 64
_PAYLOAD_MAX = ENTRY_PAYLOAD_MAX
_OPEN = HandleState.OPEN

#: ``append_callback``'s callback: ``(entry_id, None)`` once acknowledged, ``(entry_id, error)`` if it failed.
AddCallback = Callable[[int, "E.LedgerError | None"], None]
_Waiter = asyncio.Future[int] | AddCallback


def _ignore_add(entry_id: int, error: E.LedgerError | None) -> None:
    """The waiter of ``append_many``'s entries but its last (whose future settles for all of them)."""


def _resolve(waiter: _Waiter, entry_id: int, error: E.LedgerError | None) -> None:
    """Complete an append: resolve its future or call its callback (whose errors are logged, not raised)."""
    if isinstance(waiter, asyncio.Future):
        if not waiter.done():
            if error is None:
                waiter.set_result(entry_id)
            else:
                waiter.set_exception(error)
        return
    try:
        waiter(entry_id, error)
    except Exception:
        log.exception("append callback for entry %d failed", entry_id)


_current_task = asyncio.current_task
_Task = asyncio.Task


def _resume_appends(waiters: list[tuple[asyncio.Future[int], int]]) -> None:
    """Settle acknowledged appends' futures, resuming the task that awaits each one at once rather than
    through a callback the event loop runs in its next iteration (one loop handle less per entry: the
    task-per-append idiom's largest cost after asyncio's own per-task work). Only called outside any running
    task (a task's step cannot start inside another's), after the chunk's waiters left the in-flight map, in
    entry-id order. A future with any other waiter (a callback added by something other than the one task
    awaiting it) is settled as usual; one cancelled meanwhile (by a task resumed before it) is skipped. If a
    resumed step raises (only ``KeyboardInterrupt``/``SystemExit`` leave a task's step), the rest are settled
    as usual first."""
    for i, (fut, eid) in enumerate(waiters):
        if fut.done():
            continue
        callbacks = fut._callbacks  # type: ignore[attr-defined]
        if callbacks is None or len(callbacks) != 1:
            fut.set_result(eid)
            continue
        wakeup, context = callbacks[0]
        if not isinstance(getattr(wakeup, "__self__", None), _Task):
            fut.set_result(eid)
            continue
        fut.remove_done_callback(wakeup)
        fut.set_result(eid)
        try:
            context.run(wakeup, fut)
        except BaseException:
            for f, e in waiters[i + 1 :]:
                if not f.done():
                    f.set_result(e)
            raise


#: Sweeps of add timeouts skipped in a row because the event loop was blocked (see ``_sweep_timeouts``).
_STALLS_FORGIVEN = 3


class _Routes:
    """A writer's connections to its ensemble, for sending a batch of consecutive entries' frames with one
    write per connection (each connection gets the frames of the entries whose write set holds it)."""

    __slots__ = ("conns", "_masks", "_all")

    def __init__(self, conns: Sequence[BookieConnection], write_quorum: int) -> None:
        n = len(conns)
        self.conns = tuple(conns)
        self._all = write_quorum == n
        # _masks[j][s]: for a batch starting at an entry id = s (mod E), which frames (cyclically) go to j
        self._masks = tuple(
            tuple(tuple((j - s - k) % n < write_quorum for k in range(n)) for s in range(n)) for j in range(n)
        )

    def write(self, first_entry_id: int, frames: list[bytes]) -> None:
        """Send frames of entries first_entry_id, +1, ... (a closed connection is skipped: its loss is
        reported to the writer, which then fails that bookie)."""
        if self._all:
            buf = frames[0] if len(frames) == 1 else b"".join(frames)
            for conn in self.conns:
                conn.write_listened_adds(buf)
            return
        n = len(self.conns)
        for j, conn in enumerate(self.conns):
            buf = b"".join(itertools.compress(frames, itertools.cycle(self._masks[j][first_entry_id % n])))
            if buf:
                conn.write_listened_adds(buf)


class WriterSendPath:
    """The writer half of ``LedgerHandle`` (its base class): sending adds, their acks, timeouts, congestion and
    ensemble changes. Only a writer handle (``create_ledger``) calls ``_init_writer``."""

    # Set by LedgerHandle.__init__
    bk: BookKeeper
    ledger_id: int
    _versioned: Any
    _key: bytes
    _codec: EntryCodec
    _loop: asyncio.AbstractEventLoop
    _pipe: WritePipeline | None
    _state: HandleStateMachine
    # Set by _init_writer (a writer's only)
    _inflight: dict[int, tuple[bytes, _Waiter, float]]
    _add_ids: Any
    _build_frame: Callable[[int, int, int, int, bytes], bytes]
    _routes: _Routes | None
    _out: list[bytes]
    _out_first: int
    _out_time: float
    _capacity: asyncio.Event
    _congested: dict[str, float]
    _ec_task: asyncio.Task[None] | None
    _sweeper: asyncio.Task[None] | None
    _lac_sent: int
    _lac_task: asyncio.Task[None] | None

    def _init_writer(self, md: Any) -> None:
        bk = self.bk
        self._pipe = WritePipeline(
            ensemble_size=md.ensemble_size,
            write_quorum=md.write_quorum,
            ack_quorum=md.ack_quorum,
            ensemble=md.last_ensemble.bookies,
            outstanding_adds_max=bk.config.outstanding_adds_max,
        )
        # entry id -> (ADD_ENTRY frame, the caller's future or callback, loop time of the last send), in
        # entry-id order
        self._inflight = {}
        self._add_ids = bk.pool.add_ids
        self._build_frame = self._codec.add_frame_builder(self._key)
        # The fast send path: while no bookie of the ensemble failed and all their connections are open,
        # new frames collect in _out (entries _out_first, _out_first + 1, ...) and go out once per loop
        # iteration, one write per connection. _routes is None otherwise (each entry on its own).
        self._routes = None
        self._out = []
        self._out_first = 0
        self._out_time = 0.0  # loop time of the batch in _out (its entries' send time)
        bk.pool.add_listener(self.ledger_id, self)
        self._capacity = asyncio.Event()
        self._capacity.set()
        # bookie -> loop time since which its connection holds too many unsent bytes: appends wait (a
        # slow bookie must not make the client buffer without limit); past add_timeout_s it counts as
        # failed and is replaced
        self._congested = {}
        self._ec_task = None
        self._sweeper = self._loop.create_task(self._sweep_timeouts())
        self._lac_sent = -1
        self._lac_task = (
            self._loop.create_task(self._send_explicit_lac())
            if bk.config.explicit_lac_interval_s > 0
            else None
        )

    async def _until_appendable(self) -> None:
        pipe = self._pipe
        if pipe is None:
            raise E.LedgerClosedError(
                f"ledger {self.ledger_id} was opened for reading", ledger_id=self.ledger_id
            )
        while True:
            self._state.check_append()
            if pipe.error is not None:
                raise pipe.error
            if pipe.has_capacity and not self._congested:
                return
            self._capacity.clear()
            await self._capacity.wait()

    def _add(self, data: bytes, waiter: _Waiter) -> int:
        """Assign the next entry id and send the entry (the caller checked state and capacity)."""
        pipe = self._pipe
        assert pipe is not None
        if len(data) > _PAYLOAD_MAX:
            raise E.IncorrectParameterError(
                f"entry of {len(data)} bytes exceeds the maximum entry size ({_PAYLOAD_MAX} bytes)"
            )
        eid, length, lac = pipe.assign(len(data))
        frame = self._build_frame(next(self._add_ids), eid, lac, length, data)
        if self._routes is not None or self._make_routes() is not None:
            out = self._out
            if not out:
                self._out_first = eid
                self._out_time = self._loop.time()  # the batch goes out in this loop iteration
                self._loop.call_soon(self._flush_out)
            out.append(frame)
            self._inflight[eid] = (frame, waiter, self._out_time)
        else:
            self._inflight[eid] = (frame, waiter, self._loop.time())
            for t in pipe.targets(eid):
                self._send_add(eid, t.bookie, frame)
            self._maybe_change_ensemble()
        return eid

    def _make_routes(self) -> _Routes | None:
        """Enable the fast send path if it applies now (no failed bookie, every connection open)."""
        pipe = self._pipe
        assert pipe is not None
        if pipe.needs_ensemble_change or pipe.error is not None:
            return None
        conns = []
        for bookie in pipe.ensemble:
            conn = self.bk.pool.get_nowait(bookie)
            if conn is None:
                return None
            conns.append(conn)
        self._flush_out()  # (empty: _routes was None)
        self._routes = _Routes(conns, pipe.write_quorum)
        return self._routes

    def _drop_routes(self) -> None:
        """Leave the fast send path (a bookie failed, a connection broke, the ensemble changed)."""
        if self._routes is not None:
            self._flush_out()
            self._routes = None

    def _flush_out(self) -> None:
        out = self._out
        if not out:
            return
        self._out = []
        routes = self._routes
        if routes is None:  # pragma: no cover (_drop_routes flushes first)
            for i, frame in enumerate(out):
                self._resend_entry(self._out_first + i, frame)
            return
        routes.write(self._out_first, out)

    def _resend_entry(self, entry_id: int, frame: bytes) -> None:
        pipe = self._pipe
        assert pipe is not None
        if entry_id in self._inflight:
            for t in pipe.targets(entry_id):
                self._send_add(entry_id, t.bookie, frame)

    def _send_add(self, entry_id: int, bookie: str, frame: bytes) -> None:
        """Send an entry's ADD_ENTRY frame to one bookie (connecting first if need be)."""
        conn = self.bk.pool.get_nowait(bookie)
        if conn is None or not conn.send_listened_add(frame):
            self._loop.create_task(self._connect_and_send(entry_id, bookie, frame))

    async def _connect_and_send(self, entry_id: int, bookie: str, frame: bytes) -> None:
        try:
            conn = await self.bk.pool.get(bookie)
        except E.LedgerError as e:
            self._on_add_response(entry_id, bookie, None, e)
            return
        if not conn.send_listened_add(frame):
            self._on_add_response(entry_id, bookie, None, conn.close_reason)

    # -- AddListener (called by the pool's connections) ----------------------------------------------------
    def on_add_acks(self, bookie: str, entry_ids: Sequence[int]) -> None:
        """OK acks from ``bookie`` for these entries of this ledger: to the pipeline in one call."""
        pipe = self._pipe
        if pipe is None:  # pragma: no cover (only writers listen)
            return
        progress = pipe.on_acks(bookie, entry_ids)
        if progress.completed or progress.error is not None:
            self._apply(progress)

    def on_add_rows(self, bookie: str, rows: list[AddRow]) -> list[AddRow] | None:
        """A chunk of ADD_ENTRY responses from ``bookie``: OK acks of this ledger go to the pipeline in one
        call; other statuses one by one; rows of other ledgers (or other requests) are handed back."""
        lid = self.ledger_id
        eids = [r[7] for r in rows if r[5] == _OK and r[6] == lid and r[4] >= ADD_RID_BASE]
        rest: list[AddRow] | None = None
        failures: list[AddRow] = []
        if len(eids) != len(rows):
            rest = []
            for r in rows:
                if r[6] != lid or r[4] < ADD_RID_BASE:
                    rest.append(r)
                elif r[5] != _OK:
                    failures.append(r)
        pipe = self._pipe
        if pipe is None:  # pragma: no cover (only writers listen)
            return rest
        if eids:
            progress = pipe.on_acks(bookie, eids)
            if progress.completed or progress.error is not None:
                self._apply(progress)
        for r in failures:
            status = _STATUS.get(r[5])
            if status is None:
                raise p.ProtocolError(f"unknown status {r[5]}")
            self._on_add_response(r[7], bookie, status, None)
        return rest or None

    def on_bookie_lost(self, bookie: str, exc: BaseException) -> None:
        """A connection to ``bookie`` broke: if this writer still waits for acks from it, it failed."""
        self._drop_routes()
        if self._congested.pop(bookie, None) is not None:  # its unsent bytes went with it
            self._capacity.set()
        pipe = self._pipe
        if pipe is None or pipe.error is not None:
            return
        waiting = pipe.waiting_on(bookie)
        if not waiting:
            return
        log.debug("ledger=%d bookie=%s connection lost: %s", self.ledger_id, bookie, exc)
        for eid in waiting:
            self._apply(pipe.on_ack(eid, bookie, None))
        self._maybe_change_ensemble()

    def on_congestion(self, bookie: str, congested: bool) -> None:
        """Back-pressure from one bookie's connection (see ``BookieConnection.pause_writing``)."""
        pipe = self._pipe
        if pipe is None:
            return
        if congested and bookie in pipe.ensemble and pipe.error is None:
            self._congested.setdefault(bookie, self._loop.time())
        elif self._congested.pop(bookie, None) is not None:
            self._capacity.set()

    def _fail_congested(self, now: float, timeout: float) -> None:
        """A bookie that has not drained its connection for ``timeout`` is as good as failed: replace it."""
        pipe = self._pipe
        assert pipe is not None
        self._forget_congestion_outside(pipe.ensemble)
        for bookie, since in list(self._congested.items()):
            if now - since > timeout:
                log.warning(
                    "ledger=%d bookie=%s has not read our adds for %.1fs: replacing it",
                    self.ledger_id,
                    bookie,
                    now - since,
                )
                del self._congested[bookie]
                self._capacity.set()
                self._apply(pipe.on_bookie_error(bookie))
        self._maybe_change_ensemble()

    def _on_add_response(
        self, entry_id: int, bookie: str, status: p.Status | None, exc: BaseException | None
    ) -> None:
        pipe = self._pipe
        assert pipe is not None
        if status is not None and status != p.Status.OK:
            # FENCED is the expected end of a writer whose ledger another client recovers: not a warning.
            level = logging.INFO if status == p.Status.FENCED else logging.WARNING
            log.log(
                level,
                "ledger=%d entry=%d bookie=%s add failed: %s",
                self.ledger_id,
                entry_id,
                bookie,
                status.name,
            )
        elif exc is not None and pipe.error is None:
            log.debug("ledger=%d entry=%d bookie=%s add failed: %s", self.ledger_id, entry_id, bookie, exc)
        self._apply(pipe.on_ack(entry_id, bookie, status))
        self._maybe_change_ensemble()

    def _apply(self, progress: Progress) -> None:
        completed = progress.completed
        if completed:
            pop = self._inflight.pop
            # Outside any task (acks arrive in a protocol callback) the tasks awaiting ``append`` are resumed
            # here, after every waiter of the chunk was taken out (see _resume_appends); inside one, through
            # the loop.
            resume: list[tuple[asyncio.Future[int], int]] | None = (
                [] if _current_task(self._loop) is None else None
            )
            for eid in completed:
                item = pop(eid, None)
                if item is None:
                    continue
                waiter = item[1]
                if isinstance(waiter, asyncio.Future):
                    if not waiter.done():
                        if resume is not None:
                            resume.append((waiter, eid))
                        else:
                            waiter.set_result(eid)
                    continue
                try:
                    waiter(eid, None)
                except Exception:
                    log.exception("append callback for entry %d failed", eid)
            if resume:
                _resume_appends(resume)
        if progress.failed:
            err = progress.error or E.LedgerError("append failed")
            for eid in progress.failed:
                item = self._inflight.pop(eid, None)
                if item is not None:
                    _resolve(item[1], eid, err)
        if progress.error is not None:
            self._drop_routes()
            self._state.handle(HandleEvent.FAILED, error=progress.error)
            items, self._inflight = self._inflight, {}
            for eid, item in items.items():
                _resolve(item[1], eid, progress.error)
        if completed or progress.failed or progress.error:
            self._capacity.set()

    async def _sweep_timeouts(self) -> None:
        timeout = self.bk.config.add_timeout_s
        period = max(0.05, timeout / 4)
        pipe = self._pipe
        assert pipe is not None
        stalls = 0
        while True:
            slept_at = self._loop.time()
            await asyncio.sleep(period)
            if pipe.error is not None:
                return
            now = self._loop.time()
            if now - slept_at > 2 * period and stalls < _STALLS_FORGIVEN:
                # The loop itself was blocked (a long callback, a gather over millions of futures): the
                # bookies' acks may be waiting unread in the sockets, so the stall is not theirs. Look again
                # after a period of a running loop; a loop blocked round after round still sweeps.
                stalls += 1
                continue
            stalls = 0
            if self._congested:
                self._fail_congested(now, timeout)
            expired = [eid for eid, item in self._inflight.items() if now - item[2] > timeout]
            for eid in expired:
                item = self._inflight.get(eid)
                if item is None:
                    continue
                self._inflight[eid] = (item[0], item[1], now)
                acked = pipe.acked_indices(eid)
                md = self._versioned.value
                for i in write_set(eid, md.ensemble_size, md.write_quorum):
                    if i not in acked and i not in pipe.failed_indices:
                        log.warning(
                            "ledger=%d entry=%d bookie=%s add timed out",
                            self.ledger_id,
                            eid,
                            pipe.ensemble[i],
                        )
                        self._apply(pipe.on_timeout(eid, pipe.ensemble[i]))
            if expired:
                self._maybe_change_ensemble()

    def _stop_sweeper(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._lac_task is not None:
            self._lac_task.cancel()
            self._lac_task = None

    async def _send_explicit_lac(self) -> None:
        """Best effort (as BookKeeper's explicit LAC): a lost WRITE_LAC only delays readers."""
        pipe = self._pipe
        assert pipe is not None
        while pipe.error is None:
            await asyncio.sleep(self.bk.config.explicit_lac_interval_s)
            lac = pipe.lac
            if lac <= self._lac_sent:
                continue
            self._lac_sent = lac
            build = functools.partial(
                _write_lac_request, self.ledger_id, lac, self._key, self._codec.build_lac(lac)
            )
            for bookie in pipe.ensemble:
                conn = self.bk.pool.get_nowait(bookie)
                if conn is not None:
                    conn.send(build, _ignore_response)

    def _maybe_change_ensemble(self) -> None:
        pipe = self._pipe
        if pipe is None or not pipe.needs_ensemble_change:
            return
        self._drop_routes()
        if pipe.changing_ensemble:
            return
        if self._ec_task is None or self._ec_task.done():
            self._ec_task = self._loop.create_task(self._change_ensemble())

    async def _change_ensemble(self) -> None:
        pipe = self._pipe
        assert pipe is not None
        cfg = self.bk.config
        while pipe.needs_ensemble_change and pipe.error is None:
            plan = pipe.ensemble_change_plan()
            deadline = self._loop.time() + cfg.ensemble_change_timeout_s
            tried: set[tuple[str, ...]] = set()  # ensembles we tried to write (a lost reply may hide success)
            while True:
                try:
                    new_bookies = await self.bk._replacements(pipe.ensemble, sorted(plan.failed_indices))
                    tried.add(tuple(new_bookies))
                    transition = functools.partial(
                        ensemble_change_transition,
                        first_entry_id=plan.first_entry_id,
                        ensemble=pipe.ensemble,
                        tried=frozenset(tried),
                        new_bookies=new_bookies,
                    )
                    written, step = await update_metadata(
                        self.bk.ledgers, self.ledger_id, transition, self._versioned
                    )
                except E.LedgerError as e:
                    # No replacement yet, ZooKeeper unreachable, or the reply lost: retry; a stale version then
                    # surfaces as a version conflict, and the step on the re-read metadata tells whether our
                    # write was applied (ADOPT).
                    if self._loop.time() > deadline:
                        self._apply(pipe.fail(e))
                        return
                    await asyncio.sleep(0.25)
                    continue
                break
            if step is not EnsembleChangeStep.WRITE and step is not EnsembleChangeStep.ADOPT:
                self._versioned = written
                self._apply(pipe.fail(self._ensemble_change_error(step)))
                return
            new_bookies = list(written.value.last_ensemble.bookies)
            self._versioned = written
            log.info(
                "ledger=%d ensemble change at entry %d: %s -> %s",
                self.ledger_id,
                plan.first_entry_id,
                list(pipe.ensemble),
                new_bookies,
            )
            self._drop_routes()
            result = pipe.apply_new_ensemble(plan.first_entry_id, new_bookies)
            now = self._loop.time()
            for r in result.resends:
                item = self._inflight.get(r.entry_id)
                if item is not None:
                    self._inflight[r.entry_id] = (item[0], item[1], now)
                    frame = p.add_request_frame(next(self._add_ids), 0, item[0][_FRAME_HEADER_LEN:])
                    self._send_add(r.entry_id, r.bookie, frame)
            self._apply(Progress(completed=result.completed))
            self._forget_congestion_outside(pipe.ensemble)

    def _ensemble_change_error(self, step: EnsembleChangeStep) -> E.LedgerError:
        lid = self.ledger_id
        if step is EnsembleChangeStep.FENCED:
            return E.LedgerFencedError(f"ledger {lid} is being recovered by another client", ledger_id=lid)
        if step is EnsembleChangeStep.FOUND_CLOSED:
            return E.LedgerClosedError(f"ledger {lid} was closed", ledger_id=lid)
        return E.LedgerFencedError(f"ledger {lid}: metadata changed under the writer", ledger_id=lid)

    def _forget_congestion_outside(self, ensemble: tuple[str, ...]) -> None:
        for bookie in [b for b in self._congested if b not in ensemble]:
            del self._congested[bookie]
            self._capacity.set()

    async def _drained(self) -> None:
        """Wait until every append pending now completed or failed."""
        pipe = self._pipe
        assert pipe is not None
        last = pipe.next_entry_id - 1
        while pipe.error is None and pipe.lac < last and self._inflight:
            self._capacity.clear()
            await self._capacity.wait()


def _write_lac_request(ledger_id: int, lac: int, key: bytes, blob: bytes, rid: int) -> p.WriteLacRequest:
    return p.WriteLacRequest(request_id=rid, ledger_id=ledger_id, lac=lac, master_key=key, lac_blob=blob)


def _ignore_response(resp: p.Response | None, exc: BaseException | None) -> None:
    pass
