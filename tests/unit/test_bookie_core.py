"""BookieCore rules without sockets: durability before ack, fencing, master keys, long polls, restart."""

from __future__ import annotations

import errno

from hypothesis import example, given, settings
from hypothesis import strategies as st

from bookie import protocol as p
from bookie.core import BookieCore
from bookie.entryformat import DigestType, EntryCodec
from bookie.memjournal import ManualScheduler, MemoryJournal
from bookie.storage import MemoryLedgerStorage

KEY = p.master_key(b"secret")
OTHER = p.master_key(b"wrong")


class Rig:
    def __init__(
        self, storage: MemoryLedgerStorage | None = None, journal: MemoryJournal | None = None
    ) -> None:
        self.storage = storage or MemoryLedgerStorage()
        self.journal = journal or MemoryJournal()
        self.sched = ManualScheduler()
        self.core = BookieCore(self.storage, self.journal.append, self.sched)
        self.replies: list[p.Response] = []
        self.rid = 0

    def reply(self, frame: bytes) -> None:
        self.replies.append(p.decode_one_response(frame))

    def settle(self) -> None:
        self.journal.sync()
        self.sched.run_ready()

    def add(self, ledger: int, entry: int, *, lac: int = -1, key: bytes = KEY, flags: int = 0) -> None:
        self.rid += 1
        data = EntryCodec(ledger, DigestType.CRC32C).build(entry, lac, 10 * (entry + 1), b"x" * 10)
        self.core.add_entry(self.rid, ledger, entry, key, data, flags, self.reply)

    def read(
        self,
        ledger: int,
        entry: int,
        *,
        key: bytes = KEY,
        flags: int = 0,
        prev: int = -1,
        timeout_ms: int = 0,
    ):
        self.rid += 1
        req = p.ReadEntryRequest(
            request_id=self.rid,
            ledger_id=ledger,
            entry_id=entry,
            master_key=key,
            flags=flags,
            previous_lac=prev,
            timeout_ms=timeout_ms,
        )
        self.core.handle(req, self.reply)

    def restart(self) -> Rig:
        """A crash: the journal loses unsynced records; a new core replays what was durable."""
        self.journal.crash()
        fresh_storage = MemoryLedgerStorage()  # storage lost too (nothing was checkpointed): worst case
        new = Rig(fresh_storage, self.journal)
        for rtype, lid, eid, data in self.journal.replay():
            new.core.replay(rtype, lid, eid, data)
        new.core.finish_replay()
        return new


def test_add_is_acknowledged_only_after_journal_sync() -> None:
    r = Rig()
    r.add(1, 0)
    r.sched.run_ready()
    assert r.replies == []
    r.settle()
    assert [(x.status, x.entry_id) for x in r.replies] == [(p.Status.OK, 0)]


def test_acked_entry_is_readable_immediately_after_ack() -> None:
    r = Rig()
    r.add(1, 0)
    r.settle()
    r.read(1, 0)
    resp = r.replies[-1]
    assert isinstance(resp, p.ReadEntryResponse) and resp.status == p.Status.OK
    assert EntryCodec(1, DigestType.CRC32C).verify(resp.entry, 0)[1] == b"x" * 10


def test_wrong_master_key_is_unauthorized_for_every_ledger_request() -> None:
    r = Rig()
    r.add(1, 0)
    r.settle()
    r.add(1, 1, key=OTHER)
    r.read(1, 0, key=OTHER)
    r.read(1, -1, key=OTHER, flags=p.Flag.FENCE)
    r.core.handle(p.ReadLacRequest(request_id=99, ledger_id=1, master_key=OTHER), r.reply)
    r.settle()
    assert [x.status for x in r.replies[1:]] == [p.Status.UNAUTHORIZED] * 4
    assert not r.core.ledgers[1].fenced


def test_fence_then_add_is_fenced_but_recovery_add_succeeds() -> None:
    r = Rig()
    r.add(1, 0)
    r.settle()
    r.read(1, -1, flags=p.Flag.FENCE)
    r.add(1, 1)  # arrives before the fence is durable: already refused
    assert r.replies[-1].status == p.Status.FENCED
    r.settle()
    fence_reply = r.replies[-1]
    assert isinstance(fence_reply, p.ReadEntryResponse) and fence_reply.entry_id == 0
    r.add(1, 1, flags=p.Flag.RECOVERY_ADD)
    r.settle()
    assert r.replies[-1].status == p.Status.OK


def test_fence_reply_waits_for_the_fence_record_to_be_durable() -> None:
    r = Rig()
    r.read(7, -1, flags=p.Flag.FENCE)
    r.sched.run_ready()
    assert r.replies == []
    r.settle()
    assert r.replies[-1].status == p.Status.NO_ENTRY


def test_unknown_ledger_can_be_fenced_so_a_later_add_fails() -> None:
    r = Rig()
    r.read(5, -1, flags=p.Flag.FENCE)
    r.settle()
    r.add(5, 0)
    r.settle()
    assert r.replies[-1].status == p.Status.FENCED


def test_fence_and_master_key_survive_restart() -> None:
    r = Rig()
    r.add(1, 0)
    r.settle()
    r.read(1, -1, flags=p.Flag.FENCE)
    r.settle()
    r2 = r.restart()
    r2.add(1, 1)
    r2.add(1, 2, key=OTHER)
    r2.read(1, 0)
    r2.settle()
    assert [x.status for x in r2.replies] == [p.Status.FENCED, p.Status.UNAUTHORIZED, p.Status.OK]


def test_unsynced_add_is_lost_on_crash_and_was_never_acked() -> None:
    r = Rig()
    r.add(1, 0)
    r.settle()
    r.add(1, 1)  # never synced
    r2 = r.restart()
    r2.read(1, 1)
    r2.read(1, 0)
    assert [x.status for x in r2.replies] == [p.Status.NO_ENTRY, p.Status.OK]
    assert [x.entry_id for x in r.replies] == [0]


def test_read_of_unknown_ledger_is_no_ledger_and_missing_entry_is_no_entry() -> None:
    r = Rig()
    r.read(3, 0)
    r.add(1, 0)
    r.settle()
    r.read(1, 5)
    assert [x.status for x in r.replies] == [p.Status.NO_LEDGER, p.Status.OK, p.Status.NO_ENTRY]


def test_read_last_returns_last_entry_and_piggybacked_lac() -> None:
    r = Rig()
    r.add(1, 0, lac=-1)
    r.add(1, 1, lac=0)
    r.add(1, 2, lac=1)
    r.settle()
    r.read(1, -1)
    resp = r.replies[-1]
    assert isinstance(resp, p.ReadEntryResponse)
    assert (resp.status, resp.entry_id, resp.lac) == (p.Status.OK, 2, 1)


def test_long_poll_answers_when_lac_advances() -> None:
    r = Rig()
    r.add(1, 0, lac=-1)
    r.settle()
    r.read(1, -1, flags=p.Flag.LONG_POLL, prev=-1, timeout_ms=5000)
    r.sched.run_ready()
    assert len(r.replies) == 1  # still waiting: LAC is -1
    r.add(1, 1, lac=0)
    r.settle()
    r.sched.run_ready()
    lac_replies = [x for x in r.replies if isinstance(x, p.ReadEntryResponse)]
    assert lac_replies and lac_replies[0].lac == 0


def test_long_poll_answers_at_timeout_without_progress() -> None:
    r = Rig()
    r.add(1, 0, lac=-1)
    r.settle()
    r.read(1, -1, flags=p.Flag.LONG_POLL, prev=-1, timeout_ms=2000)
    r.sched.run_until(1.0)
    assert len(r.replies) == 1
    r.sched.run_until(2.5)
    assert len(r.replies) == 2 and r.replies[-1].lac == -1


def test_journal_enospc_answers_readonly_and_turns_bookie_readonly() -> None:
    r = Rig()
    r.journal.fail_with = OSError(errno.ENOSPC, "No space left on device")
    r.add(1, 0)
    r.settle()
    assert r.replies[-1].status == p.Status.READONLY
    assert r.core.readonly
    r.journal.fail_with = None
    r.add(1, 1)
    r.settle()
    assert r.replies[-1].status == p.Status.READONLY


def test_add_with_header_for_another_entry_is_bad_request() -> None:
    r = Rig()
    data = EntryCodec(1, DigestType.CRC32C).build(3, -1, 1, b"x")
    r.core.add_entry(1, 1, 4, KEY, data, 0, r.reply)
    assert r.replies[-1].status == p.Status.BAD_REQUEST


def test_read_range_returns_consecutive_entries() -> None:
    r = Rig()
    for e in range(5):
        r.add(2, e)
    r.settle()
    r.core.handle(
        p.ReadRangeRequest(request_id=50, ledger_id=2, first_entry_id=1, last_entry_id=10, master_key=KEY),
        r.reply,
    )
    resp = r.replies[-1]
    assert isinstance(resp, p.ReadRangeResponse) and len(resp.entries) == 4
    codec = EntryCodec(2, DigestType.CRC32C)
    assert [codec.verify(e)[0].entry_id for e in resp.entries] == [1, 2, 3, 4]


def test_read_range_with_a_step_returns_every_step_th_entry_up_to_a_missing_one() -> None:
    """A bookie of an E3/Qw2 ledger holds two entries in three; asked for one residue it returns just those."""
    r = Rig()
    for e in range(30):
        if (1 - e) % 3 < 2:  # bookie 1 of the ensemble: entries 0, 1, 3, 4, 6, 7, ...
            r.add(2, e)
    r.settle()
    codec = EntryCodec(2, DigestType.CRC32C)

    def read_range(first: int, last: int, step: int, max_bytes: int = 1 << 20) -> p.ReadRangeResponse:
        r.core.handle(
            p.ReadRangeRequest(
                request_id=51, ledger_id=2, first_entry_id=first, last_entry_id=last, master_key=KEY,
                max_bytes=max_bytes, step=step,
            ),
            r.reply,
        )  # fmt: skip
        resp = r.replies[-1]
        assert isinstance(resp, p.ReadRangeResponse) and resp.first_entry_id == first
        return resp

    resp = read_range(1, 100, 3)  # residue 1: all held, up to the bookie's last entry
    assert [codec.verify(e)[0].entry_id for e in resp.entries] == list(range(1, 29, 3))
    resp = read_range(0, 29, 3)
    assert [codec.verify(e)[0].entry_id for e in resp.entries] == list(range(0, 28, 3))
    assert read_range(2, 29, 3).status == p.Status.NO_ENTRY  # a residue it does not hold
    assert [codec.verify(e)[0].entry_id for e in read_range(0, 29, 1).entries] == [0, 1]  # step 1: stops at 2
    resp = read_range(0, 29, 3, max_bytes=100)  # the byte limit: at least one entry
    assert [codec.verify(e)[0].entry_id for e in resp.entries] == [0, 3]  # 46 bytes each
    assert read_range(0, 29, 0).status == p.Status.BAD_REQUEST


def test_write_lac_then_read_lac() -> None:
    r = Rig()
    r.add(1, 0)
    r.settle()
    codec = EntryCodec(1, DigestType.CRC32C)
    r.core.handle(
        p.WriteLacRequest(request_id=9, ledger_id=1, lac=0, master_key=KEY, lac_blob=codec.build_lac(0)),
        r.reply,
    )
    r.settle()
    r.core.handle(p.ReadLacRequest(request_id=10, ledger_id=1, master_key=KEY), r.reply)
    resp = r.replies[-1]
    assert (
        isinstance(resp, p.ReadLacResponse)
        and resp.explicit_lac == 0
        and codec.verify_lac(resp.lac_blob) == 0
    )


def test_batched_adds_follow_the_same_rules_and_ack_only_after_sync() -> None:
    r = Rig()
    r.add(9, 0)
    r.settle()
    r.read(9, -1, flags=p.Flag.FENCE)
    r.settle()
    codec1 = EntryCodec(1, DigestType.CRC32C)
    codec9 = EntryCodec(9, DigestType.CRC32C)
    items = [  # (flags, rid, ledger, entry, key, entry bytes), as the server decodes them
        (0, 101, 1, 0, KEY, codec1.build(0, -1, 1, b"a")),
        (0, 102, 1, 1, KEY, codec1.build(1, 0, 2, b"b")),
        (0, 103, 1, 2, OTHER, codec1.build(2, 1, 3, b"c")),  # wrong key
        (0, 104, 9, 1, KEY, codec9.build(1, 0, 2, b"d")),  # fenced
        (p.Flag.RECOVERY_ADD, 105, 9, 1, KEY, codec9.build(1, 0, 2, b"d")),
        (0, 106, 1, 7, KEY, codec1.build(3, 1, 3, b"e")),  # header names another entry
    ]
    got: list[tuple[bytes, int]] = []
    r.core.add_entries(items, lambda frames, n: got.append((frames, n)))
    assert len(got) == 1 and got[0][1] == 3  # refusals answer at once
    r.sched.run_ready()
    assert len(got) == 1  # nothing acked before the journal sync
    r.settle()
    assert len(got) == 2 and got[1][1] == 3
    dec = p.FrameDecoder()
    dec.feed(got[0][0] + got[1][0])
    statuses = {m.request_id: m.status for m in dec.responses()}
    assert statuses == {
        101: p.Status.OK,
        102: p.Status.OK,
        103: p.Status.UNAUTHORIZED,
        104: p.Status.FENCED,
        105: p.Status.OK,
        106: p.Status.BAD_REQUEST,
    }
    r.read(1, 1)
    assert r.replies[-1].status == p.Status.OK and r.core.ledgers[1].lac == 0


def test_a_ledger_deleted_while_its_adds_wait_for_the_journal_is_not_written_back() -> None:
    r = Rig()
    r.add(4, 0)
    r.add(5, 0)
    r.core.delete_ledger(4)  # garbage collection runs before the group's journal sync
    r.settle()
    assert r.storage.get_entry(4, 0) is None and 4 not in r.storage.load_index()
    assert r.storage.get_entry(5, 0) is not None and 5 in r.storage.load_index()
    r.read(4, 0)
    assert r.replies[-1].status == p.Status.NO_LEDGER


_row_shapes = st.tuples(
    st.sampled_from([0, p.Flag.RECOVERY_ADD]),
    st.sampled_from([1, 1, 1, 5, 9, 3]),  # 1 and 5 open, 9 fenced, 3 new
    st.sampled_from([KEY, KEY, KEY, OTHER]),
    st.integers(-1, 6),
    st.sampled_from(["ok", "ok", "ok", "other entry", "other ledger", "short"]),
    st.integers(-1, 5),  # piggybacked LAC
)


def _rig_for_batches() -> Rig:
    r = Rig()
    for lid in (1, 5, 9):
        r.add(lid, 0)
    r.settle()
    r.read(9, -1, flags=p.Flag.FENCE)
    r.settle()
    return r


@settings(max_examples=400, deadline=None)
@given(
    shapes=st.lists(_row_shapes, min_size=1, max_size=8),
    one_ledger=st.sampled_from([None, 1, 9, 3]),
    clean=st.booleans(),
    spoiler=st.one_of(st.none(), st.tuples(st.integers(0, 7), _row_shapes)),
)
@example(
    shapes=[(0, 1, KEY, 0, "ok", 0)] * 2, one_ledger=1, clean=True, spoiler=(1, (0, 1, KEY, -1, "ok", 0))
)
@example(
    shapes=[(0, 1, KEY, 0, "ok", 0)] * 2, one_ledger=3, clean=True, spoiler=(2, (0, 1, OTHER, 1, "ok", 0))
)
@example(
    shapes=[(0, 1, KEY, 0, "ok", 0)] * 2, one_ledger=1, clean=True, spoiler=(0, (0, 1, KEY, 1, "short", 0))
)
@example(shapes=[(0, 1, KEY, 0, "ok", 0)] * 3, one_ledger=9, clean=False, spoiler=None)
@example(shapes=[(p.Flag.RECOVERY_ADD, 1, KEY, 2, "ok", 1)] * 3, one_ledger=9, clean=False, spoiler=None)
def test_the_column_fast_path_decides_every_batch_as_the_row_by_row_path(
    shapes, one_ledger, clean, spoiler
) -> None:
    """``add_entries`` takes a column-by-column fast path for a batch of one ledger's well-formed adds; any
    batch must get the same replies, storage, index and journal either way."""
    if clean:  # mostly well-formed batches, so that one odd row (the spoiler) decides
        shapes = [(0, lid, KEY, abs(eid), "ok", lac) for _, lid, _, eid, _, lac in shapes]
    if spoiler is not None:
        shapes.insert(min(spoiler[0], len(shapes)), spoiler[1])
    rows = []
    for i, (flags, lid, key, eid, kind, lac) in enumerate(shapes):
        lid = one_ledger if one_ledger is not None else lid
        hl, he = (
            (lid + 1, eid) if kind == "other ledger" else (lid, eid + 1 if kind == "other entry" else eid)
        )
        entry = EntryCodec(hl, DigestType.CRC32C).build(max(he, 0), lac, 10, b"p%d" % i)
        entry = entry[:10] if kind == "short" else entry[:8] + he.to_bytes(8, "big", signed=True) + entry[16:]
        rows.append((flags, 200 + i, lid, eid, key, entry))
    fast, slow = _rig_for_batches(), _rig_for_batches()
    slow.core._add_run = lambda rows, reply, heads: False  # type: ignore[method-assign]
    took: list[bool] = []
    run = fast.core._add_run
    fast.core._add_run = lambda rows, reply, heads: took.append(run(rows, reply, heads)) or took[-1]  # type: ignore[method-assign]
    got: dict[str, list[tuple[bytes, int]]] = {"fast": [], "slow": []}
    for name, r in (("fast", fast), ("slow", slow)):
        r.core.add_entries(list(rows), lambda frames, n, name=name: got[name].append((frames, n)))
        r.settle()
    assert got["fast"] == got["slow"]
    assert fast.storage.entries == slow.storage.entries and fast.storage.index == slow.storage.index
    assert fast.core.ledgers == slow.core.ledgers and fast.core.stats == slow.core.stats
    assert list(fast.journal.replay()) == list(slow.journal.replay())
    if clean and spoiler is None and one_ledger in (1, 3) and len(rows) > 1:
        assert took == [True]  # the fast path did serve it


class _FailingStorage(MemoryLedgerStorage):
    """Storage whose entry 1 of every ledger cannot be read (a corrupt run, an I/O error)."""

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        if entry_id == 1:
            raise ValueError("run value of 7 bytes cannot hold 3 entry lengths")
        return super().get_entry(ledger_id, entry_id)

    def get_range(self, ledger_id: int, first: int, last: int, max_bytes: int, step: int = 1) -> list[bytes]:
        if first <= 1 <= last:
            raise OSError(5, "Input/output error")
        return super().get_range(ledger_id, first, last, max_bytes, step)


def test_a_storage_read_error_is_answered_internal_never_no_entry() -> None:
    """A recovering client counts NO_ENTRY as "this bookie does not have it" and may cut the ledger there, so an
    entry the bookie cannot read must be an error. The connection and the bookie go on serving."""
    r = Rig(_FailingStorage())
    for e in range(3):
        r.add(2, e)
    r.settle()
    r.read(2, 1)
    assert r.replies[-1].status == p.Status.INTERNAL
    r.read(2, 1, flags=p.Flag.FENCE)  # a recovery read: fences, then answers
    r.settle()
    assert r.replies[-1].status == p.Status.INTERNAL and r.core.ledgers[2].fenced
    r.core.handle(
        p.ReadRangeRequest(request_id=60, ledger_id=2, first_entry_id=0, last_entry_id=2, master_key=KEY),
        r.reply,
    )
    assert r.replies[-1].status == p.Status.INTERNAL
    r.read(2, 2)
    assert r.replies[-1].status == p.Status.OK
    assert r.core.stats.storage_read_errors == 3 and r.core.stats.by_status["INTERNAL"] == 3
