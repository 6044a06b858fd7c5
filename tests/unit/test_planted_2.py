"""Tests for the bugs planted in the audit of 2026-11-28 against b6de126 that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of the code since the earlier audits"): each fails with its
bug planted and passes without it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bookie import protocol as p
from bookie.storage import decode_run, pack_block_run

# ---- READ_RANGE replies built from stored runs (bookie/protocol.py, daa8231, 95bcee5) ----


def _run_piece(entries: list[bytes]) -> p.RangePiece:
    """A stored run of consecutive ``entries`` from id 0, every one picked."""
    value = pack_block_run(list(range(len(entries))), entries)
    _, offsets, _ = decode_run(0, value)
    return value, offsets, range(len(entries))


def _entries_of(frame: bytes | bytearray) -> list[bytes]:
    r = p.decode_one_response(bytes(frame))
    assert isinstance(r, p.ReadRangeResponse) and r.status == p.Status.OK
    return list(r.entries)


@pytest.mark.parametrize("last_size", [7, 13])
def test_a_run_whose_last_entry_alone_has_another_size_is_sent_as_stored(last_size: int) -> None:
    """The strided-block path is taken only when every picked entry, the last one included, has the first one's
    size: a run of 10-byte entries ending in a shorter or longer one is cut out entry by entry."""
    entries = [bytes([i]) * 10 for i in range(5)] + [b"z" * last_size]
    frame, n, size, trimmed = p.encode_read_range_pieces(1, 7, 0, iter([_run_piece(entries)]), 1 << 20, 6)
    assert (n, size, trimmed) == (6, 50 + last_size, False)
    assert _entries_of(frame) == entries


def test_mixed_size_entries_that_fill_max_bytes_exactly_are_all_sent() -> None:
    """``max_bytes`` is a limit the entries may reach: entries of mixed sizes adding up to it exactly all go
    in one reply, as same-size ones do."""
    entries = [b"a" * 10, b"b" * 20, b"c" * 30]
    frame, n, size, _ = p.encode_read_range_pieces(1, 7, 0, iter([_run_piece(entries)]), 60, 3)
    assert (n, size) == (3, 60) and _entries_of(frame) == entries
    same = [b"d" * 20] * 3
    frame, n, size, _ = p.encode_read_range_pieces(1, 7, 0, iter([_run_piece(same)]), 60, 3)
    assert (n, size) == (3, 60) and _entries_of(frame) == same


# ---- cluster status from a bookie's /health (ledgerstore/cluster.py, 6264a81, 937bdff) ----


def test_cluster_status_tells_a_starting_bookie_from_a_running_one() -> None:
    """A bookie restarted after a crash answers /health 503 "starting" until its old registration is gone:
    `cluster status` lists it STARTING with the reason, not plainly up (clients cannot find it yet)."""
    from ledgerstore.cluster import _bookie_health

    starting = {
        "status": "starting",
        "reason": "registering in ZooKeeper",
        "readonly": False,
        "bookie_id": "b",
    }
    assert _bookie_health(True, starting) == " STARTING: registering in ZooKeeper"
    assert _bookie_health(True, {"status": "ok", "readonly": False, "bookie_id": "b"}) == ""
    assert _bookie_health(True, {"status": "ok", "readonly": True, "bookie_id": "b"}) == " read-only"
    assert _bookie_health(True, {"status": "failed", "reason": "disk", "readonly": True}) == " FAILED: disk"
    assert _bookie_health(True, None) == " NOT ANSWERING (/health)"
    assert _bookie_health(False, None) == ""


# ---- KEY_VALUE schemas checked part by part (topic_broker/schema_compat.py, c392557) ----

_SENSOR = {"name": "sensor", "type": ["null", "string"]}
_NO_DEFAULT = {"name": "value", "type": ["null", "float"]}


def _record(*fields: dict[str, Any]) -> bytes:
    return json.dumps({"type": "record", "name": "Reading", "fields": list(fields)}).encode()


def test_a_key_value_schema_whose_value_part_changes_type_is_refused() -> None:
    """Each part's type must be the latest version's, the value's as the key's: a STRING key with an AVRO value
    then a STRING key with a JSON value is refused, naming the value."""
    from topic_broker import schema_compat as sc

    data = sc.join_key_value(b"", _record(_SENSOR))
    avro = {"key.schema.type": "STRING", "value.schema.type": "AVRO"}
    as_json = {"key.schema.type": "STRING", "value.schema.type": "JSON"}
    why = sc.key_value_incompatibility("ALWAYS_COMPATIBLE", data, as_json, [(data, avro)])
    assert why == "incompatible value schema: the topic's value schema is AVRO, not JSON"


@pytest.mark.parametrize("part", ["key", "value"])
def test_a_json_part_of_a_key_value_schema_is_checked_as_an_avro_part_is(part: str) -> None:
    """A JSON key or value (an Avro definition, as the clients send JSON schemas) gaining a field without a
    default is refused under FULL, as an AVRO part is, and accepted under FORWARD."""
    from topic_broker import schema_compat as sc

    def kv(definition: bytes) -> bytes:
        return sc.join_key_value(definition, b"") if part == "key" else sc.join_key_value(b"", definition)

    props = {"key.schema.type": "STRING", "value.schema.type": "STRING", f"{part}.schema.type": "JSON"}
    stored = [(kv(_record(_SENSOR)), props)]
    new = kv(_record(_SENSOR, _NO_DEFAULT))
    why = sc.key_value_incompatibility("FULL", new, props, stored)
    assert why is not None and why.startswith(f"the {part} schema: FULL") and "'value'" in why, why
    assert sc.key_value_incompatibility("FORWARD", new, props, stored) is None


def test_a_key_value_schema_after_a_schema_delete_is_checked_against_the_versions_after_it_only() -> None:
    """After the admin's DELETE of a topic's schema (a deletion marker, 838c216) a KEY_VALUE schema is checked
    against the live versions only: parts of other types than the deleted versions' are accepted, and a
    definition the deleted versions would refuse is too; before the delete both are refused."""
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import schema_compat as sc
    from topic_broker.service import schema_refusal
    from zk.managed_ledgers import SchemaHistory, SchemaInfo

    avro = {"key.schema.type": "STRING", "value.schema.type": "AVRO"}
    old = SchemaInfo(type=pb.Schema.KeyValue, data=sc.join_key_value(b"", _record(_SENSOR)), properties=avro)
    marker = SchemaInfo(type=0, deleted=True)
    as_json = {"key.schema.type": "STRING", "value.schema.type": "JSON"}
    other_type = SchemaInfo(type=pb.Schema.KeyValue, data=old.data, properties=as_json)
    evolved = SchemaInfo(
        type=pb.Schema.KeyValue, data=sc.join_key_value(b"", _record(_SENSOR, _NO_DEFAULT)), properties=avro
    )
    for new in (other_type, evolved):
        assert schema_refusal(SchemaHistory((old,)), new, "FULL") is not None
        assert schema_refusal(SchemaHistory((old, marker)), new, "FULL") is None


# ---- delayed delivery (topic_broker/subscription.py) ----


@pytest.mark.parametrize("early_ms", [1, 999])
def test_a_delayed_message_due_a_moment_after_its_read_is_held_until_it_is_due(early_ms: int) -> None:
    """On Shared, a message read ``early_ms`` before its deliver_at time is held back, not delivered at once;
    it goes at that time and not a millisecond before."""
    from tests.unit.test_subscription import FakeLog, delivered, run
    from topic_broker.subscription import Command, Read, Subscription, SubType

    sub = Subscription(SubType.SHARED, read_position=(1, 0))
    log = FakeLog(1)
    log.entries[0].deliver_at = 10_000
    sub.add_consumer(1, "a")
    out: list[Command] = []
    for c in sub.flow(1, 10):
        assert isinstance(c, Read)
        entries, nxt = log.read(c.start, c.max_entries)
        out += sub.on_read(c.epoch, entries, nxt, now_ms=10_000 - early_ms)
    assert delivered(run(sub, log, out)) == [] and sub.delayed_count == 1
    assert delivered(run(sub, log, sub.release_delayed(9_999))) == []
    assert [p for _, p, _ in delivered(run(sub, log, sub.release_delayed(10_000)))] == [(1, 0)]


# ---- batch-index acks (topic_broker/subscription.py) ----


def test_an_ack_set_that_leaves_only_messages_acked_before_unacked_acks_the_entry() -> None:
    """Ack sets of one batch from two consumers (the batch moved to another one between them): the second
    names as unacked only the message the first acked, so with it every message of the batch is acked and the
    entry is, not kept pending (and redelivered) with nothing left to ack."""
    from tests.unit.test_subscription import FakeLog, run
    from topic_broker.subscription import Subscription, SubType

    sub = Subscription(SubType.SHARED, read_position=(1, 0))
    log = FakeLog(1, batch=3)
    sub.add_consumer(1, "a")
    run(sub, log, sub.flow(1, 100))
    assert sub.ack_individual([((1, 0), -1, [0b110])]).acked == []  # message 0
    assert sub.ack_individual([((1, 0), -1, [0b001])]).acked == [(1, 0)]  # messages 1 and 2
    assert sub.pending(1) == []
