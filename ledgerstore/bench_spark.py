"""``ledgerstore bench spark``: a Spark full scan of a ledger set beside the raw client read of the same data.

One invocation writes the ledger set once (default 1 GiB of 1 KiB entries over 4 ledgers, E3/Qw2/Qa2, every
entry distinct), then each run measures, in this order:

* ``raw``: the ledger client in this process reading every ledger sequentially (``read_batches(0, last)``,
  batched READ_RANGE reads, as the ledger source reads), one ledger after the other, touching each entry's
  bytes (length summed);
* ``spark count``: ``spark.read.format("ledger")...load().count()`` in a ``local[2]`` session started before the
  runs (session start-up is not timed);
* ``spark checksum``: the same scan into ``sum(crc32(data))``, ``sum(length)`` and ``count(*)``, checked
  against the sums computed while writing;
* ``spark narrow checksum``: the same with the schema :data:`NARROW_SCHEMA` (ledger and entry ids, data, length:
  the metadata columns, constant per ledger, are neither built nor converted).

Figures are medians over ``--runs``, after ``--warmup-runs`` (default 1) that are not counted: the first raw read
after the write reads what the bookies' caches do not hold yet, and Spark's first queries run with a cold JIT.
``*_vs_raw_pct`` is the median of the runs' ratios of a Spark scan's MB/s over the raw client's in the same run
(target ≥ 80 %).
Each phase also reports ``machine_busy_pct`` (all processes, from /proc/stat: the bookies, Spark's JVM and Python
workers, and anything else running on the machine) so a loaded machine shows, and the CPU µs per row of each of
its own processes, which other tenants disturb less than a rate (``<phase>_cpu_us_per_row_<group>``; groups:
``client`` (this process: the raw read's client, Spark's driver side), ``bookies`` (the bookie processes it
started), ``jvm`` (Spark's JVM), ``python_workers`` (the JVM's descendants: the Python worker daemon and its
workers, where the ledger source reads)).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["add_bench_spark_command"]

PASSWORD = b"bench-spark"
#: the columns a checksum needs: the ledger source builds only these, and Spark converts only these
NARROW_SCHEMA = "ledger_id long, entry_id long, data binary, length int"


def add_bench_spark_command(
    bench: argparse.ArgumentParser, common: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add ``spark`` to ``ledgerstore bench``'s modes (the sub-parsers ``bench`` already has)."""
    modes = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction))
    sp = modes.add_parser(
        "spark",
        help="write a ledger set, then a Spark full scan (count, checksum) beside the raw client read of it",
    )
    common(sp)
    sp.add_argument("--size-mb", type=int, default=1024, help="MiB of entries to write (default 1024)")
    sp.add_argument("--entry-size", type=int, default=1024)
    sp.add_argument("--ledgers", type=int, default=4, help="ledgers the data is spread over")
    sp.add_argument("-E", "--ensemble", type=int, default=3)
    sp.add_argument("-W", "--write-quorum", type=int, default=2)
    sp.add_argument("-A", "--ack-quorum", type=int, default=2)
    sp.add_argument("--outstanding", type=int, default=2000, help="appends in flight while writing")
    sp.add_argument("--runs", type=int, default=3)
    sp.add_argument(
        "--warmup-runs",
        type=int,
        default=1,
        help="runs before the measured ones, not in the figures (default 1: the first read after the write "
        "and Spark's first queries, its JIT cold, are not comparable)",
    )
    sp.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    sp.add_argument(
        "--entries-per-partition", type=int, default=None, help="the ledger source's entriesPerPartition"
    )
    sp.add_argument(
        "--max-records-per-batch", type=int, default=None, help="the ledger source's maxRecordsPerBatch"
    )
    sp.add_argument(
        "--bookies", type=int, default=3, help="bookie processes to start (when no --use-cluster)"
    )
    sp.add_argument("--use-cluster", action="store_true", help="use the cluster registered at --zk")
    sp.add_argument(
        "--bookie-arg", action="append", default=[], help="extra argument for the bookie processes"
    )
    sp.set_defaults(func=run)


def _progress(msg: str) -> None:
    print(f"  {msg}", file=sys.stderr, flush=True)


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine (/proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


@contextlib.contextmanager
def machine_meter() -> Iterator[dict[str, float]]:
    """``machine_busy_pct``: the share of all cores busy across the block, whoever used them."""
    out: dict[str, float] = {}
    b0, t0 = _cpu_ticks()
    yield out
    b1, t1 = _cpu_ticks()
    if t1 > t0:
        out["machine_busy_pct"] = round(100.0 * (b1 - b0) / (t1 - t0), 1)


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (Linux /proc): under Spark's JVM, the Python worker daemon and its workers."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = [root]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


class CpuGroups:
    """CPU seconds so far of the bench's process groups (see the module docstring); a process that ended
    since the last look (a Python worker Spark retired) drops out, so a phase's figure is a floor."""

    def __init__(self, bookie_pids: list[int], jvm_pid: int | None) -> None:
        self.bookie_pids = bookie_pids
        self.jvm_pid = jvm_pid

    def now(self) -> dict[str, float]:
        from ledgerstore.bench import _cpu_seconds

        def total(pids: list[int]) -> float:
            used = 0.0
            for pid in pids:
                with contextlib.suppress(OSError, ValueError, IndexError):
                    used += _cpu_seconds(pid)
            return used

        out = {"client": total([os.getpid()])}
        if self.bookie_pids:
            out["bookies"] = total(self.bookie_pids)
        if self.jvm_pid is not None:
            out["jvm"] = total([self.jvm_pid])
            out["python_workers"] = total(_descendants(self.jvm_pid))
        return out

    @contextlib.contextmanager
    def per_row(self, phase: str) -> Iterator[dict[str, float]]:
        """Across the block: ``<phase>_cpu_us_per_row_<group>``; the block stores its rows under ``"rows"``."""
        out: dict[str, float] = {}
        before = self.now()
        yield out
        after = self.now()
        rows = max(1, int(out.pop("rows", 0)))
        for group, used in after.items():
            out[f"{phase}_cpu_us_per_row_{group}"] = round(1e6 * (used - before.get(group, used)) / rows, 2)


# --------------------------------------------------------------------------------------------------------
# Writing and reading with the client


async def write_ledgers(
    zk: str,
    zk_root: str,
    *,
    ledgers: int,
    entries: int,
    entry_size: int,
    ensemble: int,
    write_quorum: int,
    ack_quorum: int,
    outstanding: int,
) -> dict[str, Any]:
    """Write ``entries`` distinct entries spread over ``ledgers`` ledgers (all at once), close them. Returns the
    ledger ids, and the entry count, byte count and sum of the entries' CRC32s to check the scans against."""
    from ledger_client import BookKeeper, ClientConfig

    cfg = ClientConfig(zk_root=zk_root, outstanding_adds_max=max(1, outstanding // ledgers))
    bk = await BookKeeper.connect(zk, config=cfg)
    base = os.urandom(entry_size)
    per = [entries // ledgers + (1 if i < entries % ledgers else 0) for i in range(ledgers)]
    sums = {"crc": 0, "bytes": 0, "acked": 0, "errors": 0}
    t0 = time.perf_counter()
    try:
        handles = [await bk.create_ledger(ensemble, write_quorum, ack_quorum, password=PASSWORD) for _ in per]

        async def fill(k: int) -> None:
            lh, n = handles[k], per[k]
            drained = asyncio.Event()
            inflight = 0

            def done(_entry_id: int, error: Exception | None) -> None:
                nonlocal inflight
                inflight -= 1
                sums["errors" if error else "acked"] += 1
                if inflight == 0:
                    drained.set()

            prefix = lh.ledger_id.to_bytes(8, "big")
            step = max(1, n // 10)
            for i in range(n):
                # distinct entries: the ledger id and entry number over a random base
                data = prefix + i.to_bytes(8, "big") + base[16:]
                sums["crc"] += zlib.crc32(data)
                sums["bytes"] += len(data)
                inflight += 1
                drained.clear()
                await lh.append_callback(data, done)
                if k == 0 and i % step == step - 1:
                    _progress(f"writing: {sums['acked']:,} of {entries:,} entries acked")
            if inflight:
                await drained.wait()
            await lh.close()

        await asyncio.gather(*(fill(k) for k in range(ledgers)))
    finally:
        await bk.close()
    elapsed = time.perf_counter() - t0
    if sums["errors"]:
        raise RuntimeError(f"{sums['errors']} appends failed")
    return {
        "ledger_ids": [h.ledger_id for h in handles],
        "entries": entries,
        "bytes": sums["bytes"],
        "crc32_sum": sums["crc"],
        "write_entries_per_s": entries / elapsed,
        "write_mb_per_s": sums["bytes"] / elapsed / 1e6,
    }


async def raw_read(zk: str, zk_root: str, ledger_ids: list[int]) -> tuple[int, int]:
    """Read every ledger sequentially with one client (``read_batches``, the client's bulk read, as the ledger
    source reads); (entries, payload bytes)."""
    from ledger_client import BookKeeper, ClientConfig

    bk = await BookKeeper.connect(zk, config=ClientConfig(zk_root=zk_root))
    n = nbytes = 0
    try:
        for lid in ledger_ids:
            lh = await bk.open_ledger(lid, password=PASSWORD, recovery=False)
            async for b in lh.read_batches(0, lh.last_add_confirmed):
                n += len(b)
                nbytes += sum(map(len, b.payloads))
    finally:
        await bk.close()
    return n, nbytes


# --------------------------------------------------------------------------------------------------------
# The runs


def _rates(prefix: str, entries: int, nbytes: int, seconds: float) -> dict[str, float]:
    return {
        f"{prefix}_s": round(seconds, 3),
        f"{prefix}_entries_per_s": entries / seconds,
        f"{prefix}_mb_per_s": nbytes / seconds / 1e6,
    }


def _one_run(
    session: Any,
    zk: str,
    zk_root: str,
    written: dict[str, Any],
    source: dict[str, str],
    cpu: CpuGroups,
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    entries, nbytes, ids = written["entries"], written["bytes"], written["ledger_ids"]
    out: dict[str, Any] = {}
    with machine_meter() as busy, cpu.per_row("raw") as used:
        t0 = time.perf_counter()
        n, got = asyncio.run(raw_read(zk, zk_root, ids))
        out |= _rates("raw", n, got, time.perf_counter() - t0)
        used["rows"] = n
    out |= used
    out["raw_machine_busy_pct"] = busy.get("machine_busy_pct")
    if (n, got) != (entries, nbytes):
        raise RuntimeError(f"raw read {n} entries / {got} bytes, wrote {entries} / {nbytes}")

    df = session.read.format("ledger").options(**source).load()
    with machine_meter() as busy, cpu.per_row("spark_count") as used:
        t0 = time.perf_counter()
        counted = df.count()
        out |= _rates("spark_count", counted, nbytes, time.perf_counter() - t0)
        used["rows"] = counted
    out |= used
    out["spark_count_machine_busy_pct"] = busy.get("machine_busy_pct")
    if counted != entries:
        raise RuntimeError(f"Spark counted {counted} entries, wrote {entries}")

    narrow = session.read.format("ledger").schema(NARROW_SCHEMA).options(**source).load()
    for phase, frame in (("spark_checksum", df), ("spark_narrow_checksum", narrow)):
        with machine_meter() as busy, cpu.per_row(phase) as used:
            t0 = time.perf_counter()
            row = frame.agg(
                F.count("*").alias("n"),
                F.sum("length").alias("bytes"),
                F.sum(F.crc32("data")).alias("crc"),
            ).collect()[0]
            out |= _rates(phase, row["n"], row["bytes"], time.perf_counter() - t0)
            used["rows"] = row["n"]
        out |= used
        out[f"{phase}_machine_busy_pct"] = busy.get("machine_busy_pct")
        _check(row, written)
    for phase in ("spark_count", "spark_checksum", "spark_narrow_checksum"):
        out[f"{phase}_vs_raw_pct"] = round(100 * out[f"{phase}_mb_per_s"] / out["raw_mb_per_s"], 1)
    return out


def _cpu_summary(r: dict[str, Any], phase: str) -> str:
    prefix = f"{phase}_cpu_us_per_row_"
    return " ".join(f"{k[len(prefix) :]} {v}" for k, v in r.items() if k.startswith(prefix))


def _check(row: Any, written: dict[str, Any]) -> None:
    got = (row["n"], row["bytes"], row["crc"])
    want = (written["entries"], written["bytes"], written["crc32_sum"])
    if got != want:
        raise RuntimeError(f"Spark checksum scan: (entries, bytes, crc32 sum) {got}; wrote {want}")


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in runs[0]:
        vals = [r[k] for r in runs if r[k] is not None]
        out[k] = statistics.median(vals) if vals else None
        if "_cpu_us_per_row_" in k and out[k] is not None:
            out[k] = round(out[k], 2)
    for k in (
        "raw_entries_per_s",
        "spark_count_entries_per_s",
        "spark_checksum_entries_per_s",
        "spark_narrow_checksum_entries_per_s",
    ):
        out["per_run_" + k] = [round(r[k]) for r in runs]
    return out


def run(args: argparse.Namespace) -> int:
    from bookie.main import install_uvloop
    from ledgerstore.bench import _print, local_cluster
    from ledgerstore.cli import CommandError
    from ledgerstore.spark_cmd import _check_master
    from spark.jobs.common import local_session

    if args.size_mb < 1 or args.entry_size < 16 or args.ledgers < 1 or args.runs < 1 or args.warmup_runs < 0:
        raise CommandError(
            "--size-mb, --runs and --ledgers must be >= 1, --warmup-runs >= 0, --entry-size >= 16"
        )
    _check_master(args.master, "--master")  # before the cluster is made and written: Spark would try a minute
    install_uvloop()
    entries = args.size_mb * 1024 * 1024 // args.entry_size
    load_before = os.getloadavg()[0]
    with contextlib.ExitStack() as stack:
        bookie_pids: list[int] = []
        if args.use_cluster:
            zk, root = args.zk, args.zk_root
        else:
            _progress(f"starting ZooKeeper and {max(args.bookies, args.ensemble)} bookies")
            zk, procs, _ = stack.enter_context(
                local_cluster(max(args.bookies, args.ensemble), args.bookie_arg)
            )
            root = "/ledgerstore"
            bookie_pids = [bp.proc.pid for bp in procs if bp.proc is not None]
        _progress(
            f"writing {entries:,} entries of {args.entry_size} B ({args.size_mb} MiB) over {args.ledgers} "
            f"ledgers, E/Qw/Qa {args.ensemble}/{args.write_quorum}/{args.ack_quorum}"
        )
        written = asyncio.run(
            write_ledgers(
                zk,
                root,
                ledgers=args.ledgers,
                entries=entries,
                entry_size=args.entry_size,
                ensemble=args.ensemble,
                write_quorum=args.write_quorum,
                ack_quorum=args.ack_quorum,
                outstanding=args.outstanding,
            )
        )
        _progress(f"written: {written['write_entries_per_s']:,.0f} entries/s; starting Spark {args.master}")
        t0 = time.perf_counter()
        session = local_session("ledgerstore bench spark", args.master)
        stack.callback(session.stop)
        from spark import register

        register(session)
        session_start_s = time.perf_counter() - t0
        source = {
            "zk": zk,
            "zkRoot": root,
            "ledgers": ",".join(str(i) for i in written["ledger_ids"]),
            "password": PASSWORD.decode(),
        }
        if args.entries_per_partition:
            source["entriesPerPartition"] = str(args.entries_per_partition)
        if args.max_records_per_batch:
            source["maxRecordsPerBatch"] = str(args.max_records_per_batch)
        # the JVM, when PySpark started it
        gateway_proc = getattr(session.sparkContext._gateway, "proc", None)
        cpu = CpuGroups(bookie_pids, gateway_proc.pid if gateway_proc is not None else None)
        runs = []
        for i in range(-args.warmup_runs, args.runs):
            r = _one_run(session, zk, root, written, source, cpu)
            _progress(
                (
                    f"warm-up run {i + args.warmup_runs + 1}/{args.warmup_runs}"
                    if i < 0
                    else f"run {i + 1}/{args.runs}"
                )
                + f": raw {r['raw_entries_per_s']:,.0f} entries/s "
                f"({r['raw_mb_per_s']:,.1f} MB/s), Spark count {r['spark_count_entries_per_s']:,.0f}/s, "
                f"checksum {r['spark_checksum_entries_per_s']:,.0f}/s ({r['spark_checksum_vs_raw_pct']} % of raw), "
                f"narrow {r['spark_narrow_checksum_entries_per_s']:,.0f}/s "
                f"({r['spark_narrow_checksum_vs_raw_pct']} %); machine busy {r['raw_machine_busy_pct']} / "
                f"{r['spark_checksum_machine_busy_pct']} %; CPU µs per row: raw "
                + _cpu_summary(r, "raw")
                + ", checksum "
                + _cpu_summary(r, "spark_checksum")
            )
            if i >= 0:
                runs.append(r)
    from spark.options import DEFAULT_ENTRIES_PER_PARTITION, DEFAULT_MAX_RECORDS_PER_BATCH

    result: dict[str, Any] = {
        "mode": "spark",
        "master": args.master,
        "E/Qw/Qa": f"{args.ensemble}/{args.write_quorum}/{args.ack_quorum}",
        "entries": entries,
        "entry_size": args.entry_size,
        "ledgers": args.ledgers,
        "bytes": written["bytes"],
        "entries_per_partition": args.entries_per_partition or DEFAULT_ENTRIES_PER_PARTITION,
        "max_records_per_batch": args.max_records_per_batch or DEFAULT_MAX_RECORDS_PER_BATCH,
        "runs": args.runs,
        "warmup_runs": args.warmup_runs,
        "write_entries_per_s": written["write_entries_per_s"],
        "write_mb_per_s": written["write_mb_per_s"],
        "spark_session_start_s": round(session_start_s, 1),
        "load_avg_1m_before": load_before,
        **_median(runs),
    }
    result["spark_vs_raw_target_met"] = result["spark_checksum_vs_raw_pct"] >= 80.0
    result["spark_narrow_vs_raw_target_met"] = result["spark_narrow_checksum_vs_raw_pct"] >= 80.0
    _print(args, f"bench spark (median of {args.runs} runs)", result)
    return 0
