"""A broker's log about its bookies (topic_broker/bookie_supply.py) and the rate-limited log lines it shares with
the bookie's disk-full checkpoints and the ZooKeeper client's retries (zk/ratelog.py), on a fake clock."""

from __future__ import annotations

import logging

import pytest

from topic_broker.bookie_supply import BookieSupply
from zk.ratelog import LOG_EVERY_S, RateLimitedLog, RepeatedLinesFilter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_rate_limited_line_comes_at_once_then_once_per_interval_and_at_once_after_a_reset(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    lines = RateLimitedLog(logging.getLogger("t"), 60, clock=clock)
    with caplog.at_level(logging.INFO, "t"):
        assert lines.warning("a %d", 1)
        clock.now += 59.9
        assert not lines.warning("a %d", 2)
        clock.now += 0.1
        assert lines.warning("a %d", 3)
        lines.said()  # said another way: the interval counts from now
        clock.now += 30
        assert not lines.log(logging.INFO, "b")
        lines.reset()
        assert lines.log(logging.INFO, "c")
    assert [r.getMessage() for r in caplog.records] == ["a 1", "a 3", "c"]


def test_a_loop_that_keeps_trying_logs_its_failures_once_per_interval_and_again_at_once_after_a_success(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """RateLimitedLog.catching, the pass of AutoRecovery's auditor and replication worker loops: the failures
    it catches are one line per interval, 'msg: <error>'; a pass without one resets it; others pass through."""
    clock = Clock()
    failing = RateLimitedLog(logging.getLogger("t"), 60, clock=clock)

    def one_pass(outcome: BaseException | None) -> str:
        result = "failed"
        with failing.catching((OSError, ValueError), "worker %s", "w1"):
            if outcome is not None:
                raise outcome
            result = "done"
        return result

    with caplog.at_level(logging.INFO, "t"):
        assert one_pass(OSError("ZooKeeper away")) == "failed"
        for _ in range(59):  # a pass a second, all failing
            clock.now += 1
            one_pass(ValueError("still away"))
        clock.now += 1
        one_pass(OSError("away a minute"))
        assert one_pass(None) == "done"
        clock.now += 1
        one_pass(OSError("away again"))  # at once: the success in between ended the condition
        with pytest.raises(KeyError):
            one_pass(KeyError("a bug"))  # not one of the errors: not swallowed
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "worker w1: ZooKeeper away"),
        (logging.WARNING, "worker w1: away a minute"),
        (logging.WARNING, "worker w1: away again"),
    ]


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "topic_broker.bookie_supply"]


def test_a_broker_short_of_bookies_says_so_once_then_once_a_minute_and_once_when_they_come(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    supply = BookieSupply("b1", 3, clock=clock)
    assert not supply.short  # unknown until the registry answers
    with caplog.at_level(logging.INFO, "topic_broker.bookie_supply"):
        supply.remind()
        assert _lines(caplog) == []
        supply.update(0)
        assert supply.short
        (waiting,) = _lines(caplog)
        assert "waiting for bookies: 0 writable, a new ledger needs 3 (--ensemble-size)" in waiting
        for _ in range(int(LOG_EVERY_S) - 1):  # the broker's tick, every second
            clock.now += 1
            supply.remind()
            supply.update(1)  # one came, still short: no new line
        assert len(_lines(caplog)) == 1
        clock.now += 1
        supply.remind()
        assert len(_lines(caplog)) == 2 and "waiting for bookies: 1 writable" in _lines(caplog)[-1]
        assert "the broker has 1 writable bookies, a new ledger needs 3" in supply.refusal()
        assert supply.refusal().startswith("NOT_ENOUGH_BOOKIES")
        supply.update(3)
        assert not supply.short
        assert "bookies: 3 writable now, a new ledger needs 3" in _lines(caplog)[-1]
        supply.update(4)
        supply.remind()
        assert len(_lines(caplog)) == 3
        supply.update(2)  # short again: said at once, not a minute after the last waiting line
        assert len(_lines(caplog)) == 4 and "waiting for bookies: 2 writable" in _lines(caplog)[-1]


def test_repeated_lines_of_a_kind_pass_once_per_interval_saying_how_many_were_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """kazoo's 'Connection dropped: ...' at each retry (about one a second for as long as ZooKeeper is away)."""
    clock = Clock()
    logger = logging.getLogger("t.kazoo")
    logger.addFilter(RepeatedLinesFilter(LOG_EVERY_S, clock=clock))
    with caplog.at_level(logging.INFO, "t.kazoo"):
        for i in range(120):
            logger.warning("Connection dropped: %s", f"refused {i}")
            if i == 5:
                logger.warning("Transition to CONNECTING")  # another kind: its own interval
            clock.now += 1
    assert [r.getMessage() for r in caplog.records] == [
        "Connection dropped: refused 0",
        "Transition to CONNECTING",
        "Connection dropped: refused 60 (59 more like it in the last 60 s not shown)",
    ]
