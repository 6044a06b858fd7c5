"""The history checker of the fault run (docs/architecture.md §10, invariants 1, 3, 4, 5, 6): a pure function
of the history records (``history.py``) and of what the final phase read back after healing everything.

``check(history, final)`` returns every violation found; kinds:

* ``lost``             an acknowledged append is beyond the closed ledger's last_entry_id, or unreadable at the end
* ``wrong_bytes``      a read (during the run or at the end) returned other bytes than the acknowledged append
* ``divergent_read``   two reads of one (ledger, entry) returned different bytes
* ``conflicting_acks`` two appends were acknowledged with one (ledger, entry) but different payloads
* ``phantom``          a read returned a payload no writer ever appended to that ledger, or one payload sits at two
                       entry ids
* ``unreadable``       an entry ≤ last_entry_id of a closed ledger could not be read at the end
* ``lac_regressed``    one reader handle's LAC went backwards
* ``beyond_end``       a reader saw a LAC, or read an entry, beyond the closed ledger's last_entry_id
* ``ack_after_fence``  a writer had an append acknowledged that it sent after a recovery of that ledger had
                       returned (the recoverer's ``open_ledger`` completed), or one acknowledged after that
                       recovery returned with an entry id beyond the recovered end
* ``recover_disagree`` a recoverer or the writer's own close reported another last_entry_id than the final one
* ``unrecovered``      a ledger is not CLOSED after the final recovery (or missing from the final reads)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

KINDS = (
    "lost",
    "wrong_bytes",
    "divergent_read",
    "conflicting_acks",
    "phantom",
    "unreadable",
    "lac_regressed",
    "beyond_end",
    "ack_after_fence",
    "recover_disagree",
    "unrecovered",
)


@dataclass(frozen=True)
class FinalLedger:
    """What the final phase found: the ledger's state and last_entry_id after recovery, and the digest of every
    entry 0..last_entry_id read back (``None``: no replica could serve it)."""

    state: str
    last_entry_id: int
    entries: Mapping[int, str | None] = field(default_factory=dict)
    error: str = ""  # why the final recovery failed, if it did

    @property
    def closed(self) -> bool:
        return self.state == "CLOSED"


@dataclass(frozen=True)
class Violation:
    kind: str
    ledger: int
    entry_id: int | None
    detail: str

    def __str__(self) -> str:
        where = f"ledger {self.ledger}" + (f" entry {self.entry_id}" if self.entry_id is not None else "")
        return f"{self.kind}: {where}: {self.detail}"


def check(history: Iterable[Mapping[str, Any]], final: Mapping[int, FinalLedger]) -> list[Violation]:
    records = sorted(history, key=lambda r: r.get("t", 0.0))
    out: list[Violation] = []

    def v(kind: str, ledger: int, entry_id: int | None, detail: str) -> None:
        out.append(Violation(kind, ledger, entry_id, detail))

    # -- index the history -----------------------------------------------------------------------------
    invokes: dict[str, Mapping[str, Any]] = {}  # op_id -> append invoke
    invoked: dict[int, set[str]] = defaultdict(set)  # ledger -> digests ever sent
    acks: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = []  # (invoke, ok)
    reads: dict[tuple[int, int], list[Mapping[str, Any]]] = defaultdict(list)
    lacs: dict[tuple[str, str, int], list[Mapping[str, Any]]] = defaultdict(list)
    recoveries: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    closes: list[Mapping[str, Any]] = []
    created: set[int] = set()
    for r in records:
        op, phase = r.get("op"), r.get("phase")
        if op == "append" and phase == "invoke":
            invokes[r["op_id"]] = r
            invoked[r["ledger"]].add(r["digest"])
        elif op == "append" and phase == "ok":
            inv = invokes.get(r["op_id"])
            if inv is not None:
                acks.append((inv, r))
        elif op == "read":
            reads[(r["ledger"], r["entry_id"])].append(r)
        elif op == "lac":
            lacs[(r["proc"], r["handle"], r["ledger"])].append(r)
        elif op == "recover" and phase == "ok":
            recoveries[r["ledger"]].append(r)
        elif op == "close" and phase == "ok":
            closes.append(r)
        elif op == "create" and phase == "ok":
            created.add(r["ledger"])

    # -- every ledger is closed at the end -------------------------------------------------------------
    ledgers = created | set(final) | {inv["ledger"] for inv, _ in acks}
    for lid in sorted(ledgers):
        fin = final.get(lid)
        if fin is None:
            v("unrecovered", lid, None, "not in the final reads")
        elif not fin.closed:
            v("unrecovered", lid, None, f"state {fin.state} after the final recovery: {fin.error}")
        else:
            for eid in range(fin.last_entry_id + 1):
                if fin.entries.get(eid) is None:
                    v("unreadable", lid, eid, f"no replica served it (last_entry_id {fin.last_entry_id})")

    def closed_final(lid: int) -> FinalLedger | None:
        fin = final.get(lid)
        return fin if fin is not None and fin.closed else None

    # -- acknowledged appends --------------------------------------------------------------------------
    acked: dict[tuple[int, int], dict[str, Mapping[str, Any]]] = defaultdict(dict)  # digest -> ok record
    for inv, ok in acks:
        lid, eid, d = inv["ledger"], ok["entry_id"], inv["digest"]
        acked[(lid, eid)][d] = ok
        fin = closed_final(lid)
        if fin is None:
            continue
        if eid > fin.last_entry_id:
            v(
                "lost",
                lid,
                eid,
                f"acked to {ok['proc']} ({inv['op_id']}) beyond last_entry_id {fin.last_entry_id}",
            )
        elif fin.entries.get(eid) is None:
            v("lost", lid, eid, f"acked to {ok['proc']} ({inv['op_id']}) but unreadable at the end")
    for (lid, eid), by_digest in sorted(acked.items()):
        if len(by_digest) > 1:
            who = ", ".join(f"{d} by {r['proc']}" for d, r in by_digest.items())
            v("conflicting_acks", lid, eid, f"acknowledged with different payloads: {who}")

    # -- reads: identical bytes, known payloads ----------------------------------------------------------
    keys = set(reads) | {(lid, e) for lid, fin in final.items() for e in fin.entries}
    for lid, eid in sorted(keys):
        fin = final.get(lid)
        seen: dict[str, str] = {}  # digest -> who read it first
        for r in reads.get((lid, eid), []):
            seen.setdefault(r["digest"], f"{r['proc']}/{r.get('handle')}")
        fd = fin.entries.get(eid) if fin is not None else None
        if fd is not None:
            seen.setdefault(fd, "final read")
        if len(seen) > 1:
            v(
                "divergent_read",
                lid,
                eid,
                "reads returned " + ", ".join(f"{d} ({w})" for d, w in seen.items()),
            )
        acked_digests = acked.get((lid, eid), {})
        if len(acked_digests) == 1:
            (ad,) = acked_digests
            for d, who in seen.items():
                if d != ad:
                    v("wrong_bytes", lid, eid, f"{who} read {d}, acknowledged payload is {ad}")
        for d, who in seen.items():
            if d not in invoked.get(lid, set()):
                v("phantom", lid, eid, f"{who} read {d}, never appended to this ledger")
        fc = closed_final(lid)
        if fc is not None and eid > fc.last_entry_id and reads.get((lid, eid)):
            v("beyond_end", lid, eid, f"read during the run, but last_entry_id is {fc.last_entry_id}")
    for lid, fin in final.items():
        at: dict[str, list[int]] = defaultdict(list)
        for eid, d in fin.entries.items():
            if d is not None:
                at[d].append(eid)
        for d, eids in at.items():
            if len(eids) > 1:
                v("phantom", lid, min(eids), f"payload {d} stored at entries {sorted(eids)}")

    # -- LAC of each reader handle ---------------------------------------------------------------------
    for (proc, handle, lid), obs in sorted(lacs.items()):
        best = -1
        fin = closed_final(lid)
        for r in obs:
            lac = r["lac"]
            if lac < best:
                v("lac_regressed", lid, None, f"{proc}/{handle} saw LAC {lac} after {best}")
            best = max(best, lac)
        if fin is not None and best > fin.last_entry_id:
            v("beyond_end", lid, None, f"{proc}/{handle} saw LAC {best} > last_entry_id {fin.last_entry_id}")

    # -- fencing: nothing acknowledged after a recovery returned ---------------------------------------
    for lid, recs in recoveries.items():
        first = min(recs, key=lambda r: r["t"])
        t_r, end = first["t"], first["last_entry_id"]
        for inv, ok in acks:
            if inv["ledger"] != lid:
                continue
            if inv["t"] > t_r:
                v(
                    "ack_after_fence",
                    lid,
                    ok["entry_id"],
                    f"{inv['op_id']} sent {inv['t'] - t_r:.3f}s after {first['proc']}'s recovery returned, "
                    "yet acknowledged",
                )
            elif ok["t"] > t_r and ok["entry_id"] > end:
                v(
                    "ack_after_fence",
                    lid,
                    ok["entry_id"],
                    f"{inv['op_id']} acknowledged after {first['proc']}'s recovery closed the ledger at {end}",
                )

    # -- one last_entry_id per ledger --------------------------------------------------------------------
    for lid, recs in recoveries.items():
        fin = closed_final(lid)
        for r in recs:
            if fin is not None and r["last_entry_id"] != fin.last_entry_id:
                v(
                    "recover_disagree",
                    lid,
                    None,
                    f"{r['proc']} recovered last_entry_id {r['last_entry_id']}, final {fin.last_entry_id}",
                )
    for r in closes:
        fin = closed_final(r["ledger"])
        if fin is not None and r["last_entry_id"] != fin.last_entry_id:
            v(
                "recover_disagree",
                r["ledger"],
                None,
                f"writer {r['proc']} closed at {r['last_entry_id']}, final last_entry_id {fin.last_entry_id}",
            )
    return out


def summarize(history: Iterable[Mapping[str, Any]], final: Mapping[int, FinalLedger]) -> dict[str, Any]:
    ops: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    for r in history:
        op = r.get("op")
        if op == "fault":
            if r.get("phase") == "start":
                faults[r["kind"]] += 1
        elif op in ("start", "stop", "abandon"):
            continue
        elif r.get("phase") in ("ok", "fail"):
            prefix = "final " if r.get("proc") == "final" else ""
            ops[f"{prefix}{op} {r['phase']}"] += 1
        elif op in ("read", "lac", "read_fail"):
            ops[op] += 1
    return {
        "ops": dict(sorted(ops.items())),
        "faults": dict(sorted(faults.items())),
        "ledgers": len(final),
        "entries": sum(f.last_entry_id + 1 for f in final.values() if f.closed),
    }


def excerpt(history: Iterable[Mapping[str, Any]], vio: Violation, limit: int = 12) -> list[Mapping[str, Any]]:
    """The history records behind a violation, for a failure message: the ledger's create/recover/close
    records, and the appends and reads of the violation's entry (or the LAC records of the handle it names)."""
    recs = [r for r in history if r.get("ledger") == vio.ledger]
    life = {"create", "recover", "close", "abandon"}
    if vio.entry_id is not None:
        op_ids = {
            r.get("op_id")
            for r in recs
            if r.get("op") == "append" and r.get("phase") == "ok" and r.get("entry_id") == vio.entry_id
        }
        keep = [
            r
            for r in recs
            if r.get("op") in life
            or (r.get("op_id") is not None and r.get("op_id") in op_ids)
            or (r.get("op") in ("read", "final_read") and r.get("entry_id") == vio.entry_id)
        ]
    else:
        keep = [
            r
            for r in recs
            if r.get("op") in life or (r.get("op") == "lac" and f"/{r.get('handle')} " in f"{vio.detail} ")
        ]
    return keep[-limit:] if len(keep) > limit else keep


def format_table(summary: Mapping[str, Any], violations: list[Violation], header: str = "") -> str:
    rows: list[tuple[str, str]] = []
    for k, n in summary["ops"].items():
        rows.append((f"op  {k}", str(n)))
    rows.append(("ops total", str(sum(summary["ops"].values()))))
    for k, n in summary["faults"].items():
        rows.append((f"fault  {k}", str(n)))
    rows.append(("faults total", str(sum(summary["faults"].values()))))
    rows.append(("ledgers", str(summary["ledgers"])))
    rows.append(("entries (closed ledgers)", str(summary["entries"])))
    by_kind = Counter(x.kind for x in violations)
    rows.append(("violations", str(len(violations)) + (f" {dict(by_kind)}" if by_kind else "")))
    w = max(len(a) for a, _ in rows)
    lines = [header] if header else []
    lines += [f"  {a:<{w}}  {b}" for a, b in rows]
    return "\n".join(lines)
