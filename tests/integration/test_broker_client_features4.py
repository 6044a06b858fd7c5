"""The topic broker as users of the official ``pulsar-client`` meet it, fourth part: end-to-end encryption and
each ``ConsumerCryptoFailureAction``, ``is_connected``, ``get_service_info``, ``client.close()`` with live
producers and consumers, paused listeners, ``redeliver_unacknowledged_messages``, ``flush`` while the owning
broker is killed, ``get_last_message_id`` across ledger rollovers, a consumer gone in the middle of a chunked
message, and ``max_total_receiver_queue_size_across_partitions``.

One broker on 3 bookies is shared by the module; it rolls its ledgers every 4 entries and announces a 16 KiB
message size, so that rollovers and chunks come cheaply. Every test uses its own topics; every wait is bounded."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, module_cluster
from tests.integration.test_broker_client_features3 import bp, c, receive_all
from tests.integration.test_broker_pulsar_client import _connect, _raw, client, drain, topic_name
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire

pulsar = pytest.importorskip("pulsar")
__all__ = ["bp", "c"]  # the fixtures of the third part, on this module's broker

T = pb.BaseCommand
MAX_MESSAGE_SIZE = 16 * 1024
ENTRIES_PER_LEDGER = 4


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    args = ("--max-entries-per-ledger", str(ENTRIES_PER_LEDGER), "--min-rollover-time-s", "0")
    args += ("--max-message-size", str(MAX_MESSAGE_SIZE))
    with module_cluster(zk_server, tmp_path_factory.mktemp("features4"), *args) as b:
        yield b


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two RSA key pairs made with ``openssl``, as ``CryptoKeyReader`` objects ("right" and "wrong")."""
    d = tmp_path_factory.mktemp("keys")
    out = {}
    for name in ("right", "wrong"):
        private, public = d / f"{name}.pem", d / f"{name}.pub.pem"
        subprocess.run(["openssl", "genrsa", "-out", str(private), "2048"], check=True, capture_output=True)
        subprocess.run(
            ["openssl", "rsa", "-in", str(private), "-pubout", "-out", str(public)],
            check=True,
            capture_output=True,
        )
        out[name] = pulsar.CryptoKeyReader(str(public), str(private))
    return out


def topic_stats(bp: BrokerProcess, t: str) -> Any:
    local = t.rsplit("/", 1)[-1]
    url = f"http://127.0.0.1:{bp.http_port}/admin/v2/persistent/public/default/{local}/stats"
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def wait_for(predicate: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- end-to-end encryption ----------------------------------------------------------------------------------


def test_end_to_end_encryption_and_each_crypto_failure_action(bp: BrokerProcess, c: Any, keys: Any) -> None:
    """The broker stores and delivers encrypted payloads as sent: a consumer and a reader with the key read the
    plain text (single messages and a batch), with the producer's properties; one without the key gets what its
    ``crypto_failure_action`` says: FAIL nothing (the messages stay in its backlog), DISCARD nothing (the client
    acknowledges them, so its backlog empties), CONSUME the cipher text with ``is_decryption_failed()``, a batch
    as one undecoded message; with the wrong key, CONSUME likewise."""
    t = f"persistent://public/default/{topic_name()}"
    earliest = pulsar.InitialPosition.Earliest
    A = pulsar.ConsumerCryptoFailureAction
    good = c.subscribe(t, "good", crypto_key_reader=keys["right"], initial_position=earliest)
    keyless = {
        a: c.subscribe(t, f"no-key-{a.name}", crypto_failure_action=a) for a in (A.FAIL, A.DISCARD, A.CONSUME)
    }
    wrong = c.subscribe(t, "wrong-key", crypto_key_reader=keys["wrong"], crypto_failure_action=A.CONSUME)
    single = c.create_producer(t, encryption_key="k1", crypto_key_reader=keys["right"])
    for i in range(3):
        single.send(f"secret-{i}".encode(), properties={"i": str(i)})
    batched = c.create_producer(
        t,
        encryption_key="k1",
        crypto_key_reader=keys["right"],
        batching_enabled=True,
        batching_max_publish_delay_ms=50,
    )
    for i in range(3):
        batched.send_async(f"batched-{i}".encode(), lambda res, mid: None)
    batched.flush()
    expected = [b"secret-0", b"secret-1", b"secret-2", b"batched-0", b"batched-1", b"batched-2"]

    got = drain(good, 6)
    assert [m.data() for m in got] == expected
    assert got[0].properties() == {"i": "0"}
    ctx = got[0].encryption_context()
    assert ctx is not None and not ctx.is_decryption_failed() and [k.key for k in ctx.keys()]  # noqa: SIM118 == ["k1"]
    for m in got:
        good.acknowledge(m)
    reader = c.create_reader(t, pulsar.MessageId.earliest, crypto_key_reader=keys["right"])
    assert [reader.read_next(10_000).data() for _ in range(6)] == expected

    assert receive_all(keyless[A.FAIL], 1000) == []
    assert receive_all(keyless[A.DISCARD], 1000) == []
    for undecoded in (
        drain(keyless[A.CONSUME], 4),
        drain(wrong, 4),
    ):  # 3 single messages and the batch, whole
        assert all(m.encryption_context().is_decryption_failed() for m in undecoded)
        assert all(m.data() not in expected for m in undecoded)
        assert undecoded[3].encryption_context().batch_size() == 3
    subs = topic_stats(bp, t)["subscriptions"]
    wait_for(
        lambda: topic_stats(bp, t)["subscriptions"][f"no-key-{A.DISCARD.name}"]["msgBacklog"] == 0, "discard"
    )
    assert subs[f"no-key-{A.FAIL.name}"]["msgBacklog"] == 6

    t2 = topic_name()
    keyless_again = c.subscribe(t2, "s", crypto_failure_action=A.FAIL)
    c.create_producer(t2, encryption_key="k1").send(b"no key reader")  # no key to encrypt with: sent plain
    m = keyless_again.receive(10_000)
    assert m.data() == b"no key reader" and m.encryption_context() is None


# -- connection state, service info, close --------------------------------------------------------------------


def test_is_connected_service_info_and_a_client_closed_with_producers_and_consumers_open(
    bp: BrokerProcess,
) -> None:
    """``is_connected()`` is true on a live producer, consumer and reader and false after ``client.close()``,
    which closes them on the broker too (no publisher, no consumer left in the stats; a reader's subscription is
    gone): the same exclusive subscription and producer name are free at once for another client. Afterwards
    every call on the closed objects raises ``AlreadyClosed`` (``consumer.close()`` is a no-op)."""
    c = client(bp)
    t = f"persistent://public/default/{topic_name()}"
    assert c.get_service_info().service_url == bp.service_url
    assert c.get_service_info().use_tls is False
    consumer = c.subscribe(t, "x")
    producer = c.create_producer(t, producer_name="only-one", access_mode=pulsar.ProducerAccessMode.Exclusive)
    reader = c.create_reader(t, pulsar.MessageId.earliest)
    producer.send(b"1")
    assert producer.is_connected() and consumer.is_connected() and reader.is_connected()
    stats = topic_stats(bp, t)
    assert len(stats["publishers"]) == 1 and len(stats["subscriptions"]) == 2
    c.close()
    assert not producer.is_connected() and not consumer.is_connected() and not reader.is_connected()
    wait_for(lambda: topic_stats(bp, t)["publishers"] == [], "the producer's close")
    subs = topic_stats(bp, t)["subscriptions"]
    assert list(subs) == ["x"] and subs["x"]["consumers"] == []
    for call in (
        lambda: producer.send(b"2"),
        lambda: producer.flush(),
        lambda: consumer.receive(100),
        lambda: reader.read_next(100),
        lambda: c.subscribe(t, "y"),
    ):
        with pytest.raises(pulsar.AlreadyClosed):
            call()
    consumer.close()
    other = client(bp)
    try:
        other.subscribe(t, "x")
        other.create_producer(t, producer_name="only-one", access_mode=pulsar.ProducerAccessMode.Exclusive)
    finally:
        other.close()


# -- listeners and redelivery ---------------------------------------------------------------------------------


def test_a_paused_listener_gets_nothing_until_resumed(bp: BrokerProcess, c: Any) -> None:
    got: list[bytes] = []

    def listener(consumer: Any, m: Any) -> None:
        got.append(m.data())
        consumer.acknowledge(m)

    t = f"persistent://public/default/{topic_name()}"
    consumer = c.subscribe(t, "s", message_listener=listener, receiver_queue_size=5)
    producer = c.create_producer(t)
    producer.send(b"first")
    wait_for(lambda: got == [b"first"], "the first message")
    consumer.pause_message_listener()
    for i in range(12):
        producer.send(b"%d" % i)
    time.sleep(1.5)
    assert got == [b"first"]
    assert topic_stats(bp, t)["subscriptions"]["s"]["msgBacklog"] == 12
    consumer.resume_message_listener()
    wait_for(lambda: len(got) == 13, "the messages after the resume")
    assert got[1:] == [b"%d" % i for i in range(12)]
    wait_for(lambda: topic_stats(bp, t)["subscriptions"]["s"]["msgBacklog"] == 0, "the acks")


@pytest.mark.parametrize("sub_type", ["Exclusive", "Failover", "Shared", "KeyShared"])
def test_redeliver_unacknowledged_messages_sends_back_what_was_not_acked(c: Any, sub_type: str) -> None:
    """What was received and not acknowledged comes again, in order, the acknowledged message not; the
    redelivery count grows on Shared and Key_Shared only (as in Pulsar)."""
    t = topic_name()
    consumer = c.subscribe(t, "s", consumer_type=getattr(pulsar.ConsumerType, sub_type))
    producer = c.create_producer(t)
    for i in range(6):
        producer.send(b"%d" % i)
    first = drain(consumer, 6)
    consumer.acknowledge(first[1])
    consumer.redeliver_unacknowledged_messages()
    again = drain(consumer, 5)
    assert receive_all(consumer, 500) == []
    assert [m.data() for m in again] == [b"0", b"2", b"3", b"4", b"5"]
    counted = sub_type in ("Shared", "KeyShared")
    assert {m.redelivery_count() for m in again} == ({1} if counted else {0})


# -- producers when the broker goes away ----------------------------------------------------------------------


class Callbacks:
    """``send_async`` callbacks that record each message's result and id."""

    def __init__(self) -> None:
        self.results: dict[int, tuple[Any, Any]] = {}
        self.lock = threading.Lock()

    def send(self, producer: Any, i: int) -> None:
        def done(res: Any, mid: Any) -> None:
            with self.lock:
                self.results[i] = (res, mid)

        producer.send_async(b"%d" % i, done)

    def confirmed(self) -> set[int]:
        with self.lock:
            return {
                i for i, (res, mid) in self.results.items() if res == pulsar.Result.Ok and mid is not None
            }


def test_flush_while_the_owning_broker_goes_away_fires_every_callback(
    brokers: Brokers, bp: BrokerProcess
) -> None:
    """Two topics owned by a second broker, which is stopped while sends are pending. A producer whose client
    knows the surviving broker: ``flush`` returns once every callback fired, each with a message id (the
    survivor takes the topic over, the client resends), and every message is on the topic once. A producer
    whose client knows only the stopped broker: every callback fires with ``Timeout`` after the send timeout
    (``flush`` then returns or raises ``Timeout``, as the client's timing has it)."""
    doomed = brokers.start()
    moved, stranded = (f"persistent://public/default/{topic_name()}" for _ in range(2))
    c, only_doomed = client(bp), client(doomed)
    try:
        only_doomed.create_producer(moved).close()  # a lookup through the doomed broker makes it the owner
        check = c.subscribe(moved, "check")  # without a subscription the messages would be trimmed
        to_survivor = c.create_producer(moved, batching_enabled=False)
        to_nowhere = only_doomed.create_producer(stranded, batching_enabled=False, send_timeout_millis=3000)
        survivor_cbs, nowhere_cbs = Callbacks(), Callbacks()
        n = 40
        for i in range(n):
            survivor_cbs.send(to_survivor, i)
            nowhere_cbs.send(to_nowhere, i)
            if i == 10:
                doomed.stop()
        to_survivor.flush()
        assert to_survivor.is_connected()  # to the survivor
        wait_for(lambda: not to_nowhere.is_connected(), "the stranded producer's disconnection")
        with contextlib.suppress(pulsar.Timeout):
            to_nowhere.flush()  # the client's own: it raises Timeout or returns once the messages failed
        wait_for(lambda: len(survivor_cbs.results) == n and len(nowhere_cbs.results) == n, "every callback")
        assert survivor_cbs.confirmed() == set(range(n))
        assert {res for res, _ in nowhere_cbs.results.values() if res != pulsar.Result.Ok} == {
            pulsar.Result.Timeout
        }
        assert sorted(int(m.data()) for m in drain(check, n)) == list(range(n))
        with pytest.raises(pulsar.Timeout):
            check.receive(500)
    finally:
        c.close()
        only_doomed.close()
        brokers.procs.remove(doomed)


# -- last message id across rollovers --------------------------------------------------------------------------


def internal_stats(bp: BrokerProcess, t: str) -> Any:
    local = t.rsplit("/", 1)[-1]
    url = f"http://127.0.0.1:{bp.http_port}/admin/v2/persistent/public/default/{local}/internalStats"
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_last_message_id_across_ledger_rollovers_and_on_an_empty_current_ledger(
    bp: BrokerProcess, c: Any
) -> None:
    """The topic rolls its ledger every 4 entries, and the broker's housekeeping rolls a full one while idle, so
    the current ledger is empty: ``get_last_message_id`` still names the last message sent (in the ledger
    before); a reader at it has no message available, a new subscription at ``latest`` gets nothing old, and a
    reader at ``latest`` inclusive reads the last message (the client seeks there in ``has_message_available()``:
    a reader that never asks starts after it, with Pulsar's broker too)."""
    t = f"persistent://public/default/{topic_name()}"
    consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = c.create_producer(t, batching_enabled=False)
    ids = [producer.send(b"%d" % i) for i in range(ENTRIES_PER_LEDGER * 3)]
    assert len({m.ledger_id() for m in ids}) == 3
    wait_for(lambda: internal_stats(bp, t)["currentLedgerEntries"] == 0, "the idle full ledger's rollover")
    assert len(internal_stats(bp, t)["ledgers"]) == 4
    last = consumer.get_last_message_id()
    assert (last.ledger_id(), last.entry_id()) == (ids[-1].ledger_id(), ids[-1].entry_id())
    got = drain(consumer, len(ids))
    assert [m.data() for m in got] == [b"%d" % i for i in range(len(ids))]
    consumer.acknowledge_cumulative(got[-1])
    wait_for(lambda: topic_stats(bp, t)["subscriptions"]["s"]["msgBacklog"] == 0, "the cumulative ack")
    reader = c.create_reader(t, ids[-1])
    assert not reader.has_message_available()
    at_latest = c.subscribe(t, "new", initial_position=pulsar.InitialPosition.Latest)
    assert not c.create_reader(t, pulsar.MessageId.latest).has_message_available()
    inclusive = c.create_reader(t, pulsar.MessageId.latest, start_message_id_inclusive=True)
    assert inclusive.has_message_available()  # the C++ client seeks to the last message id here, not before
    assert inclusive.read_next(10_000).data() == b"%d" % (len(ids) - 1)
    producer.send(b"one more")
    assert reader.has_message_available()
    assert reader.read_next(10_000).data() == b"one more"
    assert at_latest.receive(10_000).data() == b"one more"
    assert consumer.receive(10_000).data() == b"one more"


def read_or_none(reader: Any) -> bytes | None:
    try:
        return reader.read_next(2000).data()  # type: ignore[no-any-return]
    except pulsar.Timeout:
        return None


def test_seek_after_reading_repositions_readers_and_consumers(c: Any) -> None:
    """A reader that already read (and prefetched) messages seeks: to a message id it goes on after that message,
    to ``earliest`` from the first. A consumer seeks by id, then by time to the first message. The broker closes
    the consumers before it answers the seek, as Pulsar does: a client answered first takes the reconnection for
    an ordinary one, and a reader resubscribes after what it last read (its seek lost)."""
    t = topic_name()
    producer = c.create_producer(t, batching_enabled=False)
    ids = [producer.send(b"%d" % i) for i in range(6)]
    for target, expected in (
        (ids[1], [b"2", b"3"]),
        (ids[4], [b"5", None]),
        (pulsar.MessageId.earliest, [b"0", b"1"]),
    ):
        reader = c.create_reader(t, pulsar.MessageId.earliest)
        assert [read_or_none(reader) for _ in range(3)] == [b"0", b"1", b"2"]
        reader.seek(target)
        assert [read_or_none(reader) for _ in range(2)] == expected
        reader.close()
    consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
    assert [m.data() for m in drain(consumer, 3)] == [b"0", b"1", b"2"]
    consumer.seek(ids[1])
    assert [m.data() for m in drain(consumer, 2)] == [b"2", b"3"]
    consumer.seek(0)
    assert [m.data() for m in drain(consumer, 2)] == [b"0", b"1"]


def test_a_consumer_of_a_topic_list_seeks_by_time_and_to_earliest(c: Any) -> None:
    a = topic_name()
    b = f"{a}-b"
    for t in (a, b):
        producer = c.create_producer(t)
        for i in range(3):
            producer.send(f"{t}-{i}".encode())
    everything = sorted(f"{t}-{i}".encode() for t in (a, b) for i in range(3))
    consumer = c.subscribe([a, b], "s", initial_position=pulsar.InitialPosition.Earliest)
    assert sorted(m.data() for m in drain(consumer, 6)) == everything
    consumer.seek(0)
    assert sorted(m.data() for m in drain(consumer, 6)) == everything
    consumer.seek(pulsar.MessageId.earliest)
    assert sorted(m.data() for m in drain(consumer, 6)) == everything
    assert receive_all(consumer, 500) == []


def test_regex_subscription_modes(c: Any) -> None:
    """``regex_subscription_mode``: PersistentOnly and AllTopics find the matching topics, NonPersistentOnly none
    (the broker answers GET_TOPICS_OF_NAMESPACE by its mode, as Pulsar; it has no non-persistent topics)."""
    prefix = topic_name()
    for suffix in ("a", "b"):
        c.create_producer(f"{prefix}-{suffix}").send(suffix.encode())
    pattern = re.compile(f"persistent://public/default/{prefix}-.*")
    M = pulsar.RegexSubscriptionMode
    got = {}
    for mode in (M.PersistentOnly, M.NonPersistentOnly, M.AllTopics):
        consumer = c.subscribe(
            pattern,
            f"s-{mode.name}",
            regex_subscription_mode=mode,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        got[mode] = sorted(m.data() for m in receive_all(consumer, 1000))
    assert got == {M.PersistentOnly: [b"a", b"b"], M.NonPersistentOnly: [], M.AllTopics: [b"a", b"b"]}


def test_acks_by_id_reader_names_sequence_ids_and_shutdown(bp: BrokerProcess) -> None:
    """Acknowledging and negatively acknowledging by ``MessageId``; a reader's ``reader_name`` is its consumer
    name and ``subscription_role_prefix`` starts its subscription name; ``initial_sequence_id`` numbers the
    producer's messages after it; ``replication_clusters`` and ``disable_replication`` are accepted (there is
    no geo-replication); after ``client.shutdown()`` the producer raises ``AlreadyClosed``."""
    c = client(bp)
    t = f"persistent://public/default/{topic_name()}"
    consumer = c.subscribe(
        t, "s", consumer_type=pulsar.ConsumerType.Shared, negative_ack_redelivery_delay_ms=100
    )
    producer = c.create_producer(t, initial_sequence_id=100, batching_enabled=False)
    for i in range(3):
        producer.send(b"%d" % i, replication_clusters=["elsewhere"], disable_replication=i == 0)
    assert producer.last_sequence_id() == 103
    first, second, third = drain(consumer, 3)
    consumer.acknowledge(first.message_id())
    consumer.negative_acknowledge(second.message_id())
    again = consumer.receive(10_000)
    assert (again.data(), again.redelivery_count()) == (b"1", 1)
    consumer.acknowledge(again.message_id())
    consumer.acknowledge(third.message_id())
    wait_for(lambda: topic_stats(bp, t)["subscriptions"]["s"]["msgBacklog"] == 0, "the acks by id")
    reader = c.create_reader(
        t, pulsar.MessageId.earliest, reader_name="my-reader", subscription_role_prefix="pfx"
    )
    assert reader.read_next(10_000).data() == b"0"
    names = {
        k: [x["consumerName"] for x in v["consumers"]] for k, v in topic_stats(bp, t)["subscriptions"].items()
    }
    assert [v for k, v in names.items() if k.startswith("pfx-reader-")] == [["my-reader"]]
    c.shutdown()
    with pytest.raises(pulsar.AlreadyClosed):
        producer.send(b"late")
    c.close()


# -- chunks -------------------------------------------------------------------------------------------------


def _frames_until(s: Any, dec: wire.FrameDecoder, n: int, kind: int) -> list[Any]:
    got: list[Any] = []
    while len([f for f in got if f.command.type == kind]) < n:
        data = s.recv(1 << 20)
        assert data, "connection closed"
        got += dec.feed(data)
    return [f for f in got if f.command.type == kind]


def test_a_consumer_gone_in_the_middle_of_a_chunked_message_leaves_it_whole_for_the_next(
    bp: BrokerProcess, c: Any
) -> None:
    """A consumer that took the first 2 chunks of a message (flow permits for 2) and vanished: the next consumer
    of the subscription gets the message whole, and the message after it."""
    t = f"persistent://public/default/{topic_name()}"
    c.subscribe(t, "s").close()
    producer = c.create_producer(t, batching_enabled=False, chunking_enabled=True)
    big = bytes(range(256)) * (5 * MAX_MESSAGE_SIZE // 256)
    producer.send(big)
    producer.send(b"after")

    s = _raw(bp)
    _connect(s)
    sub = pb.CommandSubscribe(topic=t, subscription="s", subType=pb.CommandSubscribe.Exclusive)
    sub.consumer_id, sub.request_id = 1, 1
    s.sendall(wire.encode_command(T(type=T.SUBSCRIBE, subscribe=sub)))
    dec = wire.FrameDecoder()
    _frames_until(s, dec, 1, T.SUCCESS)
    s.sendall(wire.encode_command(T(type=T.FLOW, flow=pb.CommandFlow(consumer_id=1, messagePermits=2))))
    assert len(_frames_until(s, dec, 2, T.MESSAGE)) == 2
    s.close()

    consumer = c.subscribe(t, "s")
    got = drain(consumer, 2)
    assert got[0].data() == big and got[1].data() == b"after"
    consumer.acknowledge_cumulative(got[1])


def test_interleaved_chunked_messages_over_max_pending_chunked_message(bp: BrokerProcess, c: Any) -> None:
    """Two producers' chunked messages interleaved on the topic (A0 B0 A1 B1, sent raw): a consumer with room
    for both assembles both; one with ``max_pending_chunked_message=1`` drops the older, A, when B starts (the
    client's own): with ``auto_ack_oldest_chunked_message_on_queue_full`` it acknowledges A's first chunk and A
    is lost (its last chunk stays in the backlog, unassemblable); without, A's chunks stay unacknowledged and
    ``redeliver_unacknowledged_messages`` brings A back whole."""
    t = f"persistent://public/default/{topic_name()}"
    roomy = c.subscribe(t, "roomy")
    auto = c.subscribe(
        t, "auto", max_pending_chunked_message=1, auto_ack_oldest_chunked_message_on_queue_full=True
    )
    keep = c.subscribe(t, "keep", max_pending_chunked_message=1)

    s = _raw(bp)
    _connect(s)
    dec = wire.FrameDecoder()
    names = {}
    for pid in (1, 2):
        cmd = pb.CommandProducer(topic=t, producer_id=pid, request_id=pid)
        s.sendall(wire.encode_command(T(type=T.PRODUCER, producer=cmd)))
        names[pid] = _frames_until(s, dec, 1, T.PRODUCER_SUCCESS)[0].command.producer_success.producer_name
    parts = {1: [b"aaaa", b"AAAA"], 2: [b"bbbb", b"BBBB"]}
    for chunk_id, pid in ((0, 1), (0, 2), (1, 1), (1, 2)):
        md = pb.MessageMetadata(producer_name=names[pid], sequence_id=0, publish_time=int(time.time() * 1000))
        md.uuid, md.chunk_id, md.num_chunks_from_msg, md.total_chunk_msg_size = (
            f"{names[pid]}-0",
            chunk_id,
            2,
            8,
        )
        send = T(type=T.SEND, send=pb.CommandSend(producer_id=pid, sequence_id=0, is_chunk=True))
        s.sendall(wire.encode_send(send, md, parts[pid][chunk_id]))
        _frames_until(s, dec, 1, T.SEND_RECEIPT)
    s.close()

    assert [m.data() for m in drain(roomy, 2)] == [b"aaaaAAAA", b"bbbbBBBB"]
    for consumer in (auto, keep):
        got = drain(consumer, 1)
        assert [m.data() for m in got] == [b"bbbbBBBB"]
        consumer.acknowledge(got[0])
    assert receive_all(auto, 500) == receive_all(keep, 500) == []
    wait_for(
        lambda: topic_stats(bp, t)["subscriptions"]["auto"]["msgBacklogEntries"] == 1, "A's first chunk acked"
    )
    wait_for(lambda: topic_stats(bp, t)["subscriptions"]["keep"]["msgBacklogEntries"] == 2, "B acked, A kept")
    keep.redeliver_unacknowledged_messages()
    assert [m.data() for m in drain(keep, 1)] == [b"aaaaAAAA"]
    auto.redeliver_unacknowledged_messages()
    assert receive_all(auto, 1000) == []


def test_max_total_receiver_queue_size_across_partitions_delivers_everything(
    bp: BrokerProcess, c: Any
) -> None:
    """A consumer of 4 partitions with a total queue of 8 (2 per partition) gets every message, each
    partition's in order."""
    t = topic_name()
    req = urllib.request.Request(
        f"http://127.0.0.1:{bp.http_port}/admin/v2/persistent/public/default/{t}/partitions",
        data=b"4",
        method="PUT",
    )
    req.add_header("Content-Type", "application/json")
    urllib.request.urlopen(req, timeout=30).close()
    consumer = c.subscribe(t, "s", receiver_queue_size=100, max_total_receiver_queue_size_across_partitions=8)
    producer = c.create_producer(t, batching_enabled=False)
    for i in range(120):
        producer.send_async(b"%d" % i, lambda res, mid: None, partition_key=f"k{i % 7}")
    producer.flush()
    got = drain(consumer, 120)
    by_key: dict[str, list[int]] = {}
    for m in got:
        by_key.setdefault(m.partition_key(), []).append(int(m.data()))
        consumer.acknowledge(m)
    assert sorted(int(m.data()) for m in got) == list(range(120))
    assert all(v == sorted(v) for v in by_key.values())
