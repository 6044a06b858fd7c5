"""Schema compatibility of AVRO/JSON definitions (topic_broker.schema_compat): Avro's resolution rules and
Pulsar's strategies, on the definitions the Python client's ``pulsar.schema`` sends."""

from __future__ import annotations

import json
from typing import Any

import pytest

from topic_broker.schema_compat import (
    DEFAULT_STRATEGY,
    SchemaDefinitionError,
    can_read,
    check_strategy,
    incompatibility,
    parse_definition,
)


def record(*fields: dict[str, Any], name: str = "Reading") -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields)}


def enc(d: Any) -> bytes:
    return json.dumps(d).encode()


SENSOR = {"name": "sensor", "type": ["null", "string"]}
VALUE_NO_DEFAULT = {"name": "value", "type": ["null", "float"]}
VALUE_DEFAULT = {"name": "value", "type": ["null", "float"], "default": None}
V1 = record(SENSOR)


def test_the_default_strategy_is_pulsars_full() -> None:
    assert DEFAULT_STRATEGY == "FULL"
    assert check_strategy("backward_transitive") == "BACKWARD_TRANSITIVE"
    with pytest.raises(ValueError, match="FULL_TRANSITIVE"):
        check_strategy("LAX")
    why = incompatibility("LAX", enc(V1), [enc(V1)])
    assert why is not None and "unknown schema compatibility strategy 'LAX'" in why


def test_a_field_added_with_a_default_is_fully_compatible() -> None:
    v2 = record(SENSOR, VALUE_DEFAULT)
    for strategy in ("UNDEFINED", "FULL", "BACKWARD", "FORWARD", "FULL_TRANSITIVE"):
        assert incompatibility(strategy, enc(v2), [enc(V1)]) is None, strategy


def test_a_field_added_without_a_default_breaks_backward_and_names_the_field() -> None:
    v2 = record(SENSOR, VALUE_NO_DEFAULT)
    why = incompatibility("UNDEFINED", enc(v2), [enc(V1)])
    assert why is not None and "'value'" in why and "no default" in why and "FULL" in why
    assert incompatibility("BACKWARD", enc(v2), [enc(V1)]) is not None
    assert incompatibility("FORWARD", enc(v2), [enc(V1)]) is None  # old readers skip the new field


def test_a_field_removed_without_a_default_breaks_forward_only() -> None:
    v1 = record(SENSOR, VALUE_NO_DEFAULT)
    why = incompatibility("FORWARD", enc(V1), [enc(v1)])
    assert why is not None and "'value'" in why and "version 0 cannot read" in why
    assert incompatibility("BACKWARD", enc(V1), [enc(v1)]) is None
    assert incompatibility("FULL", enc(V1), [enc(v1)]) is not None
    assert incompatibility("FULL", enc(V1), [enc(record(SENSOR, VALUE_DEFAULT))]) is None


def test_type_changes_follow_avro_promotions() -> None:
    ints = record({"name": "n", "type": "int"})
    longs = record({"name": "n", "type": "long"})
    strings = record({"name": "n", "type": "string"})
    assert can_read(longs, ints) is None  # int is promoted to long
    assert can_read(ints, longs) is not None
    assert incompatibility("BACKWARD", enc(longs), [enc(ints)]) is None
    assert incompatibility("FULL", enc(longs), [enc(ints)]) is not None
    why = can_read(strings, ints)
    assert why is not None and "field 'n'" in why
    # a nullable field that becomes required: old data may hold null
    assert (
        can_read(record({"name": "s", "type": "string"}), V1 | {"fields": [{**SENSOR, "name": "s"}]})
        is not None
    )


def test_nested_records_arrays_maps_and_enums() -> None:
    inner1 = {"type": "record", "name": "Pos", "fields": [{"name": "x", "type": "double"}]}
    inner2 = {
        "type": "record",
        "name": "Pos",
        "fields": [{"name": "x", "type": "double"}, {"name": "y", "type": "double"}],
    }
    a = record(
        {"name": "pos", "type": inner1}, {"name": "tags", "type": {"type": "array", "items": "string"}}
    )
    b = record(
        {"name": "pos", "type": inner2}, {"name": "tags", "type": {"type": "array", "items": "string"}}
    )
    why = can_read(b, a)
    assert why is not None and "'pos.y'" in why
    m1 = record({"name": "m", "type": {"type": "map", "values": "int"}})
    m2 = record({"name": "m", "type": {"type": "map", "values": "boolean"}})
    assert can_read(m2, m1) is not None and can_read(m1, m1) is None
    e1 = record({"name": "c", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}})
    e2 = record({"name": "c", "type": {"type": "enum", "name": "Color", "symbols": ["RED"]}})
    assert can_read(e1, e2) is None
    why = can_read(e2, e1)
    assert why is not None and "GREEN" in why


def test_named_references_and_recursive_types_resolve() -> None:
    node = {
        "type": "record",
        "name": "Node",
        "fields": [{"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}],
    }
    assert can_read(node, node) is None
    assert parse_definition(enc(node)) == node


def test_transitive_strategies_check_every_version() -> None:
    v0 = record(SENSOR, VALUE_NO_DEFAULT)
    v1 = record(SENSOR, VALUE_DEFAULT)
    v2 = V1  # removes 'value': v1 (default) reads it, v0 (no default) does not
    assert incompatibility("FORWARD", enc(v2), [enc(v0), enc(v1)]) is None
    why = incompatibility("FORWARD_TRANSITIVE", enc(v2), [enc(v0), enc(v1)])
    assert why is not None and "version 0" in why


def test_always_strategies_and_bad_definitions() -> None:
    v2 = record(SENSOR, VALUE_NO_DEFAULT)
    assert incompatibility("ALWAYS_COMPATIBLE", enc(v2), [enc(V1)]) is None
    why = incompatibility("ALWAYS_INCOMPATIBLE", enc(V1 | {"doc": "x"}), [enc(V1)])
    assert why is not None and "ALWAYS_INCOMPATIBLE" in why
    why = incompatibility("FULL", b"{not json", [enc(V1)])
    assert why is not None and "not JSON" in why
    with pytest.raises(SchemaDefinitionError, match="unknown type 'Missing'"):
        parse_definition(enc(record({"name": "m", "type": "Missing"})))
    with pytest.raises(SchemaDefinitionError, match="no field list"):
        parse_definition(enc({"type": "record", "name": "R"}))


def test_python_client_definitions() -> None:
    """What ``pulsar.schema`` sends: a field without ``required_default`` has no default (so adding one is not
    FULL compatible, as in Pulsar), one with ``required_default=True`` has ``"default": null``."""
    schema = pytest.importorskip("pulsar.schema")

    class Reading(schema.Record):
        sensor = schema.String()

    class Plain(schema.Record):
        sensor = schema.String()
        value = schema.Float()

    class WithDefault(schema.Record):
        sensor = schema.String()
        value = schema.Float(required_default=True)

    def data(cls: Any) -> bytes:
        return schema.JsonSchema(cls).schema_info().schema().encode()

    old = [data(Reading)]
    assert incompatibility("UNDEFINED", data(WithDefault).replace(b"WithDefault", b"Reading"), old) is None
    why = incompatibility("UNDEFINED", data(Plain).replace(b"Plain", b"Reading"), old)
    assert why is not None and "'value'" in why
    why = incompatibility("UNDEFINED", data(WithDefault), old)
    assert why is not None and "record WithDefault" in why  # another record name


def test_schema_refusal_reuses_stored_versions_and_refuses_other_types() -> None:
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker.service import schema_refusal
    from zk.managed_ledgers import SchemaHistory, SchemaInfo

    v1 = SchemaInfo(type=pb.Schema.Json, data=enc(V1))
    no_default = SchemaInfo(type=pb.Schema.Json, data=enc(record(SENSOR, VALUE_NO_DEFAULT)))
    history = SchemaHistory((v1,))
    assert schema_refusal(SchemaHistory(), no_default, "FULL") is None  # the first definition of a topic
    assert schema_refusal(history, v1, "ALWAYS_INCOMPATIBLE") is None  # stored already: its version again
    why = schema_refusal(history, no_default, "UNDEFINED")
    assert why is not None and why.startswith("incompatible schema: FULL") and "'value'" in why
    assert schema_refusal(history, no_default, "FORWARD") is None
    why = schema_refusal(history, SchemaInfo(type=pb.Schema.Avro, data=enc(V1)), "ALWAYS_COMPATIBLE")
    assert why is not None and "is JSON, not AVRO" in why
    assert (
        schema_refusal(history, SchemaInfo(type=0), "FULL") is None
    )  # bytes (Schema.Type None) goes anywhere


def test_a_deletion_marker_ends_the_live_versions_and_numbering_goes_on() -> None:
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker.service import schema_refusal
    from zk.managed_ledgers import SchemaHistory, SchemaInfo

    v1 = SchemaInfo(type=pb.Schema.Json, data=enc(V1))
    no_default = SchemaInfo(type=pb.Schema.Json, data=enc(record(SENSOR, VALUE_NO_DEFAULT)))
    marker = SchemaInfo(type=0, deleted=True)
    history = SchemaHistory((v1, marker))
    assert SchemaHistory.from_json(history.to_json()) == history
    assert "deleted" not in history.to_json()["versions"][0]  # records without markers are written as before
    assert history.latest() is None and history.live() == [] and history.live_from == 2
    assert history.get(0) == v1 and history.get(1) is None and history.get(2) is None
    assert history.version_of(v1) is None  # from before the delete: not reused
    assert schema_refusal(history, no_default, "FULL") is None  # checked against the live versions only
    assert schema_refusal(history, SchemaInfo(type=pb.Schema.Avro, data=enc(V1)), "FULL") is None
    after = SchemaHistory((*history.versions, no_default))
    assert after.latest() == (2, no_default) and after.live() == [(2, no_default)]
    assert after.version_of(no_default) == 2 and after.get(0) == v1


def test_key_value_definitions_split_show_and_check_part_by_part() -> None:
    from topic_broker import schema_compat as sc

    key = b'{"type":"record","name":"K","fields":[{"name":"id","type":"int"}]}'
    value = enc(V1)
    data = sc.join_key_value(key, value)
    assert data[:4] == len(key).to_bytes(4, "big") and sc.split_key_value(data) == (key, value)
    assert sc.split_key_value(sc.join_key_value(b"", b"")) == (b"", b"")  # two primitives
    assert sc.split_key_value(b"\xff\xff\xff\xff" + b"\x00\x00\x00\x00") == (b"", b"")  # -1: no key
    for bad in (b"", b"\x00\x00\x00\x09abc", data + b"x", b"\xff\xff\xff\xfe\x00\x00\x00\x00"):
        with pytest.raises(sc.SchemaDefinitionError):
            sc.split_key_value(bad)
    avro = {"key.schema.type": "AVRO", "value.schema.type": "AVRO", "kv.encoding.type": "SEPARATED"}
    assert json.loads(sc.key_value_json(data, avro)) == {"key": json.loads(key), "value": json.loads(value)}
    assert json.loads(sc.key_value_json(sc.join_key_value(b"", value), {"value.schema.type": "JSON"})) == {
        "key": "",
        "value": json.loads(value),
    }  # no type said: BYTES, a primitive
    assert sc.key_value_from_json(sc.key_value_json(data, avro).encode()) == sc.join_key_value(
        key, json.dumps(json.loads(value), separators=(",", ":")).encode()
    )
    with pytest.raises(sc.SchemaDefinitionError):
        sc.key_value_from_json(b'{"key": ""}')

    stored = [(data, avro)]
    assert sc.key_value_incompatibility("FULL", data, avro, []) is None
    no_default = sc.join_key_value(key, enc(record(SENSOR, VALUE_NO_DEFAULT)))
    why = sc.key_value_incompatibility("FULL", no_default, avro, stored)
    assert why is not None and why.startswith("the value schema: FULL") and "'value'" in why
    assert sc.key_value_incompatibility("FORWARD", no_default, avro, stored) is None
    why = sc.key_value_incompatibility("ALWAYS_COMPATIBLE", data, {**avro, "key.schema.type": "JSON"}, stored)
    assert why == "incompatible key schema: the topic's key schema is AVRO, not JSON"
    strings = {"key.schema.type": "STRING", "value.schema.type": "STRING"}
    empty = sc.join_key_value(b"", b"")
    assert sc.key_value_incompatibility("FULL", empty, strings, [(empty, strings)]) is None
