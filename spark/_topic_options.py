"""The ``topic`` source's options: parsed and checked on the driver before any task runs (pure, no I/O).

Names follow pulsar-spark where it has them. Option names are case-insensitive; every mistake raises
:class:`TopicOptionError`, whose message names the option. See :mod:`spark.topic_source` for what they do.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spark.options import (
    CREDENTIAL_OPTIONS,
    DEFAULT_MAX_RECORDS_PER_BATCH,
    DEFAULT_READ_TIMEOUT_MS,
    LedgerOptionError,
    _bool,
    _int,
    unknown_option,
)
from spark.options import parse_ledger_options as _parse_common

__all__ = [
    "CRYPTO_FAILURE_ACTIONS",
    "DEFAULT_ENTRIES_PER_PARTITION",
    "PULSAR_SPARK_OPTIONS",
    "OffsetSpec",
    "TopicOptionError",
    "TopicOptions",
    "parse_topic_options",
]

DEFAULT_ENTRIES_PER_PARTITION = 50_000
SUBSCRIPTION_PREFIX = "spark-topic-"

KNOWN_OPTIONS = (
    "zk",
    "zkRoot",
    "password",
    "topic",
    "topics",
    "topicsPattern",
    "startingOffsets",
    "endingOffsets",
    "startingTime",
    "endingTime",
    "failOnDataLoss",
    "maxBytesPerTrigger",
    "maxEntriesPerTrigger",
    "subscriptionName",
    "entriesPerPartition",
    "maxRecordsPerBatch",
    "readTimeoutMs",
    "cryptoFailureAction",
    *CREDENTIAL_OPTIONS,
)
#: pulsar-spark's option names the source takes too (:mod:`spark._pulsar_options` maps, checks or accepts them;
#: ``pulsar.client.*`` and the like are prefixes): an unknown option's message lists them beside
#: :data:`KNOWN_OPTIONS`, so that a job coming from pulsar-spark sees the names it can keep
PULSAR_SPARK_OPTIONS = (
    "service.url",
    "admin.url",
    "predefinedSubscription",
    "pollTimeoutMs",
    "allowDifferentTopicSchemas",
    "pulsar.client.authPluginClassName",
    "pulsar.client.authParams",
    "pulsar.admin.authPluginClassName",
    "pulsar.admin.authParams",
    "pulsar.client.*",
    "pulsar.reader.*",
    "pulsar.admin.*",
    "pulsar.producer.*",
)
#: What a reader does with an end-to-end encrypted message (it holds no keys), named as Pulsar's
#: ``ConsumerCryptoFailureAction``: fail the query, skip the message, or give its payload as stored.
CRYPTO_FAILURE_ACTIONS = ("FAIL", "DISCARD", "CONSUME")
#: The options the ``ledger`` source's parser checks for this one (lower-cased, as Spark passes them).
_COMMON_OPTIONS = frozenset(name.lower() for name in ("zk", "zkRoot", "password", *CREDENTIAL_OPTIONS))


class TopicOptionError(ValueError):
    """A ``topic`` source option is missing, unknown or malformed; ``option`` names it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"topic source option '{option}': {message}")
        self.option = option


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """``earliest`` | ``latest`` | per-partition positions (partitions not named take ``default``) | a publish
    time in ms (the first entry published at or after it)."""

    kind: str  # "earliest" | "latest" | "positions" | "time"
    positions: tuple[tuple[str, int, int], ...] = ()
    time_ms: int = 0
    default: str = "earliest"

    def to_json(self) -> str:
        return json.dumps(
            [self.kind, [list(p) for p in self.positions], self.time_ms, self.default], sort_keys=True
        )


@dataclass(frozen=True, slots=True)
class TopicOptions:
    zk: str
    zk_root: str
    password: bytes
    topics: tuple[str, ...]  # full names (topic / topics); empty with a pattern
    pattern: str | None  # topicsPattern (a regex over full topic names)
    pattern_namespace: str  # tenant/ns the pattern lists topics of
    starting: OffsetSpec
    ending: OffsetSpec
    fail_on_data_loss: bool
    max_bytes_per_trigger: int | None
    max_entries_per_trigger: int | None
    subscription: str
    subscription_explicit: bool
    entries_per_partition: int
    max_records_per_batch: int
    read_timeout_ms: int
    #: ``cryptoFailureAction``: one of :data:`CRYPTO_FAILURE_ACTIONS`
    crypto_failure_action: str = "FAIL"
    #: the bookies' token (``authTokenFile``), ZooKeeper's ``ZkAuth`` (``zkAuthFile``); None: the environment
    auth_token: str | None = field(default=None, repr=False)
    zk_auth: Any = field(default=None, repr=False)


def _topic_names(raw: str, option: str) -> tuple[str, ...]:
    from topic_broker.names import InvalidTopicName, TopicName

    names = [s.strip() for s in raw.split(",")] if option == "topics" else [raw.strip()]
    if not names or any(not n for n in names):
        raise TopicOptionError(option, f"empty topic name in {raw!r}")
    out: list[str] = []
    for n in names:
        try:
            out.append(str(TopicName.parse(n)))
        except InvalidTopicName as e:
            raise TopicOptionError(option, str(e)) from None
    return tuple(dict.fromkeys(out))


def _pattern_namespace(pattern: str) -> tuple[str, str, str]:
    """(the regex over full names, tenant/ns to list, the regex over topic names in it as given):
    ``persistent://t/ns/<regex>``, ``t/ns/<regex>`` or a bare ``<regex>`` over ``public/default``."""
    m = re.fullmatch(r"persistent://([-=:.\w]+)/([-=:.\w]+)/(.+)", pattern)
    if m:
        return pattern, f"{m.group(1)}/{m.group(2)}", m.group(3)
    if "://" in pattern:
        raise TopicOptionError("topicsPattern", f"only persistent:// topics are supported, got {pattern!r}")
    m = re.fullmatch(r"([-=:.\w]+)/([-=:.\w]+)/(.+)", pattern)
    if m:
        return (
            f"persistent://{m.group(1)}/{m.group(2)}/{m.group(3)}",
            f"{m.group(1)}/{m.group(2)}",
            m.group(3),
        )
    return f"persistent://public/default/{pattern}", "public/default", pattern


def _offsets(raw: str | None, option: str, default: str) -> OffsetSpec:
    from topic_broker.names import InvalidTopicName, TopicName

    if raw is None:
        return OffsetSpec(default)
    s = str(raw).strip()
    if s.lower() in ("earliest", "latest"):
        return OffsetSpec(s.lower())
    try:
        d = json.loads(s)
    except ValueError:
        raise TopicOptionError(
            option,
            f"expected 'earliest', 'latest' or JSON like "
            f'{{"persistent://public/default/t-partition-0": [ledgerId, entryId]}}, got {s!r}',
        ) from None
    if not isinstance(d, dict) or not d:
        raise TopicOptionError(
            option, f"the JSON form is a non-empty object of partition -> [ledger, entry]: {s!r}"
        )
    positions: list[tuple[str, int, int]] = []
    for k, v in d.items():
        try:
            name = str(TopicName.parse(k))
        except InvalidTopicName as e:
            raise TopicOptionError(option, f"{e}") from None
        if isinstance(v, str) and v in ("earliest", "latest"):
            positions.append((name, -2 if v == "earliest" else -3, 0))
            continue
        if not (
            isinstance(v, list)
            and len(v) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
        ):
            raise TopicOptionError(
                option,
                f"position of {k!r} must be [ledgerId, entryId] (non-negative) or 'earliest'/'latest', got {v!r}",
            )
        positions.append((name, v[0], v[1]))
    return OffsetSpec("positions", tuple(sorted(positions)), default=default)


#: Epoch times that are seconds from 2001 to 5138 and, read as milliseconds, 1970-01-12 to 1973-03-03: no message
#: was published then, so such a startingTime/endingTime is seconds given for milliseconds (it read everything).
SECONDS_LIKE = (1_000_000_000, 100_000_000_000)


def _time(raw: object, option: str) -> int:
    try:
        v = int(str(raw).strip())
    except ValueError:
        raise TopicOptionError(
            option, f"expected a publish time in ms since the epoch, got {raw!r}"
        ) from None
    if v < 0:
        raise TopicOptionError(option, f"must be >= 0, got {v}")
    if SECONDS_LIKE[0] <= v < SECONDS_LIKE[1]:
        raise TopicOptionError(
            option,
            f"{v} looks like seconds since the epoch (as milliseconds it is in 1970-1973, before any publish "
            f"time): give milliseconds, {v * 1000}",
        )
    return v


def _check_ending_after_starting(starting: OffsetSpec, ending: OffsetSpec) -> None:
    """An end at or before the start reads nothing: a mistake (times swapped, a position copied from the wrong
    row), refused naming the ending option as ``endingOffsets``' ``earliest`` is, not an empty DataFrame."""
    if starting.kind == "time" and ending.kind == "time" and ending.time_ms <= starting.time_ms:
        raise TopicOptionError(
            "endingTime",
            f"{ending.time_ms} is not after startingTime {starting.time_ms}: the query would read nothing "
            "(the start is inclusive, the end exclusive)",
        )
    starts = {name: (lid, eid) for name, lid, eid in starting.positions if lid >= 0}
    for name, lid, eid in ending.positions:
        if lid >= 0 and name in starts and (lid, eid) <= starts[name]:
            raise TopicOptionError(
                "endingOffsets",
                f"[{lid}, {eid}] of {name} is not after its startingOffsets position "
                f"{list(starts[name])}: the query would read nothing from it (the end is exclusive)",
            )


def parse_topic_options(options: Mapping[str, str], *, streaming: bool) -> TopicOptions:
    """Check every option; raise :class:`TopicOptionError` naming the first bad one."""
    opts = {str(k).lower(): v for k, v in options.items()}
    known = {k.lower(): k for k in KNOWN_OPTIONS}
    unknown = sorted(k for k in opts if k not in known)
    if unknown:
        raise TopicOptionError(
            unknown[0], unknown_option(unknown[0], KNOWN_OPTIONS, pulsar_spark=PULSAR_SPARK_OPTIONS)
        )
    try:
        common = _parse_common({k: v for k, v in options.items() if str(k).lower() in _COMMON_OPTIONS})
        fail = _bool(opts, "failOnDataLoss", True)
        per_part = _int(opts, "entriesPerPartition", DEFAULT_ENTRIES_PER_PARTITION, 1, 1 << 40)
        per_batch = _int(opts, "maxRecordsPerBatch", DEFAULT_MAX_RECORDS_PER_BATCH, 1, 1 << 24)
        timeout = _int(opts, "readTimeoutMs", DEFAULT_READ_TIMEOUT_MS, 1, 3_600_000)
        max_bytes = _int(opts, "maxBytesPerTrigger", 0, 1, 1 << 50) if "maxbytespertrigger" in opts else None
        max_entries = (
            _int(opts, "maxEntriesPerTrigger", 0, 1, 1 << 40) if "maxentriespertrigger" in opts else None
        )
    except LedgerOptionError as e:
        raise TopicOptionError(e.option, str(e).split(": ", 1)[1]) from None
    crypto = str(opts.get("cryptofailureaction", "FAIL")).strip().upper()
    if crypto not in CRYPTO_FAILURE_ACTIONS:
        raise TopicOptionError(
            "cryptoFailureAction",
            f"expected one of {', '.join(CRYPTO_FAILURE_ACTIONS)}, got {opts['cryptofailureaction']!r}",
        )

    chosen = [k for k in ("topic", "topics", "topicspattern") if k in opts]
    if len(chosen) != 1:
        raise TopicOptionError(
            "topic" if not chosen else known[chosen[1]],
            "give exactly one of 'topic', 'topics' (comma list) or 'topicsPattern' (regex over full names)",
        )
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    namespace = ""
    if chosen[0] == "topicspattern":
        raw = str(opts["topicspattern"]).strip()
        if not raw:
            raise TopicOptionError("topicsPattern", "is empty")
        pattern, namespace, local = _pattern_namespace(raw)
        try:
            # the topic part alone, as given: a position in the error is one in it, and a glob's leading '*'
            # ('*-orders') is refused rather than read as repeating the namespace's '/' (matching nothing)
            re.compile(local)
            re.compile(pattern)
        except re.error as e:
            raise TopicOptionError(
                "topicsPattern", f"not a valid regular expression: {e} (in {local!r})"
            ) from None
    else:
        topics = _topic_names(str(opts[chosen[0]]), known[chosen[0]])

    if "startingoffsets" in opts and "startingtime" in opts:
        raise TopicOptionError("startingTime", "give either startingOffsets or startingTime, not both")
    if "endingoffsets" in opts and "endingtime" in opts:
        raise TopicOptionError("endingTime", "give either endingOffsets or endingTime, not both")
    if streaming and ("endingoffsets" in opts or "endingtime" in opts):
        raise TopicOptionError(
            "endingOffsets" if "endingoffsets" in opts else "endingTime", "is for batch queries only"
        )
    if "startingtime" in opts:
        starting = OffsetSpec("time", time_ms=_time(opts["startingtime"], "startingTime"))
    else:
        starting = _offsets(
            opts.get("startingoffsets"), "startingOffsets", "latest" if streaming else "earliest"
        )
    if "endingtime" in opts:
        ending = OffsetSpec("time", time_ms=_time(opts["endingtime"], "endingTime"))
    else:
        ending = _offsets(opts.get("endingoffsets"), "endingOffsets", "latest")
        if ending.kind == "earliest":
            raise TopicOptionError("endingOffsets", "'earliest' would read nothing; use 'latest' or JSON")
        if any(p[1] == -2 for p in ending.positions):
            raise TopicOptionError("endingOffsets", "'earliest' for a partition would read nothing from it")
    if not streaming:
        # a batch reads to the latest entry at most: a start at 'latest' reads nothing (Kafka's and pulsar-spark's
        # sources refuse it too), a mistake like an end at or before the start
        if starting.kind == "latest":
            raise TopicOptionError(
                "startingOffsets",
                "'latest' would read nothing in a batch query (it reads up to the latest entry); use 'earliest', "
                "JSON positions or startingTime",
            )
        for name, lid, _ in starting.positions:
            if lid == -3:
                raise TopicOptionError(
                    "startingOffsets",
                    f"'latest' for {name} would read nothing from it in a batch query; to leave a partition out, "
                    "name the partitions to read in option 'topics' ('t-partition-0,t-partition-2')",
                )
    _check_ending_after_starting(starting, ending)

    sub_raw = opts.get("subscriptionname")
    if sub_raw is not None:
        subscription = str(sub_raw).strip()
        if not subscription or any(ord(c) < 0x20 for c in subscription):
            raise TopicOptionError("subscriptionName", f"invalid subscription name {sub_raw!r}")
    else:
        # The name of a stream whose checkpoint's offsets hold none (written before they kept it): one per query
        # definition. A new stream takes a name of its own, kept in its offsets (TopicStreamReader).
        ident = json.dumps(
            [common.zk_root, list(topics), pattern, starting.to_json()], sort_keys=True
        ).encode()
        subscription = SUBSCRIPTION_PREFIX + hashlib.sha256(ident).hexdigest()[:16]
    return TopicOptions(
        zk=common.zk,
        zk_root=common.zk_root,
        password=common.password,
        topics=topics,
        pattern=pattern,
        pattern_namespace=namespace,
        starting=starting,
        ending=ending,
        fail_on_data_loss=fail,
        max_bytes_per_trigger=max_bytes,
        max_entries_per_trigger=max_entries,
        subscription=subscription,
        subscription_explicit=sub_raw is not None,
        entries_per_partition=per_part,
        max_records_per_batch=per_batch,
        read_timeout_ms=timeout,
        crypto_failure_action=crypto,
        auth_token=common.auth_token,
        zk_auth=common.zk_auth,
    )
