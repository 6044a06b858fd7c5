"""A restarting bookie or broker waits for its old registration to go as long as that registration's body says
its session was granted (``session_timeout_ms``), at most ``REGISTERED_SESSION_TIMEOUT_MAX_S``: a corrupt or
foreign body saying more (a year, infinity) held the restart, and the bookie registry's lock, that long."""

from __future__ import annotations

import json
from typing import Any

import pytest

from zk.registry import REGISTERED_SESSION_TIMEOUT_MAX_S, SESSION_TIMEOUT_KEY, registered_timeout_s


@pytest.mark.parametrize(
    ("ms", "expected_s"),
    [
        (10_000, 10.0),
        (12_345.5, 12.3455),
        (60_000, 60.0),
        (365 * 86_400_000, REGISTERED_SESSION_TIMEOUT_MAX_S),  # a year
        pytest.param(10**400, REGISTERED_SESSION_TIMEOUT_MAX_S, id="10**400"),  # (no float holds it)
        (float("inf"), REGISTERED_SESSION_TIMEOUT_MAX_S),
        (float("nan"), 0.0),
        (0, 0.0),
        (-5_000, 0.0),
        ("10000", 0.0),
        (True, 0.0),
        (None, 0.0),
        ([10_000], 0.0),
    ],
)
def test_the_registered_session_timeout_is_bounded_and_a_malformed_one_ignored(
    ms: Any, expected_s: float
) -> None:
    assert registered_timeout_s({"host": "h", SESSION_TIMEOUT_KEY: ms}) == pytest.approx(expected_s)


def test_a_body_as_zookeeper_returns_it() -> None:
    assert REGISTERED_SESSION_TIMEOUT_MAX_S == 60.0
    assert registered_timeout_s({"host": "h"}) == 0.0  # an older process's body
    for text in ('{"session_timeout_ms": 1e300}', '{"session_timeout_ms": Infinity}'):
        assert registered_timeout_s(json.loads(text)) == REGISTERED_SESSION_TIMEOUT_MAX_S
