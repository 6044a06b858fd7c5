"""Still more of an operator's bad days against real processes: a broker started before any bookie of a new
deployment, whose bookies then come and go; ZooKeeper away for a while."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledgerstore import cli
from ledgerstore.cluster import BookieProcess, BrokerProcess, free_port
from tests.abuse.helpers import http
from tests.broker_testing import start_broker
from tests.conftest import BookieFactory
from tests.zk_testing import make_test_server, unique_root, wait_for


def _produce(broker: BrokerProcess, timeout_s: float = 3) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerstore.cli", "topic", "produce", "t", "-m", "x"]
        + ["--service-url", broker.service_url, "--timeout-s", f"{timeout_s:g}"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_broker_without_bookies_says_it_waits_once_refuses_producers_with_the_reason_and_says_when_they_come(
    tmp_path: Path,
) -> None:
    """A broker on a new deployment's ZooKeeper (no cluster yet: it starts) with no bookie said nothing at all
    while every producer waited out its timeout; once a topic's bookies had gone, it logged 'tick failed' and
    'close failed ... closing it by recovery' for each topic on every tick. Now: one 'waiting for bookies' line
    with how many it has and needs, producers told NOT_ENOUGH_BOOKIES and why, one line when a bookie comes, and
    after the bookies go again one waiting line and no rollover attempted (it could only fail), so no line per
    tick."""
    pytest.importorskip("pulsar")
    with make_test_server() as zk:
        one = ["--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1", "--tick-interval-s", "1"]
        broker = BrokerProcess(
            zk=zk.connect_string,
            port=free_port(),
            http_port=free_port(),
            extra_args=["--zk-session-timeout-s", "4", *one],
            log_path=tmp_path / "broker.log",
        )
        bookie = BookieProcess(
            zk=zk.connect_string,
            data_dir=tmp_path / "bookie",
            port=free_port(),
            http_port=free_port(),
            init_cluster=False,  # the first bookie of a new deployment creates its cluster anyway
        )
        log = broker.log_path
        assert log is not None
        try:
            broker.start()
            r = _produce(broker)  # (the client asks again and again meanwhile)
            assert r.returncode == cli.EXIT_UNAVAILABLE, r.stdout + r.stderr
            assert len(r.stderr.strip().splitlines()) == 1, r.stderr
            assert "NOT_ENOUGH_BOOKIES: the broker has 0 writable bookies, a new ledger needs 1" in r.stderr
            text = log.read_text(errors="replace")
            waiting = [line for line in text.splitlines() if "waiting for bookies" in line]
            assert len(waiting) == 1, text
            assert "0 writable, a new ledger needs 1 (--ensemble-size)" in waiting[0], waiting
            assert "Traceback" not in text and "tick failed" not in text, text

            bookie.start(timeout_s=60)
            assert wait_for(
                lambda: "bookies: 1 writable now" in log.read_text(errors="replace"), timeout_s=30
            )
            assert _produce(broker, 30).returncode == 0

            bookie.stop()  # unregistered at once
            assert wait_for(lambda: log.read_text(errors="replace").count("waiting for bookies") == 2, 30)
            r = _produce(broker)  # the topic's ledger is on the bookie that went: the append fails
            assert r.returncode == cli.EXIT_UNAVAILABLE, r.stdout + r.stderr
            assert wait_for(
                lambda: "append failed" in log.read_text(errors="replace"), 90
            )  # (its add timeout)
            time.sleep(6)  # six ticks, each of which tried to replace the failed ledger
            text = log.read_text(errors="replace")
            assert text.count("waiting for bookies") == 2, text
            assert "tick failed" not in text and "closing it by recovery" not in text, text
            assert "Traceback" not in text, text

            bookie.start(timeout_s=60)  # back: the failed ledger is closed and replaced, produce works again
            assert wait_for(lambda: log.read_text(errors="replace").count("bookies: 1 writable now") == 2, 30)
            assert _produce(broker, 30).returncode == 0
        finally:
            broker.kill9()
            bookie.kill9()


def test_zookeeper_away_for_a_while_gets_a_line_or_two_from_each_process_not_one_per_retry(
    tmp_path: Path,
) -> None:
    """ZooKeeper gone for half a minute under a bookie (with its AutoRecovery) and a broker: each process logged
    kazoo's 'Connection dropped: ...' about once a second, and AutoRecovery's auditor and worker a warning per
    failed pass. Each kind of line now comes at most once a minute, and everything works again once it is back."""
    pytest.importorskip("pulsar")
    with make_test_server() as zk:
        bookies = BookieFactory(zk.connect_string, unique_root(), tmp_path)
        broker = None
        try:
            (bp,) = bookies.start_many(1, autorecovery=True)
            one = [
                "--ensemble-size",
                "1",
                "--write-quorum",
                "1",
                "--ack-quorum",
                "1",
                "--tick-interval-s",
                "1",
            ]
            broker = start_broker(bookies, tmp_path, 4, *one)
            broker.wait_ready(60)
            assert _produce(broker, 30).returncode == 0
            zk.kill()
            time.sleep(30)
            assert broker.log_path is not None
            logs = {"broker": broker.log_path.read_text(errors="replace"), "bookie": bp.log_tail(100_000)}
            for who, text in logs.items():
                assert text.count("Connection dropped") <= 2, (who, text[-5000:])
                assert "Traceback" not in text, (who, text[-5000:])
            for kind in (
                "WARNING autorecovery.auditor: auditor ",
                "WARNING autorecovery.worker: replication worker ",
            ):
                assert logs["bookie"].count(kind) <= 1, (kind, logs["bookie"][-5000:])
            assert logs["broker"].count("namespace policies not refreshed") <= 1, logs["broker"][-5000:]
            zk.start()
            assert wait_for(lambda: _produce(broker, 10).returncode == 0, timeout_s=90, interval_s=1)
        finally:
            if broker is not None:
                broker.kill9()
            bookies.stop_all()


def test_the_brokers_admin_http_answers_503_with_the_reason_while_it_has_too_few_bookies(
    tmp_path: Path,
) -> None:
    """A topic's admin calls on a broker with fewer writable bookies than --ensemble-size answered 500 (an
    internal error) although the cause is as passing as ZooKeeper away, which is answered 503; now 503 with
    the NOT_ENOUGH_BOOKIES reason, one warning line each, and the calls that need no ledger still work."""
    with make_test_server() as zk:
        broker = BrokerProcess(
            zk=zk.connect_string,
            port=free_port(),
            http_port=free_port(),
            extra_args=["--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1"],
            log_path=tmp_path / "broker.log",
        )
        try:
            broker.start()
            assert http(broker, "GET", "/admin/v2/persistent/public/default")[0] == 200
            assert http(broker, "PUT", "/admin/v2/persistent/public/default/t1")[0] == 204  # metadata only
            for method, path in (
                ("GET", "/admin/v2/persistent/public/default/t1/stats"),
                ("GET", "/admin/v2/persistent/public/default/t1/internalStats"),
                ("PUT", "/admin/v2/persistent/public/default/t1/subscription/s1"),
            ):
                status, body = http(broker, method, path)
                assert status == 503, (method, path, status, body)
                assert "NOT_ENOUGH_BOOKIES: the broker has 0 writable bookies" in body["reason"], (path, body)
            text = broker.log_path.read_text(errors="replace") if broker.log_path else ""
            assert "Traceback" not in text, text
            assert (
                "admin GET /admin/v2/persistent/public/default/t1/stats: 503: NOT_ENOUGH_BOOKIES" in text
            ), text
        finally:
            broker.kill9()
