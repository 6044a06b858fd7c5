"""Minimal Prometheus text-format metrics (counters, gauges, histograms) without a dependency."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    __slots__ = ("name", "help", "buckets", "counts", "sum", "count")

    def __init__(self, name: str, help_text: str, buckets: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        self.name = name
        self.help = help_text
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        acc = 0
        for bound, c in zip(self.buckets, self.counts, strict=False):
            acc += c
            out.append(f'{self.name}_bucket{{le="{bound}"}} {acc}')
        out.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{self.name}_sum {self.sum:.6f}")
        out.append(f"{self.name}_count {self.count}")
        return out


class Registry:
    """Collects metric lines from callables at render time (counters and gauges read live values)."""

    def __init__(self) -> None:
        self._scalars: list[tuple[str, str, str, Callable[[], float]]] = []
        self._histograms: list[Histogram] = []

    def counter(self, name: str, help_text: str, fn: Callable[[], float]) -> None:
        self._scalars.append((name, help_text, "counter", fn))

    def gauge(self, name: str, help_text: str, fn: Callable[[], float]) -> None:
        self._scalars.append((name, help_text, "gauge", fn))

    def histogram(self, name: str, help_text: str, buckets: Sequence[float] = LATENCY_BUCKETS_S) -> Histogram:
        h = Histogram(name, help_text, buckets)
        self._histograms.append(h)
        return h

    def render(self) -> str:
        lines: list[str] = []
        for name, help_text, kind, fn in self._scalars:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {float(fn()):g}"]
        for h in self._histograms:
            lines += h.render()
        return "\n".join(lines) + "\n"


class RateMeter:
    """Rate of a monotone counter between two reads (each ``rate()`` call starts the next interval)."""

    __slots__ = ("_clock", "_counter", "_last")

    def __init__(self, clock: Callable[[], float], counter: Callable[[], int]) -> None:
        self._clock = clock
        self._counter = counter
        self._last = (clock(), counter())

    def rate(self) -> float:
        now, n = self._clock(), self._counter()
        t0, n0 = self._last
        self._last = (now, n)
        return (n - n0) / (now - t0) if now > t0 else 0.0
