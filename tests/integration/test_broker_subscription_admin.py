"""Moving a subscription by hand, as Pulsar users do with pulsar-admin: peek (``…/subscription/{s}/position/{n}``),
skip (``…/skip/{n}``), expire-messages (``…/expireMessages/{s}``, ``…/all_subscription/expireMessages/{s}``),
through the admin REST and ``ledgerstore topic peek|skip|expire-messages[-all-subscriptions]``, and the namespace
message TTL (``…/namespaces/{t}/{ns}/messageTTL``, ``ledgerstore namespace set-message-ttl``) applied by the
broker by itself, and terminate (``…/terminate``, ``ledgerstore topic terminate``), seen by the official
``pulsar-client``. One broker on 3 bookies (expiry check every 0.5 s) is shared by the module; terminate, which
moves its topic to another broker, has brokers of its own."""

from __future__ import annotations

import contextlib
import datetime
import json
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, in_process_broker, module_cluster
from tests.integration.test_broker_admin import call, ledgerstore, ok, web
from tests.integration.test_broker_compaction import wait_for
from tests.integration.test_broker_pulsar_client import client

pulsar = pytest.importorskip("pulsar")

T = "/admin/v2/persistent/public/default"


@pytest.fixture(scope="module")
def bp(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with module_cluster(
        zk_server, tmp_path_factory.mktemp("subadmin"), "--message-expiry-check-interval-s", "0.5"
    ) as b:
        yield b.procs[0]


@pytest.fixture
def c(bp: BrokerProcess) -> Iterator[Any]:
    with contextlib.closing(client(bp)) as pulsar_client:
        yield pulsar_client


def name() -> str:
    return f"sa-{uuid.uuid4().hex[:8]}"


def peek(bp: BrokerProcess, t: str, sub: str, n: int) -> tuple[int, bytes, Any]:
    """(status, body bytes, headers) of ``GET …/subscription/{sub}/position/{n}``."""
    req = urllib.request.Request(f"{web(bp)}{T}/{t}/subscription/{sub}/position/{n}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def backlog(bp: BrokerProcess, t: str, sub: str) -> int:
    return int(ok(bp, "GET", f"{T}/{t}/stats")["subscriptions"][sub]["msgBacklog"])


def cli(bp: BrokerProcess, *args: str) -> Any:
    r = ledgerstore("topic", *args, "--url", web(bp), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_peek_shows_the_unacknowledged_messages_and_moves_nothing(bp: BrokerProcess, c: Any) -> None:
    t = name()
    full = f"persistent://public/default/{t}"
    ok(bp, "PUT", f"{T}/{t}")
    ok(bp, "PUT", f"{T}/{t}/subscription/s", "earliest")
    producer = c.create_producer(full, batching_enabled=False)
    for i in range(10):
        producer.send(f"m-{i}".encode(), properties={"i": str(i)}, partition_key=f"k{i}")

    status, body, headers = peek(bp, t, "s", 1)
    assert status == 200 and body == b"m-0"
    assert headers["X-Pulsar-PROPERTY-i"] == "0" and headers["X-Pulsar-partition-key"] == "k0"
    assert headers["X-Pulsar-Message-ID"].count(":") == 2
    published = datetime.datetime.fromisoformat(headers["X-Pulsar-publish-time"])  # ISO 8601, as Pulsar's
    assert abs(published.timestamp() - time.time()) < 600
    assert peek(bp, t, "s", 3)[1] == b"m-2"
    assert peek(bp, t, "s", 10)[1] == b"m-9"
    status, body, _ = peek(bp, t, "s", 11)
    assert status == 404 and json.loads(body)["reason"] == "Message not found"
    assert backlog(bp, t, "s") == 10  # peeking acknowledged nothing

    # a consumer acknowledges m-1 alone: peek leaves it out
    consumer = c.subscribe(full, "s")
    got = [consumer.receive(timeout_millis=15_000) for _ in range(2)]
    assert [m.data() for m in got] == [b"m-0", b"m-1"]
    consumer.acknowledge(got[1])
    consumer.close()
    assert backlog(bp, t, "s") == 9
    assert peek(bp, t, "s", 2)[1] == b"m-2"
    shown = cli(bp, "peek", t, "-s", "s", "-n", "3")
    assert [m["payload"] for m in shown] == ["m-0", "m-2", "m-3"]
    assert shown[1]["properties"] == {"i": "2"} and shown[1]["key"] == "k2"
    assert len(cli(bp, "peek", t, "-s", "s", "-n", "50")) == 9  # stops at the end of the backlog

    # a batch is one entry: its frame, which the CLI splits into its messages
    batcher = c.create_producer(full, batching_enabled=True, batching_max_publish_delay_ms=60_000)
    for i in range(3):
        batcher.send_async(f"b-{i}".encode(), None)
    batcher.flush()
    status, body, headers = peek(bp, t, "s", 10)
    assert status == 200 and headers["X-Pulsar-num-batch-message"] == "3"
    assert [m["payload"] for m in cli(bp, "peek", t, "-s", "s", "-n", "10")[-3:]] == ["b-0", "b-1", "b-2"]

    # refusals: no such subscription or topic, a position that is not one
    assert peek(bp, t, "nobody", 1)[0] == 404
    assert peek(bp, t + "-none", "s", 1)[0] == 404
    assert peek(bp, t, "s", 0)[0] == 412
    assert peek(bp, t, "s", "x")[0] == 412  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["LZ4", "ZSTD", "SNAPPY", "ZLib"])
def test_peek_and_examinemessage_decompress_every_compression(bp: BrokerProcess, c: Any, kind: str) -> None:
    """A batch and a single message compressed as pulsar-client writes them: peek answers the batch's frame
    decompressed (which the CLI splits into its messages), examinemessage each message of it and the single one
    (LZ4, ZSTD and SNAPPY through pyarrow; they answered 412 before)."""
    t = name()
    full = f"persistent://public/default/{t}"
    ok(bp, "PUT", f"{T}/{t}")
    ok(bp, "PUT", f"{T}/{t}/subscription/s", "earliest")
    compression = getattr(pulsar.CompressionType, kind)
    batcher = c.create_producer(
        full, compression_type=compression, batching_enabled=True, batching_max_publish_delay_ms=60_000
    )
    sent = [f"{kind}-{i}-".encode() * 20 for i in range(3)]
    for data in sent:
        batcher.send_async(data, None)
    batcher.flush()
    c.create_producer(full, compression_type=compression, batching_enabled=False).send(b"alone-" * 50)

    status, body, headers = peek(bp, t, "s", 1)
    assert status == 200, body
    assert headers["X-Pulsar-num-batch-message"] == "3" and int(headers["X-Pulsar-batch-size"]) == len(body)
    shown = cli(bp, "peek", t, "-s", "s", "-n", "2")
    assert [m["payload"] for m in shown] == [d.decode() for d in sent] + ["alone-" * 50]

    def examine(query: str) -> bytes:
        url = f"{web(bp)}{T}/{t}/examinemessage?{query}"
        with urllib.request.urlopen(url, timeout=30) as r:
            return bytes(r.read())

    for i, data in enumerate(sent):
        assert examine(f"initialPosition=earliest&messagePosition=1&batchIndex={i}") == data
    assert examine("initialPosition=latest&messagePosition=1") == b"alone-" * 50
    assert backlog(bp, t, "s") == 4


def _split_batch(frame: bytes, count: int) -> list[bytes]:
    """A batch's frame split as Pulsar's admin client splits it (each message: a 4-byte size, its
    SingleMessageMetadata, then payload_size bytes of payload)."""
    from topic_broker import pulsar_api_pb2 as pb

    out, at = [], 0
    for _ in range(count):
        size = int.from_bytes(frame[at : at + 4], "big")
        single = pb.SingleMessageMetadata.FromString(frame[at + 4 : at + 4 + size])
        at += 4 + size
        out.append(frame[at : at + single.payload_size])
        at += single.payload_size
    assert at == len(frame)
    return out


def test_examinemessage_and_a_message_by_id_answer_a_batch_whole_as_pulsar(bp: BrokerProcess, c: Any) -> None:
    """Without batchIndex (Pulsar's calls have none) examinemessage and a message by id answer the batch's whole
    frame with X-Pulsar-num-batch-message and X-Pulsar-batch-size, as peek does: Pulsar's admin clients split
    the body by that header, and a body of the first message alone split into nothing."""
    t = name()
    full = f"persistent://public/default/{t}"
    batcher = c.create_producer(full, batching_enabled=True, batching_max_publish_delay_ms=60_000)
    ids: list[Any] = []
    for i in range(3):
        batcher.send_async(f"b-{i}".encode(), lambda res, mid: ids.append(mid))
    batcher.flush()
    wait_for("the batch acknowledged", lambda: len(ids) == 3)
    base = f"{web(bp)}{T}/{t}"
    for url in (
        f"{base}/examinemessage?initialPosition=earliest&messagePosition=1",
        f"{base}/ledger/{ids[0].ledger_id()}/entry/{ids[0].entry_id()}",
    ):
        with urllib.request.urlopen(url, timeout=30) as r:
            body, headers = bytes(r.read()), r.headers
        assert headers["X-Pulsar-num-batch-message"] == "3", url
        assert int(headers["X-Pulsar-batch-size"]) == len(body), url
        assert _split_batch(body, 3) == [b"b-0", b"b-1", b"b-2"], url


def test_skip_moves_the_subscription_over_n_messages(bp: BrokerProcess, c: Any) -> None:
    t = name()
    full = f"persistent://public/default/{t}"
    consumer = c.subscribe(full, "s")
    producer = c.create_producer(full, batching_enabled=False)
    for i in range(10):
        producer.send(f"m-{i}".encode())
    got = [consumer.receive(timeout_millis=15_000) for _ in range(3)]
    consumer.acknowledge(got[2])  # m-2 acked alone: m-0, m-1 still in the backlog
    consumer.close()
    assert backlog(bp, t, "s") == 9

    ok(bp, "POST", f"{T}/{t}/subscription/s/skip/1")  # m-0
    assert backlog(bp, t, "s") == 8
    assert cli(bp, "skip", t, "-s", "s", "-n", "2")["skipped"] == 2  # m-1, then m-3 (m-2 was acked)
    assert backlog(bp, t, "s") == 6
    consumer = c.subscribe(full, "s")
    assert consumer.receive(timeout_millis=15_000).data() == b"m-4"  # where the subscription stands now
    consumer.close()
    ok(bp, "POST", f"{T}/{t}/subscription/s/skip/100")  # more than there are: all of them
    assert backlog(bp, t, "s") == 0
    producer.send(b"after")
    consumer = c.subscribe(full, "s")
    assert consumer.receive(timeout_millis=15_000).data() == b"after"
    consumer.close()

    assert call(bp, "POST", f"{T}/{t}/subscription/nobody/skip/1")[0] == 404
    assert call(bp, "POST", f"{T}/{t}/subscription/s/skip/-1")[0] == 412
    r = ledgerstore("topic", "skip", t, "-s", "nobody", "-n", "1", "--url", web(bp))
    assert r.returncode != 0 and "Subscription not found" in r.stderr


def test_partitioned_topic_skip_and_expire_each_partition_peek_refused(bp: BrokerProcess, c: Any) -> None:
    t = name()
    full = f"persistent://public/default/{t}"
    ok(bp, "PUT", f"{T}/{t}/partitions", 2)
    ok(bp, "PUT", f"{T}/{t}/subscription/s", "earliest")
    producer = c.create_producer(full, batching_enabled=False)
    for i in range(10):
        producer.send(f"m-{i}".encode(), partition_key=str(i))
    status, body, _ = peek(bp, t, "s", 1)
    assert status == 405 and "partitioned" in json.loads(body)["reason"]
    assert peek(bp, f"{t}-partition-0", "s", 1)[0] == 200

    def per_partition() -> list[int]:
        return [backlog(bp, f"{t}-partition-{i}", "s") for i in range(2)]

    before = per_partition()
    assert sum(before) == 10
    ok(bp, "POST", f"{T}/{t}/subscription/s/skip/1")
    assert per_partition() == [n - 1 for n in before]
    time.sleep(1.2)  # the messages are over a second old
    ok(bp, "POST", f"{T}/{t}/all_subscription/expireMessages/1")
    assert per_partition() == [0, 0]


def test_expire_acknowledges_messages_older_than_the_given_time(bp: BrokerProcess, c: Any) -> None:
    t = name()
    full = f"persistent://public/default/{t}"
    ok(bp, "PUT", f"{T}/{t}")
    for sub in ("a", "b", "c"):
        ok(bp, "PUT", f"{T}/{t}/subscription/{sub}", "earliest")
    producer = c.create_producer(full, batching_enabled=False)
    for i in range(5):
        producer.send(f"old-{i}".encode())
    time.sleep(6)
    new_ms = time.time() * 1000
    for i in range(3):
        producer.send(f"new-{i}".encode())

    def ttl() -> int:
        """Seconds that the new messages are not as old as, with 3 to 4 s to spare for the request (a CLI that
        starts slowly on a busy machine), and the old ones (6 s older) are."""
        return int(time.time() * 1000 - new_ms) // 1000 + 4

    ok(bp, "POST", f"{T}/{t}/subscription/a/expireMessages/0")  # 0 expires nothing, as in Pulsar
    assert backlog(bp, t, "a") == 8
    ok(bp, "POST", f"{T}/{t}/subscription/a/expireMessages/3600")  # none is that old
    assert backlog(bp, t, "a") == 8
    ok(bp, "POST", f"{T}/{t}/subscription/a/expireMessages/{ttl()}")
    assert backlog(bp, t, "a") == 3 and backlog(bp, t, "b") == 8
    consumer = c.subscribe(full, "a")
    assert consumer.receive(timeout_millis=15_000).data() == b"new-0"
    consumer.close()
    cli(bp, "expire-messages-all-subscriptions", t, "-t", str(ttl()))
    assert [backlog(bp, t, s) for s in ("a", "b", "c")] == [3, 3, 3]
    assert cli(bp, "expire-messages", t, "-s", "b", "-t", "3600")["expireTimeInSeconds"] == 3600
    assert backlog(bp, t, "b") == 3
    assert call(bp, "POST", f"{T}/{t}/subscription/nobody/expireMessages/1")[0] == 404
    assert call(bp, "POST", f"{T}/{t}/subscription/a/expireMessages/-5")[0] == 412


def test_namespace_message_ttl_expires_old_messages_by_itself(bp: BrokerProcess, c: Any) -> None:
    ns, other = f"public/ttl-{uuid.uuid4().hex[:6]}", f"public/nottl-{uuid.uuid4().hex[:6]}"
    N = "/admin/v2/namespaces/" + ns
    for n in (ns, other):
        ok(bp, "PUT", f"/admin/v2/namespaces/{n}")
    assert ok(bp, "GET", f"{N}/messageTTL") is None
    topics = {n: f"persistent://{n}/t" for n in (ns, other)}
    consumers = {}
    for n, full in topics.items():
        path = "/admin/v2/persistent/" + full.removeprefix("persistent://")
        ok(bp, "PUT", path)
        ok(bp, "PUT", f"{path}/subscription/idle", "earliest")
        consumers[n] = c.subscribe(full, "live", receiver_queue_size=1)
        producer = c.create_producer(full, batching_enabled=False)
        for i in range(5):
            producer.send(f"m-{i}".encode())

    def backlogs(n: str) -> list[int]:
        st = ok(bp, "GET", "/admin/v2/persistent/" + topics[n].removeprefix("persistent://") + "/stats")
        return [st["subscriptions"][s]["msgBacklog"] for s in ("idle", "live")]

    assert backlogs(ns) == [5, 5]
    r = ledgerstore(
        "namespace", "set-message-ttl", ns, "--ttl", "1", "--url", web(bp), "--json"
    )  # as pulsar-admin namespaces set-message-ttl
    assert r.returncode == 0, r.stderr
    assert ok(bp, "GET", f"{N}/messageTTL") == 1
    assert ok(bp, "GET", N)["message_ttl_in_seconds"] == 1
    wait_for("the TTL to expire both subscriptions' messages", lambda: backlogs(ns) == [0, 0])
    assert backlogs(other) == [5, 5]  # no TTL there: the same checks left it alone
    ok(bp, "DELETE", f"{N}/messageTTL")
    assert ok(bp, "GET", f"{N}/messageTTL") is None
    # the live consumer gets what was published after, with at most what it had prefetched before it
    c.create_producer(topics[ns]).send(b"new")
    got = [consumers[ns].receive(timeout_millis=15_000).data()]
    while got[-1] != b"new":
        got.append(consumers[ns].receive(timeout_millis=15_000).data())
    assert len(got) <= 3, got
    assert call(bp, "POST", f"{N}/messageTTL", -1)[0] == 412
    assert call(bp, "POST", f"{N}/messageTTL", "10")[0] == 400
    assert call(bp, "POST", "/admin/v2/namespaces/public/none/messageTTL", 10)[0] == 404
    for consumer in consumers.values():
        consumer.close()


def test_topic_message_ttl_overrides_its_namespaces_on_every_partition(bp: BrokerProcess, c: Any) -> None:
    """A topic's own ``messageTTL`` (``?messageTTL=N``, ``ledgerstore topic set-message-ttl``) takes the place of
    its namespace's, 0 turning it off, on each partition of a partitioned topic; removed, the namespace's applies."""
    ns = f"public/tttl-{uuid.uuid4().hex[:6]}"
    ok(bp, "PUT", f"/admin/v2/namespaces/{ns}")
    P = f"/admin/v2/persistent/{ns}"
    ok(bp, "PUT", f"{P}/part/partitions", 2)
    for t in ("keep", "plain"):
        ok(bp, "PUT", f"{P}/{t}")
    ok(bp, "POST", f"{P}/part/compactionThreshold", 5000)  # another policy of the topic, kept beside its TTL
    r = ledgerstore("topic", "set-message-ttl", f"persistent://{ns}/part", "--ttl", "3600", "--url", web(bp))
    assert r.returncode == 0, r.stderr
    ok(bp, "POST", f"{P}/keep/messageTTL?messageTTL=0")
    assert ok(bp, "GET", f"{P}/part-partition-1/messageTTL") == 3600  # a partition's is its topic's
    assert ok(bp, "GET", f"{P}/part/compactionThreshold") == 5000
    assert ok(bp, "GET", f"{P}/plain/messageTTL") is None
    ok(bp, "POST", f"/admin/v2/namespaces/{ns}/messageTTL", 1)
    assert ok(bp, "GET", f"{P}/plain/messageTTL?applied=true") == 1
    assert ok(bp, "GET", f"{P}/keep/messageTTL?applied=true") == 0
    topics = ("part-partition-0", "part-partition-1", "keep", "plain")
    for t in topics:
        ok(bp, "PUT", f"{P}/{t}/subscription/s", "earliest")
        producer = c.create_producer(f"persistent://{ns}/{t}", batching_enabled=False)
        for i in range(3):
            producer.send(f"m-{i}".encode())
        producer.close()

    def backlogs() -> dict[str, int]:
        return {t: int(ok(bp, "GET", f"{P}/{t}/stats")["subscriptions"]["s"]["msgBacklog"]) for t in topics}

    wait_for("the namespace's TTL to expire plain", lambda: backlogs()["plain"] == 0)
    # every check that expired plain checked the others too: their own TTLs kept them
    assert backlogs() == {"part-partition-0": 3, "part-partition-1": 3, "keep": 3, "plain": 0}
    got = cli(bp, "get-message-ttl", f"persistent://{ns}/part", "--applied")
    assert got == {"messageTTL": 3600}
    cli(bp, "set-message-ttl", f"persistent://{ns}/part", "--ttl", "1")
    wait_for("the topic's TTL to expire both partitions", lambda: backlogs()["part-partition-1"] == 0)
    assert backlogs()["part-partition-0"] == 0
    assert ok(bp, "GET", f"{P}/part/compactionThreshold") == 5000
    assert cli(bp, "remove-message-ttl", f"persistent://{ns}/keep") == {"messageTTL": None}
    assert ok(bp, "GET", f"{P}/keep/messageTTL") is None
    wait_for("the namespace's TTL to apply to keep once its own is removed", lambda: backlogs()["keep"] == 0)
    assert call(bp, "POST", f"{P}/keep/messageTTL?messageTTL=-1")[0] == 412
    assert call(bp, "POST", f"{P}/keep/messageTTL?messageTTL=x")[0] == 400
    assert call(bp, "POST", f"{P}/part-partition-7/messageTTL?messageTTL=5")[0] == 404
    assert call(bp, "GET", f"{P}/none/messageTTL")[0] == 404
    assert ok(bp, "GET", f"{P}/keep/messageTTL") is None


def test_broker_default_message_ttl_applies_where_no_policy_sets_one(cluster: Brokers) -> None:
    """``--ttl-duration-default-s`` (Pulsar's ``ttlDurationDefaultInSeconds``): the TTL of a topic whose
    namespace and itself set none; a namespace's 0 turns it off."""
    b = cluster.start("--ttl-duration-default-s", "1", "--message-expiry-check-interval-s", "0.5")
    ns = f"public/nottl-{uuid.uuid4().hex[:6]}"
    ok(b, "PUT", f"/admin/v2/namespaces/{ns}")
    ok(b, "POST", f"/admin/v2/namespaces/{ns}/messageTTL", 0)
    # "off" first: its message is the older, so a check that expires "default" would expire it too but for the
    # namespace's 0 (the other way round it could still be under a second old then, and kept whatever the rule)
    paths = {"off": f"/admin/v2/persistent/{ns}/{name()}", "default": f"{T}/{name()}"}
    with contextlib.closing(client(b)) as pc:
        for path in paths.values():
            ok(b, "PUT", path)
            ok(b, "PUT", f"{path}/subscription/s", "earliest")
            producer = pc.create_producer("persistent://" + path.removeprefix("/admin/v2/persistent/"))
            producer.send(b"m")
            producer.close()

    def backlog_of(path: str) -> int:
        return int(ok(b, "GET", f"{path}/stats")["subscriptions"]["s"]["msgBacklog"])

    assert ok(b, "GET", f"{paths['default']}/messageTTL?applied=true") == 1
    assert ok(b, "GET", f"{paths['off']}/messageTTL?applied=true") == 0
    wait_for("the broker's default TTL to expire the message", lambda: backlog_of(paths["default"]) == 0)
    assert backlog_of(paths["off"]) == 1


def test_a_dedup_resend_to_a_terminated_topic_is_acknowledged_and_a_new_message_refused(
    cluster: Brokers,
) -> None:
    """As Pulsar's publishMessage, which asks its dedup before its managed ledger: on a topic terminated while its
    producer is still attached (a terminate under way), a resend of a stored sequence id gets its receipt with
    no position (-1:-1), a new one TopicTerminatedError, each in its turn; nothing is stored. Raw frames: a
    client resends only what it holds unacknowledged."""
    from tests.integration.test_broker_client_features4 import _frames_until
    from tests.integration.test_broker_pulsar_client import _connect
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import wire
    from topic_broker.names import TopicName
    from topic_broker.server import BrokerServer

    C = pb.BaseCommand
    with in_process_broker(cluster, tick_interval_s=3600.0) as (service, run):
        server = BrokerServer(service)  # its Pulsar port
        run(server.start())
        t = f"persistent://public/default/{name()}"
        s = socket.create_connection(("127.0.0.1", service.config.port), timeout=30)
        dec = wire.FrameDecoder()
        _connect(s)
        s.sendall(
            wire.encode_command(
                C(type=C.PRODUCER, producer=pb.CommandProducer(topic=t, producer_id=1, request_id=1))
            )
        )
        producer = _frames_until(s, dec, 1, C.PRODUCER_SUCCESS)[0].command.producer_success.producer_name

        def send(seq: int) -> None:
            md = pb.MessageMetadata(
                producer_name=producer, sequence_id=seq, publish_time=int(time.time() * 1000)
            )
            cmd = C(type=C.SEND, send=pb.CommandSend(producer_id=1, sequence_id=seq))
            s.sendall(wire.encode_send(cmd, md, b"m"))

        for seq in range(3):
            send(seq)
        stored = [f.command.send_receipt.message_id.entryId for f in _frames_until(s, dec, 3, C.SEND_RECEIPT)]
        assert stored == [0, 1, 2]
        topic = run(service.get_topic(TopicName.parse(t)))
        last = run(
            topic.ml.terminate()
        )  # its managed ledger only: the producer stays, as while a terminate runs
        for seq in (1, 3, 2):
            send(seq)
        answers: list[Any] = []
        while len(answers) < 3:
            data = s.recv(1 << 16)
            assert data, "connection closed"
            answers += [f.command for f in dec.feed(data)]
        s.close()
        got = [
            (
                a.send_receipt.sequence_id,
                a.send_receipt.message_id.ledgerId,
                a.send_receipt.message_id.entryId,
            )
            if a.type == C.SEND_RECEIPT
            else (a.send_error.sequence_id, pb.ServerError.Name(a.send_error.error))
            for a in answers
        ]
        minus_one = 2**64 - 1  # -1 in the receipt's uint64
        assert got == [(1, minus_one, minus_one), (3, "TopicTerminatedError"), (2, minus_one, minus_one)]
        assert topic.ml.last_confirmed_position() == last
        run(server.stop())


def test_terminate_ends_the_topic_on_this_owner_and_the_next(cluster: Brokers) -> None:
    a = cluster.start()
    t = name()
    full = f"persistent://public/default/{t}"
    with contextlib.closing(client(a)) as pc:
        consumer = pc.subscribe(full, "s")
        producer = pc.create_producer(full, batching_enabled=False)
        ids = [producer.send(f"m-{i}".encode()) for i in range(5)]
        last = ok(a, "POST", f"{T}/{t}/terminate")
        assert (last["ledgerId"], last["entryId"]) == (ids[-1].ledger_id(), ids[-1].entry_id())
        assert last["partitionIndex"] == -1
        with pytest.raises(pulsar.TopicTerminated):
            producer.send(b"after")
        with pytest.raises(pulsar.TopicTerminated):
            pc.create_producer(full)
        # consumers read on to the last message, and then there is nothing more
        assert [consumer.receive(timeout_millis=15_000).data() for _ in range(5)] == [
            f"m-{i}".encode() for i in range(5)
        ]
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=1_000)
        assert ok(a, "GET", f"{T}/{t}/internalStats")["state"] == "Terminated"
        assert ok(a, "POST", f"{T}/{t}/terminate") == last  # again: the same answer
    # a restart, and another broker: the topic stays terminated
    b = cluster.start()
    a.stop()
    with contextlib.closing(client(b)) as pc:
        with pytest.raises(pulsar.TopicTerminated):
            pc.create_producer(full)
        reader = pc.create_reader(full, pulsar.MessageId.earliest)
        assert [reader.read_next(timeout_millis=15_000).data() for _ in range(5)][-1] == b"m-4"
        assert not reader.has_message_available()
        reader.close()
    got = json.loads(ledgerstore("topic", "terminate", t, "--url", web(b), "--json").stdout)
    assert got["lastMessageId"] == last
    # a partitioned topic: each partition, through terminate/partitions (terminate alone is refused)
    ok(b, "PUT", f"{T}/{t}-p/partitions", 2)
    status, body, _ = call(b, "POST", f"{T}/{t}-p/terminate")
    assert status == 405 and "partitioned" in body["reason"]
    with contextlib.closing(client(b)) as pc:
        pc.create_producer(f"{full}-p", batching_enabled=False).send(b"x", partition_key="k")
        got = json.loads(ledgerstore("topic", "terminate", f"{t}-p", "--url", web(b), "--json").stdout)
        assert sorted(got["lastMessageIds"]) == ["0", "1"]
        assert sorted(m["entryId"] for m in got["lastMessageIds"].values()) == [
            -1,
            0,
        ]  # one message, one partition
        with pytest.raises(pulsar.TopicTerminated):
            pc.create_producer(f"{full}-p-partition-1")
    assert call(b, "POST", f"{T}/{t}/terminate/partitions")[0] == 405  # not partitioned
    assert call(b, "POST", f"{T}/{t}-none/terminate")[0] == 404
