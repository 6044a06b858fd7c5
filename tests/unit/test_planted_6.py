"""Tests for the bugs planted in the audit of 2026-11-29 against 1d61931 that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of dedup's skipped ids, held SENDs, backpressure and the
changes since"): each fails with its bug planted and passes without it. Pure logic, no processes."""

from __future__ import annotations

from collections import deque
from itertools import count

from tests.unit.test_broker_connection import connected, decode
from tests.unit.test_broker_skipped_ids import bookkeeping, stored
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.server import BrokerProtocol
from topic_broker.service import (
    PUBLISH_BYTES_MAX,
    SKIPPED_IDS_MAX,
    Consumer,
    Producer,
    Session,
    SubscriptionRuntime,
    _Receipt,
)
from topic_broker.subscription import Read, Subscription, SubType

T = pb.BaseCommand


def test_a_producer_keeps_exactly_the_latest_skipped_ids_max_ranges() -> None:
    """Each delayed message ahead of a batch leaves one range: the latest ``SKIPPED_IDS_MAX`` are kept, so a
    batch window of that many delayed messages still has its first id filled, and only the oldest goes."""
    t = bookkeeping()
    for i in range(SKIPPED_IDS_MAX + 1):
        stored(t, "p", 2 * i + 1)  # each skips the id before it: 0, 2, 4, ...
    assert len(t.skipped_ids["p"]) == SKIPPED_IDS_MAX
    assert not stored(t, "p", 0)  # the oldest forgotten
    assert stored(t, "p", 2)  # the next oldest kept
    assert stored(t, "p", 2 * SKIPPED_IDS_MAX)  # the latest kept


def test_the_send_path_walks_a_batch_of_pyarrows_codecs_on_the_loop_it_reads_none() -> None:
    """The send path's walk runs no pyarrow codec (an LZ4, ZSTD or Snappy batch keeps its first id): such a batch
    is not sent to a worker thread, nor the producer's later SENDs held behind it, whatever its size."""
    for codec in wire.ARROW_CODECS:
        md = pb.MessageMetadata(
            producer_name="p",
            sequence_id=0,
            publish_time=1,
            num_messages_in_batch=2,
            compression=codec,
            uncompressed_size=wire.INFLATE_ON_LOOP_MAX + 1,
        )
        assert not wire.batch_walk_off_loop(md), codec


class _Pending:
    def __init__(self, n: int) -> None:
        self.pending_bytes = n


def test_a_connection_paused_for_its_sends_is_read_again_only_under_half_the_bound() -> None:
    """Over ``PUBLISH_BYTES_MAX`` of SENDs outstanding the connection is not read; it is read again once they
    hold under half of it, not as soon as one receipt takes it under the bound (a pause and a resume a receipt)."""
    s = Session.__new__(Session)  # only what check_publishing reads and writes
    s.peer, s.producers, s.publish_paused, s.publish_bytes = "test", {}, False, 0
    changes: list[bool] = []
    s.reading_changed = lambda: changes.append(s.publish_paused)
    paused = []
    for pending in (PUBLISH_BYTES_MAX, PUBLISH_BYTES_MAX + 1, PUBLISH_BYTES_MAX - 1, PUBLISH_BYTES_MAX // 2):
        s.producers = {1: _Pending(pending)}  # type: ignore[dict-item]
        s.check_publishing()
        paused.append(s.publish_paused)
    assert paused == [False, True, True, False] and changes == [True, False]


def test_a_connection_not_read_is_pinged_again_and_given_an_interval_once_read() -> None:
    """While the broker does not read a connection (its producers' SENDs wait for the bookies), a PING without
    an answer does not close it: it is pinged again an interval later, and once read again it has a whole
    interval from that PING to answer, not a close at the first tick for the PING it could not be seen to answer."""
    conn = connected(now=0.0, keepalive_interval_s=30.0)
    conn.tick(30.0, read=False)
    assert [c.type for c in decode(conn.data_to_send())] == [T.PING]
    conn.tick(60.0, read=False)
    assert not conn.closed
    conn.tick(90.0, read=False)
    assert [c.type for c in decode(conn.data_to_send())] == [T.PING]
    conn.tick(100.0)
    assert not conn.closed
    conn.tick(120.0)
    assert conn.closed and "keep-alive" in (conn.close_reason or "")


def _session_paused_for_its_sends(writable: bool) -> Session:
    s = Session.__new__(Session)  # only what tick reads and writes
    s.peer, s.conn, s.writable = "test", connected(now=0.0, keepalive_interval_s=30.0), writable
    s.producers = {1: _Pending(PUBLISH_BYTES_MAX + 1)}  # type: ignore[dict-item]
    s.publish_paused, s.publish_bytes, s.reading_changed = True, PUBLISH_BYTES_MAX + 1, lambda: None
    s.held = deque()  # no request held
    s.flush = lambda: None  # type: ignore[method-assign]
    return s


def test_a_connection_paused_for_its_sends_that_takes_nothing_either_is_closed_by_the_keep_alive() -> None:
    """Not read for its producers' SENDs, a connection is spared the keep-alive's close only while it takes what
    the broker sends: one whose unsent bytes are over the high-water mark too (a peer that reads nothing) is
    closed after two intervals, as any connection that answers no PING."""
    for writable in (True, False):
        s = _session_paused_for_its_sends(writable)
        s.tick(30.0)
        s.tick(60.0)
        assert s.conn.closed is not writable, writable


def test_a_connection_paused_for_its_sends_is_read_again_at_a_tick_once_they_are_gone() -> None:
    """A producer gone with SENDs never answered (its topic unloaded) no longer counts: no receipt comes to
    resume the connection, the tick's check does."""
    s = _session_paused_for_its_sends(True)
    s.producers = {}
    s.tick(1.0)
    assert not s.publish_paused and s.publish_bytes == 0


def test_a_receipt_that_takes_a_paused_connection_under_half_the_bound_resumes_it() -> None:
    """Each receipt leaving while the connection is paused for its SENDs checks the bound, not only the last one
    of its producer's queue: the producer's first SEND stored, the two left hold under half, it is read again."""
    s = _session_paused_for_its_sends(True)
    s.send = lambda frame: None  # type: ignore[method-assign]
    size = PUBLISH_BYTES_MAX // 2
    p = Producer(s, 1, "p", None)  # type: ignore[arg-type]
    p.receipts.extend(_Receipt(seq, seq, size=size // 2 if seq else size) for seq in range(3))
    p.pending_bytes = s.publish_bytes = 2 * size
    s.producers = {1: p}
    p.receipts[0].done = True
    p.flush_receipts()
    assert not s.publish_paused and s.publish_bytes == size


class _Transport:
    reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def test_a_connection_over_its_write_buffers_mark_is_not_read_until_it_drains() -> None:
    """A peer that sends requests and reads no answer: over the high-water mark its connection is not read (its
    requests would queue more answers), and read again once the buffer drained."""
    s = _session_paused_for_its_sends(True)
    s.publish_paused, s.consumers, s.closed, s.transport = False, {}, False, _Transport()
    protocol = BrokerProtocol.__new__(BrokerProtocol)  # only what the write-buffer callbacks read and write
    protocol.session, protocol.paused, protocol.write_paused = s, False, False
    protocol.pause_writing()
    assert not s.transport.reading and not s.writable
    protocol.resume_writing()
    assert s.transport.reading and s.writable


def test_a_consumer_that_subscribes_on_a_connection_over_its_mark_is_sent_nothing_until_it_drains() -> None:
    """A consumer attached while its connection's unsent bytes are over the high-water mark (a peer already
    reading nothing) is not ready: its permits start no read until the connection drains."""
    session = _session_paused_for_its_sends(True)
    session.writable = False
    rt = SubscriptionRuntime.__new__(SubscriptionRuntime)  # only what add_consumer reads and writes
    rt.core, rt.cursor, rt.consumers, rt._by_key, rt._next_key = (
        Subscription(SubType.SHARED),
        None,
        {},
        {},
        count(),
    )
    rt._seek_grace = None
    rt.execute = lambda cmds: None  # type: ignore[method-assign]
    consumer = Consumer(session, 1, "c", rt)
    rt.add_consumer(consumer, SubType.SHARED, 0, [])
    assert rt.core.flow(consumer.sub_key, 1000) == []
    assert [type(c) for c in rt.core.set_writable(consumer.sub_key, True)] == [Read]


def test_the_brokers_ensemble_change_timeout_flag_is_taken() -> None:
    """``--ensemble-change-timeout-s`` reaches the broker's config (its ledger client's), default 5 s."""
    from tests.unit.test_broker_compaction_flags import _args
    from topic_broker.main import config_from_args

    assert config_from_args(_args()).ensemble_change_timeout_s == 5.0
    assert config_from_args(_args("--ensemble-change-timeout-s", "2.5")).ensemble_change_timeout_s == 2.5
