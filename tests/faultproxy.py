"""A loopback TCP fault proxy for fault tests: clients talk to the proxy, the proxy to one upstream server.

A bookie is put behind a proxy without changing server code: it listens on its real ``--port`` and registers
under ``--bookie-id 127.0.0.1:<proxy port>``; clients connect to the bookie id, i.e. to the proxy.

Modes (thread-safe, switch at any time):

* ``pass``   — forward both directions.
* ``stall``  — stop forwarding (bytes wait in socket buffers, new connections are accepted but go nowhere); on
  :meth:`FaultProxy.heal` everything flows again, nothing lost — a partition that TCP retransmission survives.
* ``drop``   — reset every connection at once and refuse new ones (accept, then RST) until healed — a partition
  long enough that the connections died.

Every proxy runs on one shared background event-loop thread (:class:`ProxyLoop`), so a test process can own
many proxies cheaply::

    with ProxyLoop() as loop:
        px = FaultProxy(loop, upstream_port=3181).start()
        px.set_mode("drop"); ...; px.heal()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

Mode = Literal["pass", "stall", "drop"]
MODES: tuple[Mode, ...] = ("pass", "stall", "drop")
_T = TypeVar("_T")
_CHUNK = 64 * 1024


class ProxyLoop:
    """One asyncio loop on a daemon thread, shared by many :class:`FaultProxy` objects."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, _T], timeout_s: float = 10.0) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()

    def __enter__(self) -> ProxyLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FaultProxy:
    def __init__(
        self,
        loop: ProxyLoop,
        upstream_port: int,
        upstream_host: str = "127.0.0.1",
        listen_host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self._ploop = loop
        self.upstream = (upstream_host, upstream_port)
        self._sock = socket.create_server((listen_host, port), reuse_port=False)
        self._sock.setblocking(False)
        self.host = listen_host
        self.port: int = self._sock.getsockname()[1]
        self.mode: Mode = "pass"
        self._server: asyncio.AbstractServer | None = None
        self._flowing: asyncio.Event | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.stats = {"connections": 0, "refused": 0, "resets": 0, "bytes": 0}

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # -- control (any thread) ----------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._ploop.run(self._start())
        return self

    def set_mode(self, mode: Mode) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r}")
        self._ploop.run(self._set_mode(mode))

    def partition(self) -> None:
        self.set_mode("drop")

    def stall(self) -> None:
        self.set_mode("stall")

    def heal(self) -> None:
        self.set_mode("pass")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._ploop.run(self._stop())

    # -- loop side -----------------------------------------------------------------------------------------
    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._on_client, sock=self._sock, limit=_CHUNK)

    async def _set_mode(self, mode: Mode) -> None:
        assert self._flowing is not None
        self.mode = mode
        if mode == "pass":
            self._flowing.set()
            return
        self._flowing.clear()
        if mode == "drop":
            self._reset_all()

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._reset_all()
        if self._flowing is not None:
            self._flowing.set()

    def _reset_all(self) -> None:
        conns, self._conns = self._conns, set()
        for w in conns:
            _abort(w)
            self.stats["resets"] += 1

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "drop":
            self.stats["refused"] += 1
            _abort(writer)
            return
        assert self._flowing is not None
        if not self._flowing.is_set():
            # A stalled link: the client's connect succeeded, nothing more happens until heal (or drop).
            self._conns.add(writer)
            await self._flowing.wait()
            self._conns.discard(writer)
            if writer.is_closing():
                _abort(writer)
                return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.upstream, limit=_CHUNK), 5.0
            )
        except (OSError, TimeoutError):
            self.stats["refused"] += 1
            _abort(writer)
            return
        self.stats["connections"] += 1
        self._conns.update((writer, up_writer))
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer)),
            asyncio.ensure_future(self._pump(up_reader, writer)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in pumps:
                t.cancel()
            for w in (writer, up_writer):
                self._conns.discard(w)
                _abort(w)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        flowing = self._flowing
        assert flowing is not None
        try:
            while True:
                data = await src.read(_CHUNK)
                if not data:
                    return
                if not flowing.is_set():
                    await flowing.wait()
                if dst.is_closing():
                    return
                dst.write(data)
                self.stats["bytes"] += len(data)
                await dst.drain()
        except (OSError, ConnectionError):
            return


def _abort(w: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        w.transport.abort()
