"""One persistent, pipelined connection from a client to a bookie (asyncio), multiplexed by request id.

Requests are written in per-loop-iteration batches; responses resolve futures (or callbacks, on the add fast
path). A connection that breaks fails every outstanding request with ``BookieUnavailableError``; the pool
(``BookiePool``) reconnects on the next use, with a bounded connect timeout.

Ledger handles' adds take a faster path (``send_listened_add``): their request ids come from one client-wide
counter starting at ``ADD_RID_BASE`` (so they never collide with a connection's own ids, which count from 1),
one frame serves every bookie of the write set, and no per-request callback is kept. Their responses go, a
whole received chunk at a time, to the ``AddListener`` registered in the pool for the response's ledger id;
a lost connection is reported to every listener (each knows whether it still waits for that bookie).

Authentication (docs/protocol.md, "AUTH"): with a token, a new connection's first frame is AUTH, written as the
connection opens and not waited for: the requests that follow are pipelined behind it, so connecting costs no
extra round trip. A refusal fails the connection with ``UnauthorizedError`` (every request on it with it). Without
a token nothing is sent, so a client without one still talks to bookies that predate AUTH.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import ssl
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from bookie import protocol as p

from .errors import BookieUnavailableError, UnauthorizedError

log = logging.getLogger("ledgerstore.client.conn")

CONNECT_TIMEOUT_S = 5.0
ResponseCallback = Callable[[p.Response | None, BaseException | None], None]
AddCallback = Callable[[p.Status | None, BaseException | None], None]
_STATUS = {int(s): s for s in p.Status}
_ADD_RESP_BODY = 17  # u8 status, u64 ledger, i64 entry
_ADD_RESP = struct.Struct(">BQq")

#: First request id of the client-wide add counter (``BookiePool.next_add_id``); a connection's own ids count
#: from 1 and never get near it. (``FrameDecoder.take_add_acks`` knows these ids by this bound.)
ADD_RID_BASE = p.LISTENED_RID_MIN

#: An unpacked ADD_ENTRY response frame: (len, version, op, flags, request_id, status, ledger_id, entry_id).
AddRow = tuple[int, int, int, int, int, int, int, int]


#: Unsent bytes on one bookie connection above which its writers wait (see ``AddListener.on_congestion``).
WRITE_BUFFER_HIGH = 16 * 1024 * 1024


class AddListener(Protocol):
    """Receives the add responses of one ledger (request ids >= ``ADD_RID_BASE``) from every connection."""

    def on_add_acks(self, bookie: str, entry_ids: Sequence[int]) -> None:
        """OK responses from ``bookie`` to this listener's adds, for these entry ids (in arrival order)."""

    def on_add_rows(self, bookie: str, rows: list[AddRow]) -> list[AddRow] | None:
        """Handle the rows of this listener's ledger with request ids >= ``ADD_RID_BASE``; return the other
        rows (or None when there are none). May raise ``ProtocolError`` (an unknown status)."""

    def on_bookie_lost(self, bookie: str, exc: BaseException) -> None:
        """A connection to ``bookie`` broke: adds sent on it will never be answered."""

    def on_congestion(self, bookie: str, congested: bool) -> None:
        """The connection to ``bookie`` holds more than ``WRITE_BUFFER_HIGH`` unsent bytes (the bookie reads
        slower than we write), or, with ``congested=False``, no longer does."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Security:
    """How a client's connections to bookies authenticate: a token (AUTH) and TLS, each optional."""

    auth_token: str | None = None
    tls: ssl.SSLContext | None = None


def client_tls_context(ca_file: str) -> ssl.SSLContext:
    """TLS to bookies whose certificates ``ca_file`` (PEM: a CA, or the bookies' own certificates) vouches for;
    the bookie's address must be in its certificate (hostname checking stays on)."""
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def split_address(bookie_id: str) -> tuple[str, int]:
    host, _, port = bookie_id.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bookie address must be HOST:PORT, got {bookie_id!r}")
    return host, int(port)


class BookieConnection(asyncio.Protocol):
    def __init__(
        self, bookie_id: str, listeners: dict[int, AddListener] | None = None, auth_token: str | None = None
    ) -> None:
        self.bookie_id = bookie_id
        self.auth_token = auth_token
        self.auth: p.AuthResponse | None = (
            None  # the bookie's answer to our AUTH (None: none sent or not yet)
        )
        # ledger id -> handle receiving its add responses (shared by the pool's connections)
        self._listeners: dict[int, AddListener] = listeners if listeners is not None else {}
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
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        if self.auth_token:
            rid = self.next_id()
            self._pending[rid] = self._on_auth
            req = p.AuthRequest(
                request_id=rid, method=p.AuthMethod.TOKEN, credential=self.auth_token.encode()
            )
            self.transport.write(p.encode(req))  # first, before anything queued

    def _on_auth(self, resp: p.Response | None, exc: BaseException | None) -> None:
        if exc is not None or resp is None:
            return  # the connection failed; its requests were failed with it
        if not isinstance(resp, p.AuthResponse) or resp.status != p.Status.OK:
            why = resp.status.name if isinstance(resp, p.AuthResponse) else f"a {type(resp).__name__}"
            log.error("bookie=%s refused our token (%s); closing the connection", self.bookie_id, why)
            self._fail_all(UnauthorizedError(f"bookie {self.bookie_id} refused the client's token ({why})"))
            if self.transport is not None:
                self.transport.abort()
            return
        self.auth = resp
        log.debug("bookie=%s authenticated us as %r (mode %s)", self.bookie_id, resp.subject, resp.mode.name)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed and isinstance(self.close_reason, UnauthorizedError):
            return  # failed already, with the reason that matters
        self._fail_all(
            BookieUnavailableError(f"connection to bookie {self.bookie_id} lost: {exc or 'closed'}")
        )

    def pause_writing(self) -> None:
        self._can_write.clear()
        for listener in list(self._listeners.values()):
            listener.on_congestion(self.bookie_id, True)

    def resume_writing(self) -> None:
        self._can_write.set()
        for listener in list(self._listeners.values()):
            listener.on_congestion(self.bookie_id, False)

    def data_received(self, data: bytes) -> None:
        decoder = self.decoder
        decoder.feed(data)
        groups = decoder.take_add_ack_groups()  # the common case: a chunk of OK acks, one ledger or a few
        if groups is not None:
            listeners = self._listeners
            for ledger_id, eids in groups:
                listener = listeners.get(ledger_id)
                if listener is not None:  # (else late answers for a handle that is gone)
                    listener.on_add_acks(self.bookie_id, eids)
            if decoder.buffered < 4:  # nothing more, or not even the next frame's length yet
                return
        rows: list[AddRow] | None = decoder.take_leading_add_responses()
        if rows:
            try:
                first = rows[0]
                if first[4] >= ADD_RID_BASE:  # the common case: one chunk of one ledger handle's acks
                    listener = self._listeners.get(first[6])
                    if listener is not None:
                        rows = listener.on_add_rows(self.bookie_id, rows)
                if rows:
                    self._add_rows(rows)
            except p.ProtocolError as e:
                self._protocol_error(e)
                return
            if decoder.buffered < 4:  # nothing more, or not even the next frame's length yet
                return
        pending = self._pending
        adds = self._pending_adds
        add_op = p.OpCode.ADD_ENTRY
        try:
            for op, flags, rid, buf, a, b in self.decoder.frames_raw():
                if op == add_op and (rid >= ADD_RID_BASE or rid in adds):
                    if b - a != _ADD_RESP_BODY:
                        raise p.ProtocolError("ADD_ENTRY response of wrong size")
                    row = (b - a + 12, p.PROTOCOL_VERSION, op, flags, rid, *_ADD_RESP.unpack_from(buf, a))
                    self._add_rows([row])
                    continue
                cb = pending.pop(rid, None)
                if cb is None:
                    continue  # a late answer to a request we gave up on
                cb(p.decode_response(op, flags, rid, memoryview(buf)[a:b]), None)
        except p.ProtocolError as e:
            self._protocol_error(e)

    def _add_rows(self, rows: list[AddRow]) -> None:
        """ADD_ENTRY responses: the listened ones to their ledger's listener, one call per ledger (many ledgers'
        handles share a connection, so a chunk interleaves their acks); add callbacks and generic requests one
        at a time."""
        adds = self._pending_adds
        pending = self._pending
        listened: dict[int, list[AddRow]] = {}
        for row in rows:
            rid = row[4]
            if rid >= ADD_RID_BASE:
                by_ledger = listened.get(row[6])
                if by_ledger is None:
                    listened[row[6]] = [row]
                else:
                    by_ledger.append(row)
                continue
            st = _STATUS.get(row[5])
            if st is None:
                raise p.ProtocolError(f"unknown status {row[5]}")
            acb = adds.pop(rid, None)
            if acb is not None:
                acb(st, None)
                continue
            cb = pending.pop(rid, None)  # an add sent through the generic request() path
            if cb is not None:
                cb(p.AddEntryResponse(request_id=rid, status=st, ledger_id=row[6], entry_id=row[7]), None)
        for lid, lrows in listened.items():
            listener = self._listeners.get(lid)
            if listener is not None:  # (else late answers for a handle that is gone)
                listener.on_add_rows(self.bookie_id, lrows)

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

    def send_listened_add(self, frame: bytes) -> bool:
        """Fast path for ledger handles: an ADD_ENTRY frame whose request id is >= ``ADD_RID_BASE``; its
        response goes to the listener of its ledger. False (nothing sent) when the connection is closed."""
        if self.closed:
            return False
        self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return True

    def write_listened_adds(self, frames: bytes) -> bool:
        """Like ``send_listened_add`` for several frames at once, written now (no batching)."""
        if self.closed or self.transport is None:
            return False
        self.transport.write(frames)
        return True

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
            raise BookieUnavailableError(
                f"bookie {self.bookie_id} did not answer within {timeout_s}s"
            ) from None
        finally:  # (answered, timed out or cancelled: e.g. a long poll a speculative answer won over)
            self._pending.pop(rid, None)

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
        for listener in list(self._listeners.values()):
            listener.on_bookie_lost(self.bookie_id, exc)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self._flush()
            self.transport.close()
        self._fail_all(BookieUnavailableError(f"connection to bookie {self.bookie_id} closed by client"))


_Conn = TypeVar("_Conn", bound=asyncio.Protocol)


async def open_connection(
    factory: Callable[[], _Conn], bookie_id: str, timeout_s: float, tls: ssl.SSLContext | None
) -> _Conn:
    """A connection to ``bookie_id`` (TLS with ``tls``, checking the certificate names its host), or
    ``BookieUnavailableError`` (refused, timed out, TLS handshake failed)."""
    host, port = split_address(bookie_id)
    loop = asyncio.get_running_loop()
    server_hostname = host if tls is not None else None
    try:
        _, proto = await asyncio.wait_for(
            loop.create_connection(factory, host, port, ssl=tls, server_hostname=server_hostname), timeout_s
        )
    except (OSError, TimeoutError) as e:
        raise BookieUnavailableError(f"cannot connect to bookie {bookie_id}: {e or 'timeout'}") from None
    return proto


async def connect(
    bookie_id: str,
    timeout_s: float = CONNECT_TIMEOUT_S,
    listeners: dict[int, AddListener] | None = None,
    auth_token: str | None = None,
    tls: ssl.SSLContext | None = None,
) -> BookieConnection:
    return await open_connection(
        lambda: BookieConnection(bookie_id, listeners, auth_token), bookie_id, timeout_s, tls
    )


class BookiePool:
    """One connection per bookie, created on first use and replaced when it breaks."""

    def __init__(
        self, connect_timeout_s: float = CONNECT_TIMEOUT_S, security: Security | None = None
    ) -> None:
        self.security = security or Security()
        self._conns: dict[str, BookieConnection] = {}
        self._connecting: dict[str, asyncio.Future[BookieConnection]] = {}
        self.connect_timeout_s = connect_timeout_s
        self.listeners: dict[int, AddListener] = {}  # ledger id -> its writer handle (every connection's)
        #: ``next(pool.add_ids)``: request ids for listened adds, unique on every connection of this pool
        self.add_ids = itertools.count(ADD_RID_BASE)

    def add_listener(self, ledger_id: int, listener: AddListener) -> None:
        """Route add responses for ``ledger_id`` (request ids >= ``ADD_RID_BASE``) to ``listener``."""
        self.listeners[ledger_id] = listener

    def remove_listener(self, ledger_id: int, listener: AddListener) -> None:
        if self.listeners.get(ledger_id) is listener:
            del self.listeners[ledger_id]

    def get_nowait(self, bookie_id: str) -> BookieConnection | None:
        c = self._conns.get(bookie_id)
        return c if c is not None and not c.closed else None

    async def get(self, bookie_id: str) -> BookieConnection:
        c = self._conns.get(bookie_id)
        if c is not None and not c.closed:
            return c
        fut = self._connecting.get(bookie_id)
        if fut is None:
            fut = asyncio.ensure_future(
                connect(
                    bookie_id,
                    self.connect_timeout_s,
                    self.listeners,
                    self.security.auth_token,
                    self.security.tls,
                )
            )
            self._connecting[bookie_id] = fut
            fut.add_done_callback(functools.partial(self._connected, bookie_id))
        # Every caller, the first included, waits behind a shield: one caller cancelled (its own timeout, or a
        # read that stopped waiting for the slower bookies) must not cancel the attempt the others share.
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if fut.cancelled() and (task is None or not task.cancelling()):
                raise BookieUnavailableError(f"connecting to bookie {bookie_id} was cancelled") from None
            raise

    def _connected(self, bookie_id: str, fut: asyncio.Future[BookieConnection]) -> None:
        if self._connecting.get(bookie_id) is fut:
            del self._connecting[bookie_id]
        if not fut.cancelled() and fut.exception() is None:  # (retrieves a failure nobody waited for)
            self._conns[bookie_id] = fut.result()

    async def close(self) -> None:
        for fut in list(self._connecting.values()):
            fut.cancel()
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    def stats(self) -> dict[str, Any]:
        return {b: c.outstanding for b, c in self._conns.items()}
