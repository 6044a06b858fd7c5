"""The compactor's pure rules (topic_broker.compaction): phase one's latest id per key, phase two's entries, the
compacted-ledger framing, which SUBSCRIBEs compaction refuses, and the compaction monitor's decision (which
threshold applies, what backlog it is compared with, compact now or not)."""

from __future__ import annotations

import struct

import pytest

from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.compaction import (
    PhaseOne,
    compacted_out_mask,
    compaction_backlog,
    compaction_due,
    decode_compacted,
    encode_compacted,
    last_kept_index,
    phase_two_entry,
)
from topic_broker.managed_ledger import Position
from topic_broker.service import read_compacted_refusal
from zk.managed_ledgers import MetadataFormatError, NamespacePolicies, TopicPolicies, policy_in_force


def single(key: str | None, value: bytes) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    if key is not None:
        md.partition_key = key
    return wire.make_entry(md, value)


def batch(items: list[tuple[str | None, bytes]]) -> bytes:
    md = pb.MessageMetadata(
        producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=len(items)
    )
    parts = []
    for key, value in items:
        sm = pb.SingleMessageMetadata(payload_size=len(value))
        if key is not None:
            sm.partition_key = key
        meta = sm.SerializeToString()
        parts += [struct.pack(">I", len(meta)), meta, value]
    return wire.make_entry(md, b"".join(parts))


def run(entries: list[bytes]) -> list[tuple[Position, bytes]]:
    """Both phases over entries at positions (1, 0), (1, 1), …: what the compacted ledger holds."""
    one = PhaseOne()
    for i, data in enumerate(entries):
        one.add(Position(1, i), data)
    out = []
    for i, data in enumerate(entries):
        kept = phase_two_entry(one.latest, Position(1, i), data)
        if kept is not None:
            out.append((Position(1, i), kept))
    return out


def test_latest_per_key_tombstones_and_keyless_messages() -> None:
    entries = [single("a", b"1"), single("b", b"1"), single("a", b"2"), single(None, b"x"), single("b", b"")]
    kept = run(entries)
    assert [p for p, _ in kept] == [Position(1, 2), Position(1, 3)]  # a's latest, the keyless one
    assert all(data == entries[p.entry_id] for p, data in kept)  # kept as stored


def test_a_batch_keeps_its_entry_with_the_dropped_messages_compacted_out() -> None:
    entries = [batch([("a", b"1"), ("b", b"1"), (None, b"x")]), single("a", b"2"), batch([("c", b"1")])]
    kept = run(entries)
    assert [p for p, _ in kept] == [Position(1, 0), Position(1, 1), Position(1, 2)]
    rewritten = kept[0][1]
    md, payload = wire.parse_entry(rewritten)
    msgs = list(wire.iter_batch(md, payload))
    assert md.num_messages_in_batch == 3
    assert [(s.compacted_out, p) for s, p in msgs if s is not None] == [
        (True, b""),
        (False, b"1"),
        (False, b"x"),
    ]
    assert compacted_out_mask(rewritten) == 0b001
    assert last_kept_index(rewritten) == 2
    assert kept[2][1] == entries[2] and compacted_out_mask(entries[2]) == 0
    # a batch whose every message is superseded is left out; the next compaction skips compacted-out messages
    assert run([batch([("a", b"1")]), single("a", b"2")]) == [(Position(1, 1), single("a", b"2"))]
    assert run([rewritten]) == [(Position(1, 0), rewritten)]


def test_an_unparsable_entry_is_kept_whole() -> None:
    assert run([b"not a pulsar entry", single("a", b"1")])[0] == (Position(1, 0), b"not a pulsar entry")


def test_compacted_ledger_framing() -> None:
    raw = encode_compacted(Position(7, 3), b"entry")
    assert decode_compacted(raw) == (Position(7, 3), b"entry")
    with pytest.raises(wire.EntryFormatError):
        decode_compacted(b"short")


@pytest.mark.parametrize(
    ("sub_type", "read_compacted", "name", "refused"),
    [
        (pb.CommandSubscribe.Exclusive, True, "s", False),
        (pb.CommandSubscribe.Failover, True, "s", False),
        (pb.CommandSubscribe.Shared, True, "s", True),
        (pb.CommandSubscribe.Key_Shared, True, "s", True),
        (pb.CommandSubscribe.Shared, False, "s", False),
        (pb.CommandSubscribe.Exclusive, False, "__compaction", True),
    ],
)
def test_read_compacted_refusal(sub_type: int, read_compacted: bool, name: str, refused: bool) -> None:
    cmd = pb.CommandSubscribe(
        topic="t",
        subscription=name,
        subType=sub_type,
        consumer_id=1,
        request_id=1,
        read_compacted=read_compacted,
    )
    assert (read_compacted_refusal(cmd) is not None) is refused


@pytest.mark.parametrize(
    ("topic", "namespace", "broker", "expected"),
    [
        (None, None, 0, 0),  # nothing set: off
        (None, None, 500, 500),  # the broker's default
        (None, 100, 500, 100),  # the namespace's over the broker's
        (None, 0, 500, 0),  # a namespace's 0 turns it off
        (200, 100, 500, 200),  # the topic's over both
        (0, 100, 500, 0),  # a topic's 0 turns it off under a namespace threshold
        (300, None, 0, 300),
    ],
)
def test_policy_in_force_is_the_topics_then_the_namespaces_then_the_brokers(
    topic: int | None, namespace: int | None, broker: int, expected: int
) -> None:
    assert policy_in_force(topic, namespace, broker) == expected


def test_compaction_backlog_is_the_compaction_cursors_else_the_slowest_else_the_whole_topic() -> None:
    assert compaction_backlog(10, 700, 9000) == 10  # compacted before: what the next compaction reads
    assert compaction_backlog(0, 700, 9000) == 0
    assert compaction_backlog(None, 700, 9000) == 700  # never compacted: the slowest subscription's backlog
    assert compaction_backlog(None, None, 9000) == 9000  # no durable subscription: the whole topic


@pytest.mark.parametrize(
    ("threshold", "backlog", "running", "serving", "due"),
    [
        (100, 101, False, True, True),
        (100, 100, False, True, False),  # exceeded, not reached
        (100, 5000, True, True, False),  # one runs already: never two at once
        (100, 5000, False, False, False),  # unloaded or fenced: left alone
        (0, 5000, False, True, False),  # off
    ],
)
def test_compaction_due(threshold: int, backlog: int, running: bool, serving: bool, due: bool) -> None:
    assert compaction_due(threshold, backlog, running=running, serving=serving) is due


def test_compaction_thresholds_stored_unset_set_and_refused_negative() -> None:
    assert NamespacePolicies.from_json({}).compaction_threshold is None  # znodes written before it
    p = NamespacePolicies(compaction_threshold=1024)
    assert NamespacePolicies.from_json(p.to_json()) == p
    assert NamespacePolicies().to_json()["compaction_threshold"] is None  # a removal overwrites the old value
    assert TopicPolicies.from_json(TopicPolicies(compaction_threshold=0).to_json()).compaction_threshold == 0
    assert TopicPolicies().empty and not TopicPolicies(compaction_threshold=0).empty
    assert not TopicPolicies(message_ttl_in_seconds=0).empty
    tp = TopicPolicies(message_ttl_in_seconds=60)
    assert TopicPolicies.from_json(tp.to_json()) == tp
    assert (
        TopicPolicies.from_json({"compaction_threshold": 5}).message_ttl_in_seconds is None
    )  # written before
    with pytest.raises(MetadataFormatError, match="negative"):
        TopicPolicies.from_json({"compaction_threshold": -1})
    with pytest.raises(MetadataFormatError, match="wrong type"):
        NamespacePolicies.from_json({"compaction_threshold": "1k"})
