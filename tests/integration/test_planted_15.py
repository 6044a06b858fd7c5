"""Tests for the bugs planted in the audit of 89e0dc0..856c42e (docs/architecture.md §11) that the tests of the
time let through: each fails with its bug planted and passes without it. Real ZooKeeper, bookies and brokers."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pulsar
import pytest

import zk
from ledgerstore.cluster import free_port
from tests.broker_testing import Brokers, cluster, swapped  # noqa: F401
from tests.integration.test_backlog_age_quota import _namespace, bp  # noqa: F401
from tests.integration.test_broker_client_features3 import admin
from tests.integration.test_broker_gone_connection import _serving
from tests.integration.test_broker_pulsar_client import client
from tests.integration.test_cluster_cli import _ls
from tests.integration.test_namespace_delete_races import _namespace_on_a_broker, _status
from tests.zk_testing import wait_for
from topic_broker.names import TopicName


def age_quota_topic(service: Any, run: Any, prefix: str) -> tuple[str, pulsar.Client]:
    """A message_age quota of 1 s, producer_exception, on public/default of the in-process broker ``service``
    (``run`` runs on its loop), a new topic's name there and a pulsar-client of that broker."""
    from zk.managed_ledgers import BacklogQuota

    quota = BacklogQuota(limit_time=1, policy="producer_exception")
    run(
        service.meta.update_policies(
            "public", "default", lambda q: dataclasses.replace(q, message_age_quota=quota)
        )
    )
    name = f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:8]}"
    return name, pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)


def test_a_namespace_delete_under_way_on_another_broker_is_not_taken_over(cluster: Brokers) -> None:  # noqa: F811
    """The ephemeral deleting/<namespace> znode of another ZooKeeper session (another broker's delete under way)
    makes this broker's delete 409 '… is being deleted' and is left as it is: only this broker's own session's
    leftover is taken over. Planted taking any session's znode for its own: the second delete ran beside the
    first (its failure could take back the first's mark) and removed the other's znode as it ended."""
    with _namespace_on_a_broker(cluster) as (service, _run, port, ns):
        path = f"deleting/{quote(f'namespace/public/{ns}', safe='')}"
        other = zk.MetadataStore.connect(cluster.bookies.zk, root=cluster.bookies.root)
        try:
            other.create(path, {"broker": "another"}, ephemeral=True)
            status, body = _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")
            assert status == 409 and "is being deleted" in body["reason"], (status, body)
            assert other.get(path).value["broker"] == "another", "the other's znode is left"
            assert _status(port, "GET", f"/admin/v2/namespaces/public/{ns}")[0] == 200
        finally:
            other.close()
        status, body = _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")
        assert status == 204, (status, body)


def test_acknowledgements_after_a_failed_unsubscribe_are_stored(cluster: Brokers) -> None:  # noqa: F811
    """An UNSUBSCRIBE whose cursor delete failed leaves the cursor open as well as attached (e44a4b6): the
    consumer goes on, and what it acknowledges then is saved to the cursor's znode by the next delayed flush.
    Planted with the cursor left closed: its acknowledgements started no flush, the stored position stayed where
    the failed delete's flush left it, and a restart of the broker redelivered them all."""
    with _serving(cluster) as (service, run):
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            meta = service.meta
            name = TopicName.parse(f"persistent://public/default/unsubacks-{uuid.uuid4().hex[:8]}")
            consumer = client.subscribe(str(name), "s")
            producer = client.create_producer(str(name))

            async def refused(ml_name: str, sub: str) -> None:
                raise zk.MetadataError("delete refused (test)")

            with swapped(meta, "delete_cursor", refused), pytest.raises(pulsar.PulsarException):
                consumer.unsubscribe()
            ids = [producer.send(b"m%d" % i) for i in range(3)]
            for _ in ids:
                consumer.acknowledge(consumer.receive(10_000))
            last: Any = ids[-1]
            want = (last.ledger_id(), last.entry_id())

            def stored_at_want() -> bool:
                stored = run(meta.get_cursor(name.ml_name, "s"))
                return stored is not None and tuple(stored.value.mark_delete) == want

            assert wait_for(stored_at_want, 10, 0.2), (run(meta.get_cursor(name.ml_name, "s")), want)
        finally:
            client.close()


def test_a_message_age_quota_of_limit_time_0_limits_nothing(bp: Any) -> None:  # noqa: F811
    """A message_age quota whose limitTime is 0 is no limit (as Pulsar's, and as docs/broker.md says): a message
    left unacknowledged past a tick does not refuse a producer. Planted with 0 taken as a limit: every backlog
    was over it, and every producer of the namespace was refused."""
    ns = _namespace(bp)
    quota = {"limitTime": 0, "policy": "producer_exception"}
    admin(bp, "POST", f"/admin/v2/namespaces/{ns}/backlogQuota?backlogQuotaType=message_age", quota)
    topic = f"persistent://{ns}/t"
    c = client(bp)
    try:
        c.subscribe(topic, "slow")
        c.create_producer(topic).send(b"old")
        time.sleep(1.5)  # a tick or more
        c.create_producer(topic).send(b"new")  # before: ProducerBlockedQuotaExceededException
    finally:
        c.close()


def test_a_message_age_quota_looks_at_the_oldest_message_left_once_older_ones_are_acknowledged(
    bp: Any,  # noqa: F811
) -> None:
    """The message_age check reads the publish time of the first entry after the slowest mark-delete once per
    position: acknowledged up to an old message, the next one's (younger) time is read, and a producer is taken.
    Planted with the time read once for any position: the acknowledged message's age still counted, producers
    refused while a young message waited."""
    ns = _namespace(bp)
    quota = {"limitTime": 3, "policy": "producer_exception"}
    admin(bp, "POST", f"/admin/v2/namespaces/{ns}/backlogQuota?backlogQuotaType=message_age", quota)
    topic = f"persistent://{ns}/t"
    c = client(bp)
    try:
        consumer = c.subscribe(topic, "slow")
        producer = c.create_producer(topic)
        producer.send(b"old")
        time.sleep(2.0)  # ticks read the old message's time
        producer.send(b"young")
        consumer.acknowledge(consumer.receive(10_000))  # the old one
        time.sleep(1.5)  # the old one would be 3.5 s old, the young one is 1.5 s
        c.create_producer(topic).send(b"taken")  # before: ProducerBlockedQuotaExceededException
    finally:
        c.close()


def test_quorums_out_of_order_or_an_ack_quorum_of_0_are_usage_errors_saying_what_to_give() -> None:
    """-A 0, and -A over -W within -E, are usage errors in the flags' names before anything is contacted (99dbffe),
    and an -A larger than -E is named in the hint. Planted with '>= 1' dropped: `-A 0` went to ZooKeeper and the
    client's 'INCORRECT_PARAMETER … Qa=0' (exit 1); planted with -W alone compared with -E: no hint for -A."""

    def write(*quorums: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "ledgerstore.cli", "ledger", "write", "-n", "1", "--zk", "127.0.0.1:1"]
        return subprocess.run([*cmd, *quorums], capture_output=True, text=True, timeout=60)

    r = write("-E", "2", "-W", "2", "-A", "0")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.splitlines()[0] == (
        "ledgerstore: -E 2 -W 2 -A 0: need -E >= -W >= -A >= 1 (-W and -A default to 2)"
    ), r.stderr
    r = write("-E", "2", "-W", "2", "-A", "3")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.splitlines()[0].endswith(": with -E 2 give -W and -A at most 2"), r.stderr


def test_cluster_up_with_zk_and_zk_port_given_with_an_equals_sign_is_refused(tmp_path: Path) -> None:
    """`cluster up --zk HOST:PORT --zk-port=N` (the flag's value after '=') is refused as `--zk-port N` is: --zk
    names a ZooKeeper already running and --zk-port another to start. Planted with only the spaced form
    recognised: the --zk-port= given was silently ignored."""
    nobody = str(free_port())
    r = _ls("cluster", "up", "--state-dir", str(tmp_path / "c"), "--zk", f"127.0.0.1:{nobody}", "--zk-port=1")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"--zk 127.0.0.1:{nobody} names a ZooKeeper already running (none is started)" in r.stderr
    assert not (tmp_path / "c" / "cluster.json").exists()


def test_recover_of_a_stopped_bookie_with_no_ledgers_is_not_taken_for_a_typo(bookies: Any) -> None:
    """`bookie recover ID` of a bookie that is stopped (not registered) and in no ensemble, whose cookie is still
    stored, answers '0 ledgers re-replicated': the cluster knows it (ed12eee refuses only an id it does not know).
    Planted with the cookies left out of the known ids: 'no bookie ID', exit 4, for a bookie the cluster had."""
    from tests.integration.test_rereplication import PW, _cli

    running, stopped = bookies.start_many(2)
    stopped.stop()
    r = _cli(bookies, "bookie", "recover", stopped.id, "--password", PW.decode())
    assert r.returncode == 0 and "0 ledgers re-replicated" in r.stdout, (r.stdout, r.stderr)


def test_a_bookie_asked_last_for_a_timed_out_read_is_forgotten_once_it_answers_a_read(bookies: Any) -> None:
    """A bookie in the client's read failure history (151b5c1) is asked last for read_failure_history_s, or until
    it answers a read again. Two of a 3/2/2 ledger's bookies marked so: the entries those two alone hold are read
    from one of them, which answers and is forgotten (the other, asked for nothing, stays). Planted with the
    answer not forgetting it: a bookie back from a stall stayed last for the whole minute, every read's batches
    on the one other bookie."""
    from tests.faults.test_core_adversary import PW, _bk, payload

    bookies.start_many(3)

    async def go() -> None:
        bk = await _bk(bookies)
        lh = await bk.create_ledger(3, 2, 2, password=PW)
        await asyncio.gather(*[await lh.append_future(payload(i)) for i in range(30)])
        await lh.close()
        reader = await _bk(bookies, read_batch_entries=5)
        try:
            marked = list(lh.metadata.last_ensemble.bookies[:2])
            for b in marked:
                reader.read_timed_out[b] = time.monotonic()
            rh = await reader.open_ledger(lh.ledger_id, password=PW)
            assert [e.data async for e in rh.read(0, 29)] == [payload(i) for i in range(30)]
            assert len([b for b in marked if b in reader.read_timed_out]) == 1, reader.read_timed_out
        finally:
            await reader.close()
            await bk.close()

    asyncio.run(go())


def test_a_message_age_quota_exceeded_stands_while_the_oldest_message_cannot_be_read(
    cluster: Brokers,  # noqa: F811
) -> None:
    """A topic over its message_age quota (producer_exception) whose oldest unacknowledged entry, now another one
    (the older acknowledged), cannot be read (its bookies away): the last decision stands, producers still
    refused, as 813e26f says. Planted with the read's failure taken for 'not exceeded': producers let in for as
    long as the entry could not be read. An in-process broker; the read fails by the test's hand."""
    from topic_broker.managed_ledger import ManagedLedgerError

    with _serving(cluster) as (service, run):
        name, c = age_quota_topic(service, run, "age")
        try:
            consumer = c.subscribe(name, "slow")
            producer = c.create_producer(name)
            first = producer.send(b"old")
            producer.send(b"older than the limit too")
            time.sleep(1.5)
            topic = service._served(name)
            assert topic is not None and run(service.quota_exceeded(topic, evict=False)) is not None
            topic.quota_exceeded = True  # (as the PRODUCER or the tick marks it)
            consumer.acknowledge(consumer.receive(10_000))  # the oldest: the next one is looked at now
            want = (first.ledger_id(), first.entry_id())
            assert wait_for(lambda: tuple(topic.ml.slowest_mark_delete() or ()) == want, 10, 0.1), (
                topic.ml.slowest_mark_delete()
            )

            async def unreadable(pos: Any) -> bytes:
                raise ManagedLedgerError("no bookie of the ledger answers (test)")

            topic.ml.read_entry = unreadable
            try:
                exceeded = run(service.quota_exceeded(topic, evict=False))
            finally:
                del topic.ml.read_entry
            assert exceeded is not None and exceeded[0] == "producer_exception", exceeded
        finally:
            c.close()
