"""A server's metrics through prometheus_client: values read at scrape time, one registry per instance, counter
names kept, histograms cumulative; AutoRecovery's table exported with its types."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from autorecovery.metrics import ROWS, Metrics
from bookie.metrics import Histogram, ServerMetrics


def samples(m: ServerMetrics) -> dict[str, Sample]:
    text = m.exposition().decode()
    return {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}


def test_counters_and_gauges_are_read_when_scraped_and_keep_their_names() -> None:
    state = {"adds": 0, "open": 3}
    m = ServerMetrics()
    m.counter("bookie_adds_total", "adds", lambda: state["adds"])
    m.gauge("bookie_connections", "connections", lambda: state["open"])
    assert samples(m)["bookie_adds_total"].value == 0
    state["adds"], state["open"] = 1_234_567, 0
    got = samples(m)
    assert got["bookie_adds_total"].value == 1_234_567 and got["bookie_connections"].value == 0
    text = m.exposition().decode()
    assert "# TYPE bookie_adds_total counter" in text and "# TYPE bookie_connections gauge" in text
    assert "_created" not in text  # no extra series beside the counters of before


def test_each_instance_has_its_own_registry() -> None:
    a, b = ServerMetrics(), ServerMetrics()
    for i, m in enumerate((a, b)):
        m.counter("bookie_adds_total", "adds", lambda i=i: 10 + i)
    assert a.registry is not b.registry
    assert samples(a)["bookie_adds_total"].value == 10 and samples(b)["bookie_adds_total"].value == 11


def test_a_counter_without_the_total_suffix_is_refused() -> None:
    with pytest.raises(ValueError, match="bookie_adds: a counter's name ends in _total"):
        ServerMetrics().counter("bookie_adds", "adds", lambda: 0)


def test_histogram_buckets_are_cumulative_and_end_with_inf() -> None:
    m = ServerMetrics()
    h = m.histogram("bookie_add_latency_seconds", "latency", (0.001, 0.01))
    for v in (0.0005, 0.001, 0.005, 3.0):
        h.observe(v)
    got = samples(m)
    exposed = text_string_to_metric_families(m.exposition().decode())
    families = [
        f for f in exposed if not f.name.startswith("process_")
    ]  # (the process's own: every server has them)
    assert [f.type for f in families] == ["histogram"]
    buckets = [s for s in families[0].samples if s.name.endswith("_bucket")]
    assert [(s.labels["le"], s.value) for s in buckets] == [("0.001", 2), ("0.01", 3), ("+Inf", 4)]
    assert got["bookie_add_latency_seconds_count"].value == 4
    assert got["bookie_add_latency_seconds_sum"].value == pytest.approx(3.0065)
    with pytest.raises(ValueError, match="increasing"):
        Histogram("x_seconds", "x", (0.1, 0.01))


def test_autorecovery_exports_its_table_with_types() -> None:
    ar = Metrics(rereplicated_entries_total=7, oldest_mark_age_s=1.23456, is_auditor=1)
    m = ServerMetrics()
    ar.register(m, "AutoRecovery in this bookie: ")
    families = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    for name, kind, help_text, _ in ROWS:
        family = families[name.removesuffix("_total")]
        assert (family.type, family.documentation) == (kind, f"AutoRecovery in this bookie: {help_text}")
    got = samples(m)
    assert got["rereplicated_entries_total"].value == 7 and got["autorecovery_is_auditor"].value == 1
    assert got["under_replicated_oldest_mark_seconds"].value == 1.235
    ar.rereplicated_entries_total += 1
    assert samples(m)["rereplicated_entries_total"].value == 8
