"""``ledgerstore bench topic``: produce and end-to-end (publish → consume) throughput and latency of the topic
broker through the official ``pulsar-client``, on a partitioned topic.

Producers and consumers are separate processes (the Python client serialises its callbacks on one
interpreter, so one process cannot drive the broker to its limit); each run uses a fresh topic, and the
medians of ``--runs`` runs are reported. Produce: every producer sends its share with ``send_async`` as fast
as the client's pending-message window lets it; the figure is the messages acknowledged over the wall time
from the common start to the last producer's flush. End to end: producers send evenly at a fixed total rate
(``--rate``; default half the median produce figure) while ``--consumers`` processes on a Shared
subscription receive and acknowledge; latency of a message is its receive time minus its publish time (same
machine clock). Every run checks its counts: what the producers had acknowledged is what the broker stored
and what the consumers received. CPU per message of the broker, the bookies and the client processes is
reported beside the figures, with how busy the whole machine was.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import sys
import time
import uuid
from array import array
from collections.abc import Callable
from typing import Any

__all__ = ["add_bench_topic_command", "run"]


def add_bench_topic_command(
    bench: argparse.ArgumentParser, common: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add ``topic`` to ``ledgerstore bench``'s modes (the sub-parsers ``bench`` already has)."""
    modes = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction))
    tp = modes.add_parser(
        "topic", help="pulsar-client produce and end-to-end throughput/latency via a broker"
    )
    common(tp)
    tp.add_argument("--messages", type=int, default=400_000, help="messages produced per phase")
    tp.add_argument("--size", type=int, default=256, help="message payload bytes (default 256)")
    tp.add_argument("--no-batching", action="store_true", help="one SEND per message")
    tp.add_argument(
        "--callback-every",
        type=int,
        default=64,
        help="a completion callback on every N-th message (1: on each; a Python callback per message costs "
        "the client more than the broker spends)",
    )
    tp.add_argument("--partitions", type=int, default=4)
    tp.add_argument("--producers", type=int, default=2, help="producer processes")
    tp.add_argument("--consumers", type=int, default=2, help="consumer processes (end-to-end phase)")
    tp.add_argument(
        "--rate", type=float, default=0.0, help="end-to-end phase rate, msg/s (0: half of produce)"
    )
    tp.add_argument("--skip-e2e", action="store_true")
    tp.add_argument("--runs", type=int, default=3, help="runs of each phase; the medians are reported")
    tp.add_argument("-E", "--ensemble", type=int, default=3)
    tp.add_argument("-W", "--write-quorum", type=int, default=2)
    tp.add_argument("-A", "--ack-quorum", type=int, default=2)
    tp.add_argument(
        "--bookies", type=int, default=3, help="bookie processes to start (without --service-url)"
    )
    tp.add_argument("--service-url", default=None, help="use this running broker (its --zk for the topic)")
    tp.set_defaults(func=run)


# -- worker processes -----------------------------------------------------------------------------------------


def _client(url: str) -> Any:
    import pulsar

    return pulsar.Client(
        url, operation_timeout_seconds=60, io_threads=1, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
    )


def _produce(
    url: str, topic: str, n: int, size: int, batching: bool, rate: float, every: int, go: Any, out: Any
) -> None:
    """Send ``n`` messages (at ``rate`` msg/s when > 0) once ``go`` is set; put (acked, failed, start, end) on
    ``out``.

    A completion callback goes on every ``every``-th message and the last: the official Python client hands each
    callback from its I/O thread to Python under the GIL, a cost of the client, not of the broker.
    ``flush()`` returns once every message is acknowledged or failed; a failed sample counts its whole stride
    as failed. The broker's own count of stored messages is checked after the phase. Paced, the producer sends
    what is due every half millisecond (at most a few dozen messages at once), so the rate has no bursts."""
    import pulsar

    c = _client(url)
    try:
        p = c.create_producer(
            topic,
            batching_enabled=batching,
            batching_max_messages=1000,
            batching_max_allowed_size_in_bytes=256 * 1024,
            batching_max_publish_delay_ms=5,
            max_pending_messages=10_000,
            max_pending_messages_across_partitions=40_000,
            block_if_queue_full=True,
            send_timeout_millis=120_000,
        )
        payload = b"x" * size
        counts = [0, 0]

        def done(res: Any, _mid: Any) -> None:
            if res != pulsar.Result.Ok:
                counts[1] += every

        send_async = p.send_async
        go.wait(120)
        cpu0 = time.process_time()
        start = time.time()
        i = 0  # messages sent
        while i < n:
            due = n
            if rate > 0:
                due = min(n, int((time.time() - start) * rate) + 1)
                if due <= i:
                    time.sleep(0.0005)
                    continue
            for i in range(i + 1, due + 1):  # noqa: B020 - i is the count sent once the loop ends
                send_async(payload, done if i % every == 0 or i == n else None)
        p.flush()
        end = time.time()
        failed = min(n, counts[1])
        out.put(("produced", n - failed, failed, start, end, time.process_time() - cpu0))
    finally:
        c.close()


def _consume(url: str, topic: str, total: int, received: Any, ready: Any, out: Any) -> None:
    """Consume on the Shared subscription ``bench`` until the consumers together received ``total`` messages
    (``received``, shared between the processes) or nothing arrives for 30 s; put (received, latencies ms,
    CPU seconds, receive times) on ``out``.

    What a Pulsar user does: ``receive`` and ``acknowledge`` each message, in as many processes as it takes to
    keep up. Latency of a message: the time ``receive`` returned it minus its publish time (same machine
    clock)."""
    import pulsar

    c = _client(url)
    try:
        consumer = c.subscribe(
            topic, "bench", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=5000
        )
        ready.release()
        receive, acknowledge, clock = consumer.receive, consumer.acknowledge, time.time
        lat = array("d")  # per message: latency ms, and (in `at`) its receive time (for the trace)
        at = array("d")
        got = unreported = 0
        cpu0 = time.process_time()
        idle_since = time.monotonic()
        while received.value < total:
            try:
                m = receive(100)
            except pulsar.Timeout:
                with received.get_lock():
                    received.value += unreported
                unreported = 0
                if time.monotonic() - idle_since > 30:
                    break
                continue
            now = clock()
            at.append(now)
            lat.append(now * 1000 - m.publish_timestamp())
            acknowledge(m)
            got += 1
            unreported += 1
            if unreported == 256:
                idle_since = time.monotonic()
                with received.get_lock():
                    received.value += unreported
                unreported = 0
        out.put(("consumed", got, lat, time.process_time() - cpu0, at))
    finally:
        c.close()


def _stored_messages(admin_url: str, topic: str) -> int:
    import json
    import urllib.request

    path = topic.replace("persistent://", "persistent/")
    with urllib.request.urlopen(f"{admin_url}/admin/v2/{path}/partitioned-stats", timeout=30) as r:
        return int(json.loads(r.read())["msgInCounter"])


def _stored_entries(admin_url: str, topic: str, partitions: int) -> int:
    """Ledger entries the broker stored for the partitions of ``topic`` (a client batch is one entry)."""
    import json
    import urllib.request

    path = topic.replace("persistent://", "persistent/")
    total = 0
    for i in range(partitions):
        url = f"{admin_url}/admin/v2/{path}-partition-{i}/internalStats"
        with urllib.request.urlopen(url, timeout=30) as r:
            total += int(json.loads(r.read())["numberOfEntries"])
    return total


# -- latency over time ----------------------------------------------------------------------------------------


def latency_trace(
    samples: list[tuple[Any, Any]], t0: float, window_s: float = 0.1, worst: int = 3
) -> dict[str, Any]:
    """Where in a run the latency was: ``samples`` holds per consumer (receive times in s, latencies in ms),
    ``t0`` is the run's start. Returns the ``worst`` windows of ``window_s`` by their highest latency, as
    [offset s, max ms, messages received in the window], and the longest time between two consecutive
    receives of all consumers (``max_gap_ms`` at ``gap_at_s``): a stall of delivery shows as both."""
    if window_s <= 0 or worst < 1:
        raise ValueError("need window_s > 0 and worst >= 1")
    peak: dict[int, float] = {}
    count: dict[int, int] = {}
    times: list[float] = []
    for at, lat in samples:
        if len(at) != len(lat):
            raise ValueError(f"{len(at)} receive times for {len(lat)} latencies")
        times.extend(at)
        for t, ms in zip(at, lat, strict=True):
            w = int((t - t0) / window_s)
            count[w] = count.get(w, 0) + 1
            if ms > peak.get(w, -1e18):
                peak[w] = ms
    top = sorted(peak, key=lambda w: peak[w], reverse=True)[:worst]
    out: dict[str, Any] = {
        "worst_windows": [[round(w * window_s, 2), round(peak[w], 1), count[w]] for w in sorted(top)]
    }
    times.sort()
    gap, gap_at = 0.0, t0
    for a, b in zip(times, times[1:], strict=False):
        if b - a > gap:
            gap, gap_at = b - a, a
    out["max_gap_ms"] = round(gap * 1000, 1)
    out["gap_at_s"] = round(gap_at - t0, 2)
    return out


def fsync_tail(
    metrics_text: str,
    over_s: tuple[float, ...] = (0.1, 0.25),
    histogram: str = "bookie_journal_fsync_seconds",
) -> list[float]:
    """From a bookie's ``/metrics``: how many observations of ``histogram`` so far were longer than each of
    ``over_s`` (each bound must be one of its bucket bounds): by default the journal's fsyncs, with
    ``bookie_add_latency_seconds`` its adds (receive to reply, the journal's write included). Raises
    ValueError when the histogram or a bucket is missing."""
    import re

    buckets: dict[float, float] = {}
    count: float | None = None
    bucket = re.compile(re.escape(histogram) + r'_bucket\{(?:[^}]*,)?le="([^"]+)"[^}]*\} (\S+)')
    for line in metrics_text.splitlines():
        m = bucket.match(line)
        if m:
            buckets[float(m.group(1))] = float(m.group(2))
        elif line.startswith(histogram + "_count "):
            count = float(line.rsplit(" ", 1)[1])
    if count is None:
        raise ValueError(f"no {histogram} histogram in the metrics")
    missing = [b for b in over_s if b not in buckets]
    if missing:
        raise ValueError(f"no {histogram} bucket with the bound {missing[0]}")
    return [count - buckets[b] for b in over_s]


def disk_of(path: str) -> str | None:
    """The name in ``/proc/diskstats`` of the block device holding ``path`` (a partition's own line), or
    None when it has none (tmpfs, overlay) or the kernel does not say."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                p = line.split()
                if len(p) > 3 and int(p[0]) == major and int(p[1]) == minor:
                    return p[2]
    except OSError:
        return None
    return None


def diskstats(name: str, text: str) -> tuple[int, int]:
    """From ``/proc/diskstats`` text: the device's writes and flushes completed so far (what a journal
    waits for; reads of other work may still complete while they stall) and its requests in flight now.
    ValueError for an unknown device."""
    for line in text.splitlines():
        p = line.split()
        if len(p) >= 14 and p[2] == name:
            done = int(p[7]) + (int(p[18]) if len(p) > 18 else 0)
            return done, int(p[11])
    raise ValueError(f"no device {name} in /proc/diskstats")


def disk_stalls(samples: list[tuple[float, int, int]], min_s: float = 0.1) -> list[tuple[float, float]]:
    """Where the device completed nothing while it held requests: ``samples`` are (time s, requests
    completed so far, requests in flight) in time order; returns each (start, end) of at least ``min_s``
    from a sample that saw requests in flight to the sample at which the next completion showed."""
    out: list[tuple[float, float]] = []
    start: float | None = None
    for (_t0, done0, _f0), (t1, done1, flight1) in zip(samples, samples[1:], strict=False):
        if done1 != done0:  # something completed since the previous sample: a stall (if any) ends here
            if start is not None and t1 - start >= min_s:
                out.append((start, t1))
            start = None
        elif start is None and flight1 > 0:
            start = t1
    last = samples[-1][0] if samples else 0.0
    if start is not None and last - start >= min_s:
        out.append((start, last))
    return out


class DiskWatch:
    """A thread sampling ``/proc/diskstats`` for one device every ``every_s`` while in a ``with``; then
    :meth:`stalls` says where it completed nothing with requests in flight. A device the kernel does not
    list (tmpfs) gives no samples and no stalls."""

    def __init__(self, name: str | None, every_s: float = 0.01) -> None:
        import threading

        self.name = name
        self.every_s = every_s
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disk-watch", daemon=True)

    def _run(self) -> None:
        assert self.name is not None
        while not self._stop.wait(self.every_s):
            try:
                with open("/proc/diskstats") as f:
                    done, flight = diskstats(self.name, f.read())
            except (OSError, ValueError):
                return
            self.samples.append((time.time(), done, flight))

    def __enter__(self) -> DiskWatch:
        if self.name is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def stalls(self, min_s: float = 0.1) -> list[tuple[float, float]]:
        return disk_stalls(self.samples, min_s)


def metric_value(metrics_text: str, name: str) -> float:
    """The value of the unlabelled sample ``name`` in a Prometheus text exposition (ValueError if absent)."""
    for line in metrics_text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise ValueError(f"no {name} in the metrics")


def _fsync_tails(http_ports: list[int]) -> list[list[float]]:
    """Per bookie: journal syncs over 100 ms and over 250 ms so far, the bytes of entries it has read, and
    its adds over 100 ms (receive to reply: a journal write that waited on the disk shows there, not in the
    fsyncs)."""
    import urllib.request

    out = []
    for port in http_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        adds = fsync_tail(text, (0.1,), "bookie_add_latency_seconds")
        out.append([*fsync_tail(text), metric_value(text, "bookie_read_bytes_total"), *adds])
    return out


#: Log lines worth showing beside a run's latency: warnings, stalls and the storage's own events.
_EVENT_WORDS = (
    "WARNING",
    "ERROR",
    "stall",
    "slow",
    "gc:",
    "rolled over",
    "rotat",
    "flush",
    "compact",
    "checkpoint",
)


def log_events(paths: list[Any], start: float, end: float, limit: int = 20) -> list[str]:
    """The lines of the processes' logs (``YYYY-MM-DD HH:MM:SS,mmm LEVEL …``, local time) stamped between
    ``start`` and ``end`` (epoch seconds) that name a warning or a storage event, each prefixed with its
    offset from ``start`` and its file's name; at most ``limit``, the earliest first."""
    found: list[tuple[float, str]] = []
    for path in paths:
        try:
            text = open(path, errors="replace").read()  # noqa: SIM115 - read at once
        except OSError:
            continue
        name = os.path.basename(str(path))
        for line in text.splitlines():
            if len(line) < 23 or not any(w in line for w in _EVENT_WORDS):
                continue
            try:
                ts = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
            except ValueError:
                continue
            if start <= ts <= end:
                found.append((ts, f"+{ts - start:.2f}s {name}: {line[24:][:160]}"))
    return [text for _ts, text in sorted(found)[:limit]]


# -- the benchmark ----------------------------------------------------------------------------------------------


def _create_topic(zk: str, zk_root: str, topic: str, partitions: int) -> None:
    from topic_broker.names import TopicName
    from zk import MetadataStore
    from zk.managed_ledgers import BrokerMetadataStore

    async def create() -> None:
        store = MetadataStore.connect(zk, root=zk_root)
        try:
            await BrokerMetadataStore(store).create_partitioned_topic(
                TopicName.parse(topic).ml_name, partitions
            )
        finally:
            store.close()

    asyncio.run(create())


def _phase(
    url: str,
    topic: str,
    args: argparse.Namespace,
    rate: float,
    consume: bool,
    pids: dict[str, int],
    logs: list[Any],
) -> dict[str, Any]:
    """One run: producers (and with ``consume`` one consumer process per partition) on a fresh ``topic``."""
    from ledgerstore.bench import cpu_meter
    from ledgerstore.bench_spark import _cpu_ticks as machine_ticks

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    go = ctx.Event()
    procs = []
    received = ctx.Value("q", 0)
    if consume:
        ready = ctx.Semaphore(0)
        for _ in range(args.consumers):
            cp = ctx.Process(target=_consume, args=(url, topic, args.messages, received, ready, out))
            cp.start()
            procs.append(cp)
        for _ in range(args.consumers):
            ready.acquire(timeout=60)
    share = args.messages // args.producers
    per_rate = rate / args.producers if rate > 0 else 0.0
    for i in range(args.producers):
        n = share + (args.messages - share * args.producers if i == 0 else 0)
        pp = ctx.Process(
            target=_produce,
            args=(url, topic, n, args.size, not args.no_batching, per_rate, args.callback_every, go, out),
        )
        pp.start()
        procs.append(pp)
    time.sleep(2)  # the producers connect before the clock starts
    busy0, total0 = machine_ticks()
    with cpu_meter(pids, "msg") as cpu, DiskWatch(disk_of(".")) as disk:
        go.set()
        results = [out.get(timeout=600) for _ in procs]
        cpu["units"] = args.messages
    busy1, total1 = machine_ticks()
    for p in procs:
        p.join(60)
    produced = [r for r in results if r[0] == "produced"]
    acked = sum(r[1] for r in produced)
    wall = max(r[4] for r in produced) - min(r[3] for r in produced)
    row: dict[str, Any] = {
        "acked": acked,
        "failed": sum(r[2] for r in produced),
        "msg_per_s": round(acked / wall),
        "mb_per_s": round(acked * args.size / wall / 1e6, 1),
        **cpu,
        "machine_busy_pct": round(100 * (busy1 - busy0) / max(1.0, total1 - total0), 1),
        "cpu_us_per_msg_producers": round(1e6 * sum(r[5] for r in produced) / max(1, acked), 2),
    }
    if disk.name is not None:  # the data directory's disk completing nothing while asked: every journal waits
        start = min(r[3] for r in produced)
        stalls = disk.stalls(0.1)
        row["disk_stalls_over_100ms"] = len(stalls)
        if stalls:
            a, b = max(stalls, key=lambda s: s[1] - s[0])
            row["disk_stall_max_ms"] = round((b - a) * 1000, 1)
            row["disk_stall_at_s"] = round(a - start, 2)
    if consume:
        lat = sorted(x for r in results if r[0] == "consumed" for x in r[2])
        row["received"] = sum(r[1] for r in results if r[0] == "consumed")
        consumers_cpu = sum(r[3] for r in results if r[0] == "consumed")
        row["cpu_us_per_msg_consumers"] = round(1e6 * consumers_cpu / max(1, row["received"]), 2)
        if lat:
            row["p50_ms"] = round(lat[len(lat) // 2], 1)
            row["p99_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1)
            row["max_ms"] = round(lat[-1], 1)
            t0 = min(r[3] for r in produced)
            trace = latency_trace([(r[4], r[2]) for r in results if r[0] == "consumed"], t0)
            row.update(trace)
            events = log_events(logs, t0 - 1.0, time.time())
            if events:
                print("  events in the run's logs:\n    " + "\n    ".join(events), file=sys.stderr)
    return row


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per key, the median of the runs' numbers (and every run's figure under ``runs`` for throughput)."""
    import statistics

    row: dict[str, Any] = {}
    for k in runs[0]:
        values = [r[k] for r in runs if k in r]
        if isinstance(values[0], list):  # the latency trace's windows: every run's
            row[f"runs_{k}"] = values
            continue
        row[k] = statistics.median(values) if len(values) > 1 else values[0]
    row["runs_msg_per_s"] = [r["msg_per_s"] for r in runs]
    if "p99_ms" in runs[0]:
        row["runs_p99_ms"] = [r.get("p99_ms") for r in runs]
        row["runs_max_gap_ms"] = [r.get("max_gap_ms") for r in runs]
        row["runs_gap_at_s"] = [r.get("gap_at_s") for r in runs]
    if any(
        "disk_stalls_over_100ms" in r for r in runs
    ):  # each run's, beside its gap (a median of offsets says nothing)
        row["runs_disk_stall_max_ms"] = [r.get("disk_stall_max_ms", 0.0) for r in runs]
        row["runs_disk_stall_at_s"] = [r.get("disk_stall_at_s") for r in runs]
    return row


def run(args: argparse.Namespace) -> int:
    from ledgerstore.bench import _print, local_cluster
    from ledgerstore.cli import CommandError
    from ledgerstore.cluster import BrokerProcess, free_port

    if args.messages < args.producers or args.size < 1 or args.partitions < 1 or args.producers < 1:
        raise CommandError("need --messages >= --producers >= 1, --size >= 1, --partitions >= 1")
    if args.runs < 1:
        raise CommandError("need --runs >= 1")
    try:
        import pulsar  # noqa: F401
    except ImportError as e:
        raise CommandError("bench topic needs pulsar-client (pip install pulsar-client)") from e
    with contextlib.ExitStack() as stack:
        pids: dict[str, int] = {}
        admin_url: str | None = None
        logs: list[Any] = []  # the broker's and bookies' logs, for the events beside the latency
        bookie_http: list[int] = []  # the bookies' admin ports (/metrics), for their journal syncs
        if args.service_url:
            url, zk, root = args.service_url, args.zk, args.zk_root
        else:
            print(f"  starting ZooKeeper, {args.bookies} bookies and a broker", file=sys.stderr, flush=True)
            zk, bookies, tmp = stack.enter_context(local_cluster(max(args.bookies, args.ensemble)))
            root = "/ledgerstore"
            bp = BrokerProcess(
                zk=zk,
                zk_root=root,
                port=free_port(),
                http_port=free_port(),
                extra_args=[
                    f"--ensemble-size={args.ensemble}",
                    f"--write-quorum={args.write_quorum}",
                    f"--ack-quorum={args.ack_quorum}",
                ],
                log_path=tmp / "broker.log",
            )
            stack.callback(bp.stop)
            bp.start()
            url = bp.service_url
            if bp.proc:
                pids["broker"] = bp.proc.pid
            pids.update({f"bookie{i}": b.proc.pid for i, b in enumerate(bookies) if b.proc})
            admin_url = f"http://127.0.0.1:{bp.http_port}"
            logs = [tmp / "broker.log", *(b.log_path for b in bookies if b.log_path)]
            bookie_http = [b.http_port for b in bookies]

        def one_run(rate: float, consume: bool) -> dict[str, Any]:
            topic = f"persistent://public/default/bench-{uuid.uuid4().hex[:8]}"
            _create_topic(zk, root, topic, args.partitions)
            before = _fsync_tails(bookie_http)
            row = _phase(url, topic, args, rate, consume, pids, logs)
            if bookie_http:  # slow journal syncs during the run, per bookie: a stall of every add on them
                after = _fsync_tails(bookie_http)
                row["fsyncs_over_100ms"] = [int(a[0] - b[0]) for a, b in zip(after, before, strict=True)]
                row["fsyncs_over_250ms"] = [int(a[1] - b[1]) for a, b in zip(after, before, strict=True)]
                # entries the broker read from the bookies, not from its cache (a consumer behind the tail)
                row["bookie_read_mb"] = round(
                    sum(a[2] - b[2] for a, b in zip(after, before, strict=True)) / 1e6, 1
                )
                row["adds_over_100ms"] = [int(a[3] - b[3]) for a, b in zip(after, before, strict=True)]
            if admin_url:  # what the broker stored, counted by the broker: the producers' figure checked
                stored = _stored_messages(admin_url, topic)
                if stored != row["acked"]:
                    raise CommandError(f"the broker stored {stored} messages, {row['acked']} acked")
                # per ledger entry (a batch): the broker's and bookies' cost does not depend on how full
                # the batches were, which the rate and the machine's load decide
                entries = _stored_entries(admin_url, topic, args.partitions)
                row["entries"] = entries
                servers = [k for k in row if k.startswith(("cpu_us_per_msg_broker", "cpu_us_per_msg_bookie"))]
                for k in servers:
                    per_entry = row[k] * row["acked"] / max(1, entries)
                    row[k.replace("_per_msg_", "_per_entry_")] = round(per_entry, 1)
            if row["failed"] or row.get("received", row["acked"]) != row["acked"]:
                raise CommandError(
                    f"{row['acked']} acked, {row['failed']} failed, {row.get('received')} received"
                )
            print(f"  {'e2e' if consume else 'produce'}: {row}", file=sys.stderr, flush=True)
            return row

        data: dict[str, Any] = {
            "size": args.size,
            "batching": not args.no_batching,
            "partitions": args.partitions,
            "producers": args.producers,
            "messages": args.messages,
            "runs": args.runs,
            "E/Qw/Qa": f"{args.ensemble}/{args.write_quorum}/{args.ack_quorum}",
            "load_before": round(os.getloadavg()[0], 2),
        }
        produce = _medians([one_run(0.0, False) for _ in range(args.runs)])
        data.update({f"produce_{k}": v for k, v in produce.items()})
        if not args.skip_e2e:
            rate = args.rate or produce["msg_per_s"] / 2
            e2e = _medians([one_run(rate, True) for _ in range(args.runs)])
            data["e2e_rate_target"] = round(rate)
            data.update({f"e2e_{k}" if not k.startswith("e2e_") else k: v for k, v in e2e.items()})
        data["load_after"] = round(os.getloadavg()[0], 2)
    _print(args, "bench topic (pulsar-client through a broker)", data)
    return 0
