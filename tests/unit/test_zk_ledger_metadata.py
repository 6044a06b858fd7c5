import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zk.client import decode_body, encode_body
from zk.errors import InvalidMetadataError, MetadataFormatError, MetadataTransitionError
from zk.ledger_metadata import (
    Ensemble,
    LedgerMetadata,
    LedgerState,
    check_transition,
    password_digest_of,
)

PW = password_digest_of(b"secret")
B = [f"127.0.0.1:{3181 + i}" for i in range(8)]


def meta(**kw: Any) -> LedgerMetadata:
    base: dict[str, Any] = dict(
        ledger_id=7,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        ensembles=(Ensemble(0, tuple(B[:3])),),
        password_digest=PW,
        ctime_ms=1_700_000_000_000,
        custom_metadata={"app": b"x"},
    )
    base.update(kw)
    return LedgerMetadata(**base)


@st.composite
def metadatas(draw: st.DrawFn) -> LedgerMetadata:
    e = draw(st.integers(1, 5))
    qw = draw(st.integers(1, e))
    qa = draw(st.integers(1, qw))
    n_ens = draw(st.integers(1, 4))
    gaps = draw(st.lists(st.integers(1, 10**6), min_size=n_ens - 1, max_size=n_ens - 1))
    starts = [0]
    for g in gaps:
        starts.append(starts[-1] + g)
    ensembles = tuple(Ensemble(s, tuple(draw(st.permutations(B))[:e])) for s in starts)
    state = draw(st.sampled_from(list(LedgerState)))
    last, length = -1, 0
    if state is LedgerState.CLOSED:
        last = draw(st.integers(-1, 2**62))
        length = 0 if last == -1 else draw(st.integers(0, 2**62))
    return LedgerMetadata(
        ledger_id=draw(st.integers(0, 2**63 - 1)),
        ensemble_size=e,
        write_quorum=qw,
        ack_quorum=qa,
        ensembles=ensembles,
        state=state,
        last_entry_id=last,
        length=length,
        digest_type=draw(st.sampled_from(["CRC32C", "CRC32", "MAC", "DUMMY"])),
        password_digest=password_digest_of(draw(st.binary(max_size=16))),
        ctime_ms=draw(st.integers(0, 2**50)),
        custom_metadata=draw(st.dictionaries(st.text(max_size=8), st.binary(max_size=32), max_size=4)),
    )


@given(metadatas())
def test_json_round_trip(m: LedgerMetadata) -> None:
    assert LedgerMetadata.from_json(m.to_json()) == m
    # through the exact bytes stored in ZooKeeper
    assert LedgerMetadata.from_json(decode_body(encode_body(m.to_json()))) == m
    text = json.dumps(m.to_json())
    assert LedgerMetadata.from_json(json.loads(text)) == m


def test_json_shape_is_the_documented_one() -> None:
    d = meta().to_json()
    assert d == {
        "format_version": 1,
        "ledger_id": 7,
        "ensemble_size": 3,
        "write_quorum": 2,
        "ack_quorum": 2,
        "state": "OPEN",
        "last_entry_id": -1,
        "length": 0,
        "ensembles": [{"first_entry_id": 0, "bookies": B[:3]}],
        "digest_type": "CRC32C",
        "password_digest": PW,
        "ctime_ms": 1_700_000_000_000,
        "custom_metadata": {"app": "eA=="},
    }
    assert meta().state == "OPEN"  # StrEnum compares to its string


@pytest.mark.parametrize(
    "kw",
    [
        dict(ensemble_size=2),  # ensemble has 3 bookies
        dict(write_quorum=4),  # Qw > E
        dict(ack_quorum=3),  # Qa > Qw
        dict(ack_quorum=0),
        dict(ensemble_size=0, write_quorum=0, ack_quorum=0, ensembles=(Ensemble(0, ("a",)),)),
        dict(ensembles=()),
        dict(ensembles=(Ensemble(1, tuple(B[:3])),)),  # must start at 0
        dict(ensembles=(Ensemble(0, tuple(B[:3])), Ensemble(0, tuple(B[1:4])))),  # not strictly increasing
        dict(ensembles=(Ensemble(0, tuple(B[:3])), Ensemble(9, tuple(B[1:4])), Ensemble(5, tuple(B[:3])))),
        dict(state="BOGUS"),
        dict(last_entry_id=5),  # OPEN with a last entry
        dict(state=LedgerState.IN_RECOVERY, length=10),
        dict(state=LedgerState.CLOSED, last_entry_id=-2),
        dict(state=LedgerState.CLOSED, last_entry_id=-1, length=3),
        dict(password_digest="abc"),
        dict(password_digest=PW.upper()),
        dict(digest_type=""),
        dict(custom_metadata={"k": "not bytes"}),
        dict(ledger_id=-1),
        dict(ledger_id=True),
        dict(ctime_ms=-5),
        dict(format_version=2),
    ],
)
def test_validation_rejects(kw: dict[str, Any]) -> None:
    with pytest.raises(InvalidMetadataError):
        meta(**kw)


@pytest.mark.parametrize(
    "bookies",
    [("a", "a", "b"), ("a", "", "b"), ("a", "x/y", "b"), ()],
)
def test_ensemble_validation(bookies: tuple[str, ...]) -> None:
    with pytest.raises(InvalidMetadataError):
        Ensemble(0, bookies)


def test_ensemble_accepts_list_and_is_hashable() -> None:
    e = Ensemble(0, ["a", "b"])  # type: ignore[arg-type]
    assert e.bookies == ("a", "b")
    assert hash(e) == hash(Ensemble(0, ("a", "b")))
    assert hash(meta()) == hash(meta())


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("ensembles"),
        lambda d: d.pop("format_version"),
        lambda d: d.update(ensembles="x"),
        lambda d: d.update(ensembles=[{"first_entry_id": 0}]),
        lambda d: d.update(custom_metadata={"a": "!!!"}),
        lambda d: d.update(custom_metadata={"a": 5}),
        lambda d: d.update(custom_metadata=[]),
    ],
)
def test_from_json_rejects_malformed(mutate: Any) -> None:
    d = meta().to_json()
    mutate(d)
    with pytest.raises((MetadataFormatError, InvalidMetadataError)):
        LedgerMetadata.from_json(d)


def test_from_json_ignores_unknown_keys() -> None:
    d = meta().to_json()
    d["future_field"] = 1
    assert LedgerMetadata.from_json(d) == meta()


def test_helpers() -> None:
    m = meta()
    m2 = m.with_new_ensemble(10, B[3:6])
    m3 = m2.with_new_ensemble(25, B[1:4])
    assert m3.ensemble_at(0) == m.ensembles[0]
    assert m3.ensemble_at(9).first_entry_id == 0
    assert m3.ensemble_at(10).bookies == tuple(B[3:6])
    assert m3.ensemble_at(24).first_entry_id == 10
    assert m3.ensemble_at(10**9).first_entry_id == 25
    assert m3.last_ensemble.first_entry_id == 25
    with pytest.raises(ValueError):
        m3.ensemble_at(-1)
    # same first entry id replaces the last ensemble
    m4 = m3.with_new_ensemble(25, B[5:8])
    assert len(m4.ensembles) == 3 and m4.last_ensemble.bookies == tuple(B[5:8])
    c = m3.close(40, 4096)
    assert c.state is LedgerState.CLOSED and c.last_entry_id == 40 and c.length == 4096 and c.is_closed
    assert m.with_state("IN_RECOVERY").state is LedgerState.IN_RECOVERY
    assert m.check_password(b"secret") and not m.check_password(b"wrong")
    with pytest.raises(InvalidMetadataError):
        m.with_new_ensemble(0, B[:2])  # wrong size
    # the stored custom metadata is a private copy
    src = {"k": b"v"}
    mm = meta(custom_metadata=src)
    src["k"] = b"changed"
    assert mm.custom_metadata == {"k": b"v"}


# --- check_transition ----------------------------------------------------------------------------------------

OPEN = meta()
OPEN_2ENS = OPEN.with_new_ensemble(10, B[3:6])
REC = OPEN_2ENS.with_state(LedgerState.IN_RECOVERY)
CLOSED = OPEN_2ENS.close(20, 2000)

ALLOWED = [
    ("no-op", OPEN, OPEN),
    ("no-op closed", CLOSED, CLOSED),
    ("append ensemble", OPEN, OPEN_2ENS),
    (
        "open: a bookie swapped in place in a sealed ensemble (re-replication while the writer writes)",
        OPEN_2ENS,
        OPEN_2ENS.replace(ensembles=(Ensemble(0, (B[0], B[7], B[2])), OPEN_2ENS.ensembles[1])),
    ),
    ("append two ensembles", OPEN, OPEN_2ENS.with_new_ensemble(15, B[:3])),
    ("replace last ensemble at same start", OPEN_2ENS, OPEN_2ENS.with_new_ensemble(10, B[5:8])),
    ("replace only ensemble", OPEN, OPEN.with_new_ensemble(0, B[5:8])),
    ("open -> in recovery", OPEN_2ENS, REC),
    ("open -> closed", OPEN_2ENS, CLOSED),
    ("open -> closed empty", OPEN, OPEN.close(-1, 0)),
    ("in recovery -> closed", REC, REC.close(20, 2000)),
    ("ensemble change during recovery", REC, REC.with_new_ensemble(12, B[:3])),
    ("close with an ensemble change", OPEN, OPEN.with_new_ensemble(5, B[3:6]).close(4, 100)),
    (
        "closed: a bookie swapped in place for a new one (re-replication)",
        CLOSED,
        CLOSED.replace(ensembles=(Ensemble(0, (B[0], B[7], B[2])), CLOSED.ensembles[1])),
    ),
    (
        "closed: bookies swapped in two ensembles at once",
        CLOSED,
        CLOSED.replace(ensembles=(Ensemble(0, (B[6], B[1], B[2])), Ensemble(10, (B[3], B[4], B[7])))),
    ),
    (
        "recovery close replaces the last ensemble and appends another (write-back changes)",
        REC,
        REC.replace(
            ensembles=(REC.ensembles[0], Ensemble(10, tuple(B[5:8])), Ensemble(20, tuple(B[:3])))
        ).close(25, 2500),
    ),
]

FORBIDDEN = [
    ("in recovery -> open", REC, OPEN_2ENS),
    ("closed -> open", CLOSED, OPEN_2ENS),
    ("closed -> in recovery", CLOSED, REC),
    ("closed: last_entry_id changes", CLOSED, OPEN_2ENS.close(21, 2000)),
    ("closed: last_entry_id shrinks", CLOSED, OPEN_2ENS.close(19, 2000)),
    ("closed: length changes", CLOSED, OPEN_2ENS.close(20, 1)),
    ("closed: ensemble appended", CLOSED, OPEN_2ENS.with_new_ensemble(30, B[:3]).close(20, 2000)),
    ("closed: last ensemble replaced", CLOSED, OPEN_2ENS.with_new_ensemble(10, B[5:8]).close(20, 2000)),
    (
        "closed: bookies reordered within an ensemble",
        CLOSED,
        CLOSED.replace(ensembles=(Ensemble(0, (B[1], B[0], B[2])), CLOSED.ensembles[1])),
    ),
    (
        "closed: a bookie moved to another position while one is swapped in",
        CLOSED,
        CLOSED.replace(ensembles=(Ensemble(0, (B[2], B[1], B[7])), CLOSED.ensembles[1])),
    ),
    (
        "closed: an ensemble's first entry moved",
        CLOSED,
        CLOSED.replace(ensembles=(CLOSED.ensembles[0], Ensemble(11, tuple(B[3:6])))),
    ),
    (
        "open: a bookie moved within a sealed ensemble",
        OPEN_2ENS,
        OPEN_2ENS.replace(ensembles=(Ensemble(0, (B[1], B[0], B[2])), OPEN_2ENS.ensembles[1])),
    ),
    (
        "open: a sealed ensemble's bookie swapped and an ensemble appended in one write",
        OPEN_2ENS,
        OPEN_2ENS.replace(
            ensembles=(Ensemble(0, (B[0], B[7], B[2])), OPEN_2ENS.ensembles[1])
        ).with_new_ensemble(15, B[:3]),
    ),
    (
        "in recovery: a bookie swapped in a sealed ensemble (the recoverer decides alone)",
        REC,
        REC.replace(ensembles=(Ensemble(0, (B[0], B[7], B[2])), REC.ensembles[1])),
    ),
    ("ensemble removed", OPEN_2ENS, OPEN),
    (
        "earlier ensemble changed",
        OPEN_2ENS,
        OPEN_2ENS.replace(ensembles=(Ensemble(0, (B[1], B[0], B[5])), OPEN_2ENS.ensembles[1])),
    ),
    (
        "last ensemble moved",
        OPEN_2ENS,
        OPEN_2ENS.replace(ensembles=(OPEN_2ENS.ensembles[0], Ensemble(11, tuple(B[3:6])))),
    ),
    (
        "replace last and append while in recovery (only the recovery close may)",
        REC,
        REC.replace(ensembles=(REC.ensembles[0], Ensemble(10, tuple(B[5:8])), Ensemble(20, tuple(B[:3])))),
    ),
    (
        "replace last and append",
        OPEN_2ENS,
        OPEN_2ENS.replace(
            ensembles=(OPEN_2ENS.ensembles[0], Ensemble(10, tuple(B[5:8])), Ensemble(20, tuple(B[:3])))
        ),
    ),
    ("ensemble size changed", OPEN, meta(ensemble_size=4, ensembles=(Ensemble(0, tuple(B[:4])),))),
    ("write quorum changed", OPEN, meta(write_quorum=3)),
    ("ack quorum changed", OPEN, meta(ack_quorum=1)),
    ("ledger id changed", OPEN, meta(ledger_id=8)),
    ("password changed", OPEN, meta(password_digest=password_digest_of(b"other"))),
    ("digest changed", OPEN, meta(digest_type="CRC32")),
    ("ctime changed", OPEN, meta(ctime_ms=1)),
    ("custom metadata changed", OPEN, meta(custom_metadata={})),
]


@pytest.mark.parametrize(("name", "old", "new"), ALLOWED, ids=[c[0] for c in ALLOWED])
def test_transition_allowed(name: str, old: LedgerMetadata, new: LedgerMetadata) -> None:
    check_transition(old, new)


@pytest.mark.parametrize(("name", "old", "new"), FORBIDDEN, ids=[c[0] for c in FORBIDDEN])
def test_transition_forbidden(name: str, old: LedgerMetadata, new: LedgerMetadata) -> None:
    with pytest.raises(MetadataTransitionError):
        check_transition(old, new)


@given(metadatas(), st.integers(-1, 100), st.integers(0, 10**6))
def test_closed_is_final(m: LedgerMetadata, last: int, length: int) -> None:
    closed = m if m.is_closed else m.close(-1, 0)
    check_transition(closed, closed)
    other = m.replace(state=LedgerState.CLOSED, last_entry_id=last, length=length if last >= 0 else 0)
    if (other.last_entry_id, other.length, other.ensembles) != (
        closed.last_entry_id,
        closed.length,
        closed.ensembles,
    ):
        with pytest.raises(MetadataTransitionError):
            check_transition(closed, other)
    for state in (LedgerState.OPEN, LedgerState.IN_RECOVERY):
        with pytest.raises(MetadataTransitionError):
            check_transition(closed, closed.replace(state=state, last_entry_id=-1, length=0))


@given(st.lists(st.sampled_from(["append", "replace", "recover", "close"]), max_size=12))
def test_any_legal_history_passes(ops: list[str]) -> None:
    """A writer/recoverer history built only from the helpers never trips the checker."""
    cur = OPEN
    next_start = 1
    for i, op in enumerate(ops):
        if cur.is_closed:
            break
        if op == "append":
            new = cur.with_new_ensemble(next_start, B[i % 5 : i % 5 + 3])
            next_start += 3
        elif op == "replace":
            new = cur.with_new_ensemble(cur.last_ensemble.first_entry_id, B[(i + 2) % 5 : (i + 2) % 5 + 3])
        elif op == "recover":
            new = cur.with_state(LedgerState.IN_RECOVERY)
        else:
            new = cur.close(next_start - 1, 10 * next_start)
        check_transition(cur, new)
        cur = new
