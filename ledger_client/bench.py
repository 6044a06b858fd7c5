"""``ledgerstore bench ledger``: the ledger client writing E/Qw/Qa ledgers to bookie processes.

One client process keeps ``outstanding`` appends in flight (spread over ``ledgers`` ledgers) for ``duration``
seconds and reports acked entries/s, MB/s and add latency percentiles (append call to ack, as the caller sees
it). The machine's limits are measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

from .client import BookKeeper, ClientConfig


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
) -> dict[str, Any]:
    from ledgerstore.bench import percentiles

    # The client's own back-pressure (outstanding_adds_max per handle) keeps `outstanding` appends in flight.
    cfg = ClientConfig(zk_root=zk_root, outstanding_adds_max=max(1, outstanding // ledgers))
    bk = await BookKeeper.connect(zk, config=cfg)
    handles = [
        await bk.create_ledger(ensemble, write_quorum, ack_quorum, password=b"bench") for _ in range(ledgers)
    ]
    payload = os.urandom(entry_size)
    latencies: list[float] = []
    acked = 0
    errors = 0
    perf = time.perf_counter
    t_start = perf()
    deadline = t_start + duration

    async def drive(lh: Any) -> None:
        nonlocal acked, errors
        inflight: set[asyncio.Future[int]] = set()

        def done(t0: float, fut: asyncio.Future[int]) -> None:
            nonlocal acked, errors
            inflight.discard(fut)
            if fut.exception() is None:
                acked += 1
                latencies.append(perf() - t0)
            else:
                errors += 1

        while perf() < deadline:
            t0 = perf()
            fut = await lh.append_future(payload)
            inflight.add(fut)
            fut.add_done_callback(lambda f, t0=t0: done(t0, f))
        if inflight:
            await asyncio.gather(*inflight, return_exceptions=True)

    await asyncio.gather(*(drive(h) for h in handles))
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


def run_ledger_bench(
    args: argparse.Namespace,
    emit: Callable[[argparse.Namespace, str, dict[str, Any]], None],
    median: Callable[[list[dict[str, Any]]], dict[str, Any]],
    local_cluster: Any,
    machine_limits: Callable[[Any], dict[str, float]],
) -> int:
    from bookie.main import install_uvloop

    install_uvloop()
    with contextlib.ExitStack() as stack:
        if args.use_cluster:
            import tempfile
            from pathlib import Path

            zk, root = args.zk, args.zk_root
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ls-bench-", dir=".")))
        else:
            zk, _, tmp = stack.enter_context(local_cluster(max(args.bookies, args.ensemble)))
            root = "/ledgerstore"
        runs = []
        for i in range(args.runs):
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
                )
            )
            print(
                f"  run {i + 1}/{args.runs}: {r['acked_entries_per_s']:,.0f} entries/s, p99 {r['p99_ms']} ms",
                flush=True,
            )
            runs.append(r)
        limits = machine_limits(tmp)
    if args.plot:
        from ledgerstore.bench import plot_latencies

        plot_latencies(
            args.plot,
            f"bench ledger: E/Qw/Qa {args.ensemble}/{args.write_quorum}/{args.ack_quorum}, "
            f"{args.entry_size} B, {args.outstanding} outstanding",
            runs,
            "acked_entries_per_s",
        )
    result = {
        "mode": "ledger",
        "E/Qw/Qa": f"{args.ensemble}/{args.write_quorum}/{args.ack_quorum}",
        "entry_size": args.entry_size,
        "outstanding": args.outstanding,
        "ledgers": args.ledgers,
        "duration_s": args.duration,
        "runs": args.runs,
        **median(runs),
        **limits,
    }
    emit(args, f"bench ledger (median of {args.runs} runs)", result)
    return 0
