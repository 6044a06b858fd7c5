"""Log lines about a condition that lasts (a disk that stays full, a broker without bookies, ZooKeeper away): the
first at once, then at most one per interval, instead of one per check, per refused request or per retry."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["LOG_EVERY_S", "Every", "RateLimitedLog", "RepeatedLinesFilter"]

#: The interval of every such line in the project (a disk that stays full, housekeeping or passes that keep
#: failing, a broker waiting for bookies, kazoo's retries while ZooKeeper is away): one a minute at most.
LOG_EVERY_S = 60.0


class Every:
    """At most once per ``interval_s``: :meth:`due` is True the first time, then once the interval has passed
    since it last was."""

    def __init__(self, interval_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = (
            None  # clock time of the last due() that was True; None: none since a reset
        )

    def due(self) -> bool:
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        return True

    def said(self) -> None:
        """A line about the condition was logged another way just now: count the interval from here."""
        self._last = self._clock()

    def reset(self) -> None:
        """The condition ended: its next line, should it come back, is due at once."""
        self._last = None


class RateLimitedLog(Every):
    """A logger's lines, at most one per ``interval_s`` (the first one at once)."""

    def __init__(
        self, logger: logging.Logger, interval_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(interval_s, clock=clock)
        self.logger = logger

    def log(self, level: int, msg: str, *args: Any) -> bool:
        """Log the line unless one was said less than ``interval_s`` ago; whether it was logged."""
        if not self.due():
            return False
        self.logger.log(level, msg, *args)
        return True

    def warning(self, msg: str, *args: Any) -> bool:
        return self.log(logging.WARNING, msg, *args)

    @contextlib.contextmanager
    def catching(
        self, errors: type[BaseException] | tuple[type[BaseException], ...], msg: str, *args: Any
    ) -> Iterator[None]:
        """One pass of a loop that keeps trying (ZooKeeper away, a housekeeping step failing): an error of
        ``errors`` the body raises ends the body and is logged as a warning, ``msg: <error>``, at most once per
        interval (the first at once); a body that ends without one resets the interval, so that the next failure
        is said at once. Other exceptions pass through, as does anything the body catches itself."""
        try:
            yield
        except errors as e:
            self.warning(f"{msg}: %s", *args, e)
        else:
            self.reset()


class RepeatedLinesFilter(logging.Filter):
    """For a logger whose lines repeat while a condition lasts (kazoo's 'Connection dropped: ...' at each retry
    while ZooKeeper is away): each kind of line (its format string) at most once per ``interval_s``, the next one
    saying how many were left out meanwhile."""

    def __init__(self, interval_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._every: dict[str, Every] = {}
        self._left_out: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = str(record.msg)
        every = self._every.get(kind)
        if every is None:
            every = self._every[kind] = Every(self.interval_s, clock=self._clock)
        if not every.due():
            self._left_out[kind] = self._left_out.get(kind, 0) + 1
            return False
        left_out = self._left_out.pop(kind, 0)
        if left_out:  # (the text added holds no %: the record's arguments still format its own)
            record.msg = f"{kind} ({left_out} more like it in the last {self.interval_s:.0f} s not shown)"
        return True
