"""The asyncio side of the broker: one :class:`asyncio.Protocol` per client connection, feeding a Session."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from bookie.server_gate import ConnectionGate

from .service import BrokerService, Session

log = logging.getLogger(__name__)

__all__ = ["BrokerProtocol", "BrokerServer"]


#: Connections at most, in all and from one address: one more is closed on arrival with a log line, so strangers
#: cannot take every file descriptor (the broker's ZooKeeper session and bookie connections need them too).
CONNECTIONS_MAX = 4096
CONNECTIONS_PER_PEER_MAX = 256


class BrokerProtocol(asyncio.Protocol):
    def __init__(self, service: BrokerService, gate: ConnectionGate) -> None:
        self.service = service
        self.gate = gate
        self.session: Session | None = None
        self.host = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.host = str(peer[0]) if peer else "?"
        if not self.gate.admit(self.host):
            cast(asyncio.Transport, transport).abort()
            return
        self.session = Session(self.service, transport, f"{peer[0]}:{peer[1]}" if peer else "?")
        self.service.sessions.add(self.session)

    def data_received(self, data: bytes) -> None:
        if self.session is not None and not self.session.closed:
            self.session.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.session is not None:
            self.gate.release(self.host)
            self.service.sessions.discard(self.session)
            self.session.connection_lost()


class BrokerServer:
    """Binds the Pulsar port and serves it from a started :class:`BrokerService`."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self._server: asyncio.base_events.Server | None = None
        self.gate = ConnectionGate(f"broker={service.config.id}", CONNECTIONS_MAX, CONNECTIONS_PER_PEER_MAX)

    async def start(self) -> None:
        cfg = self.service.config
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: BrokerProtocol(self.service, self.gate), cfg.listen_address, cfg.port, reuse_address=True
        )
        log.info("broker=%s listening on %s:%d", cfg.id, cfg.listen_address, cfg.port)

    @property
    def sockets(self) -> Any:
        return self._server.sockets if self._server else ()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
