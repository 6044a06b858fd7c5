"""The simulated world: virtual time, a lossy network, a versioned metadata store and in-memory bookies.

One ``random.Random(seed)`` owns every decision (message delays, loss, duplication, journal sync times,
faults, placement), time is an event queue, and there are no threads and no wall clock, so a seed replays
bit for bit. Nothing here re-implements the code under test: bookies are the real ``BookieCore`` over
``MemoryJournal`` + ``MemoryLedgerStorage``, requests and replies cross the network as real protocol frames,
and ledger metadata goes through the real ``zk.LedgerMetadataStore`` over a simulated ZooKeeper. What the simulator adds is small and obvious:

* **Network** — each message is delivered after a random delay (so messages reorder), or lost, or delivered
  twice; partitions block directed (src, dst) pairs, checked when a message would be delivered; scenario
  ``rules`` can drop or delay chosen messages. A request to a down bookie, or outstanding when the bookie
  crashes, fails fast at the client (connection refused/reset) unless a partition hides it (then: timeout).
* **Bookie disks** — journal records become durable only at ``sync()``, which runs at random times after an
  append (group commit), much later on a slow disk. A crash loses unsynced records and every storage write
  since the last checkpoint (RocksDB with its WAL off); a checkpoint moves the journal's mark to where the
  journal was at the checkpoint before it, and a restart replays the journal from the mark over the last
  checkpoint (records before it count as deleted, as the real bookie's segments are). A wiped disk loses
  everything, cookie included: the cookie check refuses to start such a bookie (it stays down) unless the
  test-only ``trust_wiped_disk`` mutation is on. Damage while down (profile ``storage-faults``): the ledger
  storage lost with cookie and journal kept, the journal lost with cookie and storage kept, a synced journal record damaged with a later batch after it, or
  the batch in flight torn at the crash; the restart asks the real ``bookie.startcheck.storage_check`` and
  ``tail_verdict`` (refused, or the torn tail cut) unless ``start_without_storage``,
  ``start_without_journal`` or ``cut_damaged_journal``.
* **Metadata** — ``zk.LedgerMetadataStore`` (id allocation, ``check_transition``, compare-and-set on the
  znode version) over ``tests.sim.zookeeper.SimZooKeeper`` (versioned znodes, NodeExists, BadVersion); reads
  and writes take effect after a random latency; a client whose ZooKeeper session "expired" gets errors and
  nothing applied until it heals; a flaky connection loses replies of applied operations.
"""

from __future__ import annotations

import errno
import heapq
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from bookie import protocol as p
from bookie.core import ENTRY_HEAD, REC_ENTRY, REC_FENCE, REC_MASTER_KEY, BookieCore, Done
from bookie.memjournal import MemoryJournal
from bookie.startcheck import StorageCheck, TailVerdict, storage_check, tail_verdict
from bookie.storage import MemoryLedgerStorage
from zk.errors import (
    MetadataConnectionError,
    MetadataError,
    MetadataSessionExpiredError,
    MetadataTransitionError,
    MetadataVersionError,
)
from zk.idgen import IdGenerator
from zk.layout import LEDGERS, ledger_path, parse_ledger_path
from zk.ledger_metadata import LedgerMetadata, LedgerMetadataStore
from zk.versioned import Versioned

from .zookeeper import SimZooKeeper

if TYPE_CHECKING:
    from .checker import Checker

Thunk = Callable[[], None]
MetaResult = Versioned[LedgerMetadata] | MetadataError
LEDGERS_PREFIX = LEDGERS + "/"


# ------------------------------------------------------------------------------------------------ config


@dataclass(frozen=True, slots=True)
class Mutations:
    """Safety rules switched off, to prove the checkers catch what follows. All False = the real system.

    The first three are the cores' own test-only switches; the others break the simulated disk, metadata
    store or client driver (the code a real client wraps around the cores)."""

    no_recovery_read_fence: bool = False  # LedgerRecovery(fence_on_recovery_reads=False): BookKeeper #2614
    ack_out_of_order: bool = False  # WritePipeline(_unsafe_ack_out_of_order=True)
    count_all_answers: bool = (
        False  # LedgerRecovery(_unsafe_count_all_answers=True): errors count to coverage
    )
    trust_wiped_disk: bool = False  # the cookie check is skipped: a wiped bookie starts empty and serves
    lying_fsync: bool = False  # the journal's sync returns before the records are on disk
    recoverer_overwrites_close: bool = (
        False  # ignores recovery_close_decision's "adopt": writes its own close
    )
    recoverer_reports_own_result: bool = False  # adopts the close but reports the last entry it computed
    recovery_gives_up: bool = False  # a failed recovery attempt is never retried
    unchecked_metadata_store: bool = False  # the store skips check_transition (only our checker is left)
    corrupting_disk: bool = False  # ledger storage flips a bit in some entries it stores
    eager_lac: bool = False  # the writer piggybacks the entry's own id as LAC (claims unconfirmed entries)
    writer_skips_ensemble_change: bool = False  # the writer never replaces a failed bookie
    lossy_storage: bool = False  # ledger storage silently drops some entries it is asked to write
    unversioned_set: bool = False  # ZooKeeper's set ignores the expected version (no compare-and-set)
    reopen_closed_ledger: bool = False  # a recoverer that finds the ledger CLOSED marks it IN_RECOVERY again
    wrong_close_length: bool = False  # the writer's close leaves its last entry out of the metadata length
    read_error_as_missing: bool = False  # a bookie answers a storage read error NO_ENTRY instead of INTERNAL
    batch_acks_all: bool = False  # the writer takes every response of a batch's reply chunk for an OK ack
    writer_continues_in_recovery: bool = False  # ensemble_change_step's FENCED taken for WRITE
    start_without_storage: bool = False  # 911c2b3 reversed: storage_check's STORAGE_WIPED not asked
    cut_damaged_journal: bool = False  # 31b4e10 reversed: damage before a later batch cut as a torn tail
    start_without_journal: bool = False  # storage_check's JOURNAL_WIPED not asked: starts with no journal
    spec_loser_kept: bool = False  # Rivals(_unsafe_keep_losers): a copy its rival settled is not dropped

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, flag in MUTATION_FLAGS.items() if getattr(self, flag))


MUTATION_FLAGS = {
    "no-recovery-read-fence": "no_recovery_read_fence",
    "ack-out-of-order": "ack_out_of_order",
    "count-all-answers": "count_all_answers",
    "trust-wiped-disk": "trust_wiped_disk",
    "lying-fsync": "lying_fsync",
    "recoverer-overwrites-close": "recoverer_overwrites_close",
    "recoverer-reports-own-result": "recoverer_reports_own_result",
    "recovery-gives-up": "recovery_gives_up",
    "unchecked-metadata-store": "unchecked_metadata_store",
    "corrupting-disk": "corrupting_disk",
    "eager-lac": "eager_lac",
    "writer-skips-ensemble-change": "writer_skips_ensemble_change",
    "lossy-storage": "lossy_storage",
    "unversioned-set": "unversioned_set",
    "reopen-closed-ledger": "reopen_closed_ledger",
    "wrong-close-length": "wrong_close_length",
    "read-error-as-missing": "read_error_as_missing",
    "batch-acks-all": "batch_acks_all",
    "writer-continues-in-recovery": "writer_continues_in_recovery",
    "start-without-storage": "start_without_storage",
    "cut-damaged-journal": "cut_damaged_journal",
    "start-without-journal": "start_without_journal",
    "spec-loser-kept": "spec_loser_kept",
}


def mutation(name: str | None) -> Mutations:
    """``"none"``, one name of :data:`MUTATION_FLAGS`, or several joined by ``+``."""
    if not name or name == "none":
        return Mutations()
    return Mutations(**{MUTATION_FLAGS[n]: True for n in name.split("+")})


@dataclass(slots=True)
class SimConfig:
    """Everything a schedule is made of (drawn from the seed by ``tests.sim.schedule``)."""

    n_bookies: int = 4
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    # network
    delay_min_s: float = 0.0002
    delay_max_s: float = 0.003
    slow_message_prob: float = 0.02  # a message takes up to slow_message_max_s (reordering, late replies)
    slow_message_max_s: float = 0.4
    loss: float = 0.0
    duplication: float = 0.0
    reset_delay_s: float = 0.002  # how soon a client notices a refused/reset connection
    # timeouts and retries (virtual seconds)
    request_timeout_s: float = 0.5
    ensemble_change_timeout_s: float = 2.0
    retry_backoff_s: float = 0.1
    # disks
    sync_delay_max_s: float = 0.002  # group commit: a sync within this long of the first waiting record
    slow_sync_delay_max_s: float = 0.6  # the same on a slow disk
    checkpoint_interval_s: float = 0.5
    # metadata store latency
    meta_delay_max_s: float = 0.004
    # phases
    heal_at_s: float = 4.0  # the fault period ends; everything heals
    writer_grace_s: float = 3.0  # live writers must have closed their ledgers this long after the heal
    close_deadline_s: float = 30.0  # every ledger CLOSED this long after the writers' grace (liveness)
    full_check_every: int = 64  # steps between full (costlier) invariant sweeps


# ------------------------------------------------------------------------------------------------ timers


class Timer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class World:
    """Owns the seed, the clock and every simulated component."""

    def __init__(
        self,
        seed: int,
        cfg: SimConfig,
        *,
        mutations: Mutations = Mutations(),
        trace: bool = False,
        disabled_checks: frozenset[str] = frozenset(),
        strict: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        from .checker import Checker

        self.seed = seed
        self.rng = rng if rng is not None else random.Random(seed)
        self.cfg = cfg
        self.mut = mutations
        self.now = 0.0
        self._queue: list[tuple[float, int, Thunk, Timer | None]] = []
        self._seq = 0
        self.steps = 0
        self.trace: list[str] | None = [] if trace else None
        self.healed = False
        self.healed_at = float("inf")
        self.net = Network(self)
        self.meta = MetadataStore(self)
        self.bookies: dict[str, BookieNode] = {}
        self.clients: dict[str, Client] = {}
        # Ground truth for the checkers: every entry as its writer built it, by (ledger, entry), and the size of
        # its payload (what the metadata length counts).
        self.written: dict[tuple[int, int], bytes] = {}
        self.payload_sizes: dict[tuple[int, int], int] = {}
        self.stats: Counter[str] = Counter()  # what happened (for reports and for tuning the schedules)
        self.checker: Checker = Checker(self, disabled=disabled_checks, strict=strict)

    # -- time -------------------------------------------------------------------------------------------

    def at(self, delay_s: float, fn: Thunk) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now + delay_s, self._seq, fn, None))

    def timer(self, delay_s: float, fn: Thunk) -> Timer:
        t = Timer()
        self._seq += 1
        heapq.heappush(self._queue, (self.now + delay_s, self._seq, fn, t))
        return t

    def run(self, until_s: float) -> None:
        """Run events up to ``until_s`` (or until the queue drains, or the first violation)."""
        checker = self.checker
        every = self.cfg.full_check_every
        q = self._queue
        while q and q[0][0] <= until_s and not checker.violations:
            when, _, fn, t = heapq.heappop(q)
            if t is not None and t.cancelled:
                continue
            self.now = when
            try:
                fn()
            except Exception as e:  # an assertion in a core, or a simulator bug: both need a look
                import traceback

                checker.fail("crash", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
                return
            self.steps += 1
            if self.steps % every == 0:
                checker.check_all()

    def log(self, msg: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.now:9.4f} {msg}")

    # -- registry ---------------------------------------------------------------------------------------

    def add_bookie(self, bid: str) -> BookieNode:
        node = BookieNode(self, bid)
        self.bookies[bid] = node
        return node

    def available(self) -> list[str]:
        """Registered (running) bookies, sorted: what placement may choose from."""
        return sorted(b for b, n in self.bookies.items() if n.up)

    def jitter(self, hi: float, lo: float = 0.0) -> float:
        return self.rng.uniform(lo, hi)

    # -- faults -----------------------------------------------------------------------------------------

    def heal(self) -> None:
        """End of the fault period: no more loss, duplication, latency spikes or partitions; slow disks recover; crashed
        bookies restart (a wiped one is refused by its cookie check); sessions and paused clients resume."""
        self.healed = True
        self.healed_at = self.now
        self.log("HEAL")
        self.net.loss = 0.0
        self.net.duplication = 0.0
        self.net.slow_message_prob = 0.0
        self.net.blocked.clear()
        for node in self.bookies.values():
            node.slow_until = 0.0
            node.read_errors_until = 0.0
            if not node.up:
                node.restart()
        self.meta.expired.clear()
        self.meta.flaky.clear()
        for c in self.clients.values():
            c.resume()


# ------------------------------------------------------------------------------------------------ network


class Network:
    """Delivers thunks between named endpoints with random delay, loss, duplication and partitions."""

    def __init__(self, world: World) -> None:
        self.world = world
        cfg = world.cfg
        self.loss = cfg.loss
        self.duplication = cfg.duplication
        self.blocked: set[tuple[str, str]] = set()  # directed (src, dst) pairs that cannot talk
        # Scenario hooks: rule(src, dst, message) -> None (normal), "drop", or a delay in seconds.
        self.rules: list[Callable[[str, str, Any], str | float | None]] = []
        self.slow_message_prob = world.cfg.slow_message_prob
        # a slow bookie: everything it sends takes (lo, hi) seconds more, heal or not (it answers, late)
        self.late: dict[str, tuple[float, float]] = {}
        self.sent = 0
        self.dropped = 0

    def partition(self, a: str, b: str, *, one_way: bool = False) -> None:
        self.blocked.add((a, b))
        if not one_way:
            self.blocked.add((b, a))

    def heal_pair(self, a: str, b: str) -> None:
        self.blocked.discard((a, b))
        self.blocked.discard((b, a))

    def can_reach(self, src: str, dst: str) -> bool:
        return (src, dst) not in self.blocked

    def _delay(self) -> float:
        w = self.world
        cfg = w.cfg
        if self.slow_message_prob and w.rng.random() < self.slow_message_prob:
            return w.rng.uniform(cfg.delay_max_s, cfg.slow_message_max_s)
        return w.rng.uniform(cfg.delay_min_s, cfg.delay_max_s)

    def send(self, src: str, dst: str, message: Any, deliver: Thunk) -> None:
        """``message`` (a protocol object) is only shown to scenario rules and the trace."""
        w = self.world
        self.sent += 1
        delay: float | None = None
        for rule in self.rules:
            verdict = rule(src, dst, message)
            if verdict == "drop":
                self.dropped += 1
                w.log(f"net DROP(rule) {src}->{dst} {_brief(message)}")
                return
            if isinstance(verdict, (int, float)):
                delay = float(verdict)
                break
        if delay is None:
            if self.loss and w.rng.random() < self.loss:
                self.dropped += 1
                w.log(f"net LOSE {src}->{dst} {_brief(message)}")
                return
            copies = 2 if self.duplication and w.rng.random() < self.duplication else 1
            delays = [self._delay() for _ in range(copies)]
            if src in self.late:
                delays = [d + w.rng.uniform(*self.late[src]) for d in delays]
        else:
            delays = [delay]
        for d in delays:
            w.at(d, lambda: self._arrive(src, dst, message, deliver))

    def _arrive(self, src: str, dst: str, message: Any, deliver: Thunk) -> None:
        if (src, dst) in self.blocked:
            self.dropped += 1
            self.world.log(f"net BLOCKED {src}->{dst} {_brief(message)}")
            return
        deliver()


def _brief(m: Any) -> str:
    if isinstance(m, p.AddEntryRequest):
        rec = " RECOVERY" if m.flags & p.Flag.RECOVERY_ADD else ""
        return f"ADD{rec} L{m.ledger_id} e{m.entry_id} rid{m.request_id}"
    if isinstance(m, p.ReadEntryRequest):
        fence = " FENCE" if m.flags & p.Flag.FENCE else ""
        return f"READ{fence} L{m.ledger_id} e{m.entry_id} rid{m.request_id}"
    if isinstance(m, p.AddEntryResponse):
        return f"ADD-RESP {m.status.name} L{m.ledger_id} e{m.entry_id} rid{m.request_id}"
    if isinstance(m, p.ReadEntryResponse):
        return f"READ-RESP {m.status.name} L{m.ledger_id} e{m.entry_id} lac{m.lac} rid{m.request_id}"
    if isinstance(m, AddBatch):
        return f"<{m.adds} adds, {m.nbytes} bytes>"
    if isinstance(m, bytes):
        return f"<{len(m)} bytes>"
    return type(m).__name__


# ------------------------------------------------------------------------------------------------ metadata


class MetadataStore:
    """ZooKeeper's part, through the project's own metadata code: ``zk.LedgerMetadataStore`` (ids from
    ``zk.IdGenerator``, ``check_transition``, the compare-and-set on the znode version) over the simulated
    ZooKeeper of ``tests.sim.zookeeper``. Operations take effect after a random latency; a client whose session
    "expired" gets errors and nothing applied until it heals; a "flaky" client's replies are lost after the
    operation applied (ConnectionLoss).

    ``ledgers`` is the checkers' view of what ZooKeeper holds: every ledger znode decoded after each change."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.ledgers: dict[int, Versioned[LedgerMetadata]] = {}
        self.expired: set[str] = set()  # clients whose session is expired: every operation fails
        self.flaky: set[str] = set()  # clients whose connection drops replies (operations still apply)
        self.zk = SimZooKeeper(on_change=self._on_znode_change)
        self.zk.ignore_versions = world.mut.unversioned_set
        self.store = LedgerMetadataStore(self.zk, idgen=IdGenerator(self.zk))  # type: ignore[arg-type]
        self._writer: str = ""  # the client whose operation is applying (for the trace)

    def _on_znode_change(self, path: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        """Every change of a ledger znode, decoded, goes to the checker (whoever made it, however)."""
        if not path.startswith(LEDGERS_PREFIX) or new is None:
            return
        lid = parse_ledger_path(path)
        md = LedgerMetadata.from_json(new)
        cur = self.ledgers.get(lid)
        version = self.zk.nodes[path][1]
        self.ledgers[lid] = Versioned(md, version)
        checker = self.world.checker
        if old is None:
            checker.on_metadata_created(md)
            self.world.log(f"meta CREATE L{lid} by {self._writer} ensemble={list(md.last_ensemble.bookies)}")
            return
        assert cur is not None
        self.world.log(
            f"meta WRITE L{lid} v{version} by {self._writer}: {md.state} last={md.last_entry_id} "
            f"length={md.length} ensembles={[(e.first_entry_id, list(e.bookies)) for e in md.ensembles]}"
        )
        checker.on_metadata_write(lid, cur.value, md)

    def _op(self, client: Client, apply: Callable[[], MetaResult], cb: Callable[[MetaResult], None]) -> None:
        w = self.world

        def at_server() -> None:
            result: MetaResult
            if client.name in self.expired:
                w.stats["meta op failed: session expired"] += 1
                result = MetadataSessionExpiredError(f"session of {client.name} expired")
            else:
                self._writer = client.name
                try:
                    result = apply()
                except MetadataError as e:
                    result = e
                if client.name in self.flaky and w.rng.random() < 0.5:
                    # ConnectionLoss after the server applied the operation: the client cannot tell.
                    w.stats["meta op applied, reply lost"] += 1
                    w.log(f"meta reply to {client.name} LOST (the operation was applied)")
                    result = MetadataConnectionError(f"connection of {client.name} lost")
            client.later(w.jitter(w.cfg.meta_delay_max_s), lambda: cb(result))

        w.at(w.jitter(w.cfg.meta_delay_max_s), at_server)

    def create(
        self, client: Client, build: Callable[[int], LedgerMetadata], cb: Callable[[MetaResult], None]
    ) -> None:
        """``build(ledger_id)`` describes the ledger; the store allocates the id (``IdGenerator``; an id taken
        already is skipped after NodeExists) and creates the znode."""

        def apply() -> MetaResult:
            md = build(0)
            return self.store.create(
                ensemble_size=md.ensemble_size,
                write_quorum=md.write_quorum,
                ack_quorum=md.ack_quorum,
                bookies=md.last_ensemble.bookies,
                password_digest=md.password_digest,
                digest_type=md.digest_type,
                custom_metadata=md.custom_metadata,
                ctime_ms=md.ctime_ms,
            )

        self._op(client, apply, cb)

    def read(self, client: Client, lid: int, cb: Callable[[MetaResult], None]) -> None:
        self._op(client, lambda: self.store.read(lid), cb)

    def write(
        self,
        client: Client,
        lid: int,
        new: LedgerMetadata,
        expected: Versioned[LedgerMetadata],
        cb: Callable[[MetaResult], None],
    ) -> None:
        """One compare-and-set: ``LedgerMetadataStore.write`` (transition check, then a set at the expected
        version: BadVersion if somebody wrote since). A refused transition is reported as invariant 5: no
        client may even attempt one. Mutation ``unchecked-metadata-store``: the client sets the znode itself at
        the expected version, without the transition check."""

        def apply() -> MetaResult:
            w = self.world
            try:
                if w.mut.unchecked_metadata_store:
                    self.zk.set(ledger_path(lid), new.to_json(), expected.version)
                    return Versioned(new, expected.version + 1)
                return self.store.write(lid, new, expected)
            except MetadataVersionError:
                w.stats["meta CAS conflict"] += 1
                raise
            except MetadataTransitionError as e:
                w.checker.fail("5", f"{client.name} attempted an illegal metadata write: {e}")
                raise

        self._op(client, apply, cb)


# ------------------------------------------------------------------------------------------------ clients


class Client:
    """An endpoint that sends requests to bookies. Every callback into it goes through ``call`` so that a
    paused client (a long GC pause, SIGSTOP) processes nothing until it resumes — then everything at once."""

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self._rid = 0
        self._pending: dict[tuple[str, int], tuple[Callable[[p.Response | None], None], Timer]] = {}
        self.paused = False
        self._deferred: list[Thunk] = []
        self.done = False
        world.clients[name] = self

    # -- pausing ----------------------------------------------------------------------------------------

    def call(self, fn: Thunk) -> None:
        if self.done:
            return
        if self.paused:
            self._deferred.append(fn)
        else:
            fn()

    def later(self, delay_s: float, fn: Thunk) -> None:
        self.world.at(delay_s, lambda: self.call(fn))

    def pause(self) -> None:
        self.world.log(f"{self.name} PAUSE")
        self.world.stats["pause"] += 1
        self.paused = True

    def resume(self) -> None:
        if not self.paused:
            return
        self.world.log(f"{self.name} RESUME ({len(self._deferred)} deferred events)")
        self.paused = False
        deferred, self._deferred = self._deferred, []
        for fn in deferred:
            self.world.at(0.0, lambda fn=fn: self.call(fn))  # type: ignore[misc]

    # -- requests ---------------------------------------------------------------------------------------

    def request(
        self,
        bookie: str,
        build: Callable[[int], p.Request],
        on_reply: Callable[[p.Response | None], None],
    ) -> int:
        """Send one request; ``on_reply`` gets the decoded response, or None on timeout / lost connection.
        Returns its request id (for ``forget``)."""
        w = self.world
        self._rid += 1
        rid = self._rid
        req = build(rid)
        frame = p.encode(req)
        key = (bookie, rid)
        timer = w.timer(w.cfg.request_timeout_s, lambda: self.call(lambda: self._expire(key)))
        self._pending[key] = (on_reply, timer)
        node = w.bookies[bookie]
        inc = node.incarnation if node.up else -1  # the process this request's connection goes to
        w.net.send(self.name, bookie, req, lambda: node.receive(self, rid, frame, inc))
        return rid

    def forget(self, bookie: str, rid: int) -> None:
        """Stop waiting for request ``rid`` (its answer, when it comes, is dropped), as ``BookieConnection.forget``."""
        item = self._pending.pop((bookie, rid), None)
        if item is not None:
            item[1].cancel()

    def request_adds(
        self,
        bookie: str,
        builds: list[Callable[[int], p.AddEntryRequest]],
        on_rows: Callable[[list[tuple[int, ...]] | None], bool],
    ) -> None:
        """Send several adds in one write (one network message), as the real client does when it pipelines:
        the bookie decodes them with the server's ``FrameDecoder.take_add_run`` and runs ``add_entries`` on
        each run. Its replies come back in chunks of ADD_ENTRY response rows (``take_leading_add_responses``);
        ``on_rows`` gets each chunk and returns True once every add is answered, or gets None on timeout or
        a lost connection (every add not answered yet failed)."""
        w = self.world
        frames = []
        for build in builds:
            self._rid += 1
            frames.append(p.encode(build(self._rid)))
        rid = self._rid  # the batch's key: its last request id
        blob = b"".join(frames)
        key = (bookie, rid)
        timer = w.timer(w.cfg.request_timeout_s, lambda: self.call(lambda: self._expire(key)))
        self._pending[key] = (on_rows, timer)  # type: ignore[assignment]
        node = w.bookies[bookie]
        inc = node.incarnation if node.up else -1
        msg = AddBatch(len(builds), len(blob))
        w.net.send(self.name, bookie, msg, lambda: node.receive_adds(self, rid, blob, inc))

    def on_add_rows(self, bookie: str, rid: int, chunk: bytes) -> None:
        key = (bookie, rid)
        item = self._pending.get(key)
        if item is None:
            return  # timed out already, or a duplicate chunk after the last one
        dec = p.FrameDecoder()
        dec.feed(chunk)
        rows = dec.take_leading_add_responses()
        assert rows and not dec.buffered, "a reply chunk of whole ADD_ENTRY responses"
        if item[0](rows):  # type: ignore[arg-type]
            del self._pending[key]
            item[1].cancel()

    def _expire(self, key: tuple[str, int]) -> None:
        item = self._pending.pop(key, None)
        if item is not None:
            self.world.stats["request failed"] += 1
            self.world.log(f"{self.name} TIMEOUT {key[0]} rid{key[1]}")
            item[0](None)

    def on_response(self, bookie: str, resp: p.Response) -> None:
        item = self._pending.pop((bookie, resp.request_id), None)
        if item is None:
            return  # already timed out, or a duplicate: the first answer stands
        item[1].cancel()
        item[0](resp)

    def connection_lost(self, bookie: str) -> None:
        """The connection to ``bookie`` broke: every request outstanding on it fails now."""
        lost = [k for k in self._pending if k[0] == bookie]
        for k in lost:
            on_reply, timer = self._pending.pop(k)
            timer.cancel()
            on_reply(None)


# ------------------------------------------------------------------------------------------------ bookies


class AddBatch(NamedTuple):
    """What the network and the trace see of a write of several adds."""

    adds: int
    nbytes: int


class SimStorage(MemoryLedgerStorage):
    """Ledger storage on a simulated disk: reads fail with an I/O error while ``read_fails()`` says so (the fault
    kind ``read_errors``: bad sectors, a failing controller). Writes are unaffected; nothing is lost."""

    def __init__(self) -> None:
        super().__init__()
        self.read_fails: Callable[[], bool] = lambda: False

    def _check_read(self, ledger_id: int, entry_id: int) -> None:
        if self.read_fails():
            raise OSError(errno.EIO, f"Input/output error reading L{ledger_id} e{entry_id} (simulated)")

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        self._check_read(ledger_id, entry_id)
        return super().get_entry(ledger_id, entry_id)

    def get_range(self, ledger_id: int, first: int, last: int, max_bytes: int, step: int = 1) -> list[bytes]:
        self._check_read(ledger_id, first)
        return super().get_range(ledger_id, first, last, max_bytes, step)


class MissingOnErrorCore(BookieCore):
    """WRONG on purpose (mutation ``read-error-as-missing``): a storage read error is answered NO_ENTRY, which
    readers and recovery take for "this bookie does not have the entry"."""

    def _storage_failed(self, ledger_id: int, what: str, exc: Exception) -> p.Status:
        super()._storage_failed(ledger_id, what, exc)
        return p.Status.NO_ENTRY


class CorruptingStorage(SimStorage):
    """WRONG on purpose (mutation ``corrupting-disk``): flips the last bit of about one entry in eight."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self._rng = rng

    def write(self, entries: Any, ledgers: Any) -> None:
        entries = [
            (lid, eid, data[:-1] + bytes([data[-1] ^ 1]) if data and self._rng.random() < 0.125 else data)
            for lid, eid, data in entries
        ]
        super().write(entries, ledgers)


class LossyStorage(SimStorage):
    """WRONG on purpose (mutation ``lossy-storage``): about one entry in eight is never stored."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self._rng = rng

    def write(self, entries: Any, ledgers: Any) -> None:
        super().write([e for e in entries if self._rng.random() >= 0.125], ledgers)


class BookieNode:
    """A bookie process: the real ``BookieCore`` over a simulated disk (journal, storage, checkpoint)."""

    def __init__(self, world: World, bid: str) -> None:
        self.world = world
        self.bid = bid
        self.journal = MemoryJournal()
        self.storage = self._empty_storage()
        self._checkpoint: tuple[dict[tuple[int, int], bytes], dict[int, bytes]] = ({}, {})
        self.up = True
        self.incarnation = 0
        self.has_cookie = True  # the on-disk cookie; gone with a wiped disk
        self.refused = False  # the cookie check refused to start it (a wiped disk)
        self.disk_lost = False  # its disk was wiped at some point
        # The journal's checkpoint mark (records before it are dropped from the journal: their entries live in
        # the storage's checkpoint only), the next one (taken at one checkpoint, stored at the next, when the
        # storage writes of everything before it have run), and where each synced batch ends.
        self.mark = 0
        self._next_mark = 0
        self.batch_ends: list[int] = []
        self.storage_present = True  # False: the ledger storage was lost while down (cookie and journal kept)
        self.journal_present = (
            True  # False: the journal (segments and mark) was lost while down (cookie kept)
        )
        self.damaged_at: int | None = None  # a journal record damaged while down (index in journal.durable)
        self.slow_until = 0.0  # a slow disk: syncs take long until then
        self.read_errors_until = 0.0  # a failing disk: storage reads fail (I/O error) until then ...
        self.read_error_prob = 0.0  # ... each with this probability
        self._sync_pending = False
        self._lied: list[tuple[int, int, int, bytes]] = []  # lying_fsync: "synced" but not on disk yet
        # What is on disk (durable journal records), indexed for the checkers.
        self.durable: dict[tuple[int, int], bytes] = {}
        self.durable_fences: set[int] = set()
        self.durable_keys: dict[int, bytes] = {}
        # What this bookie promised (replies it sent): invariant 7 holds it to them after a restart.
        self.acked_entries: dict[tuple[int, int], bytes] = {}
        self.acked_fences: set[int] = set()
        self.acked_keys: dict[int, bytes] = {}
        self.core: BookieCore | None = self._new_core()

    def _empty_storage(self) -> SimStorage:
        w = self.world
        storage: SimStorage
        if w.mut.corrupting_disk:
            storage = CorruptingStorage(w.rng)
        elif w.mut.lossy_storage:
            storage = LossyStorage(w.rng)
        else:
            storage = SimStorage()
        storage.read_fails = self._read_fails
        return storage

    def _read_fails(self) -> bool:
        w = self.world
        if w.now >= self.read_errors_until:
            return False
        if w.rng.random() < self.read_error_prob:
            w.stats["storage read error"] += 1
            w.log(f"{self.bid} storage READ ERROR")
            return True
        return False

    def _new_core(self) -> BookieCore:
        inc = self.incarnation
        w = self.world

        def schedule(delay_s: float, fn: Thunk) -> Timer:
            def run() -> None:
                if self.incarnation == inc:
                    fn()

            return w.timer(delay_s, run)

        core = MissingOnErrorCore if w.mut.read_error_as_missing else BookieCore
        return core(self.storage, self._journal_append, schedule, bookie_id=self.bid)

    # -- disk -------------------------------------------------------------------------------------------

    def _journal_append(self, rtype: Any, ledger_id: int, entry_id: int, data: bytes, done: Done) -> None:
        self.journal.append(rtype, ledger_id, entry_id, data, done)
        if not self._sync_pending:
            self._sync_pending = True
            w = self.world
            slow = w.now < self.slow_until
            hi = w.cfg.slow_sync_delay_max_s if slow else w.cfg.sync_delay_max_s
            inc = self.incarnation
            w.at(w.jitter(hi, hi / 10), lambda: self._sync(inc))

    def _sync(self, inc: int) -> None:
        if inc != self.incarnation:
            return
        self._sync_pending = False
        j = self.journal
        if self.world.mut.lying_fsync:
            # WRONG on purpose: the callbacks run (the bookie acks) before the records reach the disk.
            batch, j.pending = j.pending, []
            self._lied.extend(rec for rec, _ in batch)
            for _, done in batch:
                done(None)
            w = self.world
            w.at(w.jitter(0.3, 0.05), lambda: self._really_flush(inc))
            return
        n = len(j.durable)
        j.sync()
        if len(j.durable) > n:
            self.batch_ends.append(len(j.durable))
        self._index(j.durable[n:])

    def _really_flush(self, inc: int) -> None:
        if inc != self.incarnation:
            return
        recs, self._lied = self._lied, []
        self.journal.durable.extend(recs)
        if recs:
            self.batch_ends.append(len(self.journal.durable))
        self._index(recs)

    def _index(self, records: list[tuple[int, int, int, bytes]]) -> None:
        for rtype, lid, eid, data in records:
            if rtype == REC_ENTRY:
                self.durable[(lid, eid)] = data
            elif rtype == REC_FENCE:
                self.durable_fences.add(lid)
            elif rtype == REC_MASTER_KEY:
                self.durable_keys.setdefault(lid, data)

    def checkpoint(self) -> None:
        """Storage as of now survives a crash; the journal's mark moves to where it was at the previous
        checkpoint (the storage writes of every record before it ran long since), and a restart replays the
        journal from the mark only, as the real bookie does (the records before it are deleted there)."""
        if self.up:
            self._checkpoint = (dict(self.storage.entries), dict(self.storage.index))
            self.mark, self._next_mark = self._next_mark, len(self.journal.durable)

    # -- requests ---------------------------------------------------------------------------------------

    def receive(self, client: Client, rid: int, frame: bytes, incarnation: int) -> None:
        w = self.world
        if self.up and incarnation not in (-1, self.incarnation):
            return  # sent on a connection to a process that has died since: gone with it
        if not self.up or self.core is None:
            # Connection refused: the client learns fast, unless a partition hides the refusal too.
            if w.net.can_reach(self.bid, client.name):
                key = (self.bid, rid)
                client.later(w.cfg.reset_delay_s, lambda: client._expire(key))
            return
        req = p.decode_one_request(frame)
        inc = self.incarnation

        def reply(out: bytes) -> None:
            if self.incarnation != inc:
                return  # the connection died with the process
            resp = p.decode_one_response(out)  # the real codec, once: the client gets this message
            self._note_reply(req, resp)
            w.log(f"{self.bid} -> {client.name} {_brief(resp)}")
            w.net.send(
                self.bid, client.name, resp, lambda: client.call(lambda: client.on_response(self.bid, resp))
            )

        w.log(f"{self.bid} <- {client.name} {_brief(req)}")
        self.core.handle(req, reply)

    def receive_adds(self, client: Client, rid: int, blob: bytes, incarnation: int) -> None:
        """Several adds in one write: runs of same-size frames (``take_add_run``, as ``bookie.server``) each go to
        ``BookieCore.add_entries`` in one call; each reply chunk goes back as one message."""
        w = self.world
        if self.up and incarnation not in (-1, self.incarnation):
            return
        if not self.up or self.core is None:
            if w.net.can_reach(self.bid, client.name):
                key = (self.bid, rid)
                client.later(w.cfg.reset_delay_s, lambda: client._expire(key))
            return
        dec = p.FrameDecoder()
        dec.feed(blob)
        inc = self.incarnation
        core = self.core
        while dec.buffered:
            run = dec.take_add_run(ENTRY_HEAD)
            assert run is not None, "a batch holds whole ADD_ENTRY frames only"
            rows, heads = run
            sent = {r[1]: r for r in rows}
            w.stats["bookie add runs"] += 1
            w.stats["bookie adds in runs of 2+"] += len(rows) if len(rows) > 1 else 0
            w.log(f"{self.bid} <- {client.name} ADD RUN of {len(rows)} (e{rows[0][3]}..e{rows[-1][3]})")

            def reply(frames: bytes, n: int, sent: dict[int, Any] = sent) -> None:
                if self.incarnation != inc:
                    return
                chunk = p.FrameDecoder()
                chunk.feed(frames)
                for row in chunk.take_leading_add_responses():
                    if row[5] == p.Status.OK:
                        _, _, lid, eid, key, entry = sent[row[4]]
                        self.acked_entries[(lid, eid)] = entry
                        self.acked_keys.setdefault(lid, key)
                w.log(f"{self.bid} -> {client.name} {n} ADD-RESP")
                w.net.send(
                    self.bid,
                    client.name,
                    AddBatch(n, len(frames)),
                    lambda: client.call(lambda: client.on_add_rows(self.bid, rid, frames)),
                )

            core.add_entries(rows, reply, heads)

    def _note_reply(self, req: p.Request, resp: p.Response) -> None:
        """Remember what this reply promises: an acked add keeps its entry (and the ledger's key); an answered
        fence read keeps its fence (and key) — across any later crash (invariant 7)."""
        if isinstance(req, p.AddEntryRequest):
            if resp.status == p.Status.OK:
                self.acked_entries[(req.ledger_id, req.entry_id)] = req.entry
                self.acked_keys.setdefault(req.ledger_id, req.master_key)
        elif isinstance(req, p.ReadEntryRequest):
            answered = resp.status in (p.Status.OK, p.Status.NO_ENTRY, p.Status.NO_LEDGER)
            if req.flags & p.Flag.FENCE and answered:
                self.acked_fences.add(req.ledger_id)
                self.acked_keys.setdefault(req.ledger_id, req.master_key)
            key = (req.ledger_id, req.entry_id)
            missing = resp.status in (p.Status.NO_ENTRY, p.Status.NO_LEDGER)
            if req.entry_id >= 0 and missing and key in self.durable:
                # Read-your-writes at the bookie: an entry whose journal record is synced is readable
                # (the core keeps it in memory until its storage batch lands, and replays it on restart);
                # a storage read error may fail the read (INTERNAL), never deny the entry.
                self.world.checker.fail(
                    "3",
                    f"{self.bid} answered {resp.status.name} for L{key[0]} e{key[1]}, which is on its disk",
                )
        elif isinstance(req, p.ReadRangeRequest):
            key = (req.ledger_id, req.first_entry_id)
            if resp.status in (p.Status.NO_ENTRY, p.Status.NO_LEDGER) and key in self.durable:
                self.world.checker.fail(
                    "3",
                    f"{self.bid} answered {resp.status.name} to a range read from L{key[0]} e{key[1]}, "
                    "which is on its disk",
                )

    # -- crash and restart ------------------------------------------------------------------------------

    def crash(
        self,
        *,
        wipe: bool = False,
        lose_storage: bool = False,
        lose_journal: bool = False,
        damage: bool = False,
        torn: bool = False,
    ) -> None:
        """The process dies (unsynced journal records and uncheckpointed storage are lost). While it is down:
        ``wipe`` loses the whole disk, cookie included; ``lose_storage`` the ledger storage only (its cookie and
        journal kept); ``lose_journal`` the journal only (segments and mark; cookie and storage kept); ``damage`` a synced journal record that a later batch follows (a flipped byte); ``torn``
        leaves part of the batch in flight on disk, its last record torn (never acknowledged)."""
        if not self.up:
            return
        if torn and self.journal.pending:
            self._tear()
        w = self.world
        w.log(f"{self.bid} CRASH{' + WIPED DISK' if wipe else ''}")
        w.stats["crash+wipe" if wipe else "crash"] += 1
        self.up = False
        self.incarnation += 1
        self.core = None
        self._sync_pending = False
        self.journal.crash()
        self._lied.clear()
        # RocksDB (WAL off) keeps only what the last checkpoint flushed.
        self.storage = self._empty_storage()
        self.storage.entries = dict(self._checkpoint[0])
        self.storage.index = dict(self._checkpoint[1])
        if wipe:
            self.journal = MemoryJournal()
            self.storage = self._empty_storage()
            self._checkpoint = ({}, {})
            self.has_cookie = False
            self.disk_lost = True
            self.mark = self._next_mark = 0
            self.batch_ends = []
            self.damaged_at = None
        if lose_storage:
            w.log(f"{self.bid} LEDGER STORAGE LOST (journal mark {self.mark})")
            w.stats["storage lost"] += 1
            self.storage = self._empty_storage()
            self._checkpoint = ({}, {})
            self.storage_present = False
        if lose_journal:
            w.log(f"{self.bid} JOURNAL LOST ({len(self.journal.durable)} records, mark {self.mark})")
            w.stats["journal lost"] += 1
            self.journal = MemoryJournal()
            self.mark = self._next_mark = 0
            self.batch_ends = []
            self.damaged_at = None
            self.journal_present = False
        if damage:
            self._damage()
        for c in w.clients.values():
            if w.net.can_reach(self.bid, c.name):
                w.at(w.cfg.reset_delay_s, lambda c=c: c.call(lambda: c.connection_lost(self.bid)))  # type: ignore[misc]

    def _tear(self) -> None:
        """Part of the batch in flight reaches the disk, its last record torn: whole records before it (never
        acknowledged: the sync did not complete) and a damaged one that ends the journal."""
        w = self.world
        j = self.journal
        recs = [rec for rec, _ in j.pending]
        n = len(j.durable)
        m = w.rng.randint(1, len(recs))
        j.durable.extend(recs[:m])
        self.batch_ends.append(len(j.durable))
        self._index(recs[: m - 1])
        self.damaged_at = len(j.durable) - 1
        w.log(f"{self.bid} TORN TAIL: {m} records of the batch in flight, the last torn (record {n + m - 1})")
        w.stats["torn tail"] += 1

    def _damage(self) -> None:
        """A byte flipped in a synced record of the journal past its mark that a later batch follows (damage in
        the last batch cannot be told from a torn tail, by the real bookie nor by BookKeeper's: not injected)."""
        w = self.world
        ends = [e for e in self.batch_ends if e > self.mark]
        if len(ends) < 2 or self.damaged_at is not None:
            return
        self.damaged_at = k = w.rng.randrange(self.mark, ends[-2])
        w.log(f"{self.bid} JOURNAL DAMAGED at record {k} of {len(self.journal.durable)} (mark {self.mark})")
        w.stats["journal damaged"] += 1

    def _refuse(self, why: str) -> None:
        w = self.world
        self.refused = True
        w.stats["restart refused"] += 1
        w.log(f"{self.bid} REFUSED to start: {why}")

    def restart(self) -> None:
        if self.up or self.refused:
            return
        w = self.world
        if self.has_cookie:
            # bookie.main's check of a bookie whose cookies match: the journal is there (a wipe takes the cookie
            # too), the storage may not be
            check = storage_check(
                journal_written=self.journal_present,
                storage_present=self.storage_present,
                journal_checkpointed=self.mark > 0,
            )
            skip = {
                StorageCheck.OK: True,
                StorageCheck.STORAGE_WIPED: w.mut.start_without_storage,
                StorageCheck.JOURNAL_WIPED: w.mut.start_without_journal,
            }
            if not skip[check]:
                return self._refuse(f"{check.value} (journal mark {self.mark})")
        if self.damaged_at is not None:
            # Journal.replay: the scan stops at the damaged record of the (only, so last) segment
            k = self.damaged_at
            later = sum(1 for e in self.batch_ends if e > k) >= 2  # the batch holding k, and one after it
            verdict = tail_verdict(last_segment=True, later_batch=later)
            if verdict is TailVerdict.DAMAGE and not w.mut.cut_damaged_journal:
                return self._refuse(f"journal record {k} damaged with a later batch after it")
            w.log(f"{self.bid} journal cut at record {k} of {len(self.journal.durable)} (torn tail)")
            w.stats["journal cut"] += 1
            del self.journal.durable[k:]
            self.batch_ends = [e for e in self.batch_ends if e < k] + ([k] if k else [])
            self.mark = min(self.mark, k)
            self._next_mark = min(self._next_mark, k)
            self.damaged_at = None
        if not self.has_cookie:
            if not w.mut.trust_wiped_disk:
                # The cookie check: the registry knows this bookie, its disk does not. Refuse to start.
                return self._refuse("cookie missing on a wiped disk")
            self.has_cookie = True  # WRONG on purpose: serve from an empty disk
            self.durable.clear()
            self.durable_fences.clear()
            self.durable_keys.clear()
        core = self._new_core()
        for rtype, lid, eid, data in self.journal.replay()[self.mark :]:
            core.replay(rtype, lid, eid, data)
        core.finish_replay()
        self.storage_present = self.journal_present = True
        self.core = core
        self.up = True
        w.stats["restart"] += 1
        w.log(f"{self.bid} RESTART (replayed {len(self.journal.durable)} journal records)")
        w.checker.on_bookie_restart(self)
