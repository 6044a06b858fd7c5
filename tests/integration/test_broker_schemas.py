"""Schemas as users of the official ``pulsar-client`` declare them (``pulsar.schema``): Avro and JSON records,
strings, the versions the client is told, and Pulsar's compatibility check of a new AVRO or JSON definition
(FULL by default: a new field needs a default). One broker on 3 bookies is shared by the module; every test
uses its own topics."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import module_cluster
from tests.integration import test_broker_client_features3 as features3
from tests.integration.test_broker_pulsar_client import _connect, _get_schema, _raw, drain, topic_name
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.service import schema_refusal
from zk import MetadataStore
from zk.managed_ledgers import BrokerMetadataStore, SchemaInfo, SchemaRefusedError

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("fastavro")  # what the client's AvroSchema needs (the pulsar extra installs it)
T = pb.BaseCommand

from pulsar.schema import AvroSchema, Float, Integer, JsonSchema, Record, String, StringSchema  # noqa: E402

c = features3.c  # a client of the module's broker (fixture)


@pytest.fixture(scope="module")
def bp(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("schemas")) as brokers:
        yield brokers.procs[0]


def refusal(bp: BrokerProcess, topic: str, schema: Any) -> str:
    """The error a PRODUCER declaring ``schema`` (a ``pulsar.schema`` record schema) gets on ``topic``, read
    from the wire (the client only logs it); "" if the producer is accepted."""
    info = schema.schema_info()
    kind = pb.Schema.Json if isinstance(schema, JsonSchema) else pb.Schema.Avro
    return _raw_producer(
        bp, topic, pb.Schema(name=info.name(), schema_data=info.schema().encode(), type=kind)
    )


def refusal_of_string(bp: BrokerProcess, topic: str) -> str:
    return _raw_producer(bp, topic, pb.Schema(name="String", schema_data=b"", type=pb.Schema.String))


def _declare(bp: BrokerProcess, topic: str, declared: pb.Schema) -> tuple[Any, wire.FrameDecoder, Any]:
    """A connection whose PRODUCER (id 1) declares ``declared`` on ``topic``: the socket (the caller closes
    it), its frame decoder and the broker's answer (PRODUCER_SUCCESS or ERROR)."""
    s = _raw(bp)
    try:
        _connect(s)
        cmd = pb.CommandProducer(topic=topic, producer_id=1, request_id=1, schema=declared)
        s.sendall(wire.encode_command(T(type=T.PRODUCER, producer=cmd)))
        dec = wire.FrameDecoder()
        frames: list[Any] = []
        while not frames:
            frames = dec.feed(s.recv(65536))
        return s, dec, frames[0].command
    except BaseException:
        s.close()
        raise


def _raw_producer(bp: BrokerProcess, topic: str, declared: pb.Schema) -> str:
    s, _dec, answer = _declare(bp, topic, declared)
    s.close()
    if answer.type == T.PRODUCER_SUCCESS:
        return ""
    assert answer.type == T.ERROR
    assert answer.error.error == pb.IncompatibleSchema
    return str(answer.error.message)


def admin(bp: BrokerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{bp.http_port}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode(errors="replace")


def versions(msgs: list[Any]) -> list[int]:
    """Each message's schema version, as the client gives it: the broker's 8 version bytes, as a str."""
    out = []
    for m in msgs:
        v = m.schema_version()
        raw = v.encode("latin-1") if isinstance(v, str) else bytes(v)
        out.append(int.from_bytes(raw, "big") if raw else -1)
    return out


# The record classes: the Python client names an Avro record after its class, and a record of another name is
# not the same record (Avro's rule), so each evolution is a class of the same name made in a function.


class Reading(Record):
    sensor = String()
    count = Integer(required=True)


def reading_v2(with_default: bool) -> type[Record]:
    class Reading(Record):
        sensor = String()
        count = Integer(required=True)
        value = Float(required_default=True) if with_default else Float()

    return Reading


def reading_without_count() -> type[Record]:
    class Reading(Record):
        sensor = String()

    return Reading


# -- round trips ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [AvroSchema, JsonSchema])
def test_record_round_trip(c: Any, kind: Any) -> None:
    t = f"persistent://public/default/{topic_name()}"
    consumer = c.subscribe(t, "s", schema=kind(Reading), initial_position=pulsar.InitialPosition.Earliest)
    producer = c.create_producer(t, schema=kind(Reading))
    for i in range(5):
        producer.send(Reading(sensor=f"s{i}", count=i))
    got = drain(consumer, 5)
    assert [(m.value().sensor, m.value().count) for m in got] == [(f"s{i}", i) for i in range(5)]
    assert versions(got) == [0] * 5
    # a second consumer declaring the same schema is accepted and reads the same values
    again = c.subscribe(t, "s2", schema=kind(Reading), initial_position=pulsar.InitialPosition.Earliest)
    assert [m.value().count for m in drain(again, 5)] == list(range(5))


def test_string_schema_and_a_record_schema_on_it_is_refused(bp: BrokerProcess, c: Any) -> None:
    t = f"persistent://public/default/{topic_name()}"
    c.create_producer(t, schema=StringSchema()).send("hello")
    consumer = c.subscribe(t, "s", schema=StringSchema(), initial_position=pulsar.InitialPosition.Earliest)
    assert consumer.receive(timeout_millis=10_000).value() == "hello"
    with pytest.raises(pulsar.IncompatibleSchema):
        c.create_producer(t, schema=AvroSchema(Reading))
    assert "the topic's schema is STRING, not AVRO" in refusal(bp, t, AvroSchema(Reading))


# -- evolution ------------------------------------------------------------------------------------------------


def test_avro_field_with_a_default_is_a_new_version_read_by_old_and_new_consumers(c: Any) -> None:
    t = f"persistent://public/default/{topic_name()}"
    v2 = reading_v2(with_default=True)
    old = c.subscribe(t, "old", schema=AvroSchema(Reading), initial_position=pulsar.InitialPosition.Earliest)
    c.create_producer(t, schema=AvroSchema(Reading)).send(Reading(sensor="a", count=1))
    p2 = c.create_producer(t, schema=AvroSchema(v2))
    p2.send(v2(sensor="b", count=2, value=2.5))
    # the old consumer gets each message's writer schema by its version and reads the new one without 'value'
    got = drain(old, 2)
    assert versions(got) == [0, 1]
    assert [(m.value().sensor, m.value().count) for m in got] == [("a", 1), ("b", 2)]
    new = c.subscribe(t, "new", schema=AvroSchema(v2), initial_position=pulsar.InitialPosition.Earliest)
    got = drain(new, 2)
    assert [(m.value().sensor, m.value().value) for m in got] == [("a", None), ("b", 2.5)]
    # the first definition again is version 0 again, not a third version
    c.create_producer(t, schema=AvroSchema(Reading)).send(Reading(sensor="c", count=3))
    assert versions(drain(old, 1)) == [0]


@pytest.mark.parametrize("kind", [AvroSchema, JsonSchema])
def test_a_field_without_a_default_is_refused_naming_the_field(bp: BrokerProcess, c: Any, kind: Any) -> None:
    t = f"persistent://public/default/{topic_name()}"
    c.create_producer(t, schema=kind(Reading)).send(Reading(sensor="a", count=1))
    with pytest.raises(pulsar.IncompatibleSchema):
        c.create_producer(t, schema=kind(reading_v2(with_default=False)))
    why = refusal(bp, t, kind(reading_v2(with_default=False)))
    assert "FULL" in why and "field 'value'" in why and "no default" in why, why
    # removing a field that has no default: old consumers could not read the new data (FORWARD half of FULL)
    with pytest.raises(pulsar.IncompatibleSchema):
        c.create_producer(t, schema=kind(reading_without_count()))
    why = refusal(bp, t, kind(reading_without_count()))
    assert "FULL" in why and "field 'count'" in why, why
    # a consumer with an incompatible definition is refused too
    with pytest.raises(pulsar.IncompatibleSchema):
        c.subscribe(t, "s", schema=kind(reading_v2(with_default=False)))
    # the producer with the stored definition still goes, and one with a default field is version 1
    c.create_producer(t, schema=kind(Reading)).send(Reading(sensor="b", count=2))
    assert refusal(bp, t, kind(reading_v2(with_default=True))) == ""


# -- admin REST -----------------------------------------------------------------------------------------------


def test_admin_schema_routes(bp: BrokerProcess, c: Any) -> None:
    local = topic_name()
    t = f"persistent://public/default/{local}"
    base = f"/admin/v2/schemas/public/default/{local}"
    assert admin(bp, "GET", base + "/schema")[0] == 404
    c.create_producer(t, schema=AvroSchema(Reading)).send(Reading(sensor="a", count=1))
    c.create_producer(t, schema=AvroSchema(reading_v2(with_default=True)))
    status, latest = admin(bp, "GET", base + "/schema")
    assert status == 200 and latest["version"] == 1 and latest["type"] == "AVRO"
    assert abs(latest["timestamp"] / 1000 - time.time()) < 120
    assert [f["name"] for f in json.loads(latest["data"])["fields"]] == ["sensor", "count", "value"]
    status, first = admin(bp, "GET", base + "/schema/0")
    assert status == 200 and first["version"] == 0 and "value" not in first["data"]
    assert admin(bp, "GET", base + "/schema/2")[0] == 404
    status, every = admin(bp, "GET", base + "/schemas")
    assert [s["version"] for s in every["getSchemaResponses"]] == [0, 1]
    # a definition the FULL strategy refuses: the compatibility probe says so, an upload gets 409 naming it
    bad = {
        "type": "AVRO",
        "schema": AvroSchema(reading_without_count()).schema_info().schema(),
        "properties": {},
    }
    assert admin(bp, "POST", base + "/compatibility", bad) == (
        200,
        {"isCompatibility": False, "schemaCompatibilityStrategy": "FULL"},
    )
    status, err = admin(bp, "POST", base + "/schema", bad)
    assert status == 409 and "field 'count'" in json.dumps(err), err
    assert admin(bp, "POST", base + "/schema", {**bad, "type": "STRINGS"})[0] == 400
    good = {"type": "AVRO", "schema": latest["data"].replace('"value"', '"level"'), "properties": {"k": "v"}}
    assert json.loads(good["schema"])["fields"][2]["default"] is None
    assert admin(bp, "POST", base + "/compatibility", good)[1]["isCompatibility"] is True
    assert admin(bp, "POST", base + "/schema", good) == (200, {"version": {"version": 2}})
    assert admin(bp, "GET", base + "/schema")[1]["properties"] == {"k": "v"}
    # deleting the schema (a deletion marker, version 3): the topic takes any schema again, numbered on
    assert admin(bp, "DELETE", base + "/schema") == (200, {"version": 3})
    assert admin(bp, "GET", base + "/schema")[0] == 404
    c.create_producer(t, schema=AvroSchema(reading_without_count()))
    assert admin(bp, "GET", base + "/schema")[1]["version"] == 4


def test_a_deleted_schema_is_a_version_and_the_versions_go_on_counting(bp: BrokerProcess, c: Any) -> None:
    """As in Pulsar, the admin's DELETE of a topic's schema stores a deletion marker as the next version: the
    versions after it go on counting (messages written before the delete keep distinct version numbers, their
    schemas still readable by number), the list and the checks see only the versions after it, and a definition
    from before it is a new version again."""
    local = topic_name()
    t = f"persistent://public/default/{local}"
    base = f"/admin/v2/schemas/public/default/{local}"
    consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)  # bytes: any schema
    p0 = c.create_producer(t, schema=AvroSchema(Reading))
    p0.send(Reading(sensor="a", count=1))
    v2 = reading_v2(with_default=True)
    p1 = c.create_producer(t, schema=AvroSchema(v2))
    p1.send(v2(sensor="b", count=2, value=0.5))
    p0.close()
    p1.close()
    assert admin(bp, "DELETE", base + "/schema") == (200, {"version": 2})
    assert admin(bp, "GET", base + "/schema")[0] == 404
    assert admin(bp, "GET", base + "/schemas") == (200, {"getSchemaResponses": []})
    assert admin(bp, "GET", base + "/schema/2")[0] == 404  # the marker is no schema
    status, first = admin(bp, "GET", base + "/schema/0")  # what the first message was written with
    assert status == 200 and first["version"] == 0 and json.loads(first["data"])["name"] == "Reading"
    # a second delete with no live schema writes nothing
    assert admin(bp, "DELETE", base + "/schema") == (200, {"version": 3})
    # a definition FULL would have refused against version 1 is taken now, as version 3
    v3 = reading_without_count()
    p3 = c.create_producer(t, schema=AvroSchema(v3))
    p3.send(v3(sensor="c"))
    every = admin(bp, "GET", base + "/schemas")[1]["getSchemaResponses"]
    assert [s["version"] for s in every] == [3]
    # the definition of version 0 is not reused: a new version (an upload, FULL-checked against version 3 only)
    old = {"type": "AVRO", "schema": first["data"], "properties": {}}
    assert (
        admin(bp, "POST", base + "/compatibility", old)[1]["isCompatibility"] is False
    )  # 'count', no default
    assert versions(drain(consumer, 3, 10_000)) == [0, 1, 3]
    # the broker answers each version's GET_SCHEMA as the client asks it: by number, the marker being none
    s = _raw(bp)
    try:
        _connect(s)
        dec = wire.FrameDecoder()
        for request_id, version in ((1, 0), (2, 2), (3, None)):
            cmd = pb.CommandGetSchema(request_id=request_id, topic=t)
            if version is not None:
                cmd.schema_version = version.to_bytes(8, "big")
            s.sendall(wire.encode_command(T(type=T.GET_SCHEMA, getSchema=cmd)))
            frames: list[Any] = []
            while not frames:
                frames = dec.feed(s.recv(65536))
            got = frames[0].command.getSchemaResponse
            if version == 2:
                assert got.error_code == pb.TopicNotFound, got
            else:
                assert int.from_bytes(got.schema_version, "big") == (version if version is not None else 3), (
                    got
                )
    finally:
        s.close()


def test_a_namespace_strategy_changes_what_is_compatible(bp: BrokerProcess, c: Any) -> None:
    ns = f"schemas-{topic_name()}"
    assert admin(bp, "PUT", f"/admin/v2/namespaces/public/{ns}")[0] in (200, 204)
    path = f"/admin/v2/namespaces/public/{ns}/schemaCompatibilityStrategy"
    assert admin(bp, "GET", path) == (200, "UNDEFINED")
    assert admin(bp, "PUT", path, "LAX")[0] == 400
    assert admin(bp, "PUT", path, "BACKWARD")[0] == 204
    assert admin(bp, "GET", path) == (200, "BACKWARD")
    t = f"persistent://public/{ns}/{topic_name()}"
    c.create_producer(t, schema=JsonSchema(Reading)).send(Reading(sensor="a", count=1))
    # BACKWARD: removing a field is fine (the new definition ignores it in old data), adding one without a
    # default is not (the new definition could not read old data)
    c.create_producer(t, schema=JsonSchema(reading_without_count()))
    why = refusal(bp, t, JsonSchema(reading_v2(with_default=False)))
    assert "BACKWARD" in why and "field 'count'" in why, why  # the latest version has no 'count'
    assert admin(bp, "PUT", path, "ALWAYS_COMPATIBLE")[0] == 204
    c.create_producer(t, schema=JsonSchema(reading_v2(with_default=False)))


def test_two_brokers_appending_definitions_at_once_check_each_against_the_other(
    zk_server: Any, zk_root: str
) -> None:
    """A and B are each FULL compatible with v0 but not with each other ('x' an int or a string): whichever
    compare-and-set goes second sees the other's version and is refused, however the two interleave."""

    def definition(x_type: str, default: Any) -> SchemaInfo:
        fields = [{"name": "sensor", "type": "string"}, {"name": "x", "type": x_type, "default": default}]
        data = json.dumps({"type": "record", "name": "Reading", "fields": fields[: 2 if x_type else 1]})
        return SchemaInfo(type=pb.Schema.Avro, data=data.encode())

    v0, a, b = definition("", None), definition("int", 0), definition("string", "")

    async def run() -> list[Any]:
        stores = [MetadataStore.connect(zk_server.connect_string, root=zk_root) for _ in range(2)]
        try:
            metas = [BrokerMetadataStore(st) for st in stores]
            assert await metas[0].add_schema("public/default/persistent/race", v0) == 0

            async def add(meta: BrokerMetadataStore, info: SchemaInfo) -> Any:
                try:
                    return await meta.add_schema(
                        "public/default/persistent/race",
                        info,
                        refuse=lambda h: schema_refusal(h, info, "FULL"),
                    )
                except SchemaRefusedError as e:
                    return e

            return list(await asyncio.gather(add(metas[0], a), add(metas[1], b)))
        finally:
            for st in stores:
                st.close()

    results = asyncio.run(run())
    assert sorted(type(r).__name__ for r in results) == ["SchemaRefusedError", "int"], results
    assert [r for r in results if isinstance(r, int)] == [1]
    assert "field 'x'" in str(next(r for r in results if isinstance(r, SchemaRefusedError)))


def test_a_consumer_first_on_an_idle_topic_stores_its_schema(bp: BrokerProcess, c: Any) -> None:
    """As Pulsar: the consumer's schema becomes version 0 of a topic without schemas, producers or data, and
    producers then have to go with it; on a topic that has bytes messages already it is not stored."""
    local = topic_name()
    t = f"persistent://public/default/{local}"
    consumer = c.subscribe(
        t, "s", schema=AvroSchema(Reading), initial_position=pulsar.InitialPosition.Earliest
    )
    status, stored = admin(bp, "GET", f"/admin/v2/schemas/public/default/{local}/schema")
    assert status == 200 and stored["version"] == 0 and stored["type"] == "AVRO"
    assert "the topic's schema is AVRO, not STRING" in refusal_of_string(bp, t)
    why = refusal(bp, t, AvroSchema(reading_v2(with_default=False)))
    assert "field 'value'" in why, why
    c.create_producer(t, schema=AvroSchema(Reading)).send(Reading(sensor="a", count=1))
    assert versions([consumer.receive(timeout_millis=10_000)]) == [0]

    bytes_topic = topic_name()
    c.create_producer(f"persistent://public/default/{bytes_topic}").send(b"raw")
    c.subscribe(f"persistent://public/default/{bytes_topic}", "s", schema=StringSchema())
    assert admin(bp, "GET", f"/admin/v2/schemas/public/default/{bytes_topic}/schema")[0] == 404


def test_a_partitioned_topic_shares_one_schema_record(bp: BrokerProcess, c: Any) -> None:
    local = topic_name()
    t = f"persistent://public/default/{local}"
    assert admin(bp, "PUT", f"/admin/v2/persistent/public/default/{local}/partitions", 3)[0] in (200, 204)
    consumer = c.subscribe(
        t, "s", schema=JsonSchema(Reading), initial_position=pulsar.InitialPosition.Earliest
    )
    producer = c.create_producer(t, schema=JsonSchema(Reading))
    for i in range(6):
        producer.send(Reading(sensor=f"s{i}", count=i), partition_key=str(i))
    got = drain(consumer, 6)
    assert sorted(m.value().count for m in got) == list(range(6)) and set(versions(got)) == {0}
    # every partition answers the partitioned topic's record, and refuses what it refuses
    status, stored = admin(bp, "GET", f"/admin/v2/schemas/public/default/{local}-partition-2/schema")
    assert status == 200 and stored["version"] == 0 and stored["type"] == "JSON"
    why = refusal(bp, f"{t}-partition-1", JsonSchema(reading_v2(with_default=False)))
    assert "field 'value'" in why, why


def test_deleting_a_partitioned_topic_deletes_its_schemas(bp: BrokerProcess, c: Any) -> None:
    """As Pulsar (apache/pulsar#21574): the partitioned topic's record goes with its metadata, as a
    non-partitioned topic's goes with it, so a topic of the same name made again starts without schemas. The
    record was left: the new topic had the old one's versions and refused another type of schema."""
    local = topic_name()
    t = f"persistent://public/default/{local}"
    partitions = f"/admin/v2/persistent/public/default/{local}/partitions"
    schema = f"/admin/v2/schemas/public/default/{local}/schema"
    assert admin(bp, "PUT", partitions, 2)[0] in (200, 204)
    producer = c.create_producer(t, schema=JsonSchema(Reading))
    producer.send(Reading(sensor="a", count=1), partition_key="1")
    producer.close()
    assert admin(bp, "GET", schema)[1]["type"] == "JSON"
    assert admin(bp, "DELETE", partitions + "?force=true")[0] == 204
    assert admin(bp, "GET", schema)[0] == 404
    assert admin(bp, "PUT", partitions, 2)[0] in (200, 204)
    assert refusal_of_string(bp, f"{t}-partition-0") == ""  # another type: the old record is gone
    status, stored = admin(bp, "GET", schema)
    assert status == 200 and (stored["version"], stored["type"]) == (0, "STRING")


# -- KeyValue schemas -----------------------------------------------------------------------------------------
# pulsar-client (Python) has no KeyValueSchema, and its SchemaInfo carries no properties, without which its C++
# core refuses to send with a KEY_VALUE schema ("Not found kv.encoding.type by properties"): the producers here
# speak the wire as Pulsar's Java and C++ clients do with Schema.KeyValue(key, value, INLINE | SEPARATED); the
# consumers are pulsar-client's.

KV_KEY = {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "int"}]}
KV_VALUE = {"type": "record", "name": "Reading", "fields": [{"name": "sensor", "type": ["null", "string"]}]}


def kv_pack(key: bytes | None, value: bytes | None) -> bytes:
    """Pulsar's KeyValue bytes (an INLINE message, and a KEY_VALUE schema's data): each part's length as a
    big-endian int32 (-1 for none), then the part."""
    out = b""
    for part in (key, value):
        out += (-1 if part is None else len(part)).to_bytes(4, "big", signed=True) + (part or b"")
    return out


def compact(d: dict[str, Any]) -> bytes:
    """A definition as Pulsar's Java client writes it (Avro's Schema.toString(): JSON without spaces)."""
    return json.dumps(d, separators=(",", ":")).encode()


def kv_unpack(data: bytes) -> tuple[bytes, bytes]:
    n = int.from_bytes(data[:4], "big", signed=True)
    key, rest = data[4 : 4 + n], data[4 + n :]
    m = int.from_bytes(rest[:4], "big", signed=True)
    return key, rest[4 : 4 + m]


def kv_schema(encoding: str, key: dict[str, Any], value: dict[str, Any], kind: str = "AVRO") -> pb.Schema:
    """The Schema a Java client declares for Schema.KeyValue(Schema.AVRO(K), Schema.AVRO(V), encoding)."""
    props = {
        "key.schema.name": key["name"],
        "key.schema.type": kind,
        "key.schema.properties": "{}",
        "value.schema.name": value["name"],
        "value.schema.type": kind,
        "value.schema.properties": "{}",
        "kv.encoding.type": encoding,
    }
    return pb.Schema(
        name="KeyValue",
        schema_data=kv_pack(compact(key), compact(value)),
        type=pb.Schema.KeyValue,
        properties=[pb.KeyValue(key=k, value=v) for k, v in props.items()],
    )


def kv_produce(bp: BrokerProcess, topic: str, schema: pb.Schema, messages: list[tuple[bytes, bytes]]) -> str:
    """A producer declaring ``schema`` sends ``messages`` (key, value) as its encoding says: INLINE in the
    payload, SEPARATED the value as the payload and the key base64 as the message key. The error the PRODUCER
    got, or ""."""
    separated = dict((p.key, p.value) for p in schema.properties).get("kv.encoding.type") == "SEPARATED"
    s, dec, answer = _declare(bp, topic, schema)
    try:
        if answer.type == T.ERROR:
            return str(answer.error.message)
        ok = answer.producer_success
        for seq, (key, value) in enumerate(messages):
            md = pb.MessageMetadata(
                producer_name=ok.producer_name, sequence_id=seq, publish_time=int(time.time() * 1000)
            )
            md.schema_version = ok.schema_version
            if separated:
                md.partition_key = base64.b64encode(key).decode()
                md.partition_key_b64_encoded = True
                payload = value
            else:
                payload = kv_pack(key, value)
            send = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=seq))
            s.sendall(wire.encode_send(send, md, payload))
        receipts = 0
        while receipts < len(messages):
            for f in dec.feed(s.recv(65536)):
                assert f.command.type == T.SEND_RECEIPT, f.command
                receipts += 1
        return ""
    finally:
        s.close()


@pytest.mark.parametrize("encoding", ["INLINE", "SEPARATED"])
def test_key_value_schemas_in_both_encodings(bp: BrokerProcess, c: Any, encoding: str) -> None:
    """KEY_VALUE schemas as Pulsar's clients declare them: stored with their properties, messages of either
    encoding delivered to pulsar-client consumers as written, the admin's view of the schema Pulsar's JSON of the
    key and value definitions, and a new definition checked part by part, as Pulsar's KeyValue compatibility
    check does (each part under the namespace's strategy, by the part's own type)."""
    local = topic_name()
    t = f"persistent://public/default/{local}"
    base = f"/admin/v2/schemas/public/default/{local}"
    consumer = c.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
    sent = [
        (json.dumps({"id": i}).encode(), json.dumps({"sensor": f"s{i}"}).encode()) for i in range(3)
    ]  # the records' JSON encoding: JSON parts would look the same
    assert kv_produce(bp, t, kv_schema(encoding, KV_KEY, KV_VALUE), sent) == ""
    got = drain(consumer, 3)
    assert versions(got) == [0, 0, 0]
    if encoding == "INLINE":
        assert [kv_unpack(m.data()) for m in got] == sent
    else:
        assert [(base64.b64decode(m.partition_key()), m.data()) for m in got] == sent

    status, shown = admin(bp, "GET", base + "/schema")
    assert status == 200 and shown["type"] == "KEY_VALUE", shown
    assert json.loads(shown["data"]) == {"key": KV_KEY, "value": KV_VALUE}
    assert shown["properties"]["kv.encoding.type"] == encoding
    assert _get_schema(bp, t).schema.schema_data == kv_pack(compact(KV_KEY), compact(KV_VALUE))

    # the value record gains a field without a default: FULL refuses it, naming the value's field
    grown = {**KV_VALUE, "fields": [*KV_VALUE["fields"], {"name": "level", "type": "int"}]}
    why = kv_produce(bp, t, kv_schema(encoding, KV_KEY, grown), [])
    assert "value" in why and "'level'" in why, why
    # with a default it is a new version; a key of another type is refused
    grown["fields"][-1]["default"] = 0
    assert kv_produce(bp, t, kv_schema(encoding, KV_KEY, grown), sent[:1]) == ""
    assert versions(drain(consumer, 1)) == [1]
    why = kv_produce(bp, t, kv_schema(encoding, KV_KEY, grown, kind="JSON"), [])
    assert "key" in why and "JSON" in why, why
    # the admin takes the JSON form too (pulsar-admin schemas upload), stored as the clients' bytes
    upload = {
        "type": "KEY_VALUE",
        "schema": json.dumps({"key": KV_KEY, "value": grown}),
        "properties": dict((p.key, p.value) for p in kv_schema(encoding, KV_KEY, grown).properties),
    }
    assert admin(bp, "POST", base + "/schema", upload) == (
        200,
        {"version": {"version": 1}},
    )  # the same: reused
