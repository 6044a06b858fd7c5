"""The asyncio side of the broker: one :class:`asyncio.Protocol` per client connection, feeding a Session."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Any, cast

from bookie.server_gate import ConnectionGate
from zk.ratelog import RateLimitedLog

from .service import BrokerService, Session
from .tls import client_role

log = logging.getLogger(__name__)

__all__ = ["BrokerProtocol", "BrokerServer"]


#: Connections at most, in all and from one address: one more is closed on arrival with a log line, so strangers
#: cannot take every file descriptor (the broker's ZooKeeper session and bookie connections need them too).
CONNECTIONS_MAX = 4096
CONNECTIONS_PER_PEER_MAX = 256
#: Bytes of partial frames held for all connections: beyond it, a connection holding a partial frame of at least
#: ``_HELD_SMALL`` bytes is not read until the total is below again (a frame may be 5 MiB: 4096 connections each
#: holding one would take 20 GiB). A connection paused so long that it misses the keep-alive is closed by it.
PARTIAL_BYTES_MAX = 256 * 1024 * 1024
_HELD_SMALL = 64 * 1024
#: Unsent bytes of one connection (asyncio's write buffer) over which it is not sent more: its consumers get no
#: more messages and it is not read (its requests would queue answers), until fewer than a quarter of it are left.
#: A peer that does not read costs this, plus the reads in flight for its consumers, whatever its permits.
WRITE_BUFFER_HIGH = 4 * 1024 * 1024
_LOG_PAUSES_EVERY_S = 5.0
#: The TLS port: a handshake not done in this long is cut (a stranger holding connections open, a plaintext client
#: waiting for an answer that never comes)
TLS_HANDSHAKE_TIMEOUT_S = 10.0
_handshake_failures = RateLimitedLog(log, 10.0)


class BrokerProtocol(asyncio.Protocol):
    def __init__(self, service: BrokerService, gate: ConnectionGate, server: BrokerServer) -> None:
        self.service = service
        self.gate = gate
        self.server = server
        self.session: Session | None = None
        self.host = "?"
        self.partial = 0  # bytes of a partial frame counted against the server's PARTIAL_BYTES_MAX
        self.paused = False  # not read: partial frames over PARTIAL_BYTES_MAX
        self.write_paused = False  # not read: its unsent bytes over WRITE_BUFFER_HIGH
        # On the TLS port: called if the protocol is dropped without being connected (a failed handshake)
        self.handshake: weakref.finalize[Any, Any] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.handshake is not None:
            self.handshake.detach()
        peer = transport.get_extra_info("peername")
        self.host = str(peer[0]) if peer else "?"
        if not self.gate.admit(self.host):
            cast(asyncio.Transport, transport).abort()
            return
        self.session = Session(self.service, transport, f"{peer[0]}:{peer[1]}" if peer else "?")
        self.session.conn.tls_role = client_role(transport)  # a verified client certificate's CN, else None
        self.service.sessions.add(self.session)
        cast(asyncio.Transport, transport).set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        self.session.reading_changed = self.update_reading

    def pause_writing(self) -> None:
        self._writing(False)

    def resume_writing(self) -> None:
        self._writing(True)

    def _writing(self, writable: bool) -> None:
        session = self.session
        if session is None or session.closed:
            return
        self.write_paused = not writable
        session.set_writable(writable)
        self.update_reading()

    def update_reading(self) -> None:
        """Read the connection unless it is paused for partial frames, unsent bytes, its producers' SENDs or its
        requests held (``Session.held``)."""
        if self.session is None or self.session.closed:
            return
        if self.paused or self.write_paused or self.session.publish_paused or self.session.held:
            self.session.transport.pause_reading()
        else:
            self.session.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.session is not None and not self.session.closed:
            self.session.data_received(data)
            self.server.account(self, self.session.conn.buffered)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.session is not None:
            self.gate.release(self.host)
            self.server.account(self, 0)
            self.service.sessions.discard(self.session)
            self.session.connection_lost()


class BrokerServer:
    """Binds the Pulsar port and serves it from a started :class:`BrokerService`."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self._server: asyncio.base_events.Server | None = None
        self._tls_server: asyncio.base_events.Server | None = None
        self.tls_handshake_failures = 0
        self.gate = ConnectionGate(f"broker={service.config.id}", CONNECTIONS_MAX, CONNECTIONS_PER_PEER_MAX)
        self.partial_bytes = 0  # bytes of partial frames held for all connections
        self.partial_pauses = 0
        self._waiting: set[BrokerProtocol] = set()
        self._last_pause_log = 0.0

    def account(self, conn: BrokerProtocol, partial: int) -> None:
        """``conn`` now holds ``partial`` bytes of a partial frame: pause it if the total is over the bound, and
        resume the paused ones once it is below again."""
        self.partial_bytes += partial - conn.partial
        conn.partial = partial
        if partial < _HELD_SMALL or conn.session is None or conn.session.closed:
            self._waiting.discard(conn)
        elif self.partial_bytes > PARTIAL_BYTES_MAX and not conn.paused:
            conn.paused = True
            self._waiting.add(conn)
            conn.update_reading()
            self.partial_pauses += 1
            now = time.monotonic()
            if now - self._last_pause_log >= _LOG_PAUSES_EVERY_S:
                self._last_pause_log = now
                log.warning(
                    "broker=%s partial frames hold %d bytes (at most %d): connections holding one wait (%s, ...)",
                    self.service.config.id,
                    self.partial_bytes,
                    PARTIAL_BYTES_MAX,
                    conn.session.peer,
                )
        if self.partial_bytes <= PARTIAL_BYTES_MAX and self._waiting:
            waiting, self._waiting = self._waiting, set()
            for c in waiting:
                c.paused = False
                c.update_reading()

    async def start(self) -> None:
        cfg = self.service.config
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: BrokerProtocol(self.service, self.gate, self),
            cfg.listen_address,
            cfg.port,
            reuse_address=True,
        )
        log.info("broker=%s listening on %s:%d", cfg.id, cfg.listen_address, cfg.port)
        if cfg.tls_port is not None:
            assert self.service.tls is not None  # broker serve refuses a TLS port without its files
            self._tls_server = await loop.create_server(
                self._tls_protocol,
                cfg.listen_address,
                cfg.tls_port,
                reuse_address=True,
                ssl=self.service.tls.context,  # the context in force for each new connection (reloads)
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S,
            )
            log.info("broker=%s listening on %s:%d (TLS)", cfg.id, cfg.listen_address, cfg.tls_port)

    def _tls_protocol(self) -> BrokerProtocol:
        """A connection to the TLS port: served as one of the plaintext port once its handshake is done. The event
        loop closes a connection whose handshake fails (a plaintext client, a client that does not trust the
        certificate, a stranger, a timeout) without a word to its protocol: the protocol, dropped without having
        been connected, says so (one warning line at most per interval, never a traceback)."""
        proto = BrokerProtocol(self.service, self.gate, self)
        proto.handshake = weakref.finalize(proto, self._handshake_failed)
        proto.handshake.atexit = False
        return proto

    def _handshake_failed(self) -> None:
        self.tls_handshake_failures += 1
        cfg = self.service.config
        clients = ""
        if cfg.tls_trust_certs_file:
            required = " (or none, where one is required)" if cfg.tls_require_trusted_client_cert else ""
            clients = f" a client certificate that --tls-trust-certs does not verify{required},"
        _handshake_failures.warning(
            "broker=%s a connection to the TLS port closed before its TLS handshake completed (%d so far): a "
            "plaintext client, a client that does not trust the certificate,%s or a handshake over %g s; said at "
            "most once per 10 s",
            cfg.id,
            self.tls_handshake_failures,
            clients,
            TLS_HANDSHAKE_TIMEOUT_S,
        )

    @property
    def sockets(self) -> Any:
        return self._server.sockets if self._server else ()

    @property
    def tls_sockets(self) -> Any:
        return self._tls_server.sockets if self._tls_server else ()

    async def stop(self) -> None:
        for server in (self._server, self._tls_server):
            if server is not None:
                server.close()
                await server.wait_closed()
