"""``ledgerstore topic …``, ``tenant …`` and ``namespace …``: pulsar-admin's everyday verbs against a broker.

A topic's tenant and namespace must exist before the topic, as in Pulsar (``public/default`` always does):
``ledgerstore tenant create acme``, then ``ledgerstore namespace create acme/orders``.

Admin verbs (create, list, delete, stats, internal-stats, compact, compaction-status, and the automatic
compaction threshold and the message TTL of a namespace or a topic: set-|get-|remove-compaction-threshold,
set-|get-|remove-message-ttl) call the broker's REST
(``--url``, default ``$LEDGERSTORE_BROKER_HTTP`` or ``http://127.0.0.1:8080``) and follow its redirects to a
topic's owner; produce and consume use the official ``pulsar-client`` on ``--service-url``
(``$LEDGERSTORE_BROKER_URL`` or ``pulsar://127.0.0.1:6650``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import quote, urljoin, urlsplit

from ledgerstore.cli import (
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
    counted,
    emit,
    exit_status_for_http,
)

DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"
DEFAULT_SERVICE_URL = "pulsar://127.0.0.1:6650"
SUBSCRIPTION_TYPES = ("exclusive", "shared", "failover", "key_shared")
T = TypeVar("T")


# -- REST -------------------------------------------------------------------------------------------------------


def rest(url: str, method: str, path: str, body: Any = None, timeout_s: float = 60.0) -> Any:
    """One admin call; follows 307/308 to the owner (keeping method and body); raises CommandError with the
    broker's ``reason`` on an error status."""
    text = rest_raw(url, method, path, body, timeout_s)[0].decode()
    return json.loads(text) if text else None


def rest_raw(
    url: str, method: str, path: str, body: Any = None, timeout_s: float = 60.0
) -> tuple[bytes, Mapping[str, str]]:
    """:func:`rest`'s call, answering the body's bytes and the headers (a message peeked)."""
    target = url.rstrip("/") + path
    data = None if body is None else json.dumps(body).encode()
    for _hop in range(5):
        req = urllib.request.Request(target, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with _OPENER.open(req, timeout=timeout_s) as r:
                return r.read(), r.headers
        except urllib.error.HTTPError as e:
            if e.code in (307, 308) and e.headers.get("Location"):
                target = urljoin(target, e.headers["Location"])
                continue
            text = e.read().decode(errors="replace")
            try:
                reason = json.loads(text).get("reason", text)
            except (json.JSONDecodeError, AttributeError):
                reason = text or e.reason
            raise CommandError(
                f"{method} {path}: {e.code} {reason}", exit_status_for_http(e.code), kind=f"HTTP_{e.code}"
            ) from None
        except OSError as e:
            raise CommandError(
                f"broker admin at {url} unreachable ({getattr(e, 'reason', e)}): is the broker running? "
                "(`ledgerstore cluster status`; --url URL or $LEDGERSTORE_BROKER_HTTP)",
                EXIT_UNAVAILABLE,
            ) from None
    raise CommandError(f"{method} {path}: too many redirects")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # handled by rest(), which keeps the method and body


_OPENER = urllib.request.build_opener(_NoRedirect)


def topic_path(name: str) -> tuple[str, str]:
    """(REST path of the topic, its full name)."""
    from topic_broker.names import TopicName

    t = TopicName.parse(name)
    parts = (t.tenant, t.namespace, t.local)
    return "/admin/v2/persistent/" + "/".join(quote(p, safe="") for p in parts), str(t)


def _checked(segments: dict[str, str], what: str = "") -> None:
    """Each of ``segments`` (``{"tenant": …, "namespace": …}``) checked as Pulsar names them; a usage error naming
    the first bad one and ``what`` (the name typed, when more than the segment)."""
    from topic_broker.names import valid_segment

    for kind, value in segments.items():
        if not valid_segment(value):
            why = f"invalid {kind} {value!r}"
            raise CommandError(f"{why} in {what}" if what else why, EXIT_USAGE)


def namespace_path(namespace: str) -> str:
    """The REST path of ``TENANT/NAMESPACE`` (checked as Pulsar names them)."""
    if namespace.count("/") != 1:
        raise CommandError(f"a namespace is TENANT/NAMESPACE, got {namespace!r}", EXIT_USAGE)
    tenant, name = namespace.split("/")
    _checked({"tenant": tenant, "namespace": name}, f"namespace {namespace!r}")
    return f"/admin/v2/namespaces/{quote(tenant, safe='')}/{quote(name, safe='')}"


def tenant_path(tenant: str) -> str:
    """The REST path of a tenant (checked as Pulsar names it)."""
    if "/" in tenant:
        raise CommandError(f"a tenant name has no '/', got {tenant!r}", EXIT_USAGE)
    _checked({"tenant": tenant})
    return f"/admin/v2/tenants/{quote(tenant, safe='')}"


# -- verbs ------------------------------------------------------------------------------------------------------


def _create(args: argparse.Namespace) -> int:
    path, full = topic_path(args.name)
    if args.partitions < 0:
        raise CommandError(f"--partitions {args.partitions}: 0 (not partitioned) or more", EXIT_USAGE)
    if args.partitions:
        rest(args.url, "PUT", f"{path}/partitions", args.partitions)
        emit(
            args,
            f"created {full} with {counted(args.partitions, 'partition')}",
            {"topic": full, "partitions": args.partitions},
        )
    else:
        rest(args.url, "PUT", path)
        emit(args, f"created {full}", {"topic": full, "partitions": 0})
    return 0


def _create_or_delete(kind: str, method: str) -> Callable[[argparse.Namespace], int]:
    """The verb that creates (``PUT``) or deletes (``DELETE``) a ``tenant`` or a ``namespace``."""

    def run(args: argparse.Namespace) -> int:
        name = getattr(args, kind)
        path = tenant_path(name) if kind == "tenant" else namespace_path(name)
        tenant_body = {"adminRoles": [], "allowedClusters": ["ledgerstore"]}
        rest(args.url, method, path, tenant_body if (kind, method) == ("tenant", "PUT") else None)
        done = "created" if method == "PUT" else "deleted"
        emit(args, f"{done} {kind} {name}", {kind: name, done: True})
        return 0

    return run


def _tenant_list(args: argparse.Namespace) -> int:
    tenants: list[str] = rest(args.url, "GET", "/admin/v2/tenants")
    emit(args, lambda: "\n".join(tenants) or "no tenants", {"tenants": tenants})
    return 0


def _namespace_list(args: argparse.Namespace) -> int:
    namespaces: list[str] = rest(args.url, "GET", f"/admin/v2/namespaces/{quote(args.tenant, safe='')}")
    emit(
        args,
        lambda: "\n".join(namespaces) or f"no namespaces in {args.tenant}",
        {"tenant": args.tenant, "namespaces": namespaces},
    )
    return 0


def _list(args: argparse.Namespace) -> int:
    ns = args.namespace
    base = "/admin/v2/persistent/" + namespace_path(ns).removeprefix("/admin/v2/namespaces/")
    topics: list[str] = rest(args.url, "GET", base)
    partitioned: list[str] = rest(args.url, "GET", f"{base}/partitioned")
    emit(
        args,
        lambda: "\n".join([*(f"{t} (partitioned)" for t in partitioned), *topics]) or f"no topics in {ns}",
        {"topics": topics, "partitioned": partitioned},
    )
    return 0


def _partitions(args: argparse.Namespace, path: str) -> int:
    got = rest(args.url, "GET", f"{path}/partitions")
    return int(got.get("partitions", 0)) if isinstance(got, dict) else 0


def _delete(args: argparse.Namespace) -> int:
    path, full = topic_path(args.name)
    force = "?force=true" if args.force else ""
    n = _partitions(args, path)
    rest(args.url, "DELETE", f"{path}/partitions{force}" if n else f"{path}{force}")
    emit(
        args,
        f"deleted {full}" + (f" ({counted(n, 'partition')})" if n else ""),
        {"topic": full, "deleted": True},
    )
    return 0


def _stats(args: argparse.Namespace) -> int:
    path, full = topic_path(args.name)
    n = _partitions(args, path)
    st = rest(args.url, "GET", f"{path}/partitioned-stats" if n else f"{path}/stats")

    def human() -> str:
        lines = [
            f"{full}" + (f" ({counted(n, 'partition')})" if n else ""),
            f"  in   {st.get('msgInCounter', 0):>12,} messages {st.get('bytesInCounter', 0):>14,} bytes"
            f"   {st.get('msgRateIn', 0.0):,.1f} msg/s",
            f"  out  {st.get('msgOutCounter', 0):>12,} messages {st.get('bytesOutCounter', 0):>14,} bytes"
            f"   {st.get('msgRateOut', 0.0):,.1f} msg/s",
            f"  storage {st.get('storageSize', 0):,} bytes; publishers {len(st.get('publishers', []))}",
        ]
        for sub, s in sorted(st.get("subscriptions", {}).items()):
            lines.append(
                f"  subscription {sub}: {s.get('type')} backlog {s.get('msgBacklog', 0):,}, "
                f"consumers {len(s.get('consumers', []))}, delivered {s.get('msgOutCounter', 0):,}"
            )
        return "\n".join(lines)

    emit(args, human, st)
    return 0


def _internal_stats(args: argparse.Namespace) -> int:
    path, full = topic_path(args.name)
    n = _partitions(args, path)
    names = [f"{args.name}-partition-{i}" for i in range(n)] if n else [args.name]
    all_stats: dict[str, Any] = {}
    for name in names:
        p, f = topic_path(name)
        all_stats[f] = rest(args.url, "GET", f"{p}/internalStats")

    def human() -> str:
        lines: list[str] = []
        for f, st in all_stats.items():
            lines.append(
                f"{f}: {st['numberOfEntries']:,} entries, {st['totalSize']:,} bytes, "
                f"last confirmed {st['lastConfirmedEntry']}, state {st['state']}"
            )
            for li in st["ledgers"]:
                lines.append(
                    f"  ledger {li['ledgerId']:>8}  entries {li['entries']:>9,}  size {li['size']:>12,}"
                )
            for c, cs in sorted(st["cursors"].items()):
                lines.append(
                    f"  cursor {c}: markDelete {cs['markDeletePosition']} read {cs['readPosition']} "
                    f"acked ranges {cs['individuallyDeletedMessages']}"
                )
        return "\n".join(lines)

    emit(args, human, all_stats[full] if not n else all_stats)
    return 0


def _partition_paths(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(REST path, full name) of the topic, or of each of its partitions."""
    path, _full = topic_path(args.name)
    n = _partitions(args, path)
    return [topic_path(f"{args.name}-partition-{i}") for i in range(n)] if n else [topic_path(args.name)]


def _compaction_status(args: argparse.Namespace) -> int:
    """pulsar-admin's ``topics compaction-status [--wait-complete]``: each (partition's) last compaction."""
    targets = _partition_paths(args)
    deadline = time.monotonic() + args.timeout_s
    statuses: dict[str, Any] = {}
    for path, full in targets:
        while True:
            st = rest(args.url, "GET", f"{path}/compaction")
            if not args.wait or st.get("status") != "RUNNING":
                break
            if time.monotonic() > deadline:
                raise CommandError(f"{full}: compaction still running after {args.timeout_s:g} s")
            time.sleep(0.2)
        statuses[full] = st

    def human() -> str:
        return "\n".join(
            f"{f}: {st.get('status')}" + (f" ({st['lastError']})" if st.get("lastError") else "")
            for f, st in statuses.items()
        )

    emit(args, human, statuses)
    return 1 if any(st.get("status") == "ERROR" for st in statuses.values()) else 0


def _compact(args: argparse.Namespace) -> int:
    """pulsar-admin's ``topics compact``: start compacting the topic (each partition); ``--wait`` for the end."""
    targets = _partition_paths(args)
    for path, _full in targets:
        rest(args.url, "PUT", f"{path}/compaction")
    if args.wait:
        return _compaction_status(args)
    emit(args, "\n".join(f"compaction of {f} started" for _, f in targets), {f: True for _, f in targets})
    return 0


def _subscription_path(args: argparse.Namespace) -> tuple[str, str]:
    path, full = topic_path(args.name)
    return f"{path}/subscription/{quote(args.subscription, safe='')}", full


def peeked_messages(body: bytes, headers: Mapping[str, str]) -> list[dict[str, Any]]:
    """The messages of one peeked entry (a batch's frame split, as pulsar-admin does, but for an end-to-end
    encrypted one, whose payload the broker answers as stored): id, publish time, producer, key, properties and
    payload."""
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import wire

    mid = headers.get("X-Pulsar-Message-ID", "")
    common = {
        "publishTime": headers.get("X-Pulsar-publish-time", ""),
        "producerName": headers.get("X-Pulsar-producer-name", ""),
        "sequenceId": int(headers.get("X-Pulsar-sequence-id", "0") or 0),
    }
    prefix = "x-pulsar-property-"
    props = {k[len(prefix) :]: v for k, v in headers.items() if k.lower().startswith(prefix)}
    batch = headers.get("X-Pulsar-num-batch-message")
    if batch is None or headers.get("X-Pulsar-Is-Encrypted") == "true":  # an encrypted batch: one, as stored
        key = headers.get("X-Pulsar-partition-key")
        return [{"messageId": mid, **common, "key": key, "properties": props, "payload": body}]
    md = pb.MessageMetadata(producer_name="", sequence_id=0, publish_time=0, num_messages_in_batch=int(batch))
    out = []
    try:
        for i, (single, payload) in enumerate(wire.iter_batch(md, body)):
            assert single is not None
            out.append(
                {
                    "messageId": f"{mid}:{i}",
                    **common,
                    "key": single.partition_key or None,
                    "properties": {kv.key: kv.value for kv in single.properties},
                    "payload": payload,
                }
            )
    except wire.EntryFormatError as e:
        raise CommandError(f"the batch at {mid} cannot be split: {e}") from None
    return out


def _text(payload: bytes) -> str:
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return "0x" + payload.hex()


def _peek(args: argparse.Namespace) -> int:
    """pulsar-admin's ``topics peek-messages -s SUB -n N``: the next N entries the subscription has not
    acknowledged (a batch's messages each), without moving it."""
    if args.count < 1:
        raise CommandError(f"-n {args.count}: peek 1 or more messages", EXIT_USAGE)
    path, full = _subscription_path(args)
    messages: list[dict[str, Any]] = []
    for n in range(1, args.count + 1):
        try:
            body, headers = rest_raw(args.url, "GET", f"{path}/position/{n}")
        except CommandError as e:
            if e.kind == "HTTP_404" and "Message not found" in str(e):
                break  # the end of the backlog
            raise
        messages += peeked_messages(body, headers)

    def human() -> str:
        if not messages:
            return f"{full}: nothing to peek for {args.subscription}"
        return "\n".join(
            f"{m['messageId']}  {m['publishTime']}"
            + (f"  key={m['key']}" if m["key"] else "")
            + (f"  {m['properties']}" if m["properties"] else "")
            + f"  {_text(m['payload'])}"
            for m in messages
        )

    emit(args, human, [{**m, "payload": _text(m["payload"])} for m in messages])
    return 0


def _terminate(args: argparse.Namespace) -> int:
    """pulsar-admin's ``topics terminate`` (``partitioned-terminate`` for a partitioned topic: each partition):
    no more messages, ever; prints the last message id (each partition's)."""
    path, full = topic_path(args.name)
    if _partitions(args, path):
        lasts = rest(args.url, "POST", f"{path}/terminate/partitions")
        lines = [f"{full} terminated"]
        lines += [
            f"  partition {i}: last message id {m['ledgerId']}:{m['entryId']}" for i, m in lasts.items()
        ]
        emit(args, "\n".join(lines), {"topic": full, "lastMessageIds": lasts})
        return 0
    last = rest(args.url, "POST", f"{path}/terminate")
    mid = f"{last['ledgerId']}:{last['entryId']}"
    emit(args, f"{full} terminated; its last message id is {mid}", {"topic": full, "lastMessageId": last})
    return 0


def _unload(args: argparse.Namespace) -> int:
    """pulsar-admin's ``topics unload``: the topic (each partition) closed on the broker serving it, its
    clients reconnecting (the next lookup may land on another broker); its current ledger is closed."""
    path, full = topic_path(args.name)
    n = _partitions(args, path)
    rest(args.url, "PUT", f"{path}/unload")
    emit(
        args,
        f"unloaded {full}" + (f" ({counted(n, 'partition')})" if n else ""),
        {"topic": full, "unloaded": True, "partitions": n},
    )
    return 0


def _skip(args: argparse.Namespace) -> int:
    """pulsar-admin's ``topics skip -s SUB -n N`` (each partition of a partitioned topic)."""
    if args.count < 1:
        raise CommandError(f"-n {args.count}: skip 1 or more messages", EXIT_USAGE)
    path, full = _subscription_path(args)
    rest(args.url, "POST", f"{path}/skip/{args.count}")
    emit(
        args,
        f"{args.subscription} of {full}: skipped up to {args.count} entries",
        {"topic": full, "subscription": args.subscription, "skipped": args.count},
    )
    return 0


def _expire(args: argparse.Namespace) -> int:
    """pulsar-admin's ``topics expire-messages -s SUB -t SECONDS`` and ``expire-messages-all-subscriptions``."""
    if args.expire_time_s < 1:
        raise CommandError(f"-t {args.expire_time_s}: expire messages 1 or more seconds old", EXIT_USAGE)
    topic, full = topic_path(args.name)
    if args.subscription is None:
        path, who = f"{topic}/all_subscription", "every subscription"
    else:
        path, who = _subscription_path(args)[0], args.subscription
    rest(args.url, "POST", f"{path}/expireMessages/{args.expire_time_s}")
    emit(
        args,
        f"{who} of {full}: messages older than {args.expire_time_s} s acknowledged",
        {"topic": full, "subscription": args.subscription, "expireTimeInSeconds": args.expire_time_s},
    )
    return 0


_SIZE_UNITS = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str) -> int:
    """pulsar-admin's sizes: bytes, or a number with k, m, g or t (powers of 1024): ``10M`` is 10485760."""
    t = text.strip().lower()
    unit = _SIZE_UNITS.get(t[-1:], 1)
    digits = t[:-1] if unit > 1 else t
    try:
        value = int(digits) * unit
    except ValueError:
        raise CommandError(
            f"--threshold {text!r}: expected bytes, or a number with k, m, g or t (10M)", EXIT_USAGE
        ) from None
    if value < 0:
        raise CommandError(f"--threshold {text!r}: must be 0 (off) or more bytes", EXIT_USAGE)
    return value


def _policy_path(args: argparse.Namespace, policy: str) -> tuple[str, str]:
    """(REST path of a policy, what it belongs to) of ``args.namespace`` or ``args.name`` (a topic)."""
    if getattr(args, "namespace", None) is not None:
        return namespace_path(args.namespace) + "/" + policy, f"namespace {args.namespace}"
    path, full = topic_path(args.name)
    return path + "/" + policy, full


def _threshold_path(args: argparse.Namespace) -> tuple[str, str]:
    return _policy_path(args, "compactionThreshold")


def _applied(args: argparse.Namespace) -> str:
    return "?applied=true" if getattr(args, "applied", False) else ""


def _threshold_set(args: argparse.Namespace) -> int:
    path, what = _threshold_path(args)
    threshold = parse_size(args.threshold)
    rest(args.url, "POST", path, threshold)
    emit(args, f"compaction threshold of {what}: {threshold} bytes", {"compactionThreshold": threshold})
    return 0


def _threshold_get(args: argparse.Namespace) -> int:
    path, what = _threshold_path(args)
    got = rest(args.url, "GET", path + _applied(args))
    shown = "not set" if got is None else f"{got} bytes" + (" (off)" if got == 0 else "")
    emit(args, f"compaction threshold of {what}: {shown}", {"compactionThreshold": got})
    return 0


def _threshold_remove(args: argparse.Namespace) -> int:
    path, what = _threshold_path(args)
    rest(args.url, "DELETE", path)
    emit(args, f"compaction threshold of {what} removed", {"compactionThreshold": None})
    return 0


def _ttl_set(args: argparse.Namespace) -> int:
    path, what = _policy_path(args, "messageTTL")
    if args.ttl < 0:
        raise CommandError(f"--ttl {args.ttl}: seconds, 0 (no TTL) or more", EXIT_USAGE)
    if args.namespace is None:
        rest(args.url, "POST", f"{path}?messageTTL={args.ttl}")  # a topic's: a query parameter, as in Pulsar
    else:
        rest(args.url, "POST", path, args.ttl)
    emit(args, f"message TTL of {what}: {args.ttl} s", {"messageTTL": args.ttl})
    return 0


def _ttl_get(args: argparse.Namespace) -> int:
    path, what = _policy_path(args, "messageTTL")
    got = rest(args.url, "GET", path + _applied(args))
    shown = "not set" if got is None else f"{got} s" + (" (none)" if got == 0 else "")
    emit(args, f"message TTL of {what}: {shown}", {"messageTTL": got})
    return 0


def _ttl_remove(args: argparse.Namespace) -> int:
    path, what = _policy_path(args, "messageTTL")
    rest(args.url, "DELETE", path)
    emit(args, f"message TTL of {what} removed", {"messageTTL": None})
    return 0


def _add_ttl_verbs(parent: Any, common: Callable[[argparse.ArgumentParser], None], target: str) -> None:
    """pulsar-admin's ``namespaces|topics set-|get-|remove-message-ttl`` (``target``: "namespace" or "name")."""
    for name, help_text, fn in (
        ("set-message-ttl", "acknowledge every subscription's messages older than --ttl seconds", _ttl_set),
        ("get-message-ttl", "the message TTL set", _ttl_get),
        ("remove-message-ttl", "remove the message TTL set (the one above applies)", _ttl_remove),
    ):
        p = _admin_verb(parent, common, name, help_text, fn)
        _add_policy_target(p, target, fn is _ttl_get)
        if fn is _ttl_set:
            p.add_argument("--ttl", type=int, required=True, help="seconds (0: no TTL)")


def _add_policy_target(p: argparse.ArgumentParser, target: str, get: bool) -> None:
    """The namespace (``target`` "namespace") or topic ("name") argument of a policy verb, and a topic's get's
    ``--applied``."""
    if target == "namespace":
        p.add_argument("namespace", help="TENANT/NAMESPACE")
        return
    p.add_argument("name", help="topic name (a partitioned topic's is every partition's)")
    p.set_defaults(namespace=None)
    if get:
        p.add_argument(
            "--applied",
            action="store_true",
            help="the one that applies (topic, else namespace, else broker)",
        )


def _add_threshold_verbs(
    parent: Any,
    common: Callable[[argparse.ArgumentParser], None],
    verb: Callable[[Any, Callable[[argparse.ArgumentParser], None], str, str, Any], argparse.ArgumentParser],
    target: str,
) -> None:
    """``set-|get-|remove-compaction-threshold`` of a namespace (``target`` "namespace") or a topic ("name")."""
    for name, help_text, fn in (
        (
            "set-compaction-threshold",
            "compact automatically once the backlog exceeds --threshold",
            _threshold_set,
        ),
        ("get-compaction-threshold", "the automatic compaction threshold set", _threshold_get),
        (
            "remove-compaction-threshold",
            "remove the threshold set (the one above applies)",
            _threshold_remove,
        ),
    ):
        p = verb(parent, common, name, help_text, fn)
        _add_policy_target(p, target, fn is _threshold_get)
        if fn is _threshold_set:
            p.add_argument(
                "--threshold",
                "-t",
                required=True,
                help="bytes of backlog (10M, 1G: powers of 1024); 0 turns automatic compaction off",
            )


def _client(args: argparse.Namespace) -> Any:
    try:
        import pulsar
    except ImportError as e:  # pragma: no cover - the bootstrap installs it
        raise CommandError("produce/consume need pulsar-client (pip install 'ledgerstore[pulsar]')") from e
    # The client's own log lines (its retries, its view of a failure) only with -v: the command's one-line error
    # says what failed. (A Python logger here made the process abort at exit now and then.)
    if getattr(args, "verbose", False):
        logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Info)
    else:  # its warnings into a file of its own: a connect given up on says what the broker last answered
        log_file = tempfile.NamedTemporaryFile(prefix="ledgerstore-pulsar-", suffix=".log")  # noqa: SIM115
        args.pulsar_log = log_file  # deleted with the process
        logger = pulsar.FileLogger(pulsar.LoggerLevel.Warn, log_file.name)
    _check_listening(args.service_url)
    return pulsar.Client(args.service_url, operation_timeout_seconds=30, logger=logger)


def _check_listening(service_url: str) -> None:
    """A service URL of one host where nothing listens is said at once: pulsar-client retries the refused
    connection until its operation timeout and then says only that no answer came."""
    parts = urlsplit(service_url)
    if "," in parts.netloc or not parts.hostname:
        return  # several hosts: the client tries them all
    try:
        port = parts.port or {"pulsar": 6650, "pulsar+ssl": 6651, "http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return
    if port is None:
        return
    try:
        with socket.create_connection((parts.hostname, port), timeout=5):
            pass
    except ConnectionRefusedError:
        raise CommandError(
            f"no broker at {service_url} (connection refused): is it running? (`ledgerstore cluster status`; "
            "--service-url URL or $LEDGERSTORE_BROKER_URL)",
            EXIT_UNAVAILABLE,
        ) from None
    except OSError:
        return  # (a timeout, an unknown host: the client's own error says it)


def _broker_said(args: argparse.Namespace) -> str:
    """The last error the broker answered (from the client's log file), as ``; the broker answered: ...``."""
    log_file = getattr(args, "pulsar_log", None)
    if log_file is None:
        return ""
    try:
        with open(log_file.name, "rb") as f:
            f.seek(max(0, os.path.getsize(log_file.name) - 65536))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        head, sep, said = line.partition("Received error response from server: ")
        if sep:
            return "; the broker answered: " + said.split(" -- req_id:")[0].strip()
    return ""


def _exit_now(status: int, log_file: Any) -> None:
    """End the process with ``status`` before the interpreter and pulsar-client's C++ objects are torn down: a
    client thread still inside a call it was not let go of would abort the process ('terminate called without
    an active exception', status 134)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if log_file is not None:
        with contextlib.suppress(OSError):
            os.unlink(log_file.name)
    os._exit(status)


#: The longest a command waits at once on pulsar-client's calls, so that Ctrl-C is seen at once (_within).
JOIN_SLICE_S = 0.1
#: How long a command given up (Ctrl-C, --timeout-s) waits for pulsar-client's close before it ends anyway.
LET_GO_CLOSE_WAIT_S = 2.0
#: The clients :func:`_let_go` closes in a thread of their own: :func:`_close` leaves them to it.
_let_go_clients: set[int] = set()


def _close_client(client: Any) -> None:
    with contextlib.suppress(Exception):  # AlreadyClosed when _within closed it
        client.close()


def _close(client: Any) -> None:
    if id(client) not in _let_go_clients:
        _close_client(client)


@contextlib.contextmanager
def _ctrl_c_between_calls() -> Iterator[Callable[[], None]]:
    """Ctrl-C that came while pulsar-client's C++ code was inside a call (send_async waiting for room in its
    queue) crashed the process now and then (SIGSEGV in that call). Meanwhile Ctrl-C only takes note; the function
    this yields raises KeyboardInterrupt between two calls if it came."""
    came: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # (signals reach the main thread only)
        yield lambda: None
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))

    def interrupted() -> None:
        if came:
            raise KeyboardInterrupt

    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def _let_go(args: argparse.Namespace, client: Any, status: int) -> None:
    """Give up a call of ``client`` still under way (or Ctrl-C): close the client, and end the process with
    ``status`` as soon as the command has returned and printed its line (atexit), before the interpreter's
    teardown, which aborts (or crashes, with send_async callbacks pending) after a client closed in the middle of
    its work. (Closing does not always end the call: waiting for it made --timeout-s 3 take 10 s.)"""
    # Closing can itself wait on the call it interrupts (a subscribe the broker keeps answering "retry"): it runs
    # in a thread of its own, waited for a moment only, so that the command ends all the same; the paths the
    # interrupt goes on through (a second _let_go, a `finally: _close`) leave the client to that thread.
    if id(client) in _let_go_clients:
        return
    _let_go_clients.add(id(client))
    closing = threading.Thread(target=_close_client, args=(client,), name="close", daemon=True)
    closing.start()
    closing.join(LET_GO_CLOSE_WAIT_S)
    atexit.register(_exit_now, status, getattr(args, "pulsar_log", None))


def _within(args: argparse.Namespace, client: Any, what: str, call: Callable[[], T]) -> T:
    """``call()`` (pulsar-client's create_producer or subscribe), given up after ``--timeout-s``: while a broker cannot
    answer a lookup (its ZooKeeper down) it drops the connection and the client retries for ever, past its
    operation timeout. Closing the client ends the call."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except Exception as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name=what, daemon=True)
    t.start()
    deadline = time.monotonic() + args.timeout_s
    try:
        # In short waits: the kernel may hand Ctrl-C to one of pulsar-client's threads, and Python runs its
        # handler (KeyboardInterrupt) only once this thread comes back from a wait; one long join held it for
        # all of --timeout-s.
        while t.is_alive() and (left := deadline - time.monotonic()) > 0:
            t.join(min(left, JOIN_SLICE_S))
    except KeyboardInterrupt:  # Ctrl-C before the answer
        _let_go(args, client, EXIT_INTERRUPTED)
        raise
    if t.is_alive():
        said = _broker_said(args)
        _let_go(args, client, EXIT_UNAVAILABLE)
        raise CommandError(
            f"{what}: no answer within {args.timeout_s:g}s"
            + (said or f" (are the broker at {args.service_url} and its ZooKeeper up?)"),
            EXIT_UNAVAILABLE,
        )
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _namespace_missing(service_url: str, path: str) -> bool:
    """Through an http:// service URL pulsar-client reports every error status of the broker's HTTP lookup,
    its 404 "Namespace not found" too, as ConnectError: is that what the lookup of the topic (REST ``path``)
    answers?"""
    if not service_url.startswith(("http://", "https://")):
        return False
    lookup = "/lookup/v2/topic/persistent/" + path.removeprefix("/admin/v2/persistent/")
    try:
        rest(service_url, "GET", lookup, timeout_s=10)
    except CommandError as e:
        return e.kind == "HTTP_404" and "Namespace not found" in str(e)
    return False


def _client_failure(what: str, full: str, e: Exception, args: argparse.Namespace, path: str) -> CommandError:
    """The command's error for pulsar-client's exception ``e``; TopicNotFound is the broker's answer for a topic
    whose tenant or namespace does not exist (ConnectError through an http:// service URL)."""
    if type(e).__name__ == "TopicNotFound" or (
        type(e).__name__ == "ConnectError" and _namespace_missing(args.service_url, path)
    ):
        ns = full.removeprefix("persistent://").rsplit("/", 1)[0]
        answer = "TopicNotFound" if type(e).__name__ == "TopicNotFound" else '404 "Namespace not found"'
        return CommandError(
            f"{what} {full}: the broker answered {answer}: the namespace {ns} does not exist (create it "
            f"first: `ledgerstore namespace create {ns}`, after `ledgerstore tenant create` for a new tenant)",
            EXIT_NOT_FOUND,
        )
    return CommandError(f"{what} {full} failed: {e}")


def _produce(args: argparse.Namespace) -> int:
    path, full = topic_path(args.name)
    client = _client(args)
    ids: list[str] = []
    try:
        producer = _within(
            args,
            client,
            f"creating a producer on {full}",
            lambda: client.create_producer(
                full, batching_enabled=args.batching, send_timeout_millis=int(args.timeout_s * 1000)
            ),
        )
        t0 = time.perf_counter()
        messages = args.messages or ["hello"]
        with _ctrl_c_between_calls() as interrupted:
            for _ in range(args.num):
                for m in messages:
                    interrupted()
                    kw: dict[str, Any] = {"partition_key": args.key} if args.key else {}
                    if args.batching:
                        producer.send_async(m.encode(), lambda res, mid: ids.append(str(mid)), **kw)
                    else:
                        ids.append(str(producer.send(m.encode(), **kw)))
            producer.flush()
            interrupted()
        dt = time.perf_counter() - t0
        producer.close()
    except KeyboardInterrupt:  # the client's threads may still call back into Python (send_async)
        _let_go(args, client, EXIT_INTERRUPTED)
        raise
    except CommandError:
        raise
    except Exception as e:
        if type(e).__name__ == "Timeout":  # pulsar.Timeout: the send's, the producer was created
            raise CommandError(
                f"produce to {full}: {counted(len(ids), 'message')} acknowledged, then none within {args.timeout_s:g}s: the "
                "broker could not store it (are the cluster's bookies up? `ledgerstore ledger bookies`)",
                EXIT_UNAVAILABLE,
            ) from e
        raise _client_failure("produce to", full, e, args, path) from e
    finally:
        _close(client)
    emit(
        args,
        lambda: (
            f"produced {counted(len(ids), 'message')} to {full} in {dt:.2f}s"
            + (f"; last message id {ids[-1]}" if ids else "")
        ),
        {"topic": full, "produced": len(ids), "message_ids": ids},
    )
    return 0


def _consume(args: argparse.Namespace) -> int:
    import pulsar

    path, full = topic_path(args.name)
    client = _client(args)
    types = {
        "exclusive": pulsar.ConsumerType.Exclusive,
        "shared": pulsar.ConsumerType.Shared,
        "failover": pulsar.ConsumerType.Failover,
        "key_shared": pulsar.ConsumerType.KeyShared,
    }
    initial = (
        pulsar.InitialPosition.Earliest
        if args.initial_position == "earliest"
        else pulsar.InitialPosition.Latest
    )
    got: list[dict[str, Any]] = []
    timed_out = getattr(pulsar, "Timeout", Exception)  # pulsar.Timeout (absent from some client versions)
    try:
        consumer = _within(
            args,
            client,
            f"subscribing {args.subscription} to {full}",
            lambda: client.subscribe(
                full, args.subscription, consumer_type=types[args.subscription_type], initial_position=initial
            ),
        )
        deadline = time.monotonic() + args.timeout_s
        while args.num <= 0 or len(got) < args.num:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            try:  # in short waits: Ctrl-C is seen between two (a long one blocks in the client's C++ code)
                msg = consumer.receive(timeout_millis=min(left_ms, 200))
            except timed_out:
                continue
            except Exception:
                break
            row = {
                "message_id": str(msg.message_id()),
                "data": msg.data().decode(errors="replace"),
                "key": msg.partition_key() or None,
                "publish_time": msg.publish_timestamp(),
                "redelivery_count": msg.redelivery_count(),
                "topic": msg.topic_name(),
            }
            if not args.json:  # written out before acknowledged: `| head` leaves the rest unacknowledged
                line = f"{row['message_id']}  " + (f"key={row['key']}  " if row["key"] else "") + row["data"]
                print(line, flush=True)
            consumer.acknowledge(msg)
            got.append(row)
        consumer.close()
    except KeyboardInterrupt:
        _let_go(args, client, EXIT_INTERRUPTED)
        raise
    except (CommandError, BrokenPipeError):
        raise
    except Exception as e:
        raise _client_failure("consume from", full, e, args, path) from e
    finally:
        _close(client)
    if args.json:
        emit(
            args,
            "",
            {"topic": full, "subscription": args.subscription, "consumed": len(got), "messages": got},
        )
    else:
        print(f"consumed {counted(len(got), 'message')} from {full} (subscription {args.subscription})")
    if args.num > 0 and len(got) < args.num:
        raise CommandError(
            f"only {len(got)} of {counted(args.num, 'message')} arrived within {args.timeout_s}s"
        )
    return 0


# -- wiring -----------------------------------------------------------------------------------------------------


def _admin_verb(
    parent: Any,
    common: Callable[[argparse.ArgumentParser], None],
    name: str,
    help_text: str,
    fn: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    """A verb calling the broker's admin REST (``--url``)."""
    p: argparse.ArgumentParser = parent.add_parser(name, help=help_text)
    common(p)
    p.add_argument(
        "--url",
        default=os.environ.get("LEDGERSTORE_BROKER_HTTP", DEFAULT_ADMIN_URL),
        help="broker admin URL (any broker; calls follow redirects to the owner) "
        f"(default: {DEFAULT_ADMIN_URL}; env LEDGERSTORE_BROKER_HTTP)",
    )
    p.set_defaults(func=fn)
    return p


def add_namespace_commands(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """``ledgerstore tenant create|list|delete`` and ``ledgerstore namespace create|list|delete`` (pulsar-admin's
    ``tenants`` and ``namespaces``): a topic's tenant and namespace must exist before it."""
    tp = sub.add_parser(
        "tenant", help="create, list and delete tenants (a namespace's tenant must exist first)"
    )
    ts = tp.add_subparsers(dest="action", required=True)
    p = _admin_verb(ts, common, "create", "create a tenant", _create_or_delete("tenant", "PUT"))
    p.add_argument("tenant", help="tenant name (letters, digits, -=:._)")
    _admin_verb(ts, common, "list", "the tenants", _tenant_list)
    p = _admin_verb(
        ts,
        common,
        "delete",
        "delete a tenant (refused while it has namespaces)",
        _create_or_delete("tenant", "DELETE"),
    )
    p.add_argument("tenant", help="tenant name")
    np_ = sub.add_parser(
        "namespace", help="create, list and delete namespaces (a topic's namespace must exist first)"
    )
    ns = np_.add_subparsers(dest="action", required=True)
    p = _admin_verb(
        ns,
        common,
        "create",
        "create a namespace (its tenant must exist)",
        _create_or_delete("namespace", "PUT"),
    )
    p.add_argument("namespace", help="TENANT/NAMESPACE")
    p = _admin_verb(ns, common, "list", "the namespaces of a tenant", _namespace_list)
    p.add_argument("tenant", nargs="?", default="public", help="tenant name (default: %(default)s)")
    p = _admin_verb(
        ns,
        common,
        "delete",
        "delete a namespace (refused while it has topics)",
        _create_or_delete("namespace", "DELETE"),
    )
    p.add_argument("namespace", help="TENANT/NAMESPACE")
    _add_threshold_verbs(ns, common, _admin_verb, "namespace")
    _add_ttl_verbs(ns, common, "namespace")


def add_topic_commands(
    sub: Any,
    common: Callable[[argparse.ArgumentParser], None],
) -> None:
    tp = sub.add_parser(
        "topic", help="pulsar-admin's everyday verbs: create, list, delete, produce, consume, stats"
    )
    ts = tp.add_subparsers(dest="action", required=True)

    def verb(name: str, help_text: str, fn: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        p = _admin_verb(ts, common, name, help_text, fn)
        p.add_argument(
            "--service-url",
            default=os.environ.get("LEDGERSTORE_BROKER_URL", DEFAULT_SERVICE_URL),
            help="Pulsar service URL for produce/consume (pulsar://… or http://…) "
            f"(default: {DEFAULT_SERVICE_URL}; env LEDGERSTORE_BROKER_URL)",
        )
        return p

    p = verb("create", "create a topic (partitioned with --partitions N)", _create)
    p.add_argument("name", help="topic name (persistent://tenant/ns/topic or a short name in public/default)")
    p.add_argument("--partitions", "-p", type=int, default=0, help="partitions (0: a non-partitioned topic)")
    p = verb("list", "topics of a namespace", _list)
    p.add_argument(
        "namespace", nargs="?", default="public/default", help="TENANT/NAMESPACE (default: %(default)s)"
    )
    p = verb("delete", "delete a topic (and its partitions)", _delete)
    p.add_argument("name", help="topic name")
    p.add_argument("--force", "-f", action="store_true", help="even with connected producers/consumers")
    p = verb("produce", "send messages with pulsar-client", _produce)
    p.add_argument("name", help="topic name")
    p.add_argument("-m", "--messages", action="append", help="message text (repeatable)")
    p.add_argument("-n", "--num", type=int, default=1, help="send the messages this many times")
    p.add_argument("--key", "-k", default=None, help="partition key")
    p.add_argument("--batching", action="store_true", help="batch messages (send_async + flush)")
    p.add_argument(
        "--timeout-s", type=float, default=30.0, help="give up connecting, or a send, after this long"
    )
    p = verb("consume", "receive and acknowledge messages with pulsar-client", _consume)
    p.add_argument("name", help="topic name")
    p.add_argument("-s", "--subscription", required=True, help="subscription name")
    p.add_argument("-n", "--num", type=int, default=1, help="messages to receive (0 = until the timeout)")
    p.add_argument(
        "--subscription-type", "-t", choices=SUBSCRIPTION_TYPES, default="exclusive", help="subscription type"
    )
    p.add_argument(
        "--initial-position",
        choices=("earliest", "latest"),
        default="earliest",
        help="where a new subscription starts",
    )
    p.add_argument(
        "--timeout-s",
        type=float,
        default=30.0,
        help="give up subscribing, or waiting for messages, after this long",
    )
    p = verb("stats", "a topic's stats (partitioned-stats for a partitioned topic)", _stats)
    p.add_argument("name", help="topic name")
    p = verb("internal-stats", "ledgers and cursors of a topic (each partition's)", _internal_stats)
    p.add_argument("name", help="topic name")
    for name, help_text, fn, wait_help in (
        ("compact", "compact a topic: keep the latest message per key", _compact, "wait until it ends"),
        (
            "compaction-status",
            "the last compaction of a topic (on its owner)",
            _compaction_status,
            "wait while it runs",
        ),
    ):
        p = verb(name, help_text, fn)
        p.add_argument("name", help="topic name")
        p.add_argument("--wait", "-w", action="store_true", help=wait_help)
        p.add_argument("--timeout-s", type=float, default=300.0, help="give up waiting after this long")
    _add_threshold_verbs(ts, common, _admin_verb, "name")
    _add_ttl_verbs(ts, common, "name")
    p = verb("peek", "the next messages a subscription has not acknowledged, left unacknowledged", _peek)
    p.add_argument("name", help="topic name (a partition's: peek is refused on a partitioned topic)")
    p.add_argument("-s", "--subscription", required=True, help="subscription name")
    p.add_argument("-n", "--count", type=int, default=1, help="entries to peek (a batch is one)")
    p = verb(
        "terminate", "take no more messages on a topic, ever (its consumers read it to the end)", _terminate
    )
    p.add_argument("name", help="topic name (a partitioned topic's: each partition)")
    p = verb(
        "unload",
        "close a topic where it is served: its clients reconnect, its current ledger is closed",
        _unload,
    )
    p.add_argument("name", help="topic name (a partitioned topic's: each partition)")
    p = verb("skip", "acknowledge a subscription's next N messages unread", _skip)
    p.add_argument("name", help="topic name (a partitioned topic's: each partition's subscription)")
    p.add_argument("-s", "--subscription", required=True, help="subscription name")
    p.add_argument("-n", "--count", type=int, required=True, help="entries to skip (a batch is one)")
    for name, help_text in (
        ("expire-messages", "acknowledge a subscription's messages older than -t seconds"),
        ("expire-messages-all-subscriptions", "acknowledge every subscription's messages older than -t"),
    ):
        p = verb(name, help_text, _expire)
        p.add_argument("name", help="topic name (a partitioned topic's: each partition)")
        if name == "expire-messages":
            p.add_argument("-s", "--subscription", required=True, help="subscription name")
        else:
            p.set_defaults(subscription=None)
        p.add_argument(
            "-t", "--expire-time-s", type=int, required=True, help="messages published this many seconds ago"
        )
