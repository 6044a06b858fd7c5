"""``ledgerstore bench spark`` end to end at a small size: it writes, reads raw, scans with Spark (full and narrow
schema), checks every scan's count, bytes and CRC32 sum against what it wrote, and reports the ratios."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_bench_spark_small_run_reports_checked_scans_beside_the_raw_read(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ledgerstore.cli",
            "bench",
            "spark",
            "--size-mb",
            "4",
            "--runs",
            "1",
            "--warmup-runs",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    assert r["mode"] == "spark" and r["entries"] == 4096 and r["bytes"] == 4 * 1024 * 1024
    assert r["E/Qw/Qa"] == "3/2/2" and r["ledgers"] == 4
    for phase in ("raw", "spark_count", "spark_checksum", "spark_narrow_checksum"):
        assert r[f"{phase}_entries_per_s"] > 0 and r[f"{phase}_mb_per_s"] > 0
    assert r["spark_checksum_vs_raw_pct"] > 0 and isinstance(r["spark_vs_raw_target_met"], bool)
    # CPU per row of its own processes: the raw read's client here, the scans' reading in the Python workers.
    # The bookies' share of a 4 MiB read is a few ms, below /proc's 10 ms tick: reported, maybe as 0.
    assert r["raw_cpu_us_per_row_client"] > 0 and r["raw_cpu_us_per_row_bookies"] >= 0
    for phase in ("spark_count", "spark_checksum", "spark_narrow_checksum"):
        assert r[f"{phase}_cpu_us_per_row_python_workers"] > 0 and r[f"{phase}_cpu_us_per_row_jvm"] > 0
        assert r[f"{phase}_cpu_us_per_row_bookies"] >= 0
    assert "run 1/1" in proc.stderr and "writing" in proc.stderr  # progress on stderr, JSON alone on stdout
    # the warm-up run (the first read after the write, Spark's cold JIT) is shown, not counted
    assert "warm-up run 1/1" in proc.stderr and r["warmup_runs"] == 1 and r["runs"] == 1
    assert len(r["per_run_raw_entries_per_s"]) == len(r["per_run_spark_checksum_entries_per_s"]) == 1
