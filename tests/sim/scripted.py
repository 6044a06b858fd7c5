"""Helpers for scripted scenarios: a small world, message predicates and one-shot network rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bookie import protocol as p

from .actors import Recoverer, Writer
from .schedule import PASSWORD
from .world import SimConfig, World, mutation

Pred = Callable[[str, str, Any], bool]


def make_world(
    n_bookies: int,
    ensemble_size: int,
    write_quorum: int,
    ack_quorum: int,
    *,
    seed: int = 1,
    mutation_name: str = "none",
    disabled: frozenset[str] = frozenset(),
    strict: bool = False,
    **cfg: Any,
) -> World:
    """A quiet network (no random loss or slow messages) unless ``cfg`` says otherwise; bookies b0..bN-1."""
    config = SimConfig(
        n_bookies=n_bookies,
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        slow_message_prob=0.0,
    )
    for k, v in cfg.items():
        setattr(config, k, v)
    world = World(
        seed, config, mutations=mutation(mutation_name), trace=True, disabled_checks=disabled, strict=strict
    )
    for i in range(n_bookies):
        world.add_bookie(f"b{i}")
    return world


def once(world: World, pred: Pred, verdict: str | float) -> None:
    """The first message matching ``pred`` is dropped ("drop") or delivered after ``verdict`` seconds."""
    fired = [False]

    def rule(src: str, dst: str, msg: Any) -> str | float | None:
        if not fired[0] and pred(src, dst, msg):
            fired[0] = True
            return verdict
        return None

    world.net.rules.append(rule)


def add(src: str, dst: str, entry_id: int | None = None, *, recovery: bool = False) -> Pred:
    def pred(s: str, d: str, m: Any) -> bool:
        return (
            s == src
            and d == dst
            and isinstance(m, p.AddEntryRequest)
            and (entry_id is None or m.entry_id == entry_id)
            and bool(m.flags & p.Flag.RECOVERY_ADD) == recovery
        )

    return pred


def fence(src: str, dst: str) -> Pred:
    def pred(s: str, d: str, m: Any) -> bool:
        return (
            s == src
            and d == dst
            and isinstance(m, p.ReadEntryRequest)
            and m.entry_id == p.LAST_ENTRY
            and bool(m.flags & p.Flag.FENCE)
        )

    return pred


def read(src: str, dst: str, entry_id: int) -> Pred:
    def pred(s: str, d: str, m: Any) -> bool:
        return s == src and d == dst and isinstance(m, p.ReadEntryRequest) and m.entry_id == entry_id

    return pred


def writer(world: World, ensemble: list[str], n_entries: int, **kw: Any) -> Writer:
    kw.setdefault("think_max_s", 0.0)
    w = Writer(world, "w0", n_entries=n_entries, password=PASSWORD, ensemble=ensemble, **kw)
    w.start()
    return w


def recover_at(
    world: World, when_s: float, wr: Writer, name: str = "x0", read_window: int = 1
) -> list[Recoverer]:
    """Start a recoverer of ``wr``'s ledger at ``when_s``; the returned list holds it once started."""
    out: list[Recoverer] = []

    def go() -> None:
        if wr.lid is None:  # not created yet
            world.at(0.001, go)
            return
        r = Recoverer(world, name, wr.lid, PASSWORD, read_window=read_window)
        out.append(r)
        r.start()

    world.at(when_s, go)
    return out


def invariants(world: World) -> set[str]:
    return {v.invariant for v in world.checker.violations}


def dump(world: World) -> str:
    return "\n".join(world.trace or [])
