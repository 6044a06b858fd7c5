"""One local[2] SparkSession for every Spark test (starting one takes ~5 s and ~0.5 GiB)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

#: ledgerstore's credentials in the environment (docs/operations.md, "Security"). The session's JVM, and the
#: Python workers it starts to plan and read queries, begin without them, as a cluster's executors do unless
#: a job passes them on: the container tier's session fixtures set some in this process for its own cluster.
CREDENTIAL_VARS = (
    "LEDGERSTORE_ZK_AUTH",
    "LEDGERSTORE_ZK_AUTH_FILE",
    "LEDGERSTORE_AUTH_TOKEN",
    "LEDGERSTORE_AUTH_TOKEN_FILE",
)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    import spark as ledgerstore_spark

    with pytest.MonkeyPatch.context() as mp:  # the JVM takes the environment it starts with
        for var in CREDENTIAL_VARS:
            mp.delenv(var, raising=False)
        session = (
            SparkSession.builder.master("local[2]")
            .appName("ledgerstore-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.driver.memory", "512m")
            .getOrCreate()
        )
    session.sparkContext.setLogLevel("ERROR")
    ledgerstore_spark.register(session)
    yield session
    session.stop()
