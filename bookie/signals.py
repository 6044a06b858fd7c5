"""The signals that stop a server (``bookie serve``, ``broker serve``, ``autorecovery serve``) cleanly.

SIGTERM and SIGINT, and SIGHUP too: a server whose terminal closed (an ssh session ended with it in the
foreground) got SIGHUP and died on it at once, Python's default, with no shutdown at all: a bookie still
registered until its session expired and its journal not closed, a broker's cursors not flushed nor its ledgers
closed, and not a line in the log. The JVM runs its shutdown hooks on SIGHUP, so BookKeeper and Pulsar stop
cleanly there; so do these now. Where SIGHUP is ignored (``nohup``), it stays ignored: such a server keeps running.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

log = logging.getLogger("ledgerstore.signals")


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM, SIGINT, and SIGHUP unless this process ignores it (started under ``nohup``)."""
    sigs = [signal.SIGTERM, signal.SIGINT]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        sigs.append(signal.SIGHUP)
    return tuple(sigs)


def add_stop_handlers(
    loop: asyncio.AbstractEventLoop, stop: Callable[[], object], who: str
) -> tuple[signal.Signals, ...]:
    """Call ``stop`` on each of :func:`stop_signals` (a SIGHUP says so in one line headed by ``who``); the
    signals handled, for :func:`remove_stop_handlers`."""
    sigs = stop_signals()
    for sig in sigs:
        loop.add_signal_handler(sig, _received, sig, stop, who)
    return sigs


def remove_stop_handlers(loop: asyncio.AbstractEventLoop, sigs: tuple[signal.Signals, ...]) -> None:
    for sig in sigs:
        loop.remove_signal_handler(sig)


def _received(sig: signal.Signals, stop: Callable[[], object], who: str) -> None:
    if sig == signal.SIGHUP:
        log.warning(
            "%s SIGHUP (its terminal closed?): stopping cleanly, as for SIGTERM "
            "(to keep a server running past its terminal: nohup, setsid or a service manager)",
            who,
        )
    stop()
