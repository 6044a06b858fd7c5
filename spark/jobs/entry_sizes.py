"""``entry-sizes``: entry size percentiles (p50/p90/p99) and volume per ledger, and the size distribution.

Percentiles are Spark's ``percentile_approx`` (accuracy 10,000: within 0.01 % of the rank); the distribution is
counted in power-of-two size buckets on the executors.
"""

from __future__ import annotations

from typing import Any

from spark.jobs import common
from spark.jobs.common import Job, JobOptions, JobResult, Table, ledger_frame, new_figure, save_figure

__all__ = ["JOB", "run"]

_QUANTILES = [0.5, 0.9, 0.99]
_ACCURACY = 10_000


def _aggregates() -> list[Any]:
    from pyspark.sql import functions as F

    return [
        F.count("*").alias("entries"),
        F.sum("length").alias("bytes"),
        F.min("length").alias("min"),
        F.percentile_approx("length", _QUANTILES, _ACCURACY).alias("q"),
        F.max("length").alias("max"),
        F.avg("length").alias("mean"),
    ]


def _row(label: Any, r: Any) -> list[Any]:
    q = r["q"] or [0, 0, 0]
    return [label, r["entries"], r["bytes"] or 0, r["min"] or 0, *q, r["max"] or 0, float(r["mean"] or 0.0)]


def run(session: Any, opts: JobOptions) -> JobResult:
    from pyspark.sql import functions as F

    df = ledger_frame(session, opts, ["ledger_id", "length"]).cache()
    try:
        per_ledger = df.groupBy("ledger_id").agg(*_aggregates()).orderBy("ledger_id").collect()
        overall = df.agg(*_aggregates()).collect()[0]
        buckets = (
            df.select(F.floor(F.log2(F.greatest(F.col("length"), F.lit(1)))).cast("int").alias("b"))
            .groupBy("b")
            .count()
            .orderBy("b")
            .collect()
        )
    finally:
        df.unpersist()
    columns = ["ledger", "entries", "bytes", "min", "p50", "p90", "p99", "max", "mean"]
    rows = [_row(r["ledger_id"], r) for r in per_ledger]
    if overall["entries"]:
        rows.append(_row("all", overall))
    dist = [[f"{1 << r['b']}-{(2 << r['b']) - 1}", r["count"]] for r in buckets]
    result = JobResult(
        job="entry-sizes",
        tables=[
            Table("Entry sizes per ledger (bytes)", columns, rows),
            Table("Entry size distribution", ["size (bytes)", "entries"], dist),
        ],
    )
    result.chart = save_figure(_figure(rows, dist), opts.out_dir / "entry-sizes.png")
    return result


def _figure(rows: list[list[Any]], dist: list[list[Any]]) -> Any:
    fig, (left, right) = new_figure(2, "entry sizes")
    left.bar([d[0] for d in dist], [d[1] for d in dist], color="tab:blue")
    left.set_xlabel("entry size, bytes (power-of-two buckets)")
    left.set_ylabel("entries")
    left.set_title("distribution")
    left.tick_params(axis="x", labelrotation=45)
    ledgers = [r for r in rows if r[0] != "all"]
    xs = range(len(ledgers))
    for k, (name, col) in enumerate((("p50", 4), ("p90", 5), ("p99", 6))):
        right.bar([x + (k - 1) * 0.27 for x in xs], [r[col] for r in ledgers], width=0.27, label=name)
    right.set_xticks(list(xs), [str(r[0]) for r in ledgers] if len(ledgers) <= 20 else [""] * len(ledgers))
    right.set_xlabel("ledger")
    right.set_ylabel("bytes")
    right.set_title("percentiles per ledger")
    right.legend()
    if not dist:
        common.empty_panel(left, "no entries")
    if not ledgers:
        common.empty_panel(right, "no ledgers")
    return fig


JOB = Job("entry-sizes", "entry size percentiles and volume per ledger, and the size distribution", run)
