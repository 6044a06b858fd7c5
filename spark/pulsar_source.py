"""The ``topic`` source under pulsar-spark's short name: ``spark.read.format("pulsar")`` and
``spark.readStream.format("pulsar")`` are :mod:`spark.topic_source`, with pulsar-spark's option names
(:mod:`spark._pulsar_options`) as the ``topic`` name takes them too."""

from __future__ import annotations

from spark.topic_source import TopicDataSource

__all__ = ["PulsarDataSource"]


class PulsarDataSource(TopicDataSource):
    """``format("pulsar")``: the ``topic`` source, for jobs written for pulsar-spark."""

    @classmethod
    def name(cls) -> str:
        return "pulsar"
