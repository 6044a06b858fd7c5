"""The topic broker's znode records (``docs/broker.md``) and a small async store over :class:`MetadataStore`.

Records are frozen dataclasses with ``to_json``/``from_json``; ``from_json`` ignores unknown keys (forward
compatible within ``format_version`` 1) and raises :class:`MetadataFormatError` for a body it cannot read.

* :class:`ManagedLedgerInfo` at ``managed-ledgers/<ml>``: the ordered ledger list (only the last may be open),
  ``properties`` (e.g. ``dedup/<producer>``) and ``terminated_position``. Every change is a CAS; a conflict means
  another owner.
* :class:`CursorInfo` at ``managed-ledgers/<ml>/cursors/<sub>``.
* :class:`PartitionedTopicMetadata` at ``topics/<ml>``.
* :class:`BrokerInfo` at ``brokers/<id>`` (ephemeral) and :class:`OwnershipInfo` at ``ownership/<ml>``
  (ephemeral, first creator wins).
* :class:`NamespacePolicies` at ``namespaces/<tenant>/<ns>``; ``public/default`` is created with defaults.
* :class:`SchemaHistory` at ``schemas/<ml>`` (the base topic's name for a partitioned topic): every schema
  producers declared, oldest first; a schema's version is its index. The admin's delete appends a deletion
  marker, after which versions go on counting, as in Pulsar.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from zk import layout
from zk.client import JsonDict, MetadataStore
from zk.errors import (
    MetadataExistsError,
    MetadataFormatError,
    MetadataNotEmptyError,
    MetadataNotFoundError,
    MetadataVersionError,
)
from zk.registry import registered_timeout_s
from zk.versioned import Versioned

__all__ = [
    "AutoTopicCreation",
    "BacklogQuota",
    "BrokerInfo",
    "BrokerMetadataStore",
    "CursorInfo",
    "LedgerInfo",
    "ManagedLedgerInfo",
    "NamespacePolicies",
    "OwnershipInfo",
    "PartitionedTopicMetadata",
    "SchemaHistory",
    "SchemaInfo",
    "TopicPolicies",
    "schema_path",
    "topic_policies_path",
    "policy_in_force",
]

SCHEMAS = "schemas"
TOPIC_POLICIES = "topic-policies"


def schema_path(ml_name: str) -> str:
    """``schemas/<tenant>/<ns>/persistent/<local>``: the schemas of a topic (of its base name when partitioned)."""
    return f"{SCHEMAS}/{layout.check_ml_name(ml_name)}"


def topic_policies_path(ml_name: str) -> str:
    """``topic-policies/<tenant>/<ns>/persistent/<local>``: a topic's own policies (of its base name when
    partitioned: they are every partition's), which take the place of its namespace's."""
    return f"{TOPIC_POLICIES}/{layout.check_ml_name(ml_name)}"


DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"


def _field(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    if key not in d:
        if default is ...:
            raise MetadataFormatError(f"missing field {key!r}")
        return default
    value = d[key]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise MetadataFormatError(f"field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _pos(value: Any, what: str) -> tuple[int, int]:
    if not (isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int) for v in value)):
        raise MetadataFormatError(f"{what} must be [ledger, entry], got {value!r}")
    return (int(value[0]), int(value[1]))


# --- managed ledger --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerInfo:
    """One ledger of a managed ledger. ``entries``/``size`` are 0 and ``timestamp_ms`` 0 while it is open;
    ``timestamp_ms`` is the time it was closed (retention counts from it)."""

    ledger_id: int
    entries: int = 0
    size: int = 0
    timestamp_ms: int = 0
    # Messages in the ledger's entries (a batch entry holds many); 0 while open or when not known (written
    # before the field existed, or recovered from another owner): readers then count one per entry
    messages: int = 0

    def to_json(self) -> JsonDict:
        out: JsonDict = {
            "ledger_id": self.ledger_id,
            "entries": self.entries,
            "size": self.size,
            "timestamp_ms": self.timestamp_ms,
        }
        if self.messages:
            out["messages"] = self.messages
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LedgerInfo:
        return cls(
            ledger_id=_field(d, "ledger_id", int),
            entries=_field(d, "entries", int, 0),
            size=_field(d, "size", int, 0),
            timestamp_ms=_field(d, "timestamp_ms", int, 0),
            messages=_field(d, "messages", int, 0),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ManagedLedgerInfo:
    ledgers: tuple[LedgerInfo, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    terminated_position: tuple[int, int] | None = None

    def to_json(self) -> JsonDict:
        return {
            "ledgers": [li.to_json() for li in self.ledgers],
            "properties": dict(self.properties),
            "terminated_position": None
            if self.terminated_position is None
            else list(self.terminated_position),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ManagedLedgerInfo:
        ledgers = tuple(LedgerInfo.from_json(x) for x in _field(d, "ledgers", list, []))
        ids = [li.ledger_id for li in ledgers]
        if ids != sorted(set(ids)):
            raise MetadataFormatError(f"managed-ledger ledger ids are not strictly increasing: {ids}")
        tp = d.get("terminated_position")
        return cls(
            ledgers=ledgers,
            properties={str(k): str(v) for k, v in _field(d, "properties", dict, {}).items()},
            terminated_position=None if tp is None else _pos(tp, "terminated_position"),
        )


# --- cursors -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CursorInfo:
    """A durable subscription: everything up to ``mark_delete`` is acknowledged, plus the closed ranges
    ``(l1, e1, l2, e2)`` of ``individually_deleted`` after it, plus the messages of partly acknowledged batches
    (batch-index acks, Pulsar's ``batchDeletedIndexes``): ``(ledger, entry, mask)``, bit ``i`` of ``mask`` set
    when message ``i`` of that entry's batch is acknowledged. Stored only when there are some (a cursor stored
    without them loads with none). ``subscription_properties``: Pulsar's subscription properties (strings, set
    with ``PUT …/subscription/{sub}/properties``), stored likewise only when there are some."""

    mark_delete: tuple[int, int]
    individually_deleted: tuple[tuple[int, int, int, int], ...] = ()
    properties: Mapping[str, int] = field(default_factory=dict)
    last_active_ms: int = 0
    batch_acked: tuple[tuple[int, int, int], ...] = ()
    subscription_properties: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> JsonDict:
        d: JsonDict = {
            "mark_delete": list(self.mark_delete),
            "individually_deleted": [list(r) for r in self.individually_deleted],
            "properties": dict(self.properties),
            "last_active_ms": self.last_active_ms,
        }
        if self.batch_acked:
            d["batch_acked"] = [list(b) for b in self.batch_acked]
        if self.subscription_properties:
            d["subscription_properties"] = dict(self.subscription_properties)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CursorInfo:
        ranges = []
        for r in _field(d, "individually_deleted", list, []):
            if not (isinstance(r, list) and len(r) == 4 and all(isinstance(v, int) for v in r)):
                raise MetadataFormatError(f"individually_deleted range must be [l1, e1, l2, e2], got {r!r}")
            ranges.append((r[0], r[1], r[2], r[3]))
        batches = []
        for b in _field(d, "batch_acked", list, []):
            if not (
                isinstance(b, list)
                and len(b) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) for v in b)
                and b[2] > 0
            ):
                raise MetadataFormatError(f"batch_acked item must be [ledger, entry, mask > 0], got {b!r}")
            batches.append((b[0], b[1], b[2]))
        return cls(
            mark_delete=_pos(_field(d, "mark_delete", list), "mark_delete"),
            individually_deleted=tuple(ranges),
            properties={str(k): int(v) for k, v in _field(d, "properties", dict, {}).items()},
            last_active_ms=_field(d, "last_active_ms", int, 0),
            batch_acked=tuple(batches),
            subscription_properties={
                str(k): str(v) for k, v in _field(d, "subscription_properties", dict, {}).items()
            },
        )


# --- topics, brokers, ownership, namespaces ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionedTopicMetadata:
    partitions: int
    # its delete under way (set first, before its partitions are deleted): it grows no more, and no partition's
    # managed ledger is created (:meth:`BrokerMetadataStore.create_ml_info`), so none is left behind
    deleted: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.partitions, bool) or not isinstance(self.partitions, int) or self.partitions < 1:
            raise ValueError(f"a partitioned topic has at least 1 partition, got {self.partitions!r}")

    def to_json(self) -> JsonDict:
        return {"partitions": self.partitions, **({"deleted": True} if self.deleted else {})}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PartitionedTopicMetadata:
        try:
            return cls(_field(d, "partitions", int), bool(_optional_bool(d, "deleted")))
        except ValueError as e:
            raise MetadataFormatError(str(e)) from e


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerInfo:
    service_url: str
    web_service_url: str
    service_url_tls: str = ""  # pulsar+ssl:// of its TLS port, "" where it serves none
    web_service_url_tls: str = ""  # https:// of its admin's TLS port, "" where it serves none
    #: the session timeout ZooKeeper granted the session that registered it (ms; 0: not known, a registration
    #: from before it was kept): how long a restart under this id waits for a dead broker's registration to go
    session_timeout_ms: int = 0

    def to_json(self) -> JsonDict:
        d: JsonDict = {"service_url": self.service_url, "web_service_url": self.web_service_url}
        if self.service_url_tls:
            d["service_url_tls"] = self.service_url_tls
        if self.web_service_url_tls:
            d["web_service_url_tls"] = self.web_service_url_tls
        if self.session_timeout_ms > 0:
            d["session_timeout_ms"] = self.session_timeout_ms
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BrokerInfo:
        return cls(
            service_url=_field(d, "service_url", str),
            web_service_url=_field(d, "web_service_url", str, ""),
            service_url_tls=_field(d, "service_url_tls", str, ""),
            web_service_url_tls=_field(d, "web_service_url_tls", str, ""),
            session_timeout_ms=max(0, _field(d, "session_timeout_ms", int, 0)),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnershipInfo:
    broker_id: str
    service_url: str
    web_service_url: str
    service_url_tls: str = ""  # the owner's pulsar+ssl:// URL: where a lookup over TLS sends the client
    web_service_url_tls: str = ""  # the owner's https:// admin URL (the lookup's httpUrlTls), "" for none

    def to_json(self) -> JsonDict:
        d: JsonDict = {
            "broker_id": self.broker_id,
            "service_url": self.service_url,
            "web_service_url": self.web_service_url,
        }
        if self.service_url_tls:
            d["service_url_tls"] = self.service_url_tls
        if self.web_service_url_tls:
            d["web_service_url_tls"] = self.web_service_url_tls
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> OwnershipInfo:
        return cls(
            broker_id=_field(d, "broker_id", str),
            service_url=_field(d, "service_url", str),
            web_service_url=_field(d, "web_service_url", str, ""),
            service_url_tls=_field(d, "service_url_tls", str, ""),
            web_service_url_tls=_field(d, "web_service_url_tls", str, ""),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoTopicCreation:
    """Pulsar's ``AutoTopicCreationOverride`` of a namespace: whether a topic a client names that does not exist
    is created, and how (``topic_type`` "non-partitioned", or "partitioned" with ``default_num_partitions``)."""

    allow: bool = True
    topic_type: str | None = "non-partitioned"  # None: not given (with allow false)
    default_num_partitions: int | None = None

    def to_json(self) -> JsonDict:
        return {
            "allow": self.allow,
            "topic_type": self.topic_type,
            "default_num_partitions": self.default_num_partitions,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> AutoTopicCreation:
        return cls(
            allow=_field(d, "allow", bool, True),
            topic_type=_field(d, "topic_type", (str, type(None)), "non-partitioned"),
            default_num_partitions=_optional_threshold(d, "default_num_partitions"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BacklogQuota:
    """Pulsar's backlog quota: ``limit_size`` bytes (−1 = none), ``limit_time`` seconds (−1 = none), and what
    happens at the limit (``producer_request_hold`` | ``producer_exception`` | ``consumer_backlog_eviction``)."""

    limit_size: int = -1
    limit_time: int = -1
    policy: str = "producer_request_hold"

    def to_json(self) -> JsonDict:
        return {"limit_size": self.limit_size, "limit_time": self.limit_time, "policy": self.policy}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BacklogQuota:
        return cls(
            limit_size=_field(d, "limit_size", int, -1),
            limit_time=_field(d, "limit_time", int, -1),
            policy=_field(d, "policy", str, "producer_request_hold"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class NamespacePolicies:
    """Pulsar's defaults: no retention beyond the slowest subscription (0 / 0; −1 = unlimited), no dedup."""

    retention_time_minutes: int = 0
    retention_size_mb: int = 0
    deduplication_enabled: bool | None = None  # None: not set here (the broker's default applies)
    backlog_quota: BacklogQuota = field(default_factory=BacklogQuota)
    # Pulsar's ``message_age`` backlog quota (``limit_time``: seconds the oldest unacknowledged message of any
    # subscription may wait); None: not set
    message_age_quota: BacklogQuota | None = None
    # Pulsar's namespace ``auth_policies``: role (a token's subject) -> the actions granted ("produce",
    # "consume"); written by ``grant-permission``/``revoke-permission``. Absent in older znodes: nobody
    permissions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Pulsar's ``auth_policies.destination_auth``: a topic's own grants (its base name, ``persistent://t/ns/x``,
    # a partitioned topic's for its partitions) -> role -> actions; a role may do what either level grants
    topic_permissions: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    # Pulsar's ``schema_compatibility_strategy``: UNDEFINED means the broker's default (FULL)
    schema_compatibility_strategy: str = "UNDEFINED"
    # Pulsar's ``compaction_threshold``: the bytes of backlog past which the topic's owner compacts it (0: never);
    # None: not set, the broker's ``--compaction-threshold-bytes``
    compaction_threshold: int | None = None
    # Pulsar's ``message_ttl_in_seconds``: the owner's expiry check acknowledges, for every subscription, the
    # messages published longer ago than this (0: never); None: not set
    message_ttl_in_seconds: int | None = None
    # Pulsar's ``max_producers_per_topic``, ``max_consumers_per_topic``, ``max_unacked_messages_per_consumer``
    # and ``…_per_subscription``: a topic's producers, its consumers (all subscriptions), the unacknowledged
    # messages a consumer (a subscription's consumers together) may hold before it is (they are) sent nothing
    # more (0: no limit); None: not set, the broker's default
    max_producers_per_topic: int | None = None
    max_consumers_per_topic: int | None = None
    max_unacked_messages_per_consumer: int | None = None
    max_unacked_messages_per_subscription: int | None = None
    # Pulsar's ``max_consumers_per_subscription``: the consumers one subscription may have (0: no limit); None:
    # not set, the broker's default (none)
    max_consumers_per_subscription: int | None = None
    # Pulsar's ``max_subscriptions_per_topic``: the subscriptions a topic may have (0: no limit); None: not set,
    # the broker's default (none)
    max_subscriptions_per_topic: int | None = None
    # Pulsar's ``max_topics_per_namespace``: the topics the namespace may hold, each partition of a partitioned
    # topic one (0: no limit); None: not set, the broker's default (none). Checked as a topic is created
    # (:meth:`BrokerMetadataStore.create_ml_info`, :meth:`~BrokerMetadataStore.create_partitioned_topic`)
    max_topics_per_namespace: int | None = None
    # Pulsar's ``subscription_expiration_time_minutes``: a subscription with no consumer for this long is deleted
    # by the topic's owner (0: never); None: not set, never (Pulsar's broker default, 0)
    subscription_expiration_time_minutes: int | None = None
    # Pulsar's ``autoTopicCreationOverride``: None, not set (the broker's: a topic a client names is created
    # non-partitioned)
    auto_topic_creation: AutoTopicCreation | None = None
    # Pulsar's ``deleted``: the namespace's delete under way (set first, before it looks for topics): no topic
    # is created in it any more (:meth:`BrokerMetadataStore.create_ml_info`), so none is left behind
    deleted: bool = False

    @property
    def retention_time_s(self) -> float:
        return -1.0 if self.retention_time_minutes < 0 else self.retention_time_minutes * 60.0

    @property
    def retention_size_bytes(self) -> int:
        return -1 if self.retention_size_mb < 0 else self.retention_size_mb * 1024 * 1024

    def to_json(self) -> JsonDict:
        return {
            "retention_time_minutes": self.retention_time_minutes,
            "retention_size_mb": self.retention_size_mb,
            "deduplication_enabled": self.deduplication_enabled,
            # (a znode without it was written when false also meant never set: its false is read as not set)
            "deduplication_set": self.deduplication_enabled is not None,
            "backlog_quota": self.backlog_quota.to_json(),
            "message_age_quota": None if self.message_age_quota is None else self.message_age_quota.to_json(),
            "permissions": {role: list(actions) for role, actions in sorted(self.permissions.items())},
            "topic_permissions": {
                topic: {role: list(actions) for role, actions in sorted(grants.items())}
                for topic, grants in sorted(self.topic_permissions.items())
            },
            "schema_compatibility_strategy": self.schema_compatibility_strategy,
            "compaction_threshold": self.compaction_threshold,  # null kept: a removal merges over the old value
            "message_ttl_in_seconds": self.message_ttl_in_seconds,
            **{key: getattr(self, key) for key in _NAMESPACE_LIMITS},
            "subscription_expiration_time_minutes": self.subscription_expiration_time_minutes,
            "auto_topic_creation": None
            if self.auto_topic_creation is None
            else self.auto_topic_creation.to_json(),
            "deleted": self.deleted,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NamespacePolicies:
        return cls(
            retention_time_minutes=_field(d, "retention_time_minutes", int, 0),
            retention_size_mb=_field(d, "retention_size_mb", int, 0),
            deduplication_enabled=_namespace_dedup(d),
            backlog_quota=BacklogQuota.from_json(_field(d, "backlog_quota", dict, {})),
            message_age_quota=_optional_quota(d, "message_age_quota"),
            permissions=_permissions(_field(d, "permissions", dict, {})),
            topic_permissions=_topic_permissions(_field(d, "topic_permissions", dict, {})),
            schema_compatibility_strategy=_field(d, "schema_compatibility_strategy", str, "UNDEFINED"),
            compaction_threshold=_optional_threshold(d),
            message_ttl_in_seconds=_optional_threshold(d, "message_ttl_in_seconds"),
            max_producers_per_topic=_optional_threshold(d, "max_producers_per_topic"),
            max_consumers_per_topic=_optional_threshold(d, "max_consumers_per_topic"),
            max_unacked_messages_per_consumer=_optional_threshold(d, "max_unacked_messages_per_consumer"),
            max_unacked_messages_per_subscription=_optional_threshold(
                d, "max_unacked_messages_per_subscription"
            ),
            max_consumers_per_subscription=_optional_threshold(d, "max_consumers_per_subscription"),
            max_subscriptions_per_topic=_optional_threshold(d, "max_subscriptions_per_topic"),
            max_topics_per_namespace=_optional_threshold(d, "max_topics_per_namespace"),
            subscription_expiration_time_minutes=_optional_threshold(
                d, "subscription_expiration_time_minutes"
            ),
            auto_topic_creation=(
                None
                if d.get("auto_topic_creation") is None
                else AutoTopicCreation.from_json(_field(d, "auto_topic_creation", dict))
            ),
            deleted=bool(_optional_bool(d, "deleted")),
        )


#: the namespace's limits of 0 (none) or more, None when not set (their names are Pulsar's ``Policies`` fields)
_NAMESPACE_LIMITS = (
    "max_producers_per_topic",
    "max_consumers_per_topic",
    "max_unacked_messages_per_consumer",
    "max_unacked_messages_per_subscription",
    "max_consumers_per_subscription",
    "max_subscriptions_per_topic",
    "max_topics_per_namespace",
)


def _namespace_dedup(d: Mapping[str, Any]) -> bool | None:
    """A namespace's ``deduplication_enabled``, None when not set. A znode written before the policy could be
    unset (no ``deduplication_set``) holds false for every namespace that never set it, which meant the
    broker's default: read as not set, not as deduplication turned off (every namespace made before, the
    default one among them, would have lost it on a broker whose default is on)."""
    value = _optional_bool(d, "deduplication_enabled")
    if value is False and "deduplication_set" not in d:
        return None
    return value


def _optional_quota(d: Mapping[str, Any], key: str) -> BacklogQuota | None:
    """A backlog quota that may be absent or null (not set)."""
    return None if d.get(key) is None else BacklogQuota.from_json(_field(d, key, dict))


def _optional_bool(d: Mapping[str, Any], key: str) -> bool | None:
    """A boolean field that may be absent or null (not set)."""
    return None if d.get(key) is None else bool(_field(d, key, bool))


def _optional_threshold(d: Mapping[str, Any], key: str = "compaction_threshold") -> int | None:
    """A field of 0 or more that may be absent or null (not set)."""
    value = d.get(key)
    if value is None:
        return None
    value = _field(d, key, int)
    if value < 0:
        raise MetadataFormatError(f"field {key!r} is negative ({value})")
    return int(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicPolicies:
    """A topic's own policies (Pulsar's topic-level ``TopicPolicies``): each set one takes the place of its
    namespace's (:func:`policy_in_force`), None when not set on the topic. ``compaction_threshold``,
    ``message_ttl_in_seconds`` and the limits (``max_producers``, ``max_consumers``,
    ``max_unacked_messages_on_consumer``, ``max_unacked_messages_on_subscription``,
    ``max_consumers_per_subscription``, ``max_subscriptions_per_topic``; 0: none) are integers of 0
    or more; ``retention`` is (minutes, MB) as the namespace's (-1: infinite); ``deduplication_enabled`` a
    boolean; ``backlog_quota`` and ``message_age_quota`` quotas. Stored in their JSON form under these names (``update_topic_policy``
    writes one)."""

    compaction_threshold: int | None = None
    message_ttl_in_seconds: int | None = None
    max_producers: int | None = None
    max_consumers: int | None = None
    max_unacked_messages_on_consumer: int | None = None
    max_unacked_messages_on_subscription: int | None = None
    max_consumers_per_subscription: int | None = None
    max_subscriptions_per_topic: int | None = None
    retention: tuple[int, int] | None = None
    deduplication_enabled: bool | None = None
    backlog_quota: BacklogQuota | None = None
    message_age_quota: BacklogQuota | None = None

    @property
    def empty(self) -> bool:
        return all(getattr(self, name) is None for name in TopicPolicies.__dataclass_fields__)

    @property
    def retention_time_s(self) -> float | None:
        if self.retention is None:
            return None
        return -1.0 if self.retention[0] < 0 else self.retention[0] * 60.0

    @property
    def retention_size_bytes(self) -> int | None:
        if self.retention is None:
            return None
        return -1 if self.retention[1] < 0 else self.retention[1] * 1024 * 1024

    def to_json(self) -> JsonDict:
        out: JsonDict = {name: getattr(self, name) for name in _TOPIC_LIMITS}
        out["retention"] = None if self.retention is None else _retention_to_json(*self.retention)
        out["deduplication_enabled"] = self.deduplication_enabled
        out["backlog_quota"] = None if self.backlog_quota is None else self.backlog_quota.to_json()
        age = self.message_age_quota
        out["message_age_quota"] = None if age is None else age.to_json()
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TopicPolicies:
        retention, quota = d.get("retention"), d.get("backlog_quota")
        return cls(
            compaction_threshold=_optional_threshold(d),
            message_ttl_in_seconds=_optional_threshold(d, "message_ttl_in_seconds"),
            max_producers=_optional_threshold(d, "max_producers"),
            max_consumers=_optional_threshold(d, "max_consumers"),
            max_unacked_messages_on_consumer=_optional_threshold(d, "max_unacked_messages_on_consumer"),
            max_unacked_messages_on_subscription=_optional_threshold(
                d, "max_unacked_messages_on_subscription"
            ),
            max_consumers_per_subscription=_optional_threshold(d, "max_consumers_per_subscription"),
            max_subscriptions_per_topic=_optional_threshold(d, "max_subscriptions_per_topic"),
            retention=None if retention is None else _retention_from_json(_field(d, "retention", dict)),
            deduplication_enabled=_optional_bool(d, "deduplication_enabled"),
            backlog_quota=None if quota is None else BacklogQuota.from_json(_field(d, "backlog_quota", dict)),
            message_age_quota=_optional_quota(d, "message_age_quota"),
        )


#: the topic's own policies that are integers of 0 or more
_TOPIC_LIMITS = (
    "compaction_threshold",
    "message_ttl_in_seconds",
    "max_producers",
    "max_consumers",
    "max_unacked_messages_on_consumer",
    "max_unacked_messages_on_subscription",
    "max_consumers_per_subscription",
    "max_subscriptions_per_topic",
)


def _retention_to_json(minutes: int, size_mb: int) -> JsonDict:
    return {"retention_time_minutes": minutes, "retention_size_mb": size_mb}


def _retention_from_json(d: Mapping[str, Any]) -> tuple[int, int]:
    return (_field(d, "retention_time_minutes", int), _field(d, "retention_size_mb", int))


_V = TypeVar("_V")


def policy_in_force(topic: _V | None, namespace: _V | None, broker: _V) -> _V:
    """The value of a policy that applies to a topic (a compaction threshold, a message TTL, 0: off;
    deduplication): its own if set, else its namespace's if set, else the broker's default, in Pulsar's order (a
    topic's 0 or false turns it off whatever its namespace says)."""
    if topic is not None:
        return topic
    if namespace is not None:
        return namespace
    return broker


def _topic_permissions(d: Mapping[str, Any]) -> dict[str, dict[str, tuple[str, ...]]]:
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for topic, grants in d.items():
        if not isinstance(grants, dict):
            raise MetadataFormatError(f"permissions of topic {topic!r} are not an object: {grants!r}")
        out[str(topic)] = _permissions(grants)
    return out


def _permissions(d: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for role, actions in d.items():
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise MetadataFormatError(f"permissions of {role!r} are not a list of actions: {actions!r}")
        out[str(role)] = tuple(actions)
    return out


# --- schemas -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemaInfo:
    """A schema a producer declared (Pulsar's ``Schema``: type number, name, definition bytes, properties)."""

    type: int
    name: str = ""
    data: bytes = b""
    properties: Mapping[str, str] = field(default_factory=dict)
    #: when the version was stored (ms since the epoch; 0 in records written before it was kept)
    timestamp_ms: int = 0
    #: a deletion marker (Pulsar's deleted version): the admin's DELETE of the topic's schema; the versions
    #: before it stay readable by number, and the versions after it go on counting
    deleted: bool = False

    def to_json(self) -> JsonDict:
        d: JsonDict = {
            "type": self.type,
            "name": self.name,
            "data": base64.b64encode(self.data).decode("ascii"),
            "properties": dict(self.properties),
            "timestamp_ms": self.timestamp_ms,
        }
        if self.deleted:
            d["deleted"] = True
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SchemaInfo:
        try:
            data = base64.b64decode(_field(d, "data", str, ""), validate=True)
        except ValueError as e:
            raise MetadataFormatError(f"schema data is not base64: {e}") from e
        return cls(
            type=_field(d, "type", int),
            name=_field(d, "name", str, ""),
            data=data,
            properties={str(k): str(v) for k, v in _field(d, "properties", dict, {}).items()},
            timestamp_ms=_field(d, "timestamp_ms", int, 0),
            deleted=_field(d, "deleted", bool, False),
        )

    def same_definition(self, other: SchemaInfo) -> bool:
        """Pulsar reuses a version for the same type and definition (the name is the topic's, not part of it;
        the timestamp is the version's)."""
        return (self.type, self.data, dict(self.properties)) == (
            other.type,
            other.data,
            dict(other.properties),
        )


class SchemaRefusedError(Exception):
    """A schema the topic's stored schemas do not take (``add_schema``'s ``refuse``); the message says why."""


@dataclass(frozen=True, slots=True)
class SchemaHistory:
    """Every version of a topic's schema, its number being its index, deletion markers included (as Pulsar's
    schema storage: a delete is a version). The live versions are those after the last marker."""

    versions: tuple[SchemaInfo, ...] = ()

    @property
    def live_from(self) -> int:
        """The number of the first live version (after the last deletion marker; 0 without one)."""
        for i in range(len(self.versions) - 1, -1, -1):
            if self.versions[i].deleted:
                return i + 1
        return 0

    def live(self) -> list[tuple[int, SchemaInfo]]:
        """The live versions (what checks, reuse and the list of versions see), with their numbers."""
        start = self.live_from
        return list(enumerate(self.versions))[start:]

    def latest(self) -> tuple[int, SchemaInfo] | None:
        """The latest version, None without one or after a delete."""
        if not self.versions or self.versions[-1].deleted:
            return None
        return len(self.versions) - 1, self.versions[-1]

    def get(self, version: int) -> SchemaInfo | None:
        """Version ``version``, None if there is none such or it is a deletion marker."""
        if not 0 <= version < len(self.versions) or self.versions[version].deleted:
            return None
        return self.versions[version]

    def version_of(self, schema: SchemaInfo) -> int | None:
        """The live version with ``schema``'s definition (one from before a delete is not reused)."""
        for i, s in self.live():
            if s.same_definition(schema):
                return i
        return None

    def to_json(self) -> JsonDict:
        return {"versions": [s.to_json() for s in self.versions]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SchemaHistory:
        return cls(tuple(SchemaInfo.from_json(x) for x in _field(d, "versions", list, [])))


# --- the store -------------------------------------------------------------------------------------------------

#: a partition's local name (percent-encoded as in a managed-ledger name), as ``topic_broker.names`` parses it
_PARTITION_ML = re.compile(r"^(?P<base>.+)-partition-(?P<index>0|[1-9]\d*)$")


class PartitionedTopicGoneError(MetadataNotFoundError):
    """A partition's managed ledger not created: its partitioned topic's delete is under way (or it went)."""

    def __init__(self, base_ml_name: str, *, path: str | None = None) -> None:
        super().__init__(f"Partitioned topic {base_ml_name} is being deleted", path=path)


class NamespaceGoneError(MetadataNotFoundError):
    """A topic's znode not created: its namespace does not exist, or its delete is under way (marked
    ``deleted``)."""

    def __init__(self, tenant: str, namespace: str, *, path: str | None = None) -> None:
        super().__init__(f"Namespace {tenant}/{namespace} does not exist or is being deleted", path=path)
        self.tenant, self.namespace = tenant, namespace


class TopicsLimitError(Exception):
    """A topic (or a partitioned topic's partitions) not created: the namespace would hold more topics than its
    ``max_topics_per_namespace`` (Pulsar's "Exceed maximum number of topics in namespace.")."""

    def __init__(self, tenant: str, namespace: str, held: int, adding: int, limit: int) -> None:
        super().__init__(
            f"Exceed maximum number of topics in namespace. ({tenant}/{namespace} holds {held}, "
            f"{adding} more would pass its maxTopicsPerNamespace {limit})"
        )


class BrokerMetadataStore:
    """Async access to the broker's znodes. zk errors propagate (``MetadataVersionError`` on a CAS conflict).
    ``namespaces``: a topic's managed ledger or partitioned topic is created only in a namespace that exists and
    is not being deleted (:meth:`_create_in_namespace`), as a broker's are; without it (a managed ledger used
    alone, a tool writing the layout) anywhere."""

    def __init__(self, store: MetadataStore, *, namespaces: bool = False) -> None:
        self.store = store
        self.namespaces = namespaces

    # managed ledgers
    async def get_ml_info(self, ml_name: str) -> Versioned[ManagedLedgerInfo] | None:
        v = await self.store.aget_optional(layout.ml_info_path(ml_name))
        return None if v is None else v.map(ManagedLedgerInfo.from_json)

    async def create_ml_info(self, ml_name: str, info: ManagedLedgerInfo) -> Versioned[ManagedLedgerInfo]:
        """Raises ``MetadataExistsError`` if another broker created it first; with ``namespaces``
        :class:`NamespaceGoneError` when its namespace does not exist or is being deleted
        (:meth:`_create_in_namespace`)."""
        m = _PARTITION_ML.match(layout.check_ml_name(ml_name).rsplit("/", 1)[1]) if self.namespaces else None
        if m is None or not await self._create_in_partitioned(ml_name, info, ml_name.rsplit("/", 1)[0], m):
            await self._create_in_namespace(layout.ml_info_path(ml_name), info.to_json(), ml_name, topics=1)
        return Versioned(info, 0)

    async def _create_in_partitioned(
        self, ml_name: str, info: ManagedLedgerInfo, prefix: str, m: re.Match[str]
    ) -> bool:
        """A partition's managed ledger created only while its partitioned topic exists and is not being
        deleted, in one transaction with a check of the partitioned topic's znode at the version read (its
        delete marks it first, then deletes the partitions it counts: a partition made by a count grown
        meanwhile, or by a producer's open, is made before the mark, and deleted, or refused). False when there
        is no partitioned topic of that name, or its index is past the partitioned topic's count (a topic named
        so, made as any other: counted against ``max_topics_per_namespace``, as :meth:`count_topics` counts it;
        made here, it was never counted)."""
        guard = layout.partitioned_topic_path(f"{prefix}/{m.group('base')}")
        attempt = 0
        while True:
            v = await self.store.aget_optional(guard)
            if v is None:
                return False
            if v.value.get("deleted"):
                raise PartitionedTopicGoneError(
                    f"{prefix}/{m.group('base')}", path=self.store.abs_path(guard)
                )
            if int(m.group("index")) >= PartitionedTopicMetadata.from_json(v.value).partitions:
                return False
            try:
                await self.store.acreate_checked(
                    layout.ml_info_path(ml_name), info.to_json(), guard=guard, guard_version=v.version
                )
                return True
            except MetadataNotFoundError as e:
                if e.path != self.store.abs_path(guard):
                    raise
            except MetadataVersionError:
                pass
            attempt += 1  # (grown or marked since the read): read it again
            if attempt > 100:
                raise MetadataVersionError("partitioned topic keeps changing", path=guard)

    async def _create_in_namespace(self, path: str, body: JsonDict, ml_name: str, *, topics: int) -> None:
        """A topic's znode (``path``) created only while its namespace exists and is not being deleted, in one
        transaction with a check of the namespace's policies at the version read: a namespace delete marks
        them ``deleted`` before it looks for topics, so a create either lands before the mark (and the delete
        finds the topic) or is refused (:class:`NamespaceGoneError`; the empty directories it made removed);
        a policy written meanwhile only makes it read again. Without ``namespaces``, created as it is.

        ``topics``: the topics the create adds to the namespace (a partitioned topic's partitions, reserved by
        it; its partitions' managed ledgers are created in it, not counted again). Past the namespace's
        ``max_topics_per_namespace``: :class:`TopicsLimitError`, nothing created. With a limit the transaction
        writes the policies back at the version read (rather than only checking it), so that two creates at
        once, on any brokers, cannot both count the same room: the second's write fails, it counts again."""
        if not self.namespaces:
            await self.store.acreate(path, body)
            return
        tenant, namespace = layout.check_ml_name(ml_name).split("/")[:2]
        guard = layout.namespace_policies_path(tenant, namespace)
        attempt = 0
        while True:
            v = await self.store.aget_optional(guard)
            if v is None or v.value.get("deleted"):
                await self._prune_parents(path, f"{tenant}/{namespace}")
                raise NamespaceGoneError(tenant, namespace, path=self.store.abs_path(guard))
            limit = _optional_threshold(v.value, "max_topics_per_namespace")
            if limit:
                # counted at each attempt, not once: the attempt before failed because the policies moved on,
                # which is what another create's write-back does, so the room counted then may be gone
                held = await self.count_topics(tenant, namespace)
                if held + topics > limit:
                    await self._prune_parents(path, f"{tenant}/{namespace}")
                    raise TopicsLimitError(tenant, namespace, held, topics, limit)
            try:
                await self.store.acreate_checked(
                    path, body, guard=guard, guard_version=v.version, guard_write=v.value if limit else None
                )
                return
            except MetadataNotFoundError as e:
                if e.path != self.store.abs_path(guard):
                    raise
            except MetadataVersionError:
                pass
            attempt += 1  # the policies changed or went since the read: read them again
            if attempt > 100:
                raise MetadataVersionError("namespace policies keep changing", path=guard)

    async def count_topics(self, tenant: str, namespace: str) -> int:
        """The namespace's topics as its ``max_topics_per_namespace`` counts them, as Pulsar does: each
        non-partitioned topic one, each partitioned topic its partition count (whether each partition's managed
        ledger is created yet or not)."""
        prefix = f"{tenant}/{namespace}/persistent"
        partitions: dict[str, int] = {}
        for name in await self._children_or_none(f"{layout.TOPICS}/{prefix}"):
            meta = await self.get_partitions(f"{prefix}/{name}")
            if meta is not None:
                partitions[name] = meta.partitions
        count = sum(partitions.values())
        for name in await self._children_or_none(f"{layout.MANAGED_LEDGERS}/{prefix}"):
            m = _PARTITION_ML.match(name)
            if m is None or int(m.group("index")) >= partitions.get(m.group("base"), 0):
                count += 1
        return count

    async def _children_or_none(self, path: str) -> list[str]:
        try:
            return await self.store.achildren(path)
        except MetadataNotFoundError:
            return []

    async def _prune_parents(self, path: str, namespace: str) -> None:
        """The directories above ``path`` down to the namespace's removed where empty (a refused create made
        them)."""
        root = path.split("/", 1)[0]
        at = path.rpartition("/")[0]
        while at.startswith(f"{root}/{namespace}/") or at == f"{root}/{namespace}":
            try:
                await self.store.adelete(at, missing_ok=True)
            except MetadataNotEmptyError:
                return
            at = at.rpartition("/")[0]

    async def set_ml_info(
        self, ml_name: str, info: ManagedLedgerInfo, version: int
    ) -> Versioned[ManagedLedgerInfo]:
        """CAS; raises ``MetadataVersionError`` when another owner changed it."""
        v = await self.store.aset(layout.ml_info_path(ml_name), info.to_json(), version)
        return Versioned(info, v.version)

    async def delete_ml(self, ml_name: str) -> None:
        """The managed ledger's znode and its cursors (the ledgers themselves are the caller's)."""
        await self.store.adelete(layout.ml_info_path(ml_name), recursive=True, missing_ok=True)

    # cursors
    async def list_cursors(self, ml_name: str) -> list[str]:
        try:
            names = await self.store.achildren(layout.ml_cursors_path(ml_name))
        except MetadataNotFoundError:
            return []
        return [layout.decode_name(n) for n in names]

    async def get_cursor(self, ml_name: str, subscription: str) -> Versioned[CursorInfo] | None:
        v = await self.store.aget_optional(layout.ml_cursor_path(ml_name, subscription))
        return None if v is None else v.map(CursorInfo.from_json)

    async def save_cursor(
        self, ml_name: str, subscription: str, info: CursorInfo, version: int
    ) -> Versioned[CursorInfo]:
        """Create (``version`` −1) or CAS the cursor; raises ``MetadataExistsError``/``MetadataVersionError``
        when another owner wrote it."""
        path = layout.ml_cursor_path(ml_name, subscription)
        if version < 0:
            await self.store.acreate(path, info.to_json())
            return Versioned(info, 0)
        v = await self.store.aset(path, info.to_json(), version)
        return Versioned(info, v.version)

    async def delete_cursor(self, ml_name: str, subscription: str) -> None:
        await self.store.adelete(layout.ml_cursor_path(ml_name, subscription), missing_ok=True)

    # partitioned topics
    async def get_partitions(self, ml_name: str) -> PartitionedTopicMetadata | None:
        v = await self.store.aget_optional(layout.partitioned_topic_path(ml_name))
        return None if v is None else PartitionedTopicMetadata.from_json(v.value)

    async def create_partitioned_topic(self, ml_name: str, partitions: int) -> None:
        """Raises ``MetadataExistsError`` if the topic is already partitioned; with ``namespaces``
        :class:`NamespaceGoneError` when its namespace does not exist or is being deleted."""
        await self._create_in_namespace(
            layout.partitioned_topic_path(ml_name),
            PartitionedTopicMetadata(partitions).to_json(),
            ml_name,
            topics=partitions,
        )

    async def update_partitions(self, ml_name: str, partitions: int) -> None:
        """Grow a partitioned topic (partitions never shrink, as in Pulsar)."""
        new = PartitionedTopicMetadata(partitions)

        def grow(cur: JsonDict) -> JsonDict:
            stored = PartitionedTopicMetadata.from_json(cur)
            if stored.deleted:
                raise ValueError("the partitioned topic is being deleted")
            if stored.partitions > partitions:
                raise ValueError("the number of partitions can only grow")
            return {**cur, **new.to_json()}

        await self.store.aupdate(layout.partitioned_topic_path(ml_name), grow)

    async def mark_partitioned_deleted(self, ml_name: str, deleted: bool = True) -> int:
        """The partitioned topic marked (or no longer) as being deleted: it grows no more and no partition of it
        is created; its partition count then, final. MetadataNotFoundError when there is none."""

        def mark(cur: JsonDict) -> JsonDict:
            return {**cur, "deleted": deleted}

        v = await self.store.aupdate(layout.partitioned_topic_path(ml_name), mark)
        return PartitionedTopicMetadata.from_json(v.value).partitions

    async def delete_partitioned_topic(self, ml_name: str) -> None:
        await self.store.adelete(layout.partitioned_topic_path(ml_name), missing_ok=True)

    # brokers
    async def register_broker(
        self, broker_id: str, info: BrokerInfo, *, stale_wait_s: float | None = None
    ) -> None:
        """Ephemeral: gone when this store's session ends. A registration of another session is not replaced, as
        a bookie's is not: a broker killed under this id leaves one until its session times out, waited for up to
        ``stale_wait_s`` (default: the longer of the session timeouts ZooKeeper granted this session and the one
        that registered it, kept in its body, + 2 s); one still there then is another live broker's (started
        with the same id), and MetadataExistsError is raised. Our own session's is updated."""
        path = layout.broker_path(broker_id)
        own_s = self.store.session_timeout_s
        info = dataclasses.replace(info, session_timeout_ms=round(own_s * 1000))
        began = asyncio.get_running_loop().time()
        deadline = began + (own_s + 2.0 if stale_wait_s is None else stale_wait_s)
        holders: set[int] = set()  # the other sessions whose registration's body was read
        while True:
            try:
                await self.store.acreate(path, info.to_json(), ephemeral=True)
                return
            except MetadataExistsError:
                pass
            st = await asyncio.to_thread(self.store.stat, path)
            if st is None:
                continue  # gone meanwhile
            if st.ephemeral_owner == self.store.session_id:
                with contextlib.suppress(MetadataNotFoundError, MetadataVersionError):
                    await self.store.aset(path, info.to_json(), st.version)
                    return
                continue
            if stale_wait_s is None and st.ephemeral_owner not in holders:
                # a dead broker's session lasts its own timeout, longer than ours if it asked for more (an older
                # --zk-session-timeout-s) or was granted more
                holders.add(st.ephemeral_owner)
                with contextlib.suppress(MetadataNotFoundError, MetadataFormatError):
                    body = await self.store.aget_optional(path)
                    if body is not None:  # (at most REGISTERED_SESSION_TIMEOUT_MAX_S; one not a number: 0)
                        deadline = max(deadline, began + registered_timeout_s(body.value) + 2.0)
            if asyncio.get_running_loop().time() >= deadline:
                raise MetadataExistsError(
                    f"broker id {broker_id} is already registered by another live ZooKeeper session "
                    f"(0x{st.ephemeral_owner:x}): is another broker running with the same id? (a crashed "
                    "broker's registration disappears when its session times out)",
                    path=self.store.abs_path(path),
                )
            await asyncio.sleep(0.2)

    async def unregister_broker(self, broker_id: str) -> None:
        """This session's registration deleted (another live broker's of the same id is left alone)."""
        await self.store.adelete_own_ephemeral(layout.broker_path(broker_id))

    async def list_brokers(self) -> dict[str, BrokerInfo]:
        try:
            ids = await self.store.achildren(layout.BROKERS)
        except MetadataNotFoundError:
            return {}
        bodies = await asyncio.to_thread(self.store.get_many, [layout.broker_path(i) for i in ids])
        return {i: BrokerInfo.from_json(v.value) for i in ids if (v := bodies[layout.broker_path(i)])}

    # ownership
    async def acquire_ownership(self, ml_name: str, info: OwnershipInfo) -> OwnershipInfo:
        """Create the ephemeral ownership znode if absent; returns the current owner (``info`` if we won)."""
        path = layout.topic_ownership_path(ml_name)
        for _attempt in range(10):
            try:
                await self.store.acreate(path, info.to_json(), ephemeral=True)
                return info
            except MetadataNotFoundError:
                # its directories removed as they were made (a tidy-up, a namespace delete's or a release's
                # pruning of empty ones, twice in a row: kazoo makes the parents again once): make them again
                continue
            except MetadataExistsError:
                current = await self.store.aget_optional(path)
                if current is None:
                    continue
                owner = OwnershipInfo.from_json(current.value)
                if owner.broker_id == info.broker_id and await self.store.aephemeral_ours(path) is False:
                    # Our own id, but an earlier session's (a broker restarted under the same id before its
                    # old session expired): that record would vanish with the old session while we serve.
                    # Only while brokers/<id> is this session's: otherwise that session may be another live
                    # broker of this id (this one re-registering after a lost session, to be refused), whose
                    # topic this took, fencing its ledger, then left with no owner once refused.
                    if not await self.store.aowns_ephemeral(layout.broker_path(info.broker_id)):
                        raise MetadataExistsError(
                            f"{ml_name} is owned under broker id {owner.broker_id} by another ZooKeeper session, "
                            f"and brokers/{owner.broker_id} is not this broker's session's (registering again "
                            "after a lost session, or another live broker with the same id): not taken over",
                            path=self.store.abs_path(path),
                        ) from None
                    with contextlib.suppress(MetadataVersionError):
                        await self.store.adelete(path, current.version, missing_ok=True)
                    continue
                return owner
        raise MetadataVersionError("ownership znode keeps appearing and disappearing", path=path)

    async def prune_ownership_dirs(self, tenant: str, namespace: str) -> int:
        """The namespace's ownership directories removed where empty: an open refused once the namespace went
        (:class:`NamespaceGoneError`) had made them for its ownership znode. Returns how many went."""
        ns_dir = f"{layout.OWNERSHIP}/{layout.check_znode_name(tenant)}/{layout.check_znode_name(namespace)}"
        removed = 0
        for path in (f"{ns_dir}/persistent", ns_dir):
            try:
                removed += await self.store.adelete(path, missing_ok=True)
            except MetadataNotEmptyError:
                break
        return removed

    async def tidy_ownership_dirs(self) -> int:
        """The ownership directories of namespaces that no longer exist removed where empty, and a tenant's
        once it has no namespaces; returns how many znodes went. A namespace deleted while a broker held an
        ownership znode in it (a lookup's, of a topic nobody opened) keeps its directories from the delete's
        pruning; the holder's release prunes them, but a holder killed -9 never releases: its znode went with its
        session and the two empty directories stayed for good. A directory something is created in meanwhile
        stays (ZooKeeper refuses to delete it: not empty), and a create whose directory went as it was made
        makes it again (:meth:`acquire_ownership`)."""
        try:
            tenants = await self.store.achildren(layout.OWNERSHIP)
        except MetadataNotFoundError:
            return 0
        removed = 0
        for tenant in tenants:
            tenant_dir = f"{layout.OWNERSHIP}/{tenant}"
            try:
                namespaces = await self.store.achildren(tenant_dir)
            except MetadataNotFoundError:
                continue
            for ns in namespaces:
                if not await self.store.aexists(f"{layout.NAMESPACES}/{tenant}/{ns}"):
                    removed += await self.prune_ownership_dirs(tenant, ns)
            if not await self.store.aexists(f"{layout.NAMESPACES}/{tenant}"):
                with contextlib.suppress(MetadataNotEmptyError):
                    removed += await self.store.adelete(tenant_dir, missing_ok=True)
        return removed

    async def get_owner(self, ml_name: str) -> OwnershipInfo | None:
        v = await self.store.aget_optional(layout.topic_ownership_path(ml_name))
        return None if v is None else OwnershipInfo.from_json(v.value)

    async def release_ownership(self, ml_name: str, broker_id: str) -> bool:
        """Delete the ownership znode if ``broker_id`` holds it; True if it did. When the topic's namespace is
        gone (deleted while this znode, a lookup's held one, kept its directories from the delete's pruning),
        the namespace's ownership directories go too, where empty: they stayed for good before, two znodes per
        namespace so deleted."""
        path = layout.topic_ownership_path(ml_name)
        current = await self.store.aget_optional(path)
        if current is None or OwnershipInfo.from_json(current.value).broker_id != broker_id:
            return False
        try:
            deleted = await self.store.adelete(path, current.version, missing_ok=True)
        except MetadataVersionError:
            return False
        tenant, namespace, *_rest = ml_name.split("/")
        if not await self.store.aexists(layout.namespace_policies_path(tenant, namespace)):
            await self.prune_ownership_dirs(tenant, namespace)
        return deleted

    # schemas
    async def get_schemas(self, ml_name: str) -> SchemaHistory:
        v = await self.store.aget_optional(schema_path(ml_name))
        return SchemaHistory() if v is None else SchemaHistory.from_json(v.value)

    async def add_schema(
        self, ml_name: str, schema: SchemaInfo, refuse: Callable[[SchemaHistory], str | None] | None = None
    ) -> int:
        """The version of ``schema`` for the topic: an existing one with the same definition, else a new one
        appended (CAS, so concurrent producers on two brokers agree). ``refuse`` (the history -> why not, or
        None) runs inside the compare-and-set, on the history the schema would be stored in; a reason raises
        :class:`SchemaRefusedError`, so two brokers cannot both append definitions checked against an older
        history."""

        def add(cur: JsonDict) -> JsonDict:
            history = SchemaHistory.from_json(cur)
            why = refuse(history) if refuse is not None else None
            if why is not None:
                raise SchemaRefusedError(why)
            if history.version_of(schema) is None:
                history = SchemaHistory((*history.versions, schema))
            return {**cur, **history.to_json()}

        v = await self.store.aupdate(schema_path(ml_name), add, default=SchemaHistory().to_json())
        version = SchemaHistory.from_json(v.value).version_of(schema)
        assert version is not None
        return version

    async def delete_schemas(self, ml_name: str) -> None:
        """The whole record, as when the topic itself is deleted (its versions start at 0 again)."""
        await self.store.adelete(schema_path(ml_name), missing_ok=True)

    async def mark_schemas_deleted(self, ml_name: str, timestamp_ms: int) -> int:
        """The admin's DELETE of the topic's schema, as Pulsar's (not forced): a deletion marker appended as
        the next version, unless there is no live schema (none yet, or deleted already). The marker's number
        is returned, or the next version's when nothing was written."""
        history = await self.get_schemas(ml_name)
        if history.latest() is None:
            return len(history.versions)
        number = len(history.versions)

        def mark(cur: JsonDict) -> JsonDict:
            nonlocal number
            h = SchemaHistory.from_json(cur)
            number = len(h.versions)
            if h.latest() is None:
                return cur
            marker = SchemaInfo(type=0, timestamp_ms=timestamp_ms, deleted=True)
            return {**cur, **SchemaHistory((*h.versions, marker)).to_json()}

        await self.store.aupdate(schema_path(ml_name), mark, default=SchemaHistory().to_json())
        return number

    # namespaces
    async def get_policies(self, tenant: str, namespace: str) -> NamespacePolicies | None:
        v = await self.store.aget_optional(layout.namespace_policies_path(tenant, namespace))
        return None if v is None else NamespacePolicies.from_json(v.value)

    async def set_policies(self, tenant: str, namespace: str, policies: NamespacePolicies) -> None:
        """Every field written from ``policies`` (the namespace created when missing): for a record made whole,
        not for one admin's change of a field, which :meth:`update_policies` makes."""
        await self.store.aupdate(
            layout.namespace_policies_path(tenant, namespace),
            lambda cur: {**cur, **policies.to_json()},
            default={},
        )

    async def update_policies(
        self, tenant: str, namespace: str, change: Callable[[NamespacePolicies], NamespacePolicies]
    ) -> NamespacePolicies:
        """The namespace's policies as ``change`` makes them from those stored, in the store's compare-and-set
        loop (:meth:`MetadataStore.update`): on a version conflict ``change`` runs again on the policies another
        writer stored meanwhile, so two admins changing different fields at once both keep their change.
        ``change`` runs in a worker thread and may raise to abort (nothing written). Fields this version does not
        know are kept. MetadataNotFoundError for a namespace that does not exist (a delete is not undone)."""

        def fn(cur: JsonDict) -> JsonDict:
            return {**cur, **change(NamespacePolicies.from_json(cur)).to_json()}

        v = await self.store.aupdate(layout.namespace_policies_path(tenant, namespace), fn)
        return NamespacePolicies.from_json(v.value)

    async def get_topic_policies(self, ml_name: str) -> TopicPolicies | None:
        """The topic's own policies (``ml_name``: the base name of a partitioned topic), None if it has none;
        :class:`MetadataFormatError` naming the znode when what it holds is not policies."""
        path = topic_policies_path(ml_name)
        v = await self.store.aget_optional(path)
        if v is None:
            return None
        try:
            return TopicPolicies.from_json(v.value)
        except MetadataFormatError as e:
            unreadable = MetadataFormatError(str(e), path=self.store.abs_path(path))
            unreadable.version = v.version
            raise unreadable from e

    async def topics_with_policies(self, tenant: str, namespace: str) -> set[str]:
        """The managed-ledger names (base names) of the namespace's topics that have policies of their own, by one
        listing: the compaction monitor reads the policies of those only, not one znode per topic served."""
        parent = f"{TOPIC_POLICIES}/{layout.check_znode_name(tenant)}/{layout.check_znode_name(namespace)}/persistent"
        try:
            names = await self.store.achildren(parent)
        except MetadataNotFoundError:
            return set()
        return {f"{tenant}/{namespace}/persistent/{n}" for n in names}

    async def set_topic_policies(self, ml_name: str, policies: TopicPolicies) -> None:
        """Stored; removed when none is set any more."""
        if policies.empty:
            await self.delete_topic_policies(ml_name)
            return
        await self.store.aupdate(
            topic_policies_path(ml_name), lambda cur: {**cur, **policies.to_json()}, default={}
        )

    async def update_topic_policy(
        self, ml_name: str, field_name: str, value: Any, *, topic_znode: str | None = None
    ) -> None:
        """One of the topic's own policies set (``value``, in its JSON form: :meth:`TopicPolicies.to_json`) or
        removed (None), the others kept, in one
        compare-and-set of its znode; the znode is removed when none is set any more. With ``topic_znode`` (the
        topic's managed-ledger or partitioned-topic znode) the write is made only while that znode exists, in
        one transaction with the check: MetadataNotFoundError, nothing written, for a topic deleted meanwhile
        (its deletion removes its policies after that znode, so none is left behind)."""
        if field_name not in TopicPolicies.__dataclass_fields__:
            raise ValueError(f"no topic policy {field_name!r}")
        path = topic_policies_path(ml_name)
        try:
            stored = await self.get_topic_policies(ml_name)
        except MetadataFormatError as e:
            # unreadable (not JSON, or not policies): the write replaces it, as the only way back; the version
            # read only, so that policies written meanwhile are read and kept
            if e.version is not None:
                with contextlib.suppress(MetadataVersionError):
                    await self.store.adelete(path, e.version, missing_ok=True)
            stored = None
        if value is None and stored is None:
            return

        def change(cur: JsonDict) -> JsonDict:
            return {**cur, field_name: value}

        if topic_znode is None:
            new = await self.store.aupdate(path, change, default={})
        else:
            new = await self.store.aupdate_guarded(path, change, guard=topic_znode, default={})
        if TopicPolicies.from_json(new.value).empty:
            # only that version: a policy set meanwhile stays
            with contextlib.suppress(MetadataVersionError):
                await self.store.adelete(path, new.version, missing_ok=True)

    async def delete_topic_policies(self, ml_name: str) -> None:
        await self.store.adelete(topic_policies_path(ml_name), missing_ok=True)

    async def ensure_default_namespace(self) -> NamespacePolicies:
        """``public/default`` with default policies, created if absent; returns its policies."""
        path = layout.namespace_policies_path(DEFAULT_TENANT, DEFAULT_NAMESPACE)
        v = await self.store.aupdate(path, lambda cur: cur, default=NamespacePolicies().to_json())
        return NamespacePolicies.from_json(v.value)

    async def list_namespaces(self, tenant: str) -> list[str]:
        try:
            return await self.store.achildren(f"{layout.NAMESPACES}/{layout.check_znode_name(tenant)}")
        except MetadataNotFoundError:
            return []
