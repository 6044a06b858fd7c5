"""A namespace's deduplication policy as stored in its znode: set (true or false) or not set (null), and the
false of a znode written before the policy could be unset, which meant not set."""

from __future__ import annotations

from zk.managed_ledgers import NamespacePolicies


def test_a_namespace_znode_written_before_dedup_could_be_unset_reads_its_false_as_not_set() -> None:
    """Before 556f6c7 every namespace's znode held ``"deduplication_enabled": false`` unless it was turned on
    (false was the never-set value): read as false now, deduplication went off, on a broker whose default is
    on, for every namespace made before (public/default among them). It is read as not set; true stays true."""
    legacy = {
        "retention_time_minutes": 0,
        "retention_size_mb": 0,
        "schema_compatibility_strategy": "UNDEFINED",
    }
    assert (
        NamespacePolicies.from_json({**legacy, "deduplication_enabled": False}).deduplication_enabled is None
    )
    assert (
        NamespacePolicies.from_json({**legacy, "deduplication_enabled": True}).deduplication_enabled is True
    )
    assert NamespacePolicies.from_json({}).deduplication_enabled is None


def test_a_namespace_dedup_set_either_way_or_not_set_round_trips() -> None:
    for value in (True, False, None):
        p = NamespacePolicies(deduplication_enabled=value)
        assert NamespacePolicies.from_json(p.to_json()).deduplication_enabled is value
