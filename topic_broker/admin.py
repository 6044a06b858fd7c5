"""The broker's HTTP side (``--http-port``, 8080 by default): Pulsar's admin REST ``/admin/v2``, the HTTP lookup
``/lookup/v2`` that ``pulsar.Client("http://…")`` uses, ``/metrics`` (Prometheus) and ``/health``.

Paths, bodies and field names are Pulsar's, so ``pulsar-admin`` habits and the Pulsar clients work:

- ``/admin/v2/clusters``, ``/admin/v2/tenants[/{t}]``, ``/admin/v2/namespaces/{t}[/{ns}]`` with the namespace
  policies users set (``retention``, ``deduplication``, ``backlogQuota``, ``schemaCompatibilityStrategy``,
  ``compactionThreshold``, ``messageTTL``), stored in ZooKeeper (``namespaces/<t>/<ns>``, docs/broker.md).
- ``/admin/v2/schemas/{t}/{ns}/{topic}/…``: a topic's schemas (``schema[/{version}]``, ``schemas``, upload,
  ``compatibility``, delete), checked as a producer's declaration is (``schema_compat``).
- ``/admin/v2/persistent/{t}/{ns}[/{topic}[/…]]``: list, create, delete, partitions (create, grow, count),
  ``stats``, ``partitioned-stats``, ``internalStats``, ``partitioned-internalStats``, ``internal-info``, ``messageid/{timestamp}``,
  subscriptions (list, create, delete, ``resetcursor``,
  ``skip_all``, ``skip``, peek at ``position/{n}``, ``expireMessages``, ``all_subscription/expireMessages``),
  ``lastMessageId``, ``examinemessage``, a message by id, ``unload``, ``terminate``, ``compaction`` (``PUT``
  starts one, 204, or 409 while one runs; ``GET`` its status, Pulsar's ``{"status", "lastError"}``),
  ``compactionThreshold`` and ``messageTTL`` (the topic's own policies, ``topic-policies/<ml>``; a partitioned
  topic's are each of its partitions').
- ``/lookup/v2/topic/{domain}/{t}/{ns}/{topic}``: the owner's URLs; any broker answers for any topic and takes
  ownership when nobody holds it, as the binary LOOKUP does. A ``non-persistent`` topic (and its
  ``/admin/v2/non-persistent/…/partitions``, 0) is answered with this broker's URLs, for the binary protocol to
  refuse it with its reason (``AdminApp.lookup``).

Where a topic lives: calls that need the topic itself (stats, cursors, delete) run on its owner. A broker that
does not own the topic answers ``307 Temporary Redirect`` to the owner's web URL, as Pulsar does; when nobody
owns it, this broker takes it. Calls that only read or write ZooKeeper (list, partition counts, topic creation,
namespace policies) are answered by any broker. Calls on a partitioned topic are made per partition through
HTTP to this broker, which follows the redirects to each partition's owner.

Authentication (with ``--auth-secret-file``): every call but ``GET``/``HEAD`` needs ``Authorization: Bearer
<token>`` (401 without a good one; 403 when ``--superuser-roles`` is set and the token's subject is not one of
them); reads need one too with ``--admin-read-auth``, and the HTTP lookup with ``--auth-required`` (which also
checks the subject's produce or consume permission, as the binary LOOKUP does). Reads that answer messages'
payloads (:data:`PAYLOAD_ROUTES`) always need a token, and the consume permission with ``--auth-required``.
``/health`` and ``/metrics`` are always open. Namespace permissions: ``/admin/v2/namespaces/{t}/{ns}/permissions[/{role}]`` (Pulsar's
``grant-permission``, ``permissions``, ``revoke-permission``).

Errors are Pulsar's: a JSON body ``{"reason": "…"}`` with 400 (bad body), 404 (no such topic, subscription,
namespace), 405 (not allowed there: a partition's call on a partitioned topic or the reverse, a forced delete the
broker does not allow, a reader's or the compactor's subscription moved), 409 (already exists, not empty), 412
(invalid name, active clients without ``force``), 406 (a partitioned topic created past the partition limit), 408
(a body not arrived in time), 413 (a body, or subscription properties, too large), 422 (a partition count below the
current one, or grown past the limit), 500, 503 (try again: starting, ZooKeeper away, too few bookies). A call
on one topic whose tenant or namespace does not exist is 404 "Namespace not found" before anything is written.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import dataclasses
import json
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, unquote

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client.core import Metric
from yarl import URL

import zk
from bookie.auth import create_token
from bookie.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from bookie.server_gate import HTTP_IDLE_TIMEOUT_S, HttpService, refusal_json, serve_http
from ledger_client import errors as LE
from zk import layout
from zk.backoff import backoff
from zk.managed_ledgers import (
    SCHEMAS,
    TOPIC_POLICIES,
    AutoTopicCreation,
    BacklogQuota,
    CursorInfo,
    ManagedLedgerInfo,
    NamespacePolicies,
    OwnershipInfo,
    SchemaHistory,
    SchemaInfo,
    SchemaRefusedError,
    TopicPolicies,
    TopicsLimitError,
    policy_in_force,
)

from . import pulsar_api_pb2 as pb
from . import schema_compat, sub_ops, wire
from .bookie_supply import BookiesShortError
from .compaction import COMPACTION_SUBSCRIPTION, CompactionRunningError
from .cursor import InitialPosition, ManagedCursor, SubscriptionPropertiesTooLargeError
from .managed_ledger import ManagedLedger, ManagedLedgerError, Position
from .metrics import BrokerMetrics, Families
from .names import NON_PERSISTENT, PERSISTENT, InvalidTopicName, TopicName, valid_segment
from .service import (
    NAMESPACE_NOT_FOUND,
    NamespaceNotFoundError,
    PartitionLimitError,
    SubscriptionsLimitError,
    TopicDeletingError,
    past_partition_limit,
    schema_refusal,
)
from .subscription import DEFAULT_UNACKED_MESSAGES_MAX, DEFAULT_UNACKED_SUBSCRIPTION_MAX
from .tls import client_role
from .wire import pulsar_date

if TYPE_CHECKING:
    from .service import BrokerService, Topic

__all__ = ["CLUSTER_NAME", "AdminServer", "build_app", "pulsar_date"]

log = logging.getLogger(__name__)

#: The one cluster a ledgerstore deployment is (``/admin/v2/clusters``).
CLUSTER_NAME = "ledgerstore"
#: ``deleting/<what, quoted>``: the ephemeral znode of a namespace's or partitioned topic's delete under way.
DELETING = "deleting"
#: the first wait, then the longest, between tries to remove a delete's ``deleting/`` znode whose removal failed
DELETING_RETRY_S = (0.5, 5.0)
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")


class AdminError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _shrink_refused(asked: int, current: int) -> AdminError:
    """A partitioned topic's partitions never shrink: Pulsar's answer to a count below its own, its words."""
    return AdminError(422, f"Expect partitions {asked} can't less than current partitions {current}.")


#: A partitioned topic's subscription's fields that are the sum of its partitions', as Pulsar's
#: ``SubscriptionStatsImpl.add`` sums them (``msgBacklogEntries``, ours, likewise).
_SUBSCRIPTION_SUMS = (
    "msgBacklog",
    "msgBacklogEntries",
    "msgBacklogNoDelayed",
    "backlogSize",
    "msgRateOut",
    "msgThroughputOut",
    "msgRateRedeliver",
    "msgOutCounter",
    "bytesOutCounter",
    "unackedMessages",
    "msgDelayed",
    "nonContiguousDeletedMessagesRanges",
)
_SUBSCRIPTION_LATEST = ("lastAckedTimestamp", "lastConsumedTimestamp", "lastConsumedFlowTimestamp")


def _new_subscription_total() -> dict[str, Any]:
    """A partitioned topic's subscription in ``partitioned-stats`` before its partitions' are added: the fields a
    partition's has, as Pulsar's aggregate carries them (a new ``SubscriptionStatsImpl``). Those Pulsar does not
    aggregate keep its defaults: ``earliestMsgPublishTimeInBacklog`` 0, ``blockedSubscriptionOnUnackedMsgs``
    false, ``activeConsumerName`` null; a partition's cursor positions mean nothing for the whole and are left
    out (they are in each partition's entry)."""
    return {
        "type": None,
        "isDurable": False,
        "isReplicated": False,
        **dict.fromkeys(_SUBSCRIPTION_SUMS, 0),
        "msgRateOut": 0.0,
        "msgThroughputOut": 0.0,
        "msgRateRedeliver": 0.0,
        "earliestMsgPublishTimeInBacklog": 0,
        "blockedSubscriptionOnUnackedMsgs": False,
        **dict.fromkeys(_SUBSCRIPTION_LATEST, 0),
        "activeConsumerName": None,
        "subscriptionProperties": {},
        "consumers": [],
    }


def _add_subscription(total: dict[str, Any], part: dict[str, Any]) -> None:
    """A partition's subscription stats added into ``total`` (:func:`_new_subscription_total`) as Pulsar's
    ``SubscriptionStatsImpl.add`` adds them: counters and backlogs summed, ``type`` the last partition's,
    ``isDurable``, ``isReplicated`` and ``allowOutOfOrderDelivery`` true when any partition's is, the properties
    merged, the consumers all listed; a Key_Shared one's ``keySharedMode`` null, as Pulsar leaves it. The
    last-activity times are the latest partition's (Pulsar leaves them 0)."""
    for k in _SUBSCRIPTION_SUMS:
        total[k] += part.get(k, 0)
    total["type"] = part.get("type", total["type"])
    for k in ("isDurable", "isReplicated"):
        total[k] = total[k] or bool(part.get(k, False))
    if "allowOutOfOrderDelivery" in part:
        total["allowOutOfOrderDelivery"] = total.get("allowOutOfOrderDelivery", False) or bool(
            part["allowOutOfOrderDelivery"]
        )
    if "keySharedMode" in part:  # (Pulsar's add never sets it; each partition's entry has its own)
        total["keySharedMode"] = None
    for k in _SUBSCRIPTION_LATEST:
        total[k] = max(total[k], part.get(k, 0))
    total["subscriptionProperties"].update(part.get("subscriptionProperties") or {})
    total["consumers"] += part.get("consumers", [])


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


def _no_content() -> web.Response:
    return web.Response(status=204)


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"reason": reason}, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except AdminError as e:
        return _error(e.status, e.reason)
    except InvalidTopicName as e:
        return _error(412, str(e))
    except NamespaceNotFoundError:  # a topic call raced the namespace's deletion
        return _error(404, NAMESPACE_NOT_FOUND)
    except TopicDeletingError as e:  # its delete still under way: try again
        return _error(503, str(e))
    except TopicsLimitError as e:  # the namespace's maxTopicsPerNamespace: Pulsar's 412
        return _error(412, str(e))
    except web.HTTPException as e:
        if e.status < 400:  # a redirect to the topic's owner
            raise
        return _http_error(e)
    except zk.MetadataNotFoundError as e:
        return _error(404, str(e))
    except (zk.MetadataError, ManagedLedgerError) as e:
        if isinstance(e, zk.MetadataConnectionError) or isinstance(e.__cause__, zk.MetadataConnectionError):
            # ZooKeeper away: unavailable (retry later) with the reason, one line, as the bookie's admin HTTP
            reason = str(e) if "ZooKeeper" in str(e) else f"ZooKeeper: {e}"
            log.warning("admin %s %s: 503: %s", request.method, request.path, reason)
            return _error(503, reason)
        if isinstance(e, BookiesShortError) or isinstance(e.__cause__, LE.NotEnoughBookiesError):
            # too few writable bookies for a new ledger: as passing as ZooKeeper away, answered the same way
            log.warning("admin %s %s: 503: %s", request.method, request.path, e)
            return _error(503, str(e))
        log.warning("admin %s %s failed: %s", request.method, request.path, e)
        return _error(500, str(e))
    except Exception as e:
        log.exception("admin %s %s failed", request.method, request.path)
        return _error(500, f"internal error: {e}")


def _http_error(e: web.HTTPException) -> web.Response:
    """aiohttp's own refusals (no such route, a method the route does not take, a body past the size limit) with
    Pulsar's ``{"reason"}`` body as every other refusal, not aiohttp's text ("404: Not Found")."""
    return refusal_json(e, "reason")


# ------------------------------------------------------------------------------------------------------------
# helpers over the service's topics


def _storage_size(topic: Topic) -> int:
    return topic.ml.total_size


def _cursor_backlog(
    topic: Topic, mark_delete: Position, ranges: list[tuple[Position, Position]]
) -> tuple[int, int, int]:
    """(messages, entries, estimated bytes) after ``mark_delete`` not individually acked."""
    ml = topic.ml
    view = ml.view()
    last = view.last_position()
    entries = view.count_entries(mark_delete, last) - sum(
        view.count_entries(s.previous(), e) for s, e in ranges
    )
    messages = ml.count_messages(mark_delete, last) - sum(
        ml.count_messages(s.previous(), e) for s, e in ranges
    )
    size = ml.estimate_bytes(mark_delete, last) - sum(ml.estimate_bytes(s.previous(), e) for s, e in ranges)
    return max(0, messages), max(0, entries), max(0, size)


async def _earliest_publish_time(topic: Topic, mark_delete: Position, backlog: int, asked: bool) -> int:
    """Pulsar's ``earliestMsgPublishTimeInBacklog``: the publish time (Unix ms) of the entry after the
    mark-delete, -1 without a backlog, 0 when not ``asked`` or when that entry cannot be read."""
    if not asked:
        return 0
    if backlog <= 0:
        return -1
    with contextlib.suppress(ManagedLedgerError, wire.EntryFormatError):
        return wire.entry_publish_time(await topic.ml.read_entry(topic.ml.next_position(mark_delete)))
    return 0


def _ranges_text(ranges: list[tuple[Position, Position]]) -> str:
    """Pulsar's ``individuallyDeletedMessages``: open-closed ranges ``[(l:e..l:e],…]``."""
    return "[" + ",".join(f"({s.previous()}..{e}]" for s, e in ranges) + "]"


def _info_ranges(ci: CursorInfo) -> list[tuple[Position, Position]]:
    return [(Position(a, b), Position(c, d)) for a, b, c, d in ci.individually_deleted]


def _message_id(pos: Position, partition: int, batch_index: int = -1) -> dict[str, int]:
    out = {"ledgerId": pos.ledger_id, "entryId": pos.entry_id, "partitionIndex": partition}
    if batch_index >= 0:
        out["batchIndex"] = batch_index
    return out


#: What an HTTP header name may hold (RFC 9110's token characters)
_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
#: The control characters no header value may hold (RFC 9110 allows tab alone; aiohttp refuses to write the
#: others), each written as a space
_CONTROLS = str.maketrans(dict.fromkeys([*range(0x09), *range(0x0A, 0x20), 0x7F], " "))


def _header_name(name: str) -> str:
    if all(ch in _TCHAR for ch in name):
        return name
    return "".join(ch if ch in _TCHAR else urllib.parse.quote(ch, safe="") for ch in name)


def sanitised_headers(headers: CIMultiDict[str]) -> CIMultiDict[str]:
    """``headers`` that any HTTP client parses: a control character in a value but tab (CR and LF, as Pulsar's
    HTTP server, Jetty, writes them, and NUL, ESC, DEL, ...) written as a space, and a name's characters that
    no header name may hold (a property key with a space, a colon, a line break or a letter outside ASCII)
    percent-encoded as UTF-8. Before, a control character made aiohttp refuse the header (a 500), and a space
    in a name ended the headers for the client parsing them."""
    return CIMultiDict((_header_name(k), v.translate(_CONTROLS)) for k, v in headers.items())


def _batch_index(request: web.Request) -> int | None:
    """The ``batchIndex`` query parameter of examinemessage and a message by id (ValueError when not an
    integer); ``None`` when not given: the entry whole, a batch's frame, as Pulsar answers both."""
    raw = request.query.get("batchIndex")
    return None if raw is None else int(raw)


def _more_message_headers(md: pb.MessageMetadata, single: pb.SingleMessageMetadata | None) -> dict[str, str]:
    """The rest of the ``X-Pulsar-*`` headers Pulsar's admin answers a message with and its admin client reads
    back into the message's metadata (event time, ordering key, schema version, null value and key, ...); those
    of a batch's message from its own metadata where it has them."""
    meta: pb.MessageMetadata | pb.SingleMessageMetadata = single if single is not None else md
    out: dict[str, str] = {}
    if meta.event_time:
        out["X-Pulsar-event-time"] = pulsar_date(meta.event_time)
    if meta.HasField("ordering_key"):
        out["X-Pulsar-Base64-ordering-key"] = base64.b64encode(meta.ordering_key).decode()
    if meta.partition_key_b64_encoded:
        out["X-Pulsar-partition-key-b64-encoded"] = "true"
    if meta.null_value:
        out["X-Pulsar-null-value"] = "true"
    if meta.null_partition_key:
        out["X-Pulsar-null-partition-key"] = "true"
    if md.HasField("schema_version"):
        out["X-Pulsar-Base64-schema-version"] = base64.b64encode(md.schema_version).decode()
    if md.HasField("replicated_from"):
        out["X-Pulsar-replicated-from"] = md.replicated_from
    if md.HasField("uuid"):
        out["X-Pulsar-uuid"] = md.uuid
    if md.HasField("num_chunks_from_msg"):
        out["X-Pulsar-num-chunks-from-msg"] = str(md.num_chunks_from_msg)
        out["X-Pulsar-total-chunk-msg-size"] = str(md.total_chunk_msg_size)
        out["X-Pulsar-chunk-id"] = str(md.chunk_id)
    return out


async def _first_published_at_or_after(ml: ManagedLedger, ts: int) -> Position | None:
    """The first entry whose publish time is ``ts`` (ms) or later, None when none is."""

    def at_or_after(data: bytes) -> bool:
        try:
            return wire.entry_publish_time(data) >= ts
        except wire.EntryFormatError:
            return False

    return await ml.find_first(at_or_after)


def _ml_state(ml: ManagedLedger) -> str:
    """The ``state`` of internalStats, in Pulsar's words."""
    if ml.fenced:
        return "Fenced"
    if ml.closed:
        return "Closed"
    return "LedgerOpened" if ml.terminated_position is None else "Terminated"


def _policies_json(p: NamespacePolicies) -> dict[str, Any]:
    """Pulsar's ``Policies`` shape (the fields we keep)."""
    return {
        "retention_policies": _retention_json(p),
        "deduplicationEnabled": p.deduplication_enabled,
        "backlog_quota_map": _quota_map(p.backlog_quota, p.message_age_quota),
        "auth_policies": {
            "namespace_auth": {role: sorted(a) for role, a in sorted(p.permissions.items())},
            "destination_auth": {
                topic: {role: sorted(a) for role, a in sorted(grants.items())}
                for topic, grants in sorted(p.topic_permissions.items())
            },
            "subscription_auth_roles": {},
        },
        "replication_clusters": [CLUSTER_NAME],
        "bundles": {"boundaries": ["0x00000000", "0xffffffff"], "numBundles": 1},
        "schema_compatibility_strategy": p.schema_compatibility_strategy,
        "compaction_threshold": p.compaction_threshold,
        "message_ttl_in_seconds": p.message_ttl_in_seconds,
        **{policy: getattr(p, policy) for policy in _NAMESPACE_LIMITS.values()},
        "subscription_expiration_time_minutes": p.subscription_expiration_time_minutes,
        "autoTopicCreationOverride": _auto_topic_creation_json(p.auto_topic_creation),
        "deleted": p.deleted,
    }


def _auto_topic_creation_json(auto: AutoTopicCreation | None) -> dict[str, Any] | None:
    """Pulsar's ``AutoTopicCreationOverride``; None when not set."""
    if auto is None:
        return None
    return {
        "allowAutoTopicCreation": auto.allow,
        "topicType": auto.topic_type,
        "defaultNumPartitions": auto.default_num_partitions,
    }


def _auto_topic_creation_from(body: Any) -> AutoTopicCreation:
    """An ``autoTopicCreation`` body, checked as Pulsar's ``AutoTopicCreationOverrideImpl.validateOverride``
    (412 with its words)."""
    if not isinstance(body, dict) or not isinstance(body.get("allowAutoTopicCreation"), bool):
        raise AdminError(
            400, f'expected {{"allowAutoTopicCreation": true|false, "topicType", …}}, got {body!r}'
        )
    allow, kind, n = body["allowAutoTopicCreation"], body.get("topicType"), body.get("defaultNumPartitions")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n > INT32_MAX):
        raise AdminError(400, f"expected defaultNumPartitions as a JSON integer, got {n!r}")
    why = None
    if allow and kind not in ("partitioned", "non-partitioned"):
        why = f"Unknown topic type [{kind}]"
    elif allow and kind == "partitioned" and n is None:
        why = "[defaultNumPartitions] cannot be null when the type is partitioned."
    elif allow and kind == "partitioned" and n is not None and n <= 0:
        why = "[defaultNumPartitions] cannot be less than 1 for partition type."
    elif allow and kind == "non-partitioned" and n is not None:
        why = "[defaultNumPartitions] is not allowed to be set when the type is non-partition."
    if why is not None:
        raise AdminError(412, f"Invalid configuration for autoTopicCreationOverride. the detail is {why}")
    return AutoTopicCreation(
        allow=allow,
        topic_type=kind if isinstance(kind, str) else None,
        default_num_partitions=n if kind == "partitioned" else None,
    )


def _threshold_from(body: Any) -> int:
    """A ``compactionThreshold`` body: bytes, a JSON integer of 0 (off) or more."""
    if isinstance(body, bool) or not isinstance(body, int):
        raise AdminError(400, f"expected the compaction threshold in bytes as a JSON integer, got {body!r}")
    if not 0 <= body <= INT64_MAX:  # Pulsar's Long
        raise AdminError(
            412, f"compactionThreshold must be 0 (off) or more bytes, at most {INT64_MAX}, got {body}"
        )
    return body


def _ttl_from(body: Any) -> int:
    """A ``messageTTL`` value: seconds, an integer of 0 (none) up to Pulsar's Integer."""
    if isinstance(body, bool) or not isinstance(body, int):
        raise AdminError(400, f"expected the message TTL in seconds as a JSON integer, got {body!r}")
    if not 0 <= body <= INT32_MAX:  # Pulsar's Integer
        raise AdminError(412, f"Invalid value for message TTL: {body} (0 to {INT32_MAX} seconds)")
    return body


def _expiration_from(body: Any) -> int:
    """A ``subscriptionExpirationTime`` body: minutes, an integer of 0 (never) up to Pulsar's Integer."""
    if isinstance(body, bool) or not isinstance(body, int):
        raise AdminError(
            400, f"expected the subscription expiration time in minutes as a JSON integer, got {body!r}"
        )
    if not 0 <= body <= INT32_MAX:
        raise AdminError(412, "Invalid value for subscription expiration time")
    return body


def _limit_from(body: Any, what: str) -> int:
    """A limit's body (``maxProducers``, ``maxConsumersPerTopic``, …): a JSON integer of 0 (no limit) up to
    Pulsar's Integer."""
    if isinstance(body, bool) or not isinstance(body, int):
        raise AdminError(400, f"expected {what} as a JSON integer, got {body!r}")
    if not 0 <= body <= INT32_MAX:
        raise AdminError(412, f"{what} must be 0 (no limit) or more, at most {INT32_MAX}, got {body}")
    return body


def _message_id_from(body: Any, missing: int = -1, expected: str = "a MessageId") -> Position:
    """The position of a MessageId body (Pulsar's ``{"ledgerId", "entryId", …}``: ResetCursorData, MessageIdImpl;
    its other fields ignored), ``missing`` for a field left out; 400 for a body that is not an object (saying
    ``expected``) or a field that is not a Java long."""
    if not isinstance(body, dict):
        raise AdminError(400, f'expected {expected}, e.g. {{"ledgerId": 12, "entryId": 3}}')
    return Position(_int_field(body, "ledgerId", missing), _int_field(body, "entryId", missing))


def _actions_from(body: Any) -> tuple[str, ...]:
    """A grant's body: a JSON list of actions (``produce``, ``consume``)."""
    if not isinstance(body, list) or not all(isinstance(a, str) for a in body):
        raise AdminError(400, 'expected a list of actions, e.g. ["produce", "consume"]')
    unknown = sorted(set(body) - set(_ACTIONS))
    if unknown:
        raise AdminError(400, f"unknown actions {unknown}: the actions are {', '.join(_ACTIONS)}")
    return tuple(a for a in _ACTIONS if a in body)


def _retention_from(body: Any) -> tuple[int, int]:
    """A ``RetentionPolicies`` body: (minutes, MB), each -1 (infinite), 0 or more."""
    if not isinstance(body, dict):
        raise AdminError(400, 'expected {"retentionTimeInMinutes": M, "retentionSizeInMB": S}')
    minutes = _int_field(body, "retentionTimeInMinutes", 0, bits=32)
    size = _int_field(body, "retentionSizeInMB", 0)
    if minutes < -1 or size < -1:
        raise AdminError(412, "retention values are -1 (infinite), 0 or positive")
    return minutes, size


def _quota_type(request: web.Request) -> str:
    """``?backlogQuotaType``: ``destination_storage`` (the default, as Pulsar's) or ``message_age``; the field of
    the namespace's and of the topic's policies that holds a quota of that type."""
    qtype = request.query.get("backlogQuotaType", "destination_storage")
    if qtype not in _QUOTA_FIELDS:
        raise AdminError(412, f"backlog quota type {qtype!r} is not one of {', '.join(_QUOTA_FIELDS)}")
    return _QUOTA_FIELDS[qtype]


def _quota_from(request: web.Request, body: Any) -> tuple[str, BacklogQuota]:
    """A ``BacklogQuota`` body of ``?backlogQuotaType=``: the policies' field (:func:`_quota_type`) and the quota.
    A ``message_age`` quota's ``limitTime`` is the seconds the oldest unacknowledged message may wait (0 or
    less: no limit, as Pulsar's)."""
    field = _quota_type(request)
    if not isinstance(body, dict):
        raise AdminError(400, 'expected {"limitSize": bytes, "limitTime": seconds, "policy": …}')
    limit_size = _int_field(body, "limitSize", _int_field(body, "limit", -1))
    limit_time = _int_field(body, "limitTime", -1, bits=32)
    if field == "message_age_quota" and ("limitTime" not in body or limit_time < -1):
        raise AdminError(412, 'a message_age backlog quota needs "limitTime": seconds, -1 (none) or more')
    policy = body.get("policy", "producer_request_hold")
    if policy not in _QUOTA_POLICIES:
        raise AdminError(400, f"policy must be one of {', '.join(_QUOTA_POLICIES)}")
    return field, BacklogQuota(limit_size=limit_size, limit_time=limit_time, policy=policy)


def _with_quota(p: NamespacePolicies, field: str, quota: BacklogQuota | None) -> NamespacePolicies:
    """The namespace's policies with one type's quota set (None: removed), the other's kept."""
    if field == "backlog_quota":
        return dataclasses.replace(p, backlog_quota=quota or BacklogQuota())
    return dataclasses.replace(p, message_age_quota=quota)


def _quota_map(size: BacklogQuota | None, age: BacklogQuota | None) -> dict[str, Any]:
    """Pulsar's ``backlogQuotaMap``: each type's quota that is set."""
    out = {} if size is None else {"destination_storage": _quota_json(size)}
    if age is not None:
        out["message_age"] = _quota_json(age)
    return out


def _retention_json(p: NamespacePolicies | TopicPolicies) -> dict[str, int] | None:
    if isinstance(p, TopicPolicies):
        if p.retention is None:
            return None
        minutes, size = p.retention
    else:
        minutes, size = p.retention_time_minutes, p.retention_size_mb
    return {"retentionTimeInMinutes": minutes, "retentionSizeInMB": size}


def _quota_json(q: BacklogQuota) -> dict[str, Any]:
    return {"limitSize": q.limit_size, "limitTime": q.limit_time, "policy": q.policy}


#: Pulsar's ``SchemaType`` names of the protocol's schema types (the admin REST speaks these).
_SCHEMA_TYPES: dict[int, str] = {
    number: {
        "None": "BYTES",
        "Bool": "BOOLEAN",
        "KeyValue": "KEY_VALUE",
        "LocalDate": "LOCAL_DATE",
        "LocalTime": "LOCAL_TIME",
        "LocalDateTime": "LOCAL_DATE_TIME",
        "ProtobufNative": "PROTOBUF_NATIVE",
        "AutoConsume": "AUTO_CONSUME",
    }.get(name, name.upper())
    for name, number in pb.Schema.Type.items()
}


def _schema_type_number(name: Any) -> int:
    for number, n in _SCHEMA_TYPES.items():
        if isinstance(name, str) and n == name.upper():
            return number
    raise AdminError(400, f"unknown schema type {name!r}: one of {', '.join(sorted(_SCHEMA_TYPES.values()))}")


def _schema_json(version: int, info: SchemaInfo) -> dict[str, Any]:
    """Pulsar's ``GetSchemaResponse``: the definition as text (a KEY_VALUE's as Pulsar's admin shows it, JSON
    of its key's and value's definitions), the time the version was stored."""
    data = info.data.decode("utf-8", errors="replace")
    if info.type == pb.Schema.KeyValue:
        with contextlib.suppress(schema_compat.SchemaDefinitionError):  # not a KEY_VALUE's data: as it is
            data = schema_compat.key_value_json(info.data, info.properties)
    return {
        "version": version,
        "type": _SCHEMA_TYPES.get(info.type, str(info.type)),
        "timestamp": info.timestamp_ms,
        "data": data,
        "properties": dict(info.properties),
    }


#: The actions a namespace permission can grant (Pulsar's AuthAction names we enforce).
_ACTIONS = ("produce", "consume")
_QUOTA_POLICIES = ("producer_request_hold", "producer_exception", "consumer_backlog_eviction")
#: Pulsar's ``BacklogQuotaType`` names -> the field of the namespace's and topic's policies holding one
_QUOTA_FIELDS = {"destination_storage": "backlog_quota", "message_age": "message_age_quota"}
#: a namespace's limits: the route's name -> the policy (Pulsar's names of both)
_NAMESPACE_LIMITS = {
    "maxProducersPerTopic": "max_producers_per_topic",
    "maxConsumersPerTopic": "max_consumers_per_topic",
    "maxUnackedMessagesPerConsumer": "max_unacked_messages_per_consumer",
    "maxUnackedMessagesPerSubscription": "max_unacked_messages_per_subscription",
    "maxConsumersPerSubscription": "max_consumers_per_subscription",
    "maxSubscriptionsPerTopic": "max_subscriptions_per_topic",
    "maxTopicsPerNamespace": "max_topics_per_namespace",
}
#: a topic's limits: the route's name -> its own policy, its namespace's, the broker's default (0: none)
_TOPIC_LIMITS = {
    "maxProducers": ("max_producers", "max_producers_per_topic", 0),
    "maxConsumers": ("max_consumers", "max_consumers_per_topic", 0),
    "maxUnackedMessagesOnConsumer": (
        "max_unacked_messages_on_consumer",
        "max_unacked_messages_per_consumer",
        DEFAULT_UNACKED_MESSAGES_MAX,
    ),
    "maxUnackedMessagesOnSubscription": (
        "max_unacked_messages_on_subscription",
        "max_unacked_messages_per_subscription",
        DEFAULT_UNACKED_SUBSCRIPTION_MAX,
    ),
    "maxConsumersPerSubscription": ("max_consumers_per_subscription", "max_consumers_per_subscription", 0),
    "maxSubscriptionsPerTopic": ("max_subscriptions_per_topic", "max_subscriptions_per_topic", 0),
}


#: Connections the calls on a partitioned topic's partitions (``_each_partition``) open to one broker at most, the
#: others waiting their turn: well under the admin port's cap from one address (64, bookie/server_gate.py), which
#: refused this broker's own calls beyond it (a topic of 100 partitions: 500 "Connection reset by peer").
FAN_OUT_CONNECTIONS = 16
#: Redirects a call sent on to a topic's owner follows (aiohttp's default) before it is given up (503)
FORWARD_REDIRECTS_MAX = 10
#: The bound on one admin call this broker sends on (to a topic's owner, to a partition) through its shared
#: session, from connecting to the answer's last byte (a forced tenant delete's namespace calls: on connecting).
ADMIN_CALL_TIMEOUT_S = 60.0
#: The bound on a forced tenant delete's call deleting one of its namespaces (that namespace's topics deleted one
#: after another, through their owners): none, as a namespace of a few hundred topics takes minutes; only its
#: connecting is bounded (ADMIN_CALL_TIMEOUT_S). Under the shared session's bound such a tenant delete was
#: answered 500 "internal error: " after 60 s while the namespace's delete went on.
NAMESPACE_DELETE_TIMEOUT_S: float | None = None

#: A request body must arrive whole within this long (as a connection may idle): a client that announces a body
#: and sends it slowly, or never, is answered 408 rather than holding its connection and handler for ever.
BODY_TIMEOUT_S = HTTP_IDLE_TIMEOUT_S
#: The charsets a body may be in (canonical codec names): Unicode's and the common single-byte ones, each decoded in
#: linear time. Python knows others that are no text encoding of the wire: 'punycode' decodes in quadratic time
#: (300 kB of body, 30 s of the event loop: every client of the broker waited) and 'undefined' always fails
BODY_CHARSETS = frozenset(
    {
        "utf-8",
        "utf-16",
        "utf-16-le",
        "utf-16-be",
        "utf-32",
        "utf-32-le",
        "utf-32-be",
        "ascii",
        "iso8859-1",
        "cp1252",
    }
)


async def _body_json(request: web.Request) -> Any:
    """The request's JSON body (None when empty); 400 for a body that is not text in its charset or not JSON
    (nested deeper than the parser goes, a number of more digits than Python converts, as Jackson refuses
    both), 408 for one that does not arrive."""
    try:
        raw = await asyncio.wait_for(request.read(), BODY_TIMEOUT_S)
    except TimeoutError:
        raise AdminError(408, f"the request body did not arrive within {BODY_TIMEOUT_S:g} s") from None
    except ConnectionResetError:  # the client went away first: nobody to answer, nothing to log but a line
        log.info("admin %s %s: the client left before its body arrived", request.method, request.path)
        raise AdminError(400, "the connection was lost before the body arrived") from None
    except web.RequestPayloadError as e:  # not as its Content-Encoding or chunks say
        raise AdminError(400, f"the body does not decode: {' '.join(str(e).split())}") from None
    charset = request.charset or "utf-8"
    try:
        codec = codecs.lookup(charset).name
    except LookupError:
        raise AdminError(400, f"unknown charset {charset!r} in the Content-Type") from None
    if codec not in BODY_CHARSETS:
        why = f"unsupported charset {charset!r} in the Content-Type: UTF-8, UTF-16, UTF-32, ISO-8859-1 or windows-1252"
        raise AdminError(400, why)
    try:
        text = raw.decode(codec)
    except UnicodeError as e:
        raise AdminError(400, f"the body is not {charset} text: {e}") from None
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except RecursionError:
        raise AdminError(400, "the body is not JSON: nested too deep") from None
    except json.JSONDecodeError as e:
        raise AdminError(400, f"the body is not JSON: {e}") from None
    except ValueError:  # an integer of more digits than int() converts
        raise AdminError(400, "the body is not JSON: a number of over 4300 digits") from None


def _utf8(text: str, what: str) -> bytes:
    """``text`` of a JSON body as UTF-8; 400 for one holding a lone surrogate (JSON's ``"\\ud800"``), which no
    UTF-8 encodes."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise AdminError(400, f"{what} is not Unicode text: it holds a lone surrogate") from None


async def _checked_movable(sub: str) -> None:
    sub_ops.check_movable(sub)


def _int_field(d: Mapping[str, Any], key: str, default: int, *, bits: int = 64) -> int:
    """``d[key]`` (``default`` when absent): a JSON integer that fits Pulsar's field, a Java long (an int with
    ``bits=32``); 400 otherwise, as Jackson answers a number out of its field's range."""
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise AdminError(400, f"{key} must be an integer, got {v!r}")
    if not -(2 ** (bits - 1)) <= v < 2 ** (bits - 1):
        raise AdminError(400, f"{key} is out of range of a {bits}-bit integer")
    return v


# ------------------------------------------------------------------------------------------------------------
# the app


class AdminApp:
    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self.metrics: BrokerMetrics = service.metrics
        # this broker's own registry (tests run several brokers in one process)
        self.exported = ServerMetrics()
        self.exported.add_collector(self.collect_metrics)
        self._http: aiohttp.ClientSession | None = None
        #: the deleting/<what> znodes of the deletes running on this broker (:meth:`_deleting`)
        self._deletes_here: set[str] = set()
        #: the tries to remove a delete's znode whose removal failed (:meth:`_free_later`), by path
        self._freeing: dict[str, asyncio.Task[None]] = {}

    # -- plumbing ---------------------------------------------------------------------------------------------

    @property
    def meta(self) -> Any:
        meta = self.service.meta
        if meta is None:
            raise AdminError(503, "the broker is starting")
        return meta

    @property
    def store(self) -> zk.MetadataStore:
        return self.meta.store  # type: ignore[no-any-return]

    def http(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=ADMIN_CALL_TIMEOUT_S),
                connector=aiohttp.TCPConnector(limit_per_host=FAN_OUT_CONNECTIONS),
            )
        return self._http

    async def close(self) -> None:
        for task in list(self._freeing.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._http is not None:
            await self._http.close()

    def _topic_name(self, request: web.Request) -> TopicName:
        mi = request.match_info
        return TopicName.parse(f"persistent://{mi['tenant']}/{mi['namespace']}/{mi['topic']}")

    async def check_namespace(self, request: web.Request) -> None:
        """A call on one topic (a route naming ``{topic}``: the topic's calls, its schemas, the HTTP lookup)
        is refused with Pulsar's 404 "Namespace not found" when the topic's tenant or namespace does not exist,
        before anything is read or written for the topic; a bad name is 412 first. The HTTP lookup of a role whose
        permissions are checked (``--auth-required``) is let through: it is refused as anywhere the role has no
        grant (403), not told which namespaces exist."""
        if "topic" not in request.match_info or request.match_info.get("domain", PERSISTENT) != PERSISTENT:
            return  # a non-persistent:// name is refused whatever its namespace (``lookup``)
        name = self._topic_name(request)
        meta = self.meta  # 503 while the broker starts
        if self.service.serves(name):
            return
        policies = await meta.get_policies(name.tenant, name.namespace)
        if policies is None:
            role = request.get(PRINCIPAL)
            if request.path.startswith("/lookup/") and self.service.checks_permissions(role):
                return  # authorized first, as by Pulsar's lookup and the binary one: ``lookup`` answers 403
            raise AdminError(404, NAMESPACE_NOT_FOUND)
        request[NAMESPACE_POLICIES] = policies  # for the call's own use (an open, a permission): one read

    async def _redirect_if_not_owner(self, request: web.Request, name: TopicName) -> None:
        owner = await self.meta.get_owner(name.ml_name)
        if owner is not None and owner.broker_id != self.service.config.id:
            if not owner.web_service_url:
                raise AdminError(503, f"{name} is served by {owner.broker_id}, which has no web service URL")
            raise web.HTTPTemporaryRedirect(_owner_url(request, owner) + request.raw_path)

    async def _exists(self, name: TopicName) -> bool:
        return await self.store.aexists(layout.ml_info_path(name.ml_name))

    async def _partitions(self, name: TopicName) -> int:
        if name.is_partition:
            return 0
        meta = await self.meta.get_partitions(name.ml_name)
        return meta.partitions if meta else 0

    async def _owned_topic(self, request: web.Request, name: TopicName, *, must_exist: bool = True) -> Topic:
        """The topic opened on this broker (redirecting to its owner, taking it when nobody owns it)."""
        from .service import NotOwnerError

        served = self._served(name)
        if served is not None:
            return served
        await self._redirect_if_not_owner(request, name)
        if must_exist and not await self._exists(name):
            if await self._partitions(name):
                raise AdminError(
                    404, f"{name} is a partitioned topic: use its partitions or the partitioned-* calls"
                )
            raise AdminError(404, f"Topic {name} not found")
        try:
            return await self.service.get_topic(name, request.get(NAMESPACE_POLICIES))
        except NotOwnerError as e:  # lost a race for ownership
            raise web.HTTPTemporaryRedirect(_owner_url(request, e.owner) + request.raw_path) from e

    def _served(self, name: TopicName) -> Topic | None:
        fut = self.service.topics.get(str(name))
        if fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
            topic = fut.result()
            if not topic.unloaded:
                return topic
        return None

    def _served_topics(self) -> list[Topic]:
        out = []
        for key in list(self.service.topics):
            t = self._served(TopicName.parse(key))
            if t is not None:
                out.append(t)
        return out

    def _topic_url(self, name: TopicName, suffix: str) -> str:
        """The admin URL of a call on ``name`` (``suffix``: the path after the topic's) on this broker's HTTP port."""
        return (
            f"{self.service.config.web_service_url.rstrip('/')}/admin/v2/persistent/"
            f"{quote(name.tenant, safe='')}/{quote(name.namespace, safe='')}/{quote(name.local, safe='')}{suffix}"
        )

    def _forwarded_auth(self, request: web.Request | None) -> str | None:
        """The ``Authorization`` a call made on behalf of ``request`` carries: the request's own, or for one
        authenticated by a client certificate alone a token of its role minted for a minute (a certificate is
        not sent on; the brokers share the token secret)."""
        if request is None:
            return None
        header = request.headers.get("Authorization")
        role = request.get(PRINCIPAL)
        secret = self.service.config.auth_secret
        if header is None and role is not None and secret is not None:
            return f"Bearer {create_token(secret, role, expires_in_s=60)}"
        return header

    async def _send(
        self,
        method: str,
        url: str,
        auth_header: str | None,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> tuple[int, Any]:
        """One admin call (following redirects to the topic's owner): its status and parsed body. The redirects
        are followed here, the ``Authorization`` kept: aiohttp drops it on a redirect to another origin, and an
        owner is another broker's port, so a call on a topic another broker served was refused 401 there.
        ``timeout``: its bounds, if not the shared session's (:data:`ADMIN_CALL_TIMEOUT_S`)."""
        kw: dict[str, Any] = {"params": dict(params or {}), "allow_redirects": False}
        if timeout is not None:
            kw["timeout"] = timeout
        if auth_header:
            kw["headers"] = {"Authorization": auth_header}
        if body is not None:
            kw["json"] = body
        for _ in range(FORWARD_REDIRECTS_MAX + 1):
            async with self.http().request(method, url, **kw) as r:
                location = r.headers.get("Location")
                # (_redirect_if_not_owner's, to the owner's admin URL)
                if r.status in (307, 308) and location:
                    url = str(r.url.join(URL(location)))
                    kw["params"] = {}  # (the location has the query)
                    continue
                text = await r.text()
                try:
                    data = json.loads(text) if text else None
                except json.JSONDecodeError:
                    data = text
                return r.status, data
        raise AdminError(
            503, f"{url}: still redirected after {FORWARD_REDIRECTS_MAX} redirects (its owner moving)"
        )

    async def _each_partition(
        self,
        name: TopicName,
        method: str,
        suffix: str,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        request: web.Request | None = None,
        indexes: range | None = None,
    ) -> list[tuple[int, int, Any]]:
        """Send the call to every partition, or to those of ``indexes`` (through this broker's HTTP port,
        following redirects to each partition's owner); (index, status, parsed body) per partition."""
        n = await self._partitions(name)
        if n == 0:
            raise AdminError(404, f"Partitioned topic {name} does not exist")
        auth_header = self._forwarded_auth(request)

        async def one(i: int) -> tuple[int, int, Any]:
            url = self._topic_url(name.partition(i), suffix)
            return i, *await self._send(method, url, auth_header, body, params)

        return list(await asyncio.gather(*(one(i) for i in (range(n) if indexes is None else indexes))))

    @staticmethod
    def _check_partition_results(results: list[tuple[int, int, Any]], ok_404: bool = False) -> None:
        for i, status, data in results:
            if status >= 300 and not (ok_404 and status == 404):
                reason = data.get("reason") if isinstance(data, dict) else data
                raise AdminError(status, f"partition {i}: {reason}")

    # -- clusters, tenants, brokers -----------------------------------------------------------------------------

    async def clusters(self, request: web.Request) -> web.Response:
        return _json([CLUSTER_NAME])

    async def cluster(self, request: web.Request) -> web.Response:
        if request.match_info["cluster"] != CLUSTER_NAME:
            raise AdminError(404, "Cluster does not exist")
        cfg = self.service.config
        web_tls, broker_tls = cfg.web_service_url_tls, cfg.service_url_tls
        # where this broker serves none, another registered broker's: the cluster's data is one per cluster
        if not (web_tls and broker_tls):
            for _, b in sorted((await self.meta.list_brokers()).items()):
                web_tls, broker_tls = web_tls or b.web_service_url_tls, broker_tls or b.service_url_tls
        return _json(
            {
                "serviceUrl": cfg.web_service_url,
                "serviceUrlTls": web_tls,
                "brokerServiceUrl": cfg.service_url,
                "brokerServiceUrlTls": broker_tls,
                "peerClusterNames": [],
            }
        )

    async def brokers(self, request: web.Request) -> web.Response:
        if request.match_info["cluster"] != CLUSTER_NAME:
            raise AdminError(404, "Cluster does not exist")
        brokers = await self.meta.list_brokers()
        return _json(sorted(b.web_service_url.split("://", 1)[-1] for b in brokers.values()))

    async def internal_configuration(self, request: web.Request) -> web.Response:
        """Pulsar's InternalConfigurationData: where the metadata store is (``metadataStoreUrl``, ``zk:`` and the
        broker's ``--zk``) and the ledgers' root under it (``ledgersRootPath``, ``--zk-root`` + ``/ledgers``), what
        a tool holding only the admin URL needs to read the store itself (the Spark ``topic`` source's
        ``admin.url``). A superuser's call, as Pulsar's ``validateSuperUserAccess``: with authentication on, a
        token (401 without) whose subject is in ``--superuser-roles`` when that is set (403 otherwise)."""
        if self.service.verifier is not None:
            role = request.get(PRINCIPAL)
            if role is None:
                raise AdminError(401, "authentication required: send Authorization: Bearer <token>")
            if self.service.config.superuser_roles and not self.service.is_superuser(role):
                raise AdminError(403, f"{role} is not a superuser")
        cfg = self.service.config
        store = f"zk:{cfg.zk}"
        return _json(
            {
                "metadataStoreUrl": store,
                "configurationMetadataStoreUrl": store,
                "ledgersRootPath": cfg.zk_root.rstrip("/") + "/" + layout.LEDGERS,
                "bookkeeperMetadataServiceUri": None,
                "stateStorageServiceUrl": None,
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        if self.service.meta is None or getattr(self.service, "_session_lost", False):
            return web.Response(status=503, text="not connected to ZooKeeper")
        return web.Response(text="ok")

    async def ready(self, request: web.Request) -> web.Response:
        """Pulsar's ``GET /admin/v2/brokers/ready``: 200 ``ok`` once the broker serves, 500 otherwise (as Pulsar
        answers a broker not yet started); open as ``/health`` is, for load balancers and probes."""
        if self.service.meta is None or getattr(self.service, "_session_lost", False):
            return web.Response(status=500, text="not ready: not connected to ZooKeeper")
        return web.Response(text="ok")

    async def tenants(self, request: web.Request) -> web.Response:
        try:
            names = await self.store.achildren(layout.NAMESPACES)
        except zk.MetadataNotFoundError:
            names = []
        return _json(sorted(names))

    async def _tenant_exists(self, tenant: str) -> bool:
        """Whether the tenant exists; 412 for a name no tenant may have (a percent-encoded ``/``, ``..``), as
        Pulsar refuses it, rather than the znode layer's error."""
        if not valid_segment(tenant):
            raise AdminError(412, f"Tenant name is not valid: {tenant!r}")
        return await self.store.aexists(f"{layout.NAMESPACES}/{layout.check_znode_name(tenant, 'tenant')}")

    async def tenant_get(self, request: web.Request) -> web.Response:
        if not await self._tenant_exists(request.match_info["tenant"]):
            raise AdminError(404, "Tenant does not exist")
        return _json({"adminRoles": [], "allowedClusters": [CLUSTER_NAME]})

    async def tenant_put(self, request: web.Request) -> web.Response:
        tenant = request.match_info["tenant"]
        TopicName.parse(f"{tenant}/ns/t")  # Pulsar's rule for the name
        try:
            await self.store.acreate(f"{layout.NAMESPACES}/{layout.check_znode_name(tenant, 'tenant')}", {})
        except zk.MetadataExistsError:
            raise AdminError(409, "Tenant already exists") from None
        return _no_content()

    async def tenant_delete(self, request: web.Request) -> web.Response:
        tenant = request.match_info["tenant"]
        if not await self._tenant_exists(tenant):
            raise AdminError(404, "Tenant does not exist")
        if request.query.get("force", "false").lower() == "true":
            # as Pulsar's, off by default: it deletes every topic's data under the tenant
            if not self.service.config.force_delete_tenant_allowed:
                raise AdminError(405, "Broker doesn't allow forced deletion of tenants")
            await self._delete_tenant_namespaces(request, tenant)
        if await self.meta.list_namespaces(tenant):
            raise AdminError(409, "The tenant still has namespaces")
        try:
            await self.store.adelete(f"{layout.NAMESPACES}/{tenant}", missing_ok=True)
        except zk.MetadataNotEmptyError:  # a namespace created since the check: it stays, and the tenant
            raise AdminError(409, "The tenant still has namespaces") from None
        await self._prune_empty([tenant])
        return _no_content()

    async def _delete_tenant_namespaces(self, request: web.Request, tenant: str) -> None:
        """``?force=true`` (``pulsar-admin tenants delete -f``): each of the tenant's namespaces deleted with
        ``force=true`` (its topics with it), as Pulsar's forced delete does; the first refused is answered as it
        was, naming its namespace (the namespaces deleted before it stay deleted). Each namespace's delete has
        no bound on its whole (:data:`NAMESPACE_DELETE_TIMEOUT_S`); one that fails to answer (connection refused
        or lost) is answered 500 naming its namespace."""
        base = self.service.config.web_service_url.rstrip("/")
        auth = self._forwarded_auth(request)
        timeout = aiohttp.ClientTimeout(total=NAMESPACE_DELETE_TIMEOUT_S, sock_connect=ADMIN_CALL_TIMEOUT_S)
        for ns in sorted(await self.meta.list_namespaces(tenant)):
            url = f"{base}/admin/v2/namespaces/{quote(tenant, safe='')}/{quote(ns, safe='')}"
            try:
                status, data = await self._send("DELETE", url, auth, None, {"force": "true"}, timeout)
            except (aiohttp.ClientError, TimeoutError) as e:
                what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                raise AdminError(
                    500,
                    f"namespace {tenant}/{ns}: its forced delete did not answer ({what}); it may still be under way",
                ) from e
            if status >= 300 and status != 404:  # (404: deleted meanwhile)
                reason = data.get("reason") if isinstance(data, dict) else data
                raise AdminError(status, f"namespace {tenant}/{ns}: {reason}")

    async def _prune_empty(self, parts: list[str]) -> None:
        """Remove the deleted namespace's (``[tenant, ns]``) or tenant's (``[tenant]``) directories that its
        topics left under the broker's roots (managed ledgers, partitioned topics, ownership, schemas), where
        empty: nothing is left of a deleted namespace. A directory something was written to since stays."""
        suffixes = [["persistent"], []] if len(parts) == 2 else [[]]
        for root in (layout.MANAGED_LEDGERS, layout.TOPICS, layout.OWNERSHIP, SCHEMAS, TOPIC_POLICIES):
            for suffix in suffixes:
                path = "/".join([root, *parts, *suffix])
                with contextlib.suppress(zk.MetadataNotEmptyError):
                    await self.store.adelete(path, missing_ok=True)

    # -- namespaces -------------------------------------------------------------------------------------------

    async def namespaces(self, request: web.Request) -> web.Response:
        tenant = request.match_info["tenant"]
        if not await self._tenant_exists(tenant):
            raise AdminError(404, "Tenant does not exist")
        return _json(sorted(f"{tenant}/{ns}" for ns in await self.meta.list_namespaces(tenant)))

    async def _policies(self, request: web.Request) -> tuple[str, str, NamespacePolicies]:
        tenant, ns = request.match_info["tenant"], request.match_info["namespace"]
        TopicName.parse(f"{tenant}/{ns}/t")
        p = await self.meta.get_policies(tenant, ns)
        if p is None:
            raise AdminError(404, "Namespace does not exist")
        return tenant, ns, p

    async def _update_policies(
        self, tenant: str, ns: str, change: Callable[[NamespacePolicies], NamespacePolicies]
    ) -> web.Response:
        """One admin's change of the namespace's policies: ``change`` made on those stored and written at their
        version, made again on a version conflict (``update_policies``), so that another admin's change of
        another field meanwhile is kept; the policies stored then applied to the topics served here. 404 for a
        namespace deleted meanwhile, 409 as Pulsar's "Concurrent modification" when conflicts never end."""
        try:
            p = await self.meta.update_policies(tenant, ns, change)
        except zk.MetadataNotFoundError:
            raise AdminError(404, "Namespace does not exist") from None
        except zk.MetadataVersionError:
            raise AdminError(409, "Concurrent modification") from None
        self._apply_policies(tenant, ns, p)
        return _no_content()

    async def namespace_get(self, request: web.Request) -> web.Response:
        _t, _n, p = await self._policies(request)
        return _json(_policies_json(p))

    async def namespace_put(self, request: web.Request) -> web.Response:
        tenant, ns = request.match_info["tenant"], request.match_info["namespace"]
        TopicName.parse(f"{tenant}/{ns}/t")
        if not await self._tenant_exists(tenant):
            raise AdminError(404, "Tenant does not exist")
        try:
            # not makepath: a tenant deleted since the check is not made again as the namespace's parent
            await self.store.acreate(
                layout.namespace_policies_path(tenant, ns), NamespacePolicies().to_json(), makepath=False
            )
        except zk.MetadataExistsError:
            raise AdminError(409, "Namespace already exists") from None
        except zk.MetadataNotFoundError:
            raise AdminError(404, "Tenant does not exist") from None
        return _no_content()

    @contextlib.asynccontextmanager
    async def _deleting(self, what: str, label: str) -> AsyncIterator[None]:
        """One delete of ``what`` at a time, cluster-wide: an ephemeral ``deleting/<what>`` znode held for the
        delete's length (gone with its broker's session if that broker dies midway). A second delete meanwhile is
        409 '… is being deleted', so that its failure cannot take back the mark of the one under way; the
        holder finds a mark left standing by a delete that died, and finishes or takes it back."""
        path = f"{DELETING}/{quote(what, safe='')}"
        try:
            await self.store.acreate(path, {"broker": self.service.config.id}, ephemeral=True)
        except zk.MetadataExistsError:
            # this broker's session's, of no delete running here: a delete whose end could not remove it
            # (ZooKeeper failing then, the session kept), which refused every later delete while the broker ran
            # (looked at again after the read: a delete may have begun here during it)
            left = path not in self._deletes_here and await self.store.aowns_ephemeral(path)
            if not left or path in self._deletes_here:
                raise AdminError(409, f"{label} is being deleted; try again") from None
        self._deletes_here.add(path)
        try:
            yield
        finally:
            # listed until the znode is gone: a delete here meanwhile, finding it still this session's, took it
            # over as a leftover, and this removal then left that delete running with no znode held
            # only this session's: with the session lost midway (its ephemeral znode gone with it), another
            # broker's delete may hold the path now, and an unconditional delete removed its znode
            # A failure here (ZooKeeper failing) does not replace the delete's answer: the delete was done (or
            # refused, 409) and a 5xx made the client's retry meet 404; the znode left, this session's, is removed
            # in the background once ZooKeeper answers (a delete sent to another broker was 409 '… is being
            # deleted' for as long as this broker ran), taken over by a delete here meanwhile, or goes with the
            # session.
            failed = False
            try:
                await self.store.adelete_own_ephemeral(path)
            except zk.MetadataError as e:
                failed = True
                log.warning(
                    "broker=%s %s: its delete's znode %s not removed (%s); tried again in the background",
                    self.service.config.id,
                    label,
                    path,
                    e,
                )
            finally:
                self._deletes_here.discard(path)
            if failed:
                self._free_later(path, label)

    def _free_later(self, path: str, label: str) -> None:
        """Try again, until ZooKeeper answers, to remove the znode at ``path`` a delete here could not remove. A
        delete of it that starts here meanwhile takes it over (the tries stop); while a try runs, the path is
        listed as a delete here, so such a delete is 409 '… is being deleted' rather than left with no znode."""
        if path in self._freeing:
            return

        async def tries() -> None:
            try:
                for wait in backoff(*DELETING_RETRY_S):
                    await asyncio.sleep(wait)
                    if path in self._deletes_here:
                        return  # a delete here took it over: its end removes it
                    self._deletes_here.add(path)
                    try:
                        await self.store.adelete_own_ephemeral(path)
                        log.info(
                            "broker=%s %s: its delete's znode %s removed", self.service.config.id, label, path
                        )
                        return
                    except zk.MetadataError:
                        pass  # ZooKeeper still away: the next, longer wait
                    finally:
                        self._deletes_here.discard(path)
            finally:
                self._freeing.pop(path, None)

        self._freeing[path] = asyncio.get_running_loop().create_task(tries())

    async def namespace_delete(self, request: web.Request) -> web.Response:
        """As Pulsar's: the namespace marked ``deleted`` first, so that no topic is created in it any more (a
        topic's znode is created only while its namespace is not so marked, in one transaction with that check),
        then its topics looked for: none, it is deleted; some (created before the mark), 409 and the mark
        taken back. A topic created meanwhile was left behind (its managed ledger, its ledgers, its ownership)
        in a namespace that no longer existed. A namespace with topics is answered 409 before it is marked, and
        a topic that exists opens (and is looked up) while the mark stands: only creations are refused."""
        tenant, ns, _p = await self._policies(request)
        force = request.query.get("force", "false").lower() == "true"
        if force and not self.service.config.force_delete_namespace_allowed:  # as Pulsar's, off by default
            raise AdminError(405, "Broker doesn't allow forced deletion of namespaces")
        async with self._deleting(f"namespace/{tenant}/{ns}", f"Namespace {tenant}/{ns}"):
            if force:
                await self._delete_namespace_topics(request, tenant, ns)
            return await self._namespace_delete(tenant, ns)

    async def _delete_namespace_topics(self, request: web.Request, tenant: str, ns: str) -> None:
        """``?force=true`` (``pulsar-admin namespaces delete -f``): the namespace marked ``deleted`` (no topic is
        made in it any more: a producer's reconnection is refused), then each partitioned topic and each other
        topic deleted with ``force=true`` through its owner (their clients closed), as Pulsar's forced delete
        does. A delete refused takes the mark back and is answered as it was, naming its topic; a partitioned
        topic's refused, nothing more is deleted."""
        await self._update_policies(tenant, ns, lambda q: dataclasses.replace(q, deleted=True))
        try:
            auth, params = self._forwarded_auth(request), {"force": "true"}
            results: list[tuple[TopicName, int, Any]] = []
            for t in await self._list_partitioned(tenant, ns):
                name = TopicName.parse(t)
                status, data = await self._send(
                    "DELETE", self._topic_url(name, "/partitions"), auth, None, params
                )
                results.append((name, status, data))
            # a partitioned topic's delete refused leaves it whole: its partitions, still listed below, are not
            # deleted one by one (which kept its metadata and lost its data)
            self._check_topic_results(results)
            for t in await self._list_topics(tenant, ns):  # (after: the partitions went with their topics)
                name = TopicName.parse(t)
                status, data = await self._send("DELETE", self._topic_url(name, ""), auth, None, params)
                results.append((name, status, data))
            self._check_topic_results(results)
        except BaseException:
            with contextlib.suppress(zk.MetadataNotFoundError):
                await self.meta.update_policies(tenant, ns, lambda q: dataclasses.replace(q, deleted=False))
            raise

    async def _namespace_delete(self, tenant: str, ns: str) -> web.Response:
        p = await self.meta.get_policies(tenant, ns)
        if p is None:  # deleted meanwhile
            raise AdminError(404, "Namespace does not exist")
        # a namespace with topics is refused before it is marked: while marked, a topic's creation there is
        # refused (pulsar-client gives up on that answer), which a delete bound to answer 409 should not cause
        if await self._has_topics(tenant, ns):
            if p.deleted:  # the mark of a delete that died midway (none other runs): taken back
                with contextlib.suppress(zk.MetadataNotFoundError):
                    await self.meta.update_policies(
                        tenant, ns, lambda q: dataclasses.replace(q, deleted=False)
                    )
            raise AdminError(409, "Cannot delete non empty namespace")
        await self._update_policies(tenant, ns, lambda q: dataclasses.replace(q, deleted=True))
        try:
            busy = await self._has_topics(tenant, ns)
        except BaseException:
            busy = True
            raise
        finally:
            if busy:  # (or the look failed): the mark taken back, the namespace as it was
                with contextlib.suppress(zk.MetadataNotFoundError):  # (another delete ended meanwhile)
                    await self.meta.update_policies(
                        tenant, ns, lambda q: dataclasses.replace(q, deleted=False)
                    )
        if busy:
            raise AdminError(409, "Cannot delete non empty namespace")
        await self.store.adelete(layout.namespace_policies_path(tenant, ns), missing_ok=True)
        await self._prune_empty([tenant, ns])
        return _no_content()

    async def namespace_topics(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        return _json(await self._list_topics(tenant, ns))

    async def retention_get(self, request: web.Request) -> web.Response:
        _t, _n, p = await self._policies(request)
        return _json(_retention_json(p))

    async def retention_set(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        minutes, size = _retention_from(await _body_json(request))
        return await self._update_policies(
            tenant,
            ns,
            lambda q: dataclasses.replace(q, retention_time_minutes=minutes, retention_size_mb=size),
        )

    async def retention_delete(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        return await self._update_policies(
            tenant, ns, lambda q: dataclasses.replace(q, retention_time_minutes=0, retention_size_mb=0)
        )

    async def dedup_get(self, request: web.Request) -> web.Response:
        _t, _n, p = await self._policies(request)
        return _json(p.deduplication_enabled)

    async def dedup_set(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        body = await _body_json(request)
        if not isinstance(body, bool):
            raise AdminError(400, "expected true or false")
        return await self._update_policies(
            tenant, ns, lambda q: dataclasses.replace(q, deduplication_enabled=body)
        )

    async def dedup_delete(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        return await self._update_policies(
            tenant, ns, lambda q: dataclasses.replace(q, deduplication_enabled=None)
        )

    async def compaction_threshold_get(self, request: web.Request) -> web.Response:
        """The namespace's ``compaction_threshold`` (bytes), ``null`` when not set (the broker's default)."""
        _t, _n, p = await self._policies(request)
        return _json(p.compaction_threshold)

    async def compaction_threshold_set(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        threshold = _threshold_from(await _body_json(request))
        return await self._update_policies(
            tenant, ns, lambda q: dataclasses.replace(q, compaction_threshold=threshold)
        )

    async def compaction_threshold_delete(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        return await self._update_policies(
            tenant, ns, lambda q: dataclasses.replace(q, compaction_threshold=None)
        )

    async def message_ttl_get(self, request: web.Request) -> web.Response:
        """The namespace's ``message_ttl_in_seconds``, ``null`` when not set (no TTL)."""
        _t, _n, p = await self._policies(request)
        return _json(p.message_ttl_in_seconds)

    async def message_ttl_set(self, request: web.Request) -> web.Response:
        """Pulsar's ``set-message-ttl``: a JSON integer of seconds, 0 for none; applied by each topic owner's
        expiry check (``--message-expiry-check-interval-s``)."""
        tenant, ns, _p = await self._policies(request)
        ttl = _ttl_from(await _body_json(request))
        return await self._update_policies(
            tenant, ns, lambda q: dataclasses.replace(q, message_ttl_in_seconds=ttl)
        )

    async def message_ttl_delete(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        return await self._update_policies(
            tenant, ns, lambda q: dataclasses.replace(q, message_ttl_in_seconds=None)
        )

    async def expiration_get(self, request: web.Request) -> web.Response:
        """The namespace's ``subscription_expiration_time_minutes``, ``null`` when not set (never)."""
        _t, _n, p = await self._policies(request)
        return _json(p.subscription_expiration_time_minutes)

    async def expiration_set(self, request: web.Request) -> web.Response:
        """Pulsar's ``set-subscription-expiration-time``: a JSON integer of minutes, 0 for never; the topics'
        owners delete the subscriptions idle that long at their housekeeping (``expire_inactive_subscriptions``)."""
        tenant, ns, _p = await self._policies(request)
        minutes = _expiration_from(await _body_json(request))
        return await self._update_policies(
            tenant, ns, lambda q: dataclasses.replace(q, subscription_expiration_time_minutes=minutes)
        )

    async def expiration_delete(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        return await self._update_policies(
            tenant, ns, lambda q: dataclasses.replace(q, subscription_expiration_time_minutes=None)
        )

    async def auto_topic_creation_get(self, request: web.Request) -> web.Response:
        """The namespace's ``autoTopicCreationOverride``, ``null`` when not set (the broker's: created
        non-partitioned)."""
        _t, _n, p = await self._policies(request)
        return _json(_auto_topic_creation_json(p.auto_topic_creation))

    async def auto_topic_creation_set(self, request: web.Request) -> web.Response:
        """Pulsar's ``set-auto-topic-creation``: whether a topic a client names that does not exist is created
        in the namespace, and how (a partitioned one's count within ``--max-partitions-per-topic``: else 406)."""
        tenant, ns, _p = await self._policies(request)
        auto = _auto_topic_creation_from(await _body_json(request))
        limit = self._partition_limit(auto.default_num_partitions or 0)
        if auto.topic_type == "partitioned" and limit is not None:
            raise AdminError(406, f"Number of partitions should be less than or equal to {limit}")
        return await self._update_policies(
            tenant, ns, lambda q: dataclasses.replace(q, auto_topic_creation=auto)
        )

    async def auto_topic_creation_delete(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        return await self._update_policies(
            tenant, ns, lambda q: dataclasses.replace(q, auto_topic_creation=None)
        )

    # -- namespace-wide operations: each topic's own call, sent to its owner ----------------------------------

    async def _on_each_topic(
        self,
        request: web.Request,
        method: str,
        suffixes: Callable[[TopicName, bool], Awaitable[list[str]]],
    ) -> list[tuple[TopicName, int, Any]]:
        """Each of the namespace's topics (a partitioned topic's partitions each) sent ``method`` on each of
        ``suffixes(topic, owned)`` (its paths after the topic's; ``owned``: some broker holds the topic's
        ownership, read once for the namespace), through this broker's HTTP port as a partition's call is,
        following redirects to each topic's owner: (topic, status, parsed body) per call. A topic ``suffixes``
        gives no path is not called, so not opened anywhere. 404 for a namespace that does not exist."""
        tenant, ns, _p = await self._policies(request)
        auth = self._forwarded_auth(request)
        owned = await self._owned_in(tenant, ns)

        async def one(name: TopicName) -> list[tuple[TopicName, int, Any]]:
            out = []
            for suffix in await suffixes(name, name.local in owned):
                status, data = await self._send(method, self._topic_url(name, suffix), auth)
                out.append((name, status, data))
            return out

        topics = [TopicName.parse(t) for t in await self._list_topics(tenant, ns)]
        return [r for rs in await asyncio.gather(*(one(t) for t in topics)) for r in rs]

    async def _owned_in(self, tenant: str, ns: str) -> set[str]:
        """The local names of the namespace's topics some broker owns (one read of their ownership znodes)."""
        try:
            names = await self.store.achildren(f"{layout.OWNERSHIP}/{tenant}/{ns}/persistent")
        except zk.MetadataNotFoundError:
            return set()
        return {unquote(n) for n in names}

    async def _stored_subscription(self, name: TopicName, sub: str) -> bool:
        """The topic has a stored cursor of ``sub`` (every durable subscription has one from its creation)."""
        return sub in await self.meta.list_cursors(name.ml_name)

    async def _with_stored_backlog(self, name: TopicName, subs: list[str]) -> list[str]:
        """Of the stored subscriptions ``subs`` of a topic nobody serves, those that may have a backlog, read from
        its stored records without opening it: every one when a ledger of its managed ledger is still open (its
        owner did not close it: its end is known only by recovering it, which the topic's open does); else those
        whose stored mark-delete position is before the last entry the closed ledgers record (none when they
        record no entry). A subscription whose cursor is gone meanwhile has nothing to clear."""
        versioned = await self.meta.get_ml_info(name.ml_name)
        if versioned is None:
            return []  # (deleted meanwhile)
        ledgers = versioned.value.ledgers
        if any(li.timestamp_ms == 0 for li in ledgers):
            return subs
        last = max(((li.ledger_id, li.entries - 1) for li in ledgers if li.entries > 0), default=None)
        if last is None:
            return []
        out = []
        for sub in subs:
            cursor = await self.meta.get_cursor(name.ml_name, sub)
            if cursor is not None and tuple(cursor.value.mark_delete) < last:
                out.append(sub)
        return out

    @staticmethod
    def _check_topic_results(results: list[tuple[TopicName, int, Any]], ok: tuple[int, ...] = (404,)) -> None:
        """The first refusal (a status of 300 or more, but those of ``ok``: a topic deleted meanwhile, one
        without the subscription) answered as it was, naming its topic; 412 as Pulsar words it."""
        for name, status, data in results:
            if status >= 300 and status not in ok:
                reason = data.get("reason") if isinstance(data, dict) else data
                if status == 412 and reason == "Subscription has active connected consumers":
                    raise AdminError(412, reason)
                raise AdminError(status, f"{name}: {reason}")

    async def namespace_clear_backlog(self, request: web.Request) -> web.Response:
        """Pulsar's ``namespaces clear-backlog`` (``POST …/clearBacklog``, ``…/clearBacklog/{subscription}``):
        every subscription of every topic of the namespace (or that one, on the topics that have it) skips its
        whole backlog, as ``skip_all`` does; the compactor's is left alone. 204."""
        sub = request.match_info.get("subscription")

        async def suffixes(name: TopicName, owned: bool) -> list[str]:
            # A topic nobody serves is asked only for the subscriptions it has stored: one without any is not
            # opened for nothing (a served one's owner answers, a reader's subscription among them)
            # (and of those only the ones its stored records do not show at the end already)
            if sub is not None and owned:
                subs = [sub]
            elif owned:
                status, data = await self._send(
                    "GET", self._topic_url(name, "/subscriptions"), self._forwarded_auth(request)
                )
                subs = [s for s in data if s != COMPACTION_SUBSCRIPTION] if status == 200 else []
            else:
                stored = await self.meta.list_cursors(name.ml_name)
                if sub == COMPACTION_SUBSCRIPTION:  # named: refused (405) wherever stored, as when served
                    return [f"/subscription/{quote(sub, safe='')}/skip_all"] if sub in stored else []
                wanted = [s for s in stored if s != COMPACTION_SUBSCRIPTION] if sub is None else [sub]
                subs = await self._with_stored_backlog(name, [s for s in wanted if s in stored])
            return [f"/subscription/{quote(s, safe='')}/skip_all" for s in subs]

        # (every subscription: a reader's, which has no stored position to move, is passed over, 405)
        ok = (404,) if sub is not None else (404, 405)
        self._check_topic_results(await self._on_each_topic(request, "POST", suffixes), ok)
        return _no_content()

    async def namespace_unsubscribe(self, request: web.Request) -> web.Response:
        """Pulsar's ``namespaces unsubscribe -s SUB`` (``POST …/unsubscribe/{subscription}``): the subscription
        deleted from every topic of the namespace that has it; one with consumers connected is not (412
        "Subscription has active connected consumers", as Pulsar answers; the others are deleted). 204."""
        sub = request.match_info["subscription"]
        tail = f"/subscription/{quote(sub, safe='')}"

        async def suffixes(name: TopicName, owned: bool) -> list[str]:
            # a topic nobody serves only if it has the subscription stored: the others are not opened
            return [tail] if owned or await self._stored_subscription(name, sub) else []

        self._check_topic_results(await self._on_each_topic(request, "DELETE", suffixes))
        return _no_content()

    async def namespace_unload(self, request: web.Request) -> web.Response:
        """Pulsar's ``namespaces unload`` (``PUT …/unload``): every topic of the namespace that a broker serves is
        unloaded there (its clients reconnect and look it up again); topics nobody serves stay so. 204."""

        async def suffixes(name: TopicName, owned: bool) -> list[str]:
            return ["/unload"] if owned else []

        self._check_topic_results(await self._on_each_topic(request, "PUT", suffixes))
        return _no_content()

    async def schema_strategy_get(self, request: web.Request) -> web.Response:
        _t, _n, p = await self._policies(request)
        return _json(p.schema_compatibility_strategy)

    async def schema_strategy_set(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        body = await _body_json(request)
        try:
            strategy = schema_compat.check_strategy(body if isinstance(body, str) else "")
        except ValueError as e:
            raise AdminError(400, f"expected a strategy as a JSON string: {e}") from e
        return await self._update_policies(
            tenant, ns, lambda q: dataclasses.replace(q, schema_compatibility_strategy=strategy)
        )

    # -- /admin/v2/schemas/{tenant}/{namespace}/{topic}/… (a partitioned topic's partitions share its record)

    async def _schemas(self, request: web.Request) -> tuple[TopicName, SchemaHistory]:
        name = self._topic_name(request).base
        return name, await self.meta.get_schemas(name.ml_name)

    async def schema_get(self, request: web.Request) -> web.Response:
        _name, history = await self._schemas(request)
        if "version" in request.match_info:
            try:
                version = int(request.match_info["version"])
            except ValueError:
                raise AdminError(400, f"version {request.match_info['version']!r} is not a number") from None
        else:
            latest = history.latest()
            version = -1 if latest is None else latest[0]
        info = history.get(version)
        if info is None:  # none such, a deletion marker, or deleted since
            raise AdminError(404, "Schema not found")
        return _json(_schema_json(version, info))

    async def schemas_all(self, request: web.Request) -> web.Response:
        """The live versions (those after the latest delete), as Pulsar lists them."""
        _name, history = await self._schemas(request)
        return _json({"getSchemaResponses": [_schema_json(v, i) for v, i in history.live()]})

    async def _posted_schema(self, request: web.Request) -> tuple[TopicName, SchemaInfo]:
        """The topic and the schema in a ``PostSchemaPayload`` body."""
        body = await _body_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("schema", ""), str):
            raise AdminError(400, 'expected {"type": "AVRO", "schema": "<definition>", "properties": {}}')
        props = body.get("properties") or {}
        if not isinstance(props, dict) or not all(isinstance(v, str) for v in props.values()):
            raise AdminError(400, "properties must map names to strings")
        for text in (*props, *props.values()):
            _utf8(text, "a property")
        info = SchemaInfo(
            type=_schema_type_number(body.get("type")),
            data=_utf8(str(body.get("schema", "")), "the schema"),
            properties={str(k): v for k, v in props.items()},
            timestamp_ms=int(time.time() * 1000),
        )
        try:
            if info.type in (pb.Schema.Avro, pb.Schema.Json):
                schema_compat.parse_definition(info.data)
            elif info.type == pb.Schema.KeyValue:  # Pulsar's admin form, stored as the clients declare it
                info = dataclasses.replace(info, data=schema_compat.key_value_from_json(info.data))
        except schema_compat.SchemaDefinitionError as e:
            raise AdminError(400, f"invalid schema: {e}") from e
        return self._topic_name(request).base, info

    async def schema_post(self, request: web.Request) -> web.Response:
        name, info = await self._posted_schema(request)
        try:
            version = await self.service.add_checked_schema(name, info)
        except SchemaRefusedError as e:
            raise AdminError(409, str(e)) from e
        return _json({"version": {"version": version}})

    async def schema_compatibility(self, request: web.Request) -> web.Response:
        name, info = await self._posted_schema(request)
        strategy = await self.service.schema_strategy(name)
        refused = schema_refusal(await self.meta.get_schemas(name.ml_name), info, strategy)
        shown = schema_compat.DEFAULT_STRATEGY if strategy == "UNDEFINED" else strategy
        return _json({"isCompatibility": refused is None, "schemaCompatibilityStrategy": shown})

    async def schema_delete(self, request: web.Request) -> web.Response:
        """Pulsar's (not forced) delete: a deletion marker stored as the next version, whose number is answered;
        the versions after it go on counting (``mark_schemas_deleted``)."""
        name = self._topic_name(request).base
        return _json({"version": await self.meta.mark_schemas_deleted(name.ml_name, int(time.time() * 1000))})

    async def permissions_get(self, request: web.Request) -> web.Response:
        _t, _n, p = await self._policies(request)
        return _json({role: sorted(actions) for role, actions in sorted(p.permissions.items())})

    async def permission_grant(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        role = request.match_info["role"]
        actions = _actions_from(await _body_json(request))
        return await self._update_policies(
            tenant, ns, lambda q: dataclasses.replace(q, permissions={**q.permissions, role: actions})
        )

    async def permission_revoke(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        role = request.match_info["role"]

        def revoke(q: NamespacePolicies) -> NamespacePolicies:
            if role not in q.permissions:
                raise AdminError(404, f"{role} has no permissions on {tenant}/{ns}")
            return dataclasses.replace(q, permissions={r: a for r, a in q.permissions.items() if r != role})

        return await self._update_policies(tenant, ns, revoke)

    async def topic_permissions_get(self, request: web.Request) -> web.Response:
        """``pulsar-admin topics permissions``: what each role may do on the topic, its namespace's grants and
        the topic's own (a partition's: its partitioned topic's) together, as Pulsar's getPermissionsOnTopic."""
        name = self._topic_name(request).base
        _t, _n, p = await self._policies(request)
        merged = {role: set(actions) for role, actions in p.permissions.items()}
        for role, actions in p.topic_permissions.get(str(name), {}).items():
            merged.setdefault(role, set()).update(actions)
        return _json({role: sorted(actions) for role, actions in sorted(merged.items())})

    async def topic_permission_grant(self, request: web.Request) -> web.Response:
        """``pulsar-admin topics grant-permission``: the role's actions on this topic (on each partition of a
        partitioned one), beside what its namespace grants; replaces the role's earlier grant on the topic."""
        name = self._topic_name(request).base
        tenant, ns, _p = await self._policies(request)
        role = request.match_info["role"]
        actions = _actions_from(await _body_json(request))

        def grant(q: NamespacePolicies) -> NamespacePolicies:
            grants = {**q.topic_permissions.get(str(name), {}), role: actions}
            return dataclasses.replace(q, topic_permissions={**q.topic_permissions, str(name): grants})

        return await self._update_policies(tenant, ns, grant)

    async def topic_permission_revoke(self, request: web.Request) -> web.Response:
        """``pulsar-admin topics revoke-permission``: the role's grant on the topic removed (what its namespace
        grants stays); 412 when the topic grants the role nothing, as Pulsar answers."""
        name = self._topic_name(request).base
        tenant, ns, _p = await self._policies(request)
        role = request.match_info["role"]

        def revoke(q: NamespacePolicies) -> NamespacePolicies:
            grants = dict(q.topic_permissions.get(str(name), {}))
            if grants.pop(role, None) is None:
                raise AdminError(412, f"Permissions are not set at the topic level: {role} on {name}")
            topic_perms = {t: g for t, g in q.topic_permissions.items() if t != str(name)}
            if grants:
                topic_perms[str(name)] = grants
            return dataclasses.replace(q, topic_permissions=topic_perms)

        return await self._update_policies(tenant, ns, revoke)

    async def _revoke_topic_grants(self, name: TopicName) -> None:
        """A deleted topic's own grants go with it (as in Pulsar): a topic made again under its name starts
        with its namespace's only."""
        p = await self.meta.get_policies(name.tenant, name.namespace)
        if p is not None and str(name) in p.topic_permissions:

            def revoke(q: NamespacePolicies) -> NamespacePolicies:
                topic_perms = {t: g for t, g in q.topic_permissions.items() if t != str(name)}
                return dataclasses.replace(q, topic_permissions=topic_perms)

            with contextlib.suppress(zk.MetadataNotFoundError):  # the namespace deleted meanwhile
                await self.meta.update_policies(name.tenant, name.namespace, revoke)

    async def quota_get(self, request: web.Request) -> web.Response:
        _t, _n, p = await self._policies(request)
        quota = getattr(p, _quota_type(request))
        return _json(None if quota is None else _quota_json(quota))

    async def quota_map(self, request: web.Request) -> web.Response:
        _t, _n, p = await self._policies(request)
        return _json(_quota_map(p.backlog_quota, p.message_age_quota))

    async def quota_set(self, request: web.Request) -> web.Response:
        """One type's quota set, the other type's kept (one compare-and-set of the namespace's policies)."""
        tenant, ns, _p = await self._policies(request)
        field, quota = _quota_from(request, await _body_json(request))
        return await self._update_policies(tenant, ns, lambda q: _with_quota(q, field, quota))

    async def quota_delete(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        field = _quota_type(request)
        return await self._update_policies(tenant, ns, lambda q: _with_quota(q, field, None))

    def _apply_policies(self, tenant: str, ns: str, p: NamespacePolicies) -> None:
        """The namespace's new policies applied at once to its topics served here (with each one's own)."""
        for t in self._served_topics():
            if t.name.tenant == tenant and t.name.namespace == ns:
                self.service.apply_policies(t, p, t.own_policies)

    async def namespace_limit_get(self, request: web.Request) -> web.Response:
        """``maxProducersPerTopic``, ``maxConsumersPerTopic``, ``maxConsumersPerSubscription``, …: the
        namespace's, ``null`` when not set (the broker's default)."""
        _t, _n, p = await self._policies(request)
        return _json(getattr(p, _NAMESPACE_LIMITS[request.match_info["limit"]]))

    async def namespace_limit_set(self, request: web.Request) -> web.Response:
        limit = request.match_info["limit"]
        return await self._set_namespace_limit(request, _limit_from(await _body_json(request), limit))

    async def namespace_limit_delete(self, request: web.Request) -> web.Response:
        return await self._set_namespace_limit(request, None)

    async def _set_namespace_limit(self, request: web.Request, value: int | None) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        change: dict[str, Any] = {_NAMESPACE_LIMITS[request.match_info["limit"]]: value}
        return await self._update_policies(tenant, ns, lambda q: dataclasses.replace(q, **change))

    # -- topic lists and partitions --------------------------------------------------------------------------

    async def _has_topics(self, tenant: str, ns: str) -> bool:
        """Does the namespace hold a topic or a partitioned topic?"""
        return bool(await self._list_topics(tenant, ns) or await self._list_partitioned(tenant, ns))

    async def _list_topics(self, tenant: str, ns: str) -> list[str]:
        path = f"{layout.MANAGED_LEDGERS}/{tenant}/{ns}/persistent"
        try:
            names = await self.store.achildren(path)
        except zk.MetadataNotFoundError:
            names = []
        return sorted(f"persistent://{tenant}/{ns}/{unquote(n)}" for n in names)

    async def _list_partitioned(self, tenant: str, ns: str) -> list[str]:
        try:
            names = await self.store.achildren(f"{layout.TOPICS}/{tenant}/{ns}/persistent")
        except zk.MetadataNotFoundError:
            names = []
        return sorted(f"persistent://{tenant}/{ns}/{unquote(n)}" for n in names)

    async def topics_list(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        return _json(await self._list_topics(tenant, ns))

    async def partitioned_list(self, request: web.Request) -> web.Response:
        tenant, ns, _p = await self._policies(request)
        return _json(await self._list_partitioned(tenant, ns))

    async def partitions_get(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        if request.match_info.get("domain", PERSISTENT) != PERSISTENT:
            # pulsar-client's first call on a non-persistent topic through an http:// URL (``lookup``)
            return _json({"partitions": 0})
        n = await self._partitions(name)
        if not n and not name.is_partition and request.query.get("checkAllowAutoCreation") == "true":
            # a client's metadata request (http:// service URL), which may create the topic: authorized as the
            # binary PARTITIONED_METADATA is (a GET is otherwise a read, open to anyone)
            await self._check_lookup_allowed(request, name)
            try:
                n = await self.service.auto_partitioned(name)
            except PartitionLimitError as e:
                raise AdminError(406, str(e)) from None
        return _json({"partitions": n})

    async def _check_lookup_allowed(self, request: web.Request, name: TopicName) -> None:
        """Under ``--auth-required``: the request's role may produce or consume on ``name`` (a superuser may),
        else 401 (no role) or 403."""
        role = request.get(PRINCIPAL)
        if not self.service.checks_permissions(role):
            return
        if role is None:
            raise AdminError(401, "authentication required: send Authorization: Bearer <token>")
        if not await self.service.can(role, name, ("produce", "consume")):
            raise AdminError(403, f"{role} is not authorized to look up {name}")

    async def _partition_count_from(self, request: web.Request) -> int:
        body = await _body_json(request)
        if isinstance(body, dict):
            body = body.get("partitions")
        if isinstance(body, bool) or not isinstance(body, int) or body < 1:
            raise AdminError(412, "Number of partitions should be more than 0")
        if body > INT32_MAX:  # Pulsar's int: Jackson refuses more; the binary protocol's count is a uint32
            raise AdminError(400, f"the number of partitions is out of range of a 32-bit integer: {body}")
        return body

    def _partition_limit(self, n: int) -> int | None:
        """``--max-partitions-per-topic`` when ``n`` partitions are past it, else None (:func:`past_partition_limit`),
        checked before anything is written: each partition's managed ledger is created as the count is set."""
        limit = self.service.config.max_partitions_per_topic
        return limit if past_partition_limit(n, limit) else None

    async def partitions_create(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        n = await self._partition_count_from(request)
        if name.is_partition:
            raise AdminError(412, f"{name} is a partition; a partitioned topic needs a base name")
        limit = self._partition_limit(n)
        if limit is not None:  # Pulsar's answer
            raise AdminError(406, f"Number of partitions should be less than or equal to {limit}")
        if await self._exists(name):
            raise AdminError(409, "This topic already exists")
        try:
            await self.meta.create_partitioned_topic(name.ml_name, n)
        except zk.MetadataExistsError:
            raise AdminError(409, "Partitioned topic already exists") from None
        await self._create_partition_mls(name, 0, n)
        return _no_content()

    async def _create_partition_mls(self, name: TopicName, start: int, end: int) -> None:
        for i in range(start, end):
            with contextlib.suppress(zk.MetadataExistsError):
                await self.meta.create_ml_info(name.partition(i).ml_name, ManagedLedgerInfo())

    async def partitions_update(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        n = await self._partition_count_from(request)
        current = await self._partitions(name)
        if current == 0:
            raise AdminError(404, f"Partitioned topic {name} does not exist")
        if n < current:
            raise _shrink_refused(n, current)
        limit = self._partition_limit(n)
        if limit is not None:  # Pulsar's answer, its words
            raise AdminError(422, f"Expect partitions {n} grater than maximum partitions per topic {limit}")
        try:
            await self.meta.update_partitions(name.ml_name, n)
        except ValueError as e:  # being deleted, or grown past n since the read
            grown = await self._partitions(name)
            if grown > n:
                raise _shrink_refused(n, grown) from e
            raise AdminError(409, str(e)) from e
        except zk.MetadataNotFoundError:  # deleted since the read
            raise AdminError(404, f"Partitioned topic {name} does not exist") from None
        await self._create_partition_mls(name, current, n)
        await self._subscribe_new_partitions(name, current, n, request)
        return _no_content()

    async def _subscribe_new_partitions(
        self, name: TopicName, current: int, n: int, request: web.Request
    ) -> None:
        """The subscriptions of partitions ``[0, current)`` created on the new ones ``[current, n)`` at their
        start, as Pulsar's partition update does: a client finds new partitions by polling (every minute), and
        a producer that finds them before the subscription's consumers would write messages that the
        consumers, subscribing there at latest, never get. The compactor's cursor is not copied."""
        subs: set[str] = set()
        for i in range(current):
            subs.update(await self.meta.list_cursors(name.partition(i).ml_name))
        subs.discard(COMPACTION_SUBSCRIPTION)
        for sub in sorted(subs):
            suffix = f"/subscription/{quote(sub, safe='')}"
            results = await self._each_partition(
                name, "PUT", suffix, body="earliest", request=request, indexes=range(current, n)
            )
            # 409: a consumer that already found the partition subscribed there first
            self._check_partition_results([r for r in results if r[1] != 409])

    async def partitions_delete(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        force = request.query.get("force", "false").lower() == "true"
        async with self._deleting(f"partitioned/{name.ml_name}", f"Partitioned topic {name}"):
            return await self._partitions_delete(request, name, force)

    async def _partitions_delete(self, request: web.Request, name: TopicName, force: bool) -> web.Response:
        # marked first: it grows no more and no partition of it is made (a count grown, a producer's open), so
        # the partitions deleted are all it has; a partition made meanwhile was left behind, of a topic gone
        try:
            await self.meta.mark_partitioned_deleted(name.ml_name)
        except zk.MetadataNotFoundError:
            raise AdminError(404, f"Partitioned topic {name} does not exist") from None
        try:
            results = await self._each_partition(
                name, "DELETE", "", params={"force": str(force).lower()}, request=request
            )
            self._check_partition_results(results, ok_404=True)
        except BaseException:  # (a partition not deleted): the topic as it was, its mark taken back
            with contextlib.suppress(zk.MetadataNotFoundError):
                await self.meta.mark_partitioned_deleted(name.ml_name, False)
            raise
        # the partitions' shared schemas and policies go with the topic, as a non-partitioned topic's do (as in
        # Pulsar); before its metadata, so that a call failing in between can be made again
        await self.meta.delete_schemas(name.ml_name)
        await self.meta.delete_topic_policies(name.ml_name)
        await self._revoke_topic_grants(name)
        await self.meta.delete_partitioned_topic(name.ml_name)
        # and after it: a policy written in between (while the partitioned-topic znode was there) goes too
        await self.meta.delete_topic_policies(name.ml_name)
        return _no_content()

    # -- one topic --------------------------------------------------------------------------------------------

    async def topic_create(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        if await self._partitions(name.base) and not name.is_partition:
            raise AdminError(409, "This topic already exists (as a partitioned topic)")
        try:
            await self.meta.create_ml_info(name.ml_name, ManagedLedgerInfo())
        except zk.MetadataExistsError:
            raise AdminError(409, "This topic already exists") from None
        return _no_content()

    async def topic_delete(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        force = request.query.get("force", "false").lower() == "true"
        if not name.is_partition and await self._partitions(name):
            raise AdminError(
                409, f"{name} is a partitioned topic: delete it with DELETE …/{name.local}/partitions"
            )
        topic = await self._owned_topic(request, name)
        active = bool(topic.producers) or any(rt.consumers for rt in topic.subscriptions.values())
        if active and not force:
            raise AdminError(412, "Topic has active producers/subscriptions")
        await self._delete_topic(topic)
        return _no_content()

    async def _delete_topic(self, topic: Topic) -> None:
        if not await self.service.delete_topic(topic.name):
            raise AdminError(409, f"{topic.name} stopped being served here while it was deleted; try again")
        if not topic.name.is_partition:
            await self._revoke_topic_grants(topic.name)

    async def _policies_topic(self, request: web.Request) -> TopicName:
        """A topic-level policy's topic: the base name of a partitioned topic (whose policies are every
        partition's, as in Pulsar), else an existing topic's name; 404 when neither exists, or for a partition
        past the partitioned topic's count (which would have set the whole topic's policy)."""
        return (await self._policies_target(request))[0]

    async def _policies_target(self, request: web.Request) -> tuple[TopicName, str]:
        """:meth:`_policies_topic` and the znode whose existence says the topic exists (its partitioned-topic
        znode, or its managed ledger's), which a policy is written only with (``update_topic_policy``)."""
        name = self._topic_name(request)
        partitions = await self._partitions(name.base)
        if partitions:
            if name.is_partition and name.partition_index >= partitions:
                raise AdminError(404, f"Topic {name} not found: {name.base} has {partitions} partitions")
            return name.base, layout.partitioned_topic_path(name.base.ml_name)
        if not await self._exists(name):
            raise AdminError(404, f"Topic {name} not found")
        return name.base, layout.ml_info_path(name.ml_name)

    async def _topic_policies(self, request: web.Request) -> tuple[TopicPolicies, NamespacePolicies, bool]:
        """The topic's own policies (none set: empty), its namespace's, and whether the GET asked for the ones
        ``applied`` (in force: the topic's, else its namespace's, else the broker's). Own policies whose znode
        does not parse are 409, saying so (the topic's owner takes them as absent; a policy set replaces them)."""
        name = await self._policies_topic(request)
        try:
            own = await self.meta.get_topic_policies(name.ml_name) or TopicPolicies()
        except zk.MetadataFormatError as e:
            raise AdminError(
                409,
                f"the stored policies of topic {name} are unreadable ({e}): its owner takes them as absent; "
                "setting a policy of the topic replaces them, removing one removes them",
            ) from None
        ns = request.get(NAMESPACE_POLICIES) or await self.meta.get_policies(name.tenant, name.namespace)
        applied = request.query.get("applied", "false").lower() == "true"
        return own, ns or NamespacePolicies(), applied

    async def _topic_policy_get(
        self, request: web.Request, field: str, broker_default: int, ns_field: str | None = None
    ) -> web.Response:
        """A topic's own policy ``field`` (``null`` when not set); with ``applied=true`` the one that applies
        (the topic's, else its namespace's ``ns_field`` (``field``), else the broker's: :func:`policy_in_force`)."""
        own, ns, applied = await self._topic_policies(request)
        value = getattr(own, field)
        if applied:
            value = policy_in_force(value, getattr(ns, ns_field or field), broker_default)
        return _json(value)

    async def _topic_policy_set(self, target: tuple[TopicName, str], field: str, value: Any) -> web.Response:
        """Sets (removes, with None) a topic's own policy ``field`` (``value`` in its stored JSON form), its other
        policies kept, and applies its policies at once to its partitions served here; 404 for a topic deleted
        since :meth:`_policies_target` found it (nothing is written then)."""
        name, topic_znode = target
        try:
            await self.meta.update_topic_policy(name.ml_name, field, value, topic_znode=topic_znode)
        except zk.MetadataNotFoundError:
            raise AdminError(404, f"Topic {name} not found") from None
        served = [t for t in self._served_topics() if t.name.base == name]
        if served:
            own = await self.meta.get_topic_policies(name.ml_name)
            ns = await self.meta.get_policies(name.tenant, name.namespace)
            for t in served:
                self.service.apply_policies(t, ns, own)
        return _no_content()

    async def topic_limit_get(self, request: web.Request) -> web.Response:
        """``maxProducers``, ``maxConsumers``, ``maxUnackedMessagesOnConsumer``, ``maxConsumersPerSubscription``,
        …: the topic's own (``null`` when not set), or ``applied``: the topic's, else its namespace's, else the broker's (0: no limit)."""
        field, ns_field, default = _TOPIC_LIMITS[request.match_info["limit"]]
        return await self._topic_policy_get(request, field, default, ns_field)

    async def topic_limit_set(self, request: web.Request) -> web.Response:
        target = await self._policies_target(request)
        limit = request.match_info["limit"]
        value = _limit_from(await _body_json(request), limit)
        return await self._topic_policy_set(target, _TOPIC_LIMITS[limit][0], value)

    async def topic_limit_delete(self, request: web.Request) -> web.Response:
        target = await self._policies_target(request)
        return await self._topic_policy_set(target, _TOPIC_LIMITS[request.match_info["limit"]][0], None)

    async def topic_retention_get(self, request: web.Request) -> web.Response:
        own, ns, applied = await self._topic_policies(request)
        return _json(_retention_json(ns if applied and own.retention is None else own))

    async def topic_retention_set(self, request: web.Request) -> web.Response:
        target = await self._policies_target(request)
        minutes, size = _retention_from(await _body_json(request))
        value = {"retention_time_minutes": minutes, "retention_size_mb": size}
        return await self._topic_policy_set(target, "retention", value)

    async def topic_retention_delete(self, request: web.Request) -> web.Response:
        return await self._topic_policy_set(await self._policies_target(request), "retention", None)

    async def topic_dedup_get(self, request: web.Request) -> web.Response:
        own, ns, applied = await self._topic_policies(request)
        return _json(self.service.dedup_in_force(ns, own) if applied else own.deduplication_enabled)

    async def topic_dedup_set(self, request: web.Request) -> web.Response:
        target = await self._policies_target(request)
        body = await _body_json(request)
        if not isinstance(body, bool):
            raise AdminError(400, "expected true or false")
        return await self._topic_policy_set(target, "deduplication_enabled", body)

    async def topic_dedup_delete(self, request: web.Request) -> web.Response:
        return await self._topic_policy_set(
            await self._policies_target(request), "deduplication_enabled", None
        )

    async def topic_quota_map(self, request: web.Request) -> web.Response:
        """The topic's own backlog quotas (``{}`` when none), or ``applied``: else its namespace's."""
        own, ns, applied = await self._topic_policies(request)
        size = ns.backlog_quota if applied and own.backlog_quota is None else own.backlog_quota
        age = ns.message_age_quota if applied and own.message_age_quota is None else own.message_age_quota
        return _json(_quota_map(size, age))

    async def topic_quota_set(self, request: web.Request) -> web.Response:
        target = await self._policies_target(request)
        field, quota = _quota_from(request, await _body_json(request))
        return await self._topic_policy_set(target, field, quota.to_json())

    async def topic_quota_delete(self, request: web.Request) -> web.Response:
        target = await self._policies_target(request)
        return await self._topic_policy_set(target, _quota_type(request), None)

    async def topic_compaction_threshold_get(self, request: web.Request) -> web.Response:
        default = self.service.config.compaction_threshold_bytes
        return await self._topic_policy_get(request, "compaction_threshold", default)

    async def topic_compaction_threshold_set(self, request: web.Request) -> web.Response:
        target = await self._policies_target(request)  # 404 before a body is read
        threshold = _threshold_from(await _body_json(request))
        return await self._topic_policy_set(target, "compaction_threshold", threshold)

    async def topic_compaction_threshold_delete(self, request: web.Request) -> web.Response:
        return await self._topic_policy_set(
            await self._policies_target(request), "compaction_threshold", None
        )

    async def topic_message_ttl_get(self, request: web.Request) -> web.Response:
        default = self.service.config.ttl_duration_default_s
        return await self._topic_policy_get(request, "message_ttl_in_seconds", default)

    async def topic_message_ttl_set(self, request: web.Request) -> web.Response:
        """Pulsar's ``topics set-message-ttl``: ``?messageTTL=N`` seconds (0: none; a JSON integer body is taken
        too), applied by the owner's expiry check over the namespace's and the broker's."""
        target = await self._policies_target(request)
        query = request.query.get("messageTTL")
        if query is None:
            ttl = _ttl_from(await _body_json(request))
        else:
            try:
                ttl = _ttl_from(int(query))
            except ValueError:
                raise AdminError(400, f"messageTTL={query!r}: expected an integer of seconds") from None
        return await self._topic_policy_set(target, "message_ttl_in_seconds", ttl)

    async def topic_message_ttl_delete(self, request: web.Request) -> web.Response:
        target = await self._policies_target(request)
        return await self._topic_policy_set(target, "message_ttl_in_seconds", None)

    async def _subscription_rows(self, topic: Topic, earliest: bool = False) -> dict[str, dict[str, Any]]:
        """Every subscription of the topic: the live ones, and durable cursors from ZooKeeper. ``earliest``
        (Pulsar's ``getEarliestTimeInBacklog``): each one's ``earliestMsgPublishTimeInBacklog`` read from the
        entry after its mark-delete (-1 without a backlog), else 0 as in Pulsar, which reads it only when
        asked."""
        counters = self.metrics.topic(str(topic.name))
        out: dict[str, dict[str, Any]] = {}
        live = dict(topic.subscriptions)
        for sub in await self.meta.list_cursors(topic.name.ml_name):
            if sub in live:
                continue
            attached = topic.ml.cursors.get(sub)
            if isinstance(attached, ManagedCursor):
                await attached.refresh()  # idle: another writer (a Spark query's commit) may have moved it
                md, ranges = attached.mark_delete, attached.cursor.individually_deleted
                props = dict(attached.subscription_properties)
            else:
                ci = await self.meta.get_cursor(topic.name.ml_name, sub)
                if ci is None:
                    continue
                md, ranges = Position(*ci.value.mark_delete), _info_ranges(ci.value)
                props = dict(ci.value.subscription_properties)
            messages, entries, size = _cursor_backlog(topic, md, ranges)
            out[sub] = {
                "type": "Exclusive",
                "isDurable": True,
                "isReplicated": False,
                "msgBacklog": messages,
                "msgBacklogEntries": entries,
                "msgBacklogNoDelayed": messages,
                "backlogSize": size,
                "earliestMsgPublishTimeInBacklog": await _earliest_publish_time(
                    topic, md, messages, earliest
                ),
                "msgRateOut": 0.0,
                "msgThroughputOut": 0.0,
                "msgRateRedeliver": 0.0,
                "msgOutCounter": counters.sub_msg_out.get(sub, 0),
                "bytesOutCounter": counters.sub_bytes_out.get(sub, 0),
                "unackedMessages": 0,
                "blockedSubscriptionOnUnackedMsgs": False,
                "msgDelayed": 0,
                "nonContiguousDeletedMessagesRanges": len(ranges),
                "lastAckedTimestamp": 0,
                "lastConsumedTimestamp": 0,
                "lastConsumedFlowTimestamp": 0,
                "markDeletePosition": str(md),
                "readPosition": str(topic.ml.next_position(md)),
                "subscriptionProperties": props,
                "consumers": [],
            }
        for sub, rt in live.items():
            if rt.cursor is not None and not rt.consumers:
                await rt.cursor.refresh()  # idle: as above (a subscription created here, committed by Spark)
            s = rt.stats()
            consumers = s.get("consumers", [])
            backlog = s.get("msgBacklog", 0)
            out[sub] = {
                "type": s.get("type", rt.core.sub_type.name),
                **{k: s[k] for k in ("keySharedMode", "allowOutOfOrderDelivery") if k in s},
                "isDurable": rt.durable,
                "isReplicated": False,
                "msgBacklog": backlog,
                "msgBacklogEntries": s.get("msgBacklogEntries", 0),
                # Pulsar's: the backlog less the messages held back for delayed delivery
                "msgBacklogNoDelayed": max(0, backlog - s.get("msgDelayed", 0)),
                "backlogSize": s.get("backlogSize", 0),
                "earliestMsgPublishTimeInBacklog": await _earliest_publish_time(
                    topic, rt.mark_position, backlog, earliest and rt.durable
                ),
                # Pulsar's: the sum of its consumers' rates
                "msgRateOut": sum(c["msgRateOut"] for c in consumers),
                "msgThroughputOut": sum(c["msgThroughputOut"] for c in consumers),
                "msgRateRedeliver": sum(c["msgRateRedeliver"] for c in consumers),
                "msgOutCounter": counters.sub_msg_out.get(sub, 0),
                "bytesOutCounter": counters.sub_bytes_out.get(sub, 0),
                "unackedMessages": sum(c.get("unackedMessages", 0) for c in consumers),
                "blockedSubscriptionOnUnackedMsgs": rt.core.blocked_subscription_on_unacked(),
                "msgDelayed": s.get("msgDelayed", 0),
                "nonContiguousDeletedMessagesRanges": s.get("nonContiguousDeletedMessagesRanges", 0),
                # the subscription's own, kept while it is served here, and its consumers' latest (as Pulsar)
                **{
                    k: max([s.get(k, 0), *(c.get(k, 0) for c in consumers)])
                    for k in ("lastAckedTimestamp", "lastConsumedTimestamp", "lastConsumedFlowTimestamp")
                },
                "markDeletePosition": s.get("markDeletePosition"),
                "readPosition": s.get("readPosition"),
                "activeConsumerName": s.get("activeConsumerName"),
                "subscriptionProperties": dict(rt.cursor.subscription_properties) if rt.cursor else {},
                "consumers": consumers,
            }
        return out

    async def _topic_stats(self, topic: Topic, earliest: bool = False) -> dict[str, Any]:
        base = topic.stats()
        key = str(topic.name)
        c = self.metrics.topic(key)
        msg_in, bytes_in = int(base.get("msgInCounter", 0)), int(base.get("bytesInCounter", 0))
        subs = await self._subscription_rows(topic, earliest)
        storage = _storage_size(topic)
        times = [s["earliestMsgPublishTimeInBacklog"] for s in subs.values()]
        return {
            **c.topic_rates(msg_in, bytes_in),
            "msgInCounter": msg_in,
            "bytesInCounter": bytes_in,
            "msgOutCounter": c.msg_out,
            "bytesOutCounter": c.bytes_out,
            "averageMsgSize": (bytes_in / msg_in) if msg_in else 0.0,
            "storageSize": storage,
            "backlogSize": max((s["backlogSize"] for s in subs.values()), default=0),
            # the oldest over the subscriptions' (those with a backlog), 0 when not asked for, as Pulsar
            "earliestMsgPublishTimeInBacklogs": min((t for t in times if t > 0), default=0),
            "entriesInStorage": topic.ml.view().total_entries(),
            "publishers": base.get("publishers", []),
            "waitingPublishers": base.get("waitingPublishers", 0),
            "nonContiguousDeletedMessagesRanges": sum(
                s["nonContiguousDeletedMessagesRanges"] for s in subs.values()
            ),
            "subscriptions": subs,
            "deduplicationStatus": "Enabled" if topic.dedup_enabled else "Disabled",
            "topicEpoch": 0,
            "ownerBroker": self.service.config.id,
        }

    async def stats(self, request: web.Request) -> web.Response:
        topic = await self._owned_topic(request, self._topic_name(request))
        earliest = request.query.get("getEarliestTimeInBacklog", "false").lower() == "true"
        return _json(await self._topic_stats(topic, earliest))

    async def partitioned_stats(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        per_partition = request.query.get("perPartition", "true").lower() != "false"
        asked = {k: v for k, v in request.query.items() if k == "getEarliestTimeInBacklog"}
        results = await self._each_partition(name, "GET", "/stats", params=asked, request=request)
        self._check_partition_results(results, ok_404=True)
        total: dict[str, Any] = {
            k: 0
            for k in (
                "msgRateIn",
                "msgThroughputIn",
                "msgRateOut",
                "msgThroughputOut",
                "msgInCounter",
                "bytesInCounter",
                "msgOutCounter",
                "bytesOutCounter",
                "storageSize",
                "backlogSize",
                "waitingPublishers",
                "nonContiguousDeletedMessagesRanges",
            )
        }
        earliest: list[int] = []
        publishers: list[Any] = []
        subs: dict[str, dict[str, Any]] = {}
        partitions: dict[str, Any] = {}
        for i, status, data in results:
            if status == 404 or not isinstance(data, dict):
                continue
            for k in total:
                total[k] += data.get(k, 0)
            earliest.append(data.get("earliestMsgPublishTimeInBacklogs", 0))
            publishers += data.get("publishers", [])
            for sn, s in data.get("subscriptions", {}).items():
                _add_subscription(subs.setdefault(sn, _new_subscription_total()), s)
            if per_partition:
                partitions[str(name.partition(i))] = data
        msg_in = total["msgInCounter"]
        total["averageMsgSize"] = total["bytesInCounter"] / msg_in if msg_in else 0.0
        total["earliestMsgPublishTimeInBacklogs"] = min((t for t in earliest if t > 0), default=0)
        out = {
            **total,
            "publishers": publishers,
            "subscriptions": subs,
            "metadata": {"partitions": len(results)},
            "partitions": partitions,
        }
        return _json(out)

    async def partitioned_internal_stats(self, request: web.Request) -> web.Response:
        """Pulsar's ``partitioned-internalStats`` (``pulsar-admin topics partitioned-stats-internal``):
        ``{"metadata": {"partitions": N}, "partitions": {partition name: its internalStats}}``."""
        name = self._topic_name(request)
        results = await self._each_partition(name, "GET", "/internalStats", request=request)
        self._check_partition_results(results, ok_404=True)
        partitions = {str(name.partition(i)): data for i, status, data in sorted(results) if status != 404}
        return _json({"metadata": {"partitions": len(results)}, "partitions": partitions})

    async def internal_info(self, request: web.Request) -> web.Response:
        """Pulsar's ``internal-info`` (``pulsar-admin topics info-internal``): the managed ledger's stored record
        and its cursors' in the shape of Pulsar's ``ManagedLedgerInfo`` (an individually acknowledged range as
        ``{"from"`` (excluded), ``"to"`` (included)``}``; the open ledger's entries and size are filled in when it
        is closed, as stored); a partitioned topic's as ``{"partitions": {partition name: its info}}``."""
        name = self._topic_name(request)
        if not name.is_partition and await self._partitions(name):
            results = await self._each_partition(name, "GET", "/internal-info", request=request)
            self._check_partition_results(results, ok_404=True)
            parts = {str(name.partition(i)): data for i, status, data in sorted(results) if status != 404}
            return _json({"partitions": parts})
        topic = await self._owned_topic(request, name)
        stored = await self.meta.get_ml_info(topic.ml.name)
        if stored is None:
            raise AdminError(404, f"Topic {name} not found")
        info = stored.value

        def at(p: tuple[int, int]) -> dict[str, int]:
            return {"ledgerId": p[0], "entryId": p[1]}

        cursors: dict[str, Any] = {}
        for sub in sorted(await self.meta.list_cursors(topic.ml.name)):
            ci = await self.meta.get_cursor(topic.ml.name, sub)
            if ci is None:
                continue
            cursors[sub] = {
                "version": ci.version,
                "cursorsLedgerId": -1,
                "markDelete": at(ci.value.mark_delete),
                "individualDeletedMessages": [
                    {"from": at((l1, e1 - 1)), "to": at((l2, e2))}
                    for l1, e1, l2, e2 in ci.value.individually_deleted
                ],
                "properties": dict(ci.value.properties),
            }
        out: dict[str, Any] = {
            "version": stored.version,
            "ledgers": [
                {
                    "ledgerId": li.ledger_id,
                    "entries": li.entries,
                    "size": li.size,
                    "timestamp": li.timestamp_ms,
                    "isOffloaded": False,
                }
                for li in info.ledgers
            ],
            "cursors": cursors,
            "properties": dict(info.properties),
        }
        if info.terminated_position is not None:
            out["terminatedPosition"] = at(info.terminated_position)
        return _json(out)

    async def internal_stats(self, request: web.Request) -> web.Response:
        topic = await self._owned_topic(request, self._topic_name(request))
        ml = topic.ml
        view = ml.view()
        info = ml.info
        sizes = {li.ledger_id: li.size for li in info.ledgers}
        current = view.current_ledger_id
        current_size = _storage_size(topic) - sum(li.size for li in info.ledgers[:-1])
        ledgers = [
            {
                "ledgerId": lid,
                "entries": n,
                "size": current_size if lid == current else sizes.get(lid, 0),
                "offloaded": False,
                "underReplicated": False,
            }
            for lid, n in view.ledgers
        ]
        cursors: dict[str, Any] = {}
        names = set(await self.meta.list_cursors(ml.name)) | set(topic.subscriptions)
        for sub in sorted(names):
            rt = topic.subscriptions.get(sub)
            attached = ml.cursors.get(sub)
            mc = rt.cursor if rt is not None and rt.cursor is not None else attached
            if isinstance(mc, ManagedCursor):
                md, ranges = mc.mark_delete, mc.cursor.individually_deleted
            elif rt is not None:
                md, ranges = rt.mark_position, []
            else:
                ci = await self.meta.get_cursor(ml.name, sub)
                if ci is None:
                    continue
                md, ranges = Position(*ci.value.mark_delete), _info_ranges(ci.value)
            read = Position(*rt.core.read_position) if rt is not None else ml.next_position(md)
            cursors[sub] = {
                "markDeletePosition": str(md),
                "readPosition": str(read),
                "individuallyDeletedMessages": _ranges_text(ranges),
                "totalNonContiguousDeletedMessagesRange": len(ranges),
                "numberOfEntriesSinceFirstNotAckedMessage": view.count_entries(md, view.last_position()),
                "messagesConsumedCounter": self.metrics.topic(str(topic.name)).sub_msg_out.get(sub, 0),
                "cursorLedger": -1,
                "cursorLedgerLastEntry": -1,
                "state": "Open",
                "active": bool(rt is not None and rt.consumers),
                "durable": rt.durable if rt is not None else True,
                "waitingReadOp": False,
                "pendingReadOps": 0,
                "properties": dict(mc.properties) if isinstance(mc, ManagedCursor) else {},
            }
        total = view.total_entries()
        out = {
            "entriesAddedCounter": total,
            "numberOfEntries": total,
            "totalSize": _storage_size(topic),
            "currentLedgerEntries": view.entries_in(current),
            "currentLedgerSize": current_size,
            "lastLedgerCreatedTimestamp": "",
            "waitingCursorsCount": 0,
            "pendingAddEntriesCount": 0,
            "lastConfirmedEntry": str(ml.last_confirmed_position()),
            "state": _ml_state(ml),
            "ledgers": ledgers,
            "cursors": cursors,
            "properties": dict(ml.properties),
            "compactedLedger": topic.compaction.ledger_stats(),
        }
        return _json(out)

    async def last_message_id(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        topic = await self._owned_topic(request, name)
        last = topic.ml.last_confirmed_position()
        batch_index = -1
        if last.entry_id >= 0:
            with contextlib.suppress(ManagedLedgerError, wire.EntryFormatError):
                md, _ = wire.parse_entry(await topic.ml.read_entry(last), verify_checksum=False)
                if md.HasField("num_messages_in_batch"):
                    batch_index = md.num_messages_in_batch - 1
        return _json(_message_id(last, name.partition_index, batch_index))

    async def unload(self, request: web.Request) -> web.Response:
        """Stop serving the topic here (clients reconnect; the next lookup may land elsewhere). A partitioned
        topic's: each partition on its owner, as Pulsar's (a partition missing is passed over); it was 404."""
        name = self._topic_name(request)
        if not name.is_partition and await self._partitions(name):
            results = await self._each_partition(name, "PUT", "/unload", request=request)
            self._check_partition_results(results, ok_404=True)
            return _no_content()
        if self._served(name) is None:
            await self._redirect_if_not_owner(request, name)
            if not await self._exists(name):
                raise AdminError(404, f"Topic {name} not found")
            return _no_content()
        await self.service.unload(name)
        return _no_content()

    async def truncate(self, request: web.Request) -> web.Response:
        """Pulsar's ``DELETE …/{topic}/truncate`` (``pulsar-admin topics truncate``): every subscription's backlog
        dropped (each moved to the last message) and the topic's ledgers before a new current one deleted
        (:func:`sub_ops.truncate`); 204. Each partition of a partitioned topic."""
        return await self._on_topic_or_partitions(
            request, "DELETE", "/truncate", "truncate", sub_ops.truncate
        )

    async def trim(self, request: web.Request) -> web.Response:
        """Pulsar's ``POST …/{topic}/trim`` (``pulsar-admin topics trim-topic``): the ledgers the topic's
        subscriptions have consumed and its retention lets go are deleted now, as the owner's next tick would
        (``ManagedLedger.trim_by_retention``); 204. Each partition of a partitioned topic."""
        return await self._on_topic_or_partitions(
            request, "POST", "/trim", "trim", lambda topic: topic.ml.trim_by_retention()
        )

    async def _on_topic_or_partitions(
        self,
        request: web.Request,
        method: str,
        tail: str,
        what: str,
        op: Callable[[Topic], Awaitable[object]],
    ) -> web.Response:
        """``op`` on the topic served here (a managed-ledger error answered 500, naming ``what``), or the same
        request (``method`` on ``…/{partition}{tail}``) sent to each partition of a partitioned topic; 204."""
        name = self._topic_name(request)
        if not name.is_partition and await self._partitions(name):
            self._check_partition_results(await self._each_partition(name, method, tail, request=request))
            return _no_content()
        topic = await self._owned_topic(request, name)
        try:
            await op(topic)
        except ManagedLedgerError as e:
            raise AdminError(500, f"{what} of {name} failed: {e}") from e
        return _no_content()

    async def create_missed_partitions(self, request: web.Request) -> web.Response:
        """Pulsar's ``POST …/{topic}/createMissedPartitions`` (``pulsar-admin topics create-missed-partitions``):
        each partition of the partitioned topic whose managed ledger is missing (a partition deleted by name) is
        created again, empty; the others are left as they are. 409 "Topic is not partitioned topic" otherwise,
        Pulsar's answer."""
        name = self._topic_name(request)
        n = 0 if name.is_partition else await self._partitions(name)
        if n == 0:
            raise AdminError(409, "Topic is not partitioned topic")
        await self._create_partition_mls(name, 0, n)
        return _no_content()

    async def truncate_non_persistent(self, request: web.Request) -> web.Response:
        """A non-persistent topic keeps no ledgers: 412, Pulsar's answer."""
        raise AdminError(412, "unsupport truncate")

    async def compaction_trigger(self, request: web.Request) -> web.Response:
        """Start compacting the topic (``pulsar-admin topics compact``); 409 while a compaction runs."""
        topic = await self._owned_topic(request, self._topic_name(request))
        try:
            topic.compaction.trigger()
        except CompactionRunningError as e:
            raise AdminError(409, str(e)) from e
        return _no_content()

    async def terminate(self, request: web.Request) -> web.Response:
        """Pulsar's ``terminate``: the topic takes no more messages, on this owner or any later one (producers
        are refused with TopicTerminatedError); answers the last message id, ``{"ledgerId", "entryId",
        "partitionIndex"}`` (again, the same, when terminated already). 405 on a partitioned topic, as in Pulsar
        (:meth:`terminate_partitions` terminates them all)."""
        name = self._topic_name(request)
        if not name.is_partition and await self._partitions(name):
            raise AdminError(405, "Termination of a partitioned topic is not allowed")
        topic = await self._owned_topic(request, name)
        last = await topic.terminate()
        return _json(_message_id(last, name.partition_index))

    async def terminate_partitions(self, request: web.Request) -> web.Response:
        """Pulsar's ``partitioned-terminate``: :meth:`terminate` on each partition (on its owner); answers
        ``{"<partition index>": MessageId}``. 405 on a topic that is not partitioned, as in Pulsar."""
        name = self._topic_name(request)
        if name.is_partition or not await self._partitions(name):
            raise AdminError(405, "Termination of a non-partitioned topic is not allowed: use terminate")
        results = await self._each_partition(name, "POST", "/terminate", request=request)
        self._check_partition_results(results)
        return _json({str(i): data for i, _status, data in sorted(results)})

    async def compaction_status(self, request: web.Request) -> web.Response:
        """The last compaction's status on this owner (``pulsar-admin topics compaction-status``): NOT_RUN,
        RUNNING, SUCCESS or ERROR with its reason."""
        topic = await self._owned_topic(request, self._topic_name(request))
        c = topic.compaction
        return _json({"status": c.status.value, "lastError": c.last_error})

    async def _message_response(self, topic: Topic, pos: Position, batch_index: int | None) -> web.Response:
        """The message at ``batch_index`` of the entry at ``pos`` (its payload as the body, its metadata in
        ``X-Pulsar-*`` headers); ``None``: the whole entry, a batch's frame as it is (peek, as Pulsar answers)."""
        try:
            data = await topic.ml.read_entry(pos)
        except ManagedLedgerError as e:
            raise AdminError(404, f"Message not found at {pos}: {e}") from e
        try:
            md, payload = wire.parse_entry(data, verify_checksum=False)
            # end-to-end encrypted (compressed, then encrypted, by the producer): the broker holds no key, so the
            # payload goes as stored, a batch whole, with what a consumer needs to decrypt it in the headers
            encrypted = bool(md.encryption_keys)
            if encrypted and batch_index and md.HasField("num_messages_in_batch"):
                raise AdminError(
                    412, f"the entry at {pos} is encrypted: its batch's messages cannot be told apart here"
                )

            def decompressed() -> list[tuple[pb.SingleMessageMetadata | None, bytes]]:
                if encrypted:
                    return [(None, bytes(payload))]
                if batch_index is None:
                    return [(None, wire.uncompressed_payload(md, payload))]
                return list(wire.iter_batch(md, payload))

            if not encrypted and wire.inflates_off_loop(md):
                # pyarrow's import (the first time) and its decompression, or a large inflation, off the loop
                messages = await asyncio.to_thread(decompressed)
            else:
                messages = decompressed()
        except wire.EntryFormatError as e:
            raise AdminError(412, f"the entry at {pos} cannot be read as a message: {e}") from e
        index = 0 if batch_index is None else batch_index
        if not 0 <= index < len(messages):
            raise AdminError(404, f"no message {index} in the entry at {pos} ({len(messages)} messages)")
        single, body = messages[index]
        batched = md.HasField("num_messages_in_batch")
        headers = CIMultiDict(
            {
                "X-Pulsar-Message-ID": f"{pos.ledger_id}:{pos.entry_id}:{topic.name.partition_index}"
                + (f":{batch_index}" if batched and batch_index is not None and not encrypted else ""),
                "X-Pulsar-publish-time": pulsar_date(md.publish_time),
                "X-Pulsar-producer-name": md.producer_name,
                "X-Pulsar-sequence-id": str(md.sequence_id),
                "X-Pulsar-Is-Encrypted": "true" if encrypted else "false",
            }
        )
        if encrypted:  # Pulsar's headers, from which its admin client rebuilds the metadata to decrypt with
            headers["X-Pulsar-compression"] = pb.CompressionType.Name(md.compression)
            headers["X-Pulsar-uncompressed-size"] = str(md.uncompressed_size)
            if md.HasField("encryption_algo"):
                headers["X-Pulsar-encryption-algo"] = md.encryption_algo
            for ek in md.encryption_keys:
                headers.add(
                    "X-Pulsar-Base64-encryption-keys", base64.b64encode(ek.SerializeToString()).decode()
                )
            if md.HasField("encryption_param"):
                headers["X-Pulsar-Base64-encryption-param"] = base64.b64encode(md.encryption_param).decode()
        if batched:
            headers["X-Pulsar-num-batch-message"] = str(md.num_messages_in_batch)
            if batch_index is None or encrypted:
                headers["X-Pulsar-batch-size"] = str(len(body))
        props = single.properties if single is not None else md.properties
        key = (single.partition_key if single is not None else md.partition_key) or ""
        if key:
            headers["X-Pulsar-partition-key"] = key
        for kv in props:
            headers[f"X-Pulsar-PROPERTY-{kv.key}"] = kv.value
        headers.update(_more_message_headers(md, single))
        return web.Response(
            body=body, headers=sanitised_headers(headers), content_type="application/octet-stream"
        )

    async def examine_message(self, request: web.Request) -> web.Response:
        """Pulsar's ``examinemessage``: the ``messagePosition``-th entry (1 = first) from ``initialPosition``
        (``earliest`` or ``latest``): a batch's whole frame, as Pulsar's (its admin clients split the body by
        ``X-Pulsar-num-batch-message``); ``batchIndex``, which Pulsar's calls never send, picks one message."""
        name = self._topic_name(request)
        topic = await self._owned_topic(request, name)
        try:
            n = int(request.query.get("messagePosition", "1"))
            batch_index = _batch_index(request)
        except ValueError:
            raise AdminError(412, "messagePosition and batchIndex are integers") from None
        initial = request.query.get("initialPosition", "latest")
        if initial not in ("earliest", "latest") or n < 1:
            raise AdminError(412, "initialPosition is earliest or latest, messagePosition at least 1")
        view = topic.ml.view()
        total = view.total_entries()
        if n > total:
            raise AdminError(404, f"the topic has {total} entries")
        pos = view.position_at(n - 1 if initial == "earliest" else total - n)
        return await self._message_response(topic, pos, batch_index)

    async def message_by_id(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        topic = await self._owned_topic(request, name)
        try:
            pos = Position(int(request.match_info["ledger"]), int(request.match_info["entry"]))
            batch_index = _batch_index(request)
        except ValueError:
            raise AdminError(412, "ledger and entry ids and batchIndex are integers") from None
        return await self._message_response(topic, pos, batch_index)

    # -- subscriptions ----------------------------------------------------------------------------------------

    async def subscriptions(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        if not name.is_partition and await self._partitions(name):
            results = await self._each_partition(name, "GET", "/subscriptions", request=request)
            self._check_partition_results(results, ok_404=True)
            subs = {s for _i, status, data in results if status == 200 for s in data}
            return _json(sorted(subs))
        served = self._served(name)
        if served is not None:
            cursors = set(await self.meta.list_cursors(name.ml_name))
            return _json(sorted(cursors | set(served.subscriptions)))
        await self._redirect_if_not_owner(request, name)
        if not await self._exists(name):
            raise AdminError(404, f"Topic {name} not found")
        return _json(sorted(await self.meta.list_cursors(name.ml_name)))

    def _sub_suffix(self, request: web.Request, tail: str = "") -> str:
        return f"/subscription/{quote(request.match_info['subscription'], safe='')}{tail}"

    async def _fan_out_if_partitioned(
        self, request: web.Request, name: TopicName, method: str, tail: str, body: Any = None
    ) -> web.Response | None:
        if name.is_partition or not await self._partitions(name):
            return None
        results = await self._each_partition(
            name,
            method,
            self._sub_suffix(request, tail),
            body=body,
            params=dict(request.query),
            request=request,
        )
        self._check_partition_results(results)
        return _no_content()

    async def _start_position(self, topic: Topic, body: Any) -> Position | None:
        """A MessageId body (Pulsar's ``{"ledgerId", "entryId", …}``), "earliest"/"latest", or None (latest); an id
        after the last stored entry is the next entry written."""
        ml = topic.ml
        if body is None or body == "latest":
            return None
        if body == "earliest":
            return ml.first_position()
        lid, eid = _message_id_from(body, INT64_MAX, 'a MessageId, "earliest" or "latest"')
        if lid == INT64_MAX or eid == INT64_MAX:
            return None
        if lid < 0 or eid < 0:
            return ml.first_position()
        # past the last stored entry: the next one written (Pulsar's getNextValidPosition), as a SEEK there; taken
        # as is, the entries written before that id were never delivered to the subscription
        return topic.not_past_the_end(Position(lid, eid))

    async def subscription_create(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        sub = request.match_info["subscription"]
        body = await _body_json(request)
        fanned = await self._fan_out_if_partitioned(request, name, "PUT", "", body)
        if fanned is not None:
            return fanned
        topic = await self._owned_topic(request, name)
        async with topic._opening_subscription:  # not created by a consumer subscribing meanwhile too
            if sub in topic.subscriptions or await self.meta.get_cursor(name.ml_name, sub) is not None:
                raise AdminError(409, "Subscription already exists for topic")
            if await topic.subscriptions_full(sub):
                raise AdminError(412, SubscriptionsLimitError(topic.name).args[0])
            start = await self._start_position(topic, body)
            mc = await ManagedCursor.open(topic.ml, sub, InitialPosition.LATEST)
            if start is not None:
                await mc.reset(start)
        return _no_content()

    async def subscription_delete(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        sub = request.match_info["subscription"]
        force = request.query.get("force", "false").lower() == "true"
        fanned = await self._fan_out_if_partitioned(request, name, "DELETE", "")
        if fanned is not None:
            return fanned
        topic = await self._owned_topic(request, name)
        if sub == COMPACTION_SUBSCRIPTION and sub not in topic.subscriptions:
            # the compactor's: its compacted ledger goes too, once the compaction under way has ended (Pulsar's
            # asyncDeleteCursorWithCleanCompactionLedger); not under the lock, which that compaction may need to
            # create the cursor; no consumer subscribes by that name
            try:
                if await topic.compaction.delete_subscription():
                    return _no_content()
            except CompactionRunningError as e:
                raise AdminError(412, str(e)) from e
        # under the lock a consumer subscribing holds until it is attached (as the subscription expiration):
        # looked at without it, a consumer that attached while the cursor was read was not seen, and the
        # subscription's cursor was deleted and detached under it (204 with a consumer connected)
        async with topic._opening_subscription:
            rt = topic.subscriptions.get(sub)
            stored = await self.meta.get_cursor(name.ml_name, sub)
            if rt is None and stored is None:
                raise AdminError(404, "Subscription not found")
            if rt is not None:
                if rt.consumers and not force:
                    raise AdminError(412, "Subscription has active connected consumers")
                rt.disconnect_consumers()
            await sub_ops.delete(topic, sub, rt)
        return _no_content()

    async def _move_cursor(self, topic: Topic, sub: str, pos: Position, *, disconnect: bool) -> None:
        """The subscription's next entry is ``pos``: a live one's dispatcher seeks there (its consumers
        disconnected with ``disconnect``); an idle one's stored cursor is reset, with no consumer opening it
        meanwhile (its cursor would be the version before, whose next save would conflict and fence the topic).
        The compactor's subscription is refused (405), as by skip and expire-messages."""
        await self._on_subscription(sub, _checked_movable(sub))
        rt = topic.subscriptions.get(sub)
        if rt is None or not rt.consumers:
            async with topic._opening_subscription:
                rt = topic.subscriptions.get(sub)
                if rt is None or (rt.cursor is not None and not rt.consumers):
                    # an idle one listed is looked at as skip's is: its znode gone (an UNSUBSCRIBE whose delete was
                    # applied with its reply lost), it leaves the topic's list and the answer is 404, where a seek
                    # reset its ghost cursor (a save failing for ever) and kept it listed
                    rt, mc = await self._on_subscription(sub, sub_ops.subscription_cursor(topic, sub))
                    if rt is None:
                        await mc.reset(pos)
                        return
        await rt.seek(pos)
        if disconnect:
            # their consumers closed (they reconnect), as Pulsar does on reset-cursor, and removed as a consumer's
            # own close removes it: its cursor no longer in use, its idle time set (a reader's subscription kept
            # for its reader to come back to, as a seek keeps it). Removed here by hand, a consumer that did not
            # come back left the cursor "active" (another writer's move of it never adopted: the next skip or
            # reset saved over it, a conflict that fenced the topic) and itself in the dispatcher's records.
            rt.disconnect_consumers(keep=True)

    async def reset_cursor(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        sub = request.match_info["subscription"]
        try:
            ts = int(request.match_info["timestamp"])
        except ValueError:
            raise AdminError(412, "the timestamp must be milliseconds since the epoch") from None
        fanned = await self._fan_out_if_partitioned(request, name, "POST", f"/resetcursor/{ts}")
        if fanned is not None:
            return fanned
        topic = await self._owned_topic(request, name)
        ml = topic.ml
        found = await _first_published_at_or_after(ml, ts)
        pos = found if found is not None else ml.next_position(ml.last_confirmed_position())
        await self._move_cursor(topic, sub, pos, disconnect=True)
        return _no_content()

    async def message_id_by_time(self, request: web.Request) -> web.Response:
        """Pulsar's ``messageid/{timestamp}`` (``pulsar-admin topics get-message-id -d``): the id of the first
        message published at or after the time (ms), 404 "Message ID is null" when none is; 405 on a partitioned
        topic (ask its partitions), as Pulsar answers."""
        name = self._topic_name(request)
        try:
            ts = int(request.match_info["timestamp"])
        except ValueError:
            raise AdminError(412, "the timestamp must be milliseconds since the epoch") from None
        await self._refuse_partitioned(name, "Get message ID by timestamp")
        topic = await self._owned_topic(request, name)
        found = await _first_published_at_or_after(topic.ml, ts)
        if found is None:
            raise AdminError(404, "Message ID is null")
        return _json(_message_id(found, name.partition_index))

    async def reset_cursor_to_id(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        sub = request.match_info["subscription"]
        body = await _body_json(request)
        if isinstance(body, dict) and not name.is_partition and await self._partitions(name):
            lid, eid = _message_id_from(body, INT64_MAX)
            if 0 <= lid < INT64_MAX and 0 <= eid < INT64_MAX:
                # as Pulsar's: a message id is one partition's; sent to every partition it moved the others to
                # a place not theirs (past their end when its ledger is newer than theirs: their backlog skipped)
                raise AdminError(405, "Reset-cursor at position is not allowed for partitioned-topic")
        fanned = await self._fan_out_if_partitioned(request, name, "POST", "/resetcursor", body)
        if fanned is not None:
            return fanned
        topic = await self._owned_topic(request, name)
        start = await self._start_position(topic, body)
        ml = topic.ml
        pos = start if start is not None else ml.next_position(ml.last_confirmed_position())
        await self._move_cursor(topic, sub, pos, disconnect=True)
        return _no_content()

    async def skip_all(self, request: web.Request) -> web.Response:
        name = self._topic_name(request)
        sub = request.match_info["subscription"]
        fanned = await self._fan_out_if_partitioned(request, name, "POST", "/skip_all")
        if fanned is not None:
            return fanned
        topic = await self._owned_topic(request, name)
        ml = topic.ml
        await self._move_cursor(topic, sub, ml.next_position(ml.last_confirmed_position()), disconnect=False)
        return _no_content()

    async def subscription_properties_get(self, request: web.Request) -> web.Response:
        """Pulsar's ``GET …/subscription/{sub}/properties`` (``pulsar-admin topics get-subscription-properties``):
        the subscription's properties, ``{}`` when none were set; a partitioned topic's, its partitions' merged.
        404 "Subscription not found", 405 for a reader's non-durable subscription."""
        name = self._topic_name(request)
        sub = request.match_info["subscription"]
        if not name.is_partition and await self._partitions(name):
            results = await self._each_partition(
                name, "GET", self._sub_suffix(request, "/properties"), request=request
            )
            self._check_partition_results(results)
            merged: dict[str, str] = {}
            for _i, _status, data in sorted(results):
                merged.update(data or {})
            return _json(merged)
        topic = await self._owned_topic(request, name)
        async with topic._opening_subscription:
            _rt, mc = await self._on_subscription(sub, sub_ops.subscription_cursor(topic, sub))
            return _json(dict(mc.subscription_properties))

    async def subscription_properties_set(self, request: web.Request) -> web.Response:
        """Pulsar's ``PUT …/subscription/{sub}/properties`` (``pulsar-admin topics update-subscription-properties``):
        the subscription's properties replaced by the body's (a JSON object of strings; ``{}`` or no body clears
        them), saved with its cursor before the answer (204); a partitioned topic's on each partition."""
        name = self._topic_name(request)
        sub = request.match_info["subscription"]
        body = await _body_json(request)
        body = {} if body is None else body
        if not isinstance(body, dict) or not all(isinstance(v, str) for v in body.values()):
            raise AdminError(400, 'expected a JSON object of strings, e.g. {"owner": "billing"}')
        fanned = await self._fan_out_if_partitioned(request, name, "PUT", "/properties", body)
        if fanned is not None:
            return fanned
        topic = await self._owned_topic(request, name)
        async with topic._opening_subscription:
            _rt, mc = await self._on_subscription(sub, sub_ops.subscription_cursor(topic, sub))
            try:
                await mc.set_subscription_properties(body)
            except SubscriptionPropertiesTooLargeError as e:
                raise AdminError(413, str(e)) from None
        return _no_content()

    async def _refuse_partitioned(self, name: TopicName, what: str) -> None:
        """405 for a call Pulsar serves on a partition only, with Pulsar's reason."""
        if not name.is_partition and await self._partitions(name):
            raise AdminError(
                405,
                f"{what} on a partitioned topic is not allowed, please try do it on specific topic partition",
            )

    async def backlog_size(self, request: web.Request) -> web.Response:
        """Pulsar's ``PUT …/{topic}/backlogSize`` (``pulsar-admin topics get-backlog-size -m l:e``): the estimated
        bytes of the entries after the MessageId of the body (the position a subscription's mark-delete would
        be), as a subscription's ``backlogSize`` is estimated; 405 on a partitioned topic (ask a partition)."""
        name = self._topic_name(request)
        pos = _message_id_from(await _body_json(request))
        await self._refuse_partitioned(name, "Get backlog size by message id")
        topic = await self._owned_topic(request, name)
        ml = topic.ml
        return _json(ml.estimate_bytes(pos, ml.last_confirmed_position()))

    async def analyze_backlog(self, request: web.Request) -> web.Response:
        """Pulsar's ``POST …/subscription/{sub}/analyzeBacklog`` (``pulsar-admin topics analyze-backlog``): the
        subscription's backlog read and counted (:func:`sub_ops.analyze_backlog`, at most 10,000 entries or 2
        minutes, ``aborted`` true when it stopped there), from the entry after its mark-delete or from the body's
        MessageId (``{"ledgerId": l, "entryId": e}``, ResetCursorData); no entry filters here, so every entry is
        accepted. 405 on a partitioned topic (analyze a partition)."""
        name = self._topic_name(request)
        body = await _body_json(request)
        start = None
        if body is not None and body != {}:
            if isinstance(body, dict) and "ledgerId" not in body:
                raise AdminError(400, 'expected no body or a MessageId, e.g. {"ledgerId": 12, "entryId": 3}')
            start = _message_id_from(body, expected="no body or a MessageId")
        await self._refuse_partitioned(name, "Analyze backlog")
        topic = await self._owned_topic(request, name)
        sub = request.match_info["subscription"]
        scan = await self._on_subscription(sub, sub_ops.analyze_backlog(topic, sub, start))
        out: dict[str, Any] = {
            "entries": scan.entries,
            "messages": scan.messages,
            "filterAcceptedEntries": scan.entries,
            "filterAcceptedMessages": scan.messages,
            "filterRejectedEntries": 0,
            "filterRejectedMessages": 0,
            "filterRescheduledEntries": 0,
            "filterRescheduledMessages": 0,
            "aborted": scan.aborted,
        }
        if scan.first is not None and scan.last is not None:
            out["firstMessageId"] = f"{scan.first.ledger_id}:{scan.first.entry_id}"
            out["lastMessageId"] = f"{scan.last.ledger_id}:{scan.last.entry_id}"
        return _json(out)

    @staticmethod
    async def _on_subscription(sub: str, call: Awaitable[T]) -> T:
        """``call`` (a ``sub_ops`` one on ``sub``), its refusals answered as Pulsar does."""
        try:
            return await call
        except sub_ops.SubscriptionNotFoundError:
            raise AdminError(404, "Subscription not found") from None
        except sub_ops.NotDurableError:
            raise AdminError(
                405, f"{sub} is a reader's non-durable subscription: it has no stored position"
            ) from None
        except sub_ops.ReservedSubscriptionError:
            raise AdminError(
                405, f"Subscription {sub} is reserved for topic compaction: only the compactor moves it"
            ) from None

    @staticmethod
    def _count_in_path(request: web.Request, key: str, what: str, least: int) -> int:
        try:
            n = int(request.match_info[key])
        except ValueError:
            n = least - 1
        if n < least:
            raise AdminError(412, f"{what} is an integer, {least} or more: got {request.match_info[key]!r}")
        return n

    async def peek(self, request: web.Request) -> web.Response:
        """Pulsar's ``peek-messages``: the ``messagePosition``-th entry (1 = the first) after the subscription's
        mark-delete that it has not acknowledged, without moving it; the body and headers of examinemessage, a
        batch as its whole frame. 405 on a partitioned topic (peek a partition), as in Pulsar."""
        name = self._topic_name(request)
        n = self._count_in_path(request, "position", "messagePosition", 1)
        if not name.is_partition and await self._partitions(name):
            raise AdminError(405, "Peek messages on a partitioned topic is not allowed")
        topic = await self._owned_topic(request, name)
        sub = request.match_info["subscription"]
        pos = await self._on_subscription(sub, sub_ops.peek(topic, sub, n))
        if pos is None:
            raise AdminError(404, "Message not found")
        return await self._message_response(topic, pos, None)

    async def skip(self, request: web.Request) -> web.Response:
        """Pulsar's ``skip``: the subscription acknowledges its next ``numMessages`` unacknowledged entries (all of
        them when there are fewer); its consumers go on after them. Each partition of a partitioned topic."""
        name = self._topic_name(request)
        n = self._count_in_path(request, "count", "numMessages", 0)
        fanned = await self._fan_out_if_partitioned(request, name, "POST", f"/skip/{n}")
        if fanned is not None:
            return fanned
        topic = await self._owned_topic(request, name)
        sub = request.match_info["subscription"]
        await self._on_subscription(sub, sub_ops.skip(topic, sub, n))
        return _no_content()

    async def _expire(self, topic: Topic, sub: str, ttl_s: int) -> None:
        await self._on_subscription(sub, sub_ops.expire(topic, sub, ttl_s, int(time.time() * 1000)))

    async def expire_messages(self, request: web.Request) -> web.Response:
        """Pulsar's ``expire-messages``: the subscription acknowledges every message up to the newest one
        published more than ``expireTimeInSeconds`` ago (0 expires nothing, as in Pulsar). Each partition of a
        partitioned topic."""
        name = self._topic_name(request)
        ttl = self._count_in_path(request, "seconds", "expireTimeInSeconds", 0)
        fanned = await self._fan_out_if_partitioned(request, name, "POST", f"/expireMessages/{ttl}")
        if fanned is not None:
            return fanned
        topic = await self._owned_topic(request, name)
        await self._expire(topic, request.match_info["subscription"], ttl)
        return _no_content()

    async def expire_messages_all(self, request: web.Request) -> web.Response:
        """``expire-messages-all-subscriptions``: :meth:`expire_messages` for each durable subscription but the
        compactor's."""
        name = self._topic_name(request)
        ttl = self._count_in_path(request, "seconds", "expireTimeInSeconds", 0)
        if not name.is_partition and await self._partitions(name):
            tail = f"/all_subscription/expireMessages/{ttl}"
            self._check_partition_results(await self._each_partition(name, "POST", tail, request=request))
            return _no_content()
        topic = await self._owned_topic(request, name)
        await sub_ops.expire_all(topic, ttl, int(time.time() * 1000))
        return _no_content()

    # -- lookup -----------------------------------------------------------------------------------------------

    async def lookup(self, request: web.Request) -> web.Response:
        """The owner's URLs. A ``non-persistent`` topic is answered with this broker's URLs, whatever its
        namespace, and no ownership: pulsar-client (``http://`` service URL) then asks this broker over the binary
        protocol, which refuses the name with NotAllowedError and says why, as through a ``pulsar://`` URL. An
        error status here would reach the user as ConnectError, a broker that seems down (the C++ client maps
        every HTTP error to it)."""
        mi = request.match_info
        domain = mi["domain"]
        if domain not in (PERSISTENT, NON_PERSISTENT):
            raise AdminError(412, f"unknown topic domain {domain!r}")
        name = TopicName.parse(f"persistent://{mi['tenant']}/{mi['namespace']}/{mi['topic']}")
        known = request.get(NAMESPACE_POLICIES)
        if not await self.service.can(request.get(PRINCIPAL), name, ("produce", "consume"), known):
            raise AdminError(
                403, f"{request.get(PRINCIPAL)} is not authorized to produce or consume on {name}"
            )
        if domain == NON_PERSISTENT:
            owner = self.service.ownership()
        else:
            owner = await self.service.lookup_owner(name)
        return _json(
            {
                "brokerUrl": owner.service_url,
                "brokerUrlTls": owner.service_url_tls,
                "httpUrl": owner.web_service_url,
                "httpUrlTls": owner.web_service_url_tls,
                "nativeUrl": owner.service_url,
            }
        )

    # -- metrics ----------------------------------------------------------------------------------------------

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=self.exported.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def collect_metrics(self) -> list[Metric]:
        """The families ``/metrics`` serves, read from the service when scraped (``self.exported`` calls it)."""
        fam = Families()
        add = fam.add
        topics = self._served_topics()
        for t in topics:
            key = str(t.name)
            labels = {"cluster": CLUSTER_NAME, "namespace": t.name.namespace_name, "topic": key}
            c = self.metrics.topic(key)
            # stored, counted by the broker's record of the topic (Pulsar counts a publish once persisted): the
            # served topic's own counters start again at 0 when it is unloaded and opened again
            add("pulsar_in_messages_total", labels, c.msg_published)
            add("pulsar_in_bytes_total", labels, c.bytes_published)
            add("pulsar_out_messages_total", labels, c.msg_out)
            add("pulsar_out_bytes_total", labels, c.bytes_out)
            add("pulsar_storage_size", labels, _storage_size(t))
            add("pulsar_storage_entries", labels, t.ml.view().total_entries())
            add("pulsar_producers_count", labels, len(t.producers))
            add("pulsar_consumers_count", labels, sum(len(rt.consumers) for rt in t.subscriptions.values()))
            backlogs: dict[str, int] = {}
            for name, hook in t.ml.cursors.items():
                if isinstance(hook, ManagedCursor):
                    backlogs[name] = hook.backlog_messages()
            for name, rt in t.subscriptions.items():
                if rt.cursor is not None:
                    backlogs[name] = rt.cursor.backlog_messages()
            add("pulsar_subscriptions_count", labels, len(set(backlogs) | set(t.subscriptions)))
            add("pulsar_msg_backlog", labels, sum(backlogs.values()))
            for name, backlog in sorted(backlogs.items()):
                add("pulsar_subscription_back_log", {**labels, "subscription": name}, backlog)
            for name, n in sorted(c.sub_msg_out.items()):
                sl = {**labels, "subscription": name}
                add("pulsar_subscription_out_messages_total", sl, n)
                add("pulsar_subscription_out_bytes_total", sl, c.sub_bytes_out.get(name, 0))
        broker = {"cluster": CLUSTER_NAME, "broker": self.service.config.id}
        add("pulsar_topics_count", broker, len(topics))
        add("pulsar_broker_connections", broker, len(self.service.sessions))
        add("pulsar_broker_auth_failures_total", broker, self.metrics.auth_failures)
        add("pulsar_broker_authorization_refusals_total", broker, self.metrics.authz_refusals)
        add("pulsar_broker_backlog_quota_refusals_total", broker, self.metrics.quota_refusals)
        add("pulsar_broker_backlog_quota_evictions_total", broker, self.metrics.quota_evictions)
        return [*fam.families(), self.metrics.publish_latency.family(broker)]

    # -- routes -----------------------------------------------------------------------------------------------

    def routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/admin/v2/brokers/health", self.health)
        r.add_get("/metrics", self.prometheus)
        r.add_get("/metrics/", self.prometheus)
        r.add_get("/admin/v2/clusters", self.clusters)
        r.add_get("/admin/v2/clusters/{cluster}", self.cluster)
        # before brokers/{cluster}, which would take "internal-configuration" for a cluster's name
        r.add_get("/admin/v2/brokers/internal-configuration", self.internal_configuration)
        r.add_get("/admin/v2/brokers/ready", self.ready)
        r.add_get("/admin/v2/brokers/{cluster}", self.brokers)
        r.add_get("/admin/v2/tenants", self.tenants)
        r.add_get("/admin/v2/tenants/{tenant}", self.tenant_get)
        r.add_put("/admin/v2/tenants/{tenant}", self.tenant_put)
        r.add_delete("/admin/v2/tenants/{tenant}", self.tenant_delete)
        ns = "/admin/v2/namespaces/{tenant}/{namespace}"
        r.add_get("/admin/v2/namespaces/{tenant}", self.namespaces)
        r.add_get(ns, self.namespace_get)
        r.add_put(ns, self.namespace_put)
        r.add_delete(ns, self.namespace_delete)
        r.add_get(ns + "/topics", self.namespace_topics)
        r.add_get(ns + "/retention", self.retention_get)
        r.add_post(ns + "/retention", self.retention_set)
        r.add_delete(ns + "/retention", self.retention_delete)
        r.add_get(ns + "/deduplication", self.dedup_get)
        r.add_post(ns + "/deduplication", self.dedup_set)
        r.add_delete(ns + "/deduplication", self.dedup_delete)
        r.add_get(ns + "/schemaCompatibilityStrategy", self.schema_strategy_get)
        r.add_put(ns + "/schemaCompatibilityStrategy", self.schema_strategy_set)
        r.add_post(ns + "/schemaCompatibilityStrategy", self.schema_strategy_set)
        sch = "/admin/v2/schemas/{tenant}/{namespace}/{topic}"
        r.add_get(sch + "/schema", self.schema_get)
        r.add_get(sch + "/schema/{version}", self.schema_get)
        r.add_post(sch + "/schema", self.schema_post)
        r.add_delete(sch + "/schema", self.schema_delete)
        r.add_get(sch + "/schemas", self.schemas_all)
        r.add_post(sch + "/compatibility", self.schema_compatibility)
        r.add_get(ns + "/permissions", self.permissions_get)
        r.add_post(ns + "/permissions/{role}", self.permission_grant)
        r.add_delete(ns + "/permissions/{role}", self.permission_revoke)
        r.add_get(ns + "/compactionThreshold", self.compaction_threshold_get)
        r.add_post(ns + "/compactionThreshold", self.compaction_threshold_set)
        r.add_delete(ns + "/compactionThreshold", self.compaction_threshold_delete)
        r.add_get(ns + "/messageTTL", self.message_ttl_get)
        r.add_post(ns + "/messageTTL", self.message_ttl_set)
        r.add_delete(ns + "/messageTTL", self.message_ttl_delete)
        r.add_get(ns + "/subscriptionExpirationTime", self.expiration_get)
        r.add_post(ns + "/subscriptionExpirationTime", self.expiration_set)
        r.add_delete(ns + "/subscriptionExpirationTime", self.expiration_delete)
        r.add_get(ns + "/autoTopicCreation", self.auto_topic_creation_get)
        r.add_post(ns + "/autoTopicCreation", self.auto_topic_creation_set)
        r.add_delete(ns + "/autoTopicCreation", self.auto_topic_creation_delete)
        r.add_post(ns + "/clearBacklog", self.namespace_clear_backlog)
        r.add_post(ns + "/clearBacklog/{subscription}", self.namespace_clear_backlog)
        r.add_post(ns + "/unsubscribe/{subscription}", self.namespace_unsubscribe)
        r.add_put(ns + "/unload", self.namespace_unload)
        r.add_get(ns + "/backlogQuota", self.quota_get)
        limits = ns + "/{limit:" + "|".join(_NAMESPACE_LIMITS) + "}"
        r.add_route("GET", limits, self.namespace_limit_get)
        r.add_route("POST", limits, self.namespace_limit_set)
        r.add_route("DELETE", limits, self.namespace_limit_delete)
        r.add_get(ns + "/backlogQuotaMap", self.quota_map)
        r.add_post(ns + "/backlogQuota", self.quota_set)
        r.add_delete(ns + "/backlogQuota", self.quota_delete)
        pns = "/admin/v2/persistent/{tenant}/{namespace}"
        r.add_get(pns, self.topics_list)
        r.add_get(pns + "/partitioned", self.partitioned_list)
        t = pns + "/{topic}"
        r.add_put(t, self.topic_create)
        r.add_delete(t, self.topic_delete)
        r.add_get(t + "/partitions", self.partitions_get)
        r.add_get(
            f"/admin/v2/{{domain:{NON_PERSISTENT}}}/{{tenant}}/{{namespace}}/{{topic}}/partitions",
            self.partitions_get,
        )
        r.add_put(t + "/partitions", self.partitions_create)
        r.add_post(t + "/partitions", self.partitions_update)
        r.add_delete(t + "/partitions", self.partitions_delete)
        r.add_get(t + "/stats", self.stats)
        r.add_get(t + "/partitioned-stats", self.partitioned_stats)
        r.add_get(t + "/internalStats", self.internal_stats)
        r.add_get(t + "/partitioned-internalStats", self.partitioned_internal_stats)
        r.add_get(t + "/internal-info", self.internal_info)
        r.add_get(t + "/messageid/{timestamp}", self.message_id_by_time)
        r.add_get(t + "/lastMessageId", self.last_message_id)
        r.add_put(t + "/unload", self.unload)
        r.add_delete(t + "/truncate", self.truncate)
        r.add_post(t + "/trim", self.trim)
        r.add_post(t + "/createMissedPartitions", self.create_missed_partitions)
        r.add_delete(
            f"/admin/v2/{{domain:{NON_PERSISTENT}}}/{{tenant}}/{{namespace}}/{{topic}}/truncate",
            self.truncate_non_persistent,
        )
        r.add_post(t + "/terminate", self.terminate)
        r.add_post(t + "/terminate/partitions", self.terminate_partitions)
        r.add_put(t + "/compaction", self.compaction_trigger)
        r.add_get(t + "/compaction", self.compaction_status)
        r.add_get(t + "/compactionThreshold", self.topic_compaction_threshold_get)
        r.add_post(t + "/compactionThreshold", self.topic_compaction_threshold_set)
        r.add_delete(t + "/compactionThreshold", self.topic_compaction_threshold_delete)
        r.add_get(t + "/messageTTL", self.topic_message_ttl_get)
        r.add_post(t + "/messageTTL", self.topic_message_ttl_set)
        r.add_delete(t + "/messageTTL", self.topic_message_ttl_delete)
        # a topic's own policies: GET (its own, or ?applied=true), POST and DELETE each
        for path, get, post, delete in (
            (
                "/{limit:" + "|".join(_TOPIC_LIMITS) + "}",
                self.topic_limit_get,
                self.topic_limit_set,
                self.topic_limit_delete,
            ),
            ("/retention", self.topic_retention_get, self.topic_retention_set, self.topic_retention_delete),
            ("/deduplicationEnabled", self.topic_dedup_get, self.topic_dedup_set, self.topic_dedup_delete),
        ):
            r.add_get(t + path, get)
            r.add_post(t + path, post)
            r.add_delete(t + path, delete)
        r.add_get(t + "/backlogQuotaMap", self.topic_quota_map)
        r.add_post(t + "/backlogQuota", self.topic_quota_set)
        r.add_delete(t + "/backlogQuota", self.topic_quota_delete)
        r.add_get(t + "/examinemessage", self.examine_message)
        r.add_get(t + "/ledger/{ledger}/entry/{entry}", self.message_by_id)
        r.add_get(t + "/subscriptions", self.subscriptions)
        s = t + "/subscription/{subscription}"
        r.add_put(s, self.subscription_create)
        r.add_delete(s, self.subscription_delete)
        r.add_post(s + "/resetcursor/{timestamp}", self.reset_cursor)
        r.add_post(s + "/resetcursor", self.reset_cursor_to_id)
        r.add_post(s + "/skip_all", self.skip_all)
        r.add_post(s + "/skip/{count}", self.skip)
        r.add_get(s + "/position/{position}", self.peek)
        r.add_post(s + "/expireMessages/{seconds}", self.expire_messages)
        r.add_get(s + "/properties", self.subscription_properties_get)
        r.add_put(s + "/properties", self.subscription_properties_set)
        r.add_post(s + "/analyzeBacklog", self.analyze_backlog)
        r.add_get(s + "/analyzeBacklog", self.analyze_backlog)
        r.add_put(t + "/backlogSize", self.backlog_size)
        r.add_get(t + "/permissions", self.topic_permissions_get)
        r.add_post(t + "/permissions/{role}", self.topic_permission_grant)
        r.add_delete(t + "/permissions/{role}", self.topic_permission_revoke)
        r.add_post(t + "/all_subscription/expireMessages/{seconds}", self.expire_messages_all)
        r.add_get("/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}", self.lookup)


#: Always served without a token (load balancers and Prometheus keep working).
OPEN_PATHS = frozenset(
    {"/health", "/metrics", "/metrics/", "/admin/v2/brokers/health", "/admin/v2/brokers/ready"}
)
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Read-only routes that answer messages' payloads (examinemessage, a message by id, a subscription's peek):
#: with authentication on they need a token whatever ``--admin-read-auth`` says, and with ``--auth-required``
#: the subject's ``consume`` permission on the topic's namespace, as a consumer would (Pulsar's peek and
#: examine need it too). A stranger must not read through HTTP what it may not subscribe to.
PAYLOAD_ROUTES = ("/examinemessage", "/ledger/{ledger}/entry/{entry}", "/position/{position}")
#: request keys (typed: aiohttp warns NotAppKeyWarning of a string key): the subject of the request's token,
#: when it carried a good one; the topic's namespace policies check_namespace read
PRINCIPAL = web.RequestKey("principal", str)
NAMESPACE_POLICIES = web.RequestKey("namespace_policies", NamespacePolicies)


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _auth_middleware(service: BrokerService) -> Any:
    from .connection import AuthenticationFailed

    cfg = service.config
    needs_auth = "authentication required: send Authorization: Bearer <token>"
    if cfg.admin_tls_port is not None and cfg.tls_trust_certs_file:
        needs_auth += f" (or a client certificate on https port {cfg.admin_tls_port})"

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if service.verifier is None or request.path in OPEN_PATHS:
            return await handler(request)
        token = _bearer(request)
        if token is not None:
            try:
                # the header's bytes as sent (aiohttp decodes those that are not UTF-8 to surrogates)
                request[PRINCIPAL] = service.authenticate("token", token.encode("utf-8", "surrogateescape"))
            except AuthenticationFailed as e:
                return _error(401, f"authentication failed: {e}")
        elif (role := _certificate_role(request)) is not None:  # a client certificate the https port verified
            request[PRINCIPAL] = role
        mutating = request.method not in _READ_METHODS
        lookup = request.path.startswith("/lookup/")
        payload = _reads_payloads(request)
        needed = mutating or payload or cfg.admin_read_auth or (lookup and cfg.auth_required)
        if needed and PRINCIPAL not in request:
            return _error(401, needs_auth)
        if mutating and cfg.superuser_roles and not service.is_superuser(request[PRINCIPAL]):
            return _error(403, f"{request[PRINCIPAL]} is not a superuser")
        if payload:
            mi = request.match_info
            name = TopicName.parse(f"persistent://{mi['tenant']}/{mi['namespace']}/{mi['topic']}")
            if not await service.can(request[PRINCIPAL], name, ("consume",)):
                return _error(403, f"{request[PRINCIPAL]} is not authorized to consume from {name}")
        return await handler(request)

    return auth


def _owner_url(request: web.Request, owner: OwnershipInfo) -> str:
    """Where a call on a topic ``owner`` serves is redirected: its https URL for a request that came over https,
    as Pulsar's validateTopicOwnership (redirected to plain http, the request's token went in clear and its
    client certificate was not asked for, 401), else (or where the owner serves no https) its http URL."""
    url = owner.web_service_url_tls if request.secure and owner.web_service_url_tls else owner.web_service_url
    return url.rstrip("/")


def _certificate_role(request: web.Request) -> str | None:
    """The CN of the client certificate the https port (``--admin-tls-port`` with ``--tls-trust-certs``) verified
    for this request's connection, as the TLS port's CONNECT with auth method ``tls`` takes it; None on plain
    http, or where the client sent none."""
    transport = request.transport
    return client_role(transport) if transport is not None else None


def _reads_payloads(request: web.Request) -> bool:
    """Is this a call of :data:`PAYLOAD_ROUTES` (one that answers messages' payloads)?"""
    route = request.match_info.route.resource
    return route is not None and route.canonical.endswith(PAYLOAD_ROUTES) and "topic" in request.match_info


def _namespace_middleware(admin: AdminApp) -> Any:
    @web.middleware
    async def namespace_exists(request: web.Request, handler: Handler) -> web.StreamResponse:
        await admin.check_namespace(request)
        return await handler(request)

    return namespace_exists


def build_app(service: BrokerService) -> tuple[web.Application, AdminApp]:
    admin = AdminApp(service)
    app = web.Application(middlewares=[_errors, _auth_middleware(service), _namespace_middleware(admin)])
    admin.routes(app)
    return app, admin


class AdminServer:
    """Serves the admin app on the broker's ``--http-port`` (``listen_address``) from a started service."""

    def __init__(self, service: BrokerService, host: str | None = None, port: int | None = None) -> None:
        self.service = service
        self.host = host if host is not None else service.config.listen_address
        self.port = port if port is not None else service.config.http_port
        self.app, self.admin = build_app(service)
        self._runner: HttpService | None = None

    async def start(self) -> None:
        # connection limits and idle timeout: bookie/server_gate.py
        cfg = self.service.config
        tls = self.service.tls
        # https on --admin-tls-port too (Pulsar's webServicePortTls): the Pulsar TLS port's context, reloads too
        https = None
        if cfg.admin_tls_port is not None and tls is not None:
            https = (cfg.admin_tls_port, tls.context)
        self._runner = await serve_http(
            f"broker={cfg.id} admin HTTP", self.app, self.host, self.port, tls=https, access_log=None
        )
        log.info("broker=%s admin REST on http://%s:%d", cfg.id, self.host, self.port)
        if https is not None:
            log.info("broker=%s admin REST on https://%s:%d", cfg.id, self.host, https[0])

    async def stop(self) -> None:
        await self.admin.close()
        if self._runner is not None:
            await self._runner.cleanup()
