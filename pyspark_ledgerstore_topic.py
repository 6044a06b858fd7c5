"""Makes ``spark.read.format("topic")`` work with no ``register()`` call: PySpark imports every top-level
``pyspark_*`` module at session start and registers its ``DefaultSource`` (see :mod:`spark.topic_source`)."""

from spark.topic_source import TopicDataSource as DefaultSource

__all__ = ["DefaultSource"]
