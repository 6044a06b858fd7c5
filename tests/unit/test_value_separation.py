"""ValueSeparation: when RocksDB keeps entries in blob files (pure decisions, explicit clock)."""

from __future__ import annotations

import pytest

from bookie.storage import ValueSeparation


def test_auto_switches_off_after_two_quiet_windows_and_on_at_the_first_second_ledger() -> None:
    v = ValueSeparation("auto", window_s=1.0)
    assert v.enabled  # interleaving is assumed until seen otherwise
    assert v.observe([7], 0.0) is None
    assert v.observe([7], 0.5) is None
    assert v.observe([7], 1.0) is None  # one quiet window is not enough
    assert v.observe([7], 2.1) is False  # the second: one ledger at a time
    assert not v.enabled and v.switches == 1
    assert v.observe([7], 2.2) is None
    assert v.observe([8], 2.3) is True  # a second ledger in the window: on at once, not at the window's end
    assert v.enabled and v.switches == 2
    assert v.observe([8], 3.4) is None  # the window that saw two ledgers does not count as quiet
    assert v.observe([8], 4.5) is None
    assert v.observe([8], 5.6) is False


def test_auto_stays_on_while_ledgers_interleave() -> None:
    v = ValueSeparation("auto", window_s=1.0)
    for i in range(50):
        assert v.observe([1, 2], i * 0.3) is None
    assert v.enabled and v.switches == 0


def test_a_window_alternating_between_ledgers_is_not_quiet() -> None:
    v = ValueSeparation("auto", window_s=1.0)
    t = 0.0
    for i in range(30):  # one ledger per write, but two per window
        assert v.observe([i % 2], t) is None
        t += 0.4
    assert v.enabled


def test_writes_without_entries_change_nothing_and_fixed_modes_never_switch() -> None:
    v = ValueSeparation("auto", window_s=1.0)
    for t in range(5):
        v.observe([], float(t))
    assert not v.enabled  # quiet windows: nothing interleaved
    for mode, enabled in (("on", True), ("off", False)):
        v = ValueSeparation(mode, window_s=0.0)
        for t in range(10):
            assert v.observe([t], float(t)) is None
            assert v.observe([5], float(t)) is None
        assert v.enabled is enabled and v.switches == 0
    with pytest.raises(ValueError, match="auto, on, off"):
        ValueSeparation("sometimes")
