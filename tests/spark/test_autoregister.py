"""`spark.read.format("ledger")` / `format("topic")` / `format("pulsar")` work in a plain PySpark session with no
`register()` call: PySpark registers the `DefaultSource` of every top-level `pyspark_*` module it finds."""

from __future__ import annotations

import os
import subprocess
import sys

_SCRIPT = """
from pyspark.sql import SparkSession
s = SparkSession.builder.master("local[1]").getOrCreate()
for fmt in ("ledger", "topic", "pulsar"):
    try:
        s.read.format(fmt).option("noSuchOption", "x").load()
    except Exception as e:
        print(fmt, "DATA_SOURCE_NOT_FOUND" in str(e), "nosuchoption" in str(e).lower())
s.stop()
"""


def test_both_sources_are_found_without_register(tmp_path) -> None:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert r.returncode == 0, r.stderr[-2000:]
    # found (not DATA_SOURCE_NOT_FOUND), and our own option check named the bad option
    assert "ledger False True" in r.stdout and "topic False True" in r.stdout, r.stdout + r.stderr[-2000:]
    # the topic source under pulsar-spark's name
    assert "pulsar False True" in r.stdout, r.stdout + r.stderr[-2000:]
