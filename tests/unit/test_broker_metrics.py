"""The broker's metrics: counters per topic/subscription and the Prometheus families they export."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bookie.metrics import ServerMetrics
from topic_broker.admin import _ranges_text
from topic_broker.managed_ledger import Position
from topic_broker.metrics import BrokerMetrics, Families


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


def test_families_render_through_prometheus_client_with_escaped_labels_and_cumulative_buckets() -> None:
    m = BrokerMetrics()
    for v in (0.0001, 0.003, 0.003, 7.0):
        m.publish_latency.observe(v)
    fam = Families()
    weird = 'we"ird\\name\n'
    fam.add("pulsar_in_messages_total", {"topic": weird}, 3)
    fam.add("pulsar_in_messages_total", {"topic": "plain"}, 5)
    fam.add("pulsar_subscription_back_log", {"topic": "plain", "subscription": "s"}, 7)
    exported = ServerMetrics()
    exported.add_collector(lambda: [*fam.families(), m.publish_latency.family({"broker": "b1"})])
    text = exported.exposition().decode()
    assert "# TYPE pulsar_in_messages_total counter" in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["pulsar_in_messages"].type == "counter"
    assert {s.labels["topic"]: s.value for s in families["pulsar_in_messages"].samples} == {
        weird: 3,
        "plain": 5,
    }
    (backlog,) = families["pulsar_subscription_back_log"].samples
    assert backlog.labels == {"topic": "plain", "subscription": "s"} and backlog.value == 7
    h = families["pulsar_broker_publish_latency_seconds"]
    assert h.type == "histogram"
    buckets = [s for s in h.samples if s.name.endswith("_bucket")]
    counts = [s.value for s in buckets]
    assert (
        counts == sorted(counts) and buckets[-1].labels == {"broker": "b1", "le": "+Inf"} and counts[-1] == 4
    )
    assert [s.value for s in buckets if s.labels["le"] == "0.005"] == [3]
    (total,) = [s.value for s in h.samples if s.name.endswith("_sum")]
    assert abs(total - 7.0061) < 1e-9


def test_an_unknown_family_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no metric family 'pulsar_nonsense'"):
        Families().add("pulsar_nonsense", {}, 1)


def test_individually_deleted_ranges_read_as_pulsar_prints_them() -> None:
    assert _ranges_text([]) == "[]"
    ranges = [(Position(3, 5), Position(3, 7)), (Position(3, 9), Position(4, 0))]
    assert _ranges_text(ranges) == "[(3:4..3:7],(3:8..4:0]]"
