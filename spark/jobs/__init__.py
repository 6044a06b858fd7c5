"""Analyses users run over their logs, each one Spark job: ``ledgerstore spark JOB [--master URL]``.

    from spark.jobs import JOBS, JobOptions
    result = JOBS["ledger-health"].run(session, JobOptions(zk="127.0.0.1:2181", out_dir=Path("out")))
    print(result.render())            # the summary tables; result.chart is the PNG written to out_dir

Jobs: ``ledger-health`` (:mod:`spark.jobs.ledger_health`), ``entry-sizes`` (:mod:`spark.jobs.entry_sizes`) over
the ``ledger`` source; ``topic-volume`` (:mod:`spark.jobs.topic_volume`) over the ``topic`` source. A job
registers the sources itself and computes on the executors; only the summary (one row per ledger, bookie, topic
or minute) comes back to the driver.

:func:`demo_summary` runs ``topic-volume`` (or ``ledger-health``) in a local Spark of its own and returns the
summary text (what ``ledgerstore demo`` ends with).
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
    topic_password: str = "",
    ledger_password: str = "",
    master: str = "local[2]",
) -> str:
    """Run ``topic-volume`` over ``topics`` and, when there are no topics or they hold no messages (a topic
    whose subscriptions acknowledged everything has its ledgers trimmed unless retention is set),
    ``ledger-health`` over ``ledgers``, in a Spark session of its own (started and stopped here; an active
    session is used and left running). Writes each job's report and chart to ``out_dir`` and returns the
    summary text. Raises whatever stops Spark from starting or a job from running (no Java, no pyspark): the
    caller decides whether that is fatal."""
    from pyspark.sql import SparkSession

    if not topics and not ledgers:
        raise ValueError("demo_summary needs topics or ledgers")
    ours = SparkSession.getActiveSession() is None  # a session already running is the caller's to stop
    session = local_session("ledgerstore demo analysis", master)
    parts: list[str] = []
    try:
        if topics:
            opts = JobOptions(
                zk=zk, zk_root=zk_root, password=topic_password, out_dir=out_dir, topics=",".join(topics)
            )
            result = TOPIC_VOLUME.run(session, opts)
            result.write(out_dir)
            if any(row[1] for row in result.tables[0].rows) or not ledgers:  # messages, not rows of zeros
                return result.render()
            parts.append(
                f"no messages left in {', '.join(topics)} (consumed ledgers are trimmed without retention)"
            )
        opts = JobOptions(
            zk=zk,
            zk_root=zk_root,
            password=ledger_password,
            out_dir=out_dir,
            ledgers=",".join(str(lid) for lid in ledgers),
        )
        result = LEDGER_HEALTH.run(session, opts)
        result.write(out_dir)
        parts.append(result.render())
        return "\n\n".join(parts)
    finally:
        if ours:
            session.stop()
