"""Invariant checkers for docs/architecture.md §10 (1-7 and 10), run as the simulation goes.

Cheap checks run at the event that can break them (an ack to the user, a metadata write, a bookie restart, a
read); the costlier sweeps (every entry of every ledger against the bookies' disks) run every
``SimConfig.full_check_every`` steps and at the end. The first violation stops the run.

Ground truth: ``World.written`` (every entry as its writer built it), each writer's list of entries it
acknowledged to its user, and each bookie's on-disk view (``BookieNode.durable``: journal records that were
synced, whatever its process is doing). A bookie whose wiped disk the cookie check refused keeps its copies
in that view for invariant 2 (the protocol did put them there; losing a disk is what re-replication is for)
but they no longer count as *readable* for invariant 1.

Invariants (the labels used in reports):

1. Once a ledger is CLOSED, every entry acked to its writer is <= last_entry_id and readable (a copy with the
   right bytes on a bookie that can serve).
2. Every entry <= the writer's LAC (OPEN) or <= last_entry_id (CLOSED) is on >= Qa bookies of the ensemble
   covering it, with the bytes written.
3. Reads (tailing readers, recovery reads) return the bytes written; acks to the user come in entry-id
   order; the writer's LAC never goes backwards; a reader's LAC never exceeds what was confirmed.
4. A recoverer's fencing coverage is real (enough durable fences in every write set), and after it the old
   writer gets nothing acknowledged that fenced bookies did not already hold (see ``on_fence_coverage``).
   Fence survival across restarts: 7.
5. Metadata moves only OPEN->IN_RECOVERY->CLOSED or OPEN->CLOSED; a CLOSED ledger never changes (not its
   state, last_entry_id, length nor ensembles); ensembles are only appended (or the last one replaced at the
   same first entry) with strictly increasing first entry ids; a ledger is closed with ``length`` = the sum of
   its entries' payload sizes up to last_entry_id — checked here, on every change of a ledger znode of the
   simulated ZooKeeper, independently of ``check_transition``, which the real store also runs.
6. Every recoverer reports the last_entry_id the ledger was closed with.
7. A restarted bookie has every entry it acked, every fence it confirmed and every master key it used.
10. Liveness: after the heal, live writers finish, and every ledger is CLOSED before the deadline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from bookie.core import UNBOUND_KEY, fence_keys
from ledger_client.quorum import write_set
from zk.ledger_metadata import LedgerMetadata

if TYPE_CHECKING:
    from .actors import Reader, Recoverer, Writer
    from .world import BookieNode, World

_RANK = {"OPEN": 0, "IN_RECOVERY": 1, "CLOSED": 2}

#: Violations caused by bugs in the cores that are reported and not fixed yet: name -> a substring of the
#: violation message. Unless the run is strict, a match is recorded in ``Checker.known`` and the run goes on
#: (so the rest of the schedule is still checked). Each needs an xfail(strict=True) test in
#: ``tests/sim/test_found_bugs.py``; when the bug is fixed that test XPASSes and says to delete the entry.
KNOWN_BUGS: dict[str, str] = {}


class Violation(NamedTuple):
    invariant: str
    time: float
    message: str

    def __str__(self) -> str:
        return f"invariant {self.invariant} violated at t={self.time:.4f}s: {self.message}"


class Checker:
    def __init__(self, world: World, *, disabled: frozenset[str] = frozenset(), strict: bool = False) -> None:
        self.world = world
        self.disabled = disabled
        self.strict = strict
        self.violations: list[Violation] = []
        self.known: list[tuple[str, Violation]] = []
        self.writers: dict[int, Writer] = {}
        self.recoverers: dict[int, list[Recoverer]] = {}
        # lid -> (time, entries durable on >= Qa bookies of their write set) at the first fencing coverage
        self.coverage: dict[int, tuple[float, frozenset[int]]] = {}
        self.checks = 0

    def fail(self, invariant: str, message: str) -> None:
        if invariant in self.disabled:
            return
        v = Violation(invariant, self.world.now, message)
        if not self.strict:
            for name, signature in KNOWN_BUGS.items():
                if signature in message:
                    self.world.log(f"KNOWN BUG {name}: {v}")
                    self.known.append((name, v))
                    return
        self.world.log(f"VIOLATION {v}")
        self.violations.append(v)

    # -- helpers ----------------------------------------------------------------------------------------

    def _md(self, lid: int) -> LedgerMetadata:
        return self.world.meta.ledgers[lid].value

    def _copies(self, lid: int, eid: int, md: LedgerMetadata) -> tuple[int, int]:
        """(copies on the write set of the covering ensemble, of which readable) with the written bytes."""
        bookies = self.world.bookies
        ens = md.ensemble_at(eid).bookies
        want = self.world.written.get((lid, eid))
        n = readable = 0
        for i in write_set(eid, md.ensemble_size, md.write_quorum):
            node = bookies[ens[i]]
            got = node.durable.get((lid, eid))
            if got is None:
                continue
            if got != want:
                self.fail("3", f"bookie {node.bid} stores L{lid} e{eid} with bytes that were never written")
                continue
            n += 1
            if not node.refused:
                readable += 1
        return n, readable

    def _check_entry(self, lid: int, eid: int, md: LedgerMetadata, why: str) -> None:
        n, readable = self._copies(lid, eid, md)
        if n < md.ack_quorum:
            ens = md.ensemble_at(eid)
            self.fail(
                "2",
                f"L{lid} e{eid} ({why}) is durable on {n} < Qa={md.ack_quorum} bookies of its write set in "
                f"ensemble {list(ens.bookies)} (from e{ens.first_entry_id})",
            )
        elif readable == 0 and md.state.value == "CLOSED":
            self.fail("1", f"L{lid} e{eid} <= last_entry_id {md.last_entry_id} is readable from no bookie")

    # -- writers ----------------------------------------------------------------------------------------

    def on_writer_created(self, writer: Writer) -> None:
        assert writer.lid is not None
        self.writers[writer.lid] = writer

    def on_user_ack(self, writer: Writer, eid: int) -> None:
        lid = writer.lid
        assert lid is not None
        expected = len(writer.acked) - 1  # acked already holds eid
        if eid != expected:
            self.fail(
                "3", f"{writer.name} acknowledged L{lid} e{eid} out of order (next in order: e{expected})"
            )
        md = self._md(lid)
        if md.state.value == "CLOSED" and eid > md.last_entry_id:
            self.fail(
                "1", f"{writer.name} acknowledged L{lid} e{eid} after it was CLOSED at {md.last_entry_id}"
            )
        cov = self.coverage.get(lid)
        if cov is not None and eid not in cov[1]:
            self.fail(
                "4",
                f"{writer.name} got L{lid} e{eid} acknowledged after fencing coverage (t={cov[0]:.4f}), "
                f"with acks that fenced bookies cannot have given",
            )
        self._check_entry(lid, eid, md, f"acked by {writer.name}")

    def on_writer_lac(self, writer: Writer) -> None:
        pipe = writer.pipe
        assert pipe is not None and writer.lid is not None
        if pipe.lac < writer.max_lac:
            self.fail("3", f"{writer.name}'s LAC went back from {writer.max_lac} to {pipe.lac}")

    # -- readers ----------------------------------------------------------------------------------------

    def on_read(self, who: str, lid: int, eid: int, data: bytes) -> None:
        want = self.world.written.get((lid, eid))
        if data != want:
            self.fail("3", f"{who} read L{lid} e{eid} with bytes that differ from the ones written")

    def on_reader_lac(self, reader: Reader, lac: int) -> None:
        lid = reader.lid
        assert lid is not None
        writer = self.writers.get(lid)
        bound = writer.max_lac if writer is not None else -1
        md = self._md(lid)
        if md.state.value == "CLOSED":
            bound = max(bound, md.last_entry_id)
            if lac > md.last_entry_id:
                self.fail(
                    "3",
                    f"{reader.name} learned LAC {lac} of L{lid}, beyond its last entry {md.last_entry_id}",
                )
        if lac > bound:
            self.fail(
                "3", f"{reader.name} learned LAC {lac} of L{lid}; nothing beyond {bound} was ever confirmed"
            )

    # -- metadata ---------------------------------------------------------------------------------------

    def on_metadata_created(self, md: LedgerMetadata) -> None:
        if md.state.value != "OPEN" or md.last_entry_id != -1 or len(md.ensembles) != 1:
            self.fail("5", f"ledger {md.ledger_id} created as {md.state} with {len(md.ensembles)} ensembles")
        self._check_ensembles(md)

    def _check_ensembles(self, md: LedgerMetadata) -> None:
        firsts = [e.first_entry_id for e in md.ensembles]
        if firsts[0] != 0 or any(b <= a for a, b in zip(firsts, firsts[1:], strict=False)):
            self.fail("5", f"L{md.ledger_id}: ensemble starts {firsts} do not strictly increase from 0")
        for e in md.ensembles:
            if len(set(e.bookies)) != md.ensemble_size:
                self.fail("5", f"L{md.ledger_id}: ensemble {list(e.bookies)} is not E distinct bookies")

    def on_metadata_write(self, lid: int, old: LedgerMetadata, new: LedgerMetadata) -> None:
        os_, ns = old.state.value, new.state.value
        if _RANK[ns] < _RANK[os_]:
            self.fail("5", f"L{lid} went from {os_} to {ns}")
        if os_ == "CLOSED" and (new.last_entry_id, new.length, new.ensembles) != (
            old.last_entry_id,
            old.length,
            old.ensembles,
        ):
            self.fail(
                "5",
                f"L{lid} changed after CLOSED at {old.last_entry_id} (length {old.length}): now "
                f"{new.state} at {new.last_entry_id} (length {new.length}), ensembles {_segs(new.ensembles)}",
            )
        if ns != "CLOSED" and new.last_entry_id != -1:
            self.fail("5", f"L{lid} is {ns} with last_entry_id {new.last_entry_id}")
        self._check_ensembles(new)
        o, n = old.ensembles, new.ensembles
        if (
            len(n) < len(o)
            or n[: len(o) - 1] != o[:-1]
            or n[len(o) - 1].first_entry_id != o[-1].first_entry_id
        ):
            self.fail("5", f"L{lid}: ensembles rewritten: {_segs(o)} -> {_segs(n)}")
        if ns == "CLOSED" and os_ != "CLOSED":
            self._on_closed(lid, new)

    def _on_closed(self, lid: int, md: LedgerMetadata) -> None:
        sizes = self.world.payload_sizes
        last = md.last_entry_id
        if all((lid, e) in sizes for e in range(last + 1)):  # (else entries no simulated writer made)
            want = sum(sizes[(lid, e)] for e in range(last + 1))
            if md.length != want:
                self.fail(
                    "5",
                    f"L{lid} CLOSED at last_entry_id {last} with length {md.length}; its entries 0..{last} "
                    f"hold {want} bytes of payload",
                )
        writer = self.writers.get(lid)
        if writer is not None:
            lost = [e for e in writer.acked if e > md.last_entry_id]
            if lost:
                self.fail(
                    "1",
                    f"L{lid} CLOSED at last_entry_id {md.last_entry_id} but {writer.name} acknowledged {lost}",
                )
        for r in self.recoverers.get(lid, []):
            if r.result is not None and r.result != md.last_entry_id:
                self.fail(
                    "6", f"{r.name} reported L{lid} last entry {r.result}, closed at {md.last_entry_id}"
                )
        for eid in range(md.last_entry_id + 1):
            self._check_entry(lid, eid, md, f"<= last_entry_id {md.last_entry_id}")

    # -- recovery ---------------------------------------------------------------------------------------

    def on_fence_coverage(self, rec: Recoverer) -> None:
        """A recoverer decided that its fencing reads reached coverage (invariant 4).

        (a) That must be true of the disks: every write set of the last ensemble has >= Qw - Qa + 1 bookies
            whose fence is durable (a fence read is answered only once its record is synced, so a correct
            recoverer can only count bookies that are fenced for good).
        (b) From now on the old writer may still complete an entry, but only with acks that fenced bookies
            gave before their fence: a fenced bookie refuses adds, so at least Qa - (unfenced bookies of the
            write set) acks must come from copies durable on fenced bookies already. Record which entries
            qualify; ``on_user_ack`` refuses any other acked after this moment.
        """
        lid = rec.lid
        assert rec.versioned is not None
        md = rec.versioned.value
        bookies = self.world.bookies
        last = md.last_ensemble.bookies
        e, qw, qa = md.ensemble_size, md.write_quorum, md.ack_quorum
        fenced = frozenset(b for b in last if lid in bookies[b].durable_fences)
        for s in range(e):
            ws = [last[i] for i in write_set(s, e, qw)]
            n = sum(1 for b in ws if b in fenced)
            if n < qw - qa + 1:
                self.fail(
                    "4",
                    f"{rec.name} reached fencing 'coverage' of L{lid} but only {sorted(fenced)} of {list(last)} "
                    f"are fenced: write set {ws} has {n} < Qw-Qa+1={qw - qa + 1} fenced bookies",
                )
                return
        if lid in self.coverage:
            return
        writer = self.writers.get(lid)
        safe = []
        for eid in range(writer.appended if writer is not None else 0):
            ens = md.ensemble_at(eid).bookies
            ws = [ens[i] for i in write_set(eid, e, qw)]
            unfenced = sum(1 for b in ws if b not in fenced)
            have = sum(1 for b in ws if b in fenced and (lid, eid) in bookies[b].durable)
            if have >= max(1, qa - unfenced):
                safe.append(eid)
        self.coverage[lid] = (self.world.now, frozenset(safe))

    def on_recovery_done(self, rec: Recoverer) -> None:
        self.recoverers.setdefault(rec.lid, []).append(rec)
        md = self._md(rec.lid)
        if md.state.value != "CLOSED":
            self.fail("6", f"{rec.name} finished recovering L{rec.lid}, which is still {md.state}")
        elif rec.result != md.last_entry_id:
            self.fail(
                "6", f"{rec.name} reported L{rec.lid} last entry {rec.result}, closed at {md.last_entry_id}"
            )

    # -- bookies ----------------------------------------------------------------------------------------

    def on_bookie_restart(self, node: BookieNode) -> None:
        core = node.core
        assert core is not None
        stored = node.storage.entries  # (not through get_entry: a failing disk may refuse reads)
        missing = [k for k, data in node.acked_entries.items() if stored.get(k) != data]
        if missing:
            self.fail(
                "7", f"{node.bid} restarted without {len(missing)} entries it had acknowledged: {missing[:5]}"
            )
        unfenced = [
            lid for lid in sorted(node.acked_fences) if not (lid in core.ledgers and core.ledgers[lid].fenced)
        ]
        if unfenced:
            self.fail("7", f"{node.bid} restarted without the fences of {unfenced}, which it had confirmed")
        keys = [lid for lid, key in node.acked_keys.items() if not _holds_key(core.ledgers.get(lid), key)]
        if keys:
            self.fail("7", f"{node.bid} restarted without the master keys of ledgers {keys}")
        if node.disk_lost:  # trusted after a wipe: its promises start over (the loss is reported above)
            node.acked_entries.clear()
            node.acked_fences.clear()
            node.acked_keys.clear()
        self.check_all()

    # -- sweeps -----------------------------------------------------------------------------------------

    def check_all(self) -> None:
        """Invariants 1 and 2 for every entry of every ledger, against the disks as they are now."""
        self.checks += 1
        for lid, v in self.world.meta.ledgers.items():
            md = v.value
            writer = self.writers.get(lid)
            if md.state.value == "CLOSED":
                bound = md.last_entry_id
                if writer is not None and writer.acked and max(writer.acked) > bound:
                    self.fail(
                        "1", f"L{lid} CLOSED at {bound} but {writer.name} acknowledged {max(writer.acked)}"
                    )
            else:
                bound = writer.max_lac if writer is not None else -1
            for eid in range(bound + 1):
                self._check_entry(lid, eid, md, "swept")
                if self.violations:
                    return

    def check_writer_progress(self, alive: list[Writer]) -> None:
        """Liveness: a writer alive at the heal has closed its ledger by the end of its grace period, unless
        a recoverer fenced it, an ensemble change truly found fewer spare bookies than failed ones, or one
        that began during the fault period ran out of time. An ensemble change begun after the heal, with
        enough bookies, must succeed and the writer must go on to close."""
        for wr in alive:
            if wr.outcome == "closed":
                continue
            if wr.outcome in ("FENCED", "CLOSED") and wr.lid in self._recovered_lids():
                continue
            short = wr.spares_short
            if wr.outcome in (None, "NOT_ENOUGH_BOOKIES") and short is not None and short[0] < short[1]:
                continue  # failed, or still retrying until its deadline: there is no bookie to replace with
            started = wr.ec_gave_up_started_at
            if started is not None and started < self.world.healed_at:
                continue  # an ensemble change that began in the fault period ran out of time (by design)
            self.fail(
                "10",
                f"{wr.name} (alive at the heal) did not finish: outcome={wr.outcome} appended="
                f"{wr.appended}/{wr.n_entries} acked={len(wr.acked)} state={wr.state.state.name} "
                f"spares_short={short} pipe={wr.pipe!r}",
            )

    def _recovered_lids(self) -> set[int]:
        from .actors import Recoverer

        return {c.lid for c in self.world.clients.values() if isinstance(c, Recoverer)}

    def check_closed(self) -> None:
        """Liveness: every ledger is CLOSED at the deadline, and every reader (tailing or range) has read all of
        it."""
        from .actors import RangeReader, Reader

        for lid, v in self.world.meta.ledgers.items():
            if v.value.state.value != "CLOSED":
                self.fail("10", f"L{lid} is still {v.value.state} at the liveness deadline")
        for c in self.world.clients.values():
            if isinstance(c, (Reader, RangeReader)) and not c.done:
                self.fail("10", f"{c.name} has not read L{c.lid} to its end: next e{c.next}, LAC {c.lac}")


def _segs(ensembles: tuple) -> list[tuple[int, list[str]]]:
    return [(e.first_entry_id, list(e.bookies)) for e in ensembles]


def _holds_key(info: Any, key: bytes) -> bool:
    """Whether a restarted bookie still answers ``key`` for a ledger as before: bound to it, or (a ledger only
    fenced here, never written: no key bound) fenced for it (``bookie.core``, no squatting)."""
    if info is None:
        return False
    if info.master_key == UNBOUND_KEY:
        return key in fence_keys(info)
    return bool(info.master_key == key)
