"""The bookie's network side: a thin asyncio adapter around ``BookieCore``, plus the admin HTTP app.

One ``BookieConnection`` per client connection: frames are decoded in batches as bytes arrive, each request
goes to the core, and replies are coalesced into one ``transport.write`` per loop iteration. Limits:

* a malformed, oversized or wrong-version frame closes that connection (logged with the peer and reason);
* a partial frame that makes no progress for ``partial_frame_timeout_s`` closes the connection (slow loris);
* back-pressure first: with ``inflight_max / 2`` requests in flight on a connection we stop reading it, and
  resume at ``inflight_max / 4`` (BookKeeper's bookie also stops reading rather than refusing adds); the
  client's socket buffers fill and its writes wait. Only requests beyond ``inflight_max`` that arrived in
  chunks already read are refused with ``TOO_MANY_REQUESTS`` (bounded memory either way);
* when the peer stops reading our replies (transport buffer high), we stop reading its requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from . import protocol as p
from .core import ENTRY_HEAD, AddRow, BookieCore
from .metrics import RateMeter, Registry

log = logging.getLogger("ledgerstore.bookie.server")

DEFAULT_INFLIGHT_MAX = 10_000
DEFAULT_PARTIAL_FRAME_TIMEOUT_S = 30.0

_ADD_BODY = p.struct.Struct(f">Qq{p.MASTER_KEY_LEN}s")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLimits:
    inflight_max: int = DEFAULT_INFLIGHT_MAX
    partial_frame_timeout_s: float = DEFAULT_PARTIAL_FRAME_TIMEOUT_S
    frame_size_max: int = p.FRAME_SIZE_MAX


def error_response(op: int, rid: int, status: p.Status, ledger_id: int = 0, entry_id: int = -1) -> bytes:
    """A reply with a non-OK status for any op (used for overload)."""
    if op == p.OpCode.ADD_ENTRY:
        return p.encode_add_response(rid, status, ledger_id, entry_id)
    if op == p.OpCode.READ_ENTRY:
        msg: p.Response = p.ReadEntryResponse(
            request_id=rid, status=status, ledger_id=ledger_id, entry_id=entry_id
        )
    elif op == p.OpCode.READ_LAC:
        msg = p.ReadLacResponse(request_id=rid, status=status, ledger_id=ledger_id)
    elif op == p.OpCode.WRITE_LAC:
        msg = p.WriteLacResponse(request_id=rid, status=status, ledger_id=ledger_id)
    elif op == p.OpCode.READ_RANGE:
        msg = p.ReadRangeResponse(request_id=rid, status=status, ledger_id=ledger_id, first_entry_id=entry_id)
    else:
        msg = p.BookieInfoResponse(request_id=rid, status=status)
    return p.encode(msg)


class BookieConnection(asyncio.Protocol):
    def __init__(self, server: BookieServer) -> None:
        self.server = server
        self.core = server.core
        self.decoder = p.FrameDecoder(server.limits.frame_size_max)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.inflight = 0
        self._pause_at = max(1, server.limits.inflight_max // 2)
        self._resume_at = self._pause_at // 2
        self._paused_inflight = False  # reading paused: too many requests in flight
        self._paused_writing = False  # reading paused: the peer does not read our replies
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._closed = False
        self._last_progress = time.monotonic()
        self._loop = asyncio.get_running_loop()
        self._watchdog: asyncio.TimerHandle | None = None

    # asyncio callbacks ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have the same methods.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.transport.set_write_buffer_limits(high=8 * 1024 * 1024)
        self.server.connections.add(self)
        self._arm_watchdog()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.connections.discard(self)
        if self._watchdog is not None:
            self._watchdog.cancel()

    def pause_writing(self) -> None:
        self._paused_writing = True
        if self.transport is not None and not self._paused_inflight:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused_writing = False
        if self.transport is not None and not self._closed and not self._paused_inflight:
            self.transport.resume_reading()

    def _done(self, count: int) -> None:
        """``count`` requests answered: resume reading once few enough are in flight."""
        self.inflight -= count
        if self._paused_inflight and self.inflight <= self._resume_at:
            self._paused_inflight = False
            if self.transport is not None and not self._closed and not self._paused_writing:
                self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        dec = self.decoder
        dec.feed(data)
        core = self.core
        server = self.server
        limit = server.limits.inflight_max
        try:
            run = dec.take_add_run(ENTRY_HEAD)  # the whole chunk, when it is a run of same-size adds
            if run is not None:
                self._submit_adds(*run)
                if not dec.buffered:
                    return
            adds: list[AddRow] = []
            unpack_add = _ADD_BODY.unpack_from
            add_body = _ADD_BODY.size
            for op, flags, rid, buf, a, b in dec.frames_raw():
                if op == p.OpCode.ADD_ENTRY:
                    if b - a < add_body:
                        raise p.ProtocolError("ADD_ENTRY: body too short")
                    lid, eid, key = unpack_add(buf, a)
                    adds.append((flags, rid, lid, eid, key, buf[a + add_body : b]))
                    continue
                if adds:
                    self._submit_adds(adds)
                    adds = []
                if self.inflight >= limit:
                    server.overloaded += 1
                    self._write(error_response(op, rid, p.Status.TOO_MANY_REQUESTS))
                    continue
                req = p.decode_request(op, flags, rid, memoryview(buf)[a:b])
                self.inflight += 1
                core.handle(req, self._reply)
            if adds:
                self._submit_adds(adds)
        except p.ProtocolError as e:
            server.malformed += 1
            log.warning(
                "bookie=%s closing connection from %s: malformed frame: %s", core.bookie_id, self.peer, e
            )
            self._abort()
        except Exception:
            log.exception(
                "bookie=%s internal error serving %s; closing that connection", core.bookie_id, self.peer
            )
            self._abort()
        finally:
            self._last_progress = time.monotonic()
            if self.inflight >= self._pause_at and not self._paused_inflight and not self._closed:
                self._paused_inflight = True
                server.backpressure_pauses += 1
                if self.transport is not None and not self._paused_writing:
                    self.transport.pause_reading()

    def _submit_adds(self, rows: list[AddRow], heads: Sequence[tuple[int, int, int]] | None = None) -> None:
        server = self.server
        room = server.limits.inflight_max - self.inflight
        if len(rows) > room:  # over the per-connection bound: refuse the excess, keep the order of the rest
            room = max(0, room)
            server.overloaded += len(rows) - room
            busy = p.Status.TOO_MANY_REQUESTS
            self._write(b"".join([p.encode_add_response(r[1], busy, r[2], r[3]) for r in rows[room:]]))
            rows = rows[:room]
            heads = None if heads is None else heads[:room]
            if not rows:
                return
        n = len(rows)
        self.inflight += n
        server.adds_received += n
        t0 = time.perf_counter()
        hist = server.add_latency

        def reply(frames: bytes, count: int) -> None:
            hist.observe(time.perf_counter() - t0)
            self._write(frames)
            self._done(count)

        self.core.add_entries(rows, reply, heads)

    # replies -------------------------------------------------------------------------------------------
    def _reply(self, frame: bytes) -> None:
        self._write(frame)
        self._done(1)

    def _write(self, frame: bytes) -> None:
        if self._closed:
            return
        self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._closed or self.transport is None:
            self._out.clear()
            return
        out, self._out = self._out, []
        self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    def _abort(self) -> None:
        self._closed = True
        if self.transport is not None:
            self.transport.abort()

    def _arm_watchdog(self) -> None:
        period = max(0.05, self.server.limits.partial_frame_timeout_s / 4)
        self._watchdog = self._loop.call_later(period, self._check_partial)

    def _check_partial(self) -> None:
        if self._closed:
            return
        if self._paused_inflight or self._paused_writing:
            self._last_progress = time.monotonic()  # we stopped reading: the peer is not the slow one
        idle = time.monotonic() - self._last_progress
        if self.decoder.buffered and idle > self.server.limits.partial_frame_timeout_s:
            self.server.slow_closed += 1
            log.warning(
                "bookie=%s closing connection from %s: partial frame (%d bytes) stalled for %.1fs",
                self.core.bookie_id,
                self.peer,
                self.decoder.buffered,
                idle,
            )
            self._abort()
            return
        if not self.decoder.buffered:
            self._last_progress = time.monotonic()
        self._arm_watchdog()

    def close(self) -> None:
        if self.transport is not None and not self._closed:
            self._flush()
            self._closed = True
            self.transport.close()


class BookieServer:
    """Owns the listening socket and the connections; exposes counters for metrics."""

    def __init__(self, core: BookieCore, limits: ServerLimits | None = None) -> None:
        self.core = core
        self.limits = limits or ServerLimits()
        self.connections: set[BookieConnection] = set()
        self.malformed = 0
        self.overloaded = 0
        self.backpressure_pauses = 0
        self.slow_closed = 0
        self.adds_received = 0
        self.add_rate = RateMeter(time.monotonic, lambda: self.adds_received)
        self.metrics = Registry()
        self.add_latency = self.metrics.histogram(
            "bookie_add_latency_seconds",
            "Add latency, receive to reply (fsync included), one observation per group of adds received together",
        )
        self.fsync_latency = self.metrics.histogram(
            "bookie_journal_fsync_seconds", "Journal write+fsync latency"
        )
        self._server: asyncio.AbstractServer | None = None

    async def listen(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: BookieConnection(self), host, port, reuse_address=True
        )

    @property
    def port(self) -> int:
        assert self._server is not None
        sockets = getattr(self._server, "sockets", None) or []
        return int(sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in list(self.connections):
            c.close()
        if self._server is not None:
            await self._server.wait_closed()


# ------------------------------------------------------------------------------------------------------
# Admin HTTP


def admin_app(
    server: BookieServer,
    info: Callable[[], dict[str, Any]],
    gc: Callable[[], Awaitable[dict[str, Any]]] | None = None,
) -> web.Application:
    core = server.core

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "readonly": core.readonly, "bookie_id": core.bookie_id})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=server.metrics.render(), content_type="text/plain", charset="utf-8")

    async def api_info(_: web.Request) -> web.Response:
        return web.json_response(info())

    async def api_ledgers(_: web.Request) -> web.Response:
        rows = [_ledger_row(lid) for lid in sorted(core.ledgers)]
        return web.json_response({"ledgers": rows, "count": len(rows)})

    def _ledger_row(lid: int) -> dict[str, Any]:
        li = core.ledgers[lid]
        return {
            "ledger_id": lid,
            "fenced": li.fenced,
            "lac": li.lac,
            "explicit_lac": li.explicit_lac,
            "last_entry_id": li.last_entry_id,
        }

    async def api_ledger(request: web.Request) -> web.Response:
        try:
            lid = int(request.match_info["id"])
        except ValueError:
            return web.json_response({"error": "ledger id must be an integer"}, status=400)
        if lid not in core.ledgers:
            return web.json_response({"error": f"no ledger {lid} on this bookie"}, status=404)
        return web.json_response(_ledger_row(lid))

    async def api_gc(_: web.Request) -> web.Response:
        if gc is None:
            return web.json_response({"error": "this bookie has no garbage collector"}, status=501)
        return web.json_response(await gc())

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/v1/info", api_info)
    app.router.add_get("/api/v1/ledgers", api_ledgers)
    app.router.add_get("/api/v1/ledgers/{id}", api_ledger)
    app.router.add_put("/api/v1/gc", api_gc)
    return app


def register_core_metrics(server: BookieServer, journal_stats: Callable[[], dict[str, Any]]) -> None:
    core = server.core
    m = server.metrics
    m.counter("bookie_adds_total", "Entries added and acknowledged", lambda: core.stats.adds)
    m.counter("bookie_add_bytes_total", "Bytes of entries acknowledged", lambda: core.stats.add_bytes)
    m.counter(
        "bookie_adds_rejected_total",
        "Adds refused (fenced, unauthorized, read-only, ...)",
        lambda: core.stats.adds_rejected,
    )
    m.gauge(
        "bookie_adds_per_second", "Add requests per second since the previous scrape", server.add_rate.rate
    )
    m.counter("bookie_reads_total", "Read requests served", lambda: core.stats.reads)
    m.counter("bookie_read_bytes_total", "Bytes of entries read", lambda: core.stats.read_bytes)
    m.counter("bookie_fence_requests_total", "Fencing reads", lambda: core.stats.fences)
    m.counter(
        "bookie_storage_read_errors_total",
        "Reads answered INTERNAL because storage failed (a corrupt value, an I/O error)",
        lambda: core.stats.storage_read_errors,
    )
    m.counter(
        "bookie_unauthorized_total", "Requests with a wrong master key", lambda: core.stats.unauthorized
    )
    m.gauge("bookie_ledgers", "Ledgers stored on this bookie", lambda: len(core.ledgers))
    m.gauge("bookie_readonly", "1 when the bookie is read-only", lambda: 1 if core.readonly else 0)
    m.gauge("bookie_connections", "Open client connections", lambda: len(server.connections))
    m.counter(
        "bookie_malformed_frames_total", "Connections closed for a malformed frame", lambda: server.malformed
    )
    m.counter(
        "bookie_overload_rejections_total", "Requests answered TOO_MANY_REQUESTS", lambda: server.overloaded
    )
    m.counter(
        "bookie_backpressure_pauses_total",
        "Times a connection stopped being read because too many of its requests were in flight",
        lambda: server.backpressure_pauses,
    )
    m.counter(
        "bookie_journal_bytes_total", "Bytes written to the journal", lambda: journal_stats().get("bytes", 0)
    )
    m.counter("bookie_journal_syncs_total", "Journal fsyncs", lambda: journal_stats().get("syncs", 0))
