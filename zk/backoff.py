"""The pauses of a retry loop that backs off: the first, then each twice the one before, up to a longest."""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["backoff"]


def backoff(first_s: float, longest_s: float) -> Iterator[float]:
    """``first_s``, then each pause twice the one before, never more than ``longest_s``; endless (a loop that
    gives up says when: after a number of tries, past a deadline, or once the process stops)."""
    if not 0 < first_s <= longest_s:
        raise ValueError(f"backoff needs 0 < first_s <= longest_s, not {first_s} and {longest_s}")
    pause = first_s
    while True:
        yield pause
        pause = min(pause * 2, longest_s)
