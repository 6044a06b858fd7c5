"""The ledger client's add fast path without sockets: frame building, response decoding and dispatch to the
writer handle (``AddListener``), batched sends (``_Routes``), connection loss, and the handle's append APIs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie import protocol as p
from bookie.entryformat import ADD_FRAME_ENTRY_OFFSET, DigestType, EntryCodec
from ledger_client.bookie_conn import ADD_RID_BASE, AddRow, BookieConnection, BookiePool
from ledger_client.client import ClientConfig, LedgerHandle
from ledger_client.errors import (
    BookieUnavailableError,
    LedgerError,
    LedgerFencedError,
    NotEnoughBookiesError,
)
from ledger_client.quorum import write_set
from ledger_client.send_path import _Routes

KEY = p.master_key(b"pw")


# -- frames --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("digest", list(DigestType))
@pytest.mark.parametrize("flags", [0, p.Flag.RECOVERY_ADD])
def test_add_frame_builder_equals_the_generic_encoding(digest, flags) -> None:
    codec = EntryCodec(5, digest, KEY)
    build = codec.add_frame_builder(KEY, flags)
    for payload in (b"", b"hello", bytes(range(256)) * 5):
        frame = build(ADD_RID_BASE + 3, 9, 7, 1234, payload)
        entry = codec.build(9, 7, 1234, payload)
        assert frame == p.encode_add_request(ADD_RID_BASE + 3, 5, 9, KEY, entry, flags)
        assert frame[ADD_FRAME_ENTRY_OFFSET:] == entry
        assert codec.verify(entry, 9)[1] == payload
    with pytest.raises(p.ProtocolError):
        codec.add_frame_builder(b"short")
    with pytest.raises(p.ProtocolError):
        build(1, 0, -1, 0, b"x" * p.FRAME_SIZE_MAX)


def test_take_leading_add_responses_takes_the_run_up_to_another_or_partial_frame() -> None:
    adds = [p.encode_add_response(i, p.Status.OK, 7, i) for i in range(4)]
    other = p.encode(p.WriteLacResponse(request_id=9, status=p.Status.OK, ledger_id=7))
    dec = p.FrameDecoder()
    assert dec.take_leading_add_responses() == []
    dec.feed(b"".join(adds[:3]) + adds[3][:5])
    assert [r[4] for r in dec.take_leading_add_responses()] == [0, 1, 2]
    assert dec.buffered == 5
    dec.feed(adds[3][5:] + other + adds[0])
    assert [r[4] for r in dec.take_leading_add_responses()] == [3]
    assert dec.take_leading_add_responses() == []  # WriteLacResponse first now
    assert [m.request_id for m in dec.responses()] == [9, 0]
    assert dec.buffered == 0


def test_take_add_acks_takes_a_whole_run_of_one_ledgers_ok_acks_or_nothing() -> None:
    def ack(rid: int, eid: int, ledger: int = 7, status: p.Status = p.Status.OK) -> bytes:
        return p.encode_add_response(rid, status, ledger, eid)

    dec = p.FrameDecoder()
    assert dec.take_add_acks() is None
    eids = [5, 3, 2**40, 0, 9]  # any order, any value: returned as they came
    rids = [ADD_RID_BASE, 2**55, 2**63 - 1, ADD_RID_BASE + 2**20, 2**49 + 255]  # second byte never zero
    data = b"".join(ack(r, e) for r, e in zip(rids, eids, strict=True))
    dec.feed(data + data[:7])  # and a partial frame
    got = dec.take_add_acks()
    assert got is not None and got[0] == 7 and list(got[1]) == eids
    assert dec.buffered == 7
    dec.feed(data[7:33])
    got = dec.take_add_acks()
    assert got is not None and list(got[1]) == [5] and dec.buffered == 0

    ok = [ack(ADD_RID_BASE + i, i) for i in range(4)]
    spoilers = [
        ack(ADD_RID_BASE - 1, 4),  # a connection's own request id
        ack(3, 4),
        ack(ADD_RID_BASE + 4, 4, ledger=8),  # another ledger
        ack(ADD_RID_BASE + 4, 4, ledger=7 + (1 << 56)),
        ack(ADD_RID_BASE + 4, 4, status=p.Status.FENCED),
        ack(ADD_RID_BASE + 4, 4, status=p.Status.NO_LEDGER),
        ack(ADD_RID_BASE + 4, 4)[:5] + b"\x02" + ack(ADD_RID_BASE + 4, 4)[6:],  # another op
        ack(ADD_RID_BASE + 4, 4)[:4] + b"\x02" + ack(ADD_RID_BASE + 4, 4)[5:],  # another version
        p.encode(p.WriteLacResponse(request_id=ADD_RID_BASE, status=p.Status.OK, ledger_id=7)) + b"\0" * 20,
    ]
    for bad in spoilers:
        for at in (0, 2, 4):
            frames = ok[:at] + [bad] + ok[at:]
            dec = p.FrameDecoder()
            dec.feed(b"".join(frames))
            before = dec.buffered
            assert dec.take_add_acks() is None, (bad, at)
            assert dec.buffered == before
    dec = p.FrameDecoder()
    dec.feed(ack(2**56, 1) + ack(2**57, 2))  # first byte never zero
    got = dec.take_add_acks()
    assert got is not None and list(got[1]) == [1, 2]
    # a mix of top request-id bytes that no single column check can vouch for: left to the slower path
    dec = p.FrameDecoder()
    dec.feed(ack(2**56, 0) + ack(ADD_RID_BASE, 1) + ack(0x0100_0000_0000_0000 + 2**48, 2))
    got = dec.take_add_acks()
    assert got is None or list(got[1]) == [0, 1, 2]


def test_take_add_ack_groups_takes_several_ledgers_acks_one_group_each_in_arrival_order() -> None:
    def ack(rid: int, eid: int, ledger: int) -> bytes:
        return p.encode_add_response(rid, p.Status.OK, ledger, eid)

    rows = [(7, 0), (7, 1), (8, 0), (7, 2), (8, 1), (8, 2), (7 + (1 << 56), 5), (7, 3)]
    dec = p.FrameDecoder()
    dec.feed(b"".join(ack(ADD_RID_BASE + i, e, lid) for i, (lid, e) in enumerate(rows)) + b"\0\0")
    got = dec.take_add_ack_groups()
    assert got is not None and [(lid, list(eids)) for lid, eids in got] == [
        (7, [0, 1, 2, 3]),
        (8, [0, 1, 2]),
        (7 + (1 << 56), [5]),
    ]
    assert dec.buffered == 2
    dec = p.FrameDecoder()  # one ledger: the same single group as take_add_acks
    dec.feed(ack(ADD_RID_BASE, 4, 9) + ack(ADD_RID_BASE, 5, 9))
    got = dec.take_add_ack_groups()
    assert got is not None and [(lid, list(eids)) for lid, eids in got] == [(9, [4, 5])]
    for bad in (  # anything but OK acks to listened adds: the buffer is left alone
        p.encode_add_response(ADD_RID_BASE, p.Status.FENCED, 8, 3),
        ack(5, 3, 8),
        p.encode(p.WriteLacResponse(request_id=ADD_RID_BASE, status=p.Status.OK, ledger_id=7)) + b"\0" * 20,
    ):
        dec = p.FrameDecoder()
        dec.feed(ack(ADD_RID_BASE, 1, 7) + bad + ack(ADD_RID_BASE, 2, 8))
        before = dec.buffered
        assert dec.take_add_ack_groups() is None and dec.buffered == before


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.sampled_from([1, 2, 3, 2**40]), st.integers(0, 2**62)), min_size=1, max_size=40
    )
)
def test_take_add_ack_groups_keeps_each_ledgers_acks_in_order(rows) -> None:
    dec = p.FrameDecoder()
    dec.feed(
        b"".join(
            p.encode_add_response(ADD_RID_BASE + i, p.Status.OK, lid, e) for i, (lid, e) in enumerate(rows)
        )
    )
    got = dec.take_add_ack_groups()
    assert got is not None and dec.buffered == 0
    want: dict[int, list[int]] = {}
    for lid, e in rows:
        want.setdefault(lid, []).append(e)
    assert [(lid, list(eids)) for lid, eids in got] == list(want.items())


_frame_kinds = st.one_of(
    st.tuples(
        st.just("ack"),
        st.sampled_from([ADD_RID_BASE, ADD_RID_BASE + 1, 2**56, 5]),
        st.sampled_from([p.Status.OK, p.Status.OK, p.Status.FENCED]),
        st.sampled_from([7, 7, 8]),
        st.integers(0, 2**62),
    ),
    st.tuples(st.just("lac"), st.integers(1, 50)),
)


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(_frame_kinds, max_size=12), cuts=st.lists(st.integers(0, 400), max_size=4))
def test_take_add_acks_then_the_other_paths_see_every_frame_once_in_order(frames, cuts) -> None:
    """The client's decoding order (take_add_acks, take_leading_add_responses, frames_raw) on any chunking:
    every response comes out exactly once, in order, with its fields."""
    want = []
    parts = []
    for f in frames:
        if f[0] == "ack":
            _, rid, status, ledger, eid = f
            parts.append(p.encode_add_response(rid, status, ledger, eid))
            want.append((rid, int(status), ledger, eid))
        else:
            parts.append(p.encode(p.WriteLacResponse(request_id=f[1], status=p.Status.OK, ledger_id=9)))
            want.append((f[1], 0, 9, None))
    data = b"".join(parts)
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    dec = p.FrameDecoder()
    got: list[tuple[int, int, int, int | None]] = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        dec.feed(data[a:b])
        acks = dec.take_add_acks()
        if acks is not None:
            got += [(ADD_RID_BASE, 0, acks[0], e) for e in acks[1]]  # rid: only known to be listened
        got += [(r[4], r[5], r[6], r[7]) for r in dec.take_leading_add_responses()]
        for op, _flags, rid, buf, x, y in dec.frames_raw():
            resp = p.decode_response(op, _flags, rid, memoryview(buf)[x:y])
            eid = resp.entry_id if isinstance(resp, p.AddEntryResponse) else None
            got.append((rid, int(resp.status), resp.ledger_id, eid))
    assert dec.buffered == 0
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if g[0] == ADD_RID_BASE and w[0] >= ADD_RID_BASE and g[1] == 0:
            g = (w[0], *g[1:])  # take_add_acks vouches only for "a listened add"
        assert g == w


# -- connection dispatch -------------------------------------------------------------------------------


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.closed = True

    def set_write_buffer_limits(self, high: int) -> None:
        pass


class Listener:
    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        self.calls: list[tuple[str, list[int]]] = []  # (bookie, entry ids acked) per call
        self.lost: list[str] = []

    def on_add_acks(self, bookie: str, entry_ids: Sequence[int]) -> None:
        self.calls.append((bookie, list(entry_ids)))

    def on_add_rows(self, bookie: str, rows: list[AddRow]) -> list[AddRow] | None:
        mine = [r for r in rows if r[6] == self.ledger_id and r[4] >= ADD_RID_BASE]
        if mine:
            self.calls.append((bookie, [r[7] for r in mine]))
        rest = [r for r in rows if not (r[6] == self.ledger_id and r[4] >= ADD_RID_BASE)]
        return rest or None

    def on_bookie_lost(self, bookie: str, exc: BaseException) -> None:
        self.lost.append(bookie)

    def on_congestion(self, bookie: str, congested: bool) -> None:
        pass


def _conn(listeners: dict[int, Any]) -> BookieConnection:
    conn = BookieConnection("b:1", listeners)
    conn.connection_made(FakeTransport())  # type: ignore[arg-type]
    return conn


def test_add_responses_go_to_the_listener_of_their_ledger_in_one_call_per_chunk() -> None:
    async def go() -> None:
        l7, l8 = Listener(7), Listener(8)
        conn = _conn({7: l7, 8: l8})
        got: list[Any] = []
        conn.send_add(5, b"f", lambda st, exc: got.append(("add", st)))  # a connection's own request id
        conn.send_frame(6, b"f", lambda resp, exc: got.append(("req", resp.status)))
        frames = [p.encode_add_response(ADD_RID_BASE + i, p.Status.OK, 7, i) for i in range(5)]
        frames.insert(2, p.encode_add_response(5, p.Status.OK, 7, 100))
        frames.insert(3, p.encode_add_response(ADD_RID_BASE + 50, p.Status.OK, 8, 0))
        frames.append(p.encode_add_response(6, p.Status.FENCED, 7, 101))
        frames.append(p.encode_add_response(ADD_RID_BASE + 60, p.Status.OK, 99, 0))  # nobody listens: dropped
        data = b"".join(frames)
        conn.data_received(data[:50])  # a chunk ending inside a frame
        conn.data_received(data[50:])
        assert [e for _, eids in l7.calls for e in eids] == [0, 1, 2, 3, 4]
        assert len(l7.calls) <= 3
        assert [e for _, eids in l8.calls for e in eids] == [0]
        assert got == [("add", p.Status.OK), ("req", p.Status.FENCED)]
        assert conn.outstanding == 0

    asyncio.run(go())


def test_interleaved_ledgers_acks_reach_each_listener_in_one_call_per_chunk() -> None:
    """Many ledgers' handles share a connection: a chunk of their acks, interleaved, is one call per ledger
    (in entry order), not one call per ack."""

    async def go() -> None:
        listeners = {lid: Listener(lid) for lid in (7, 8, 9)}
        conn = _conn(dict(listeners))
        frames = [
            p.encode_add_response(ADD_RID_BASE + 10 * i + lid, p.Status.OK, lid, i)
            for i in range(20)
            for lid in (7, 8, 9)
        ]
        conn.data_received(b"".join(frames))
        for lst in listeners.values():
            assert lst.calls == [("b:1", list(range(20)))]

    asyncio.run(go())


def test_add_responses_after_another_frame_in_the_same_chunk() -> None:
    async def go() -> None:
        l7 = Listener(7)
        conn = _conn({7: l7})
        got: list[Any] = []
        conn.send_frame(1, b"f", lambda resp, exc: got.append(resp))
        other = p.encode(p.WriteLacResponse(request_id=1, status=p.Status.OK, ledger_id=7))
        adds = [p.encode_add_response(ADD_RID_BASE + i, p.Status.OK, 7, i) for i in range(3)]
        conn.data_received(other + b"".join(adds))
        assert isinstance(got[0], p.WriteLacResponse)
        assert [e for _, eids in l7.calls for e in eids] == [0, 1, 2]

    asyncio.run(go())


def test_unknown_status_closes_the_connection_and_lost_connections_are_reported() -> None:
    async def go() -> None:
        l7 = Listener(7)
        conn = _conn({7: l7})
        failed: list[Any] = []
        conn.send_add(3, b"f", lambda st, exc: failed.append(exc))
        bad = p.encode_add_response(3, p.Status.OK, 7, 0)
        bad = bad[:16] + bytes([200]) + bad[17:]  # status byte
        conn.data_received(bad)
        assert conn.closed and conn.transport.aborted  # type: ignore[union-attr]
        assert isinstance(failed[0], BookieUnavailableError)
        assert l7.lost == ["b:1"]
        assert not conn.send_listened_add(b"x") and not conn.write_listened_adds(b"x")

        conn2 = _conn({7: l7})
        conn2.connection_lost(None)
        assert l7.lost == ["b:1", "b:1"]

    asyncio.run(go())


def test_pool_add_ids_never_collide_with_a_connections_own_ids() -> None:
    pool = BookiePool()
    first = next(pool.add_ids)
    assert first == ADD_RID_BASE and next(pool.add_ids) == first + 1
    lst = Listener(1)
    pool.add_listener(1, lst)
    pool.remove_listener(1, Listener(1))  # not the registered one: stays
    assert pool.listeners[1] is lst
    pool.remove_listener(1, lst)
    assert pool.listeners == {}


# -- batched sends ---------------------------------------------------------------------------------------


class FakeConn:
    def __init__(self, name: str) -> None:
        self.bookie_id = name
        self.closed = False
        self.written: list[bytes] = []
        self.sent: list[bytes] = []

    def write_listened_adds(self, buf: bytes) -> bool:
        if self.closed:
            return False
        self.written.append(buf)
        return True

    def send_listened_add(self, frame: bytes) -> bool:
        if self.closed:
            return False
        self.sent.append(frame)
        return True


@settings(max_examples=100, deadline=None)
@given(
    shape=st.sampled_from([(1, 1), (2, 1), (3, 2), (3, 3), (4, 2), (5, 3), (5, 5)]),
    first=st.integers(0, 50),
    n=st.integers(1, 20),
)
def test_routes_send_each_bookie_exactly_the_frames_of_its_write_sets(shape, first, n) -> None:
    E, qw = shape
    conns = [FakeConn(f"b{i}") for i in range(E)]
    routes = _Routes(conns, qw)  # type: ignore[arg-type]
    frames = [f"<{first + k}>".encode() for k in range(n)]
    routes.write(first, frames)
    for j, c in enumerate(conns):
        want = b"".join(f for k, f in enumerate(frames) if j in write_set(first + k, E, qw))
        assert b"".join(c.written) == want
        assert len(c.written) <= 1


# -- the writer handle -------------------------------------------------------------------------------------


def _handle(E: int = 3, qw: int = 3, qa: int = 2, **cfg: Any) -> tuple[LedgerHandle, dict[str, FakeConn]]:
    bookies = [f"b{i}" for i in range(E)]
    conns = {b: FakeConn(b) for b in bookies}
    pool = BookiePool()
    pool.get_nowait = lambda b: (lambda c: c if c is not None and not c.closed else None)(conns.get(b))  # type: ignore[method-assign, assignment]

    async def no_replacements(ensemble: Any, failed: Any) -> list[str]:
        raise NotEnoughBookiesError("no spare bookie")

    bk = SimpleNamespace(
        config=ClientConfig(explicit_lac_interval_s=0, ensemble_change_timeout_s=0, **cfg),
        pool=pool,
        _handles=set(),
        _replacements=no_replacements,
    )
    md = SimpleNamespace(
        ledger_id=7,
        digest_type="CRC32C",
        ensemble_size=E,
        write_quorum=qw,
        ack_quorum=qa,
        last_ensemble=SimpleNamespace(bookies=bookies),
    )
    return LedgerHandle(bk, SimpleNamespace(value=md), b"pw", writer=True), conns  # type: ignore[arg-type]


def _frames(buf: bytes) -> list[tuple[int, int]]:
    """(request id, entry id) of each ADD_ENTRY frame in a written buffer."""
    dec = p.FrameDecoder()
    dec.feed(buf)
    return [(r.request_id, r.entry_id) for r in dec.requests()]  # type: ignore[attr-defined]


def _ack(lh: LedgerHandle, conn: FakeConn, status: p.Status = p.Status.OK) -> None:
    rows = [
        (29, 1, int(p.OpCode.ADD_ENTRY), 0, rid, int(status), 7, eid)
        for buf in conn.written + conn.sent
        for rid, eid in _frames(buf)
    ]
    conn.written.clear()
    conn.sent.clear()
    assert lh.on_add_rows(conn.bookie_id, rows) is None


def test_appends_go_out_as_one_write_per_bookie_and_complete_in_order() -> None:
    async def go() -> None:
        lh, conns = _handle(E=3, qw=2, qa=2)
        order: list[tuple[int, LedgerError | None]] = []
        futs = [await lh.append_future(b"x%d" % i) for i in range(3)]
        ids = [await lh.append_callback(b"y%d" % i, lambda e, err: order.append((e, err))) for i in range(3)]
        assert ids == [3, 4, 5]
        await asyncio.sleep(0)  # the batch is flushed once per loop iteration
        for c in conns.values():
            assert len(c.written) == 1
            got = _frames(c.written[0])
            assert all(rid >= ADD_RID_BASE for rid, _ in got)
            assert [e for _, e in got] == [e for e in range(6) if int(c.bookie_id[1]) in write_set(e, 3, 2)]
        _ack(lh, conns["b2"])  # entries 1, 2, 4, 5
        _ack(lh, conns["b1"])  # entries 0, 1, 3, 4: 1 and 4 reach Qa, but entry 0 has not
        assert not any(f.done() for f in futs) and order == [] and lh.last_add_confirmed == -1
        _ack(lh, conns["b0"])
        assert [f.result() for f in futs] == [0, 1, 2]
        assert order == [(3, None), (4, None), (5, None)] and lh.last_add_confirmed == 5
        await asyncio.wait_for(lh._drained(), 1)
        lh._stop_sweeper()

    asyncio.run(go())


def test_back_pressure_waits_for_acks() -> None:
    async def go() -> None:
        lh, conns = _handle(outstanding_adds_max=2)
        await lh.append_future(b"a")
        await lh.append_future(b"b")
        blocked = asyncio.ensure_future(lh.append_future(b"c"))
        await asyncio.sleep(0.01)
        assert not blocked.done()
        _ack(lh, conns["b0"])
        _ack(lh, conns["b1"])
        fut = await asyncio.wait_for(blocked, 1)
        _ack(lh, conns["b0"])
        _ack(lh, conns["b1"])
        assert await fut == 2

    asyncio.run(go())


def test_a_lost_connection_fails_the_bookie_only_if_the_writer_waits_for_it() -> None:
    async def go() -> None:
        lh, conns = _handle(E=3, qw=3, qa=2)
        errors: list[tuple[int, LedgerError | None]] = []
        for _ in range(2):
            await lh.append_callback(b"x", lambda e, err: errors.append((e, err)))
        await asyncio.sleep(0)
        for b in ("b0", "b1", "b2"):
            _ack(lh, conns[b])
        assert errors == [(0, None), (1, None)]
        lh.on_bookie_lost("b1", ConnectionError("gone"))  # nothing pending on b1: no ensemble change
        assert lh._pipe is not None and not lh._pipe.needs_ensemble_change
        await lh.append_callback(b"x", lambda e, err: errors.append((e, err)))
        await asyncio.sleep(0)
        _ack(lh, conns["b0"])
        conns["b1"].closed = True
        lh.on_bookie_lost("b1", ConnectionError("gone"))  # entry 2 waits for b1 -> ensemble change
        assert lh._pipe.failed_indices == {1}
        # no spare bookie (and a zero ensemble-change timeout): the writer fails, entry 2 with it
        for _ in range(50):
            if len(errors) == 3:
                break
            await asyncio.sleep(0.01)
        assert errors[2][0] == 2 and isinstance(errors[2][1], NotEnoughBookiesError)
        with pytest.raises(NotEnoughBookiesError):
            await lh.append_future(b"y")
        lh._stop_sweeper()

    asyncio.run(go())


def test_a_failed_add_status_sends_later_entries_on_the_slow_path_without_the_bookie() -> None:
    async def go() -> None:
        lh, conns = _handle(E=3, qw=3, qa=2)
        lh._maybe_change_ensemble = lambda: None  # type: ignore[method-assign]  (keep the failed bookie)
        await lh.append_future(b"a")
        await asyncio.sleep(0)
        _ack(lh, conns["b2"], p.Status.READONLY)
        assert lh._pipe is not None and lh._pipe.failed_indices == {2}
        lh._drop_routes()
        await lh.append_future(b"b")
        await asyncio.sleep(0)
        assert [e for _, e in _frames(b"".join(conns["b0"].written + conns["b0"].sent))] == [0, 1]
        assert conns["b2"].sent == [] and conns["b2"].written == []
        lh._stop_sweeper()

    asyncio.run(go())


def test_callback_errors_are_logged_not_raised(caplog) -> None:
    async def go() -> None:
        lh, conns = _handle()

        def boom(entry_id: int, err: LedgerError | None) -> None:
            raise RuntimeError("user bug")

        seen: list[int] = []
        await lh.append_callback(b"a", boom)
        await lh.append_callback(b"b", lambda e, err: seen.append(e))
        await asyncio.sleep(0)
        _ack(lh, conns["b0"])
        _ack(lh, conns["b1"])
        assert seen == [1] and lh.last_add_confirmed == 1
        lh._stop_sweeper()

    asyncio.run(go())
    assert "append callback for entry 0 failed" in caplog.text


def test_appends_of_many_tasks_go_out_as_one_write_per_bookie_and_return_their_ids() -> None:
    """The idiom ``asyncio.create_task(lh.append(d))`` per entry: one batch per loop iteration, ids in order."""

    async def go() -> None:
        lh, conns = _handle(E=3, qw=3, qa=2)
        tasks = [asyncio.create_task(lh.append(b"t%d" % i)) for i in range(50)]
        await asyncio.sleep(0)  # the tasks run and add their entries
        await asyncio.sleep(0)  # the batch leaves
        for c in conns.values():
            assert len(c.written) == 1 and [e for _, e in _frames(c.written[0])] == list(range(50))
        _ack(lh, conns["b0"])
        assert not any(t.done() for t in tasks)
        _ack(lh, conns["b2"])
        assert await asyncio.gather(*tasks) == list(range(50))
        assert lh.last_add_confirmed == 49 and not lh._inflight
        lh._stop_sweeper()

    asyncio.run(go())


def test_append_is_one_coroutine_and_one_future_per_entry() -> None:
    """No coroutine layered inside ``append`` (the fast path awaits nothing but the entry's own future)."""

    async def go() -> None:
        lh, conns = _handle()
        coro = lh.append(b"a")
        fut = coro.send(None)  # runs up to its one await: the entry is added, its future is what it waits on
        assert isinstance(fut, asyncio.Future) and lh._inflight[0][1] is fut
        await asyncio.sleep(0)
        _ack(lh, conns["b0"])
        _ack(lh, conns["b1"])
        with pytest.raises(StopIteration) as stop:
            coro.send(None)
        assert stop.value.value == 0
        lh._stop_sweeper()

    asyncio.run(go())


def test_append_many_returns_the_ids_in_order_once_all_are_acknowledged() -> None:
    async def go() -> None:
        lh, conns = _handle(E=3, qw=2, qa=2, outstanding_adds_max=4)
        assert await lh.append_many([]) == []
        many = asyncio.create_task(lh.append_many([b"m%d" % i for i in range(10)]))
        futures = 0
        for _ in range(20):  # more items than outstanding_adds_max: sent as acks free capacity
            await asyncio.sleep(0)
            futures = max(futures, sum(isinstance(w, asyncio.Future) for _, w, _ in lh._inflight.values()))
            for c in conns.values():
                _ack(lh, c)
            if many.done():
                break
        assert await many == list(range(10)) and lh.last_add_confirmed == 9
        assert futures <= 1  # one future for the whole list
        lh._stop_sweeper()

    asyncio.run(go())


def test_append_many_raises_the_writers_error() -> None:
    async def go() -> None:
        lh, conns = _handle(E=3, qw=3, qa=2)
        many = asyncio.create_task(lh.append_many([b"a", b"b", b"c"]))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        _ack(lh, conns["b0"], p.Status.FENCED)
        with pytest.raises(LedgerFencedError):
            await many
        with pytest.raises(LedgerFencedError):
            await lh.append_many([b"d"])
        lh._stop_sweeper()

    asyncio.run(go())


def test_reader_handles_refuse_appends() -> None:
    async def go() -> None:
        lh, _ = _handle()
        lh._stop_sweeper()
        lh._pipe = None
        with pytest.raises(LedgerError):
            await lh.append_future(b"x")
        with pytest.raises(LedgerError):
            await lh.append_callback(b"x", lambda e, err: None)
        with pytest.raises(LedgerError):
            await lh.append(b"x")
        with pytest.raises(LedgerError):
            await lh.append_many([b"x"])

    asyncio.run(go())


def test_acks_outside_a_task_resume_the_appending_tasks_at_once() -> None:
    """Acks arrive in a protocol callback (no task running): each task awaiting ``append`` is resumed by the
    acks' processing, in entry-id order, not in the loop's next iteration. A task that an earlier one's
    continuation cancels is not resumed; a future with another callback is settled as usual."""

    async def go() -> None:
        lh, conns = _handle(E=3, qw=3, qa=2)
        loop = asyncio.get_running_loop()
        order: list[int] = []
        victim: list[asyncio.Task[int]] = []

        async def append(i: int) -> int:
            eid = await lh.append(b"t%d" % i)
            order.append(eid)
            if eid == 1:
                victim[0].cancel()
            return eid

        tasks = [asyncio.create_task(append(i)) for i in range(5)]
        victim.append(tasks[2])
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        lh._inflight[4][1].add_done_callback(lambda f: order.append(-1))  # type: ignore[union-attr]
        seen: list[list[bool]] = []

        def acks() -> None:
            _ack(lh, conns["b0"])
            _ack(lh, conns["b1"])
            seen.append([t.done() for t in tasks])

        loop.call_soon(acks)
        await asyncio.sleep(0)
        assert seen == [[True, True, False, True, False]]  # 2 cancelled (ends next iteration), 4 as usual
        assert order == [0, 1, 3]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert results[:2] == [0, 1] and isinstance(results[2], asyncio.CancelledError)
        assert results[3:] == [3, 4] and order == [0, 1, 3, 4, -1]
        assert lh.last_add_confirmed == 4 and not lh._inflight
        lh._stop_sweeper()

    asyncio.run(go())
