"""``ledger-health``: entries and bytes per ledger, each bookie's share of the entry replicas, ensemble changes.

Entries and bytes come from a Spark scan of the ``ledger`` source (what is actually readable); the replica share
follows from each ledger's ensembles and write quorum (entry e of an ensemble is on bookies (e + i) mod E,
i < Qw), counted to the last entry read; a bookie's status says whether it is registered now (writable,
read-only) or gone, which flags ledgers waiting for ``bookie recover``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from spark.jobs import common
from spark.jobs.common import Job, JobOptions, JobResult, Table, ledger_frame, new_figure, save_figure
from spark.options import parse_ledgers
from spark.planning import replicas_per_bookie

__all__ = ["JOB", "run"]


def run(session: Any, opts: JobOptions) -> JobResult:
    from pyspark.sql import functions as F

    from ledger_client import ClientConfig, NoSuchLedgerError
    from ledger_client.sync import BookKeeper

    scanned = {
        r["ledger_id"]: r
        for r in ledger_frame(session, opts, ["ledger_id", "entry_id", "length"])
        .groupBy("ledger_id")
        .agg(
            F.count("*").alias("entries"),
            F.sum("length").alias("bytes"),
            F.max("entry_id").alias("last_read"),
        )
        .collect()
    }
    bk = BookKeeper.connect(opts.zk, config=ClientConfig(zk_root=opts.zk_root))
    try:
        chosen, _ = parse_ledgers(opts.ledgers).select(bk.list_ledgers())
        metas = {}
        for lid in chosen:
            try:
                metas[lid] = bk.ledger_metadata(lid)
            except NoSuchLedgerError:  # deleted since the scan
                continue
        writable, readonly = set(bk.writable_bookies()), set(bk.readonly_bookies())
    finally:
        bk.close()

    ledger_rows: list[list[Any]] = []
    replicas: Counter[str] = Counter()
    ledgers_on: Counter[str] = Counter()
    for lid, md in sorted(metas.items()):
        row = scanned.get(lid)
        entries, nbytes, last = (row["entries"], row["bytes"], row["last_read"]) if row else (0, 0, -1)
        per = replicas_per_bookie(
            [(e.first_entry_id, e.bookies) for e in md.ensembles], md.write_quorum, last
        )
        replicas.update(per)
        ledgers_on.update(per.keys())
        ever = {b for e in md.ensembles for b in e.bookies}
        replaced = sorted(ever - set(md.last_ensemble.bookies))
        ledger_rows.append(
            [
                lid,
                md.state.value,
                f"{md.ensemble_size}/{md.write_quorum}/{md.ack_quorum}",
                entries,
                nbytes,
                len(md.ensembles) - 1,
                ",".join(replaced) or "-",
            ]
        )
    total = sum(replicas.values()) or 1

    def status(b: str) -> str:
        return "writable" if b in writable else "read-only" if b in readonly else "GONE"

    bookie_rows = [[b, n, 100.0 * n / total, ledgers_on[b], status(b)] for b, n in sorted(replicas.items())]
    result = JobResult(
        job="ledger-health",
        tables=[
            Table(
                "Ledgers",
                ["ledger", "state", "E/Qw/Qa", "entries", "bytes", "ensemble changes", "replaced bookies"],
                ledger_rows,
            ),
            Table(
                "Entry replicas per bookie",
                ["bookie", "replicas", "share %", "ledgers", "status"],
                bookie_rows,
            ),
        ],
    )
    gone = [str(r[0]) for r in bookie_rows if r[4] == "GONE"]
    if gone:
        result.notes.append(
            f"bookies holding replicas but not registered: {', '.join(gone)} (see `ledgerstore bookie recover`)"
        )
    result.chart = save_figure(_figure(ledger_rows, bookie_rows), opts.out_dir / "ledger-health.png")
    return result


def _figure(ledger_rows: list[list[Any]], bookie_rows: list[list[Any]]) -> Any:
    fig, (left, right) = new_figure(2, "ledger health")
    labels = [str(r[0]) for r in ledger_rows]
    left.bar(labels, [r[4] / 1e6 for r in ledger_rows], color="tab:blue")
    left.set_xlabel("ledger")
    left.set_ylabel("MB")
    left.set_title("bytes per ledger")
    if len(labels) > 20:
        left.set_xticks([])
    colors = ["tab:red" if r[4] == "GONE" else "tab:green" for r in bookie_rows]
    right.barh([str(r[0]) for r in bookie_rows], [r[2] for r in bookie_rows], color=colors)
    right.set_xlabel("share of entry replicas, %")
    right.set_title("replicas per bookie (red: not registered)")
    if not ledger_rows:
        common.empty_panel(left, "no ledgers")
    if not bookie_rows:
        common.empty_panel(right, "no entry replicas")
    return fig


JOB = Job("ledger-health", "entries and bytes per ledger, replicas per bookie, ensemble changes", run)
