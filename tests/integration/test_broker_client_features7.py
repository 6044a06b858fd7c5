"""The topic broker as users of the official ``pulsar-client`` meet it, seventh part: what a pulsar-admin user
reads in a topic's stats while clients produce and consume.

One broker on 3 bookies (its housekeeping tick every second) is shared by the module; every test uses its own
topics; every wait is bounded."""

from __future__ import annotations

import base64
import contextlib
import datetime
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from ledgerstore.topic_cmd import peeked_messages
from tests.broker_testing import Brokers, module_cluster
from tests.integration.test_broker_client_features3 import admin, c
from tests.integration.test_broker_client_features4 import keys, wait_for
from tests.integration.test_broker_pulsar_client import failover_topic, topic_name
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire

pulsar = pytest.importorskip("pulsar")
T = pb.BaseCommand
__all__ = ["c", "keys"]  # the third part's client fixture, on this module's broker; the fourth's RSA keys


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("features7"), "--tick-interval-s", "1") as b:
        yield b


@pytest.fixture(scope="module")
def bp(brokers: Brokers) -> BrokerProcess:
    return brokers.procs[0]


def _stats(bp: BrokerProcess, t: str) -> dict[str, Any]:
    return admin(bp, "GET", f"/admin/v2/persistent/public/default/{t.rsplit('/', 1)[-1]}/stats")


def test_the_first_stats_read_shows_the_rates_of_messages_flowing(bp: BrokerProcess, c: Any) -> None:
    """A topic's stats read once, while messages flow in and out, show rates above 0 (the broker's tick samples
    the counters; before, a rate was sampled only when read, so the first read answered 0.0), and so do its
    producer's, subscription's and consumer's (before: no such fields)."""
    t = f"persistent://public/default/{topic_name()}"
    c.subscribe(t, "s", message_listener=lambda consumer, m: consumer.acknowledge(m))
    producer = c.create_producer(t, batching_enabled=False)
    started = time.monotonic()
    while time.monotonic() - started < 3.5:  # several ticks of the broker, with messages after each
        producer.send(b"x" * 100)
        time.sleep(0.05)
    stats = _stats(bp, t)
    assert stats["msgInCounter"] > 0
    assert stats["msgRateIn"] > 0 and stats["msgThroughputIn"] > 0, stats
    assert stats["msgRateOut"] > 0 and stats["msgThroughputOut"] > 0, stats
    # the producer's, the subscription's and the consumer's own (Pulsar's fields)
    (pub,) = stats["publishers"]
    assert pub["msgRateIn"] > 0 and pub["msgThroughputIn"] > 0 and pub["averageMsgSize"] > 100, pub
    sub = stats["subscriptions"]["s"]
    (consumer,) = sub["consumers"]
    assert consumer["msgRateOut"] > 0 and consumer["msgThroughputOut"] > 0, consumer
    assert (sub["msgRateOut"], sub["msgThroughputOut"]) == (
        consumer["msgRateOut"],
        consumer["msgThroughputOut"],
    )


def test_stats_name_the_producers_and_consumers_as_pulsar_does(bp: BrokerProcess, c: Any) -> None:
    """Pulsar's publisher and consumer fields: the producer's access mode and properties, each client's address,
    connection time and version, what each consumer was sent, and a Failover subscription's active consumer."""
    t = f"persistent://public/default/{failover_topic('a')}"
    a = c.subscribe(
        t, "s", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a", properties={"team": "x"}
    )
    c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b")
    producer = c.create_producer(
        t,
        producer_name="billing",
        properties={"app": "billing"},
        batching_enabled=True,
        batching_max_messages=5,  # one batch of the 5
        batching_max_publish_delay_ms=60_000,
    )
    for i in range(5):
        producer.send_async(f"m{i}".encode(), None)
    producer.flush()
    assert [a.receive(10_000).data() for _ in range(5)] == [f"m{i}".encode() for i in range(5)]
    stats = _stats(bp, t)
    (pub,) = stats["publishers"]
    assert (pub["producerName"], pub["accessMode"], pub["metadata"]) == (
        "billing",
        "Shared",
        {"app": "billing"},
    )
    sub = stats["subscriptions"]["s"]
    assert sub["activeConsumerName"] == "a"
    consumers = {x["consumerName"]: x for x in sub["consumers"]}
    assert {n: x["msgOutCounter"] for n, x in consumers.items()} == {"a": 5, "b": 0}
    assert consumers["a"]["metadata"] == {"team": "x"} and consumers["a"]["bytesOutCounter"] > 0
    for client in (pub, *consumers.values()):
        assert client["address"].startswith("/127.0.0.1:"), client
        assert client["clientVersion"].startswith("Pulsar-"), client
        connected = datetime.datetime.fromisoformat(client["connectedSince"])
        assert abs(datetime.datetime.now(datetime.UTC) - connected) < datetime.timedelta(hours=1), client


def test_peek_and_examine_answer_an_encrypted_compressed_batch_as_stored(
    bp: BrokerProcess, c: Any, keys: dict[str, Any]
) -> None:
    """A peek (and examinemessage) of an end-to-end encrypted batch compressed by the producer answers its
    payload as stored, which only a key holder can decrypt, with Pulsar's encryption headers (before: 412, the
    broker tried to decompress the ciphertext)."""
    t = f"persistent://public/default/{topic_name()}"
    raw = c.subscribe(t, "s", crypto_failure_action=pulsar.ConsumerCryptoFailureAction.CONSUME)
    producer = c.create_producer(
        t,
        encryption_key="k",
        crypto_key_reader=keys["right"],
        compression_type=pulsar.CompressionType.LZ4,
        batching_enabled=True,
        batching_max_messages=3,  # one batch of the 3
        batching_max_publish_delay_ms=60_000,
    )
    for i in range(3):
        producer.send_async(f"secret {i} ".encode() * 20, None)
    producer.flush()
    stored = raw.receive(10_000).data()  # the batch as sent: a consumer without the key gets it whole
    reader = c.create_reader(t, pulsar.MessageId.earliest, crypto_key_reader=keys["right"])
    assert [reader.read_next(10_000).data() for _ in range(3)] == [
        f"secret {i} ".encode() * 20 for i in range(3)
    ]
    base = f"http://127.0.0.1:{bp.http_port}/admin/v2/persistent/public/default/{t.rsplit('/', 1)[-1]}"
    for path in ("/subscription/s/position/1", "/examinemessage?initialPosition=earliest&messagePosition=1"):
        with urllib.request.urlopen(base + path, timeout=30) as r:
            assert r.read() == stored, path
            assert (r.headers["X-Pulsar-Is-Encrypted"], r.headers["X-Pulsar-compression"]) == ("true", "LZ4")
            assert r.headers["X-Pulsar-num-batch-message"] == "3"
            assert r.headers.get_all("X-Pulsar-Base64-encryption-keys"), path
    # ledgerstore topic peek shows it as one message, not split (the split of ciphertext failed)
    with urllib.request.urlopen(base + "/subscription/s/position/1", timeout=30) as r:
        (peeked,) = peeked_messages(r.read(), r.headers)
    assert peeked["payload"] == stored


def test_message_id_by_time_and_partitioned_internal_stats(bp: BrokerProcess, c: Any) -> None:
    """pulsar-admin's ``topics get-message-id`` (the first message published at or after a time, on a partition;
    405 on the partitioned topic) and ``topics partitioned-stats-internal`` (before: 404, no such route)."""
    base = topic_name()
    path = f"/admin/v2/persistent/public/default/{base}"
    admin(bp, "PUT", path + "/partitions", 2)
    producer = c.create_producer(f"persistent://public/default/{base}-partition-0", batching_enabled=False)
    first = producer.send(b"early")
    time.sleep(0.01)  # a later millisecond for the next publish time
    later = int(time.time() * 1000)
    second = producer.send(b"late")
    got = admin(bp, "GET", f"{path}-partition-0/messageid/{later}")
    assert (got["ledgerId"], got["entryId"], got["partitionIndex"]) == (
        second.ledger_id(),
        second.entry_id(),
        0,
    )
    got = admin(bp, "GET", f"{path}-partition-0/messageid/{later - 600_000}")
    assert (got["ledgerId"], got["entryId"]) == (first.ledger_id(), first.entry_id())
    with pytest.raises(urllib.error.HTTPError) as e:
        admin(bp, "GET", f"{path}/messageid/{later}")
    assert e.value.code == 405
    stats = admin(bp, "GET", path + "/partitioned-internalStats")
    assert stats["metadata"] == {"partitions": 2}
    p0 = stats["partitions"][f"persistent://public/default/{base}-partition-0"]
    assert p0["lastConfirmedEntry"] == f"{second.ledger_id()}:{second.entry_id()}"


def test_internal_info_is_the_stored_record_in_pulsars_shape(bp: BrokerProcess, c: Any) -> None:
    """pulsar-admin's ``topics info-internal``: the stored ledgers and cursors as Pulsar's ManagedLedgerInfo, an
    individually acknowledged range as (from, to] (before: 404, no such route)."""
    t = f"persistent://public/default/{topic_name()}"
    path = f"/admin/v2/persistent/public/default/{t.rsplit('/', 1)[-1]}"
    producer = c.create_producer(t, batching_enabled=False)
    consumer = c.subscribe(t, "s")
    ids = [producer.send(b"x") for _ in range(4)]
    for m in [consumer.receive(10_000) for _ in range(4)][1:3]:
        consumer.acknowledge(m)
    wait_for(lambda: admin(bp, "GET", path + "/stats")["subscriptions"]["s"]["msgBacklog"] == 2, "the acks")
    admin(bp, "PUT", path + "/unload")  # the ledger closed and the cursor written
    info = admin(bp, "GET", path + "/internal-info")
    ledger = ids[0].ledger_id()
    assert {"ledgerId": ledger, "entries": 4} in [
        {k: li[k] for k in ("ledgerId", "entries")} for li in info["ledgers"]
    ]
    cursor = info["cursors"]["s"]
    assert cursor["markDelete"] == {"ledgerId": ledger, "entryId": ids[0].entry_id() - 1}
    assert cursor["individualDeletedMessages"] == [
        {
            "from": {"ledgerId": ledger, "entryId": ids[0].entry_id()},
            "to": {"ledgerId": ledger, "entryId": ids[2].entry_id()},
        }
    ]


def test_a_producer_name_held_by_a_silent_connection_is_freed_for_its_reconnection(
    bp: BrokerProcess, c: Any
) -> None:
    """A producer connecting again under its name while its old connection is half-open (a network cut the
    broker has not seen) gets the name once the old connection leaves a PING unanswered, as Pulsar's liveness
    check does (before: ProducerBusy until the keep-alive closed the old connection, 30 to 60 s). A name held by
    a connection that answers is still refused."""
    t = f"persistent://public/default/{topic_name()}"
    silent = socket.create_connection(("127.0.0.1", bp.port), timeout=30)
    try:
        connect = pb.CommandConnect(client_version="t", protocol_version=20)
        silent.sendall(wire.encode_command(T(type=T.CONNECT, connect=connect)))
        producer_cmd = pb.CommandProducer(topic=t, producer_id=1, request_id=1, producer_name="p")
        silent.sendall(wire.encode_command(T(type=T.PRODUCER, producer=producer_cmd)))
        dec, frames = wire.FrameDecoder(), []
        while len(frames) < 2:  # CONNECTED, PRODUCER_SUCCESS; then it reads and answers nothing
            frames += dec.feed(silent.recv(65536))
        assert frames[1].command.type == T.PRODUCER_SUCCESS
        producer = c.create_producer(t, producer_name="p")
        producer.send(b"after the reconnection")
    finally:
        silent.close()
    c.create_producer(t, producer_name="q")
    with (
        contextlib.closing(
            pulsar.Client(f"pulsar://127.0.0.1:{bp.port}", operation_timeout_seconds=30)
        ) as other,
        pytest.raises(pulsar.ProducerBusy),
    ):
        other.create_producer(t, producer_name="q")


def _raw_producer(bp: BrokerProcess, requests: list[tuple[str, int, int, str]]) -> socket.socket:
    """A connection of the protocol's frames that asks for producers (topic, producer id, request id, name), all
    in one write: the broker reads them together, so a later request comes while an earlier one is pending even on
    a busy machine (a write each let the first be created before the second was sent)."""
    conn = socket.create_connection(("127.0.0.1", bp.port), timeout=30)
    connect = pb.CommandConnect(client_version="t", protocol_version=20)
    frames = [wire.encode_command(T(type=T.CONNECT, connect=connect))]
    for topic, producer_id, request_id, name in requests:
        cmd = pb.CommandProducer(
            topic=topic, producer_id=producer_id, request_id=request_id, producer_name=name
        )
        frames.append(wire.encode_command(T(type=T.PRODUCER, producer=cmd)))
    conn.sendall(b"".join(frames))
    return conn


def _answers(conn: socket.socket, n: int) -> dict[int, str]:
    """The next ``n`` answers to requests: request id -> PRODUCER_SUCCESS, SUCCESS or the error's name."""
    dec, out = wire.FrameDecoder(), {}
    while len(out) < n:
        for f in dec.feed(conn.recv(65536)):
            if f.command.type == T.PRODUCER_SUCCESS:
                out[f.command.producer_success.request_id] = "PRODUCER_SUCCESS"
            elif f.command.type == T.SUCCESS:
                out[f.command.success.request_id] = "SUCCESS"
            elif f.command.type == T.ERROR:
                out[f.command.error.request_id] = pb.ServerError.Name(f.command.error.error)
    return out


def test_a_producer_id_taken_while_the_liveness_check_waits_is_not_taken_over(
    bp: BrokerProcess, c: Any
) -> None:
    """A PRODUCER waiting for the liveness check of its name's holder (up to 5 s) keeps its producer id: another
    PRODUCER of the id on the same connection (of another topic) is refused ServiceNotReady at once, as Pulsar's
    ServerCnx refuses an id whose creation is pending; once created, the id of another topic is refused too.
    Before an earlier fix, the waiting one took the id over, and the other producer, no longer the connection's,
    held its name on its topic after the connection closed: ProducerBusy for good."""
    t1, t2 = (f"persistent://public/default/{topic_name()}" for _ in range(2))
    silent = _raw_producer(bp, [(t1, 1, 1, "p")])  # holds p on t1, then reads and answers nothing
    try:
        assert _answers(silent, 1) == {1: "PRODUCER_SUCCESS"}
        # p is held by the silent connection: the broker PINGs it and waits; meanwhile q on t2, producer id 1
        raw = _raw_producer(bp, [(t1, 1, 1, "p"), (t2, 1, 2, "q")])
        with contextlib.closing(raw):
            assert _answers(raw, 2) == {2: "ServiceNotReady", 1: "PRODUCER_SUCCESS"}
            cmd = pb.CommandProducer(topic=t2, producer_id=1, request_id=3, producer_name="q")
            raw.sendall(wire.encode_command(T(type=T.PRODUCER, producer=cmd)))
            assert _answers(raw, 1) == {3: "ServiceNotReady"}  # the id is p's on t1
    finally:
        silent.close()
    c.create_producer(t2, producer_name="q").send(b"q is free again")
    c.create_producer(t1, producer_name="p").send(b"so is p")


def test_producers_waiting_on_one_silent_holder_send_it_one_ping(bp: BrokerProcess, c: Any) -> None:
    """Several PRODUCERs asking for a name that a silent connection holds share one liveness check of it, as
    Pulsar's broker checks a connection (one PING, the answer shared by whoever waits on it); before, each sent
    its own PING and polled for the answer. The silent connection is closed once, and one of them gets the
    name."""
    t = f"persistent://public/default/{topic_name()}"
    silent = _raw_producer(bp, [(t, 1, 1, "p")])  # holds p, then reads and answers nothing
    try:
        assert _answers(silent, 1) == {1: "PRODUCER_SUCCESS"}
        raw = _raw_producer(bp, [(t, i, i, "p") for i in (1, 2, 3)])
        with contextlib.closing(raw):
            dec, pings = wire.FrameDecoder(), 0
            while data := silent.recv(65536):  # until the broker closes it, its PING unanswered
                pings += sum(f.command.type == T.PING for f in dec.feed(data))
            answers = sorted(_answers(raw, 3).values())
        assert pings == 1
        assert answers == ["PRODUCER_SUCCESS", "ProducerBusy", "ProducerBusy"]
    finally:
        silent.close()


def test_a_producer_or_consumer_closed_while_being_created_is_not_left_behind(
    bp: BrokerProcess, c: Any
) -> None:
    """A CLOSE_PRODUCER (CLOSE_CONSUMER) that comes while its PRODUCER (SUBSCRIBE) is handled, as a client whose
    request timed out sends it, ends the creation with the id closed, as Pulsar's broker does: the request is
    answered ServiceNotReady, and nothing is left holding the name or the subscription. Before, the close was
    answered SUCCESS for an id not there yet, and the producer (consumer) created after it held the name (the
    Exclusive subscription) until the connection closed."""
    t = f"persistent://public/default/{topic_name()}"
    raw = socket.create_connection(("127.0.0.1", bp.port), timeout=30)
    with contextlib.closing(raw):
        producer = pb.CommandProducer(topic=t, producer_id=1, request_id=1, producer_name="p")
        sub = pb.CommandSubscribe(
            topic=t, subscription="s", subType=pb.CommandSubscribe.Exclusive, consumer_id=1, request_id=3
        )
        frames = [
            T(type=T.CONNECT, connect=pb.CommandConnect(client_version="t", protocol_version=20)),
            T(type=T.PRODUCER, producer=producer),
            T(type=T.CLOSE_PRODUCER, close_producer=pb.CommandCloseProducer(producer_id=1, request_id=2)),
            T(type=T.SUBSCRIBE, subscribe=sub),
            T(type=T.CLOSE_CONSUMER, close_consumer=pb.CommandCloseConsumer(consumer_id=1, request_id=4)),
        ]
        raw.sendall(
            b"".join(wire.encode_command(f) for f in frames)
        )  # at once: each close behind its request
        assert _answers(raw, 4) == {1: "ServiceNotReady", 2: "SUCCESS", 3: "ServiceNotReady", 4: "SUCCESS"}
        # the raw connection still open: it has no producer or consumer on the topic, the name and the
        # Exclusive subscription are free
        stats = _stats(bp, t)
        assert (stats["publishers"], stats["subscriptions"]["s"]["consumers"]) == ([], [])
        c.create_producer(t, producer_name="p").send(b"p is free")
        c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.Exclusive).close()


def test_examined_message_headers_carry_event_time_ordering_key_and_schema_version(
    bp: BrokerProcess, c: Any
) -> None:
    """examinemessage (and peek) answer the event time, the ordering key and the schema version in Pulsar's
    headers, which Pulsar's admin client reads back into the message (before: left out)."""
    from pulsar.schema import StringSchema

    t = f"persistent://public/default/{topic_name()}"
    producer = c.create_producer(t, schema=StringSchema(), batching_enabled=False)
    producer.send("hello", event_timestamp=1_700_000_000_123, ordering_key="order-7")
    path = f"/admin/v2/persistent/public/default/{t.rsplit('/', 1)[-1]}"
    url = f"http://127.0.0.1:{bp.http_port}{path}/examinemessage?initialPosition=earliest&messagePosition=1"
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.read() == b"hello"
        assert r.headers["X-Pulsar-event-time"] == "2023-11-14T22:13:20.123Z"
        assert base64.b64decode(r.headers["X-Pulsar-Base64-ordering-key"]) == b"order-7"
        assert base64.b64decode(r.headers["X-Pulsar-Base64-schema-version"]) == (0).to_bytes(8, "big")


def test_a_message_whose_event_time_is_past_year_9999_is_examined(bp: BrokerProcess, c: Any) -> None:
    """An event time past year 9999 (microseconds given where milliseconds are meant, a common slip) is written
    as Pulsar's admin writes it, the year signed ('+55840-…', Java's ISO format); before, writing the header
    raised 'year 55840 is out of range' and examinemessage, peek and a message by id answered 500."""
    t = f"persistent://public/default/{topic_name()}"
    c.create_producer(t, batching_enabled=False).send(b"late", event_timestamp=1_700_000_000_123_456)
    path = f"/admin/v2/persistent/public/default/{t.rsplit('/', 1)[-1]}"
    url = f"http://127.0.0.1:{bp.http_port}{path}/examinemessage?initialPosition=earliest&messagePosition=1"
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.read() == b"late"
        assert r.headers["X-Pulsar-event-time"] == "+55840-11-08T22:15:23.456Z"


def test_a_subscribe_repeated_before_the_first_is_answered_is_refused_until_it_is(
    bp: BrokerProcess, c: Any
) -> None:
    """Two SUBSCRIBEs of one consumer id sent at once (a client resending before its answer) make one consumer,
    as Pulsar's ServerCnx: the second, come while the first is pending, is refused ServiceNotReady ("Consumer is
    already present on the connection", the client retries); once the first is attached, a third is answered
    SUCCESS as a repeat. Before, the second waited for the first and was answered SUCCESS; before that, both
    were attached and the first stayed on the Exclusive subscription after the connection closed."""
    t = f"persistent://public/default/{topic_name()}"
    raw = socket.create_connection(("127.0.0.1", bp.port), timeout=30)
    with contextlib.closing(raw):

        def subscribe(request_id: int) -> bytes:
            sub = pb.CommandSubscribe(
                topic=t,
                subscription="s",
                subType=pb.CommandSubscribe.Exclusive,
                consumer_id=1,
                request_id=request_id,
            )
            return wire.encode_command(T(type=T.SUBSCRIBE, subscribe=sub))

        connect = pb.CommandConnect(client_version="t", protocol_version=20)
        # at once: the second is read while the first waits for the topic and cursor
        raw.sendall(wire.encode_command(T(type=T.CONNECT, connect=connect)) + subscribe(1) + subscribe(2))
        assert _answers(raw, 2) == {1: "SUCCESS", 2: "ServiceNotReady"}
        raw.sendall(subscribe(3))
        assert _answers(raw, 1) == {3: "SUCCESS"}
        assert len(_stats(bp, t)["subscriptions"]["s"]["consumers"]) == 1
    got: list[Any] = []  # the connection's close reaches the broker a moment later
    wait_for(lambda: got.append(_subscribed_or_none(c, t)) or got[-1] is not None, "the subscription free")
    got[-1].close()


def test_a_producer_repeated_before_the_first_is_answered_is_refused_until_it_is(bp: BrokerProcess) -> None:
    """Two PRODUCERs of one producer id sent at once: the second, come while the first is pending, is refused
    ServiceNotReady ("Producer is already present on the connection"), as Pulsar's ServerCnx; once the first is
    created, a third is answered PRODUCER_SUCCESS with the first one's name. Before, the second waited for the
    first and was answered PRODUCER_SUCCESS."""
    t = f"persistent://public/default/{topic_name()}"
    raw = _raw_producer(bp, [(t, 1, 1, "p"), (t, 1, 2, "p")])  # at once: the second while the topic opens
    with contextlib.closing(raw):
        assert _answers(raw, 2) == {1: "PRODUCER_SUCCESS", 2: "ServiceNotReady"}
        cmd = pb.CommandProducer(topic=t, producer_id=1, request_id=3)  # no name asked: the first one's given
        raw.sendall(wire.encode_command(T(type=T.PRODUCER, producer=cmd)))
        dec = wire.FrameDecoder()
        while not (frames := dec.feed(raw.recv(65536))):
            pass
        (answer,) = frames
        assert answer.command.type == T.PRODUCER_SUCCESS
        assert (
            answer.command.producer_success.request_id,
            answer.command.producer_success.producer_name,
        ) == (3, "p")
        assert [p["producerName"] for p in _stats(bp, t)["publishers"]] == ["p"]


def _subscribed_or_none(c: Any, t: str) -> Any:
    try:
        return c.subscribe(t, "s", consumer_type=pulsar.ConsumerType.Exclusive)
    except pulsar.ConsumerBusy:
        return None


def test_a_message_whose_property_holds_a_line_break_is_examined(bp: BrokerProcess, c: Any) -> None:
    """A property value (or producer name, or key) holding CR or LF is answered with them written as spaces, as
    Pulsar's HTTP server writes them, and a property key no header name may hold is percent-encoded; before,
    aiohttp refused to write a line break (examinemessage, peek and a message by id answered 500), and a space in
    a key ended the headers the client parsed."""
    t = f"persistent://public/default/{topic_name()}"
    p = c.create_producer(t, batching_enabled=False)
    p.send(
        b"multi",
        properties={"note": "line one\nline two", "k\r\nx": "v", "plain": "ok", "ключ": "значение"},
        partition_key="a\nb",
    )
    path = f"/admin/v2/persistent/public/default/{t.rsplit('/', 1)[-1]}"
    url = f"http://127.0.0.1:{bp.http_port}{path}/examinemessage?initialPosition=earliest&messagePosition=1"
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.read() == b"multi"
        assert r.headers["X-Pulsar-PROPERTY-note"] == "line one line two"
        assert r.headers["X-Pulsar-PROPERTY-plain"] == "ok"
        assert r.headers["X-Pulsar-PROPERTY-k%0D%0Ax"] == "v"  # a name's line break percent-encoded
        assert r.headers["X-Pulsar-partition-key"] == "a b"
        assert (
            r.headers["X-Pulsar-PROPERTY-%D0%BA%D0%BB%D1%8E%D1%87"].encode("latin-1").decode() == "значение"
        )
