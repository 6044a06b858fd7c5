"""The topic bench's latency-over-time trace and the log events shown beside it."""

from __future__ import annotations

import time
from array import array
from pathlib import Path

import pytest

from ledgerstore.bench_topic import (
    DiskWatch,
    disk_of,
    disk_stalls,
    diskstats,
    fsync_tail,
    latency_trace,
    log_events,
    metric_value,
)


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


FSYNC_METRICS = """# HELP bookie_journal_fsync_seconds Journal fdatasync latency per batch
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
    with pytest.raises(ValueError, match="no bookie_journal_fsync_seconds bucket with the bound 0.5"):
        fsync_tail(FSYNC_METRICS, (0.5,))
    with pytest.raises(ValueError, match="no bookie_journal_fsync_seconds histogram"):
        fsync_tail("bookie_add_latency_seconds_count 3.0\n")


def test_metric_value_reads_one_unlabelled_sample() -> None:
    text = "# HELP bookie_read_bytes_total Bytes\nbookie_read_bytes_total 1.5e+06\nbookie_reads_total 7.0\n"
    assert metric_value(text, "bookie_read_bytes_total") == 1.5e6
    assert metric_value(text, "bookie_reads_total") == 7.0
    with pytest.raises(ValueError, match="no bookie_adds_total"):
        metric_value(text, "bookie_adds_total")


def test_fsync_tail_reads_the_adds_histogram_too() -> None:
    # the adds' latency includes the journal's write, which the fsync histogram leaves out
    text = (
        FSYNC_METRICS
        + 'bookie_add_latency_seconds_bucket{le="+Inf"} 9.0\nbookie_add_latency_seconds_count 9.0\n'
    )
    assert fsync_tail(text, (0.1,), "bookie_add_latency_seconds") == [8.0]
    with pytest.raises(ValueError, match="no bookie_add_latency_seconds bucket with the bound 0.25"):
        fsync_tail(text, (0.25,), "bookie_add_latency_seconds")
    with pytest.raises(ValueError, match="no bookie_add_latency_seconds histogram"):
        fsync_tail(FSYNC_METRICS.replace("bookie_add", "other"), (0.1,), "bookie_add_latency_seconds")


DISKSTATS = (
    " 253       0 vda 9 0 72 3 100 5 800 40 2 50 60 7 0 0 0 11 3\n"
    " 253       1 vda1 4 0 32 1 30 1 240 9 0 8 10\n"
)


def test_diskstats_counts_writes_completed_and_requests_in_flight() -> None:
    # writes 100 + flushes 11 completed (not the reads or discards); 2 in flight
    assert diskstats("vda", DISKSTATS) == (111, 2)
    assert diskstats("vda1", DISKSTATS) == (30, 0)  # an older kernel's line: no flush field
    with pytest.raises(ValueError, match="no device sdz"):
        diskstats("sdz", DISKSTATS)


def test_disk_stalls_are_spans_with_requests_in_flight_and_nothing_completed() -> None:
    samples = [
        (0.00, 10, 0),
        (0.05, 10, 0),  # idle: nothing asked, no stall
        (0.10, 12, 1),
        (0.15, 12, 3),  # asked, nothing completes from here ...
        (0.20, 12, 3),
        (0.30, 12, 2),
        (0.35, 13, 0),  # ... to here: 200 ms
        (0.40, 13, 1),
        (0.45, 13, 1),  # 50 ms: under the bound
        (0.50, 20, 0),
        (0.60, 20, 4),
        (0.75, 20, 4),  # still stalled when the watch ended: 150 ms so far
    ]
    assert disk_stalls(samples, 0.1) == [(0.15, 0.35), (0.60, 0.75)]
    assert disk_stalls(samples, 0.05) == [(0.15, 0.35), (0.40, 0.50), (0.60, 0.75)]
    assert disk_stalls([], 0.1) == []


def test_disk_watch_samples_the_disk_of_a_path(tmp_path: Path) -> None:
    name = disk_of(str(tmp_path))
    with DiskWatch(name, every_s=0.005) as watch:
        time.sleep(0.1)
    if name is None:  # tmpfs or a device the kernel does not list: nothing sampled
        assert watch.samples == []
    else:
        assert len(watch.samples) >= 5
        assert all(
            a[0] < b[0] and a[1] <= b[1] for a, b in zip(watch.samples, watch.samples[1:], strict=False)
        )
    assert DiskWatch(None).__enter__().samples == []


def test_medians_keep_each_run_s_gap_and_disk_stall() -> None:
    from ledgerstore.bench_topic import _medians

    runs = [
        {
            "msg_per_s": 10,
            "p99_ms": 300.0,
            "max_gap_ms": 266.7,
            "gap_at_s": 3.69,
            "disk_stalls_over_100ms": 2,
        },
        {
            "msg_per_s": 12,
            "p99_ms": 170.0,
            "max_gap_ms": 109.2,
            "gap_at_s": 9.67,
            "disk_stalls_over_100ms": 0,
        },
        {"msg_per_s": 11, "p99_ms": 631.4, "max_gap_ms": 571.9, "gap_at_s": 1.4, "disk_stalls_over_100ms": 1},
    ]
    runs[0].update(disk_stall_max_ms=262.5, disk_stall_at_s=3.7)
    runs[2].update(disk_stall_max_ms=559.2, disk_stall_at_s=1.41)
    row = _medians(runs)
    assert row["p99_ms"] == 300.0
    assert row["runs_max_gap_ms"] == [266.7, 109.2, 571.9]
    assert row["runs_gap_at_s"] == [3.69, 9.67, 1.4]
    assert row["runs_disk_stall_max_ms"] == [262.5, 0.0, 559.2]
    assert row["runs_disk_stall_at_s"] == [3.7, None, 1.41]
    assert "runs_disk_stall_max_ms" not in _medians([{"msg_per_s": 1, "p99_ms": 2.0}])
