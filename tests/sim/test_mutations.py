"""The harness can fail: with each safety rule switched off, the simulator finds a violation.

For each mutation: search seeds of a profile until a schedule violates an invariant (it must happen within
``max_seeds``), check that the invariant is one that mutation should break, and check that the very same seed
passes with the rule switched back on — so the violation is the mutation's doing, not noise. Some cases switch
the first checker to fire off, to show the next line of defence catches the damage too.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from .schedule import run


class Case(NamedTuple):
    mutation: str
    profile: str
    expect: frozenset[str]  # the invariant(s) the first violation may be reported under
    max_seeds: int
    disabled: frozenset[str] = frozenset()


def case(mutation: str, profile: str, expect: str, max_seeds: int, disabled: str = "") -> Case:
    return Case(
        mutation,
        profile,
        frozenset(expect.split(",")),
        max_seeds,
        frozenset(filter(None, disabled.split(","))),
    )


CASES = [
    # The cores' own test-only switches.
    case("no-recovery-read-fence", "fence-race", "1", 1500),  # BookKeeper #2614: an acked entry is lost
    case("count-all-answers", "fence-race", "4", 100),  # "coverage" without enough durable fences
    case("ack-out-of-order", "out-of-order", "3", 20),  # acks to the user out of entry order
    case("ack-out-of-order", "out-of-order", "1", 100, disabled="3"),  # ... and then one is lost
    # Broken disks.
    case("trust-wiped-disk", "disk-faults", "7", 50),  # no cookie check: a wiped bookie restarts empty
    case("trust-wiped-disk", "disk-faults", "2", 100, disabled="7"),
    case("lying-fsync", "disk-faults", "2", 20),  # acked before durable
    case("lying-fsync", "disk-faults", "7,4", 100, disabled="2"),  # ... lost in a crash
    case("corrupting-disk", "default", "3", 20),  # reads return other bytes than written
    case("lossy-storage", "default", "3", 20),  # a synced entry is not found by reads
    # Broken client drivers and metadata store.
    case("eager-lac", "default", "3,2", 50),  # a LAC that claims unconfirmed entries
    case("recoverer-overwrites-close", "concurrent-recovery", "5", 50),
    case("recoverer-overwrites-close+unchecked-metadata-store", "concurrent-recovery", "5", 50),
    case("recoverer-reports-own-result", "concurrent-recovery", "6", 100),
    case("recovery-gives-up", "default", "10", 300),  # liveness: a ledger never closes
    case("writer-skips-ensemble-change", "default", "10", 50),  # liveness: a writer stops making progress
    # ensemble_change_step's FENCED taken for WRITE: the writer changes the ensemble of a ledger being recovered
    # and gets entries acknowledged by bookies the recovery never fenced.
    case("writer-continues-in-recovery", "default", "4,1,5", 100),
    # The metadata store: the real LedgerMetadataStore over the simulated ZooKeeper.
    case("unversioned-set", "concurrent-recovery", "5", 20),  # no compare-and-set: a stale write lands
    case("reopen-closed-ledger", "concurrent-recovery", "5", 50),  # refused by the store's check_transition
    case(
        "reopen-closed-ledger+unchecked-metadata-store", "concurrent-recovery", "5", 50
    ),  # ... the checker's
    case("wrong-close-length", "default", "5", 20),  # the metadata length is not the entries' sizes
    # Storage read errors.
    case("read-error-as-missing", "read-errors", "3", 50),  # a failed read denies a stored entry
    # ... and without that check, a range read finds every replica denying an entry of a CLOSED ledger
    case("read-error-as-missing", "read-errors", "1", 200, disabled="3"),
    # The batched add path (several adds in one write, a chunk of replies to WritePipeline.on_acks).
    case("batch-acks-all", "batched", "1,2,4", 20),  # a refused add in a reply chunk counted as acked
    # A disk damaged while its bookie was down (bookie.startcheck's rules switched off).
    case("start-without-storage", "storage-faults", "7", 50),  # 911c2b3 reversed: starts with no storage
    case("cut-damaged-journal", "storage-faults", "7", 100),  # 31b4e10 reversed: damage cut as a torn tail
    case("start-without-journal", "storage-faults", "7", 100),  # starts with its journal deleted
    # ... and without invariant 7's look at the restart, the bookie answers NO_LEDGER/NO_ENTRY for them
    case("start-without-storage", "storage-faults", "3", 150, disabled="7"),
    case("cut-damaged-journal", "storage-faults", "3", 300, disabled="7"),
    case("start-without-journal", "storage-faults", "3", 300, disabled="7"),
    # Speculative range reads (the client's Rivals): a copy a settled batch left out is not dropped, and its
    # late answer is taken for the batch again: its entries are handed out twice
    case("spec-loser-kept", "slow-reads", "3", 50),
]


@pytest.mark.parametrize(
    "c", CASES, ids=lambda c: c.mutation + (f"-without-{'-'.join(sorted(c.disabled))}" if c.disabled else "")
)
def test_mutation_is_caught(c: Case) -> None:
    for seed in range(c.max_seeds):
        out = run(seed, c.profile, c.mutation, disabled=c.disabled)
        if out.ok:
            continue
        first = out.violations[0]
        assert first.invariant in c.expect, out.report()
        clean = run(seed, c.profile, disabled=c.disabled)
        assert clean.ok, f"seed {seed} fails without the mutation too:\n{clean.report()}"
        print(f"{c.mutation} (checks off: {sorted(c.disabled)}): seed={seed}: {first}")
        return
    pytest.fail(f"{c.mutation}: no violation in {c.max_seeds} seeds of profile {c.profile}")
