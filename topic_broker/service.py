"""The broker service: topics, producers, subscriptions, ownership and lookup, behind the protocol connections.

Decisions live in the pure cores (``connection.py`` for the protocol state, ``subscription.py`` for dispatch,
``managed_ledger``/``cursor`` rules); this module executes them against ZooKeeper, the ledgers and sockets.

- Ownership: a topic (or partition) is served only by the broker holding its ephemeral ``ownership/<ml>`` znode.
  LOOKUP on any broker answers the owner's URL (taking ownership when nobody holds it). A topic is opened
  lazily (its managed ledger fences the previous owner's ledger) on the first PRODUCER or SUBSCRIBE.
- When a topic is fenced (another owner appended or wrote its metadata) or the ZooKeeper session is lost, the
  topic is unloaded: its producers and consumers get CLOSE_PRODUCER/CLOSE_CONSUMER, so clients look up again and
  land on the new owner; nothing more is acknowledged (invariant 9).
- SEND: one entry per SEND, stored as received (checksum verified: ChecksumError on mismatch); appends are
  pipelined by one appender task per topic; receipts leave strictly in order per producer.
- Dedup (``deduplication_enabled``: the topic's own policy, else its namespace's, else the broker's default):
  by (producer name, highest sequence id); the last ids are kept in the managed ledger's properties
  (``dedup/<name>``, written with every ledger-list change) and a new owner rebuilds them from those plus the
  metadata of the tail ledger's entries.
- Automatic compaction (``compaction_threshold``: the topic's own policy, else its namespace's, else
  ``--compaction-threshold-bytes``): every ``--compaction-monitor-interval-s`` each topic served here (each
  partition by itself) whose backlog exceeds it is compacted, unless a compaction of it runs already.
- Message TTL (``message_ttl_in_seconds``: the topic's own policy, else its namespace's, else
  ``--ttl-duration-default-s``): every ``--message-expiry-check-interval-s`` each durable subscription (but the
  compactor's) of the topics served here acknowledges the messages published longer ago than the TTL
  (``sub_ops.expire_all``).
- Subscription expiration (the namespace's ``subscription_expiration_time_minutes``): every
  ``--subscription-expiry-check-interval-s`` the subscriptions without consumers idle longer than that are
  deleted (``sub_ops.delete_inactive``).

The admin side (``admin.py``) uses :meth:`BrokerService.topic_names`, :meth:`topic_stats`,
:meth:`internal_stats`, :meth:`subscriptions`, :meth:`get_topic` and :meth:`unload`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import functools
import itertools
import logging
import operator
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import zk
from bookie.auth import TokenError, TokenVerifier
from bookie.server_gate import OpenFilesWatch
from ledger_client import ENTRY_PAYLOAD_MAX, BookKeeper, ClientConfig
from ledger_client import errors as LE
from zk.backoff import backoff
from zk.managed_ledgers import (
    BacklogQuota,
    BrokerInfo,
    BrokerMetadataStore,
    ManagedLedgerInfo,
    NamespaceGoneError,
    NamespacePolicies,
    OwnershipInfo,
    SchemaHistory,
    SchemaInfo,
    SchemaRefusedError,
    TopicPolicies,
    TopicsLimitError,
    policy_in_force,
)
from zk.ratelog import LOG_EVERY_S, RateLimitedLog

from . import pulsar_api_pb2 as pb
from . import schema_compat, sub_ops, wire
from .bookie_supply import BookiesShortError, BookieSupply
from .compaction import (
    COMPACTION_SUBSCRIPTION,
    TopicCompaction,
    compacted_out_mask,
    compaction_backlog,
    compaction_due,
    last_kept_index,
)
from .connection import AuthenticationFailed, ConnectionConfig, ProtocolConnection, Request
from .cursor import InitialPosition, ManagedCursor
from .managed_ledger import (
    ManagedLedger,
    ManagedLedgerConfig,
    ManagedLedgerError,
    ManagedLedgerFencedError,
    Position,
    QueuedEntry,
)
from .metrics import BrokerMetrics, ClientCounters
from .names import InvalidTopicName, TopicName
from .subscription import (
    DEFAULT_UNACKED_MESSAGES_MAX,
    DEFAULT_UNACKED_SUBSCRIPTION_MAX,
    ActiveConsumerChanged,
    Command,
    ConsumerAssignError,
    ConsumerBusyError,
    Deliver,
    DispatchEntry,
    HoldDispatch,
    Read,
    ReadReplay,
    Subscription,
    SubType,
    cumulative_batch_index,
    failover_topic_hash,
    merge_ranges,
)
from .tls import TlsFiles

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_HTTP_PORT",
    "DEFAULT_PORT",
    "BrokerConfig",
    "BrokerService",
    "Session",
]

DEFAULT_PORT = 6650
DEFAULT_HTTP_PORT = 8080
DEFAULT_MAX_MESSAGE_SIZE = wire.DEFAULT_MAX_MESSAGE_SIZE
DEFAULT_ENSEMBLE_SIZE = 3
DEFAULT_WRITE_QUORUM = 2
DEFAULT_ACK_QUORUM = 2
DEFAULT_ENSEMBLE_CHANGE_TIMEOUT_S = 5.0
DEFAULT_TICK_INTERVAL_S = 5.0
#: how long a reader's subscription outlives its consumer after a seek: the C++ client resubscribes a reader that
#: sought a time without a start message id, and comes back to it at the position sought (as to Pulsar's, which
#: keeps it over a cursor reset)
READER_SEEK_GRACE_S = 60.0
#: how long the ownership a LOOKUP took of a topic nobody opened here is held before it is released
DEFAULT_LOOKUP_OWNERSHIP_HOLD_S = 60.0
#: how often the ownership directories of deleted namespaces are looked for and removed where empty (and once at
#: the start): those of a namespace deleted while a broker killed -9 held an ownership in it stayed for good
DEFAULT_OWNERSHIP_TIDY_INTERVAL_S = 300.0
#: topics one connection's PRODUCERs and SUBSCRIBEs open at once (the others wait their turn): each open is a
#: series of ZooKeeper and bookie requests, and those of a thousand opens at once, queued together, held every
#: other connection's open of a new topic until the last of them was done
TOPIC_OPENS_PER_CONNECTION = 16
DEFAULT_DEDUP_ENABLED = True
#: Pulsar's ``brokerServiceCompactionThresholdInBytes`` (0: no automatic compaction unless a policy asks) and
#: ``brokerServiceCompactionMonitorIntervalInSeconds``
DEFAULT_COMPACTION_THRESHOLD_BYTES = 0
DEFAULT_COMPACTION_MONITOR_INTERVAL_S = 60.0
#: Pulsar's ``messageExpiryCheckIntervalInMinutes`` (5): how often an owner applies its namespaces' message TTL
DEFAULT_MESSAGE_EXPIRY_CHECK_INTERVAL_S = 300.0
#: Pulsar's ``subscriptionExpiryCheckIntervalInMinutes`` (5): how often an owner deletes the subscriptions idle
#: longer than their namespace's ``subscription_expiration_time_minutes``
DEFAULT_SUBSCRIPTION_EXPIRY_CHECK_INTERVAL_S = 300.0
#: Pulsar's ``ttlDurationDefaultInSeconds`` (0: none): the message TTL of a topic where neither the topic nor its
#: namespace sets one
DEFAULT_TTL_DURATION_S = 0
#: Pulsar's ``maxNumPartitionsPerPartitionedTopic`` (Pulsar's default 0, no limit): the partitions a partitioned
#: topic may have, checked where a count is set (docs/broker.md). Each partition is a managed ledger created as the
#: count is set, one ZooKeeper write each (about 500 a second), and a client opens a producer or consumer on each:
#: 1024 is a few seconds of writes and beyond what a topic needs; 0 turns the limit off
DEFAULT_MAX_PARTITIONS_PER_TOPIC = 1024
#: A topic opened again right after this broker stopped serving it waits up to this long for the old instance's
#: close (BrokerService.get_topic)
CLOSE_WAIT_S = 10.0
#: a Failover subscription sends nothing for this long after its active consumer changed (Pulsar's
#: activeConsumerFailoverDelayTimeMillis, 1000 by default), so that consumers reconnecting together after an owner
#: change are not each sent the backlog in turn
FAILOVER_SWITCH_DELAY_S = 1.0
INT64_MAX = 2**63 - 1
#: ``Schema.Type.None``: what a bytes producer would declare (it declares no schema at all)
SCHEMA_NONE = 0
#: ``Schema.Type.AutoConsume`` of newer protocol files (not in ours): a consumer taking whatever the topic has
SCHEMA_AUTO_CONSUME = 21
#: The actions a namespace permission grants (Pulsar's AuthAction names we enforce).
PRODUCE = "produce"
CONSUME = "consume"
EITHER = (PRODUCE, CONSUME)
#: The answer to a topic name we refuse (malformed, ``non-persistent://``). Not ``InvalidTopicName``: the C++-based
#: clients (Python's ``pulsar-client``) retry that one until their operation timeout, so the user would see only
#: ``Timeout``; ``NotAllowedError`` fails the call at once, and the message says what is wrong with the name.
BAD_NAME = pb.NotAllowedError
#: Ranges of sequence ids a producer's stored sends jumped over that a topic remembers (``Topic.skipped_ids``):
#: each delayed message a batching producer sends ahead of its batch leaves one, so that many fit in one batch
#: window (the client's default batching_max_messages); with 16, 40 of them left the batch's first id forgotten
SKIPPED_IDS_MAX = 1000
#: Producer names a topic remembers skipped ids of (the oldest forgotten first); a name whose ids are all filled
#: is forgotten at once
SKIPPED_IDS_PRODUCERS_MAX = 1000
#: A producer's newest skipped-id ranges kept in the topic's properties (``dedup-skipped/<producer>``, written with
#: the ledger list at each rollover and at a clean close), so that the next owner after a restart, an unload or a
#: move still stores the batch that fills them
SKIPPED_IDS_PERSISTED_MAX = 64
#: The property prefix of a producer's persisted skipped ids: ``lo-hi,lo-hi,…`` (empty: none)
SKIPPED_IDS_PROPERTY = "dedup-skipped/"
#: Positions of orphaned chunks a topic remembers (``Topic.orphans``, the newest kept) and keeps in its properties
#: (``chunk-orphans``: ``ledger:entry,…``)
ORPHAN_CHUNKS_MAX = 256
ORPHAN_CHUNKS_PROPERTY = "chunk-orphans"
#: Bytes one dispatcher read takes at most, by the topic's average entry size (Pulsar's
#: ``dispatcherMaxReadSizeBytes``): what a consumer is sent beyond its connection's high-water mark
READ_BYTES_MAX = 5 * 1024 * 1024
#: Bytes of SENDs one connection's producers have outstanding (read, not yet answered) over which the connection
#: is not read, until under half of it (as Pulsar's ``maxPendingPublishRequestsPerConnection``): a producer that
#: pipelines SENDs faster than they are stored holds this, not all it sent
PUBLISH_BYTES_MAX = 32 * 1024 * 1024
#: Requests of one connection being answered at once (lookups, topic lists, schemas, PRODUCERs, SUBSCRIBEs, ...:
#: those whose answer waits on ZooKeeper, the bookies or a topic). Beyond it, and while the connection takes nothing
#: more (its unsent bytes over the transport's high-water mark), the requests read are held, in order, and the
#: connection is not read until they are begun: a peer that pipelines requests and reads no answer holds this many
#: answers, not one per request it wrote (Pulsar's broker bounds lookups with ``maxConcurrentLookupRequest``)
REQUESTS_IN_FLIGHT_MAX = 1000
#: Of those, at most this many whose answer's size has no bound (a namespace's topics, a topic's schema): the 1,000
#: begun at once queued their answers all the same once the connection took nothing more, 1,000 times a namespace's
#: topic list (132 MB measured for 2,000 topics; it grows with the namespace) for a peer that reads none
LARGE_ANSWERS_IN_FLIGHT_MAX = 8
#: The handlers of those requests
LARGE_ANSWER_HANDLERS = frozenset({"on_get_topics_of_namespace", "on_get_schema"})
#: A connection the broker closes has this long to take what was queued for it (an ERROR, a PING) before it is cut:
#: one whose peer reads nothing kept its socket, its unsent bytes and its consumers (their messages unacked) for ever
CLOSE_GRACE_S = 10.0
#: How long a connection holding a producer's name has to answer a PING when a producer of that name connects
#: again (Pulsar's connectionLivenessCheckTimeoutMillis): silent, it is taken for dead and closed
PRODUCER_LIVENESS_TIMEOUT_S = 5.0
_publish_pauses = RateLimitedLog(log, 5.0)
_request_holds = RateLimitedLog(log, 5.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerConfig:
    zk: str = "127.0.0.1:2181"
    zk_root: str = "/ledgerstore"
    port: int = DEFAULT_PORT
    http_port: int = DEFAULT_HTTP_PORT
    listen_address: str = "0.0.0.0"
    advertised_address: str = "127.0.0.1"
    broker_id: str | None = None
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    ensemble_size: int = DEFAULT_ENSEMBLE_SIZE
    write_quorum: int = DEFAULT_WRITE_QUORUM
    ack_quorum: int = DEFAULT_ACK_QUORUM
    managed_ledger_password: bytes = b""
    max_entries_per_ledger: int = 50_000
    min_rollover_time_s: float = 10 * 60.0
    max_rollover_time_s: float = 4 * 3600.0
    dedup_enabled: bool = DEFAULT_DEDUP_ENABLED
    tick_interval_s: float = DEFAULT_TICK_INTERVAL_S
    compaction_threshold_bytes: int = DEFAULT_COMPACTION_THRESHOLD_BYTES
    compaction_monitor_interval_s: float = DEFAULT_COMPACTION_MONITOR_INTERVAL_S
    message_expiry_check_interval_s: float = DEFAULT_MESSAGE_EXPIRY_CHECK_INTERVAL_S
    subscription_expiry_check_interval_s: float = DEFAULT_SUBSCRIPTION_EXPIRY_CHECK_INTERVAL_S
    ttl_duration_default_s: int = DEFAULT_TTL_DURATION_S
    max_partitions_per_topic: int = DEFAULT_MAX_PARTITIONS_PER_TOPIC  # 0: no limit
    # Pulsar's forceDeleteNamespaceAllowed and forceDeleteTenantAllowed (false by default there too): a DELETE with
    # ?force=true deletes every topic (their data) under the namespace or tenant, so it is refused (405) unless on
    force_delete_namespace_allowed: bool = False
    force_delete_tenant_allowed: bool = False
    zk_session_timeout_s: float = 10.0
    # How long the broker's ledger client tries to replace a failed bookie of a topic's ledger before it fails
    # the ledger's appends, and the topic rolls over to a new ledger (docs/broker.md, "Bookies failing")
    ensemble_change_timeout_s: float = DEFAULT_ENSEMBLE_CHANGE_TIMEOUT_S
    # Authentication (docs/broker.md, "Authentication and authorization"): the HS256 secret tokens are checked
    # with (None: no authentication at all), whether a connection must carry one (and produce/consume then
    # need a permission), the roles allowed everything, whether admin reads need a token too
    auth_secret: bytes | None = None
    auth_previous_secret: bytes | None = None  # during a rotation: tokens it signed are still taken
    auth_required: bool = False
    superuser_roles: tuple[str, ...] = ()
    admin_read_auth: bool = False
    # The token the broker's own ledger client sends to bookies (None: $LEDGERSTORE_AUTH_TOKEN[_FILE])
    bookie_auth_token: str | None = None
    # TLS on a second Pulsar port (Pulsar's brokerServicePortTls, tlsCertificateFilePath, tlsKeyFilePath), beside
    # the plaintext one: None serves no TLS (docs/broker.md, "TLS")
    tls_port: int | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # Client certificates on that port (Pulsar's tlsTrustCertsFilePath, tlsRequireTrustedClientCertOnConnect): the
    # CA they are verified against (None: none asked for), whether one is required; the files read again every
    # so often on the housekeeping (tlsCertRefreshCheckDurationSec; topic_broker/tls.py)
    tls_trust_certs_file: str | None = None
    tls_require_trusted_client_cert: bool = False
    tls_cert_refresh_check_s: float = 300.0
    # TLS on the admin HTTP port too (Pulsar's webServicePortTls), with the same certificate: None serves none
    admin_tls_port: int | None = None
    # How long the ownership a lookup took of a topic not opened here is kept (docs/broker.md, "Housekeeping and
    # ownership rules"): released at the first housekeeping tick after, unless a client opened the topic
    lookup_ownership_hold_s: float = DEFAULT_LOOKUP_OWNERSHIP_HOLD_S
    # How often the ownership directories of namespaces that no longer exist are removed where empty (and once
    # at the start; BrokerMetadataStore.tidy_ownership_dirs)
    ownership_tidy_interval_s: float = DEFAULT_OWNERSHIP_TIDY_INTERVAL_S

    @property
    def id(self) -> str:
        return self.broker_id or f"{self.advertised_address}:{self.port}"

    @property
    def service_url(self) -> str:
        return f"pulsar://{self.advertised_address}:{self.port}"

    @property
    def service_url_tls(self) -> str:
        """``pulsar+ssl://`` URL of the TLS port (Pulsar's brokerServiceUrlTls), "" where there is none."""
        return f"pulsar+ssl://{self.advertised_address}:{self.tls_port}" if self.tls_port is not None else ""

    @property
    def web_service_url(self) -> str:
        return f"http://{self.advertised_address}:{self.http_port}"

    @property
    def web_service_url_tls(self) -> str:
        """``https://`` URL of the admin's TLS port (Pulsar's webServiceUrlTls), "" where there is none."""
        port = self.admin_tls_port
        return f"https://{self.advertised_address}:{port}" if port is not None else ""

    def ml_config(self) -> ManagedLedgerConfig:
        return ManagedLedgerConfig(
            ensemble_size=self.ensemble_size,
            write_quorum=self.write_quorum,
            ack_quorum=self.ack_quorum,
            password=self.managed_ledger_password,
            max_entries_per_ledger=self.max_entries_per_ledger,
            min_rollover_time_s=self.min_rollover_time_s,
            max_rollover_time_s=self.max_rollover_time_s,
        )


def lookup_answer(request_id: int, owner: OwnershipInfo, *, tls: bool) -> bytes:
    """LOOKUP_RESPONSE sending the client to ``owner``: both its URLs, as Pulsar's broker answers (the client takes
    brokerServiceUrlTls when it connected with pulsar+ssl://). A client over TLS is never sent to a plaintext port:
    an owner without a TLS port fails its lookup (ServiceNotReady, the client looks up again until its operation
    timeout, as while a topic moves)."""
    if tls and not owner.service_url_tls:
        why = f"the owner of this topic, broker {owner.broker_id}, serves no TLS port (its --tls-port is not set)"
        return wire.lookup_response(request_id, error_code=pb.ServiceNotReady, message=why)
    return wire.lookup_response(
        request_id, broker_service_url=owner.service_url, broker_service_url_tls=owner.service_url_tls or None
    )


class NotOwnerError(Exception):
    def __init__(self, owner: OwnershipInfo) -> None:
        super().__init__(f"topic owned by {owner.broker_id}")
        self.owner = owner


#: Pulsar's text for a topic whose tenant or namespace does not exist (its broker's ``RestException`` 404, which
#: LOOKUP and PARTITIONED_METADATA answer as ``TopicNotFound``); the client raises ``TopicNotFound`` at once.
NAMESPACE_NOT_FOUND = "Namespace not found"


class NamespaceNotFoundError(Exception):
    """A topic of a tenant or namespace that was never created (or was deleted): refused, as Pulsar does, so
    that a typo in a name does not quietly create a topic nobody reads."""

    def __init__(self, name: TopicName) -> None:
        super().__init__(f"{NAMESPACE_NOT_FOUND}: {name.namespace_name} (topic {name})")
        self.name = name


def _save_attached_activity(topic: Topic, expiration_minutes: int, now_ms: int) -> None:
    """The subscription expiration's record of activity kept for the next owner: each subscription of ``topic``
    with consumers attached has its cursor's ``last_active_ms`` saved once older than half ``expiration_minutes``
    (at each housekeeping tick, and at the expiry check). The times a check saw consumers are this broker's, and
    another owner (or this one serving the topic again) reads the cursor's, which only an acknowledgement moves
    otherwise: a consumer attached for long without acknowledging had its subscription deleted when the topic
    moved before it reconnected. Saved at the expiry check only (every 300 s by default), it was older than an
    expiration of a few minutes at such a move."""
    for rt in topic.subscriptions.values():
        cursor = rt.cursor
        if (
            rt.consumers
            and cursor is not None
            and now_ms - cursor.last_active_ms > expiration_minutes * 30_000
        ):
            cursor.touch()


def past_partition_limit(n: int, limit: int) -> bool:
    """Whether a count of ``n`` partitions is past ``--max-partitions-per-topic`` ``limit`` (0: no limit): as
    Pulsar's ``maxNumPartitionsPerPartitionedTopic``, a count equal to the limit is taken."""
    return limit > 0 and n > limit


class PartitionLimitError(Exception):
    """A topic a client names that its namespace's ``autoTopicCreation`` would create partitioned with more
    partitions than this broker's ``--max-partitions-per-topic`` (a policy set on a broker with a higher limit,
    or before the limit was lowered): not created, as Pulsar refuses it."""

    def __init__(self, name: TopicName, n: int, limit: int) -> None:
        super().__init__(
            f"Number of partitions should be less than or equal to {limit}: the autoTopicCreation of namespace "
            f"{name.namespace_name} would create {name} with {n} partitions, past --max-partitions-per-topic "
            f"{limit}; nothing created (set the namespace's defaultNumPartitions to {limit} or fewer)"
        )


class SubscriptionsLimitError(Exception):
    """A new subscription (a reader's too) past its topic's namespace's ``maxSubscriptionsPerTopic``: not
    created, as Pulsar refuses it (NotAllowedError to a SUBSCRIBE, 412 to the admin's create)."""

    def __init__(self, name: TopicName) -> None:
        super().__init__(f"Exceed the maximum number of subscriptions of the topic: {name}")


class TopicDeletingError(Exception):
    """An open of a topic whose delete is still under way after CLOSE_WAIT_S: refused, to be tried again (a
    client's ServiceNotReady, the admin's 503), rather than opened on the ledger list being deleted."""

    def __init__(self, name: TopicName) -> None:
        super().__init__(f"{name} is being deleted; try again")
        self.name = name


class TopicNotFoundError(Exception):
    """A topic that does not exist, named by a client in a namespace whose ``autoTopicCreation`` does not let
    it be created (Pulsar's TopicNotFound "Topic does not exist")."""

    def __init__(self, name: TopicName) -> None:
        super().__init__(
            f"Topic {name} does not exist (the namespace's autoTopicCreation does not allow creating it)"
        )
        self.name = name


# ------------------------------------------------------------------------------------------------------------
# per connection


@dataclass(slots=True, eq=False)
class _Creation:
    """A PRODUCER or SUBSCRIBE being handled (its topic opened, a schema stored, a liveness check...)."""

    #: a CLOSE_PRODUCER or CLOSE_CONSUMER of its id came meanwhile: it ends without the producer or consumer
    closed: bool = False
    #: set when its handling ends (:meth:`_Creations.ended`)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class _Creations:
    """A connection's producers (or consumers) being created, by id, as Pulsar's ``ServerCnx`` keeps each id's
    future before it is complete: a close of the id while one is created ends it closed, and another request of
    the id meanwhile is refused (:meth:`busy`). Begun as the command is read (before the connection's next
    command is handled), ended when its handling ends."""

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        self._by_id: dict[int, _Creation] = {}

    def busy(self, id_: int) -> bool:
        """A creation of ``id_`` is under way (and not closed)."""
        return id_ in self._by_id

    def run(self, id_: int, create: Callable[[_Creation], Awaitable[None]]) -> Coroutine[Any, Any, None]:
        """A creation of ``id_`` (not :meth:`busy`) begun now: the coroutine that awaits ``create`` of it and then
        ends it."""
        c = self._by_id[id_] = _Creation()
        return self._run(id_, c, create(c))

    async def _run(self, id_: int, c: _Creation, work: Awaitable[None]) -> None:
        try:
            await work
        finally:
            c.done.set()
            if self._by_id.get(id_) is c:
                del self._by_id[id_]

    async def ended(self, id_: int) -> None:
        """Returns once the creation of ``id_`` under way (if any) has ended."""
        c = self._by_id.get(id_)
        if c is not None:
            await c.done.wait()

    def close(self, id_: int) -> None:
        """The id is closed: what is being created under it ends without its producer or consumer, and the id is
        free for a new request."""
        c = self._by_id.pop(id_, None)
        if c is not None:
            c.closed = True


class Session:
    """One client connection: its protocol state, producers and consumers. Writes are coalesced: everything
    produced during one event-loop iteration leaves in one ``transport.write``."""

    def __init__(self, service: BrokerService, transport: Any, peer: str) -> None:
        self.service = service
        self.transport = transport
        self.peer = peer
        self.conn = ProtocolConnection(service.conn_config, time.monotonic())
        self.producers: dict[int, Producer] = {}
        self.consumers: dict[int, Consumer] = {}
        self.waiting: dict[int, Topic] = {}  # WaitForExclusive producers queued, by producer id
        #: PRODUCERs and SUBSCRIBEs being handled, by producer and consumer id
        self.creating_producers = _Creations()
        self.creating_consumers = _Creations()
        #: its PRODUCERs' and SUBSCRIBEs' opens of topics not served here yet, at most TOPIC_OPENS_PER_CONNECTION
        #: at once: one connection's flood of new topics must not stand before every other connection's open
        self.topic_opens = asyncio.Semaphore(TOPIC_OPENS_PER_CONNECTION)
        self.closed_by_quota: dict[int, bool] = {}  # producer ids closed by a backlog quota or a terminate
        self._flush_scheduled = False
        self.closed = False
        #: the transport's unsent bytes are under its high-water mark (asyncio's pause_writing/resume_writing)
        self.writable = True
        #: not read: its producers' outstanding SENDs are over PUBLISH_BYTES_MAX (:meth:`check_publishing`)
        self.publish_paused = False
        #: bytes of its producers' outstanding SENDs, kept as they come and go (exact at each check)
        self.publish_bytes = 0
        #: called when :attr:`publish_paused` or :attr:`held` changes (the protocol pauses or resumes reading)
        self.reading_changed: Callable[[], None] = lambda: None
        #: requests being answered (spawned), at most REQUESTS_IN_FLIGHT_MAX
        self.in_flight = 0
        #: of those, the ones whose answer may be large (LARGE_ANSWER_HANDLERS), at most LARGE_ANSWERS_IN_FLIGHT_MAX
        self.large_in_flight = 0
        #: requests read while REQUESTS_IN_FLIGHT_MAX were being answered or the connection took nothing more, and
        #: every request read after them: begun in order as that ends; the connection is not read meanwhile
        self.held: deque[Request] = deque()
        #: the liveness check in progress (:meth:`answers_ping`), the frames received when it began, its timer
        self._liveness: asyncio.Future[bool] | None = None
        self._liveness_frames = 0
        self._liveness_timer: asyncio.TimerHandle | None = None

    def set_writable(self, writable: bool) -> None:
        """The transport's buffer went over its high-water mark (False) or drained below its low-water mark: a
        consumer of a connection that does not take more is sent nothing more until it does, so what a peer that
        reads slowly or not at all is sent stays within the mark plus a read in flight, whatever its permits."""
        if self.writable == writable:
            return
        self.writable = writable
        for c in list(self.consumers.values()):
            c.sub.execute(c.sub.core.set_writable(c.sub_key, writable))
        if writable and self.held:
            self.run_held()

    def check_publishing(self) -> None:
        """Pause reading while the producers' outstanding SENDs hold over ``PUBLISH_BYTES_MAX``; resume under half
        of it (as their receipts leave, or a producer goes)."""
        pending = self.publish_bytes = sum(p.pending_bytes for p in self.producers.values())
        paused = pending > (PUBLISH_BYTES_MAX // 2 if self.publish_paused else PUBLISH_BYTES_MAX)
        if paused == self.publish_paused:
            return
        self.publish_paused = paused
        if paused:
            _publish_pauses.log(
                logging.INFO,
                "connection %s: its producers' SENDs not yet answered hold %d bytes (at most %d): not read "
                "until under half",
                self.peer,
                pending,
                PUBLISH_BYTES_MAX,
            )
        self.reading_changed()

    def send(self, frame: bytes) -> None:
        self.conn.send_raw(frame)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        frames = self.conn.take_frames()
        if frames and not self.closed:
            self.transport.writelines(frames)
        if self.conn.closed and not self.closed:
            log.info("connection %s closed by the broker: %s", self.peer, self.conn.close_reason)
            self.closed = True
            self.transport.close()  # once what is queued is written...
            asyncio.get_running_loop().call_later(CLOSE_GRACE_S, self.transport.abort)  # ... or cut

    def data_received(self, data: bytes) -> None:
        requests = self.conn.receive_data(data, time.monotonic())
        if self._liveness is not None and self.conn.frames_received > self._liveness_frames:
            self._liveness_ends(True)  # any frame is a sign of life, the PONG or not
        held = bool(self.held)
        for req in requests:
            if self.held or not self._may_begin(req):
                self.held.append(req)  # (and every request after it, in order)
            elif not self._begin(req):
                break
        if self.held and not held:
            _request_holds.log(
                logging.INFO,
                "connection %s: %d requests being answered%s: the next ones wait their turn, not read until begun",
                self.peer,
                self.in_flight,
                "" if self.writable else ", and it takes no more of what it is sent",
            )
            self.reading_changed()
        self.flush()

    def _may_begin(self, req: Request) -> bool:
        if req.handler in LARGE_ANSWER_HANDLERS and self.large_in_flight >= LARGE_ANSWERS_IN_FLIGHT_MAX:
            return False
        return self.in_flight < REQUESTS_IN_FLIGHT_MAX and self.writable

    def _begin(self, req: Request) -> bool:
        """Handles ``req``, its answer spawned if it has to wait; False if it failed (the connection is closed)."""
        try:
            result = getattr(self.service, req.handler)(self, req)
        except Exception:
            log.exception("connection %s: %s failed", self.peer, req.handler)
            self.conn.close(f"internal error in {req.handler}")
            return False
        if result is not None:
            self.in_flight += 1
            if req.handler in LARGE_ANSWER_HANDLERS:
                self.large_in_flight += 1
            self.service.spawn(self._guard(result, req.handler))
        return True

    def run_held(self) -> None:
        """Begins the requests held, in order, as far as :meth:`_may_begin` lets; reads again once none is left."""
        while self.held and not (self.closed or self.conn.closed) and self._may_begin(self.held[0]):
            if not self._begin(self.held.popleft()):
                break
        if self.closed or self.conn.closed:
            self.held.clear()
        if not self.held:
            self.reading_changed()
        self.flush()

    async def _guard(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        try:
            await self._answer(coro, what)
        finally:
            self.in_flight -= 1
            if what in LARGE_ANSWER_HANDLERS:
                self.large_in_flight -= 1
            if self.held:
                self.run_held()

    async def _answer(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        try:
            await coro
        except zk.MetadataConnectionError as e:
            # ZooKeeper unreachable (an outage, not a bug): one line; closing the connection makes the client
            # reconnect and retry, as Pulsar's clients do on ServiceNotReady
            log.warning("connection %s: %s: ZooKeeper unavailable (%s); closing it", self.peer, what, e)
            self.conn.close(f"ZooKeeper unavailable in {what}")
            self.flush()
        except Exception:
            log.exception("connection %s: %s failed", self.peer, what)
            self.conn.close(f"internal error in {what}")  # the client reconnects and retries
            self.flush()

    def tick(self, now: float) -> None:
        # not read while its producers' SENDs wait for the bookies (unless it takes nothing either): its PONGs are
        # not seen then, and the keep-alive would close a healthy client's connection
        self.conn.tick(
            now, time.time(), read=not ((self.publish_paused or bool(self.held)) and self.writable)
        )
        if self.publish_paused:
            self.check_publishing()  # (a producer gone with SENDs never answered: its topic unloaded)
        if self.conn.has_data_to_send or self.conn.closed:
            self.flush()

    async def answers_ping(self, timeout_s: float) -> bool:
        """Whether the peer shows a sign of life (any frame, the PONG to a PING sent now) within ``timeout_s``;
        True when it cannot tell (the connection is not read for now, as :meth:`tick` says). One check at a time
        per connection, as Pulsar's ``ServerCnx.checkConnectionLiveness``: the first caller sends the PING, and
        callers that come while it waits share its answer (the rest of its ``timeout_s``)."""
        if self.closed or self.conn.closed:
            return False
        if (self.publish_paused or self.held) and self.writable:
            return True
        check = self._liveness
        if check is None:
            loop = asyncio.get_running_loop()
            check = self._liveness = loop.create_future()
            self._liveness_frames = self.conn.frames_received
            self._liveness_timer = loop.call_later(timeout_s, self._liveness_ends, None)
            self.send(wire.ping())
        return await asyncio.shield(check)  # (a caller cancelled leaves the others their answer)

    def _liveness_ends(self, alive: bool | None) -> None:
        """The liveness check in progress ends: a frame came (True), the connection is gone (False), or its time
        is up (None): False, unless the connection is not read for now (True, it cannot tell): its producers'
        SENDs or its held requests stopped the reading (after the PING was sent, maybe), and it takes what it is
        sent. A check whose connection held requests once its PING was out answered False, the PONG unseen."""
        check, self._liveness = self._liveness, None
        if self._liveness_timer is not None:
            self._liveness_timer.cancel()
            self._liveness_timer = None
        if check is None or check.done():
            return
        if alive is None:
            alive = (
                (self.publish_paused or bool(self.held))
                and self.writable
                and not (self.closed or self.conn.closed)
            )
        check.set_result(alive)

    def close_dead(self, why: str) -> None:
        """Close the connection and let go of its producers and consumers now, not when the transport reports
        it lost (a half-open connection's may come much later)."""
        self.conn.close(why)
        self.flush()
        self.connection_lost()

    def connection_lost(self) -> None:
        self.closed = True
        self._liveness_ends(False)
        self.waiting.clear()
        self.held.clear()
        for p in list(self.producers.values()):
            p.topic.remove_producer(p)
        self.producers.clear()
        for c in list(self.consumers.values()):
            c.sub.remove_consumer(c)
        self.consumers.clear()


# ------------------------------------------------------------------------------------------------------------
# producers and topics


@dataclass(slots=True)
class _Receipt:
    sequence_id: int
    highest_sequence_id: int
    position: Position | None = None
    error: str | None = None
    error_code: pb.ServerError = pb.PersistenceError  # the SEND_ERROR's code when ``error`` is set
    done: bool = False
    started: float = 0.0  # time.monotonic() at the SEND's arrival (publish latency)
    messages: int = 1
    size: int = 0
    dedup: bool = True  # its sequence id takes part in deduplication (false for a chunk before the last)
    dedup_id: int = -1  # the id deduplication keeps for it (dedup_sequence_id)
    #: the skipped ids it fills (Topic.fills_skipped_id): put back if its write fails
    fills: tuple[tuple[int, int], ...] = ()
    chunk: wire.Chunk | None = None  # a chunk's (uuid, chunk id, chunks of its message)


def dedup_sequence_id(sequence_id: int, highest: int | None, num_messages: int, entry: bytes) -> int:
    """The id deduplication keeps for a SEND (or stored entry) of ``num_messages`` from ``sequence_id`` on: the
    highest id it declares (the Java client); else, for a batch whose messages are numbered one after the
    other, its last message's (a C++-based client declares only the first); else its first (Pulsar's rule).
    With key-based batching a batch's ids are not consecutive: key A's batch holds 0, 2, 4, 5, key B's 1, 3,
    sent after it in the order of their first ids, so taking A's end for 0 + 4 - 1 = 3 dropped B as a resend,
    acknowledged and never stored."""
    found = dedup_walk(sequence_id, highest, num_messages, entry)
    return found if isinstance(found, int) else found()


def dedup_walk(
    sequence_id: int,
    highest: int | None,
    num_messages: int,
    entry: bytes,
    walked: tuple[int | None] | None = None,
) -> int | Callable[[], int]:
    """:func:`dedup_sequence_id`'s id, or, when it takes inflating a compressed batch over
    ``wire.INFLATE_ON_LOOP_MAX`` (``wire.batch_walk_off_loop``), the walk that finds it: a function of no
    arguments, for a worker thread (up to 5 MiB inflated, ~17 ms, would block the event loop). ``walked``: the
    batch's ``wire.batch_last_sequence_id`` (in a 1-tuple) when it was walked already, not walked again."""
    if highest is not None:
        return max(sequence_id, highest)
    end = sequence_id + max(num_messages, 1) - 1
    if end == sequence_id:
        return sequence_id
    if walked is not None:
        return end if walked[0] == end else sequence_id
    try:
        md, payload = wire.parse_entry(entry, verify_checksum=False)
    except wire.EntryFormatError:
        return sequence_id
    if not md.HasField("num_messages_in_batch"):
        return sequence_id

    def walk() -> int:
        try:
            last = wire.batch_last_sequence_id(md, payload)
        except wire.EntryFormatError:
            return sequence_id
        return end if last == end else sequence_id

    return walk if wire.batch_walk_off_loop(md) else walk()


_LO, _HI = operator.itemgetter(0), operator.itemgetter(1)  # a range's ends, as bisect's keys


def subtract_ranges(
    ranges: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """The ids of ``ranges`` that none of ``spans`` covers, as ranges in ``merge_ranges``'s form: one pass over
    both, merged and sorted."""
    out: list[tuple[int, int]] = []
    cuts = merge_ranges(spans)
    k = 0
    for lo, hi in merge_ranges(ranges):
        while k < len(cuts) and cuts[k][1] < lo:
            k += 1
        j = k
        while lo <= hi and j < len(cuts) and cuts[j][0] <= hi:
            if cuts[j][0] > lo:
                out.append((lo, cuts[j][0] - 1))
            lo = max(lo, cuts[j][1] + 1)
            j += 1
        if lo <= hi:
            out.append((lo, hi))
    return out


@dataclass(slots=True)
class _HeldSend:
    send: pb.CommandSend
    entry: bytes
    num_messages: int
    dedup: bool
    dedup_id: int | Callable[[], int]  # (dedup_walk's answer)
    started: float
    chunk: wire.Chunk | None


@dataclass(slots=True, eq=False)
class Producer:
    session: Session
    producer_id: int
    name: str
    topic: Topic
    exclusive: bool = False
    #: what the stats show of it (Pulsar's ``accessMode``, ``metadata``: the PRODUCER's properties)
    access_mode: int = pb.Shared
    metadata: dict[str, str] = field(default_factory=dict)
    #: what it published (Pulsar's ``msgRateIn``, ``msgThroughputIn``, ``averageMsgSize``)
    counters: ClientCounters = field(default_factory=ClientCounters)
    receipts: deque[_Receipt] = field(default_factory=deque)
    closed: bool = False
    #: SENDs held behind a batch whose dedup walk runs in a worker thread (``Topic.publish``), in their order
    held: deque[_HeldSend] = field(default_factory=deque)
    #: bytes of its SENDs read and not yet answered (``Session.check_publishing``)
    pending_bytes: int = 0

    def flush_receipts(self) -> None:
        q = self.receipts
        session = self.session
        while q and q[0].done:
            r = q.popleft()
            self.pending_bytes -= r.size
            session.publish_bytes -= r.size
            if self.closed:
                continue
            if r.error is not None:
                self.session.send(wire.send_error(self.producer_id, r.sequence_id, r.error_code, r.error))
            else:
                pos = r.position or Position(-1, -1)
                self.session.send(
                    wire.send_receipt(
                        self.producer_id,
                        r.sequence_id,
                        pos.ledger_id,
                        pos.entry_id,
                        highest_sequence_id=r.highest_sequence_id,
                    )
                )
        if session.publish_paused:
            session.check_publishing()


@dataclass(slots=True, eq=False)
class _WaitingProducer:
    session: Session
    cmd: pb.CommandProducer
    name: str
    schema_version: bytes | None


@dataclass(slots=True, eq=False)
class Consumer:
    session: Session
    consumer_id: int
    name: str
    sub: SubscriptionRuntime
    sub_key: int = -1
    #: the consumer's properties (SUBSCRIBE ``metadata``), shown in stats as Pulsar's ``metadata``
    metadata: dict[str, str] = field(default_factory=dict)
    #: what was dispatched to it (Pulsar's ``msgOutCounter``, ``bytesOutCounter``, ``msgRateOut`` …)
    counters: ClientCounters = field(default_factory=ClientCounters)
    #: Unix ms of its last ack, of the last messages sent to it, of its last FLOW (0: none yet), Pulsar's
    #: ``lastAckedTimestamp``, ``lastConsumedTimestamp`` and ``lastConsumedFlowTimestamp``
    last_acked_ms: int = 0
    last_consumed_ms: int = 0
    last_flow_ms: int = 0


def _consumer_rates(c: Consumer, now: float | None = None) -> dict[str, float]:
    redelivered = c.sub.core.redelivered_messages(c.sub_key)
    return {
        **c.counters.sampled("Out", now),
        "msgRateRedeliver": c.counters.rates.rate("redeliver", redelivered, now),
    }


def _key_hash_ranges(core: Subscription, key: int) -> dict[str, list[str]]:
    """A Key_Shared consumer's ``keyHashRanges`` as Pulsar's stats write them (``["[0, 1234]", ...]``); nothing
    for a consumer of another type."""
    if core.sub_type != SubType.KEY_SHARED:
        return {}
    return {"keyHashRanges": [f"[{start}, {end}]" for start, end in core.key_hash_ranges(key)]}


def _client_stats(session: Session, counters: ClientCounters) -> dict[str, str]:
    """What Pulsar's stats say of a producer's or consumer's connection (``/127.0.0.1:54321`` as Java writes a
    socket address)."""
    return {
        "address": f"/{session.peer}",
        "connectedSince": wire.pulsar_date(counters.connected_since_ms),
        "clientVersion": session.conn.client_version,
    }


class SubscriptionRuntime:
    """Executes a :class:`Subscription`'s commands: reads from the managed ledger, MESSAGE frames to consumers."""

    def __init__(
        self, topic: Topic, name: str, core: Subscription, cursor: ManagedCursor | None, start: Position
    ) -> None:
        self.topic = topic
        self.name = name
        self.core = core
        self.cursor = cursor  # None for a non-durable (reader) subscription
        self.consumers: dict[int, Consumer] = {}
        self._next_key = itertools.count()
        self._by_key: dict[int, Consumer] = {}
        core.read_position = start
        if cursor is not None:
            core.restore_batch_acks(cursor.cursor.batch_acked.items())
        self.mark_delete: Position = cursor.mark_delete if cursor else self._before(start)
        self._delay_timer: asyncio.TimerHandle | None = None
        self._delay_timer_at = 0  # Unix ms the timer is set for
        #: a reader's subscription kept by its latest seek: the timer that drops it if its reader does not come back
        self._seek_grace: asyncio.TimerHandle | None = None
        #: a consumer subscribed with read_compacted: reads up to the compaction horizon come from the
        #: compacted ledger (``_read_compacted``)
        self.read_compacted = False
        #: Unix ms of the last ack, messages sent and FLOW of any of its consumers while served here (0: none)
        self.last_acked_ms = 0
        #: Unix ms its last consumer left it here (0: none did), Pulsar's ``updateLastActive`` on a consumer's
        #: removal: the subscription expiration counts its inactivity from then at the earliest
        self.idle_since_ms = 0
        self.last_consumed_ms = 0
        self.last_flow_ms = 0
        #: consumer key -> uuid of a message whose orphaned chunks it was sent (:meth:`_restarts_chunks`)
        self._chunk_restarts: dict[int, str] = {}

    @property
    def durable(self) -> bool:
        return self.cursor is not None

    def add_consumer(
        self,
        c: Consumer,
        sub_type: SubType,
        priority: int,
        ranges: list[tuple[int, int]],
        sticky: bool = False,
        out_of_order: bool = False,
    ) -> None:
        key = next(self._next_key)
        cursor = self.cursor
        if cursor is not None and cursor.moved and not self.consumers:
            cursor.moved = False  # moved in ZooKeeper while idle: start over from where it stands now
            self.core.reset(self.topic.ml.next_position(cursor.mark_delete))
            self.core.restore_batch_acks(cursor.cursor.batch_acked.items())
        cmds = self.core.add_consumer(
            key,
            c.name,
            priority,
            sub_type=sub_type,
            hash_ranges=ranges,
            sticky=sticky,
            out_of_order=out_of_order,
        )
        self.consumers[key] = c
        self._by_key[key] = c
        c.sub_key = key
        if self._seek_grace is not None:  # a reader back after its seek: the subscription is its own again
            self._seek_grace.cancel()
            self._seek_grace = None
        if not c.session.writable:
            self.core.set_writable(key, False)
        if cursor is not None:
            cursor.active = True
        self.execute(cmds)

    def remove_consumer(self, c: Consumer) -> None:
        key = c.sub_key
        if key not in self.consumers:
            return
        del self.consumers[key]
        self._chunk_restarts.pop(key, None)
        self.execute(self.core.remove_consumer(key))
        self._by_key.pop(key, None)
        if self.cursor is not None and not self.consumers:
            self.cursor.active = False
            self.idle_since_ms = int(time.time() * 1000)
        if not self.consumers and not self.durable:
            self.topic.subscriptions.pop(self.name, None)

    def forget_consumers(self) -> None:
        """The topic is no longer served here: its consumers are closed, and what a read under way brings is
        delivered to nobody. (The consumer ids are those their clients subscribe again with, on the same
        connections: a late delivery reached the new consumer after its client had cleared its queue, and each
        of those messages came twice.) The dispatcher forgets them too: with their permits it read on after a
        late read, from the bookies, and after a failed read tried again every second for ever."""
        for key in list(self.consumers):
            self.core.remove_consumer(key)  # (its commands are for a topic no longer served: none is run)
        self.consumers.clear()
        self._by_key.clear()
        self._chunk_restarts.clear()

    def disconnect_consumers(self, keep: bool = False) -> None:
        """CLOSE_CONSUMER to every consumer (they reconnect); a reader's subscription goes with them, unless
        ``keep`` (a seek's: it stays, for :data:`READER_SEEK_GRACE_S`, for its reader to come back to)."""
        for c in list(self.consumers.values()):
            c.session.consumers.pop(c.consumer_id, None)
            self.remove_consumer(c)
            c.session.send(wire.close_consumer(c.consumer_id, 0))
        if keep and not self.durable and self.name not in self.topic.subscriptions:
            self.topic.subscriptions[self.name] = self
            if self._seek_grace is not None:  # an earlier seek's grace: this seek's runs from now
                self._seek_grace.cancel()
            self._seek_grace = asyncio.get_running_loop().call_later(
                READER_SEEK_GRACE_S, self._drop_unclaimed
            )

    def _drop_unclaimed(self) -> None:
        """A reader's subscription kept by a seek is dropped when its reader has not come back."""
        self._seek_grace = None
        if not self.consumers and self.topic.subscriptions.get(self.name) is self:
            del self.topic.subscriptions[self.name]

    def drop_if_unused(self) -> None:
        """A reader's subscription that a SUBSCRIBE made, or came back to, and then attached no consumer to (its
        connection gone, its creation closed, refused) goes, as when its last reader leaves; it stayed on the
        topic with no reader until the topic was unloaded. Not one a seek keeps for its reader to come back to
        (its grace drops it)."""
        unused = not self.consumers and not self.durable and self._seek_grace is None
        if unused and self.topic.subscriptions.get(self.name) is self:
            del self.topic.subscriptions[self.name]

    def key_of(self, c: Consumer) -> int:
        return c.sub_key

    def _arm_delay_timer(self) -> None:
        """Delayed delivery: wake up when the earliest held-back entry is due."""
        due = self.core.next_delivery_ms
        if due is None or (self._delay_timer is not None and self._delay_timer_at <= due):
            return
        if self._delay_timer is not None:
            self._delay_timer.cancel()
        self._delay_timer_at = due
        delay_s = max(0.0, due / 1000 - time.time())
        self._delay_timer = asyncio.get_running_loop().call_later(delay_s, self._release_delayed)

    def _release_delayed(self) -> None:
        self._delay_timer = None
        if not self.topic.unloaded:
            self.execute(self.core.release_delayed(time.time() * 1000))

    def execute(self, cmds: list[Command]) -> None:
        self._execute(cmds)
        if self.core.delayed_count:
            self._arm_delay_timer()

    def _execute(self, cmds: list[Command]) -> None:
        work = cmds
        i = 0
        now_ms = int(time.time() * 1000)  # the deliveries' time, as their consumers' lastConsumedTimestamp
        while i < len(work):
            cmd = work[i]
            i += 1
            if isinstance(cmd, Deliver):
                c = self._by_key.get(cmd.consumer_id)
                if c is None:
                    continue
                entry = cmd.entry
                self._send_message(c, cmd)
                if self._chunk_restarts and self._restarts_chunks(cmd):
                    self._send_message(c, cmd)
                size = len(entry.data) if entry.data else 0
                c.counters.messages += entry.num_messages
                c.counters.bytes += size
                c.last_consumed_ms = self.last_consumed_ms = now_ms
                self.topic.service.metrics.dispatched(self.topic.key, self.name, entry.num_messages, size)
            elif isinstance(cmd, Read):
                cmd = self._within_read_bytes(cmd)
                if self._compacted_before(cmd.start):
                    self.topic.service.spawn(self._read_compacted(cmd))
                    continue
                # At the tail the entries are in the cache: dispatched now, not by a task per read
                cached = self.topic.ml.read_cached(Position(*cmd.start), cmd.max_entries)
                if cached is None:
                    self.topic.service.spawn(self._read(cmd))
                    continue
                got, at_end = cached
                nxt = Position(got[-1][0][0], got[-1][0][1] + 1) if got else cmd.start
                entries = self._tail_entries(got)
                if work is cmds:
                    work = list(cmds)
                work += self.core.on_read(cmd.epoch, entries, nxt, at_end=at_end, now_ms=time.time() * 1000)
            elif isinstance(cmd, ReadReplay):
                self.topic.service.spawn(self._read_replay(cmd))
            elif isinstance(cmd, ActiveConsumerChanged):
                c = self._by_key.get(cmd.consumer_id)
                if c is not None:
                    c.session.send(wire.active_consumer_change(c.consumer_id, cmd.is_active))
            elif isinstance(cmd, HoldDispatch):
                asyncio.get_running_loop().call_later(
                    cmd.delay_s, lambda: self.execute(self.core.release_hold())
                )

    def _send_message(self, c: Consumer, cmd: Deliver) -> None:
        entry = cmd.entry
        pos = entry.position
        session = c.session
        partition = self.core.partition  # the topic's partition index in the message id, as Pulsar's broker
        if cmd.ack_set is not None:  # a batch partly acknowledged: the client skips what its set says
            session.send(
                wire.message(
                    c.consumer_id,
                    pos[0],
                    pos[1],
                    entry.data,
                    redelivery_count=cmd.redelivery_count,
                    partition=partition,
                    ack_set=cmd.ack_set,
                )
            )
        else:
            # the frame's head, then the stored entry as it is (two buffers, no copy)
            session.send(
                wire.message_head(
                    c.consumer_id,
                    pos[0],
                    pos[1],
                    len(entry.data),
                    redelivery_count=cmd.redelivery_count,
                    partition=partition,
                )
            )
            session.send(entry.data)

    def _restarts_chunks(self, cmd: Deliver) -> bool:
        """Whether ``cmd`` is the first chunk of the message sent again whose orphaned chunks its consumer was
        sent (:meth:`ack_orphans`): it is then sent twice. pulsar-client 3.13's C++ consumer holds those chunks
        as the start of the message and drops the first copy ('a chunk whose chunk id is invalid'), which clears
        them; the second starts the message. A client that starts a message over at a chunk 0 that comes again
        does so twice."""
        uuid = self._chunk_restarts.get(cmd.consumer_id)
        if uuid is None:
            return False
        try:
            md, _ = wire.parse_entry(cmd.entry.data, verify_checksum=False)
        except wire.EntryFormatError:
            return False
        chunk = wire.chunk_of(md)
        if chunk is None or chunk[0] != uuid or chunk[1] != 0:
            return False
        del self._chunk_restarts[cmd.consumer_id]
        return True

    def _within_read_bytes(self, cmd: Read) -> Read:
        """``cmd`` with no more entries than make ``READ_BYTES_MAX`` at the topic's average entry size (at least
        one), as Pulsar's ``dispatcherMaxReadSizeBytes``: 100 entries of 5 MiB were 500 MiB read, and sent to a
        consumer at once, whatever its connection took."""
        ml = self.topic.ml
        entries = ml.view().total_entries()
        if entries <= 0 or cmd.max_entries <= 1:
            return cmd
        fit = max(1, READ_BYTES_MAX * entries // max(1, ml.total_size))
        return cmd if fit >= cmd.max_entries else dataclasses.replace(cmd, max_entries=fit)

    def _tail_entries(self, got: list[tuple[Position, bytes]]) -> list[DispatchEntry]:
        """What to dispatch of entries read at the tail. Only Key_Shared needs an entry's key; the others take
        its message count from the managed ledger, as its SEND gave it, instead of parsing its metadata."""
        if self.core.sub_type == SubType.KEY_SHARED:
            return [_dispatch_entry(p, d) for p, d in got if not self._acked(p)]
        count = self.topic.ml.current_entry_messages
        delays = (
            self.core.sub_type == SubType.SHARED
        )  # delayed delivery (Exclusive, Failover deliver at once)
        out: list[DispatchEntry] = []
        for p, d in got:
            if self._acked(p):
                continue
            n = count(p[0], p[1])
            if n is None:
                out.append(_dispatch_entry(p, d))
                continue
            deliver_at = None
            if delays:
                with contextlib.suppress(wire.EntryFormatError):
                    deliver_at = wire.entry_deliver_at(d)
            out.append(DispatchEntry(p, n, b"", d, deliver_at))
        return out

    async def _read_failed(self, epoch: int, what: str, e: Exception) -> None:
        """A read for the dispatcher failed: logged, the dispatcher told, and reading resumed a second later."""
        log.warning("topic=%s sub=%s %s failed: %s", self.topic.name, self.name, what, e)
        self.core.on_read_failed(epoch)
        await asyncio.sleep(1.0)
        self.execute(self.core.resume())

    async def _read(self, cmd: Read) -> None:
        ml = self.topic.ml
        try:
            got = await ml.read_entries(Position(*cmd.start), cmd.max_entries)
        except ManagedLedgerError as e:
            await self._read_failed(cmd.epoch, "read", e)
            return
        if not got:
            self.execute(self.core.on_read(cmd.epoch, [], cmd.start))
            return
        nxt = ml.next_position(got[-1][0])
        entries = [_dispatch_entry(p, d) for p, d in got if not self._acked(p)]
        self.execute(self.core.on_read(cmd.epoch, entries, nxt, at_end=False, now_ms=time.time() * 1000))

    def _compacted_before(self, start: tuple[int, int]) -> bool:
        horizon = self.topic.compaction.horizon if self.read_compacted else None
        return horizon is not None and Position(*start) <= horizon

    def _compacted_entry(self, pos: Position, data: bytes) -> DispatchEntry:
        """A compacted-ledger entry to dispatch: the messages of a batch that compaction left out count as
        acknowledged, so its ack set leaves them out."""
        mask = compacted_out_mask(data)
        if mask:
            self.core.restore_batch_acks([(pos, mask)])
        return _dispatch_entry(pos, data)

    async def _read_compacted(self, cmd: Read) -> None:
        """A read at or before the compaction horizon: the compacted ledger's entries from ``cmd.start`` on
        (with their original positions), then, once it is read to its end, the topic after the horizon."""
        ml = self.topic.ml
        view = self.topic.compaction.view
        if view is None or Position(*cmd.start) > view.horizon:
            await self._read(cmd)
            return
        try:
            start = Position(*cmd.start)
            first = 0 if start.ledger_id < 0 else await view.find(start)
            got = await view.read(first, cmd.max_entries)
        except (LE.LedgerError, wire.EntryFormatError) as e:
            await self._read_failed(cmd.epoch, "compacted read", e)
            return
        end = not got or first + len(got) >= view.entries  # the compacted ledger read to its end
        if not end:
            last = got[-1][0]
            nxt = Position(last.ledger_id, last.entry_id + 1)
        else:
            nxt = ml.next_position(view.horizon)
        if self.cursor is not None:
            self._ack_compacted_away(start, [p for p, _ in got], view.horizon if end else None)
        entries = [self._compacted_entry(p, d) for p, d in got if not self._acked(p)]
        self.execute(self.core.on_read(cmd.epoch, entries, nxt, at_end=False, now_ms=time.time() * 1000))

    def _ack_compacted_away(self, start: Position, kept: list[Position], horizon: Position | None) -> None:
        """The ids a compaction removed between ``start`` and the entries read from the compacted ledger (up to
        the ``horizon`` when read to its end) count as acknowledged: never delivered, nobody acks them, and they
        would hold the mark-delete (the backlog, what retention keeps) back for ever."""
        assert self.cursor is not None
        ml = self.topic.ml
        gap = start
        for pos in kept:
            self.cursor.ack_range(gap, Position(pos.ledger_id, pos.entry_id - 1))
            gap = ml.next_position(pos)
        if horizon is not None:
            self.cursor.ack_range(gap, horizon)

    async def _read_replay(self, cmd: ReadReplay) -> None:
        ml = self.topic.ml
        out: list[DispatchEntry] = []
        try:
            for pos in cmd.positions:
                if self._compacted_before(pos):
                    view = self.topic.compaction.view
                    data = await view.read_at(Position(*pos)) if view is not None else None
                    if data is not None:
                        out.append(self._compacted_entry(Position(*pos), data))
                    elif view is not None and self.cursor is not None:
                        self.cursor.ack_individual(Position(*pos))  # compacted away since its delivery
                    continue
                got = await ml.read_entries(Position(*pos), 1)
                if got and got[0][0] == pos:
                    out.append(_dispatch_entry(got[0][0], got[0][1]))
        except (ManagedLedgerError, LE.LedgerError, wire.EntryFormatError) as e:
            await self._read_failed(cmd.epoch, "replay read", e)
            return
        self.execute(self.core.on_replay_read(cmd.epoch, out))

    def _acked(self, pos: Position) -> bool:
        orphans = self.topic.orphans
        if (
            orphans and pos in orphans
        ):  # never dispatched; acknowledged on a durable subscription that reaches it
            if self.cursor is not None:
                self.cursor.ack_individual(pos)
            return True
        if self.cursor is not None:
            return self.cursor.is_acked(pos)
        return pos <= self.mark_delete

    def ack_orphans(self, positions: list[Position], uuid: str) -> None:
        """Orphaned chunks (:meth:`Topic._orphan`) of the message of ``uuid`` acknowledged as a consumer's
        individual acks are (an orphan a consumer was sent is no longer its to acknowledge; it is sent the first
        chunk of the message sent again twice, :meth:`_restarts_chunks`); a reader's skip them when it reads
        them."""
        for pos in positions:
            holder = self.core.consumer_of(pos)
            if holder is not None:
                self._chunk_restarts[holder] = uuid
        out = self.core.ack_individual([(pos, -1, None) for pos in positions])
        if self.cursor is not None:
            for pos in positions:
                self.cursor.ack_individual(pos)
        self.execute(out.commands)

    def ack(self, ack: pb.CommandAck) -> None:
        """An ack of a position after the topic's last stored entry is dropped, as Pulsar's cursor refuses a
        mark-delete past its last confirmed entry: taken, it acknowledged entries not written yet (a stranger's
        or a broken client's id, far in the future or a few entries ahead), which were then never delivered
        to the subscription once produced (a cumulative one: every entry up to it)."""
        last = self.topic.ml.last_confirmed_position()
        if ack.ack_type == pb.CommandAck.Cumulative:
            if not ack.message_id:
                return
            mid = ack.message_id[0]
            pos = _position(mid)
            if pos > last:
                return
            batch_index = mid.batch_index if mid.HasField("batch_index") else -1
            if any(mid.ack_set):
                batch_index = cumulative_batch_index(mid.ack_set)
                if batch_index < 0:  # nothing of this batch acked: up to the entry before it
                    pos = pos.previous()
            out = self.core.ack_cumulative(pos, batch_index)
            if self.cursor is not None:
                for p, mask in out.batches:
                    self.cursor.ack_batch(Position(*p), mask)
            if out.mark_delete is not None:
                md = Position(*out.mark_delete)
                if self.cursor is not None:
                    self.cursor.ack_cumulative(md)
                elif md > self.mark_delete:
                    self.mark_delete = md
        else:
            items = [
                (
                    _position(m),
                    m.batch_index if m.HasField("batch_index") else -1,
                    list(m.ack_set) if m.ack_set else None,
                )
                for m in ack.message_id
                if _position(m) <= last
            ]
            out = self.core.ack_individual(items)
            if self.cursor is not None:
                for p, mask in out.batches:
                    self.cursor.ack_batch(Position(*p), mask)
                for p in out.acked:
                    self.cursor.ack_individual(Position(*p))
        self.execute(out.commands)

    def on_new_entries(self) -> None:
        if self.core.caught_up:
            self.execute(self.core.on_new_entries())

    async def seek(self, position: Position) -> None:
        if self.cursor is not None:
            if not self.consumers:  # idle: another writer may have moved it (reset on top of its write)
                await self.cursor.refresh()
            await self.cursor.reset(position)
        self.mark_delete = self._before(position)
        self.execute(self.core.reset(position))

    def _before(self, start: Position) -> Position:
        """A reader's mark-delete when ``start`` is its next entry: the last stored entry when it starts after it,
        also when the current ledger is still empty (its ``(ledger, -1)`` would sort after that entry, and the
        client, comparing it with the last message id, would see nothing to read at latest-inclusive)."""
        last = self.topic.ml.last_confirmed_position()
        return last if start == self.topic.ml.next_position(last) else start.previous()

    def stats(self) -> dict[str, Any]:
        c = self.cursor
        active = None if self.core.active_consumer is None else self._by_key.get(self.core.active_consumer)
        mode = self.core.key_shared_mode()
        key_shared = {} if mode is None else {"keySharedMode": mode[0], "allowOutOfOrderDelivery": mode[1]}
        return {
            "type": pb.CommandSubscribe.SubType.Name(self.core.sub_type),  # Pulsar's names: Key_Shared
            **key_shared,
            "durable": self.durable,
            "nonContiguousDeletedMessagesRanges": len(c.cursor.individually_deleted) if c else 0,
            "lastAckedTimestamp": self.last_acked_ms,
            "lastConsumedTimestamp": self.last_consumed_ms,
            "lastConsumedFlowTimestamp": self.last_flow_ms,
            "msgBacklog": c.backlog_messages() if c else 0,  # messages: a batch entry counts its messages
            "msgBacklogEntries": c.backlog() if c else 0,
            "backlogSize": self.topic.ml.estimate_bytes(
                c.mark_delete, self.topic.ml.last_confirmed_position()
            )
            if c
            else 0,
            "msgDelayed": self.core.delayed_count,  # held back for delayed delivery (entries)
            "markDeletePosition": str(Position(*self.mark_position)),
            "readPosition": str(Position(*self.core.read_position)),
            "activeConsumerName": None if active is None else active.name,  # Failover, Exclusive
            "consumers": [
                {
                    "consumerName": c.name,
                    "availablePermits": self.core.permits(k),
                    "unackedMessages": self.core.unacked_messages(k),
                    "blockedConsumerOnUnackedMsgs": self.core.blocked_on_unacked(k),
                    "msgOutCounter": c.counters.messages,
                    "bytesOutCounter": c.counters.bytes,
                    **_consumer_rates(c),
                    "lastAckedTimestamp": c.last_acked_ms,
                    "lastConsumedTimestamp": c.last_consumed_ms,
                    "lastConsumedFlowTimestamp": c.last_flow_ms,
                    **_key_hash_ranges(self.core, k),
                    "metadata": dict(c.metadata),
                    **_client_stats(c.session, c.counters),
                }
                for k, c in self.consumers.items()
            ],
        }

    @property
    def mark_position(self) -> Position:
        return self.cursor.mark_delete if self.cursor else self.mark_delete


def schema_conflict(stored_types: Sequence[int], declared: int) -> str | None:
    """Why a producer or consumer declaring a schema of type ``declared`` is refused on a topic whose schemas
    have ``stored_types`` (oldest first), or None. As Pulsar: a schema of another type than the topic's latest
    is incompatible (``IncompatibleSchema``); bytes (no schema) goes with anything. Definitions of the same
    type are compared by :func:`schema_evolution_refused`."""
    if declared == SCHEMA_NONE or not stored_types or stored_types[-1] in (SCHEMA_NONE, declared):
        return None
    return (
        f"incompatible schema: the topic's schema is {_schema_type_name(stored_types[-1])}, "
        f"not {_schema_type_name(declared)}"
    )


def schema_refusal(history: SchemaHistory, schema: SchemaInfo, strategy: str) -> str | None:
    """Why ``schema`` does not go with a topic whose stored schemas are ``history``, under ``strategy``: a type
    other than the latest's (:func:`schema_conflict`) or an AVRO or JSON definition the strategy does not allow
    (:func:`schema_evolution_refused`). None for bytes and for a schema stored already (its version is
    reused, unchecked, as in Pulsar)."""
    if schema.type == SCHEMA_NONE:
        return None
    refused = schema_conflict([v.type for _, v in history.live()], schema.type)
    if refused is not None or history.version_of(schema) is not None:
        return refused
    return schema_evolution_refused(history, schema, strategy)


def schema_evolution_refused(history: SchemaHistory, schema: SchemaInfo, strategy: str) -> str | None:
    """Why a new AVRO or JSON definition is refused on a topic with ``history`` under ``strategy``
    (:func:`schema_compat.incompatibility` against the stored definitions of that type), or a new KEY_VALUE
    one (:func:`schema_compat.key_value_incompatibility`, its parts checked so), or None. Other types carry no
    definition to compare."""
    if schema.type == pb.Schema.KeyValue:
        stored_kv = [(v.data, v.properties) for _, v in history.live() if v.type == pb.Schema.KeyValue]
        why = schema_compat.key_value_incompatibility(strategy, schema.data, schema.properties, stored_kv)
    elif schema.type in (pb.Schema.Avro, pb.Schema.Json):
        stored = [v.data for _, v in history.live() if v.type == schema.type]
        why = schema_compat.incompatibility(strategy, schema.data, stored)
    else:
        return None
    return None if why is None else f"incompatible schema: {why}"


def _schema_type_name(t: int) -> str:
    try:
        return pb.Schema.Type.Name(t).upper()  # type: ignore[arg-type]
    except ValueError:
        return f"type {t}"


def _schema_info(schema: pb.Schema) -> SchemaInfo:
    return SchemaInfo(
        type=int(schema.type),
        name=schema.name,
        data=bytes(schema.schema_data),
        properties={kv.key: kv.value for kv in schema.properties},
        timestamp_ms=int(time.time() * 1000),
    )


#: the start of a compacted reader at the earliest message (``Topic.earliest``)
EARLIEST_COMPACTED = Position(-1, 0)


def read_compacted_refusal(cmd: pb.CommandSubscribe) -> str | None:
    """Why a SUBSCRIBE is refused for compaction's sake (Pulsar's NotAllowed), or None: read_compacted only
    on an Exclusive or Failover subscription or a reader, and the compactor's subscription is its own."""
    if cmd.subscription == COMPACTION_SUBSCRIPTION:
        return f"Subscription name {COMPACTION_SUBSCRIPTION} is reserved for topic compaction"
    if cmd.read_compacted and cmd.subType not in (
        pb.CommandSubscribe.Exclusive,
        pb.CommandSubscribe.Failover,
    ):
        return "readCompacted only allowed on failover or exclusive subscriptions"
    return None


def _position(mid: pb.MessageIdData) -> Position:
    """A client's message id as a signed position (the earliest id (−1, −1) arrives as uint64 2**64 − 1)."""
    return Position(wire.signed64(mid.ledgerId), wire.signed64(mid.entryId))


def _dispatch_entry(pos: Position, data: bytes) -> DispatchEntry:
    try:
        md, _ = wire.parse_entry(data, verify_checksum=False)
    except wire.EntryFormatError:
        return DispatchEntry(pos, 1, wire.NONE_KEY, data)
    key = wire.sticky_key(md)
    n = md.num_messages_in_batch if md.HasField("num_messages_in_batch") else 1
    deliver_at = md.deliver_at_time if md.HasField("deliver_at_time") else None
    return DispatchEntry(pos, max(1, n), key, data, deliver_at)


class Topic:
    # Slotted: the send and dispatch paths read these for every entry, and CPython 3.11 reads and writes an
    # instance's attributes as fast inline values only while its class's instances have fewer than 30 names;
    # at 30 (here since the topic's own policies) every access fell back to a dict lookup. An attribute not
    # listed still works (in ``__dict__``), slower.
    __slots__ = (
        "_appending",
        "_opening_subscription",
        "_producer_seq",
        "_queue",
        "_skipped_dirty",
        "bytes_in",
        "compaction",
        "consumers_creating",
        "dedup_enabled",
        "exclusive_producers",
        "key",
        "last_entry_messages",
        "last_sequence",
        "max_consumers",
        "max_consumers_per_subscription",
        "max_producers",
        "max_subscriptions",
        "max_unacked_on_consumer",
        "max_unacked_on_subscription",
        "ml",
        "msg_in",
        "name",
        "namespace_compaction_threshold",
        "open_chunks",
        "orphans",
        "own_policies",
        "own_policies_unreadable",
        "persisted_sequence",
        "producer_names",
        "producers",
        "age_exceeded",
        "age_probe",
        "age_quota",
        "quota",
        "quota_exceeded",
        "service",
        "skipped_ids",
        "subscriptions",
        "tick_failures",
        "unloaded",
        "waiting",
        "__dict__",
    )

    def __init__(self, service: BrokerService, name: TopicName, ml: ManagedLedger, dedup: bool) -> None:
        self.service = service
        self.name = name
        self.key = str(name)
        self.ml = ml
        self.dedup_enabled = dedup
        self.producers: dict[int, Producer] = {}  # by id(producer)
        # the same by name, and how many are exclusive: each PRODUCER looks them up, where a walk of the producers
        # made 15,000 PRODUCERs pipelined on one connection take 17 s of the event loop (quadratic)
        self.producer_names: dict[str, Producer] = {}
        self.exclusive_producers = 0
        self.subscriptions: dict[str, SubscriptionRuntime] = {}
        self._opening_subscription = asyncio.Lock()  # consumers subscribing at once open one cursor
        self.waiting: deque[_WaitingProducer] = deque()  # WaitForExclusive producers, first come first served
        self.last_sequence: dict[str, int] = {}  # producer name -> highest sequence id accepted
        self.persisted_sequence: dict[str, int] = {}  # producer name -> highest sequence id stored
        self.last_entry_messages: int | None = None
        self._queue: deque[QueuedEntry] = deque()  # SENDs not handed to the ML yet
        self._appending = False
        self._producer_seq = itertools.count()
        self.unloaded = False
        self.quota = BacklogQuota()  # the namespace's backlog quota (applied with the other policies)
        self.age_quota: BacklogQuota | None = None  # the message_age quota in force (its ``limit_time``)
        #: the first entry after the slowest mark-delete and its publish time (ms), read once per position
        self.age_probe: tuple[Position, int] | None = None
        #: the message_age quota's last reading found it exceeded (a producer policy): what stands while the
        #: entry cannot be read, not ``quota_exceeded``, which the size quota may have set
        self.age_exceeded = False
        self.quota_exceeded = False  # a producer policy's limit is exceeded: producers closed and refused
        self.msg_in = 0
        self.bytes_in = 0
        self.tick_failures = RateLimitedLog(log, LOG_EVERY_S)  # its housekeeping's failure lines
        #: its compacted view and compactor, whose ``__compaction`` cursor is a subscription like any other
        self.compaction = TopicCompaction(ml, ml.bk, self._open_compaction_cursor)
        self.namespace_compaction_threshold: int | None = None  # the namespace's (applied with its policies)
        self.own_policies = TopicPolicies()  # its own (its partitioned topic's), applied with the others
        #: its own policies' znode did not parse when last read (said once, until it parses again)
        self.own_policies_unreadable = False
        #: the limits in force (``BrokerService.apply_policies``): producers, consumers (0: none), and the
        #: unacknowledged messages a consumer may hold before it is sent nothing more
        self.max_producers = 0
        self.max_consumers = 0
        #: the consumers one subscription may have (0: none), the namespace's ``maxConsumersPerSubscription``
        self.max_consumers_per_subscription = 0
        #: the subscriptions the topic may have (0: none), the namespace's ``maxSubscriptionsPerTopic``
        self.max_subscriptions = 0
        #: SUBSCRIBEs past the consumers limit's first check and not yet attached or refused: counted by that
        #: check (``BrokerService._consumers_refused``) as the consumers they are about to be
        self.consumers_creating = 0
        self.max_unacked_on_consumer = DEFAULT_UNACKED_MESSAGES_MAX
        self.max_unacked_on_subscription = DEFAULT_UNACKED_SUBSCRIPTION_MAX
        #: producer name -> ranges [lo, hi] of sequence ids its stored sends jumped over (``fills_skipped_id``)
        self.skipped_ids: dict[str, list[tuple[int, int]]] = {}
        self._skipped_dirty: set[str] = set()  # names whose skipped ids changed since record_skipped_ids
        ml.before_list_write = self.record_skipped_ids
        #: producer name -> its chunked message being stored: (uuid, positions of its chunks stored so far)
        self.open_chunks: dict[str, tuple[str, list[Position]]] = {}
        #: chunks of messages never completed (:meth:`_track_chunks`): acknowledged, never dispatched
        self.orphans: set[Position] = self._restore_orphans()

    # -- producers ------------------------------------------------------------------------------------------

    def fills_skipped_id(self, name: str, seq: int, high: int | None = None) -> tuple[tuple[int, int], ...]:
        """Whether a SEND of producer ``name`` with sequence id ``seq`` (dedup on) is one its stored sends jumped
        over, which no deduplication may drop: the C++ client sends a message with a delivery time on its own at
        once, ahead of the batch its earlier messages wait in (ids 0, 2, 4 sent before the batch 1, 3, 5), and
        taken for a resend (1 <= 4) the batch was acknowledged and never stored. A send that jumps over ids is
        remembered here (the latest ``SKIPPED_IDS_MAX`` ranges, while the topic is open); one whose first id
        ``seq`` fills such an id is stored without a dedup check and takes out every skipped id from ``seq`` to
        its last, ``high`` (the batch 1, 3, 5 fills 1 and 3; 2 and 4 were stored before it): the ranges it took
        out are returned (empty: it fills none)."""
        last = self.last_sequence.get(name, -1)
        if seq > last + 1:
            jumped = self._skipped_ranges(name)
            # a range above the last id was left by a send not stored (a failed write): jumped over again now,
            # kept twice it let a resend of a filled id be stored a second time (the ranges are sorted and apart,
            # so those are at the end)
            while jumped and jumped[-1][1] > last:
                jumped.pop()
            jumped.append((last + 1, seq - 1))
            if len(jumped) > SKIPPED_IDS_MAX:
                del jumped[: len(jumped) - SKIPPED_IDS_MAX]
            self._skipped_dirty.add(name)
            return ()
        ranges = self.skipped_ids.get(name)
        if not ranges:
            return ()
        # binary searches, not a walk of up to SKIPPED_IDS_MAX ranges at every SEND (a key-based batching
        # producer leaves ids inside its stored batches as skipped, so its list fills up and stays full)
        i = bisect.bisect_left(ranges, seq, key=_HI)  # the first range that ends at seq or later
        if i == len(ranges) or ranges[i][0] > seq:
            return ()
        high = seq if high is None or high < seq else high
        j = bisect.bisect_right(ranges, high, lo=i, key=_LO)  # past the last range that starts by high
        taken = tuple((max(lo, seq), min(hi, high)) for lo, hi in ranges[i:j])
        first_lo, last_hi = ranges[i][0], ranges[j - 1][1]
        ranges[i:j] = [r for r in ((first_lo, seq - 1), (high + 1, last_hi)) if r[0] <= r[1]]
        if len(ranges) > SKIPPED_IDS_MAX:  # (a fill inside a range splits it in two)
            del ranges[: len(ranges) - SKIPPED_IDS_MAX]
        if not ranges:
            del self.skipped_ids[name]
        self._skipped_dirty.add(name)
        return taken

    def _is_skipped_id(self, name: str, seq: int) -> bool:
        """Whether ``seq`` is one of producer ``name``'s skipped ids (:meth:`fills_skipped_id`), left there."""
        ranges = self.skipped_ids.get(name)
        if not ranges:
            return False
        i = bisect.bisect_left(ranges, seq, key=_HI)  # the first range that ends at seq or later
        return i < len(ranges) and ranges[i][0] <= seq

    def _skipped_ranges(self, name: str) -> list[tuple[int, int]]:
        """Producer ``name``'s list in ``skipped_ids``, made when it has none; the oldest producer's is forgotten
        when that would make more than ``SKIPPED_IDS_PRODUCERS_MAX``."""
        ranges = self.skipped_ids.get(name)
        if ranges is None:
            if len(self.skipped_ids) >= SKIPPED_IDS_PRODUCERS_MAX:
                oldest = next(iter(self.skipped_ids))
                del self.skipped_ids[oldest]
                self._skipped_dirty.add(oldest)
            ranges = self.skipped_ids[name] = []
        return ranges

    def record_skipped_ids(self) -> None:
        """Put the skipped ids of the producers whose ids changed since the last call into the topic's
        properties (each producer's newest ``SKIPPED_IDS_PERSISTED_MAX`` ranges, ``dedup-skipped/<producer>``),
        so that a later owner starts from them (``restore_skipped_ids``). The managed ledger calls it before each
        write of its ledger list (rollover, close), which carries the properties."""
        recorded = self.ml.properties if self._skipped_dirty else {}
        for name in self._skipped_dirty:
            ranges = self.skipped_ids.get(name, ())
            text = ",".join(f"{lo}-{hi}" for lo, hi in ranges[-SKIPPED_IDS_PERSISTED_MAX:])
            key = SKIPPED_IDS_PROPERTY + name
            if text or recorded.get(key):  # (a producer whose ids are all filled: cleared there)
                self.ml.set_property(key, text)
        self._skipped_dirty.clear()

    def restore_skipped_ids(self) -> None:
        """A new owner's ``skipped_ids`` as the topic's properties recorded them (``record_skipped_ids``); a value
        that does not parse is ignored (its producer's batch behind a delayed message would be taken for a
        resend, as before these were recorded)."""
        for key, value in self.ml.properties.items():
            if not key.startswith(SKIPPED_IDS_PROPERTY) or not value:
                continue
            name = key[len(SKIPPED_IDS_PROPERTY) :]
            try:
                ranges = [(int(lo), int(hi)) for lo, hi in (r.split("-", 1) for r in value.split(","))]
            except ValueError:
                log.warning(
                    "topic %s: property %s=%r is not a list of id ranges; ignored", self.key, key, value
                )
                continue
            good = merge_ranges([(lo, hi) for lo, hi in ranges if 0 <= lo <= hi])
            if good:
                self._skipped_ranges(name)[:] = good[-SKIPPED_IDS_MAX:]

    # -- orphaned chunks --------------------------------------------------------------------------------------

    def _track_chunks(self, name: str, chunk: wire.Chunk | None, position: Position) -> None:
        """Producer ``name``'s entry stored at ``position`` (``chunk``: a chunk's uuid, id and count). A chunked
        message whose first chunks were stored and whose last was not (the connection went, or the broker was
        killed, before the producer had their receipts) is sent again whole, chunk 0 first: the chunks stored
        before are orphans, which pulsar-client 3.13's C++ consumer cannot get past (reading chunks 0, 1 and then
        chunk 0 of the same uuid again, it drops the message, each time). Pulsar's broker stores them too; here
        a chunk 0, another message's chunk or a message not chunked from that producer while one of its chunk
        sequences is open makes its positions orphans (:meth:`_orphan`)."""
        open_ = self.open_chunks.get(name)
        if chunk is None:
            if open_ is not None:
                del self.open_chunks[name]
                self._orphan(open_[1], open_[0])
            return
        uuid, chunk_id, chunks = chunk
        if open_ is not None and (chunk_id == 0 or open_[0] != uuid):
            del self.open_chunks[name]
            self._orphan(open_[1], open_[0])
            open_ = None
        if chunk_id >= chunks - 1:  # the last: the message is whole
            self.open_chunks.pop(name, None)
            return
        if open_ is None:
            open_ = self.open_chunks[name] = (uuid, [])
        open_[1].append(position)

    def _orphan(self, positions: list[Position], uuid: str) -> None:
        """Orphaned chunks: acknowledged on every durable subscription (a subscription or reader that reaches
        them later skips them, :meth:`SubscriptionRuntime._acked`), remembered in the topic's properties (the
        newest ``ORPHAN_CHUNKS_MAX``) so that a later owner skips them too."""
        if self.orphans.issuperset(positions):  # (known: a new owner reading the tail ledger again)
            return
        log.info("topic=%s chunks at %s of a message never completed: skipped", self.name, positions)
        self.orphans.update(positions)
        if len(self.orphans) > ORPHAN_CHUNKS_MAX:
            for pos in sorted(self.orphans)[: len(self.orphans) - ORPHAN_CHUNKS_MAX]:
                self.orphans.discard(pos)
        self.ml.set_property(ORPHAN_CHUNKS_PROPERTY, ",".join(f"{lo}:{e}" for lo, e in sorted(self.orphans)))
        for sub in list(self.subscriptions.values()):
            sub.ack_orphans(positions, uuid)
        if not self.unloaded:
            self.service.spawn(self._save_orphans())

    async def _save_orphans(self) -> None:
        try:
            await self.ml.save_properties()
        except ManagedLedgerError as e:  # (written with the next change of the ledger list)
            log.warning("topic=%s orphaned chunks not saved now: %s", self.name, e)

    def _restore_orphans(self) -> set[Position]:
        """The orphaned chunks the topic's properties recorded (a value that does not parse: none)."""
        value = self.ml.properties.get(ORPHAN_CHUNKS_PROPERTY)
        if not value:
            return set()
        try:
            return {Position(int(lo), int(e)) for lo, e in (p.split(":", 1) for p in value.split(","))}
        except ValueError:
            log.warning(
                "topic %s: property %s=%r is not a list of positions", self.key, ORPHAN_CHUNKS_PROPERTY, value
            )
            return set()

    def add_producer(self, p: Producer) -> None:
        self.producers[id(p)] = p
        self.producer_names[p.name] = p
        self.exclusive_producers += p.exclusive

    def remove_producer(self, p: Producer) -> None:
        p.closed = True
        if self.producers.pop(id(p), None) is not None:
            if self.producer_names.get(p.name) is p:
                del self.producer_names[p.name]
            self.exclusive_producers -= p.exclusive
        if not self.producers and self.waiting:
            self.service.grant_waiting_producer(self)

    def publish(
        self,
        p: Producer,
        send: pb.CommandSend,
        entry: bytes,
        num_messages: int,
        *,
        dedup: bool = True,
        chunk: wire.Chunk | None = None,
        walked: tuple[int | None] | None = None,
    ) -> None:
        """``dedup`` False: the SEND's sequence id takes no part in deduplication (a chunk before the last).
        ``chunk``: a chunk's (uuid, chunk id, chunks of its message), for :meth:`_track_chunks`.
        ``walked``: the batch's last sequence id stated, when :meth:`BrokerService.on_send` walked it (a 1-tuple).
        A batch whose dedup walk inflates much (:func:`dedup_walk`) is walked in a worker thread, and the
        producer's later SENDs are held behind it, to be taken in their order."""
        seq = send.sequence_id
        declared = send.highest_sequence_id if send.HasField("highest_sequence_id") else None
        dedup_id = (
            dedup_walk(seq, declared, num_messages, entry, walked) if self.dedup_enabled and dedup else seq
        )
        if p.held or not isinstance(dedup_id, int):
            p.held.append(_HeldSend(send, entry, num_messages, dedup, dedup_id, time.monotonic(), chunk))
            if len(p.held) == 1:
                self.service.spawn(self._publish_held(p))
            return
        self._publish(p, send, entry, num_messages, dedup, dedup_id, time.monotonic(), chunk)

    async def _publish_held(self, p: Producer) -> None:
        """The producer's held SENDs, in their order, each batch walked in a worker thread first."""
        held = p.held
        while held:
            h = held[0]
            if not isinstance(h.dedup_id, int):
                try:
                    h.dedup_id = await asyncio.to_thread(h.dedup_id)
                except Exception as e:  # (MemoryError): the batch's first id, as for any batch not read
                    log.warning("topic=%s batch of %s not walked for dedup: %r", self.name, p.name, e)
                    h.dedup_id = h.send.sequence_id
            if p.closed or p.session.conn.closed:
                # a write of the producer's failed meanwhile (or its connection went): the client sends these
                # again after the one that failed, which stored now they would go before; or the producer was
                # closed (fenced by an exclusive one, whose messages they would follow)
                held.clear()
                return
            held.popleft()
            self._publish(p, h.send, h.entry, h.num_messages, h.dedup, h.dedup_id, h.started, h.chunk)

    def _publish(
        self,
        p: Producer,
        send: pb.CommandSend,
        entry: bytes,
        num_messages: int,
        dedup: bool,
        dedup_id: int,
        started: float,
        chunk: wire.Chunk | None = None,
    ) -> None:
        seq = send.sequence_id
        # in the producer's order, held SENDs (a batch walked in a thread) included
        fills = self.fills_skipped_id(p.name, seq, dedup_id) if self.dedup_enabled and dedup else ()
        declared = send.highest_sequence_id if send.HasField("highest_sequence_id") else None
        rec = _Receipt(
            seq,
            wire.highest_sequence_id(seq, declared, num_messages),
            started=started,
            messages=num_messages,
            size=len(entry),
            dedup=dedup,
            dedup_id=dedup_id,
            fills=fills,
            chunk=chunk,
        )
        p.receipts.append(rec)
        last = self.last_sequence.get(p.name, -1)
        # a chunk before the last of a message whose last chunk is stored (or on its way) is a resend too (the
        # producer reconnected and sends the message again): stored again, it would be a partial copy after the
        # whole message, which the client holds as an incomplete message (Pulsar stores it)
        # (unless its id is one the producer's stored sends jumped over: it fills that id, as its last chunk does)
        if (
            self.dedup_enabled
            and (dedup or (seq <= last and not self._is_skipped_id(p.name, seq)))
            and not fills
            and seq <= last
        ):
            # a resend of what is stored (or on its way): answered in its turn, with no position (-1:-1), on a
            # terminated topic too, as Pulsar's publishMessage asks its dedup before its managed ledger. Judged by
            # its first id, as Pulsar's isDuplicate judges it: a batch that holds both stored ids and new ones (an
            # application resending from an earlier id) is dropped whole, its new messages too, where it was
            # stored whole, its stored messages a second time
            if seq > self.persisted_sequence.get(p.name, last) and not self._sent_before(p, rec):
                # its first send is still being stored, by an earlier producer of this name (a connection gone
                # since): that write may yet fail, so this is no duplicate yet, Pulsar's MessageDupUnknown. The
                # client closes its connection on the error and sends again
                rec.error = f"{self.name}: sequence id {seq} of {p.name} is still being stored; send it again"
                rec.error_code = pb.PersistenceError
            rec.done = True
            p.flush_receipts()
            return
        if self.ml.terminated_position is not None:
            # a new message (or any, without dedup): Pulsar's add to a terminated managed ledger fails so
            rec.error, rec.error_code = f"Topic {self.name} was already terminated", pb.TopicTerminatedError
            rec.done = True
            p.flush_receipts()
            return
        if self.dedup_enabled and dedup:
            self.persisted_sequence.setdefault(p.name, last)
            # a fill's last id may be below the last one (1 after 2, 4) or above it (the batch 1, 3, 5 after 4:
            # its resend is then a duplicate)
            self.last_sequence[p.name] = max(last, rec.dedup_id)
        self.msg_in += num_messages
        self.bytes_in += len(entry)
        p.counters.messages += num_messages
        p.counters.bytes += len(entry)
        self._queue.append((entry, functools.partial(self._appended, p, rec), num_messages))
        if not self._appending:
            self._appending = True
            self.service.spawn(self._append_loop())

    @staticmethod
    def _sent_before(p: Producer, rec: _Receipt) -> bool:
        """An earlier send of ``p`` still unanswered covers ``rec``'s first id (answered in its turn after it)."""
        return any(
            r is not rec and not r.done and r.dedup and r.dedup_id >= rec.sequence_id for r in p.receipts
        )

    async def _append_loop(self) -> None:
        """One appender per topic: everything queued since its last turn goes to the managed ledger in one
        call (entries are sent in arrival order; receipts follow each producer's order)."""
        try:
            while self._queue and not self.unloaded:
                try:
                    await self.ml.append_from(self._queue)
                except ManagedLedgerFencedError as e:
                    self.service.topic_lost(self, str(e))
                    return
                except ManagedLedgerError as e:
                    # as Pulsar: a failed add fails everything queued behind it, so that no later sequence id is
                    # stored before the failed one is sent again (dedup would then take the resend for a duplicate)
                    failed = list(self._queue)
                    self._queue.clear()
                    for _entry, callback, _n in failed:
                        callback(None, e)
        finally:
            self._appending = False

    def _appended(
        self, p: Producer, rec: _Receipt, position: Position | None, error: ManagedLedgerError | None
    ) -> None:
        if self.unloaded or rec.done:
            return
        if isinstance(error, ManagedLedgerFencedError):
            self.service.topic_lost(self, str(error))
            return
        if error is not None:
            rec.error = str(error)
            if self.dedup_enabled:
                # as Pulsar (resetHighestSequenceIdPushed, producers disconnected): what failed was not stored, so
                # its resend is no duplicate; the connection closes so that nothing sent after it is stored first
                self.last_sequence.update(self.persisted_sequence)
                if rec.fills:  # not stored: its ids are to fill still, else its resend was dropped
                    ranges = self._skipped_ranges(p.name)
                    ranges[:] = merge_ranges([*ranges, *rec.fills])
                    self._skipped_dirty.add(p.name)
                p.session.conn.close(f"persistence failed: {error}")
        else:
            rec.position = position
            self.service.metrics.published(self.key, rec.messages, rec.size, time.monotonic() - rec.started)
            if self.dedup_enabled and rec.dedup:
                # (a fill's id may be below the last one stored)
                persisted = max(self.persisted_sequence.get(p.name, -1), rec.dedup_id)
                self.ml.set_property(f"dedup/{p.name}", str(persisted))
                self.persisted_sequence[p.name] = persisted
            self.last_entry_messages = None
            if (
                rec.chunk is not None or self.open_chunks
            ) and position is not None:  # (a topic without chunks)
                self._track_chunks(p.name, rec.chunk, position)
            for sub in self.subscriptions.values():
                sub.on_new_entries()
        rec.done = True
        p.flush_receipts()

    async def scan_tail(self) -> None:
        """A new owner: with dedup, the persisted last sequence ids, then the tail ledger's entries on top;
        the tail ledger's message counts (it was recovered from the previous owner, whose counts are lost).

        The sequence ids found in the tail ledger are stored at once (``dedup/<producer>``): the next owner
        scans only the ledger before its own, and this owner's ledger may hold entries of other producers only,
        so a producer that wrote to the previous owner alone would otherwise be forgotten after a second change
        of owner (a restart or a crash of this one), and its resends stored again."""
        stored: dict[str, int] = {}
        if self.dedup_enabled:
            for k, v in self.ml.properties.items():
                if k.startswith("dedup/"):
                    with contextlib.suppress(ValueError):
                        stored[k[len("dedup/") :]] = int(v)
            self.last_sequence.update(stored)
            self.restore_skipped_ids()
        ledgers = self.ml.view().ledgers
        tail = [(lid, n) for lid, n in ledgers[:-1] if n > 0]
        if not tail:
            return
        lid, n = tail[-1]
        known = any(li.ledger_id == lid and li.messages > 0 for li in self.ml.info.ledgers)
        if known and not self.dedup_enabled:
            return
        counts: list[int] = []
        spans: dict[str, list[tuple[int, int]]] = {}  # producer -> its stored sends' ids in the tail ledger
        pos = Position(lid, 0)
        while True:
            got = await self.ml.read_entries(pos, 1000)
            got = [(p, d) for p, d in got if p.ledger_id == lid]
            if not got:
                break
            for at, data in got:
                try:
                    md, _ = wire.parse_entry(data, verify_checksum=False)
                except wire.EntryFormatError:
                    counts.append(1)
                    continue
                counts.append(md.num_messages_in_batch if md.HasField("num_messages_in_batch") else 1)
                # a chunk sequence still open at the tail: its chunk 0 sent again orphans it
                self._track_chunks(md.producer_name, wire.chunk_of(md), at)
                if self.dedup_enabled and wire.counts_for_dedup(md):
                    declared = md.highest_sequence_id if md.HasField("highest_sequence_id") else None
                    found = dedup_walk(md.sequence_id, declared, counts[-1], data)
                    seq = found if isinstance(found, int) else await asyncio.to_thread(found)
                    spans.setdefault(md.producer_name, []).append((md.sequence_id, seq))
                    if seq > self.last_sequence.get(md.producer_name, -1):
                        self.last_sequence[md.producer_name] = seq
            if len(got) < 1000:
                break
            pos = Position(lid, got[-1][0].entry_id + 1)
        if not known and len(counts) == n:
            self.ml.record_messages(lid, counts)
        for name, got_ids in spans.items():
            self._learn_skipped_ids(name, stored.get(name, -1), got_ids)
        learnt = {name: seq for name, seq in self.last_sequence.items() if seq > stored.get(name, -1)}
        for name, seq in learnt.items():
            self.ml.set_property(f"dedup/{name}", str(seq))
        if learnt or spans:
            await self.ml.save_properties()

    def _learn_skipped_ids(self, name: str, persisted: int, spans: list[tuple[int, int]]) -> None:
        """A new owner's ``skipped_ids`` of producer ``name``: the ids above ``persisted`` (its last id stored
        with the ledger list, so every id of the ledgers before the tail is at most that) that none of its
        sends in the tail ledger (``spans``, first and last id each) covers. They were never stored: the
        previous owner had them in its ``skipped_ids``, and a batch still in the client then, resent to this
        owner, fills them (stored, not dropped as a resend of the delayed messages that jumped over it).

        Added to the ranges the properties recorded (``restore_skipped_ids``: what the previous owner knew at its
        clean close or at its last rollover), less the ids the tail ledger's sends cover (filled since)."""
        top = max((hi for _lo, hi in spans), default=persisted)
        above = [(persisted + 1, top)] if top > persisted else []
        ranges = subtract_ranges([*self.skipped_ids.get(name, ()), *above], spans)
        if ranges or name in self.skipped_ids:
            self._skipped_ranges(name)[:] = ranges[-SKIPPED_IDS_MAX:]
            if not ranges:
                del self.skipped_ids[name]
            self._skipped_dirty.add(name)

    # -- backlog quota ----------------------------------------------------------------------------------------

    def backlog_bytes(self) -> int:
        """Estimated bytes after the slowest durable subscription's mark-delete (Pulsar's backlog size)."""
        slowest = self.ml.slowest_mark_delete()
        if slowest is None:
            return 0
        return self.ml.estimate_bytes(slowest, self.ml.last_confirmed_position())

    def compaction_backlog_bytes(self) -> int:
        """What the compaction threshold is compared with (:func:`compaction_backlog`)."""
        ml = self.ml
        last = ml.last_confirmed_position()
        mark = self.compaction.mark_delete
        slowest = ml.slowest_mark_delete()
        return compaction_backlog(
            None if mark is None else ml.estimate_bytes(mark, last),
            None if slowest is None else ml.estimate_bytes(slowest, last),
            ml.total_size,
        )

    async def oldest_unacked_publish_ms(self) -> int | None:
        """The publish time (ms) of the oldest message not acknowledged by every durable subscription: the first
        entry after the slowest mark-delete (Pulsar's precise ``message_age`` check); None without a backlog or
        when that entry's metadata cannot be read."""
        slowest = self.ml.slowest_mark_delete()
        if slowest is None:
            return None
        pos = sub_ops.first_after(self.ml.view(), slowest)
        if pos is None:
            return None
        if self.age_probe is not None and self.age_probe[0] == pos:
            return self.age_probe[1]
        try:
            published = wire.entry_publish_time(await self.ml.read_entry(pos))
        except wire.EntryFormatError:
            return None
        self.age_probe = (pos, published)
        return published

    async def evict_backlog(self, limit_bytes: int) -> None:
        """Move every cursor behind the point where the backlog fits ``limit_bytes`` up to it (the oldest
        unacknowledged entries are skipped, as Pulsar's ``consumer_backlog_eviction`` does)."""
        ml = self.ml
        view = ml.view()
        last = ml.last_confirmed_position()
        lo, hi = 0, view.total_entries()  # the first entry index whose backlog from there fits
        while lo < hi:
            mid = (lo + hi) // 2
            if ml.estimate_bytes(view.position_at(mid).previous(), last) <= limit_bytes:
                hi = mid
            else:
                lo = mid + 1
        start = ml.next_position(last) if lo >= view.total_entries() else view.position_at(lo)
        target = start.previous()
        await ml.refresh_cursors()
        names = {*ml.cursors, *(await self.service.stored_cursor_names(self))}
        names.discard(COMPACTION_SUBSCRIPTION)  # its mark-delete is the compaction horizon: never moved so
        # An idle subscription's stored cursor is opened (or its attached one refreshed) and reset with no consumer
        # subscribing to it meanwhile: that consumer would open the version before the reset, and its next save
        # would conflict with the reset's and fence the topic (as for skip, expire and reset-cursor).
        async with self._opening_subscription:
            for name in sorted(names):
                rt = self.subscriptions.get(name)
                if rt is None or (rt.cursor is not None and not rt.consumers):
                    # (an idle one listed too: its znode gone, an UNSUBSCRIBE whose delete was applied with its
                    # reply lost, it leaves the topic's list; sought, its reset's save failed and ended the eviction)
                    try:
                        rt, mc = await sub_ops.subscription_cursor(self, name)
                    except sub_ops.SubscriptionNotFoundError:
                        continue  # deleted since it was listed
                if rt is None:
                    if mc.mark_delete < target:
                        log.warning(
                            "topic=%s subscription=%s backlog evicted up to %s", self.name, name, target
                        )
                        await mc.reset(start)
                        self.service.metrics.quota_evictions += 1
                elif rt.cursor is not None and rt.cursor.mark_delete < target:  # a reader's holds no backlog
                    log.warning("topic=%s subscription=%s backlog evicted up to %s", self.name, name, target)
                    await rt.seek(start)
                    self.service.metrics.quota_evictions += 1

    # -- subscriptions --------------------------------------------------------------------------------------

    async def terminate(self) -> Position:
        """Pulsar's terminate: the managed ledger takes no more entries (``ManagedLedger.terminate``, stored for
        every later owner) and the producers are closed: reopening, they are refused with TopicTerminatedError
        (as their later sends are). Consumers read on to the last entry. Answers its position."""
        last = await self.ml.terminate()
        for p in list(self.producers.values()):
            self.remove_producer(p)
            p.session.producers.pop(p.producer_id, None)
            # a SEND the client wrote before it saw CLOSE_PRODUCER is dropped (it resends after reconnecting and
            # is refused then), as after a quota's close: not "no producer", which closes the whole connection
            p.session.closed_by_quota[p.producer_id] = True
            p.session.send(wire.close_producer(p.producer_id, 0))
        return last

    async def subscription(self, s: pb.CommandSubscribe) -> SubscriptionRuntime:
        """The subscription ``s`` names, opened (its cursor restored or created) on first use. Opening is one
        at a time: two consumers subscribing a new subscription at once must not both create its cursor (the
        second creation would conflict and fence the topic)."""
        rt = self.subscriptions.get(s.subscription)
        if rt is not None and (rt.consumers or rt.cursor is None):
            return rt
        # an idle one too is taken under the lock: the subscription expiration (``sub_ops.delete_inactive``)
        # deletes an idle subscription under it, and the caller attaches its consumer before anything else runs
        # once this returns; refreshed outside it, the expiry deleted the subscription meanwhile and the
        # consumer was attached to a subscription gone from the topic and from ZooKeeper
        async with self._opening_subscription:
            rt = self.subscriptions.get(s.subscription)
            if rt is None:
                return await self._open_subscription(s)
            # idle: another writer may have moved it (it restarts from there); its znode gone, an UNSUBSCRIBE whose
            # delete was applied with its reply lost listed it again for the client's retry, and none came: the
            # subscription is deleted, made anew as an open of its name makes it (ManagedCursor.open drops the
            # ghost cursor), not served on a cursor whose every save fails
            if rt.cursor is not None and not rt.consumers and not await rt.cursor.refresh():
                self.subscriptions.pop(s.subscription, None)
                return await self._open_subscription(s)
            return rt

    async def subscriptions_full(self, name: str) -> bool:
        """Would a subscription ``name`` be one past ``max_subscriptions`` (taken under ``_opening_subscription``)?
        As Pulsar's (``PersistentTopic.checkMaxSubscriptionsPerTopicExceed``): one that exists (served, or its
        cursor stored) is never refused; the others are counted, the stored cursors (the compactor's
        ``__compaction`` too) and the readers' subscriptions being served."""
        if not self.max_subscriptions or name in self.subscriptions:
            return False
        stored = set(await self.ml.store.list_cursors(self.ml.name))
        if name in stored:
            return False
        return len(stored | set(self.subscriptions)) >= self.max_subscriptions

    async def _open_compaction_cursor(self) -> ManagedCursor:
        """The compactor's ``__compaction`` cursor, created by its first compaction as a new subscription: past
        ``max_subscriptions`` it is not, and :class:`SubscriptionsLimitError` fails the compaction (Pulsar's
        compactor subscribes through ``getDurableSubscription``, whose limit's check makes no exception for it)."""
        async with self._opening_subscription:
            if await self.subscriptions_full(COMPACTION_SUBSCRIPTION):
                raise SubscriptionsLimitError(self.name)
            return await ManagedCursor.open(self.ml, COMPACTION_SUBSCRIPTION, InitialPosition.EARLIEST)

    async def _open_subscription(self, s: pb.CommandSubscribe) -> SubscriptionRuntime:
        # a reader's (non-durable) too, as Pulsar's getNonDurableSubscription
        if await self.subscriptions_full(s.subscription):
            raise SubscriptionsLimitError(self.name)
        sub_type = SubType(s.subType)
        core = Subscription(
            sub_type,
            partition=self.name.partition_index,
            unacked_messages_max=self.max_unacked_on_consumer,
            topic_hash=failover_topic_hash(str(self.name)),
        )
        core.unacked_subscription_max = self.max_unacked_on_subscription
        core.failover_delay_s = FAILOVER_SWITCH_DELAY_S
        if s.durable:
            initial = (
                InitialPosition.EARLIEST
                if s.initialPosition == pb.CommandSubscribe.Earliest
                else InitialPosition.LATEST
            )
            # (the one an admin call opened, if it did: one cursor object per subscription, whose saves agree)
            cursor = await ManagedCursor.open(self.ml, s.subscription, initial)
            start = self.ml.next_position(cursor.mark_delete)
            rt = SubscriptionRuntime(self, s.subscription, core, cursor, start)
        else:
            start = self._reader_start(s)
            rt = SubscriptionRuntime(self, s.subscription, core, None, start)
        self.subscriptions[s.subscription] = rt
        return rt

    def _reader_start(self, s: pb.CommandSubscribe) -> Position:
        if s.HasField("start_message_id"):
            mid = _position(s.start_message_id)
            if mid.ledger_id == INT64_MAX or mid.entry_id == INT64_MAX:
                return self.ml.next_position(self.ml.last_confirmed_position())
            if mid.ledger_id < 0 or mid.entry_id < 0:
                return self.earliest(s.read_compacted)
            return self.not_past_the_end(mid)
        if s.initialPosition == pb.CommandSubscribe.Earliest:
            return self.earliest(s.read_compacted)
        return self.ml.next_position(self.ml.last_confirmed_position())

    async def initial_subscription(self, name: str) -> None:
        """A producer's ``initial_subscription_name`` (the C++ client's dead-letter producer sends the policy's):
        the subscription is created at the earliest message when the topic has none of that name, as Pulsar
        does, so that what is produced is kept for it before any consumer comes. Ignored, a dead-letter topic
        nobody had subscribed to kept its messages for no subscription: a consumer at latest never saw them,
        and retention let them go. Past ``maxSubscriptionsPerTopic`` it is not created and
        :class:`SubscriptionsLimitError` raised: Pulsar's handleProducer creates it through the same checked
        path (``createSubscription``) and refuses the producer NotAllowedError."""
        async with self._opening_subscription:  # (as a consumer's subscribe and the admin's create)
            if name in self.subscriptions or name in self.ml.cursors:
                return
            if await self.ml.store.get_cursor(self.ml.name, name) is None:
                if await self.subscriptions_full(name):
                    raise SubscriptionsLimitError(self.name)
                await ManagedCursor.open(self.ml, name, InitialPosition.EARLIEST)

    def not_past_the_end(self, pos: Position) -> Position:
        """``pos``, or the next entry to be written when ``pos`` is past the last stored one: as in Pulsar (its
        cursors take such a position for the latest), a reader that starts or a subscription that seeks past the
        end gets what is written next. Taken as is, the position waited for a ledger or an entry the topic
        reaches much later, if ever, and the messages written before it were never delivered (a seek acknowledged
        them)."""
        last = self.ml.last_confirmed_position()
        return self.ml.next_position(last) if pos > last else pos

    def earliest(self, read_compacted: bool) -> Position:
        """Where a reader or seek to the earliest message starts: the first stored entry, or for a compacted
        reader of a compacted topic the compacted ledger's first entry, which may be older (retention may have
        trimmed the ledgers before the horizon): ``EARLIEST_COMPACTED``, before every position."""
        if read_compacted and self.compaction.horizon is not None:
            return EARLIEST_COMPACTED
        return self.ml.first_position()

    # -- stats ----------------------------------------------------------------------------------------------

    def sample_rates(self, now: float) -> None:
        """A sample of the counters behind every rate the stats show (the topic's, its producers' and its
        consumers'), taken at each tick so that the first read of the stats has a window to measure."""
        self.service.metrics.topic(self.key).topic_rates(self.msg_in, self.bytes_in, now)
        for p in self.producers.values():
            p.counters.sampled("In", now)
        for sub in self.subscriptions.values():
            for c in sub.consumers.values():
                _consumer_rates(c, now)

    def stats(self) -> dict[str, Any]:
        return {
            "msgInCounter": self.msg_in,
            "bytesInCounter": self.bytes_in,
            "publishers": [
                {
                    "producerName": p.name,
                    "producerId": p.producer_id,
                    "accessMode": pb.ProducerAccessMode.Name(p.access_mode),
                    **p.counters.sampled("In"),
                    "averageMsgSize": p.counters.bytes / p.counters.messages if p.counters.messages else 0.0,
                    "metadata": dict(p.metadata),
                    **_client_stats(p.session, p.counters),
                }
                for p in self.producers.values()
            ],
            # WaitForExclusive producers queued behind the one that holds the topic (those still waiting)
            "waitingPublishers": sum(
                1
                for w in self.waiting
                if not w.session.closed and w.session.waiting.get(w.cmd.producer_id) is self
            ),
            "subscriptions": {n: s.stats() for n, s in self.subscriptions.items()},
        }

    def internal_stats(self) -> dict[str, Any]:
        view = self.ml.view()
        return {
            "entriesAddedCounter": view.total_entries(),
            "numberOfEntries": view.total_entries(),
            "currentLedgerEntries": view.entries_in(view.current_ledger_id),
            "lastConfirmedEntry": str(self.ml.last_confirmed_position()),
            "ledgers": [{"ledgerId": lid, "entries": n} for lid, n in view.ledgers],
            "cursors": {
                n: {
                    "markDeletePosition": str(s.mark_position),
                    "readPosition": str(Position(*s.core.read_position)),
                    "individuallyDeletedMessages": str(
                        [(str(a), str(b)) for a, b in s.cursor.cursor.individually_deleted]
                    )
                    if s.cursor
                    else "[]",
                }
                for n, s in self.subscriptions.items()
            },
            "properties": dict(self.ml.properties),
            "compactedLedger": self.compaction.ledger_stats(),
        }


# ------------------------------------------------------------------------------------------------------------
# the service


class TopicChecksFailedError(Exception):
    """A periodic check of the topics served here (compaction thresholds, message TTLs) failed for some of them;
    the others were checked."""

    def __init__(self, failed: list[str]) -> None:
        shown = "; ".join(failed[:5]) + (f"; and {len(failed) - 5} more" if len(failed) > 5 else "")
        super().__init__(f"{len(failed)} topic(s) failed: {shown}")
        self.failed = failed


#: what makes one namespace's or topic's policies unreadable, not ZooKeeper's (a znode that does not parse, a
#: value of the wrong shape, ACLs): the policy refresh passes it over and goes on with the others
_UNREADABLE = (
    zk.MetadataFormatError,
    zk.InvalidMetadataError,
    zk.MetadataAuthError,
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
)


class _OwnPolicies:
    """The topics' own policies (``topic-policies/<ml>``) for one pass of a monitor over the topics served here,
    by base name (the partitions of one topic share them). Which topics have any is known by one listing per
    namespace: most have none, and a read of each one's znode at every check cost ZooKeeper one request per
    topic served."""

    def __init__(self, meta: BrokerMetadataStore) -> None:
        self.meta = meta
        self.own: dict[str, TopicPolicies | None] = {}
        self.listed: dict[tuple[str, str], set[str]] = {}

    async def of(self, topic: Topic) -> TopicPolicies | None:
        ns = (topic.name.tenant, topic.name.namespace)
        if ns not in self.listed:
            self.listed[ns] = await self.meta.topics_with_policies(*ns)
        base = topic.name.base.ml_name
        if base not in self.own:
            self.own[base] = await self.meta.get_topic_policies(base) if base in self.listed[ns] else None
        return self.own[base]


class BrokerService:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        previous = [config.auth_previous_secret] if config.auth_previous_secret is not None else []
        self.verifier = (
            TokenVerifier(config.auth_secret, previous=previous) if config.auth_secret is not None else None
        )
        #: the TLS port's context and its reload on the housekeeping (None: no TLS port)
        self.tls: TlsFiles | None = None
        if config.tls_port is not None and config.tls_cert_file and config.tls_key_file:
            self.tls = TlsFiles(
                config.id,
                config.tls_cert_file,
                config.tls_key_file,
                config.tls_trust_certs_file,
                config.tls_require_trusted_client_cert,
                config.tls_cert_refresh_check_s,
            )
        self.conn_config = ConnectionConfig(
            max_message_size=config.max_message_size,
            authenticate=self.authenticate_token if self.verifier is not None else None,
            auth_required=config.auth_required,
        )
        self.bk: BookKeeper | None = None
        self.meta: BrokerMetadataStore | None = None
        self.metrics = BrokerMetrics()
        self.topics: dict[str, asyncio.Future[Topic]] = {}
        #: topics no longer served whose close (their ledger list's last write) is under way, by name
        self._closing: dict[str, asyncio.Task[None]] = {}
        #: the topics whose delete is under way (in ``_closing`` too): an open waits for it, never opens beside it
        self._deleting: set[str] = set()
        #: topic -> (the lock its ownership's release and take hold, how many hold or await it): see
        #: :meth:`_ownership_change`
        self._ownership_locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        #: topic -> (its name, when a lookup last found it owned here but not open): see :meth:`lookup_owner`
        self._looked_up: dict[str, tuple[TopicName, float]] = {}
        self.sessions: set[Session] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        #: names for producers that bring none: unique across this broker's restarts too (Pulsar draws them
        #: from a ZooKeeper counter), since the dedup state of a name outlives the process that gave it
        self._producer_names = itertools.count()
        self._producer_name_prefix = f"{config.id.replace(':', '-')}-{secrets.token_hex(4)}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._compaction_monitor: asyncio.Task[None] | None = None
        self._session_lost = False
        self._registering_again = False  # a _register_again under way (a flapping session starts no second)
        self._stopping = False
        # set when the broker lost its registration and could not register again: it serves nothing then, and
        # ``serve`` shuts the process down (exit 1), as a Pulsar broker does that cannot keep its registration
        self.registration_failed = asyncio.Event()
        self._zk_connected = True  # the session's last state was CONNECTED (not SUSPENDED or LOST)
        self.bookie_supply = BookieSupply(config.id, config.ensemble_size)
        self._policies_failing = RateLimitedLog(log, LOG_EVERY_S)  # (ZooKeeper away)
        self._tick_failing = RateLimitedLog(log, LOG_EVERY_S)  # (a housekeeping step that raised)
        self._open_files = OpenFilesWatch(f"broker={config.id}")  # (out of descriptors: connections dropped)
        self._expiry_monitor: asyncio.Task[None] | None = None
        self._subscription_expiry_monitor: asyncio.Task[None] | None = None
        self._ownership_tidy: asyncio.Task[None] | None = None
        #: topic -> subscription -> when the subscription expiration check last saw a consumer on it (ms)
        self._consumers_seen_ms: dict[str, dict[str, int]] = {}

    # -- authentication and authorization ---------------------------------------------------------------------

    def authenticate(self, method: str, data: bytes) -> str:
        """A token's subject (the admin HTTP's check); AuthenticationFailed otherwise."""
        return self.authenticate_token(method, data)[0]

    def authenticate_token(self, method: str, data: bytes) -> tuple[str, float | None]:
        """A token's subject and expiry (CONNECT's and AUTH_RESPONSE's check); AuthenticationFailed otherwise."""
        if self.verifier is None:
            raise AuthenticationFailed("the broker has no token secret")
        try:
            principal = self.verifier.verify(data)
        except TokenError as e:
            self.metrics.auth_failures += 1
            raise AuthenticationFailed(str(e)) from None
        return principal.subject, principal.expires_at

    def is_superuser(self, role: str | None) -> bool:
        return role is not None and role in self.config.superuser_roles

    def checks_permissions(self, role: str | None) -> bool:
        """Are ``role``'s requests checked against the namespace's permissions (``--auth-required``, not a
        superuser)?"""
        return self.config.auth_required and not self.is_superuser(role)

    async def can(
        self,
        role: str | None,
        name: TopicName,
        actions: tuple[str, ...],
        known: NamespacePolicies | None = None,
    ) -> bool:
        """May ``role`` do one of ``actions`` (``produce``, ``consume``) on the topic? Always yes without
        ``--auth-required``; superusers may do everything; otherwise what the namespace's permissions grant the
        role (Pulsar's ``namespaces grant-permission``) and what the topic's own grant it (``topics
        grant-permission``; a partition's are its partitioned topic's) decide: ``known``, the namespace's
        policies the caller has just read, else read here."""
        if not self.checks_permissions(role):
            return True
        if role is None:
            return False
        assert self.meta is not None
        policies = known if known is not None else await self.meta.get_policies(name.tenant, name.namespace)
        if policies is None:
            return False
        granted = (
            *policies.permissions.get(role, ()),
            *policies.topic_permissions.get(str(name.base), {}).get(role, ()),
        )
        return any(a in granted for a in actions)

    async def _authorized(
        self, s: Session, name: TopicName, actions: tuple[str, ...], known: NamespacePolicies | None = None
    ) -> str | None:
        """None when the session's role may do one of ``actions`` on ``name``; else the refusal's text."""
        try:
            if await self.can(s.conn.principal, name, actions, known):
                return None
        except zk.MetadataError as e:
            return f"permissions of {name.namespace_name} cannot be read: {e}"
        return self._refused(s, name, actions)

    def _refused(self, s: Session, name: TopicName, actions: tuple[str, ...]) -> str:
        """The text of the session's refusal to do ``actions`` on ``name`` (counted)."""
        self.metrics.authz_refusals += 1
        return f"{s.conn.principal or 'an anonymous client'} is not authorized to {' or '.join(actions)} on {name}"

    def serves(self, name: TopicName) -> bool:
        """Is the topic open here? (Its namespace exists then: it cannot be deleted while the topic exists.)"""
        fut = self.topics.get(str(name))
        return fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None

    async def _lookup_refusal(
        self, s: Session, name: TopicName, what: str
    ) -> tuple[tuple[pb.ServerError, str] | None, NamespacePolicies | None]:
        """Why ``what`` (a PARTITIONED_METADATA or LOOKUP) of ``name`` is refused: (AuthorizationError, why) when
        the session's role may neither produce nor consume there, (TopicNotFound, "Namespace not found") when its
        namespace does not exist; None when it is not. As Pulsar, the role is authorized first: a namespace that
        does not exist grants nothing, so a role whose permissions are checked is refused there as anywhere it
        has no grant, and learns nothing of which namespaces exist. The namespace's policies are read once for
        both (not at all for a topic served here when permissions are not checked), and given back beside the
        answer (None when not read) for the request's next step."""
        known: NamespacePolicies | None = None
        if self.checks_permissions(s.conn.principal) or not self.serves(name):
            assert self.meta is not None
            known = await self.meta.get_policies(name.tenant, name.namespace)
            if known is None and self.checks_permissions(s.conn.principal):
                return (pb.AuthorizationError, self._refused(s, name, EITHER)), None
            # (a namespace whose delete is under way: only for a topic that does not exist, which it would create)
            exists = known is not None and (not known.deleted or await self._exists_any(name))
        else:
            exists = True  # a topic served here: its namespace exists (it cannot be deleted under a topic)
        if not exists:
            log.info("broker=%s %s of %s: namespace not found", self.config.id, what, name)
            return (pb.TopicNotFound, NAMESPACE_NOT_FOUND), None
        refused = await self._authorized(s, name, EITHER, known)
        return (None if refused is None else (pb.AuthorizationError, refused)), known

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.bk = await BookKeeper.connect(
            self.config.zk,
            config=ClientConfig(
                zk_root=self.config.zk_root,
                zk_session_timeout_s=self.config.zk_session_timeout_s,
                ensemble_change_timeout_s=self.config.ensemble_change_timeout_s,
                auth_token=self.config.bookie_auth_token,
            ),
        )
        # a mistyped --zk-root is refused (NoClusterError) before anything is written under it
        await asyncio.to_thread(zk.cookies.existing_instance_id, self.bk.store)
        self.meta = BrokerMetadataStore(self.bk.store, namespaces=True)
        await self.meta.ensure_default_namespace()
        # before the registration: a session lost after it (during the bookies' watch) was never followed by a
        # registration again, the broker serving unregistered
        self.bk.store.add_session_listener(self._session_listener)
        await self._register()
        await self.bookie_supply.watch(self.bk.registry)
        self._ticker = asyncio.get_running_loop().create_task(self._tick_loop())
        loop = asyncio.get_running_loop()
        # Pulsar's compaction monitor and expiry monitor
        self._compaction_monitor = loop.create_task(
            self._every(
                self.config.compaction_monitor_interval_s,
                self.check_compaction,
                "compaction thresholds not checked",
            )
        )
        self._expiry_monitor = loop.create_task(
            self._every(
                self.config.message_expiry_check_interval_s,
                self.check_message_expiry,
                "message TTLs not applied",
            )
        )
        self._subscription_expiry_monitor = loop.create_task(
            self._every(
                self.config.subscription_expiry_check_interval_s,
                self.expire_inactive_subscriptions,
                "subscription expiration not checked",
            )
        )
        self._ownership_tidy = loop.create_task(
            self._every(
                self.config.ownership_tidy_interval_s,
                self.tidy_ownership_dirs,
                "ownership directories of deleted namespaces not tidied",
                at_once=True,
            )
        )
        log.info("broker=%s serving %s", self.config.id, self.config.service_url)

    async def _register(self) -> None:
        assert self.meta is not None
        await self.meta.register_broker(
            self.config.id,
            BrokerInfo(
                service_url=self.config.service_url,
                web_service_url=self.config.web_service_url,
                service_url_tls=self.config.service_url_tls,
                web_service_url_tls=self.config.web_service_url_tls,
            ),
        )

    async def _register_again(self) -> None:
        """After a lost session: brokers/<id> again. If another live session registered this id meanwhile
        (MetadataExistsError, after the wait of ``register_broker``), the broker must not go on serving
        unregistered (lookups would not find it; the other broker of this id may own its topics): its
        connections are closed and ``registration_failed`` is set for ``serve`` to shut down. Any other failure
        (ZooKeeper still flapping: a connection lost, a timeout, the session lost again) is tried again, 0.1 s
        to 2 s apart, until the broker stops: one ZooKeeper blip made every broker exit."""
        pauses = backoff(0.1, 2.0)
        try:
            while True:
                try:
                    await self._register()
                    return
                except zk.MetadataExistsError as e:
                    failure = e
                    break
                except Exception as e:
                    if self._stopping:
                        return
                    log.warning(
                        "broker=%s could not register again after its lost ZooKeeper session: %s; retrying",
                        self.config.id,
                        e,
                    )
                    await asyncio.sleep(next(pauses))
        finally:
            self._registering_again = False
        log.error(
            "broker=%s lost its registration with its ZooKeeper session and could not register again: %s; "
            "shutting down rather than serve unregistered",
            self.config.id,
            failure,
        )
        for fut in list(self.topics.values()):
            if fut.done() and not fut.exception():
                self.topic_lost(fut.result(), "broker registration lost")
        for sess in list(self.sessions):
            sess.transport.close()
        self.registration_failed.set()

    async def stop(self) -> None:
        self._stopping = True
        if self._ticker is not None:
            self._ticker.cancel()
        if self._compaction_monitor is not None:
            self._compaction_monitor.cancel()
        if self._expiry_monitor is not None:
            self._expiry_monitor.cancel()
        if self._subscription_expiry_monitor is not None:
            self._subscription_expiry_monitor.cancel()
        if self._ownership_tidy is not None:
            self._ownership_tidy.cancel()
        self.bookie_supply.close()
        for s in list(self.sessions):
            s.transport.close()
        zk_away = self.meta is not None and not self._zk_connected
        if zk_away:  # each metadata write of a clean stop would wait out its timeout, one after the other
            log.warning(
                "broker=%s stopping with ZooKeeper unreachable: its %d topics are left as after a crash (the "
                "next owner recovers their ledgers; acks not yet flushed are delivered again)",
                self.config.id,
                len(self.topics),
            )
        for name in list(self.topics):
            fut = self.topics.pop(name)
            if zk_away:
                continue
            if fut.done() and not fut.exception():
                topic = fut.result()
                topic.unloaded = True
                with contextlib.suppress(Exception):
                    await topic.ml.close()
                if self.meta is not None:
                    with contextlib.suppress(Exception):
                        await self.meta.release_ownership(topic.name.ml_name, self.config.id)
        if self.meta is not None and not zk_away:
            with contextlib.suppress(Exception):
                await self.meta.unregister_broker(self.config.id)
        closing = [t for t in self._closing.values() if not t.done()]
        if closing and not zk_away:
            # closes under way (topics lost or unloaded just before: a failed re-registration drops them all)
            # end before the client closes under them: their ledgers closed, their cursors flushed, not cut short
            # to be recovered, their last acknowledgements delivered again
            await asyncio.wait(closing, timeout=CLOSE_WAIT_S)
        if self.bk is not None:
            with contextlib.suppress(Exception):
                await self.bk.close()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _session_listener(self, state: str) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_session_state, state)

    def _on_session_state(self, state: str) -> None:
        log.warning("broker=%s ZooKeeper session %s", self.config.id, state)
        self._zk_connected = state == "CONNECTED"
        if state == "LOST":
            self._session_lost = True
            for fut in list(self.topics.values()):
                if fut.done() and not fut.exception():
                    self.topic_lost(fut.result(), "ZooKeeper session lost")
        elif state == "CONNECTED" and self._session_lost:
            self._session_lost = False
            if not self._registering_again:  # (one under way goes on, on the new session)
                self._registering_again = True
                self.spawn(self._register_again())

    async def _tick_loop(self) -> None:
        """Every second: keep-alive of the connections. Every ``tick_interval_s``: the namespaces' policies
        (retention, dedup) read again and applied, then each topic's housekeeping (rollover, cursor flushes,
        retention)."""
        next_topic_tick = time.monotonic() + self.config.tick_interval_s
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            # (nothing here may end the loop: every topic's rollover, retention and quota hang on it)
            with self._tick_failing.catching(Exception, "housekeeping: bookies or TLS files not checked"):
                self.bookie_supply.remind()
                self._open_files.check()
                if self.tls is not None:
                    self.tls.check(now)
            for s in list(self.sessions):
                with self._tick_failing.catching(Exception, "housekeeping: a connection's keep-alive failed"):
                    s.tick(now)
            if now < next_topic_tick:
                continue
            next_topic_tick = now + self.config.tick_interval_s
            self._release_looked_up(now)
            with self._policies_failing.catching(Exception, "namespace policies not refreshed"):
                await self.refresh_policies()
            draining: set[str] = set()
            if self.bk is not None and self.served_topics():
                with self._tick_failing.catching(Exception, "housekeeping: decommissioning bookies not read"):
                    writable, draining = await self.bk.draining_bookies()
                    if len(writable - draining) < self.bookie_supply.needed:
                        draining = set()  # a new ledger could only be placed on them again: keep writing
            for topic in self.served_topics():
                # the time of the sample itself: the topics before it may have waited on ZooKeeper or bookies
                topic.sample_rates(time.monotonic())
                try:
                    await self.enforce_quota(topic)
                    # without the bookies a new ledger needs, a rollover only fails again (cursors are flushed)
                    # a ledger on a bookie being decommissioned is rolled at once: the decommission waits for it
                    await topic.ml.tick(rollover=not self.bookie_supply.short, draining=draining)
                except ManagedLedgerFencedError as e:
                    self.topic_lost(topic, str(e))
                except Exception as e:
                    topic.tick_failures.warning("topic=%s tick failed: %s", topic.name, e)
                else:
                    topic.tick_failures.reset()

    @staticmethod
    async def _every(
        interval_s: float, check: Callable[[], Awaitable[object]], failed: str, *, at_once: bool = False
    ) -> None:
        """``check()`` every ``interval_s`` (``at_once``: the first at once), its failures logged as ``failed``
        at most once a minute."""
        failing = RateLimitedLog(log, LOG_EVERY_S)
        if not at_once:
            await asyncio.sleep(interval_s)
        while True:
            with failing.catching(Exception, failed):
                await check()
            await asyncio.sleep(interval_s)

    async def tidy_ownership_dirs(self) -> None:
        """The ownership directories of namespaces that no longer exist removed where empty
        (:meth:`BrokerMetadataStore.tidy_ownership_dirs`), a line logged when some went."""
        if self.meta is None or self._session_lost:
            return
        removed = await self.meta.tidy_ownership_dirs()
        if removed:
            log.info(
                "broker=%s removed %d empty ownership directories of deleted namespaces",
                self.config.id,
                removed,
            )

    async def check_compaction(self) -> None:
        """Start a compaction of each topic served here whose backlog exceeds its compaction threshold
        (:func:`compaction_due`); a partition is a topic of its own here, with its partitioned topic's policies.
        A topic whose check fails (its policies unreadable) is passed over: the others are checked, and then
        :class:`TopicChecksFailedError` names it."""
        assert self.meta is not None
        own = _OwnPolicies(self.meta)
        failed: list[str] = []
        for topic in self.served_topics():
            try:
                await self._check_compaction_of(topic, own)
            except Exception as e:
                failed.append(f"{topic.name}: {e}")
        if failed:
            raise TopicChecksFailedError(failed)

    async def _check_compaction_of(self, topic: Topic, own: _OwnPolicies) -> None:
        tp = await own.of(topic)
        threshold = policy_in_force(
            None if tp is None else tp.compaction_threshold,
            topic.namespace_compaction_threshold,
            self.config.compaction_threshold_bytes,
        )
        if threshold <= 0:
            return
        backlog = topic.compaction_backlog_bytes()
        serving = not topic.unloaded and not topic.ml.closed
        if compaction_due(threshold, backlog, running=topic.compaction.running, serving=serving):
            log.info(
                "topic=%s backlog of %d bytes exceeds its compaction threshold of %d: compacting",
                topic.name,
                backlog,
                threshold,
            )
            topic.compaction.trigger()

    async def check_message_expiry(self) -> None:
        """Each topic served here with a message TTL over 0 (its own ``message_ttl_in_seconds``, else its
        namespace's, else ``--ttl-duration-default-s``: :func:`policy_in_force`; a partition has its partitioned
        topic's): every durable subscription but the compactor's acknowledges the messages published longer ago
        than that (``sub_ops.expire_all``); the backlogs shrink, and retention then lets the ledgers go. A topic
        whose check fails (its entries unreadable now) is passed over: the others are checked, and then
        :class:`TopicChecksFailedError` names it."""
        assert self.meta is not None
        ns_ttls: dict[tuple[str, str], int | None] = {}
        own = _OwnPolicies(self.meta)
        failed: list[str] = []
        for topic in self.served_topics():
            ns = (topic.name.tenant, topic.name.namespace)
            try:
                if ns not in ns_ttls:
                    p = await self.meta.get_policies(*ns)
                    ns_ttls[ns] = None if p is None else p.message_ttl_in_seconds
                tp = await own.of(topic)
                ttl = policy_in_force(
                    None if tp is None else tp.message_ttl_in_seconds,
                    ns_ttls[ns],
                    self.config.ttl_duration_default_s,
                )
                if ttl <= 0 or topic.unloaded or topic.ml.closed:
                    continue
                moved = await sub_ops.expire_all(topic, ttl, int(time.time() * 1000))
            except ManagedLedgerFencedError as e:
                self.topic_lost(topic, str(e))
                continue
            except Exception as e:
                failed.append(f"{topic.name}: {e}")
                continue
            if moved:
                log.info("topic=%s message TTL %d s: subscriptions %s expired", topic.name, ttl, moved)
        if failed:
            raise TopicChecksFailedError(failed)

    async def expire_inactive_subscriptions(self) -> None:
        """Pulsar's subscription expiration, every ``--subscription-expiry-check-interval-s`` (Pulsar's
        ``subscriptionExpiryCheckIntervalInMinutes``; a ZooKeeper list and a read per subscription of each topic,
        not at each housekeeping tick): in each namespace whose ``subscription_expiration_time_minutes`` is over
        0, each topic served here deletes the durable subscriptions (the compactor's aside) with no consumer that
        were last active longer ago than that (:func:`sub_ops.delete_inactive`; last active: the cursor's last
        save, its last consumer leaving it here, or the last pass that saw a consumer on it). A topic whose check
        fails is logged (rate limited) and the others are checked."""
        assert self.meta is not None
        now_ms = int(time.time() * 1000)
        served = self.served_topics()
        seen = self._consumers_seen_ms
        for key in set(seen) - {str(t.name) for t in served}:
            del seen[key]
        minutes_of: dict[tuple[str, str], int] = {}
        for topic in served:
            mine = seen.setdefault(str(topic.name), {})
            mine.update((sub, now_ms) for sub, rt in topic.subscriptions.items() if rt.consumers)
            ns = (topic.name.tenant, topic.name.namespace)
            try:
                if ns not in minutes_of:
                    p = await self.meta.get_policies(*ns)
                    minutes_of[ns] = (None if p is None else p.subscription_expiration_time_minutes) or 0
                if minutes_of[ns] <= 0 or topic.unloaded or topic.ml.closed:
                    continue
                _save_attached_activity(topic, minutes_of[ns], now_ms)
                deleted = await sub_ops.delete_inactive(topic, minutes_of[ns] * 60_000, now_ms, mine)
            except ManagedLedgerFencedError as e:
                self.topic_lost(topic, str(e))
                continue
            except Exception as e:
                self._tick_failing.warning("topic=%s subscription expiration not checked: %r", topic.name, e)
                continue
            for sub in deleted:
                mine.pop(sub, None)
            if deleted:
                log.info(
                    "topic=%s subscriptions %s deleted: no consumer for over %d minutes (subscriptionExpirationTime)",
                    topic.name,
                    deleted,
                    minutes_of[ns],
                )

    async def refresh_policies(self) -> None:
        """Read the policies of every namespace with a topic served here and apply them (changes made through
        any broker's admin REST, or directly in ZooKeeper, take effect within one tick)."""
        assert self.meta is not None
        by_ns: dict[tuple[str, str], list[Topic]] = {}
        for t in self.served_topics():
            by_ns.setdefault((t.name.tenant, t.name.namespace), []).append(t)
        own = _OwnPolicies(self.meta)
        for (tenant, ns), topics in by_ns.items():
            # one namespace's or topic's policies unreadable (a znode that does not parse) leave what is applied
            # to it as it was, and the others are still applied; ZooKeeper away ends the pass (the next tick tries)
            try:
                policies = await self.meta.get_policies(tenant, ns)
            except _UNREADABLE as e:
                self._policies_failing.warning("namespace %s/%s: policies not refreshed: %r", tenant, ns, e)
                continue
            for t in topics:
                try:
                    tp = await own.of(t)
                except _UNREADABLE as e:
                    if not t.own_policies_unreadable:  # said once (the topic's opening may have said it)
                        log.warning("topic %s: its own policies not refreshed: %r", t.name, e)
                    t.own_policies_unreadable = True
                    tp = t.own_policies
                else:
                    t.own_policies_unreadable = False
                self.apply_policies(t, policies, tp)
                if policies is not None and policies.subscription_expiration_time_minutes:
                    _save_attached_activity(
                        t, policies.subscription_expiration_time_minutes, int(time.time() * 1000)
                    )

    def dedup_in_force(self, p: NamespacePolicies, own: TopicPolicies) -> bool:
        return policy_in_force(own.deduplication_enabled, p.deduplication_enabled, self.config.dedup_enabled)

    def apply_policies(
        self, topic: Topic, policies: NamespacePolicies | None, own: TopicPolicies | None = None
    ) -> None:
        """The policies in force on ``topic``: each of its own (``own``: its partitioned topic's for a partition)
        where set, else its namespace's (``policies``), else the broker's default (:func:`policy_in_force`):
        retention, deduplication, the backlog quota, the limits of producers, consumers and unacknowledged
        messages per consumer (the compaction threshold and message TTL are read by their monitors)."""
        p = policies or NamespacePolicies()
        tp = own or TopicPolicies()
        topic.own_policies = tp
        retention = (p.retention_time_s, p.retention_size_bytes)
        if tp.retention_time_s is not None and tp.retention_size_bytes is not None:
            retention = (tp.retention_time_s, tp.retention_size_bytes)
        topic.ml.retention_time_s, topic.ml.retention_size_bytes = retention
        dedup = self.dedup_in_force(p, tp)
        if dedup and not topic.dedup_enabled:
            # Turned on while served: the sequence ids seen since are not known, so the first SEND of each
            # producer after this is stored (as Pulsar does when dedup is enabled on a live topic).
            topic.dedup_enabled = True
        elif not dedup:
            topic.dedup_enabled = False
        topic.quota = p.backlog_quota if tp.backlog_quota is None else tp.backlog_quota
        topic.age_quota = p.message_age_quota if tp.message_age_quota is None else tp.message_age_quota
        topic.namespace_compaction_threshold = p.compaction_threshold
        topic.max_producers = policy_in_force(tp.max_producers, p.max_producers_per_topic, 0)
        topic.max_consumers = policy_in_force(tp.max_consumers, p.max_consumers_per_topic, 0)
        topic.max_consumers_per_subscription = policy_in_force(
            tp.max_consumers_per_subscription, p.max_consumers_per_subscription, 0
        )
        topic.max_subscriptions = policy_in_force(
            tp.max_subscriptions_per_topic, p.max_subscriptions_per_topic, 0
        )
        unacked = policy_in_force(
            tp.max_unacked_messages_on_consumer,
            p.max_unacked_messages_per_consumer,
            DEFAULT_UNACKED_MESSAGES_MAX,
        )
        topic.max_unacked_on_consumer = unacked if unacked > 0 else INT64_MAX  # 0: no limit
        on_sub = policy_in_force(
            tp.max_unacked_messages_on_subscription,
            p.max_unacked_messages_per_subscription,
            DEFAULT_UNACKED_SUBSCRIPTION_MAX,
        )
        topic.max_unacked_on_subscription = on_sub if on_sub > 0 else INT64_MAX
        for rt in list(topic.subscriptions.values()):
            core = rt.core
            raised = (
                topic.max_unacked_on_consumer > core.unacked_messages_max
                or topic.max_unacked_on_subscription > core.unacked_subscription_max
            )
            core.unacked_messages_max = topic.max_unacked_on_consumer
            core.unacked_subscription_max = topic.max_unacked_on_subscription
            if raised and rt.consumers:  # a consumer held at the old limit is sent more now
                rt.execute(rt.core.resume())

    async def quota_exceeded(self, topic: Topic, *, evict: bool) -> tuple[str, str] | None:
        """The first of the topic's backlog quotas with a producer policy that it exceeds, as (policy, why);
        None when none. The ``destination_storage`` quota: ``limit_size`` bytes of the slowest durable
        subscription's backlog; the ``message_age`` quota: ``limit_time`` seconds (0 or less: none) since the
        oldest message not acknowledged by every durable subscription was published. With ``evict``, a quota
        of ``consumer_backlog_eviction`` exceeded moves the slowest cursors forward until it fits (the age:
        each subscription acknowledges the messages older than the limit, as a message TTL would)."""
        q = topic.quota
        if q.limit_size >= 0:
            backlog = topic.backlog_bytes()
            if backlog > q.limit_size:
                if q.policy != "consumer_backlog_eviction":
                    return (
                        q.policy,
                        f"backlog of {backlog} bytes exceeds the quota of {q.limit_size} ({q.policy})",
                    )
                if evict:
                    await topic.evict_backlog(q.limit_size)
        age = topic.age_quota
        if age is None or age.limit_time <= 0:
            topic.age_exceeded = False
            return None
        try:
            published = await topic.oldest_unacked_publish_ms()
        except (ManagedLedgerError, LE.LedgerError) as e:
            # the entry cannot be read now (its bookies away): the last decision stands, and the tick goes on
            # to the topic's other housekeeping
            if evict:
                topic.tick_failures.warning("topic=%s message_age quota not checked: %s", topic.name, e)
            if not topic.age_exceeded or age.policy == "consumer_backlog_eviction":
                return None
            return age.policy, f"its message_age quota of {age.limit_time} s is exceeded ({age.policy}; {e})"
        now_ms = int(time.time() * 1000)
        if published is None or now_ms - published <= age.limit_time * 1000:
            topic.age_exceeded = False
            return None
        topic.age_exceeded = age.policy != "consumer_backlog_eviction"
        if age.policy != "consumer_backlog_eviction":
            waited = (now_ms - published) / 1000
            return age.policy, (
                f"oldest unacknowledged message, {waited:.1f} s old, exceeds the message_age quota of "
                f"{age.limit_time} s ({age.policy})"
            )
        if evict:
            moved = await sub_ops.expire_all(topic, age.limit_time, now_ms)
            for sub in moved:
                log.warning(
                    "topic=%s subscription=%s backlog older than %d s evicted",
                    topic.name,
                    sub,
                    age.limit_time,
                )
            self.metrics.quota_evictions += len(moved)
        return None

    async def enforce_quota(self, topic: Topic) -> None:
        """The topic's backlog quotas (:meth:`quota_exceeded`, evicting): a producer policy's exceeded marks the
        topic so that its producers are closed and refused until it fits again."""
        if topic.unloaded:
            topic.quota_exceeded = False
            return
        exceeded = await self.quota_exceeded(topic, evict=True)
        if exceeded is None:
            topic.quota_exceeded = False
            return
        if not topic.quota_exceeded:
            log.warning("topic=%s %s: producers are closed and refused", topic.name, exceeded[1])
        topic.quota_exceeded = True
        for p in list(topic.producers.values()):  # they reconnect, and are refused while it lasts
            topic.remove_producer(p)
            p.session.producers.pop(p.producer_id, None)
            p.session.send(wire.close_producer(p.producer_id, 0))

    def served_topics(self) -> list[Topic]:
        """The topics open on this broker now."""
        return [f.result() for f in list(self.topics.values()) if f.done() and not f.exception()]

    # -- topics ---------------------------------------------------------------------------------------------

    async def get_topic(self, name: TopicName, known: NamespacePolicies | None = None) -> Topic:
        """The topic, opened if this broker owns it (or nobody does); NotOwnerError otherwise. ``known``: its
        namespace's policies when the caller has just read them (an open reads them otherwise)."""
        key = str(name)
        fut = self.topics.get(key)
        while fut is None and (closing := self._closing.get(key)) is not None:
            # the instance unloaded a moment ago writes its ledger list as it closes: opened meanwhile, this one
            # would read the version before and its first write (a rollover, a terminate) conflict and fence it
            await asyncio.wait({closing}, timeout=CLOSE_WAIT_S)
            if not closing.done():
                if key in self._deleting:  # opened on the ledger list being deleted, served with none
                    raise TopicDeletingError(name)
                break  # a close stuck (its bookies away): open anyway, as before
            fut = self.topics.get(key)
        if fut is None:
            if self.bookie_supply.short:  # its new ledger could not be created: said at once, nothing written
                raise BookiesShortError(self.bookie_supply.refusal())
            fut = asyncio.get_running_loop().create_future()
            self.topics[key] = fut
            try:
                fut.set_result(await self._open_topic(name, known))
            except BaseException as e:
                self.topics.pop(key, None)
                fut.set_exception(e)
                fut.exception()  # retrieved: waiters get it re-raised
                raise
        return await asyncio.shield(fut)

    async def _open_topic(self, name: TopicName, known: NamespacePolicies | None = None) -> Topic:
        assert self.meta is not None and self.bk is not None
        # before anything is written (ownership, the managed ledger, a ledger on the bookies)
        policies = known if known is not None else await self.meta.get_policies(name.tenant, name.namespace)
        # (deleted: its delete under way; a topic that exists still opens, so the delete answers 409 and its
        # clients, reconnecting meanwhile, are not refused for good: pulsar-client gives up on TopicNotFound)
        if policies is None or (policies.deleted and not await self._exists_any(name)):
            raise NamespaceNotFoundError(name)
        auto = policies.auto_topic_creation
        if auto is not None and not auto.allow and not await self._topic_exists(name):
            raise TopicNotFoundError(name)
        async with self._ownership_change(str(name)):  # (not while a close of it lets the znode go)
            owner = await self.meta.acquire_ownership(name.ml_name, self.ownership())
        if owner.broker_id != self.config.id:
            raise NotOwnerError(owner)
        try:
            own = await self.meta.get_topic_policies(name.base.ml_name) or TopicPolicies()
            unreadable: zk.MetadataFormatError | None = None
        except zk.MetadataFormatError as e:
            # a znode that does not parse (written by hand, or by another version) kept the topic from opening
            # at all; it opens as one without policies of its own, and setting one through the admin replaces it
            own, unreadable = TopicPolicies(), e
        except BaseException:  # (ZooKeeper failing): the ownership taken goes, as on the failures below
            with contextlib.suppress(Exception):
                await self.meta.release_ownership(name.ml_name, self.config.id)
            raise
        dedup = self.dedup_in_force(policies, own)
        ml_config = dataclasses.replace(
            self.config.ml_config(),
            retention_time_s=policies.retention_time_s,
            retention_size_bytes=policies.retention_size_bytes,
        )
        try:
            ml = await ManagedLedger.open(self.bk, self.meta, name.ml_name, ml_config)
        except BaseException as e:
            await self.meta.release_ownership(name.ml_name, self.config.id)
            if isinstance(e, NamespaceGoneError):  # deleted (or its delete begun) since the read above
                await self.meta.prune_ownership_dirs(name.tenant, name.namespace)
                raise NamespaceNotFoundError(name) from e
            raise
        topic = Topic(self, name, ml, dedup)
        if unreadable is not None:
            topic.own_policies_unreadable = True
            log.warning(
                "topic=%s its own policies are unreadable, taken as absent (its namespace's and the broker's "
                "apply) until a policy set through the admin replaces them: %s",
                name,
                unreadable,
            )
        self.apply_policies(topic, policies, own)
        try:
            await topic.compaction.load()
        except BaseException:
            with contextlib.suppress(Exception):
                await ml.close()
            await self.meta.release_ownership(name.ml_name, self.config.id)
            raise
        try:
            await topic.scan_tail()
        except BaseException:
            # (its tail ledger unreadable): held, the ownership routed every lookup of the topic here, where
            # nothing served it, until the broker stopped
            await self._close_topic(topic, failed_open=True)
            raise
        log.info("broker=%s now serves topic=%s", self.config.id, name)
        return topic

    async def _topic_exists(self, name: TopicName) -> bool:
        """Does the topic exist: its managed ledger, or for a partition its partitioned topic's count covering it?"""
        assert self.meta is not None
        if await self.meta.get_ml_info(name.ml_name) is not None:
            return True
        if not name.is_partition:
            return False
        meta = await self.meta.get_partitions(name.base.ml_name)
        return meta is not None and name.partition_index < meta.partitions

    async def _exists_any(self, name: TopicName) -> bool:
        """Does the topic exist as :meth:`_topic_exists` says, or as a partitioned topic (a PARTITIONED_METADATA
        names one by its base name)?"""
        if await self._topic_exists(name):
            return True
        assert self.meta is not None
        return not name.is_partition and await self.meta.get_partitions(name.ml_name) is not None

    async def auto_partitioned(self, name: TopicName, known: NamespacePolicies | None = None) -> int:
        """The partitions of a topic a client names (a PARTITIONED_METADATA) that does not exist, in a namespace
        whose ``autoTopicCreation`` makes such topics partitioned: created with ``defaultNumPartitions`` (each
        partition's managed ledger too, as the admin's create does), as Pulsar's broker does at that request.
        0 otherwise (a topic served here, one that exists non-partitioned, another namespace's policy).
        ``known``: the namespace's policies when the request already read them."""
        assert self.meta is not None
        if self.serves(name):
            return 0
        policies = known if known is not None else await self.meta.get_policies(name.tenant, name.namespace)
        auto = None if policies is None else policies.auto_topic_creation
        if (
            auto is None
            or not auto.allow
            or auto.topic_type != "partitioned"
            or not auto.default_num_partitions
        ):
            return 0
        if await self.meta.get_ml_info(name.ml_name) is not None:
            return 0
        n = auto.default_num_partitions
        if past_partition_limit(n, self.config.max_partitions_per_topic):
            raise PartitionLimitError(name, n, self.config.max_partitions_per_topic)
        try:
            await self.meta.create_partitioned_topic(name.ml_name, n)
        except zk.MetadataExistsError:  # another client's request made it first
            meta = await self.meta.get_partitions(name.ml_name)
            return meta.partitions if meta else 0
        for i in range(n):
            with contextlib.suppress(zk.MetadataExistsError):
                await self.meta.create_ml_info(name.partition(i).ml_name, ManagedLedgerInfo())
        log.info("broker=%s topic=%s created with %d partitions (autoTopicCreation)", self.config.id, name, n)
        return n

    def ownership(self) -> OwnershipInfo:
        """This broker's ownership record (what an ``ownership/<ml>`` znode it holds says)."""
        return OwnershipInfo(
            broker_id=self.config.id,
            service_url=self.config.service_url,
            web_service_url=self.config.web_service_url,
            service_url_tls=self.config.service_url_tls,
            web_service_url_tls=self.config.web_service_url_tls,
        )

    async def lookup_owner(self, name: TopicName) -> OwnershipInfo:
        """The topic's owner for a lookup (binary or HTTP), ownership taken when nobody holds it. Ownership so
        taken of a topic nobody then opens here is released after ``lookup_ownership_hold_s`` (by
        :meth:`_release_looked_up`): held until the broker stopped, each name ever looked up (a flood of random
        names, a typo in a loop) left its ownership znode, one per name, for good."""
        assert self.meta is not None
        owner = await self.meta.get_owner(name.ml_name)
        if owner is None:
            async with self._ownership_change(str(name)):
                owner = await self.meta.acquire_ownership(name.ml_name, self.ownership())
        key = str(name)
        if owner.broker_id == self.config.id and key not in self.topics:
            self._looked_up[key] = (name, time.monotonic())
        return owner

    def _release_looked_up(self, now: float) -> None:
        """The ownership lookups took of topics not opened here within ``lookup_ownership_hold_s`` released;
        each release stands in ``_closing`` meanwhile, so that an open of the topic waits for it (as for a
        close) and takes the ownership anew, not the znode being deleted."""
        for key, (name, since) in list(self._looked_up.items()):
            if key in self.topics or key in self._closing:
                del self._looked_up[key]  # opened (or closing): the topic's own ownership
            elif now - since >= self.config.lookup_ownership_hold_s:
                del self._looked_up[key]
                if self.meta is not None and not self._session_lost:
                    self._closing_as(key, self._release_ownership(name))

    async def _release_ownership(self, name: TopicName, *, failed_open: bool = False) -> None:
        """The topic's ownership znode deleted, if this broker holds it, unless the topic was opened here again
        meanwhile (``failed_open``: but by the open that failed): an open waits CLOSE_WAIT_S for a close or a
        release under way, then opens anyway on the znode still there, and a close stuck longer (its ledger's
        close waiting on bookies) deleted it as it ended, leaving the topic served here with no ownership for
        any broker's lookup to take."""
        async with self._ownership_change(str(name)):
            # the look and the delete under one lock that an open's take of the znode holds too: an open begun
            # during the delete's ZooKeeper round trips took the znode still there as its own, and the delete
            # then removed it (served with no ownership); it now waits, and takes the znode anew
            if self.meta is None or self._session_lost or (not failed_open and str(name) in self.topics):
                return
            with contextlib.suppress(Exception):
                await self.meta.release_ownership(name.ml_name, self.config.id)

    @contextlib.asynccontextmanager
    async def _ownership_change(self, key: str) -> AsyncIterator[None]:
        """Topic ``key``'s ownership znode taken or let go by this broker, one change at a time."""
        lock, users = self._ownership_locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                self._ownership_locks.pop(key, None)

    def topic_lost(self, topic: Topic, reason: str) -> None:
        """Stop serving: clients are told to reconnect (and look the topic up again)."""
        if topic.unloaded:
            return
        topic.unloaded = True
        log.warning("broker=%s stops serving topic=%s: %s", self.config.id, topic.name, reason)
        key = str(topic.name)
        fut = self.topics.get(key)
        if fut is not None and fut.done() and not fut.exception() and fut.result() is topic:
            del self.topics[key]
        self._disconnect_clients(topic)
        self._closing_as(key, self._close_topic(topic))

    def _closing_as(self, key: str, close: Coroutine[Any, Any, None]) -> None:
        """``close`` run as topic ``key``'s close under way (an open of the topic waits for it), until it ends."""
        closing = self._closing[key] = self.spawn(close)

        def closed(task: asyncio.Task[None]) -> None:
            if self._closing.get(key) is task:
                del self._closing[key]

        closing.add_done_callback(closed)

    def _disconnect_clients(self, topic: Topic) -> None:
        while topic.waiting:  # queued WaitForExclusive producers retry (lookup, then the new owner)
            w = topic.waiting.popleft()
            if w.session.waiting.pop(w.cmd.producer_id, None) is topic:
                w.session.send(wire.error(w.cmd.request_id, pb.ServiceNotReady, f"{topic.name} moved"))
        for p in list(topic.producers.values()):
            topic.remove_producer(p)
            p.session.producers.pop(p.producer_id, None)
            p.session.send(wire.close_producer(p.producer_id, 0))
        for sub in list(topic.subscriptions.values()):
            for c in list(sub.consumers.values()):
                c.session.consumers.pop(c.consumer_id, None)
                c.session.send(wire.close_consumer(c.consumer_id, 0))
            sub.forget_consumers()

    async def stored_cursor_names(self, topic: Topic) -> list[str]:
        assert self.meta is not None
        return list(await self.meta.list_cursors(topic.name.ml_name))

    async def _close_topic(self, topic: Topic, *, failed_open: bool = False) -> None:
        """``failed_open``: the topic's own open failed (the entry in ``topics`` is that open's)."""
        with contextlib.suppress(Exception):
            await topic.compaction.close()
        with contextlib.suppress(Exception):
            await topic.ml.close()
        await self._release_ownership(topic.name, failed_open=failed_open)

    async def delete_topic(self, name: TopicName | str) -> bool:
        """Delete a topic this broker serves: its clients are disconnected, its storage (every ledger, the
        cursors, the managed-ledger znode) removed, its ownership released. False when it is not served here
        (the caller redirects to the owner, or opens it first)."""
        topic = self._served(str(name))
        if topic is None:
            return False
        topic.unloaded = True
        fut = self.topics.get(topic.key)
        if fut is not None and fut.done() and not fut.exception() and fut.result() is topic:
            del self.topics[topic.key]
        self._disconnect_clients(topic)
        # the delete stands as the topic's close under way: an open of the topic meanwhile (a producer it
        # disconnected, reconnecting at once) waits for it, then makes the topic anew; it opened the ledger list
        # being deleted, so the topic was served with no managed-ledger znode (what it acknowledged then lost)
        self._deleting.add(topic.key)
        self._closing_as(topic.key, self._delete_storage(topic))
        await asyncio.shield(self._closing[topic.key])
        return True

    async def _delete_storage(self, topic: Topic) -> None:
        topic.subscriptions.clear()
        for c in list(topic.ml.cursors.values()):
            with contextlib.suppress(ManagedLedgerError, zk.MetadataError):
                await c.close()
        try:
            await topic.compaction.delete()
            await topic.ml.delete()
            if not topic.name.is_partition and self.meta is not None:
                await self.meta.delete_schemas(topic.name.ml_name)  # a partitioned topic's are its own
                await self.meta.delete_topic_policies(topic.name.ml_name)  # likewise
        finally:
            self.metrics.forget(topic.key)
            try:
                await self._release_ownership(topic.name)
            finally:
                # only now: an open past CLOSE_WAIT_S during the release took the znode still there as its own
                # and the release then deleted it (served with no ownership); it is refused until here
                self._deleting.discard(topic.key)
        log.info("broker=%s deleted topic=%s", self.config.id, topic.name)

    async def unload(self, name: TopicName) -> bool:
        fut = self.topics.get(str(name))
        if fut is None or not fut.done() or fut.exception():
            return False
        self.topic_lost(fut.result(), "unloaded")
        return True

    # admin hooks
    def topic_names(self) -> list[str]:
        return sorted(k for k, f in self.topics.items() if f.done() and not f.exception())

    def _served(self, name: str) -> Topic | None:
        fut = self.topics.get(str(TopicName.parse(name)))
        return fut.result() if fut is not None and fut.done() and not fut.exception() else None

    def topic_stats(self, name: str) -> dict[str, Any] | None:
        t = self._served(name)
        return t.stats() if t else None

    def internal_stats(self, name: str) -> dict[str, Any] | None:
        t = self._served(name)
        return t.internal_stats() if t else None

    def subscriptions(self, name: str) -> list[str]:
        t = self._served(name)
        return sorted(t.subscriptions) if t else []

    # -- request handlers (named in connection.HANDLERS) ----------------------------------------------------

    async def on_partitioned_metadata(self, s: Session, r: Request) -> None:
        cmd: pb.CommandPartitionedTopicMetadata = r.body  # type: ignore[assignment]
        try:
            name = TopicName.parse(cmd.topic)
        except InvalidTopicName as e:
            s.send(wire.partitioned_metadata_response(cmd.request_id, error_code=BAD_NAME, message=str(e)))
            return
        refusal, known = await self._lookup_refusal(s, name, "partitioned metadata")
        if refusal is not None:
            code, why = refusal
            s.send(wire.partitioned_metadata_response(cmd.request_id, error_code=code, message=why))
            return
        assert self.meta is not None
        meta = await self.meta.get_partitions(name.base.ml_name) if not name.is_partition else None
        try:
            n = (
                meta.partitions
                if meta
                else 0
                if name.is_partition
                else await self.auto_partitioned(name, known)
            )
        except zk.MetadataError as e:
            s.send(
                wire.partitioned_metadata_response(
                    cmd.request_id, error_code=pb.MetadataError, message=str(e)
                )
            )
            return
        except (PartitionLimitError, TopicsLimitError) as e:
            # NotAllowedError: the client fails at once with the message, not retrying to its timeout
            s.send(
                wire.partitioned_metadata_response(
                    cmd.request_id, error_code=pb.NotAllowedError, message=str(e)
                )
            )
            return
        s.send(wire.partitioned_metadata_response(cmd.request_id, n))

    async def on_lookup(self, s: Session, r: Request) -> None:
        cmd: pb.CommandLookupTopic = r.body  # type: ignore[assignment]
        try:
            name = TopicName.parse(cmd.topic)
        except InvalidTopicName as e:
            s.send(wire.lookup_response(cmd.request_id, error_code=BAD_NAME, message=str(e)))
            return
        refusal, _known = await self._lookup_refusal(s, name, "lookup")
        if refusal is not None:
            code, why = refusal
            s.send(wire.lookup_response(cmd.request_id, error_code=code, message=why))
            return
        try:
            owner = await self.lookup_owner(name)
        except zk.MetadataError as e:
            s.send(wire.lookup_response(cmd.request_id, error_code=pb.MetadataError, message=str(e)))
            return
        s.send(lookup_answer(cmd.request_id, owner, tls=s.transport.get_extra_info("ssl_object") is not None))

    async def _topic_for(
        self, s: Session, topic: str, request_id: int, action: str | None = None
    ) -> Topic | None:
        try:
            name = TopicName.parse(topic)
            known: NamespacePolicies | None = None  # read once for the permission and the open
            if action is not None:
                if self.checks_permissions(s.conn.principal) and not self.serves(name):
                    assert self.meta is not None
                    known = await self.meta.get_policies(name.tenant, name.namespace)
                    if known is None:  # authorized first (``_lookup_refusal``): no grant in no namespace
                        s.send(
                            wire.error(request_id, pb.AuthorizationError, self._refused(s, name, (action,)))
                        )
                        return None
                refused = await self._authorized(s, name, (action,), known)
                if refused is not None:
                    s.send(wire.error(request_id, pb.AuthorizationError, refused))
                    return None
            if str(name) in self.topics:  # served (or being opened) already
                return await self.get_topic(name, known)
            async with s.topic_opens:
                if s.closed:  # gone while this waited its turn: nobody to open the topic for
                    return None
                return await self.get_topic(name, known)
        except InvalidTopicName as e:
            s.send(wire.error(request_id, BAD_NAME, str(e)))
        except NamespaceNotFoundError as e:
            log.info("broker=%s %s", self.config.id, e)
            s.send(wire.error(request_id, pb.TopicNotFound, NAMESPACE_NOT_FOUND))
        except TopicNotFoundError as e:
            s.send(wire.error(request_id, pb.TopicNotFound, str(e)))
        except TopicDeletingError as e:
            s.send(wire.error(request_id, pb.ServiceNotReady, str(e)))
        except TopicsLimitError as e:  # a topic to create past maxTopicsPerNamespace: refused, as Pulsar's
            s.send(wire.error(request_id, pb.NotAllowedError, str(e)))
        except NotOwnerError as e:
            s.send(wire.error(request_id, pb.ServiceNotReady, f"{topic} is served by {e.owner.service_url}"))
        except (ManagedLedgerError, zk.MetadataError) as e:
            s.send(wire.error(request_id, pb.ServiceNotReady, f"{topic} cannot be served now: {e}"))
        return None

    def on_producer(self, s: Session, r: Request) -> Coroutine[Any, Any, None] | None:
        cmd: pb.CommandProducer = r.body  # type: ignore[assignment]
        if s.creating_producers.busy(cmd.producer_id) or cmd.producer_id in s.waiting:
            # as Pulsar's ServerCnx: a PRODUCER of an id whose creation is pending (a client that sent it again
            # before its answer; a WaitForExclusive one queued) is refused, to be retried; once the first is
            # created, a repeat is answered with its name (in _create_producer)
            s.send(
                wire.error(
                    cmd.request_id, pb.ServiceNotReady, "Producer is already present on the connection"
                )
            )
            return None
        # begun now, before the connection's next command: a CLOSE_PRODUCER right behind it must find it
        return s.creating_producers.run(cmd.producer_id, lambda c: self._create_producer(s, cmd, c))

    async def _create_producer(self, s: Session, cmd: pb.CommandProducer, creation: _Creation) -> None:
        topic = await self._topic_for(s, cmd.topic, cmd.request_id, PRODUCE)
        if topic is None:
            return
        # first, as every check below is made on the state after its wait (a topic terminated meanwhile)
        await self._free_name_of_dead_connection(s, cmd, topic)
        if topic.ml.terminated_position is not None:
            why = f"Topic {topic.name} was already terminated"
            s.send(wire.error(cmd.request_id, pb.TopicTerminatedError, why))
            return
        exceeded = await self.quota_exceeded(topic, evict=False)
        if exceeded is None:
            # the backlog fits again (acknowledged since the mark): the producer's SENDs are taken, not closed
            # until the next tick clears the mark (each SEND closed its producer, which came back and sent again)
            topic.quota_exceeded = False
        else:
            policy, why = exceeded
            topic.quota_exceeded = True
            self.metrics.quota_refusals += 1
            code = (
                pb.ProducerBlockedQuotaExceededException
                if policy == "producer_exception"
                else pb.ProducerBlockedQuotaExceededError
            )
            s.send(wire.error(cmd.request_id, code, f"{topic.name}: {why}"))
            return
        schema_version: bytes | None = None
        if cmd.HasField("schema") and (cmd.schema.type != SCHEMA_NONE or cmd.schema.schema_data):
            assert self.meta is not None  # bytes producers declare none; a declared schema is stored
            try:
                version = await self.add_checked_schema(topic.name, _schema_info(cmd.schema))
            except SchemaRefusedError as e:
                s.send(wire.error(cmd.request_id, pb.IncompatibleSchema, str(e)))
                return
            except zk.MetadataError as e:
                s.send(wire.error(cmd.request_id, pb.MetadataError, f"schema not stored: {e}"))
                return
            schema_version = version.to_bytes(8, "big")
        if cmd.initial_subscription_name:
            try:
                await topic.initial_subscription(cmd.initial_subscription_name)
            except SubscriptionsLimitError as e:
                s.send(wire.error(cmd.request_id, pb.NotAllowedError, str(e)))
                return
            except (ManagedLedgerError, zk.MetadataError) as e:
                s.send(wire.error(cmd.request_id, pb.MetadataError, f"initial subscription not created: {e}"))
                return
        if s.closed:  # as in on_subscribe: a producer of a connection gone would hold its name for good
            return
        if creation.closed:
            # CLOSE_PRODUCER came while this waited (a client whose PRODUCER timed out sends it): created now, the
            # producer held its name (and the topic, if exclusive) until the connection closed
            why = f"producer {cmd.producer_id} was closed before its creation completed"
            s.send(wire.error(cmd.request_id, pb.ServiceNotReady, why))
            return
        if (
            topic.unloaded
        ):  # while this waited (a liveness check, a schema stored): the client looks it up again
            s.send(wire.error(cmd.request_id, pb.ServiceNotReady, f"{topic.name} is not served here now"))
            return
        if topic.ml.terminated_position is not None:
            # terminated while this waited (the message_age quota's read of an entry, a schema stored): the
            # producer was created on a terminated topic, its every send then refused
            why = f"Topic {topic.name} was already terminated"
            s.send(wire.error(cmd.request_id, pb.TopicTerminatedError, why))
            return
        existing = s.producers.get(cmd.producer_id)
        if existing is not None and existing.topic is topic:
            s.send(
                wire.producer_success(
                    cmd.request_id, existing.name, topic.last_sequence.get(existing.name, -1)
                )
            )
            return
        if existing is not None and not existing.topic.unloaded:
            # the id names a producer of another topic on this connection (no client reuses one): taking it
            # over left that producer on its topic, holding its name after the connection closed
            why = (
                f"producer id {cmd.producer_id} is already in use on this connection ({existing.topic.name})"
            )
            s.send(wire.error(cmd.request_id, pb.ServiceNotReady, why))
            return
        mode = cmd.producer_access_mode if cmd.HasField("producer_access_mode") else pb.Shared
        if mode == pb.WaitForExclusive and (topic.producers or topic.waiting):
            # Pulsar's answer: "queued" now (producer_ready false: the client waits without a timeout), the
            # real PRODUCER_SUCCESS once every other producer of the topic is gone.
            name = self._producer_name(cmd)
            topic.waiting.append(_WaitingProducer(s, cmd, name, schema_version))
            s.waiting[cmd.producer_id] = topic
            s.send(wire.producer_success(cmd.request_id, name, -1, producer_ready=False))
            return
        if mode != pb.Shared and topic.producers:
            if mode == pb.ExclusiveWithFencing:
                # as Pulsar's: the queued WaitForExclusive producers are fenced out first (ProducerFenced "Fenced
                # out", the answer to their PRODUCER), else the closes below handed the topic to the first of them,
                # and this producer was refused ProducerBusy with the others fenced all the same
                while topic.waiting:
                    w = topic.waiting.popleft()
                    if w.session.waiting.get(w.cmd.producer_id) is topic:
                        del w.session.waiting[w.cmd.producer_id]
                        if not w.session.closed:
                            w.session.send(wire.error(w.cmd.request_id, pb.ProducerFenced, "Fenced out"))
                for other in list(topic.producers.values()):
                    topic.remove_producer(other)
                    other.session.producers.pop(other.producer_id, None)
                    other.session.send(wire.close_producer(other.producer_id, 0))
            else:
                # Exclusive: Pulsar's ProducerFenced, on which the client gives the producer up (its sends fail at
                # once). ProducerBusy it retries: an Exclusive producer fenced by an ExclusiveWithFencing one
                # reconnected without end, and each of its sends failed only at its send timeout, as Timeout
                held = "an exclusive producer" if topic.exclusive_producers else "producers"
                s.send(wire.error(cmd.request_id, pb.ProducerFenced, f"{topic.name} has {held} already"))
                return
        if topic.exclusive_producers:
            s.send(wire.error(cmd.request_id, pb.ProducerBusy, f"{topic.name} has an exclusive producer"))
            return
        if topic.max_producers and len(topic.producers) >= topic.max_producers:
            # Pulsar's answer (maxProducersPerTopic): the client's create_producer fails with ProducerBusy
            why = f"Topic {topic.name} reached max producers limit ({topic.max_producers})"
            s.send(wire.error(cmd.request_id, pb.ProducerBusy, why))
            return
        name = self._producer_name(cmd)
        if name in topic.producer_names:
            s.send(wire.error(cmd.request_id, pb.ProducerBusy, f"producer {name} is already connected"))
            return
        self._add_producer(s, cmd, topic, name, schema_version)

    async def _free_name_of_dead_connection(self, s: Session, cmd: pb.CommandProducer, topic: Topic) -> None:
        """As Pulsar's broker: a producer name held by a producer of another connection, maybe one left
        half-open by the client's own reconnection (a network cut that the old connection has not seen), is
        freed if that connection leaves a PING unanswered (closed), else the producer would be refused until the
        keep-alive closes it, 30 to 60 s. The caller checks the topic again after this wait."""
        asked = cmd.producer_name if cmd.HasField("producer_name") else ""
        holder = topic.producer_names.get(asked) if asked else None
        if holder is None or holder.session is s:
            return
        old = holder.session
        if not await old.answers_ping(PRODUCER_LIVENESS_TIMEOUT_S) and not old.closed:
            log.info(
                "connection %s: no answer to PING within %gs while producer %s connects again from %s: closed",
                old.peer,
                PRODUCER_LIVENESS_TIMEOUT_S,
                holder.name,
                s.peer,
            )
            old.close_dead(f"no answer to PING while producer {holder.name} connected again")

    def _producer_name(self, cmd: pb.CommandProducer) -> str:
        if cmd.HasField("producer_name") and cmd.producer_name:
            return cmd.producer_name
        return f"{self._producer_name_prefix}-{next(self._producer_names)}"

    def _add_producer(
        self, s: Session, cmd: pb.CommandProducer, topic: Topic, name: str, schema_version: bytes | None
    ) -> None:
        mode = cmd.producer_access_mode if cmd.HasField("producer_access_mode") else pb.Shared
        s.closed_by_quota.pop(cmd.producer_id, None)
        p = Producer(
            s,
            cmd.producer_id,
            name,
            topic,
            exclusive=mode != pb.Shared,
            access_mode=mode,
            metadata={kv.key: kv.value for kv in cmd.metadata},
        )
        topic.add_producer(p)
        s.producers[cmd.producer_id] = p
        last = topic.last_sequence.get(name, -1) if topic.dedup_enabled else -1
        s.send(wire.producer_success(cmd.request_id, name, last, schema_version=schema_version))

    def grant_waiting_producer(self, topic: Topic) -> None:
        """The topic has no producer left: the first WaitForExclusive producer still connected gets it."""
        while topic.waiting and not topic.producers and not topic.unloaded:
            w = topic.waiting.popleft()
            if w.session.closed or w.session.waiting.get(w.cmd.producer_id) is not topic:
                continue
            del w.session.waiting[w.cmd.producer_id]
            self._add_producer(w.session, w.cmd, topic, w.name, w.schema_version)

    def on_send(self, s: Session, r: Request) -> None:
        cmd: pb.CommandSend = r.body  # type: ignore[assignment]
        p = s.producers.get(cmd.producer_id)
        if p is None:
            if cmd.producer_id in s.closed_by_quota:
                return  # sent before the client saw CLOSE_PRODUCER: it resends after reconnecting
            s.conn.send_raw(wire.error(0, pb.ProducerBusy, f"no producer with id {cmd.producer_id}"))
            s.conn.close(f"SEND for unknown producer {cmd.producer_id}")
            return
        if p.topic.quota_exceeded:
            self.metrics.quota_refusals += 1
            p.topic.remove_producer(p)
            s.producers.pop(p.producer_id, None)
            s.closed_by_quota[p.producer_id] = True
            s.send(wire.close_producer(p.producer_id, 0))
            return
        frame = r.frame
        if not frame.checksum_ok:
            s.send(wire.send_error(cmd.producer_id, cmd.sequence_id, pb.ChecksumError, "checksum mismatch"))
            return
        entry = frame.entry
        assert entry is not None
        if len(entry) > ENTRY_PAYLOAD_MAX:
            # the client keeps messages to the max_message_size announced in CONNECTED, which leaves room
            message = (
                f"message of {len(entry)} bytes stored is over the largest ledger entry ({ENTRY_PAYLOAD_MAX})"
            )
            s.send(wire.send_error(cmd.producer_id, cmd.sequence_id, pb.NotAllowedError, message))
            return
        try:
            # a consumer's client cannot read what it cannot parse (pulsar-client closes its connection, and the
            # entry comes again): never stored (parsed once, kept in the frame)
            metadata = frame.metadata
        except wire.EntryFormatError as e:
            s.send(
                wire.send_error(cmd.producer_id, cmd.sequence_id, pb.NotAllowedError, f"invalid message: {e}")
            )
            return
        # the client marks chunks on the SEND
        dedup = wire.counts_for_dedup(metadata) if cmd.is_chunk else True
        chunk = wire.chunk_of(metadata) if cmd.is_chunk else None
        # the messages the entry holds, as a consumer's client counts them (and a reload of the ledger), not the
        # SEND's num_messages: a count above that took permits the client never gives back
        messages = max(1, wire.entry_message_count(metadata))
        declared = cmd.highest_sequence_id if cmd.HasField("highest_sequence_id") else None
        highest = wire.highest_sequence_id(cmd.sequence_id, declared, messages)
        if max(highest, metadata.sequence_id, metadata.highest_sequence_id) > INT64_MAX:
            # sequence ids are Pulsar's longs (a client sends no more): one over would be the producer's last id,
            # which PRODUCER_SUCCESS cannot carry, and above any id it sends after
            why = f"sequence id over {INT64_MAX}"
            s.send(wire.send_error(cmd.producer_id, cmd.sequence_id, pb.NotAllowedError, why))
            return
        walked: tuple[int | None] | None = None
        batch = metadata.HasField("num_messages_in_batch")
        if batch and metadata.compression == pb.NONE and not metadata.encryption_keys:  # (not a cipher text)
            # pulsar-client reads a batch by its count and sizes without checking them against the payload:
            # one that overran it crashed the consumer's process (a segfault) or had it hand out bytes of its
            # own memory as messages, at each delivery, to every consumer of the topic. Walked once here, for
            # deduplication too
            try:
                walked = (wire.batch_last_sequence_id(metadata, frame.payload),)
            except wire.EntryFormatError as e:
                why = f"invalid message: {e}"
                s.send(wire.send_error(cmd.producer_id, cmd.sequence_id, pb.NotAllowedError, why))
                return
        p.pending_bytes += len(entry)
        s.publish_bytes += len(entry)
        p.topic.publish(p, cmd, entry, messages, dedup=dedup, chunk=chunk, walked=walked)
        if s.publish_bytes > PUBLISH_BYTES_MAX and not s.publish_paused:
            s.check_publishing()

    def on_close_producer(self, s: Session, r: Request) -> None:
        cmd: pb.CommandCloseProducer = r.body  # type: ignore[assignment]
        s.creating_producers.close(cmd.producer_id)
        s.waiting.pop(cmd.producer_id, None)  # a queued WaitForExclusive producer gives up
        p = s.producers.pop(cmd.producer_id, None)
        if p is not None:
            p.topic.remove_producer(p)
        s.send(wire.success(cmd.request_id))

    async def _schema_refused(self, topic: Topic, schema: pb.Schema) -> str | None:
        """Why a consumer's ``schema`` does not go with the topic's stored schemas (:func:`schema_refusal`
        under the namespace's strategy), or None. As Pulsar (``addSchemaIfIdleOrCheckCompatible``): on a topic
        without schemas, producers, consumers or messages, the consumer's schema is stored as version 0, so
        that producers that come later must go with it. AUTO_CONSUME (a consumer taking whatever the topic
        has) is neither checked nor stored."""
        if schema.type in (SCHEMA_NONE, SCHEMA_AUTO_CONSUME):
            return None
        assert self.meta is not None
        history = await self.meta.get_schemas(topic.name.base.ml_name)
        info = _schema_info(schema)
        idle = not topic.producers and not any(sub.consumers for sub in topic.subscriptions.values())
        if history.latest() is not None or not idle or topic.ml.view().total_entries() > 0:
            return schema_refusal(history, info, await self.schema_strategy(topic.name))
        try:
            await self.add_checked_schema(topic.name, info)
        except SchemaRefusedError as e:
            return str(e)
        return None

    async def add_checked_schema(self, name: TopicName, info: SchemaInfo) -> int:
        """Store ``info`` as a version of the schemas of ``name`` (its base topic's record) and return the version;
        it is checked (:func:`schema_refusal` under the namespace's strategy) inside the compare-and-set that
        appends it, against the history it is appended to. :class:`SchemaRefusedError` says why not."""
        assert self.meta is not None
        strategy = await self.schema_strategy(name)
        return await self.meta.add_schema(
            name.base.ml_name, info, refuse=lambda h: schema_refusal(h, info, strategy)
        )

    async def schema_strategy(self, name: TopicName) -> str:
        """The namespace's ``schema_compatibility_strategy`` (UNDEFINED without policies)."""
        assert self.meta is not None
        policies = await self.meta.get_policies(name.tenant, name.namespace)
        return policies.schema_compatibility_strategy if policies is not None else "UNDEFINED"

    def on_subscribe(self, s: Session, r: Request) -> Coroutine[Any, Any, None] | None:
        cmd: pb.CommandSubscribe = r.body  # type: ignore[assignment]
        if s.creating_consumers.busy(cmd.consumer_id):  # (as on_producer's)
            s.send(
                wire.error(
                    cmd.request_id, pb.ServiceNotReady, "Consumer is already present on the connection"
                )
            )
            return None
        # (begun now, as on_producer's)
        return s.creating_consumers.run(cmd.consumer_id, lambda c: self._create_consumer(s, cmd, c))

    async def _create_consumer(self, s: Session, cmd: pb.CommandSubscribe, creation: _Creation) -> None:
        topic = await self._topic_for(s, cmd.topic, cmd.request_id, CONSUME)
        if topic is None:
            return
        if cmd.consumer_id in s.consumers:
            s.send(wire.success(cmd.request_id))  # a repeated SUBSCRIBE of the same consumer
            return
        if not cmd.subscription:  # as Pulsar (a NamingException): not a znode name to fail on later
            s.send(wire.error(cmd.request_id, pb.InvalidTopicName, "Empty subscription name"))
            return
        refusal = read_compacted_refusal(cmd)
        if refusal is not None:
            s.send(wire.error(cmd.request_id, pb.NotAllowedError, refusal))
            return
        if self._consumers_refused(s, topic, cmd.request_id):
            # before the subscription is made, as Pulsar: a durable one made for a consumer refused held the
            # topic's backlog from then on with no consumer to read it
            return
        # counted against the limit until attached or refused: two SUBSCRIBEs at once past the first check, the
        # second's subscription was made while the first attached, then refused at the second check, left behind
        topic.consumers_creating += 1
        try:
            await self._subscribe_consumer(s, cmd, creation, topic)
        finally:
            topic.consumers_creating -= 1

    async def _subscribe_consumer(
        self, s: Session, cmd: pb.CommandSubscribe, creation: _Creation, topic: Topic
    ) -> None:
        try:
            refused = await self._schema_refused(topic, cmd.schema) if cmd.HasField("schema") else None
            if refused is not None:
                s.send(wire.error(cmd.request_id, pb.IncompatibleSchema, refused))
                return
            sub = await topic.subscription(cmd)
        except SubscriptionsLimitError as e:
            s.send(wire.error(cmd.request_id, pb.NotAllowedError, str(e)))
            return
        except (ManagedLedgerError, zk.MetadataError) as e:
            s.send(wire.error(cmd.request_id, pb.ServiceNotReady, str(e)))
            return
        if s.closed:  # gone while the topic or its cursor was opened: attached now, it would stay for good
            sub.drop_if_unused()
            return
        if creation.closed:
            # CLOSE_CONSUMER came while this waited (a client whose SUBSCRIBE timed out sends it): attached now,
            # the consumer stayed on its subscription until the connection closed (an Exclusive one busy)
            why = f"consumer {cmd.consumer_id} was closed before its creation completed"
            s.send(wire.error(cmd.request_id, pb.ServiceNotReady, why))
            sub.drop_if_unused()
            return
        if topic.unloaded:
            # while this waited (a schema read, the cursor opened): attached now, the consumer sat on an instance
            # nobody serves (its consumers' CLOSE_CONSUMER already sent), given nothing. The client looks it up again
            s.send(wire.error(cmd.request_id, pb.ServiceNotReady, f"{topic.name} is not served here now"))
            return
        ranges: list[tuple[int, int]] = []
        ksm = cmd.keySharedMeta if cmd.HasField("keySharedMeta") else None
        sticky = ksm is not None and ksm.keySharedMode == pb.STICKY
        if ksm is not None and sticky:
            ranges = [(rg.start, rg.end) for rg in ksm.hashRanges]
        # (again, this one's creation aside: the limit may have been lowered while this waited)
        if self._consumers_refused(s, topic, cmd.request_id, creating=1):
            sub.drop_if_unused()
            return
        limit = topic.max_consumers_per_subscription
        if limit and len(sub.consumers) >= limit:
            # Pulsar's dispatchers' answer (Shared, Key_Shared, Failover; an Exclusive one has one consumer at
            # most): ConsumerBusy. Nothing awaited since the subscription was taken: no other SUBSCRIBE of it
            # attached meanwhile, so two at once cannot both pass
            why = f"Subscription {sub.name} of {topic.name} reached max consumers limit ({limit})"
            s.send(wire.error(cmd.request_id, pb.ConsumerBusy, why))
            return
        c = Consumer(
            s, cmd.consumer_id, cmd.consumer_name, sub, metadata={kv.key: kv.value for kv in cmd.metadata}
        )
        s.consumers[cmd.consumer_id] = c
        if not sub.consumers:  # the first consumer's choice is the subscription's
            sub.read_compacted = cmd.read_compacted
        try:
            sub.add_consumer(
                c,
                SubType(cmd.subType),
                cmd.priority_level if cmd.HasField("priority_level") else 0,
                ranges,
                sticky=sticky,
                out_of_order=ksm is not None and ksm.allowOutOfOrderDelivery,
            )
        except ConsumerBusyError as e:
            s.consumers.pop(cmd.consumer_id, None)
            code = pb.ConsumerAssignError if isinstance(e, ConsumerAssignError) else pb.ConsumerBusy
            s.send(wire.error(cmd.request_id, code, str(e)))
            return
        s.send(wire.success(cmd.request_id))

    @staticmethod
    def _consumers_refused(s: Session, topic: Topic, request_id: int, creating: int = 0) -> bool:
        """The topic has its limit of consumers (all subscriptions', those being created counted, less
        ``creating``: the caller's own): refused with Pulsar's answer to maxConsumersPerTopic, ConsumerBusy (the
        client's subscribe fails)."""
        consumers = sum(len(rt.consumers) for rt in topic.subscriptions.values())
        consumers += topic.consumers_creating - creating
        if not topic.max_consumers or consumers < topic.max_consumers:
            return False
        why = f"Topic {topic.name} reached max consumers limit ({topic.max_consumers})"
        s.send(wire.error(request_id, pb.ConsumerBusy, why))
        return True

    def _consumer(self, s: Session, consumer_id: int) -> Consumer | None:
        return s.consumers.get(consumer_id)

    async def _consumer_subscribed(self, s: Session, consumer_id: int) -> Consumer | None:
        """The connection's consumer ``consumer_id`` once its SUBSCRIBE under way (if any) is answered. The C++
        client takes a new connection for its consumer's as it sends the SUBSCRIBE, so a GET_LAST_MESSAGE_ID, SEEK
        or UNSUBSCRIBE it sends meanwhile (a reader's ``has_message_available()`` as it reconnects after its broker
        went) follows the SUBSCRIBE on the connection: answered ConsumerNotFound, the application got the error
        (Pulsar's broker answers it MetadataError "Consumer not found"), where its answer can wait."""
        await s.creating_consumers.ended(consumer_id)
        return s.consumers.get(consumer_id)

    def on_flow(self, s: Session, r: Request) -> None:
        cmd: pb.CommandFlow = r.body  # type: ignore[assignment]
        c = self._consumer(s, cmd.consumer_id)
        if c is not None:
            c.last_flow_ms = c.sub.last_flow_ms = int(time.time() * 1000)
            c.sub.execute(c.sub.core.flow(c.sub.key_of(c), cmd.messagePermits))

    def on_ack(self, s: Session, r: Request) -> None:
        cmd: pb.CommandAck = r.body  # type: ignore[assignment]
        c = self._consumer(s, cmd.consumer_id)
        if c is not None:
            c.last_acked_ms = c.sub.last_acked_ms = int(time.time() * 1000)
            c.sub.ack(cmd)
        if cmd.HasField("request_id"):
            s.send(wire.ack_response(cmd.consumer_id, cmd.request_id))

    def on_redeliver(self, s: Session, r: Request) -> None:
        cmd: pb.CommandRedeliverUnacknowledgedMessages = r.body  # type: ignore[assignment]
        c = self._consumer(s, cmd.consumer_id)
        if c is None:
            return
        positions = [_position(m) for m in cmd.message_ids] if cmd.message_ids else None
        c.sub.execute(c.sub.core.redeliver(c.sub.key_of(c), positions))

    async def on_unsubscribe(self, s: Session, r: Request) -> None:
        cmd: pb.CommandUnsubscribe = r.body  # type: ignore[assignment]
        c = await self._consumer_subscribed(s, cmd.consumer_id)
        if c is None:
            s.send(wire.error(cmd.request_id, pb.ConsumerNotFound, "no such consumer"))
            return
        sub = c.sub
        # under the lock a consumer subscribing holds until it is attached: one subscribing while the cursor is
        # deleted attaches after, to a subscription made anew; it restored the cursor still stored and attached,
        # and the delete then removed that znode (and detached the cursor's name) under it
        async with sub.topic._opening_subscription:
            if s.consumers.get(cmd.consumer_id) is not c:  # closed meanwhile
                s.send(wire.error(cmd.request_id, pb.ConsumerNotFound, "no such consumer"))
                return
            if len(sub.consumers) > 1:
                s.send(wire.error(cmd.request_id, pb.ConsumerBusy, "the subscription has other consumers"))
                return
            # out of the topic's subscriptions while the cursor is deleted (one subscribing meanwhile waits for
            # the lock and makes it anew), but the consumer stays attached until the delete succeeded: if it
            # fails, the subscription is put back and the client's retry finds its consumer (removed first, the
            # retry met ConsumerNotFound, the cursor still stored)
            listed = sub.topic.subscriptions.get(sub.name) is sub
            if listed:
                del sub.topic.subscriptions[sub.name]
            if sub.cursor is not None:
                try:
                    await sub.cursor.delete()
                except (ManagedLedgerError, zk.MetadataError) as e:
                    s.send(wire.error(cmd.request_id, pb.MetadataError, str(e)))
                    if sub.topic.unloaded:
                        # let go meanwhile (its session lost, unloaded, deleted): its consumers were told to
                        # reconnect while this subscription was out of its list, so this one is told now (it
                        # stayed attached to a topic nobody served, its receive() getting nothing)
                        s.consumers.pop(cmd.consumer_id, None)
                        sub.remove_consumer(c)
                        s.send(wire.close_consumer(cmd.consumer_id, 0))
                    elif listed:
                        sub.topic.subscriptions.setdefault(sub.name, sub)
                    return
                except BaseException:
                    # any other failure (a bug, a cancellation): the cursor is attached again (ManagedCursor.delete),
                    # so its subscription is listed again too, not a cursor the topic does not list
                    if listed and not sub.topic.unloaded:
                        sub.topic.subscriptions.setdefault(sub.name, sub)
                    raise
            s.consumers.pop(cmd.consumer_id, None)
            sub.remove_consumer(c)
        s.send(wire.success(cmd.request_id))

    def on_close_consumer(self, s: Session, r: Request) -> None:
        cmd: pb.CommandCloseConsumer = r.body  # type: ignore[assignment]
        s.creating_consumers.close(cmd.consumer_id)
        c = s.consumers.pop(cmd.consumer_id, None)
        if c is not None:
            c.sub.remove_consumer(c)
        s.send(wire.success(cmd.request_id))

    async def on_seek(self, s: Session, r: Request) -> None:
        cmd: pb.CommandSeek = r.body  # type: ignore[assignment]
        c = await self._consumer_subscribed(s, cmd.consumer_id)
        if c is None:
            s.send(wire.error(cmd.request_id, pb.ConsumerNotFound, "no such consumer"))
            return
        sub = c.sub
        ml = sub.topic.ml
        if cmd.HasField("message_publish_time"):
            t = cmd.message_publish_time
            try:
                found = await ml.find_first(lambda data: wire.entry_publish_time(data) >= t)
            except ManagedLedgerError as e:
                s.send(wire.error(cmd.request_id, pb.PersistenceError, str(e)))
                return
            pos = found if found is not None else ml.next_position(ml.last_confirmed_position())
        elif cmd.HasField("message_id"):
            mid = _position(cmd.message_id)
            if mid.ledger_id < 0 or mid.entry_id < 0:
                pos = sub.topic.earliest(sub.read_compacted)
            elif mid.ledger_id == INT64_MAX:
                pos = ml.next_position(ml.last_confirmed_position())
            else:
                pos = sub.topic.not_past_the_end(mid)
        else:
            s.send(wire.error(cmd.request_id, pb.NotAllowedError, "SEEK needs a message id or publish time"))
            return
        # Like Pulsar: the consumers are closed first (they reconnect, and start over with fresh permits and an
        # empty queue), then the cursor is reset, then the seek is answered. A client that has its consumer closed
        # before the answer resubscribes at the position sought; one answered first would take its reconnection
        # for an ordinary one, and a reader would resubscribe after the message it last read (the seek lost). A
        # reader's subscription stays (it comes back to it without a start message id after a seek by time).
        sub.disconnect_consumers(keep=True)
        try:
            await sub.seek(pos)
        except (ManagedLedgerError, zk.MetadataError) as e:
            s.send(wire.error(cmd.request_id, pb.MetadataError, str(e)))
            return
        s.send(wire.success(cmd.request_id))

    async def on_get_last_message_id(self, s: Session, r: Request) -> None:
        cmd: pb.CommandGetLastMessageId = r.body  # type: ignore[assignment]
        c = await self._consumer_subscribed(s, cmd.consumer_id)
        if c is None:
            s.send(wire.error(cmd.request_id, pb.ConsumerNotFound, "no such consumer"))
            return
        topic = c.sub.topic
        last = topic.ml.last_confirmed_position()
        batch_index = -1
        view = topic.compaction.view if c.sub.read_compacted else None
        if view is not None and last <= view.horizon:
            # nothing after the horizon: a compacted reader's last message is the compacted ledger's (the
            # topic's may be compacted away, and it would wait for it)
            try:
                kept = await view.last()
            except (LE.LedgerError, wire.EntryFormatError) as e:
                s.send(wire.error(cmd.request_id, pb.PersistenceError, str(e)))
                return
            last, batch_index = (
                (Position(view.horizon.ledger_id, -1), -1)
                if kept is None
                else (kept[0], last_kept_index(kept[1]))
            )
        elif last.entry_id >= 0:
            if topic.last_entry_messages is None:
                try:
                    md, _ = wire.parse_entry(await topic.ml.read_entry(last), verify_checksum=False)
                    topic.last_entry_messages = (
                        md.num_messages_in_batch if md.HasField("num_messages_in_batch") else 0
                    )
                except (ManagedLedgerError, wire.EntryFormatError):
                    topic.last_entry_messages = 0
            if topic.last_entry_messages:
                batch_index = topic.last_entry_messages - 1
        s.send(
            wire.get_last_message_id_response(
                cmd.request_id,
                last.ledger_id,
                last.entry_id,
                batch_index=batch_index,
                partition=topic.name.partition_index,
                mark_delete_position=tuple(c.sub.mark_position),  # type: ignore[arg-type]
            )
        )

    async def on_get_topics_of_namespace(self, s: Session, r: Request) -> None:
        cmd: pb.CommandGetTopicsOfNamespace = r.body  # type: ignore[assignment]
        assert self.bk is not None
        if self.config.auth_required:
            try:
                probe = TopicName.parse(f"persistent://{cmd.namespace}/-")
            except InvalidTopicName as e:
                s.send(wire.error(cmd.request_id, pb.InvalidTopicName, str(e)))
                return
            refused = await self._authorized(s, probe, EITHER)
            if refused is not None:
                s.send(wire.error(cmd.request_id, pb.AuthorizationError, refused))
                return
        if cmd.mode == pb.CommandGetTopicsOfNamespace.NON_PERSISTENT:
            # Pulsar answers the mode's topics only (a regex consumer's RegexSubscriptionMode.NonPersistentOnly),
            # and this broker has no non-persistent topics
            s.send(wire.get_topics_of_namespace_response(cmd.request_id, []))
            return
        try:
            tenant, ns = cmd.namespace.split("/", 1)
            names = await self.bk.store.achildren(f"managed-ledgers/{tenant}/{ns}/persistent")
        except (ValueError, zk.MetadataNotFoundError):
            names = []
        except zk.MetadataError as e:
            s.send(wire.error(cmd.request_id, pb.MetadataError, str(e)))
            return
        topics = sorted(f"persistent://{cmd.namespace}/{unquote(n)}" for n in names)
        s.send(wire.get_topics_of_namespace_response(cmd.request_id, topics))

    async def on_get_schema(self, s: Session, r: Request) -> None:
        """The schema stored for the topic (``schemas/<ml>`` in ZooKeeper, shared by a partitioned topic's
        partitions): the version asked for, else the latest; a bytes topic answers "no schema"."""
        cmd: pb.CommandGetSchema = r.body  # type: ignore[assignment]
        assert self.meta is not None
        try:
            name = TopicName.parse(cmd.topic)
        except InvalidTopicName as e:
            s.send(
                wire.get_schema_response(cmd.request_id, error_code=pb.InvalidTopicName, error_message=str(e))
            )
            return
        try:
            history = await self.meta.get_schemas(name.base.ml_name)
        except zk.MetadataError as e:
            s.send(
                wire.get_schema_response(cmd.request_id, error_code=pb.MetadataError, error_message=str(e))
            )
            return
        latest = history.latest()
        version = -1 if latest is None else latest[0]
        if cmd.HasField("schema_version") and cmd.schema_version:
            version = int.from_bytes(cmd.schema_version[-8:], "big")
        info = history.get(version)
        if info is None:  # none such, or the latest was deleted through the admin
            s.send(
                wire.get_schema_response(
                    cmd.request_id, error_code=pb.TopicNotFound, error_message="Topic not found or no-schema"
                )
            )
            return
        schema = pb.Schema(
            name=info.name or name.local,
            schema_data=info.data,
            type=info.type,  # type: ignore[arg-type]
            properties=[pb.KeyValue(key=k, value=v) for k, v in info.properties.items()],
        )
        s.send(
            wire.get_schema_response(cmd.request_id, schema=schema, schema_version=version.to_bytes(8, "big"))
        )

    def on_consumer_stats(self, s: Session, r: Request) -> None:
        cmd: pb.CommandConsumerStats = r.body  # type: ignore[assignment]
        c = self._consumer(s, cmd.consumer_id)
        if c is None:
            s.send(
                wire.consumer_stats_response(
                    cmd.request_id, error_code=pb.ConsumerNotFound, error_message="no such consumer"
                )
            )
            return
        key = c.sub.key_of(c)
        s.send(
            wire.consumer_stats_response(
                cmd.request_id,
                consumerName=c.name,
                availablePermits=c.sub.core.permits(key),
                unackedMessages=c.sub.core.unacked_messages(key),
                type=pb.CommandSubscribe.SubType.Name(c.sub.core.sub_type),
                msgBacklog=c.sub.cursor.backlog_messages() if c.sub.cursor else 0,
            )
        )
