"""MESSAGE frames written as their head plus the stored entry (two buffers, the entry not copied)."""

from __future__ import annotations

import pytest

from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.connection import ConnectionConfig, ProtocolConnection

T = pb.BaseCommand


def _entry(n: int) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=3, publish_time=1000, num_messages_in_batch=n)
    return wire.make_entry(md, b"m" * (10 * n))


@pytest.mark.parametrize("redelivery_count", [0, 1, 300])
def test_head_and_entry_make_the_message_frame(redelivery_count: int) -> None:
    entry = _entry(31)
    head = wire.message_head(12, 2**40, 7, len(entry), redelivery_count=redelivery_count)
    assert head + entry == wire.message(12, 2**40, 7, entry, redelivery_count=redelivery_count)
    (frame,) = wire.FrameDecoder().feed(head + entry)
    assert frame.command.type == T.MESSAGE and frame.entry == entry and frame.checksum_ok
    m = frame.command.message
    assert (m.consumer_id, m.message_id.ledgerId, m.message_id.entryId) == (12, 2**40, 7)
    assert m.redelivery_count == redelivery_count


@pytest.mark.parametrize("partition", [0, 3, 200])
def test_a_partitions_message_id_carries_its_index(partition: int) -> None:
    """A partition's MESSAGE names the partition in its id, as Pulsar's broker sends it (the client's MessageId
    then equals the one the producer was given); the hand-built head is protobuf's encoding of the same fields."""
    entry = _entry(1)
    head = wire.message_head(4, 9, 2, len(entry), partition=partition)
    assert head + entry == wire.message(4, 9, 2, entry, partition=partition)
    cmd = T(
        type=T.MESSAGE,
        message=pb.CommandMessage(
            consumer_id=4, message_id=pb.MessageIdData(ledgerId=9, entryId=2, partition=partition)
        ),
    )
    assert (head + entry) == wire.encode_message(cmd, entry)
    (frame,) = wire.FrameDecoder().feed(head + entry)
    assert frame.command.message.message_id.partition == partition


def test_a_head_is_refused_for_what_no_frame_can_carry() -> None:
    with pytest.raises(ValueError, match="consumer -1"):
        wire.message_head(-1, 1, 1, 100)
    with pytest.raises(ValueError, match="redelivery count 4294967296"):
        wire.message_head(1, 1, 1, 100, redelivery_count=2**32)
    with pytest.raises(ValueError, match="an entry of 3 bytes"):
        wire.message_head(1, 1, 1, 3)


def test_take_frames_hands_over_the_queued_buffers_once() -> None:
    conn = ProtocolConnection(ConnectionConfig(), 0.0)
    entry = _entry(2)
    head = wire.message_head(1, 5, 0, len(entry))
    conn.send_raw(head)
    conn.send_raw(entry)
    frames = conn.take_frames()
    assert frames == [head, entry] and frames[1] is entry, "the entry itself, not a copy"
    assert conn.take_frames() == [] and not conn.has_data_to_send and conn.data_to_send() == b""
    conn.send_raw(head)
    conn.send_raw(entry)
    assert conn.data_to_send() == head + entry
