"""An operator's bad days against real processes: ZooKeeper gone for longer than the session timeout under a
bookie (its admin HTTP answers 503 with the reason meanwhile), and back."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledger_client.errors import NotEnoughBookiesError
from ledger_client.sync import BookKeeper
from tests.abuse.helpers import http
from tests.broker_testing import Brokers
from tests.zk_testing import wait_for

SESSION_TIMEOUT_S = 10.0  # the bookie's ZooKeeper session timeout (zk.client's default)


def test_zookeeper_paused_past_the_session_timeout_is_a_one_line_warning_and_the_bookie_serves_after(
    bookies, zk_server
) -> None:
    bp = bookies.start("--gc-interval-s", "1")
    with BookKeeper.connect(bookies.zk, zk_root=bookies.root) as bk:  # a ledger, so that GC lists ledgers
        lh = bk.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1, password=b"p")
        lh.append(b"before")
        lh.close()
    zk_server.pause()
    try:
        paused_at = time.monotonic()
        # an admin request that needs ZooKeeper meanwhile: 503 with the reason, not a 500 page and a traceback
        status, body = http(bp, "GET", "/api/v1/bookie/list_bookies", timeout_s=30)
        assert status == 503 and "ZooKeeper" in body["error"], (status, body)
        time.sleep(max(0.0, paused_at + SESSION_TIMEOUT_S + 4 - time.monotonic()))
    finally:
        zk_server.resume()
    assert bp.log_path is not None
    assert wait_for(lambda: "periodic task gc skipped" in bp.log_path.read_text(), timeout_s=20)
    status, body = http(bp, "GET", "/health")
    assert status == 200 and body["status"] == "ok"
    with BookKeeper.connect(
        bookies.zk, zk_root=bookies.root
    ) as bk:  # and it serves again, once re-registered
        deadline = time.monotonic() + 30
        while True:
            try:
                lh = bk.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1, password=b"p")
                break
            except NotEnoughBookiesError:
                assert time.monotonic() < deadline, "the bookie did not register again"
                time.sleep(0.5)
        assert lh.append(b"after ZooKeeper came back") == 0
        lh.close()
    log = bp.log_path.read_text()
    assert "periodic task gc failed" not in log and "Traceback" not in log, log[-3000:]
    assert "admin GET /api/v1/bookie/list_bookies: 503: ZooKeeper" in log


def test_acknowledged_messages_survive_failed_appends_and_their_resends_with_dedup(bookies, tmp_path) -> None:
    """Two of three bookies killed under a producer: the broker's appends fail, the client sends again what
    failed, and once the bookies are back every message the producer saw acknowledged is in the topic (dedup
    must not take a resend of a message that was never stored for a duplicate)."""
    pulsar = pytest.importorskip("pulsar")
    brokers = Brokers(bookies, tmp_path)
    try:
        bookies.start_many(3)
        broker = brokers.start()
        topic = "persistent://public/default/failed-appends"
        client = pulsar.Client(
            broker.service_url,
            operation_timeout_seconds=30,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
        try:
            consumer = client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
            producer = client.create_producer(topic, send_timeout_millis=0, batching_enabled=False)
            acked: set[bytes] = set()

            def sent(res: object, _mid: object, m: bytes) -> None:
                if res == pulsar.Result.Ok:
                    acked.add(m)

            start = time.monotonic()
            i = 0
            killed: list = []
            restarted = False
            while time.monotonic() - start < 25:
                elapsed = time.monotonic() - start
                if elapsed > 3 and not killed:
                    killed = bookies.procs[:2]
                    for bp in killed:
                        bp.kill9()
                if elapsed > 12 and killed and not restarted:
                    restarted = True
                    for bp in killed:
                        bp.start(wait=False)
                m = b"m%06d" % i
                i += 1
                producer.send_async(m, lambda r, mid, m=m: sent(r, mid, m))
                time.sleep(0.01)
            producer.flush()
            got: set[bytes] = set()
            while True:
                try:
                    msg = consumer.receive(timeout_millis=10_000)
                except Exception:
                    break
                got.add(msg.data())
                consumer.acknowledge(msg)
        finally:
            client.close()
        assert acked, "nothing was acknowledged"
        lost = sorted(acked - got)
        assert not lost, f"{len(lost)} acknowledged messages not in the topic, first {lost[:5]}"
    finally:
        brokers.stop_all()


_STUCK_WATCH = """
import sys, threading, time
from zk import MetadataStore
store = MetadataStore.connect(sys.argv[1], sys.argv[2])
kazoo = store._client
path = sys.argv[2] + "/stuck-watch"
kazoo.ensure_path(path)
entered = threading.Event()

def watch(data, _stat):
    if data == b"block":  # as a watch whose read retries while ZooKeeper is away
        entered.set()
        time.sleep(3600)

kazoo.DataWatch(path, watch)
kazoo.set(path, b"block")
assert entered.wait(10), "the watch did not run"
print("exiting", flush=True)
"""


def test_a_process_exits_although_a_zookeeper_watch_callback_is_stuck(zk_server, zk_root: str) -> None:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _STUCK_WATCH, zk_server.connect_string, zk_root],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    assert proc.returncode == 0 and "exiting" in proc.stdout, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 30
