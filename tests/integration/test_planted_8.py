"""Tests for the bugs planted in the audit of 2026-11-29 against f2903da that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of the SEND checks, the producer-name liveness check, topic
stats, the admin's new routes and headers, and the Spark source's encryption and password hand-over"): each fails
with its bug planted and passes without it. One broker on 3 bookies (its housekeeping tick every second, as
``test_broker_client_features7``'s), the official ``pulsar-client`` and raw connections of the protocol's
frames."""

from __future__ import annotations

import base64
import contextlib
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.integration.test_broker_client_features3 import admin, c
from tests.integration.test_broker_client_features4 import keys, wait_for
from tests.integration.test_broker_client_features7 import _answers, _raw_producer, _stats, bp, brokers
from tests.integration.test_broker_pulsar_client import failover_topic, topic_name
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire

pulsar = pytest.importorskip("pulsar")
T = pb.BaseCommand
#: the third part's client fixture, the fourth's RSA keys, the seventh's broker (its own, for this module)
__all__ = ["bp", "brokers", "c", "keys"]


def _path(topic: str) -> str:
    return f"/admin/v2/persistent/public/default/{topic.rsplit('/', 1)[-1]}"


def test_stats_count_a_producers_messages_and_a_consumers_bytes_and_name_the_active_consumer(
    bp: BrokerProcess, c: Any
) -> None:
    """Two batches of 5 from an Exclusive producer: its average message size is per message (not per batch), the
    consumer that got both batches was sent the bytes of both, and the Failover subscription's active consumer is
    the one its order chose (``a``, subscribed after ``b``), not the first subscribed."""
    t = f"persistent://public/default/{failover_topic('a')}"
    failover = pulsar.ConsumerType.Failover
    c.subscribe(t, "s", consumer_type=failover, consumer_name="b")
    a = c.subscribe(t, "s", consumer_type=failover, consumer_name="a")  # active: the ring's choice for t
    producer = c.create_producer(
        t,
        access_mode=pulsar.ProducerAccessMode.Exclusive,
        batching_enabled=True,
        batching_max_messages=5,
        batching_max_publish_delay_ms=60_000,
    )
    for batch in range(2):
        for i in range(5):
            producer.send_async(b"m" * (10 + 5 * batch + i), None)
        producer.flush()
    assert len([a.receive(10_000) for _ in range(10)]) == 10
    stats = _stats(bp, t)
    (pub,) = stats["publishers"]
    assert pub["accessMode"] == "Exclusive"
    assert stats["msgInCounter"] == 10
    assert pub["averageMsgSize"] == stats["bytesInCounter"] / 10, (pub, stats["bytesInCounter"])
    sub = stats["subscriptions"]["s"]
    assert sub["activeConsumerName"] == "a"
    consumers = {x["consumerName"]: x for x in sub["consumers"]}
    assert consumers["a"]["msgOutCounter"] == 10
    assert consumers["a"]["bytesOutCounter"] == sub["bytesOutCounter"] > 0, sub


def test_a_subscriptions_rates_are_its_consumers_summed_also_in_partitioned_stats(
    bp: BrokerProcess, c: Any
) -> None:
    """Two Shared consumers of a partitioned topic read while messages flow: a partition's subscription rate is
    the sum of its consumers' (Pulsar's), and partitioned-stats sums the partitions' subscription rates."""
    t = f"persistent://public/default/{topic_name()}"
    admin(bp, "PUT", _path(t) + "/partitions", 2)
    for name in ("a", "b"):
        c.subscribe(
            t,
            "s",
            consumer_type=pulsar.ConsumerType.Shared,
            consumer_name=name,
            receiver_queue_size=1,  # each holds one message at a time: both are sent some
            message_listener=lambda consumer, m: consumer.acknowledge(m),
        )
    producer = c.create_producer(t, batching_enabled=False)
    started = time.monotonic()
    while time.monotonic() - started < 3.5:  # several ticks of the broker, with messages after each
        producer.send(b"x" * 100)
        time.sleep(0.02)
    sub = admin(bp, "GET", _path(t) + "-partition-0/stats")["subscriptions"]["s"]
    rates = [x["msgRateOut"] for x in sub["consumers"]]
    assert len(rates) == 2 and min(rates) > 0, sub  # both consumers were sent messages in the window
    assert sub["msgRateOut"] == sum(rates), sub
    agg = admin(bp, "GET", _path(t) + "/partitioned-stats")["subscriptions"]["s"]
    assert agg["msgRateOut"] > 0 and agg["msgThroughputOut"] > 0, agg


def test_a_messages_own_publish_time_finds_its_id_and_a_later_time_finds_none(
    bp: BrokerProcess, c: Any
) -> None:
    """``messageid/{ms}``: a message published at that very millisecond is "at or after" it; a time after the
    last message answers 404 'Message ID is null' (pulsar-admin prints that), not the last message."""
    t = f"persistent://public/default/{topic_name()}"
    producer = c.create_producer(t, batching_enabled=False)
    producer.send(b"first")
    time.sleep(0.01)  # a later millisecond for the next publish time
    producer.send(b"second")
    reader = c.create_reader(t, pulsar.MessageId.earliest)
    messages = [reader.read_next(10_000) for _ in range(2)]
    assert messages[0].publish_timestamp() < messages[1].publish_timestamp()
    for m in messages:
        got = admin(bp, "GET", f"{_path(t)}/messageid/{m.publish_timestamp()}")
        assert (got["ledgerId"], got["entryId"]) == (m.message_id().ledger_id(), m.message_id().entry_id())
    with pytest.raises(urllib.error.HTTPError) as e:
        admin(bp, "GET", f"{_path(t)}/messageid/{messages[1].publish_timestamp() + 60_000}")
    assert e.value.code == 404


def test_internal_info_of_a_terminated_topic_and_of_a_partitioned_one(bp: BrokerProcess, c: Any) -> None:
    """``topics info-internal``: a terminated topic's terminatedPosition, a closed ledger's size in bytes (as
    internalStats gives it), and a partitioned topic's partitions."""
    t = f"persistent://public/default/{topic_name()}"
    # a subscription keeps the ledger: without one, retention (none set) lets the broker's housekeeping delete
    # it once closed, before the two reads below
    c.subscribe(t, "keeps-the-ledger")
    producer = c.create_producer(t, batching_enabled=False)
    ids = [producer.send(b"x" * 50) for _ in range(3)]
    admin(bp, "PUT", _path(t) + "/unload")  # the ledger closed, its size stored
    last = admin(bp, "POST", _path(t) + "/terminate")
    info = admin(bp, "GET", _path(t) + "/internal-info")
    assert info["terminatedPosition"] == {"ledgerId": last["ledgerId"], "entryId": last["entryId"]}
    ledger = ids[0].ledger_id()
    sizes = {li["ledgerId"]: li["size"] for li in admin(bp, "GET", _path(t) + "/internalStats")["ledgers"]}
    assert [li["size"] for li in info["ledgers"] if li["ledgerId"] == ledger] == [sizes[ledger]], info
    assert sizes[ledger] > 150

    base = f"persistent://public/default/{topic_name()}"
    admin(bp, "PUT", _path(base) + "/partitions", 2)
    c.create_producer(f"{base}-partition-0").send(b"p0")
    info = admin(bp, "GET", _path(base) + "/internal-info")
    assert info["partitions"][f"{base}-partition-0"]["ledgers"], info


def test_an_examined_encrypted_batch_carries_what_a_key_holder_decrypts_it_with(
    bp: BrokerProcess, c: Any, keys: dict[str, Any]
) -> None:
    """examinemessage of an encrypted LZ4 batch: the IV (``X-Pulsar-Base64-encryption-param``, AES-GCM's 12
    bytes), the batch's size before compression and the batch's stored size, from which Pulsar's admin client
    rebuilds the message to decrypt."""
    t = f"persistent://public/default/{topic_name()}"
    raw = c.subscribe(t, "s", crypto_failure_action=pulsar.ConsumerCryptoFailureAction.CONSUME)
    lz4_batches = {
        "compression_type": pulsar.CompressionType.LZ4,
        "batching_enabled": True,
        "batching_max_messages": 3,
    }
    producer = c.create_producer(
        t,
        encryption_key="k",
        crypto_key_reader=keys["right"],
        batching_max_publish_delay_ms=60_000,
        **lz4_batches,
    )
    messages = [f"secret {i} ".encode() * 20 for i in range(3)]
    for m in messages:
        producer.send_async(m, None)  # one batch of the 3
    producer.flush()
    stored = raw.receive(10_000).data()
    url = (
        f"http://127.0.0.1:{bp.http_port}{_path(t)}/examinemessage?initialPosition=earliest&messagePosition=1"
    )
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.read() == stored
        assert len(base64.b64decode(r.headers["X-Pulsar-Base64-encryption-param"])) == 12
        assert int(r.headers["X-Pulsar-uncompressed-size"]) > 3 * 180 > len(stored)  # LZ4 of repeated text
        assert r.headers["X-Pulsar-batch-size"] == str(len(stored))


def test_a_batched_messages_own_event_time_is_examined(bp: BrokerProcess, c: Any) -> None:
    """A message by id of a batch's second message answers its own event time, not the batch's first."""
    t = f"persistent://public/default/{topic_name()}"
    producer = c.create_producer(
        t, batching_enabled=True, batching_max_messages=2, batching_max_publish_delay_ms=60_000
    )
    ids: list[Any] = []
    for ms in (1_700_000_000_001, 1_700_000_000_002):
        producer.send_async(b"e", lambda res, mid: ids.append(mid), event_timestamp=ms)
    producer.flush()
    wait_for(lambda: len(ids) == 2, "both messages acknowledged")
    entry = f"{_path(t)}/ledger/{ids[0].ledger_id()}/entry/{ids[0].entry_id()}"
    for index, want in ((0, "2023-11-14T22:13:20.001Z"), (1, "2023-11-14T22:13:20.002Z")):
        url = f"http://127.0.0.1:{bp.http_port}{entry}?batchIndex={index}"
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.headers["X-Pulsar-event-time"] == want, index


def test_a_producer_waiting_for_the_liveness_check_of_a_topic_unloaded_meanwhile_is_refused(
    bp: BrokerProcess, c: Any
) -> None:
    """A PRODUCER waiting for the liveness check of its name's holder while the topic is unloaded is answered
    ServiceNotReady (the client looks the topic up again), not attached to the unloaded topic."""
    t = f"persistent://public/default/{topic_name()}"
    silent = _raw_producer(bp, [(t, 1, 1, "p")])  # holds p on t, then answers nothing
    try:
        assert _answers(silent, 1) == {1: "PRODUCER_SUCCESS"}
        raw = _raw_producer(bp, [(t, 1, 1, "p")])
        with contextlib.closing(raw):
            dec = wire.FrameDecoder()
            while not any(f.command.type == T.PING for f in dec.feed(silent.recv(65536))):
                pass  # the broker's PING to the holder: the check waits now
            admin(bp, "PUT", _path(t) + "/unload")
            assert _answers(raw, 1) == {1: "ServiceNotReady"}
    finally:
        silent.close()
    c.create_producer(t, producer_name="p").send(b"p is served")


def test_sequence_ids_in_the_metadata_are_checked_against_the_largest_long_included(
    bp: BrokerProcess,
) -> None:
    """A SEND whose MessageMetadata's sequence id is over 2^63-1 is refused (stored, it was the producer's last
    id after a reload); 2^63-1 itself is a long, and is stored."""
    t = f"persistent://public/default/{topic_name()}"
    raw = _raw_producer(bp, [(t, 1, 1, "fz")])
    with contextlib.closing(raw):
        assert _answers(raw, 1) == {1: "PRODUCER_SUCCESS"}
        dec = wire.FrameDecoder()
        for seq, meta_seq, want in ((0, 2**64 - 1, T.SEND_ERROR), (2**63 - 1, 2**63 - 1, T.SEND_RECEIPT)):
            md = pb.MessageMetadata(producer_name="fz", sequence_id=meta_seq, publish_time=1)
            raw.sendall(
                wire.encode_send(
                    T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=seq)), md, b"x"
                )
            )
            got: list[int] = []
            while not got:
                got = [f.type for f in dec.feed(raw.recv(65536)) if f.type in (T.SEND_RECEIPT, T.SEND_ERROR)]
            assert got == [want], (seq, meta_seq)


def test_a_message_whose_property_holds_an_ansi_colour_is_examined(bp: BrokerProcess, c: Any) -> None:
    """A property value holding ESC (an ANSI colour from a log line), or any control character but tab, is
    answered with it written as a space; before, aiohttp refused to write the header and the client saw the
    connection closed without an answer (only CR, LF and NUL were replaced)."""
    t = f"persistent://public/default/{topic_name()}"
    c.create_producer(t, batching_enabled=False).send(
        b"coloured", properties={"line": "a \x1b[31mred\x1b[0m\x7fz"}
    )
    url = (
        f"http://127.0.0.1:{bp.http_port}{_path(t)}/examinemessage?initialPosition=earliest&messagePosition=1"
    )
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.read() == b"coloured"
        assert r.headers["X-Pulsar-PROPERTY-line"] == "a  [31mred [0m z"
