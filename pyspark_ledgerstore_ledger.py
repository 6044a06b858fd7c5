"""Makes ``spark.read.format("ledger")`` work with no ``register()`` call: PySpark imports every top-level
``pyspark_*`` module at session start and registers its ``DefaultSource`` (see :mod:`spark.ledger_source`)."""

from spark.ledger_source import LedgerDataSource as DefaultSource

__all__ = ["DefaultSource"]
