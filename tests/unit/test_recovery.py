"""Ledger recovery as a pure state machine: fencing coverage, #2614, #2615, the tail cut, the length."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie.entryformat import DigestType, EntryCodec, peek_header, peek_lac
from bookie.protocol import Status
from ledger_client.errors import (
    IncorrectParameterError,
    LedgerFencedError,
    LedgerRecoveryError,
    NotEnoughBookiesError,
)
from ledger_client.pending import WritePipeline
from ledger_client.quorum import write_set
from ledger_client.recovery import (
    ChangeEnsemble,
    Close,
    CloseDecision,
    Command,
    FenceRead,
    LedgerRecovery,
    LengthRead,
    Phase,
    RecoveryAdd,
    RecoveryFailed,
    RecoveryRead,
    Segment,
    recovery_close_decision,
    recovery_metadata_decision,
)

OK, NO_ENTRY, NO_LEDGER = Status.OK, Status.NO_ENTRY, Status.NO_LEDGER
CODEC = EntryCodec(1, DigestType.CRC32C)
B3 = ("b1", "b2", "b3")


def entry(eid: int, length: int, lac: int = -1, payload: bytes = b"p") -> bytes:
    return CODEC.build(eid, lac, length, payload)


def of(cmds: list[Command], cls: type) -> list:
    return [c for c in cmds if isinstance(c, cls)]


def recovery(E=3, qw=3, qa=2, segments=((0, B3),), **kw) -> LedgerRecovery:
    return LedgerRecovery(
        ensemble_size=E,
        write_quorum=qw,
        ack_quorum=qa,
        ensembles=[Segment(first_entry_id=f, bookies=tuple(b)) for f, b in segments],
        **kw,
    )


def ack_writebacks(rec: LedgerRecovery, cmds: list[Command]) -> list[Command]:
    out: list[Command] = []
    for c in of(cmds, RecoveryAdd):
        out += rec.on_recovery_add_response(c.entry_id, c.bookie, OK)
    return out


# -- fencing -------------------------------------------------------------------------------------------------


def test_start_fences_every_bookie_of_the_last_segment():
    rec = recovery(segments=((0, ("a", "b", "c")), (4, B3)))
    assert rec.start() == [FenceRead(bookie_index=i, bookie=b) for i, b in enumerate(B3)]
    assert rec.phase is Phase.FENCING


def test_reading_starts_only_at_fencing_coverage_and_from_the_highest_lac():
    rec = recovery(E=4, qw=3, qa=2, segments=((0, ("a", "b", "c", "d")),))
    rec.start()
    assert rec.on_fence_response(0, OK, lac=3) == []
    assert rec.on_fence_response(1, None) == []  # timeout: no answer
    cmds = rec.on_fence_response(2, OK, lac=5)  # write sets {0,1,2},{1,2,3},{2,3,0},{3,0,1}: 3 lacks 2
    assert cmds == []
    cmds = rec.on_fence_response(3, NO_ENTRY, lac=4)
    assert rec.start_entry_id == 5
    reads = of(cmds, RecoveryRead)
    assert reads and reads[0].entry_id == 6
    assert rec.on_fence_response(1, OK, lac=99) == []  # late answers are ignored
    assert rec.start_entry_id == 5


def test_fenced_answer_counts_for_coverage_and_no_ledger_means_lac_minus_one():
    rec = recovery()
    rec.start()
    rec.on_fence_response(0, Status.FENCED, lac=50)
    cmds = rec.on_fence_response(1, NO_LEDGER, lac=70)
    assert rec.start_entry_id == -1 and of(cmds, RecoveryRead)[0].entry_id == 0


def test_fencing_fails_when_too_many_errors_make_coverage_impossible():
    rec = recovery()
    rec.start()
    assert rec.on_fence_response(0, Status.UNAUTHORIZED) == []
    cmds = rec.on_fence_response(1, None)
    assert len(cmds) == 1 and isinstance(cmds[0], RecoveryFailed)
    assert isinstance(cmds[0].error, LedgerRecoveryError) and cmds[0].error.retriable
    assert rec.phase is Phase.FAILED
    assert rec.on_fence_response(2, OK, lac=1) == []


def test_unsafe_coverage_switch_counts_errors():
    rec = recovery(_unsafe_count_all_answers=True)
    rec.start()
    rec.on_fence_response(0, None)
    cmds = rec.on_fence_response(1, Status.INTERNAL)
    assert rec.phase is Phase.READING and of(cmds, RecoveryRead)


# -- #2614 ---------------------------------------------------------------------------------------------------


def test_2614_recovery_reads_carry_the_fence_flag_and_recover_e0():
    """E=Qw=3, Qa=2: the fence to b3 is lost; b1 says NO_ENTRY, b2 holds e0."""
    rec = recovery(read_window=1)
    rec.start()
    rec.on_fence_response(0, NO_ENTRY, lac=-1)
    cmds = rec.on_fence_response(1, OK, lac=-1)  # b3 never answers: 2 of 3 is coverage
    assert cmds == [RecoveryRead(entry_id=0, bookie_indices=(0, 1, 2), bookies=B3, fence=True)]
    e0 = entry(0, length=1)
    assert rec.on_read_response(0, 0, NO_ENTRY) == []
    cmds = rec.on_read_response(0, 1, OK, e0)
    assert [(c.entry_id, c.bookie, c.entry) for c in of(cmds, RecoveryAdd)] == [(0, b, e0) for b in B3]
    assert of(cmds, RecoveryRead) == []  # window 1: entry 1 is read once entry 0 is written back
    cmds = ack_writebacks(rec, cmds)
    (read1,) = of(cmds, RecoveryRead)
    assert read1.entry_id == 1 and read1.fence
    rec.on_read_response(1, 0, NO_ENTRY)
    cmds = rec.on_read_response(1, 2, NO_ENTRY)
    assert cmds == [Close(last_entry_id=0, length=1, ensembles=(Segment(first_entry_id=0, bookies=B3),))]
    assert rec.phase is Phase.DONE


def test_2614_switch_off_sends_unfenced_recovery_reads():
    rec = recovery(fence_on_recovery_reads=False)
    rec.start()
    rec.on_fence_response(0, NO_ENTRY)
    cmds = rec.on_fence_response(1, OK)
    assert all(not r.fence for r in of(cmds, RecoveryRead))


@dataclass
class FakeBookie:
    """Just enough of a bookie: stores entries, persists the fence before answering."""

    entries: dict[int, bytes] = field(default_factory=dict)
    fenced: bool = False

    def add(self, eid: int, data: bytes, recovery_add: bool = False) -> Status:
        if self.fenced and not recovery_add:
            return Status.FENCED
        self.entries[eid] = data
        return OK

    def read(self, eid: int, fence: bool) -> tuple[Status, bytes]:
        known = bool(self.entries) or self.fenced
        if fence:
            self.fenced = True
        if eid in self.entries:
            return OK, self.entries[eid]
        return (NO_ENTRY if known else NO_LEDGER), b""

    def lac(self) -> int:
        return max((peek_lac(d) for d in self.entries.values()), default=-1)


@pytest.mark.parametrize("fence_reads", [True, False])
def test_2614_the_old_writer_cannot_get_an_entry_acked_after_recovery_declared_it_unrecoverable(fence_reads):
    """The TLA+ trace: without fencing recovery reads an acknowledged entry is lost."""
    bookies = {b: FakeBookie() for b in B3}
    writer = WritePipeline(ensemble_size=3, write_quorum=3, ack_quorum=2, ensemble=B3)
    add = writer.next_entry(1)
    e0 = CODEC.build(add.entry_id, add.lac, add.length, b"x")
    acked: list[int] = []
    # w1's e0: lost on the way to b1, stored by b2 (ack), still in flight to b3.
    acked += writer.on_ack(0, "b1", None).completed
    acked += writer.on_ack(0, "b2", bookies["b2"].add(0, e0)).completed
    rec = recovery(fence_on_recovery_reads=fence_reads)
    rec.start()
    # Fencing reads reach b1 and b2; the one to b3 is lost.
    for i in (0, 1):
        st_, _ = bookies[B3[i]].read(-1, fence=True)
        cmds = rec.on_fence_response(i, st_, bookies[B3[i]].lac())
    read0 = of(cmds, RecoveryRead)[0]
    assert read0.entry_id == 0 and read0.fence is fence_reads
    # b1 and b3 answer first: two NO_ENTRY -> unrecoverable, the ledger is empty.
    for i in (0, 2):
        st_, data = bookies[B3[i]].read(0, fence=read0.fence)
        cmds = rec.on_read_response(0, i, st_, data)
    assert of(cmds, Close) == [Close(last_entry_id=-1, length=0, ensembles=rec.ensembles)]
    # Now w1's delayed e0 reaches b3.
    acked += writer.on_ack(0, "b3", bookies["b3"].add(0, e0)).completed
    if fence_reads:
        assert acked == [] and writer.error is not None  # b3 was fenced by the recovery read
    else:
        assert acked == [0]  # the bug: e0 acknowledged to the client, but the ledger closed empty


# -- #2615 and the length ---------------------------------------------------------------------------------


def test_2615_start_is_at_least_the_last_segments_first_entry_minus_one():
    old, new = ("a", "b", "c"), ("d", "e", "f")
    rec = recovery(segments=((0, old), (5, new)))
    rec.start()
    rec.on_fence_response(0, NO_LEDGER)
    cmds = rec.on_fence_response(1, OK, lac=2)  # every LAC seen is lower than 4
    assert rec.start_entry_id == 4
    assert of(cmds, RecoveryRead)[0] == RecoveryRead(
        entry_id=5, bookie_indices=(2, 0, 1), bookies=("f", "d", "e"), fence=True
    )
    for i in (2, 0):
        cmds = rec.on_read_response(5, i, NO_LEDGER)
    # Nothing recovered: the length is that of entry 4, which lives in the previous segment.
    assert cmds == [LengthRead(entry_id=4, bookies=tuple(old[i] for i in write_set(4, 3, 3)))]
    assert rec.on_length_response(4, "b", None) == []
    assert rec.on_length_response(4, "c", OK, entry(4, length=77), valid=False) == []  # bad digest: an error
    cmds = rec.on_length_response(4, "a", OK, entry(4, length=77))
    assert cmds == [Close(last_entry_id=4, length=77, ensembles=rec.ensembles)]
    assert rec.ensembles == (Segment(first_entry_id=0, bookies=old), Segment(first_entry_id=5, bookies=new))


def test_length_read_fails_when_no_bookie_returns_the_start_entry():
    rec = recovery(segments=((0, ("a", "b", "c")), (5, B3)))
    rec.start()
    rec.on_fence_response(0, NO_LEDGER)
    rec.on_fence_response(1, NO_LEDGER)
    rec.on_read_response(5, 2, NO_LEDGER)
    (length_read,) = rec.on_read_response(5, 0, NO_LEDGER)
    assert isinstance(length_read, LengthRead)
    rec.on_length_response(4, "a", NO_ENTRY)
    rec.on_length_response(4, "b", None)
    (failed,) = rec.on_length_response(4, "c", Status.INTERNAL)
    assert isinstance(failed, RecoveryFailed)


def test_empty_ledger_closes_at_minus_one_with_length_zero():
    rec = recovery()
    rec.start()
    rec.on_fence_response(0, NO_LEDGER)
    rec.on_fence_response(2, NO_LEDGER)
    rec.on_read_response(0, 0, NO_LEDGER)
    cmds = rec.on_read_response(0, 2, NO_LEDGER)
    assert of(cmds, Close) == [Close(last_entry_id=-1, length=0, ensembles=rec.ensembles)]


def test_length_is_the_header_length_of_the_last_recovered_entry():
    rec = recovery(read_window=8)
    rec.start()
    rec.on_fence_response(0, OK, lac=1)
    cmds = rec.on_fence_response(1, OK, lac=0)
    assert [r.entry_id for r in of(cmds, RecoveryRead)] == list(range(2, 10))
    out: list[Command] = []
    out += rec.on_read_response(2, 0, OK, entry(2, length=30))
    out += rec.on_read_response(3, 1, OK, entry(3, length=45))
    out += rec.on_read_response(4, 0, NO_ENTRY)
    out += rec.on_read_response(4, 1, NO_ENTRY)
    assert of(out, Close) == []  # write-backs pending
    closes = of(ack_writebacks(rec, out), Close)
    assert closes == [Close(last_entry_id=3, length=45, ensembles=rec.ensembles)]


# -- the tail: in-order decisions ------------------------------------------------------------------------


def test_ledger_ends_at_the_first_unrecoverable_entry_and_later_finds_are_ignored():
    rec = recovery(read_window=6)
    rec.start()
    rec.on_fence_response(0, NO_ENTRY)
    rec.on_fence_response(1, NO_ENTRY)
    out: list[Command] = []
    out += rec.on_read_response(3, 1, OK, entry(3, length=4))  # found past the end: must be ignored
    out += rec.on_read_response(2, 0, NO_ENTRY)
    out += rec.on_read_response(2, 2, NO_ENTRY)  # entry 2 unrecoverable, but 0 and 1 are undecided
    out += rec.on_read_response(5, 1, Status.INTERNAL)
    out += rec.on_read_response(5, 0, None)
    out += rec.on_read_response(5, 2, None)  # entry 5 failed: irrelevant, it is past the end
    assert of(out, RecoveryAdd) == [] and of(out, Close) == [] and of(out, RecoveryFailed) == []
    assert of(out, RecoveryRead) == []  # nothing past entry 2 is read any more
    out += rec.on_read_response(1, 2, OK, entry(1, length=2))
    assert of(out, RecoveryAdd) == []  # entry 0 still undecided: nothing written back out of order
    out += rec.on_read_response(0, 1, OK, entry(0, length=1))
    adds = of(out, RecoveryAdd)
    assert sorted({a.entry_id for a in adds}) == [0, 1]
    assert rec.last_entry_id == 1
    cmds = ack_writebacks(rec, adds)
    assert of(cmds, Close) == [Close(last_entry_id=1, length=2, ensembles=rec.ensembles)]
    assert rec.on_read_response(3, 0, OK, entry(3, length=4)) == []


def test_an_entry_with_no_decision_from_its_whole_write_set_fails_the_attempt():
    rec = recovery()
    rec.start()
    rec.on_fence_response(0, NO_ENTRY)
    rec.on_fence_response(1, NO_ENTRY)
    rec.on_read_response(0, 0, NO_ENTRY)
    rec.on_read_response(0, 1, OK, entry(0, 1), valid=False)  # a bad digest is not a copy
    (failed,) = rec.on_read_response(0, 2, None)
    assert isinstance(failed, RecoveryFailed) and isinstance(failed.error, LedgerRecoveryError)
    assert rec.on_read_response(1, 0, OK, entry(1, 2)) == []


def test_a_copy_whose_header_names_another_entry_is_not_a_copy():
    rec = recovery(E=1, qw=1, qa=1, segments=((0, ("a",)),))
    rec.start()
    rec.on_fence_response(0, NO_ENTRY)
    (failed,) = rec.on_read_response(0, 0, OK, entry(7, 1))
    assert isinstance(failed, RecoveryFailed)


def test_duplicate_and_foreign_answers_are_ignored():
    rec = recovery(E=4, qw=3, qa=2, segments=((0, ("a", "b", "c", "d")),))
    rec.start()
    for i in range(4):
        rec.on_fence_response(i, NO_ENTRY)
    assert rec.on_read_response(0, 0, NO_ENTRY) == []
    assert rec.on_read_response(0, 0, NO_ENTRY) == []  # the same bookie twice counts once
    assert rec.on_read_response(0, 3, NO_ENTRY) == []  # not in entry 0's write set (0, 1, 2)
    cmds = rec.on_read_response(0, 1, NO_ENTRY)
    assert of(cmds, Close)


# -- write-back --------------------------------------------------------------------------------------------


def test_write_back_to_qa_with_ensemble_change_kept_locally_until_close():
    rec = recovery(read_window=2)
    rec.start()
    rec.on_fence_response(0, NO_ENTRY)
    rec.on_fence_response(1, NO_ENTRY)
    e0 = entry(0, 5)
    cmds = rec.on_read_response(0, 1, OK, e0)
    cmds += rec.on_read_response(1, 0, NO_ENTRY)
    cmds += rec.on_read_response(1, 1, NO_ENTRY)
    assert rec.last_entry_id == 0
    assert [(a.bookie, a.entry) for a in of(cmds, RecoveryAdd)] == [(b, e0) for b in B3]
    assert rec.on_recovery_add_response(0, "b1", OK) == []
    (change,) = rec.on_recovery_add_response(0, "b2", Status.READONLY)
    assert isinstance(change, ChangeEnsemble)
    assert change.plan.first_entry_id == 0 and change.plan.failed_indices == {1} and change.ensemble == B3
    assert rec.on_recovery_add_response(0, "b3", OK) == []  # Qa reached, but the ensemble is changing
    cmds = rec.on_ensemble_changed(0, ["b1", "x", "b3"])
    assert cmds == [RecoveryAdd(entry_id=0, bookie_index=1, bookie="x", entry=e0)] + [
        Close(last_entry_id=0, length=5, ensembles=(Segment(first_entry_id=0, bookies=("b1", "x", "b3")),))
    ]


def test_write_back_failures_fail_the_attempt():
    rec = recovery()
    rec.start()
    rec.on_fence_response(0, NO_ENTRY)
    rec.on_fence_response(1, OK, lac=-1)
    rec.on_read_response(0, 1, OK, entry(0, 5))
    (failed,) = rec.on_recovery_add_response(0, "b1", Status.UNAUTHORIZED)
    assert isinstance(failed, RecoveryFailed)
    rec2 = recovery()
    rec2.start()
    rec2.on_fence_response(0, NO_ENTRY)
    rec2.on_fence_response(1, OK, lac=-1)
    rec2.on_read_response(0, 1, OK, entry(0, 5))
    rec2.on_recovery_add_response(0, "b1", None)
    (failed,) = rec2.on_ensemble_change_failed(NotEnoughBookiesError())
    assert isinstance(failed, RecoveryFailed) and isinstance(failed.error.__cause__, NotEnoughBookiesError)


def test_constructor_validates_segments():
    with pytest.raises(IncorrectParameterError):
        recovery(segments=())
    with pytest.raises(IncorrectParameterError):
        recovery(segments=((1, B3),))
    with pytest.raises(IncorrectParameterError):
        recovery(segments=((0, B3), (0, ("x", "y", "z"))))
    with pytest.raises(IncorrectParameterError):
        recovery(segments=((0, ("a", "a", "b")),))


# -- metadata decisions ------------------------------------------------------------------------------------


def test_recovery_metadata_decision():
    assert recovery_metadata_decision("OPEN") == "mark_in_recovery"
    assert recovery_metadata_decision("IN_RECOVERY") == "proceed"
    assert recovery_metadata_decision("CLOSED") == "already_closed"
    with pytest.raises(IncorrectParameterError):
        recovery_metadata_decision("BOGUS")


def test_concurrent_recoverers_converge_on_the_first_close():
    kw = dict(last_entry_id=9, length=90)
    assert recovery_close_decision(
        current_state="IN_RECOVERY", current_last_entry_id=-1, current_length=0, **kw
    ) == CloseDecision("write", 9, 90)
    assert recovery_close_decision(
        current_state="CLOSED", current_last_entry_id=7, current_length=70, **kw
    ) == CloseDecision("adopt", 7, 70)
    with pytest.raises(LedgerRecoveryError):
        recovery_close_decision(current_state="OPEN", current_last_entry_id=-1, current_length=0, **kw)


# -- a randomized protocol-level check: writer and recoverer racing over lossy links ----------------------


class Sim:
    """A writer (with ensemble changes) and a recovery (retried until it closes) racing over a lossy,
    reordering network to in-memory bookies, with the metadata as one compare-and-set cell."""

    def __init__(self, E, qw, qa, n_entries, seed, fence_reads=True, loss=0.2, unsafe_coverage=False):
        self.rng = random.Random(seed)
        self.E, self.qw, self.qa = E, qw, qa
        self.names = [f"b{i}" for i in range(E + 4)]  # spares for ensemble changes
        self.bookies = {b: FakeBookie() for b in self.names}
        ensemble = tuple(self.names[:E])
        self.segments = [Segment(first_entry_id=0, bookies=ensemble)]  # the metadata
        self.state = "OPEN"
        self.writer = WritePipeline(ensemble_size=E, write_quorum=qw, ack_quorum=qa, ensemble=ensemble)
        self.writer_plan = None
        self.written: dict[int, bytes] = {}
        self.acked: list[int] = []
        self.n_entries = n_entries
        self.fence_reads = fence_reads
        self.unsafe_coverage = unsafe_coverage
        self.loss = loss
        self.net: list[tuple] = []
        self.rec: LedgerRecovery | None = None
        self.attempts = 0
        self.closed: Close | None = None
        self.fence_checked: set[int] = set()

    def spare(self, ensemble, k):
        return self.rng.sample([b for b in self.names if b not in ensemble], k)

    def writer_step(self):
        w = self.writer
        if w.error is not None:
            return
        if self.writer_plan is not None:
            # The ensemble change CAS: predicate OPEN (IN_RECOVERY -> fenced, CLOSED -> closed).
            plan, self.writer_plan = self.writer_plan, None
            if self.state != "OPEN":
                w.fail(LedgerFencedError("ensemble change found the ledger in recovery"))
                return
            new = list(w.ensemble)
            for i, b in zip(
                sorted(plan.failed_indices), self.spare(w.ensemble, len(plan.failed_indices)), strict=True
            ):
                new[i] = b
            seg = Segment(first_entry_id=plan.first_entry_id, bookies=tuple(new))
            if self.segments[-1].first_entry_id == plan.first_entry_id:
                self.segments[-1] = seg
            else:
                self.segments.append(seg)
            res = w.apply_new_ensemble(plan.first_entry_id, new)
            self.acked += res.completed
            for r in res.resends:
                self.net.append(("w_add", r.bookie, r.entry_id, self.written[r.entry_id]))
        elif w.needs_ensemble_change and not w.changing_ensemble:
            self.writer_plan = w.ensemble_change_plan()  # the CAS happens at a later step
        elif w.next_entry_id < self.n_entries and w.has_capacity:
            payload = bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(4)))
            add = w.next_entry(len(payload))
            data = CODEC.build(add.entry_id, add.lac, add.length, payload)
            self.written[add.entry_id] = data
            for t in w.targets(add.entry_id):
                self.net.append(("w_add", t.bookie, add.entry_id, data))

    def start_recovery(self):
        assert recovery_metadata_decision(self.state) in ("mark_in_recovery", "proceed")
        self.state = "IN_RECOVERY"
        self.attempts += 1
        self.rec = LedgerRecovery(
            ensemble_size=self.E,
            write_quorum=self.qw,
            ack_quorum=self.qa,
            ensembles=list(self.segments),
            read_window=3,
            fence_on_recovery_reads=self.fence_reads,
            _unsafe_count_all_answers=self.unsafe_coverage,
        )
        self.issue(self.rec.start())

    def issue(self, cmds):
        rec = self.rec
        for c in cmds:
            if isinstance(c, FenceRead):
                self.net.append(("fence", rec, c.bookie_index, c.bookie))
            elif isinstance(c, RecoveryRead):
                for i, b in zip(c.bookie_indices, c.bookies, strict=True):
                    self.net.append(("read", rec, c.entry_id, i, b, c.fence))
            elif isinstance(c, LengthRead):
                for b in c.bookies:
                    self.net.append(("len", rec, c.entry_id, b))
            elif isinstance(c, RecoveryAdd):
                self.net.append(("radd", rec, c.entry_id, c.bookie, c.entry))
            elif isinstance(c, ChangeEnsemble):
                new = list(c.ensemble)
                for i, b in zip(
                    sorted(c.plan.failed_indices),
                    self.spare(c.ensemble, len(c.plan.failed_indices)),
                    strict=True,
                ):
                    new[i] = b
                self.net.append(("changed", rec, c.plan.first_entry_id, new))
            elif isinstance(c, Close):
                d = recovery_close_decision(
                    current_state=self.state,
                    current_last_entry_id=-1,
                    current_length=0,
                    last_entry_id=c.last_entry_id,
                    length=c.length,
                )
                assert d.action == "write" and self.closed is None
                self.state, self.closed, self.segments = "CLOSED", c, list(c.ensembles)
            elif isinstance(c, RecoveryFailed):
                self.rec = None  # retry with a fresh attempt (fences are permanent)

    def check_fencing(self):
        # §10.4 at the moment recovery decides it has coverage: no write set of the last segment still has
        # Qa unfenced bookies, so the old writer cannot complete anything new on its own.
        last = self.segments[-1].bookies
        for s in range(self.E):
            unfenced = [last[i] for i in write_set(s, self.E, self.qw) if not self.bookies[last[i]].fenced]
            assert len(unfenced) < self.qa, ("fencing coverage declared too early", s, unfenced)

    def deliver(self, msg, lost):
        kind = msg[0]
        if kind == "w_add":
            _, b, eid, data = msg
            st_ = None if lost else self.bookies[b].add(eid, data)
            self.net.append(("w_resp", b, eid, st_ if self.rng.random() >= self.loss else None))
        elif kind == "w_resp":
            _, b, eid, st_ = msg
            self.acked += self.writer.on_ack(eid, b, st_).completed
        else:
            rec = msg[1]
            if rec is not self.rec:
                return  # an abandoned attempt
            if kind == "fence":
                _, _, i, b = msg
                if lost:
                    self.issue(rec.on_fence_response(i, None))
                else:
                    st_, _ = self.bookies[b].read(-1, fence=True)
                    self.issue(rec.on_fence_response(i, st_, self.bookies[b].lac()))
                if rec.start_entry_id is not None and id(rec) not in self.fence_checked:
                    self.fence_checked.add(id(rec))
                    self.check_fencing()
            elif kind == "read":
                _, _, eid, i, b, fence = msg
                st_, data = (None, b"") if lost else self.bookies[b].read(eid, fence)
                self.issue(rec.on_read_response(eid, i, st_, data))
            elif kind == "len":
                _, _, eid, b = msg
                st_, data = (None, b"") if lost else self.bookies[b].read(eid, False)
                self.issue(rec.on_length_response(eid, b, st_, data))
            elif kind == "radd":
                _, _, eid, b, data = msg
                st_ = None if lost else self.bookies[b].add(eid, data, recovery_add=True)
                self.issue(rec.on_recovery_add_response(eid, b, st_))
            elif kind == "changed":
                _, _, first, new = msg
                self.issue(rec.on_ensemble_changed(first, new))

    def run(self):
        recovery_at = self.rng.randrange(60)
        for step in range(100_000):
            if self.closed is not None and not self.net:
                return
            if step == recovery_at or (step > recovery_at and self.rec is None and self.closed is None):
                self.start_recovery()
            if self.rng.random() < 0.3:
                self.writer_step()
            if self.net:
                msg = self.net.pop(self.rng.randrange(len(self.net)))
                # Later attempts run on a reliable network, so recovery must eventually close.
                loss = self.loss if self.attempts <= 2 else 0.0
                self.deliver(msg, lost=self.rng.random() < loss)
        raise AssertionError("simulation did not finish")

    def check(self):
        c = self.closed
        assert c is not None, "recovery never closed the ledger"
        # §10.1: every acknowledged entry is in the closed ledger.
        assert all(e <= c.last_entry_id for e in self.acked), (self.acked, c)
        assert self.acked == list(range(len(self.acked)))
        # §10.2 + §10.3: every entry <= last is on >= Qa bookies of its covering segment, byte-identical.
        for e in range(c.last_entry_id + 1):
            seg = [s for s in c.ensembles if s.first_entry_id <= e][-1]
            holders = [seg.bookies[i] for i in write_set(e, self.E, self.qw)]
            copies = [self.bookies[b].entries.get(e) for b in holders]
            assert sum(x == self.written[e] for x in copies) >= self.qa, (e, holders)
            assert all(x is None or x == self.written[e] for x in copies)
        expected_length = peek_header(self.written[c.last_entry_id]).length if c.last_entry_id >= 0 else 0
        assert c.length == expected_length


SHAPES = [(E, qw, qa) for E in range(1, 5) for qw in range(1, E + 1) for qa in range(1, qw + 1)]


@settings(max_examples=300, deadline=None)
@given(shape=st.sampled_from(SHAPES), n=st.integers(0, 8), seed=st.integers(0, 2**32))
def test_randomized_writer_versus_recovery_never_loses_an_acknowledged_entry(shape, n, seed):
    sim = Sim(*shape, n_entries=n, seed=seed)
    sim.run()
    sim.check()


def first_failing_seed(seeds, n_entries=4, **kw):
    for seed in seeds:
        sim = Sim(3, 3, 2, n_entries=n_entries, seed=seed, loss=0.3, **kw)
        try:
            sim.run()
            sim.check()
        except AssertionError:
            return seed
    return None


def test_randomized_search_finds_the_2614_bug_with_unfenced_recovery_reads():
    """The harness has teeth: with the #2614 fix switched off some seed loses an acknowledged entry."""
    # The #2614 interleaving is rare (about 1 seed in 700 here): the search is deterministic, not flaky.
    assert first_failing_seed(range(5000), n_entries=2, fence_reads=False) is not None


def test_randomized_search_catches_unsafe_fencing_coverage():
    assert first_failing_seed(range(3000), unsafe_coverage=True) is not None
