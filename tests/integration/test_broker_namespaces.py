"""Topics of tenants and namespaces that do not exist are refused, as Pulsar refuses them: the official
``pulsar-client`` (binary and HTTP lookup) raises ``TopicNotFound`` at once, not a ``Timeout`` after its retries,
and nothing is written for the topic (no znode, no ledger). Once the namespace is created through the admin the
same calls work. The admin's calls on one topic answer 404 with Pulsar's "Namespace not found"; the namespace's
topic lists 404 "Namespace does not exist"; a namespace that still has topics cannot be deleted (409).

Real processes: ZooKeeper, 3 bookies, one broker (shared by the module's tests).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, in_process_broker, module_cluster, topic_opening_commands
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from zk.acl import resolve_auth

pulsar = pytest.importorskip("pulsar")

#: The client's operation timeout: a refusal must come long before it.
OPERATION_TIMEOUT_S = 20
FAST_S = 5.0


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    # the forced deletes tested here are allowed (off, they are 405: test_forced_delete_gate)
    forced = ("--force-delete-namespace-allowed", "--force-delete-tenant-allowed")
    with module_cluster(zk_server, tmp_path_factory.mktemp("namespaces"), *forced) as b:
        yield b


@pytest.fixture(scope="module")
def zk(brokers: Brokers) -> Iterator[Any]:
    """A plain ZooKeeper client, to see what the broker wrote: with the credentials its processes were given
    (``LEDGERSTORE_ZK_AUTH[_FILE]`` in this process's environment, as a session's other fixtures may set), which
    the znodes' ACLs then require."""
    auth = resolve_auth()
    k = KazooClient(
        hosts=brokers.bookies.zk,
        auth_data=None if auth is None else [("digest", f"{auth.user}:{auth.password}")],
    )
    k.start(30)
    yield k
    k.stop()
    k.close()


@pytest.fixture(scope="module")
def bp(brokers: Brokers) -> BrokerProcess:
    return brokers.procs[0]


def admin(bp: BrokerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{bp.http_port}{path}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    return status, (json.loads(text) if text else None)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def znodes_naming(zk: Any, root: str, word: str) -> list[str]:
    """Every znode under ``root`` whose path holds ``word``."""
    found: list[str] = []

    def walk(path: str) -> None:
        for child in zk.get_children(path):
            p = f"{path}/{child}"
            if word in child:
                found.append(p)
            walk(p)

    walk(root)
    return found


def ledger_count(zk: Any, root: str) -> int:
    """Ledgers in the metadata (a ledger on the bookies is created there first)."""
    n = 0

    def walk(path: str) -> None:
        nonlocal n
        for child in zk.get_children(path):
            if child.startswith("L"):
                n += 1
            elif child.isdigit():
                walk(f"{path}/{child}")

    if zk.exists(f"{root}/ledgers"):
        walk(f"{root}/ledgers")
    return n


def refused_fast(call: Callable[[], Any], error: type[Exception] | None = None) -> float:
    """``call()`` raises ``error`` (``pulsar.TopicNotFound``) well before the operation timeout; the seconds it
    took."""
    t0 = time.monotonic()
    with pytest.raises(error or pulsar.TopicNotFound):
        call()
    took = time.monotonic() - t0
    assert took < FAST_S, f"refused after {took:.1f}s (the client retried instead of failing)"
    return took


def each_client_call(c: Any, topic: str) -> list[tuple[str, Callable[[], Any]]]:
    return [
        ("producer", lambda: c.create_producer(topic)),
        ("consumer", lambda: c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)),
        ("reader", lambda: c.create_reader(topic, pulsar.MessageId.earliest)),
        ("partitions", lambda: c.get_topic_partitions(topic)),
    ]


@pytest.mark.parametrize("url_kind", ["pulsar", "http"])
@pytest.mark.parametrize("missing", ["tenant", "namespace"])
def test_clients_of_a_missing_tenant_or_namespace_fail_at_once_and_nothing_is_created(
    bp: BrokerProcess, brokers: Brokers, zk: Any, missing: str, url_kind: str
) -> None:
    tenant = unique("tn") if missing == "tenant" else "public"
    ns = unique("ns")
    topic = f"persistent://{tenant}/{ns}/{unique('t')}"
    word = tenant if missing == "tenant" else ns
    root = brokers.bookies.root
    ledgers_before = ledger_count(zk, root)
    url = bp.service_url if url_kind == "pulsar" else f"http://127.0.0.1:{bp.http_port}"
    # The binary protocol answers TopicNotFound; over HTTP the broker answers 404 "Namespace not found", which
    # the C++-based client (as for every HTTP error status, with Pulsar's broker too) reports as ConnectError.
    error = pulsar.TopicNotFound if url_kind == "pulsar" else pulsar.ConnectError
    c = pulsar.Client(url, operation_timeout_seconds=OPERATION_TIMEOUT_S)
    try:
        for what, call in each_client_call(c, topic):
            took = refused_fast(call, error)
            print(f"{url_kind} {missing} {what}: {error.__name__} after {took:.2f}s")
        # the short form names the same topic
        refused_fast(lambda: c.create_producer(f"{tenant}/{ns}/short"), error)
    finally:
        c.close()
    assert znodes_naming(zk, root, word) == []
    assert ledger_count(zk, root) == ledgers_before
    if url_kind == "pulsar":  # the broker says why (the client logs the reason at warn level)
        log = bp.log_path.read_text()
        assert f"of {topic}: namespace not found" in log

    # created through the admin (a tenant first when it is new), the same calls work
    if missing == "tenant":
        assert admin(bp, "PUT", f"/admin/v2/tenants/{tenant}", {"allowedClusters": ["ledgerstore"]})[0] == 204
    assert admin(bp, "PUT", f"/admin/v2/namespaces/{tenant}/{ns}")[0] == 204
    c = pulsar.Client(url, operation_timeout_seconds=OPERATION_TIMEOUT_S)
    try:
        consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        reader = c.create_reader(topic, pulsar.MessageId.earliest)
        producer = c.create_producer(topic)
        producer.send(b"hello")
        assert consumer.receive(10_000).data() == b"hello"
        assert reader.read_next(10_000).data() == b"hello"
        assert c.get_topic_partitions(topic) == [topic]
    finally:
        c.close()
    assert admin(bp, "GET", f"/admin/v2/persistent/{tenant}/{ns}")[1] == [topic]


def test_each_command_naming_a_topic_of_a_missing_namespace_answers_topic_not_found(
    bp: BrokerProcess, brokers: Brokers, zk: Any
) -> None:
    """What the broker sends, command by command (the client stops at the first, PARTITIONED_METADATA):
    Pulsar's ``TopicNotFound`` "Namespace not found" in each answer's own form, and the connection goes on."""
    T = pb.BaseCommand
    ns = unique("ns")
    topic = f"persistent://public/{ns}/t"
    commands = [*topic_opening_commands(topic), T(type=T.PING, ping=pb.CommandPing())]
    s = socket.create_connection(("127.0.0.1", bp.port), timeout=10)
    try:
        connect = pb.CommandConnect(client_version="t", protocol_version=20)
        s.sendall(wire.encode_command(T(type=T.CONNECT, connect=connect)))
        dec = wire.FrameDecoder()
        frames = dec.feed(s.recv(65536))
        assert frames[0].command.type == T.CONNECTED
        s.sendall(b"".join(wire.encode_command(c) for c in commands))
        got: list[Any] = []
        while len([c for c in got if c.type != T.PONG]) < 4 or not any(c.type == T.PONG for c in got):
            data = s.recv(65536)
            assert data, "the broker closed the connection"
            got += [f.command for f in dec.feed(data)]
    finally:
        s.close()
    one = {c.type: c for c in got}
    pm = one[T.PARTITIONED_METADATA_RESPONSE].partitionMetadataResponse
    assert (pm.request_id, pm.response, pm.error, pm.message) == (
        1,
        pb.CommandPartitionedTopicMetadataResponse.Failed,
        pb.TopicNotFound,
        "Namespace not found",
    )
    lk = one[T.LOOKUP_RESPONSE].lookupTopicResponse
    assert (lk.request_id, lk.response, lk.error, lk.message) == (
        2,
        pb.CommandLookupTopicResponse.Failed,
        pb.TopicNotFound,
        "Namespace not found",
    )
    errors = {c.error.request_id: (c.error.error, c.error.message) for c in got if c.type == T.ERROR}
    assert errors == {
        3: (pb.TopicNotFound, "Namespace not found"),
        4: (pb.TopicNotFound, "Namespace not found"),
    }
    log = bp.log_path.read_text()
    assert log.count(f"{topic}: namespace not found") >= 2
    assert log.count(f"Namespace not found: public/{ns} (topic {topic})") == 2  # PRODUCER and SUBSCRIBE
    assert znodes_naming(zk, brokers.bookies.root, ns) == []


def test_the_admin_refuses_topic_calls_in_a_missing_namespace_with_404(
    bp: BrokerProcess, zk: Any, brokers: Brokers
) -> None:
    ns = unique("ns")
    t = f"/admin/v2/persistent/public/{ns}/t"
    not_found = {"reason": "Namespace not found"}
    schema = {"type": "STRING", "schema": "", "properties": {}}
    # method, path (after the topic's), body
    calls: list[tuple[str, str, Any]] = [
        (method, t + suffix, None)
        for method, _, suffix in (
            line.strip().partition(" ")
            for line in """PUT
            GET /partitions
            DELETE
            DELETE /partitions
            GET /stats
            GET /partitioned-stats
            GET /internalStats
            GET /lastMessageId
            GET /subscriptions
            PUT /subscription/s
            DELETE /subscription/s
            POST /subscription/s/skip_all
            POST /subscription/s/resetcursor/0
            POST /subscription/s/skip/1
            GET /subscription/s/position/1
            POST /subscription/s/expireMessages/1
            POST /all_subscription/expireMessages/1
            POST /terminate
            PUT /unload
            GET /examinemessage
            GET /ledger/1/entry/0""".splitlines()
        )
    ]
    calls += [("PUT", t + "/partitions", 3), ("POST", t + "/partitions", 4)]
    calls += [("POST", f"/admin/v2/schemas/public/{ns}/t/schema", schema)]
    calls += [("GET", f"/admin/v2/schemas/public/{ns}/t/schema", None)]
    calls += [("GET", f"/lookup/v2/topic/persistent/public/{ns}/t", None)]
    for method, path, body in calls:
        assert admin(bp, method, path, body) == (404, not_found), (method, path)
    # the namespace's lists: Pulsar's other 404
    for path in (f"/admin/v2/persistent/public/{ns}", f"/admin/v2/persistent/public/{ns}/partitioned"):
        assert admin(bp, "GET", path) == (404, {"reason": "Namespace does not exist"}), path
    # a bad name is still a bad name (412), whatever its namespace
    assert admin(bp, "PUT", f"/admin/v2/persistent/public/{ns}/%01")[0] == 412
    assert znodes_naming(zk, brokers.bookies.root, ns) == []

    # created, the same calls reach the topic
    assert admin(bp, "PUT", f"/admin/v2/namespaces/public/{ns}")[0] == 204
    assert admin(bp, "PUT", t) == (204, None)
    assert admin(bp, "GET", t + "/stats")[0] == 200
    assert admin(bp, "GET", f"/lookup/v2/topic/persistent/public/{ns}/t")[0] == 200


def test_a_namespace_with_topics_cannot_be_deleted_and_an_empty_one_can(
    bp: BrokerProcess, brokers: Brokers, zk: Any
) -> None:
    tenant, ns = unique("tn"), unique("ns")
    assert admin(bp, "PUT", f"/admin/v2/tenants/{tenant}", {})[0] == 204
    assert admin(bp, "PUT", f"/admin/v2/namespaces/{tenant}/{ns}")[0] == 204
    base = f"/admin/v2/persistent/{tenant}/{ns}"
    c = pulsar.Client(bp.service_url, operation_timeout_seconds=OPERATION_TIMEOUT_S)
    try:
        c.create_producer(f"persistent://{tenant}/{ns}/plain").send(b"x")
    finally:
        c.close()
    assert admin(bp, "PUT", f"{base}/parted/partitions", 2)[0] == 204
    # topics (a plain one with a message, a partitioned one): 409, as Pulsar; so is the tenant's deletion
    assert admin(bp, "DELETE", f"/admin/v2/namespaces/{tenant}/{ns}") == (
        409,
        {"reason": "Cannot delete non empty namespace"},
    )
    assert admin(bp, "DELETE", f"/admin/v2/tenants/{tenant}")[0] == 409
    assert admin(bp, "DELETE", f"{base}/plain?force=true")[0] == 204
    assert admin(bp, "DELETE", f"/admin/v2/namespaces/{tenant}/{ns}")[0] == 409  # the partitioned one is left
    assert admin(bp, "DELETE", f"{base}/parted/partitions?force=true")[0] == 204
    assert admin(bp, "DELETE", f"/admin/v2/namespaces/{tenant}/{ns}")[0] == 204
    assert admin(bp, "DELETE", f"/admin/v2/tenants/{tenant}")[0] == 204
    assert znodes_naming(zk, brokers.bookies.root, tenant) == []  # nothing of it is left
    # gone: its topics are refused again
    c = pulsar.Client(bp.service_url, operation_timeout_seconds=OPERATION_TIMEOUT_S)
    try:
        refused_fast(lambda: c.create_producer(f"persistent://{tenant}/{ns}/plain"))
    finally:
        c.close()


def test_a_forced_namespace_delete_deletes_its_topics_and_clients_then_the_namespace(
    bp: BrokerProcess, brokers: Brokers, zk: Any
) -> None:
    """``pulsar-admin namespaces delete -f`` (``?force=true``): its topics (a plain one with a producer attached,
    a partitioned one with a consumer) are deleted with their clients closed, then the namespace: 204, nothing
    of it left, and the producer's reconnection makes no topic there again (before: 409 "Cannot delete non
    empty namespace", force ignored)."""
    tenant, ns = unique("tn"), unique("ns")
    assert admin(bp, "PUT", f"/admin/v2/tenants/{tenant}", {})[0] == 204
    assert admin(bp, "PUT", f"/admin/v2/namespaces/{tenant}/{ns}")[0] == 204
    assert admin(bp, "PUT", f"/admin/v2/persistent/{tenant}/{ns}/parted/partitions", 2)[0] == 204
    c = pulsar.Client(bp.service_url, operation_timeout_seconds=OPERATION_TIMEOUT_S)
    try:
        producer = c.create_producer(f"persistent://{tenant}/{ns}/plain", send_timeout_millis=3000)
        producer.send(b"x")
        c.subscribe(f"persistent://{tenant}/{ns}/parted", "s")
        # without force, as before
        assert admin(bp, "DELETE", f"/admin/v2/namespaces/{tenant}/{ns}")[0] == 409
        assert admin(bp, "DELETE", f"/admin/v2/namespaces/{tenant}/{ns}?force=true") == (204, None)
        assert admin(bp, "GET", f"/admin/v2/namespaces/{tenant}/{ns}")[0] == 404
        with pytest.raises(Exception):  # noqa: B017 (whichever refusal the client raises once it reconnects)
            producer.send(b"y")
    finally:
        c.close()
    assert admin(bp, "DELETE", f"/admin/v2/tenants/{tenant}")[0] == 204
    assert znodes_naming(zk, brokers.bookies.root, tenant) == []  # nothing of it is left


def test_a_refused_forced_namespace_delete_leaves_a_partitioned_topics_partitions(
    bp: BrokerProcess, brokers: Brokers
) -> None:
    """A forced namespace delete whose partitioned topic's delete is refused (another delete of that topic under
    way: 409 '... is being deleted') is answered 409 and leaves that topic whole. It went on to the namespace's
    other topics, among them the refused topic's partitions, and force-deleted each one by name: the topic kept
    its metadata and lost its data (before: 0 of the 4 messages read back)."""
    from urllib.parse import quote

    import zk as zkmod
    from topic_broker.names import TopicName

    tenant, ns = unique("tn"), unique("ns")
    topic = f"persistent://{tenant}/{ns}/parted"
    assert admin(bp, "PUT", f"/admin/v2/tenants/{tenant}", {})[0] == 204
    assert admin(bp, "PUT", f"/admin/v2/namespaces/{tenant}/{ns}")[0] == 204
    assert admin(bp, "PUT", f"/admin/v2/persistent/{tenant}/{ns}/parted/partitions", 2)[0] == 204
    sent = [f"m{i}".encode() for i in range(4)]
    c = pulsar.Client(bp.service_url, operation_timeout_seconds=OPERATION_TIMEOUT_S)
    try:
        c.subscribe(topic, "s").close()
        producer = c.create_producer(topic, batching_enabled=False)
        for m in sent:
            producer.send(m)
        producer.close()
    finally:
        c.close()
    other = zkmod.MetadataStore.connect(brokers.bookies.zk, root=brokers.bookies.root)
    try:
        ml = TopicName.parse(topic).ml_name
        other.create(f"deleting/{quote(f'partitioned/{ml}', safe='')}", {"broker": "another"}, ephemeral=True)
        status, body = admin(bp, "DELETE", f"/admin/v2/namespaces/{tenant}/{ns}?force=true")
        assert status == 409 and "is being deleted" in body["reason"], (status, body)
    finally:
        other.close()
    c = pulsar.Client(bp.service_url, operation_timeout_seconds=OPERATION_TIMEOUT_S)
    try:
        consumer = c.subscribe(topic, "s")
        got = []
        for _ in sent:
            try:
                got.append(consumer.receive(timeout_millis=5000).data())
            except Exception:  # noqa: BLE001 (pulsar.Timeout: nothing more to read)
                break
        assert sorted(got) == sent, f"{len(got)} of {len(sent)} messages read back: {got}"
    finally:
        c.close()
    assert admin(bp, "DELETE", f"/admin/v2/namespaces/{tenant}/{ns}?force=true")[0] == 204


def test_a_forced_tenant_delete_deletes_its_namespaces_and_their_topics(
    bp: BrokerProcess, brokers: Brokers, zk: Any
) -> None:
    """``pulsar-admin tenants delete -f`` (``?force=true``): each namespace is deleted with force (a topic with
    a message in one, the other empty), then the tenant: 204 and nothing of it left (before: 409 "The tenant
    still has namespaces", force ignored)."""
    tenant = unique("tn")
    assert admin(bp, "PUT", f"/admin/v2/tenants/{tenant}", {})[0] == 204
    for ns in ("a", "b"):
        assert admin(bp, "PUT", f"/admin/v2/namespaces/{tenant}/{ns}")[0] == 204
    c = pulsar.Client(bp.service_url, operation_timeout_seconds=OPERATION_TIMEOUT_S)
    try:
        c.create_producer(f"persistent://{tenant}/a/t").send(b"x")
    finally:
        c.close()
    assert admin(bp, "DELETE", f"/admin/v2/tenants/{tenant}")[0] == 409  # without force, as before
    assert admin(bp, "DELETE", f"/admin/v2/tenants/{tenant}?force=true") == (204, None)
    assert admin(bp, "GET", f"/admin/v2/tenants/{tenant}")[0] == 404
    assert znodes_naming(zk, brokers.bookies.root, tenant) == []


def test_the_cli_creates_lists_and_deletes_tenants_and_namespaces(bp: BrokerProcess) -> None:
    """``ledgerstore tenant …`` and ``ledgerstore namespace …`` (pulsar-admin's ``tenants`` and ``namespaces``);
    ``topic produce`` into a namespace that does not exist says so and how to create it (exit 4, not found)."""
    web, svc = f"http://127.0.0.1:{bp.http_port}", bp.service_url

    def cli(*args: str) -> tuple[int, Any]:
        r = subprocess.run(
            [sys.executable, "-m", "ledgerstore.cli", *args, "--url", web, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return r.returncode, json.loads(r.stdout) if r.stdout.strip() else r.stderr

    tenant, ns = unique("cli"), unique("ns")
    code, out = cli("topic", "produce", f"{tenant}/{ns}/t", "--service-url", svc, "-m", "x")
    assert code == 4, out
    why = out["error"]["message"]
    assert "TopicNotFound" in why and f"ledgerstore namespace create {tenant}/{ns}" in why, why
    assert cli("namespace", "create", f"{tenant}/{ns}")[0] == 4  # its tenant first
    assert cli("tenant", "create", tenant) == (0, {"tenant": tenant, "created": True})
    assert tenant in cli("tenant", "list")[1]["tenants"]
    assert cli("namespace", "create", f"{tenant}/{ns}") == (
        0,
        {"namespace": f"{tenant}/{ns}", "created": True},
    )
    assert cli("namespace", "list", tenant)[1]["namespaces"] == [f"{tenant}/{ns}"]
    assert cli("namespace", "create", "no-slash")[0] == 2
    code, out = cli("topic", "produce", f"{tenant}/{ns}/t", "--service-url", svc, "-m", "x")
    assert code == 0 and out["produced"] == 1, out
    code, out = cli("namespace", "delete", f"{tenant}/{ns}")
    assert code == 1 and "409 Cannot delete non empty namespace" in out["error"]["message"], out
    assert cli("tenant", "delete", tenant)[0] == 1  # it has a namespace
    assert cli("topic", "delete", f"{tenant}/{ns}/t")[0] == 0
    assert cli("namespace", "delete", f"{tenant}/{ns}") == (
        0,
        {"namespace": f"{tenant}/{ns}", "deleted": True},
    )
    assert cli("tenant", "delete", tenant) == (0, {"tenant": tenant, "deleted": True})
    assert tenant not in cli("tenant", "list")[1]["tenants"]


def test_topic_produce_and_consume_through_an_http_service_url_name_a_missing_namespace(
    bp: BrokerProcess,
) -> None:
    """Through an http:// service URL pulsar-client reports the broker's 404 "Namespace not found" as
    ConnectError (as with Pulsar's broker), so ``topic produce``/``consume`` said only 'failed: ConnectError'
    (exit 1), as for a broker that is down; they say that the namespace does not exist and how to create it
    (exit 4), as through a pulsar:// URL."""
    web = f"http://127.0.0.1:{bp.http_port}"
    tenant, ns = unique("cli"), unique("ns")
    for verb, extra in (("produce", ["-m", "x"]), ("consume", ["-s", "sub", "-n", "1"])):
        r = subprocess.run(
            [sys.executable, "-m", "ledgerstore.cli", "topic", verb, f"{tenant}/{ns}/t"]
            + ["--service-url", web, "--url", web, "--timeout-s", "20", *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 4, (verb, r.stdout, r.stderr)
        assert f"the namespace {tenant}/{ns} does not exist" in r.stderr, (verb, r.stderr)
        assert f"ledgerstore namespace create {tenant}/{ns}" in r.stderr, (verb, r.stderr)


@pytest.mark.parametrize("url_kind", ["pulsar", "http"])
def test_a_non_persistent_topic_is_refused_with_not_allowed_through_either_service_url_whatever_its_namespace(
    bp: BrokerProcess, brokers: Brokers, zk: Any, url_kind: str
) -> None:
    """non-persistent:// topics are not served. Through a pulsar:// URL the broker refuses the name with
    NotAllowedError at once, in any namespace. Through an http:// URL pulsar-client first asks
    ``/admin/v2/non-persistent/…/partitions`` and the HTTP lookup, and reports any error status there as
    ConnectError (a broker that seems down): the lookup answered 404 "Namespace not found" in a missing namespace
    and 412 in an existing one, and the partitions call had no route (404). Both now answer (0 partitions, this
    broker's URLs, nothing written) so that the client asks over the binary protocol, which refuses the name:
    NotAllowedError at once there too."""
    ns = unique("ns")
    url = bp.service_url if url_kind == "pulsar" else f"http://127.0.0.1:{bp.http_port}"
    c = pulsar.Client(url, operation_timeout_seconds=OPERATION_TIMEOUT_S)
    try:
        for namespace in (f"public/{ns}", "public/default"):
            topic = f"non-persistent://{namespace}/{unique('np')}"
            for what, call in each_client_call(c, topic):
                if what == "partitions" and url_kind == "http":
                    # answered from the HTTP partitions call alone (0: the topic itself), no broker refusal
                    assert c.get_topic_partitions(topic) == [topic]
                    continue
                took = refused_fast(call, pulsar.NotAllowedError)
                print(f"{url_kind} {namespace} {what}: NotAllowedError after {took:.2f}s")
    finally:
        c.close()
    # the HTTP answers, whatever the namespace; nothing is owned or written for such a topic
    for namespace in (f"public/{ns}", "public/default"):
        status, body = admin(bp, "GET", f"/lookup/v2/topic/non-persistent/{namespace}/np")
        assert (status, body["brokerUrl"], body["httpUrl"]) == (
            200,
            bp.service_url,
            f"http://127.0.0.1:{bp.http_port}",
        )
        assert admin(bp, "GET", f"/admin/v2/non-persistent/{namespace}/np/partitions") == (
            200,
            {"partitions": 0},
        )
    assert znodes_naming(zk, brokers.bookies.root, ns) == []
    assert not zk.exists(f"{brokers.bookies.root}/ownership/public/default/non-persistent")
    # a bad name is still 412; a persistent topic of the missing namespace is still Pulsar's 404
    assert admin(bp, "GET", "/lookup/v2/topic/non-persistent/public/default/%01")[0] == 412
    assert admin(bp, "GET", f"/admin/v2/non-persistent/public/{ns}/%01/partitions")[0] == 412
    assert admin(bp, "GET", f"/lookup/v2/topic/persistent/public/{ns}/t") == (
        404,
        {"reason": "Namespace not found"},
    )
    assert admin(bp, "GET", f"/lookup/v2/topic/other/public/{ns}/t")[0] == 412


def test_each_request_reads_its_namespace_policies_once(brokers: Brokers) -> None:
    """With --auth-required a lookup needs the namespace's existence and the role's permission, a producer
    the permission and the open; the admin its namespace check and the open: one read of the policies each
    (they were read twice). An in-process broker beside the module's, its reads of them counted."""
    import os

    from bookie.auth import create_token
    from topic_broker.admin import AdminServer
    from topic_broker.server import BrokerServer

    secret = os.urandom(32)
    with in_process_broker(
        brokers,
        tick_interval_s=3600.0,  # no policy refresh meanwhile
        auth_secret=secret,
        auth_required=True,
        superuser_roles=("admin",),
    ) as (service, run):
        config = service.config
        server, http = BrokerServer(service), AdminServer(service)
        run(server.start())
        run(http.start())
        ns = unique("ns")
        reads: list[str] = []
        assert service.meta is not None
        read_policies = service.meta.get_policies

        async def counted(tenant: str, namespace: str) -> Any:
            if namespace == ns:
                reads.append(namespace)
            return await read_policies(tenant, namespace)

        service.meta.get_policies = counted  # type: ignore[method-assign]

        def call(method: str, path: str, body: Any = None) -> int:
            req = urllib.request.Request(
                f"http://127.0.0.1:{config.http_port}{path}",
                data=None if body is None else json.dumps(body).encode(),
                method=method,
                headers={
                    "Authorization": f"Bearer {create_token(secret, 'admin')}",
                    "Content-Type": "application/json",
                },
            )
            with urllib.request.urlopen(req, timeout=30) as r:
                return int(r.status)

        c = pulsar.Client(
            config.service_url,
            authentication=pulsar.AuthenticationToken(create_token(secret, "app")),
            operation_timeout_seconds=OPERATION_TIMEOUT_S,
        )
        try:
            assert call("PUT", f"/admin/v2/namespaces/public/{ns}") == 204
            assert call("POST", f"/admin/v2/namespaces/public/{ns}/permissions/app", ["produce"]) == 204
            reads.clear()
            # PARTITIONED_METADATA, LOOKUP, PRODUCER
            c.create_producer(f"persistent://public/{ns}/t").send(b"x")
            assert len(reads) == 3, reads
            reads.clear()
            assert call("PUT", f"/admin/v2/persistent/public/{ns}/u") == 204  # created, not open
            reads.clear()
            assert call("GET", f"/admin/v2/persistent/public/{ns}/u/stats") == 200  # check, then open
            assert len(reads) == 1, reads
        finally:
            c.close()
            run(http.stop())
            run(server.stop())


def test_a_forced_tenant_delete_waits_for_a_slow_namespace_delete_and_names_a_failed_one(
    brokers: Brokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forced tenant delete's nested namespace delete is not bound by the admin session's bound on a call
    (:data:`ADMIN_CALL_TIMEOUT_S`, 60 s, made 1 s here): a namespace whose forced delete takes 2 s is deleted and the
    tenant with it (before: 500 "internal error: ", nothing naming the namespace, while its delete went on). A
    nested call that fails to answer (its own bound made 0.5 s here) is answered naming the namespace."""
    import asyncio

    from topic_broker import admin as admin_mod
    from topic_broker.admin import AdminServer

    monkeypatch.setattr(admin_mod, "ADMIN_CALL_TIMEOUT_S", 1.0)
    with in_process_broker(
        brokers, force_delete_namespace_allowed=True, force_delete_tenant_allowed=True
    ) as (service, run):
        http = AdminServer(service)
        run(http.start())
        slow = http.admin._delete_namespace_topics

        async def slow_delete(*a: Any) -> None:
            await asyncio.sleep(2.0)
            await slow(*a)

        http.admin._delete_namespace_topics = slow_delete  # type: ignore[method-assign]
        bp_like = type("P", (), {"http_port": service.config.http_port})()
        try:
            for tenant in (t1 := unique("tslow"), t2 := unique("tfail")):
                assert admin(bp_like, "PUT", f"/admin/v2/tenants/{tenant}", {})[0] == 204
                assert admin(bp_like, "PUT", f"/admin/v2/namespaces/{tenant}/a")[0] == 204
            assert admin(bp_like, "DELETE", f"/admin/v2/tenants/{t1}?force=true") == (204, None)
            assert admin(bp_like, "GET", f"/admin/v2/tenants/{t1}")[0] == 404
            monkeypatch.setattr(admin_mod, "NAMESPACE_DELETE_TIMEOUT_S", 0.5)
            status, body = admin(bp_like, "DELETE", f"/admin/v2/tenants/{t2}?force=true")
            assert status == 500, (status, body)
            assert body["reason"].startswith(
                f"namespace {t2}/a: its forced delete did not answer (Timeout"
            ), body
            time.sleep(3.0)  # (its delete, still under way, finishes)
            assert admin(bp_like, "DELETE", f"/admin/v2/tenants/{t2}") == (204, None)
        finally:
            run(http.stop())
