"""Connections for batched reads, apart from the writers' connections.

A READ_RANGE answer is large (up to ``ClientConfig.read_batch_bytes``) and arrives in many chunks. On the pool's
``BookieConnection`` every chunk first goes through the add-ack fast paths, which look for ADD_ENTRY responses
over the whole buffered bytes; a connection that carries only reads has none, so ``ReadConnection`` hands its
chunks straight to the frame decoder. Keeping reads off the writers' connections also keeps a reader's big answers
from delaying a writer's acks on the same socket.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from bookie import protocol as p

from .bookie_conn import CONNECT_TIMEOUT_S, BookieConnection, Security, open_connection

RangeCallback = Callable[[p.ReadRangeSpans | None, BaseException | None], None]


class ReadConnection(BookieConnection):
    """A ``BookieConnection`` for requests with callbacks only (no adds). READ_RANGE answers sent by
    ``send_read_range`` reach their callback undecoded (``protocol.decode_read_range``: the entries' spans in the
    received bytes), so the reader verifies each entry where it lies and copies only its payload."""

    def __init__(self, bookie_id: str, auth_token: str | None = None) -> None:
        super().__init__(bookie_id, auth_token=auth_token)
        self._ranges: dict[int, RangeCallback] = {}

    def send_read_range(self, req: p.ReadRangeRequest, cb: RangeCallback) -> None:
        """Send ``req`` (its request id from ``next_id``); ``cb(spans, None)`` or ``cb(None, error)``."""
        if self._closed_error(cb):
            return
        self._ranges[req.request_id] = cb
        self._enqueue(p.encode(req))

    def forget(self, rid: int) -> None:
        self._ranges.pop(rid, None)
        super().forget(rid)

    def data_received(self, data: bytes) -> None:
        decoder = self.decoder
        decoder.feed(data)
        pending = self._pending
        ranges = self._ranges
        range_op = p.OpCode.READ_RANGE
        try:
            for op, flags, rid, buf, a, b in decoder.frames_raw():
                if op == range_op:
                    rcb = ranges.pop(rid, None)
                    if rcb is not None:
                        rcb(p.decode_read_range(rid, buf, a, b), None)
                        continue
                cb = pending.pop(rid, None)
                if cb is not None:  # (else a late answer to a request given up on)
                    cb(p.decode_response(op, flags, rid, memoryview(buf)[a:b]), None)
        except p.ProtocolError as e:
            self._protocol_error(e)

    def _fail_all(self, exc: BaseException) -> None:
        ranges, self._ranges = self._ranges, {}
        super()._fail_all(exc)
        for cb in ranges.values():
            cb(None, exc)

    @property
    def outstanding(self) -> int:
        return super().outstanding + len(self._ranges)


class ReadPool:
    """One ``ReadConnection`` per bookie, opened on first use and replaced when it breaks."""

    def __init__(
        self, connect_timeout_s: float = CONNECT_TIMEOUT_S, security: Security | None = None
    ) -> None:
        self.security = security or Security()
        self._conns: dict[str, ReadConnection] = {}
        self._opening: dict[str, asyncio.Future[ReadConnection]] = {}
        self.connect_timeout_s = connect_timeout_s

    def get_nowait(self, bookie_id: str) -> ReadConnection | None:
        c = self._conns.get(bookie_id)
        return c if c is not None and not c.closed else None

    async def get(self, bookie_id: str) -> ReadConnection:
        c = self.get_nowait(bookie_id)
        if c is not None:
            return c
        fut = self._opening.get(bookie_id)
        if fut is None:
            fut = asyncio.ensure_future(self._open(bookie_id))
            self._opening[bookie_id] = fut
            fut.add_done_callback(functools.partial(self._opened, bookie_id))
        # shielded: one waiter given up (a read that stopped) must not cancel the others' attempt
        return await asyncio.shield(fut)

    async def _open(self, bookie_id: str) -> ReadConnection:
        factory = functools.partial(ReadConnection, bookie_id, self.security.auth_token)
        return await open_connection(factory, bookie_id, self.connect_timeout_s, self.security.tls)

    def _opened(self, bookie_id: str, fut: asyncio.Future[ReadConnection]) -> None:
        if self._opening.get(bookie_id) is fut:
            del self._opening[bookie_id]
        if not fut.cancelled() and fut.exception() is None:  # (retrieves a failure nobody waited for)
            self._conns[bookie_id] = fut.result()

    def close(self) -> None:
        for fut in list(self._opening.values()):
            fut.cancel()
        for c in self._conns.values():
            c.close()
        self._conns.clear()
