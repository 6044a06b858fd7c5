"""Log lines about a condition that lasts (a disk that stays full, a broker without bookies): the first at once,
then at most one per interval, instead of one per check or per refused request."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """A logger's lines, at most one per ``interval_s`` (the first one at once)."""

    def __init__(
        self, logger: logging.Logger, interval_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None  # clock time of the last line said, None: none since the last reset

    def log(self, level: int, msg: str, *args: Any) -> bool:
        """Log the line unless one was said less than ``interval_s`` ago; whether it was logged."""
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        self.logger.log(level, msg, *args)
        return True

    def warning(self, msg: str, *args: Any) -> bool:
        return self.log(logging.WARNING, msg, *args)

    def said(self) -> None:
        """A line about the condition was logged another way just now: count the interval from here."""
        self._last = self._clock()

    def reset(self) -> None:
        """The condition ended: its next line, should it come back, is logged at once."""
        self._last = None
