"""The jobs' charts on empty and tiny data: a panel with nothing to draw says so (before: bare axes, ticks of
-0.04 to 0.04 entries and a legend of nothing), and a topic's few minutes of messages get one tick per minute
(before: half-minute ticks labelled in minutes, each label twice). No Spark: the figures the jobs save."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("matplotlib")

MINUTE = 29_400_000  # 2025-11-24 16:00 UTC, in minutes


def _panels(fig: Any) -> list[tuple[str, list[str], list[float]]]:
    """Each axes' (text drawn in it, tick labels of x, tick positions of y)."""
    fig.canvas.draw()
    out = []
    for ax in fig.axes:
        texts = " ".join(t.get_text() for t in ax.texts)
        out.append((texts, [t.get_text() for t in ax.get_xticklabels()], list(ax.get_yticks())))
    return out


def _close(fig: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_empty_job_charts_say_there_is_nothing_to_draw() -> None:
    from spark.jobs import entry_sizes, ledger_health, topic_volume

    cases = [
        (entry_sizes._figure([], []), ["no entries", "no ledgers"]),
        (ledger_health._figure([], []), ["no ledgers", "no entry replicas"]),
        (topic_volume._figure([], [], []), ["no messages"] * 3),
    ]
    for fig, said in cases:
        try:
            panels = _panels(fig)
            assert [p[0] for p in panels] == said
            assert all(p[2] == [] for p in panels)  # no y ticks (before: -0.04 ... 0.04)
            assert all(ax.get_legend() is None for ax in fig.axes)
        finally:
            _close(fig)


def test_a_topic_without_event_times_and_a_minute_of_messages() -> None:
    from spark.jobs import topic_volume

    topic = "persistent://public/default/t"
    row = [topic, 300, 28_800, 1, 300.0, 96, 96, 96, 96, 0, 0, None, None, None, None]
    fig = topic_volume._figure([row], [{"topic": topic, "minute": MINUTE, "messages": 300}], [])
    try:
        (volume, sizes, lag) = _panels(fig)
        assert volume[0] == "" and sizes[0] == ""  # drawn
        assert lag[0] == "no message has an event time" and lag[2] == []
        labels = [x for x in volume[1] if x]
        assert len(labels) == len(set(labels)) >= 3  # one tick a minute (before: each label twice)
    finally:
        _close(fig)
