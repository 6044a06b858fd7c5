"""Tests for the bugs planted in the audit of 2026-11-29 against bd93ea4 that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of persisted skipped ids, Key_Shared's hash and replay index,
TLS and the Spark checks"): each fails with its bug planted and passes without it. Real ZooKeeper, bookie and
broker processes, the official ``pulsar-client``."""

from __future__ import annotations

import contextlib
import json
import urllib.request
import uuid
from pathlib import Path

import pytest

from ledgerstore.cluster import free_port
from tests.broker_testing import Brokers
from tests.tls_testing import needs_openssl, self_signed
from topic_broker.admin import CLUSTER_NAME

pulsar = pytest.importorskip("pulsar")


@pytest.mark.timeout(180)
def test_skipped_ids_a_new_owner_took_out_at_load_are_recorded_before_it_crashes_too(
    cluster: Brokers,
) -> None:
    """Owner A stores 0, 2, 4 (1 and 3 skipped) and records them at its clean close; owner B stores the fill 1
    and is killed -9; owner C, whose load takes 1 out of the recorded ids (B's ledger holds it), stores 5 and is
    killed -9 too. Owner D scans only C's ledger: what C learnt at load must be in the properties already, or D
    takes 1 for skipped still and stores a resend of it a second time."""
    bp = cluster.start()  # (stopped at the end)
    name = f"planted7-skipped-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/default/{name}"
    client = pulsar.Client(bp.service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, producer_name="p", batching_enabled=False)
        for seq in (0, 2, 4):  # delayed messages ahead of their batch: 1 and 3 skipped
            producer.send(b"m%d" % seq, sequence_id=seq)
        url = f"http://127.0.0.1:{bp.http_port}/admin/v2/persistent/public/default/{name}/unload"
        urllib.request.urlopen(urllib.request.Request(url, method="PUT"), timeout=30).read()  # A closes
        producer.send(b"m1", sequence_id=1)  # B stores the fill
        bp.kill9()
        bp.start(wait=True, timeout_s=60)
        producer.send(b"m5", sequence_id=5)  # C: its load took 1 out of the recorded ids
        bp.kill9()
        bp.start(wait=True, timeout_s=60)
        producer.send(b"m1 again", sequence_id=1)  # D: a resend of 1, a duplicate
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(timeout_millis=10_000).data())
        assert got == [b"m0", b"m2", b"m4", b"m1", b"m5"]
    finally:
        client.close()


@needs_openssl
def test_the_cluster_a_tls_broker_describes_names_its_tls_url(cluster: Brokers, tmp_path: Path) -> None:
    """``pulsar-admin clusters get``: a broker with a TLS port gives its pulsar+ssl:// URL as the cluster's
    brokerServiceUrlTls, beside the plaintext one."""
    cert, key = self_signed(tmp_path, "broker")
    port = free_port()
    bp = cluster.start("--tls-port", str(port), "--tls-cert", str(cert), "--tls-key", str(key))
    url = f"http://127.0.0.1:{bp.http_port}/admin/v2/clusters/{CLUSTER_NAME}"
    with urllib.request.urlopen(url, timeout=30) as r:
        described = json.loads(r.read())
    assert described["brokerServiceUrl"] == bp.service_url
    assert described["brokerServiceUrlTls"] == f"pulsar+ssl://127.0.0.1:{port}"


@needs_openssl
def test_a_tls_connection_that_completed_its_handshake_is_no_failed_handshake_when_it_closes(
    cluster: Brokers, tmp_path: Path
) -> None:
    """An in-process broker's TLS port: a client's round trip and close count as no failed handshake (each
    was counted, and warned of, when its connection was dropped); a plaintext peer's CONNECT there counts one."""
    import gc
    import socket

    from tests.broker_testing import in_process_broker, produce_consume
    from tests.zk_testing import wait_for
    from topic_broker.server import BrokerServer

    cert, key = self_signed(tmp_path, "broker")
    tls_port = free_port()
    with in_process_broker(
        cluster, tick_interval_s=3600.0, tls_port=tls_port, tls_cert_file=str(cert), tls_key_file=str(key)
    ) as (service, run):
        server = BrokerServer(service)
        run(server.start())
        try:
            c = pulsar.Client(f"pulsar+ssl://127.0.0.1:{tls_port}", tls_trust_certs_file_path=str(cert))
            try:
                assert (
                    len(
                        produce_consume(c, f"persistent://public/default/planted7-tls-{uuid.uuid4().hex[:8]}")
                    )
                    == 5
                )
            finally:
                c.close()
            assert wait_for(lambda: server.gate.open == 0, 30)
            with socket.create_connection(("127.0.0.1", tls_port), timeout=30) as s:
                s.sendall(b"\x00\x00\x00\x08not tls!")  # no TLS handshake: closed
                with contextlib.suppress(ConnectionResetError):
                    while s.recv(4096):
                        pass
            assert wait_for(lambda: gc.collect() >= 0 and server.tls_handshake_failures >= 1, 30)
            gc.collect()  # (a protocol dropped is collected with its cycles)
            assert server.tls_handshake_failures == 1
        finally:
            run(server.stop())
