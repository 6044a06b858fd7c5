"""Analyses users run over their logs, each one Spark job: ``ledgerstore spark JOB [--master URL]``.

    from spark.jobs import JOBS, JobOptions
    result = JOBS["ledger-health"].run(session, JobOptions(zk="127.0.0.1:2181", out_dir=Path("out")))
    print(result.render())            # the summary tables; result.chart is the PNG written to out_dir

Jobs: ``ledger-health`` (:mod:`spark.jobs.ledger_health`), ``entry-sizes`` (:mod:`spark.jobs.entry_sizes`).
A job registers the sources itself, reads through the ``ledger`` source, and computes on the executors; only the
summary (one row per ledger or bookie) comes back to the driver.
"""

from __future__ import annotations

from spark.jobs.common import Job, JobOptions, JobResult, Table
from spark.jobs.entry_sizes import JOB as ENTRY_SIZES
from spark.jobs.ledger_health import JOB as LEDGER_HEALTH

__all__ = ["JOBS", "Job", "JobOptions", "JobResult", "Table"]

#: name -> job. Per-minute message volume per topic joins these once the ``topic`` source exists
#: (see :func:`spark.jobs.entry_sizes.topic_minute_volume`).
JOBS: dict[str, Job] = {job.name: job for job in (LEDGER_HEALTH, ENTRY_SIZES)}
