"""`ledgerstore bench` runs end to end (a smoke test of the commands, never of their speed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerstore.bench import block_device, disk_meter

LEDGERSTORE = [str(Path(sys.executable).parent / "ledgerstore")]  # the console script of this venv


def _bench(tmp_path: Path, *args: str) -> dict:
    out = subprocess.run(
        [*LEDGERSTORE, "bench", *args, "--duration", "1", "--runs", "1", "--outstanding", "50", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "run 1/1" in out.stderr  # progress goes to stderr: with --json, stdout is the JSON document alone
    return json.loads(out.stdout)


def test_bench_bookie_reports_throughput_latency_cpu_and_limits(tmp_path: Path) -> None:
    r = _bench(tmp_path, "bookie", "--plot", str(tmp_path / "latency.png"))
    assert (tmp_path / "latency.png").stat().st_size > 0
    assert r["acked"] > 0 and r["errors"] == 0
    assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["p999_ms"]
    for key in ("fsync_1k_per_s", "seq_write_fsync_4mib_bytes_per_s", "disk_bound_adds_per_s"):
        assert r[key] > 0, key
    assert r["cpu_us_per_add_bookie"] > 0 and r["cpu_us_per_add_client"] > 0
    assert r["per_run_adds_per_s"] == [round(r["acked_adds_per_s"])]
    if block_device(tmp_path) is not None:  # the disk's own view of the run (absent on tmpfs)
        assert r["disk_write_mb_per_s"] > 0 and 0 < r["disk_busy_pct"] <= 100


def test_disk_meter_sees_a_write_reach_the_disk(tmp_path: Path) -> None:
    if block_device(tmp_path) is None:
        pytest.skip("no block device under the temp dir")
    # several synced writes: the device's busy time advances a clock tick at a time, so one fast 8 MiB write
    # could end inside a tick and show 0 % busy (seen: 844.7 MB/s and 0.0 %)
    with disk_meter(tmp_path) as d, open(tmp_path / "blob", "wb") as f:
        for _ in range(16):
            f.write(b"x" * (4 << 20))
            f.flush()
            os.fsync(f.fileno())
    assert d["disk_write_mb_per_s"] > 0 and d["disk_busy_pct"] > 0


@pytest.mark.parametrize("quorum", [("3", "3", "2"), ("3", "2", "2")])
def test_bench_ledger_reports_throughput_latency_cpu_and_limits(
    tmp_path: Path, quorum: tuple[str, ...]
) -> None:
    e, w, a = quorum
    r = _bench(tmp_path, "ledger", "-E", e, "-W", w, "-A", a)
    assert r["acked"] > 0 and r["errors"] == 0
    assert r["E/Qw/Qa"] == f"{e}/{w}/{a}"
    assert r["disk_bound_entries_per_s"] > 0
    assert r["per_run_entries_per_s"] == [round(r["acked_entries_per_s"])]
    assert all(r[f"cpu_us_per_entry_bookie{i}"] > 0 for i in (1, 2, 3))
    # the bookies' group commit in the same runs, from their /metrics (a batch ends on a 4 KiB boundary)
    assert r["journal_syncs_per_s"] > 0 and r["journal_kib_per_sync"] >= 4
    assert r["journal_sync_ms"] > 0 and r["bookie_add_ms"] > 0


@pytest.mark.parametrize(
    "mode", [("tasks", "asyncio", "50"), ("futures", "uvloop", "50"), ("await", "uvloop", "1")]
)
def test_bench_ledger_measures_each_way_of_writing_appends(
    tmp_path: Path, mode: tuple[str, str, str]
) -> None:
    """--mode tasks (create_task(lh.append(d)) per entry), futures (a window of append_future), await
    (coroutines awaiting lh.append; --outstanding 1 is the one-at-a-time latency) report like callbacks, with
    the client's garbage collector (its thresholds set by --gc-threshold for the tasks run)."""
    name, loop, outstanding = mode
    gc_args = ["--gc-threshold", "50000,40,30"] if name == "tasks" else []
    out = subprocess.run(
        [*LEDGERSTORE, "bench", "ledger", "--mode", name, "--loop", loop, "--outstanding", outstanding]
        + ["--duration", "1", "--runs", "1", "--json", *gc_args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["append_mode"] == name and r["loop"] == loop and r["outstanding"] == int(outstanding)
    assert r["acked"] > 0 and r["errors"] == 0
    assert 0 < r["p50_ms"] <= r["p99_ms"]
    assert r["gc_threshold"] == ("50000,40,30" if gc_args else "700,10,10")
    assert r["client_gc_collections"] >= r["client_gc_full_collections"] >= 0
    assert r["gc_us_per_entry_client"] >= 0 and r["client_gc_cpu_ms"] >= 0


def test_bench_rereplication_reports_the_rate_and_the_writers_latency(tmp_path: Path) -> None:
    """A tiny run of one (throttled) phase: the killed bookie's entries are all copied back (AutoRecovery's own
    count), the rates are over the copy's duration, and the writer's latency is split at the kill. (The
    unthrottled phase of ``--compare-throttle`` runs the same code on a fresh cluster: one phase keeps this
    quick.)"""
    out = subprocess.run(
        [*LEDGERSTORE, "bench", "rereplication", "--size-mb", "2", "--ledgers", "2", "--bookies", "4"]
        + ["--write-rate", "100", "--baseline-s", "1", "--throttle-mb", "4", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-2000:] + out.stdout[-1000:]  # with --json the error is on stdout
    assert (
        "kill -9" in out.stderr and "repaired" in out.stderr
    )  # progress on stderr, the JSON alone on stdout
    r = json.loads(out.stdout)
    assert r["mode"] == "rereplication" and r["E/Qw/Qa"] == "3/2/2" and r["bookies"] == 4
    assert "unthrottled" not in r and "throttled" not in r  # one phase: its figures at the top level
    assert r["throttle_mb_per_s_per_worker"] == 4.0
    assert r["victim_entries"] == 2048 and r["copied_entries"] == r["victim_entries"], r
    assert 0 < r["detect_s"] < r["recovery_s"] and 0 < r["copy_s"] <= r["recovery_s"]
    assert r["rereplication_entries_per_s"] > 0 and r["rereplication_mb_per_s"] > 0
    assert r["writer_errors"] == 0
    assert r["writer_before"]["acked"] > 0 and r["writer_during"]["acked"] > 0
    assert 0 < r["writer_during"]["p50_ms"] <= r["writer_during"]["p99_ms"]
    assert not list(tmp_path.glob("ls-bench-rerep-*"))  # the throwaway clusters are gone
