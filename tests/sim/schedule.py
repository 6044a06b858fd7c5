"""Random schedules: a cluster, a workload and a fault plan, all drawn from one seed; then the run.

A schedule has two phases. During the fault period (until ``cfg.heal_at_s``) writers append, readers tail,
recoverers may start at any moment (sometimes two at once), and faults strike: bookie crashes (losing
unsynced journal records and uncheckpointed storage), a wiped disk, symmetric and one-way partitions between
a client and a bookie, slow disks, disks whose reads fail with I/O errors, ZooKeeper session expiry or a
flaky ZooKeeper connection (replies lost after the operation applied) of a client, a paused client. Then everything
heals; live writers must finish within ``writer_grace_s``; after that a recoverer is started for every ledger
that is not CLOSED, and every ledger must be CLOSED within ``close_deadline_s``.

Profiles bias the draw: ``default`` is the broad random mix the CI runs; the others aim the faults at one
protocol step so that each mutation in ``tests/sim/test_mutations.py`` is found within a few seeds.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from bookie import protocol as p

from .actors import RangeReader, Reader, Recoverer, Writer
from .checker import Violation
from .world import Mutations, SimConfig, World, mutation

PASSWORD = b"sim-password"

CONFIGS = [  # (E, Qw, Qa)
    (3, 3, 2),
    (3, 2, 2),
    (3, 3, 3),
    (3, 2, 1),
    (4, 3, 2),
    (4, 2, 2),
    (2, 2, 2),
    (2, 2, 1),
    (5, 3, 2),
    (4, 4, 3),
]


@dataclass(slots=True)
class Outcome:
    seed: int
    profile: str
    mutation: str
    violations: list[Violation]
    steps: int
    sim_time_s: float
    summary: str
    trace: list[str] | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    known: list[tuple[str, Violation]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def command(self) -> str:
        cmd = f"python -m tests.sim --seed {self.seed}"
        if self.profile != "default":
            cmd += f" --profile {self.profile}"
        if self.mutation != "none":
            cmd += f" --mutation {self.mutation}"
        return cmd + " --verbose"

    def report(self) -> str:
        lines = [f"seed={self.seed} profile={self.profile} mutation={self.mutation}: {self.summary}"]
        lines += [f"  {v}" for v in self.violations]
        lines += [f"  (known bug {name}: {v})" for name, v in self.known[:3]]
        if self.violations:
            lines.append(f"  reproduce: {self.command}")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ profiles


@dataclass(slots=True)
class Plan:
    """What a profile decides beyond ``SimConfig``."""

    n_ledgers: int = 1
    entries: tuple[int, int] = (5, 30)
    outstanding: tuple[int, int] = (1, 8)
    think_max_s: float = 0.02
    readers: float = 0.5  # probability of a tailing reader per ledger
    recoverers: tuple[int, int] = (0, 2)  # recoverers started during the fault period
    recoverer_window: tuple[float, float] = (0.05, 1.0)  # as fractions of heal_at_s
    faults: tuple[int, int] = (0, 6)
    fault_kinds: tuple[str, ...] = (
        "crash",
        "partition",
        "one_way",
        "isolate",
        "slow_disk",
        "session",
        "zk_flaky",
        "pause",
        "read_errors",
    )
    allow_wipe: bool = True
    batching: float = 0.3  # probability that a writer appends in bursts sent as one write per bookie
    range_readers: float = 0.3  # probability of a range reader (READ_RANGE batches, once CLOSED) per ledger
    speculative_s: float = 0.0  # > 0: range readers read speculatively after this long (BatchReader's)
    slow_bookies: int = 0  # bookies that answer late, the whole run: everything they send takes ``late`` more
    late: tuple[float, float] = (0.0, 0.0)
    rules: list[Callable[[World], Callable[[str, str, Any], str | float | None]]] = field(
        default_factory=list
    )


def _default(rng: random.Random, cfg: SimConfig, plan: Plan) -> None:
    e, qw, qa = rng.choice(CONFIGS)
    cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum = e, qw, qa
    cfg.n_bookies = rng.randint(e + 1, min(e + 2, 6))
    cfg.loss = rng.choice([0.0, 0.0, 0.005, 0.02, 0.05])
    cfg.duplication = rng.choice([0.0, 0.0, 0.01, 0.05])
    cfg.slow_message_prob = rng.choice([0.0, 0.01, 0.05])
    cfg.heal_at_s = rng.uniform(1.0, 4.0)
    cfg.request_timeout_s = rng.choice([0.2, 0.5, 1.0])
    plan.n_ledgers = rng.randint(1, 3)
    plan.entries = (10, 50)
    plan.recoverers = (0, 3)
    plan.faults = (2, 12)


def _drop(prob: float, pred: Callable[[str, str, Any], bool]) -> Callable[[World], Callable[..., Any]]:
    def make(world: World) -> Callable[[str, str, Any], str | float | None]:
        def rule(src: str, dst: str, msg: Any) -> str | float | None:
            if not world.healed and pred(src, dst, msg) and world.rng.random() < prob:
                return "drop"
            return None

        return rule

    return make


def _delay(
    prob: float, hi: float, pred: Callable[[str, str, Any], bool]
) -> Callable[[World], Callable[..., Any]]:
    def make(world: World) -> Callable[[str, str, Any], str | float | None]:
        def rule(src: str, dst: str, msg: Any) -> str | float | None:
            if not world.healed and pred(src, dst, msg) and world.rng.random() < prob:
                return world.rng.uniform(hi / 4, hi)
            return None

        return rule

    return make


def is_fence(src: str, dst: str, m: Any) -> bool:
    return isinstance(m, p.ReadEntryRequest) and m.entry_id == p.LAST_ENTRY and bool(m.flags & p.Flag.FENCE)


def is_writer_add(src: str, dst: str, m: Any) -> bool:
    return isinstance(m, p.AddEntryRequest) and not m.flags & p.Flag.RECOVERY_ADD


def _fence_race(rng: random.Random, cfg: SimConfig, plan: Plan) -> None:
    """The shape of BookKeeper #2614: a one-entry ledger whose adds are lost, late or on time, a recoverer
    that fences right away with some fence reads lost, and recovery reads that are often slow."""
    cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum = rng.choice([(3, 3, 2), (4, 3, 2)])
    cfg.n_bookies = cfg.ensemble_size + rng.randint(0, 1)
    cfg.request_timeout_s = 2.0
    cfg.slow_message_prob = 0.0
    cfg.heal_at_s = 1.0
    plan.entries = (1, 1)
    plan.readers = 0.0
    plan.recoverers = (1, 1)
    plan.recoverer_window = (0.0, 0.05)
    plan.faults = (0, 0)
    plan.rules = [_drop(0.5, is_fence), _lost_or_late(is_writer_add, 0.3), _delay(0.5, 0.3, is_recovery_read)]


def _lost_or_late(pred: Callable[[str, str, Any], bool], hi: float) -> Callable[[World], Callable[..., Any]]:
    """A third of the matching messages are lost, a third arrive up to ``hi`` late, a third on time."""

    def make(world: World) -> Callable[[str, str, Any], str | float | None]:
        def rule(src: str, dst: str, msg: Any) -> str | float | None:
            if world.healed or not pred(src, dst, msg):
                return None
            x = world.rng.randrange(3)
            return "drop" if x == 0 else world.rng.uniform(hi / 4, hi) if x == 1 else None

        return rule

    return make


def is_recovery_read(src: str, dst: str, m: Any) -> bool:
    return isinstance(m, p.ReadEntryRequest) and m.entry_id >= 0 and src.startswith("x")


def _out_of_order(rng: random.Random, cfg: SimConfig, plan: Plan) -> None:
    """Many adds in flight, some lost or late, then a recovery."""
    cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum = rng.choice([(3, 2, 2), (3, 3, 2), (4, 2, 2)])
    cfg.n_bookies = cfg.ensemble_size + 1
    cfg.heal_at_s = 1.5
    plan.entries = (20, 40)
    plan.outstanding = (6, 12)
    plan.think_max_s = 0.005
    plan.recoverers = (1, 1)
    plan.recoverer_window = (0.1, 0.4)
    plan.faults = (0, 0)
    plan.rules = [_drop(0.15, is_writer_add), _delay(0.3, 0.2, is_writer_add)]


def _disk_faults(rng: random.Random, cfg: SimConfig, plan: Plan) -> None:
    """Crashes, wiped disks and restarts while entries are acknowledged."""
    cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum = rng.choice([(3, 3, 2), (3, 2, 2), (4, 3, 2)])
    cfg.n_bookies = cfg.ensemble_size + 2
    cfg.heal_at_s = 2.0
    cfg.sync_delay_max_s = 0.01
    plan.entries = (20, 40)
    plan.recoverers = (0, 1)
    plan.faults = (3, 6)
    plan.fault_kinds = ("crash", "wipe", "crash")


def _storage_faults(rng: random.Random, cfg: SimConfig, plan: Plan) -> None:
    """Bookies that crash and come back with a disk damaged while down: the ledger storage lost (cookie and
    journal kept), the journal lost (cookie and storage kept), a synced journal record damaged with later batches
    after it, or the batch in flight torn.
    The first three are refused by the real start-up rules (bookie.startcheck); a torn tail is cut and starts."""
    _disk_faults(rng, cfg, plan)
    cfg.checkpoint_interval_s = 0.3
    plan.fault_kinds = ("crash", "lose_storage", "lose_journal", "damage_journal", "torn_tail", "crash")


def _batched(rng: random.Random, cfg: SimConfig, plan: Plan) -> None:
    """Every writer appends in bursts (each bookie gets its share in one write) while recoverers fence it."""
    _concurrent_recovery(rng, cfg, plan)
    plan.batching = 1.0
    plan.outstanding = (8, 16)
    plan.recoverers = (1, 2)


def _concurrent_recovery(rng: random.Random, cfg: SimConfig, plan: Plan) -> None:
    """Several recoverers of one ledger at once, on a lossy network, while its writer is mid-stream."""
    cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum = rng.choice([(3, 3, 2), (3, 2, 2), (4, 3, 2)])
    cfg.n_bookies = cfg.ensemble_size + 2
    cfg.loss = 0.05
    cfg.slow_message_prob = 0.1
    cfg.request_timeout_s = 0.3
    cfg.heal_at_s = 1.5
    plan.entries = (20, 40)
    plan.outstanding = (4, 10)
    plan.think_max_s = 0.01
    plan.recoverers = (2, 3)
    plan.recoverer_window = (0.1, 0.2)
    plan.faults = (1, 4)
    plan.fault_kinds = ("crash", "partition", "one_way", "isolate")


def _read_errors(rng: random.Random, cfg: SimConfig, plan: Plan) -> None:
    """Bookies whose disks fail reads (I/O errors) while readers tail and recoverers read the ledger."""
    cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum = rng.choice([(3, 3, 2), (3, 2, 2), (4, 3, 2)])
    cfg.n_bookies = cfg.ensemble_size + 1
    cfg.heal_at_s = 2.0
    plan.entries = (10, 30)
    plan.readers = 1.0
    plan.range_readers = 1.0
    plan.recoverers = (1, 2)
    plan.recoverer_window = (0.2, 0.9)
    plan.faults = (2, 5)
    plan.fault_kinds = ("read_errors", "read_errors", "crash")


def _slow_reads(rng: random.Random, cfg: SimConfig, plan: Plan) -> None:
    """Range readers reading speculatively while one or two bookies answer late (but answer) and others crash
    or are cut off: copies of a batch race, fail at once, and lose to each other."""
    cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum = rng.choice(
        [(3, 3, 2), (3, 2, 2), (4, 3, 2), (4, 4, 2)]
    )
    cfg.n_bookies = cfg.ensemble_size + 1
    cfg.request_timeout_s = 1.0
    cfg.heal_at_s = rng.uniform(3.0, 6.0)  # (range reads mostly start before the heal: ledgers close fast)
    cfg.writer_grace_s = 15.0  # (a writer waits on the slow bookies' acks too: up to 0.8 s per entry)
    plan.entries = (10, 40)
    plan.outstanding = (4, 8)
    plan.range_readers = 1.0
    plan.speculative_s = rng.choice([0.05, 0.1, 0.2])
    plan.slow_bookies = rng.randint(1, 2)
    plan.late = (0.0, 0.8)
    plan.faults = (2, 6)
    plan.fault_kinds = ("crash", "isolate", "read_errors", "crash")


PROFILES: dict[str, Callable[[random.Random, SimConfig, Plan], None]] = {
    "default": _default,
    "fence-race": _fence_race,
    "out-of-order": _out_of_order,
    "disk-faults": _disk_faults,
    "concurrent-recovery": _concurrent_recovery,
    "read-errors": _read_errors,
    "batched": _batched,
    "storage-faults": _storage_faults,
    "slow-reads": _slow_reads,
}


# ------------------------------------------------------------------------------------------------ building


def build(
    seed: int,
    profile: str = "default",
    mutations: Mutations = Mutations(),
    *,
    trace: bool = False,
    disabled: frozenset[str] = frozenset(),
    strict: bool = False,
) -> tuple[World, Plan]:
    rng = random.Random(seed)
    cfg = SimConfig()
    plan = Plan()
    PROFILES[profile](rng, cfg, plan)
    world = World(
        seed, cfg, mutations=mutations, trace=trace, disabled_checks=disabled, strict=strict, rng=rng
    )
    for i in range(cfg.n_bookies):
        world.add_bookie(f"b{i}")
    for make in plan.rules:
        world.net.rules.append(make(world))
    for b in rng.sample(sorted(world.bookies), plan.slow_bookies) if plan.slow_bookies else ():
        world.net.late[b] = plan.late
    heal = cfg.heal_at_s

    writers: list[Writer] = []
    # Batching is drawn from its own stream, so that the schedules of writers that do not batch stay as before.
    brng = random.Random(seed * 7919 + 17)
    for i in range(plan.n_ledgers):
        batch = brng.random() < plan.batching
        wr = Writer(
            world,
            f"w{i}",
            n_entries=rng.randint(*plan.entries),
            password=PASSWORD,
            think_max_s=plan.think_max_s,
            outstanding_adds_max=rng.randint(*plan.outstanding),
            batch_max=brng.randint(2, 8) if batch else 1,
            payload_size=brng.randint(1, 24),
        )
        wr.start(rng.uniform(0.0, 0.05))
        writers.append(wr)
        if rng.random() < plan.readers:
            Reader(world, f"r{i}", wr, poll_s=rng.uniform(0.05, 0.3)).start(rng.uniform(0.0, 0.2))
        if brng.random() < plan.range_readers:
            rr = RangeReader(
                world,
                f"rr{i}",
                wr,
                batch_entries=brng.choice([1, 2, 4, 8]),
                window=brng.choice([1, 2, 4]),
                speculative_s=plan.speculative_s,
            )
            rr.start(brng.uniform(0.0, 0.2))

    # Recoverers during the fault period (on a ledger that exists by then), sometimes two at once.
    n_rec = rng.randint(*plan.recoverers)
    for j in range(n_rec):
        when = rng.uniform(*plan.recoverer_window) * heal
        target = rng.choice(writers)
        pair = rng.random() < 0.3
        world.at(when, partial(_start_recoverers, world, target, f"x{j}", pair))

    # Faults. Client faults pick their victim when they strike (recoverers and readers exist by then too).
    bookies = list(world.bookies)
    can_wipe = plan.allow_wipe and cfg.ack_quorum >= 2 and cfg.n_bookies >= cfg.ensemble_size + 2
    wiped = False
    for _ in range(rng.randint(*plan.faults)):
        kind = rng.choice(plan.fault_kinds)
        when = rng.uniform(0.0, heal)
        dur = rng.uniform(0.05, 1.5)
        b = rng.choice(bookies)
        if kind == "wipe" or (kind == "crash" and can_wipe and not wiped and rng.random() < 0.25):
            kind = "crash" if not can_wipe or wiped else "wipe"
            wiped = wiped or kind == "wipe"
        if kind in (
            "lose_storage",
            "lose_journal",
            "damage_journal",
        ):  # may leave the bookie refused for good, as a wipe
            kind = kind if can_wipe and not wiped else "crash"
            wiped = wiped or kind != "crash"
        if kind in ("crash", "wipe", "lose_storage", "lose_journal", "damage_journal", "torn_tail"):
            node = world.bookies[b]
            world.at(
                when,
                partial(
                    node.crash,
                    wipe=kind == "wipe",
                    lose_storage=kind == "lose_storage",
                    lose_journal=kind == "lose_journal",
                    damage=kind == "damage_journal",
                    torn=kind == "torn_tail",
                ),
            )
            world.at(when + dur, node.restart)
        elif kind == "isolate":
            world.at(when, partial(_isolate, world, b, True))
            world.at(when + dur, partial(_isolate, world, b, False))
        elif kind == "slow_disk":
            world.at(when, partial(_slow, world, b, dur))
        elif kind == "read_errors":
            world.at(when, partial(_failing_reads, world, b, dur, rng.uniform(0.2, 0.9)))
        else:
            world.at(when, partial(_client_fault, world, kind, b, dur))

    # Checkpoints (storage survives crashes up to the last one).
    for b in bookies:
        t = rng.uniform(0, cfg.checkpoint_interval_s)
        while t < heal:
            world.at(t, world.bookies[b].checkpoint)
            t += rng.uniform(0.5, 1.5) * cfg.checkpoint_interval_s

    # Heal, then liveness.
    world.at(heal, world.heal)
    alive: list[Writer] = []

    def note_alive() -> None:
        if len(world.available()) >= cfg.ensemble_size + 1:
            alive.extend(w for w in writers if not w.done)

    world.at(heal, note_alive)
    grace = heal + cfg.writer_grace_s
    world.at(grace, lambda: world.checker.check_writer_progress(alive))
    sweeper = _LivenessSweeper(world)
    world.at(grace, sweeper.sweep)
    return world, plan


def _client_fault(world: World, kind: str, bookie: str, dur: float) -> None:
    """A fault on one client (chosen now, among those still running) for ``dur`` seconds."""
    live = [c for c in world.clients.values() if not c.done]
    if not live:
        return
    c = world.rng.choice(live).name
    if kind in ("partition", "one_way"):
        src, dst = (c, bookie) if world.rng.random() < 0.5 else (bookie, c)
        _partition(world, src, dst, kind == "one_way")
        world.at(dur, lambda: world.net.heal_pair(src, dst))
    elif kind == "session":
        _expire(world, c, True)
        world.at(dur, lambda: _expire(world, c, False))
    elif kind == "zk_flaky":
        _flaky(world, c, True)
        world.at(dur, lambda: _flaky(world, c, False))
    elif kind == "pause":
        world.clients[c].pause()
        world.at(2 * dur, world.clients[c].resume)
    else:  # pragma: no cover
        raise ValueError(kind)


def _start_recoverers(world: World, writer: Writer, name: str, pair: bool) -> None:
    if writer.lid is None:  # not created yet: recover it as soon as it is
        world.at(0.005, lambda: _start_recoverers(world, writer, name, pair))
        return
    rw = world.rng.choice([1, 2, 4, 16])
    Recoverer(world, name, writer.lid, PASSWORD, read_window=rw).start()
    if pair:
        Recoverer(world, name + "b", writer.lid, PASSWORD, read_window=rw).start(world.rng.uniform(0, 0.01))


def _partition(world: World, src: str, dst: str, one_way: bool) -> None:
    world.log(f"PARTITION {src} {'->' if one_way else '<->'} {dst}")
    world.net.partition(src, dst, one_way=one_way)


def _isolate(world: World, bookie: str, on: bool) -> None:
    world.log(f"{'ISOLATE' if on else 'RECONNECT'} {bookie}")
    for c in list(world.clients):
        if on:
            world.net.partition(bookie, c)
        else:
            world.net.heal_pair(bookie, c)


def _slow(world: World, bookie: str, dur: float) -> None:
    world.log(f"SLOW DISK {bookie} for {dur:.3f}s")
    world.bookies[bookie].slow_until = world.now + dur


def _failing_reads(world: World, bookie: str, dur: float, prob: float) -> None:
    world.log(f"READ ERRORS {bookie} for {dur:.3f}s (p={prob:.2f})")
    node = world.bookies[bookie]
    node.read_errors_until = world.now + dur
    node.read_error_prob = prob


def _expire(world: World, client: str, on: bool) -> None:
    world.log(f"SESSION {'EXPIRED' if on else 'RESTORED'} {client}")
    if on:
        world.meta.expired.add(client)
    else:
        world.meta.expired.discard(client)


def _flaky(world: World, client: str, on: bool) -> None:
    world.log(f"ZK CONNECTION {'FLAKY' if on else 'STABLE'} {client}")
    if on:
        world.meta.flaky.add(client)
    else:
        world.meta.flaky.discard(client)


class _LivenessSweeper:
    """After the writers' grace: recover every ledger that is not CLOSED (again, while it is not)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.deadline = world.now + 0.0
        self.n = 0

    def sweep(self) -> None:
        w = self.world
        if self.n == 0:
            self.deadline = w.now + w.cfg.close_deadline_s
            w.at(w.cfg.close_deadline_s, w.checker.check_closed)
        self.n += 1
        pending = False
        for lid, v in w.meta.ledgers.items():
            if v.value.state.value == "CLOSED":
                continue
            pending = True
            active = [
                c for c in w.clients.values() if isinstance(c, Recoverer) and c.lid == lid and not c.done
            ]
            if not active:
                Recoverer(
                    w, f"live{self.n}-L{lid}", lid, PASSWORD, read_window=w.rng.choice([1, 4, 16])
                ).start()
        writers_pending = any(
            isinstance(c, Writer) and c.lid is None and not c.done for c in w.clients.values()
        )
        if (pending or writers_pending) and w.now < self.deadline:
            w.at(1.0, self.sweep)


# ------------------------------------------------------------------------------------------------ running


def run(
    seed: int,
    profile: str = "default",
    mutation_name: str = "none",
    *,
    trace: bool = False,
    disabled: frozenset[str] = frozenset(),
    strict: bool = False,
) -> Outcome:
    world, plan = build(seed, profile, mutation(mutation_name), trace=trace, disabled=disabled, strict=strict)
    cfg = world.cfg
    world.run(cfg.heal_at_s + cfg.writer_grace_s + cfg.close_deadline_s + 1.0)
    if not world.checker.violations:
        world.checker.check_all()
    if not world.checker.violations:
        world.checker.check_closed()
    writers = [c for c in world.clients.values() if isinstance(c, Writer)]
    recs = [c for c in world.clients.values() if isinstance(c, Recoverer)]
    summary = (
        f"E={cfg.ensemble_size} Qw={cfg.write_quorum} Qa={cfg.ack_quorum} bookies={cfg.n_bookies} "
        f"ledgers={len(writers)} acked={sum(len(w.acked) for w in writers)} "
        f"writers={[w.outcome for w in writers]} recoverers={len(recs)} steps={world.steps} "
        f"t={world.now:.2f}s msgs={world.net.sent} dropped={world.net.dropped}"
    )
    return Outcome(
        seed=seed,
        profile=profile,
        mutation=mutation_name,
        violations=list(world.checker.violations),
        steps=world.steps,
        sim_time_s=world.now,
        summary=summary,
        trace=world.trace,
        stats=dict(world.stats),
        known=list(world.checker.known),
    )
