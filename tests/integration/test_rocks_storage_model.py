"""RocksLedgerStorage against the in-memory model (MemoryLedgerStorage), on a real RocksDB: random histories of
writes as a bookie makes them (appends, re-adds from any entry, duplicates within a batch, ledgers interleaved in
one batch, journal replays after a restart; every id, or the ids a bookie of a striped ledger receives: 2 of
every 3, 1 of every 2 or 3, so runs have gaps), deletes and reopenings. After every step each entry reads back as
the model has it, alone and in range reads, however the runs it was written in overlap."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookie.storage import RUN_ENTRIES_MAX, LedgerInfo, MemoryLedgerStorage, RocksLedgerStorage

KEY = b"k" * 20
LEDGERS = (1, 2)
SPAN = 3 * RUN_ENTRIES_MAX  # entry ids 0..SPAN-1: three blocks, so runs start inside and across them


def _entry(lid: int, eid: int) -> bytes:
    """An entry's bytes are fixed by its ids (entries are immutable), and sizes vary."""
    return bytes([lid, eid % 251]) * (1 + eid % 7)


# which ids of a range a write carries: (modulus, residues kept); (1, (0,)) is every id
_STRIPES = ((1, (0,)), (3, (0, 1)), (3, (1, 2)), (3, (0, 2)), (2, (0,)), (2, (1,)), (3, (1,)))
_ranges = st.tuples(
    st.sampled_from(LEDGERS),
    st.integers(0, SPAN - 1),
    st.integers(1, 2 * RUN_ENTRIES_MAX),
    st.sampled_from(_STRIPES),
)
_steps = st.one_of(
    st.tuples(st.just("write"), st.lists(_ranges, min_size=1, max_size=3)),  # one batch of one or more ranges
    st.tuples(st.just("delete"), st.sampled_from(LEDGERS)),
    st.tuples(st.just("reopen"), st.just(0)),
)


def _check(s: RocksLedgerStorage, model: MemoryLedgerStorage) -> None:
    for lid in LEDGERS:
        for eid in range(SPAN):
            s._runs.clear()  # found in the store, not the cache of runs read
            assert s.get_entry(lid, eid) == model.get_entry(lid, eid), (lid, eid)
        for first in range(0, SPAN, 37):
            got = s.get_range(lid, first, SPAN - 1, 1 << 20)
            assert got == model.get_range(lid, first, SPAN - 1, 1 << 20), (lid, first)
            for step in (2, 3, 65):  # every step-th entry (a striped ledger's bookie serving one residue)
                got = s.get_range(lid, first, SPAN - 1, 1 << 20, step)
                assert got == model.get_range(lid, first, SPAN - 1, 1 << 20, step), (lid, first, step)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_steps, min_size=1, max_size=8))
def test_every_history_reads_back_as_the_model(steps: list[tuple[str, object]]) -> None:
    with tempfile.TemporaryDirectory(prefix="rocks-model-", dir=".") as tmp:
        path = Path(tmp) / "db"
        s = RocksLedgerStorage(path, blob_window_s=0.0)
        model = MemoryLedgerStorage()
        try:
            for op, arg in steps:
                if op == "write":
                    rows = [
                        (lid, e, _entry(lid, e))
                        for lid, first, n, (mod, kept) in arg  # type: ignore[attr-defined]
                        for e in range(first, min(SPAN, first + n))
                        if e % mod in kept
                    ]
                    ledgers = [(lid, LedgerInfo(KEY)) for lid in sorted({r[0] for r in rows})]
                    s.write(rows, ledgers)
                    model.write(rows, ledgers)
                elif op == "delete":
                    s.delete_ledger(arg)  # type: ignore[arg-type]
                    model.delete_ledger(arg)  # type: ignore[arg-type]
                else:
                    s.flush()
                    s.close()
                    s = RocksLedgerStorage(path, blob_window_s=0.0)
                _check(s, model)
        finally:
            s.close()
