"""One persistent, pipelined connection from a client to a bookie (asyncio), multiplexed by request id.

Requests are written in per-loop-iteration batches; responses resolve futures (or callbacks, on the add fast
path). A connection that breaks fails every outstanding request with ``BookieUnavailableError``; the pool
(``BookiePool``) reconnects on the next use, with a bounded connect timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any, cast

from bookie import protocol as p

from .errors import BookieUnavailableError

log = logging.getLogger("ledgerstore.client.conn")

CONNECT_TIMEOUT_S = 5.0
ResponseCallback = Callable[[p.Response | None, BaseException | None], None]
AddCallback = Callable[[p.Status | None, BaseException | None], None]
_STATUS = {int(s): s for s in p.Status}
_ADD_RESP_BODY = 17  # u8 status, u64 ledger, i64 entry


def split_address(bookie_id: str) -> tuple[str, int]:
    host, _, port = bookie_id.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bookie address must be HOST:PORT, got {bookie_id!r}")
    return host, int(port)


class BookieConnection(asyncio.Protocol):
    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.transport: asyncio.Transport | None = None
        self.decoder = p.FrameDecoder()
        self._pending: dict[int, ResponseCallback] = {}
        self._pending_adds: dict[int, AddCallback] = {}
        self._ids = itertools.count(1)
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()
        self.closed = False
        self.close_reason: BaseException | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()

    # asyncio ---------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have the same methods.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=16 * 1024 * 1024)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(
            BookieUnavailableError(f"connection to bookie {self.bookie_id} lost: {exc or 'closed'}")
        )

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        pending = self._pending
        adds = self._pending_adds
        add_op = p.OpCode.ADD_ENTRY
        rows = self.decoder.take_add_responses()
        if rows is not None:
            statuses = _STATUS
            for row in rows:
                st = statuses.get(row[5])
                if st is None:
                    self._protocol_error(p.ProtocolError(f"unknown status {row[5]}"))
                    return
                acb = adds.pop(row[4], None)
                if acb is not None:
                    acb(st, None)
                    continue
                cb = pending.pop(row[4], None)  # an add sent through the generic request() path
                if cb is not None:
                    cb(
                        p.AddEntryResponse(request_id=row[4], status=st, ledger_id=row[6], entry_id=row[7]),
                        None,
                    )
            return
        try:
            for op, flags, rid, buf, a, b in self.decoder.frames_raw():
                if op == add_op:
                    acb = adds.pop(rid, None)
                    if acb is not None:
                        if b - a != _ADD_RESP_BODY:
                            raise p.ProtocolError("ADD_ENTRY response of wrong size")
                        status = _STATUS.get(buf[a])
                        if status is None:
                            raise p.ProtocolError(f"unknown status {buf[a]}")
                        acb(status, None)
                        continue
                cb = pending.pop(rid, None)
                if cb is None:
                    continue  # a late answer to a request we gave up on
                cb(p.decode_response(op, flags, rid, memoryview(buf)[a:b]), None)
        except p.ProtocolError as e:
            self._protocol_error(e)

    def _protocol_error(self, e: p.ProtocolError) -> None:
        log.warning("bookie=%s sent a malformed frame: %s; closing", self.bookie_id, e)
        self._fail_all(BookieUnavailableError(f"bookie {self.bookie_id} sent a malformed frame: {e}"))
        if self.transport is not None:
            self.transport.abort()

    # sending ---------------------------------------------------------------------------------------
    def next_id(self) -> int:
        return next(self._ids)

    def send_frame(self, rid: int, frame: bytes, cb: ResponseCallback) -> None:
        if self._closed_error(cb):
            return
        self._pending[rid] = cb
        self._enqueue(frame)

    def send_add(self, rid: int, frame: bytes, cb: AddCallback) -> None:
        """Fast path for adds: ``cb(status, None)`` or ``cb(None, error)``."""
        if self._closed_error(cb):
            return
        self._pending_adds[rid] = cb
        self._enqueue(frame)

    def _closed_error(self, cb: Callable[[Any, BaseException | None], None]) -> bool:
        if self.closed:
            cb(
                None,
                self.close_reason or BookieUnavailableError(f"bookie {self.bookie_id} connection closed"),
            )
        return self.closed

    def _enqueue(self, frame: bytes) -> None:
        self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def send(self, build: Callable[[int], p.Request], cb: ResponseCallback) -> int:
        rid = self.next_id()
        self.send_frame(rid, p.encode(build(rid)), cb)
        return rid

    async def request(self, build: Callable[[int], p.Request], timeout_s: float) -> p.Response:
        fut: asyncio.Future[p.Response] = self._loop.create_future()

        def cb(resp: p.Response | None, exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                assert resp is not None
                fut.set_result(resp)

        rid = self.send(build, cb)
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            self._pending.pop(rid, None)
            raise BookieUnavailableError(
                f"bookie {self.bookie_id} did not answer within {timeout_s}s"
            ) from None

    def forget(self, rid: int) -> None:
        self._pending.pop(rid, None)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.closed or self.transport is None:
            return
        out, self._out = self._out, []
        if out:
            self.transport.write(b"".join(out))

    @property
    def outstanding(self) -> int:
        return len(self._pending) + len(self._pending_adds)

    async def drain(self) -> None:
        await self._can_write.wait()

    def _fail_all(self, exc: BaseException) -> None:
        self.closed = True
        self.close_reason = exc
        self._out.clear()
        pending, self._pending = self._pending, {}
        adds, self._pending_adds = self._pending_adds, {}
        for cb in pending.values():
            cb(None, exc)
        for acb in adds.values():
            acb(None, exc)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self._flush()
            self.transport.close()
        self._fail_all(BookieUnavailableError(f"connection to bookie {self.bookie_id} closed by client"))


async def connect(bookie_id: str, timeout_s: float = CONNECT_TIMEOUT_S) -> BookieConnection:
    host, port = split_address(bookie_id)
    loop = asyncio.get_running_loop()
    try:
        _, proto = await asyncio.wait_for(
            loop.create_connection(lambda: BookieConnection(bookie_id), host, port), timeout_s
        )
    except (OSError, TimeoutError) as e:
        raise BookieUnavailableError(f"cannot connect to bookie {bookie_id}: {e or 'timeout'}") from None
    return proto


class BookiePool:
    """One connection per bookie, created on first use and replaced when it breaks."""

    def __init__(self, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self._conns: dict[str, BookieConnection] = {}
        self._connecting: dict[str, asyncio.Future[BookieConnection]] = {}
        self.connect_timeout_s = connect_timeout_s

    def get_nowait(self, bookie_id: str) -> BookieConnection | None:
        c = self._conns.get(bookie_id)
        return c if c is not None and not c.closed else None

    async def get(self, bookie_id: str) -> BookieConnection:
        c = self._conns.get(bookie_id)
        if c is not None and not c.closed:
            return c
        fut = self._connecting.get(bookie_id)
        if fut is None:
            fut = asyncio.ensure_future(connect(bookie_id, self.connect_timeout_s))
            self._connecting[bookie_id] = fut
            try:
                conn = await fut
            finally:
                self._connecting.pop(bookie_id, None)
            self._conns[bookie_id] = conn
            return conn
        return await asyncio.shield(fut)

    async def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    def stats(self) -> dict[str, Any]:
        return {b: c.outstanding for b, c in self._conns.items()}
