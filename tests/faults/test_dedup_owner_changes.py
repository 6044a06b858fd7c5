"""Deduplication across two changes of a topic's owner, with the official ``pulsar-client``: a producer that
wrote only to the first owner (killed -9) keeps its last sequence id after the second owner, which served
other producers, goes too (killed -9, or stopped as in a rolling restart). The second owner learnt that id
from the first owner's last ledger; the third scans only the ledger before its own, the second owner's."""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path

import pytest

from tests.broker_testing import start_broker
from tests.integration.test_broker_split_brain import zk_read

pulsar = pytest.importorskip("pulsar")

SESSION_TIMEOUT_S = 4.0


def owner_of(bookies, ml_name: str) -> str | None:
    o = zk_read(bookies, lambda m: m.get_owner(ml_name))
    return o.broker_id if o else None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("second_owner_goes", ["kill", "stop"])
def test_producer_of_the_first_owner_keeps_its_sequence_id_after_the_second(
    bookies, tmp_path: Path, second_owner_goes: str
) -> None:
    bookies.start_many(3)
    a, b = (start_broker(bookies, tmp_path, SESSION_TIMEOUT_S) for _ in range(2))
    a.wait_ready(60)
    b.wait_ready(60)
    topic = f"dedup-owners-{uuid.uuid4().hex[:8]}"
    ml_name = f"public/default/persistent/{topic}"
    clients: list[pulsar.Client] = []

    def client(url: str) -> pulsar.Client:
        clients.append(pulsar.Client(url, operation_timeout_seconds=30))
        return clients[-1]

    try:
        p1 = client(a.service_url).create_producer(topic, producer_name="p1", batching_enabled=False)
        assert owner_of(bookies, ml_name) == a.id
        # the subscription read at the end, made first: with no subscription at all (and no retention) an owner's
        # housekeeping may trim the closed ledgers before it is made, as Pulsar's does
        clients[0].subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest).close()
        for i in range(10):
            p1.send(f"p1-{i}".encode())
        a.kill9()  # p1's sequence ids are in a's last ledger only
        clients[0].close()  # p1's application goes too (its producer would come back under the same name)
        deadline = time.monotonic() + 30
        while owner_of(bookies, ml_name) is not None:
            assert time.monotonic() < deadline, "a's ownership outlived its session"
            time.sleep(0.2)
        p2 = client(b.service_url).create_producer(topic, producer_name="p2", batching_enabled=False)
        assert owner_of(bookies, ml_name) == b.id
        for i in range(5):
            p2.send(f"p2-{i}".encode())
        if second_owner_goes == "kill":
            b.kill9()
        else:
            b.stop()
        a.start(wait=True)
        p1 = client(a.service_url).create_producer(topic, producer_name="p1", batching_enabled=False)
        assert owner_of(bookies, ml_name) == a.id
        assert p1.last_sequence_id() == 9
        p1.send(b"p1-5", sequence_id=5)  # a resend of what is stored: acknowledged, not stored again
        p1.send(b"p1-10", sequence_id=10)
        consumer = clients[-1].subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        got = []
        while True:
            try:
                m = consumer.receive(timeout_millis=2000)
            except pulsar.Timeout:
                break
            got.append(m.data().decode())
        assert got == [*(f"p1-{i}" for i in range(10)), *(f"p2-{i}" for i in range(5)), "p1-10"]
    finally:
        for c in clients:
            with contextlib.suppress(Exception):  # the first one is closed already
                c.close()
        for bp in (a, b):
            try:
                bp.stop()
            except Exception:
                bp.kill9()
