"""AutoRecovery in the simulator: the auditor's and the workers' decisions (``autorecovery.policy``, pure) driven
over a seeded schedule of bookie crashes (for good), partitions (a partitioned bookie loses its ZooKeeper
session, so it is unregistered, and keeps its data), worker crashes mid-copy and auditor crashes, with the real
placement (``ledger_client.placement.choose_replacement``), fragments (``ledger_client.rereplication``) and
metadata rules (``LedgerMetadata``, ``swapped``).

The model, one ``random.Random(seed)`` owning every choice: CLOSED ledgers of E3/Qw2/Qa2 and E3/Qw3/Qa2 over
6 bookies (each a dict of the entries it holds); ledger metadata in the real ``zk.LedgerMetadataStore`` over
the simulated ZooKeeper (``tests.sim.zookeeper``: its CAS and ``check_transition``); marks, locks and the
registry as the znodes are. The auditor marks ledgers of lost bookies (``LostBookieTracker``,
``ledgers_to_mark``) and runs the check (``entries_to_check``: a live bookie lacking an entry is marked). A
worker takes one step per event: lock a mark, ``decide``, copy one entry (read from a reachable replica of its
write set), and at the end one CAS swapping the replacements in, clear the mark at its version, unlock. A
worker crash loses its lock (ephemeral) and its progress.

The checker (invariant 2 of docs/architecture.md §10): once everything healed and no mark is left, every entry
<= last_entry_id is on >= Qa live bookies of the write set the metadata names; and at every CAS, the bookies it
swaps in hold their entries already (the metadata never names a bookie without the data).

Mutation ``swap-before-copy``: a worker CASes the replacement into the metadata first, then copies (as a broken
worker would); a crash or an unreachable source mid-copy leaves a bookie named without its entries, and the
next worker, seeing the marked bookie gone from the ensembles, clears the mark: the checker finds it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from autorecovery.policy import Action, LostBookieTracker, decide, entries_to_check, ledgers_to_mark
from ledger_client.placement import choose_replacement
from ledger_client.quorum import write_set
from ledger_client.rereplication import lost_fragments, swapped
from zk.errors import MetadataTransitionError, MetadataVersionError
from zk.layout import LEDGERS, parse_ledger_path
from zk.ledger_metadata import LedgerMetadata, LedgerMetadataStore, LedgerState, password_digest_of
from zk.underreplication import UnderReplicationMark

from .zookeeper import SimZooKeeper

__all__ = ["ArOutcome", "run_autorecovery"]

BOOKIES = tuple(f"b{i}:3181" for i in range(6))
MUTATIONS = ("swap-before-copy",)


@dataclass
class ArOutcome:
    seed: int
    violations: list[str]
    trace: list[str]
    copied: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self) -> str:
        return "\n".join(
            [f"seed {self.seed}: {len(self.violations)} violations", *self.violations, *self.trace[-60:]]
        )


@dataclass
class _Job:
    """A worker's progress on one marked ledger."""

    lid: int
    mark_version: int
    md_version: int
    md: LedgerMetadata
    copies: list[tuple[int, str, str]] = field(default_factory=list)  # (entry, leaving bookie, target)
    replacements: dict[str, dict[int, str]] = field(default_factory=dict)
    swapped_early: bool = False


class _Model:
    def __init__(self, seed: int, mutation: str | None) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.mutation = mutation
        self.now = 0.0
        self.trace: list[str] = []
        self.violations: list[str] = []
        self.data: dict[str, dict[tuple[int, int], bytes]] = {b: {} for b in BOOKIES}
        self.dead: set[str] = set()  # crashed for good
        self.partitioned: set[str] = set()
        self.md: dict[int, tuple[LedgerMetadata, int]] = {}  # what the ledger znodes hold, decoded
        self.zk = SimZooKeeper(on_change=self._on_znode)
        self.store = LedgerMetadataStore(self.zk)  # type: ignore[arg-type]
        self.marks: dict[int, tuple[UnderReplicationMark, int]] = {}
        self.locks: dict[int, str] = {}
        self.jobs: dict[str, _Job | None] = {"w0": None, "w1": None}
        self.tracker = LostBookieTracker(0.0)
        self.copied = 0

    def log(self, msg: str) -> None:
        self.trace.append(f"{self.now:7.2f} {msg}")

    def registered(self) -> set[str]:
        return set(BOOKIES) - self.dead - self.partitioned

    def reachable(self, b: str) -> bool:
        return b in self.registered()

    # --- setup ------------------------------------------------------------------------------------------------

    def write_ledgers(self, n: int) -> None:
        for lid in range(1, n + 1):
            ens = tuple(self.rng.sample(BOOKIES, 3))
            qw = self.rng.choice((2, 3))
            last = self.rng.randint(0, 30)
            created = self.store.create(
                ledger_id=lid,
                ensemble_size=3,
                write_quorum=qw,
                ack_quorum=2,
                bookies=ens,
                password_digest=password_digest_of(b""),
                ctime_ms=0,
            )
            md = created.value
            if last > 10 and self.rng.random() < 0.5:  # an ensemble change part way
                others = [b for b in BOOKIES if b not in ens]
                second = list(ens)
                second[self.rng.randrange(3)] = self.rng.choice(others)
                md = md.with_new_ensemble(last // 2, second)
            md = md.replace(state=LedgerState.CLOSED, last_entry_id=last, length=last + 1)
            for eid in range(last + 1):
                e = md.ensemble_at(eid).bookies
                for i in write_set(eid, 3, qw):
                    self.data[e[i]][(lid, eid)] = f"L{lid}E{eid}".encode()
            self.store.write(lid, md, created)  # (self.md follows the znode)

    # --- znodes -----------------------------------------------------------------------------------------------

    def mark(self, lid: int, missing: set[str]) -> None:
        cur = self.marks.get(lid)
        if cur is None:
            self.marks[lid] = (UnderReplicationMark(ledger_id=lid, missing=tuple(sorted(missing))), 0)
        else:
            m, v = cur
            new = UnderReplicationMark(
                ledger_id=lid, missing=tuple(sorted(set(m.missing) | missing)), count=m.count + 1
            )
            self.marks[lid] = (new, v + 1)
        self.log(f"mark ledger {lid} missing {sorted(missing)}")

    def _on_znode(self, path: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None and path.startswith(LEDGERS + "/"):
            self.md[parse_ledger_path(path)] = (LedgerMetadata.from_json(new), self.zk.nodes[path][1])

    def cas(self, lid: int, version: int, md: LedgerMetadata, by: str) -> bool:
        """``LedgerMetadataStore.write`` at ``version`` (the transition check included: a swap must be a legal
        change of a CLOSED ledger); False on a version conflict."""
        try:
            self.store.write(lid, md, version)
        except MetadataVersionError:
            return False
        except MetadataTransitionError as e:
            self.violations.append(f"5: {by}: an illegal metadata write: {e}")
            return False
        self.log(f"{by}: CAS ledger {lid} -> {[e.bookies for e in md.ensembles]}")
        return True

    # --- the auditor ------------------------------------------------------------------------------------------

    def audit(self) -> None:
        reg = self.registered()
        mds = {lid: m for lid, (m, _) in self.md.items()}
        referenced = {b for m in mds.values() for e in m.ensembles for b in e.bookies}
        self.tracker.observe(reg, referenced, self.now)
        due = self.tracker.due(self.now)
        if due:
            for lid, hit in sorted(ledgers_to_mark(mds, due).items()):
                self.mark(lid, hit)
            self.tracker.marked |= due
        for lid, m in sorted(mds.items()):
            lacking = {
                b
                for b, ids in entries_to_check(m, reg, all_entries=True).items()
                if any((lid, e) not in self.data[b] for e in ids)
            }
            if lacking and not (lid in self.marks and lacking <= set(self.marks[lid][0].missing)):
                self.mark(lid, lacking)

    # --- workers ----------------------------------------------------------------------------------------------

    def worker_step(self, w: str) -> None:
        job = self.jobs[w]
        if job is None:
            free = sorted(lid for lid in self.marks if lid not in self.locks)
            if not free:
                return
            lid = self.rng.choice(free)
            self.locks[lid] = w
            self.jobs[w] = self.plan(w, lid)
            return
        if job.copies:
            eid, leaving, target = job.copies[0]
            md = job.md
            ens = md.ensemble_at(eid).bookies
            sources = [
                ens[i]
                for i in write_set(eid, md.ensemble_size, md.write_quorum)
                if ens[i] != leaving and self.reachable(ens[i]) and (job.lid, eid) in self.data[ens[i]]
            ]
            if not self.reachable(target):
                return self.give_up(w, f"target {target} unreachable")
            if not sources:
                return self.give_up(w, f"no source for entry {eid}")
            self.data[target][(job.lid, eid)] = self.data[sources[0]][(job.lid, eid)]
            self.copied += 1
            job.copies.pop(0)
            return
        self.finish(w, job)

    def plan(self, w: str, lid: int) -> _Job | None:
        mark, mv = self.marks[lid]
        md, version = self.md[lid]
        reg = self.registered()
        d = decide(md, mark, reg, reg, int(self.now * 1000), 0)
        job = _Job(lid, mv, version, md)
        if d.action is Action.CLEAR:
            self.clear(w, job, d.why)
            return None
        assert d.action is Action.REPLICATE, d
        planned = [list(e.bookies) for e in md.ensembles]
        for bookie in sorted(d.repair):
            for f in lost_fragments(md, bookie):
                job.copies += [
                    (eid, bookie, bookie) for eid in f.entries() if (lid, eid) not in self.data[bookie]
                ]
        for bookie in sorted(d.replace):
            chosen: dict[int, str] = {}
            for f in lost_fragments(md, bookie):
                ens = md.ensembles[f.ensemble_index].bookies
                try:
                    target = choose_replacement(
                        planned[f.ensemble_index],
                        f.bookie_index,
                        reg,
                        exclude=set(d.replace) | set(ens),
                        rng=self.rng,
                    )
                except Exception as e:  # not enough bookies: the mark stays
                    self.give_up(w, f"no replacement: {e}", job)
                    return None
                planned[f.ensemble_index][f.bookie_index] = target
                chosen[f.ensemble_index] = target
                job.copies += [(eid, bookie, target) for eid in f.entries()]
            job.replacements[bookie] = chosen
        self.log(f"{w}: ledger {lid} {d.action.value} replace {sorted(d.replace)} repair {sorted(d.repair)}")
        if self.mutation == "swap-before-copy" and job.replacements:
            if not self.cas(lid, version, self.transform(md, job), w + " (early)"):
                self.give_up(w, "metadata changed", job)
                return None
            job.swapped_early = True
        return job

    def transform(self, md: LedgerMetadata, job: _Job) -> LedgerMetadata:
        for bookie, chosen in job.replacements.items():
            md = swapped(md, bookie, chosen)
        return md

    def finish(self, w: str, job: _Job) -> None:
        targets = {t for chosen in job.replacements.values() for t in chosen.values()}
        if not job.swapped_early and not all(self.reachable(t) for t in targets):
            return self.give_up(w, "a replacement is unreachable: its fence fails, no CAS")
        if job.replacements and not job.swapped_early:
            new = self.transform(job.md, job)
            for k, e in enumerate(new.ensembles):  # the metadata never names a bookie without its entries
                for b in set(e.bookies) - set(job.md.ensembles[k].bookies):
                    for f in lost_fragments(new, b):
                        if f.ensemble_index == k:
                            lacking = [x for x in f.entries() if (job.lid, x) not in self.data[b]]
                            if lacking:
                                self.violations.append(
                                    f"2: ledger {job.lid}: {b} swapped in without {lacking}"
                                )
            if not self.cas(job.lid, job.md_version, new, w):
                return self.give_up(w, "metadata changed")
        self.clear(w, job, "re-replicated")

    def clear(self, w: str, job: _Job, why: str) -> None:
        cur = self.marks.get(job.lid)
        if cur is not None and cur[1] == job.mark_version:
            del self.marks[job.lid]
            self.log(f"{w}: clear mark of ledger {job.lid}: {why}")
        self.locks.pop(job.lid, None)
        self.jobs[w] = None

    def give_up(self, w: str, why: str, job: _Job | None = None) -> None:
        job = job or self.jobs[w]
        assert job is not None
        self.log(f"{w}: ledger {job.lid} left marked: {why}")
        self.locks.pop(job.lid, None)
        self.jobs[w] = None

    def crash_worker(self, w: str) -> None:
        job = self.jobs[w]
        if job is not None:
            self.log(f"{w} crashes mid-copy of ledger {job.lid} ({len(job.copies)} copies left)")
            self.locks.pop(job.lid, None)
        self.jobs[w] = None

    # --- the checker ------------------------------------------------------------------------------------------

    def check_replication(self) -> None:
        live = self.registered()
        for lid, (md, _) in sorted(self.md.items()):
            for eid in range(md.last_entry_id + 1):
                ens = md.ensemble_at(eid).bookies
                have = [ens[i] for i in write_set(eid, 3, md.write_quorum) if ens[i] in live]
                have = [b for b in have if (lid, eid) in self.data[b]]
                if len(have) < md.ack_quorum:
                    self.violations.append(f"2: ledger {lid} entry {eid} on {have} only (Qa={md.ack_quorum})")


def run_autorecovery(
    seed: int, mutation: str | None = None, *, ledgers: int = 12, heal_at: float = 30.0
) -> ArOutcome:
    """One schedule: faults until ``heal_at`` (one bookie crashes for good, others are partitioned for a while,
    workers and the auditor crash), then everything heals and recovery runs to the end; then the checker."""
    if mutation not in (None, *MUTATIONS):
        raise ValueError(f"unknown mutation {mutation!r}")
    m = _Model(seed, mutation)
    rng = m.rng
    m.write_ledgers(ledgers)
    victim = rng.choice(BOOKIES)
    crash_at = rng.uniform(0, heal_at / 2)
    step = 0.1
    crashed = False
    while m.now < heal_at + 200:
        m.now += step
        faulty = m.now < heal_at
        if not crashed and m.now >= crash_at:
            m.dead.add(victim)
            m.data[victim].clear()
            crashed = True
            m.log(f"bookie {victim} crashes for good")
        if faulty and rng.random() < 0.02:
            b = rng.choice([b for b in BOOKIES if b != victim])
            if b in m.partitioned:
                m.partitioned.discard(b)
                m.log(f"bookie {b} partition heals")
            elif len(m.partitioned) < 1:
                m.partitioned.add(b)
                m.log(f"bookie {b} partitioned (session expired)")
        if faulty and rng.random() < 0.02:
            m.crash_worker(rng.choice(sorted(m.jobs)))
        if faulty and rng.random() < 0.01:
            m.tracker = LostBookieTracker(0.0)  # a new auditor: no state but the marks
            m.log("auditor crashes; another is elected")
        if not faulty and m.partitioned:
            m.partitioned.clear()
            m.log("everything heals")
        if rng.random() < 0.5:
            m.audit()
        for w in sorted(m.jobs):
            if rng.random() < 0.8:
                m.worker_step(w)
        if crashed and not faulty and not m.marks and all(j is None for j in m.jobs.values()):
            m.audit()
            if not m.marks:
                break
    if m.marks:
        m.violations.append(f"10: marks left after the heal: {sorted(m.marks)}")
    m.check_replication()
    return ArOutcome(seed, m.violations, m.trace, m.copied)
