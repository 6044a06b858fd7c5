"""Tests for the bugs planted in the audit of 2026-11-29 against 78b3357 that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of the wire codec, connections, admin policies and the
AutoRecovery helpers"): each fails with its bug planted and passes without it. Pure logic, no processes."""

from __future__ import annotations

import struct

import pytest

from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.connection import ConnectionConfig, ProtocolConnection

T = pb.BaseCommand


def _connected(**config: object) -> ProtocolConnection:
    conn = ProtocolConnection(ConnectionConfig(**config), 0.0)  # type: ignore[arg-type]
    connect = T(type=T.CONNECT, connect=pb.CommandConnect(client_version="test", protocol_version=20))
    assert conn.receive_data(wire.encode_command(connect), 0.0) == []
    conn.data_to_send()
    return conn


def _send(payload: bytes) -> bytes:
    send = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=0))
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    return wire.encode_send(send, md, payload)


def test_a_frame_over_the_brokers_own_max_message_size_closes_the_connection() -> None:
    """A broker started with a smaller ``--max-message-size`` announces it in CONNECTED; a SEND past it (and its
    frame padding) is refused at its first 4 bytes, not decoded and stored because a ledger entry could hold it."""
    limit = 64 * 1024
    conn = _connected(max_message_size=limit)
    (req,) = conn.receive_data(_send(b"x" * (limit // 2)), 1.0)
    assert req.handler == "on_send"
    big = _send(b"x" * (limit + wire.FRAME_PADDING_SIZE + 1))
    assert conn.receive_data(big, 2.0) == []
    assert conn.closed and "frame size" in (conn.close_reason or "")


@pytest.mark.parametrize("overrun", [1, 2, 3, 4])
def test_a_send_whose_metadata_size_runs_past_the_frame_is_refused(overrun: int) -> None:
    """The payload part's metadata size counts from after its own 4 bytes: one that reaches past the frame's
    end by up to those 4 bytes is a bad frame too, not an entry stored that no reader can parse."""
    command = wire.encode_command(T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=0)))
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1).SerializeToString()
    body = struct.pack(">I", len(meta) + overrun) + meta
    frame_body = command[4:] + body  # the command frame without its total size, then the payload part
    frame = struct.pack(">I", len(frame_body)) + frame_body
    with pytest.raises(wire.FrameError, match="metadata size"):
        wire.FrameDecoder().feed(frame)


@pytest.mark.parametrize("overrun", [1, 2, 3, 4])
def test_a_stored_entry_whose_metadata_size_runs_past_its_end_is_refused(overrun: int) -> None:
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1).SerializeToString()
    body = struct.pack(">I", len(meta) + overrun) + meta
    entry = struct.pack(">HI", wire.CHECKSUM_MAGIC, wire.checksum(body)) + body
    with pytest.raises(wire.EntryFormatError, match="metadata size"):
        wire.parse_entry(entry)
    with pytest.raises(wire.EntryFormatError, match="metadata size"):
        wire.entry_publish_time(entry)


def test_a_batch_message_whose_metadata_size_runs_past_the_batch_is_refused() -> None:
    """A batch message's metadata size past what is left of the batch: its metadata is not read from a cut-off
    slice (whose fields would then be taken for the message's)."""
    single = pb.SingleMessageMetadata(payload_size=0).SerializeToString()
    raw = struct.pack(">I", len(single) + 1) + single
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=1)
    with pytest.raises(wire.EntryFormatError, match="metadata size"):
        list(wire.iter_batch(md, raw))
    with pytest.raises(wire.EntryFormatError, match="metadata size"):
        wire.batch_last_sequence_id(md, raw)


def test_an_lz4_batch_is_read_as_the_raw_lz4_block_pulsars_clients_write() -> None:
    """Pulsar's clients compress LZ4 as a raw block (no frame header): such a payload, made here with the raw
    block codec itself rather than with the broker's table, decompresses to its batch."""
    pa = pytest.importorskip("pyarrow")
    raw = b"".join(
        struct.pack(">I", len(s)) + s + p
        for s, p in (
            (pb.SingleMessageMetadata(payload_size=100).SerializeToString(), b"x" * 100),
            (pb.SingleMessageMetadata(payload_size=1).SerializeToString(), b"y"),
        )
    )
    packed = pa.Codec("lz4_raw").compress(raw, asbytes=True)
    md = pb.MessageMetadata(
        producer_name="p",
        sequence_id=0,
        publish_time=1,
        num_messages_in_batch=2,
        compression=pb.LZ4,
        uncompressed_size=len(raw),
    )
    assert [p for _s, p in wire.iter_batch(md, packed)] == [b"x" * 100, b"y"]


def test_a_fixed_type_of_another_size_is_refused_whichever_is_larger() -> None:
    """Avro reads a fixed only as a fixed of its own size: a new schema whose fixed is larger, or smaller, than
    the stored one's is refused (FULL, the default, checks both ways)."""
    import json

    from topic_broker.schema_compat import incompatibility

    def record(size: int) -> bytes:
        fixed = {"type": "fixed", "name": "Id", "size": size}
        return json.dumps({"type": "record", "name": "R", "fields": [{"name": "id", "type": fixed}]}).encode()

    for strategy in ("BACKWARD", "FORWARD", "FULL"):
        for new, old in ((16, 8), (8, 16)):
            why = incompatibility(strategy, record(new), [record(old)])
            assert why is not None and "size" in why, (strategy, new, old, why)
    assert incompatibility("FULL", record(8), [record(8)]) is None


# -- re-replication's copies ----------------------------------------------------------------------------------


class _FakeConn:
    """A bookie connection whose adds are answered by the test (``answer``), or at once with ``status``."""

    def __init__(self, status: object = None) -> None:
        self.closed = False
        self.status = status
        self.waiting: list[object] = []
        self._rid = 0

    def next_id(self) -> int:
        self._rid += 1
        return self._rid

    def send_add(self, rid: int, frame: bytes, callback: object) -> None:
        if self.status is not None:
            callback(self.status, None)  # type: ignore[operator]
        else:
            self.waiting.append(callback)


class _FakeBk:
    def __init__(self, conn: _FakeConn) -> None:
        import types

        self.config = types.SimpleNamespace(add_timeout_s=30.0)
        self.pool = self
        self.conn = conn

    async def get(self, bookie: str) -> _FakeConn:
        return self.conn


def test_a_copy_whose_adds_the_new_bookie_refuses_fails_and_counts_nothing_copied() -> None:
    """The new bookie answers every RECOVERY_ADD with an error (FENCED here): the copy fails, and none of those
    entries counts as copied (nothing would then be swapped in on entries the new bookie does not hold)."""
    import asyncio

    from bookie import protocol as bp
    from ledger_client import errors as E
    from ledger_client.rereplicator import _Writer

    copied: list[int] = []
    writer = _Writer(
        _FakeBk(_FakeConn(bp.Status.FENCED)), 7, b"k", "new", None, lambda n, _b: copied.append(n)
    )  # type: ignore[arg-type]

    async def copy() -> None:
        await writer.send(b"abcdef", [0, 3, 3, 6], 0, 1)
        await writer.drain()

    with pytest.raises(E.LedgerError, match="FENCED"):
        asyncio.run(copy())
    assert writer.acked == 0 and copied == []


def test_a_copy_is_drained_only_once_the_new_bookie_acknowledged_its_last_add() -> None:
    import asyncio

    from bookie import protocol as bp
    from ledger_client.rereplicator import _Writer

    conn = _FakeConn()
    writer = _Writer(_FakeBk(conn), 7, b"k", "new", None, lambda _n, _b: None)  # type: ignore[arg-type]

    async def copy() -> None:
        await writer.send(b"abcdef", [0, 3, 3, 6], 0, 1)
        assert len(conn.waiting) == 2
        drain = asyncio.ensure_future(writer.drain())
        conn.waiting[0](bp.Status.OK, None)  # type: ignore[operator]
        for _ in range(10):
            await asyncio.sleep(0)
        assert not drain.done(), "drained with an add still unacknowledged"
        conn.waiting[1](bp.Status.OK, None)  # type: ignore[operator]
        await asyncio.wait_for(drain, 30)
        assert writer.acked == 2

    asyncio.run(copy())


def test_a_repair_in_place_reads_an_entry_from_the_first_copy_whose_digest_verifies() -> None:
    """The entry-by-entry copy (a repair in place) skips a source whose copy fails its digest and takes the next
    one's; with no good copy anywhere it fails, rather than writing the damaged bytes to the bookie."""
    import asyncio

    from bookie import protocol as bp
    from bookie.entryformat import DigestType, EntryCodec
    from ledger_client import errors as E
    from ledger_client.rereplicator import _read_verified

    codec = EntryCodec(7, DigestType.CRC32C, b"k")
    good = codec.build(3, 2, 100, b"payload")
    damaged = good[:-1] + bytes([good[-1] ^ 0xFF])

    class Bk:
        def __init__(self, copies: dict[str, bytes]) -> None:
            self.copies = copies

        async def _ask_or_none(self, bookie: str, make: object) -> bp.ReadEntryResponse:
            return bp.ReadEntryResponse(
                request_id=1, status=bp.Status.OK, ledger_id=7, entry_id=3, entry=self.copies[bookie]
            )

    got = asyncio.run(_read_verified(Bk({"a": damaged, "b": good}), codec, b"k", 3, ["a", "b"]))  # type: ignore[arg-type]
    assert got == good
    with pytest.raises(E.LedgerError, match="digest mismatch"):
        asyncio.run(_read_verified(Bk({"a": damaged}), codec, b"k", 3, ["a"]))  # type: ignore[arg-type]


# -- ZooKeeper ACL mode, connection caps ----------------------------------------------------------------------


def test_a_root_that_still_admits_world_is_migrating_and_one_that_does_not_is_secured() -> None:
    """While the root's ACL still holds ``world:anyone`` beside the digest (a tree being secured), processes
    stay in ``migrating`` mode (their new znodes keep a world entry for the processes without credentials)."""
    from kazoo.security import OPEN_ACL_UNSAFE

    from zk.acl import ZkAuth, mode_of

    auth = ZkAuth("ledgerstore", "secret")
    assert mode_of(auth.acl("migrating")) == "migrating"
    assert mode_of(list(OPEN_ACL_UNSAFE)) == "migrating"
    assert mode_of(auth.acl("secured")) == "secured"


def test_a_connection_gate_admits_exactly_its_caps_and_gives_back_what_is_released() -> None:
    from bookie.server_gate import ConnectionGate

    gate = ConnectionGate("test", connections_max=3, per_peer_max=2)
    assert gate.admit("a") and gate.admit("a")
    assert not gate.admit("a"), "a third from one address"
    assert gate.admit("b")
    assert not gate.admit("c"), "a fourth in all"
    assert gate.refused == 2
    for _ in range(5):  # connections come and go: each release gives its place back
        gate.release("a")
        assert gate.admit("a")
    gate.release("a")
    gate.release("a")
    gate.release("b")
    assert gate.open == 0 and gate.per_peer == {}
