"""A batched sequential read's I/O: ``BatchReader`` sends the ``ReadPlanner``'s batches (the pure core,
``read_planner``) as READ_RANGE requests on the read connections, verifies every returned entry's digest where it
lies in the received bytes and files the payloads as ready runs for ``LedgerHandle.read_batches`` (and ``read``,
``read_unconfirmed``, ``tail``), which consume them.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from typing import TYPE_CHECKING, Any

from bookie import protocol as p

from . import errors as E
from .read_conn import ReadConnection
from .read_planner import Batch, Outcome, ReadPlanner, ReadyRuns, Rivals, Unreadable
from .send_path import _FRAME_HEADER_LEN

if TYPE_CHECKING:
    from .client import LedgerHandle

log = logging.getLogger("ledgerstore.client")

__all__ = ["BatchReader", "RefreshAndRetry"]


class RefreshAndRetry(Exception):
    """An open ledger's entry no replica of the handle's metadata returned: refresh it and read on from there."""

    def __init__(self, entry_id: int) -> None:
        super().__init__(entry_id)
        self.entry_id = entry_id


_RANGE_REPLY_FIXED = _FRAME_HEADER_LEN + 21  # frame header + u8 status, u64 ledger, i64 first, u32 n


class BatchReader:
    """The I/O of one batched sequential read: sends the ``ReadPlanner``'s batches as READ_RANGE requests (with a
    timeout each) on read connections, verifies every returned entry's digest where it lies in the received
    bytes (``EntryCodec.verify_spans``), and files their payloads in ``ready`` (a piece per answer) for the
    consumer, which ``wake`` wakes. With ``rows``, a reply's payloads of one size are filed as a 2-D array
    viewing the reply (``verify_spans(rows=True)``)."""

    def __init__(self, lh: LedgerHandle, first: int, last: int, rows: bool = False) -> None:
        md = lh.metadata
        cfg = lh.bk.config
        self.lh = lh
        self.rows = rows
        self.batch_entries = max(1, cfg.read_batch_entries)
        # the reply must fit a frame: its fixed part and a u32 length per entry, then at most max_bytes
        self.max_bytes = max(
            1, min(cfg.read_batch_bytes, p.FRAME_SIZE_MAX - _RANGE_REPLY_FIXED - 4 * self.batch_entries)
        )
        self.planner = ReadPlanner(
            first,
            last,
            [(ens.first_entry_id, ens.bookies) for ens in md.ensembles],
            ensemble_size=md.ensemble_size,
            write_quorum=md.write_quorum,
            batch_entries=self.batch_entries,
            window=max(1, cfg.read_ahead_batches),
            last_resort=lh.bk.slow_read_bookies(),
        )
        self.ready = ReadyRuns(self.planner.step)
        self.unreadable: dict[int, Unreadable] = {}
        self.fatal: E.LedgerError | None = None
        self.wake = asyncio.Event()
        # batch -> (connection, request id, its timeout) while it waits for an answer
        self._waiting: dict[Batch, tuple[ReadConnection | None, int, asyncio.TimerHandle | None]] = {}
        # speculative reads (``speculative_read_timeout_s``, 0: none): batch -> (its timer, how many answers its
        # bookie had given this read when it was armed); a batch and its speculative copies -> their one list,
        # in the order they were sent; answers per bookie in this read
        spec = cfg.speculative_read_timeout_s  # (one not below the read timeout would come after it: none)
        self.speculative_timeout_s = spec if 0 < spec < cfg.read_timeout_s else 0.0
        self._spec: dict[Batch, tuple[asyncio.TimerHandle, int]] = {}
        self._rivals = Rivals()
        self._heard: collections.Counter[str] = collections.Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def start(self) -> None:
        self._send_all(self.planner.next_batches())

    def more(self, consumed: int) -> None:
        """The consumer took every entry before ``consumed``: read ahead from there."""
        planner = self.planner
        planner.consumed = consumed
        if planner.in_flight < planner.window and not planner.done_planning:
            self._send_all(planner.next_batches())

    def _send_all(self, batches: list[Batch]) -> None:
        for b in batches:
            self._send(b)

    def _send(self, b: Batch, conn: ReadConnection | None = None) -> None:
        if self._closed:
            return
        if conn is None:  # (not the second call of a connection just opened)
            self._arm(b)
            conn = self.lh.bk.read_pool.get_nowait(b.bookie)
        self._waiting[b] = (conn, 0, None)
        if conn is None:
            task = asyncio.ensure_future(self._connect_and_send(b))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        lh = self.lh
        rid = conn.next_id()
        req = p.ReadRangeRequest(
            request_id=rid,
            ledger_id=lh.ledger_id,
            first_entry_id=b.first,
            last_entry_id=b.last,
            master_key=lh._key,
            max_bytes=self.max_bytes,
            step=b.step,
        )
        conn.send_read_range(req, functools.partial(self._on_reply, b))
        if b in self._waiting:  # (a closed connection answers at once)
            timer = lh._loop.call_later(lh.bk.config.read_timeout_s, self._on_timeout, b)
            self._waiting[b] = (conn, rid, timer)

    async def _connect_and_send(self, b: Batch) -> None:
        try:
            conn = await self.lh.bk.read_pool.get(b.bookie)
        except E.LedgerError as e:
            self._answer(b, 0, Outcome.FAILED, e.code)
            return
        except OSError as e:
            self._answer(b, 0, Outcome.FAILED, str(e))
            return
        if b in self._waiting:
            self._send(b, conn)

    def _on_timeout(self, b: Batch) -> None:
        conn, rid, _ = self._waiting.get(b, (None, 0, None))
        if conn is not None:
            conn.forget(rid)
        self._slow(b.bookie)
        self._answer(b, 0, Outcome.FAILED, "TIMEOUT")

    def _slow(self, bookie: str) -> None:
        """A read from ``bookie`` timed out or lost to a speculative one: the client's reads ask it last for
        ``read_failure_history_s``, this one's later batches too."""
        self.lh.bk.read_timed_out[bookie] = time.monotonic()
        self.planner.mark_slow(bookie)

    # -- speculative reads ---------------------------------------------------------------------------------
    def _arm(self, b: Batch) -> None:
        if self.speculative_timeout_s > 0:
            timer = self.lh._loop.call_later(self.speculative_timeout_s, self._on_speculate, b)
            self._spec[b] = (timer, self._heard[b.bookie])

    def _disarm(self, b: Batch) -> None:
        armed = self._spec.pop(b, None)
        if armed is not None:
            armed[0].cancel()

    def _on_speculate(self, b: Batch) -> None:
        armed = self._spec.pop(b, None)
        if armed is None or b not in self._waiting or self._closed:
            return
        if not self._rivals.speculates(b):
            return  # (the newest request of the batch speculates on)
        answered_since = self._heard[b.bookie] != armed[1]
        nb = self.planner.speculate(b, answered_since)
        if nb is None:
            if answered_since:  # busy, not hung: look again after another speculative timeout
                self._arm(b)
            return
        self._rivals.add(b, nb)
        self.lh.bk.speculative_reads += 1
        log.debug(
            "ledger=%d: no answer from %s for entries %d..%d in %.1f s: asking %s too",
            self.lh.ledger_id,
            b.bookie,
            b.first,
            b.last,
            self.speculative_timeout_s,
            nb.bookie,
        )
        self._send(nb)

    def _drop(self, b: Batch) -> None:
        """Give up waiting for ``b`` (a speculative rival settled its entries): its answer is never used."""
        conn, rid, timer = self._waiting.pop(b)
        if conn is not None:
            conn.forget(rid)
        if timer is not None:
            timer.cancel()
        self._disarm(b)

    def _on_reply(self, b: Batch, resp: p.ReadRangeSpans | None, exc: BaseException | None) -> None:
        self._heard[b.bookie] += 1
        if b not in self._waiting:  # timed out before (or closed)
            return
        if exc is not None or resp is None:
            code = exc.code if isinstance(exc, E.LedgerError) else type(exc).__name__
            self._answer(b, 0, Outcome.FAILED, code)
            return
        status = resp.status
        if status == p.Status.OK:
            lh = self.lh
            if lh.bk.read_timed_out:
                lh.bk.read_timed_out.pop(b.bookie, None)  # it answers again
            count = b.count
            bounds = resp.bounds if len(resp.bounds) <= 2 * count else resp.bounds[: 2 * count]
            payloads, bad = lh._codec.verify_spans(resp.data, bounds, b.first, b.step, self.rows)
            n = len(payloads)
            self.ready.add(b.first, payloads)
            outcome: Outcome | None = None
            why = ""
            if bad is not None:
                log.error("ledger=%d bookie=%s: %s", lh.ledger_id, b.bookie, bad)
                outcome, why = Outcome.FAILED, "DIGEST_MISMATCH"
            elif n < count:
                outcome = Outcome.SHORT
            self._answer(b, n, outcome, why)
        elif status == p.Status.UNAUTHORIZED:  # (the metadata accepted the password: the bookie is odd)
            self.lh.bk.report_unauthorized(b.bookie, self.lh.ledger_id, "a range read")
            self._answer(b, 0, Outcome.FAILED, status.name)
        elif status in (p.Status.NO_ENTRY, p.Status.NO_LEDGER):
            self._answer(b, 0, Outcome.MISSING, status.name)
        else:
            self._answer(b, 0, Outcome.FAILED, status.name)

    def _answer(self, b: Batch, delivered: int, outcome: Outcome | None, why: str) -> None:
        waiting = self._waiting.pop(b, None)
        if waiting is None or self._closed:
            return
        if waiting[2] is not None:
            waiting[2].cancel()
        self._disarm(b)
        v = self._rivals.on_answer(b, delivered, outcome, why, self._waiting)
        if not v.settles:
            if v.rearm is not None and v.rearm not in self._spec:
                self._arm(v.rearm)
            return
        for r in v.drop:
            self._drop(r)
        for bookie in v.slow:
            self._slow(bookie)
        settled = self.planner.on_answer(b, delivered, outcome, why)
        if settled.unreadable is not None:
            self.unreadable[settled.unreadable.entry_id] = settled.unreadable
        self._send_all(settled.retries)
        if delivered or settled.unreadable is not None or self.fatal is not None:
            self.wake.set()

    def error(self, bad: Unreadable) -> E.LedgerError:
        eid, lid = bad.entry_id, self.lh.ledger_id
        if bad.missing:
            return E.NoSuchEntryError(
                f"entry {eid} not found on any replica: {'; '.join(bad.errors)}", ledger_id=lid, entry_id=eid
            )
        return E.BookieUnavailableError(
            f"entry {eid} unreadable from every replica: {'; '.join(bad.errors)}", ledger_id=lid, entry_id=eid
        )

    def close(self) -> None:
        self._closed = True
        waiting, self._waiting = self._waiting, {}
        for conn, rid, timer in waiting.values():
            if conn is not None:
                conn.forget(rid)
            if timer is not None:
                timer.cancel()
        spec, self._spec = self._spec, {}
        for timer, _ in spec.values():
            timer.cancel()
        _discard(list(self._tasks))


def _discard(tasks: Any) -> None:
    """Cancel prefetched reads nobody will consume (and retrieve the errors of those that already failed)."""
    for t in tasks:
        if t.done():
            if not t.cancelled():
                t.exception()
        else:
            t.cancel()
