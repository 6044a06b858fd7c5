"""A listener's connection caps, in all and per peer address, and aiohttp served behind them (admin HTTP): light
to import, so the broker uses them too without the bookie's storage."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, NamedTuple, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from zk.ratelog import LOG_EVERY_S, RateLimitedLog

log = logging.getLogger("ledgerstore.bookie.server")

LOG_REFUSALS_EVERY_S = (
    5.0  # refusals are logged at most this often (a stranger in a loop must not flood the log)
)


class ConnectionGate:
    """Counts a listener's connections, in all and per peer host, and refuses one more beyond either cap with a
    log line (at most one per ``LOG_REFUSALS_EVERY_S``) headed by ``name``; ``refused`` counts refusals.
    ``flags``: the command-line options that set the two caps, named in the reasons instead of "at most"."""

    def __init__(
        self, name: str, connections_max: int, per_peer_max: int, flags: tuple[str, str] | None = None
    ) -> None:
        self.name = name
        self.connections_max = connections_max
        self.per_peer_max = per_peer_max
        self.flags = flags
        self.open = 0
        self.per_peer: dict[str, int] = {}
        self.refused = 0
        self._last_log = 0.0
        self._unlogged = 0

    def admit(self, host: str) -> bool:
        return not self.refusal(host)

    def refusal(self, host: str) -> str:
        """Take a connection from ``host`` in (""), or count, log and return why not (the caller closes it)."""
        why = ""
        if self.open >= self.connections_max:
            cap = f"{self.flags[0]} " if self.flags else "at most "
            why = f"{self.open} connections open ({cap}{self.connections_max})"
        elif self.per_peer.get(host, 0) >= self.per_peer_max:
            cap = (
                f"{self.flags[1]} {self.per_peer_max}"
                if self.flags
                else f"at most {self.per_peer_max} from one address"
            )
            why = f"{self.per_peer[host]} connections from {host} ({cap})"
        if not why:
            self.open += 1
            self.per_peer[host] = self.per_peer.get(host, 0) + 1
            return ""
        self.refused += 1
        now = time.monotonic()
        if now - self._last_log >= LOG_REFUSALS_EVERY_S:
            log.warning(
                "%s: refusing connection from %s: %s (%d more refused since the last such line)",
                self.name,
                host,
                why,
                self._unlogged,
            )
            self._last_log = now
            self._unlogged = 0
        else:
            self._unlogged += 1
        return why

    def release(self, host: str) -> None:
        self.open -= 1
        left = self.per_peer.get(host, 1) - 1
        if left > 0:
            self.per_peer[host] = left
        else:
            self.per_peer.pop(host, None)


#: Admin HTTP connections: at most this many at once, and this many from one peer address; one more is closed
#: on arrival (logged), so strangers holding connections cannot take the process's file descriptors, which the
#: journal and storage need. A connection with no request under way for ``HTTP_IDLE_TIMEOUT_S`` (one that sends
#: nothing, or only part of a request head) is closed (aiohttp's keep-alive timeout, an hour by default).
HTTP_CONNECTIONS_MAX = 512
HTTP_CONNECTIONS_PER_PEER_MAX = 64
HTTP_IDLE_TIMEOUT_S = 30.0
#: A connection whose answer the client has not read any of for this long (its send buffer full all that while)
#: is closed: a stranger that asks for a large answer (a peeked message) and never reads held its connection, and
#: the handler writing to it, for ever.
HTTP_WRITE_STALL_S = HTTP_IDLE_TIMEOUT_S


class PortProblems(NamedTuple):
    """What :func:`port_problems` found: ``in_use``, the ports another process listens on, as ``"port N (--flag)"``;
    ``unbindable``, those a listener could not bind for another reason (an address this host does not have, a port
    below 1024 without the privilege), as ``"port N (--flag): why"``."""

    in_use: list[str]
    unbindable: list[str]


def port_problems(host: str | None, ports: dict[str, int]) -> PortProblems:
    """The ``ports`` (flag -> port) a server's listener could not bind at ``host`` (None: every address), each
    tried once with a bind as the listener makes it (SO_REUSEADDR), closed at once, and split by the error: in use
    by another process (EADDRINUSE), or unbindable for another reason."""
    in_use: list[str] = []
    unbindable: list[str] = []
    for flag, port, e in _bind_failures(host, ports):
        if e.errno == errno.EADDRINUSE:
            in_use.append(f"port {port} ({flag})")
        else:
            unbindable.append(f"port {port} ({flag}): {e.strerror or e}")
    return PortProblems(in_use, unbindable)


def _bind_failures(host: str | None, ports: dict[str, int]) -> list[tuple[str, int, OSError]]:
    """(flag, port, the error) of each of ``ports`` a bind at ``host`` fails for (its first failing address, or
    the look-up of a host name that does not resolve)."""
    failed: list[tuple[str, int, OSError]] = []
    for flag, port in ports.items():
        if port == 0:
            continue
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except OSError as e:
            failed.append((flag, port, e))
            continue
        for family, kind, proto, _, addr in infos:
            with socket.socket(family, kind, proto) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(addr)
                except OSError as e:
                    failed.append((flag, port, e))
                    break
    return failed


def ports_given_twice(ports: dict[str, int]) -> list[str]:
    """The ``ports`` (flag -> port) given to more than one listener, as ``"port N given to both --a and --b"``:
    :func:`port_problems` tries each alone, so such a port passed, and the second listener's bind failed only
    after the server had written what names it (a bookie's cookie, a broker's registration)."""
    flags: dict[int, list[str]] = {}
    for flag, port in ports.items():
        if port != 0:
            flags.setdefault(port, []).append(flag)
    return [
        f"port {port} given to {'both ' if len(fs) == 2 else ''}{', '.join(fs[:-1])} and {fs[-1]}"
        for port, fs in flags.items()
        if len(fs) > 1
    ]


def raise_open_files_limit(needed: int, what: str) -> int:
    """Raise this process's soft limit of open files to its hard limit, as the JVM does for BookKeeper's and
    Pulsar's processes (``-XX:+MaxFDLimit``, on by default): the usual soft default of 1024 is below the connection
    caps, and strangers holding that many idle connections left no descriptor to accept a client with, or to reach
    a bookie or ZooKeeper (1250 CONNECTed connections from 5 addresses: a client's producer timed out, nothing
    logged). A warning when the limit stays under ``needed`` (the caps and room for the rest). Returns the limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    target = max(soft, needed) if hard == infinite else hard
    if soft != infinite and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("%s: open files limit %d not raised to %d: %s", what, soft, target, e)
    if soft != infinite and soft < needed:
        log.warning(
            "%s: at most %d open files, fewer than its connection caps need (%d): connections beyond them are "
            "not accepted while others are open (raise it: ulimit -n)",
            what,
            soft,
            needed,
        )
    return soft


#: Descriptors left free under the soft limit below which :class:`OpenFilesWatch` warns: a server at its limit
#: cannot accept a connection (libuv accepts it on a spare descriptor and closes it at once, saying nothing).
OPEN_FILES_SPARE = 16


class OpenFilesWatch:
    """Whether the process is (nearly) out of file descriptors, checked by a server's one-second loop: a broker or
    bookie at its ``ulimit -n`` drops every new connection unanswered (the client sees it connect and close, and a
    pulsar-client retries until its operation timeout) and logged nothing; now a warning, at most one a minute
    while it lasts. ``/metrics`` has ``process_open_fds`` and ``process_max_fds`` (bookie/metrics.py)."""

    def __init__(self, what: str, *, fd_dir: str = "/proc/self/fd") -> None:
        self.what = what
        self.fd_dir = fd_dir
        self._said = RateLimitedLog(log, LOG_EVERY_S)

    def check(self) -> int | None:
        """The descriptors in use (None where /proc cannot tell), with the warning when few are left."""
        import os
        import resource

        try:
            used = len(os.listdir(self.fd_dir))
        except OSError:  # no /proc here, or out of descriptors for the listing itself: the limit is reached
            used = None
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return used
        if used is None or used >= soft - OPEN_FILES_SPARE:
            self._said.warning(
                "%s: %s of its %d open files in use: new connections are closed unanswered until some close "
                "(raise the limit, ulimit -n, or find who holds them)",
                self.what,
                "all" if used is None else used,
                soft,
            )
        else:
            self._said.reset()
        return used


class _GatedHttpConnection(asyncio.Protocol):
    """aiohttp's handler for one connection, behind the gate: refused ones never reach it."""

    def __init__(
        self, gate: ConnectionGate, handler: Callable[[], asyncio.Protocol], write_stall_s: float
    ) -> None:
        self.gate = gate
        self._handler = handler
        self.inner: asyncio.Protocol | None = None  # the handler, once admitted
        self.host = "?"
        self._write_stall_s = write_stall_s
        self._transport: asyncio.Transport | None = None
        self._stalled: asyncio.TimerHandle | None = None  # closes the connection unless writing resumes

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if peer else "?"
        if not self.gate.admit(host):
            cast(asyncio.Transport, transport).abort()
            return
        self.host = host
        self._transport = cast(asyncio.Transport, transport)
        self.inner = self._handler()
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_stall()
        if self.inner is not None:
            self.gate.release(self.host)
            self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()
            self._cancel_stall()
            self._stalled = asyncio.get_running_loop().call_later(self._write_stall_s, self._abort_stalled)

    def resume_writing(self) -> None:
        self._cancel_stall()
        if self.inner is not None:
            self.inner.resume_writing()

    def _cancel_stall(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _abort_stalled(self) -> None:
        self._stalled = None
        log.debug("admin HTTP: closing the connection of %s, which read none of its answer", self.host)
        if self._transport is not None:
            self._transport.abort()


class _ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger (``aiohttp.server``) with a request it could not parse (a malformed head, a body
    not chunked as it says, a bad Content-Length) logged as one DEBUG line, as aiohttp logs non-HTTP traffic:
    it logged each with its traceback at ERROR, so that a stranger sending junk in a loop flooded the log."""

    def exception(self, msg: object, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            reason = " ".join(str(exc_info.message).split())
            self.debug(f"{msg}: %s %s", *args, exc_info.code, reason)
            return
        if isinstance(exc_info, web.RequestPayloadError):
            # a body aiohttp reads after the handler (one it did not read: a refused request) that does not decode
            # as its Content-Encoding says, or is not chunked as it says: logged at ERROR with three tracebacks
            self.debug(f"{msg}: %s", *args, " ".join(str(exc_info).split()))
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


_SERVER_LOG = _ServerLog(logging.getLogger("aiohttp.server"), {})


def refusal_json(e: web.HTTPException, key: str) -> web.Response:
    """aiohttp's own refusal (no such route, a method the route does not take, a body past the size limit) as a
    JSON ``{key: reason}`` like the application's other refusals, not aiohttp's text ("404: Not Found")."""
    reason = e.text if e.text and not e.text.startswith(f"{e.status}:") else e.reason
    if isinstance(e, web.HTTPMethodNotAllowed):
        reason = f"{e.method} is not allowed here: {', '.join(sorted(e.allowed_methods))}"
    response = web.json_response({key: reason}, status=e.status)
    if "Allow" in e.headers:
        response.headers["Allow"] = e.headers["Allow"]
    return response


class HttpService:
    """An aiohttp application served on ``host:port`` behind the connection limits above; ``refused`` counts
    the connections closed on arrival."""

    def __init__(
        self,
        name: str,
        runner: web.AppRunner,
        server: asyncio.AbstractServer,
        gate: ConnectionGate,
        tls_server: asyncio.AbstractServer | None = None,
    ) -> None:
        self.name = name
        self.runner = runner
        self._server = server
        self._gate = gate
        self._tls_server = tls_server

    @property
    def refused(self) -> int:
        return self._gate.refused

    @property
    def port(self) -> int:
        sockets = getattr(self._server, "sockets", None) or []
        return int(sockets[0].getsockname()[1])

    async def cleanup(self) -> None:
        self._server.close()
        if self._tls_server is not None:
            self._tls_server.close()
        await self.runner.cleanup()


async def serve_http(
    name: str,
    app: web.Application,
    host: str | None,
    port: int,
    *,
    connections_max: int = HTTP_CONNECTIONS_MAX,
    per_peer_max: int = HTTP_CONNECTIONS_PER_PEER_MAX,
    idle_timeout_s: float = HTTP_IDLE_TIMEOUT_S,
    write_stall_s: float | None = None,
    tls: tuple[int, ssl.SSLContext] | None = None,
    **runner_kw: Any,
) -> HttpService:
    """Serve ``app`` (``runner_kw`` go to ``web.AppRunner``); ``name`` heads the refusal log lines.
    ``write_stall_s``: :data:`HTTP_WRITE_STALL_S` when None. ``tls``: (port, context) serves the same app over
    https on that port too, behind the same limits."""
    stall_s = HTTP_WRITE_STALL_S if write_stall_s is None else write_stall_s
    runner_kw.setdefault("logger", _SERVER_LOG)
    runner = web.AppRunner(app, keepalive_timeout=idle_timeout_s, **runner_kw)
    await runner.setup()
    handlers = runner.server
    assert handlers is not None
    gate = ConnectionGate(name, connections_max, per_peer_max)
    loop = asyncio.get_running_loop()
    server: asyncio.AbstractServer | None = None
    try:
        server = await loop.create_server(
            lambda: _GatedHttpConnection(gate, handlers, stall_s), host, port, reuse_address=True
        )
        tls_server = None
        if tls is not None:
            tls_server = await loop.create_server(
                lambda: _GatedHttpConnection(gate, handlers, stall_s),
                host,
                tls[0],
                reuse_address=True,
                ssl=tls[1],
                ssl_handshake_timeout=HTTP_IDLE_TIMEOUT_S,
            )
    except BaseException:
        if server is not None:
            server.close()
        await runner.cleanup()
        raise
    return HttpService(name, runner, server, gate, tls_server)
