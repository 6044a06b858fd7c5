"""The ``topic`` PySpark data source: Pulsar topics read straight from the bookies, batch and streaming.

    from spark import register
    register(spark)
    df = (spark.read.format("topic").option("zk", "127.0.0.1:2181").option("topic", "orders")
          .option("startingOffsets", "earliest").load())
    q = (spark.readStream.format("topic").option("zk", "127.0.0.1:2181").option("topics", "a,b")
         .option("maxEntriesPerTrigger", 10000).load()
         .writeStream.format("parquet").option("checkpointLocation", ck).trigger(availableNow=True).start(out))

No broker is in the path: the driver reads the managed ledgers' znodes (``docs/broker.md``) and, for a topic's
open (current) ledger, its last add confirmed with a non-fencing open, so the broker keeps writing undisturbed;
executors read entries from the bookies with their own client and unpack them (batches into one row per message;
payloads compressed with LZ4, ZLIB, ZSTD or SNAPPY, as the Pulsar clients write them, are decompressed).

Options (names case-insensitive; every mistake fails when the query is defined/started, naming the option):

* ``zk``, ``zkRoot`` (default ``/ledgerstore``), ``password``: the managed-ledger password (default empty),
  checked once per query at planning against the first ledger listed (a salted PBKDF2 each); a ledger of another
  password fails where it is opened, naming the option too.
* ``authTokenFile``, ``zkAuthFile``: files holding the bookies' token and ZooKeeper's ``user:password`` for a
  secured cluster, read where the query is planned, their contents shipped with the tasks (default: each
  process's environment, ``LEDGERSTORE_AUTH_TOKEN[_FILE]`` and ``LEDGERSTORE_ZK_AUTH[_FILE]``); a credential
  missing or refused fails the planning naming the option (:mod:`spark.options`).
* pulsar-spark's names (the source is ``format("pulsar")`` too): ``admin.url`` (no ``zk``: the metadata store the
  broker names), ``service.url`` (checked, unused), ``predefinedSubscription``, ``pulsar.client.authParams``' token
  (:mod:`spark._pulsar_options`).
* exactly one of ``topic`` (a name: ``t``, ``tenant/ns/t`` or ``persistent://tenant/ns/t``), ``topics`` (a comma
  list) or ``topicsPattern`` (a regex matched against full names ``persistent://tenant/ns/<topic>``; the namespace
  is the pattern's ``persistent://tenant/ns/`` prefix, ``public/default`` for a bare regex). A partitioned topic
  (``topics/<ml>`` znode, N partitions) reads its N partitions ``<topic>-partition-<i>``, each its own managed
  ledger; a topic is matched by its base name or a partition's name. A named topic that does not exist is an
  error (saying so when its namespace does not exist either), and so is a pattern that matches nothing in a
  namespace that does not exist (a typo would otherwise read nothing), or whose topic part is no regex on its own
  (a glob's ``*-orders``, which after the namespace's prefix would repeat its ``/`` and match nothing).
* ``startingOffsets``: ``earliest`` (batch default), ``latest`` (streaming default) or JSON
  ``{"persistent://public/default/t-partition-0": [ledgerId, entryId], ...}``: per partition, the position of the
  first entry to read (inclusive); a value may also be ``"earliest"``/``"latest"``; partitions not named start
  where the query's default does, as in pulsar-spark: ``earliest`` in a batch, ``latest`` in a stream (a stream
  that means to read the others from their start names them ``"earliest"``). A batch query refuses ``latest``,
  whole or for a partition (it reads up to the latest entry, so it would read nothing; to leave partitions out,
  name the others in ``topics``). ``endingOffsets`` (batch only): ``latest`` (default) or the same JSON, the
  position *after* the last entry to read (exclusive; partitions not named read to ``latest``). Positions are Pulsar's MessageIdData
  ``(ledgerId, entryId)``, the ``__ledgerId``/``__entryId`` columns: to resume after a row, start at
  ``[ledgerId, entryId + 1]``.
* ``startingTime`` / ``endingTime`` (ms since the epoch, publish time; a value of seconds, 10^9 to 10^11, is
  refused naming the option; no message published before ``startingTime`` makes a row, so a stream given a
  time still ahead reads from there, not from when it started; a stream keeps the time it began with in its
  checkpoint's offsets, and a restart filters by it whatever the option says now, as a starting option applies to
  a new query only; an offset logged before the time was kept filters by the option, as then): start at the first
  entry published at or
  after ``startingTime``; stop before the first entry published at or after ``endingTime`` (found by binary search
  over each partition's entries; the messages of a batch entry share its publish time). An ``endingTime`` not after
  ``startingTime``, or an ``endingOffsets`` position not after the partition's ``startingOffsets`` one, would read
  nothing and is refused naming the option.
* ``failOnDataLoss`` (default true): a ledger deleted (trimmed by retention) before the query read it fails the
  query naming the ledger; false skips it with a warning. So does a topic a stream has read that is deleted (a
  topic never read is an option's error): false skips it, warning once, and reads it from its start once it is
  made again.
* streaming: ``maxEntriesPerTrigger`` (admission control counted in ledger entries: a batch entry counts once),
  ``maxBytesPerTrigger`` (estimated from each ledger's average entry size: a closed ledger's length, an open
  one's from its newest entry's header), ``subscriptionName``.
* ``cryptoFailureAction`` (Pulsar's ``ConsumerCryptoFailureAction``; default ``FAIL``): what to do with an
  end-to-end encrypted message (a producer with an encryption key), which the source cannot decrypt: ``FAIL``
  fails the query naming the entry and its key names; ``DISCARD`` skips it (a warning counts them per range);
  ``CONSUME`` gives one row per entry with the payload as stored (compressed, then encrypted, a batch whole:
  ``__batchIndex`` −1), its entry's key, properties and times, as a Pulsar consumer with that action does.
* tuning: ``entriesPerPartition`` (default 50000: one Spark partition per this many entries of one ledger),
  ``maxRecordsPerBatch`` (rows per Arrow batch), ``readTimeoutMs``.

A ledger the bookies cannot serve (too few of them up) fails the query with :class:`TopicReadError`, naming the
partition, the ledger, what was read and the bookies tried (those not registered now marked so).

Columns: ``value`` binary (null for a message sent with a null value), ``__key`` string, ``__topic`` string (the
partition's full name), ``__messageId`` binary (a serialised ``MessageIdData``: ledgerId, entryId, partition,
batch_index/batch_size for batch messages, what pulsar-spark gives; ``pulsar.MessageId.deserialize`` reads it),
``__publishTime`` timestamp, ``__eventTime`` timestamp (null when 0), ``__messageProperties``
map<string,string>, ``__partition`` int (−1 for a non-partitioned topic), ``__ledgerId`` long, ``__entryId`` long,
``__batchIndex`` int (−1 for a message not in a batch).

A chunked message (a producer with chunking on splits a message larger than the broker's limit over several
entries) is one row at its last chunk's position (``__ledgerId``/``__entryId``), its ``__messageId`` the id Pulsar's
clients give it (the last chunk's, with the first chunk's as ``first_chunk_message_id``); a reader finishing one
finds its earlier chunks before its range (in the ledger and the one before it, up to ``CHUNK_LOOKBACK_ENTRIES``
entries back). Chunks of a message that never completes (its producer died) make no row, as for a Pulsar consumer.

Streaming: the offset is ``{partition full name: [ledgerId, entryId], "subscription": name}``, the next position to
read per partition and the query's subscription. Partitions added to a topic while the query runs are picked up and
read from their earliest entry. ``commit(end)`` (and the planning of each micro-batch, whose start is the end of the
completed previous one: Spark commits a batch only when it plans the next one with data) moves the durable
subscription ``subscriptionName`` (default: a name of the query's own, ``spark-topic-<16 hex digits>``, taken when
the query first starts and kept in its checkpoint with every batch's offset, so the query restarted from its
checkpoint moves the same one whatever options changed, and two queries over the same topics, two checkpoints,
never share one; an offset written before the name was kept names none, and the query then keeps the name hashed
from zkRoot, topics and starting position, as it was; a query started without its checkpoint is a new one: the
old subscription stays, holding retention, until deleted; a subscription that exists and was not made by a topic
query, an application's, is refused, naming the option) on every partition: its cursor znode
``managed-ledgers/<ml>/cursors/<sub>`` (property ``spark-topic-query`` = 1 marks it as a query's) gets
``mark_delete`` = the position before the committed end, so retention (the broker trims only ledgers every
cursor consumed) keeps what Spark has not processed; properties ``spark-topic-mark-ledger``/``-entry`` record that
position too, so a restart tells the query's own commit from a move by another (the message TTL, a skip, a reset),
after which a trimmed ledger is checked as lost. ``Trigger.AvailableNow`` reads up to the latest positions
seen when the query starts, in as many micro-batches as the read limit makes. A new query makes its subscription
when its initial offset is chosen, at that position (a partition with no entry yet at ``(-1, -1)``), before any
batch reads (a new name that no batch Spark logged came to name is deleted when the query stops); a commit keeps
the cursor's other contents (the subscription properties set through the admin) and writes nothing for a topic
deleted meanwhile (one ZooKeeper transaction checking its managed ledger's znode).
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark._pulsar_options import parse_source_options
from spark._topic_offsets import (
    EARLIEST,
    STARTING_TIME_KEY,
    SUBSCRIPTION_KEY,
    LedgerSlot,
    Pos,
    Snapshot,
    advance,
    allot,
    bytes_between,
    count_between,
    entries_within_bytes,
    entry_ranges,
    missing_ledger_is_loss,
    positions_from_json,
    positions_json,
    resolve_start,
)
from spark._topic_options import (
    SUBSCRIPTION_PREFIX,
    OffsetSpec,
    TopicOptionError,
    TopicOptions,
)
from spark.ledger_source import _exists, check_bookie_access, credentials_checked, freeze_worker_heap
from spark.options import BATCH_BYTES_MAX, client_config
from spark.planning import bookies_tried

__all__ = [
    "TOPIC_SCHEMA",
    "CryptoFailureError",
    "TopicDataLossError",
    "TopicDataSource",
    "TopicOptionError",
    "TopicRange",
    "TopicReadError",
    "TopicReader",
    "TopicStreamReader",
]

log = logging.getLogger("spark.topic_source")

TOPIC_SCHEMA = StructType(
    [
        StructField("value", BinaryType(), True),
        StructField("__key", StringType(), True),
        StructField("__topic", StringType(), False),
        StructField("__messageId", BinaryType(), False),
        StructField("__publishTime", TimestampType(), False),
        StructField("__eventTime", TimestampType(), True),
        StructField("__messageProperties", MapType(StringType(), StringType(), True), False),
        StructField("__partition", IntegerType(), False),
        StructField("__ledgerId", LongType(), False),
        StructField("__entryId", LongType(), False),
        StructField("__batchIndex", IntegerType(), False),
    ]
)


class CryptoFailureError(RuntimeError):
    """An end-to-end encrypted message read while ``cryptoFailureAction`` is FAIL (the default)."""


class TopicDataLossError(RuntimeError):
    """Entries the query was to read were deleted (a trimmed ledger, or the topic: ``ledger_id`` None) while
    ``failOnDataLoss`` is true."""

    def __init__(self, topic: str, ledger_id: int | None, what: str) -> None:
        lost = "lost ledgers" if ledger_id is not None else "a deleted topic"
        super().__init__(
            f"{topic}: {'' if ledger_id is None else f'ledger {ledger_id} '}{what} (failOnDataLoss is true; set "
            f"option failOnDataLoss=false to skip {lost} with a warning)"
        )
        self.topic = topic
        self.ledger_id = ledger_id


class TopicReadError(RuntimeError):
    """A topic's ledger its bookies could not serve (too few answered, timed out, a bad reply): the message names
    the topic, the ledger, what was being read and the bookies that hold it, saying which are not registered."""

    def __init__(self, topic: str, ledger_id: int, what: str, message: str) -> None:
        super().__init__(message)
        self.topic = topic
        self.ledger_id = ledger_id
        self.what = what


def _unreadable(
    bk: Any, topic: str, ledger_id: int, what: str, err: BaseException, first: int = 0
) -> TopicReadError:
    """``err`` (a ledger client's error reading ``what`` of ``ledger_id``) as a :class:`TopicReadError`: the
    bookies tried are those of the ensembles holding entries ``first`` on, from the ledger's metadata (ZooKeeper
    answers when the bookies do not); each one not registered now (down, or its session lost) is said so."""
    try:
        md = bk.ledger_metadata(ledger_id)
        ensembles = [(e.first_entry_id, e.bookies) for e in md.ensembles]
        try:
            up: set[str] | None = set(bk.writable_bookies()) | set(bk.readonly_bookies())
        except Exception:  # noqa: BLE001 - then the bookies are listed without saying which are down
            up = None
        bookies = bookies_tried(ensembles, first, up)
    except Exception as e:  # noqa: BLE001 - the message is the point: it says what it could not learn
        bookies = f"bookies not known ({type(e).__name__}: {e})"
    return TopicReadError(
        topic, ledger_id, what, f"{topic}: ledger {ledger_id} could not be read ({what}): {err}; {bookies}"
    )


def _wrong_password(ledger_id: int, topic: str) -> TopicOptionError:
    return TopicOptionError(
        "password",
        f"wrong password for ledger {ledger_id} of {topic} (give the broker's managed-ledger password: its "
        "--managed-ledger-password, empty by default)",
    )


def _data_loss(opts: TopicOptions, topic: str, ledger_id: int, what: str) -> None:
    if opts.fail_on_data_loss:
        raise TopicDataLossError(topic, ledger_id, what)
    log.warning("%s: ledger %d %s; skipped (failOnDataLoss=false)", topic, ledger_id, what)


@dataclass(frozen=True)
class PartitionRef:
    """One topic partition (or a non-partitioned topic): its full name, index (−1) and managed ledger."""

    name: str
    index: int
    ml_name: str


@dataclass(frozen=True)
class TopicRange(InputPartition):  # type: ignore[misc]
    """One Spark partition: entries ``first_entry_id..last_entry_id`` of one ledger of one topic partition.
    ``prev_ledger_id``: the ledger before it in the partition's chain (−1 if none), where the first chunks of a
    chunked message whose last chunk is in the range may lie. ``not_before``: the query's ``startingTime`` (ms, 0
    for none): no message published before it makes a row (a stream's, from its checkpoint's offsets)."""

    topic: str
    partition: int
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    prev_ledger_id: int = -1
    not_before: int = 0


# --- driver side: topics, ledger chains, positions ----------------------------------------------------------------


def _bk_client(opts: TopicOptions) -> Any:
    from ledger_client.sync import BookKeeper

    with credentials_checked(opts, TopicOptionError):
        return BookKeeper.connect(opts.zk, config=client_config(opts))


class _Driver:
    """ZooKeeper and bookie access of the driver (planning, offsets, commits). Not picklable: built lazily."""

    def __init__(self, opts: TopicOptions) -> None:
        from zk.client import MetadataStore

        self.opts = opts
        #: the durable subscription a stream moves (its checkpoint's, set by the stream reader)
        self.subscription = opts.subscription
        with credentials_checked(opts, TopicOptionError):
            self.store = MetadataStore.connect(opts.zk, opts.zk_root, auth=opts.zk_auth)
        self._bk: Any = None
        self._open_handles: dict[int, Any] = {}
        #: ledger id -> entries of ledgers seen closed (fixed for good): tells a trimmed ledger from a loss
        self.known_closed: dict[int, int] = {}
        #: whether ``password`` was checked against a ledger's digest (once per query: a salted PBKDF2, about
        #: 40 ms of CPU each; the ledgers of a topic take its broker's one password, and a ledger that takes
        #: another fails where it is opened, naming the option too)
        self._password_ok = False
        #: topics a stream read that were deleted since, skipped (failOnDataLoss=false): warned of once each
        self._gone_warned: set[str] = set()
        try:  # a token the bookies refuse fails here, naming the option
            check_bookie_access(self.bk, opts, TopicOptionError)
        except BaseException:
            self.close()
            raise

    @property
    def bk(self) -> Any:
        if self._bk is None:
            self._bk = _bk_client(self.opts)
        return self._bk

    def close(self) -> None:
        for h in self._open_handles.values():
            try:
                h.close()
            except Exception:  # noqa: BLE001 - releasing a read handle never matters
                pass
        self._open_handles.clear()
        if self._bk is not None:
            self._bk.close()
            self._bk = None
        self.store.close()

    # topics
    def partitions(self, read: Collection[str] = (), *, skip_missing: bool = False) -> list[PartitionRef]:
        """The partitions of the topics read. A named topic that does not exist fails naming the option; one that
        a stream read (a partition of it in ``read``, the names of its offset) was deleted under it: a data loss
        (the messages written after the stream's last batch); ``skip_missing`` leaves missing topics out."""
        from topic_broker.names import TopicName
        from zk import layout
        from zk.managed_ledgers import PartitionedTopicMetadata

        opts = self.opts
        out: list[PartitionRef] = []
        if opts.pattern is None:
            for full in opts.topics:
                tn = TopicName.parse(full)
                meta = self.store.get_optional(layout.partitioned_topic_path(tn.ml_name))
                if meta is not None:
                    n = PartitionedTopicMetadata.from_json(meta.value).partitions
                    out += [PartitionRef(str(tn.partition(i)), i, tn.partition(i).ml_name) for i in range(n)]
                elif self.store.exists(layout.ml_info_path(tn.ml_name)):
                    out.append(PartitionRef(str(tn), tn.partition_index, tn.ml_name))
                elif skip_missing:
                    continue
                elif any(str(TopicName.parse(r).base) == str(tn.base) for r in read):
                    self._topic_gone(str(tn))
                else:
                    why = f"topic {full} does not exist"
                    if not self._namespace_exists(tn.tenant, tn.namespace):
                        why += f" (nor does its namespace {tn.namespace_name}: a typo?)"
                    raise TopicOptionError("topics" if len(opts.topics) > 1 else "topic", why)
            # each partition once, however often it is named ('orders,orders-partition-0': the base names it too)
            return list({p.name: p for p in out}.values())
        regex = re.compile(opts.pattern)
        tenant, ns = opts.pattern_namespace.split("/")
        ml_dir = f"{layout.MANAGED_LEDGERS}/{tenant}/{ns}/persistent"
        topic_dir = f"{layout.TOPICS}/{tenant}/{ns}/persistent"
        locals_ = self._children(ml_dir)
        partitioned = {}
        for local in self._children(topic_dir):
            tn = TopicName(tenant, ns, local)
            meta = self.store.get_optional(layout.partitioned_topic_path(tn.ml_name))
            if meta is not None:
                partitioned[local] = PartitionedTopicMetadata.from_json(meta.value).partitions
        seen: set[str] = set()
        for local, n in sorted(partitioned.items()):
            base = TopicName(tenant, ns, local)
            for i in range(n):
                p = base.partition(i)
                if regex.fullmatch(str(base)) or regex.fullmatch(str(p)):
                    out.append(PartitionRef(str(p), i, p.ml_name))
                    seen.add(p.local)
        for local in sorted(locals_):
            tn = TopicName(tenant, ns, local)
            if local in seen or tn.base.local in partitioned or not regex.fullmatch(str(tn)):
                continue
            out.append(PartitionRef(str(tn), tn.partition_index, tn.ml_name))
        if not out and not self._namespace_exists(tenant, ns):
            # a typo in the pattern's namespace would otherwise read nothing, quietly
            raise TopicOptionError("topicsPattern", f"namespace {tenant}/{ns} does not exist")
        return out

    def _topic_gone(self, topic: str) -> None:
        what = "was deleted while the query read it (what was written to it after the query's last batch is lost)"
        if self.opts.fail_on_data_loss:
            raise TopicDataLossError(topic, None, what)
        if topic not in self._gone_warned:
            self._gone_warned.add(topic)
            log.warning("%s %s; skipped until it exists again (failOnDataLoss=false)", topic, what)

    def _namespace_exists(self, tenant: str, ns: str) -> bool:
        """Does the namespace exist (its policies znode, created through the broker's admin, as in Pulsar)?"""
        from zk import layout

        return bool(self.store.exists(layout.namespace_policies_path(tenant, ns)))

    def _children(self, path: str) -> list[str]:
        from zk.errors import MetadataNotFoundError

        try:
            return sorted(unquote(c) for c in self.store.children(path))
        except MetadataNotFoundError:
            return []

    # ledger chains
    def snapshot(self, part: PartitionRef) -> Snapshot:
        """The partition's ledgers and how far each is readable (the open one to its LAC, never fencing)."""
        from ledger_client import NoSuchLedgerError
        from zk import layout
        from zk.managed_ledgers import ManagedLedgerInfo

        v = self.store.get_optional(layout.ml_info_path(part.ml_name))
        if v is None:
            return Snapshot()
        info = ManagedLedgerInfo.from_json(v.value)
        slots: list[LedgerSlot] = []
        for i, li in enumerate(info.ledgers):
            last = i == len(info.ledgers) - 1
            if li.entries > 0 or not last:
                if not self._password_ok:
                    try:
                        self._check_password(part, li.ledger_id, self.bk.ledger_metadata(li.ledger_id))
                    except NoSuchLedgerError:
                        pass  # trimmed or deleted: the data-loss checks say so where it matters
                slots.append(LedgerSlot(li.ledger_id, li.entries, li.size, True))
                self.known_closed[li.ledger_id] = li.entries
                continue
            try:
                slots.append(self._open_slot(part, li.ledger_id))
            except NoSuchLedgerError:
                continue  # dropped by a new owner: it held nothing
        return Snapshot(tuple(slots))

    def _check_password(self, part: PartitionRef, ledger_id: int, md: Any) -> None:
        """A wrong ``password`` fails the plan naming the option (tasks would each fail on it, unnamed): checked
        against the first ledger the query lists, once per query."""
        if self._password_ok:
            return
        if not md.check_password(self.opts.password):
            raise _wrong_password(ledger_id, part.name)
        self._password_ok = True

    def _open_slot(self, part: PartitionRef, ledger_id: int) -> LedgerSlot:
        from ledger_client import LedgerError, NoSuchLedgerError, UnauthorizedError

        md = self.bk.ledger_metadata(ledger_id)
        self._check_password(part, ledger_id, md)
        if md.state.value == "CLOSED":
            self._drop_handle(ledger_id)
            self.known_closed[ledger_id] = md.last_entry_id + 1
            return LedgerSlot(ledger_id, md.last_entry_id + 1, md.length, True)
        h = self._open_handles.get(ledger_id)
        if h is None:
            try:  # never fences the broker; the client checks the password (a ledger of another one)
                h = self.bk.open_ledger(ledger_id, self.opts.password, recovery=False)
            except UnauthorizedError:
                raise _wrong_password(ledger_id, part.name) from None
            except NoSuchLedgerError:
                raise
            except LedgerError as e:
                raise _unreadable(self.bk, part.name, ledger_id, "its open, planning the query", e) from e
            self._open_handles[ledger_id] = h
            for old in [k for k in self._open_handles if k != ledger_id and k < ledger_id]:
                self._drop_handle(old)
        try:
            lac = h.read_last_add_confirmed()
        except NoSuchLedgerError:
            self._drop_handle(ledger_id)
            raise
        except LedgerError as e:
            what = "the last add confirmed of the topic's current ledger, planning the query"
            raise _unreadable(self.bk, part.name, ledger_id, what, e) from e
        try:
            size = _open_size(h, lac)
        except LedgerError as e:  # a corrupt reply header
            what = "the size of the topic's current ledger, planning the query"
            raise _unreadable(self.bk, part.name, ledger_id, what, e) from e
        return LedgerSlot(ledger_id, lac + 1, size, False)

    def _drop_handle(self, ledger_id: int) -> None:
        h = self._open_handles.pop(ledger_id, None)
        if h is not None:
            try:
                h.close()
            except Exception:  # noqa: BLE001
                pass

    def first_at_or_after(self, part: PartitionRef, snap: Snapshot, time_ms: int) -> Pos:
        """The position of the first entry published at or after ``time_ms`` (the snapshot's end if none)."""
        from ledger_client import LedgerError, NoSuchEntryError, NoSuchLedgerError
        from topic_broker.wire import entry_publish_time

        index: list[tuple[int, int]] = [(s.ledger_id, s.entries) for s in snap.ledgers if s.entries > 0]
        total = sum(n for _, n in index)

        def position(i: int) -> Pos:
            for lid, n in index:
                if i < n:
                    return (lid, i)
                i -= n
            raise IndexError(i)

        handles: dict[int, Any] = {}
        try:
            lo, hi = 0, total
            while lo < hi:
                mid = (lo + hi) // 2
                lid, eid = position(mid)
                try:
                    h = handles.get(lid)
                    if h is None:
                        h = handles[lid] = self.bk.open_ledger(lid, self.opts.password, recovery=False)
                    published = entry_publish_time(h.read_entry(eid).data)
                except (NoSuchEntryError, NoSuchLedgerError):
                    raise
                except LedgerError as e:
                    what = f"entry {eid}, looking for startingTime/endingTime {time_ms}"
                    raise _unreadable(self.bk, part.name, lid, what, e, eid) from e
                if published >= time_ms:
                    hi = mid
                else:
                    lo = mid + 1
        finally:
            for h in handles.values():
                h.close()
        return snap.latest() if lo == total else position(lo)

    def position(self, part: PartitionRef, snap: Snapshot, spec: OffsetSpec, option: str) -> Pos:
        kind = spec.kind
        if kind == "positions":
            for name, lid, eid in spec.positions:
                if name == part.name:
                    if lid == -2:
                        return snap.earliest()
                    if lid == -3:
                        return snap.latest()
                    return (lid, eid)
            kind = spec.default
        if kind == "earliest":
            return snap.earliest()
        if kind == "latest":
            return snap.latest()
        if kind == "time":
            return self.first_at_or_after(part, snap, spec.time_ms)
        raise TopicOptionError(option, f"unsupported offset kind {kind!r}")

    def check_positions_name_partitions(self, parts: list[PartitionRef]) -> None:
        names = {p.name for p in parts}
        for spec, option in ((self.opts.starting, "startingOffsets"), (self.opts.ending, "endingOffsets")):
            for name, _, _ in spec.positions:
                if name not in names:
                    raise TopicOptionError(
                        option,
                        f"{name} is not a partition of the topics read (they are: {', '.join(sorted(names))})",
                    )

    def check_start(
        self, part: PartitionRef, snap: Snapshot, start: Pos, committed: Pos | None, *, stream: bool = False
    ) -> Pos:
        """``start`` on the chain; a start inside a ledger that is gone is data loss unless it was consumed."""
        for lid in snap.lost_ledgers(start):
            if missing_ledger_is_loss(start, self.known_closed, committed, snap.ids()):
                what = f"was deleted before entry {start[1]} on was read"
                if stream and committed is None:
                    what += (
                        f" (the query's subscription {self.subscription}, which vouches for what it read, is "
                        "gone or was moved by another; a topic deleted and created again after the query had read "
                        "it all lost nothing)"
                    )
                _data_loss(self.opts, part.name, lid, what)
        return resolve_start(snap, start)

    # durable subscription
    def _check_ours(self, part: PartitionRef, info: Any) -> None:
        """Refuse a subscription that a topic query did not create: an application's, whose consumers the
        commits would disturb (and the broker serving them takes such a write for another owner's and stops
        serving the topic). Default names are ours even without the mark (made before it was set)."""
        sub = self.subscription
        if SPARK_CURSOR_PROPERTY in info.properties or not self.opts.subscription_explicit:
            return
        if self._copied_from_ours(part):
            return
        raise TopicOptionError(
            "subscriptionName",
            f"subscription {sub!r} of {part.name} exists and was not created by a Spark topic query (an "
            "application's?): moving it would disturb its consumers and fence the topic at its broker; give "
            "the query a subscription name of its own",
        )

    def _copied_from_ours(self, part: PartitionRef) -> bool:
        """Whether the subscription on a partition added to a partitioned topic is the partition update's copy
        of the query's: the update makes the topic's subscriptions on its new partitions, at their start and
        without their properties (as Pulsar's does); the query's own on partition 0 makes the copy its own."""
        from topic_broker.names import TopicName
        from zk import layout
        from zk.managed_ledgers import CursorInfo

        if part.index <= 0:
            return False
        first = TopicName.parse(part.name).base.partition(0)
        v = self.store.get_optional(layout.ml_cursor_path(first.ml_name, self.subscription))
        return v is not None and SPARK_CURSOR_PROPERTY in CursorInfo.from_json(v.value).properties

    def commit(self, part: PartitionRef, mark_delete: Pos) -> bool:
        """The query's subscription on ``part`` to ``mark_delete``, made if need be; False (nothing written)
        when the topic is gone. The write is one ZooKeeper transaction with a check that the partition's
        managed-ledger znode is there: a topic deleted since the trigger read its metadata gets no cursor (nor
        its managed-ledger znode, empty, as the cursor's parent) made again. What else the cursor holds (the
        subscription properties set through the admin REST) stays."""
        from zk import layout
        from zk.errors import MetadataNotFoundError
        from zk.managed_ledgers import CursorInfo

        def moved(stored: dict[str, Any]) -> dict[str, Any]:
            cur = CursorInfo.from_json(stored) if "mark_delete" in stored else None  # else: none yet
            if cur is not None:
                self._check_ours(part, cur)
            info = CursorInfo(
                mark_delete=mark_delete,
                properties={
                    **(cur.properties if cur is not None else {}),
                    SPARK_CURSOR_PROPERTY: 1,
                    SPARK_MARK_LEDGER_PROPERTY: mark_delete[0],
                    SPARK_MARK_ENTRY_PROPERTY: mark_delete[1],
                },
                last_active_ms=int(time.time() * 1000),
                subscription_properties=cur.subscription_properties if cur is not None else {},
            )
            return info.to_json()

        try:
            self.store.update_guarded(
                layout.ml_cursor_path(part.ml_name, self.subscription),
                moved,
                guard=layout.ml_info_path(part.ml_name),
                default={},
            )
        except MetadataNotFoundError:
            log.info("%s: deleted; subscription %s not moved", part.name, self.subscription)
            return False
        return True

    def committed(self, part: PartitionRef) -> Pos | None:
        """What the query itself committed on the partition, as its subscription stores it; None when the
        subscription is gone, or when another moved it past that (the message TTL, a skip, a reset, a consumer):
        the broker may then have trimmed entries the query never read, so that position vouches for nothing."""
        from zk import layout
        from zk.managed_ledgers import CursorInfo

        v = self.store.get_optional(layout.ml_cursor_path(part.ml_name, self.subscription))
        if v is None:
            return None
        info = CursorInfo.from_json(v.value)
        self._check_ours(part, info)
        props = info.properties
        if SPARK_MARK_LEDGER_PROPERTY not in props or SPARK_MARK_ENTRY_PROPERTY not in props:
            return info.mark_delete  # committed before the query recorded its own position
        own = (int(props[SPARK_MARK_LEDGER_PROPERTY]), int(props[SPARK_MARK_ENTRY_PROPERTY]))
        if info.mark_delete > own:
            log.warning(
                "%s: subscription %s stands at %s, past the query's %s: moved by another (message TTL, skip, "
                "reset); ledgers trimmed since are checked as lost",
                part.name,
                self.subscription,
                info.mark_delete,
                own,
            )
            return None
        return info.mark_delete


# --- executor side: entries to Arrow rows ---------------------------------------------------------------------------


def _open_size(h: Any, lac: int) -> int:
    """Estimated bytes of entries 0..``lac`` of an OPEN ledger, whose metadata has no length yet (a reader's
    ``length`` is 0): the ledger's average entry size by the newest entry's header (its cumulative length)
    times the entries. ``maxBytesPerTrigger`` counts with it; without it, a topic whose ledgers are all open
    had its entries counted at 1 KiB each, whatever their size."""
    size = max(0, h.length)
    tail = h.tail_length
    if size == 0 and lac >= 0 and tail is not None and tail[1] > 0:
        entry_id, length = tail
        if entry_id < 0:  # (-1 divided by zero)
            from ledger_client.errors import ProtocolViolationError

            raise ProtocolViolationError(
                f"ledger {h.ledger_id}: the reply to the read of its last add confirmed ({lac}) has a corrupt "
                f"header: entry id {entry_id} (cumulative length {length}); a bookie answered with an entry it "
                "cannot hold"
            )
        size = round(length * (lac + 1) / (entry_id + 1))
    return size


def _prev_ledger(snap: Snapshot, ledger_id: int) -> int:
    ids = snap.ids()
    i = ids.index(ledger_id)
    return ids[i - 1] if i > 0 else -1


#: The property a topic query's subscription carries (its cursor's ``properties``): made by Spark, Spark's to move.
SPARK_CURSOR_PROPERTY = "spark-topic-query"
#: The position (ledger, entry) of the query's own last commit, beside the mark-delete that others may move.
SPARK_MARK_LEDGER_PROPERTY = "spark-topic-mark-ledger"
SPARK_MARK_ENTRY_PROPERTY = "spark-topic-mark-entry"

#: How many entries before a range a reader looks back for the earlier chunks of a chunked message it finishes.
CHUNK_LOOKBACK_ENTRIES = 10_000


@dataclass
class _Partial:
    """The chunks of a chunked message read so far: where its first chunk is and the payloads in order."""

    first: Pos
    parts: list[bytes]


def read_range(opts: TopicOptions, part: TopicRange, schema: StructType) -> Iterator[Any]:
    """The range's messages as Arrow record batches. Stateless: its own client, closed at the end."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from ledger_client import LedgerError, NoSuchEntryError, NoSuchLedgerError, UnauthorizedError
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker.wire import EntryFormatError, iter_batch, parse_entry

    freeze_worker_heap()  # as the ledger source: PySpark's full collection after each task skips the modules
    pa_schema = to_arrow_schema(schema, timezone="UTC")
    names = [f.name for f in schema.fields]
    cols: dict[str, list[Any]] = {n: [] for n in names}
    size = 0

    def flush() -> Any:
        nonlocal cols, size
        batch = pa.RecordBatch.from_arrays(
            [pa.array(cols[f.name], type=f.type) for f in pa_schema], schema=pa_schema
        )
        cols = {n: [] for n in names}
        size = 0
        return batch

    # chunked messages (one message split over several entries): assembled at their last chunk
    partials: dict[tuple[str, str], _Partial] = {}

    def look_back(key: tuple[str, str], chunk_id: int) -> _Partial | None:
        """Chunks ``0..chunk_id-1`` of ``key`` from the entries before the range (this ledger, then the one
        before it), newest first; None when chunk 0 is not found within :data:`CHUNK_LOOKBACK_ENTRIES`."""
        found: dict[int, tuple[Pos, bytes]] = {}
        budget = CHUNK_LOOKBACK_ENTRIES
        for lid in (part.ledger_id, part.prev_ledger_id):
            if lid < 0 or budget <= 0:
                break
            try:
                h = lh if lid == part.ledger_id else bk.open_ledger(lid, opts.password, recovery=False)
            except NoSuchLedgerError:
                break
            try:
                hi = part.first_entry_id - 1 if lid == part.ledger_id else h.last_add_confirmed
                while hi >= 0 and budget > 0:
                    lo = max(0, hi - 63)
                    budget -= hi - lo + 1
                    for entry in reversed(list(h.read(lo, hi))):
                        m, pl = parse_entry(entry.data)
                        if m.num_chunks_from_msg > 1 and (m.producer_name, m.uuid) == key:
                            if m.chunk_id < chunk_id:
                                found.setdefault(m.chunk_id, ((lid, entry.entry_id), bytes(pl)))
                            if m.chunk_id == 0:
                                if len(found) < chunk_id:
                                    return None
                                return _Partial(found[0][0], [found[i][1] for i in range(chunk_id)])
                    hi = lo - 1
            finally:
                if h is not lh:
                    h.close()
        return None

    def assemble(entry_id: int, meta: Any, payload: Any) -> tuple[Pos, bytes] | None:
        """A chunk added; the message's first position and whole payload once its last chunk is in."""
        key = (meta.producer_name, meta.uuid)
        chunk_id = meta.chunk_id
        if chunk_id == 0:
            p: _Partial | None = _Partial((part.ledger_id, entry_id), [])
        else:
            p = partials.pop(key, None) or look_back(key, chunk_id)
            if p is None or len(p.parts) != chunk_id:
                log.warning(
                    "%s: chunk %d of message %s at %d:%d without its earlier chunks: skipped",
                    part.topic,
                    chunk_id,
                    meta.uuid,
                    part.ledger_id,
                    entry_id,
                )
                return None
        assert p is not None
        p.parts.append(bytes(payload))
        if chunk_id < meta.num_chunks_from_msg - 1:
            partials[key] = p
            return None
        return p.first, b"".join(p.parts)

    discarded = 0
    #: ``startingTime``: no message published before it makes a row. The range starts at the first entry
    #: published at or after it (or, for a stream whose startingTime was still ahead, at the latest entry when
    #: the query started: the entries written from then until that time are left out here); a stream's is the
    #: time its checkpoint began with, not the option's now
    not_before = part.not_before

    def encrypted(entry_id: int, meta: Any) -> bool:
        """An end-to-end encrypted entry (the source holds no keys): whether it makes a row, as
        ``cryptoFailureAction`` says (FAIL raises)."""
        nonlocal discarded
        if opts.crypto_failure_action == "CONSUME":
            return True
        if opts.crypto_failure_action == "DISCARD":
            discarded += 1
            return False
        names = ", ".join(sorted({k.key for k in meta.encryption_keys}))
        raise CryptoFailureError(
            f"{part.topic}: entry {part.ledger_id}:{entry_id} is end-to-end encrypted (keys: {names}) and the "
            "topic source holds no keys to decrypt it: set option cryptoFailureAction=DISCARD to skip encrypted "
            "messages or CONSUME to read their payloads as stored (compressed, then encrypted, a batch whole)"
        )

    def add(entry_id: int, data: bytes) -> None:
        nonlocal size
        first_chunk: Pos | None = None
        try:
            meta, raw = parse_entry(data)
            payload: Any = raw
            if meta.num_chunks_from_msg > 1:
                whole = assemble(entry_id, meta, payload)
                if whole is None:
                    return
                first_chunk, payload = whole
            if (
                meta.publish_time < not_before
            ):  # (a chunked message: its last chunk's, as the clients give it)
                return
            if meta.encryption_keys:
                if not encrypted(entry_id, meta):
                    return
                # as a Pulsar consumer's CONSUME: the payload as stored (compressed, encrypted), a batch whole
                messages: list[tuple[Any, bytes]] = [(None, bytes(payload))]
            else:
                messages = list(
                    iter_batch(meta, payload)
                )  # decompressed there (pyarrow for LZ4, ZSTD, SNAPPY)
        except EntryFormatError as e:
            raise RuntimeError(f"{part.topic}: entry {part.ledger_id}:{entry_id} is malformed: {e}") from e
        publish_us = meta.publish_time * 1000
        batched = meta.HasField("num_messages_in_batch") and not meta.encryption_keys
        for i, (single, value) in enumerate(messages):
            src: Any = meta if single is None else single
            if single is not None and single.compacted_out:
                continue
            mid = pb.MessageIdData(ledgerId=part.ledger_id, entryId=entry_id)
            if part.partition >= 0:
                mid.partition = part.partition
            if batched:
                mid.batch_index = i
                mid.batch_size = len(messages)
            if first_chunk is not None:  # what Pulsar's clients serialise for a chunked message's id
                mid.first_chunk_message_id.ledgerId, mid.first_chunk_message_id.entryId = first_chunk
                if part.partition >= 0:
                    mid.first_chunk_message_id.partition = part.partition
            # send(None): the single message's metadata in a batch, the entry's own otherwise
            cols["value"].append(None if src.null_value else value)
            cols["__key"].append(src.partition_key if src.HasField("partition_key") else None)
            cols["__topic"].append(part.topic)
            cols["__messageId"].append(mid.SerializeToString())
            cols["__publishTime"].append(publish_us)
            cols["__eventTime"].append(src.event_time * 1000 if src.event_time else None)
            cols["__messageProperties"].append([(kv.key, kv.value) for kv in src.properties])
            cols["__partition"].append(part.partition)
            cols["__ledgerId"].append(part.ledger_id)
            cols["__entryId"].append(entry_id)
            cols["__batchIndex"].append(i if batched else -1)
            size += len(value)

    bk = _bk_client(opts)
    try:
        try:
            lh = bk.open_ledger(part.ledger_id, opts.password, recovery=False)
        except NoSuchLedgerError:
            _data_loss(opts, part.topic, part.ledger_id, "was deleted before it was read")
            return
        except UnauthorizedError:  # planning checked the password against one ledger of the query
            raise _wrong_password(part.ledger_id, part.topic) from None
        except LedgerError as e:
            raise _unreadable(bk, part.topic, part.ledger_id, "its open", e, part.first_entry_id) from e
        expected = part.first_entry_id
        try:
            if lh.last_add_confirmed < part.last_entry_id:
                lh.read_last_add_confirmed()  # planned from a LAC; it never goes backwards
            for entry in lh.read(part.first_entry_id, part.last_entry_id):
                assert entry.entry_id == expected, (entry.entry_id, expected)
                expected += 1
                add(entry.entry_id, entry.data)
                if len(cols["value"]) >= opts.max_records_per_batch or size >= BATCH_BYTES_MAX:
                    yield flush()
        except (NoSuchEntryError, NoSuchLedgerError):
            if _exists(bk, part.ledger_id):
                raise
            _data_loss(
                opts, part.topic, part.ledger_id, f"was deleted during the query (read to {expected - 1})"
            )
            return
        except LedgerError as e:
            what = f"entries {expected}..{part.last_entry_id} of the range {part.first_entry_id}..{part.last_entry_id}"
            raise _unreadable(bk, part.topic, part.ledger_id, what, e, expected) from e
        if cols["value"]:
            yield flush()
        if discarded:
            log.warning(
                "%s: %d end-to-end encrypted entries of ledger %d skipped (cryptoFailureAction=DISCARD)",
                part.topic,
                discarded,
                part.ledger_id,
            )
    finally:
        bk.close()


def _not_before(opts: TopicOptions) -> int:
    """The ``startingTime`` of the options (0: none)."""
    return opts.starting.time_ms if opts.starting.kind == "time" else 0


def _check_schema(schema: StructType) -> None:
    if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in TOPIC_SCHEMA]:
        raise TopicOptionError(
            "schema", f"the topic source has a fixed schema: {TOPIC_SCHEMA.simpleString()}"
        )


# --- batch ----------------------------------------------------------------------------------------------------------


class TopicReader(DataSourceReader):  # type: ignore[misc]
    """Holds only the parsed options and the schema: it is pickled to the executors."""

    def __init__(self, opts: TopicOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> list[TopicRange]:
        drv = _Driver(self.opts)
        try:
            parts = drv.partitions()
            drv.check_positions_name_partitions(parts)
            out: list[TopicRange] = []
            for p in parts:
                snap = drv.snapshot(p)
                start = drv.check_start(
                    p, snap, drv.position(p, snap, self.opts.starting, "startingOffsets"), None
                )
                end = drv.position(p, snap, self.opts.ending, "endingOffsets")
                for lid, first, last in entry_ranges(snap, start, end, self.opts.entries_per_partition):
                    out.append(
                        TopicRange(
                            p.name, p.index, lid, first, last, _prev_ledger(snap, lid), _not_before(self.opts)
                        )
                    )
            return out
        finally:
            drv.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, TopicRange):  # Spark hands us InputPartition(None) for an empty plan
            return iter(())
        return read_range(self.opts, partition, self.schema)


# --- streaming ------------------------------------------------------------------------------------------------------


class TopicStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Driver-side state (ZooKeeper session, cached open handles, the AvailableNow target) is rebuilt lazily and
    never pickled; ``read`` is stateless."""

    def __init__(self, opts: TopicOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._drv: _Driver | None = None
        self._target: dict[str, Pos] | None = None
        self._parts: dict[str, PartitionRef] = {}
        self._snaps: dict[str, Snapshot] = {}
        self._committed: dict[str, Pos | None] = {}
        self._initial: dict[str, Any] | None = None  # the last initial offset given (a new query's start)
        self._fresh: str | None = None  # a new query's subscription name, made once per run
        #: whether a batch's end Spark logs (latestOffset's, planned, committed) names ``_fresh``: then the
        #: checkpoint keeps it
        self._fresh_logged = False
        #: partitions (full name -> managed ledger) where ``_fresh`` was made
        self._fresh_made: dict[str, str] = {}
        #: a named subscription's own position on each partition (``committed``) before the initial offset moved
        #: it: where an earlier run of the checkpoint made it, for a batch 0 that run logged (:meth:`_rerun`)
        self._prior: dict[str, Pos | None] = {}
        #: the batch ends this run's latestOffset gave from the initial offset (a logged batch 0 is none of them)
        self._first_ends: list[dict[str, Pos]] = []

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "schema": self.schema}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["opts"], state["schema"])  # type: ignore[misc]

    @property
    def drv(self) -> _Driver:
        if self._drv is None:
            self._drv = _Driver(self.opts)
        return self._drv

    def _use_subscription(self, offset: dict[str, Any] | None, *, new_query: bool = False) -> str:
        """The durable subscription the query moves, for an offset of its checkpoint: the one
        ``subscriptionName`` names; else the one the offset holds (:data:`SUBSCRIPTION_KEY`, kept by every
        batch's end); else, for a new query (``offset`` its initial offset), a new name of its own, so that two
        queries (two checkpoints) never share one; else (offsets written before the name was kept in them) the
        name hashed from the query's options."""
        if self.opts.subscription_explicit:
            sub = self.opts.subscription
        elif isinstance((offset or {}).get(SUBSCRIPTION_KEY), str):
            sub = str((offset or {})[SUBSCRIPTION_KEY])
        elif new_query:
            if self._fresh is None:
                self._fresh = SUBSCRIPTION_PREFIX + secrets.token_hex(8)
                self._fresh_logged = False
            sub = self._fresh
        else:
            sub = self.opts.subscription
        if self.drv.subscription != sub:
            self.drv.subscription = sub
            self._committed.clear()
        return sub

    def _refresh(self, read: Collection[str] = (), *, skip_missing: bool = False) -> dict[str, Snapshot]:
        parts = self.drv.partitions(read, skip_missing=skip_missing)
        self.drv.check_positions_name_partitions(parts)
        self._parts = {p.name: p for p in parts}
        self._snaps = {p.name: self.drv.snapshot(p) for p in parts}
        return self._snaps

    def initialOffset(self) -> dict[str, Any]:
        """A new query's start (Spark asks when its checkpoint holds no offset, and again as batch 0's start
        whenever it runs that batch, a restart re-running a batch 0 logged by an earlier run too; within a run
        the answer is the first one; a re-run batch 0 is planned from where the checkpoint's subscription was
        made, :meth:`_made_at`). Its
        subscription is made here, durably, at that start on every partition (a partition with no entry yet at
        ``(-1, -1)``, before every ledger it will have), before any batch reads: retention keeps from then on what
        the first batch reads. A start in a ledger already gone is a data loss (``failOnDataLoss``; false
        starts at the next ledger). The name is not in this offset (the first batch's end holds it), so the first
        trigger always logs a batch that names it; a new name that no logged batch came to name is deleted
        again when the query stops (:meth:`stop`), so a query stopped first leaves nothing behind."""
        if self._initial is not None:
            # Spark asks again for batch 0's start when it runs that batch (after latestOffset chose its end):
            # the start chosen, not a later 'latest', which would skip what was written in between
            return dict(self._initial)
        snaps = self._refresh()
        # a start in a ledger already gone (startingOffsets naming a ledger retention trimmed) is a loss, told
        # here: the subscription made at it next would vouch for it at the first batch, as if it had held it
        self._initial = positions_json(
            {
                name: self.drv.check_start(
                    self._parts[name],
                    snap,
                    self.drv.position(self._parts[name], snap, self.opts.starting, "startingOffsets"),
                    None,
                )
                for name, snap in snaps.items()
            }
        )
        # kept by every batch's end: a restart filters as the query began (0, none: kept too, so that an end
        # without the key is known for one logged before the key was, which filters by the option as it did)
        self._initial = {**self._initial, STARTING_TIME_KEY: _not_before(self.opts)}
        self._use_subscription(None, new_query=True)
        if self.opts.subscription_explicit:  # (the query's own position: refused here if not the query's)
            self._prior = {name: self._committed_mark(name) for name in snaps}
        self._move_subscription(self._initial, strict=True)
        return dict(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_entries_per_trigger is not None:
            return ReadMaxRows(self.opts.max_entries_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # before the checkpoint's offset is known: a topic deleted since the query read it is for latestOffset to
        # tell (it has no target: nothing of it is read), a topic that never existed for initialOffset
        self._target = {name: snap.latest() for name, snap in self._refresh(skip_missing=True).items()}

    def _committed_mark(self, name: str) -> Pos | None:
        if name not in self._committed:
            self._committed[name] = self.drv.committed(self._parts[name])
        return self._committed[name]

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # ``start`` is the end of the last completed micro-batch (or the initial offset): Spark calls
        # ``commit`` for a batch only when it plans the next one with data, so the subscription moves here too
        # and stands on what Spark has processed even after AvailableNow's last batch. It comes after the
        # data-loss check, which takes the subscription's stored position: a ledger trimmed while the
        # subscription was gone (deleted, or never there) is a loss, and a failed check leaves it gone.
        # A new query's subscription was made at its initial offset (initialOffset): nothing to move yet.
        new_query = self._initial is not None and start == self._initial
        sub = self._use_subscription(start, new_query=new_query)
        begin = positions_from_json(start or {})
        snaps = self._refresh(begin)
        stored = {name: self._committed_mark(name) for name in snaps}
        starts: dict[str, Pos] = {}
        caps: dict[str, Pos] = {}
        for name, snap in snaps.items():
            if self._target is not None and name not in self._target:
                continue  # appeared after AvailableNow's target was taken: the next run reads it
            s = begin.get(name, EARLIEST)
            starts[name] = self.drv.check_start(self._parts[name], snap, s, stored[name], stream=True)
            cap = snap.latest()
            if self._target is not None:
                cap = min(cap, self._target[name])
            caps[name] = cap
        if not new_query:
            self.commit(start or {})
        max_entries: float | None = None
        max_bytes: float | None = None
        if isinstance(limit, ReadMaxRows):
            max_entries = limit.max_rows
            max_bytes = self.opts.max_bytes_per_trigger
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = limit.max_bytes
            max_entries = self.opts.max_entries_per_trigger
        budget: dict[str, float] = {n: float(count_between(snaps[n], starts[n], caps[n])) for n in starts}
        if max_entries is not None:
            budget = allot(budget, float(max_entries))
        if max_bytes is not None:
            byte_share = allot(
                {n: bytes_between(snaps[n], starts[n], caps[n]) for n in starts}, float(max_bytes)
            )
            for n in starts:
                fit = (
                    entries_within_bytes(snaps[n], starts[n], caps[n], byte_share[n])
                    if byte_share[n] > 0
                    else 0
                )
                budget[n] = min(budget[n], float(fit))
            if sum(budget.values()) == 0:  # always make progress: at least one entry
                for n in sorted(starts):
                    if count_between(snaps[n], starts[n], caps[n]) > 0:
                        budget[n] = 1.0
                        break
        end = dict(begin)
        for n in starts:
            moved = advance(snaps[n], starts[n], int(budget[n]), caps[n])
            if moved != starts[n] or n not in begin:
                end[n] = moved
        out: dict[str, Any] = {**positions_json(end), SUBSCRIPTION_KEY: sub}
        if isinstance((start or {}).get(STARTING_TIME_KEY), int):  # the query's, not the option's now
            out[STARTING_TIME_KEY] = start[STARTING_TIME_KEY]
        self._logged(out)
        if new_query:
            self._first_ends.append(end)
        return out

    def _logged(self, end: dict[str, Any]) -> None:
        """``end`` is a batch's end that Spark logs in the checkpoint: a new name it holds stays with the query.
        Called where latestOffset answers it, not only where Spark plans or commits that batch: Spark logs
        every end latestOffset gives for batch 0 (it always differs from the initial offset, which names no
        subscription) before it plans the batch, and a query stopped between the two restarts with that name.
        A logged end naming another name is the checkpoint's (a restart re-running a batch 0 logged by an
        earlier run, for which Spark asks for an initial offset again): the new name made then is not the
        query's, and is deleted now rather than holding retention at that start until the query stops."""
        name = end.get(SUBSCRIPTION_KEY)
        if self._fresh is None or not isinstance(name, str):
            return
        if name == self._fresh:
            self._fresh_logged = True
        elif not self._fresh_logged:
            self._forget_unlogged()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[TopicRange]:
        self._logged(end)
        rerun = self._rerun(start, end)
        self._use_subscription(end)
        begin = positions_from_json(start or {})
        stop = positions_from_json(end)
        if not self._parts or any(n not in self._parts for n in stop):
            self._refresh(stop)
        # the startingTime the query began with (its checkpoint's); an end logged before it was kept (08e79b5)
        # filters by the option, as every batch did then
        not_before = end.get(STARTING_TIME_KEY)
        not_before = not_before if isinstance(not_before, int) else _not_before(self.opts)
        out: list[TopicRange] = []
        for name, e in sorted(stop.items()):
            s = begin.get(name, EARLIEST)
            if rerun and name in self._parts:
                s = self._made_at(name, s, e)
            if s == e or name not in self._parts:
                continue
            part = self._parts[name]
            snap = self._snaps.get(name)
            if snap is None or not snap.covers(e):  # e.g. a batch planned by an earlier run of the query
                snap = self.drv.snapshot(part)
            s = self.drv.check_start(part, snap, s, self._committed_mark(name), stream=True)
            for lid, first, last in entry_ranges(snap, s, e, self.opts.entries_per_partition):
                out.append(
                    TopicRange(name, part.index, lid, first, last, _prev_ledger(snap, lid), not_before)
                )
        return out

    def _rerun(self, start: dict[str, Any], end: dict[str, Any]) -> bool:
        """Is this batch 0 of a checkpoint that a restart runs again? Its start is this run's initial offset (as
        Spark asks anew: a newer 'latest' than the earlier run's), and its end the earlier run's: with a default
        name, it names the earlier run's new subscription, not this run's; with ``subscriptionName``, it is none
        of the ends this run's latestOffset gave from the initial offset."""
        if self._initial is None or start != self._initial or not isinstance(end.get(SUBSCRIPTION_KEY), str):
            return False
        if self.opts.subscription_explicit:
            return positions_from_json(end) not in self._first_ends
        return self._fresh is not None and end[SUBSCRIPTION_KEY] != self._fresh

    def _made_at(self, name: str, start: Pos, end: Pos) -> Pos:
        """Where the checkpoint's subscription was made on partition ``name`` (its mark-delete + 1): the start
        of a logged batch 0 its earlier run chose, that run's initial offset, which no commit has moved since
        (Spark commits batch 0 before any later batch). A default name's is the logged subscription's position
        now; a named one's, the position it had before this run's initial offset moved it (:attr:`_prior`).
        ``start`` when the subscription lacks the partition, another moved it, or it stands past ``end``."""
        mark = self._prior.get(name) if self.opts.subscription_explicit else self._committed_mark(name)
        if mark is None:
            return start
        made = (mark[0], mark[1] + 1)
        return made if made <= end else start

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, TopicRange):
            return iter(())
        return read_range(self.opts, partition, self.schema)

    def commit(self, end: dict[str, Any]) -> None:
        self._logged(end)
        self._use_subscription(end)
        self._move_subscription(end, strict=False)

    def _move_subscription(self, end: dict[str, Any], *, strict: bool) -> None:
        """The subscription to the position before ``end`` on each partition; a failure raises when
        ``strict``, else is logged (the next commit retries; retention waits meanwhile)."""
        for name, (lid, eid) in positions_from_json(end).items():
            part = self._parts.get(name)
            if part is None:
                continue
            # a partition with no entry yet (EARLIEST): (-1, -1), before every ledger it will ever have, so
            # retention keeps all of them until the query has read them
            mark = (lid, eid - 1) if lid >= 0 else (EARLIEST[0], EARLIEST[1] - 1)
            if self._committed.get(name) == mark:
                continue
            try:
                if not self.drv.commit(part, mark):
                    continue  # the topic is gone: the next planning tells
                log.debug("%s: subscription %s at %s", name, self.drv.subscription, mark)
            except Exception as e:
                if strict:
                    raise
                log.warning("%s: cannot move subscription %s to %s: %s", name, self.drv.subscription, mark, e)
                continue
            self._committed[name] = mark
            if self.drv.subscription == self._fresh:
                self._fresh_made[name] = part.ml_name

    def stop(self) -> None:
        if self._drv is not None:
            try:
                self._forget_unlogged()
            finally:
                self._drv.close()
                self._drv = None

    def _forget_unlogged(self) -> None:
        """A new name made at the initial offset that no logged batch named: the query restarted from its
        checkpoint would take another, so this one is deleted rather than left holding retention."""
        if self._fresh is None or self._fresh_logged or not self._fresh_made:
            return
        from zk import layout

        for name, ml in sorted(self._fresh_made.items()):
            try:
                self.drv.store.delete(layout.ml_cursor_path(ml, self._fresh), missing_ok=True)
            except Exception as e:  # noqa: BLE001 - stopping goes on; the subscription is then left behind
                log.warning(
                    "%s: cannot delete subscription %s of a query stopped before its first batch: %s",
                    name,
                    self._fresh,
                    e,
                )
        self._fresh_made.clear()


# --- the source -----------------------------------------------------------------------------------------------------


class TopicDataSource(DataSource):  # type: ignore[misc]
    """``spark.read.format("topic")`` and ``spark.readStream.format("topic")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "topic"

    def schema(self) -> StructType:
        parse_source_options(self.options, streaming=False)  # bad options fail when the DataFrame is defined
        return TOPIC_SCHEMA

    def reader(self, schema: StructType) -> TopicReader:
        opts = parse_source_options(self.options, streaming=False)
        _check_schema(schema)
        return TopicReader(opts, schema)

    def streamReader(self, schema: StructType) -> TopicStreamReader:
        try:
            opts = parse_source_options(self.options, streaming=True)
            _check_schema(schema)
        except TopicOptionError as e:
            # PySpark's streaming runner stops the reader in a ``finally`` even when making it failed, and its
            # UnboundLocalError ('reader') then takes the place of this error: fail at the query's first call
            return _RefusedStreamReader(e)
        return TopicStreamReader(opts, schema)


class _RefusedStreamReader(TopicStreamReader):
    """A stream whose options were refused: every call the query makes raises that error (naming the option)."""

    def __init__(self, error: TopicOptionError) -> None:  # no super().__init__: there are no options to use
        self.error = error

    def __getstate__(self) -> dict[str, Any]:
        return {"error": self.error}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.error = state["error"]

    def _refuse(self) -> TopicOptionError:
        return TopicOptionError(self.error.option, str(self.error).split(": ", 1)[1])

    def initialOffset(self) -> dict[str, Any]:
        raise self._refuse()

    def getDefaultReadLimit(self) -> ReadLimit:
        raise self._refuse()

    def prepareForTriggerAvailableNow(self) -> None:
        raise self._refuse()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        raise self._refuse()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[TopicRange]:
        raise self._refuse()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        raise self._refuse()

    def commit(self, end: dict[str, Any]) -> None:
        raise self._refuse()

    def stop(self) -> None:
        pass
