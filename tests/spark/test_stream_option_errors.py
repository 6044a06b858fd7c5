"""A stream whose options are refused only when it starts (``endingOffsets`` is for batch queries; the
DataFrame's definition cannot tell a stream from a batch) fails naming the option: PySpark's streaming runner
replaced the error with its own UnboundLocalError ('reader') when the source refused to make a reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


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
    from pyspark.errors import StreamingQueryException

    df = (
        spark.readStream.format("topic")
        .option("zk", "127.0.0.1:1")  # never reached: the options are refused first
        .option("topic", "t")
        .option(option, value)
        .load()
    )
    q = (
        df.writeStream.format("parquet")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start(str(tmp_path / "out"))
    )
    with pytest.raises(StreamingQueryException) as e:
        q.awaitTermination(120)
    q.stop()
    assert named in str(e.value) and "UnboundLocalError" not in str(e.value), str(e.value)[-2000:]
