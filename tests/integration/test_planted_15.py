"""Tests for the bugs planted in the audit of 89e0dc0..856c42e (docs/architecture.md §11) that the tests of the
time let through: each fails with its bug planted and passes without it. Real ZooKeeper, bookies and brokers."""

from __future__ import annotations

from urllib.parse import quote

import zk
from tests.broker_testing import Brokers, cluster  # noqa: F401
from tests.integration.test_namespace_delete_races import _namespace_on_a_broker, _status


def test_a_namespace_delete_under_way_on_another_broker_is_not_taken_over(cluster: Brokers) -> None:  # noqa: F811
    """The ephemeral deleting/<namespace> znode of another ZooKeeper session (another broker's delete under way)
    makes this broker's delete 409 '… is being deleted' and is left as it is: only this broker's own session's
    leftover is taken over. Planted taking any session's znode for its own: the second delete ran beside the
    first (its failure could take back the first's mark) and removed the other's znode as it ended."""
    with _namespace_on_a_broker(cluster) as (service, _run, port, ns):
        path = f"deleting/{quote(f'namespace/public/{ns}', safe='')}"
        other = zk.MetadataStore.connect(cluster.bookies.zk, root=cluster.bookies.root)
        try:
            other.create(path, {"broker": "another"}, ephemeral=True)
            status, body = _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")
            assert status == 409 and "is being deleted" in body["reason"], (status, body)
            assert other.get(path).value["broker"] == "another", "the other's znode is left"
            assert _status(port, "GET", f"/admin/v2/namespaces/public/{ns}")[0] == 200
        finally:
            other.close()
        status, body = _status(port, "DELETE", f"/admin/v2/namespaces/public/{ns}")
        assert status == 204, (status, body)
