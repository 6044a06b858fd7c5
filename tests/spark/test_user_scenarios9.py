"""What a Spark user's day found in the topic source: a message sent with a null value (a tombstone). The cluster
of ``test_user_scenarios`` (ZooKeeper, 3 bookies, a broker rolling its ledgers every 20 entries)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.spark import test_user_scenarios as users
from tests.spark.test_user_scenarios import Cluster

pytest.importorskip("pyspark")
pulsar = pytest.importorskip("pulsar")
cluster = users.cluster  # the module's own cluster, built as that module builds it


@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
def test_a_message_sent_with_a_null_value_has_a_null_value(
    cluster: Cluster, spark: Any, batching: bool
) -> None:
    """pulsar-client's send(None) sets the message's null_value (its entry's metadata alone, or its batch entry's
    single-message metadata): the row's value is null, the empty payload beside it b"". Before, a message of its
    own entry read as b"" (only a batched one was null)."""
    topic = f"persistent://public/default/tombstones-{'b' if batching else 's'}"
    client = cluster.client()
    try:
        p = client.create_producer(topic, batching_enabled=batching, batching_max_messages=3)
        sent = [(f"k{i}", None if i % 2 else f"v{i}".encode()) for i in range(6)] + [("empty", b"")]
        for key, value in sent:
            p.send_async(value, None, partition_key=key)
        p.flush()
        p.close()
    finally:
        client.close()
    rows = users.read_all(cluster, spark, len(sent), topic=topic)
    got = [(r["__key"], None if r["value"] is None else bytes(r["value"])) for r in rows]
    assert got == sent
    if batching:
        assert any(r["__batchIndex"] > 0 for r in rows)


@pytest.mark.parametrize(
    "given", ["*-orders", "public/default/*-orders", "persistent://public/default/*-orders"]
)
def test_a_glob_for_topics_pattern_is_refused_naming_the_option(given: str) -> None:
    """A glob's leading '*' is no regular expression; after the namespace's prefix it read as a repeated '/',
    which no topic's name matches: the query read nothing, quietly. The error's position is in the topic part
    as given (it was in the full name the source built: 'orders-[' gave 'position 35')."""
    from spark._topic_options import TopicOptionError, parse_topic_options

    with pytest.raises(
        TopicOptionError, match=r"option 'topicsPattern': not a valid regular expression: nothing"
    ):
        parse_topic_options({"topicspattern": given}, streaming=False)
    with pytest.raises(TopicOptionError, match=r"at position 7 \(in 'orders-\['\)"):
        parse_topic_options({"topicspattern": given.replace("*-orders", "orders-[")}, streaming=False)
