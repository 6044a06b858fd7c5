"""Whether a broker has the writable bookies its new ledgers need (``--ensemble-size``), and its log about it.

A broker started before its bookies (or whose bookies are all away) cannot open a topic: each one needs a new
ledger. It says so once, with how many bookies it has and needs, then at most a line a minute while that lasts,
and once when enough have come; meanwhile the clients of a topic it cannot open are answered at once with the
reason (``NOT_ENOUGH_BOOKIES``), without a ledger creation that would fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from zk.ratelog import LOG_EVERY_S, RateLimitedLog

from .managed_ledger import ManagedLedgerError

__all__ = ["BookieSupply", "BookiesShortError"]

log = logging.getLogger(__name__)


class BookiesShortError(ManagedLedgerError):
    """A topic not opened because the broker has fewer writable bookies than a new ledger needs (passing)."""

    code = "NOT_ENOUGH_BOOKIES"


class BookieSupply:
    """The writable bookies registered (a watch on ``bookies/available``) against the ensemble size."""

    def __init__(self, broker_id: str, needed: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.broker_id = broker_id
        self.needed = needed
        self.writable: int | None = None  # unknown until the watch first answers
        self._waiting_log = RateLimitedLog(log, LOG_EVERY_S, clock=clock)
        self._cancel: Callable[[], None] | None = None

    @property
    def short(self) -> bool:
        """Known to have fewer writable bookies than a new ledger needs."""
        return self.writable is not None and self.writable < self.needed

    def refusal(self) -> str:
        """What a client of a topic that cannot be opened meanwhile is told."""
        return (
            f"NOT_ENOUGH_BOOKIES: the broker has {self.writable} writable bookies, a new ledger needs "
            f"{self.needed} (--ensemble-size); waiting for bookies"
        )

    def update(self, writable: int) -> None:
        """The registered writable bookies changed (or were first read)."""
        was_short = self.short
        self.writable = writable
        if self.short:
            self.remind()
        elif was_short:
            self._waiting_log.reset()
            log.info(
                "broker=%s bookies: %d writable now, a new ledger needs %d: topics can be opened",
                self.broker_id,
                writable,
                self.needed,
            )

    def remind(self) -> None:
        """While short: the waiting line, at most once per ``LOG_EVERY_S`` (the first at once)."""
        if self.short:
            self._waiting_log.warning(
                "broker=%s waiting for bookies: %d writable, a new ledger needs %d (--ensemble-size); "
                "until then topics are not opened and their clients are told NOT_ENOUGH_BOOKIES",
                self.broker_id,
                self.writable,
                self.needed,
            )

    async def watch(self, registry: Any) -> None:
        """Follow ``registry``'s writable bookies (a ``zk.BookieRegistry``) from now until :meth:`close`."""
        loop = asyncio.get_running_loop()

        def changed(ids: list[str]) -> None:  # ZooKeeper's thread
            with contextlib.suppress(RuntimeError):  # the loop closed
                loop.call_soon_threadsafe(self.update, len(ids))

        self._cancel = await asyncio.to_thread(registry.watch_available, changed)

    def close(self) -> None:
        if self._cancel is not None:
            self._cancel()
            self._cancel = None
