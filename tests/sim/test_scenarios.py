"""Named scenarios, scripted message by message on top of the simulator (real cores, real checkers).

Each test fails with the simulator trace in its message, so a broken scenario explains itself.
"""

from __future__ import annotations

import pytest

from .actors import RangeReader, Writer
from .scripted import add, dump, fence, invariants, make_world, once, read, recover_at, writer
from .world import World

ABC = ["b0", "b1", "b2"]


def settle(world: World, until_s: float) -> None:
    world.run(until_s)
    if not world.checker.violations:
        world.checker.check_all()


def assert_clean(world: World) -> None:
    assert not world.checker.violations, dump(world)


# -- BookKeeper #2614 ---------------------------------------------------------------------------------------


def _scenario_2614(mutation_name: str, late_add_s: float) -> tuple[World, Writer]:
    """The TLA+ trace (E=Qw=3, Qa=2): w0's add of e0 to b0 is lost, b1 stores and acks it, the add to b2 is
    late. The recoverer's fencing read to b2 is lost, so b0 and b1 make coverage. Its recovery read of e0 from
    b1 is slow, so b0 and b2 answer first: two NO_ENTRY = unrecoverable, close empty. Then the late add
    reaches b2 — unfenced unless the recovery read fenced it."""
    w = make_world(3, 3, 3, 2, mutation_name=mutation_name, request_timeout_s=2.0)
    once(w, add("w0", "b0", 0), "drop")
    once(w, add("w0", "b2", 0), late_add_s)
    once(w, fence("x0", "b2"), "drop")
    once(w, read("x0", "b1", 0), 0.5)
    wr = writer(w, ABC, 1)
    recover_at(w, 0.05, wr)
    settle(w, 3.0)
    return w, wr


def test_2614_recovery_read_fences_the_bookie_whose_fence_was_lost() -> None:
    w, wr = _scenario_2614("none", late_add_s=0.2)
    assert_clean(w)
    md = w.meta.ledgers[1].value
    assert (md.state, md.last_entry_id) == ("CLOSED", -1), dump(w)
    assert wr.acked == [] and wr.outcome == "FENCED", dump(w)  # b2 refused the late add: FENCED


def test_2614_without_fencing_recovery_reads_an_acked_entry_is_lost() -> None:
    w, wr = _scenario_2614("no-recovery-read-fence", late_add_s=0.2)
    assert invariants(w) == {"1"}, dump(w)
    assert wr.acked == [0]
    assert w.meta.ledgers[1].value.last_entry_id == -1


def test_2614_acked_entry_survives_when_the_late_add_lands_before_the_recovery_read() -> None:
    w, wr = _scenario_2614("none", late_add_s=0.01)
    assert_clean(w)
    assert wr.acked == [0], dump(w)
    assert w.meta.ledgers[1].value.last_entry_id == 0, dump(w)


# -- BookKeeper #2615 ---------------------------------------------------------------------------------------


def test_2615_recovery_starts_at_the_last_ensemble_not_below_it() -> None:
    """w0 writes e0..e4; its add of e4 to b2 is lost, e4 completes on b0+b1, and the delayed failure makes
    an ensemble change at e5 = LAC + 1 with nothing pending: the new segment [b0, b1, b3] from e5 holds no
    entry. The piggybacked LAC on the bookies is only 3 (e4's header), so recovery must start at
    first(last segment) - 1 = 4, not at 3: reading e4 from the last segment would ask b3, which never had it."""
    w = make_world(4, 3, 3, 2)
    once(w, add("w0", "b2", 4), "drop")
    wr = writer(w, ABC, 5, close_when_done=False, outstanding_adds_max=1)
    recs = recover_at(w, 1.5, wr)
    settle(w, 5.0)
    assert_clean(w)
    md = w.meta.ledgers[1].value
    assert [e.first_entry_id for e in md.ensembles] == [0, 5], dump(w)
    (rec,) = recs
    assert max(rec.fence_lacs) == 3 and rec.starts[0] == 4, (rec.fence_lacs, rec.starts)
    assert (md.state, md.last_entry_id) == ("CLOSED", 4), dump(w)
    assert md.length == sum(len(w.written[(1, e)]) - 36 for e in range(5))  # header 32 + CRC32C 4


# -- a writer paused across a whole recovery -----------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_writer_paused_across_a_full_recovery_gets_fenced_and_loses_nothing(seed: int) -> None:
    """w0 stops (GC pause, SIGSTOP) with adds in flight; a recoverer fences, recovers and closes; w0 resumes
    and processes everything at once. Its later adds must fail fenced, and nothing it got acked is lost."""
    w = make_world(4, 3, 3, 2, seed=seed, delay_max_s=0.01)
    wr = writer(w, ABC, 40, think_max_s=0.01, outstanding_adds_max=6)
    w.at(0.1 + 0.01 * seed, wr.pause)
    recs = recover_at(w, 0.15, wr)
    w.at(1.0, wr.resume)
    settle(w, 3.0)
    assert_clean(w)
    md = w.meta.ledgers[1].value
    assert md.state == "CLOSED" and recs[0].result == md.last_entry_id
    assert wr.outcome in ("FENCED", "CLOSED"), dump(w)
    assert wr.acked == list(range(len(wr.acked))) and (not wr.acked or wr.acked[-1] <= md.last_entry_id)


# -- an ensemble change racing a recovery --------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_ensemble_change_racing_a_recovery(seed: int) -> None:
    """b1 crashes while w0 writes; w0's ensemble change CAS and the recoverer's OPEN->IN_RECOVERY CAS race
    (slow metadata). Whichever wins, the result is safe: the recoverer sees the new ensemble, or w0's CAS finds
    IN_RECOVERY and w0 fails fenced."""
    w = make_world(4, 3, 3, 2, seed=seed, meta_delay_max_s=0.05, request_timeout_s=0.2)
    wr = writer(w, ABC, 30, think_max_s=0.01)
    w.at(0.2, lambda: w.bookies["b1"].crash())
    recover_at(w, 0.14 + 0.01 * seed, wr)
    settle(w, 5.0)
    assert_clean(w)
    w.checker.check_closed()
    assert_clean(w)


def test_ensemble_change_racing_a_recovery_sees_both_orders() -> None:
    """Across the seeds above, both orders happen (the scenario really is a race)."""
    fenced_by_cas = changed_first = 0
    for seed in range(12):
        w = make_world(4, 3, 3, 2, seed=seed, meta_delay_max_s=0.05, request_timeout_s=0.2)
        wr = writer(w, ABC, 30, think_max_s=0.01)
        w.at(0.2, lambda w=w: w.bookies["b1"].crash())  # type: ignore[misc]
        recover_at(w, 0.14 + 0.01 * seed, wr)
        settle(w, 5.0)
        trace = dump(w)
        fenced_by_cas += "w0 FAILED: [FENCED] ledger is being recovered" in trace
        changed_first += "w0 ENSEMBLE CHANGE" in trace
    assert fenced_by_cas and changed_first, (fenced_by_cas, changed_first)


# -- a bookie restarted with an empty disk ------------------------------------------------------------------


def _wiped(mutation_name: str, disabled: frozenset[str] = frozenset()) -> World:
    """e0 is acked by b0 and b1 (the add to b2 is lost). b1 loses its disk and restarts. A recoverer then
    reads e0 with b0's answer slow, so b1 and b2 answer first."""
    w = make_world(4, 3, 3, 2, mutation_name=mutation_name, disabled=disabled)
    once(w, add("w0", "b2", 0), "drop")
    wr = writer(w, ABC, 1, close_when_done=False)
    w.at(0.1, lambda: w.bookies["b1"].crash(wipe=True))
    w.at(0.2, lambda: w.bookies["b1"].restart())
    once(w, read("x0", "b0", 0), 0.3)
    recover_at(w, 0.3, wr)
    settle(w, 3.0)
    return w


def test_wiped_bookie_is_refused_by_the_cookie_check_and_nothing_is_lost() -> None:
    w = _wiped("none")
    assert_clean(w)
    assert w.bookies["b1"].refused and not w.bookies["b1"].up
    md = w.meta.ledgers[1].value
    assert (md.state, md.last_entry_id) == ("CLOSED", 0), dump(w)
    assert "b1" not in md.ensembles[-1].bookies  # write-back replaced the dead bookie


def test_trusting_a_wiped_bookie_is_caught_at_its_restart() -> None:
    w = _wiped("trust-wiped-disk")
    assert w.checker.violations and w.checker.violations[0].invariant == "7", dump(w)


def test_trusting_a_wiped_bookie_loses_an_acked_entry() -> None:
    """With the restart check (7) and the replica count (2) switched off, the loss itself is caught: the
    empty bookie answers NO_ENTRY, recovery closes the ledger empty, and e0 had been acknowledged."""
    w = _wiped("trust-wiped-disk", disabled=frozenset({"7", "2"}))
    assert invariants(w) == {"1"}, dump(w)
    assert w.meta.ledgers[1].value.last_entry_id == -1


# -- storage read errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mutation_name", ["none", "read-error-as-missing"])
def test_recovery_reads_past_a_bookie_whose_disk_fails_every_read(mutation_name: str) -> None:
    """E=Qw=3, Qa=2: the writer stops (stays open) after 10 acked entries; b0's storage then fails every read
    with an I/O error. Recovery fences and reads from b1 and b2 and closes at the last entry, nothing lost;
    a range reader (the client's ReadPlanner) then reads all ten; b0 answers INTERNAL, never NO_ENTRY. Answered NO_ENTRY instead (the mutation), b0 denies entries that are
    on its disk."""
    w = make_world(3, 3, 3, 2, mutation_name=mutation_name)
    wr = writer(w, ABC, 10, close_when_done=False)
    w.run(1.0)
    assert wr.acked == list(range(10)), dump(w)
    b0 = w.bookies["b0"]
    b0.read_errors_until, b0.read_error_prob = 100.0, 1.0
    recs = recover_at(w, 1.1, wr, read_window=4)
    rr = RangeReader(w, "rr0", wr, batch_entries=4, window=2)
    rr.start(1.0)
    settle(w, 5.0)
    if mutation_name != "none":
        assert invariants(w) == {"3"}, dump(w)
        return
    assert_clean(w)
    md = w.meta.ledgers[1].value
    assert (md.state, md.last_entry_id) == ("CLOSED", 9), dump(w)
    assert md.length == sum(w.payload_sizes[(1, e)] for e in range(10))
    assert recs[0].result == 9 and w.stats["storage read error"] > 0, dump(w)
    assert rr.done and rr.next == 10, dump(w)  # READ_RANGE batches failed over from b0 to b1 and b2
