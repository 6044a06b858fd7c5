"""Strangers and careless operators against the admin routes of peek, skip, expire-messages, the namespace
message TTL and the compaction thresholds: every refusal is a 4xx with Pulsar's ``{"reason": …}``, and a refused
call moves nothing. One broker on 3 bookies for the module."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import logging
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, in_process_broker, module_cluster
from tests.integration.test_broker_admin import call, ledgerstore, ok
from tests.integration.test_broker_compaction import wait_for
from tests.integration.test_broker_pulsar_client import client

pulsar = pytest.importorskip("pulsar")

T = "/admin/v2/persistent/public/default"
NS = "/admin/v2/namespaces/public/default"


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("strangers2")) as b:
        yield b


@pytest.fixture(scope="module")
def bp(brokers: Brokers) -> BrokerProcess:
    return brokers.procs[0]


def name() -> str:
    return f"st2-{uuid.uuid4().hex[:8]}"


def refused(bp: BrokerProcess, method: str, path: str, status: int, body: Any = None) -> str:
    """The reason of a call that must be refused with ``status``."""
    got, data, _ = call(bp, method, path, body)
    assert got == status, (method, path, got, data)
    assert isinstance(data, dict) and data.get("reason"), data
    return str(data["reason"])


def mark_deletes(bp: BrokerProcess, t: str) -> dict[str, str]:
    stats = ok(bp, "GET", f"{T}/{t}/internalStats")
    return {s: c["markDeletePosition"] for s, c in stats["cursors"].items()}


def test_the_compactors_subscription_is_not_moved_by_hand(bp: BrokerProcess) -> None:
    """Skip, expire-messages, reset-cursor and skip_all name ``__compaction``: 405, its horizon unmoved (moved, the
    entries it passed over were never compacted and left the compacted view with their ledger); peek reads it."""
    t = name()
    full = f"persistent://public/default/{t}"
    ok(bp, "PUT", f"{T}/{t}")
    with contextlib.closing(client(bp)) as c:
        producer = c.create_producer(full, batching_enabled=False)
        producer.send(b"a", partition_key="a")
        ok(bp, "PUT", f"{T}/{t}/compaction")
        wait_for("compaction", lambda: ok(bp, "GET", f"{T}/{t}/compaction")["status"] == "SUCCESS")
        for k in "bcd":
            producer.send(k.encode(), partition_key=k)
    before = mark_deletes(bp, t)
    assert "__compaction" in before
    sub = f"{T}/{t}/subscription/__compaction"
    for method, path, body in [
        ("POST", f"{sub}/skip/2", None),
        ("POST", f"{sub}/expireMessages/0", None),
        ("POST", f"{sub}/skip_all", None),
        ("POST", f"{sub}/resetcursor/0", None),
        ("POST", f"{sub}/resetcursor", "latest"),
    ]:
        assert "reserved for topic compaction" in refused(bp, method, path, 405, body)
    assert mark_deletes(bp, t) == before
    assert call(bp, "GET", f"{sub}/position/1")[0] == 200


@pytest.mark.parametrize("body", ["not json", "str", 1.5, [1], True, -1, 2**63, 10**30])
def test_thresholds_refuse_what_is_not_a_long_of_0_or_more(bp: BrokerProcess, body: Any) -> None:
    """The namespace's and a topic's ``compactionThreshold`` (Pulsar's Long): 400 for what is not a JSON integer,
    412 for a negative one or one past 2**63 - 1 (accepted before: a value Pulsar's admin cannot read); the
    threshold set before is kept."""
    t = name()
    ok(bp, "PUT", f"{T}/{t}")
    for path in (f"{NS}/compactionThreshold", f"{T}/{t}/compactionThreshold"):
        ok(bp, "POST", path, 1000)
        status = 412 if isinstance(body, int) and not isinstance(body, bool) else 400
        raw = body.encode() if body == "not json" else json.dumps(body).encode()
        refused_raw(bp, path, raw, status)
        assert ok(bp, "GET", path) == 1000
    ok(bp, "POST", f"{T}/{t}/compactionThreshold", 2**63 - 1)
    ok(bp, "DELETE", f"{NS}/compactionThreshold")


@pytest.mark.parametrize("body", ["not json", 1.5, None, -1, 2**31, 2**63])
def test_message_ttl_refuses_what_is_not_an_int_of_0_or_more(bp: BrokerProcess, body: Any) -> None:
    """The namespace's ``messageTTL`` (Pulsar's Integer of seconds): 400 for what is not a JSON integer, 412
    for a negative one or one past 2**31 - 1; the TTL set before is kept."""
    path = f"{NS}/messageTTL"
    ok(bp, "POST", path, 3600)
    try:
        status = 412 if isinstance(body, int) else 400
        raw = body.encode() if body == "not json" else json.dumps(body).encode()
        refused_raw(bp, path, raw, status)
        assert ok(bp, "GET", path) == 3600
    finally:
        ok(bp, "DELETE", path)


def refused_raw(bp: BrokerProcess, path: str, raw: bytes, status: int) -> str:
    """The reason of a POST of the bytes ``raw`` that must be refused with ``status``."""
    req = urllib.request.Request(f"http://127.0.0.1:{bp.http_port}{path}", data=raw, method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raise AssertionError(f"{path} {raw[:40]!r}: {r.status}, not refused")
    except urllib.error.HTTPError as e:
        got, text = e.code, e.read().decode()
    assert got == status, (path, raw[:40], got, text)
    data = json.loads(text)
    assert isinstance(data, dict) and data.get("reason"), data
    return str(data["reason"])


def test_the_cli_says_in_one_line_that_a_threshold_or_ttl_is_too_large(bp: BrokerProcess) -> None:
    url = f"http://127.0.0.1:{bp.http_port}"
    for args in (
        ("namespace", "set-compaction-threshold", "public/default", "--threshold", "99999999999t"),
        ("namespace", "set-message-ttl", "public/default", "--ttl", str(2**31)),
    ):
        r = ledgerstore(*args, "--url", url)
        assert r.returncode != 0, (args, r.returncode, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "412" in r.stderr, r.stderr
    assert ok(bp, "GET", f"{NS}/compactionThreshold") is None
    assert ok(bp, "GET", f"{NS}/messageTTL") is None


def test_aiohttps_own_refusals_have_a_reason(bp: BrokerProcess) -> None:
    """No such route (``position/`` with no number, a topic call missing ``subscription/``), a method the route
    does not take, and a 50 MiB body: Pulsar's ``{"reason"}`` as every other refusal (aiohttp's text before)."""
    t = name()
    ok(bp, "PUT", f"{T}/{t}")
    ok(bp, "PUT", f"{T}/{t}/subscription/s", "earliest")
    refused(bp, "GET", f"{T}/{t}/subscription/s/position/", 404)
    refused(bp, "POST", f"{T}/{t}/skip/1", 404)
    assert "PUT is not allowed" in refused(bp, "PUT", f"{T}/{t}/subscription/s/skip/1", 405)
    big = b"1" * (50 * 1024 * 1024)
    assert "Maximum request body size" in refused_raw(bp, f"{NS}/messageTTL", big, 413)
    assert "Maximum request body size" in refused_raw(bp, f"{T}/{t}/compactionThreshold", big, 413)
    assert ok(bp, "GET", f"{NS}/messageTTL") is None
    # still serving
    assert call(bp, "GET", f"{T}/{t}/subscription/s/position/1")[0] == 404


@pytest.mark.parametrize(
    ("method", "tail", "status"),
    [
        ("GET", "position/0", 412),
        ("GET", "position/-1", 412),
        ("GET", f"position/{10**30}", 404),
        ("GET", "position/1.5", 412),
        ("POST", "skip/-5", 412),
        ("POST", "skip/1e3", 412),
        ("POST", "expireMessages/-1", 412),
        ("POST", "expireMessages/abc", 412),
    ],
)
def test_path_numbers_out_of_range_move_nothing(
    bp: BrokerProcess, method: str, tail: str, status: int
) -> None:
    t = name()
    ok(bp, "PUT", f"{T}/{t}")
    ok(bp, "PUT", f"{T}/{t}/subscription/s", "earliest")
    with contextlib.closing(client(bp)) as c:
        producer = c.create_producer(f"persistent://public/default/{t}", batching_enabled=False)
        for i in range(3):
            producer.send(b"m%d" % i)
    before = mark_deletes(bp, t)
    refused(bp, method, f"{T}/{t}/subscription/s/{tail}", status)
    assert mark_deletes(bp, t) == before


def test_a_partition_where_a_partitioned_topic_is_meant_and_the_other_way_round(bp: BrokerProcess) -> None:
    """A partitioned topic of 2: peek and terminate refused on it (405), terminate/partitions on a partition
    (405), a partition past the count 404 for every call and for its compactionThreshold (which set the whole
    topic's threshold before), the topic's threshold unset after all of them."""
    t = name()
    ok(bp, "PUT", f"{T}/{t}/partitions", 2)
    ok(bp, "PUT", f"{T}/{t}/subscription/s", "earliest")
    assert "partitioned topic" in refused(bp, "GET", f"{T}/{t}/subscription/s/position/1", 405)
    refused(bp, "POST", f"{T}/{t}/terminate", 405)
    refused(bp, "POST", f"{T}/{t}-partition-0/terminate/partitions", 405)
    past = f"{T}/{t}-partition-7"
    for method, tail in [
        ("GET", "/subscription/s/position/1"),
        ("POST", "/subscription/s/skip/1"),
        ("POST", "/subscription/s/expireMessages/1"),
        ("POST", "/all_subscription/expireMessages/1"),
        ("POST", "/terminate"),
        ("GET", "/compactionThreshold"),
        ("DELETE", "/compactionThreshold"),
    ]:
        refused(bp, method, past + tail, 404)
    assert "has 2 partitions" in refused_raw(bp, f"{past}/compactionThreshold", b"5", 404)
    assert ok(bp, "GET", f"{T}/{t}/compactionThreshold") is None
    # a partition's is its topic's, as in Pulsar
    ok(bp, "POST", f"{T}/{t}-partition-1/compactionThreshold", 5)
    assert ok(bp, "GET", f"{T}/{t}/compactionThreshold") == 5


def test_a_body_sent_slowly_or_never_is_answered_408(
    brokers: Brokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stranger announcing a body and sending part of it (or none) is answered 408 once the body timeout is
    past (30 s; 1 s here), its handler and connection not held for ever (it hung before); others served meanwhile,
    and the namespace's TTL left alone."""
    from topic_broker import admin

    monkeypatch.setattr(admin, "BODY_TIMEOUT_S", 1.0)
    with in_process_broker(brokers) as (service, run):
        http = admin.AdminServer(service)
        run(http.start())
        try:
            _slow_bodies(service.config.http_port)
        finally:
            run(http.stop())


def test_a_body_cut_off_logs_no_traceback(brokers: Brokers, caplog: pytest.LogCaptureFixture) -> None:
    """A client gone before its body arrived whole: no traceback in the log (its ConnectionResetError was logged
    as the admin's own failure, a 500 with a traceback), the port serving after."""
    from topic_broker import admin

    with in_process_broker(brokers) as (service, run):
        http = admin.AdminServer(service)
        run(http.start())
        try:
            port = service.config.http_port
            head = f"POST {NS}/messageTTL HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            with caplog.at_level(logging.INFO):
                for _ in range(2):
                    with socket.create_connection(("127.0.0.1", port)) as s:
                        s.sendall(f"{head}Content-Length: 10\r\n\r\n12".encode())
                        time.sleep(0.5)  # the handler waits for the rest
                url = f"http://127.0.0.1:{port}{NS}/messageTTL"
                assert json.loads(urllib.request.urlopen(url, timeout=30).read()) is None
            wait_for("the line", lambda: "left before its body arrived" in caplog.text)
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text
        finally:
            run(http.stop())


def _slow_bodies(port: int) -> None:
    """Two strangers' bodies, one never sent and one cut short, each answered 408; the port serving meanwhile."""
    head = (
        f"POST {NS}/messageTTL HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 10\r\n\r\n"
    )
    slow = []
    for part in (b"", b"12"):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(head.encode() + part)
        slow.append(s)
    assert (
        json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}{NS}/messageTTL", timeout=30).read())
        is None
    )
    for s in slow:
        with contextlib.closing(s):
            s.settimeout(30)
            started = time.monotonic()
            answer = s.recv(4096).decode()
            assert answer.startswith("HTTP/1.1 408"), answer
            assert "did not arrive within 1 s" in answer
            assert time.monotonic() - started < 20
    assert (
        json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}{NS}/messageTTL", timeout=30).read())
        is None
    )


def test_requests_the_http_parser_refuses_log_no_traceback(
    brokers: Brokers, caplog: pytest.LogCaptureFixture
) -> None:
    """A body not chunked as its head says, a Content-Length that is not a number, a NUL in the path: 400 from
    the HTTP parser, and no traceback in the log (aiohttp logged each at ERROR with its traceback)."""
    from topic_broker import admin

    with in_process_broker(brokers) as (service, run):
        http = admin.AdminServer(service)
        run(http.start())
        try:
            port = service.config.http_port
            junk = [
                f"POST {NS}/messageTTL HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n12\r\n",
                f"POST {NS}/messageTTL HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
                "GET /\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
            ]
            with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
                for request in junk:
                    with socket.create_connection(("127.0.0.1", port)) as s:
                        s.sendall(request.encode())
                        s.settimeout(30)
                        status_line = s.recv(4096).decode().split("\r\n")[0]
                        assert status_line.endswith("400 Bad Request"), (request, status_line)
                url = f"http://127.0.0.1:{port}{NS}/messageTTL"
                assert json.loads(urllib.request.urlopen(url, timeout=30).read()) is None
            wait_for("the lines", lambda: caplog.text.count("Error handling request") >= len(junk))
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text
        finally:
            run(http.stop())


def test_terminate_and_unload_at_once_answer_no_500(bp: BrokerProcess) -> None:
    """Terminate and unload sent 10 each at once on a topic, 4 topics: every terminate answers the last message
    id, never 500 "another owner changed the ledger list" (the topic opened again while the unloaded instance
    still closed read the ledger list before that close's write, and its terminate conflicted and fenced it; 1
    topic in 4 before), and the topic ends terminated."""
    with contextlib.closing(client(bp)) as c:
        for _ in range(4):
            t = name()
            ok(bp, "PUT", f"{T}/{t}")
            producer = c.create_producer(f"persistent://public/default/{t}", batching_enabled=False)
            for i in range(20):
                producer.send_async(b"v%d" % i, None)
            producer.flush()
            with cf.ThreadPoolExecutor(20) as ex:
                calls = [("POST", f"{T}/{t}/terminate"), ("PUT", f"{T}/{t}/unload")] * 10
                answers = list(ex.map(lambda mp: call(bp, *mp), calls))
            assert {s for s, _d, _h in answers} <= {200, 204}, [a[:2] for a in answers if a[0] >= 300]
            last = {json.dumps(d, sort_keys=True) for s, d, _h in answers if s == 200}
            assert len(last) == 1, last
            assert ok(bp, "GET", f"{T}/{t}/internalStats")["state"] == "Terminated"


def test_a_client_that_reads_none_of_a_large_answer_is_closed(
    brokers: Brokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stranger asking for a 4 MiB peeked message and reading none of it: its connection is closed once
    writing has been stalled for the stall timeout (30 s; 1 s here), not held with its handler for ever (it
    was still open after 45 s); it reads less than the message after."""
    from bookie import server_gate
    from topic_broker import admin, wire
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker.names import TopicName

    monkeypatch.setattr(server_gate, "HTTP_WRITE_STALL_S", 1.0)
    with in_process_broker(brokers) as (service, run):
        http = admin.AdminServer(service)
        run(http.start())
        try:
            port = service.config.http_port
            t = name()
            topic = run(service.get_topic(TopicName.parse(f"persistent://public/default/{t}")))
            size = 4 * 1024 * 1024
            md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
            run(topic.ml.append(wire.make_entry(md, b"x" * size)))
            assert call_port(port, "PUT", f"{T}/{t}/subscription/s", b'"earliest"') == 204
            s = socket.socket()
            with contextlib.closing(s):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.connect(("127.0.0.1", port))
                s.sendall(f"GET {T}/{t}/subscription/s/position/1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                time.sleep(4)  # reading nothing, well past the stall timeout
                s.settimeout(20)
                got = 0
                with contextlib.suppress(ConnectionResetError):
                    while chunk := s.recv(1 << 20):
                        got += len(chunk)
                assert got < size, got
            assert call_port(port, "GET", f"{NS}/messageTTL") == 200
        finally:
            run(http.stop())


def call_port(port: int, method: str, path: str, body: bytes | None = None) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_a_topic_of_80_partitions_is_skipped_and_expired_whole(bp: BrokerProcess) -> None:
    """The calls on a partitioned topic's partitions go through the broker's own admin port: 80 at once were
    more than its cap from one address (64), and the ones beyond were refused, the call 500 "Connection reset by
    peer" with part of the partitions done. Now each answers 204 and every partition has the subscription."""
    t = name()
    ok(bp, "PUT", f"{T}/{t}/partitions", 80)
    ok(bp, "PUT", f"{T}/{t}/subscription/s", "earliest")
    ok(bp, "POST", f"{T}/{t}/subscription/s/skip/1")
    ok(bp, "POST", f"{T}/{t}/subscription/s/expireMessages/1")
    ok(bp, "POST", f"{T}/{t}/all_subscription/expireMessages/1")
    assert all("s" in ok(bp, "GET", f"{T}/{t}-partition-{i}/subscriptions") for i in (0, 40, 79))
