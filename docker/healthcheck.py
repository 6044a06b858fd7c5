#!/usr/bin/env python3
"""The image's health check: exit 0 when the server's admin HTTP answers 200 on ``/health``, else 1.

The URL is ``$LEDGERSTORE_HEALTH_URL`` when set (an override). Otherwise it follows the server the container runs:
the ``ledgerstore bookie serve`` or ``broker serve`` process (PID 1, or the first such process: under ``docker run
--init`` PID 1 is the init) and its admin port as that command resolves it: ``--http-port`` on its command line >
``$LEDGERSTORE_HTTP_PORT`` > ``http_port`` in its ``--config`` file (or ``$LEDGERSTORE_CONFIG``) > the default
(bookie 8000, broker 8080); the host is the address it listens on, resolved the same way (``--listen-address``;
a bookie's defaults to its ``--advertised-address``), or 127.0.0.1 when it listens on every interface. A
container running anything else is asked on 127.0.0.1:8000, as before.

The environment is this process's: Docker runs the check with the container's. Standard library only, and
cheap: it runs every few seconds.
"""

from __future__ import annotations

import os
import sys
import tomllib
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

URL_ENV = "LEDGERSTORE_HEALTH_URL"
CONFIG_ENV = "LEDGERSTORE_CONFIG"
DEFAULT_PORTS = {"bookie": 8000, "broker": 8080}
FALLBACK_PORT = 8000
LOOPBACK = "127.0.0.1"
ANY_ADDRESS = "0.0.0.0"
TIMEOUT_S = 2.0


def server_of(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """``("bookie" | "broker", the arguments after serve)`` when ``argv`` runs ``ledgerstore ... serve``."""
    for i in range(1, len(argv)):
        if argv[i] == "serve" and argv[i - 1] in DEFAULT_PORTS:
            return argv[i - 1], list(argv[i + 1 :])
    return None


def _flag(args: Sequence[str], name: str) -> str | None:
    """The last value of ``--name V`` or ``--name=V`` (argparse keeps the last)."""
    value = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(name + "="):
            value = a[len(name) + 1 :]
    return value


def _port(text: object, where: str) -> int:
    if isinstance(text, bool) or not isinstance(text, int | str) or not str(text).strip().isdigit():
        raise ValueError(f"{where}: {text!r} is not a port")
    port = int(str(text).strip())
    if not 0 < port < 65536:
        raise ValueError(f"{where}: {port} is not a port")
    return port


def _settings(args: Sequence[str], environ: Mapping[str, str]) -> tuple[dict[str, object], str | None]:
    config = _flag(args, "--config") or environ.get(CONFIG_ENV)
    if not config:
        return {}, None
    with open(config, "rb") as f:  # keys as serve reads them: `http-port` is `http_port`
        return {str(k).replace("-", "_"): v for k, v in tomllib.load(f).items()}, config


def _setting(
    args: Sequence[str],
    environ: Mapping[str, str],
    settings: Mapping[str, object],
    config: str | None,
    key: str,
) -> tuple[object, str]:
    """A ``serve`` setting as serve resolves it (``--key`` > ``$LEDGERSTORE_KEY`` > ``key`` in its config file),
    and where it came from, for an error naming it; ``None`` when none of them sets it."""
    flag = "--" + key.replace("_", "-")
    if (value := _flag(args, flag)) is not None:
        return value, flag
    env = "LEDGERSTORE_" + key.upper()
    if environ.get(env):
        return environ[env], f"${env}"
    return settings.get(key), f"{key} in {config}"


def admin_port(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """The admin HTTP port of the server ``argv`` runs, resolved as ``bookie serve``/``broker serve`` do."""
    return admin_address(argv, environ)[1]


def admin_address(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[str, int]:
    """Where the admin HTTP of the server ``argv`` runs listens, resolved as ``bookie serve``/``broker serve`` do:
    the port as above; the host is its listen address (a bookie's defaults to its advertised address, 127.0.0.1
    unless given; a broker's to every interface), asked on 127.0.0.1 when it listens on every interface."""
    server = server_of(argv)
    if server is None:
        return LOOPBACK, FALLBACK_PORT
    role, args = server
    settings, config = _settings(args, environ)
    value, where = _setting(args, environ, settings, config, "http_port")
    port = DEFAULT_PORTS[role] if value is None else _port(value, where)
    host, _ = _setting(args, environ, settings, config, "listen_address")
    if host is None:
        host = (
            _setting(args, environ, settings, config, "advertised_address")[0]
            if role == "bookie"
            else ANY_ADDRESS
        )
    host = str(host or LOOPBACK).strip()
    if host in ("", ANY_ADDRESS, "::", "[::]"):
        host = LOOPBACK
    return host, port


def health_url(argv: Sequence[str], environ: Mapping[str, str]) -> str:
    if environ.get(URL_ENV):
        return environ[URL_ENV]
    host, port = admin_address(argv, environ)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/health"


def cmdline(pid: int | str, proc: Path = Path("/proc")) -> list[str]:
    raw = (proc / str(pid) / "cmdline").read_bytes()
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]] if raw else []


def server_argv(proc: Path = Path("/proc"), first: int = 1) -> list[str]:
    """The command line of the server process: ``first`` (PID 1) if it is one, else the lowest pid that is."""
    pids = sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit())
    for pid in [first, *(p for p in pids if p != first)]:
        try:
            argv = cmdline(pid, proc)
        except OSError:  # gone, or not ours to read
            continue
        if server_of(argv) is not None:
            return argv
    try:
        return cmdline(first, proc)
    except OSError:
        return []


def main(argv: Sequence[str] = ()) -> int:
    first = int(argv[0]) if argv else 1
    try:
        url = health_url(server_argv(first=first), os.environ)
    except (OSError, ValueError) as e:
        print(f"health check: {e}", file=sys.stderr)
        return 1
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:
            return 0 if r.status == 200 else 1
    except OSError as e:  # refused, timed out, an HTTP error (503: starting or failed)
        print(f"health check: {url}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
