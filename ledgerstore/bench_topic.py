"""``ledgerstore bench topic``: produce and end-to-end (publish → consume) throughput and latency of the topic
broker through the official ``pulsar-client``, on a partitioned topic.

Producers and the consumer are separate processes (the Python client serialises its callbacks on one
interpreter, so one process cannot drive the broker to its limit). Produce: every producer sends its share
with ``send_async`` as fast as the client's pending-message window lets it; the figure is the messages
acknowledged over the wall time of the slowest producer. End to end: producers send at a fixed total rate
(``--rate``; default half the produce figure of the same run) while a consumer on a Shared subscription
receives and acknowledges; latency of a message is its receive time minus its publish time (same machine
clock). The broker's CPU per message is reported beside the figures.
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
    tp.add_argument(
        "--rate", type=float, default=0.0, help="end-to-end phase rate, msg/s (0: half of produce)"
    )
    tp.add_argument("--skip-e2e", action="store_true")
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
        url, operation_timeout_seconds=60, io_threads=2, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
    )


def _produce(
    url: str, topic: str, n: int, size: int, batching: bool, rate: float, every: int, out: Any
) -> None:
    """Send ``n`` messages (at ``rate`` msg/s when > 0); put (acked, failed, start, end) on ``out``.

    A completion callback goes on every ``every``-th message and the last: the official Python client hands each
    callback from its I/O thread to Python under the GIL, which alone caps a process at ~25-35k msg/s here
    whatever the broker does. ``flush()`` returns once every message is acknowledged or failed; a failed sample
    counts its whole stride as failed. The broker's own count of stored messages is checked after the phase."""
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

        def send(i: int) -> None:
            if (i + 1) % every == 0 or i == n - 1:
                p.send_async(payload, done)
            else:
                p.send_async(payload, None)

        start = time.time()
        if rate > 0:
            step = 200  # messages per pacing step
            for i in range(0, n, step):
                wait = start + i / rate - time.time()
                if wait > 0:
                    time.sleep(wait)
                for j in range(i, min(i + step, n)):
                    send(j)
        else:
            for j in range(n):
                send(j)
        p.flush()
        end = time.time()
        failed = min(n, counts[1])
        out.put(("produced", n - failed, failed, start, end))
    finally:
        c.close()


def _consume(url: str, topic: str, n: int, ready: Any, out: Any) -> None:
    """Receive ``n`` messages; put (received, latencies ms sample) on ``out``."""
    c = _client(url)
    try:
        consumer = c.subscribe(topic, "bench", consumer_type=_shared(), receiver_queue_size=5000)
        ready.set()
        lat: list[float] = []
        got = 0
        while got < n:
            try:
                m = consumer.receive(30_000)
            except Exception:  # noqa: BLE001 - a timeout ends the phase with what arrived
                break
            got += 1
            if got % 10 == 0:
                lat.append(time.time() * 1000 - m.publish_timestamp())
            consumer.acknowledge(m)
        out.put(("consumed", got, lat))
    finally:
        c.close()


def _stored_messages(admin_url: str, topic: str) -> int:
    import json
    import urllib.request

    path = topic.replace("persistent://", "persistent/")
    with urllib.request.urlopen(f"{admin_url}/admin/v2/{path}/partitioned-stats", timeout=30) as r:
        return int(json.loads(r.read())["msgInCounter"])


def _shared() -> Any:
    import pulsar

    return pulsar.ConsumerType.Shared


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
    url: str, topic: str, args: argparse.Namespace, rate: float, consume: bool, broker_pid: int | None
) -> dict[str, Any]:
    from ledgerstore.bench import cpu_meter

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = []
    if consume:
        ready = ctx.Event()
        cp = ctx.Process(target=_consume, args=(url, topic, args.messages, ready, out))
        cp.start()
        procs.append(cp)
        ready.wait(60)
    share = args.messages // args.producers
    per_rate = rate / args.producers if rate > 0 else 0.0
    with cpu_meter({"broker": broker_pid} if broker_pid else {}, "msg") as cpu:
        for i in range(args.producers):
            n = share + (args.messages - share * args.producers if i == 0 else 0)
            pp = ctx.Process(
                target=_produce,
                args=(url, topic, n, args.size, not args.no_batching, per_rate, args.callback_every, out),
            )
            pp.start()
            procs.append(pp)
        results = [out.get(timeout=600) for _ in procs]
        cpu["units"] = args.messages
    for p in procs:
        p.join(60)
    produced = [r for r in results if r[0] == "produced"]
    acked = sum(r[1] for r in produced)
    failed = sum(r[2] for r in produced)
    wall = max(r[4] for r in produced) - min(r[3] for r in produced)
    row: dict[str, Any] = {"acked": acked, "failed": failed, "msg_per_s": round(acked / wall), **cpu}
    row["mb_per_s"] = round(acked * args.size / wall / 1e6, 1)
    for r in results:
        if r[0] == "consumed":
            lat = sorted(r[2])
            row["received"] = r[1]
            if lat:
                row["e2e_p50_ms"] = round(lat[len(lat) // 2], 1)
                row["e2e_p99_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1)
                row["e2e_max_ms"] = round(lat[-1], 1)
    return row


def run(args: argparse.Namespace) -> int:
    from ledgerstore.bench import _print, local_cluster
    from ledgerstore.cli import CommandError
    from ledgerstore.cluster import BrokerProcess, free_port

    if args.messages < args.producers or args.size < 1 or args.partitions < 1 or args.producers < 1:
        raise CommandError("need --messages >= --producers >= 1, --size >= 1, --partitions >= 1")
    try:
        import pulsar  # noqa: F401
    except ImportError as e:
        raise CommandError("bench topic needs pulsar-client (pip install pulsar-client)") from e
    topic = f"persistent://public/default/bench-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        broker_pid: int | None = None
        admin_url: str | None = None
        if args.service_url:
            url, zk, root = args.service_url, args.zk, args.zk_root
        else:
            print(f"  starting ZooKeeper, {args.bookies} bookies and a broker", file=sys.stderr, flush=True)
            zk, _, tmp = stack.enter_context(local_cluster(max(args.bookies, args.ensemble)))
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
            url, broker_pid = bp.service_url, bp.proc.pid if bp.proc else None
            admin_url = f"http://127.0.0.1:{bp.http_port}"
        _create_topic(zk, root, topic, args.partitions)
        _create_topic(zk, root, topic + "-e2e", args.partitions)
        load = os.getloadavg()[0]
        data: dict[str, Any] = {
            "size": args.size,
            "batching": not args.no_batching,
            "partitions": args.partitions,
            "producers": args.producers,
            "messages": args.messages,
            "E/Qw/Qa": f"{args.ensemble}/{args.write_quorum}/{args.ack_quorum}",
            "load_before": round(load, 2),
        }
        produce = _phase(url, topic, args, 0.0, False, broker_pid)
        if admin_url:  # what the broker stored, counted by the broker: the producers' figure checked
            produce["stored"] = _stored_messages(admin_url, topic)
            if produce["stored"] != produce["acked"]:
                raise CommandError(
                    f"the broker stored {produce['stored']} messages, {produce['acked']} acked"
                )
        data.update({f"produce_{k}": v for k, v in produce.items()})
        if not args.skip_e2e:
            rate = args.rate or produce["msg_per_s"] / 2
            e2e = _phase(url, topic + "-e2e", args, rate, True, broker_pid)
            data["e2e_rate_target"] = round(rate)
            data.update({f"e2e_{k}" if not k.startswith("e2e_") else k: v for k, v in e2e.items()})
    _print(args, "bench topic (pulsar-client through a broker)", data)
    return 0
