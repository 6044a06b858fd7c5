"""``topic-volume``: per topic, message volume per minute, message size percentiles, top keys, and the lag from
a message's event time to its publish time.

Reads the ``topic`` source (messages straight from the bookies, batch entries unpacked). A partitioned topic is
reported under its base name (its partitions summed). Minutes are publish-time minutes in UTC. Size is the
value's length (0 for a null value). Lag is ``publish time - event time`` in ms, over the messages that carry an
event time (negative when a producer stamps event times ahead of the broker's clock). Percentiles are Spark's
``percentile_approx`` (accuracy 10,000). Only the summaries come back to the driver.

Tables: ``Topics`` (one row each), ``Messages per minute`` (each topic's last :data:`MINUTES_SHOWN` minutes),
``Top keys`` (each topic's :data:`TOP_KEYS` most frequent keys). Chart: messages per minute per topic, size
percentiles per topic, lag distribution.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from spark.jobs.common import (
    Job,
    JobOptions,
    JobResult,
    Table,
    empty_panel,
    new_figure,
    save_figure,
    topic_frame,
)

__all__ = ["JOB", "MINUTES_SHOWN", "TOP_KEYS", "run"]

_QUANTILES = [0.5, 0.9, 0.99]
_ACCURACY = 10_000
#: per-minute rows kept per topic (the latest)
MINUTES_SHOWN = 60
#: keys listed per topic
TOP_KEYS = 5
_PARTITION_SUFFIX = r"-partition-\d+$"


def _minute_label(minute: int) -> str:
    return datetime.fromtimestamp(minute * 60, UTC).strftime("%Y-%m-%d %H:%M")


def _quantiles(q: Any) -> list[Any]:
    return list(q) if q else [None, None, None]


def run(session: Any, opts: JobOptions) -> JobResult:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    raw = topic_frame(session, opts)
    msgs = raw.select(
        F.regexp_replace("__topic", _PARTITION_SUFFIX, "").alias("topic"),
        F.floor(F.unix_micros("__publishTime") / 60_000_000).cast("long").alias("minute"),
        F.coalesce(F.length("value"), F.lit(0)).alias("size"),
        F.col("__key").alias("key"),
        ((F.unix_micros("__publishTime") - F.unix_micros("__eventTime")) / 1000.0).alias("lag_ms"),
    ).cache()
    try:
        per_topic = (
            msgs.groupBy("topic")
            .agg(
                F.count("*").alias("messages"),
                F.sum("size").alias("bytes"),
                F.countDistinct("minute").alias("minutes"),
                F.min("minute").alias("first"),
                F.max("minute").alias("last"),
                F.percentile_approx("size", _QUANTILES, _ACCURACY).alias("size_q"),
                F.max("size").alias("size_max"),
                F.count("lag_ms").alias("with_event_time"),
                F.percentile_approx("lag_ms", _QUANTILES, _ACCURACY).alias("lag_q"),
                F.max("lag_ms").alias("lag_max"),
                F.countDistinct("key").alias("keys"),
            )
            .orderBy("topic")
            .collect()
        )
        per_minute = (
            msgs.groupBy("topic", "minute")
            .agg(
                F.count("*").alias("messages"),
                F.sum("size").alias("bytes"),
                F.percentile_approx("size", _QUANTILES, _ACCURACY).alias("size_q"),
                F.percentile_approx("lag_ms", [0.5], _ACCURACY).alias("lag_q"),
            )
            .withColumn("recent", F.row_number().over(Window.partitionBy("topic").orderBy(F.desc("minute"))))
            .where(F.col("recent") <= MINUTES_SHOWN)
            .orderBy("topic", "minute")
            .collect()
        )
        top_keys = (
            msgs.where(F.col("key").isNotNull())
            .groupBy("topic", "key")
            .agg(F.count("*").alias("messages"), F.sum("size").alias("bytes"))
            .withColumn(
                "rank",
                F.row_number().over(Window.partitionBy("topic").orderBy(F.desc("messages"), F.asc("key"))),
            )
            .where(F.col("rank") <= TOP_KEYS)
            .orderBy("topic", "rank")
            .collect()
        )
        lag_hist = (
            msgs.where(F.col("lag_ms").isNotNull())
            .select(_lag_bucket(F.col("lag_ms")).alias("b"))
            .groupBy("b")
            .count()
            .orderBy("b")
            .collect()
        )
    finally:
        msgs.unpersist()

    messages_of = {r["topic"]: r["messages"] for r in per_topic}
    topic_rows = []
    for r in per_topic:
        sp50, sp90, sp99 = _quantiles(r["size_q"])
        lp50, lp90, lp99 = _quantiles(r["lag_q"])
        span = r["last"] - r["first"] + 1
        topic_rows.append(
            [
                r["topic"],
                r["messages"],
                r["bytes"] or 0,
                r["minutes"],
                round(r["messages"] / span, 1),
                sp50,
                sp90,
                sp99,
                r["size_max"],
                r["keys"],
                r["with_event_time"],
                lp50,
                lp90,
                lp99,
                r["lag_max"],
            ]
        )
    for t in _named_topics(opts):  # named but no message read: a row of zeros, not no row
        if t not in messages_of:
            topic_rows.append([t, 0, 0, 0, 0.0, None, None, None, None, 0, 0, None, None, None, None])
    topic_rows.sort(key=lambda row: row[0])
    minute_rows = []
    for r in per_minute:
        p50, _, p99 = _quantiles(r["size_q"])
        (lag50,) = r["lag_q"] or [None]
        minute_rows.append(
            [r["topic"], _minute_label(r["minute"]), r["messages"], r["bytes"] or 0, p50, p99, lag50]
        )
    key_rows = [
        [
            r["topic"],
            r["key"],
            r["messages"],
            r["bytes"] or 0,
            100.0 * r["messages"] / messages_of[r["topic"]],
        ]
        for r in top_keys
    ]
    result = JobResult(
        job="topic-volume",
        tables=[
            Table(
                "Topics (sizes in bytes, lag = publish - event time in ms)",
                [
                    "topic",
                    "messages",
                    "bytes",
                    "minutes",
                    "msgs/min",
                    "size p50",
                    "size p90",
                    "size p99",
                    "size max",
                    "keys",
                    "with event time",
                    "lag p50",
                    "lag p90",
                    "lag p99",
                    "lag max",
                ],
                topic_rows,
            ),
            Table(
                f"Messages per minute (UTC, each topic's last {MINUTES_SHOWN} minutes)",
                ["topic", "minute", "messages", "bytes", "size p50", "size p99", "lag p50"],
                minute_rows,
            ),
            Table(
                f"Top keys (each topic's {TOP_KEYS} most frequent)",
                ["topic", "key", "messages", "bytes", "share %"],
                key_rows,
            ),
        ],
    )
    if not messages_of:
        result.notes.append("no messages in the selected topics")
    shown = {r[0]: r[3] for r in topic_rows}
    cut = [t for t, n in shown.items() if n > MINUTES_SHOWN]
    if cut:
        result.notes.append(
            f"per-minute rows of {', '.join(cut)} start {MINUTES_SHOWN} minutes before the last one"
        )
    hist = [(int(r["b"]), int(r["count"])) for r in lag_hist]
    result.chart = save_figure(
        _figure([r for r in topic_rows if r[1]], per_minute, hist), opts.out_dir / "topic-volume.png"
    )
    return result


def _named_topics(opts: JobOptions) -> tuple[str, ...]:
    """The full names of the topics ``--topics`` names (none for a pattern)."""
    from spark._topic_options import parse_topic_options

    if not opts.topics:
        return ()
    return parse_topic_options(opts.topic_source_options(), streaming=False).topics


def _lag_bucket(lag: Any) -> Any:
    """Signed power-of-two buckets of |lag| in ms: 0 for |lag| < 1, else ±(floor(log2 |lag|) + 1)."""
    from pyspark.sql import functions as F

    mag = F.floor(F.log2(F.abs(lag))).cast("int") + 1
    return F.when(F.abs(lag) < 1, F.lit(0)).otherwise(F.when(lag < 0, -mag).otherwise(mag))


def _bucket_label(b: int) -> str:
    if b == 0:
        return "<1"
    lo = 1 << (abs(b) - 1)
    return f"{'-' if b < 0 else ''}{lo}"


def _figure(topic_rows: list[list[Any]], per_minute: list[Any], hist: list[tuple[int, int]]) -> Any:
    fig, (left, middle, right) = new_figure(3, "topic volume")
    topics = [r[0] for r in topic_rows]
    short = {t: t.removeprefix("persistent://") for t in topics}
    shown = topics[:10]
    for t in shown:
        pts = [(r["minute"], r["messages"]) for r in per_minute if r["topic"] == t]
        if pts:
            left.plot(
                [datetime.fromtimestamp(m * 60, UTC) for m, _ in pts],
                [n for _, n in pts],
                marker="o" if len(pts) < 30 else None,
                label=short[t],
            )
    from datetime import timedelta

    from matplotlib.dates import DateFormatter, MinuteLocator

    left.xaxis.set_major_formatter(DateFormatter("%m-%d %H:%M"))
    minutes = sorted({r["minute"] for r in per_minute})
    if minutes and minutes[-1] - minutes[0] < 4:  # a few minutes: keep the axis minutes wide, not years
        lo = datetime.fromtimestamp(minutes[0] * 60, UTC) - timedelta(minutes=2)
        hi = datetime.fromtimestamp(minutes[-1] * 60, UTC) + timedelta(minutes=2)
        left.set_xlim(lo, hi)
        left.xaxis.set_major_locator(MinuteLocator())  # (half-minute ticks read as minutes, each twice)
    left.set_ylim(bottom=0)
    left.set_xlabel("publish minute (UTC)")
    left.set_ylabel("messages per minute")
    left.set_title("volume" + (f" (first {len(shown)} of {len(topics)} topics)" if len(topics) > 10 else ""))
    left.tick_params(axis="x", labelrotation=30)
    if shown:
        left.legend(fontsize="small")
    xs = range(len(topic_rows))
    for k, (name, col) in enumerate((("p50", 5), ("p90", 6), ("p99", 7))):
        middle.bar(
            [x + (k - 1) * 0.27 for x in xs], [r[col] or 0 for r in topic_rows], width=0.27, label=name
        )
    middle.set_xticks(
        list(xs),
        [short[t] for t in topics] if len(topics) <= 12 else [""] * len(topics),
        rotation=30,
        ha="right",
    )
    middle.set_ylabel("message size, bytes")
    middle.set_title("size percentiles per topic")
    if topic_rows:
        middle.legend()
    right.bar([_bucket_label(b) for b, _ in hist], [n for _, n in hist], color="tab:purple")
    right.set_xlabel("publish - event time, ms (power-of-two buckets, lower bound)")
    right.set_ylabel("messages")
    right.set_title("event-to-publish lag")
    right.tick_params(axis="x", labelrotation=45)
    if not left.lines:
        empty_panel(left, "no messages")
    if not topic_rows:
        empty_panel(middle, "no messages")
    if not hist:
        empty_panel(right, "no message has an event time" if topic_rows else "no messages")
    return fig


JOB = Job(
    "topic-volume",
    "per topic: messages per minute, size percentiles, top keys, publish-to-event-time lag",
    run,
)
