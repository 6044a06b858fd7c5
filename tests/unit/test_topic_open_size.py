"""The size a topic query estimates for an open ledger from its newest entry's reply header (pure)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ledger_client.errors import ProtocolViolationError
from spark.topic_source import _open_size


@dataclass
class _Read:
    """What ``_open_size`` reads of a ledger handle after ``read_last_add_confirmed``."""

    tail_length: tuple[int, int] | None
    length: int = 0
    ledger_id: int = 7


def test_the_size_is_the_average_entry_size_by_the_header_times_the_entries() -> None:
    assert _open_size(_Read((4, 500)), 9) == 1000
    assert _open_size(_Read(None), 9) == 0
    assert _open_size(_Read((4, 500), length=123), 9) == 123


def test_a_header_with_entry_id_minus_one_is_a_clear_error_not_a_division_by_zero() -> None:
    with pytest.raises(ProtocolViolationError, match=r"ledger 7: .* corrupt header: entry id -1"):
        _open_size(_Read((-1, 500)), 9)
