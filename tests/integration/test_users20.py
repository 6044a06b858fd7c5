"""What a pulsar-client user found on a terminated topic whose messages were all acknowledged (one broker
process on 3 bookies, housekeeping every 0.5 s, the namespace with no retention)."""

from __future__ import annotations

import contextlib
import time
import uuid

import pytest

from tests.broker_testing import Brokers
from tests.integration.test_broker_admin import ok
from tests.integration.test_broker_compaction import wait_for
from tests.integration.test_broker_pulsar_client import client

pulsar = pytest.importorskip("pulsar")


def test_a_terminated_topics_last_ledger_stays_after_its_messages_are_acknowledged(cluster: Brokers) -> None:
    """Pulsar's terminate closes the current ledger and opens none, and trimming never takes the current ledger:
    a terminated topic keeps its last messages whatever was acknowledged. Here the terminate rolls over, and the
    next tick deleted the ledger holding them once its one subscription had acknowledged everything: a reader from
    the earliest then read nothing and GET_LAST_MESSAGE_ID answered the empty ledger's N:-1, not the terminated
    position. The ledger of the terminated position now stays."""
    bp = cluster.start("--tick-interval-s", "0.5")
    t = f"term-{uuid.uuid4().hex[:8]}"
    full = f"persistent://public/default/{t}"
    with contextlib.closing(client(bp)) as c:
        consumer = c.subscribe(full, "s")
        producer = c.create_producer(full, batching_enabled=False)
        for i in range(5):
            producer.send(f"m-{i}".encode())
        for _ in range(5):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        last = ok(bp, "POST", f"/admin/v2/persistent/public/default/{t}/terminate")
        at = f"{last['ledgerId']}:{last['entryId']}"
        path = f"/admin/v2/persistent/public/default/{t}/internalStats"
        wait_for(
            "the acknowledgements stored",
            lambda: ok(bp, "GET", path)["cursors"]["s"]["markDeletePosition"] == at,
        )
        time.sleep(2.0)  # four ticks, each of which trimmed what retention let go
        assert last["ledgerId"] in [li["ledgerId"] for li in ok(bp, "GET", path)["ledgers"]]
        reader = c.create_reader(full, pulsar.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(timeout_millis=10_000).data())
        assert got == [f"m-{i}".encode() for i in range(5)]
