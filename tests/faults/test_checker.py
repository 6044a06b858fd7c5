"""The history checker on synthetic histories: a clean history passes, and each violation kind is caught."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from tests.faults.checker import KINDS, FinalLedger, Violation, check, excerpt, format_table, summarize
from tests.faults.history import History, load_history

L = 7
COVERED: set[str] = set()


def catches(*kinds: str) -> Any:
    """Marks a test as showing that the checker catches these violation kinds."""
    COVERED.update(kinds)
    return lambda fn: fn


class Builder:
    """Synthetic histories: times advance by 1 per record unless given."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._t = itertools.count(1)
        self._ops = itertools.count()

    def rec(self, proc: str, op: str, t: float | None = None, **f: Any) -> dict[str, Any]:
        r = {"proc": proc, "op": op, "t": float(next(self._t)) if t is None else t, **f}
        self.records.append(r)
        return r

    def create(self, ledger: int = L, proc: str = "w0") -> None:
        self.rec(proc, "create", phase="ok", ledger=ledger)

    def invoke(self, digest: str, ledger: int = L, proc: str = "w0", t: float | None = None) -> str:
        op_id = f"{proc}-{next(self._ops)}"
        self.rec(proc, "append", t, phase="invoke", ledger=ledger, op_id=op_id, digest=digest, size=10)
        return op_id

    def ok(self, op_id: str, entry_id: int, ledger: int = L, t: float | None = None) -> None:
        proc = op_id.rsplit("-", 1)[0]
        self.rec(proc, "append", t, phase="ok", ledger=ledger, op_id=op_id, entry_id=entry_id)

    def append(self, digest: str, entry_id: int, ledger: int = L, proc: str = "w0") -> None:
        self.ok(self.invoke(digest, ledger, proc), entry_id, ledger)

    def read(self, entry_id: int, digest: str, ledger: int = L, proc: str = "r0", handle: str = "h0") -> None:
        self.rec(proc, "read", ledger=ledger, entry_id=entry_id, digest=digest, handle=handle)

    def lac(self, lac: int, ledger: int = L, proc: str = "r0", handle: str = "h0") -> None:
        self.rec(proc, "lac", ledger=ledger, handle=handle, lac=lac)

    def recover(self, last: int, ledger: int = L, proc: str = "c0", t: float | None = None) -> None:
        self.rec(proc, "recover", t, phase="invoke", ledger=ledger)
        self.rec(proc, "recover", t, phase="ok", ledger=ledger, last_entry_id=last)

    def close(self, last: int, ledger: int = L, proc: str = "w0") -> None:
        self.rec(proc, "close", phase="ok", ledger=ledger, last_entry_id=last)


def clean() -> tuple[Builder, dict[int, FinalLedger]]:
    """w0 acks a, b, c as entries 0..2; d is sent but never acknowledged (and not recovered); a reader follows;
    a recoverer fences and closes at 2; the final read agrees."""
    b = Builder()
    b.create()
    b.append("a", 0)
    b.lac(-1)
    b.append("b", 1)
    b.read(0, "a")
    b.lac(0)
    b.append("c", 2)
    b.invoke("d")
    b.lac(1)
    b.read(1, "b")
    b.recover(2)
    b.read(2, "c", proc="c0", handle="c0-r1")
    b.rec("w0", "append", phase="fail", ledger=L, op_id="w0-3", error="FENCED")
    b.lac(2, handle="h1")
    return b, {L: FinalLedger("CLOSED", 2, {0: "a", 1: "b", 2: "c"})}


def kinds(vs: list[Violation]) -> set[str]:
    return {v.kind for v in vs}


def test_clean_history_has_no_violations() -> None:
    b, final = clean()
    assert check(b.records, final) == []


def test_unacknowledged_entry_may_or_may_not_survive() -> None:
    b, _ = clean()
    # the recovery found the unacknowledged "d" and kept it: fine either way
    final = {L: FinalLedger("CLOSED", 3, {0: "a", 1: "b", 2: "c", 3: "d"})}
    b.records = [r for r in b.records if r["op"] != "recover"]
    b.recover(3)
    assert check(b.records, final) == []


@catches("lost")
def test_lost_acked_entry_beyond_last_entry_id() -> None:
    b, _ = clean()
    vs = check(b.records, {L: FinalLedger("CLOSED", 1, {0: "a", 1: "b"})})
    assert "lost" in kinds(vs)
    lost = [v for v in vs if v.kind == "lost"]
    assert lost[0].entry_id == 2 and "beyond last_entry_id 1" in lost[0].detail


@catches("lost", "unreadable")
def test_lost_acked_entry_unreadable_at_the_end() -> None:
    b, _ = clean()
    vs = check(b.records, {L: FinalLedger("CLOSED", 2, {0: "a", 1: None, 2: "c"})})
    assert {"lost", "unreadable"} <= kinds(vs)


@catches("wrong_bytes")
def test_wrong_bytes_in_the_final_read() -> None:
    b, _ = clean()
    b.invoke("x")  # x was sent to the ledger, but entry 1 was acknowledged as b
    vs = check(b.records, {L: FinalLedger("CLOSED", 2, {0: "a", 1: "x", 2: "c"})})
    assert "wrong_bytes" in kinds(vs)
    assert "phantom" not in kinds(vs)


@catches("wrong_bytes", "divergent_read")
def test_wrong_bytes_in_a_read_during_the_run() -> None:
    b, final = clean()
    b.invoke("x")
    b.read(0, "x", proc="r1")
    assert {"wrong_bytes", "divergent_read"} <= kinds(check(b.records, final))


@catches("divergent_read")
def test_divergent_reads_of_an_unacknowledged_entry() -> None:
    b = Builder()
    b.create()
    b.append("a", 0)
    b.invoke("b")
    b.invoke("b2")
    b.read(1, "b", proc="c0")
    b.read(1, "b2", proc="c1")
    b.recover(1)
    vs = check(b.records, {L: FinalLedger("CLOSED", 1, {0: "a", 1: "b"})})
    assert kinds(vs) == {"divergent_read"}


@catches("conflicting_acks")
def test_conflicting_acks_for_one_entry() -> None:
    b, final = clean()
    b.append("z", 1, proc="w1")  # a second writer acknowledged for the same (ledger, entry)
    assert "conflicting_acks" in kinds(check(b.records, final))


@catches("phantom")
def test_phantom_payload_never_appended() -> None:
    b, final = clean()
    b.read(1, "never-written", proc="r1")
    assert "phantom" in kinds(check(b.records, final))


@catches("phantom")
def test_payload_at_two_entry_ids_is_phantom() -> None:
    b = Builder()
    b.create()
    b.append("a", 0)
    b.invoke("b")
    b.recover(2)
    vs = check(b.records, {L: FinalLedger("CLOSED", 2, {0: "a", 1: "b", 2: "b"})})
    assert kinds(vs) == {"phantom"}


@catches("lac_regressed")
def test_lac_going_backwards_on_one_handle() -> None:
    b, final = clean()
    b.lac(0)  # handle h0 saw 1 before
    vs = check(b.records, final)
    assert kinds(vs) == {"lac_regressed"}


def test_lac_lower_on_a_new_handle_is_fine() -> None:
    b, final = clean()
    b.lac(0, handle="h7")
    assert check(b.records, final) == []


@catches("beyond_end")
def test_lac_beyond_the_end() -> None:
    b, final = clean()
    b.lac(5, handle="h1")
    assert kinds(check(b.records, final)) == {"beyond_end"}


@catches("beyond_end")
def test_read_beyond_the_end() -> None:
    b, final = clean()
    b.invoke("e")
    b.read(3, "e")
    assert "beyond_end" in kinds(check(b.records, final))


@catches("ack_after_fence")
def test_append_sent_after_recovery_returned_yet_acked() -> None:
    b = Builder()
    b.create()
    b.append("a", 0)
    b.recover(1, t=10.0)
    op = b.invoke("b", t=11.0)  # sent after the recoverer's open returned
    b.ok(op, 1, t=12.0)
    vs = check(b.records, {L: FinalLedger("CLOSED", 1, {0: "a", 1: "b"})})
    assert kinds(vs) == {"ack_after_fence"}


@catches("ack_after_fence", "lost")
def test_append_acked_after_recovery_beyond_its_end() -> None:
    b = Builder()
    b.create()
    b.append("a", 0)
    op = b.invoke("b", t=5.0)
    b.recover(0, t=10.0)
    b.ok(op, 1, t=11.0)
    vs = check(b.records, {L: FinalLedger("CLOSED", 0, {0: "a"})})
    assert {"ack_after_fence", "lost"} <= kinds(vs)


def test_late_ack_of_an_entry_the_recovery_kept_is_fine() -> None:
    b = Builder()
    b.create()
    op = b.invoke("a", t=5.0)
    b.recover(0, t=10.0)
    b.ok(op, 0, t=11.0)  # the bookies acked before the fence; the writer heard late
    assert check(b.records, {L: FinalLedger("CLOSED", 0, {0: "a"})}) == []


@catches("recover_disagree")
def test_recoverers_disagree() -> None:
    b, final = clean()
    b.recover(1, proc="c1")
    vs = check(b.records, final)
    assert kinds(vs) == {"recover_disagree"}


@catches("recover_disagree")
def test_writer_close_disagrees_with_final() -> None:
    b = Builder()
    b.create()
    b.append("a", 0)
    b.append("b", 1)
    b.close(1)
    vs = check(b.records, {L: FinalLedger("CLOSED", 2, {0: "a", 1: "b", 2: "b"})})
    assert "recover_disagree" in kinds(vs)


@catches("unrecovered")
def test_unrecovered_ledgers() -> None:
    b, _ = clean()
    b.create(ledger=8)
    vs = check(b.records, {L: FinalLedger("IN_RECOVERY", -1, {})})
    assert [v.ledger for v in vs if v.kind == "unrecovered"] == [L, 8]


def test_every_violation_kind_is_shown_caught() -> None:
    assert set(KINDS) == COVERED


def test_history_files_round_trip_and_tolerate_a_torn_tail(tmp_path: Path) -> None:
    h = History(tmp_path / "w0.jsonl", "w0")
    h.record("create", phase="ok", ledger=L)
    h.record("append", phase="invoke", ledger=L, op_id="w0-0", digest="a", size=1)
    h.close()
    with open(tmp_path / "w0.jsonl", "a") as f:
        f.write('{"proc": "w0", "op": "app')  # killed mid-write
    recs = load_history([tmp_path / "w0.jsonl"])
    assert [r["op"] for r in recs] == ["create", "append"]


def test_summary_table_and_excerpt() -> None:
    b, final = clean()
    b.rec("nemesis", "fault", kind="kill9", target="b1", phase="start")
    b.rec("nemesis", "fault", kind="kill9", target="b1", phase="end")
    s = summarize(b.records, final)
    assert s["faults"] == {"kill9": 1} and s["ledgers"] == 1 and s["entries"] == 3
    assert s["ops"]["append ok"] == 3 and s["ops"]["append fail"] == 1
    table = format_table(s, [], header="h")
    assert "violations" in table and "kill9" in table
    vio = Violation("lost", L, 2, "x")
    assert any(r.get("entry_id") == 2 for r in excerpt(b.records, vio))
