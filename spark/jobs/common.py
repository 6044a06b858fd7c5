"""What every job shares: its options, its result (tables + a PNG chart), and reading the ``ledger`` source."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Job",
    "JobOptions",
    "JobResult",
    "Table",
    "ledger_frame",
    "local_session",
    "new_figure",
    "topic_frame",
]


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    zk: str = "127.0.0.1:2181"
    zk_root: str = "/ledgerstore"
    ledgers: str = "all"
    password: str = ""
    entries_per_partition: int | None = None
    out_dir: Path = Path("spark-out")
    #: topic jobs: a comma list of topics, or else a regex over full names (``topicsPattern``; a bare regex
    #: matches in public/default); neither: every topic of public/default
    topics: str | None = None
    topics_pattern: str | None = None
    #: files of a secured cluster's credentials (the sources' ``authTokenFile`` and ``zkAuthFile``): read where
    #: the job plans its query and shipped with its tasks, so a cluster's executors need neither the files nor
    #: the environment (``ledgerstore spark`` takes them from ``--auth-token-file`` and the environment)
    auth_token_file: str | None = None
    zk_auth_file: str | None = None
    #: topic jobs: the ``topic`` source's ``cryptoFailureAction`` (None: its default, FAIL)
    crypto_failure_action: str | None = None

    def _credentials(self) -> dict[str, str]:
        opts = {}
        if self.auth_token_file:
            opts["authTokenFile"] = self.auth_token_file
        if self.zk_auth_file:
            opts["zkAuthFile"] = self.zk_auth_file
        return opts

    def source_options(self) -> dict[str, str]:
        """The ``ledger`` source's options."""
        opts = {"zk": self.zk, "zkRoot": self.zk_root, "ledgers": self.ledgers, "password": self.password}
        opts.update(self._credentials())
        if self.entries_per_partition is not None:
            opts["entriesPerPartition"] = str(self.entries_per_partition)
        return opts

    def topic_source_options(self) -> dict[str, str]:
        """The ``topic`` source's options (batch: earliest to latest)."""
        opts = {"zk": self.zk, "zkRoot": self.zk_root, "password": self.password, **self._credentials()}
        if self.topics:
            opts["topics"] = self.topics
        else:
            opts["topicsPattern"] = self.topics_pattern or ".*"
        if self.entries_per_partition is not None:
            opts["entriesPerPartition"] = str(self.entries_per_partition)
        if self.crypto_failure_action is not None:
            opts["cryptoFailureAction"] = self.crypto_failure_action
        return opts


@dataclass(frozen=True)
class Table:
    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]

    def render(self) -> str:
        cells = [[_cell(v) for v in row] for row in self.rows]
        widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(self.columns)]

        def line(values: Sequence[str]) -> str:
            return "  ".join(
                v.ljust(w) if i == 0 else v.rjust(w)
                for i, (v, w) in enumerate(zip(values, widths, strict=True))
            ).rstrip()

        out = [self.title, line(list(self.columns)), line(["-" * w for w in widths])]
        out += [line(r) for r in cells] or ["(no rows)"]
        return "\n".join(out)

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


def _cell(v: Any) -> str:
    if v is None:  # nothing to measure (no event times, no messages): JSON keeps null
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


@dataclass
class JobResult:
    job: str
    tables: list[Table]
    chart: Path | None = None
    report: Path | None = None
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        parts = [t.render() for t in self.tables] + self.notes
        if self.chart:
            parts.append(f"chart: {self.chart}")
        return "\n\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "tables": {t.title: t.as_dicts() for t in self.tables},
            "chart": str(self.chart) if self.chart else None,
            "notes": self.notes,
        }

    def write(self, out_dir: Path) -> None:
        """The summary beside the chart: ``<job>.txt`` and ``<job>.json``."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.report = out_dir / f"{self.job}.txt"
        self.report.write_text(self.render() + "\n")
        (out_dir / f"{self.job}.json").write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")


@dataclass(frozen=True)
class Job:
    name: str
    help: str
    run: Callable[[Any, JobOptions], JobResult]


def ledger_frame(session: Any, opts: JobOptions, columns: Sequence[str] = ()) -> Any:
    """The selected ledgers' entries as a DataFrame (registers the sources on ``session`` first). With
    ``columns``, only those columns of the ``ledger`` source: the reader builds no others and Spark converts no
    others (a job that needs lengths, not payloads, skips moving the payloads into the JVM)."""
    from spark import register

    register(session)
    reader = session.read.format("ledger").options(**opts.source_options())
    if columns:
        from spark.ledger_source import LEDGER_SCHEMA

        reader = reader.schema(", ".join(f"{c} {LEDGER_SCHEMA[c].dataType.simpleString()}" for c in columns))
    return reader.load()


def topic_frame(session: Any, opts: JobOptions) -> Any:
    """The selected topics' messages as a DataFrame (registers the sources on ``session`` first)."""
    from spark import register

    register(session)
    return session.read.format("topic").options(**opts.topic_source_options()).load()


def local_session(
    app: str,
    master: str = "local[2]",
    *,
    executor_python: str | None = None,
    conf: Sequence[tuple[str, str]] = (),
) -> Any:
    """A SparkSession whose Python workers run ``executor_python`` (default this Python, which has ledgerstore
    and pyarrow), quiet (no progress bars, ERROR logs), with few shuffle partitions (the jobs' summaries are
    small)."""
    import os
    import sys

    from pyspark.sql import SparkSession

    python = executor_python or os.environ.get("PYSPARK_PYTHON") or sys.executable
    # Spark's Python workers on the driver (which plan the data sources' partitions) follow PYSPARK_PYTHON,
    # not spark.pyspark.python: give both.
    os.environ["PYSPARK_PYTHON"] = python
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.pyspark.python", python)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
    )
    for key, value in conf:
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def new_figure(ncols: int, title: str) -> tuple[Any, Any]:
    """A matplotlib figure on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 4.5), squeeze=False)
    fig.suptitle(title)
    return fig, axes[0]


def empty_panel(ax: Any, text: str) -> None:
    """A panel with nothing to draw says so, in place of bare axes (matplotlib draws ticks of -0.04 to 0.04, and
    a legend of nothing, for an empty bar chart)."""
    ax.set_xticks([])
    ax.set_yticks([])
    legend = ax.get_legend()
    if legend is not None:
        legend.remove()
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.4")


def save_figure(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
