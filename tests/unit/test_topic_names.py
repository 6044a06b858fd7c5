"""Topic names: parsing, partitions and the managed-ledger (znode) name."""

from __future__ import annotations

import pytest

from topic_broker.names import InvalidTopicName, TopicName


@pytest.mark.parametrize(
    ("given", "full"),
    [
        ("t", "persistent://public/default/t"),
        ("my-tenant/ns1/orders", "persistent://my-tenant/ns1/orders"),
        ("persistent://a/b/c", "persistent://a/b/c"),
        ("persistent://public/default/with space", "persistent://public/default/with space"),
    ],
)
def test_parse_accepts_full_and_short_forms(given: str, full: str) -> None:
    assert str(TopicName.parse(given)) == full
    assert TopicName.parse(full) == TopicName.parse(given)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "a/b",
        "persistent://a/b",
        "persistent://a//c",
        "persistent:///b/c",
        "a/b/c/d",
        "a/b/",
        "x://a/b/c",
        "a/b/..",
        "a b/ns/t",
        "t\x00",
        "persistent://\U0001d400/ns/t",  # ZooKeeper refuses a znode name outside the BMP (a 500 creating it)
        "persistent://public/d\u00e9faut/t",  # Pulsar's \w is ASCII's
    ],
)
def test_parse_rejects_malformed_names(bad: str) -> None:
    with pytest.raises(InvalidTopicName):
        TopicName.parse(bad)


def test_non_persistent_topics_are_refused_with_a_clear_error() -> None:
    with pytest.raises(InvalidTopicName, match="non-persistent topics are not supported"):
        TopicName.parse("non-persistent://public/default/t")


def test_partitions_round_trip_to_their_base() -> None:
    t = TopicName.parse("orders")
    p3 = t.partition(3)
    assert str(p3) == "persistent://public/default/orders-partition-3"
    assert p3.is_partition and p3.partition_index == 3 and p3.base == t
    assert not t.is_partition and t.partition_index == -1 and t.base == t
    assert TopicName.parse("x-partition-abc").partition_index == -1
    assert TopicName.parse("x-partition-01").partition_index == -1
    with pytest.raises(InvalidTopicName):
        p3.partition(1)
    with pytest.raises(InvalidTopicName):
        t.partition(-1)


def test_ml_name_is_one_percent_encoded_znode_component() -> None:
    assert TopicName.parse("t").ml_name == "public/default/persistent/t"
    assert TopicName.parse("a/b/x y:z%").ml_name == "a/b/persistent/x%20y%3Az%25"
    assert TopicName.parse("a/b/c").namespace_name == "a/b"
