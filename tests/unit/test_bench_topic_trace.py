"""The topic bench's latency-over-time trace and the log events shown beside it."""

from __future__ import annotations

import time
from array import array
from pathlib import Path

import pytest

from ledgerstore.bench_topic import fsync_tail, latency_trace, log_events, metric_value


def test_the_trace_names_the_stalled_window_and_the_longest_gap() -> None:
    t0 = 1000.0
    # consumer 1: a message every 10 ms with 5 ms latency, except a 600 ms stall at 2.0 s
    at1 = [t0 + i * 0.01 for i in range(200)] + [t0 + 2.6 + i * 0.01 for i in range(100)]
    lat1 = [5.0] * 200 + [600.0 - i * 10 for i in range(60)] + [5.0] * 40
    at2 = [t0 + 0.005 + i * 0.01 for i in range(100)]  # consumer 2 stops after 1 s
    lat2 = [4.0] * 100
    out = latency_trace([(array("d", at1), array("d", lat1)), (at2, lat2)], t0, window_s=0.1, worst=2)
    assert out["worst_windows"] == [[2.6, 600.0, 10], [2.7, 500.0, 10]]
    assert out["max_gap_ms"] == pytest.approx(610.0, abs=0.5)
    assert out["gap_at_s"] == pytest.approx(1.99, abs=0.005)


def test_the_trace_refuses_mismatched_samples_and_bad_windows() -> None:
    with pytest.raises(ValueError, match="2 receive times for 1 latencies"):
        latency_trace([([1.0, 2.0], [3.0])], 0.0)
    with pytest.raises(ValueError, match="window_s > 0"):
        latency_trace([], 0.0, window_s=0)
    assert latency_trace([], 0.0) == {"worst_windows": [], "max_gap_ms": 0.0, "gap_at_s": 0.0}


def test_log_events_keeps_the_run_s_warnings_and_storage_events(tmp_path: Path) -> None:
    start = time.mktime(time.strptime("2026-11-27 20:30:00", "%Y-%m-%d %H:%M:%S"))
    broker = tmp_path / "broker.log"
    broker.write_text(
        "2026-11-27 20:29:59,900 WARNING x: stall: before the run\n"
        "2026-11-27 20:30:01,250 INFO x: now serves topic=t\n"
        "2026-11-27 20:30:02,500 WARNING topic_broker.main: stall: the event loop was 300 ms late\n"
        "not a log line\n"
    )
    bookie = tmp_path / "bookie-1.log"
    bookie.write_text(
        "2026-11-27 20:30:01,000 INFO bookie.journal: journal rotated to segment 3\n"
        "2026-11-27 20:30:03,000 INFO bookie.gc: bookie=b gc: 2 ledgers deleted\n"
        "2026-11-27 20:30:04,000 INFO bookie.server: a routine line\n"
    )
    got = log_events([broker, bookie, tmp_path / "missing.log"], start, start + 10)
    assert got == [
        "+1.00s bookie-1.log: INFO bookie.journal: journal rotated to segment 3",
        "+2.50s broker.log: WARNING topic_broker.main: stall: the event loop was 300 ms late",
        "+3.00s bookie-1.log: INFO bookie.gc: bookie=b gc: 2 ledgers deleted",
    ]
    assert log_events([broker], start, start + 10, limit=0) == []


FSYNC_METRICS = """# HELP bookie_journal_fsync_seconds Journal write+fsync latency
# TYPE bookie_journal_fsync_seconds histogram
bookie_journal_fsync_seconds_bucket{le="0.05"} 327.0
bookie_journal_fsync_seconds_bucket{le="0.1"} 328.0
bookie_journal_fsync_seconds_bucket{le="0.25"} 330.0
bookie_journal_fsync_seconds_bucket{le="+Inf"} 334.0
bookie_journal_fsync_seconds_count 334.0
bookie_add_latency_seconds_bucket{le="0.1"} 1.0
"""


def test_fsync_tail_counts_the_syncs_over_each_bound() -> None:
    assert fsync_tail(FSYNC_METRICS) == [6.0, 4.0]
    assert fsync_tail(FSYNC_METRICS, (0.05,)) == [7.0]
    with pytest.raises(ValueError, match="no fsync bucket with the bound 0.5"):
        fsync_tail(FSYNC_METRICS, (0.5,))
    with pytest.raises(ValueError, match="no bookie_journal_fsync_seconds histogram"):
        fsync_tail("bookie_add_latency_seconds_count 3.0\n")


def test_metric_value_reads_one_unlabelled_sample() -> None:
    text = "# HELP bookie_read_bytes_total Bytes\nbookie_read_bytes_total 1.5e+06\nbookie_reads_total 7.0\n"
    assert metric_value(text, "bookie_read_bytes_total") == 1.5e6
    assert metric_value(text, "bookie_reads_total") == 7.0
    with pytest.raises(ValueError, match="no bookie_adds_total"):
        metric_value(text, "bookie_adds_total")
