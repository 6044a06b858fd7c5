"""``ledgerstore bench rereplication``: how fast AutoRecovery brings a killed bookie's data back to its write
quorum, and what that does to a concurrent writer's latency.

Each phase starts its own cluster: ZooKeeper (a private one on a free port, or the one ``--zk`` names, then under a
fresh ``--zk-root`` of its own), ``--bookies`` bookie processes and one ``ledgerstore autorecovery serve`` process
(``--throttle-mb``: MiB/s per worker, 0 for no limit). It then

1. fills ``--ledgers`` closed ledgers (E/Qw/Qa, default 3/2/2) so that the victim bookie holds ``--size-mb`` MiB of
   entries: the victim is in every ledger's ensemble (at a rotating slot, the other slots rotating over the other
   bookies), so with E3/Qw2 it stores 2/3 of the entries and the bench writes 1.5 × ``--size-mb``;
2. starts a writer appending ``--write-rate`` entries/s to its own ledger on bookies other than the victim
   (latency of an entry: from the moment it was due to its ack, so a stalled writer counts its backlog) and lets it
   run ``--baseline-s`` seconds;
3. kills the victim with SIGKILL and waits until the under-replicated list is empty and no ledger's metadata
   names the victim (every ledger back at its write quorum on live bookies).

Figures: seconds from the kill until the first mark (the victim's ZooKeeper session expiring), until all is
repaired, and from the first mark until then (the copy); the victim's entries and bytes over those; what
AutoRecovery's ``/metrics`` counted as copied; the writer's p50/p99/p999 before the kill and during recovery.
``--compare-throttle`` runs two phases, each on a fresh cluster: unthrottled, then ``--throttle-mb``.
Progress goes to stderr (bars only on a terminal); ``--json`` prints the figures as one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["add_bench_rereplication_command", "run"]

PASSWORD = b"bench-rereplication"


def add_bench_rereplication_command(
    bench: argparse.ArgumentParser, common: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add ``rereplication`` to ``ledgerstore bench``'s modes (the sub-parsers ``bench`` already has)."""
    modes = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction))
    rp = modes.add_parser(
        "rereplication",
        help="kill -9 a bookie holding N MiB: AutoRecovery's re-replication rate and a writer's p99 meanwhile",
    )
    common(rp)
    rp.add_argument(
        "--size-mb", type=float, default=256.0, help="MiB of entries the killed bookie holds (default 256)"
    )
    rp.add_argument("--entry-size", type=int, default=1024, help="bytes per entry (default 1024)")
    rp.add_argument("--ledgers", type=int, default=8, help="ledgers the data is spread over (default 8)")
    rp.add_argument("--bookies", type=int, default=5, help="bookie processes per phase (default 5)")
    rp.add_argument("-E", "--ensemble", type=int, default=3)
    rp.add_argument("-W", "--write-quorum", type=int, default=2)
    rp.add_argument("-A", "--ack-quorum", type=int, default=2)
    rp.add_argument("--outstanding", type=int, default=2000, help="appends in flight while filling")
    rp.add_argument(
        "--throttle-mb",
        type=float,
        default=0.0,
        help="MiB/s each AutoRecovery worker copies at most (0: no limit; the default)",
    )
    rp.add_argument(
        "--compare-throttle",
        action="store_true",
        help="two phases on fresh clusters: without a throttle, then with --throttle-mb",
    )
    rp.add_argument("--workers", type=int, default=1, help="AutoRecovery's workers (ledgers copied at once)")
    rp.add_argument(
        "--write-rate", type=float, default=500.0, help="the concurrent writer's entries/s (0: no writer)"
    )
    rp.add_argument("--write-entry-size", type=int, default=1024, help="the writer's entry bytes")
    rp.add_argument("--baseline-s", type=float, default=5.0, help="seconds the writer runs before the kill")
    rp.add_argument(
        "--timeout-s", type=float, default=1800.0, help="give up waiting for recovery after this long"
    )
    rp.add_argument(
        "--bookie-arg", action="append", default=[], help="extra argument for the bookie processes"
    )
    rp.set_defaults(func=run)


# --------------------------------------------------------------------------------------------------------
# Progress on stderr: a bar on a terminal, a line now and then otherwise


class _Progress:
    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self._last_line = 0.0
        self._bar_open = False

    def say(self, msg: str) -> None:
        self._end_bar()
        print(f"  {msg}", file=sys.stderr, flush=True)

    def bar(self, what: str, done: float, total: float, extra: str = "") -> None:
        frac = min(1.0, done / total) if total > 0 else 0.0
        if self.tty:
            width = 30
            fill = int(frac * width)
            sys.stderr.write(
                f"\r  {what} [{'#' * fill}{'.' * (width - fill)}] {100 * frac:5.1f} % {extra}\033[K"
            )
            sys.stderr.flush()
            self._bar_open = True
        elif time.monotonic() - self._last_line >= 5.0:
            self._last_line = time.monotonic()
            print(f"  {what}: {100 * frac:.1f} % {extra}", file=sys.stderr, flush=True)

    def _end_bar(self) -> None:
        if self._bar_open:
            sys.stderr.write("\n")
            self._bar_open = False


# --------------------------------------------------------------------------------------------------------
# The cluster of one phase


@dataclass
class _Cluster:
    zk: str
    root: str
    bookies: list[Any]
    recovery: Any
    dir: Path


@contextlib.contextmanager
def _cluster(args: argparse.Namespace, throttle_mb: float, progress: _Progress) -> Iterator[_Cluster]:
    from ledgerstore.cluster import AutoRecoveryProcess, BookieProcess, free_port
    from zk.launcher import ZooKeeperServer

    with tempfile.TemporaryDirectory(prefix="ls-bench-rerep-", dir=".") as d, contextlib.ExitStack() as stack:
        tmp = Path(d)
        if getattr(args, "zk_given", False):
            zk, root = args.zk, f"/ledgerstore-bench-rereplication-{uuid.uuid4().hex[:8]}"
        else:
            server = ZooKeeperServer(data_dir=tmp / "zk")
            server.start()
            stack.callback(server.stop)
            zk, root = server.connect_string, "/ledgerstore"
        progress.say(
            f"starting {args.bookies} bookies and AutoRecovery (throttle {_throttle(throttle_mb)}), ZooKeeper {zk}{root}"
        )
        bookies: list[BookieProcess] = []
        for i in range(args.bookies):
            bp = BookieProcess(
                zk=zk,
                zk_root=root,
                data_dir=tmp / f"bookie-{i}",
                port=free_port(),
                http_port=free_port(),
                extra_args=list(args.bookie_arg),
            )
            stack.callback(bp.stop)
            bookies.append(bp.start(wait=False))
        for bp in bookies:
            bp.wait_healthy(60)
        recovery = AutoRecoveryProcess(
            zk=zk,
            zk_root=root,
            metrics_port=free_port(),
            passwords=[PASSWORD.decode()],
            extra_args=[
                "--throttle-mb",
                str(throttle_mb),
                "--workers",
                str(args.workers),
                "--poll-interval-s",
                "0.2",
            ],
            log_path=tmp / "autorecovery.log",
        )
        stack.callback(recovery.stop)
        recovery.start(wait=True)
        yield _Cluster(zk, root, bookies, recovery, tmp)


def _throttle(mb: float) -> str:
    return f"{mb:g} MiB/s per worker" if mb > 0 else "none"


def _recovery_metrics(recovery: Any) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{recovery.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


# --------------------------------------------------------------------------------------------------------
# Filling and the writer


async def _fill(
    c: _Cluster, args: argparse.Namespace, victim: str, others: list[str], progress: _Progress
) -> dict[str, Any]:
    """Closed ledgers whose ensembles all hold ``victim``; returns their ids and the victim's share."""
    from ledger_client import BookKeeper, ClientConfig
    from ledger_client.quorum import write_set
    from ledgerstore.bench_ledger import _drive

    e, w = args.ensemble, args.write_quorum
    victim_target = int(args.size_mb * 2**20) // args.entry_size
    total = -(-victim_target * e // w)  # the victim stores w of every e entries
    per_ledger = [total // args.ledgers + (1 if k < total % args.ledgers else 0) for k in range(args.ledgers)]
    cfg = ClientConfig(zk_root=c.root, outstanding_adds_max=max(1, args.outstanding // args.ledgers))
    bk = await BookKeeper.connect(c.zk, config=cfg)
    try:
        handles = []
        victim_entries = 0
        for k in range(args.ledgers):
            ens = [others[(k + j) % len(others)] for j in range(e - 1)]
            slot = k % e
            ens.insert(slot, victim)
            handles.append(await bk.create_ledger(e, w, args.ack_quorum, password=PASSWORD, bookies=ens))
            victim_entries += sum(1 for i in range(per_ledger[k]) if slot in write_set(i, e, w))
        payload = os.urandom(args.entry_size)
        stats = {"acked": 0, "errors": 0}
        latencies: list[float] = []
        t0 = time.perf_counter()

        async def show() -> None:
            while True:
                el = time.perf_counter() - t0
                progress.bar(
                    "filling", stats["acked"], total, f"{stats['acked'] / max(el, 1e-9):,.0f} entries/s"
                )
                await asyncio.sleep(0.5)

        shower = asyncio.create_task(show())
        try:
            await asyncio.gather(
                *(
                    _drive(h, payload, None, latencies, stats, count=n)
                    for h, n in zip(handles, per_ledger, strict=True)
                )
            )
        finally:
            shower.cancel()
        elapsed = time.perf_counter() - t0
        for h in handles:
            await h.close()
        if stats["errors"]:
            from ledgerstore.cli import CommandError

            raise CommandError(f"{stats['errors']} appends failed while filling")
        progress.say(
            f"filled: {total:,} entries in {elapsed:.1f} s ({total / elapsed:,.0f} entries/s, "
            f"{total * args.entry_size / elapsed / 1e6:,.1f} MB/s); the victim {victim} holds "
            f"{victim_entries:,} entries ({victim_entries * args.entry_size / 2**20:,.1f} MiB)"
        )
        return {
            "ledger_ids": [h.ledger_id for h in handles],
            "entries": total,
            "fill_entries_per_s": round(total / elapsed),
            "fill_mb_per_s": round(total * args.entry_size / elapsed / 1e6, 1),
            "victim_entries": victim_entries,
            "victim_bytes": victim_entries * args.entry_size,
        }
    finally:
        await bk.close()


@dataclass
class _Writer:
    """Appends at a fixed rate on its own thread and event loop; (due time, latency) of every acked entry."""

    zk: str
    root: str
    ensemble: list[str]
    rate: float
    entry_size: int
    write_quorum: int
    ack_quorum: int
    samples: list[tuple[float, float]] = field(default_factory=list)
    errors: int = 0
    started: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._main, name="bench-writer", daemon=True)
        self.thread.start()
        if not self.started.wait(60) or self.failure is not None:
            raise RuntimeError(f"the writer did not start: {self.failure!r}")

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(120)

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as e:  # noqa: BLE001 - reported by start() or in the figures
            self.failure = e
            self.started.set()

    async def _run(self) -> None:
        from ledger_client import BookKeeper, ClientConfig
        from ledger_client.errors import LedgerError

        bk = await BookKeeper.connect(self.zk, config=ClientConfig(zk_root=self.root))
        try:
            lh = await bk.create_ledger(
                len(self.ensemble),
                self.write_quorum,
                self.ack_quorum,
                password=PASSWORD,
                bookies=self.ensemble,
            )
            payload = os.urandom(self.entry_size)
            perf = time.perf_counter
            interval = 1.0 / self.rate
            pending: set[asyncio.Task[None]] = set()

            async def one(due: float) -> None:
                try:
                    await lh.append(payload)
                    self.samples.append((due, perf() - due))
                except LedgerError:
                    self.errors += 1

            self.started.set()
            t0 = perf()
            i = 0
            while not self.stop.is_set():
                due = t0 + i * interval
                now = perf()
                if due > now:
                    await asyncio.sleep(due - now)
                t = asyncio.create_task(one(due))
                pending.add(t)
                t.add_done_callback(pending.discard)
                i += 1
            if pending:
                await asyncio.gather(*pending)
            with contextlib.suppress(Exception):
                await lh.close()
        finally:
            await bk.close()


def _pcts(samples: list[float]) -> dict[str, float]:
    from ledgerstore.bench import percentiles

    return percentiles(samples)


# --------------------------------------------------------------------------------------------------------
# One phase


async def _wait_repaired(
    c: _Cluster,
    ledger_ids: list[int],
    victim: str,
    t_kill: float,
    timeout_s: float,
    copied_before: float,
    victim_entries: int,
    progress: _Progress,
) -> tuple[float | None, float | None]:
    """Poll until the under-replicated list is empty and no ledger's metadata names ``victim`` (one client and
    one ZooKeeper session throughout). Returns (first mark seen, all repaired), perf_counter times."""
    from ledger_client import BookKeeper, ClientConfig
    from zk import MetadataStore
    from zk.underreplication import UnderReplicationManager

    store = await asyncio.to_thread(MetadataStore.connect, c.zk, root=c.root)
    marks = UnderReplicationManager(store)
    bk = await BookKeeper.connect(c.zk, config=ClientConfig(zk_root=c.root))
    t_mark: float | None = None
    t_poll = t_kill  # when the last poll began: a mark found by this poll was made after it
    try:
        while time.perf_counter() - t_kill < timeout_s:
            started = time.perf_counter()
            n_marks = len(await asyncio.to_thread(marks.list))
            naming = 0
            for lid in ledger_ids:
                md = await bk.ledger_metadata(lid)
                naming += any(victim in ens.bookies for ens in md.ensembles)
            now = time.perf_counter()
            if t_mark is None and (n_marks or naming < len(ledger_ids)):
                # A small copy can begin and end between two polls: then this poll sees it done already, and
                # the mark came after the previous poll began (its time, not this one's, bounds the copy).
                t_mark = now if n_marks or naming else t_poll
                progress.say(f"first mark after {t_mark - t_kill:.1f} s")
            t_poll = started
            if t_mark is not None:
                if n_marks == 0 and naming == 0:
                    return t_mark, now
                m = await asyncio.to_thread(_recovery_metrics, c.recovery)
                copied = m.get("rereplicated_entries_total", 0) - copied_before
                done = len(ledger_ids) - naming
                progress.bar(
                    "re-replicating",
                    copied,
                    victim_entries,
                    f"{done}/{len(ledger_ids)} ledgers, {copied:,.0f} entries copied, {n_marks} marked",
                )
            await asyncio.sleep(0.2)
        return t_mark, None
    finally:
        await bk.close()
        await asyncio.to_thread(store.close)


def _phase(args: argparse.Namespace, throttle_mb: float, progress: _Progress) -> dict[str, Any]:
    with _cluster(args, throttle_mb, progress) as c:
        victim_proc = c.bookies[0]
        victim = victim_proc.id
        others = [b.id for b in c.bookies[1:]]
        filled = asyncio.run(_fill(c, args, victim, others, progress))
        ids = filled["ledger_ids"]
        writer: _Writer | None = None
        if args.write_rate > 0:
            writer = _Writer(
                c.zk,
                c.root,
                others[: args.ensemble],
                args.write_rate,
                args.write_entry_size,
                args.write_quorum,
                args.ack_quorum,
            )
            writer.start()
            progress.say(
                f"writer: {args.write_rate:g} entries/s on {', '.join(writer.ensemble)}; baseline {args.baseline_s:g} s"
            )
            time.sleep(args.baseline_s)
        before = _recovery_metrics(c.recovery)
        progress.say(f"kill -9 {victim}")
        t_kill = time.perf_counter()
        victim_proc.kill9()
        try:
            t_mark, t_done = asyncio.run(
                _wait_repaired(
                    c,
                    ids,
                    victim,
                    t_kill,
                    args.timeout_s,
                    before.get("rereplicated_entries_total", 0),
                    filled["victim_entries"],
                    progress,
                )
            )
        finally:
            if writer is not None:
                writer.finish()
        if t_done is None or t_mark is None:
            from ledgerstore.cli import CommandError

            raise CommandError(f"not re-replicated within {args.timeout_s:g} s (logs: {c.dir})")
        after = _recovery_metrics(c.recovery)
    total_s = t_done - t_kill
    copy_s = t_done - t_mark
    ve, vb = filled["victim_entries"], filled["victim_bytes"]
    copied_entries = int(
        after.get("rereplicated_entries_total", 0) - before.get("rereplicated_entries_total", 0)
    )
    copied_bytes = int(after.get("rereplicated_bytes_total", 0) - before.get("rereplicated_bytes_total", 0))
    out: dict[str, Any] = {
        "throttle_mb_per_s_per_worker": throttle_mb,
        "victim_entries": ve,
        "victim_mb": round(vb / 2**20, 1),
        "fill_entries_per_s": filled["fill_entries_per_s"],
        "fill_mb_per_s": filled["fill_mb_per_s"],
        "detect_s": round(t_mark - t_kill, 2),
        "copy_s": round(copy_s, 2),
        "recovery_s": round(total_s, 2),
        "rereplication_entries_per_s": round(ve / copy_s),
        "rereplication_mb_per_s": round(vb / copy_s / 1e6, 2),
        "kill_to_repaired_entries_per_s": round(ve / total_s),
        "kill_to_repaired_mb_per_s": round(vb / total_s / 1e6, 2),
        "copied_entries": copied_entries,
        "copied_bytes": copied_bytes,
        "ledgers": len(ids),
    }
    if writer is not None:
        base = [lat for due, lat in writer.samples if due < t_kill]
        during = [lat for due, lat in writer.samples if t_kill <= due <= t_done]
        out["writer_rate"] = args.write_rate
        out["writer_errors"] = writer.errors
        out["writer_before"] = {"acked": len(base), **_pcts(base)}
        out["writer_during"] = {"acked": len(during), **_pcts(during)}
        # the copy alone, without the victim's session expiry (the writer's ledger never held the victim)
        copying = [lat for due, lat in writer.samples if t_mark <= due <= t_done]
        out["writer_during_copy"] = {"acked": len(copying), **_pcts(copying)}
    progress.say(
        f"repaired {out['victim_mb']} MiB ({ve:,} entries) in {copy_s:.1f} s after the first mark "
        f"({out['rereplication_entries_per_s']:,} entries/s, {out['rereplication_mb_per_s']} MB/s); "
        f"{total_s:.1f} s after the kill"
        + (
            f"; writer p99 {out['writer_before']['p99_ms']} ms before, {out['writer_during_copy']['p99_ms']} ms while copying"
            if writer is not None
            else ""
        )
    )
    return out


def run(args: argparse.Namespace) -> int:
    from bookie.main import install_uvloop
    from ledgerstore.bench import _print
    from ledgerstore.cli import CommandError

    if args.size_mb <= 0 or args.entry_size < 16 or args.ledgers < 1:
        raise CommandError("--size-mb must be > 0, --entry-size >= 16, --ledgers >= 1")
    if args.bookies < args.ensemble + 1:
        raise CommandError(f"--bookies must be at least E + 1 = {args.ensemble + 1} (a bookie to copy to)")
    if args.write_rate > 0 and args.bookies - 1 < args.ensemble:
        raise CommandError("the writer needs E bookies besides the victim")
    if args.compare_throttle and args.throttle_mb <= 0:
        raise CommandError("--compare-throttle needs --throttle-mb X (X > 0) for its throttled phase")
    install_uvloop()
    progress = _Progress()
    load_before = os.getloadavg()
    throttles = [0.0, args.throttle_mb] if args.compare_throttle else [args.throttle_mb]
    phases = []
    for i, t in enumerate(throttles):
        progress.say(f"phase {i + 1}/{len(throttles)}: throttle {_throttle(t)}")
        phases.append(_phase(args, t, progress))
    result: dict[str, Any] = {
        "mode": "rereplication",
        "E/Qw/Qa": f"{args.ensemble}/{args.write_quorum}/{args.ack_quorum}",
        "bookies": args.bookies,
        "entry_size": args.entry_size,
        "size_mb": args.size_mb,
        "workers": args.workers,
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    if args.compare_throttle:
        result["unthrottled"], result["throttled"] = phases
    else:
        result.update(phases[0])
    if args.json:
        _print(args, "bench rereplication", result)
    else:
        _print(args, "bench rereplication", _flat(result))
    return 0


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, list):
            out[f"{prefix}{k}"] = ", ".join(str(x) for x in v)
        else:
            out[f"{prefix}{k}"] = v
    return out
