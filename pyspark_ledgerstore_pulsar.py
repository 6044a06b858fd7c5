"""Makes ``spark.read.format("pulsar")`` work with no ``register()`` call, as ``format("topic")`` does
(:mod:`pyspark_ledgerstore_topic`): the ``topic`` source under pulsar-spark's short name (see
:mod:`spark.pulsar_source`)."""

from spark.pulsar_source import PulsarDataSource as DefaultSource

__all__ = ["DefaultSource"]
