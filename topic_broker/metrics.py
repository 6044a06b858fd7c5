"""The broker's Prometheus metrics: counters per topic and subscription, a publish-latency histogram, and the
text exposition ``/metrics`` serves (``admin.py``). Pure: no sockets, no event loop.

Names follow Pulsar's broker metrics where Pulsar has one (``pulsar_in_messages_total``, ``pulsar_storage_size``,
``pulsar_subscription_back_log`` …) so dashboards written for Pulsar find them; every per-topic sample carries
``cluster``, ``namespace`` and ``topic`` labels, per-subscription samples also ``subscription``.

The service reports what happened through :meth:`BrokerMetrics.published` (an entry is durable; latency from SEND
to durable) and :meth:`BrokerMetrics.dispatched` (an entry went to a consumer).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from bookie.metrics import Histogram

__all__ = ["PUBLISH_LATENCY_BUCKETS_S", "BrokerMetrics", "Sample", "TopicCounters", "render"]

#: Publish latency buckets (seconds), SEND received → entry durable on Qa bookies.
PUBLISH_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0)
#: How far back a rate (``msgRateIn`` …) looks.
RATE_WINDOW_S = 10.0


@dataclass(slots=True)
class _RateWindow:
    """Rate of a monotone counter over the last ``RATE_WINDOW_S`` seconds, from samples taken when read."""

    samples: list[tuple[float, float]] = field(default_factory=list)

    def rate(self, now: float, value: float) -> float:
        s = self.samples
        s.append((now, value))
        while len(s) > 2 and now - s[1][0] >= RATE_WINDOW_S:
            s.pop(0)
        t0, v0 = s[0]
        return (value - v0) / (now - t0) if now - t0 >= 0.5 else 0.0


@dataclass(slots=True)
class TopicCounters:
    """What a topic (partition) did on this broker since the broker started serving it."""

    msg_out: int = 0
    bytes_out: int = 0
    msg_published: int = 0
    bytes_published: int = 0
    sub_msg_out: dict[str, int] = field(default_factory=dict)
    sub_bytes_out: dict[str, int] = field(default_factory=dict)
    rates: dict[str, _RateWindow] = field(default_factory=dict)

    def rate(self, what: str, value: float, now: float | None = None) -> float:
        w = self.rates.setdefault(what, _RateWindow())
        return w.rate(time.monotonic() if now is None else now, value)


def cumulative(h: Histogram) -> list[tuple[str, int]]:
    """(``le`` label, cumulative count) per bucket, ending with ``+Inf``."""
    out: list[tuple[str, int]] = []
    acc = 0
    for bound, c in zip(h.buckets, h.counts, strict=False):
        acc += c
        out.append((_fmt(bound), acc))
    out.append(("+Inf", h.count))
    return out


class BrokerMetrics:
    """Counters the service feeds; read by the admin app's stats and ``/metrics``."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicCounters] = {}
        self.publish_latency = Histogram(
            "pulsar_broker_publish_latency_seconds",
            "time from a SEND's arrival to its entry being durable on the ack quorum",
            PUBLISH_LATENCY_BUCKETS_S,
        )
        self.auth_failures = 0  # tokens refused (binary CONNECT and admin HTTP)
        self.authz_refusals = 0  # produce/consume/lookup refused for lack of a permission
        self.quota_refusals = 0  # producers and sends refused by a backlog quota (producer_exception)
        self.quota_evictions = 0  # cursors moved forward by a backlog quota (consumer_backlog_eviction)

    def topic(self, topic: str) -> TopicCounters:
        c = self.topics.get(topic)
        if c is None:
            c = self.topics[topic] = TopicCounters()
        return c

    def published(self, topic: str, messages: int, size: int, latency_s: float) -> None:
        """An entry of ``messages`` messages and ``size`` bytes is durable, ``latency_s`` after its SEND."""
        c = self.topic(topic)
        c.msg_published += messages
        c.bytes_published += size
        self.publish_latency.observe(latency_s)

    def dispatched(self, topic: str, subscription: str, messages: int, size: int) -> None:
        """An entry of ``messages`` messages and ``size`` bytes was sent to a consumer of ``subscription``."""
        c = self.topic(topic)
        c.msg_out += messages
        c.bytes_out += size
        c.sub_msg_out[subscription] = c.sub_msg_out.get(subscription, 0) + messages
        c.sub_bytes_out[subscription] = c.sub_bytes_out.get(subscription, 0) + size

    def forget(self, topic: str) -> None:
        self.topics.pop(topic, None)


# -- exposition -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def _fmt(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return repr(float(v))


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def render(
    families: Iterable[tuple[str, str, str, Iterable[Sample]]],
    histograms: Iterable[tuple[Mapping[str, str], Histogram]] = (),
) -> str:
    """Prometheus text format 0.0.4: ``families`` are (name, type, help, samples)."""
    lines: list[str] = []
    for name, kind, help_text, samples in families:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for s in samples:
            lines.append(f"{s.name}{_labels(s.labels)} {_fmt(s.value)}")
    for labels, h in histograms:
        name = h.name
        lines.append(f"# HELP {name} {h.help}")
        lines.append(f"# TYPE {name} histogram")
        for le, n in cumulative(h):
            lines.append(f"{name}_bucket{_labels({**labels, 'le': le})} {n}")
        lines.append(f"{name}_sum{_labels(labels)} {_fmt(h.sum)}")
        lines.append(f"{name}_count{_labels(labels)} {h.count}")
    return "\n".join(lines) + "\n"
