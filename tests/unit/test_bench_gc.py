"""``bench ledger``'s view of the client process's garbage collector (``--gc-threshold``, ``gc_meter``)."""

from __future__ import annotations

import argparse
import gc

import pytest

from ledgerstore.bench_ledger import gc_meter, parse_gc_threshold


def test_gc_meter_counts_the_collections_of_its_block_and_removes_its_callback() -> None:
    callbacks = list(gc.callbacks)
    with gc_meter() as m:
        gc.collect()
        gc.collect(0)
        m["units"] = 4
    assert gc.callbacks == callbacks
    assert "units" not in m
    assert m["client_gc_full_collections"] >= 1
    assert m["client_gc_collections"] >= 2
    assert m["client_gc_cpu_ms"] >= 0
    assert m["gc_us_per_entry_client"] == pytest.approx(
        1000 * m["client_gc_cpu_ms"] / 4, abs=13
    )  # ms rounded to 0.1


def test_gc_meter_sees_nothing_of_collections_outside_its_block() -> None:
    with gc_meter() as m:
        m["units"] = 1
    gc.collect()
    assert m["client_gc_collections"] == 0 and m["client_gc_full_collections"] == 0


@pytest.mark.parametrize(
    ("text", "want"), [("20000", (20000,)), ("20000,20", (20000, 20)), ("0,10,10", (0, 10, 10))]
)
def test_gc_threshold_takes_one_to_three_integers(text: str, want: tuple[int, ...]) -> None:
    assert parse_gc_threshold(text) == want


@pytest.mark.parametrize("text", ["", "x", "1,2,3,4", "-1", "700,,10"])
def test_gc_threshold_refuses_anything_else(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_gc_threshold(text)
