"""``ledgerstore bench ledger``: the ledger client writing E/Qw/Qa ledgers to bookie processes.

``ledgerstore bench read``: the same client writing ``entries`` entries to one ledger, closing it, and reading it
back (batched READ_RANGE reads) with ``read_batches(0, last)`` (``--api batches``, the bulk consumers' API) or
``read(0, last)`` (``--api entries``, an object per entry), each timed: write and read figures of one run, and
the CPU µs per entry read of the client and of each bookie process.

One client process keeps ``outstanding`` appends in flight (spread over ``ledgers`` ledgers) for ``duration``
seconds and reports acked entries/s, MB/s and add latency percentiles (append call to ack, as the caller sees
it). The machine's limits are measured in the same run. ``mode`` is how the appends are written (every form a
user would write, so each is measured):

* ``callbacks`` — ``append_callback`` (BookKeeper's ``asyncAddEntry``), the handle's back-pressure keeping
  ``outstanding`` in flight;
* ``futures``   — a window of ``outstanding`` ``append_future`` futures, the oldest awaited once it is full;
* ``tasks``     — one ``asyncio.create_task(lh.append(d))`` per entry under an ``asyncio.Semaphore(outstanding)``;
* ``await``     — ``outstanding`` coroutines each awaiting ``lh.append(d)`` in a loop (``--outstanding 1``: one
  append at a time, the latency of an idle system).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import gc
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from ledger_client.client import BookKeeper, ClientConfig, LedgerHandle
from ledger_client.errors import LedgerError


async def ledger_run(
    zk: str,
    zk_root: str,
    *,
    ensemble: int,
    write_quorum: int,
    ack_quorum: int,
    entry_size: int,
    outstanding: int,
    ledgers: int,
    duration: float,
    mode: str = "callbacks",
    freeze_heap: bool = True,
) -> dict[str, Any]:
    from ledgerstore.bench import percentiles

    # The client's own back-pressure (outstanding_adds_max per handle) keeps `outstanding` appends in flight.
    cfg = ClientConfig(
        zk_root=zk_root, outstanding_adds_max=max(1, outstanding // ledgers), freeze_heap=freeze_heap
    )
    bk = await BookKeeper.connect(zk, config=cfg)
    handles = [
        await bk.create_ledger(ensemble, write_quorum, ack_quorum, password=b"bench") for _ in range(ledgers)
    ]
    payload = os.urandom(entry_size)
    latencies: list[float] = []
    stats = {"acked": 0, "errors": 0}
    perf = time.perf_counter
    t_start = perf()
    deadline = t_start + duration
    drive = _DRIVERS[mode]
    per_handle = max(1, outstanding // ledgers)
    load = _Load(payload, deadline, latencies, stats)
    await asyncio.gather(*(drive(h, load, per_handle) for h in handles))
    acked, errors = stats["acked"], stats["errors"]
    elapsed = perf() - t_start
    for h in handles:
        with contextlib.suppress(Exception):
            await h.close()
            await bk.delete_ledger(h.ledger_id)
    await bk.close()
    return {
        "acked_entries_per_s": acked / elapsed,
        "mb_per_s": acked * entry_size / elapsed / 1e6,
        "acked": acked,
        "errors": errors,
        **percentiles(latencies),
        "_latencies": latencies,
    }


async def _drive(
    lh: LedgerHandle,
    payload: bytes,
    deadline: float | None,
    latencies: list[float],
    stats: dict[str, int],
    *,
    count: int | None = None,
) -> None:
    """Append ``payload`` until ``deadline`` (or ``count`` times); the handle's back-pressure keeps
    ``outstanding_adds_max`` appends in flight. Latency: from the append call to the ack."""
    perf = time.perf_counter
    started: dict[int, float] = {}  # entry id -> when its append was called
    record = latencies.append
    drained = asyncio.Event()

    def done(entry_id: int, error: LedgerError | None) -> None:
        t0 = started.pop(entry_id)
        if error is None:
            stats["acked"] += 1
            record(perf() - t0)
        else:
            stats["errors"] += 1
        if not started:
            drained.set()

    append = lh.append_callback
    n = 0
    while (deadline is None or perf() < deadline) and (count is None or n < count):
        t0 = perf()
        started[await append(payload, done)] = t0
        n += 1
    if started:
        await drained.wait()


class _Load:
    """What every driver shares: the payload, the deadline, and where the outcomes go."""

    __slots__ = ("payload", "deadline", "latencies", "stats")

    def __init__(
        self, payload: bytes, deadline: float, latencies: list[float], stats: dict[str, int]
    ) -> None:
        self.payload = payload
        self.deadline = deadline
        self.latencies = latencies
        self.stats = stats

    def acked(self, t0: float) -> None:
        self.stats["acked"] += 1
        self.latencies.append(time.perf_counter() - t0)

    def failed(self) -> None:
        self.stats["errors"] += 1


async def _drive_callbacks(lh: LedgerHandle, load: _Load, _: int) -> None:
    await _drive(lh, load.payload, load.deadline, load.latencies, load.stats)


async def _drive_futures(lh: LedgerHandle, load: _Load, window: int) -> None:
    """A window of ``append_future`` futures: the oldest is awaited once ``window`` are outstanding. Latency:
    from the append call to the moment its future is awaited done (what the caller sees)."""
    perf = time.perf_counter
    append, payload = lh.append_future, load.payload
    inflight: collections.deque[tuple[float, asyncio.Future[int]]] = collections.deque()

    async def settle() -> None:
        t0, fut = inflight.popleft()
        try:
            await fut
        except LedgerError:
            load.failed()
        else:
            load.acked(t0)

    while perf() < load.deadline:
        t0 = perf()
        inflight.append((t0, await append(payload)))
        if len(inflight) >= window:
            await settle()
    while inflight:
        await settle()


async def _drive_tasks(lh: LedgerHandle, load: _Load, window: int) -> None:
    """One ``asyncio.create_task(lh.append(payload))`` per entry, at most ``window`` at a time (a semaphore).
    Latency: from creating the task to its completion."""
    perf = time.perf_counter
    sem = asyncio.Semaphore(window)
    tasks: set[asyncio.Task[int]] = set()

    def done(t0: float, task: asyncio.Task[int]) -> None:
        tasks.discard(task)
        sem.release()
        if task.cancelled() or task.exception() is not None:
            load.failed()
        else:
            load.acked(t0)

    create_task, append, payload = asyncio.create_task, lh.append, load.payload
    while perf() < load.deadline:
        await sem.acquire()
        task = create_task(append(payload))
        tasks.add(task)
        task.add_done_callback(functools.partial(done, perf()))
    if tasks:
        await asyncio.wait(tasks)


async def _drive_await(lh: LedgerHandle, load: _Load, writers: int) -> None:
    """``writers`` coroutines, each awaiting ``lh.append(payload)`` in a loop (1: one append at a time)."""
    perf = time.perf_counter

    async def writer() -> None:
        while perf() < load.deadline:
            t0 = perf()
            try:
                await lh.append(load.payload)
            except LedgerError:
                load.failed()
                return
            load.acked(t0)

    await asyncio.gather(*(writer() for _ in range(writers)))


_DRIVERS = {
    "callbacks": _drive_callbacks,
    "futures": _drive_futures,
    "tasks": _drive_tasks,
    "await": _drive_await,
}
MODES = tuple(_DRIVERS)


#: Counters of each bookie's ``/metrics`` that ``journal_meter`` reads (histograms by their sum and count).
_JOURNAL_COUNTERS = (
    "bookie_journal_syncs_total",
    "bookie_journal_bytes_total",
    "bookie_journal_fsync_seconds_sum",
    "bookie_add_latency_seconds_sum",
    "bookie_add_latency_seconds_count",
)


def _journal_counters(http_ports: list[int]) -> list[dict[str, float]]:
    import urllib.request

    from ledgerstore.bench_topic import metric_value

    out = []
    for port in http_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        out.append({name: metric_value(text, name) for name in _JOURNAL_COUNTERS})
    return out


@contextlib.contextmanager
def journal_meter(http_ports: list[int]) -> Iterator[dict[str, float]]:
    """The bookies' group commit across a block, from their ``/metrics`` (averaged over the bookies):
    ``journal_syncs_per_s``, ``journal_kib_per_sync`` (a batch's size), ``journal_sync_ms`` (a batch's write and
    fdatasync on the journal's thread) and ``bookie_add_ms`` (an add's receive to its reply, per group of adds
    read together, fsync and storage included). Left empty when the bookies cannot be asked."""
    out: dict[str, float] = {}
    if not http_ports:
        yield out
        return
    try:
        before = _journal_counters(http_ports)
    except (OSError, ValueError):
        yield out
        return
    t0 = time.perf_counter()
    yield out
    wall = time.perf_counter() - t0
    try:
        after = _journal_counters(http_ports)
    except (OSError, ValueError):
        return
    syncs = bytes_ = sync_s = add_s = adds = 0.0
    for b, a in zip(before, after, strict=True):
        d = {k: a[k] - b[k] for k in _JOURNAL_COUNTERS}
        syncs += d["bookie_journal_syncs_total"]
        bytes_ += d["bookie_journal_bytes_total"]
        sync_s += d["bookie_journal_fsync_seconds_sum"]
        add_s += d["bookie_add_latency_seconds_sum"]
        adds += d["bookie_add_latency_seconds_count"]
    n = len(http_ports)
    out["journal_syncs_per_s"] = round(syncs / n / wall, 1)
    if syncs:
        out["journal_kib_per_sync"] = round(bytes_ / syncs / 1024, 1)
        out["journal_sync_ms"] = round(1000 * sync_s / syncs, 3)
    if adds:
        out["bookie_add_ms"] = round(1000 * add_s / adds, 3)


@contextlib.contextmanager
def gc_meter() -> Iterator[dict[str, float]]:
    """CPython's cyclic garbage collector in this (the client's) process across a block: ``client_gc_cpu_ms``
    (the collections' CPU time on this thread), ``client_gc_collections`` (all generations) and
    ``client_gc_full_collections`` (generation 2, which walks every tracked object of the process). The block
    stores how many entries it acked under ``"units"``; on exit that key becomes ``gc_us_per_entry_client``."""
    out: dict[str, float] = {}
    counts = [0, 0, 0]
    spent = [0.0]
    started = [0.0]

    def observe(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.thread_time()
        else:
            spent[0] += time.thread_time() - started[0]
            counts[info["generation"]] += 1

    gc.callbacks.append(observe)
    try:
        yield out
    finally:
        gc.callbacks.remove(observe)
    n = max(1, int(out.pop("units", 0)))
    out["client_gc_cpu_ms"] = round(1000 * spent[0], 1)
    out["client_gc_collections"] = sum(counts)
    out["client_gc_full_collections"] = counts[2]
    out["gc_us_per_entry_client"] = round(1e6 * spent[0] / n, 2)


def parse_gc_threshold(text: str) -> tuple[int, ...]:
    """``--gc-threshold``: one to three non-negative integers, comma-separated, as ``gc.set_threshold`` takes."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N[,N1[,N2]] integers, got {text!r}") from None
    if not 1 <= len(values) <= 3 or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected one to three non-negative integers, got {text!r}")
    return values


def run_ledger_bench(
    args: argparse.Namespace,
    emit: Callable[[argparse.Namespace, str, dict[str, Any]], None],
    median: Callable[[list[dict[str, Any]]], dict[str, Any]],
    local_cluster: Any,
    machine_limits: Callable[[Any], dict[str, float]],
) -> int:
    from bookie.main import install_uvloop
    from ledgerstore.bench import cpu_meter, disk_meter

    if args.loop == "uvloop":
        install_uvloop()
    if args.gc_threshold is not None:
        gc.set_threshold(*args.gc_threshold)
    pids = {"client": os.getpid()}
    http_ports: list[int] = []  # the bookies' admin ports (their journals' /metrics), when started here
    with contextlib.ExitStack() as stack:
        if args.use_cluster:
            import tempfile
            from pathlib import Path

            zk, root = args.zk, args.zk_root
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ls-bench-", dir=".")))
        else:
            zk, procs, tmp = stack.enter_context(
                local_cluster(max(args.bookies, args.ensemble), args.bookie_arg)
            )
            root = "/ledgerstore"
            pids |= {f"bookie{i + 1}": bp.proc.pid for i, bp in enumerate(procs)}
            http_ports = [bp.http_port for bp in procs]
        # the machine's limits first, on a quiet disk (after the runs it is still writing back their data)
        limits = machine_limits(tmp)
        runs = []
        for i in range(args.runs):
            with (
                cpu_meter(pids, "entry") as cpu,
                disk_meter(tmp) as disk,
                journal_meter(http_ports) as jnl,
                gc_meter() as gcm,
            ):
                r = asyncio.run(
                    ledger_run(
                        zk,
                        root,
                        ensemble=args.ensemble,
                        write_quorum=args.write_quorum,
                        ack_quorum=args.ack_quorum,
                        entry_size=args.entry_size,
                        outstanding=args.outstanding,
                        ledgers=args.ledgers,
                        duration=args.duration,
                        mode=args.append_mode,
                        freeze_heap=args.freeze_heap,
                    )
                )
                cpu["units"] = gcm["units"] = r["acked"]
            r |= cpu | disk | jnl | gcm
            batch = (
                f", journal {r['journal_kib_per_sync']:,.0f} KiB per sync"
                if "journal_kib_per_sync" in r
                else ""
            )
            print(
                f"  run {i + 1}/{args.runs}: {r['acked_entries_per_s']:,.0f} entries/s, p99 {r['p99_ms']} ms, "
                f"CPU busy {r.get('cpu_busy_pct', '?')}%, disk busy {r.get('disk_busy_pct', '?')}%{batch}",
                file=sys.stderr,
                flush=True,
            )
            runs.append(r)
    if args.plot:
        from ledgerstore.bench import plot_latencies

        plot_latencies(
            args.plot,
            f"bench ledger: E/Qw/Qa {args.ensemble}/{args.write_quorum}/{args.ack_quorum}, "
            f"{args.entry_size} B, {args.outstanding} outstanding, {args.append_mode}",
            runs,
            "acked_entries_per_s",
        )
    result = {
        "mode": "ledger",
        "E/Qw/Qa": f"{args.ensemble}/{args.write_quorum}/{args.ack_quorum}",
        "entry_size": args.entry_size,
        "outstanding": args.outstanding,
        "append_mode": args.append_mode,
        "loop": args.loop if args.loop != "uvloop" or _uvloop_available() else "asyncio",
        "gc_threshold": ",".join(map(str, gc.get_threshold())),
        "client_heap_frozen": gc.get_freeze_count(),
        "ledgers": args.ledgers,
        "duration_s": args.duration,
        "runs": args.runs,
        **median(runs),
        **limits,
    }
    from ledgerstore.bench import disk_bound

    # every bookie of the write set journals and stores each entry, all on this machine's one disk
    result["disk_bound_entries_per_s"] = disk_bound(limits, args.entry_size, args.write_quorum)
    emit(args, f"bench ledger (median of {args.runs} runs)", result)
    return 0


def _uvloop_available() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return not os.environ.get("LEDGERSTORE_NO_UVLOOP")


async def read_run(
    zk: str,
    zk_root: str,
    *,
    ensemble: int,
    write_quorum: int,
    ack_quorum: int,
    entry_size: int,
    entries: int,
    outstanding: int,
    read_config: dict[str, Any],
    api: str = "batches",
    pids: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Write ``entries`` entries to a new ledger, close it, read them all back in order (checking each one's
    id and size): with ``read_batches`` (``api`` "batches") or ``read``; the CPU of ``pids`` over the read, and
    the share of the machine's cores busy meanwhile (``read_machine_busy_pct``: every process, other tenants too)."""
    from ledgerstore.bench import cpu_meter
    from ledgerstore.bench_spark import machine_meter

    cfg = ClientConfig(zk_root=zk_root, outstanding_adds_max=max(1, outstanding), **read_config)
    bk = await BookKeeper.connect(zk, config=cfg)
    try:
        lh = await bk.create_ledger(ensemble, write_quorum, ack_quorum, password=b"bench")
        payload = os.urandom(entry_size)
        stats = {"acked": 0, "errors": 0}
        perf = time.perf_counter
        t0 = perf()
        await _drive(lh, payload, None, [], stats, count=entries)
        await lh.close()
        t_write = perf() - t0
        if stats["errors"]:
            raise RuntimeError(f"{stats['errors']} appends failed")
        reader = await bk.open_ledger(lh.ledger_id, password=b"bench", recovery=False)
        last = reader.last_add_confirmed
        with cpu_meter(pids or {}, "entry_read") as cpu, machine_meter() as machine:
            t0 = perf()
            n = 0
            if api == "batches":
                async for b in reader.read_batches(0, last):
                    if b.first_entry_id != n or b.payloads.count(payload) != len(b):
                        raise RuntimeError(
                            f"read a batch of {len(b)} from entry {b.first_entry_id}, expected {n}"
                        )
                    n += len(b)
            else:
                async for e in reader.read(0, last):
                    if e.entry_id != n or len(e.data) != entry_size:
                        raise RuntimeError(f"read entry {e.entry_id} ({len(e.data)} B), expected {n}")
                    n += 1
            t_read = perf() - t0
            cpu["units"] = n
        if n != entries:
            raise RuntimeError(f"read {n} entries, wrote {entries}")
        with contextlib.suppress(Exception):
            await bk.delete_ledger(lh.ledger_id)
    finally:
        await bk.close()
    return {
        "write_entries_per_s": entries / t_write,
        "write_mb_per_s": entries * entry_size / t_write / 1e6,
        "read_entries_per_s": entries / t_read,
        "read_mb_per_s": entries * entry_size / t_read / 1e6,
        "write_s": round(t_write, 3),
        "read_s": round(t_read, 3),
        **cpu,
        "read_machine_busy_pct": machine.get("machine_busy_pct"),
    }


def run_read_bench(
    args: argparse.Namespace,
    emit: Callable[[argparse.Namespace, str, dict[str, Any]], None],
    median: Callable[[list[dict[str, Any]]], dict[str, Any]],
    local_cluster: Any,
) -> int:
    from bookie.main import install_uvloop

    install_uvloop()
    read_config = {
        k: v
        for k, v in (
            ("read_batch_entries", args.batch_entries),
            ("read_batch_bytes", args.batch_bytes),
            ("read_ahead_batches", args.read_ahead),
        )
        if v is not None
    }
    pids = {"client": os.getpid()}
    with contextlib.ExitStack() as stack:
        if args.use_cluster:
            zk, root = args.zk, args.zk_root
        else:
            zk, procs, _ = stack.enter_context(
                local_cluster(max(args.bookies, args.ensemble), args.bookie_arg)
            )
            root = "/ledgerstore"
            pids |= {f"bookie{i + 1}": bp.proc.pid for i, bp in enumerate(procs)}
        runs = []
        for i in range(args.runs):
            r = asyncio.run(
                read_run(
                    zk,
                    root,
                    ensemble=args.ensemble,
                    write_quorum=args.write_quorum,
                    ack_quorum=args.ack_quorum,
                    entry_size=args.entry_size,
                    entries=args.entries,
                    outstanding=args.outstanding,
                    read_config=read_config,
                    api=args.api,
                    pids=pids,
                )
            )
            print(
                f"  run {i + 1}/{args.runs}: write {r['write_entries_per_s']:,.0f} entries/s, "
                f"read {r['read_entries_per_s']:,.0f} entries/s",
                file=sys.stderr,
                flush=True,
            )
            runs.append(r)
    cfg = ClientConfig()
    result = {
        "mode": "read",
        "E/Qw/Qa": f"{args.ensemble}/{args.write_quorum}/{args.ack_quorum}",
        "entries": args.entries,
        "entry_size": args.entry_size,
        "read_api": args.api,
        "read_batch_entries": read_config.get("read_batch_entries", cfg.read_batch_entries),
        "read_batch_bytes": read_config.get("read_batch_bytes", cfg.read_batch_bytes),
        "read_ahead_batches": read_config.get("read_ahead_batches", cfg.read_ahead_batches),
        "runs": args.runs,
        **median(runs),
    }
    emit(args, f"bench read (median of {args.runs} runs)", result)
    return 0
