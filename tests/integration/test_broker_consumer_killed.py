"""A Shared consumer whose process is killed (kill -9: its connection goes without a CLOSE_CONSUMER) in the middle
of a batch it acknowledged in part, with ``batch_index_ack_enabled``: the subscription's other consumer gets the
batch's unacknowledged messages, each once, and none of those acknowledged. The clean close of the same consumer is
test_broker_client_features.py's test_batch_index_acks_survive_a_reconnect_and_a_negative_ack.
Real ZooKeeper, 3 bookie processes, a broker process, and the dying consumer in a process of its own."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.integration.test_broker_pulsar_client import client, drain, topic_name

pulsar = pytest.importorskip("pulsar")

# The consumer that dies: subscribes, says so, acknowledges the first ACKED messages it receives one by one,
# waits out the client's ack grouping (100 ms) and says which, then waits to be killed.
_VICTIM = """
import sys, time, pulsar
url, topic, acked = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
consumer = c.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, batch_index_ack_enabled=True)
print("subscribed", flush=True)
done = []
for _ in range(acked):
    m = consumer.receive(timeout_millis=20000)
    consumer.acknowledge(m)
    done.append(m.data().decode())
time.sleep(1.0)
print(",".join(done), flush=True)
time.sleep(120)
"""


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line, f"the consumer process ended (exit {proc.poll()})"
    return line


def test_a_shared_consumer_killed_mid_batch_leaves_only_its_unacked_messages(broker: BrokerProcess) -> None:
    t = topic_name()
    victim = subprocess.Popen(
        [sys.executable, "-c", _VICTIM, broker.service_url, t, "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    c = client(broker)
    try:
        assert _line(victim) == "subscribed"
        producer = c.create_producer(t, batching_enabled=True, batching_max_publish_delay_ms=50)
        for i in range(10):
            producer.send_async(f"{i}".encode(), None)
        producer.flush()
        acked = _line(victim).split(",")
        assert acked == ["0", "1", "2"]  # the whole batch went to the only consumer there was
        other: Any = c.subscribe(
            t, "s", consumer_type=pulsar.ConsumerType.Shared, batch_index_ack_enabled=True
        )
        time.sleep(0.3)
        victim.kill()
        victim.wait(10)
        got = [m.data().decode() for m in drain(other, 7)]
        assert got == [f"{i}" for i in range(3, 10)]
        with pytest.raises(pulsar.Timeout):
            other.receive(timeout_millis=1000)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(10)
        c.close()
