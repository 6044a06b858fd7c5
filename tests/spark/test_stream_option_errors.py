"""A stream whose options are refused only when it starts (``endingOffsets`` is for batch queries; the
DataFrame's definition cannot tell a stream from a batch) fails naming the option: PySpark's streaming runner
replaced the error with its own UnboundLocalError ('reader') when the source refused to make a reader. A stream of
the batch-only ``ledger`` source says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def stream_error(df: Any, tmp_path: Path) -> str:
    """Run the stream with AvailableNow to its failure: the error's text."""
    from pyspark.errors import StreamingQueryException

    q = (
        df.writeStream.format("parquet")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start(str(tmp_path / "out"))
    )
    with pytest.raises(StreamingQueryException) as e:
        q.awaitTermination(120)
    q.stop()
    return str(e.value)


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("endingOffsets", "latest", "option 'endingOffsets': is for batch queries only"),
        ("endingTime", "1700000000000", "option 'endingTime': is for batch queries only"),
    ],
)
def test_a_batch_only_option_on_a_stream_fails_naming_it(
    spark: Any, tmp_path: Path, option: str, value: str, named: str
) -> None:
    df = (
        spark.readStream.format("topic")
        .option("zk", "127.0.0.1:1")  # never reached: the options are refused first
        .option("topic", "t")
        .option(option, value)
        .load()
    )
    message = stream_error(df, tmp_path)
    assert named in message and "UnboundLocalError" not in message, message[-2000:]


def test_a_stream_of_the_ledger_source_is_refused_saying_why(spark: Any, tmp_path: Path) -> None:
    """``readStream.format("ledger")``: the source reads batches only; the query said only UnboundLocalError."""
    message = stream_error(spark.readStream.format("ledger").option("zk", "127.0.0.1:1").load(), tmp_path)
    assert "the ledger source reads batches only" in message and "UnboundLocalError" not in message, message
