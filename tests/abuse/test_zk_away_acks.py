"""ZooKeeper away while consumers acknowledge: the broker keeps their acks and saves them once ZooKeeper is back,
and says so in a line a minute. Each cursor's delayed save logged ``ERROR ... flush failed`` with a whole
traceback every time ZooKeeper failed it (about every 10 s per cursor with acks: a flood with many topics),
against the rule that a lasting condition is a line a minute (docs/operations.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.broker_testing import start_broker
from tests.conftest import BookieFactory
from tests.zk_testing import make_test_server, unique_root, wait_for
from zk import MetadataStore, layout

pulsar = pytest.importorskip("pulsar")

SUBS = 3
ACKED = 14  # the messages each consumer acknowledges, all but the first while ZooKeeper is away
ML = "public/default/persistent/acks-while-zk-away"
ONE = ["--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1", "--tick-interval-s", "1"]


def test_acks_while_zookeeper_is_away_are_a_line_a_minute_and_saved_once_it_is_back(tmp_path: Path) -> None:
    with make_test_server() as zk:
        bookies = BookieFactory(zk.connect_string, unique_root(), tmp_path)
        broker = client = None
        try:
            bookies.start_many(1)
            broker = start_broker(bookies, tmp_path, 10, *ONE)
            broker.wait_ready(60)
            assert broker.log_path is not None
            client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
            topic = "persistent://public/default/acks-while-zk-away"
            consumers = [client.subscribe(topic, f"s{i}") for i in range(SUBS)]
            producer = client.create_producer(topic)
            for i in range(20):
                producer.send(b"m%d" % i)
            got = [[c.receive(10_000) for _ in range(20)] for c in consumers]
            for c, msgs in zip(consumers, got, strict=True):
                c.acknowledge(msgs[0])
            time.sleep(2)  # the cursors are saved once with ZooKeeper there
            zk.kill()
            for k in range(
                1, ACKED
            ):  # an ack every 1.5 s on each subscription for 20 s: each cursor save fails
                for c, msgs in zip(consumers, got, strict=True):
                    c.acknowledge(msgs[k])
                time.sleep(1.5)
            log = broker.log_path.read_text(errors="replace")
            assert "Traceback" not in log, log[-5000:]
            assert 1 <= log.count("not saved yet (acks kept, saved later)") <= 2, log[-5000:]
            zk.start()
            store = MetadataStore.connect(zk.connect_string, root=bookies.root)
            try:
                last = got[0][ACKED - 1].message_id()
                want = [last.ledger_id(), last.entry_id()]

                def saved() -> bool:
                    paths = [layout.ml_cursor_path(ML, f"s{i}") for i in range(SUBS)]
                    return all(store.get(p).value["mark_delete"] == want for p in paths)

                assert wait_for(saved, 60, 0.5), broker.log_path.read_text()[
                    -4000:
                ]  # every ack made while away
            finally:
                store.close()
            assert "Traceback" not in broker.log_path.read_text(errors="replace")
        finally:
            if client is not None:
                client.close()
            if broker is not None:
                broker.kill9()
            bookies.stop_all()
