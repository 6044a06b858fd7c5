"""A misspelt option name fails when the DataFrame is defined, naming it and the option it most likely
misspells (Spark hands the names over lower-cased: 'startingoffset' for ``startingOffset``)."""

from __future__ import annotations

from typing import Any

import pytest

from spark._topic_options import TopicOptionError, parse_topic_options
from spark.options import LedgerOptionError, parse_ledger_options


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("startingOffset", "startingOffsets"),
        ("entriesPerPartiton", "entriesPerPartition"),
        ("failOnDatLoss", "failOnDataLoss"),
        ("topicPattern", "topicsPattern"),
        ("maxEntriesPerTriger", "maxEntriesPerTrigger"),
        ("subscription", "subscriptionName"),
    ],
)
def test_a_topic_option_typo_names_the_option_it_misspells(typo: str, meant: str) -> None:
    with pytest.raises(TopicOptionError, match=f"'{typo.lower()}': unknown option; did you mean '{meant}'"):
        parse_topic_options({"topic": "t", typo.lower(): "1"}, streaming=True)


def test_a_ledger_option_typo_names_the_option_it_misspells_and_a_stranger_only_the_known_ones() -> None:
    with pytest.raises(LedgerOptionError, match="'ledger': unknown option; did you mean 'ledgers'"):
        parse_ledger_options({"ledger": "1"})
    with pytest.raises(LedgerOptionError, match="'service.url': unknown option; known options: zk, ") as e:
        parse_ledger_options({"service.url": "pulsar://127.0.0.1:6650"})
    assert "did you mean" not in str(e.value)


def test_spark_refuses_the_typo_when_the_dataframe_is_defined(spark: Any) -> None:
    r = spark.read.format("topic").option("topic", "t").option("startingOffset", "earliest")
    with pytest.raises(
        Exception, match="option 'startingoffset': unknown option; did you mean 'startingOffsets'"
    ):
        r.load()
    r = spark.read.format("ledger").option("maxRecordsPerBach", "10")
    with pytest.raises(
        Exception, match="option 'maxrecordsperbach': unknown option; did you mean 'maxRecordsPerBatch'"
    ):
        r.load()
