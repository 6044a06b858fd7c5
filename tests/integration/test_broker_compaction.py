"""Topic compaction as users of the official ``pulsar-client`` meet it: TableView, readers and consumers with
``is_read_compacted=True``, the admin's compaction trigger and status. One broker on 3 bookies is shared by
the module (broker tests are slow); every test uses its own topics and every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ledger_client import BookKeeper, ClientConfig
from ledger_client.errors import NoSuchLedgerError
from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, module_cluster
from tests.integration.test_broker_admin import ledgerstore
from tests.integration.test_broker_client_features3 import admin
from tests.integration.test_broker_pulsar_client import _connect, _raw, client, topic_name
from tests.integration.test_broker_retention import unreadable
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.compaction import TEST_PAUSE_ENV

pulsar = pytest.importorskip("pulsar")
T = pb.BaseCommand


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    """3 bookies and a broker for the module; one test starts a second broker and restarts the first."""
    with module_cluster(zk_server, tmp_path_factory.mktemp("compaction")) as b:
        yield b


@pytest.fixture
def c(brokers: Brokers) -> Iterator[Any]:
    """A pulsar-client on the module's (first) broker, closed after the test."""
    with contextlib.closing(client(brokers.procs[0])) as cl:
        yield cl


def wait_for(what: str, cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def table(view: Any) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    view.for_each(lambda k, v: out.__setitem__(k, v))
    return out


def send_all(producer: Any, items: list[tuple[str | None, bytes]]) -> None:
    for key, value in items:
        if key is None:
            producer.send(value)
        else:
            producer.send(value, partition_key=key)


def test_table_view_reads_the_latest_value_per_key_and_follows_updates(c: Any) -> None:
    t = topic_name()
    p = c.create_producer(t, batching_enabled=False)
    send_all(p, [("a", b"1"), ("b", b"1"), ("a", b"2"), ("c", b"1"), ("c", b"")])
    view = c.create_table_view(t)
    try:
        assert table(view) == {"a": b"2", "b": b"1"}  # the tombstone removed c
        send_all(p, [("b", b"2"), ("d", b"1")])
        wait_for("the later updates", lambda: table(view) == {"a": b"2", "b": b"2", "d": b"1"})
        assert view.get("b") == b"2"
    finally:
        view.close()


def topic_path(t: str) -> str:
    return f"/admin/v2/persistent/public/default/{t}"


def compact(bp: BrokerProcess, t: str) -> None:
    """Trigger a compaction through the admin REST and wait for its SUCCESS."""
    assert admin(bp, "GET", topic_path(t) + "/compaction")["status"] in ("NOT_RUN", "SUCCESS")
    admin(bp, "PUT", topic_path(t) + "/compaction")
    status: dict[str, Any] = {}

    def done() -> bool:
        status.update(admin(bp, "GET", topic_path(t) + "/compaction"))
        return status["status"] != "RUNNING"

    wait_for("the compaction", done)
    assert status == {"status": "SUCCESS", "lastError": ""}


def read_compacted(c: Any, t: str) -> list[tuple[str, bytes, str]]:
    """(key, value, message id) of everything a compacted reader from the earliest message reads."""
    r = c.create_reader(t, pulsar.MessageId.earliest, is_read_compacted=True)
    try:
        out = []
        while r.has_message_available():
            m = r.read_next(timeout_millis=10_000)
            out.append((m.partition_key(), m.data(), str(m.message_id())))
        return out
    finally:
        r.close()


def test_compaction_keeps_the_latest_message_per_key_with_its_original_id(c: Any, brokers: Brokers) -> None:
    bp = brokers.procs[0]
    t = topic_name()
    p = c.create_producer(t, batching_enabled=False)
    send_all(p, [("a", b"1"), ("b", b"1"), ("a", b"2"), (None, b"keyless"), ("c", b"1"), ("c", b"")])
    bp_ = c.create_producer(
        t, batching_enabled=True, batching_max_messages=3, batching_max_publish_delay_ms=60_000
    )
    for key, value in [("d", b"1"), ("e", b"1"), ("d", b"2")]:  # one batch entry
        bp_.send_async(value, None, partition_key=key)
    bp_.flush()
    whole = read_compacted(c, t)  # not compacted yet: the whole topic
    assert [(k, v) for k, v, _ in whole] == [
        ("a", b"1"), ("b", b"1"), ("a", b"2"), ("", b"keyless"), ("c", b"1"), ("c", b""),
        ("d", b"1"), ("e", b"1"), ("d", b"2"),
    ]  # fmt: skip
    ids = {(k, v): mid for k, v, mid in whole}
    stats = admin(bp, "GET", topic_path(t) + "/internalStats")
    assert stats["compactedLedger"]["ledgerId"] == -1
    compact(bp, t)
    expected = [("b", b"1"), ("a", b"2"), ("", b"keyless"), ("e", b"1"), ("d", b"2")]
    got = read_compacted(c, t)
    assert [(k, v) for k, v, _ in got] == expected
    assert [mid for _, _, mid in got] == [ids[kv] for kv in expected]  # the original ids, batch indexes too
    first = admin(bp, "GET", topic_path(t) + "/internalStats")["compactedLedger"]
    assert first["ledgerId"] >= 0 and first["entries"] == 4  # b, a, keyless, the batch
    # a reader without read_compacted still reads everything; later messages follow the compacted view
    plain = c.create_reader(t, pulsar.MessageId.earliest)
    assert len([plain.read_next(10_000) for _ in range(9)]) == 9
    plain.close()
    send_all(p, [("f", b"1"), ("a", b"3"), ("b", b"")])
    got = read_compacted(c, t)
    assert [(k, v) for k, v, _ in got] == [*expected, ("f", b"1"), ("a", b"3"), ("b", b"")]
    # a second compaction: the previous compacted view plus what came after it, its ledger replaced
    compact(bp, t)
    got = read_compacted(c, t)
    assert [(k, v) for k, v, _ in got] == [
        ("", b"keyless"),
        ("e", b"1"),
        ("d", b"2"),
        ("f", b"1"),
        ("a", b"3"),
    ]
    second = admin(bp, "GET", topic_path(t) + "/internalStats")["compactedLedger"]
    assert second["ledgerId"] not in (-1, first["ledgerId"])
    answers = unreadable(brokers.bookies, [first["ledgerId"], second["ledgerId"]])
    assert answers[first["ledgerId"]] == "NoSuchLedger"  # the previous compacted ledger is deleted
    assert answers[second["ledgerId"]].startswith("opened")
    subs = admin(bp, "GET", topic_path(t) + "/subscriptions")
    assert "__compaction" in subs


def compacted_consumer(c: Any, bp: BrokerProcess) -> tuple[str, Any, list[Any]]:
    """A topic of 4 keyed messages compacted (k's first two removed) and one more after the horizon, and an
    Exclusive compacted consumer from the earliest that received its 3 messages."""
    t = topic_name()
    p = c.create_producer(t, batching_enabled=False)
    send_all(p, [("k", b"1"), ("k", b"2"), ("j", b"1"), ("k", b"3")])
    compact(bp, t)
    send_all(p, [("j", b"2")])
    cons = c.subscribe(t, "s", is_read_compacted=True, initial_position=pulsar.InitialPosition.Earliest)
    got = [cons.receive(10_000) for _ in range(3)]
    assert [(m.partition_key(), m.data()) for m in got] == [("j", b"1"), ("k", b"3"), ("j", b"2")]
    return t, cons, got


def test_compacted_consumer_acks_seeks_and_shared_is_refused(c: Any, brokers: Brokers) -> None:
    bp = brokers.procs[0]
    t, cons, got = compacted_consumer(c, bp)
    cons.acknowledge(got[0])
    cons.seek(pulsar.MessageId.earliest)  # back to the compacted start
    again = [cons.receive(10_000) for _ in range(3)]
    assert [m.data() for m in again] == [b"1", b"3", b"2"]
    cons.acknowledge_cumulative(again[-1])
    cons.close()
    cons = c.subscribe(t, "s", is_read_compacted=True)
    with pytest.raises(pulsar.Timeout):
        cons.receive(1000)  # all acknowledged
    cons.close()
    for sub_type in (pulsar.ConsumerType.Shared, pulsar.ConsumerType.KeyShared):
        with pytest.raises(pulsar.InvalidConfiguration):  # the client refuses it before the broker would
            c.subscribe(t, "shared", consumer_type=sub_type, is_read_compacted=True)
    s = _raw(bp)
    try:
        _connect(s)
        sub = pb.CommandSubscribe(
            topic=f"persistent://public/default/{t}",
            subscription="shared",
            subType=pb.CommandSubscribe.Shared,
            consumer_id=1,
            request_id=7,
            read_compacted=True,
        )
        s.sendall(wire.encode_command(T(type=T.SUBSCRIBE, subscribe=sub)))
        frames = wire.FrameDecoder().feed(s.recv(65536))
        assert frames[0].command.type == T.ERROR
        assert frames[0].command.error.error == pb.NotAllowedError
        assert "failover or exclusive" in frames[0].command.error.message
    finally:
        s.close()


def test_table_view_after_compaction_a_move_and_a_broker_restart(c: Any, brokers: Brokers) -> None:
    bp = brokers.procs[0]
    t = topic_name()
    p = c.create_producer(t, batching_enabled=False)
    send_all(p, [("a", b"1"), ("b", b"1"), ("a", b"2"), ("b", b""), ("c", b"1")])
    compact(bp, t)
    send_all(p, [("c", b"2")])
    view = c.create_table_view(t)
    try:
        assert table(view) == {"a": b"2", "c": b"2"}
        send_all(p, [("d", b"1")])
        wait_for("a later update", lambda: table(view) == {"a": b"2", "c": b"2", "d": b"1"})
    finally:
        view.close()
    before = admin(bp, "GET", topic_path(t) + "/internalStats")["compactedLedger"]
    p.close()

    def served_by(owner: BrokerProcess) -> None:
        """The owner serves the compacted view the __compaction cursor records, TableView included."""
        with contextlib.closing(client(owner)) as cl:
            got = read_compacted(cl, t)
            assert [(k, v) for k, v, _ in got] == [("a", b"2"), ("c", b"1"), ("c", b"2"), ("d", b"1")]
            assert admin(owner, "GET", topic_path(t) + "/internalStats")["compactedLedger"] == before
            tv = cl.create_table_view(t)
            assert table(tv) == {"a": b"2", "c": b"2", "d": b"1"}
            tv.close()

    other = brokers.start()  # the topic moves: unloaded here, taken by the other broker's lookup
    try:
        admin(bp, "PUT", topic_path(t) + "/unload")
        served_by(other)
        admin(other, "PUT", topic_path(t) + "/unload")
    finally:
        other.stop()
        brokers.procs.remove(other)
    bp.restart()  # and back after a restart
    served_by(bp)


def test_cli_compacts_each_partition_and_reports_its_status(c: Any, brokers: Brokers) -> None:
    bp = brokers.procs[0]
    t = topic_name()
    admin(bp, "PUT", topic_path(t) + "/partitions", 2)
    p = c.create_producer(t, batching_enabled=False)
    send_all(p, [(k, v) for v in (b"1", b"2") for k in ("a", "b", "c", "d")])
    urls = ["--url", f"http://127.0.0.1:{bp.http_port}"]
    r = ledgerstore("topic", "compact", t, "--wait", *urls, "--json")
    assert r.returncode == 0, r.stderr
    statuses = json.loads(r.stdout)
    assert sorted(statuses) == [f"persistent://public/default/{t}-partition-{i}" for i in range(2)]
    assert {s["status"] for s in statuses.values()} == {"SUCCESS"}
    view = c.create_table_view(t)
    try:
        assert table(view) == {"a": b"2", "b": b"2", "c": b"2", "d": b"2"}
    finally:
        view.close()
    r = ledgerstore("topic", "compaction-status", t, *urls)
    assert r.returncode == 0 and r.stdout.count(": SUCCESS") == 2


def test_retention_trims_only_what_the_compacted_ledger_covers(c: Any, brokers: Brokers) -> None:
    bp = brokers.procs[0]
    t = topic_name()
    p = c.create_producer(t, batching_enabled=False)

    def ledgers() -> list[int]:
        return [li["ledgerId"] for li in admin(bp, "GET", topic_path(t) + "/internalStats")["ledgers"]]

    send_all(p, [("a", b"1"), ("b", b"1"), ("a", b"2")])
    compact(bp, t)
    first = ledgers()[0]
    for key in (
        "c",
        "d",
    ):  # each unload closes the current ledger: three ledgers, the first before the horizon
        admin(bp, "PUT", topic_path(t) + "/unload")
        send_all(p, [(key, b"1")])
    second = ledgers()[1]
    # no subscription but __compaction: the ledger before the horizon goes, the one after it stays (same pass)
    wait_for("retention to trim the compacted ledger's part", lambda: first not in ledgers(), 60)
    assert second in ledgers()
    plain = c.create_reader(t, pulsar.MessageId.earliest)
    assert plain.read_next(10_000).partition_key() == "c"  # the topic itself starts after the trimmed ledger
    plain.close()
    compacted = [("b", b"1"), ("a", b"2"), ("c", b"1"), ("d", b"1")]
    assert [(k, v) for k, v, _ in read_compacted(c, t)] == compacted
    compact(bp, t)  # the horizon moves past the second ledger: it may go now
    wait_for("retention to trim the second ledger", lambda: second not in ledgers(), 60)
    assert [(k, v) for k, v, _ in read_compacted(c, t)] == compacted


def test_a_compacted_consumer_that_acks_each_message_leaves_no_backlog(c: Any, brokers: Brokers) -> None:
    """Individual acks of a compacted consumer's messages: the ids compaction removed between them were never
    delivered, so nobody acks them; they must not hold the subscription's mark-delete (its backlog, and the
    ledgers retention keeps for it) back for ever."""
    bp = brokers.procs[0]
    t, cons, got = compacted_consumer(c, bp)
    for m in got:
        cons.acknowledge(m)

    def backlog() -> int:
        return int(admin(bp, "GET", topic_path(t) + "/stats")["subscriptions"]["s"]["msgBacklog"])

    wait_for("the subscription's backlog to drain", lambda: backlog() == 0)
    cons.close()


def test_a_message_compacted_away_before_its_redelivery_counts_as_acknowledged(
    c: Any, brokers: Brokers
) -> None:
    """A compacted consumer's message read from the topic after the horizon, not acked, then removed by the next
    compaction: redelivered, it is not there, so nobody can ack it; it must not hold the backlog."""
    bp = brokers.procs[0]
    t, cons, got = compacted_consumer(c, bp)  # j1, k3 from the compacted ledger, j2 from the topic
    cons.acknowledge(got[0])
    cons.acknowledge(got[1])  # j2 is not acknowledged
    p = c.create_producer(t, batching_enabled=False)
    send_all(p, [("j", b"3")])
    j3 = cons.receive(10_000)
    assert j3.data() == b"3"
    cons.acknowledge(j3)
    compact(bp, t)  # j2 removed
    cons.redeliver_unacknowledged_messages()
    with pytest.raises(pulsar.Timeout):
        cons.receive(2000)  # j2 is gone

    def backlog() -> int:
        return int(admin(bp, "GET", topic_path(t) + "/stats")["subscriptions"]["s"]["msgBacklog"])

    wait_for("the subscription's backlog to drain", lambda: backlog() == 0)
    cons.close()


def compacted_ledgers(bookies: Any, t: str) -> set[int]:
    """The ledgers of ZooKeeper's ledger list that are compacted ledgers of topic ``t`` (their custom metadata)."""

    async def go() -> set[int]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            out = set()
            for lid in await bk.list_ledgers():
                try:
                    custom = (await bk.ledger_metadata(lid)).custom_metadata
                except NoSuchLedgerError:
                    continue
                ml = custom.get("managed-ledger", b"").decode()
                if custom.get("component") == b"compacted-ledger" and ml.endswith(f"/{t}"):
                    out.add(lid)
            return out
        finally:
            await bk.close()

    return asyncio.run(go())


@pytest.mark.parametrize("point", ["after-create", "after-record"])
def test_a_broker_killed_in_the_middle_of_a_compaction_leaves_no_ledger(
    c: Any, brokers: Brokers, point: str
) -> None:
    """A broker killed (SIGKILL) once its compaction created its ledger, or once it recorded it (the previous
    compacted ledger not deleted yet): the next owner says SUCCESS (compacted before) and deletes what was left
    when it loads the topic, so that the ledger list holds the compacted ledger in force only, and so it does
    after the next owner's compaction."""
    bp = brokers.procs[0]
    t = topic_name()
    p = c.create_producer(t, batching_enabled=False)
    send_all(p, [("a", b"1"), ("b", b"1"), ("a", b"2")])
    compact(bp, t)
    first = admin(bp, "GET", topic_path(t) + "/internalStats")["compactedLedger"]["ledgerId"]
    send_all(p, [("b", b"2"), ("c", b"1")])
    p.close()
    paused = brokers.start(env={TEST_PAUSE_ENV: point})
    try:

        def owned_by_paused() -> bool:  # unloaded from its owner, then taken by the paused broker's lookup
            lookup = admin(paused, "GET", f"/lookup/v2/topic/persistent/public/default/{t}")
            if lookup["brokerUrl"] == paused.service_url:
                return True
            admin(bp, "PUT", topic_path(t) + "/unload")
            return False

        wait_for("the topic on the paused broker", owned_by_paused)
        admin(paused, "PUT", topic_path(t) + "/compaction")
        found: list[str] = []

        def paused_there() -> bool:
            found[:] = re.findall(f"paused {point} of ledger (\\d+)", paused.log_tail(200))
            return bool(found)

        wait_for("the compaction to pause", paused_there)
        written = int(found[0])
        assert compacted_ledgers(brokers.bookies, t) == {first, written}
        paused.kill9()
    finally:
        paused.kill9()
        brokers.procs.remove(paused)

    def taken_over() -> bool:
        try:
            return status(bp) == "SUCCESS"  # recorded: compacted before, whatever the broker's memory says
        except OSError:
            return False  # redirected to the killed owner until its ZooKeeper session expires

    def status(owner: BrokerProcess) -> str:
        return str(admin(owner, "GET", topic_path(t) + "/compaction")["status"])

    wait_for("the topic on the first broker", taken_over, timeout_s=60)
    adopted = admin(bp, "GET", topic_path(t) + "/internalStats")["compactedLedger"]["ledgerId"]
    assert adopted == (first if point == "after-create" else written)
    # what was left is deleted when the topic is loaded, without a compaction
    wait_for("the leftover's deletion", lambda: compacted_ledgers(brokers.bookies, t) == {adopted})
    with contextlib.closing(client(bp)) as cl:
        send_all(cl.create_producer(t, batching_enabled=False), [("d", b"1")])
        compact(bp, t)
        now = admin(bp, "GET", topic_path(t) + "/internalStats")["compactedLedger"]["ledgerId"]
        assert compacted_ledgers(brokers.bookies, t) == {now}
        got = [(k, v) for k, v, _ in read_compacted(cl, t)]
        assert got == [("a", b"2"), ("b", b"2"), ("c", b"1"), ("d", b"1")]
