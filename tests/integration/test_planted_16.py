"""Tests for the bugs planted in the audit of 856c42e..1eb8e2e (docs/architecture.md §11) that the tests of the
time let through: each fails with its bug planted and passes without it. Real ZooKeeper, bookies and brokers."""

from __future__ import annotations

import asyncio
import time
import urllib.request
import uuid
from typing import Any

import pulsar

import zk
from ledger_client import BookKeeper, ClientConfig
from ledger_client.range_reader import BatchReader
from tests.broker_testing import Brokers, cluster, in_process_broker  # noqa: F401
from tests.integration.test_broker_client_features4 import wait_for
from tests.integration.test_broker_gone_connection import _serving
from tests.integration.test_planted_15 import age_quota_topic
from topic_broker import sub_ops
from topic_broker.admin import AdminServer
from topic_broker.names import TopicName


async def _closed_ledger_and_reader(
    bookies: Any, size: int, entries: int, **cfg: Any
) -> tuple[Any, BookKeeper]:
    """A closed size/size/size ledger of ``entries`` entries b"e<i>", and a new client to read it with ``cfg``
    (read_timeout_s 120 s unless given)."""
    bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    lh = await bk.create_ledger(size, size, 2, password=b"pw")
    await asyncio.gather(*[await lh.append_future(b"e%d" % i) for i in range(entries)])
    await lh.close()
    await bk.close()
    cfg.setdefault("read_timeout_s", 120.0)
    reader = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root, **cfg))
    return lh, reader


def _read_with_held_answers(bookies: Any, hold_s: float | None, **cfg: Any) -> tuple[BookKeeper, list[bytes]]:
    """Read entries 0..39 of a closed 3/3/2 ledger in batches of 4 with a new client, the answer to the first batch
    sent to the ensemble's bookie 1 (where a fresh reader's first batch goes) held ``hold_s`` seconds (None: never
    given), every other answer at once: that bookie answers its other batches meanwhile, as a busy one does."""
    held: list[int] = []
    on_reply = BatchReader._on_reply

    def holding(self: BatchReader, b: Any, resp: Any, exc: BaseException | None) -> None:
        if b.bookie == self.lh.metadata.last_ensemble.bookies[1] and not held:
            held.append(b.first)
            if hold_s is not None:
                self.lh._loop.call_later(hold_s, on_reply, self, b, resp, exc)
            return
        on_reply(self, b, resp, exc)

    async def go() -> tuple[BookKeeper, list[bytes]]:
        lh, reader = await _closed_ledger_and_reader(bookies, 3, 40, read_batch_entries=4, **cfg)
        rh = await reader.open_ledger(lh.ledger_id, password=b"pw")
        BatchReader._on_reply = holding  # type: ignore[method-assign]
        try:
            got = await asyncio.wait_for(_entries(rh), 30)
        finally:
            BatchReader._on_reply = on_reply  # type: ignore[method-assign]
            await reader.close()
        assert held == [0], held
        return reader, got

    return asyncio.run(go())


async def _entries(rh: Any) -> list[bytes]:
    return [e.data async for e in rh.read(0, 39)]


def test_speculative_reads_spare_a_busy_bookie_and_copy_one_silent_since(bookies: Any) -> None:
    """A batch whose bookie answers other batches of the read meanwhile is busy, not hung: no speculative copy at
    ``speculative_read_timeout_s`` (the timer looks again one timeout later), and one still silent then, its
    bookie silent too, is sent to the next replica. Planted: an answer not counted (a busy bookie's batch
    copied at the first timeout), a busy one's timer not armed again (a batch its bookie never answers waited
    out the 120 s read timeout)."""
    bookies.start_many(3)
    want = [b"e%d" % i for i in range(40)]
    reader, got = _read_with_held_answers(bookies, 1.5, speculative_read_timeout_s=1.0)
    assert got == want and reader.speculative_reads == 0
    reader, got = _read_with_held_answers(bookies, None, speculative_read_timeout_s=0.5)
    assert got == want and reader.speculative_reads == 1


def test_a_speculative_copy_failing_at_once_leaves_the_batch_waiting_for_its_stalled_replica(
    bookies: Any,
) -> None:
    """A 2/2/2 ledger, the replica asked first stalled (SIGSTOP) and the other one down: the speculative copy
    fails at once, and the read waits for the stalled replica (resumed 2 s later), which holds the entry; it is
    not an error while a replica asked may still answer. Planted: a failed copy settling the batch, its stalled
    rival dropped and the entry declared unreadable 0.5 s into the read."""
    procs = bookies.start_many(2)

    async def go() -> None:
        lh, reader = await _closed_ledger_and_reader(bookies, 2, 10, speculative_read_timeout_s=0.5)
        ensemble = lh.metadata.last_ensemble.bookies
        # a fresh reader asks bookie 1 of the ensemble first for entry 5 (its write set in order: 1, 0)
        stalled, dead = (next(bp for bp in procs if bp.id == ensemble[i]) for i in (1, 0))
        dead.kill9()
        rh = await reader.open_ledger(lh.ledger_id, password=b"pw")
        stalled.pause()
        try:
            read = asyncio.ensure_future(rh.read_entry(5))
            await asyncio.sleep(2.0)
            assert not read.done(), read
        finally:
            stalled.resume()
        try:
            assert (await asyncio.wait_for(read, 30)).data == b"e5"
            assert reader.speculative_reads == 1
        finally:
            await reader.close()

    asyncio.run(go())


def test_a_request_a_speculative_copy_won_over_is_forgotten_on_the_hung_bookies_connection(
    bookies: Any, monkeypatch: Any
) -> None:
    """The request of a batch whose speculative copy delivered first is given up on: nothing of it stays
    outstanding on the hung (SIGSTOPped) bookie's read connection. Planted: the dropped rival's request not
    forgotten, one request left pending per speculated batch for as long as the connection lives."""
    # A token in the environment (the container tier leaves one in this process) has each new connection send
    # AUTH first, which the hung bookie never answers: that request would stay outstanding, rightly.
    monkeypatch.delenv("LEDGERSTORE_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("LEDGERSTORE_AUTH_TOKEN_FILE", raising=False)
    procs = bookies.start_many(3)

    async def go() -> None:
        lh, reader = await _closed_ledger_and_reader(bookies, 3, 10, speculative_read_timeout_s=0.5)
        # a fresh reader asks bookie 1 of the ensemble first
        hung = next(bp for bp in procs if bp.id == lh.metadata.last_ensemble.bookies[1])
        rh = await reader.open_ledger(lh.ledger_id, password=b"pw")
        hung.pause()
        try:
            assert (await asyncio.wait_for(rh.read_entry(5), 30)).data == b"e5"
            assert reader.speculative_reads >= 1  # (a busy machine may speculate past the next bookie too)
            conn = reader.read_pool.get_nowait(hung.id)
            assert conn is not None and conn.outstanding == 0, conn and conn.outstanding
        finally:
            hung.resume()
            await reader.close()

    asyncio.run(go())


async def lac_19_and_a_reader(bookies: Any) -> tuple[BookKeeper, Any, BookKeeper, Any]:
    """A 3/3/2 ledger whose bookies know LAC 19 (21 entries written; the LAC moves with the adds only), and a new
    client's handle on it (``recovery=False``, ``read_timeout_s`` 120 s, ``speculative_read_timeout_s`` 0.5 s):
    (the writer's client, the ledger, the reader's client, its handle)."""
    bk = await BookKeeper.connect(
        bookies.zk, config=ClientConfig(zk_root=bookies.root, explicit_lac_interval_s=0)
    )
    lh = await bk.create_ledger(3, 3, 2, password=b"pw")
    await asyncio.gather(*[await lh.append_future(b"e%d" % i) for i in range(20)])
    await lh.append(b"e20")  # (the bookies learn LAC 19 with it)
    reader = await BookKeeper.connect(
        bookies.zk,
        config=ClientConfig(zk_root=bookies.root, read_timeout_s=120.0, speculative_read_timeout_s=0.5),
    )
    return bk, lh, reader, await reader.open_ledger(lh.ledger_id, password=b"pw", recovery=False)


def test_a_long_poll_for_the_lac_waits_its_time_and_a_dead_bookie_passes_it_on_as_a_long_poll(
    bookies: Any,
) -> None:
    """``wait_for_lac`` speculates only once a long poll is overdue: a poll answered at its own end (nothing
    written) marks no bookie slow. And a bookie that fails at once (killed) passes the long poll on to the next
    bookie as a long poll, which answers when the LAC moves. Planted: the speculative timer counted from the
    poll's start (a healthy bookie marked slow 0.5 s into a 2 s poll, as each of them in turn), and the next
    bookie asked for the LAC as it is (the call returned at once, the LAC not moved: a tailing reader's poll a
    busy loop while a bookie of its ensemble is down)."""
    procs = bookies.start_many(4)

    async def go() -> None:
        bk, lh, reader, rh = await lac_19_and_a_reader(bookies)
        try:
            assert await asyncio.wait_for(rh.wait_for_lac(19, 2.0), 30) == 19
            assert reader.read_timed_out == {}, reader.read_timed_out
            ensemble = lh.metadata.last_ensemble.bookies
            next(bp for bp in procs if bp.id == ensemble[0]).kill9()
            for b in ensemble[1:]:  # (the failure history puts them last: the dead one is asked first)
                reader.read_timed_out[b] = time.monotonic()
            poll = asyncio.ensure_future(rh.wait_for_lac(19, 20.0))
            await asyncio.sleep(1.0)
            assert not poll.done(), poll
            await lh.append(b"e21")
            await lh.append(b"e22")
            assert await asyncio.wait_for(poll, 30) >= 20
        finally:
            await reader.close()
            await lh.close()
            await bk.close()

    asyncio.run(go())


def test_a_forced_subscription_delete_closes_its_consumers_which_subscribe_again(
    cluster: Brokers,  # noqa: F811
) -> None:
    """A forced subscription DELETE closes its consumers (they reconnect and subscribe anew, as Pulsar's do).
    Planted: the DELETE leaving its consumer attached to the deleted subscription (no reconnect: it went on
    getting messages of a subscription no longer stored, its acknowledgements kept nowhere)."""
    with _serving(cluster) as (service, run):
        http = AdminServer(service)
        run(http.start())
        client = pulsar.Client(f"pulsar://127.0.0.1:{service.config.port}", operation_timeout_seconds=30)
        try:
            name = TopicName.parse(f"persistent://public/default/tell-{uuid.uuid4().hex[:8]}")
            url = (
                f"http://127.0.0.1:{service.config.http_port}/admin/v2/persistent/public/default/{name.local}"
            )
            consumer = client.subscribe(str(name), "s")
            producer = client.create_producer(str(name))
            for i in range(3):
                producer.send(b"m%d" % i)
            topic = run(service.get_topic(name))
            rt = topic.subscriptions["s"]
            req = urllib.request.Request(f"{url}/subscription/s?force=true", method="DELETE")
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 204
            assert not rt.consumers
            wait_for(
                lambda: "s" in topic.subscriptions and topic.subscriptions["s"].consumers, "its resubscribe"
            )
            consumer.close()
        finally:
            client.close()
            run(http.stop())


def test_a_message_age_quotas_exceeded_mark_goes_once_the_backlog_fits_or_the_quota_is_removed(
    cluster: Brokers,  # noqa: F811
) -> None:
    """The message_age quota's own last finding (``age_exceeded``, 00f268e), which stands while the oldest
    unacknowledged entry cannot be read, is 'not exceeded' again once a reading finds the backlog within the
    limit, or the quota removed. Planted with the mark kept in either case: a topic whose backlog fit again (or
    whose quota was removed and set again) refused its producers for as long as its oldest entry could not be
    read. An in-process broker; the read fails, and the quota is removed, by the test's hand."""
    from topic_broker.managed_ledger import ManagedLedgerError

    async def unreadable(pos: Any) -> bytes:
        raise ManagedLedgerError("no bookie of the ledger answers (test)")

    with _serving(cluster) as (service, run):
        name, c = age_quota_topic(service, run, "agemark")
        try:
            consumer = c.subscribe(name, "slow")
            producer = c.create_producer(name)
            topic = service._served(name)
            assert topic is not None and topic.age_quota is not None
            quota = topic.age_quota

            def exceeded_while_unreadable() -> Any:
                topic.ml.read_entry = unreadable
                try:
                    return run(service.quota_exceeded(topic, evict=False))
                finally:
                    del topic.ml.read_entry

            producer.send(b"m0")
            time.sleep(1.5)
            assert run(service.quota_exceeded(topic, evict=False)) is not None
            consumer.acknowledge(consumer.receive(10_000))
            wait_for(lambda: run(service.quota_exceeded(topic, evict=False)) is None, "the backlog fitting")
            producer.send(b"m1")
            assert exceeded_while_unreadable() is None  # (the last finding: within the limit)

            time.sleep(1.5)
            assert run(service.quota_exceeded(topic, evict=False)) is not None
            topic.age_quota = None  # removed
            assert run(service.quota_exceeded(topic, evict=False)) is None
            consumer.acknowledge(consumer.receive(10_000))  # m1; m2 is the oldest now, its time not read yet
            producer.send(b"m2")
            m1 = topic.age_probe and topic.age_probe[0]
            wait_for(
                lambda: (
                    sub_ops.first_after(topic.ml.view(), topic.ml.slowest_mark_delete()) not in (None, m1)
                ),
                "m1's acknowledgement",
            )
            topic.age_quota = quota  # and set again
            assert exceeded_while_unreadable() is None  # (nothing found since it was set)
        finally:
            c.close()


def test_the_background_removal_of_a_deleting_znode_leaves_a_delete_that_took_it_over(
    cluster: Brokers,  # noqa: F811
    monkeypatch: Any,
) -> None:
    """A delete's deleting/ znode whose removal failed is removed in the background (485683b); a delete here that
    took it over meanwhile keeps it (the tries stop), and one starting while a try removes it is 409. Planted:
    the try removing the znode under the delete that took it over (and unlisting that delete, so another
    broker's could run beside it), and the try not listed as a delete while it removes the znode (a delete
    taking it over then ran with no znode held). An in-process broker's AdminApp; ZooKeeper's failure, and a
    slow removal, by the test's hand."""
    from topic_broker import admin as admin_mod
    from topic_broker.admin import AdminError

    monkeypatch.setattr(admin_mod, "DELETING_RETRY_S", (0.3, 0.3))
    with in_process_broker(cluster) as (service, run):
        app = AdminServer(service).admin
        store = app.store
        real = store.adelete_own_ephemeral

        async def go() -> None:
            calls: list[str] = []
            removing, go_on = asyncio.Event(), asyncio.Event()

            async def scripted(path: str) -> None:
                calls.append(path)
                if len(calls) in (1, 3):  # the delete's own removal fails (ZooKeeper failing)
                    raise zk.MetadataConnectionError("ZooKeeper failing (test)")
                if len(calls) == 4:  # the second background try, held while the test looks
                    removing.set()
                    await go_on.wait()
                await real(path)

            store.adelete_own_ephemeral = scripted
            try:
                what = f"namespace/public/gone-{uuid.uuid4().hex[:8]}"
                async with app._deleting(what, "ns"):
                    pass
                (path,) = set(calls)
                async with app._deleting(what, "ns"):  # takes the leftover over before the first try
                    await asyncio.sleep(1.0)  # (three tries' time)
                    assert await asyncio.to_thread(store.exists, path), "the znode of the delete running here"
                    assert path in app._deletes_here
                assert len(calls) == 2 and not await asyncio.to_thread(store.exists, path)

                async with app._deleting(what, "ns"):  # its removal fails: tried again in the background
                    pass
                await asyncio.wait_for(removing.wait(), 10)
                try:
                    async with app._deleting(what, "ns"):
                        raise AssertionError("a delete taking over the znode a try is removing")
                except AdminError as e:
                    assert e.status == 409, e
                finally:
                    go_on.set()
                await asyncio.sleep(0.1)
                assert not await asyncio.to_thread(store.exists, path) and not app._freeing
            finally:
                del store.adelete_own_ephemeral

        run(go())


def test_a_broker_registers_again_after_each_lost_session(bookies: Any) -> None:
    """A broker's ZooKeeper session expires, it registers again under its new session; the session expires again,
    and it registers again again. Planted: the 'registration under way' flag (f896d3f's one re-registration at a
    time) never cleared, so that after the second loss the broker served unregistered (lookups could not find
    it). The broker in this process, one bookie."""
    from tests.broker_testing import broker_config
    from tests.zk_testing import expire_session
    from topic_broker.service import BrokerService
    from zk import layout

    bookies.start()
    config = broker_config(bookies, "twice-lost", zk_session_timeout_s=3.0)
    path = layout.broker_path("twice-lost")

    async def body() -> None:
        service = BrokerService(config)
        await service.start()
        try:
            assert service.bk is not None
            store = service.bk.store
            for _ in range(2):
                lost = store.session_id
                await asyncio.to_thread(expire_session, store)
                for _ in range(150):  # 15 s
                    st = await asyncio.to_thread(store.stat, path)
                    if st is not None and st.ephemeral_owner == store.session_id != lost:
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError(f"not registered again after the session {lost:#x} was lost")
        finally:
            await service.stop()

    asyncio.run(body())


def test_a_topics_open_ledger_whose_earlier_ensemble_names_a_decommissioning_bookie_is_rolled(
    bookies: Any, tmp_path: Any
) -> None:
    """The broker's housekeeping rolls a topic's open ledger naming a bookie being decommissioned (37a83f3) in any
    of its ensembles: one the ledger left at an ensemble change (killed, then decommissioned) still holds
    entries of it, and the decommission waits for the ledger to be closed. Planted: the last ensemble alone
    looked at, so that such a ledger stayed open (for hours on a quiet topic) and the decommission with it."""
    from ledger_client.sync import BookKeeper as SyncBookKeeper
    from tests.integration.test_broker_admin import ok
    from tests.integration.test_broker_pulsar_client import client, topic_name
    from zk.underreplication import UnderReplicationManager

    procs = bookies.start_many(4)
    b = Brokers(bookies, tmp_path)
    try:
        bp = b.start("--tick-interval-s", "1")
        t = topic_name()
        c = client(bp)
        producer = c.create_producer(f"persistent://public/default/{t}")
        producer.send(b"before")
        path = f"/admin/v2/persistent/public/default/{t}/internalStats"
        first = ok(bp, "GET", path)["ledgers"][-1]["ledgerId"]
        bk = SyncBookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            gone = bk.ledger_metadata(first).ensembles[0].bookies[0]
            next(p for p in procs if p.id == gone).kill9()
            for i in range(
                4
            ):  # (an ensemble change away from it, at the first entry its write set names it in)
                producer.send(b"after %d" % i)
            wait_for(
                lambda: gone not in bk.ledger_metadata(first).ensembles[-1].bookies, "the ensemble change", 15
            )
            UnderReplicationManager(bk._bk.store).start_decommission(gone)
            wait_for(lambda: ok(bp, "GET", path)["ledgers"][-1]["ledgerId"] != first, "a new ledger", 15)
        finally:
            bk.close()
        c.close()
    finally:
        b.stop_all()


def test_updatecookie_of_moved_directories_refuses_a_running_bookie_or_a_journal_left_behind_and_dry_runs(
    bookies: Any, tmp_path: Any
) -> None:
    """`bookie updatecookie` given the bookie's own id (f06f2fc) refuses while the bookie runs, refuses a journal
    directory holding the cookie but no journal (the segments left behind), and with --dry-run changes nothing.
    Planted: each check dropped (a running bookie's cookie rewritten under it; a journal directory with no
    journal recorded, the bookie then starting on an empty journal; a dry run that wrote the cookies)."""
    import shutil

    from tests.integration.test_cluster_cli import _ls
    from zk.cookies import COOKIE_FILE

    bp = bookies.start()
    zk_args = ["--zk", bookies.zk, "--zk-root", bookies.root]
    copy = tmp_path / "copy" / "journal"
    shutil.copytree(bp.data_dir / "journal", copy)
    args = ["--bookie-id", bp.id, "--data-dir", str(bp.data_dir), *zk_args]
    r = _ls("bookie", "updatecookie", *args, "--journal-dir", str(copy))
    assert r.returncode != 0 and "is running" in r.stderr, r.stdout + r.stderr
    bp.stop()
    bare = tmp_path / "bare" / "journal"
    bare.mkdir(parents=True)
    shutil.copy(bp.data_dir / "journal" / COOKIE_FILE, bare / COOKIE_FILE)
    r = _ls("bookie", "updatecookie", *args, "--journal-dir", str(bare))
    assert r.returncode != 0 and "no journal" in r.stderr, r.stdout + r.stderr
    r = _ls("bookie", "updatecookie", *args, "--journal-dir", str(copy), "--dry-run")
    assert r.returncode == 0 and "would record" in r.stdout, r.stdout + r.stderr
    r = _ls("bookie", "updatecookie", *args, "--journal-dir", str(copy))
    assert r.returncode == 0 and "recorded the moved directories" in r.stdout, r.stdout + r.stderr


def test_cluster_status_calls_a_bookie_down_mid_decommission_down(tmp_path: Any) -> None:
    """`cluster status` says 'decommissioned' of a stopped bookie only once its decommission ended (its cookie
    deleted, c49435f): one stopped while its decommission runs (marked, its cookie still there: its data not
    moved off yet) is DOWN and exit 1, as any bookie down. Planted: the mark alone taken for a decommissioned
    bookie, so that a bookie crashing mid-decommission was called decommissioned and the status exit 0."""
    import json as _json

    from ledgerstore.cluster import free_port
    from tests.integration.test_cluster_cli import _ls, _ports
    from zk import MetadataStore
    from zk.underreplication import UnderReplicationManager

    state = tmp_path / "cluster"
    r = _ls("cluster", "up", *_ports(state, free_port()))
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        st = _json.loads((state / "cluster.json").read_text())
        with MetadataStore.connect(st["zk"], root=st.get("zk_root", "/ledgerstore")) as store:
            UnderReplicationManager(store).start_decommission(
                st["bookies"][1]["id"]
            )  # (its data not moved yet)
        _ls("cluster", "stop", "bookie-1", "--state-dir", str(state))
        r = _ls("cluster", "status", "--state-dir", str(state))
        assert r.returncode == 1 and "decommissioned" not in r.stdout, r.stdout + r.stderr
    finally:
        _ls("cluster", "down", "--state-dir", str(state))


def test_a_send_whose_first_ids_an_earlier_send_being_stored_covers_is_answered_in_its_turn(
    cluster: Brokers,  # noqa: F811
) -> None:
    """A SEND of ids 2..5 after one of ids 1..3 whose write still waits on the bookies, on the same connection: a
    resend (judged by its first id, 9e11ed6) that the earlier send covers, answered in its turn after it, not
    MessageDupUnknown. Planted: the earlier send compared with the later one's last id (`_sent_before`), so that
    the connection's producer was told to reconnect and send everything again."""
    from tests.integration.test_broker_pulsar_client import _raw_answer, _raw_producer, topic_name
    from topic_broker import pulsar_api_pb2 as pb
    from topic_broker import wire

    T = pb.BaseCommand

    def send(s: Any, seq: int, highest: int) -> None:
        cmd = pb.CommandSend(producer_id=1, sequence_id=seq, highest_sequence_id=highest)
        md = pb.MessageMetadata(producer_name="x", sequence_id=seq, publish_time=1)
        s.sendall(wire.encode_send(T(type=T.SEND, send=cmd), md, b"m%d" % seq))

    broker = cluster.start()
    s, dec = _raw_producer(broker, f"persistent://public/default/{topic_name()}", "x")
    try:
        send(s, 0, 0)
        assert _raw_answer(s, dec).type == T.SEND_RECEIPT
        paused = cluster.bookies.procs[:2]  # every entry of E3/Qw2/Qa2 waits for one of them
        for bk in paused:
            bk.pause()
        try:
            send(s, 1, 3)
            send(s, 2, 5)
            time.sleep(0.5)  # (both read by the broker while the first one's write waits)
        finally:
            for bk in paused:
                bk.resume()
        answers = [_raw_answer(s, dec), _raw_answer(s, dec)]
        assert [a.type for a in answers] == [T.SEND_RECEIPT, T.SEND_RECEIPT], answers
    finally:
        s.close()
