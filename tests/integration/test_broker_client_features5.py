"""The topic broker as users of the official ``pulsar-client`` meet it, fifth part: a partitioned topic whose
partition count grows while its producers and consumers run, a batching producer's delayed messages, a reader or
a seek at a message id past the end, an Exclusive producer fenced by an ExclusiveWithFencing one, and a dead-letter
policy's initial subscription.

One broker on 3 bookies is shared by the module; every test uses its own topics; every wait is bounded."""

from __future__ import annotations

import contextlib
import datetime
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, module_cluster
from tests.integration.test_broker_client_features3 import admin, c, partitioned, receive_all
from tests.integration.test_broker_client_features4 import wait_for
from tests.integration.test_broker_pulsar_client import topic_name

pulsar = pytest.importorskip("pulsar")
__all__ = ["c"]  # the third part's client fixture, on this module's broker


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("features5")) as b:
        yield b


@pytest.fixture(scope="module")
def bp(brokers: Brokers) -> BrokerProcess:
    return brokers.procs[0]


def test_new_partitions_get_the_topics_subscriptions_so_nothing_sent_there_early_is_lost(
    bp: BrokerProcess, c: Any
) -> None:
    t = partitioned(bp, 2)
    path = f"/admin/v2/persistent/public/default/{t.rsplit('/', 1)[-1]}"
    consumer = c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.Shared)
    admin(bp, "POST", f"{path}/partitions", 3)
    # A producer made now sees three partitions at once; the running consumer finds the third only at its next
    # poll of the partition count (a minute). What is sent there meanwhile waits for the subscription.
    producer = c.create_producer(t, message_router=lambda _msg, n: n - 1)
    for i in range(3):
        producer.send(f"m{i}".encode())
    consumer.close()
    again = c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.Shared)  # at latest where "s" is new
    assert sorted(m.data() for m in receive_all(again)) == [b"m0", b"m1", b"m2"]
    assert admin(bp, "GET", f"{path}-partition-2/subscriptions") == ["s"]


def test_delayed_messages_between_batched_ones_are_all_stored_with_dedup_on(c: Any) -> None:
    t = f"persistent://public/default/{topic_name()}"
    consumer = c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = c.create_producer(t, batching_enabled=True, batching_max_publish_delay_ms=100)
    ids: list[Any] = []
    sent = []
    for i in range(40):
        # the client sends each delayed message at once, on its own, and the others later in one batch: the
        # batch's first sequence id (1) is below the last delayed one's (78)
        later = datetime.timedelta(seconds=1)
        producer.send_async(f"d{i}".encode(), lambda _r, mid: ids.append(mid), deliver_after=later)
        producer.send_async(f"n{i}".encode(), lambda _r, mid: ids.append(mid))
        sent += [f"d{i}".encode(), f"n{i}".encode()]
    producer.flush()
    dropped = [str(mid) for mid in ids if mid.ledger_id() < 0]  # (-1, -1): taken for a resend
    assert not dropped
    assert sorted(m.data() for m in receive_all(consumer, idle_ms=3000)) == sorted(sent)


def test_a_reader_or_a_seek_past_the_end_gets_what_is_written_next(c: Any) -> None:
    t = f"persistent://public/default/{topic_name()}"
    producer = c.create_producer(t)
    first = producer.send(b"m0")
    beyond = pulsar.MessageId(-1, first.ledger_id() + 1000, 0, -1)  # a ledger the topic has not reached
    reader = c.create_reader(t, beyond)
    consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
    assert consumer.receive(10_000).data() == b"m0"
    consumer.seek(beyond)
    producer.send(b"m1")
    assert consumer.receive(10_000).data() == b"m1"
    assert reader.read_next(10_000).data() == b"m1"


def test_an_exclusive_producer_fenced_by_another_fails_its_sends_at_once(c: Any) -> None:
    t = f"persistent://public/default/{topic_name()}"
    fenced = c.create_producer(t, access_mode=pulsar.ProducerAccessMode.Exclusive, send_timeout_millis=10_000)
    fenced.send(b"m0")
    fencer = c.create_producer(t, access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing)
    # it reconnects, is told ProducerFenced and gives up (told ProducerBusy it retried, each send a Timeout)
    with pytest.raises(pulsar.ProducerFenced):
        fenced.send(b"lost")
    with pytest.raises(pulsar.ProducerFenced):
        fenced.send(b"lost too")
    fencer.send(b"m1")


def test_a_dead_letter_policys_initial_subscription_keeps_what_reaches_the_dead_letter_topic(
    bp: BrokerProcess, c: Any
) -> None:
    t = f"persistent://public/default/{topic_name()}"
    policy = pulsar.ConsumerDeadLetterPolicy(
        max_redeliver_count=1, dead_letter_topic=f"{t}-DLQ", initial_subscription_name="dlq-sub"
    )
    consumer = c.subscribe(
        t,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=policy,
    )
    c.create_producer(t).send(b"poison")
    for _ in range(2):  # delivered, then redelivered once: the client sends it to the dead-letter topic next
        consumer.negative_acknowledge(consumer.receive(10_000))
    stats = f"/admin/v2/persistent/public/default/{t.rsplit('/', 1)[-1]}-DLQ/stats"

    def dead_lettered() -> bool:
        with contextlib.suppress(urllib.error.HTTPError):  # (404 until the client's producer made the topic)
            return bool(admin(bp, "GET", stats)["msgInCounter"])
        return False

    wait_for(dead_lettered, "the message on the dead-letter topic")
    # stored before anybody subscribed there: the producer's initial subscription holds it, and a consumer of
    # that subscription gets it (at latest, as by default: the subscription exists already)
    dead = c.subscribe(f"{t}-DLQ", "dlq-sub")
    assert dead.receive(10_000).data() == b"poison"
