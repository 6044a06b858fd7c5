"""The per-connection protocol state machine (``topic_broker.connection``), driven without sockets."""

from __future__ import annotations

import struct

import pytest

from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.connection import (
    HANDLERS,
    MIN_CLIENT_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    ConnectionConfig,
    ConnState,
    ProtocolConnection,
)

T = pb.BaseCommand


def cmd(**kw: object) -> bytes:
    return wire.encode_command(T(**kw))  # type: ignore[arg-type]


def connect_frame(version: int = 20) -> bytes:
    return cmd(type=T.CONNECT, connect=pb.CommandConnect(client_version="test", protocol_version=version))


def decode(data: bytes) -> list[pb.BaseCommand]:
    return [f.command for f in wire.FrameDecoder().feed(data)]


def connected(now: float = 0.0, **config: object) -> ProtocolConnection:
    conn = ProtocolConnection(ConnectionConfig(**config), now)  # type: ignore[arg-type]
    assert conn.receive_data(connect_frame(), now) == []
    conn.data_to_send()
    return conn


def test_connect_is_answered_with_server_version_and_the_negotiated_protocol() -> None:
    conn = ProtocolConnection(ConnectionConfig(max_message_size=1234))
    assert conn.state is ConnState.AWAITING_CONNECT
    assert conn.receive_data(connect_frame(20), 0.0) == []
    (reply,) = decode(conn.data_to_send())
    assert reply.type == T.CONNECTED
    assert reply.connected.server_version  # the client requires it
    assert reply.connected.protocol_version == min(20, PROTOCOL_VERSION)
    assert reply.connected.max_message_size == 1234
    assert conn.state is ConnState.CONNECTED
    assert conn.client_version == "test"


def test_an_older_client_gets_its_own_version_back() -> None:
    conn = ProtocolConnection()
    conn.receive_data(connect_frame(MIN_CLIENT_PROTOCOL_VERSION), 0.0)
    (reply,) = decode(conn.data_to_send())
    assert reply.connected.protocol_version == MIN_CLIENT_PROTOCOL_VERSION


def test_a_client_below_the_minimum_version_is_refused_and_closed() -> None:
    conn = ProtocolConnection()
    conn.receive_data(connect_frame(MIN_CLIENT_PROTOCOL_VERSION - 1), 0.0)
    (reply,) = decode(conn.data_to_send())
    assert reply.type == T.ERROR and reply.error.error == pb.UnsupportedVersionError
    assert conn.closed


@pytest.mark.parametrize(
    "first",
    [
        cmd(type=T.PING, ping=pb.CommandPing()),
        cmd(type=T.LOOKUP, lookupTopic=pb.CommandLookupTopic(topic="t", request_id=7)),
    ],
)
def test_anything_but_connect_first_gets_an_error_and_closes(first: bytes) -> None:
    conn = ProtocolConnection()
    assert conn.receive_data(first, 0.0) == []
    (reply,) = decode(conn.data_to_send())
    assert reply.type == T.ERROR and reply.error.error == pb.ServiceNotReady
    assert conn.closed and conn.close_reason
    assert conn.receive_data(connect_frame(), 0.0) == [], "nothing is processed after the close"


def test_the_request_id_of_a_command_before_connect_is_echoed() -> None:
    conn = ProtocolConnection()
    conn.receive_data(cmd(type=T.LOOKUP, lookupTopic=pb.CommandLookupTopic(topic="t", request_id=7)), 0.0)
    (reply,) = decode(conn.data_to_send())
    assert reply.error.request_id == 7


def test_a_second_connect_closes() -> None:
    conn = connected()
    conn.receive_data(connect_frame(), 1.0)
    assert conn.closed and "second CONNECT" in (conn.close_reason or "")


def test_ping_is_answered_inside_and_pong_is_swallowed() -> None:
    conn = connected()
    assert conn.receive_data(cmd(type=T.PING, ping=pb.CommandPing()), 1.0) == []
    assert [c.type for c in decode(conn.data_to_send())] == [T.PONG]
    assert conn.receive_data(cmd(type=T.PONG, pong=pb.CommandPong()), 1.0) == []
    assert conn.data_to_send() == b""


def test_commands_become_requests_for_their_handlers_in_order() -> None:
    conn = connected()
    data = cmd(
        type=T.PARTITIONED_METADATA,
        partitionMetadata=pb.CommandPartitionedTopicMetadata(topic="t", request_id=1),
    ) + cmd(type=T.FLOW, flow=pb.CommandFlow(consumer_id=3, messagePermits=10))
    reqs = conn.receive_data(data, 1.0)
    assert [r.handler for r in reqs] == ["on_partitioned_metadata", "on_flow"]
    assert reqs[1].body.messagePermits == 10  # type: ignore[attr-defined]
    assert all(r.handler == HANDLERS[r.type][1] for r in reqs)


def test_a_frame_split_across_reads_is_decoded_once_complete() -> None:
    conn = connected()
    frame = cmd(type=T.FLOW, flow=pb.CommandFlow(consumer_id=1, messagePermits=5))
    assert conn.receive_data(frame[:3], 1.0) == []
    assert conn.receive_data(frame[3:9], 1.0) == []
    (req,) = conn.receive_data(frame[9:], 1.0)
    assert req.handler == "on_flow"


def test_a_send_carries_its_entry_and_checksum_verdict() -> None:
    conn = connected()
    send = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=0))
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    good = wire.encode_send(send, md, b"hello")
    bad = bytearray(good)
    bad[-1] ^= 0xFF
    ok, corrupt = conn.receive_data(good + bytes(bad), 1.0)
    assert ok.handler == corrupt.handler == "on_send"
    assert ok.frame.checksum_ok and not corrupt.frame.checksum_ok
    assert ok.frame.entry is not None and ok.frame.entry.endswith(b"hello")


def test_an_unserved_command_with_a_request_id_gets_not_allowed_and_the_connection_stays() -> None:
    conn = connected()
    frame = cmd(type=T.ACK_RESPONSE, ackResponse=pb.CommandAckResponse(consumer_id=1, request_id=42))
    assert conn.receive_data(frame, 1.0) == []
    (reply,) = decode(conn.data_to_send())
    assert reply.type == T.ERROR and reply.error.error == pb.NotAllowedError
    assert reply.error.request_id == 42
    assert not conn.closed


def test_an_unserved_command_without_a_request_id_is_ignored() -> None:
    conn = connected()
    assert conn.receive_data(cmd(type=T.NEW_TXN), 1.0) == []
    assert conn.data_to_send() == b""
    assert not conn.closed


def test_a_known_command_without_its_body_closes() -> None:
    conn = connected()
    conn.receive_data(cmd(type=T.FLOW), 1.0)
    assert conn.closed and "without" in (conn.close_reason or "")


def test_a_connect_without_its_body_closes() -> None:
    conn = ProtocolConnection()
    assert conn.receive_data(cmd(type=T.CONNECT), 0.0) == []
    assert conn.closed


@pytest.mark.parametrize(
    "data",
    [
        struct.pack(">I", 64 * 1024 * 1024) + b"x" * 100,  # over the maximum frame size
        b"\x00\x00\x00\x09garbage!!",  # sizes that do not add up / not protobuf
    ],
)
def test_an_undecodable_frame_closes_the_connection(data: bytes) -> None:
    conn = connected(max_message_size=1024 * 1024)
    assert conn.receive_data(data, 1.0) == []
    assert conn.closed and (conn.close_reason or "").startswith("bad frame")


def test_output_is_queued_until_taken_and_dropped_after_close() -> None:
    conn = connected()
    conn.send(T(type=T.PING, ping=pb.CommandPing()))
    conn.send_raw(wire.pong())
    assert conn.has_data_to_send
    assert [c.type for c in decode(conn.data_to_send())] == [T.PING, T.PONG]
    assert not conn.has_data_to_send and conn.data_to_send() == b""
    conn.send_raw(wire.success(1))
    conn.close("done")
    conn.send_raw(wire.success(2))
    assert [c.success.request_id for c in decode(conn.data_to_send())] == [1], "queued before the close stays"


def test_keepalive_pings_when_idle_and_closes_when_the_ping_is_not_answered() -> None:
    conn = connected(now=0.0, keepalive_interval_s=30.0)
    conn.tick(29.0)
    assert not conn.has_data_to_send
    conn.tick(30.0)
    assert [c.type for c in decode(conn.data_to_send())] == [T.PING]
    conn.tick(45.0)
    assert not conn.closed
    conn.tick(60.0)
    assert conn.closed and "keep-alive" in (conn.close_reason or "")


def test_any_input_counts_as_an_answer_to_the_ping() -> None:
    conn = connected(now=0.0, keepalive_interval_s=30.0)
    conn.tick(30.0)
    conn.data_to_send()
    conn.receive_data(cmd(type=T.PONG, pong=pb.CommandPong()), 40.0)
    conn.tick(60.0)
    assert not conn.closed
    assert not conn.has_data_to_send, "not idle for a whole interval since the PONG"
    conn.tick(70.0)
    assert [c.type for c in decode(conn.data_to_send())] == [T.PING]


def test_no_keepalive_before_connect_and_no_connect_within_the_interval_closes() -> None:
    conn = ProtocolConnection(ConnectionConfig(keepalive_interval_s=1.0), 0.0)
    conn.tick(0.9)
    assert not conn.has_data_to_send and not conn.closed
    conn.tick(1.0)
    assert not conn.has_data_to_send, "no PING to a peer that has not connected"
    assert conn.closed and "no CONNECT within 1s" in (conn.close_reason or "")


def test_negative_message_ids_are_sent_as_uint64_and_read_back_signed() -> None:
    frame = wire.get_last_message_id_response(5, 3, -1)
    (reply,) = decode(frame)
    mid = reply.getLastMessageIdResponse.last_message_id
    assert mid.entryId == 2**64 - 1
    assert (wire.signed64(mid.ledgerId), wire.signed64(mid.entryId)) == (3, -1)
    assert wire.signed64(2**63 - 1) == 2**63 - 1  # MessageId.latest stays the largest id


@pytest.mark.parametrize(
    ("ledger_id", "entry_id", "highest", "big"),
    [(0, 0, None, 0), (3, -1, 7, 1), (2**63 - 1, 2**40 + 5, 2**62, 2**35), (128, 16383, 0, 300)],
)
def test_hand_encoded_receipts_and_messages_are_what_protobuf_encodes(
    ledger_id: int, entry_id: int, highest: int | None, big: int
) -> None:
    u64 = 2**64 - 1
    mid = pb.MessageIdData(ledgerId=ledger_id & u64, entryId=entry_id & u64)
    receipt = T(
        type=T.SEND_RECEIPT,
        send_receipt=pb.CommandSendReceipt(
            producer_id=big, sequence_id=big + 1, message_id=mid, highest_sequence_id=highest
        ),
    )
    assert wire.send_receipt(big, big + 1, ledger_id, entry_id, highest_sequence_id=highest) == (
        wire.encode_command(receipt)
    )
    entry = wire.make_entry(pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2), b"payload")
    message = T(
        type=T.MESSAGE,
        message=pb.CommandMessage(consumer_id=big, message_id=mid, redelivery_count=big % 2**32 or None),
    )
    assert wire.message(big, ledger_id, entry_id, entry, redelivery_count=big % 2**32) == wire.encode_message(
        message, entry
    )
