"""Re-replication planning (pure): which entries a lost bookie held, and the metadata swap that follows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger_client.quorum import write_set
from ledger_client.rereplication import lost_fragments, swapped
from zk.ledger_metadata import Ensemble, LedgerMetadata, check_transition, password_digest_of

B = [f"b{i}" for i in range(10)]


def md(e: int, qw: int, qa: int, ensembles: list[tuple[int, list[str]]], last: int) -> LedgerMetadata:
    m = LedgerMetadata(
        ledger_id=7,
        ensemble_size=e,
        write_quorum=qw,
        ack_quorum=qa,
        ensembles=tuple(Ensemble(f, tuple(b)) for f, b in ensembles),
        password_digest=password_digest_of(b"pw"),
    )
    return m.close(last, 100 * (last + 1))


def test_the_lost_bookies_entries_in_each_of_its_fragments() -> None:
    m = md(3, 2, 2, [(0, B[0:3]), (10, [B[0], B[3], B[2]]), (20, B[4:7])], last=24)
    frags = lost_fragments(m, B[0])
    assert [(f.ensemble_index, f.bookie_index, f.first_entry_id, f.last_entry_id) for f in frags] == [
        (0, 0, 0, 9),
        (1, 0, 10, 19),
    ]
    # index 0 of E=3, Qw=2 holds e with (0 - e) % 3 < 2: e % 3 in {0, 2}
    assert list(frags[0].entries()) == [0, 2, 3, 5, 6, 8, 9]
    assert list(frags[1].entries()) == [11, 12, 14, 15, 17, 18]
    assert lost_fragments(m, B[9]) == []
    (f,) = lost_fragments(m, B[5])
    assert (f.first_entry_id, f.last_entry_id) == (20, 24) and list(f.entries()) == [
        21,
        22,
        24,
    ]  # e % 3 in {0, 1}


def test_an_ensemble_past_the_last_entry_is_an_empty_fragment() -> None:
    m = md(3, 3, 2, [(0, B[0:3]), (5, B[3:6])], last=4)  # recovery's ensemble change, then nothing written
    frags = lost_fragments(m, B[4])
    assert len(frags) == 1 and list(frags[0].entries()) == []
    empty = md(3, 3, 2, [(0, B[0:3])], last=-1)
    assert [list(f.entries()) for f in lost_fragments(empty, B[1])] == [[]]


def test_an_open_ledger_has_only_its_sealed_fragments_and_one_in_recovery_none() -> None:
    m = md(3, 2, 2, [(0, B[0:3]), (5, (B[3], B[1], B[2]))], last=9)
    open_ = m.replace(state=m.state.OPEN, last_entry_id=-1, length=0)
    (f,) = lost_fragments(open_, B[1])  # the sealed ensemble's, not the writer's last one
    assert (f.ensemble_index, f.first_entry_id, f.last_entry_id) == (0, 0, 4)
    assert lost_fragments(open_, B[3]) == []
    with pytest.raises(ValueError, match="IN_RECOVERY"):
        lost_fragments(m.replace(state=m.state.IN_RECOVERY, last_entry_id=-1, length=0), B[0])


@given(
    e=st.integers(1, 5),
    data=st.data(),
)
def test_fragment_entries_are_exactly_those_whose_write_set_holds_the_bookie(e: int, data) -> None:
    qw = data.draw(st.integers(1, e))
    last = data.draw(st.integers(-1, 40))
    starts = sorted(data.draw(st.sets(st.integers(1, 45), max_size=3)))
    ensembles = [(0, B[:e])] + [(s, B[i + 1 : i + 1 + e]) for i, s in enumerate(starts)]
    m = md(e, qw, 1, ensembles, last)
    lost = data.draw(st.sampled_from(B[: e + len(starts)]))
    got = {eid for f in lost_fragments(m, lost) for eid in f.entries()}
    want = {
        eid
        for eid in range(last + 1)
        if lost in {m.ensemble_at(eid).bookies[i] for i in write_set(eid, e, qw)}
    }
    assert got == want


def test_the_swap_is_a_legal_closed_ledger_change_and_checks_the_plan_still_holds() -> None:
    m = md(3, 2, 2, [(0, B[0:3]), (10, [B[3], B[0], B[2]])], last=15)
    new = swapped(m, B[0], {0: B[7], 1: B[8]})
    assert [e.bookies for e in new.ensembles] == [(B[7], B[1], B[2]), (B[3], B[8], B[2])]
    check_transition(m, new)
    with pytest.raises(ValueError, match="no longer"):
        swapped(new, B[0], {0: B[9]})
    with pytest.raises(ValueError, match="already"):
        swapped(m, B[0], {0: B[2]})
