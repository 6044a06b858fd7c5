"""Analyses users run over their logs, each one Spark job: ``ledgerstore spark JOB [--master URL]``.

    from spark.jobs import JOBS, JobOptions
    result = JOBS["ledger-health"].run(session, JobOptions(zk="127.0.0.1:2181", out_dir=Path("out")))
    print(result.render())            # the summary tables; result.chart is the PNG written to out_dir

Jobs: ``ledger-health`` (:mod:`spark.jobs.ledger_health`), ``entry-sizes`` (:mod:`spark.jobs.entry_sizes`) over
the ``ledger`` source; ``topic-volume`` (:mod:`spark.jobs.topic_volume`) over the ``topic`` source. A job
registers the sources itself and computes on the executors; only the summary (one row per ledger, bookie, topic
or minute) comes back to the driver.

:func:`demo_summary` runs one job in a local Spark of its own and returns the summary text (what
``ledgerstore demo`` ends with).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from spark.jobs.common import Job, JobOptions, JobResult, Table, local_session
from spark.jobs.entry_sizes import JOB as ENTRY_SIZES
from spark.jobs.ledger_health import JOB as LEDGER_HEALTH
from spark.jobs.topic_volume import JOB as TOPIC_VOLUME

__all__ = ["JOBS", "Job", "JobOptions", "JobResult", "Table", "demo_summary"]

#: name -> job
JOBS: dict[str, Job] = {job.name: job for job in (LEDGER_HEALTH, ENTRY_SIZES, TOPIC_VOLUME)}


def demo_summary(
    zk: str,
    zk_root: str,
    out_dir: Path,
    *,
    topics: Sequence[str] = (),
    ledgers: Sequence[int] = (),
    password: str = "",
    master: str = "local[2]",
) -> str:
    """Run ``topic-volume`` over ``topics`` (or, with no topics, ``entry-sizes`` over ``ledgers``) in a Spark
    session of its own (started and stopped here; an active session is used and left running), write the report and chart to ``out_dir`` and return the
    summary text. Raises whatever stops Spark from starting or the job from running (no Java, no pyspark):
    the caller decides whether that is fatal."""
    if not topics and not ledgers:
        raise ValueError("demo_summary needs topics or ledgers")
    opts = JobOptions(
        zk=zk,
        zk_root=zk_root,
        password=password,
        out_dir=out_dir,
        topics=",".join(topics) if topics else None,
        ledgers=",".join(str(lid) for lid in ledgers) if ledgers else "all",
    )
    from pyspark.sql import SparkSession

    job = TOPIC_VOLUME if topics else ENTRY_SIZES
    ours = SparkSession.getActiveSession() is None  # a session already running is the caller's to stop
    session = local_session(f"ledgerstore demo {job.name}", master)
    try:
        result = job.run(session, opts)
    finally:
        if ours:
            session.stop()
    result.write(out_dir)
    return result.render()
