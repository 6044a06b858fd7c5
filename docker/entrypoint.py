#!/usr/bin/env python3
"""The image's entrypoint: ``ledgerstore "$@"``, optionally with loopback relays beside it.

A bookie's id is the address clients dial. Started to be reachable from the host, bookies advertise
``127.0.0.1:<port>`` and are published on the same port of the host's loopback: the host dials them directly,
but inside another container 127.0.0.1 is that container itself. A broker or an AutoRecovery worker in a
container reads those ids from ZooKeeper too, so this entrypoint can listen on the container's own loopback and
relay each connection to the bookie behind it:

    LEDGERSTORE_LOOPBACK_RELAY="3181=bookie-0:3181 3182=bookie-1:3182 3183=bookie-2:3183"

(``PORT=HOST:PORT`` pairs separated by spaces or commas). ``127.0.0.1:3181`` then means bookie-0 inside this
container as it does on the host. Each connection resolves the target anew (a restarted bookie may have another
address); a target that refuses or is unreachable closes the relayed connection at once, as a dead bookie
would. With the variable unset or empty nothing listens and this process simply becomes ``ledgerstore``.

The relays run in a child process; ``ledgerstore`` replaces this one (keeps its PID, gets the signals). The
container ends when ``ledgerstore`` ends, relays included.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

ENV = "LEDGERSTORE_LOOPBACK_RELAY"
CHUNK = 256 * 1024
CONNECT_TIMEOUT_S = 10.0


def parse(spec: str) -> list[tuple[int, str, int]]:
    routes = []
    for item in spec.replace(",", " ").split():
        listen, _, target = item.partition("=")
        host, _, port = target.rpartition(":")
        if not listen.isdigit() or not host or not port.isdigit():
            raise SystemExit(f"{ENV}: {item!r} is not PORT=HOST:PORT")
        routes.append((int(listen), host, int(port)))
    return routes


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def relay(host: str, port: int, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
    try:
        up_r, up_w = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
    except OSError:  # refused, unreachable, unknown name, timed out
        down_w.close()
        return
    for w in (down_w, up_w):
        sock = w.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # Either side closing closes both (the bookie protocol never half-closes).
    await asyncio.wait(
        [asyncio.ensure_future(pipe(down_r, up_w)), asyncio.ensure_future(pipe(up_r, down_w))],
        return_when=asyncio.FIRST_COMPLETED,
    )
    up_w.close()
    down_w.close()


async def serve(routes: list[tuple[int, str, int]]) -> None:
    servers = []
    for listen, host, port in routes:

        async def handle(
            r: asyncio.StreamReader, w: asyncio.StreamWriter, host: str = host, port: int = port
        ) -> None:
            await relay(host, port, r, w)

        servers.append(await asyncio.start_server(handle, "127.0.0.1", listen, reuse_address=True))
    await asyncio.gather(*(s.serve_forever() for s in servers))


def die_with_parent() -> None:
    """SIGTERM this process when its parent (ledgerstore, after the exec) ends (Linux's PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main() -> None:
    argv = ["ledgerstore", *sys.argv[1:]]
    routes = parse(os.environ.get(ENV, ""))
    if routes:
        child = os.fork()
        if child == 0:
            die_with_parent()
            try:
                import uvloop

                uvloop.install()
            except ImportError:
                pass
            try:
                asyncio.run(serve(routes))
            except BaseException as exc:  # the relays are an aid: report and leave ledgerstore running
                print(f"ledgerstore-entrypoint: loopback relay stopped: {exc!r}", file=sys.stderr, flush=True)
            os._exit(1)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
