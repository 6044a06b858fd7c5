"""Clients of the simulated cluster, driving the real client cores the way ``ledger_client.client`` does.

* :class:`Writer` — creates a ledger (ensemble from ``placement.choose_ensemble``), appends through
  ``WritePipeline`` (single adds, or bursts sent as one write per bookie), changes the ensemble with the
  client's ``ensemble_change_transition``/``ensemble_change_step`` (what to write, and what the metadata found
  on a conflict means), closes with ``writer_close_transition``; its handle
  state is a ``HandleStateMachine``. Every entry it acknowledges to its "user" is recorded for the checkers.
* :class:`Recoverer` — opens with recovery: ``recovery_start_transition``, CAS OPEN->IN_RECOVERY, executes
  ``LedgerRecovery``'s commands (fence reads, recovery reads, write-backs, ensemble changes by placement),
  closes with ``recovery_close_transition`` and a CAS; a failed attempt is retried from fresh metadata.
* :class:`Reader` — a tailing reader: learns the LAC with READ_ENTRY(-1) from a coverage of the last
  ensemble (no fence) or with a long poll on one bookie, reads entries up to it from their write sets
  (following metadata changes) and verifies each digest.

Timeouts are per-request virtual-time timers that feed ``None`` statuses (``on_timeout`` semantics).
"""

from __future__ import annotations

from typing import Any

from bookie import protocol as p
from bookie.entryformat import DigestMismatchError, DigestType, EntryCodec, peek_header
from ledger_client.errors import (
    LedgerClosedError,
    LedgerError,
    LedgerFencedError,
    MetadataStoreError,
    NotEnoughBookiesError,
)
from ledger_client.handle_state import (
    EnsembleChangeStep,
    HandleEvent,
    HandleState,
    HandleStateMachine,
    ensemble_change_step,
    ensemble_change_transition,
    writer_close_transition,
)
from ledger_client.pending import EnsembleChangePlan, Progress, WritePipeline
from ledger_client.placement import choose_ensemble, replace_failed
from ledger_client.quorum import CoverageSet, answer_for_status, write_set
from ledger_client.read_planner import Batch, Outcome, ReadPlanner, Rivals
from ledger_client.recovery import (
    ChangeEnsemble,
    Close,
    Command,
    FenceRead,
    LedgerRecovery,
    LengthRead,
    RecoveryAdd,
    RecoveryFailed,
    RecoveryRead,
    recovery_close_transition,
    recovery_start_transition,
)
from zk.errors import MetadataError, MetadataTransitionError, MetadataVersionError
from zk.ledger_metadata import Ensemble, LedgerMetadata, password_digest_of
from zk.versioned import Versioned

from .world import Client, MetaResult, Timer, World

DIGEST = DigestType.CRC32C


def _lac_of(resp: p.ReadEntryResponse) -> int:
    """The LAC a READ_ENTRY(-1) answer carries: the bookie's, or the one piggybacked on its last entry."""
    lac = resp.lac
    if resp.status == p.Status.OK and resp.entry:
        try:
            lac = max(lac, peek_header(resp.entry).lac)
        except ValueError:
            pass
    return lac


# ------------------------------------------------------------------------------------------------ writer


class Writer(Client):
    def __init__(
        self,
        world: World,
        name: str,
        *,
        n_entries: int,
        password: bytes,
        think_max_s: float = 0.02,
        outstanding_adds_max: int = 8,
        ensemble: list[str] | None = None,
        close_when_done: bool = True,
        batch_max: int = 1,
        payload_size: int = 16,
    ) -> None:
        super().__init__(world, name)
        self.fixed_ensemble = ensemble  # scenarios pin the ensemble; otherwise placement chooses
        self.close_when_done = close_when_done  # False: stay open and idle after the last append
        cfg = world.cfg
        self.E, self.Qw, self.Qa = cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum
        self.n_entries = n_entries
        self.password = password
        self.key = p.master_key(password)
        self.think_max_s = think_max_s
        self.outstanding_adds_max = outstanding_adds_max
        self.batch_max = (
            batch_max  # > 1: append bursts of up to this many and send each bookie its share at once
        )
        self.payload_size = payload_size  # the payload size of a batching writer's entries
        self.lid: int | None = None
        self.versioned: Versioned[LedgerMetadata] | None = None
        self.pipe: WritePipeline | None = None
        self.codec: EntryCodec | None = None
        self.state = HandleStateMachine(HandleState.OPEN)
        self.inflight: set[int] = set()
        self.acked: list[int] = []  # entry ids acknowledged to the user, in the order they were
        self.appended = 0
        self.max_lac = -1
        self.outcome: str | None = None  # "closed" or the error code that ended this writer
        self._ec_plan: EnsembleChangePlan | None = None
        self._ec_tried: list[tuple[str, ...]] = []  # ensembles this change has tried to CAS
        self._ec_deadline = 0.0
        self._close_started = False
        self._close_sent = False
        self._waiting = False  # waiting for pipeline capacity
        # (spare bookies, failed indices) when placement last found too few replacements (liveness excuse)
        self.spares_short: tuple[int, int] | None = None
        self.ec_gave_up_started_at: float | None = None  # when the ensemble change that timed out began

    # -- creation ---------------------------------------------------------------------------------------

    def start(self, delay_s: float = 0.0) -> None:
        self.later(delay_s, self._create)

    def _create(self) -> None:
        w = self.world
        try:
            bookies = self.fixed_ensemble or choose_ensemble(self.E, w.available(), rng=w.rng)
        except NotEnoughBookiesError:
            self.later(w.cfg.retry_backoff_s, self._create)
            return
        digest = password_digest_of(self.password)
        ctime = int(w.now * 1000)

        def build(lid: int) -> LedgerMetadata:
            return LedgerMetadata(
                ledger_id=lid,
                ensemble_size=self.E,
                write_quorum=self.Qw,
                ack_quorum=self.Qa,
                ensembles=(Ensemble(0, tuple(bookies)),),
                password_digest=digest,
                digest_type=DIGEST.value,
                ctime_ms=ctime,
            )

        w.meta.create(self, build, self._created)

    def _created(self, res: MetaResult) -> None:
        w = self.world
        if isinstance(res, MetadataError):
            self.later(w.cfg.retry_backoff_s, self._create)
            return
        md = res.value
        self.versioned = res
        self.lid = md.ledger_id
        self.codec = EntryCodec(md.ledger_id, DIGEST, self.key)
        self.pipe = WritePipeline(
            ensemble_size=md.ensemble_size,
            write_quorum=md.write_quorum,
            ack_quorum=md.ack_quorum,
            ensemble=md.last_ensemble.bookies,
            outstanding_adds_max=self.outstanding_adds_max,
            _unsafe_ack_out_of_order=w.mut.ack_out_of_order,
        )
        w.checker.on_writer_created(self)
        self._tick()

    # -- appending --------------------------------------------------------------------------------------

    def _tick(self) -> None:
        pipe, codec, lid = self.pipe, self.codec, self.lid
        assert pipe is not None and codec is not None and lid is not None
        if self.appended >= self.n_entries:
            self._maybe_close()
            return
        try:
            self.state.check_append()
        except LedgerError as e:
            self._finish(e.code)
            return
        w = self.world
        if not pipe.has_capacity:
            self._waiting = True  # back-pressure: _apply ticks again once an add completes or fails
            return
        if self.batch_max > 1:
            self._tick_batch()
            return
        payload = w.rng.randbytes(w.rng.randint(1, 24))
        eid, data = self._append(payload)
        for t in pipe.targets(eid):
            self._send_add(eid, t.bookie, data)
        self._maybe_change_ensemble()
        self.later(w.jitter(self.think_max_s) + 0.0001, self._tick)

    def _append(self, payload: bytes) -> tuple[int, bytes]:
        pipe, codec, lid, w = self.pipe, self.codec, self.lid, self.world
        assert pipe is not None and codec is not None and lid is not None
        add = pipe.next_entry(len(payload))
        lac = add.entry_id if w.mut.eager_lac else add.lac  # eager_lac: WRONG on purpose
        data = codec.build(add.entry_id, lac, add.length, payload)
        w.written[(lid, add.entry_id)] = data
        w.payload_sizes[(lid, add.entry_id)] = len(payload)
        self.inflight.add(add.entry_id)
        self.appended += 1
        w.log(f"{self.name} APPEND L{lid} e{add.entry_id} (lac {add.lac})")
        return add.entry_id, data

    def _tick_batch(self) -> None:
        """Append a burst of entries (of one payload size, as a benchmark or a batching producer does) and send
        each bookie its share in one write: the bookie's multi-entry add path and the pipeline's ``on_acks``."""
        pipe, w = self.pipe, self.world
        assert pipe is not None
        outbox: dict[str, list[tuple[int, bytes]]] = {}
        for _ in range(w.rng.randint(1, self.batch_max)):
            if not pipe.has_capacity or self.appended >= self.n_entries:
                break
            eid, data = self._append(w.rng.randbytes(self.payload_size))
            for t in pipe.targets(eid):
                outbox.setdefault(t.bookie, []).append((eid, data))
        for bookie, items in outbox.items():
            if len(items) == 1:
                self._send_add(items[0][0], bookie, items[0][1])
            else:
                self._send_adds(bookie, items)
        self._maybe_change_ensemble()
        self.later(w.jitter(self.think_max_s) + 0.0001, self._tick)

    def _send_adds(self, bookie: str, items: list[tuple[int, bytes]]) -> None:
        lid, key, w = self.lid, self.key, self.world
        assert lid is not None
        w.stats["writer add batches"] += 1
        remaining = {eid for eid, _ in items}

        def build(eid: int, data: bytes) -> Any:
            return lambda rid: p.AddEntryRequest(
                request_id=rid, ledger_id=lid, entry_id=eid, master_key=key, entry=data
            )

        def on_rows(rows: list[tuple[int, ...]] | None) -> bool:
            pipe = self.pipe
            assert pipe is not None
            if rows is None:  # timeout or lost connection: every add not answered failed at this bookie
                for eid in sorted(remaining):
                    self._apply(pipe.on_ack(eid, bookie, None))
                remaining.clear()
            else:
                mine = [r for r in rows if r[7] in remaining]
                remaining.difference_update(r[7] for r in mine)
                ok = [r[7] for r in mine if r[5] == p.Status.OK or w.mut.batch_acks_all]
                if ok:  # a chunk of OK acks from one bookie: one call, as the client's fast path
                    self._apply(pipe.on_acks(bookie, ok))
                for r in mine:
                    if r[5] != p.Status.OK and not w.mut.batch_acks_all:
                        self._apply(pipe.on_ack(r[7], bookie, p.Status(r[5])))
            self._maybe_change_ensemble()
            self._maybe_close()
            return not remaining

        self.request_adds(bookie, [build(eid, data) for eid, data in items], on_rows)

    def _send_add(self, eid: int, bookie: str, data: bytes) -> None:
        lid, key = self.lid, self.key
        assert lid is not None
        self.request(
            bookie,
            lambda rid: p.AddEntryRequest(
                request_id=rid, ledger_id=lid, entry_id=eid, master_key=key, entry=data
            ),
            lambda resp: self._on_add(eid, bookie, resp),
        )

    def _on_add(self, eid: int, bookie: str, resp: p.Response | None) -> None:
        pipe = self.pipe
        assert pipe is not None
        status = resp.status if resp is not None else None
        self._apply(pipe.on_ack(eid, bookie, status))
        self._maybe_change_ensemble()
        self._maybe_close()

    def _apply(self, progress: Progress) -> None:
        pipe, w = self.pipe, self.world
        assert pipe is not None
        for eid in progress.completed:
            self.inflight.discard(eid)
            self.acked.append(eid)
            w.stats["entries acked"] += 1
            w.log(f"{self.name} ACKED L{self.lid} e{eid} to the user")
            w.checker.on_user_ack(self, eid)
        if pipe.lac != self.max_lac:
            w.checker.on_writer_lac(self)  # before max_lac moves: the check compares the two
            self.max_lac = max(self.max_lac, pipe.lac)
        for eid in progress.failed:
            self.inflight.discard(eid)
        if self._waiting and (progress.completed or progress.failed):
            self._waiting = False
            self.later(0.0, self._tick)
        if progress.error is not None:
            w.log(f"{self.name} FAILED: {progress.error}")
            self.state.handle(HandleEvent.FAILED, error=progress.error)
            self._finish(progress.error.code)

    # -- ensemble change --------------------------------------------------------------------------------

    def _maybe_change_ensemble(self) -> None:
        pipe = self.pipe
        assert pipe is not None
        if self.done or not pipe.needs_ensemble_change or pipe.changing_ensemble:
            return
        if self._close_sent:
            return  # nothing is pending and the close CAS carries the LAC: a late failure changes nothing
        if self.world.mut.writer_skips_ensemble_change:
            return  # WRONG on purpose: the failed bookie is never replaced
        self._ec_plan = pipe.ensemble_change_plan()
        self._ec_tried = []
        self._ec_deadline = self.world.now + self.world.cfg.ensemble_change_timeout_s
        self.state.handle(HandleEvent.ENSEMBLE_CHANGE_START)
        self._ec_attempt()

    def _ec_attempt(self) -> None:
        """Choose replacements and CAS the new segment on the version we hold, as
        ``ensemble_change_transition`` (the client's own) makes it from that version."""
        pipe, plan, w = self.pipe, self._ec_plan, self.world
        assert pipe is not None and plan is not None and self.versioned is not None and self.lid is not None
        if pipe.error is not None:
            return
        available = w.available()
        try:
            new = replace_failed(pipe.ensemble, sorted(plan.failed_indices), available, rng=w.rng)
        except NotEnoughBookiesError as e:
            self.spares_short = (len(set(available) - set(pipe.ensemble)), len(plan.failed_indices))
            self._ec_retry(e)
            return
        current = self.versioned
        md, step = ensemble_change_transition(
            current.value,
            first_entry_id=plan.first_entry_id,
            ensemble=pipe.ensemble,
            tried=self._ec_tried,
            new_bookies=new,
        )
        if md is None and step is EnsembleChangeStep.FENCED and w.mut.writer_continues_in_recovery:
            md = current.value.with_new_ensemble(plan.first_entry_id, new)  # WRONG on purpose
        if md is None:
            self._ec_step(step, current)
            return
        self._ec_tried.append(tuple(new))
        w.meta.write(self, self.lid, md, current, self._ec_written)

    def _ec_retry(self, error: LedgerError) -> None:
        """After a failure: give up past the deadline, else re-read (a lost reply may hide an applied write)."""
        w = self.world
        if w.now > self._ec_deadline:
            self.ec_gave_up_started_at = self._ec_deadline - w.cfg.ensemble_change_timeout_s
            self._apply(self.pipe.fail(error))  # type: ignore[union-attr]
            return
        self.later(w.cfg.retry_backoff_s, lambda: w.meta.read(self, self.lid, self._ec_reread))  # type: ignore[arg-type]

    def _ec_written(self, res: MetaResult) -> None:
        pipe, w = self.pipe, self.world
        assert pipe is not None and self.lid is not None
        if pipe.error is not None:
            return
        if isinstance(res, MetadataVersionError):
            w.meta.read(self, self.lid, self._ec_reread)
        elif isinstance(res, MetadataError):
            self._ec_retry(MetadataStoreError(str(res), ledger_id=self.lid))
        else:
            self._ec_applied(res)

    def _ec_reread(self, res: MetaResult) -> None:
        pipe, plan = self.pipe, self._ec_plan
        assert pipe is not None and plan is not None and self.lid is not None
        if pipe.error is not None:
            return
        if isinstance(res, MetadataError):
            self._ec_retry(MetadataStoreError(str(res), ledger_id=self.lid))
            return
        last = res.value.last_ensemble
        step = ensemble_change_step(
            res.value.state,
            last.first_entry_id,
            last.bookies,
            first_entry_id=plan.first_entry_id,
            ensemble=pipe.ensemble,
            tried=self._ec_tried,
        )
        if step is EnsembleChangeStep.FENCED and self.world.mut.writer_continues_in_recovery:
            step = EnsembleChangeStep.WRITE  # WRONG on purpose: carries on in a ledger being recovered
        self._ec_step(step, res)

    def _ec_step(self, step: EnsembleChangeStep, res: Versioned[LedgerMetadata]) -> None:
        """Act on ``ensemble_change_step``'s decision about the metadata found."""
        pipe = self.pipe
        assert pipe is not None and self.lid is not None
        if step is EnsembleChangeStep.FENCED:
            self._apply(pipe.fail(LedgerFencedError("ledger is being recovered", ledger_id=self.lid)))
        elif step is EnsembleChangeStep.FOUND_CLOSED:
            self._apply(pipe.fail(LedgerClosedError("ledger was closed", ledger_id=self.lid)))
        elif step is EnsembleChangeStep.CHANGED:
            self._apply(pipe.fail(LedgerFencedError("metadata changed under the writer", ledger_id=self.lid)))
        elif step is EnsembleChangeStep.ADOPT:
            # One of our own CAS writes was applied although its reply was lost (ZooKeeper ConnectionLoss).
            self.world.stats["writer found its own lost ensemble change"] += 1
            self._ec_applied(res)
        else:
            self.versioned = res
            self._ec_attempt()

    def _ec_applied(self, res: Versioned[LedgerMetadata]) -> None:
        pipe, plan, w = self.pipe, self._ec_plan, self.world
        assert pipe is not None and plan is not None and self.lid is not None
        self.versioned = res
        bookies = list(res.value.last_ensemble.bookies)
        w.log(
            f"{self.name} ENSEMBLE CHANGE L{self.lid} from e{plan.first_entry_id}: {list(pipe.ensemble)} -> {bookies}"
        )
        w.stats["writer ensemble change"] += 1
        result = pipe.apply_new_ensemble(plan.first_entry_id, bookies)
        self._ec_plan = None
        self.state.handle(HandleEvent.ENSEMBLE_CHANGE_DONE)
        for r in result.resends:
            self._send_add(r.entry_id, r.bookie, w.written[(self.lid, r.entry_id)])
        self._apply(Progress(completed=result.completed))
        self._maybe_change_ensemble()
        self._maybe_close()

    # -- closing ----------------------------------------------------------------------------------------

    def _maybe_close(self) -> None:
        pipe = self.pipe
        assert pipe is not None
        if self.done or self.appended < self.n_entries or not self.close_when_done:
            return
        if not self._close_started:
            self._close_started = True
            self.state.handle(HandleEvent.CLOSE_START)
        if self._close_sent or pipe.outstanding or pipe.changing_ensemble or pipe.needs_ensemble_change:
            return  # wait for the pending adds (and any ensemble change) to drain
        if pipe.error is not None:
            self._finish(pipe.error.code)
            return
        self._close_sent = True
        self._close_attempt()

    def _close_attempt(self) -> None:
        pipe, cur, w = self.pipe, self.versioned, self.world
        assert pipe is not None and cur is not None and self.lid is not None
        length = pipe.length
        if w.mut.wrong_close_length and pipe.lac >= 0:
            length -= w.payload_sizes[(self.lid, pipe.lac)]  # WRONG on purpose: the last entry left out
        md, ev = writer_close_transition(cur.value, pipe.lac, length)
        if md is not None:
            w.meta.write(self, self.lid, md, cur, self._close_written)
            return
        assert ev is not None
        self.state.handle(ev)
        w.log(
            f"{self.name} CLOSE found {cur.value.state} last={cur.value.last_entry_id}: {self.state.state.name}"
        )
        if self.state.state is HandleState.CLOSED:
            self._finish("closed")
        else:
            assert self.state.error is not None
            self._finish(self.state.error.code)

    def _close_written(self, res: MetaResult) -> None:
        w = self.world
        assert self.lid is not None
        if isinstance(res, MetadataVersionError):
            w.meta.read(self, self.lid, self._close_reread)
            return
        if isinstance(res, MetadataError):
            self.later(w.cfg.retry_backoff_s, lambda: w.meta.read(self, self.lid, self._close_reread))  # type: ignore[arg-type]
            return
        self.versioned = res
        self.state.handle(HandleEvent.CLOSE_DONE)
        w.log(f"{self.name} CLOSED L{self.lid} at {res.value.last_entry_id}")
        self._finish("closed")

    def _close_reread(self, res: MetaResult) -> None:
        w = self.world
        if isinstance(res, MetadataError):
            self.later(w.cfg.retry_backoff_s, lambda: w.meta.read(self, self.lid, self._close_reread))  # type: ignore[arg-type]
            return
        self.versioned = res
        self._close_attempt()

    def _finish(self, outcome: str) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.world.stats[f"writer {outcome}"] += 1
            self.world.log(f"{self.name} DONE: {outcome}")
        self.done = True


# ------------------------------------------------------------------------------------------------ recovery


class Recoverer(Client):
    def __init__(self, world: World, name: str, lid: int, password: bytes, *, read_window: int = 4) -> None:
        super().__init__(world, name)
        self.lid = lid
        self.key = p.master_key(password)
        self.codec = EntryCodec(lid, DIGEST, self.key)
        self.read_window = read_window
        self.versioned: Versioned[LedgerMetadata] | None = None
        self.rec: LedgerRecovery | None = None
        self.attempts = 0
        self.result: int | None = None  # the last_entry_id this recoverer reports to its user
        self.fence_lacs: list[int] = []  # LACs the fencing reads returned (all attempts)
        self.starts: list[int] = []  # each attempt's recovery start, once fencing reached coverage
        self._covered = False
        self._reopened = False  # mutation reopen-closed-ledger: this recoverer reopened its ledger

    def start(self, delay_s: float = 0.0) -> None:
        self.world.log(f"{self.name} RECOVER L{self.lid} (in {delay_s:.3f}s)")
        self.later(delay_s, self._read_md)

    def _read_md(self) -> None:
        self.world.meta.read(self, self.lid, self._on_md)

    def _on_md(self, res: MetaResult) -> None:
        if isinstance(res, MetadataError):
            self.later(self.world.cfg.retry_backoff_s, self._read_md)
            return
        self.versioned = res
        self._decide()

    def _decide(self) -> None:
        assert self.versioned is not None
        md = self.versioned.value
        marked, decision = recovery_start_transition(md)  # the client's own transition
        if decision == "already_closed" and self.world.mut.reopen_closed_ledger and not self._reopened:
            # WRONG on purpose: the ledger is taken out of CLOSED and recovered again.
            self._reopened = True
            self.world.meta.write(
                self,
                self.lid,
                md.replace(state="IN_RECOVERY", last_entry_id=-1, length=0),
                self.versioned,
                self._on_marked,
            )
        elif decision == "already_closed":
            self._finished(md.last_entry_id)
        elif decision == "proceed":
            self._run()
        else:
            assert marked is not None
            self.world.meta.write(self, self.lid, marked, self.versioned, self._on_marked)

    def _on_marked(self, res: MetaResult) -> None:
        if isinstance(res, MetadataVersionError):
            self._read_md()
            return
        if isinstance(res, MetadataError):
            self.later(self.world.cfg.retry_backoff_s, self._read_md)
            return
        self.versioned = res
        self._run()

    def _run(self) -> None:
        assert self.versioned is not None
        md, mut = self.versioned.value, self.world.mut
        self.attempts += 1
        rec = LedgerRecovery(
            ensemble_size=md.ensemble_size,
            write_quorum=md.write_quorum,
            ack_quorum=md.ack_quorum,
            ensembles=md.ensembles,
            read_window=self.read_window,
            fence_on_recovery_reads=not mut.no_recovery_read_fence,
            _unsafe_count_all_answers=mut.count_all_answers,
        )
        self.rec = rec
        self._covered = False
        self._exec(rec, rec.start())

    # -- executing commands -----------------------------------------------------------------------------

    def _exec(self, rec: LedgerRecovery, cmds: list[Command]) -> None:
        lid, key, w = self.lid, self.key, self.world
        for cmd in cmds:
            if rec is not self.rec:
                return  # a finished or abandoned attempt
            if isinstance(cmd, FenceRead):
                fr = cmd
                self.request(
                    fr.bookie,
                    lambda rid: p.ReadEntryRequest(
                        request_id=rid,
                        ledger_id=lid,
                        entry_id=p.LAST_ENTRY,
                        master_key=key,
                        flags=p.Flag.FENCE,
                    ),
                    lambda resp, fr=fr: self._on_fence(rec, fr, resp),  # type: ignore[misc]
                )
            elif isinstance(cmd, RecoveryRead):
                flags = p.Flag.FENCE if cmd.fence else 0
                for idx, bookie in zip(cmd.bookie_indices, cmd.bookies, strict=True):
                    self._read(rec, cmd.entry_id, bookie, flags, idx)
            elif isinstance(cmd, LengthRead):
                for bookie in cmd.bookies:
                    self._read(rec, cmd.entry_id, bookie, 0, None)
            elif isinstance(cmd, RecoveryAdd):
                ra = cmd
                self.request(
                    ra.bookie,
                    lambda rid, ra=ra: p.AddEntryRequest(  # type: ignore[misc]
                        request_id=rid,
                        ledger_id=lid,
                        entry_id=ra.entry_id,
                        master_key=key,
                        entry=ra.entry,
                        flags=p.Flag.RECOVERY_ADD,
                    ),
                    lambda resp, ra=ra: self._on_recovery_add(rec, ra, resp),  # type: ignore[misc]
                )
            elif isinstance(cmd, ChangeEnsemble):
                self._change_ensemble(rec, cmd)
            elif isinstance(cmd, Close):
                self._close(rec, cmd)
            elif isinstance(cmd, RecoveryFailed):
                w.stats["recovery attempt failed"] += 1
                w.log(f"{self.name} attempt {self.attempts} FAILED: {cmd.error}")
                self.rec = None
                if w.mut.recovery_gives_up:
                    return  # WRONG on purpose: the ledger stays IN_RECOVERY
                self.later(w.jitter(2 * w.cfg.retry_backoff_s, w.cfg.retry_backoff_s), self._read_md)
            else:  # pragma: no cover
                raise TypeError(cmd)

    def _on_fence(self, rec: LedgerRecovery, cmd: FenceRead, resp: p.Response | None) -> None:
        if rec is not self.rec:
            return
        status, lac = None, -1
        if isinstance(resp, p.ReadEntryResponse):
            status, lac = resp.status, _lac_of(resp)
        if status == p.Status.UNAUTHORIZED:
            self.world.checker.fail("crash", f"{self.name}: bookie {cmd.bookie} refused the ledger's key")
            return
        if status is not None:
            self.fence_lacs.append(lac)
        cmds = rec.on_fence_response(cmd.bookie_index, status, lac)
        if rec.start_entry_id is not None and not self._covered:
            self._covered = True
            self.starts.append(rec.start_entry_id)
            self.world.stats["fencing coverage"] += 1
            self.world.log(f"{self.name} FENCING COVERAGE L{self.lid}: start={rec.start_entry_id}")
            self.world.checker.on_fence_coverage(self)
        self._exec(rec, cmds)

    def _read(self, rec: LedgerRecovery, eid: int, bookie: str, flags: int, idx: int | None) -> None:
        lid, key = self.lid, self.key

        def on_reply(resp: p.Response | None) -> None:
            if rec is not self.rec:
                return
            status: p.Status | None = None
            data = b""
            valid = True
            if isinstance(resp, p.ReadEntryResponse):
                status = resp.status
                if status == p.Status.OK:
                    data = resp.entry
                    try:
                        self.codec.verify(data, eid)
                    except DigestMismatchError as e:
                        valid = False
                        self.world.checker.fail("3", f"{self.name}: {bookie} returned a corrupt e{eid}: {e}")
                    else:
                        self.world.checker.on_read(self.name, lid, eid, data)
            if idx is None:
                cmds = rec.on_length_response(eid, bookie, status, data, valid)
            else:
                cmds = rec.on_read_response(eid, idx, status, data, valid)
            self._exec(rec, cmds)

        self.request(
            bookie,
            lambda rid: p.ReadEntryRequest(
                request_id=rid, ledger_id=lid, entry_id=eid, master_key=key, flags=flags
            ),
            on_reply,
        )

    def _on_recovery_add(self, rec: LedgerRecovery, cmd: RecoveryAdd, resp: p.Response | None) -> None:
        if rec is not self.rec:
            return
        status = resp.status if resp is not None else None
        self._exec(rec, rec.on_recovery_add_response(cmd.entry_id, cmd.bookie, status))

    def _change_ensemble(self, rec: LedgerRecovery, cmd: ChangeEnsemble) -> None:
        w = self.world
        try:
            new = replace_failed(cmd.ensemble, sorted(cmd.plan.failed_indices), w.available(), rng=w.rng)
        except NotEnoughBookiesError as e:
            err = e
            self.later(
                w.jitter(w.cfg.meta_delay_max_s), lambda: self._exec(rec, rec.on_ensemble_change_failed(err))
            )
            return
        w.stats["write-back ensemble change"] += 1
        w.log(
            f"{self.name} write-back ENSEMBLE CHANGE from e{cmd.plan.first_entry_id}: {list(cmd.ensemble)} -> {new}"
        )
        self.later(
            w.jitter(w.cfg.meta_delay_max_s),
            lambda: self._exec(rec, rec.on_ensemble_changed(cmd.plan.first_entry_id, new)),
        )

    # -- closing ----------------------------------------------------------------------------------------

    def _close(self, rec: LedgerRecovery, cmd: Close) -> None:
        cur = self.versioned
        assert cur is not None
        md = cur.value
        closed, d = recovery_close_transition(md, cmd)  # the client's own transition
        mut = self.world.mut
        if closed is None and not mut.recoverer_overwrites_close:
            self.world.stats["recovery adopted another close"] += 1
            self.world.log(
                f"{self.name} adopts the close at {d.last_entry_id} (computed {cmd.last_entry_id})"
            )
            self._finished(cmd.last_entry_id if mut.recoverer_reports_own_result else d.last_entry_id)
            return
        new = closed or md.replace(  # (None: recoverer-overwrites-close, WRONG on purpose)
            state="CLOSED",
            last_entry_id=cmd.last_entry_id,
            length=cmd.length,
            ensembles=tuple(Ensemble(s.first_entry_id, tuple(s.bookies)) for s in cmd.ensembles),
        )

        def written(res: MetaResult) -> None:
            if rec is not self.rec:
                return
            if isinstance(res, MetadataTransitionError):
                # The store refused the close: the real client's open fails with MetadataStoreError and the
                # ledger stays IN_RECOVERY; our "user" retries the whole recovery later.
                self.world.log(f"{self.name} close REFUSED by the metadata store: {res}")
                self.world.stats["recovery close refused"] += 1
                self.rec = None
                self.later(self.world.cfg.retry_backoff_s, self._read_md)
                return
            if isinstance(res, MetadataError):
                delay = 0.0 if isinstance(res, MetadataVersionError) else self.world.cfg.retry_backoff_s
                self.later(delay, lambda: self.world.meta.read(self, self.lid, reread))
                return
            self.versioned = res
            self._finished(cmd.last_entry_id)

        def reread(res: MetaResult) -> None:
            if rec is not self.rec:
                return
            if isinstance(res, MetadataError):
                self.later(
                    self.world.cfg.retry_backoff_s, lambda: self.world.meta.read(self, self.lid, reread)
                )
                return
            self.versioned = res
            self._close(rec, cmd)

        self.world.meta.write(self, self.lid, new, cur, written)

    def _finished(self, last_entry_id: int) -> None:
        self.result = last_entry_id
        self.rec = None
        self.done = True
        self.world.stats["recovery done"] += 1
        self.world.log(f"{self.name} RECOVERED L{self.lid}: last_entry_id={last_entry_id}")
        self.world.checker.on_recovery_done(self)


# ------------------------------------------------------------------------------------------------ reader


class Reader(Client):
    def __init__(self, world: World, name: str, writer: Writer, *, poll_s: float = 0.1) -> None:
        super().__init__(world, name)
        self.writer = writer
        self.key = writer.key
        self.poll_s = poll_s
        self.lid: int | None = None
        self.codec: EntryCodec | None = None
        self.versioned: Versioned[LedgerMetadata] | None = None
        self.lac = -1
        self.next = 0
        self.reads = 0
        self._round = 0

    def start(self, delay_s: float = 0.0) -> None:
        self.later(delay_s, self._open)

    def _open(self) -> None:
        if self.writer.lid is None:
            self.later(self.poll_s, self._open)
            return
        self.lid = self.writer.lid
        self.codec = EntryCodec(self.lid, DIGEST, self.key)
        self._refresh(self._poll)

    def _refresh(self, then: Any) -> None:
        assert self.lid is not None

        def got(res: MetaResult) -> None:
            if not isinstance(res, MetadataError):
                if self.versioned is None or res.version >= self.versioned.version:
                    self.versioned = res
                then()
            else:
                self.later(self.poll_s, lambda: self._refresh(then))

        self.world.meta.read(self, self.lid, got)

    def _poll(self) -> None:
        assert self.versioned is not None and self.lid is not None
        md = self.versioned.value
        if md.state.value == "CLOSED":
            self._set_lac(md.last_entry_id)
            self._read_next()
            return
        self._round += 1
        rnd = self._round
        cov = CoverageSet(md.ensemble_size, md.write_quorum, md.ack_quorum)
        state = {"best": -1, "answers": 0, "done": False}
        bookies = md.last_ensemble.bookies
        lid, key = self.lid, self.key

        def on_reply(i: int, resp: p.Response | None) -> None:
            if state["done"] or rnd != self._round:
                return
            state["answers"] += 1
            status = None
            if isinstance(resp, p.ReadEntryResponse):
                status = resp.status
                state["best"] = max(state["best"], _lac_of(resp))
            cov.add_response(i, answer_for_status(status))
            if cov.covered():
                state["done"] = True
                self._set_lac(state["best"])
                self._read_next()
            elif state["answers"] == len(bookies):
                state["done"] = True
                self.later(self.poll_s, lambda: self._refresh(self._poll))

        for i, b in enumerate(bookies):
            self.request(
                b,
                lambda rid: p.ReadEntryRequest(
                    request_id=rid, ledger_id=lid, entry_id=p.LAST_ENTRY, master_key=key
                ),
                lambda resp, i=i: on_reply(i, resp),  # type: ignore[misc]
            )

    def _set_lac(self, lac: int) -> None:
        self.world.checker.on_reader_lac(self, lac)
        if lac > self.lac:
            self.world.log(f"{self.name} LAC L{self.lid} -> {lac}")
            self.lac = lac

    def _read_next(self) -> None:
        assert self.versioned is not None
        md = self.versioned.value
        if self.next > self.lac:
            if md.state.value == "CLOSED" and self.next > md.last_entry_id:
                self.done = True
                self.world.log(f"{self.name} read all of L{self.lid} ({self.next} entries)")
                return
            if md.state.value != "CLOSED" and self.world.rng.random() < 0.5:
                self._long_poll(md)
            else:
                self.later(self.poll_s, lambda: self._refresh(self._poll))
            return
        eid = self.next
        ens = md.ensemble_at(eid).bookies
        ws = write_set(eid, md.ensemble_size, md.write_quorum)
        bookies = [ens[i] for i in ws]
        k = self.world.rng.randrange(len(bookies))
        self._try(eid, bookies[k:] + bookies[:k])

    def _long_poll(self, md: LedgerMetadata) -> None:
        """Wait on one bookie of the last ensemble until its LAC passes ours (or the poll times out)."""
        w = self.world
        lid, key, prev = self.lid, self.key, self.lac
        assert lid is not None
        bookie = w.rng.choice(md.last_ensemble.bookies)
        timeout_ms = int(1000 * min(self.poll_s, w.cfg.request_timeout_s / 2))

        def on_reply(resp: p.Response | None) -> None:
            if isinstance(resp, p.ReadEntryResponse) and resp.status in (p.Status.OK, p.Status.NO_ENTRY):
                w.stats["reader long polls answered"] += 1
                self._set_lac(resp.lac)
                if self.lac > prev:
                    self._read_next()
                    return
            self.later(self.poll_s, lambda: self._refresh(self._poll))

        self.request(
            bookie,
            lambda rid: p.ReadEntryRequest(
                request_id=rid,
                ledger_id=lid,
                entry_id=p.LAST_ENTRY,
                master_key=key,
                flags=p.Flag.LONG_POLL,
                previous_lac=prev,
                timeout_ms=timeout_ms,
            ),
            on_reply,
        )

    def _try(self, eid: int, bookies: list[str]) -> None:
        if not bookies:
            # No replica answered (down, partitioned, or our metadata is stale): refresh and retry later.
            self.later(self.poll_s, lambda: self._refresh(self._read_next))
            return
        lid, key, bookie = self.lid, self.key, bookies[0]
        assert lid is not None and self.codec is not None

        def on_reply(resp: p.Response | None) -> None:
            if isinstance(resp, p.ReadEntryResponse) and resp.status == p.Status.OK:
                try:
                    self.codec.verify(resp.entry, eid)  # type: ignore[union-attr]
                except DigestMismatchError as e:
                    self.world.checker.fail("3", f"{self.name}: {bookie} returned a corrupt e{eid}: {e}")
                    return
                self.world.checker.on_read(self.name, lid, eid, resp.entry)
                self.reads += 1
                self.world.stats["reader entries read"] += 1
                self.next = eid + 1
                self._read_next()
                return
            self._try(eid, bookies[1:])

        self.request(
            bookie,
            lambda rid: p.ReadEntryRequest(request_id=rid, ledger_id=lid, entry_id=eid, master_key=key),
            on_reply,
        )


# ------------------------------------------------------------------------------------------------ range reader


class RangeReader(Client):
    """Reads a ledger, once it is CLOSED, from its first entry to its last as ``LedgerHandle.read_batches`` does:
    the client's ``ReadPlanner`` cuts it into READ_RANGE batches (read-ahead window, failover to the next
    replica, short answers asked again) and this actor sends them and verifies every entry. An entry that
    every replica says it does not have is reported lost (invariant 1: it is <= last_entry_id); one that
    failed otherwise (I/O errors, timeouts) is read again later, from a fresh plan.

    With ``speculative_s`` > 0 it reads speculatively as ``BatchReader`` does: a batch without an answer for
    that long (on the simulated clock) whose bookie answered nothing of this read since is asked of another
    replica too (``ReadPlanner.speculate``), and the copies' answers go through the client's ``Rivals`` (which
    one settles the batch, which are dropped, which speculates on after a copy failed at once). Each entry of a
    plan is handed out once (invariant 3)."""

    def __init__(
        self,
        world: World,
        name: str,
        writer: Writer,
        *,
        batch_entries: int,
        window: int,
        poll_s: float = 0.1,
        speculative_s: float = 0.0,
    ) -> None:
        super().__init__(world, name)
        self.writer = writer
        self.key = writer.key
        self.batch_entries = batch_entries
        self.window = window
        self.poll_s = poll_s
        self.lid: int | None = None
        self.codec: EntryCodec | None = None
        self.md: LedgerMetadata | None = None
        self.planner: ReadPlanner | None = None
        self.got: set[int] = set()
        self.next = 0  # every entry before this one has been read
        self.lac = -1  # (the ledger's last entry, once known: for the liveness report)
        self.speculative_s = speculative_s
        self._new_plan_state()

    def _new_plan_state(self) -> None:
        self.plan_got: set[int] = set()  # entries this plan handed out
        self.waiting: dict[Batch, int] = {}  # batch -> its request id, until answered or dropped
        self.rivals = Rivals()
        self.rivals._unsafe_keep_losers = self.world.mut.spec_loser_kept
        self.spec: dict[Batch, tuple[Timer, int]] = {}  # batch -> its speculative timer, answers heard then
        self.heard: dict[str, int] = {}  # answers per bookie in this plan

    def start(self, delay_s: float = 0.0) -> None:
        self.later(delay_s, self._open)

    def _open(self) -> None:
        lid = self.writer.lid
        if lid is None:
            self.later(self.poll_s, self._open)
            return
        self.lid = lid
        self.codec = EntryCodec(lid, DIGEST, self.key)

        def got(res: MetaResult) -> None:
            if isinstance(res, MetadataError) or res.value.state.value != "CLOSED":
                self.later(self.poll_s, self._open)
                return
            self.md = res.value
            self.lac = self.md.last_entry_id
            self._plan()

        self.world.meta.read(self, lid, got)

    def _plan(self) -> None:
        md = self.md
        assert md is not None
        if self.next > md.last_entry_id:
            self.done = True
            self.world.log(f"{self.name} range-read all of L{self.lid} ({self.next} entries)")
            return
        self.world.stats["range reader plans"] += 1
        self._new_plan_state()
        self.planner = ReadPlanner(
            self.next,
            md.last_entry_id,
            [(e.first_entry_id, e.bookies) for e in md.ensembles],
            ensemble_size=md.ensemble_size,
            write_quorum=md.write_quorum,
            batch_entries=self.batch_entries,
            window=self.window,
        )
        for b in self.planner.next_batches():
            self._send(self.planner, b)

    def _send(self, planner: ReadPlanner, b: Batch) -> None:
        lid, key = self.lid, self.key
        assert lid is not None
        self._arm(planner, b)
        self.waiting[b] = self.request(
            b.bookie,
            lambda rid: p.ReadRangeRequest(
                request_id=rid,
                ledger_id=lid,
                first_entry_id=b.first,
                last_entry_id=b.last,
                master_key=key,
                max_bytes=self.world.rng.choice([64, 256, 1 << 20]),  # short answers too
                step=b.step,
            ),
            lambda resp: self._on_reply(planner, b, resp),
        )

    # -- speculative reads (as BatchReader's, on the simulated clock) --------------------------------------
    def _arm(self, planner: ReadPlanner, b: Batch) -> None:
        if self.speculative_s > 0:
            timer = self.world.timer(
                self.speculative_s, lambda: self.call(lambda: self._speculate(planner, b))
            )
            self.spec[b] = (timer, self.heard.get(b.bookie, 0))

    def _disarm(self, b: Batch) -> None:
        armed = self.spec.pop(b, None)
        if armed is not None:
            armed[0].cancel()

    def _speculate(self, planner: ReadPlanner, b: Batch) -> None:
        armed = self.spec.pop(b, None)
        if planner is not self.planner or armed is None or b not in self.waiting:
            return
        if not self.rivals.speculates(b):
            return
        answered_since = self.heard.get(b.bookie, 0) != armed[1]
        nb = planner.speculate(b, answered_since)
        if nb is None:
            if answered_since:
                self._arm(planner, b)
            return
        self.rivals.add(b, nb)
        self.world.stats["range reader speculative reads"] += 1
        self.world.log(f"{self.name} SPECULATE e{b.first}..{b.last} {b.bookie} -> {nb.bookie}")
        self._send(planner, nb)

    def _on_reply(self, planner: ReadPlanner, b: Batch, resp: p.Response | None) -> None:
        if planner is not self.planner:
            return  # an abandoned plan
        w, lid, codec = self.world, self.lid, self.codec
        assert lid is not None and codec is not None
        if resp is not None:
            self.heard[b.bookie] = self.heard.get(b.bookie, 0) + 1
        if self.waiting.pop(b, None) is None:
            return  # dropped: a rival settled its entries
        self._disarm(b)
        delivered, outcome, why = 0, Outcome.FAILED, "TIMEOUT"
        entries: list[tuple[int, bytes]] = []
        if isinstance(resp, p.ReadRangeResponse):
            why = resp.status.name
            if resp.status == p.Status.OK:
                outcome = Outcome.SHORT if len(resp.entries) < b.count else None  # type: ignore[assignment]
                for k, entry in enumerate(resp.entries[: b.count]):
                    eid = b.first + k * b.step
                    try:
                        codec.verify(entry, eid)
                    except DigestMismatchError as e:
                        w.checker.fail("3", f"{self.name}: {b.bookie} returned a corrupt e{eid}: {e}")
                        outcome, why = Outcome.FAILED, "DIGEST_MISMATCH"
                        break
                    entries.append((eid, entry))
                    delivered += 1
            elif resp.status in (p.Status.NO_ENTRY, p.Status.NO_LEDGER):
                outcome = Outcome.MISSING
        if resp is None and self.speculative_s > 0:
            planner.mark_slow(b.bookie)  # (timed out or its connection lost: asked last from now on)
        v = self.rivals.on_answer(b, delivered, outcome, why, self.waiting)
        if not v.settles:
            w.stats["range reader copies failed beside a rival"] += 1
            if v.rearm is not None and v.rearm not in self.spec:
                self._arm(planner, v.rearm)
            return
        for r in v.drop:
            w.stats["range reader copies dropped"] += 1
            self.forget(r.bookie, self.waiting.pop(r))
            self._disarm(r)
        for bookie in v.slow:
            planner.mark_slow(bookie)
        for eid, entry in entries:
            if eid in self.plan_got:
                w.checker.fail("3", f"{self.name}: L{lid} e{eid} handed out twice (again from {b.bookie})")
            self.plan_got.add(eid)
            w.checker.on_read(self.name, lid, eid, entry)
            self.got.add(eid)
        settled = planner.on_answer(b, delivered, outcome, why)
        w.stats["range reader entries read"] += delivered
        while self.next in self.got:
            self.next += 1
        planner.consumed = self.next
        bad = settled.unreadable
        if bad is not None:
            self.planner = None
            if bad.missing:
                w.checker.fail(
                    "1",
                    f"{self.name}: every replica of L{lid} e{bad.entry_id} (CLOSED at {self.lac}) says it has "
                    f"no such entry: {'; '.join(bad.errors)}",
                )
                return
            w.stats["range reader retries"] += 1
            self.later(self.poll_s, self._plan)  # unreadable for now (errors): read on from a fresh plan
            return
        for r in settled.retries:
            self._send(planner, r)
        for r in planner.next_batches():
            self._send(planner, r)
        if planner.done_planning and planner.in_flight == 0:
            self.planner = None
            self._plan()
