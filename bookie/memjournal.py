"""An in-memory journal and a manual scheduler with the interfaces ``BookieCore`` expects.

Used by the deterministic simulator and by unit tests of the core: records become durable only when
``sync()`` runs (a crash before that loses them, exactly like an un-fsynced journal tail), and timers fire
only when the owner of time advances the clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Done = Callable[[BaseException | None], None]


@dataclass(slots=True)
class MemoryJournal:
    durable: list[tuple[int, int, int, bytes]] = field(default_factory=list)
    pending: list[tuple[tuple[int, int, int, bytes], Done]] = field(default_factory=list)
    fail_with: BaseException | None = None  # when set, the next sync fails every pending record with it

    def append(self, rtype: Any, ledger_id: int, entry_id: int, data: bytes, done: Done) -> None:
        self.pending.append(((int(rtype), ledger_id, entry_id, bytes(data)), done))

    def sync(self) -> int:
        """Make every pending record durable (in order) and run its callback; returns how many."""
        batch, self.pending = self.pending, []
        if self.fail_with is not None:
            exc = self.fail_with
            for _, done in batch:
                done(exc)
            return 0
        for rec, _ in batch:
            self.durable.append(rec)
        for _, done in batch:
            done(None)
        return len(batch)

    def crash(self) -> None:
        """Lose what was not synced; callbacks of lost records never run (their connections are gone)."""
        self.pending.clear()

    def replay(self) -> list[tuple[int, int, int, bytes]]:
        return list(self.durable)


class ManualScheduler:
    """``schedule(delay_s, fn)`` against a clock the caller advances (``run_until``/``run_ready``)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None], list[bool]]] = []
        self._seq = itertools.count()

    def __call__(self, delay_s: float, fn: Callable[[], None]) -> _Handle:
        cancelled = [False]
        heapq.heappush(self._heap, (self.now + max(0.0, delay_s), next(self._seq), fn, cancelled))
        return _Handle(cancelled)

    def run_ready(self) -> int:
        return self.run_until(self.now)

    def run_until(self, t: float) -> int:
        n = 0
        while self._heap and self._heap[0][0] <= t:
            when, _, fn, cancelled = heapq.heappop(self._heap)
            self.now = max(self.now, when)
            if not cancelled[0]:
                fn()
                n += 1
        self.now = max(self.now, t)
        return n

    @property
    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None


@dataclass(slots=True)
class _Handle:
    cancelled: list[bool]

    def cancel(self) -> None:
        self.cancelled[0] = True
