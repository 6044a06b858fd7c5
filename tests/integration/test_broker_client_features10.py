"""Pulsar client features, tenth part, on a broker of its own (the fixtures of the third part): a reader that
seeks by time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.broker_testing import Brokers, module_cluster
from tests.integration.test_broker_client_features3 import bp, c
from tests.integration.test_broker_pulsar_client import topic_name

pulsar = pytest.importorskip("pulsar")
__all__ = ["bp", "c"]  # the fixtures of the third part, on this module's broker


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("features10")) as b:
        yield b


def test_a_reader_seeks_by_time(c: Any) -> None:
    """After a seek by time the C++ client resubscribes its reader without a start message id (it has none to
    give): the broker must keep the reader's subscription, moved by the seek, for it to come back to, as Pulsar
    does. Dropped with its consumer, the reader came back to a new subscription at its initial position (the
    latest): nothing to read, whatever the time sought."""
    t = f"persistent://public/default/{topic_name()}"
    p = c.create_producer(t, batching_enabled=False)
    for i in range(10):
        p.send(f"{i}".encode())
        if i == 5:
            time.sleep(0.05)
            t_mid = int(time.time() * 1000)
            time.sleep(0.05)
    reader = c.create_reader(t, pulsar.MessageId.earliest)
    assert reader.read_next(10_000).data() == b"0"
    reader.seek(t_mid)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(10_000).data())
    assert got == [b"6", b"7", b"8", b"9"]
    reader.seek(0)  # to the first message again
    assert reader.read_next(10_000).data() == b"0"
    assert reader.has_message_available()
