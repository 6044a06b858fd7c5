"""``ledgerstore bench``: throughput and latency, beside this machine's own limits measured in the same run.

Modes:
* ``bench bookie``  — one client pipelining adds to one bookie process (journal fsync on);
* ``bench ledger``  — the ledger client writing E/Qw/Qa ledgers to a local cluster of bookie processes;
* ``bench limits``  — only the machine limits: 1 KiB append+fsync rate, sequential fsync'd write, loopback
  framed-message rate.

Targets are in the issues; results and the commands that produced them go in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import struct
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
    b.add_argument("--plot", default=None, help="write a PNG of the add-latency distribution of every run")
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
    lg.add_argument("--plot", default=None, help="write a PNG of the add-latency distribution of every run")
    lg.set_defaults(func=_cmd_bench_ledger)
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
    directory: Path, total: int = 256 * 1024 * 1024, chunk: int = 4 * 1024 * 1024
) -> float:
    """Bytes/s writing `total` bytes with an fdatasync every `chunk`."""
    path = directory / "seq-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    buf = os.urandom(chunk)
    t0 = time.perf_counter()
    try:
        for _ in range(total // chunk):
            os.write(fd, buf)
            os.fdatasync(fd)
    finally:
        os.close(fd)
        path.unlink()
    return total / (time.perf_counter() - t0)


async def _loopback_rate(seconds: float = 1.0, size: int = 1024) -> float:
    """Framed messages/s echoed over a loopback asyncio connection (the network limit of one client)."""
    hdr = struct.Struct(">I")
    counted = 0

    class Echo(asyncio.Protocol):
        def connection_made(self, t: asyncio.BaseTransport) -> None:
            self.t = cast(asyncio.Transport, t)

        def data_received(self, d: bytes) -> None:
            self.t.write(d)

    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    frame = hdr.pack(size) + b"y" * size
    batch = frame * 64
    t0 = time.perf_counter()

    async def pump() -> None:
        while time.perf_counter() - t0 < seconds:
            writer.write(batch)
            await writer.drain()

    async def sink() -> None:
        nonlocal counted
        want = len(frame)
        got = 0
        while time.perf_counter() - t0 < seconds:
            data = await reader.read(1 << 20)
            got += len(data)
            counted = got // want

    await asyncio.gather(pump(), sink())
    elapsed = time.perf_counter() - t0
    writer.close()
    server.close()
    return counted / elapsed


def machine_limits(directory: Path) -> dict[str, float]:
    from bookie.main import install_uvloop

    install_uvloop()
    return {
        "fsync_1k_per_s": round(fsync_rate(directory)),
        "seq_write_fsync_4mib_bytes_per_s": round(sequential_write_rate(directory)),
        "loopback_framed_1k_msgs_per_s": round(asyncio.run(_loopback_rate())),
    }


def _cmd_bench_limits(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="ls-limits-", dir=".") as d:
        lim = machine_limits(Path(d))
    _print(args, "machine limits", lim)
    return 0


# --------------------------------------------------------------------------------------------------------
# Helpers


def plot_latencies(path: str, title: str, runs: list[dict[str, Any]], rate_key: str) -> None:
    """Latency CDF per run (log scale), with the run's throughput in the legend."""
    import matplotlib

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
    print(f"  latency plot written to {path}")


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


async def _bookie_run(address: str, entry_size: int, outstanding: int, duration: float) -> dict[str, Any]:
    from bookie import protocol as p
    from bookie.entryformat import DigestType, EntryCodec
    from ledger_client.bookie_conn import connect

    conn = await connect(address)
    ledger_id = int(time.time() * 1000) & 0xFFFFFFFF
    key = p.master_key(b"bench")
    codec = EntryCodec(ledger_id, DigestType.CRC32C)
    payload = os.urandom(entry_size)
    latencies: list[float] = []
    acked = 0
    errors = 0
    next_entry = 0
    done = asyncio.get_running_loop().create_future()
    t_start = time.perf_counter()
    deadline = t_start + duration
    inflight = 0
    perf = time.perf_counter

    def send_one() -> None:
        nonlocal next_entry, inflight
        eid = next_entry
        next_entry += 1
        rid = conn.next_id()
        frame, _ = codec.build_add_frame(rid, eid, eid - 1, (eid + 1) * entry_size, payload, key)
        t0 = perf()
        inflight += 1

        def on_resp(resp: Any, exc: BaseException | None) -> None:
            nonlocal acked, errors, inflight
            inflight -= 1
            now = perf()
            if exc is None and resp == p.Status.OK:
                acked += 1
                latencies.append(now - t0)
            else:
                errors += 1
            if now < deadline and exc is None:
                send_one()
            elif inflight == 0 and not done.done():
                done.set_result(None)

        conn.send_add(rid, frame, on_resp)

    for _ in range(outstanding):
        send_one()
    await done
    elapsed = perf() - t_start
    conn.close()
    return {
        "acked_adds_per_s": acked / elapsed,
        "mb_per_s": acked * entry_size / elapsed / 1e6,
        "acked": acked,
        "errors": errors,
        **percentiles(latencies),
        "_latencies": latencies,
    }


def _median_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in runs[0]:
        if k.startswith("_"):
            continue
        vals = [r[k] for r in runs]
        out[k] = statistics.median(vals) if isinstance(vals[0], int | float) else vals[0]
    return out


def _cmd_bench_bookie(args: argparse.Namespace) -> int:
    from bookie.main import install_uvloop

    install_uvloop()
    with contextlib.ExitStack() as stack:
        if args.bookie:
            address = args.bookie
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ls-bench-", dir=".")))
        else:
            _, procs, root = stack.enter_context(local_cluster(1))
            address = procs[0].id
        runs = []
        for i in range(args.runs):
            r = asyncio.run(_bookie_run(address, args.entry_size, args.outstanding, args.duration))
            print(
                f"  run {i + 1}/{args.runs}: {r['acked_adds_per_s']:,.0f} adds/s, p99 {r['p99_ms']} ms",
                flush=True,
            )
            runs.append(r)
        limits = machine_limits(root)
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
    if args.plot:
        plot_latencies(
            args.plot,
            f"bench bookie: {args.entry_size} B adds, {args.outstanding} outstanding",
            runs,
            "acked_adds_per_s",
        )
    _print(args, f"bench bookie (median of {args.runs} runs)", result)
    return 0


def _cmd_bench_ledger(args: argparse.Namespace) -> int:
    from ledger_client.bench import run_ledger_bench

    return run_ledger_bench(args, _print, _median_runs, local_cluster, machine_limits)
