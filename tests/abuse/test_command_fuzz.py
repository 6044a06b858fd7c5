"""A seeded command-level fuzz: strangers that speak well-formed frames but the wrong things, on the broker's
Pulsar port, its TLS port and a bookie's port, against a real broker on 3 real bookies.

On the broker: commands out of order (SEND before PRODUCER, FLOW/ACK/SEEK on unknown or closed consumers, a
second CONNECT, LOOKUP before CONNECT), ids reused, extreme field values (permits, sequence ids, num_messages,
batch counts that disagree with the payload, checksums that do not match, message ids of ledgers that do not
exist or belong to another topic), invalid, long and unicode topic names, frames at and just past the largest
frame. On the TLS port the same, and garbage after a completed handshake. On a bookie: reads and adds on ledgers
that do not exist, a fenced ledger, a wrong master key (also against the broker's own ledgers), entry ids out of
range, unknown ops, frames at and past the largest.

After each sequence: every request carrying a request id (and every SEND) got its answer or the connection was
closed, a PING at the end got its PONG unless closed (never a hang); the broker and bookies still serve a real
``pulsar-client`` producer and consumer on a topic the strangers abused, which receives each message it sent and
acknowledged exactly once; and no log holds a traceback.

``LEDGERSTORE_FUZZ_SEQUENCES`` (default 24) and ``LEDGERSTORE_FUZZ_SEED`` run it longer or elsewhere: sequence i
uses ``random.Random(f"{seed}-{kind}-{i}")``, so a failing one is named by its seed and index, and
``LEDGERSTORE_FUZZ_FIRST=i LEDGERSTORE_FUZZ_SEQUENCES=1`` runs it again (its message lists what the stranger sent).
A long run wants ``--timeout=0``. Batches whose sizes overrun their payload go to topics other than the witness's:
pulsar-client (3.x) crashes with SIGSEGV unpacking one, and the broker stores batches unread, as Pulsar's does."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bookie import protocol as bp_proto
from bookie.entryformat import DigestType, EntryCodec
from ledgerstore.cluster import BookieProcess, BrokerProcess, free_port
from tests.broker_testing import Brokers, module_cluster
from tests.tls_testing import needs_openssl, self_signed
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire

pulsar = pytest.importorskip("pulsar")
pytestmark = needs_openssl

T = pb.BaseCommand
SEQUENCES = int(os.environ.get("LEDGERSTORE_FUZZ_SEQUENCES", "24"))
FIRST = int(os.environ.get("LEDGERSTORE_FUZZ_FIRST", "0"))  # the first sequence's index (to run one again)
SEED = os.environ.get("LEDGERSTORE_FUZZ_SEED", "1129")
ANSWER_S = 30.0  # an answer not here by then is a hang (generous: a busy shared machine)
U64 = 2**64 - 1
U32 = 2**32 - 1
WITNESS_TOPIC = "persistent://public/default/fuzz-witness"
TOPICS = [
    WITNESS_TOPIC,
    "persistent://public/default/fuzz-other",
    "fuzz-short",
    "persistent://public/default/fuzz-part-partition-0",
    "persistent://public/default/" + "x" * 300,
    "persistent://public/default/ünïcødé-✓",
    "persistent://public/default/",
    "persistent://public/default/a/b/c",
    "persistent://nope-tenant/nope-ns/t",
    "non-persistent://public/default/np",
    "http://public/default/t",
    "persistent://public/default/" + "y" * 5000,
    "",
    "\x00\x01",
    "persistent://public/default/%2F..%2F",
    "persistent://public/default/fuzz-other-partition-99999999999999999999",
]
SUBSCRIPTIONS = ["f1", "f2", "", "ü-sub", "s" * 1000, "a/b"]  # never "w", the witness's
RESPONSE_TYPES = frozenset(
    {
        T.SUCCESS,
        T.ERROR,
        T.PRODUCER_SUCCESS,
        T.LOOKUP_RESPONSE,
        T.PARTITIONED_METADATA_RESPONSE,
        T.GET_LAST_MESSAGE_ID_RESPONSE,
        T.GET_SCHEMA_RESPONSE,
        T.GET_TOPICS_OF_NAMESPACE_RESPONSE,
        T.CONSUMER_STATS_RESPONSE,
        T.ACK_RESPONSE,
    }
)


# ---- the stranger on the Pulsar port -----------------------------------------------------------------------


class Hang(AssertionError):
    pass


class Stranger:
    """A raw Pulsar connection: frames out, answers in (never waits past ``ANSWER_S``)."""

    def __init__(self, sock: socket.socket, max_frame: int) -> None:
        self.sock = sock
        self.sock.settimeout(0.5)
        self.dec = wire.FrameDecoder(max_frame_size=max_frame + 1024)
        self.closed = False
        self.frames: list[wire.Frame] = []
        self.log: list[str] = []

    def send(self, data: bytes, what: str) -> None:
        self.log.append(what)
        if self.closed:
            return
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed = True

    def _read(self) -> None:
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return
        except OSError:
            self.closed = True
            return
        if not data:
            self.closed = True
            return
        self.frames += self.dec.feed(data)

    def wait(self, match: Callable[[wire.Frame], bool], what: str) -> wire.Frame | None:
        """The first frame received that ``match``es (None: the broker closed the connection)."""
        deadline = time.monotonic() + ANSWER_S
        while True:
            for f in self.frames:
                if match(f):
                    self.frames.remove(f)
                    return f
            if self.closed:
                return None
            if time.monotonic() > deadline:
                raise Hang(f"no answer to {what} within {ANSWER_S:g}s and the connection is open: {self.log}")
            self._read()

    def request(self, cmd: pb.BaseCommand, rid: int, what: str) -> wire.Frame | None:
        self.send(wire.encode_command(cmd), what)
        return self.wait(lambda f: f.type in RESPONSE_TYPES and _rid(f.command) == rid, what)


def _rid(cmd: pb.BaseCommand) -> int | None:
    for desc, value in cmd.ListFields():
        if desc.name != "type" and hasattr(value, "request_id"):
            return int(value.request_id)
    return None


def _connect(version: int = 20) -> bytes:
    return wire.encode_command(
        T(type=T.CONNECT, connect=pb.CommandConnect(client_version="fuzz", protocol_version=version))
    )


def _pick(rng: random.Random, *choices: Any) -> Any:
    return rng.choice(choices)


class BrokerFuzz:
    """One random sequence of commands on one connection; ``known`` holds (ledger, entry) ids seen for real."""

    def __init__(self, rng: random.Random, s: Stranger, known: list[tuple[int, int]], max_frame: int) -> None:
        self.rng, self.s, self.known, self.max_frame = rng, s, known, max_frame
        self.rid = 0
        self.connected = False
        self.producers: dict[int, str] = {}  # producer ids the broker took, and their topics

    def next_rid(self) -> int:
        self.rid += 1
        return _pick(self.rng, self.rid, self.rid, self.rid, 0, U64, 1)  # mostly fresh, sometimes reused

    def topic(self) -> str:
        return self.rng.choice(TOPICS[:4]) if self.rng.random() < 0.7 else self.rng.choice(TOPICS)

    def pid(self) -> int:
        return _pick(self.rng, 0, 1, 2, U64)

    def cid(self) -> int:
        return _pick(self.rng, 0, 1, 2, U64)

    def message_id(self) -> pb.MessageIdData:
        r = self.rng
        if self.known and r.random() < 0.6:
            ledger, entry = r.choice(self.known)
            entry = _pick(r, entry, entry + 1, entry + 10**6, 0)
        else:
            ledger, entry = _pick(r, 0, 1, 10**9, U64, 2**63), _pick(r, 0, 1, U64, 2**63 - 1)
        mid = pb.MessageIdData(ledgerId=ledger, entryId=entry)
        if r.random() < 0.3:
            mid.batch_index = _pick(r, -1, 0, 5, -(2**31), 2**31 - 1)
        if r.random() < 0.2:
            mid.batch_size = _pick(r, 0, 1, -5, 2**31 - 1)
        if r.random() < 0.2:
            mid.partition = _pick(r, -1, 0, 7, 2**31 - 1)
        if r.random() < 0.2:
            mid.ack_set.extend(r.choice([[0], [-1], [2**63 - 1, -(2**63)], [1] * 50]))
        return mid

    def run(self, steps: int) -> None:
        r = self.rng
        if r.random() < 0.9:
            version = _pick(r, 20, 17, 12, 2**31 - 1) if r.random() < 0.85 else _pick(r, 11, 0, -1)
            self.s.send(_connect(version), f"CONNECT v{version}")
            self.connected = self.s.wait(lambda f: f.type in (T.CONNECTED, T.ERROR), "CONNECT") is not None
        actions = [
            self.lookup,
            self.producer,
            self.send_message,
            self.send_message,
            self.subscribe,
            self.flow,
            self.ack,
            self.seek,
            self.last_message_id,
            self.redeliver,
            self.close_one,
            self.unsubscribe,
            self.misc,
            self.second_connect,
            self.big_frame,
        ]
        for _ in range(steps):
            if self.s.closed:
                break
            r.choice(actions)()
        if not self.s.closed:
            self.s.send(wire.ping(), "PING")
            self.s.wait(lambda f: f.type == T.PONG, "the closing PING")

    def lookup(self) -> None:
        rid, topic = self.next_rid(), self.topic()
        if self.rng.random() < 0.5:
            cmd = T(type=T.LOOKUP, lookupTopic=pb.CommandLookupTopic(topic=topic, request_id=rid))
            self.s.request(cmd, rid, f"LOOKUP {topic[:40]!r}")
        else:
            meta = pb.CommandPartitionedTopicMetadata(topic=topic, request_id=rid)
            self.s.request(
                T(type=T.PARTITIONED_METADATA, partitionMetadata=meta), rid, "PARTITIONED_METADATA"
            )

    def producer(self) -> None:
        r, rid, topic = self.rng, self.next_rid(), self.topic()
        cmd = pb.CommandProducer(topic=topic, producer_id=self.pid(), request_id=rid)
        if r.random() < 0.3:
            cmd.producer_name = _pick(r, "fz", "", "ü" * 200, "n" * 3000)
        if r.random() < 0.3:
            cmd.producer_access_mode = _pick(r, pb.Shared, pb.Exclusive, pb.ExclusiveWithFencing)
        if r.random() < 0.1:
            cmd.epoch = _pick(r, 0, U64)
        if r.random() < 0.1:
            cmd.schema.CopyFrom(pb.Schema(name="s", schema_data=bytes(r.randrange(256) for _ in range(30)),
                                          type=_pick(r, pb.Schema.String, pb.Schema.Json, pb.Schema.Avro)))  # fmt: skip
        what = f"PRODUCER {cmd.producer_id} {topic[:40]!r}"
        answer = self.s.request(T(type=T.PRODUCER, producer=cmd), rid, what)
        if answer is not None and answer.type == T.PRODUCER_SUCCESS:
            self.producers[cmd.producer_id] = topic
        if (
            answer is not None
            and answer.type == T.PRODUCER_SUCCESS
            and not answer.command.producer_success.producer_ready
        ):
            self.s.wait(lambda f: f.type in RESPONSE_TYPES and _rid(f.command) == rid, what + " (queued)")

    def send_message(self) -> None:
        r = self.rng
        pid = r.choice(sorted(self.producers)) if self.producers and r.random() < 0.85 else self.pid()
        seq = _pick(r, 0, 1, 2, U64, 2**63, 2**63 - 1, r.randrange(1000))
        cmd = pb.CommandSend(producer_id=pid, sequence_id=seq)
        if r.random() < 0.5:
            cmd.num_messages = _pick(r, 0, 1, 10**9, 2**31 - 1, 3, -1, -(2**31))
        if r.random() < 0.2:
            cmd.highest_sequence_id = _pick(r, 0, seq, U64, 5)
        if r.random() < 0.1:
            cmd.is_chunk = True
        md = pb.MessageMetadata(
            producer_name="fz",
            sequence_id=seq,
            publish_time=_pick(r, 0, 1, 2**63 - 1, int(time.time() * 1000)),
        )
        payload = b"junk-" + bytes(r.randrange(256) for _ in range(r.randrange(40)))
        kind = r.randrange(8)
        if kind in (0, 1) and self.producers.get(pid) == WITNESS_TOPIC:
            # pulsar-client (3.x, C++) crashes with SIGSEGV on a batch whose sizes overrun its payload, and the
            # broker stores what a producer sends unread, as Pulsar's does: such batches go to other topics
            kind = 7
        if kind == 0:  # a batch whose declared count disagrees with its payload
            md.num_messages_in_batch = _pick(r, 0, 1, 5, 10**9, 2**31 - 1, -1)
            single = pb.SingleMessageMetadata(payload_size=_pick(r, 3, 0, 10**6, 2**31 - 1))
            body = single.SerializeToString()
            payload = struct.pack(">I", len(body)) + body + b"abc"
        elif kind == 1:  # a batch with garbage inside
            md.num_messages_in_batch = 2
            payload = bytes(r.randrange(256) for _ in range(r.randrange(64)))
        elif kind == 2 and cmd.is_chunk:
            md.uuid, md.num_chunks_from_msg, md.chunk_id = "u", _pick(r, 0, 1, 2**31 - 1), _pick(r, 0, 5, -1)
            md.total_chunk_msg_size = _pick(r, 0, 10**9)
        elif kind == 3:
            md.compression = _pick(r, pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY)
            md.uncompressed_size = _pick(r, 0, 10, 10**9, U32)
        elif kind == 4:
            md.deliver_at_time = _pick(r, 0, -1, 2**63 - 1)
        meta: bytes | pb.MessageMetadata = md
        if r.random() < 0.1:
            meta = b"\xff\xff\xff" + bytes(r.randrange(256) for _ in range(10))  # not a MessageMetadata
        frame = bytearray(
            wire.encode_send(T(type=T.SEND, send=cmd), meta, payload, with_checksum=r.random() < 0.8)
        )
        if r.random() < 0.15 and len(frame) > 20:
            frame[-1] ^= (
                0xFF  # the checksum no longer matches (or the payload is changed, when there is none)
            )
        what = f"SEND p{pid} s{seq} kind {kind}"
        self.s.send(bytes(frame), what)

        def answered(f: wire.Frame) -> bool:
            c = f.command
            if f.type == T.SEND_RECEIPT:
                return c.send_receipt.producer_id == pid and c.send_receipt.sequence_id == seq
            if f.type == T.SEND_ERROR:
                return c.send_error.producer_id == pid and c.send_error.sequence_id == seq
            return f.type in (T.ERROR, T.CLOSE_PRODUCER)

        self.s.wait(answered, what)

    def subscribe(self) -> None:
        r, rid, topic = self.rng, self.next_rid(), self.topic()
        cmd = pb.CommandSubscribe(
            topic=topic,
            subscription=r.choice(SUBSCRIPTIONS),
            subType=_pick(
                r,
                pb.CommandSubscribe.Exclusive,
                pb.CommandSubscribe.Shared,
                pb.CommandSubscribe.Failover,
                pb.CommandSubscribe.Key_Shared,
            ),  # fmt: skip
            consumer_id=self.cid(),
            request_id=rid,
        )
        if r.random() < 0.3:
            cmd.initialPosition = _pick(r, pb.CommandSubscribe.Earliest, pb.CommandSubscribe.Latest)
        if r.random() < 0.2:
            cmd.start_message_id.CopyFrom(self.message_id())
        if r.random() < 0.2:
            cmd.durable = False
        if r.random() < 0.1:
            cmd.read_compacted = True
        if r.random() < 0.2:
            cmd.priority_level = _pick(r, -1, 0, 2**31 - 1)
        if cmd.subType == pb.CommandSubscribe.Key_Shared and r.random() < 0.5:
            ksm = pb.KeySharedMeta(keySharedMode=pb.STICKY)
            ksm.hashRanges.extend(
                [pb.IntRange(start=_pick(r, 0, -5, 70000), end=_pick(r, 0, 100, 65535, -1))]
            )
            cmd.keySharedMeta.CopyFrom(ksm)
        if r.random() < 0.1:
            cmd.start_message_rollback_duration_sec = _pick(r, 0, U64)
        self.s.request(
            T(type=T.SUBSCRIBE, subscribe=cmd), rid, f"SUBSCRIBE c{cmd.consumer_id} {topic[:40]!r}"
        )

    def flow(self) -> None:
        cid, permits = self.cid(), _pick(self.rng, 0, 1, 1000, U32, 2**31)
        self.s.send(
            wire.encode_command(T(type=T.FLOW, flow=pb.CommandFlow(consumer_id=cid, messagePermits=permits))),
            f"FLOW c{cid} {permits}",
        )

    def ack(self) -> None:
        r = self.rng
        cmd = pb.CommandAck(
            consumer_id=self.cid(), ack_type=_pick(r, pb.CommandAck.Individual, pb.CommandAck.Cumulative)
        )
        cmd.message_id.extend(self.message_id() for _ in range(_pick(r, 0, 1, 1, 3)))
        if r.random() < 0.1:
            cmd.validation_error = _pick(r, pb.CommandAck.ChecksumMismatch, pb.CommandAck.DecompressionError)
        if r.random() < 0.5:
            rid = self.next_rid()
            cmd.request_id = rid
            self.s.request(T(type=T.ACK, ack=cmd), rid, f"ACK c{cmd.consumer_id} with request id")
        else:
            self.s.send(wire.encode_command(T(type=T.ACK, ack=cmd)), f"ACK c{cmd.consumer_id}")

    def seek(self) -> None:
        r, rid = self.rng, self.next_rid()
        cmd = pb.CommandSeek(consumer_id=self.cid(), request_id=rid)
        k = r.randrange(3)
        if k == 0:
            cmd.message_id.CopyFrom(self.message_id())
        elif k == 1:
            cmd.message_publish_time = _pick(r, 0, U64, int(time.time() * 1000))
        self.s.request(T(type=T.SEEK, seek=cmd), rid, f"SEEK c{cmd.consumer_id}")

    def last_message_id(self) -> None:
        rid = self.next_rid()
        cmd = pb.CommandGetLastMessageId(consumer_id=self.cid(), request_id=rid)
        self.s.request(T(type=T.GET_LAST_MESSAGE_ID, getLastMessageId=cmd), rid, "GET_LAST_MESSAGE_ID")

    def redeliver(self) -> None:
        cmd = pb.CommandRedeliverUnacknowledgedMessages(consumer_id=self.cid())
        if self.rng.random() < 0.6:
            cmd.message_ids.extend(self.message_id() for _ in range(_pick(self.rng, 1, 2, 20)))
        self.s.send(
            wire.encode_command(
                T(type=T.REDELIVER_UNACKNOWLEDGED_MESSAGES, redeliverUnacknowledgedMessages=cmd)
            ),
            "REDELIVER",
        )

    def close_one(self) -> None:
        rid = self.next_rid()
        if self.rng.random() < 0.5:
            cmd = T(
                type=T.CLOSE_PRODUCER,
                close_producer=pb.CommandCloseProducer(producer_id=self.pid(), request_id=rid),
            )
        else:
            cmd = T(
                type=T.CLOSE_CONSUMER,
                close_consumer=pb.CommandCloseConsumer(consumer_id=self.cid(), request_id=rid),
            )
        self.s.request(cmd, rid, "CLOSE")

    def unsubscribe(self) -> None:
        rid = self.next_rid()
        cmd = T(type=T.UNSUBSCRIBE, unsubscribe=pb.CommandUnsubscribe(consumer_id=self.cid(), request_id=rid))
        self.s.request(cmd, rid, "UNSUBSCRIBE")

    def misc(self) -> None:
        r, rid = self.rng, self.next_rid()
        k = r.randrange(5)
        if k == 0:
            ns = _pick(r, "public/default", "", "nope/nope", "a" * 2000, "ü/ü", "public")
            cmd = T(
                type=T.GET_TOPICS_OF_NAMESPACE,
                getTopicsOfNamespace=pb.CommandGetTopicsOfNamespace(namespace=ns, request_id=rid),
            )
        elif k == 1:
            g = pb.CommandGetSchema(topic=self.topic(), request_id=rid)
            if r.random() < 0.5:
                g.schema_version = _pick(r, b"", b"\xff" * 8, b"\x00" * 100, b"\x01")
            cmd = T(type=T.GET_SCHEMA, getSchema=g)
        elif k == 2:
            cmd = T(
                type=T.CONSUMER_STATS,
                consumerStats=pb.CommandConsumerStats(consumer_id=self.cid(), request_id=rid),
            )
        else:  # a type served by no handler here, without a body; or a type no Pulsar knows
            body = T(type=_pick(r, T.NEW_TXN, T.GET_OR_CREATE_SCHEMA, T.AUTH_RESPONSE)).SerializeToString()
            if k == 4:
                body = b"\x08" + bytes([_pick(r, 99, 1, 127)])
            self.s.send(struct.pack(">II", len(body) + 4, len(body)) + body, f"a bare command {body!r}")
            return
        self.s.request(cmd, rid, wire.command_name(cmd.type))

    def second_connect(self) -> None:
        if not self.connected:  # the first, late
            self.s.send(_connect(), "CONNECT")
            self.connected = self.s.wait(lambda f: f.type in (T.CONNECTED, T.ERROR), "CONNECT") is not None
            return
        self.s.send(_connect(), "a second CONNECT")
        self.s.wait(lambda f: False, "a second CONNECT (the broker closes)")

    def big_frame(self) -> None:
        """A SEND frame of exactly the largest frame size, or one byte over it."""
        over = self.rng.random() < 0.5
        total = self.max_frame + (1 if over else 0)
        cmd = T(type=T.SEND, send=pb.CommandSend(producer_id=self.pid(), sequence_id=7))
        md = pb.MessageMetadata(producer_name="fz", sequence_id=7, publish_time=1).SerializeToString()
        head = wire.encode_send(cmd, md, b"")
        payload = bytes(total - (len(head) - 4))
        frame = wire.encode_send(cmd, md, payload)
        assert len(frame) - 4 == total, (len(frame), total)
        self.s.send(frame, f"a SEND frame of {total} bytes")
        if over:
            self.s.wait(lambda f: False, "a frame over the largest (the broker closes)")
        else:
            self.s.wait(
                lambda f: f.type in (T.SEND_ERROR, T.SEND_RECEIPT, T.ERROR), "a frame of the largest size"
            )


# ---- the witness: a real client on a topic the strangers abuse ---------------------------------------------


class Witness:
    def __init__(self, service_url: str) -> None:
        self.client = pulsar.Client(service_url, operation_timeout_seconds=30,
                                    logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))  # fmt: skip
        self.consumer = self.client.subscribe(WITNESS_TOPIC, "w", consumer_type=pulsar.ConsumerType.Shared,
                                              initial_position=pulsar.InitialPosition.Earliest)  # fmt: skip
        self.producer = self.client.create_producer(
            WITNESS_TOPIC, batching_enabled=False, send_timeout_millis=60_000
        )
        self.acked: set[bytes] = set()  # sent and acknowledged by the broker
        self.received: set[bytes] = set()
        self.twice: list[bytes] = []  # received again
        self.known: list[tuple[int, int]] = []

    def round(self, tag: str, n: int = 3) -> None:
        want = set()
        for i in range(n):
            data = f"w-{tag}-{i}".encode()
            mid = self.producer.send(data)
            self.acked.add(data)
            want.add(data)
            self.known.append((mid.ledger_id(), mid.entry_id()))
        deadline = time.monotonic() + 60
        while want - self.received:
            assert time.monotonic() < deadline, f"after {tag}: not received {sorted(want - self.received)}"
            try:
                m = self.consumer.receive(timeout_millis=2000)
            except pulsar.Timeout:
                continue
            self.consumer.acknowledge(m)
            data = m.data()
            if data.startswith(b"w-"):
                if data in self.received:
                    self.twice.append(data)
                self.received.add(data)
        assert not self.twice, f"after {tag}: received twice {self.twice}"

    def close(self) -> None:
        self.client.close()


# ---- logs ------------------------------------------------------------------------------------------------


class Logs:
    """Tracebacks added to the processes' logs since the last look."""

    def __init__(self, procs: list[BrokerProcess | BookieProcess]) -> None:
        self.paths = [p.log_path for p in procs if p.log_path is not None]
        self.offsets = {p: p.stat().st_size for p in self.paths}

    def new_tracebacks(self) -> list[str]:
        found = []
        for path in self.paths:
            with open(path, "rb") as f:
                f.seek(self.offsets[path])
                text = f.read().decode(errors="replace")
                self.offsets[path] = f.tell()
            lines = text.splitlines()
            for i, line in enumerate(lines):
                if "Traceback" in line:
                    found.append(f"{path.name}: " + "\n".join(lines[max(0, i - 2) : i + 30]))
        return found


# ---- the cluster -----------------------------------------------------------------------------------------


class FuzzCluster:
    def __init__(self, brokers: Brokers, tls_port: int) -> None:
        self.brokers = brokers
        self.broker = brokers.procs[0]
        self.bookies: list[BookieProcess] = brokers.bookies.procs
        self.tls_port = tls_port
        self.logs = Logs([self.broker, *self.bookies])
        self.witness = Witness(self.broker.service_url)
        self.witness.round("start")
        self.max_frame = wire.DEFAULT_MAX_FRAME_SIZE

    def check(self, tag: str, sent: list[str] | None = None) -> None:
        """``sent``: what the stranger sent, for the failure's message."""
        what = f"after {tag} (the stranger sent {sent})"
        assert self.broker.alive and all(b.alive for b in self.bookies), f"{what}: a process died"
        try:
            self.witness.round(tag)
        except AssertionError as e:
            raise AssertionError(f"{what}: {e}") from None
        tracebacks = self.logs.new_tracebacks()
        assert not tracebacks, f"{what}:\n" + "\n\n".join(tracebacks)


@pytest.fixture(scope="module")
def fuzz(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzCluster]:
    tmp = tmp_path_factory.mktemp("fuzz")
    cert, key = self_signed(tmp, "broker")
    tls_port = free_port()
    tls = ("--tls-port", str(tls_port), "--tls-cert", str(cert), "--tls-key", str(key))
    with module_cluster(zk_server, tmp, *tls) as brokers:
        fc = FuzzCluster(brokers, tls_port)
        try:
            yield fc
        finally:
            fc.witness.close()


def _plain(fc: FuzzCluster) -> socket.socket:
    return socket.create_connection(("127.0.0.1", fc.broker.port), timeout=10)


def _tls(fc: FuzzCluster) -> socket.socket:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection(("127.0.0.1", fc.tls_port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def _run_broker_sequence(fc: FuzzCluster, rng: random.Random, sock: socket.socket, tag: str) -> None:
    s = Stranger(sock, fc.max_frame)
    try:
        BrokerFuzz(rng, s, fc.witness.known, fc.max_frame).run(rng.randrange(1, 14))
    finally:
        sock.close()
    fc.check(tag, s.log)


def test_commands_out_of_order_and_extreme_values_on_the_pulsar_port(fuzz: FuzzCluster) -> None:
    for i in range(FIRST, FIRST + SEQUENCES):
        tag = f"{SEED}-plain-{i}"
        _run_broker_sequence(fuzz, random.Random(tag), _plain(fuzz), tag)


def test_commands_and_garbage_after_the_tls_handshake(fuzz: FuzzCluster) -> None:
    for i in range(FIRST, FIRST + max(1, SEQUENCES // 2)):
        tag = f"{SEED}-tls-{i}"
        rng = random.Random(tag)
        sock = _tls(fuzz)
        if rng.random() < 0.5:
            _run_broker_sequence(fuzz, rng, sock, tag)
            continue
        s = Stranger(sock, fuzz.max_frame)
        try:
            if rng.random() < 0.5:
                s.send(_connect(), "CONNECT")
                s.wait(lambda f: f.type == T.CONNECTED, "CONNECT")
            garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 2000)))
            if rng.random() < 0.5:  # a frame of its declared size, holding garbage
                garbage = struct.pack(">I", len(garbage)) + garbage
            else:  # a size past the largest frame
                garbage = struct.pack(">I", fuzz.max_frame + rng.randrange(1, 1 << 20)) + garbage
            s.send(garbage, f"{len(garbage)} bytes of garbage")
            s.wait(lambda f: False, "garbage (the broker closes)")
        finally:
            sock.close()
        fuzz.check(tag)


# ---- the stranger on a bookie's port -----------------------------------------------------------------------

KEY = bp_proto.master_key(b"fuzz")
WRONG_KEY = bp_proto.master_key(b"not-it")


class BookieStranger:
    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.settimeout(0.5)
        self.dec = bp_proto.FrameDecoder(frame_size_max=bp_proto.FRAME_SIZE_MAX + 1024)
        self.closed = False
        self.got: dict[int, Any] = {}
        self.log: list[str] = []

    def ask(self, frame: bytes, rid: int, what: str) -> Any:
        """The answer to request ``rid`` (None: the bookie closed the connection)."""
        self.log.append(what)
        if not self.closed:
            try:
                self.sock.sendall(frame)
            except OSError:
                self.closed = True
        deadline = time.monotonic() + ANSWER_S
        while rid not in self.got:
            if self.closed:
                return None
            if time.monotonic() > deadline:
                raise Hang(f"bookie: no answer to {what} within {ANSWER_S:g}s: {self.log}")
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                self.closed = True
                break
            self.dec.feed(data)
            for resp in self.dec.responses():
                self.got[resp.request_id] = resp
        return self.got.pop(rid, None)

    def close(self) -> None:
        self.sock.close()


def _entry(ledger: int, entry: int, payload: bytes) -> bytes:
    return EntryCodec(ledger % 2**63, DigestType.CRC32C).build(entry, entry - 1, len(payload), payload)


def _bookie_sequence(rng: random.Random, s: BookieStranger, real_ledgers: list[int], base: int) -> None:
    """Requests of the wrong kind; the broker's own ledgers only ever with a wrong master key."""
    r = rng
    fuzz_ledgers = [base, base + 1, base + 2]
    rid = 0
    for _ in range(r.randrange(1, 16)):
        if s.closed:
            return
        rid += 1
        real = bool(real_ledgers) and r.random() < 0.3
        ledger = r.choice(real_ledgers) if real else _pick(r, *fuzz_ledgers, 0, 2**63, U64, 424242)
        key = WRONG_KEY if real else _pick(r, KEY, KEY, KEY, WRONG_KEY)
        eid = _pick(r, 0, 1, 2, -1, -2, 2**63 - 1, -(2**63), r.randrange(10))
        k = r.randrange(10)
        flags = 0
        if k == 0:  # ADD (a well-formed entry, or one of another ledger or entry, or garbage)
            payload = b"fz" * r.randrange(50)
            entry = _pick(
                r, _entry(ledger, max(eid, 0), payload), _entry(ledger + 1, 3, payload), b"", b"\x00" * 10
            )
            if r.random() < 0.1:
                flags = bp_proto.Flag.RECOVERY_ADD
            if real and flags:
                flags = 0  # a recovery add with a wrong key is still refused; keep it to the plain kind
            frame = bp_proto.encode_add_request(rid, ledger, eid, key, entry, flags)
            what = f"ADD {ledger}/{eid} flags {flags}"
        elif k == 1:  # fence (a read of the last entry with FENCE)
            frame = bp_proto.encode(bp_proto.ReadEntryRequest(request_id=rid, ledger_id=ledger,
                                    entry_id=bp_proto.LAST_ENTRY, master_key=key, flags=bp_proto.Flag.FENCE))  # fmt: skip
            what = f"FENCE {ledger}"
        elif k == 2:
            flags = _pick(r, 0, 0, bp_proto.Flag.LONG_POLL, 0xFFFF)
            frame = bp_proto.encode(bp_proto.ReadEntryRequest(request_id=rid, ledger_id=ledger, entry_id=eid,
                                    master_key=key, flags=flags, previous_lac=_pick(r, -1, 0, 2**63 - 1),
                                    timeout_ms=_pick(r, 0, 10, 500)))  # fmt: skip
            what = f"READ {ledger}/{eid} flags {flags}"
        elif k == 3:
            frame = bp_proto.encode(bp_proto.ReadLacRequest(request_id=rid, ledger_id=ledger, master_key=key))
            what = f"READ_LAC {ledger}"
        elif k == 4:
            frame = bp_proto.encode(bp_proto.WriteLacRequest(request_id=rid, ledger_id=ledger, lac=eid,
                                    master_key=key, lac_blob=bytes(r.randrange(256) for _ in range(r.randrange(40)))))  # fmt: skip
            what = f"WRITE_LAC {ledger} {eid}"
        elif k == 5:
            first, last = _pick(r, 0, -1, 5, 2**63 - 1), _pick(r, 0, -1, 3, 2**63 - 1, 10**6)
            body = struct.pack(">Qqq20sI", ledger, first, last, key, _pick(r, 0, 1, U32, 8 << 20))
            if r.random() < 0.4:
                body += struct.pack(">I", _pick(r, 0, 1, 2, U32))
            frame = bp_proto._frame(bp_proto.OpCode.READ_RANGE, 0, rid, body)
            what = f"READ_RANGE {ledger} {first}..{last}"
        elif k == 6:
            frame = bp_proto.encode(bp_proto.BookieInfoRequest(request_id=rid))
            what = "BOOKIE_INFO"
        elif k == 7:  # a request of an op no bookie serves, or a body cut short
            op = _pick(r, 0, 8, 200, bp_proto.OpCode.READ_ENTRY, bp_proto.OpCode.ADD_ENTRY)
            frame = bp_proto._frame(op, 0, rid, bytes(r.randrange(256) for _ in range(r.randrange(12))))
            what = f"op {op} with a short body"
        elif k == 8:  # AUTH not first
            frame = bp_proto.encode(bp_proto.AuthRequest(request_id=rid))
            what = "AUTH not first"
        else:  # a frame of the largest size, or one byte over
            over = r.random() < 0.5
            n = bp_proto.FRAME_SIZE_MAX + (1 if over else 0)
            body = struct.pack(">Qq20s", ledger, 0, key) + bytes(n - bp_proto.FRAME_HEADER.size - 36)
            frame = (
                struct.pack(">I", n) + bp_proto.FRAME_HEADER.pack(bp_proto.PROTOCOL_VERSION, 1, 0, rid) + body
            )
            what = f"ADD frame of {n} bytes"
        resp = s.ask(frame, rid, what)
        if resp is None:
            continue
        status = getattr(resp, "status", None)
        if real and key == WRONG_KEY and k in (0, 1, 4):
            assert status != bp_proto.Status.OK, f"{what} with a wrong master key on a broker ledger: {resp}"


def test_requests_of_the_wrong_kind_on_a_bookies_port(fuzz: FuzzCluster) -> None:
    for i in range(FIRST, FIRST + SEQUENCES):
        tag = f"{SEED}-bookie-{i}"
        rng = random.Random(tag)
        bookie = rng.choice(fuzz.bookies)
        real = sorted({ledger for ledger, _ in fuzz.witness.known})
        s = BookieStranger(bookie.id)
        try:
            _bookie_sequence(rng, s, real, 10**12 + 10 * i)
        finally:
            s.close()
        fuzz.check(tag)


def test_a_fenced_ledger_refuses_adds_and_a_wrong_key_neither_fences_nor_writes(fuzz: FuzzCluster) -> None:
    s = BookieStranger(fuzz.bookies[0].id)
    try:
        ledger = 10**13 + 1
        add = bp_proto.encode_add_request
        assert s.ask(add(1, ledger, 0, KEY, _entry(ledger, 0, b"a")), 1, "ADD").status == bp_proto.Status.OK
        fence = bp_proto.ReadEntryRequest(request_id=2, ledger_id=ledger, entry_id=bp_proto.LAST_ENTRY,
                                          master_key=WRONG_KEY, flags=bp_proto.Flag.FENCE)  # fmt: skip
        assert s.ask(bp_proto.encode(fence), 2, "FENCE, wrong key").status == bp_proto.Status.UNAUTHORIZED
        assert s.ask(add(3, ledger, 1, KEY, _entry(ledger, 1, b"b")), 3, "ADD").status == bp_proto.Status.OK
        fence = bp_proto.ReadEntryRequest(request_id=4, ledger_id=ledger, entry_id=bp_proto.LAST_ENTRY,
                                          master_key=KEY, flags=bp_proto.Flag.FENCE)  # fmt: skip
        assert s.ask(bp_proto.encode(fence), 4, "FENCE").status == bp_proto.Status.OK
        assert (
            s.ask(add(5, ledger, 2, KEY, _entry(ledger, 2, b"c")), 5, "ADD").status == bp_proto.Status.FENCED
        )
        wrong = add(6, ledger, 2, WRONG_KEY, _entry(ledger, 2, b"c"))
        assert s.ask(wrong, 6, "ADD, wrong key").status in (
            bp_proto.Status.UNAUTHORIZED,
            bp_proto.Status.FENCED,
        )
    finally:
        s.close()
    fuzz.check("fence")


def test_the_strangers_left_the_witness_whole(fuzz: FuzzCluster) -> None:
    w = fuzz.witness
    assert w.acked == w.received and not w.twice, (sorted(w.acked ^ w.received), w.twice)


@contextlib.contextmanager
def _consumer_and_stranger(fuzz: FuzzCluster, topic: str) -> Iterator[tuple[Any, Any, Stranger]]:
    """A real client subscribed to ``topic`` from the earliest, its consumer, and a stranger connected with
    producer 1 on the topic."""
    client = pulsar.Client(fuzz.broker.service_url, operation_timeout_seconds=30,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))  # fmt: skip
    try:
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        s = Stranger(_plain(fuzz), fuzz.max_frame)
        try:
            s.send(_connect(), "CONNECT")
            assert s.wait(lambda f: f.type == T.CONNECTED, "CONNECT") is not None
            producer = T(
                type=T.PRODUCER, producer=pb.CommandProducer(topic=topic, producer_id=1, request_id=1)
            )
            answer = s.request(producer, 1, "PRODUCER")
            assert answer is not None and answer.type == T.PRODUCER_SUCCESS, answer
            yield client, consumer, s
        finally:
            s.sock.close()
    finally:
        client.close()


def _answer_to_send(
    s: Stranger, seq: int, meta: bytes | pb.MessageMetadata, payload: bytes, **fields: Any
) -> Any:
    """The SEND_RECEIPT or SEND_ERROR of a SEND of producer 1 (``fields``: more of CommandSend's)."""
    send = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=seq, **fields))
    s.send(wire.encode_send(send, meta, payload), f"SEND {seq} {fields}")
    got = s.wait(lambda f: f.type in (T.SEND_RECEIPT, T.SEND_ERROR), "SEND")
    assert got is not None, "the broker closed the connection"
    return got


def test_a_send_whose_metadata_does_not_parse_is_refused_and_never_stalls_a_consumer(
    fuzz: FuzzCluster,
) -> None:
    """Such an entry, stored, made pulsar-client's consumer close its connection at each delivery ('Error
    parsing message metadata') and get it again: the subscription stalled for good."""
    topic = "persistent://public/default/fuzz-unparsable"
    with _consumer_and_stranger(fuzz, topic) as (client, consumer, s):
        lacking = pb.MessageMetadata(producer_name="fz").SerializePartialToString()  # no sequence_id, time
        for seq, meta in enumerate((b"\xff\xff\xff\x01", lacking)):
            got = _answer_to_send(s, seq, meta, b"poison")
            assert got.type == T.SEND_ERROR and "invalid message" in got.command.send_error.message, got
        client.create_producer(topic).send(b"after")
        assert consumer.receive(timeout_millis=20_000).data() == b"after"
    fuzz.check("unparsable")


def test_a_send_claiming_more_messages_than_its_entry_holds_takes_no_permits_from_consumers(
    fuzz: FuzzCluster,
) -> None:
    """A message (no batch) sent with num_messages 10^9 was dispatched as 10^9 messages: a consumer's permits went
    with it, and pulsar-client, which counts one message, never gave them back: nothing more was delivered."""
    topic = "persistent://public/default/fuzz-count"
    with _consumer_and_stranger(fuzz, topic) as (client, consumer, s):
        for seq, count in enumerate((10**9, -1)):
            md = pb.MessageMetadata(producer_name="fz", sequence_id=seq, publish_time=1)
            got = _answer_to_send(s, seq, md, b"claims %d" % count, num_messages=count)
            assert got.type == T.SEND_RECEIPT, got
        client.create_producer(topic).send(b"after")
        got = [consumer.receive(timeout_millis=20_000).data() for _ in range(3)]
        assert got == [b"claims 1000000000", b"claims -1", b"after"], got
    fuzz.check("num_messages")


def test_a_sequence_id_past_the_largest_long_is_refused_and_leaves_the_producer_usable(
    fuzz: FuzzCluster,
) -> None:
    """A SEND with sequence id 2^64-1 (a uint64 on the wire, a long in Pulsar) was stored and became the
    producer's last id: its next PRODUCER failed with a traceback ('Value out of range' building PRODUCER_SUCCESS)
    and the connection was closed, each time the client tried again."""
    topic = "persistent://public/default/fuzz-long"
    with _consumer_and_stranger(fuzz, topic) as (_client, _consumer, s):
        md = pb.MessageMetadata(producer_name="fz", sequence_id=0, publish_time=1)
        for seq, fields in (
            (2**64 - 1, {}),
            (0, {"highest_sequence_id": 2**63}),
            (2**63 - 1, {"num_messages": 2}),
        ):
            batch = pb.MessageMetadata(
                producer_name="fz", sequence_id=seq, publish_time=1, num_messages_in_batch=2
            )
            got = _answer_to_send(s, seq, batch if "num_messages" in fields else md, b"", **fields)
            assert got.type == T.SEND_ERROR and "sequence id over" in got.command.send_error.message, got
        again = T(type=T.PRODUCER, producer=pb.CommandProducer(topic=topic, producer_id=1, request_id=2))
        answer = s.request(again, 2, "PRODUCER again")
        assert answer is not None and answer.type == T.PRODUCER_SUCCESS, answer
        assert answer.command.producer_success.last_sequence_id == -1
    fuzz.check("long")
