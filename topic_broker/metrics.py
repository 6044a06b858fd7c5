"""The broker's Prometheus metrics: counters per topic and subscription, a publish-latency histogram, and the
families ``/metrics`` serves (``admin.py`` collects them at each scrape; ``prometheus_client`` writes the text).
Pure: no sockets, no event loop.

Names follow Pulsar's broker metrics where Pulsar has one (``pulsar_in_messages_total``, ``pulsar_storage_size``,
``pulsar_subscription_back_log`` …) so dashboards written for Pulsar find them; every per-topic sample carries
``cluster``, ``namespace`` and ``topic`` labels, per-subscription samples also ``subscription``.

The service reports what happened through :meth:`BrokerMetrics.published` (an entry is durable; latency from SEND
to durable) and :meth:`BrokerMetrics.dispatched` (an entry went to a consumer): plain ints and a plain-int
histogram on the data path, read only when ``/metrics`` is scraped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from bookie.metrics import Histogram

__all__ = ["FAMILIES", "PUBLISH_LATENCY_BUCKETS_S", "BrokerMetrics", "Families", "Rates", "TopicCounters"]

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
class Rates:
    """Rates of monotone counters, by name (``_RateWindow`` each): what a producer's or consumer's stats show."""

    windows: dict[str, _RateWindow] = field(default_factory=dict)

    def rate(self, what: str, value: float, now: float | None = None) -> float:
        w = self.windows.setdefault(what, _RateWindow())
        return w.rate(time.monotonic() if now is None else now, value)


@dataclass(slots=True)
class ClientCounters:
    """A producer's or consumer's own counters: since when it is connected, the messages (a batch counts its
    messages) and bytes it published (a producer) or was sent (a consumer), and their rates."""

    connected_since_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    messages: int = 0
    bytes: int = 0
    rates: Rates = field(default_factory=Rates)

    def sampled(self, direction: str, now: float | None = None) -> dict[str, float]:
        """Pulsar's ``msgRate<direction>`` and ``msgThroughput<direction>`` (``In``, ``Out``), sampled now."""
        return {
            f"msgRate{direction}": self.rates.rate("messages", self.messages, now),
            f"msgThroughput{direction}": self.rates.rate("bytes", self.bytes, now),
        }


@dataclass(slots=True)
class TopicCounters:
    """What a topic (partition) did on this broker since the broker started serving it."""

    msg_out: int = 0
    bytes_out: int = 0
    msg_published: int = 0
    bytes_published: int = 0
    sub_msg_out: dict[str, int] = field(default_factory=dict)
    sub_bytes_out: dict[str, int] = field(default_factory=dict)
    rates: Rates = field(default_factory=Rates)

    def rate(self, what: str, value: float, now: float | None = None) -> float:
        return self.rates.rate(what, value, now)

    def topic_rates(self, msg_in: int, bytes_in: int, now: float | None = None) -> dict[str, float]:
        """The topic's rates (Pulsar's names), each counter sampled now: the broker's tick samples every topic it
        serves, so the first read of the stats already has a window to measure (before, a rate was sampled only
        when read, and the first read after a while answered 0.0 whatever the traffic)."""
        at = time.monotonic() if now is None else now
        return {
            "msgRateIn": self.rate("msg_in", msg_in, at),
            "msgThroughputIn": self.rate("bytes_in", bytes_in, at),
            "msgRateOut": self.rate("msg_out", self.msg_out, at),
            "msgThroughputOut": self.rate("bytes_out", self.bytes_out, at),
        }


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

#: (type, help) of every family ``/metrics`` serves besides the publish-latency histogram, by name.
FAMILIES: dict[str, tuple[str, str]] = {
    "pulsar_in_messages_total": ("counter", "messages published to the topic on this broker"),
    "pulsar_in_bytes_total": ("counter", "bytes (stored entries) published to the topic on this broker"),
    "pulsar_out_messages_total": ("counter", "messages dispatched to consumers"),
    "pulsar_out_bytes_total": ("counter", "bytes (stored entries) dispatched to consumers"),
    "pulsar_storage_size": ("gauge", "bytes in the topic's ledgers (before replication)"),
    "pulsar_storage_entries": ("gauge", "entries in the topic's ledgers"),
    "pulsar_producers_count": ("gauge", "connected producers"),
    "pulsar_consumers_count": ("gauge", "connected consumers"),
    "pulsar_subscriptions_count": ("gauge", "subscriptions"),
    "pulsar_msg_backlog": (
        "gauge",
        "messages not yet acknowledged (a batch counts its messages), summed over durable subscriptions",
    ),
    "pulsar_subscription_back_log": ("gauge", "messages not yet acknowledged by the subscription"),
    "pulsar_subscription_out_messages_total": ("counter", "messages dispatched to the subscription"),
    "pulsar_subscription_out_bytes_total": ("counter", "bytes dispatched to the subscription"),
    "pulsar_topics_count": ("gauge", "topics (partitions) this broker serves"),
    "pulsar_broker_connections": ("gauge", "open client connections"),
    "pulsar_broker_auth_failures_total": ("counter", "tokens refused (binary CONNECT and HTTP)"),
    "pulsar_broker_authorization_refusals_total": (
        "counter",
        "lookups, producers and subscriptions refused for lack of a namespace permission",
    ),
    "pulsar_broker_backlog_quota_refusals_total": (
        "counter",
        "producers and sends refused by a backlog quota (producer_exception)",
    ),
    "pulsar_broker_backlog_quota_evictions_total": (
        "counter",
        "cursors moved forward by a backlog quota (consumer_backlog_eviction)",
    ),
}


class Families:
    """Samples added one at a time (name, labels, value), grouped into ``prometheus_client`` families of the
    type and help :data:`FAMILIES` gives; the samples of one family carry the same label names in the same
    order."""

    def __init__(self) -> None:
        self._families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}

    def add(self, name: str, labels: Mapping[str, str], value: float) -> None:
        f = self._families.get(name)
        if f is None:
            try:
                kind, help_text = FAMILIES[name]
            except KeyError:
                raise ValueError(f"no metric family {name!r} (topic_broker.metrics.FAMILIES)") from None
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            f = self._families[name] = family(name, help_text, labels=list(labels))
        f.add_metric(list(labels.values()), value)

    def families(self) -> list[Metric]:
        return list(self._families.values())
