"""The bookie connection's back-pressure state: reading pauses with too many requests in flight or while the peer
does not read our replies, and resumes only when neither holds (no sockets: a recording transport)."""

from __future__ import annotations

import asyncio

from bookie import protocol as p
from bookie.core import BookieCore
from bookie.entryformat import DigestType, EntryCodec
from bookie.memjournal import ManualScheduler, MemoryJournal
from bookie.server import BookieConnection, BookieServer, ServerLimits
from bookie.storage import MemoryLedgerStorage

KEY = p.master_key(b"secret")


class RecordingTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.calls: list[str] = []

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 1) if name == "peername" else None

    def set_write_buffer_limits(self, high: int, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0  # everything written leaves at once

    def abort(self) -> None:
        self.calls.append("abort")

    def close(self) -> None:
        self.calls.append("close")


class Rig:
    def __init__(self, inflight_max: int) -> None:
        self.journal = MemoryJournal()
        self.sched = ManualScheduler()
        core = BookieCore(MemoryLedgerStorage(), self.journal.append, self.sched)
        self.server = BookieServer(core, ServerLimits(inflight_max=inflight_max))
        self.conn = BookieConnection(self.server)
        self.transport = RecordingTransport()
        self.conn.connection_made(self.transport)  # type: ignore[arg-type]
        self.next_entry = 0

    def send_adds(self, n: int) -> None:
        frames = []
        codec = EntryCodec(1, DigestType.CRC32C)
        for _ in range(n):
            e = self.next_entry
            self.next_entry += 1
            entry = codec.build(e, e - 1, 10 * (e + 1), b"x" * 10)
            req = p.AddEntryRequest(request_id=e + 1, ledger_id=1, entry_id=e, master_key=KEY, entry=entry)
            frames.append(p.encode(req))
        self.conn.data_received(b"".join(frames))

    async def commit(self) -> None:
        """The journal makes everything durable; the replies go out."""
        self.journal.sync()
        self.sched.run_ready()
        await asyncio.sleep(0)  # the connection's coalesced write

    def statuses(self) -> list[p.Status]:
        dec = p.FrameDecoder()
        for chunk in self.transport.written:
            dec.feed(chunk)
        return [r.status for r in dec.responses()]


def test_reading_pauses_at_half_the_bound_and_resumes_at_a_quarter() -> None:
    async def go() -> None:
        rig = Rig(inflight_max=8)
        rig.send_adds(3)
        assert rig.transport.calls == []
        rig.send_adds(1)  # 4 in flight: half the bound
        assert rig.transport.calls == ["pause"]
        assert rig.server.backpressure_pauses == 1
        await rig.commit()
        assert rig.transport.calls == ["pause", "resume"]
        assert rig.statuses() == [p.Status.OK] * 4

    asyncio.run(go())


def test_a_peer_that_does_not_read_keeps_reading_paused_after_the_adds_complete() -> None:
    async def go() -> None:
        rig = Rig(inflight_max=8)
        rig.send_adds(4)
        rig.conn.pause_writing()  # our replies pile up too
        await rig.commit()
        assert rig.transport.calls == ["pause"], "resumed while the peer still does not read"
        rig.conn.resume_writing()
        assert rig.transport.calls == ["pause", "resume"]

    asyncio.run(go())


def test_the_peer_draining_does_not_resume_a_connection_with_too_much_in_flight() -> None:
    async def go() -> None:
        rig = Rig(inflight_max=8)
        rig.conn.pause_writing()
        rig.send_adds(4)  # already paused by the peer: no second pause_reading
        rig.conn.resume_writing()
        assert rig.transport.calls == ["pause"], "resumed with half the bound in flight"
        await rig.commit()
        assert rig.transport.calls == ["pause", "resume"]

    asyncio.run(go())


def test_requests_beyond_the_bound_in_one_chunk_are_refused_in_order() -> None:
    async def go() -> None:
        rig = Rig(inflight_max=8)
        rig.send_adds(10)
        await asyncio.sleep(0)
        assert rig.statuses() == [p.Status.TOO_MANY_REQUESTS] * 2
        await rig.commit()
        assert rig.statuses() == [p.Status.TOO_MANY_REQUESTS] * 2 + [p.Status.OK] * 8
        assert rig.server.overloaded == 2

    asyncio.run(go())
