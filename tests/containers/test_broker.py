"""The topic broker in a container, driven by the official ``pulsar-client`` from the host.

The broker advertises 127.0.0.1 and is published on its own ports (see conftest.py), so ``pulsar.Client(
cluster.broker_url)`` in this process looks the topic up and produces and consumes through the container. Faults
hit a bookie of the topic's current ledger (SIGKILL, network disconnect, pause) or the broker itself (pause); in
each case producing goes on within a bounded time and every message the broker acknowledged is consumed.

The tests share one cluster (ZooKeeper + 4 bookies + a broker, see ``broker_cluster``) and each uses its own topic;
a test heals what it harmed (restarts a killed bookie on its volume, reconnects, unpauses) before it ends.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.metrics_testing import scrape, starting

from .conftest import (
    BROKER_CONFIG,
    Cluster,
    Node,
    assert_runs_with_config,
    assert_stranger_refused,
    wait_until,
)

pulsar = pytest.importorskip("pulsar", reason="pulsar-client is not installed (pip install '.[pulsar]')")

pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(420)]

PROGRESS_TIMEOUT_S = 90
DRAIN_TIMEOUT_S = 60
# Pulsar's defaults would wait 30 s for a send; a stalled bookie or broker must be survived well within that.
SEND_TIMEOUT_MS = 60_000


def payload(i: int) -> bytes:
    return b"msg-%08d-" % i + bytes((i + k) % 251 for k in range(48))


def index_of(data: bytes) -> int:
    return int(data[4:12])


def new_topic() -> str:
    return f"persistent://public/default/containers-{uuid.uuid4().hex[:10]}"


def client(cluster: Cluster, url: str) -> Any:
    """A Pulsar client of ``url`` with the cluster's admin token (the broker requires one)."""
    return pulsar.Client(
        url,
        authentication=cluster.pulsar_auth(),
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
    )


def admin_get(cluster: Cluster, path: str) -> Any:
    with urllib.request.urlopen(cluster.broker_admin + path, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body[:1] in (b"{", b"[") else body.decode()


class TopicWriter(threading.Thread):
    """Sends payload(0), payload(1), ... one at a time (sync) until told to stop; records what the broker acked
    and what failed (a send that timed out may or may not be stored: it is neither required nor forbidden)."""

    def __init__(self, producer: Any) -> None:
        super().__init__(name="topic-writer", daemon=True)
        self.producer = producer
        self.acked: list[int] = []
        self.failed: list[tuple[int, str]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        i = 0
        while not self._halt.is_set():
            try:
                self.producer.send(payload(i))
                self.acked.append(i)
            except Exception as exc:  # a send timeout under a fault; recorded, the next send goes on
                self.failed.append((i, repr(exc)))
            i += 1

    def wait_for(self, count: int, what: str, timeout_s: float = PROGRESS_TIMEOUT_S) -> float:
        """Until ``count`` sends are acked; returns how long it took."""
        t0 = time.monotonic()
        wait_until(
            lambda: len(self.acked) >= count,
            timeout_s,
            f"{count} acked sends {what}(have {len(self.acked)}, failed {self.failed[-3:]})",
            interval_s=0.05,
        )
        return time.monotonic() - t0

    def progress(self, more: int, what: str) -> float:
        return self.wait_for(len(self.acked) + more, what)

    def finish(self, timeout_s: float = 90) -> list[int]:
        self._halt.set()
        self.join(timeout_s)
        assert not self.is_alive(), f"producer still blocked in send after {timeout_s}s"
        return self.acked


def subscribe_and_write(c: Any, topic: str) -> tuple[Any, TopicWriter]:
    """A durable subscription from the earliest message (so it sees every send), then a started writer."""
    consumer = c.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    writer = TopicWriter(
        c.create_producer(topic, batching_enabled=False, send_timeout_millis=SEND_TIMEOUT_MS)
    )
    writer.start()
    return consumer, writer


def drain(consumer: Any, acked: list[int], timeout_s: float = DRAIN_TIMEOUT_S) -> list[int]:
    """Receive (and acknowledge) until every acked index was seen or the deadline; the indexes in arrival order."""
    want = set(acked)
    got: list[int] = []
    deadline = time.monotonic() + timeout_s
    while not want <= set(got) and time.monotonic() < deadline:
        try:
            msg = consumer.receive(timeout_millis=1000)
        except pulsar.Timeout:
            continue
        assert msg.data() == payload(index_of(msg.data())), "a message came back with other bytes"
        got.append(index_of(msg.data()))
        consumer.acknowledge(msg)
    return got


def assert_every_ack_consumed(acked: list[int], got: list[int]) -> None:
    lost = sorted(set(acked) - set(got))
    assert not lost, (
        f"{len(lost)} acknowledged messages never consumed, first {lost[:10]} (acked {len(acked)})"
    )
    first_seen = list(dict.fromkeys(got))  # redeliveries dropped, arrival order kept
    assert first_seen == sorted(first_seen), "messages were consumed out of the order they were produced"


def finish_and_check(writer: TopicWriter, consumer: Any) -> None:
    """Stop producing, then consume: every send the broker acknowledged arrives, in the order it was sent."""
    acked = writer.finish()
    assert_every_ack_consumed(acked, drain(consumer, acked))


def current_ensemble(cluster: Cluster, topic: str) -> tuple[int, list[str]]:
    """The topic's current ledger (the broker's internalStats) and the bookies of its last ensemble."""
    from ledger_client.sync import BookKeeper

    stats = admin_get(cluster, "/admin/v2/" + topic.replace("://", "/") + "/internalStats")
    ledger_id = int(stats["ledgers"][-1]["ledgerId"])
    bk = BookKeeper.connect(cluster.zk_connect)
    try:
        md = bk.ledger_metadata(ledger_id)
        return ledger_id, list(md.ensembles[-1].bookies)
    finally:
        bk.close()


def test_pulsar_client_produces_and_consumes_through_the_broker_container(broker_cluster: Cluster) -> None:
    cluster = broker_cluster
    assert cluster.broker is not None
    cluster.wait_healthy(cluster.broker, 30, docker_says=True)  # the HEALTHCHECK with LEDGERSTORE_HEALTH_URL
    assert_runs_with_config(  # docker/broker.toml, as compose.yaml mounts it
        cluster.broker_admin, BROKER_CONFIG, from_flags=("port", "http_port", "advertised_address")
    )
    topic = new_topic()
    c = client(cluster, cluster.broker_url)
    try:
        consumer = c.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        batched = c.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5)
        for i in range(400):
            batched.send_async(payload(i), None)
        batched.flush()
        single = c.create_producer(topic, batching_enabled=False)
        for i in range(400, 500):
            single.send(payload(i))
        got = drain(consumer, list(range(500)))
        assert got == list(range(500))
    finally:
        c.close()

    # The HTTP lookup (http:// service URL) answers the advertised address too; a reader from the earliest id.
    c = client(cluster, cluster.broker_admin)
    try:
        reader = c.create_reader(topic, pulsar.MessageId.earliest)
        first = reader.read_next(timeout_millis=10_000)
        assert first.data() == payload(0)
    finally:
        c.close()
    metrics = scrape(cluster.broker_admin + "/metrics")
    assert starting(metrics, "pulsar_in_messages_total"), sorted(metrics)


def inject(cluster: Cluster, fault: str, node: Node) -> Callable[[], None]:
    """Apply ``fault`` to ``node``; returns how to heal it (a killed bookie starts again on its volume)."""
    if fault == "kill":
        cluster.kill(node)
        return lambda: cluster.restart_stopped(node)
    if fault == "pause":
        cluster.pause(node)
        return lambda: cluster.unpause(node)
    cluster.disconnect(node)
    return lambda: cluster.connect(node)


@pytest.mark.parametrize("fault", ["kill", "network-disconnect", "pause"])
def test_producing_through_the_broker_survives_a_bookie_fault_and_loses_no_acked_message(
    broker_cluster: Cluster, fault: str
) -> None:
    # E=3 of 4 bookies: the spare takes the faulty bookie's place (an ensemble change in the broker's ledger).
    cluster = broker_cluster
    topic = new_topic()
    c = client(cluster, cluster.broker_url)
    try:
        consumer, writer = subscribe_and_write(c, topic)
        writer.wait_for(200, "before the fault ")
        ledger_id, ensemble = current_ensemble(cluster, topic)
        victim = cluster.bookie(ensemble[0])

        heal = inject(cluster, fault, victim)
        stalled_s = writer.progress(300, f"with {victim.bookie_id} under {fault} ")
        _, after = current_ensemble(cluster, topic)
        assert victim.bookie_id not in after, f"{victim.bookie_id} still in the topic's ensemble {after}"
        heal()
        cluster.wait_healthy(victim, 60)
        cluster.wait_registered([victim.bookie_id])
        writer.progress(100, f"after {fault} of {victim.bookie_id} ended ")
        finish_and_check(writer, consumer)
        # Bounded: the fault cost at most a few seconds of producing, far below the send timeout.
        assert stalled_s < 60, f"300 sends took {stalled_s:.1f}s under {fault}"
    finally:
        c.close()


def test_producing_resumes_after_the_broker_container_is_paused(broker_cluster: Cluster) -> None:
    cluster = broker_cluster
    broker = cluster.broker
    assert broker is not None
    topic = new_topic()
    c = client(cluster, cluster.broker_url)
    try:
        consumer, writer = subscribe_and_write(c, topic)
        writer.wait_for(200, "before the pause ")

        # Every process of the broker frozen: no acks, no pings, no ZooKeeper heartbeats.
        cluster.pause(broker)
        frozen_at = len(writer.acked)
        time.sleep(4)  # below the broker's ZooKeeper session timeout (10 s): it keeps its topics
        assert len(writer.acked) <= frozen_at + 1, "a paused broker acknowledged sends"
        cluster.unpause(broker)
        resumed_s = writer.progress(200, "after the broker resumed ")
        finish_and_check(writer, consumer)
        assert resumed_s < 30, f"producing took {resumed_s:.1f}s to resume after the pause"
    finally:
        c.close()


def test_a_stranger_is_refused_by_zookeeper_every_bookie_and_the_broker(broker_cluster: Cluster) -> None:
    """Authentication as docker/compose.yaml runs it: the admin token writes (so the ledgers node exists); with no
    token and no ZooKeeper credentials nothing is read or changed anywhere."""
    cluster = broker_cluster
    c = client(cluster, cluster.broker_url)
    try:
        c.create_producer(new_topic()).send(payload(0))
    finally:
        c.close()
    assert cluster.zk is not None and cluster.broker is not None
    assert_stranger_refused(
        cluster.zk.port, [b.port for b in cluster.bookies], cluster.broker.port, cluster.broker.http_port
    )
