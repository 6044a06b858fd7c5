"""The znode layout: every path the system uses, relative to the store root (default ``/ledgerstore``).

All functions here are pure. Paths are *relative* (no leading ``/``); :class:`zk.client.MetadataStore` prefixes
the root. See ``docs/metadata.md`` for the bodies and who writes them.

Ledger znodes are hierarchical, like BookKeeper's ``LongHierarchicalLedgerManager``: the id is zero-padded to 19
digits (enough for any non-negative signed 64-bit id) and split 3/4/4/4/4::

    ledger 1            -> ledgers/000/0000/0000/0000/L0001
    ledger 123456789012 -> ledgers/000/0000/1234/5678/L9012

so no znode ever has more than 10 000 children (the top level at most 923), whatever the number of ledgers.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

DEFAULT_ROOT = "/ledgerstore"

LEDGERS = "ledgers"
IDGEN = "idgen"
BOOKIES = "bookies"
BOOKIES_AVAILABLE = "bookies/available"
BOOKIES_READONLY = "bookies/readonly"
COOKIES = "cookies"
INSTANCEID = "INSTANCEID"
UNDERREPLICATED = "underreplicated"
UNDERREPLICATED_LEDGERS = "underreplicated/ledgers"
UNDERREPLICATED_LOCKS = "underreplicated/locks"
# The topic broker's znodes (docs/architecture.md §7, bodies in docs/broker.md and zk/managed_ledgers.py).
MANAGED_LEDGERS = "managed-ledgers"
TOPICS = "topics"
BROKERS = "brokers"
OWNERSHIP = "ownership"

MAX_LEDGER_ID = 2**63 - 1
LEDGER_ID_DIGITS = 19
#: Widths of the path components the zero-padded id is split into (the last one is the leaf, prefixed "L").
LEDGER_PATH_SPLIT = (3, 4, 4, 4, 4)
LEDGER_LEAF_PREFIX = "L"
UNDERREPLICATED_LEAF_PREFIX = "urL"

_INTERNAL_RE = [re.compile(rf"^\d{{{w}}}$") for w in LEDGER_PATH_SPLIT[:-1]]


def _check_ledger_id(ledger_id: int) -> None:
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int):
        raise TypeError(f"ledger id must be an int, got {type(ledger_id).__name__}")
    if not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise ValueError(f"ledger id {ledger_id} out of range 0..{MAX_LEDGER_ID}")


def _split_id(ledger_id: int) -> list[str]:
    _check_ledger_id(ledger_id)
    digits = f"{ledger_id:0{LEDGER_ID_DIGITS}d}"
    parts, pos = [], 0
    for width in LEDGER_PATH_SPLIT:
        parts.append(digits[pos : pos + width])
        pos += width
    return parts


def ledger_path(ledger_id: int) -> str:
    """``ledgers/000/0000/0000/0000/L0001`` for ledger 1."""
    parts = _split_id(ledger_id)
    return "/".join([LEDGERS, *parts[:-1], LEDGER_LEAF_PREFIX + parts[-1]])


def ledger_bucket_depth() -> int:
    """Number of directory levels between ``ledgers`` and the ``L....`` leaves."""
    return len(LEDGER_PATH_SPLIT) - 1


def _parse_hier(components: list[str], leaf_prefix: str, what: str, path: str) -> int:
    if len(components) != len(LEDGER_PATH_SPLIT):
        raise ValueError(f"not a {what} path: {path!r}")
    for comp, rx in zip(components[:-1], _INTERNAL_RE, strict=True):
        if not rx.match(comp):
            raise ValueError(f"not a {what} path: {path!r} (bad component {comp!r})")
    leaf = components[-1]
    width = LEDGER_PATH_SPLIT[-1]
    if not (leaf.startswith(leaf_prefix) and re.fullmatch(rf"\d{{{width}}}", leaf[len(leaf_prefix) :])):
        raise ValueError(f"not a {what} path: {path!r} (bad leaf {leaf!r})")
    ledger_id = int("".join(components[:-1]) + leaf[len(leaf_prefix) :])
    if ledger_id > MAX_LEDGER_ID:
        raise ValueError(f"not a {what} path: {path!r} (id out of range)")
    return ledger_id


def parse_ledger_path(path: str) -> int:
    """Inverse of :func:`ledger_path`; raises ``ValueError`` for anything that is not exactly a ledger path."""
    comps = path.strip("/").split("/")
    if not comps or comps[0] != LEDGERS:
        raise ValueError(f"not a ledger path: {path!r}")
    return _parse_hier(comps[1:], LEDGER_LEAF_PREFIX, "ledger", path)


def check_znode_name(name: str, what: str = "znode name") -> str:
    """Validate a single path component (bookie ids, broker ids, ...). ``':'`` is fine in znode names, and so is
    ``zookeeper`` below the root (only ``/zookeeper`` is ZooKeeper's own: ``zk.client`` refuses a root under it):
    a Pulsar tenant, namespace or topic may be named so."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a non-empty string")
    if "/" in name or name in (".", "..") or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise ValueError(f"invalid {what} {name!r}: no '/', control characters, '.' or '..'")
    return name


# --- bookies ------------------------------------------------------------------------------------------------


def available_bookie_path(bookie_id: str) -> str:
    return f"{BOOKIES_AVAILABLE}/{check_znode_name(bookie_id, 'bookie id')}"


def readonly_bookie_path(bookie_id: str) -> str:
    return f"{BOOKIES_READONLY}/{check_znode_name(bookie_id, 'bookie id')}"


def cookie_path(bookie_id: str) -> str:
    return f"{COOKIES}/{check_znode_name(bookie_id, 'bookie id')}"


# --- under-replication (paths only for now) ----------------------------------------------------------------


def underreplicated_ledger_path(ledger_id: int) -> str:
    """``underreplicated/ledgers/000/0000/0000/0000/urL0001``: marks ledger 1 as under-replicated."""
    parts = _split_id(ledger_id)
    return "/".join([UNDERREPLICATED_LEDGERS, *parts[:-1], UNDERREPLICATED_LEAF_PREFIX + parts[-1]])


def parse_underreplicated_ledger_path(path: str) -> int:
    comps = path.strip("/").split("/")
    if comps[:2] != UNDERREPLICATED_LEDGERS.split("/"):
        raise ValueError(f"not an under-replicated ledger path: {path!r}")
    return _parse_hier(comps[2:], UNDERREPLICATED_LEAF_PREFIX, "under-replicated ledger", path)


def underreplicated_lock_path(ledger_id: int) -> str:
    """Ephemeral lock held by the worker re-replicating ledger ``ledger_id``."""
    _check_ledger_id(ledger_id)
    return f"{UNDERREPLICATED_LOCKS}/{UNDERREPLICATED_LEAF_PREFIX}{ledger_id:0{LEDGER_ID_DIGITS}d}"


# --- topic broker (docs/broker.md) ------------------------------------------------------------------------


def encode_name(name: str) -> str:
    """Percent-encode an arbitrary name (e.g. a topic ``persistent://t/ns/x``) into one znode component."""
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    encoded = quote(name, safe="-_:@,=+")
    if encoded in (".", ".."):
        encoded = encoded.replace(".", "%2E")
    return encoded


def decode_name(component: str) -> str:
    return unquote(component)


def broker_path(broker_id: str) -> str:
    return f"{BROKERS}/{check_znode_name(broker_id, 'broker id')}"


def join(*parts: str) -> str:
    """Join relative path components, ignoring empty ones and stray slashes."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


# --- topic broker: managed ledgers, cursors, partitioned topics, ownership, namespaces (docs/broker.md) ------

NAMESPACES = "namespaces"
ML_CURSORS = "cursors"


def check_ml_name(ml_name: str) -> str:
    """A managed-ledger name is ``tenant/ns/persistent/<percent-encoded local>``: four valid components."""
    if not isinstance(ml_name, str):
        raise ValueError("managed-ledger name must be a string")
    parts = ml_name.split("/")
    if len(parts) != 4 or parts[2] != "persistent":
        raise ValueError(f"invalid managed-ledger name {ml_name!r}: expected tenant/ns/persistent/<local>")
    for part in parts:
        check_znode_name(part, "managed-ledger name component")
    return ml_name


def encode_component(name: str) -> str:
    """``quote(name, safe="")``: any name (a subscription, a topic's local name) as one znode component."""
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    encoded = quote(name, safe="")
    return encoded.replace(".", "%2E") if encoded in (".", "..") else encoded


def ml_info_path(ml_name: str) -> str:
    """``managed-ledgers/<tenant>/<ns>/persistent/<local>``: the managed ledger's ledger list."""
    return f"{MANAGED_LEDGERS}/{check_ml_name(ml_name)}"


def ml_cursors_path(ml_name: str) -> str:
    return f"{ml_info_path(ml_name)}/{ML_CURSORS}"


def ml_cursor_path(ml_name: str, subscription: str) -> str:
    """``managed-ledgers/<ml>/cursors/<percent-encoded subscription>``."""
    return f"{ml_cursors_path(ml_name)}/{encode_component(subscription)}"


def partitioned_topic_path(ml_name: str) -> str:
    """``topics/<tenant>/<ns>/persistent/<local>``: the partition count of a partitioned topic."""
    return f"{TOPICS}/{check_ml_name(ml_name)}"


def topic_ownership_path(ml_name: str) -> str:
    """``ownership/<tenant>/<ns>/persistent/<local>`` (ephemeral): the broker serving the topic."""
    return f"{OWNERSHIP}/{check_ml_name(ml_name)}"


def namespace_policies_path(tenant: str, namespace: str) -> str:
    """``namespaces/<tenant>/<ns>``: retention, deduplication and backlog-quota policies."""
    return f"{NAMESPACES}/{check_znode_name(tenant, 'tenant')}/{check_znode_name(namespace, 'namespace')}"
