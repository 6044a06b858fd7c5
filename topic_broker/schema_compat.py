"""Schema compatibility of AVRO and JSON schemas, as Pulsar checks it when a producer or consumer declares a
new definition on a topic that has schemas already. Pure code: no sockets, no ZooKeeper.

Both types carry an Avro record definition (the Python client's ``AvroSchema`` and ``JsonSchema`` send the same
JSON text). Whether one definition can read data written with another follows Avro's schema resolution rules:
a reader's field that the writer lacks needs a ``default``; a writer's field the reader lacks is skipped; types
must match or be a promotion (int to long, float or double; long to float or double; float to double; string
and bytes either way); a writer's union branch must be readable by the reader; a writer's enum symbol must be
one of the reader's (or the reader's enum has a default).

The strategies are Pulsar's ``SchemaCompatibilityStrategy``: BACKWARD (the new definition reads data written
with the latest one), FORWARD (the latest reads the new one's), FULL (both), each ``_TRANSITIVE`` against every
stored version instead of the latest, ALWAYS_COMPATIBLE (no check) and ALWAYS_INCOMPATIBLE (no new definition).
UNDEFINED, the namespace default, means the broker's strategy, and Pulsar's default there is FULL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

STRATEGIES = (
    "UNDEFINED",
    "ALWAYS_INCOMPATIBLE",
    "ALWAYS_COMPATIBLE",
    "BACKWARD",
    "FORWARD",
    "FULL",
    "BACKWARD_TRANSITIVE",
    "FORWARD_TRANSITIVE",
    "FULL_TRANSITIVE",
)

#: What UNDEFINED (no namespace policy) means: Pulsar's default strategy.
DEFAULT_STRATEGY = "FULL"

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAMED = frozenset({"record", "error", "enum", "fixed"})
#: writer type -> the reader types it can be read as, besides itself (Avro's promotions)
_PROMOTIONS: Mapping[str, frozenset[str]] = {
    "int": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}


class SchemaDefinitionError(ValueError):
    """A schema's data is not an Avro definition."""


def check_strategy(name: str) -> str:
    """``name`` as one of :data:`STRATEGIES` (any case), or ValueError naming the valid ones."""
    up = name.strip().upper()
    if up not in STRATEGIES:
        raise ValueError(f"unknown schema compatibility strategy {name!r}; one of {', '.join(STRATEGIES)}")
    return up


def _loads(data: bytes, what: str) -> Any:
    """``data`` parsed as UTF-8 JSON, or SchemaDefinitionError naming ``what`` it should be: a definition that
    is not (bytes that are not UTF-8, nesting deeper than the parser goes, a number of more digits than int()
    converts) is refused, never raised as any other error."""
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise SchemaDefinitionError(f"{what}: nested too deep") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SchemaDefinitionError(f"{what}: {e}") from e
    except ValueError:  # an integer of more digits than int() converts
        raise SchemaDefinitionError(f"{what}: a number of over 4300 digits") from None


def parse_definition(data: bytes) -> Any:
    """The Avro definition in ``data`` (JSON text), or SchemaDefinitionError saying what is wrong with it."""
    d = _loads(data, "the schema definition is not JSON")
    _Names().register(d)
    return d


def incompatibility(strategy: str, new: bytes, stored: Sequence[bytes]) -> str | None:
    """Why the definition ``new`` is refused on a topic whose definitions of the same type are ``stored``
    (oldest first), under ``strategy``, or None if it is accepted. The caller has already looked for ``new``
    among the stored versions (an identical definition is never checked)."""
    try:
        strategy = check_strategy(strategy)
    except ValueError as e:
        return str(e)  # a namespace policy written by hand: refuse rather than guess
    if strategy == "UNDEFINED":
        strategy = DEFAULT_STRATEGY
    if strategy == "ALWAYS_COMPATIBLE" or not stored:
        return None
    if strategy == "ALWAYS_INCOMPATIBLE":
        return "the topic's schema compatibility strategy is ALWAYS_INCOMPATIBLE: no new schema versions"
    try:
        new_d = parse_definition(new)
    except SchemaDefinitionError as e:
        return f"the new schema: {e}"
    transitive = strategy.endswith("_TRANSITIVE")
    base = strategy.removesuffix("_TRANSITIVE")
    versions = list(enumerate(stored))
    if not transitive:
        versions = versions[-1:]
    for version, data in reversed(versions):
        try:
            old_d = parse_definition(data)
        except SchemaDefinitionError as e:
            return f"stored schema version {version}: {e}"
        if base in ("BACKWARD", "FULL"):
            why = can_read(new_d, old_d)
            if why is not None:
                return f"{strategy}: the new schema cannot read data written with version {version}: {why}"
        if base in ("FORWARD", "FULL"):
            why = can_read(old_d, new_d)
            if why is not None:
                return f"{strategy}: version {version} cannot read data written with the new schema: {why}"
    return None


# -- KEY_VALUE schemas -----------------------------------------------------------------------------------------
# Pulsar's KeyValue schema (its Java and C++ clients' Schema.KeyValue): the data is the key's definition and the
# value's, each after its length as a big-endian int32 (-1: none); the properties name each part's type
# ("key.schema.type", "value.schema.type"; BYTES without) and the messages' encoding ("kv.encoding.type": INLINE,
# the default, both parts in the payload laid out the same way; SEPARATED, the key base64 as the message key).

#: The part types whose definition is a JSON document (the others, primitives, have none).
STRUCT_TYPES = frozenset({"AVRO", "JSON", "PROTOBUF", "PROTOBUF_NATIVE"})
KV_PARTS = ("key", "value")


def split_key_value(data: bytes) -> tuple[bytes, bytes]:
    """The key's and the value's definitions in a KEY_VALUE schema's ``data``, or SchemaDefinitionError."""
    parts: list[bytes] = []
    pos = 0
    for part in KV_PARTS:
        if len(data) < pos + 4:
            raise SchemaDefinitionError(f"a KEY_VALUE schema's data ends before the {part}'s length")
        n = int.from_bytes(data[pos : pos + 4], "big", signed=True)
        pos += 4
        if n < -1 or len(data) < pos + max(n, 0):
            raise SchemaDefinitionError(f"a KEY_VALUE schema's {part} length {n} does not fit its data")
        parts.append(bytes(data[pos : pos + max(n, 0)]))
        pos += max(n, 0)
    if pos != len(data):
        raise SchemaDefinitionError(f"a KEY_VALUE schema's data has {len(data) - pos} bytes after the value")
    return parts[0], parts[1]


def join_key_value(key: bytes, value: bytes) -> bytes:
    return len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value


def key_value_types(properties: Mapping[str, str]) -> tuple[str, str]:
    """The key's and the value's type names (Pulsar's SchemaType: "AVRO", "STRING", ...; BYTES when unsaid)."""
    return (
        properties.get("key.schema.type", "BYTES").upper(),
        properties.get("value.schema.type", "BYTES").upper(),
    )


def key_value_json(data: bytes, properties: Mapping[str, str]) -> str:
    """What Pulsar's admin shows as a KEY_VALUE schema's definition: ``{"key": ..., "value": ...}``, each part's
    definition as JSON, or "" for a primitive part; SchemaDefinitionError when the data is not a KEY_VALUE's."""
    shown: dict[str, Any] = {}
    for part, kind, definition in zip(
        KV_PARTS, key_value_types(properties), split_key_value(data), strict=True
    ):
        if kind not in STRUCT_TYPES:
            shown[part] = ""
            continue
        shown[part] = _loads(definition, f"the {part}'s {kind} definition is not JSON")
    return json.dumps(shown)


def key_value_from_json(text: bytes) -> bytes:
    """A KEY_VALUE definition as Pulsar's admin takes it (``{"key": ..., "value": ...}``, "" for a primitive
    part) in the form the clients declare it (:func:`split_key_value`), or SchemaDefinitionError."""
    d = _loads(text, 'a KEY_VALUE definition is JSON {"key": ..., "value": ...}')
    if not isinstance(d, dict) or set(d) != set(KV_PARTS):
        raise SchemaDefinitionError('a KEY_VALUE definition is {"key": ..., "value": ...}')
    key, value = (
        b"" if d[p] in ("", None) else json.dumps(d[p], separators=(",", ":")).encode() for p in KV_PARTS
    )
    return join_key_value(key, value)


def key_value_incompatibility(
    strategy: str,
    new: bytes,
    new_properties: Mapping[str, str],
    stored: Sequence[tuple[bytes, Mapping[str, str]]],
) -> str | None:
    """Why the KEY_VALUE definition ``new`` is refused on a topic whose KEY_VALUE definitions are ``stored``
    (data and properties, oldest first), as Pulsar's KeyValue check does: each part's type must be the latest
    version's, and an AVRO or JSON part is checked as :func:`incompatibility` checks a definition, under the
    same strategy, against that part of the stored versions."""
    if not stored:
        return None
    try:
        parts = split_key_value(new)
        stored_parts = [split_key_value(data) for data, _ in stored]
    except SchemaDefinitionError as e:
        return str(e)
    types = key_value_types(new_properties)
    latest_types = key_value_types(stored[-1][1])
    for i, part in enumerate(KV_PARTS):
        if types[i] != latest_types[i]:
            return (
                f"incompatible {part} schema: the topic's {part} schema is {latest_types[i]}, not {types[i]}"
            )
    for i, part in enumerate(KV_PARTS):
        if types[i] not in ("AVRO", "JSON"):
            continue
        same_type = [
            p[i]
            for p, (_, props) in zip(stored_parts, stored, strict=True)
            if key_value_types(props)[i] == types[i]
        ]
        why = incompatibility(strategy, parts[i], same_type)
        if why is not None:
            return f"the {part} schema: {why}"
    return None


def can_read(reader: Any, writer: Any) -> str | None:
    """Why data written with Avro definition ``writer`` cannot be read with ``reader`` (the first problem found,
    naming the field), or None if it can."""
    return _Resolver(_Names().register(reader), _Names().register(writer)).check(reader, writer, "")


class _Names:
    """The named types (records, enums, fixed) a definition declares, by full name and by short name, so that
    a type given by name resolves to its declaration."""

    def __init__(self) -> None:
        self.types: dict[str, Mapping[str, Any]] = {}

    def register(self, d: Any, namespace: str = "") -> _Names:
        if isinstance(d, str):
            if d not in _PRIMITIVES and d not in self.types:
                raise SchemaDefinitionError(f"unknown type {d!r}")
            return self
        if isinstance(d, list):
            for branch in d:
                self.register(branch, namespace)
            return self
        if not isinstance(d, Mapping) or not isinstance(d.get("type"), str | list | dict):
            raise SchemaDefinitionError(f"not an Avro type: {json.dumps(d)[:80]}")
        kind = d["type"]
        if not isinstance(kind, str):
            return self.register(kind, namespace)
        if kind in _NAMED:
            name = d.get("name")
            if not isinstance(name, str) or not name:
                raise SchemaDefinitionError(f"a {kind} without a name")
            namespace = d.get("namespace") or namespace
            full = name if "." in name or not namespace else f"{namespace}.{name}"
            self.types[full] = d
            self.types.setdefault(full.rsplit(".", 1)[-1], d)
            if kind in ("record", "error"):
                fields = d.get("fields")
                if not isinstance(fields, list):
                    raise SchemaDefinitionError(f"record {name!r} has no field list")
                for f in fields:
                    if not isinstance(f, Mapping) or not isinstance(f.get("name"), str) or "type" not in f:
                        raise SchemaDefinitionError(f"record {name!r}: a field without a name or type")
                    self.register(f["type"], namespace)
            return self
        if kind == "array":
            return self.register(d.get("items", "null"), namespace)
        if kind == "map":
            return self.register(d.get("values", "null"), namespace)
        return self.register(kind, namespace)

    def resolve(self, d: Any) -> Any:
        """``d`` with a named reference replaced by its declaration, and ``{"type": "int"}`` by ``"int"``."""
        if isinstance(d, str) and d not in _PRIMITIVES:
            return self.types[d]
        if isinstance(d, Mapping) and isinstance(d.get("type"), str) and d["type"] in _PRIMITIVES:
            return d["type"]
        if isinstance(d, Mapping) and not isinstance(d.get("type"), str):
            return self.resolve(d["type"])
        return d


def _kind(d: Any) -> str:
    if isinstance(d, str):
        return d
    if isinstance(d, list):
        return "union"
    kind: str = d["type"]
    return "record" if kind == "error" else kind


def _describe(d: Any) -> str:
    k = _kind(d)
    if k in _NAMED:
        return f"{k} {d.get('name')}"
    if k == "union":
        return "union [" + ", ".join(_describe(b) if isinstance(b, str) else _kind(b) for b in d) + "]"
    return k


class _Resolver:
    def __init__(self, reader_names: _Names, writer_names: _Names) -> None:
        self.rn = reader_names
        self.wn = writer_names
        self.seen: set[tuple[int, int]] = set()  # record pairs being checked (recursive types)

    def check(self, reader: Any, writer: Any, path: str) -> str | None:
        r = self.rn.resolve(reader)
        w = self.wn.resolve(writer)
        rk, wk = _kind(r), _kind(w)
        where = f"field '{path}'" if path else "the schema"
        if wk == "union":
            for branch in w:
                why = self.check(r, branch, path)
                if why is not None:
                    return why
            return None
        if rk == "union":
            if any(self.check(branch, w, path) is None for branch in r):
                return None
            return f"{where}: the reader's {_describe(r)} has no branch for the writer's {_describe(w)}"
        if rk != wk:
            if wk in _PROMOTIONS and rk in _PROMOTIONS[wk]:
                return None
            return f"{where}: the reader's type {_describe(r)} cannot read the writer's {_describe(w)}"
        if rk in _PRIMITIVES:
            return None
        if rk == "array":
            return self.check(r.get("items"), w.get("items"), f"{path}[]" if path else "[]")
        if rk == "map":
            return self.check(r.get("values"), w.get("values"), f"{path}{{}}" if path else "{}")
        if _short(r["name"]) != _short(w["name"]):
            return f"{where}: the reader's {_describe(r)} is not the writer's {_describe(w)}"
        if rk == "fixed":
            if r.get("size") != w.get("size"):
                return f"{where}: fixed {r['name']} has size {r.get('size')}, the writer's {w.get('size')}"
            return None
        if rk == "enum":
            missing = [s for s in w.get("symbols", []) if s not in r.get("symbols", [])]
            if missing and "default" not in r:
                return f"{where}: the reader's enum {r['name']} lacks the writer's symbol(s) {', '.join(missing)}"
            return None
        return self._record(r, w, path)

    def _record(self, r: Mapping[str, Any], w: Mapping[str, Any], path: str) -> str | None:
        key = (id(r), id(w))
        if key in self.seen:
            return None
        self.seen.add(key)
        writer_fields = {f["name"]: f for f in w["fields"]}
        for f in r["fields"]:
            name = f["name"]
            sub = f"{path}.{name}" if path else name
            wf = writer_fields.get(name)
            if wf is None:
                wf = next((writer_fields[a] for a in f.get("aliases", []) if a in writer_fields), None)
            if wf is None:
                if "default" not in f:
                    return f"field '{sub}' is missing from the writer's schema and has no default"
                continue
            why = self.check(f["type"], wf["type"], sub)
            if why is not None:
                return why
        return None


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]
