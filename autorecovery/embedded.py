"""AutoRecovery inside a bookie's process (BookKeeper's ``autoRecoveryDaemonEnabled``, on by default in
``ledgerstore bookie serve``; ``--no-autorecovery`` turns it off).

The bookie package never imports this one: ``ledgerstore bookie serve`` builds an :class:`EmbeddedAutoRecovery`
from the bookie's settings and hands it to ``bookie.main.serve`` as a *companion*, which the bookie starts once
it serves and stops first on shutdown.

It is what ``ledgerstore autorecovery serve`` runs (``run_autorecovery``: an auditor candidate, replication
workers, their own ZooKeeper session), on an event loop in a thread of its own: the bookie's event loop, which
carries its data path, never runs AutoRecovery's work, and the copy rate of its workers is capped by the
throttle as in a standalone process. Its metrics appear on the bookie's ``/metrics`` under the standalone
process's names (``under_replicated_ledgers``, ``rereplicated_entries_total``, ``autorecovery_is_auditor``...).

Credentials come as for any other client in the process: ZooKeeper's from ``LEDGERSTORE_ZK_AUTH[_FILE]`` (read
by ``MetadataStore.connect``), the token sent to bookies from ``--auth-token-file`` or
``LEDGERSTORE_AUTH_TOKEN[_FILE]``; a bookie that checks tokens (``--auth-secret-file``) and was given none
signs one for its AutoRecovery with its secret (subject ``autorecovery@<bookie id>``).

Stopping is bounded: ``stop`` sets the service's stop event on its loop and waits at most ``STOP_WAIT_S`` for the
thread (a daemon: a thread stuck on an unreachable ZooKeeper never holds up the process's exit). A service that
fails (ZooKeeper unreachable at start, a session lost for good) is started again after ``RESTART_DELAY_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from .config import AutoRecoveryConfig
from .metrics import Metrics
from .service import run_autorecovery

if TYPE_CHECKING:
    from bookie.main import Bookie

__all__ = ["EmbeddedAutoRecovery"]

log = logging.getLogger(__name__)

STOP_WAIT_S = 4.0
RESTART_DELAY_S = 5.0


class EmbeddedAutoRecovery:
    """A bookie companion (``bookie.main.Companion``) running AutoRecovery with ``config``."""

    name = "autorecovery"

    def __init__(self, config: AutoRecoveryConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopping = False

    async def start(self, bookie: Bookie) -> None:
        bid = bookie.config.id
        config = replace(self.config, owner=self.config.owner or f"bookie-{bid}")
        if config.auth_token is None:
            config = replace(config, auth_token=_token_for(bookie))
        if bookie.server is not None:
            self.metrics.register(bookie.server.metrics, "AutoRecovery in this bookie: ")
        self._thread = threading.Thread(
            target=self._run, args=(config,), name=f"autorecovery-{bid}", daemon=True
        )
        self._thread.start()

    def _run(self, config: AutoRecoveryConfig) -> None:
        try:
            asyncio.run(self._main(config))
        except Exception:  # pragma: no cover - _main catches what it can; never kill the bookie
            log.exception("autorecovery %s: its thread failed", config.owner)

    async def _main(self, config: AutoRecoveryConfig) -> None:
        stop = asyncio.Event()
        self._stop, self._loop = stop, asyncio.get_running_loop()
        while not (self._stopping or stop.is_set()):  # _stopping: stop() ran before this loop existed
            started = time.monotonic()
            try:
                await run_autorecovery(config, stop, self.metrics)
            except Exception as e:
                log.error(
                    "autorecovery %s failed, starting again in %.0fs: %r", config.owner, RESTART_DELAY_S, e
                )
            self.metrics.is_auditor = 0
            if stop.is_set() or self._stopping:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, RESTART_DELAY_S - (time.monotonic() - started)))

    async def stop(self) -> None:
        self._stopping = True
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop already closed
                loop.call_soon_threadsafe(stop.set)
        thread = self._thread
        deadline = time.monotonic() + STOP_WAIT_S
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if thread is not None and thread.is_alive():
            log.warning("autorecovery: still stopping after %.0fs; the process exits without it", STOP_WAIT_S)


def _token_for(bookie: Bookie) -> str | None:
    """The token AutoRecovery sends to bookies: the process's own (``--auth-token-file``,
    ``$LEDGERSTORE_AUTH_TOKEN[_FILE]``), else one signed with the bookie's secret, else none."""
    from bookie.auth import create_token
    from bookie.main import load_secret
    from ledger_client.client import ClientConfig, resolve_auth_token

    own = resolve_auth_token(ClientConfig())
    secret_file = bookie.config.auth_secret_file
    if own is not None or secret_file is None:
        return own
    return create_token(load_secret(secret_file), f"autorecovery@{bookie.config.id}")
