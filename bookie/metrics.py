"""The metrics of one server instance (a bookie, a broker, an AutoRecovery process), exposed through
``prometheus_client``.

The hot paths count in plain ints and in :class:`Histogram` (a bisect and three adds per observation, several times
cheaper than ``prometheus_client``'s own ``Counter.inc`` or ``Histogram.observe``, which take a lock); a custom
collector reads them when ``/metrics`` is scraped and ``prometheus_client`` writes the text exposition. Each
:class:`ServerMetrics` has its own ``CollectorRegistry``, never the process-wide default: tests run several bookies
and brokers in one process.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = [
    "CONTENT_TYPE_LATEST",
    "LATENCY_BUCKETS_S",
    "Histogram",
    "RateMeter",
    "ServerMetrics",
]

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """Observations counted per bucket in plain ints; :meth:`family` exports them as a Prometheus histogram."""

    __slots__ = ("name", "help", "buckets", "counts", "sum", "count")

    def __init__(self, name: str, help_text: str, buckets: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"histogram {name}: buckets must be distinct and increasing, not {buckets!r}")
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

    def cumulative(self) -> list[tuple[str, int]]:
        """(``le`` label, observations ≤ that bound) per bucket, ending with ``+Inf``."""
        out: list[tuple[str, int]] = []
        acc = 0
        for bound, c in zip(self.buckets, self.counts, strict=False):
            acc += c
            out.append((floatToGoString(bound), acc))
        out.append(("+Inf", self.count))
        return out

    def family(self, labels: dict[str, str] | None = None) -> HistogramMetricFamily:
        labels = labels or {}
        f = HistogramMetricFamily(self.name, self.help, labels=list(labels))
        f.add_metric(list(labels.values()), self.cumulative(), sum_value=self.sum)
        return f


class ServerMetrics(Collector):
    """One server instance's metrics: counters and gauges read from callables at scrape time, histograms, and
    collectors of labelled families (``add_collector``), all in this instance's own ``CollectorRegistry``."""

    def __init__(self) -> None:
        self._scalars: list[tuple[str, str, bool, Callable[[], float]]] = []
        self._histograms: list[Histogram] = []
        self._collectors: list[Callable[[], Iterable[Metric]]] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        # the process's own, as a JVM's exporter gives BookKeeper and Pulsar: process_open_fds and process_max_fds
        # (a server at its limit drops new connections), resident memory, CPU seconds, start time
        ProcessCollector(registry=self.registry)

    def counter(self, name: str, help_text: str, fn: Callable[[], float]) -> None:
        """A counter whose value ``fn()`` returns when scraped. Its name ends in ``_total`` (Prometheus' rule for
        counters; ``prometheus_client`` would add the suffix otherwise and the name would change)."""
        if not name.endswith("_total"):
            raise ValueError(f"counter {name}: a counter's name ends in _total")
        self._scalars.append((name, help_text, True, fn))

    def gauge(self, name: str, help_text: str, fn: Callable[[], float]) -> None:
        """A gauge whose value ``fn()`` returns when scraped."""
        self._scalars.append((name, help_text, False, fn))

    def histogram(self, name: str, help_text: str, buckets: Sequence[float] = LATENCY_BUCKETS_S) -> Histogram:
        h = Histogram(name, help_text, buckets)
        self._histograms.append(h)
        return h

    def add_collector(self, collect: Callable[[], Iterable[Metric]]) -> None:
        """Families that ``collect()`` builds at each scrape (labelled ones: per topic, per subscription)."""
        self._collectors.append(collect)

    def collect(self) -> Iterator[Metric]:
        for name, help_text, is_counter, fn in self._scalars:
            if is_counter:
                yield CounterMetricFamily(name, help_text, value=fn())
            else:
                yield GaugeMetricFamily(name, help_text, value=fn())
        for h in self._histograms:
            yield h.family()
        for collect in self._collectors:
            yield from collect()

    def exposition(self) -> bytes:
        """The text exposition of every metric (``CONTENT_TYPE_LATEST``), what ``/metrics`` serves."""
        return generate_latest(self.registry)


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
