"""The analysis jobs over a live cluster, in the session's local[2] Spark."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ledger_client import ClientConfig
from ledger_client.sync import BookKeeper
from spark.jobs import JOBS, JobOptions

PW = "pw"


def _write(bk: BookKeeper) -> tuple[int, int]:
    small = bk.create_ledger(3, 2, 2, password=PW.encode())
    small.append_many([b"s" * 100] * 300)
    small.close()
    mixed = bk.create_ledger(3, 3, 2, password=PW.encode())
    mixed.append_many([b"m" * (10 if i % 10 else 5000) for i in range(200)])  # one in ten is big
    # the second stays open: wait until the bookies know its LAC (the writer sends it within 0.5 s)
    reader = bk.open_ledger(mixed.ledger_id, PW.encode(), recovery=False)
    deadline = time.monotonic() + 10
    while reader.read_last_add_confirmed() < 199 and time.monotonic() < deadline:
        time.sleep(0.1)
    return small.ledger_id, mixed.ledger_id


def test_ledger_health_and_entry_sizes_jobs_report_and_chart(
    bookies: Any, spark: Any, tmp_path: Path
) -> None:
    procs = bookies.start_many(3)
    writer = BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    small, mixed = _write(writer)
    opts = JobOptions(zk=bookies.zk, zk_root=bookies.root, password=PW, out_dir=tmp_path)

    health = JOBS["ledger-health"].run(spark, opts)
    ledgers = {r["ledger"]: r for r in health.tables[0].as_dicts()}
    assert ledgers[small]["entries"] == 300 and ledgers[small]["bytes"] == 300 * 100
    assert ledgers[small]["state"] == "CLOSED" and ledgers[small]["ensemble changes"] == 0
    assert ledgers[mixed]["state"] == "OPEN" and ledgers[mixed]["entries"] == 200
    per_bookie = {r["bookie"]: r for r in health.tables[1].as_dicts()}
    assert set(per_bookie) == {bp.id for bp in procs}
    # 300 entries x Qw 2 + (>=199) entries x Qw 3, evenly spread over three bookies
    assert sum(r["replicas"] for r in per_bookie.values()) == 600 + 3 * ledgers[mixed]["entries"]
    assert all(r["status"] == "writable" for r in per_bookie.values())
    assert health.chart == tmp_path / "ledger-health.png" and health.chart.stat().st_size > 1000
    assert "Entry replicas per bookie" in health.render()

    sizes = JOBS["entry-sizes"].run(spark, opts)
    rows = {r["ledger"]: r for r in sizes.tables[0].as_dicts()}
    assert (rows[small]["p50"], rows[small]["p99"], rows[small]["max"]) == (100, 100, 100)
    assert rows[mixed]["p50"] == 10 and rows[mixed]["p99"] == 5000 and rows[mixed]["min"] == 10
    assert rows["all"]["entries"] == 300 + rows[mixed]["entries"]
    dist = dict(sizes.tables[1].rows)
    assert dist["64-127"] == 300 and dist["4096-8191"] == 20
    assert sizes.chart is not None and sizes.chart.stat().st_size > 1000
    writer.close()
