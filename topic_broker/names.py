"""Topic names, as Pulsar spells them.

A topic is ``persistent://<tenant>/<namespace>/<local name>``; ``tenant/ns/local`` and a bare ``local`` (in
``public/default``) are accepted short forms. A partition of a partitioned topic is the topic
``<local>-partition-<i>``. One topic (or partition) is one managed ledger, named
``<tenant>/<ns>/persistent/<quote(local, safe="")>`` so that it is exactly one znode (see ``docs/broker.md``).

``non-persistent://`` topics are not supported and are refused with a clear :class:`InvalidTopicName`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_TENANT",
    "PARTITION_SUFFIX",
    "PERSISTENT",
    "InvalidTopicName",
    "TopicName",
    "valid_segment",
]

PERSISTENT = "persistent"
NON_PERSISTENT = "non-persistent"
DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"
PARTITION_SUFFIX = "-partition-"
#: Pulsar's rule for tenant and namespace names (its NamedEntity's), whose Java ``\w`` is ASCII's: Python's took
#: any letter, and one outside the Basic Multilingual Plane is a znode name ZooKeeper refuses (a 500 for a tenant)
_SEGMENT_RE = re.compile(r"^[-=:.\w]+$", re.ASCII)
_PARTITION_RE = re.compile(r"^(?P<base>.+)" + re.escape(PARTITION_SUFFIX) + r"(?P<index>0|[1-9]\d*)$")
#: A generous bound: the managed-ledger name must fit a znode path.
LOCAL_NAME_MAX = 1024


class InvalidTopicName(ValueError):
    """A topic name that cannot be parsed (or names an unsupported domain)."""

    code = "INVALID_TOPIC_NAME"
    retriable = False


def valid_segment(value: str) -> bool:
    """Whether ``value`` is a tenant or namespace name as Pulsar allows them."""
    return bool(value) and _SEGMENT_RE.match(value) is not None and value not in (".", "..")


def _check_segment(value: str, what: str, full: str) -> str:
    if not valid_segment(value):
        raise InvalidTopicName(f"invalid {what} {value!r} in topic name {full!r}")
    return value


def _check_local(local: str, full: str) -> str:
    if not local:
        raise InvalidTopicName(f"empty local name in topic name {full!r}")
    if "/" in local:
        raise InvalidTopicName(f"local name {local!r} may not contain '/' (topic name {full!r})")
    if local in (".", ".."):
        raise InvalidTopicName(f"invalid local name {local!r} in topic name {full!r}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in local):
        raise InvalidTopicName(f"control character in topic name {full!r}")
    if len(local) > LOCAL_NAME_MAX:
        raise InvalidTopicName(f"local name longer than {LOCAL_NAME_MAX} characters in {full[:64]!r}...")
    return local


@dataclass(frozen=True, slots=True)
class TopicName:
    """A fully qualified persistent topic name. Build it with :meth:`parse`."""

    tenant: str
    namespace: str
    local: str

    @classmethod
    def parse(cls, name: str) -> TopicName:
        """``"t"`` → ``persistent://public/default/t``; also ``tenant/ns/t`` and ``persistent://tenant/ns/t``."""
        if not isinstance(name, str) or not name:
            raise InvalidTopicName("topic name must be a non-empty string")
        if "://" in name:
            domain, rest = name.split("://", 1)
            if domain == NON_PERSISTENT:
                raise InvalidTopicName(f"non-persistent topics are not supported: {name!r}")
            if domain != PERSISTENT:
                raise InvalidTopicName(f"unknown topic domain {domain!r} in {name!r}")
            parts = rest.split("/", 2)
            if len(parts) != 3:
                raise InvalidTopicName(f"expected persistent://<tenant>/<namespace>/<topic>, got {name!r}")
        else:
            parts = name.split("/", 2)
            if len(parts) == 1:
                parts = [DEFAULT_TENANT, DEFAULT_NAMESPACE, parts[0]]
            elif len(parts) != 3:
                raise InvalidTopicName(
                    f"invalid short topic name {name!r}: use <topic> or <tenant>/<namespace>/<topic>"
                )
        tenant, namespace, local = parts
        return cls(
            _check_segment(tenant, "tenant", name),
            _check_segment(namespace, "namespace", name),
            _check_local(local, name),
        )

    def __str__(self) -> str:
        return f"{PERSISTENT}://{self.tenant}/{self.namespace}/{self.local}"

    @property
    def namespace_name(self) -> str:
        """``tenant/namespace``."""
        return f"{self.tenant}/{self.namespace}"

    @property
    def partition_index(self) -> int:
        """The ``i`` of ``<topic>-partition-<i>``, −1 for a topic that is not a partition."""
        m = _PARTITION_RE.match(self.local)
        return int(m.group("index")) if m else -1

    @property
    def is_partition(self) -> bool:
        return self.partition_index >= 0

    @property
    def base(self) -> TopicName:
        """The partitioned topic a partition belongs to (the topic itself when it is not a partition)."""
        m = _PARTITION_RE.match(self.local)
        return self if m is None else TopicName(self.tenant, self.namespace, m.group("base"))

    def partition(self, index: int) -> TopicName:
        """The ``index``-th partition of this (base) topic."""
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise InvalidTopicName(f"partition index must be a non-negative int, got {index!r}")
        if self.is_partition:
            raise InvalidTopicName(f"{self} is already a partition")
        return TopicName(self.tenant, self.namespace, f"{self.local}{PARTITION_SUFFIX}{index}")

    @property
    def ml_name(self) -> str:
        """The managed-ledger name: ``tenant/ns/persistent/<percent-encoded local>`` (one znode)."""
        return f"{self.tenant}/{self.namespace}/{PERSISTENT}/{quote(self.local, safe='')}"
