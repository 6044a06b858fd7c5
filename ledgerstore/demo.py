"""``ledgerstore demo``: the end-to-end story on a running cluster (what `make run` shows).

1. the bookies the cluster has; 2. a ledger written with quorum writes and read back (simpletest);
3. fencing: a second client recovers a ledger while its writer is still appending — the writer is fenced,
   and every entry it had acknowledged is in the recovered ledger; 4. topics through the broker with the official
   ``pulsar-client``: 1,000 messages produced, half consumed and acknowledged on a durable subscription, the broker
   restarted, the rest consumed from the same subscription — it resumes right after its last acknowledgement, no
   gap and no duplicate; 5. a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ledgerstore.cli import DEFAULT_STATE_DIR, DEFAULT_ZK, DEFAULT_ZK_ROOT, CommandError, progress_disabled
from ledgerstore.topic_cmd import DEFAULT_ADMIN_URL, namespace_path, rest

TOPIC_MESSAGES = 1000


def _command_name() -> str:
    """How the user can type this command: its name when on PATH, else the path it was run by (.venv/bin/…)."""
    exe = Path(sys.argv[0])
    if exe.name != "ledgerstore" or shutil.which("ledgerstore") == str(exe.resolve()):
        return "ledgerstore"
    try:
        return str(exe.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


def next_steps(
    args: argparse.Namespace, zk: str, ledger_id: int, web_url: str | None, topic: str | None
) -> list[str]:
    """The commands the demo suggests afterwards, as they can be typed here (this cluster's --zk, --url)."""
    ls = _command_name()
    at = "" if zk == DEFAULT_ZK else f" --zk {zk}"
    at += "" if args.zk_root == DEFAULT_ZK_ROOT else f" --zk-root {args.zk_root}"
    lines = [
        f"{ls} ledger list{at}",
        f"{ls} ledger metadata {ledger_id}{at}",
        f"{ls} ledger read {ledger_id} --password demo --last 9{at}",
    ]
    if web_url is not None:
        url = "" if web_url == DEFAULT_ADMIN_URL else f" --url {web_url}"
        lines += [f"{ls} topic list{url}", f"{ls} topic stats {topic or '<topic>'}{url}"]
    if Path(args.state_dir) == Path(DEFAULT_STATE_DIR):
        lines.append("make cluster-down   (stops ZooKeeper, the bookies and the brokers)")
    else:
        lines.append(
            f"{ls} cluster down --state-dir {args.state_dir}   (stops ZooKeeper, the bookies and the brokers)"
        )
    return lines


def _brokers_from_state(args: argparse.Namespace) -> list[dict[str, Any]]:
    st = Path(args.state_dir) / "cluster.json"
    if not st.exists():
        return []
    return list(json.loads(st.read_text()).get("brokers", []))


def _admin_get(web_url: str, path: str) -> Any:
    import urllib.request

    try:
        with urllib.request.urlopen(web_url + path, timeout=10) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


#: the demo's namespace: with retention, so that the analysis at the end finds the messages the demo consumed
#: (without it a consumed ledger is trimmed, as in Pulsar)
DEMO_NAMESPACE = "public/demo"
DEMO_RETENTION = {"retentionTimeInMinutes": 24 * 60, "retentionSizeInMB": 256}


def _demo_namespace(web_url: str) -> None:
    """Create ``DEMO_NAMESPACE`` if missing and give it ``DEMO_RETENTION`` (both idempotent)."""
    try:
        rest(web_url, "PUT", namespace_path(DEMO_NAMESPACE), {})
    except CommandError as e:
        if e.kind != "HTTP_409":  # 409: it exists already (an earlier demo)
            raise
    rest(web_url, "POST", namespace_path(DEMO_NAMESPACE) + "/retention", DEMO_RETENTION)


def _topic_story(args: argparse.Namespace, broker: dict[str, Any]) -> dict[str, Any]:
    """Produce, consume half with a durable subscription, restart the broker, consume the rest."""
    import pulsar

    from ledgerstore.cluster import restart_broker

    service_url, web_url = broker["service_url"], broker["web_service_url"]
    _demo_namespace(web_url)
    topic = f"persistent://{DEMO_NAMESPACE}/demo-{int(time.time())}"
    sub = "demo-subscription"
    quiet = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    n, half = TOPIC_MESSAGES, TOPIC_MESSAGES // 2

    client = pulsar.Client(service_url, operation_timeout_seconds=30, logger=quiet)
    try:
        consumer = client.subscribe(topic, sub, initial_position=pulsar.InitialPosition.Earliest)
        # One entry per message: a subscription acknowledges entries, and a batch half acknowledged would be
        # redelivered whole after the restart (Pulsar's behaviour without batch-index acknowledgement).
        producer = client.create_producer(topic, batching_enabled=False)
        t0 = time.perf_counter()
        for i in range(n):
            # a key and an event time, so that the analysis at the end has keys and lags to show
            producer.send_async(
                f"demo message {i}".encode(),
                None,
                partition_key=f"sensor-{i % 5}",
                event_timestamp=int(time.time() * 1000),
            )
        producer.flush()
        pdt = time.perf_counter() - t0
        producer.close()
        first = [consumer.receive(timeout_millis=15_000) for _ in range(half)]
        for m in first:
            consumer.acknowledge(m)
        last_acked = first[-1]
        consumer.close()  # sends the grouped acknowledgements
    finally:
        client.close()
    first_idx = [int(m.data().split()[-1]) for m in first]
    print(
        f"[4/5] topic {topic}: produced {n} messages through pulsar-client in {pdt:.2f}s "
        f"({n / pdt:,.0f}/s, pipelined) to {service_url}; subscription '{sub}' consumed and acknowledged "
        f"{len(first)} (up to '{last_acked.data().decode()}', id {last_acked.message_id()})"
    )
    before = _admin_get(web_url, _stats_path(topic))
    backlog_before = before["subscriptions"][sub]["msgBacklog"] if before else None

    t1 = time.perf_counter()
    row = restart_broker(Path(args.state_dir), 0)
    rdt = time.perf_counter() - t1
    client = pulsar.Client(row["service_url"], operation_timeout_seconds=30, logger=quiet)
    try:
        consumer = client.subscribe(topic, sub, initial_position=pulsar.InitialPosition.Earliest)
        rest: list[Any] = []
        while True:
            try:
                m = consumer.receive(timeout_millis=15_000 if len(rest) < n - half else 1_000)
            except Exception:  # pulsar.Timeout: nothing more to come
                break
            rest.append(m)
            consumer.acknowledge(m)
        consumer.close()
    finally:
        client.close()
    rest_idx = [int(m.data().split()[-1]) for m in rest]
    after = _admin_get(row["web_service_url"], _stats_path(topic))
    backlog_after = after["subscriptions"][sub]["msgBacklog"] if after else None
    resumed_at = rest_idx[0] if rest_idx else None
    print(
        f"[5/5] broker restarted (pid {row['pid']}, {rdt:.1f}s); the same subscription resumed at "
        f"'demo message {resumed_at}' and received {len(rest)} more: "
        + (
            "no gap, no duplicate"
            if first_idx + rest_idx == list(range(n))
            else f"MISMATCH (first {first_idx[:3]}…, then {rest_idx[:3]}…)"
        )
        + (f"; backlog {backlog_before} before the restart, {backlog_after} at the end" if before else "")
    )
    return {
        "topic": topic,
        "produced": n,
        "produce_rate": round(n / pdt),
        "consumed_before_restart": len(first),
        "consumed_after_restart": len(rest),
        "resumed_at": resumed_at,
        "exactly_once_in_order": first_idx + rest_idx == list(range(n)),
        "backlog_before_restart": backlog_before,
        "backlog_after": backlog_after,
    }


def _stats_path(topic: str) -> str:
    local = topic.rsplit("/", 1)[-1]
    return f"/admin/v2/persistent/{DEMO_NAMESPACE}/{local}/stats"


def _zk_from_state(args: argparse.Namespace) -> str:
    st = Path(args.state_dir) / "cluster.json"
    if st.exists():
        return str(json.loads(st.read_text())["zk"])
    return str(args.zk)


async def _story(zk: str, root: str) -> dict[str, Any]:
    from ledger_client import BookKeeper, ClientConfig, LedgerFencedError

    cfg = ClientConfig(zk_root=root)
    bk = await BookKeeper.connect(zk, config=cfg)
    summary: dict[str, Any] = {}
    try:
        bookies = await bk.writable_bookies()
        print(f"[1/5] cluster: ZooKeeper {zk}, {len(bookies)} writable bookies: {', '.join(bookies)}")
        summary["bookies"] = len(bookies)

        n = 2000
        lh = await bk.create_ledger(3, 2, 2, password=b"demo")
        t0 = time.perf_counter()
        futs = []
        with tqdm(
            total=n,
            desc=f"[2/5] writing ledger {lh.ledger_id} (E=3 Qw=2 Qa=2)",
            unit="entry",
            file=sys.stderr,
            leave=False,
            disable=progress_disabled(),
        ) as bar:
            for i in range(n):
                f = await lh.append_future(f"demo entry {i}".encode())
                f.add_done_callback(lambda _f: bar.update(1))
                futs.append(f)
            await asyncio.gather(*futs)
        wdt = time.perf_counter() - t0
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id, password=b"demo")
        ok = 0
        async for e in rh.read(0, rh.last_add_confirmed):
            ok += e.data == f"demo entry {e.entry_id}".encode()
        print(
            f"[2/5] ledger {lh.ledger_id}: wrote {n} entries in {wdt:.2f}s ({n / wdt:,.0f}/s), "
            f"read back {ok}/{n} identical; ensemble {', '.join(rh.metadata.ensembles[0].bookies)}"
        )
        summary.update(ledger=lh.ledger_id, written=n, verified=ok, write_rate=round(n / wdt))

        w = await bk.create_ledger(3, 3, 2, password=b"demo")
        acked: dict[int, bytes] = {}
        fenced_after: list[int] = []

        async def writer() -> None:
            i = 0
            try:
                while True:
                    eid = await w.append(f"fenced-writer {i}".encode())
                    acked[eid] = f"fenced-writer {i}".encode()
                    i += 1
            except LedgerFencedError:
                fenced_after.append(i)

        task = asyncio.create_task(writer())
        while len(acked) < 300:
            await asyncio.sleep(0.01)
        other = await BookKeeper.connect(zk, config=cfg)
        rec = await other.open_ledger(w.ledger_id, password=b"demo", recovery=True)
        await asyncio.wait_for(task, 30)
        md = rec.metadata
        survived = 0
        async for e in rec.read(0, md.last_entry_id):
            survived += acked.get(e.entry_id) == e.data
        await other.close()
        print(
            f"[3/5] ledger {w.ledger_id}: a second client recovered it while the writer appended; the writer "
            f"got LedgerFencedError after {len(acked)} acknowledged entries; the recovered ledger is "
            f"{md.state.value} at last_entry_id={md.last_entry_id} and holds {survived}/{len(acked)} of them"
        )
        summary.update(
            fenced_ledger=w.ledger_id,
            writer_acked=len(acked),
            recovered_last_entry_id=md.last_entry_id,
            acked_entries_survived=survived,
            writer_fenced=bool(fenced_after),
        )
    finally:
        await bk.close()
    return summary


def run(args: argparse.Namespace) -> int:
    """The story on stdout; with --json the story goes to stderr and stdout gets its figures as one document."""
    if not getattr(args, "json", False):
        return _run(args)
    figures: dict[str, Any] = {}
    with contextlib.redirect_stdout(sys.stderr):
        status = _run(args, figures)
    print(json.dumps({**figures, "ok": status == 0}, indent=2, sort_keys=True, default=str))
    return status


def _run(args: argparse.Namespace, figures: dict[str, Any] | None = None) -> int:
    from bookie.main import install_uvloop

    install_uvloop()
    zk = _zk_from_state(args)
    s = asyncio.run(_story(zk, args.zk_root))
    brokers = _brokers_from_state(args)
    t: dict[str, Any] | None = None
    if brokers:
        t = _topic_story(args, brokers[0])
    else:
        print("[4/5] no broker in this cluster (`ledgerstore cluster up --brokers 1`): topics skipped")
    ok = (
        s["verified"] == s["written"]
        and s["writer_fenced"]
        and s["acked_entries_survived"] == s["writer_acked"]
        and (t is None or t["exactly_once_in_order"])
    )
    if figures is not None:
        figures.update(ledgers=s, topics=t)
    line = "=" * 72
    print(line)
    print(f"  bookies                      {s['bookies']}")
    print(
        f"  quorum writes                {s['written']} entries, {s['write_rate']:,}/s, {s['verified']} verified"
    )
    print(
        f"  fencing + recovery           writer fenced: {s['writer_fenced']}, acknowledged entries kept: "
        f"{s['acked_entries_survived']}/{s['writer_acked']}"
    )
    if t is not None:
        print(f"  topic (pulsar-client)        {t['produced']:,} produced, {t['produce_rate']:,}/s")
        print(
            f"  subscription across restart  {t['consumed_before_restart']} acked before, "
            f"{t['consumed_after_restart']} after, resumed at #{t['resumed_at']}: "
            + ("no gap, no duplicate" if t["exactly_once_in_order"] else "GAP OR DUPLICATE")
        )
    print(f"  result                       {'OK' if ok else 'FAILED'}")
    print(line)
    web_url = brokers[0]["web_service_url"] if brokers else None
    for i, line in enumerate(next_steps(args, zk, s["ledger"], web_url, t["topic"] if t else None)):
        print(("  next: " if i == 0 else " " * 8) + line)
    try:  # the analysis of what the demo wrote; the demo's result stands without it
        from spark.jobs import demo_summary

        out = args.state_dir / "spark-out"
        print(f"[analysis] Spark (local[2]) over what the demo wrote (report and chart in {out}):")
        print(
            demo_summary(
                zk,
                args.zk_root,
                out,
                topics=[t["topic"]] if t else [],
                ledgers=[s["ledger"], s["fenced_ledger"]],
                ledger_password="demo",
            )
        )
    except Exception as e:
        from ledgerstore.spark_cmd import _one_line

        print(f"[analysis] Spark analysis skipped: {_one_line(e)}")
    return 0 if ok else 1
