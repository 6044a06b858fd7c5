"""PySpark data sources over ledgerstore, read straight from the bookies (no broker in the path).

    from pyspark.sql import SparkSession
    import spark as ledgerstore_spark

    session = SparkSession.builder.master("local[2]").getOrCreate()
    ledgerstore_spark.register(session)          # registers the "ledger", "topic" and "pulsar" sources
    df = (session.read.format("ledger").option("zk", "127.0.0.1:2181").option("ledgers", "all")
          .option("password", "secret").load())

Sources: ``ledger`` (:mod:`spark.ledger_source`, options in :mod:`spark.options`) and ``topic``
(:mod:`spark.topic_source`: a topic's managed ledgers, batch and streaming; also registered as ``pulsar``, taking
pulsar-spark's option names, :mod:`spark.pulsar_source`). Analyses users run: :mod:`spark.jobs`
(``ledgerstore spark JOB``).

Executors import this package (and ``ledger_client``, ``zk``, ``bookie``) to read: install ledgerstore in the
Python that the executors run (``PYSPARK_PYTHON`` / ``spark.pyspark.python``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(session: Any) -> None:
    """Register ledgerstore's data sources (``ledger``, ``topic`` and ``pulsar``, the topic source under
    pulsar-spark's name) with a ``SparkSession`` (idempotent)."""
    from spark.ledger_source import LedgerDataSource
    from spark.pulsar_source import PulsarDataSource
    from spark.topic_source import TopicDataSource

    session.dataSource.register(LedgerDataSource)
    session.dataSource.register(TopicDataSource)
    session.dataSource.register(PulsarDataSource)
