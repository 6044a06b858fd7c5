"""The broker's metrics: counters per topic/subscription and the Prometheus text they render to."""

from __future__ import annotations

import re

from topic_broker.admin import _ranges_text
from topic_broker.managed_ledger import Position
from topic_broker.metrics import BrokerMetrics, Sample, render

SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_]\w*="([^"\\]|\\.)*",?)*\})? \S+$')


def test_counters_add_up_per_topic_and_subscription() -> None:
    m = BrokerMetrics()
    m.published("t", 10, 1000, 0.004)
    m.published("t", 1, 50, 0.2)
    m.dispatched("t", "a", 10, 1000)
    m.dispatched("t", "b", 1, 50)
    c = m.topic("t")
    assert (c.msg_published, c.bytes_published, c.msg_out, c.bytes_out) == (11, 1050, 11, 1050)
    assert c.sub_msg_out == {"a": 10, "b": 1}
    assert m.publish_latency.count == 2
    m.forget("t")
    assert m.topic("t").msg_out == 0


def test_render_is_prometheus_text_with_escaped_labels_and_cumulative_buckets() -> None:
    m = BrokerMetrics()
    for v in (0.0001, 0.003, 0.003, 7.0):
        m.publish_latency.observe(v)
    text = render(
        [("x_total", "counter", "a counter", [Sample("x_total", {"topic": 'we"ird\\name\n'}, 3)])],
        [({"broker": "b1"}, m.publish_latency)],
    )
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert all(SAMPLE.match(ln) for ln in lines), lines
    assert 'x_total{topic="we\\"ird\\\\name\\n"} 3' in lines
    buckets = [ln for ln in lines if "_bucket" in ln]
    counts = [int(ln.rsplit(" ", 1)[1]) for ln in buckets]
    assert counts == sorted(counts) and counts[-1] == 4
    assert buckets[-1].startswith('pulsar_broker_publish_latency_seconds_bucket{broker="b1",le="+Inf"}')
    assert "# TYPE pulsar_broker_publish_latency_seconds histogram" in text


def test_individually_deleted_ranges_read_as_pulsar_prints_them() -> None:
    assert _ranges_text([]) == "[]"
    ranges = [(Position(3, 5), Position(3, 7)), (Position(3, 9), Position(4, 0))]
    assert _ranges_text(ranges) == "[(3:4..3:7],(3:8..4:0]]"
