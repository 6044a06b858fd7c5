"""The bookie's network side: a thin asyncio adapter around ``BookieCore``, plus the admin HTTP app.

One ``BookieConnection`` per client connection: frames are decoded in batches as bytes arrive, each request
goes to the core, and replies are coalesced into one ``transport.write`` per loop iteration. Limits:

* a malformed, oversized or wrong-version frame closes that connection (logged with the peer and reason);
* a partial frame that makes no progress for ``partial_frame_timeout_s`` closes the connection (slow loris), and
  so does one that arrives slower than ``frame_rate_min`` bytes/s on average after ``frame_grace_s``: a frame of
  S bytes has at most ``frame_grace_s + S / frame_rate_min`` seconds, so a byte every few seconds no longer
  keeps a 5 MiB partial frame alive;
* a connection sending nothing with nothing in flight for ``idle_timeout_s`` is closed;
* at most ``connections_max`` connections, and ``connections_per_peer_max`` from one peer address: one more is
  closed at once with a logged reason (``bookie_connections_refused_total``);
* per connection, requests are decoded and answered only while the replies not yet sent (ours and the
  transport's buffer) are below ``write_buffer_max``: reads whose replies pile up because the peer does not read
  them wait, still undecoded, and the connection is not read meanwhile. Each reply exists once: frames are
  joined only when small, a large one is handed to the transport as it is;
* a global budget, ``inflight_bytes_max`` per bookie, of bytes held on behalf of peers: unsent replies, adds
  between receipt and reply, partial frames. While it is spent, a connection holding any of those is not read
  (it goes on once its own share is zero or the budget has room again); a connection holding nothing is read,
  so an honest client keeps being served while others hold the budget;
* back-pressure first: with ``inflight_max / 2`` requests in flight on a connection we stop reading it, and
  resume at ``inflight_max / 4`` (BookKeeper's bookie also stops reading rather than refusing adds); the
  client's socket buffers fill and its writes wait. Only requests beyond ``inflight_max`` that arrived in
  chunks already read are refused with ``TOO_MANY_REQUESTS`` (bounded memory either way);
* when the peer stops reading our replies (transport buffer high), we stop reading its requests.

Authentication (docs/protocol.md, "AUTH"): a connection's first frame may be AUTH, with a token. With a secret
configured (``ServerAuth.verifier``) a token sent is checked, and a bad one is answered UNAUTHORIZED and the
connection closed; with ``required`` also, any other first frame is answered UNAUTHORIZED and the connection
closed, so a peer without a good token is served nothing. Until the first frame is seen the add fast path is
off (every frame goes through ``_handle_frames``); after it, the gate costs nothing.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from zk.errors import MetadataConnectionError, MetadataError

from . import protocol as p
from .auth import TokenError, TokenVerifier
from .core import ENTRY_HEAD, AddRow, BookieCore
from .metrics import CONTENT_TYPE_LATEST, RateMeter, ServerMetrics
from .server_gate import LOG_REFUSALS_EVERY_S as _LOG_REFUSALS_EVERY_S
from .server_gate import ConnectionGate, refusal_json

log = logging.getLogger("ledgerstore.bookie.server")


class _RefusalLog:
    """Warnings about refusals, at most one line per ``_LOG_REFUSALS_EVERY_S`` (a stranger retrying in a loop
    must not flood the log), each saying how many were not logged since the one before."""

    def __init__(self) -> None:
        self._last = -_LOG_REFUSALS_EVERY_S
        self._unlogged = 0

    def warning(self, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last < _LOG_REFUSALS_EVERY_S:
            self._unlogged += 1
            return
        log.warning(msg + " (%d more since the last such line)", *args, self._unlogged)
        self._last = now
        self._unlogged = 0


DEFAULT_INFLIGHT_MAX = 10_000
DEFAULT_PARTIAL_FRAME_TIMEOUT_S = 30.0
DEFAULT_FRAME_GRACE_S = 5.0
DEFAULT_FRAME_RATE_MIN = 256 * 1024  # bytes/s a started frame must average after the grace
DEFAULT_IDLE_TIMEOUT_S = 900.0
DEFAULT_CONNECTIONS_MAX = 4096
DEFAULT_CONNECTIONS_PER_PEER_MAX = 256
DEFAULT_WRITE_BUFFER_MAX = 8 * 1024 * 1024  # unsent reply bytes per connection before we stop decoding
DEFAULT_INFLIGHT_BYTES_MAX = 128 * 1024 * 1024  # bytes held for peers, whole bookie
_JOIN_MAX = 64 * 1024  # replies up to this size are joined into one write; larger ones are written alone
_HELD_SMALL = 64 * 1024  # a partial frame below this does not count as holding the budget

_ADD_BODY = p.struct.Struct(f">Qq{p.MASTER_KEY_LEN}s")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLimits:
    inflight_max: int = DEFAULT_INFLIGHT_MAX
    partial_frame_timeout_s: float = DEFAULT_PARTIAL_FRAME_TIMEOUT_S
    frame_size_max: int = p.FRAME_SIZE_MAX
    frame_grace_s: float = DEFAULT_FRAME_GRACE_S
    frame_rate_min: int = DEFAULT_FRAME_RATE_MIN  # 0: no minimum rate
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S  # 0: never
    connections_max: int = DEFAULT_CONNECTIONS_MAX
    connections_per_peer_max: int = DEFAULT_CONNECTIONS_PER_PEER_MAX
    write_buffer_max: int = DEFAULT_WRITE_BUFFER_MAX
    inflight_bytes_max: int = DEFAULT_INFLIGHT_BYTES_MAX

    def frame_overdue(self, buffered: int, elapsed_s: float) -> bool:
        """Whether a frame started ``elapsed_s`` ago, of which ``buffered`` bytes arrived, is too slow: it had
        ``frame_grace_s`` plus one second per ``frame_rate_min`` bytes so far (pure; unit-tested)."""
        if not self.frame_rate_min or not buffered:
            return False
        return elapsed_s > self.frame_grace_s + buffered / self.frame_rate_min


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerAuth:
    """The data plane's authentication: ``verifier`` None is auth off (AUTH accepted, nothing checked)."""

    verifier: TokenVerifier | None = None
    required: bool = False  # nothing but AUTH served before a good token (needs a verifier)

    def __post_init__(self) -> None:
        if self.required and self.verifier is None:
            raise ValueError("authentication required without a secret to check tokens with")

    @property
    def mode(self) -> p.AuthMode:
        if self.verifier is None:
            return p.AuthMode.OFF
        return p.AuthMode.REQUIRED if self.required else p.AuthMode.OPTIONAL

    def check(self, req: p.AuthRequest) -> tuple[p.Status, str, str]:
        """(status, verified subject or "", why refused or "") for an AUTH request (pure but for the clock)."""
        if self.verifier is None:
            return p.Status.OK, "", ""
        if req.method == p.AuthMethod.NONE:
            if self.required:
                return p.Status.UNAUTHORIZED, "", "no token (authentication is required)"
            return p.Status.OK, "", ""
        try:
            principal = self.verifier.verify(req.credential)
        except TokenError as e:
            return p.Status.UNAUTHORIZED, "", str(e)
        return p.Status.OK, principal.subject, ""


def server_tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The data plane's TLS: the bookie's certificate chain and key (TLS 1.2 at least; no client certificates:
    clients authenticate with tokens, AUTH)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


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
    elif op == p.OpCode.AUTH:
        msg = p.AuthResponse(request_id=rid, status=status, features=0)
    else:
        msg = p.BookieInfoResponse(request_id=rid, status=status)
    return p.encode(msg)


class BookieConnection(asyncio.Protocol):
    def __init__(self, server: BookieServer) -> None:
        self.server = server
        self.core = server.core
        self.limits = server.limits
        self.decoder = p.FrameDecoder(server.limits.frame_size_max)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.peer_host = "?"
        self.inflight = 0
        self._pause_at = max(1, server.limits.inflight_max // 2)
        self._resume_at = self._pause_at // 2
        self._paused_inflight = False  # reading paused: too many requests in flight
        self._paused_writing = False  # reading paused: the peer does not read our replies
        self._paused_budget = False  # reading paused: the bookie's in-flight byte budget is spent
        self._reading = True
        self._out: list[bytes] = []
        self._out_bytes = 0  # bytes in _out
        self._flush_scheduled = False
        self._closed = False
        self._refused = False
        # frames decoded but not yet handled because our unsent replies reached write_buffer_max
        self._stalled: Iterator[tuple[int, int, int, bytes, int, int]] | None = None
        self._adds_bytes = 0  # bytes of adds received and not yet answered
        self._charged = 0  # what this connection counts against the server's budget now
        now = time.monotonic()
        self._last_progress = now
        self._last_activity = now
        self._frame_started = 0.0  # when the partial frame in the decoder started (0: none)
        self._frame_paused_s = 0.0  # of its time, how long we were not reading for our own reasons
        self._loop = asyncio.get_running_loop()
        self._watchdog: asyncio.TimerHandle | None = None
        # the first frame not seen yet (it may be AUTH; with auth required it must be a good one): the add
        # fast path is off meanwhile
        self._vetting = True
        self.principal = ""  # the verified token's subject ("" while none)

    # asyncio callbacks ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have the same methods.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.peer_host = str(peer[0]) if peer else "?"
        why = self.server.admit(self)
        if why:
            self._refused = True
            self._closed = True
            self.transport.abort()
            return
        high = self.limits.write_buffer_max
        self.transport.set_write_buffer_limits(high=high, low=high // 4)
        self._arm_watchdog()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._stalled = None
        self._out.clear()
        self._out_bytes = 0
        self._adds_bytes = 0
        if not self._refused:
            self.server.release(self)
        self._set_charge(0)
        if self._watchdog is not None:
            self._watchdog.cancel()

    def pause_writing(self) -> None:
        self._paused_writing = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._paused_writing = False
        self._recharge()
        if self._stalled is not None:
            self._loop.call_soon(self._resume_stalled)
        self._update_reading()

    def _update_reading(self) -> None:
        """Read the socket unless one of the reasons not to holds."""
        if self.transport is None or self._closed:
            return
        want = not (
            self._paused_inflight or self._paused_writing or self._paused_budget or self._stalled is not None
        )
        if want != self._reading:
            self._reading = want
            if want:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def _done(self, count: int) -> None:
        """``count`` requests answered: resume reading once few enough are in flight."""
        self.inflight -= count
        if self._paused_inflight and self.inflight <= self._resume_at:
            self._paused_inflight = False
            self._update_reading()

    def data_received(self, data: bytes) -> None:
        dec = self.decoder
        expect = dec.buffered + len(data)
        dec.feed(data)
        self._last_activity = time.monotonic()
        if self._stalled is not None:
            return  # (a chunk the transport had read before it paused) handled after the stalled frames
        try:
            # the whole chunk, when it is a run of same-size adds (once the first frame was vetted)
            run = None if self._vetting else dec.take_add_run(ENTRY_HEAD)
            if run is not None:
                self._submit_adds(*run)
                if not dec.buffered:
                    return
            self._handle_frames(dec.frames_raw())
        except Exception as e:
            self._input_failed(e)
        finally:
            self._after_input(dec.buffered < expect)

    def _input_failed(self, e: Exception) -> None:
        """Close this connection after a malformed frame or an internal error while serving its input."""
        if isinstance(e, p.ProtocolError):
            self.server.malformed += 1
            log.warning(
                "bookie=%s closing connection from %s: malformed frame: %s", self.core.bookie_id, self.peer, e
            )
        else:
            log.error(
                "bookie=%s internal error serving %s; closing that connection",
                self.core.bookie_id,
                self.peer,
                exc_info=e,
            )
        self._abort()

    def _after_input(self, consumed: bool) -> None:
        """After frames were taken from the decoder (``consumed``: at least one whole frame) or bytes added."""
        now = time.monotonic()
        self._last_progress = now
        if self._closed:
            return
        if not self.decoder.buffered:
            self._frame_started = 0.0
        elif consumed or not self._frame_started:  # the partial frame left is a new one
            self._frame_started = now
            self._frame_paused_s = 0.0
        if self.inflight >= self._pause_at and not self._paused_inflight:
            self._paused_inflight = True
            self.server.backpressure_pauses += 1
        self._recharge()
        self._update_reading()

    def _handle_frames(self, frames: Iterator[tuple[int, int, int, bytes, int, int]]) -> None:
        """Handle decoded frames until they run out, or until our unsent replies reach ``write_buffer_max``:
        then the rest wait in ``_stalled`` (already decoded, so they are not lost) and reading stops."""
        server = self.server
        core = self.core
        limit = self.limits.inflight_max
        out_max = self.limits.write_buffer_max
        transport = self.transport
        adds: list[AddRow] = []
        unpack_add = _ADD_BODY.unpack_from
        add_body = _ADD_BODY.size
        for op, flags, rid, buf, a, b in frames:
            if self._vetting and not self._vet(op, flags, rid, buf, a, b):
                return  # refused and closing
            if op == p.OpCode.ADD_ENTRY:
                if b - a < add_body:
                    raise p.ProtocolError("ADD_ENTRY: body too short")
                lid, eid, key = unpack_add(buf, a)
                adds.append((flags, rid, lid, eid, key, buf[a + add_body : b]))
                continue
            if adds:
                self._submit_adds(adds)
                adds = []
            if op == p.OpCode.AUTH:
                if not self._authed_now:  # AUTH after other requests, or a second one: not allowed
                    self._refuse_auth(rid, p.Status.BAD_REQUEST, "AUTH that is not the first frame")
                    return
                self._authed_now = False
                continue
            if self.inflight >= limit:
                server.overloaded += 1
                self._write(error_response(op, rid, p.Status.TOO_MANY_REQUESTS))
                continue
            req = p.decode_request(op, flags, rid, memoryview(buf)[a:b])
            self.inflight += 1
            core.handle(req, self._reply)
            if self._closed:
                return
            if transport is not None and self._out_bytes + transport.get_write_buffer_size() > out_max:
                self._stalled = frames
                server.write_stalls += 1
                break
        if adds:
            self._submit_adds(adds)

    _authed_now = False  # the frame just vetted was the AUTH that opened the connection

    def _vet(self, op: int, flags: int, rid: int, buf: bytes, a: int, b: int) -> bool:
        """The connection's first frame: an AUTH is checked and answered here; any other is let through
        unless authentication is required. False: refused, the connection is closing."""
        self._vetting = False
        auth = self.server.auth
        if op != p.OpCode.AUTH:
            if auth.required:
                self._refuse_auth(rid, p.Status.UNAUTHORIZED, f"op {op} before AUTH", op=op)
                return False
            return True
        req = p.decode_request(op, flags, rid, memoryview(buf)[a:b])
        assert isinstance(req, p.AuthRequest)
        status, subject, why = auth.check(req)
        if status != p.Status.OK:
            self._refuse_auth(rid, status, why)
            return False
        self.principal = subject
        self._authed_now = True
        self.server.auth_ok += 1
        if subject:
            log.debug(
                "bookie=%s connection from %s authenticated as %r", self.core.bookie_id, self.peer, subject
            )
        resp = p.AuthResponse(request_id=rid, status=p.Status.OK, mode=auth.mode, subject=subject)
        self._write(p.encode(resp))
        return True

    def _refuse_auth(self, rid: int, status: p.Status, why: str, op: int = p.OpCode.AUTH) -> None:
        """Answer ``status`` to the frame, close the connection once the answer is written, serve nothing more."""
        self.server.note_auth_refusal(self.peer, why)
        if op == p.OpCode.AUTH:
            frame = p.encode(p.AuthResponse(request_id=rid, status=status, mode=self.server.auth.mode))
        else:
            frame = error_response(op, rid, status)
        self._write(frame)
        self._flush()
        self._closed = True
        self._stalled = None
        if self.transport is not None:
            self.transport.close()  # (the reply already handed to the transport is still sent)

    def _resume_stalled(self) -> None:
        """Our replies drained: handle the frames that waited, then what arrived meanwhile."""
        frames = self._stalled
        if frames is None or self._closed or self.transport is None:
            return
        if self._out_bytes + self.transport.get_write_buffer_size() > self.limits.write_buffer_max:
            return  # not yet: resume_writing calls again
        self._stalled = None
        try:
            self._handle_frames(frames)
            if self._stalled is None and self.decoder.buffered:
                self._handle_frames(self.decoder.frames_raw())
        except Exception as e:
            self._input_failed(e)
        finally:
            self._after_input(True)

    def _submit_adds(self, rows: list[AddRow], heads: Sequence[tuple[int, int, int]] | None = None) -> None:
        server = self.server
        room = self.limits.inflight_max - self.inflight
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
        nbytes = n * len(rows[0][5]) if heads is not None else sum(map(len, map(_ENTRY_OF, rows)))
        self.inflight += n
        self._adds_bytes += nbytes
        server.adds_received += n
        t0 = time.perf_counter()
        hist = server.add_latency

        def reply(frames: bytes, count: int) -> None:
            hist.observe(time.perf_counter() - t0)
            self._adds_bytes -= nbytes
            self._write(frames)
            self._done(count)

        self.core.add_entries(rows, reply, heads)

    # the in-flight byte budget ---------------------------------------------------------------------------
    def _holding(self) -> int:
        out = self._out_bytes
        if self.transport is not None and not self._closed:
            out += self.transport.get_write_buffer_size()
        buffered = self.decoder.buffered
        return out + self._adds_bytes + (buffered if buffered >= _HELD_SMALL else 0)

    def _recharge(self) -> None:
        self._set_charge(self._holding())

    def _set_charge(self, amount: int) -> None:
        server = self.server
        if amount != self._charged:
            server.held_bytes += amount - self._charged
            self._charged = amount
        over = server.held_bytes > self.limits.inflight_bytes_max
        if over and amount and not self._paused_budget and not self._closed:
            self._paused_budget = True
            server.budget_pauses += 1
            server.budget_waiting.add(self)
            self._update_reading()
        elif self._paused_budget and (not amount or not over):
            self._paused_budget = False
            server.budget_waiting.discard(self)
            self._update_reading()
        if not over and server.budget_waiting:
            server.wake_budget_waiters()

    # replies -------------------------------------------------------------------------------------------
    def _reply(self, frame: bytes) -> None:
        self._write(frame)
        self._done(1)

    def _write(self, frame: bytes) -> None:
        if self._closed:
            return
        self._out.append(frame)
        self._out_bytes += len(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._closed or self.transport is None:
            self._out.clear()
            self._out_bytes = 0
            return
        out, self._out = self._out, []
        total, self._out_bytes = self._out_bytes, 0
        write = self.transport.write
        if len(out) == 1:
            write(out[0])
        elif total <= _JOIN_MAX:
            write(b"".join(out))
        else:  # never a second copy of large replies: small ones joined, large ones written as they are
            small: list[bytes] = []
            for frame in out:
                if len(frame) > _JOIN_MAX:
                    if small:
                        write(b"".join(small) if len(small) > 1 else small[0])
                        small = []
                    write(frame)
                else:
                    small.append(frame)
            if small:
                write(b"".join(small) if len(small) > 1 else small[0])
        del out
        self._recharge()
        if self._stalled is not None and not self._paused_writing:
            self._resume_stalled()

    def _abort(self) -> None:
        self._closed = True
        if self.transport is not None:
            self.transport.abort()

    def _arm_watchdog(self) -> None:
        period = min(1.0, max(0.05, self.limits.partial_frame_timeout_s / 4))  # (as in _check_partial)
        self._watchdog = self._loop.call_later(period, self._check_partial)

    def _close_for(self, counter: str, why: str, *args: object) -> None:
        setattr(self.server, counter, getattr(self.server, counter) + 1)
        log.warning("bookie=%s closing connection from %s: " + why, self.core.bookie_id, self.peer, *args)
        self._abort()

    def _check_partial(self) -> None:
        if self._closed:
            return
        now = time.monotonic()
        limits = self.limits
        period = min(1.0, max(0.05, limits.partial_frame_timeout_s / 4))
        if self._stalled is not None and not self._paused_writing:
            self._resume_stalled()
            if self._closed:
                return
        if self._paused_inflight or self._paused_writing or self._stalled is not None:
            self._last_progress = now  # we stopped reading: the peer is not the one that makes no progress
        if self._paused_inflight or (self._stalled is not None and not self._paused_writing):
            # paused for our own reasons (the journal is slow): neither the frame's clock nor idleness runs
            self._last_activity = now
            if self._frame_started:
                self._frame_paused_s += min(now - self._frame_started, period)
        idle = now - self._last_progress
        buffered = self.decoder.buffered
        if buffered and idle > limits.partial_frame_timeout_s:
            self._close_for("slow_closed", "partial frame (%d bytes) stalled for %.1fs", buffered, idle)
            return
        if buffered and self._frame_started:
            elapsed = now - self._frame_started - self._frame_paused_s
            if limits.frame_overdue(buffered, elapsed):
                self._close_for(
                    "slow_closed",
                    "partial frame too slow (%d bytes in %.1fs; at least %d B/s after %.0fs)",
                    buffered,
                    elapsed,
                    limits.frame_rate_min,
                    limits.frame_grace_s,
                )
                return
        if (
            limits.idle_timeout_s
            and not self.inflight
            and not buffered
            and now - self._last_activity > limits.idle_timeout_s
        ):
            self._close_for("idle_closed", "idle for %.0fs", now - self._last_activity)
            return
        if not buffered:
            self._last_progress = now
        self._recharge()  # the transport's buffer drains without telling us until it is low
        self._arm_watchdog()

    def close(self) -> None:
        if self.transport is not None and not self._closed:
            self._flush()
            self._closed = True
            self.transport.close()


def _entry_of(row: AddRow) -> bytes:
    return row[5]


_ENTRY_OF = _entry_of


class BookieServer:
    """Owns the listening socket and the connections; exposes counters for metrics."""

    def __init__(
        self, core: BookieCore, limits: ServerLimits | None = None, auth: ServerAuth | None = None
    ) -> None:
        self.core = core
        self.limits = limits or ServerLimits()
        self.auth = auth or ServerAuth()
        self.auth_ok = 0  # AUTH requests accepted
        self.auth_refused = 0  # connections refused by the AUTH step
        self.admin_refused = 0  # admin HTTP requests refused for want of a good token
        self._auth_log = _RefusalLog()
        self._admin_log = _RefusalLog()
        self.connections: set[BookieConnection] = set()
        self.gate = ConnectionGate(
            f"bookie={core.bookie_id}",
            self.limits.connections_max,
            self.limits.connections_per_peer_max,
            flags=("--connections-max", "--connections-per-peer-max"),
        )
        self.malformed = 0
        self.overloaded = 0
        self.backpressure_pauses = 0
        self.slow_closed = 0
        self.idle_closed = 0
        self.write_stalls = 0
        self.budget_pauses = 0
        self.held_bytes = 0  # bytes held for peers (the in-flight byte budget's use)
        self.budget_waiting: set[BookieConnection] = set()
        self.adds_received = 0
        self.add_rate = RateMeter(time.monotonic, lambda: self.adds_received)
        self.metrics = ServerMetrics()
        self.add_latency = self.metrics.histogram(
            "bookie_add_latency_seconds",
            "Add latency, receive to reply (fsync included), one observation per group of adds received together",
        )
        self.fsync_latency = self.metrics.histogram(
            "bookie_journal_fsync_seconds",
            "Journal fdatasync latency per batch (not the write before it: a write that waited on the disk "
            "shows in bookie_add_latency_seconds)",
        )
        self._server: asyncio.AbstractServer | None = None

    @property
    def refused_connections(self) -> int:
        """Connections closed on arrival: ``connections_max`` or ``connections_per_peer_max`` reached."""
        return self.gate.refused

    def admit(self, conn: BookieConnection) -> str:
        """Take a new connection in, or say why not (the caller closes it)."""
        why = self.gate.refusal(conn.peer_host)
        if not why:
            self.connections.add(conn)
        return why

    def note_auth_refusal(self, peer: str, why: str) -> None:
        """Count a refusal and log it, at most one line per ``_LOG_REFUSALS_EVERY_S`` (a stranger retrying in
        a loop must not flood the log)."""
        self.auth_refused += 1
        self._auth_log.warning(
            "bookie=%s refusing connection from %s: unauthenticated: %s", self.core.bookie_id, peer, why
        )

    def note_admin_refusal(self, method: str, path: str, peer: str | None, why: str) -> None:
        """Count an admin HTTP request refused for want of a good token and log it, at most one line per
        ``_LOG_REFUSALS_EVERY_S`` (as :meth:`note_auth_refusal`; the path as a Python literal, so that a
        stranger's ``%0A`` writes no line of its own)."""
        self.admin_refused += 1
        self._admin_log.warning(
            "bookie=%s admin %s %r from %s refused: %s", self.core.bookie_id, method, path, peer, why
        )

    def release(self, conn: BookieConnection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            self.gate.release(conn.peer_host)
        self.budget_waiting.discard(conn)

    def wake_budget_waiters(self) -> None:
        """The budget has room again: let the connections waiting for it be read."""
        waiting, self.budget_waiting = self.budget_waiting, set()
        for c in waiting:
            c._paused_budget = False
            c._update_reading()

    async def listen(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        """Serve on ``host:port``; with ``tls`` every connection is TLS (no plaintext beside it)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: BookieConnection(self), host, port, reuse_address=True, ssl=tls
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


#: ``--admin-read-auth``: which read-only endpoints need a token too (mutating ones always do, given a secret)
ADMIN_READ_AUTH = ("none", "api", "all")
_OPEN_PATHS = frozenset({"/health", "/heartbeat", "/metrics"})


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminAuth:
    """Admin HTTP authentication: with a ``verifier`` (a secret), requests that change state need
    ``Authorization: Bearer <token>``; ``read`` says which read-only ones do too: ``none``, ``api``
    (``/api/...``) or ``all`` (``/health`` and ``/metrics`` as well)."""

    verifier: TokenVerifier | None = None
    read: str = "none"

    def __post_init__(self) -> None:
        if self.read not in ADMIN_READ_AUTH:
            raise ValueError(f"admin read auth must be one of {ADMIN_READ_AUTH}, got {self.read!r}")

    def needs_token(self, method: str, path: str) -> bool:
        if self.verifier is None:
            return False
        if method not in ("GET", "HEAD", "OPTIONS"):
            return True
        if self.read == "all":
            return True
        return self.read == "api" and path not in _OPEN_PATHS

    def check(self, method: str, path: str, authorization: str | None) -> str:
        """Why the request is refused ("" when it may go on)."""
        if not self.needs_token(method, path):
            return ""
        assert self.verifier is not None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return "this endpoint needs Authorization: Bearer <token>"
        try:
            self.verifier.verify(token.strip())
        except TokenError as e:
            return str(e)
        return ""


def admin_app(
    server: BookieServer,
    info: Callable[[], dict[str, Any]],
    gc: Callable[[Callable[[], bool]], Awaitable[dict[str, Any]]] | None = None,
    failure: Callable[[], str] = lambda: "",
    auth: AdminAuth | None = None,
    starting: Callable[[], str] = lambda: "",
) -> web.Application:
    """``gc(caller_gone)`` runs a GC round; ``failure()`` says why the bookie failed ("" while it has not);
    ``auth``: which requests need a token (none without a secret); ``starting()`` says what the bookie still does
    before it is ready ("" once it is): ``/health`` answers 503 until then, so a caller waiting for a healthy
    bookie does not find one that clients cannot see yet (not registered in ZooKeeper)."""
    core = server.core
    admin_auth = auth or AdminAuth()

    @web.middleware
    async def authenticate(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        why = admin_auth.check(request.method, request.path, request.headers.get("Authorization"))
        if why:
            server.note_admin_refusal(request.method, request.path, request.remote, why)
            return web.json_response(
                {"error": f"unauthorized: {why}"}, status=401, headers={"WWW-Authenticate": "Bearer"}
            )
        return await handler(request)

    async def health(_: web.Request) -> web.Response:
        failed = failure()
        if failed:
            body = {"status": "failed", "reason": failed, "readonly": True, "bookie_id": core.bookie_id}
            return web.json_response(body, status=503)
        pending = starting()
        if pending:
            body = {
                "status": "starting",
                "reason": pending,
                "readonly": core.readonly,
                "bookie_id": core.bookie_id,
            }
            return web.json_response(body, status=503)
        return web.json_response({"status": "ok", "readonly": core.readonly, "bookie_id": core.bookie_id})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=server.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

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

    async def api_gc(request: web.Request) -> web.Response:
        if gc is None:
            return web.json_response({"error": "this bookie has no garbage collector"}, status=501)

        def caller_gone() -> bool:
            transport = request.transport
            return transport is None or transport.is_closing()

        return web.json_response(await gc(caller_gone))

    @web.middleware
    async def metadata_errors(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """ZooKeeper away (or refusing) is an answer with the reason, not a 500 page and a traceback in the log;
        the HTTP server's own refusals (no such route, a method the route does not take) are JSON ``{"error"}``
        as every other answer, not aiohttp's text ("404: Not Found")."""
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            return refusal_json(e, "error")
        except MetadataError as e:
            status = 503 if isinstance(e, MetadataConnectionError) else 500
            log.warning(
                "bookie=%s admin %s %s: %d: ZooKeeper: %s",
                core.bookie_id,
                request.method,
                request.path,
                status,
                e,
            )
            return web.json_response({"error": f"ZooKeeper: {e}", "code": e.code}, status=status)

    app = web.Application(middlewares=[authenticate, metadata_errors])
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
    m.counter("bookie_auth_ok_total", "AUTH requests accepted", lambda: server.auth_ok)
    m.counter(
        "bookie_auth_refused_total",
        "Connections refused by the AUTH step (bad or expired token, or a request before AUTH when required)",
        lambda: server.auth_refused,
    )
    m.counter(
        "bookie_admin_unauthorized_total",
        "Admin HTTP requests refused for want of a good token",
        lambda: server.admin_refused,
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
        "bookie_slow_frames_closed_total",
        "Connections closed for a partial frame that stalled or arrived slower than --frame-rate-min-kib",
        lambda: server.slow_closed,
    )
    m.counter(
        "bookie_idle_closed_total", "Connections closed after --idle-timeout-s", lambda: server.idle_closed
    )
    m.counter(
        "bookie_connections_refused_total",
        "Connections closed on arrival: --connections-max or --connections-per-peer-max reached",
        lambda: server.refused_connections,
    )
    m.counter(
        "bookie_write_stalls_total",
        "Times a connection's requests waited because its unsent replies reached --connection-write-buffer-mb",
        lambda: server.write_stalls,
    )
    m.gauge(
        "bookie_inflight_bytes",
        "Bytes held for peers: unsent replies, adds not yet answered, partial frames (--inflight-bytes-max-mb)",
        lambda: server.held_bytes,
    )
    m.counter(
        "bookie_inflight_budget_pauses_total",
        "Times a connection was not read because the bookie's in-flight byte budget was spent",
        lambda: server.budget_pauses,
    )
    m.counter(
        "bookie_journal_bytes_total", "Bytes written to the journal", lambda: journal_stats().get("bytes", 0)
    )
    m.counter("bookie_journal_syncs_total", "Journal fsyncs", lambda: journal_stats().get("syncs", 0))
    m.counter(
        "bookie_journal_inline_syncs_total",
        "Journal batches written and fsynced on the event loop's thread (the idle path, no thread hand-off)",
        lambda: journal_stats().get("inline_syncs", 0),
    )
    m.counter(
        "bookie_journal_direct_writes_total",
        "Journal batches written with O_DIRECT, bypassing the page cache (--no-journal-direct-io: none)",
        lambda: journal_stats().get("direct_writes", 0),
    )
    m.counter(
        "bookie_journal_preallocated_bytes_total",
        "Zeros an idle journal wrote ahead of its records",
        lambda: journal_stats().get("preallocated_bytes", 0),
    )
