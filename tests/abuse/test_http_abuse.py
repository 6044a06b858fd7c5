"""Strangers and careless scripts on the HTTP ports: the broker's admin REST and the bookies' admin HTTP, against
a real cluster (ZooKeeper, 3 bookies, an open broker and one with authentication).

A seeded driver sends every route (taken from the apps' own route tables, so none is forgotten) with malformed
input: bodies that are not JSON, JSON of the wrong type, nested past any parser's depth, numbers past any integer,
bytes that are not UTF-8, unknown charsets and encodings, long, unicode, dotted and percent-encoded path segments,
query strings with bad values, wrong methods, and bad ``Authorization`` headers. Each answer must come (never a
hang), be no 500, and an error's body must be JSON with its reason (``{"reason"}`` from the broker, ``{"error"}``
from a bookie) holding no traceback and no secret; with authentication on, every route but the open ones refuses
a request without a good token (401) and changes nothing. After each batch the processes are alive, a
``pulsar-client`` producer and consumer on the open broker are still served, and no log holds a traceback.

``LEDGERSTORE_HTTP_FUZZ_REQUESTS`` (default 100) and ``LEDGERSTORE_HTTP_FUZZ_SEED`` run it longer or elsewhere:
request i uses ``random.Random(f"{seed}-{target}-{i}")``; a failure names the request, and
``LEDGERSTORE_HTTP_FUZZ_FIRST=i LEDGERSTORE_HTTP_FUZZ_REQUESTS=1`` sends it again. A long run wants
``--timeout=0``."""

from __future__ import annotations

import base64
import gzip
import json
import os
import random
import re
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bookie.auth import create_token, new_secret
from ledgerstore.cluster import BookieProcess, BrokerProcess
from tests.abuse.test_command_fuzz import Logs
from tests.broker_testing import start_broker
from topic_broker.admin import OPEN_PATHS, AdminApp
from topic_broker.main import CONFIG_VALUES_PATHS

pulsar = pytest.importorskip("pulsar")

REQUESTS = int(os.environ.get("LEDGERSTORE_HTTP_FUZZ_REQUESTS", "100"))
FIRST = int(os.environ.get("LEDGERSTORE_HTTP_FUZZ_FIRST", "0"))
SEED = os.environ.get("LEDGERSTORE_HTTP_FUZZ_SEED", "1129")
ANSWER_S = 30.0  # an answer not here by then is a hang (generous: a busy shared machine)
BATCH = 50  # requests between two checks of the cluster
SUPERUSER = "admin"
WITNESS_TOPIC = "persistent://witt/wns/http-witness"

#: The bookies' admin routes (bookie/server.py ``admin_app`` and bookie/bk_http.py), with their methods.
BOOKIE_ROUTES: list[tuple[str, str]] = [
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/api/v1/info"),
    ("GET", "/api/v1/ledgers"),
    ("GET", "/api/v1/ledgers/{id}"),
    ("PUT", "/api/v1/gc"),
    ("GET", "/heartbeat"),
    ("GET", "/api/v1/bookie/info"),
    ("GET", "/api/v1/bookie/state"),
    ("GET", "/api/v1/bookie/is_ready"),
    ("GET", "/api/v1/bookie/last_log_mark"),
    ("PUT", "/api/v1/bookie/gc"),
    ("GET", "/api/v1/bookie/gc"),
    ("GET", "/api/v1/bookie/gc_details"),
    ("GET", "/api/v1/bookie/list_bookies"),
    ("GET", "/api/v1/ledger/metadata"),
    ("GET", "/api/v1/ledger/metadata/"),
    ("GET", "/api/v1/config/server_config"),
    ("GET", "/api/v1/config"),
]
BOOKIE_OPEN_PATHS = frozenset({"/health", "/heartbeat", "/metrics"})


def broker_routes() -> list[tuple[str, str]]:
    """(method, canonical path) of every route the broker's admin HTTP serves, from its own route table."""

    class _Stub:
        def __getattr__(self, _name: str) -> Any:
            async def handler(_request: web.Request) -> web.Response:
                return web.Response()

            return handler

    app = web.Application()
    AdminApp.routes(_Stub(), app)  # type: ignore[arg-type]
    out = []
    for route in app.router.routes():
        if route.method != "HEAD" and route.resource is not None:
            out.append((route.method, route.resource.canonical))
    out += [("GET", p) for p in (*CONFIG_VALUES_PATHS, "/api/v1/config")]
    return out


# ---- what a stranger sends -------------------------------------------------------------------------------

NAMES = [
    "public",
    "default",
    "hf",
    "ns",
    "nope",
    "x" * 3000,
    "ünïcødé-✓",
    "..",
    "%2E%2E",
    "..%2F",
    "..%2F..%2F..%2Fadmin",
    "a%2Fb",
    "%00",
    "%ED%A0%80",
    "%FF",
    "%",
    "%zz",
    " ",
    "a b",
    "-partition-0",
    "t-partition-99999999999999999999",
    "t-partition-1",
    "zookeeper",
    "__compaction",
    "{x}",
    "*",
    "\u202e",
    "a;b=c",
]
TOPICS = ["hf-t", "hf-p", "hf-p-partition-0", "hf-gone"]
NUMBERS = [
    "0",
    "1",
    "-1",
    "2147483648",
    str(2**63),
    str(2**64),
    "9" * 5000,
    "1e3",
    "NaN",
    "abc",
    "",
    "0x10",
    " 1",
    "+1",
    "１",
]
QUERY_KEYS = [
    "force",
    "applied",
    "messageTTL",
    "messagePosition",
    "batchIndex",
    "initialPosition",
    "backlogQuotaType",
    "type",
    "print_hostnames",
    "ledger_id",
    "authoritative",
    "x",
]
QUERY_VALUES = ["true", "false", "TRUE", "earliest", "latest", "rw", "ro", *NUMBERS, "%ZZ", "a&b", "é"]


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


BODIES: list[bytes | None] = [
    None,
    b"",
    b"{",
    b"nul",
    b"null",
    b"true",
    b"[]",
    b"{}",
    b"[1, 2]",
    b'"earliest"',
    b'"x"',
    b"-1",
    b"0",
    b"3",
    b"2147483648",
    str(2**64).encode(),
    b"9" * 5000,
    b"1.5",
    b"NaN",
    b"-Infinity",
    b"1e999",
    _deep(100_000),
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b"\xff\xfe\x00garbage",
    b'"\\ud800"',
    b'{"retentionTimeInMinutes": "60", "retentionSizeInMB": 1}',
    b'{"retentionTimeInMinutes": 1e3, "retentionSizeInMB": -5}',
    b'{"retentionTimeInMinutes": 99999999999999999999999, "retentionSizeInMB": 1}',
    b'{"partitions": 0}',
    b'{"partitions": -3}',
    b'{"partitions": "2"}',
    b'{"partitions": 2.0}',
    b'{"ledgerId": -1, "entryId": 18446744073709551616}',
    b'{"ledgerId": "1", "entryId": null}',
    b'{"ledgerId": 9223372036854775807, "entryId": 0, "batchIndex": -7}',
    b'{"limitSize": -2, "limitTime": 1e20, "policy": "nope"}',
    b'{"limitSize": 1, "limitTime": 1, "policy": ["producer_exception"]}',
    b'{"type": "AVRO", "schema": "' + b"[" * 5000 + b'", "properties": {}}',
    b'{"type": "JSON", "schema": "' + b"9" * 5000 + b'"}',
    b'{"type": "AVRO", "schema": "\\ud800"}',
    b'{"type": "STRING", "schema": "\\ud800", "properties": {"\\udc00": "\\ud800"}}',
    b'{"type": "KEY_VALUE", "schema": "{\\"key\\": 1}"}',
    b'{"type": 7, "schema": null, "properties": []}',
    b'{"type": "AVRO", "schema": "{\\"type\\": \\"record\\", \\"name\\": \\"r\\", \\"fields\\": 5}"}',
    b'["produce", "consume", "produce"]',
    b'["everything"]',
    b"[null]",
    b'{"' + b"k" * 100_000 + b'": 1}',
    os.urandom(64),
]
CONTENT_TYPES = [
    None,
    "application/json",
    "text/plain",
    "application/json; charset=utf-16",
    "application/json; charset=nope",
    "application/json; charset=latin-1",
    "multipart/form-data; boundary=x",
    "application/x-www-form-urlencoded",
]
METHODS = ["GET", "PUT", "POST", "DELETE", "HEAD", "OPTIONS", "PATCH", "TRACE", "FOO"]


@dataclass
class Request:
    method: str
    path: str  # raw, as sent
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes | None = None
    tokened: bool = False  # carries a good token

    def encode(self) -> bytes:
        head = [f"{self.method} {self.path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
        head += [k + b": " + v for k, v in self.headers]
        if self.body is not None:
            head.append(b"Content-Length: %d" % len(self.body))
        return b"\r\n".join(head) + b"\r\n\r\n" + (self.body or b"")

    def describe(self) -> str:
        body = None if self.body is None else self.body[:80]
        return f"{self.method} {self.path[:200]} {[(k, v[:60]) for k, v in self.headers]} body={body!r}"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def exchange(port: int, req: Request, timeout_s: float = ANSWER_S) -> Answer | None:
    """Send ``req`` on a new connection; its answer, or None when the server closed without one."""
    data = req.encode()
    deadline = time.monotonic() + timeout_s
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        try:
            s.sendall(data)
        except OSError:
            pass  # answered (413, 400) and closed before the whole body went: read what it said
        out = b""
        while True:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                chunk = s.recv(1 << 16)
            except TimeoutError:
                raise AssertionError(f"no answer within {timeout_s:g} s to {req.describe()}") from None
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += chunk
    if not out:
        return None
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return Answer(status, headers, body)


class Stranger:
    """Makes the requests of one target (the open broker, the one with authentication, a bookie)."""

    def __init__(self, routes: list[tuple[str, str]], tokens: list[str], bad_tokens: list[bytes]) -> None:
        self.routes = routes
        self.tokens = tokens
        self.bad_tokens = bad_tokens

    def request(self, rng: random.Random) -> Request:
        method, canonical = rng.choice(self.routes)
        if rng.random() < 0.15:
            method = rng.choice(METHODS)
        path = self._path(rng, canonical)
        if rng.random() < 0.3:
            pairs = [
                f"{rng.choice(QUERY_KEYS)}={rng.choice(QUERY_VALUES)}" for _ in range(rng.randrange(1, 4))
            ]
            path += "?" + "&".join(pairs)
        req = Request(method, path)
        if rng.random() < 0.7:
            req.body = rng.choice(BODIES)
        if rng.random() < 0.05 and req.body is not None:
            req.body = gzip.compress(req.body)
            req.headers.append((b"Content-Encoding", b"gzip"))
        elif rng.random() < 0.03:
            req.headers.append((b"Content-Encoding", rng.choice([b"gzip", b"br", b"deflate", b"zz"])))
        content_type = rng.choice(CONTENT_TYPES)
        if content_type is not None:
            req.headers.append((b"Content-Type", content_type.encode()))
        r = rng.random()
        if r < 0.5 and self.tokens:
            req.headers.append((b"Authorization", b"Bearer " + rng.choice(self.tokens).encode()))
            req.tokened = True
        elif r < 0.75:
            req.headers.append((b"Authorization", rng.choice(self.bad_tokens)))
        return req

    @staticmethod
    def _path(rng: random.Random, canonical: str) -> str:
        """The route's path with its parameters filled: mostly names that exist (so that the handlers' own checks
        are reached), each replaced by a stranger's name now and then."""
        tenant, namespace = rng.choice([("hf", "ns"), ("public", "default")])
        usual = {
            "tenant": tenant,
            "namespace": namespace,
            "topic": rng.choice(TOPICS),
            "subscription": "s1",
            "cluster": "ledgerstore",
            "domain": "persistent",
            "role": "alice",
        }
        parts = []
        for seg in canonical.split("/"):
            if seg.startswith("{") and seg.endswith("}"):
                key = seg[1:-1].split(":")[0]
                if key in usual and rng.random() < 0.8:
                    seg = usual[key]
                elif key in usual:
                    seg = rng.choice(["x", "", "non-persistent"] if key == "domain" else NAMES)
                else:
                    seg = rng.choice(NUMBERS)
            parts.append(seg)
        path = "/".join(parts)
        if rng.random() < 0.05:
            path = path.replace("/", "//", 1)
        if rng.random() < 0.03:
            path += "/"
        return _quote_raw(path)


def _quote_raw(path: str) -> str:
    """The path as it goes on the wire: characters an HTTP request line may not hold percent-encoded, the
    stranger's own ``%`` sequences left as they are."""
    out = []
    for ch in path:
        if ch.isascii() and (ch.isalnum() or ch in "-._~!$&'()*+,;=:@/%{}?"):
            out.append(ch)
        else:
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8")))
    return "".join(out)


BAD_TOKENS = [
    b"Bearer",
    b"Bearer ",
    b"Bearer x",
    b"Basic YWRtaW46YWRtaW4=",
    b"bearer a.b.c",
    b"Bearer \xff\xfe",
    b"Bearer \xc3\xa9t\xc3\xa9",
    b"Bearer " + b"A" * 9000,
    b"Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJhZG1pbiJ9.",
]


# ---- the cluster ----------------------------------------------------------------------------------------


@dataclass
class HttpCluster:
    bookies: list[BookieProcess]
    open_broker: BrokerProcess
    auth_broker: BrokerProcess
    secret: bytes
    tokens: dict[str, str]
    client: Any = None
    producer: Any = None
    consumer: Any = None
    logs: Logs | None = None

    @property
    def secrets(self) -> list[bytes]:
        """What no answer may hold."""
        raw = [self.secret, base64.b64encode(self.secret), base64.urlsafe_b64encode(self.secret).rstrip(b"=")]
        return raw + [t.encode() for t in self.tokens.values()]

    def admin(
        self, method: str, path: str, body: Any = None, *, broker: BrokerProcess | None = None
    ) -> Answer:
        bp = broker or self.auth_broker
        req = Request(method, path, [(b"Authorization", f"Bearer {self.tokens[SUPERUSER]}".encode())])
        if body is not None:
            req.body = json.dumps(body).encode()
            req.headers.append((b"Content-Type", b"application/json"))
        answer = exchange(bp.http_port, req)
        assert answer is not None, (method, path)
        if answer.status == 307:  # the topic's owner is the other broker: ask it (who owns it is no content)
            owner = int(answer.headers["location"].split("/")[2].rpartition(":")[2])
            answer = exchange(owner, req)
            assert answer is not None, (method, path)
        return answer

    def witness_round(self, tag: str) -> None:
        data = f"w-{tag}-{uuid.uuid4().hex[:6]}".encode()
        self.producer.send(data)
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, f"after {tag}: the witness did not get its message"
            try:
                m = self.consumer.receive(timeout_millis=2000)
            except pulsar.Timeout:
                continue
            self.consumer.acknowledge(m)
            if m.data() == data:
                return

    def check(self, tag: str) -> None:
        for p in (*self.bookies, self.open_broker, self.auth_broker):
            assert p.alive, f"after {tag}: {p.id} died"
        self.witness_round(tag)
        assert self.logs is not None
        tracebacks = self.logs.new_tracebacks()
        assert not tracebacks, f"after {tag}:\n" + "\n\n".join(tracebacks)

    def snapshot(self) -> dict[str, Any]:
        """What the auth broker's superuser reads of the fuzz's tenants, namespaces and topics."""
        out: dict[str, Any] = {}
        paths = ["/admin/v2/tenants", "/admin/v2/namespaces/hf", "/admin/v2/namespaces/public"]
        for ns in ("hf/ns", "public/default"):
            paths += [
                f"/admin/v2/namespaces/{ns}",
                f"/admin/v2/persistent/{ns}",
                f"/admin/v2/persistent/{ns}/partitioned",
                f"/admin/v2/namespaces/{ns}/permissions",
                f"/admin/v2/namespaces/{ns}/messageTTL",
                f"/admin/v2/namespaces/{ns}/compactionThreshold",
            ]
            for t in TOPICS:
                paths += [
                    f"/admin/v2/persistent/{ns}/{t}/subscriptions",
                    f"/admin/v2/schemas/{ns}/{t}/schemas",
                ]
        for path in paths:
            a = self.admin("GET", path)
            out[path] = (a.status, a.body)
        return out


def _secret_file(path: Path, secret: bytes) -> Path:
    path.write_bytes(secret)
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def hc(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpCluster]:
    from tests.conftest import BookieFactory
    from tests.zk_testing import unique_root

    tmp = tmp_path_factory.mktemp("httpfuzz")
    secret = new_secret()
    secret_file = _secret_file(tmp / "secret", secret)
    tokens = {name: create_token(secret, name, expires_in_s=3600) for name in (SUPERUSER, "alice")}
    broker_token = tmp / "broker.token"
    broker_token.write_text(create_token(secret, "broker"))
    bookies = BookieFactory(zk_server.connect_string, unique_root(), tmp)
    started: list[BrokerProcess] = []
    try:
        procs = bookies.start_many(3, "--auth-secret-file", str(secret_file), "--admin-read-auth", "api")
        open_bp = start_broker(bookies, tmp, 4, "--bookie-auth-token-file", str(broker_token))
        started.append(open_bp)
        auth_bp = start_broker(
            bookies,
            tmp,
            4,
            "--auth-secret-file",
            str(secret_file),
            "--auth-required",
            "--admin-read-auth",
            "--superuser-roles",
            SUPERUSER,
            "--bookie-auth-token-file",
            str(broker_token),
        )
        started.append(auth_bp)
        open_bp.wait_ready(60)
        auth_bp.wait_ready(60)
        c = HttpCluster(procs, open_bp, auth_bp, secret, tokens)
        for path, body in [
            ("/admin/v2/tenants/hf", None),
            ("/admin/v2/namespaces/hf/ns", None),
            ("/admin/v2/tenants/witt", None),
            ("/admin/v2/namespaces/witt/wns", None),
            ("/admin/v2/persistent/hf/ns/hf-t", None),
            ("/admin/v2/persistent/public/default/hf-t", None),
            ("/admin/v2/persistent/hf/ns/hf-p/partitions", 2),
            ("/admin/v2/persistent/public/default/hf-p/partitions", 2),
        ]:
            a = c.admin("PUT", path, body)
            assert a.status == 204, (path, a)
        c.client = pulsar.Client(open_bp.service_url, operation_timeout_seconds=30,
                                 logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))  # fmt: skip
        for ns in ("hf/ns", "public/default"):
            c.client.subscribe(f"persistent://{ns}/hf-t", "s1").close()
        c.consumer = c.client.subscribe(WITNESS_TOPIC, "w", initial_position=pulsar.InitialPosition.Earliest)
        c.producer = c.client.create_producer(WITNESS_TOPIC, send_timeout_millis=60_000)
        c.logs = Logs([*procs, open_bp, auth_bp])
        c.check("start")
        yield c
    finally:
        if started and "c" in locals() and c.client is not None:
            c.client.close()
        for bp in started:
            try:
                bp.stop()
            except Exception:
                bp.kill9()
        bookies.stop_all()


# ---- the checks ------------------------------------------------------------------------------------------


def _parser_refusal(a: Answer) -> bool:
    """Refused by aiohttp's HTTP parser, before any route or token check (an unknown method, a line past 8190
    bytes, a body that does not decode): its own text, as Jetty answers Pulsar's with its own page."""
    text = a.headers.get("content-type", "").startswith("text/plain")
    return a.status in (400, 413, 414, 431) and text and not re.match(rb"\d{3}: ", a.body)


def _check_answer(hc: HttpCluster, req: Request, a: Answer | None, error_key: str) -> None:
    what = req.describe()
    assert a is not None, f"closed without an answer: {what}"
    assert a.status < 500 or a.status in (501, 503), f"{a.status} {a.body[:300]!r}: {what}"
    assert b"Traceback" not in a.body and b'File "' not in a.body, f"a traceback in the answer to {what}"
    for s in hc.secrets:
        assert s not in a.body and all(s.decode(errors="replace") not in v for v in a.headers.values()), (
            f"a secret in the answer to {what}"
        )
    if _parser_refusal(a):
        return
    if a.status >= 400 and req.method != "HEAD":
        try:
            body = json.loads(a.body)
        except ValueError:
            raise AssertionError(f"{a.status} {a.body[:200]!r} is not JSON: {what}") from None
        assert isinstance(body, dict) and isinstance(body.get(error_key), str), f"{a.status} {body}: {what}"


def _run(
    hc: HttpCluster,
    target: str,
    port: int,
    stranger: Stranger,
    error_key: str,
    auth: Any = None,
    state: int = 0,
) -> None:
    """``auth(req)``: whether the request must be refused 401 (the target has authentication on); ``state``: every
    ``state``-th request that may change something is checked to have changed nothing when it is refused."""
    for i in range(FIRST, FIRST + REQUESTS):
        rng = random.Random(f"{SEED}-{target}-{i}")
        req = stranger.request(rng)
        mutating = req.method not in ("GET", "HEAD")
        before = hc.snapshot() if state and mutating and i % state == 0 else None
        a = exchange(port, req)
        _check_answer(hc, req, a, error_key)
        assert a is not None
        if before is not None and a.status >= 400:
            after = hc.snapshot()
            changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
            assert not changed, (
                f"{target} request {i}, refused {a.status}, changed {changed}: {req.describe()}"
            )
        if auth is not None and auth(req) and not _parser_refusal(a):
            assert a.status == 401, (
                f"{target} request {i}: {a.status} {a.body[:200]!r} without a good token: " + (req.describe())
            )
        if (i + 1) % BATCH == 0 or i == FIRST + REQUESTS - 1:
            hc.check(f"{SEED}-{target}-{i}")


def test_malformed_requests_on_every_route_of_the_open_broker(hc: HttpCluster) -> None:
    stranger = Stranger(broker_routes(), [], BAD_TOKENS)
    _run(hc, "open", hc.open_broker.http_port, stranger, "reason", state=4)


def test_without_a_good_token_every_route_of_the_secured_broker_refuses_and_changes_nothing(
    hc: HttpCluster,
) -> None:
    before = hc.snapshot()
    stranger = Stranger(broker_routes(), [], BAD_TOKENS)

    def refused(req: Request) -> bool:
        path = req.path.split("?", 1)[0]
        return path not in OPEN_PATHS

    _run(hc, "anon", hc.auth_broker.http_port, stranger, "reason", refused)
    assert hc.snapshot() == before


def test_malformed_requests_with_a_good_token_on_the_secured_broker(hc: HttpCluster) -> None:
    stranger = Stranger(broker_routes(), [hc.tokens[SUPERUSER], hc.tokens["alice"]], BAD_TOKENS)
    _run(hc, "auth", hc.auth_broker.http_port, stranger, "reason", state=4)


def test_malformed_requests_on_every_route_of_a_bookie(hc: HttpCluster) -> None:
    stranger = Stranger(BOOKIE_ROUTES, [hc.tokens[SUPERUSER]], BAD_TOKENS)

    def refused(req: Request) -> bool:
        path = req.path.split("?", 1)[0]
        return not req.tokened and (
            req.method not in ("GET", "HEAD", "OPTIONS") or path not in BOOKIE_OPEN_PATHS
        )

    _run(hc, "bookie", hc.bookies[0].http_port, stranger, "error", refused)


# ---- what the fuzz found ---------------------------------------------------------------------------------


def test_a_body_that_is_not_json_text_is_refused_400_with_its_reason(hc: HttpCluster) -> None:
    """Nested past the parser's depth, a number past int()'s digits, bytes that are not UTF-8, an unknown
    charset: each was a 500 with a traceback in the log (RecursionError, ValueError, UnicodeDecodeError,
    LookupError out of the body's parsing)."""
    path = "/admin/v2/namespaces/hf/ns/retention"
    before = hc.snapshot()
    for body, content_type, reason in [
        (_deep(100_000), b"application/json", "nested too deep"),
        (b"9" * 5000, b"application/json", "a number of over 4300 digits"),
        (b'{"retentionTimeInMinutes": "\xff"}', b"application/json", "is not utf-8 text"),
        (b"{}", b"application/json; charset=nope", "unknown charset 'nope'"),
    ]:
        for bp, headers in [
            (hc.open_broker, []),
            (hc.auth_broker, [(b"Authorization", f"Bearer {hc.tokens[SUPERUSER]}".encode())]),
        ]:
            req = Request("POST", path, [*headers, (b"Content-Type", content_type)], body)
            a = exchange(bp.http_port, req)
            assert a is not None and a.status == 400, (req.describe(), a)
            assert reason in json.loads(a.body)["reason"], (req.describe(), a)
    assert hc.snapshot() == before
    hc.check("bodies")


def test_a_charset_that_is_no_text_encoding_of_the_wire_is_refused_400(hc: HttpCluster) -> None:
    """A body is decoded in the Unicode encodings and the common single-byte ones only. Python's 'punycode'
    (quadratic: a 300 kB body held the broker's event loop for 30 s) decoded ``{}-`` to ``{}`` and the request was
    served; its 'undefined' raised a UnicodeError that was not a UnicodeDecodeError: a 500 with a traceback."""
    path = "/admin/v2/namespaces/hf/ns/retention"
    before = hc.snapshot()
    for body, charset in [(b"{}-", "punycode"), (b"{}", "undefined"), (b"{}", "unicode_escape")]:
        req = Request(
            "POST", path, [(b"Content-Type", f"application/json; charset={charset}".encode())], body
        )
        a = exchange(hc.open_broker.http_port, req)
        assert a is not None and a.status == 400, (req.describe(), a)
        assert f"unsupported charset {charset!r}" in json.loads(a.body)["reason"], (req.describe(), a)
    for charset in ("UTF-16LE", "latin-1", "us-ascii", "windows-1252"):  # still decoded: not an object, 400
        body = "[]".encode(charset)
        req = Request(
            "POST", path, [(b"Content-Type", f"application/json; charset={charset}".encode())], body
        )
        a = exchange(hc.open_broker.http_port, req)
        assert a is not None and a.status == 400, (req.describe(), a)
        assert json.loads(a.body)["reason"].startswith("expected {"), (req.describe(), a)
    assert hc.snapshot() == before
    hc.check("charsets")


def test_an_authorization_header_that_is_not_utf8_is_refused_401(hc: HttpCluster) -> None:
    """aiohttp hands a header's bytes that are not UTF-8 over as surrogates, which the token check encoded:
    a UnicodeEncodeError, 500 and a traceback from the broker and from a bookie."""
    for port, path, key in [
        (hc.auth_broker.http_port, "/admin/v2/tenants", "reason"),
        (hc.auth_broker.http_port, "/admin/v2/tenants/hf", "reason"),
        (hc.bookies[0].http_port, "/api/v1/ledgers", "error"),
        (hc.bookies[0].http_port, "/api/v1/gc", "error"),
    ]:
        for header in (b"Bearer \xff\xfe", b"Bearer a.b.\xe9"):
            method = "PUT" if path.endswith(("/gc", "/hf")) else "GET"
            req = Request(method, path, [(b"Authorization", header)])
            a = exchange(port, req)
            assert a is not None and a.status == 401, (req.describe(), a)
            assert isinstance(json.loads(a.body)[key], str)
    hc.check("tokens")


def test_a_schema_that_is_not_json_or_not_unicode_is_refused_400(hc: HttpCluster) -> None:
    """A schema definition nested past the parser's depth or holding a number past int()'s digits raised out of
    the definition's check, and one holding a lone surrogate out of its encoding: 500s with tracebacks."""
    topic = f"schema-{uuid.uuid4().hex[:6]}"
    assert hc.admin("PUT", f"/admin/v2/persistent/hf/ns/{topic}", broker=hc.open_broker).status == 204
    path = f"/admin/v2/schemas/hf/ns/{topic}/schema"
    for schema, props, reason in [
        ("[" * 5000, {}, "nested too deep"),
        ("9" * 5000, {}, "a number of over 4300 digits"),
        ("\ud800", {}, "lone surrogate"),
        ("", {"k": "\udc00"}, "lone surrogate"),
    ]:
        for kind in ("AVRO", "JSON", "STRING"):
            if kind == "STRING" and "surrogate" not in reason:
                continue
            body = {"type": kind, "schema": schema, "properties": props}
            for method_path in (path, f"/admin/v2/schemas/hf/ns/{topic}/compatibility"):
                a = hc.admin("POST", method_path, body, broker=hc.open_broker)
                assert a.status == 400 and reason in json.loads(a.body)["reason"], (kind, schema[:10], a)
    a = hc.admin("GET", f"/admin/v2/schemas/hf/ns/{topic}/schemas")
    assert a.status == 200 and json.loads(a.body) == {"getSchemaResponses": []}, a
    hc.check("schemas")


def test_a_message_id_past_a_long_is_refused_400_and_moves_no_cursor(hc: HttpCluster) -> None:
    topic = f"/admin/v2/persistent/hf/ns/ids-{uuid.uuid4().hex[:6]}"
    assert hc.admin("PUT", topic, broker=hc.open_broker).status == 204
    assert hc.admin("PUT", f"{topic}/subscription/s1", broker=hc.open_broker).status == 204
    sub = f"{topic}/subscription/s1/resetcursor"
    stats = f"{topic}/internalStats"
    before = hc.admin("GET", stats, broker=hc.open_broker)
    for body in [
        {"ledgerId": 2**64, "entryId": 0},
        {"ledgerId": 0, "entryId": 2**63},
        {"ledgerId": -(2**63) - 1},
    ]:
        a = hc.admin("POST", sub, body, broker=hc.open_broker)
        assert a.status == 400 and "out of range" in json.loads(a.body)["reason"], (body, a)
    a = hc.admin("POST", "/admin/v2/namespaces/hf/ns/retention", {"retentionTimeInMinutes": 2**31})
    assert a.status == 400, a
    after = hc.admin("GET", stats, broker=hc.open_broker)

    def mark(a: Answer) -> Any:
        return json.loads(a.body)["cursors"]["s1"]["markDeletePosition"]

    assert mark(after) == mark(before)
    hc.check("ids")


def test_a_partition_count_past_an_int_is_refused_400_and_creates_nothing(hc: HttpCluster) -> None:
    """4294967296 partitions were taken: the count was written (past the uint32 the binary protocol answers it
    in), then one managed ledger per partition created for ever, the request unanswered (about 500 znodes a
    second, going on after the client left)."""
    for body, method in [(2**32, "PUT"), ({"partitions": 2**31}, "PUT"), (2**40, "POST")]:
        name = f"/admin/v2/persistent/hf/ns/many-{uuid.uuid4().hex[:6]}"
        a = hc.admin(method, f"{name}/partitions", body, broker=hc.open_broker)
        assert a.status == 400 and "out of range" in json.loads(a.body)["reason"], (body, a)
        assert json.loads(hc.admin("GET", f"{name}/partitions").body) == {"partitions": 0}
    name = f"/admin/v2/persistent/hf/ns/grown-{uuid.uuid4().hex[:6]}"
    assert hc.admin("PUT", f"{name}/partitions", 2, broker=hc.open_broker).status == 204
    a = hc.admin("POST", f"{name}/partitions", 2**32, broker=hc.open_broker)
    assert a.status == 400, a
    assert json.loads(hc.admin("GET", f"{name}/partitions").body) == {"partitions": 2}
    hc.check("partitions")


def test_a_partition_count_past_the_brokers_limit_is_refused_and_creates_nothing(hc: HttpCluster) -> None:
    """--max-partitions-per-topic (default 1024, Pulsar's maxNumPartitionsPerPartitionedTopic): a count within the
    int range but past it was taken, one managed ledger per partition created while the request waited (10**6:
    about half an hour of ZooKeeper writes). Refused as Pulsar refuses it: 406 on create, 422 on growing, nothing
    written."""
    name = f"/admin/v2/persistent/hf/ns/wide-{uuid.uuid4().hex[:6]}"
    for n in (1025, 10**6):
        a = hc.admin("PUT", f"{name}/partitions", n, broker=hc.open_broker)
        assert a.status == 406, (n, a)
        assert json.loads(a.body)["reason"] == "Number of partitions should be less than or equal to 1024"
        assert json.loads(hc.admin("GET", f"{name}/partitions").body) == {"partitions": 0}
    name = f"/admin/v2/persistent/hf/ns/grown-{uuid.uuid4().hex[:6]}"
    assert hc.admin("PUT", f"{name}/partitions", 2, broker=hc.open_broker).status == 204
    a = hc.admin("POST", f"{name}/partitions", 1025, broker=hc.open_broker)
    assert a.status == 422 and "maximum partitions per topic 1024" in json.loads(a.body)["reason"], a
    assert json.loads(hc.admin("GET", f"{name}/partitions").body) == {"partitions": 2}
    hc.check("partition limit")
