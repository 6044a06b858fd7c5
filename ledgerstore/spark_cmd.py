"""``ledgerstore spark JOB [--master URL]``: run one of the analyses in ``spark/jobs`` and print its summary.

    ledgerstore spark ledger-health                                   # local[2]
    ledgerstore spark entry-sizes --master spark://10.0.0.9:7077 --ledgers 3-9 --out reports/
    ledgerstore spark topic-volume --topics orders,payments         # or --topics-pattern 'orders-.*'

The job writes ``<out>/<job>.png`` (the chart), ``<job>.txt`` (the tables as printed) and ``<job>.json``. On a
cluster, the executors import ledgerstore: install it into the Python they run and name that Python with
``--executor-python`` (or ``PYSPARK_PYTHON``); they must reach ZooKeeper and the bookies.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledgerstore.cli import add_password_arguments, password_of
from spark._topic_options import CRYPTO_FAILURE_ACTIONS

DEFAULT_MASTER = "local[2]"
_PY_ERROR = re.compile(r"^[\w.]*(Error|Exception): ")
_OUR_ERROR = re.compile(r"^(?:\w+\.)*((?:Ledger|Topic)(?:Option|DataLoss)Error): ")
#: a source option a job passes -> the flag its user gives it with
_FLAGS = {
    "zk": "--zk",
    "zkRoot": "--zk-root",
    "ledgers": "--ledgers",
    "password": "--password",
    "topic": "--topics",
    "topics": "--topics",
    "topicsPattern": "--topics-pattern",
    "entriesPerPartition": "--entries-per-partition",
    "authTokenFile": "--auth-token-file",
    "zkAuthFile": "$LEDGERSTORE_ZK_AUTH_FILE",
    "cryptoFailureAction": "--crypto-failure-action",
}
_SOURCE_OPTION = re.compile(r"\b(?:ledger|topic) source option '([-\w]+)'")
_OPTION_NAMED = re.compile(r"\boption '([-\w]+)'")
_SKIP_ADVICE = re.compile(r" \(failOnDataLoss is true; set option failOnDataLoss=false [^)]*\)")


def add_spark_command(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    from spark.jobs import JOBS

    p: argparse.ArgumentParser = sub.add_parser(
        "spark",
        help="run an analysis job over ledgers or topics with Spark",
        description="Jobs: " + "; ".join(f"{j.name}: {j.help}" for j in JOBS.values()),
    )
    common(p)
    p.add_argument("job", choices=sorted(JOBS), help="the analysis to run")
    p.add_argument(
        "--master",
        default=os.environ.get("LEDGERSTORE_SPARK_MASTER", DEFAULT_MASTER),
        help="Spark master URL: local[N], spark://HOST:PORT, ... (default local[2] or $LEDGERSTORE_SPARK_MASTER)",
    )
    p.add_argument("--ledgers", default="all", help="'all', ids '1,2,5' or ranges '3-9' (default all)")
    add_password_arguments(p, "the ledgers' (or managed ledgers') password")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--topics", default=None, help="topic jobs: a comma list of topics")
    which.add_argument(
        "--topics-pattern",
        default=None,
        help="topic jobs: a regex over full topic names (bare: in public/default; default: every topic there)",
    )
    p.add_argument("--entries-per-partition", type=int, default=None, help="entries per Spark partition")
    p.add_argument(
        "--crypto-failure-action",
        type=str.upper,
        choices=CRYPTO_FAILURE_ACTIONS,
        default=None,
        help="topic jobs: end-to-end encrypted messages, which the job cannot decrypt: FAIL the job (the topic "
        "source's default), DISCARD them or CONSUME them as stored (the source's cryptoFailureAction)",
    )
    p.add_argument("--out", type=Path, default=Path("spark-out"), help="where the chart and report go")
    p.add_argument(
        "--executor-python",
        default=os.environ.get("PYSPARK_PYTHON", sys.executable),
        help="the Python the executors run, with ledgerstore installed (default $PYSPARK_PYTHON or this one)",
    )
    p.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (repeatable)"
    )
    p.set_defaults(func=run)
    return p


def _session(args: argparse.Namespace) -> Any:
    from spark.jobs.common import local_session

    conf = progress_conf(args)  # before the user's --conf, which may say otherwise
    for kv in args.conf:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            from ledgerstore.cli import CommandError

            raise CommandError(f"--conf expects KEY=VALUE, got {kv!r}")
        conf.append((key.strip(), value))
    _check_master(args.master)
    return local_session(
        f"ledgerstore {args.job}", args.master, executor_python=args.executor_python, conf=conf
    )


def progress_conf(args: argparse.Namespace) -> list[tuple[str, str]]:
    """On a terminal (and not with --json), Spark's console progress bar on stderr, each stage's tasks done:
    a job runs a minute or more, which it spent in silence (local_session turns the bar off)."""
    from ledgerstore.cli import progress_disabled

    return [] if progress_disabled(args) else [("spark.ui.showConsoleProgress", "true")]


#: Seconds a connection to a standalone master may take before it counts as not answering.
MASTER_CONNECT_TIMEOUT_S = 5.0


def _check_master(master: str, given_by: str = "--master or $LEDGERSTORE_SPARK_MASTER") -> None:
    """A ``spark://`` master (or any of an HA list) that takes no connection fails here, in one line: Spark
    itself tried three times 20 s apart, printed pages of JVM traces, and failed with 'Cannot call methods on
    a stopped SparkContext'. ``given_by``: where the user gave the master, for the message (``bench spark``
    takes ``--master`` alone)."""
    import socket

    from ledgerstore.cli import EXIT_UNAVAILABLE, CommandError

    if not master.startswith("spark://"):
        return
    refused = []
    for hostport in master.removeprefix("spark://").split(","):
        host, _, port = hostport.strip().rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=MASTER_CONNECT_TIMEOUT_S).close()
            return
        except ValueError:
            raise CommandError(f"--master {master}: expected spark://HOST:PORT[,HOST:PORT...]") from None
        except OSError as e:
            refused.append(f"{hostport.strip()}: {e.strerror or e}")
    raise CommandError(
        f"no Spark master answers at {master} ({'; '.join(refused)}): is it running? ({given_by})",
        EXIT_UNAVAILABLE,
    )


def job_options(args: argparse.Namespace) -> Any:
    """The job's :class:`spark.jobs.JobOptions` from the command's flags."""
    from spark.jobs import JobOptions
    from zk.acl import ENV_AUTH_FILE

    return JobOptions(
        zk=args.zk,
        zk_root=args.zk_root,
        ledgers=args.ledgers,
        password=password_of(args),
        entries_per_partition=args.entries_per_partition,
        out_dir=args.out,
        topics=args.topics,
        topics_pattern=args.topics_pattern,
        # the files --auth-token-file and the environment name (the job's executors may have neither)
        auth_token_file=os.environ.get("LEDGERSTORE_AUTH_TOKEN_FILE") or None,
        zk_auth_file=os.environ.get(ENV_AUTH_FILE) or None,
        crypto_failure_action=args.crypto_failure_action,
    )


def run(args: argparse.Namespace) -> int:
    from ledgerstore.cli import CommandError, emit
    from spark._topic_options import TopicOptionError, parse_topic_options
    from spark.jobs import JOBS
    from spark.options import LedgerOptionError, parse_ledger_options

    opts = job_options(args)
    try:  # a wrong flag fails here, before Spark starts (seconds, half a GiB)
        parse_ledger_options(opts.source_options())
        if args.job.startswith("topic-"):
            parse_topic_options(opts.topic_source_options(), streaming=False)
    except (LedgerOptionError, TopicOptionError) as e:
        raise CommandError(_in_flags(str(e))) from None
    if progress_conf(args):
        print(f"ledgerstore spark {args.job}: starting Spark ({args.master})", file=sys.stderr, flush=True)
    session = _session(args)
    try:
        result = JOBS[args.job].run(session, opts)
    except Exception as e:
        raise CommandError(f"spark job {args.job} failed: {_in_flags(_one_line(e))}") from e
    finally:
        session.stop()
    result.write(args.out)
    emit(args, lambda: result.render() + f"\nreport: {result.report}", result.to_json())
    return 0


def _in_flags(line: str) -> str:
    """A source's message in the command's words: its options named by the flags that set them (the one at
    fault and those its advice names: "select the ones it opens with option --ledgers"), and no
    advice to set ``failOnDataLoss``, which a job does not offer (a ledger is left out with ``--ledgers``)."""
    for pattern in (_SOURCE_OPTION, _OPTION_NAMED):  # the option at fault, then any the advice names
        line = pattern.sub(
            lambda m: f"option {_FLAGS[m.group(1)]}" if m.group(1) in _FLAGS else m.group(0), line
        )
    line = line.replace("set option cryptoFailureAction=", "give --crypto-failure-action ")
    advice = " (leave it out with --ledgers)" if "LedgerDataLossError" in line else ""
    return _SKIP_ADVICE.sub(advice, line)


def _one_line(e: BaseException) -> str:
    """Spark wraps Python errors in pages of JVM trace: keep the line that says what went wrong (ours first,
    else the last Python exception line)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    python_errors = [
        ln for ln in lines if _PY_ERROR.match(ln) and not ln.startswith(("org.", "java.", "py4j."))
    ]
    for ln in python_errors:
        ours = _OUR_ERROR.match(ln)  # raised in a Python worker, it comes module-qualified (spark.options.…)
        if ours:
            return ln[ours.start(1) :]
    if python_errors:
        return python_errors[-1]
    return lines[0] if lines else type(e).__name__
