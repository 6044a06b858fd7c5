"""``ledgerstore bench``: throughput and latency, beside this machine's own limits measured in the same run.

Modes:
* ``bench bookie``  — one client pipelining adds to one bookie process (journal fsync on);
* ``bench ledger``  — the ledger client writing E/Qw/Qa ledgers to a local cluster of bookie processes;
* ``bench read``    — the ledger client writing N entries to a ledger, closing it and reading it back
  sequentially: write and read entries/s of the same run;
* ``bench limits``  — only the machine limits: 1 KiB append+fsync rate, sequential fsync'd write, loopback
  framed-message rate.

Targets are in the issues; each benchmark's command and latest figures go in docs/BENCHMARKS.md, the figures
they replace in docs/benchmarks-history.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast


def add_bench_commands(
    parser: argparse.ArgumentParser, common: Callable[[argparse.ArgumentParser], None]
) -> None:
    sub = parser.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("bookie", help="one client pipelining adds to one bookie process")
    common(b)
    b.add_argument("--entry-size", type=int, default=1024)
    b.add_argument("--outstanding", type=int, default=2000)
    b.add_argument("--duration", type=float, default=10.0)
    b.add_argument("--runs", type=int, default=3, help="report the median of this many runs")
    b.add_argument("--bookie", default=None, help="HOST:PORT of a running bookie (default: start one)")
    b.add_argument("--plot", default=None, type=plot_path, help=PLOT_HELP)
    b.add_argument(
        "--bookie-arg",
        action="append",
        default=[],
        help="extra argument for the bookie process started (repeatable), e.g. --bookie-arg=--write-buffer-mb=1024",
    )
    b.set_defaults(func=_cmd_bench_bookie)
    lg = sub.add_parser("ledger", help="the ledger client writing to a local cluster")
    common(lg)
    lg.add_argument("-E", "--ensemble", type=int, default=3)
    lg.add_argument("-W", "--write-quorum", type=int, default=3)
    lg.add_argument("-A", "--ack-quorum", type=int, default=2)
    lg.add_argument("--entry-size", type=int, default=1024)
    lg.add_argument("--outstanding", type=int, default=2000)
    lg.add_argument("--ledgers", type=int, default=1)
    lg.add_argument("--duration", type=float, default=10.0)
    lg.add_argument("--runs", type=int, default=3)
    lg.add_argument(
        "--bookies", type=int, default=3, help="bookie processes to start (when no --use-cluster)"
    )
    lg.add_argument("--use-cluster", action="store_true", help="use the cluster registered at --zk")
    lg.add_argument(
        "--mode",
        dest="append_mode",
        choices=("callbacks", "futures", "tasks", "await"),
        default="callbacks",
        help="how the appends are written: append_callback (default); a window of append_future futures; one "
        "asyncio.create_task(lh.append(d)) per entry under a semaphore of --outstanding; --outstanding "
        "coroutines each awaiting lh.append(d) (with --outstanding 1: one append at a time)",
    )
    lg.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="the client's event loop: uvloop when installed (default), or asyncio's own",
    )
    lg.add_argument(
        "--gc-threshold",
        default=None,
        type=_gc_threshold,
        metavar="N[,N1[,N2]]",
        help="gc.set_threshold for the client process (default: CPython's 700,10,10); the runs report the "
        "collector's CPU per entry either way (gc_us_per_entry_client)",
    )
    lg.add_argument(
        "--no-freeze-heap",
        dest="freeze_heap",
        action="store_false",
        help="connect the client with freeze_heap=False (by default its first connect freezes the process's "
        "heap, gc.freeze; client_heap_frozen reports the objects frozen)",
    )
    lg.add_argument("--plot", default=None, type=plot_path, help=PLOT_HELP)
    lg.add_argument(
        "--bookie-arg", action="append", default=[], help="extra argument for the bookie processes"
    )
    lg.set_defaults(func=_cmd_bench_ledger)
    rd = sub.add_parser("read", help="write N entries to a ledger, close it, read it back sequentially")
    common(rd)
    rd.add_argument("-E", "--ensemble", type=int, default=3)
    rd.add_argument("-W", "--write-quorum", type=int, default=2)
    rd.add_argument("-A", "--ack-quorum", type=int, default=2)
    rd.add_argument("-n", "--entries", type=int, default=200_000)
    rd.add_argument("--entry-size", type=int, default=1024)
    rd.add_argument("--outstanding", type=int, default=2000, help="appends in flight while writing")
    rd.add_argument("--batch-entries", type=int, default=None, help="ClientConfig.read_batch_entries")
    rd.add_argument("--batch-bytes", type=int, default=None, help="ClientConfig.read_batch_bytes")
    rd.add_argument("--read-ahead", type=int, default=None, help="ClientConfig.read_ahead_batches")
    rd.add_argument(
        "--api",
        choices=("batches", "entries"),
        default="batches",
        help="read with read_batches (default: a list of payloads per run of entries) or read (an object per "
        "entry)",
    )
    rd.add_argument("--runs", type=int, default=3)
    rd.add_argument(
        "--bookies", type=int, default=3, help="bookie processes to start (when no --use-cluster)"
    )
    rd.add_argument("--use-cluster", action="store_true", help="use the cluster registered at --zk")
    rd.add_argument(
        "--bookie-arg", action="append", default=[], help="extra argument for the bookie processes"
    )
    rd.set_defaults(func=_cmd_bench_read)
    lim = sub.add_parser("limits", help="this machine's fsync and loopback limits")
    common(lim)
    lim.set_defaults(func=_cmd_bench_limits)


# --------------------------------------------------------------------------------------------------------
# Machine limits


def fsync_rate(directory: Path, size: int = 1024, seconds: float = 1.0) -> float:
    """Appends of `size` bytes, each followed by fdatasync: the rate without group commit."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    buf = b"x" * size
    n = 0
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            os.write(fd, buf)
            os.fdatasync(fd)
            n += 1
    finally:
        os.close(fd)
        path.unlink()
    return n / (time.perf_counter() - t0)


def sequential_write_rate(
    directory: Path, total: int = 256 * 1024 * 1024, chunk: int = 4 * 1024 * 1024, *, overwrite: bool = False
) -> float:
    """Bytes/s writing `total` bytes with an fdatasync every `chunk`: into a new file (it grows, as RocksDB's
    files do), or with ``overwrite`` over a file already written (as the journal writes over old segments)."""
    path = directory / "seq-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    buf = os.urandom(chunk)
    try:
        if overwrite:
            for _ in range(total // chunk):
                os.write(fd, buf)
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        t0 = time.perf_counter()
        for _ in range(total // chunk):
            os.write(fd, buf)
            os.fdatasync(fd)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return total / elapsed


async def _loopback_rate(seconds: float = 1.0, size: int = 1024, window: int = 1000) -> float:
    """The network side of ``bench bookie`` alone: ``size``-byte frames pipelined over one loopback asyncio
    connection (``window`` in flight) to a server that answers each with a 33-byte frame (an add response's
    size) and does nothing else. Frames/s answered: the most a bookie could do with zero work per add."""
    reply = b"r" * 33
    frame = struct.pack(">I", size - 4) + b"y" * (size - 4)
    answered = 0

    class Server(asyncio.Protocol):
        def connection_made(self, t: asyncio.BaseTransport) -> None:
            self.t = cast(asyncio.Transport, t)
            self.pending = 0

        def data_received(self, d: bytes) -> None:
            self.pending += len(d)
            n, self.pending = divmod(self.pending, size)
            if n:
                self.t.write(reply * n)

    class Client(asyncio.Protocol):
        def __init__(self) -> None:
            self.got = 0
            self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def connection_made(self, t: asyncio.BaseTransport) -> None:
            self.t = cast(asyncio.Transport, t)
            self.t.write(frame * window)

        def data_received(self, d: bytes) -> None:
            nonlocal answered
            self.got += len(d)
            n, self.got = divmod(self.got, len(reply))
            answered += n
            if time.perf_counter() < deadline:
                self.t.write(frame * n)
            elif not self.done.done():
                self.done.set_result(None)

    loop = asyncio.get_running_loop()
    server = await loop.create_server(Server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    t0 = time.perf_counter()
    deadline = t0 + seconds
    transport, client = await loop.create_connection(Client, "127.0.0.1", port)
    await client.done
    elapsed = time.perf_counter() - t0
    transport.close()
    server.close()
    return answered / elapsed


def machine_limits(directory: Path) -> dict[str, float]:
    """The machine's probes (the loopback one on uvloop when installed). The caller's event loop policy is left
    as it was: ``bench ledger --loop asyncio`` runs its client on asyncio's own loop after these."""
    from bookie.main import install_uvloop

    policy = asyncio.get_event_loop_policy()
    install_uvloop()
    try:
        return {
            "fsync_1k_per_s": round(fsync_rate(directory)),
            "seq_write_fsync_4mib_bytes_per_s": round(sequential_write_rate(directory)),
            "seq_overwrite_fsync_4mib_bytes_per_s": round(sequential_write_rate(directory, overwrite=True)),
            "loopback_framed_1k_msgs_per_s": round(asyncio.run(_loopback_rate())),
        }
    finally:
        asyncio.set_event_loop_policy(policy)


#: Bytes a bookie writes per stored entry besides the payload: entry header + digest (36), the journal's
#: per-entry length (4), RocksDB key and record overhead (~24). Each entry is written twice (journal, storage).
_PER_ENTRY_OVERHEAD = 64


def disk_bound(limits: dict[str, float], entry_size: int, copies: int) -> int:
    """The most entries/s this machine's disk can take when ``copies`` bookies on it each journal every entry
    (written over old segments: the overwrite rate) and store it (RocksDB's new files: the new-file rate). An
    upper bound: RocksDB compaction and filesystem metadata add to it."""
    size = copies * (entry_size + _PER_ENTRY_OVERHEAD)
    new = limits["seq_write_fsync_4mib_bytes_per_s"]
    over = limits.get("seq_overwrite_fsync_4mib_bytes_per_s") or new
    return round(1 / (size / over + size / new))


def _cmd_bench_limits(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="ls-limits-", dir=".") as d:
        lim = machine_limits(Path(d))
    _print(args, "machine limits", lim)
    return 0


# --------------------------------------------------------------------------------------------------------
# Helpers


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; every thread, the kernel's work included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def cpu_meter(pids: dict[str, int], unit: str) -> Iterator[dict[str, float]]:
    """Measure the CPU of named processes across a block. The block stores how many units it acked under
    ``"units"`` in the yielded dict; on exit that key is replaced by ``cpu_us_per_<unit>_<name>`` (CPU µs per
    unit) and ``cpu_busy_pct`` (of all cores). Left empty where /proc is missing."""
    out: dict[str, float] = {}
    try:
        before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
    except OSError:
        yield out
        return
    t0 = time.perf_counter()
    yield out
    wall = time.perf_counter() - t0
    n = max(1, int(out.pop("units", 0)))
    total = 0.0
    for name, pid in pids.items():
        try:
            used = _cpu_seconds(pid) - before[name]
        except OSError:
            continue
        total += used
        out[f"cpu_us_per_{unit}_{name}"] = round(1e6 * used / n, 2)
    out["cpu_busy_pct"] = round(100 * total / (wall * (os.cpu_count() or 1)), 1)


def block_device(path: Path) -> str | None:
    """The /proc/diskstats name of the block device holding ``path`` (None for tmpfs and the like)."""
    try:
        st = os.stat(path)
        link = os.readlink(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    except OSError:
        return None
    return os.path.basename(link)


def _diskstats(device: str) -> tuple[int, int] | None:
    """(bytes written, ms the device was busy) so far, from /proc/diskstats."""
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 12 and fields[2] == device:
                    return int(fields[9]) * 512, int(fields[12])
    except OSError:
        return None
    return None


@contextlib.contextmanager
def disk_meter(path: Path) -> Iterator[dict[str, float]]:
    """Measure the disk holding ``path`` across a block: ``disk_write_mb_per_s`` (everything written to that
    device, other processes' writes included) and ``disk_busy_pct`` (time it had requests in flight; near
    100 the disk, not the software, sets the pace). Left empty where the device cannot be found."""
    out: dict[str, float] = {}
    device = block_device(path)
    before = _diskstats(device) if device else None
    t0 = time.perf_counter()
    yield out
    after = _diskstats(device) if device else None
    wall = time.perf_counter() - t0
    if before is None or after is None or wall <= 0:
        return
    out["disk_write_mb_per_s"] = round((after[0] - before[0]) / wall / 1e6, 1)
    out["disk_busy_pct"] = round(min(100.0, (after[1] - before[1]) / (10 * wall)), 1)


PLOT_HELP = "write a PNG of the add-latency distribution of every run (needs the plot extra: matplotlib)"


def plot_path(path: str) -> str:
    """--plot's type: refuse at once, not after the benchmark ran, when matplotlib is not installed."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError("needs matplotlib: pip install 'ledgerstore[plot]'")
    return path


def plot_latencies(path: str, title: str, runs: list[dict[str, Any]], rate_key: str) -> None:
    """Latency CDF per run (log scale), with the run's throughput in the legend."""
    try:
        import matplotlib
    except ImportError as e:
        from ledgerstore.cli import CommandError

        raise CommandError("--plot needs matplotlib: pip install 'ledgerstore[plot]'") from e

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, r in enumerate(runs):
        lat = sorted(1000 * x for x in r["_latencies"])
        if not lat:
            continue
        ys = [(k + 1) / len(lat) for k in range(len(lat))]
        ax.plot(lat, ys, label=f"run {i + 1}: {r[rate_key]:,.0f}/s, p99 {r['p99_ms']} ms")
    ax.set_xscale("log")
    ax.set_xlabel("add latency (ms, log scale)")
    ax.set_ylabel("fraction of adds")
    ax.axhline(0.99, color="grey", lw=0.5, ls="--")
    ax.set_title(title)
    ax.legend(loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"  latency plot written to {path}", file=sys.stderr)


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"p50_ms": 0.0, "p99_ms": 0.0, "p999_ms": 0.0}
    s = sorted(samples)

    def q(f: float) -> float:
        return round(1000 * s[min(len(s) - 1, int(f * len(s)))], 3)

    return {"p50_ms": q(0.50), "p99_ms": q(0.99), "p999_ms": q(0.999)}


def _print(args: argparse.Namespace, title: str, data: dict[str, Any]) -> None:
    from ledgerstore.cli import emit

    def human() -> str:
        width = max(len(k) for k in data)
        lines = [title, "-" * len(title)]
        for k, v in data.items():
            if isinstance(v, float):
                v = f"{v:,.3f}" if v < 1000 else f"{v:,.0f}"
            elif isinstance(v, int):
                v = f"{v:,}"
            lines.append(f"{k:<{width}}  {v}")
        return "\n".join(lines)

    emit(args, human, data)


@contextlib.contextmanager
def local_cluster(bookies: int, extra_args: list[str] | None = None) -> Iterator[tuple[str, list[Any], Path]]:
    """A throwaway ZooKeeper + bookie processes under a temp dir (on the working directory's disk)."""
    from ledgerstore.cluster import BookieProcess, free_port
    from zk.launcher import ZooKeeperServer

    with tempfile.TemporaryDirectory(prefix="ls-bench-", dir=".") as d:
        root = Path(d)
        zk = ZooKeeperServer(data_dir=root / "zk")
        zk.start()
        procs: list[BookieProcess] = []
        try:
            for i in range(bookies):
                bp = BookieProcess(
                    zk=zk.connect_string,
                    data_dir=root / f"bookie-{i}",
                    port=free_port(),
                    http_port=free_port(),
                    extra_args=list(extra_args or []),
                )
                procs.append(bp.start(wait=False))
            for bp in procs:
                bp.wait_healthy(60)
            yield zk.connect_string, procs, root
        finally:
            for bp in procs:
                bp.stop()
            zk.stop()


# --------------------------------------------------------------------------------------------------------
# bench bookie


class _AddLoad(asyncio.Protocol):
    """The bench bookie load generator: keeps ``outstanding`` adds of one ledger in flight on one connection.

    Replies are handled a received chunk at a time and answered with as many new adds in one write, so the
    generator costs little CPU next to the bookie it measures (both share this machine's two cores). Latency
    of an add: its chunk's send time to its reply chunk's arrival."""

    def __init__(self, entry_size: int, outstanding: int, duration: float) -> None:
        from bookie import protocol as p
        from bookie.entryformat import DigestType, EntryCodec

        self.ledger_id = int(time.time() * 1000) & 0xFFFFFFFF
        codec = EntryCodec(self.ledger_id, DigestType.CRC32C)
        self.build = codec.add_frame_builder(p.master_key(b"bench"))
        self.decoder = p.FrameDecoder()
        self.payload = os.urandom(entry_size)
        self.entry_size = entry_size
        self.outstanding = outstanding
        self.duration = duration
        self.sent_at: list[float] = []  # by entry id (= request id - 1)
        self.latencies: list[float] = []
        self.acked = 0
        self.errors = 0
        self.inflight = 0
        self.deadline = 0.0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        from bookie import protocol as p
        from ledger_client.client import ClientConfig, resolve_auth_token

        self.transport = cast(asyncio.Transport, transport)
        token = resolve_auth_token(ClientConfig())
        if token:  # a bookie with --auth-required: AUTH first (request id 0), the adds pipelined behind it
            auth = p.AuthRequest(request_id=0, method=p.AuthMethod.TOKEN, credential=token.encode())
            self.transport.write(p.encode(auth))
        self.deadline = time.perf_counter() + self.duration
        self._send(self.outstanding)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"bookie closed the connection: {exc or 'EOF'}"))

    def _send(self, n: int) -> None:
        first = len(self.sent_at)
        size = self.entry_size
        payload = self.payload
        build = self.build
        frames = [build(e + 1, e, e - 1, (e + 1) * size, payload) for e in range(first, first + n)]
        self.sent_at.extend([time.perf_counter()] * n)
        self.inflight += n
        assert self.transport is not None
        self.transport.write(b"".join(frames))

    def data_received(self, data: bytes) -> None:
        from bookie import protocol as p

        dec = self.decoder
        dec.feed(data)
        rows = dec.take_leading_add_responses()
        # more than a partial add response left: another kind of frame came first; decode the rest one by one
        if dec.buffered >= p.ADD_RESP_FRAME_SIZE:
            rows += [(0, 0, 0, 0, r.request_id, int(r.status), 0, 0) for r in dec.responses()]
            if rows and rows[0][4] == 0:  # the answer to AUTH
                if rows[0][5] != p.Status.OK and not self.done.done():
                    self.done.set_exception(ConnectionError("bookie refused the token"))
                rows = rows[1:]
        now = time.perf_counter()
        sent = self.sent_at
        ok = [now - sent[r[4] - 1] for r in rows if r[5] == p.Status.OK]
        self.latencies.extend(ok)
        self.acked += len(ok)
        self.errors += len(rows) - len(ok)
        self.inflight -= len(rows)
        if now < self.deadline and len(ok) == len(rows):
            self._send(len(rows))
        elif self.inflight == 0 and not self.done.done():
            self.done.set_result(None)


async def _bookie_run(address: str, entry_size: int, outstanding: int, duration: float) -> dict[str, Any]:
    from ledger_client.bookie_conn import split_address

    host, port = split_address(address)
    loop = asyncio.get_running_loop()
    load = _AddLoad(entry_size, outstanding, duration)
    t_start = time.perf_counter()
    transport, _ = await loop.create_connection(lambda: load, host, port)
    try:
        await load.done
    finally:
        transport.close()
    elapsed = time.perf_counter() - t_start
    return {
        "acked_adds_per_s": load.acked / elapsed,
        "mb_per_s": load.acked * entry_size / elapsed / 1e6,
        "acked": load.acked,
        "errors": load.errors,
        **percentiles(load.latencies),
        "_latencies": load.latencies,
    }


def _median_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in runs[0]:
        if k.startswith("_"):
            continue
        vals = [r[k] for r in runs]
        out[k] = statistics.median(vals) if isinstance(vals[0], int | float) else vals[0]
    for rate in ("acked_entries_per_s", "acked_adds_per_s", "write_entries_per_s", "read_entries_per_s"):
        if rate in runs[0]:
            out["per_run_" + rate.removeprefix("acked_")] = [round(r[rate]) for r in runs]
    return out


def _cmd_bench_bookie(args: argparse.Namespace) -> int:
    from bookie.main import install_uvloop

    install_uvloop()
    with contextlib.ExitStack() as stack:
        if args.bookie:
            address = args.bookie
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ls-bench-", dir=".")))
        else:
            _, procs, root = stack.enter_context(local_cluster(1, args.bookie_arg))
            address = procs[0].id
        # the machine's limits first, on a quiet disk (after the runs it is still writing back their data)
        limits = machine_limits(root)
        pids = {"client": os.getpid()} | ({} if args.bookie else {"bookie": procs[0].proc.pid})
        runs = []
        for i in range(args.runs):
            with cpu_meter(pids, "add") as cpu, disk_meter(root) as disk:
                r = asyncio.run(_bookie_run(address, args.entry_size, args.outstanding, args.duration))
                cpu["units"] = r["acked"]
            r |= cpu | disk
            print(
                f"  run {i + 1}/{args.runs}: {r['acked_adds_per_s']:,.0f} adds/s, p99 {r['p99_ms']} ms, "
                f"CPU busy {r.get('cpu_busy_pct', '?')}%, disk busy {r.get('disk_busy_pct', '?')}%",
                file=sys.stderr,
                flush=True,
            )
            runs.append(r)
    result = {
        "mode": "bookie",
        "entry_size": args.entry_size,
        "outstanding": args.outstanding,
        "duration_s": args.duration,
        "runs": args.runs,
        **_median_runs(runs),
        **limits,
    }
    result["vs_fsync_rate"] = round(result["acked_adds_per_s"] / max(1, limits["fsync_1k_per_s"]), 1)
    result["disk_bound_adds_per_s"] = disk_bound(limits, args.entry_size, 1)
    if args.plot:
        plot_latencies(
            args.plot,
            f"bench bookie: {args.entry_size} B adds, {args.outstanding} outstanding",
            runs,
            "acked_adds_per_s",
        )
    _print(args, f"bench bookie (median of {args.runs} runs)", result)
    return 0


def _gc_threshold(text: str) -> tuple[int, ...]:
    from ledgerstore.bench_ledger import parse_gc_threshold

    return parse_gc_threshold(text)


def _cmd_bench_ledger(args: argparse.Namespace) -> int:
    from ledgerstore.bench_ledger import run_ledger_bench

    return run_ledger_bench(args, _print, _median_runs, local_cluster, machine_limits)


def _cmd_bench_read(args: argparse.Namespace) -> int:
    from ledgerstore.bench_ledger import run_read_bench

    return run_read_bench(args, _print, _median_runs, local_cluster)
