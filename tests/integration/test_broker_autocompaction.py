"""Automatic compaction (Pulsar's compaction threshold) as users meet it: a namespace's or a topic's
``compactionThreshold`` set through the admin REST or ``ledgerstore namespace|topic set-compaction-threshold``,
and a broker that compacts the topics it serves by itself once their backlog exceeds it, read back by the
official ``pulsar-client`` with ``is_read_compacted=True``. One broker (monitor every 0.5 s) on 3 bookies is
shared by the module; every test uses its own namespace and every wait is bounded. The cost of a check and a
check going on past a failing topic (the message TTL's too) are seen on an in-process broker beside it."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
import urllib.error
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, in_process_broker, module_cluster
from tests.integration.test_broker_admin import ledgerstore
from tests.integration.test_broker_client_features3 import admin
from tests.integration.test_broker_compaction import read_compacted, send_all, wait_for
from tests.integration.test_broker_pulsar_client import client

pulsar = pytest.importorskip("pulsar")

THRESHOLD = 1000  # bytes: 40 messages of 100 bytes exceed it, one does not


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with module_cluster(
        zk_server, tmp_path_factory.mktemp("autocompaction"), "--compaction-monitor-interval-s", "0.5"
    ) as b:
        yield b


@pytest.fixture
def bp(brokers: Brokers) -> BrokerProcess:
    return brokers.procs[0]


@pytest.fixture
def c(bp: BrokerProcess) -> Iterator[Any]:
    with contextlib.closing(client(bp)) as cl:
        yield cl


@pytest.fixture
def ns(bp: BrokerProcess) -> str:
    """A namespace of the test's own, in tenant public."""
    name = f"ac-{uuid.uuid4().hex[:8]}"
    admin(bp, "PUT", f"/admin/v2/namespaces/public/{name}")
    return f"public/{name}"


def tpath(topic: str) -> str:
    """``persistent://t/ns/local`` -> its admin REST path."""
    return "/admin/v2/persistent/" + topic.removeprefix("persistent://")


def status(bp: BrokerProcess, topic: str) -> str:
    return str(admin(bp, "GET", tpath(topic) + "/compaction")["status"])


def updates(keys: str, rounds: int) -> list[tuple[str | None, bytes]]:
    """``rounds`` values of each key, 100 bytes each, the last one of key k ending in ``k{rounds - 1}``."""
    return [(k, f"{k}{i}".encode().rjust(100, b".")) for i in range(rounds) for k in keys]


def latest(keys: str, rounds: int) -> dict[str, bytes]:
    return {k: f"{k}{rounds - 1}".encode().rjust(100, b".") for k in keys}


def http_error(bp: BrokerProcess, method: str, path: str, body: Any = None) -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as e:
        admin(bp, method, path, body)
    return e.value.code, json.loads(e.value.read())["reason"]


def test_a_namespace_threshold_compacts_without_anyone_asking(c: Any, bp: BrokerProcess, ns: str) -> None:
    t = f"persistent://{ns}/orders"
    p = c.create_producer(t, batching_enabled=False)
    send_all(p, updates("abcd", 10))
    assert status(bp, t) == "NOT_RUN"
    cli = ledgerstore(
        "namespace",
        "set-compaction-threshold",
        ns,
        "--threshold",
        "1k",
        "--url",
        f"http://127.0.0.1:{bp.http_port}",
    )
    assert cli.returncode == 0, cli.stderr
    assert admin(bp, "GET", f"/admin/v2/namespaces/{ns}/compactionThreshold") == 1024
    wait_for("the automatic compaction", lambda: status(bp, t) == "SUCCESS")
    got = read_compacted(c, t)
    assert {k: v for k, v, _ in got} == latest("abcd", 10) and len(got) == 4


def test_a_topic_threshold_of_0_turns_it_off_under_a_namespace_threshold(
    c: Any, bp: BrokerProcess, ns: str
) -> None:
    admin(bp, "POST", f"/admin/v2/namespaces/{ns}/compactionThreshold", THRESHOLD)
    off, on = f"persistent://{ns}/off", f"persistent://{ns}/on"
    admin(bp, "PUT", tpath(off))
    admin(bp, "POST", tpath(off) + "/compactionThreshold", 0)
    assert admin(bp, "GET", tpath(off) + "/compactionThreshold") == 0
    assert admin(bp, "GET", tpath(off) + "/compactionThreshold?applied=true") == 0
    p_off = c.create_producer(off, batching_enabled=False)
    send_all(p_off, updates("xy", 20))
    p_on = c.create_producer(on, batching_enabled=False)
    assert admin(bp, "GET", tpath(on) + "/compactionThreshold?applied=true") == THRESHOLD
    send_all(p_on, updates("xy", 20))
    # the monitor's pass that compacted "on" saw all of "off" (sent before) over the namespace's threshold
    wait_for("the compaction of the other topic", lambda: status(bp, on) == "SUCCESS")
    assert status(bp, off) == "NOT_RUN"
    admin(bp, "DELETE", tpath(off) + "/compactionThreshold")  # the namespace's applies again
    assert admin(bp, "GET", tpath(off) + "/compactionThreshold") is None
    wait_for("the compaction once the topic's 0 is removed", lambda: status(bp, off) == "SUCCESS")
    assert {k: v for k, v, _ in read_compacted(c, off)} == latest("xy", 20)


def test_each_partition_is_compacted_by_itself_with_its_topics_threshold(
    c: Any, bp: BrokerProcess, ns: str
) -> None:
    t = f"persistent://{ns}/parts"
    admin(bp, "PUT", tpath(t) + "/partitions", 2)
    p0, p1 = f"{t}-partition-0", f"{t}-partition-1"
    small = c.create_producer(p1, batching_enabled=False)
    send_all(small, [("k", b"1")])  # served, its backlog under the threshold
    big = c.create_producer(p0, batching_enabled=False)
    # everything sent before the threshold is set: set first, the monitor could compact partition 0 while the
    # messages arrive (past the 11th), leaving the rest after the horizon, under the threshold if fewer than 10
    send_all(big, updates("k", 30))
    cli = ledgerstore(
        "topic",
        "set-compaction-threshold",
        t,
        "-t",
        str(THRESHOLD),
        "--url",
        f"http://127.0.0.1:{bp.http_port}",
    )
    assert cli.returncode == 0, cli.stderr
    assert admin(bp, "GET", tpath(p1) + "/compactionThreshold") == THRESHOLD  # the partitioned topic's
    wait_for("partition 0's compaction", lambda: status(bp, p0) == "SUCCESS")
    assert status(bp, p1) == "NOT_RUN"
    assert [(k, v) for k, v, _ in read_compacted(c, p0)] == list(latest("k", 30).items())


def test_threshold_routes_answer_and_refuse(bp: BrokerProcess, ns: str) -> None:
    route = f"/admin/v2/namespaces/{ns}/compactionThreshold"
    assert admin(bp, "GET", route) is None  # not set: the broker's default
    admin(bp, "POST", route, 2048)
    assert admin(bp, "GET", route) == 2048
    assert admin(bp, "GET", f"/admin/v2/namespaces/{ns}")["compaction_threshold"] == 2048
    code, reason = http_error(bp, "POST", route, -1)
    assert code == 412 and "0 (off) or more" in reason
    assert http_error(bp, "POST", route, "10M")[0] == 400
    assert http_error(bp, "POST", route, True)[0] == 400
    assert admin(bp, "GET", route) == 2048  # unchanged by the refusals
    admin(bp, "DELETE", route)
    assert admin(bp, "GET", route) is None
    assert http_error(bp, "GET", "/admin/v2/namespaces/public/no-such-ns/compactionThreshold")[0] == 404
    assert http_error(bp, "POST", "/admin/v2/namespaces/public/no-such-ns/compactionThreshold", 1)[0] == 404
    # topic-level: the topic must exist, in a namespace that does
    missing = tpath(f"persistent://{ns}/never-created") + "/compactionThreshold"
    code, reason = http_error(bp, "POST", missing, 1)
    assert code == 404 and "not found" in reason
    assert http_error(bp, "GET", missing)[0] == 404
    code, reason = http_error(bp, "GET", tpath("persistent://public/no-such-ns/t") + "/compactionThreshold")
    assert code == 404 and reason == "Namespace not found"
    t = f"persistent://{ns}/plain"
    admin(bp, "PUT", tpath(t))
    assert http_error(bp, "POST", tpath(t) + "/compactionThreshold", -5)[0] == 412
    assert admin(bp, "GET", tpath(t) + "/compactionThreshold?applied=true") == 0  # nothing set: broker's 0
    url = f"http://127.0.0.1:{bp.http_port}"
    cli = ledgerstore("topic", "set-compaction-threshold", t, "-t", "-1", "--url", url)
    assert cli.returncode == 2 and "0 (off) or more" in cli.stderr
    cli = ledgerstore("topic", "get-compaction-threshold", t, "--json", "--url", url)
    assert cli.returncode == 0 and json.loads(cli.stdout) == {"compactionThreshold": None}
    # a deleted topic's policies go with it, a partitioned topic's too
    admin(bp, "POST", tpath(t) + "/compactionThreshold", 10)
    admin(bp, "DELETE", tpath(t))
    admin(bp, "PUT", tpath(t))
    assert admin(bp, "GET", tpath(t) + "/compactionThreshold") is None
    pt = f"persistent://{ns}/parted"
    admin(bp, "PUT", tpath(pt) + "/partitions", 2)
    admin(bp, "POST", tpath(pt) + "/compactionThreshold", 10)
    admin(bp, "DELETE", tpath(pt) + "/partitions")
    admin(bp, "PUT", tpath(pt) + "/partitions", 2)
    assert admin(bp, "GET", tpath(pt) + "/compactionThreshold") is None


@pytest.mark.parametrize("partitioned", [False, True], ids=["topic", "partitioned"])
def test_a_policy_for_a_topic_deleted_while_it_was_set_is_refused_and_not_stored(
    bp: BrokerProcess, ns: str, partitioned: bool
) -> None:
    """A topic's compactionThreshold POSTed, its body held back until the topic is deleted (the broker found
    the topic, and waits for the body): 404, and no policy is stored for a topic that no longer exists (it
    applied to the topic created again under that name). The write and the check that the topic is there are
    one ZooKeeper transaction, so no deletion can come in between."""
    t = f"persistent://{ns}/{'parted' if partitioned else 'plain'}"
    where = tpath(t) + ("/partitions" if partitioned else "")
    admin(bp, "PUT", where, 2 if partitioned else None)
    body = b"10"
    with socket.create_connection(("127.0.0.1", bp.http_port), timeout=30) as s:
        s.sendall(
            f"POST {tpath(t)}/compactionThreshold HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        )
        time.sleep(1)  # (the broker finds the topic meanwhile; later, the answer is 404 all the same)
        admin(bp, "DELETE", where)
        s.sendall(body)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.split(b"\r\n", 1)[0] == b"HTTP/1.1 404 Not Found", answer
    admin(bp, "PUT", where, 2 if partitioned else None)
    assert admin(bp, "GET", tpath(t) + "/compactionThreshold") is None


def open_with_an_entry(service: Any, run: Any, ns: str, n: int) -> tuple[list[Any], list[Any]]:
    """Topics ``t0``..``t{n-1}`` of ``ns`` opened on the in-process broker (served in that order), each with one
    entry of 100 bytes published long ago (1970); their names and topics."""
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import wire
    from topic_broker.names import TopicName

    names = [TopicName.parse(f"persistent://{ns}/t{i}") for i in range(n)]
    topics = [run(service.get_topic(name)) for name in names]
    md = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, partition_key="k")
    for t in topics:
        run(t.ml.append(wire.make_entry(md, b"v" * 100)))
    return names, topics


#: an in-process broker with no tick and no monitors of its own: the tests call the checks by hand
QUIET = {"tick_interval_s": 3600.0, "compaction_monitor_interval_s": 3600.0}


def test_the_monitor_reads_only_the_policies_of_topics_that_have_some(brokers: Brokers, ns: str) -> None:
    """Each check lists which topics of a namespace have policies of their own (one request) and reads those
    only: it read one znode per topic served at every check, most of them absent. The topic with a threshold
    is still compacted by it, the others not. An in-process broker beside the module's, its reads counted."""
    from zk.managed_ledgers import TopicPolicies

    with in_process_broker(brokers, **QUIET) as (service, run):
        meta = service.meta
        names, topics = open_with_an_entry(service, run, ns, 8)
        run(meta.set_topic_policies(names[3].ml_name, TopicPolicies(compaction_threshold=10)))
        reads: list[str] = []
        read_policies = meta.get_topic_policies

        async def counted(ml_name: str) -> Any:
            reads.append(ml_name)
            return await read_policies(ml_name)

        meta.get_topic_policies = counted
        run(service.check_compaction())
        assert reads == [names[3].ml_name]
        assert [t.compaction.status.value for t in topics].count("NOT_RUN") == 7
        assert topics[3].compaction.status.value != "NOT_RUN"
        wait_for("the compaction", lambda: topics[3].compaction.status.value == "SUCCESS")


def test_one_topic_failing_its_check_does_not_stop_the_others(
    brokers: Brokers, bp: BrokerProcess, ns: str
) -> None:
    """The compaction and message-TTL checks go on past a topic whose check fails, and then name it: the first
    failure ended the check, and every topic served after it went without compaction or TTL for as long as it
    failed. Here the first topic's policies cannot be read (a negative threshold, written by another tool) and
    its entries cannot be read (its bookies away)."""
    from topic_broker.cursor import InitialPosition, ManagedCursor
    from topic_broker.managed_ledger import ManagedLedgerError
    from topic_broker.service import TopicChecksFailedError
    from zk.managed_ledgers import TopicPolicies

    admin(bp, "POST", f"/admin/v2/namespaces/{ns}/messageTTL", 1)
    with in_process_broker(brokers, **QUIET) as (service, run):
        names, topics = open_with_an_entry(service, run, ns, 2)
        run(service.meta.set_topic_policies(names[0].ml_name, TopicPolicies(compaction_threshold=-5)))
        run(service.meta.set_topic_policies(names[1].ml_name, TopicPolicies(compaction_threshold=10)))
        with pytest.raises(Exception) as failure:
            run(service.check_compaction())
        assert topics[1].compaction.status.value != "NOT_RUN"  # checked after the one that failed
        assert isinstance(failure.value, TopicChecksFailedError)
        assert re.search(f"1 topic.*{names[0]}.*negative", str(failure.value))
        wait_for("the compaction", lambda: topics[1].compaction.status.value == "SUCCESS")

        subs = [run(ManagedCursor.open(t.ml, "s", InitialPosition.EARLIEST)) for t in topics]

        async def unreadable(pos: Any) -> bytes:
            raise ManagedLedgerError(f"read of {pos} failed: bookies away")

        topics[0].ml.read_entry = unreadable
        # its policies readable again: the message-TTL check reads them too (a topic's own TTL)
        run(service.meta.delete_topic_policies(names[0].ml_name))
        with pytest.raises(Exception) as failure:
            run(service.check_message_expiry())
        assert subs[1].mark_delete == topics[1].ml.last_confirmed_position()  # its entry expired
        assert subs[0].mark_delete < topics[0].ml.last_confirmed_position()
        assert isinstance(failure.value, TopicChecksFailedError)
        assert re.search(f"1 topic.*{names[0]}.*bookies away", str(failure.value))
