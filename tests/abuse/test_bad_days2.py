"""More of an operator's bad days against real processes: a broker whose ZooKeeper is away (its admin HTTP
answers 503; a SIGTERM stops it promptly)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.abuse.helpers import http
from tests.broker_testing import start_broker
from tests.conftest import BookieFactory
from tests.zk_testing import make_test_server, unique_root, wait_for


def test_the_brokers_admin_http_answers_503_with_the_reason_while_zookeeper_is_away(tmp_path: Path) -> None:
    with make_test_server() as zk:
        bookies = BookieFactory(zk.connect_string, unique_root(), tmp_path)
        broker = None
        try:
            bookies.start_many(1)
            broker = start_broker(bookies, tmp_path, 4)
            broker.wait_ready(60)
            assert http(broker, "PUT", "/admin/v2/persistent/public/default/t1")[0] == 204
            zk.stop()
            for method, path in (
                ("GET", "/admin/v2/tenants"),
                ("GET", "/admin/v2/persistent/public/default"),
                ("GET", "/admin/v2/persistent/public/default/t1/partitions"),
                ("PUT", "/admin/v2/persistent/public/default/t2"),
                ("GET", "/admin/v2/namespaces/public/default/retention"),
            ):
                status, body = http(broker, method, path)
                assert status == 503, (method, path, status, body)
                assert "ZooKeeper" in body["reason"], (method, path, body)
            log = broker.log_path.read_text(errors="replace") if broker.log_path else ""
            assert "Traceback" not in log, broker.log_tail(60)
            assert "admin GET /admin/v2/tenants: 503: ZooKeeper" in log, broker.log_tail(60)
        finally:
            if broker is not None:
                broker.kill9()
            for bp in bookies.procs:
                bp.kill9()


def test_a_broker_stopped_while_zookeeper_is_away_stops_promptly_and_loses_nothing(tmp_path: Path) -> None:
    """SIGTERM with ZooKeeper gone: every metadata write of a clean stop (closing ledgers, flushing cursors,
    releasing ownership) would wait out its timeout, one after the other, and the broker was killed after
    `cluster down`'s 15 s. It stops at once instead, in one warning line, leaving its topics as a crash would;
    the next broker recovers them and every acknowledged message is there."""
    pulsar = pytest.importorskip("pulsar")
    with make_test_server() as zk:
        bookies = BookieFactory(zk.connect_string, unique_root(), tmp_path)
        brokers: list[BrokerProcess] = []
        try:
            bookies.start_many(1)
            one = ["--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1"]
            brokers.append(start_broker(bookies, tmp_path, 4, *one))
            brokers[0].wait_ready(60)
            topic = "persistent://public/default/stopped-without-zk"
            client = pulsar.Client(
                brokers[0].service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
            )
            try:
                consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
                producer = client.create_producer(topic)
                for i in range(20):
                    producer.send(f"m{i}".encode())
                for _ in range(5):
                    consumer.acknowledge(consumer.receive(timeout_millis=10_000))
            finally:
                client.close()
            zk.kill()  # gone, its data kept for the start below
            log = brokers[0].log_path
            assert log is not None
            assert wait_for(
                lambda: "ZooKeeper session SUSPENDED" in log.read_text(errors="replace"), timeout_s=30
            )
            t0 = time.monotonic()
            brokers[0].proc.send_signal(signal.SIGTERM)
            assert brokers[0].wait_exit(30) == 0
            assert time.monotonic() - t0 < 8, time.monotonic() - t0
            text = log.read_text(errors="replace")
            assert "stopping with ZooKeeper unreachable" in text and "Traceback" not in text, text[-3000:]
            zk.start()
            brokers.append(start_broker(bookies, tmp_path, 4, *one))
            brokers[1].wait_ready(60)
            client = pulsar.Client(
                brokers[1].service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
            )
            try:
                consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
                unacked = {f"m{i}".encode() for i in range(5, 20)}
                got: set[bytes] = set()
                while not unacked <= got:  # the 5 acked may come again too (their acks were not flushed)
                    got.add(consumer.receive(timeout_millis=30_000).data())
            finally:
                client.close()
        finally:
            for bp in brokers:
                bp.kill9()
            for b in bookies.procs:
                b.kill9()


def test_a_broker_whose_bookies_are_gone_logs_one_line_per_failed_close_not_one_per_recovery_attempt(
    bookies, tmp_path: Path
) -> None:
    (bp,) = bookies.start_many(1)
    broker = start_broker(
        bookies, tmp_path, 4, "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1"
    )
    try:
        broker.wait_ready(60)
        assert http(broker, "PUT", "/admin/v2/persistent/public/default/t")[0] == 204
        assert http(broker, "GET", "/admin/v2/persistent/public/default/t/internalStats")[0] == 200  # loaded
        bp.kill9()
        produce = [sys.executable, "-m", "ledgerstore.cli", "topic", "produce", "t", "--timeout-s", "5"]
        subprocess.run([*produce, "--service-url", broker.service_url], capture_output=True, timeout=120)
        log = broker.log_path
        assert log is not None
        assert wait_for(lambda: "append failed" in log.read_text(errors="replace"), timeout_s=90)
        time.sleep(10)  # ticks: with no bookie left no close is tried at all (test_bad_days3), and none logs
        text = log.read_text(errors="replace")  # a line per recovery attempt
        assert "recovery attempt" not in text and "Traceback" not in text, text[-3000:]
    finally:
        broker.kill9()
