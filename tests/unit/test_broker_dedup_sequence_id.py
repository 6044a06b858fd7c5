"""``dedup_sequence_id``: the id deduplication keeps for a SEND or a stored entry."""

from __future__ import annotations

import struct

from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.service import dedup_sequence_id


def batch(ids: list[int], *, with_ids: bool = True) -> bytes:
    body = bytearray()
    for i in ids:
        single = pb.SingleMessageMetadata(payload_size=3, partition_key="k")
        if with_ids:
            single.sequence_id = i
        raw = single.SerializeToString()
        body += struct.pack(">I", len(raw)) + raw + b"abc"
    md = pb.MessageMetadata(
        producer_name="p", sequence_id=ids[0], publish_time=1, num_messages_in_batch=len(ids)
    )
    return wire.make_entry(md, bytes(body))


def test_a_batch_numbered_one_after_the_other_is_kept_by_its_last_id() -> None:
    assert dedup_sequence_id(10, None, 5, batch([10, 11, 12, 13, 14])) == 14


def test_a_key_based_batch_is_kept_by_its_first_id() -> None:
    # key A's batch 0, 2, 4, 5 is followed by key B's 1, 3: B's first id is above what A's batch leaves
    assert dedup_sequence_id(0, None, 4, batch([0, 2, 4, 5])) == 0
    assert dedup_sequence_id(1, None, 2, batch([1, 3])) == 1


def test_a_declared_highest_id_wins_and_a_single_message_is_its_id() -> None:
    assert dedup_sequence_id(10, 19, 10, batch(list(range(10, 20)))) == 19
    assert dedup_sequence_id(7, None, 1, b"not parsed") == 7


def test_a_batch_without_per_message_ids_or_unparsable_is_kept_by_its_first_id() -> None:
    assert dedup_sequence_id(10, None, 3, batch([10, 11, 12], with_ids=False)) == 10
    assert dedup_sequence_id(10, None, 3, b"\x00garbage") == 10
