"""``dedup_sequence_id``: the id deduplication keeps for a SEND or a stored entry."""

from __future__ import annotations

import struct
import zlib

from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.service import dedup_sequence_id, dedup_walk


def batch(
    ids: list[int], *, with_ids: bool = True, payload: bytes = b"abc", compressed: bool = False
) -> bytes:
    body = bytearray()
    for i in ids:
        single = pb.SingleMessageMetadata(payload_size=len(payload), partition_key="k")
        if with_ids:
            single.sequence_id = i
        raw = single.SerializeToString()
        body += struct.pack(">I", len(raw)) + raw + payload
    md = pb.MessageMetadata(
        producer_name="p", sequence_id=ids[0], publish_time=1, num_messages_in_batch=len(ids)
    )
    if not compressed:
        return wire.make_entry(md, bytes(body))
    md.compression, md.uncompressed_size = pb.ZLIB, len(body)
    return wire.make_entry(md, zlib.compress(bytes(body)))


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


def test_the_batch_walk_finds_what_iter_batch_shows() -> None:
    """wire.batch_last_sequence_id (the send path's walk) against iter_batch: the last id stated, None when
    none is, ZLIB inflated, and the same refusals of a batch that overruns."""
    import zlib

    import pytest

    def last_by_iter(entry: bytes) -> int | None:
        md, payload = wire.parse_entry(entry, verify_checksum=False)
        ids = [
            s.sequence_id
            for s, _ in wire.iter_batch(md, payload)
            if s is not None and s.HasField("sequence_id")
        ]
        return ids[-1] if ids else None

    def walk(entry: bytes) -> int | None:
        return wire.batch_last_sequence_id(*wire.parse_entry(entry, verify_checksum=False))

    for entry in (batch([4, 5, 6]), batch([0, 2, 4, 5]), batch([9]), batch([1, 2], with_ids=False)):
        assert walk(entry) == last_by_iter(entry)
    assert walk(batch([3, 7, 8])) == 8 and walk(batch([1, 2], with_ids=False)) is None
    md, payload = wire.parse_entry(batch([10, 11, 12]), verify_checksum=False)
    md.compression = pb.ZLIB
    md.uncompressed_size = len(payload)
    assert wire.batch_last_sequence_id(md, zlib.compress(bytes(payload))) == 12
    md, payload = wire.parse_entry(batch([1, 2, 3]), verify_checksum=False)
    for cut in (len(payload) - 1, 2):  # a payload, a size field cut short
        with pytest.raises(wire.EntryFormatError):
            list(wire.iter_batch(md, payload[:cut]))
        with pytest.raises(wire.EntryFormatError):
            wire.batch_last_sequence_id(md, payload[:cut])


def test_a_batch_that_inflates_past_the_loops_bound_is_walked_by_a_function_for_a_worker_thread() -> None:
    """The send path walks a ZLIB batch inflating past ``wire.INFLATE_ON_LOOP_MAX`` in a worker thread
    (``dedup_walk`` answers the walk), a smaller one inline (it answers the id)."""
    ids = list(range(10, 20))
    small = batch(ids, compressed=True)
    large = batch(ids, payload=bytes(wire.INFLATE_ON_LOOP_MAX // len(ids) + 1), compressed=True)
    assert dedup_walk(10, None, 10, small) == 19
    walk = dedup_walk(10, None, 10, large)
    assert callable(walk) and walk() == 19 == dedup_sequence_id(10, None, 10, large)
    key_based = batch([0, 2, 4], payload=bytes(wire.INFLATE_ON_LOOP_MAX), compressed=True)
    walk = dedup_walk(0, None, 3, key_based)
    assert callable(walk) and walk() == 0
    # nothing to inflate: a declared highest id, a single message, a batch not compressed
    assert dedup_walk(10, 19, 10, large) == 19
    assert dedup_walk(7, None, 1, large) == 7
    assert dedup_walk(10, None, 10, batch(ids, payload=bytes(wire.INFLATE_ON_LOOP_MAX))) == 19
