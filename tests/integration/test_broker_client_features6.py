"""The topic broker as users of the official ``pulsar-client`` meet it, sixth part: Key_Shared sticky hash ranges
that take the keys they take with Pulsar's broker.

One broker on 3 bookies is shared by the module; every test uses its own topics; every wait is bounded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.broker_testing import Brokers, module_cluster
from tests.integration.test_broker_client_features3 import receive_all
from tests.integration.test_broker_compaction import c
from tests.integration.test_broker_pulsar_client import topic_name

pulsar = pytest.importorskip("pulsar")
__all__ = ["c"]  # a client of the module's first broker (the fixture of the compaction tests)


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("features6")) as b:
        yield b


#: Pulsar's Key_Shared slots (Murmur3_32 of the key, sign bit cleared, modulo 65536) of the keys the tests send,
#: worked out apart from the broker's code: Murmur3_32(b"orders-eu") = 0xdda99399 and
#: Murmur3_32(b"NONE_KEY") = 0x9e15bea3 (the key Pulsar gives a message without one).
SLOT_ORDERS_EU = 0x9399
SLOT_NO_KEY = 0xBEA3


def _sticky(*ranges: tuple[int, int]) -> Any:
    return pulsar.ConsumerKeySharedPolicy(pulsar.KeySharedMode.Sticky, sticky_ranges=list(ranges))


def test_sticky_hash_ranges_take_the_keys_pulsar_gives_them(c: Any) -> None:
    """A consumer holding the slot a key hashes to with Pulsar's broker gets that key's messages, and the one
    holding the slot of Pulsar's NONE_KEY those without a key; the other consumer everything else."""
    t = f"persistent://public/default/{topic_name()}"
    mine = sorted([(SLOT_ORDERS_EU, SLOT_ORDERS_EU), (SLOT_NO_KEY, SLOT_NO_KEY)])
    rest, start = [], 0
    for lo, hi in mine:
        rest.append((start, lo - 1))
        start = hi + 1
    rest.append((start, 65535))
    a = c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.KeyShared, key_shared_policy=_sticky(*mine))
    b = c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.KeyShared, key_shared_policy=_sticky(*rest))
    producer = c.create_producer(t, batching_enabled=False)
    for i in range(3):
        producer.send(f"eu{i}".encode(), partition_key="orders-eu")
        producer.send(f"us{i}".encode(), partition_key="orders-us")
        producer.send(f"none{i}".encode())
    assert sorted(m.data() for m in receive_all(a)) == [b"eu0", b"eu1", b"eu2", b"none0", b"none1", b"none2"]
    assert [m.data() for m in receive_all(b)] == [b"us0", b"us1", b"us2"]
