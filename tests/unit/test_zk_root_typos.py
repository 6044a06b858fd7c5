"""Which --zk-root is taken for a mistyped one (refused) and which for another cluster on the same ZooKeeper
(started): ``zk.cookies.looks_mistyped``. One ZooKeeper serving many clusters, one root per team, per test run or
per tenant, is a normal deployment; only a root a typo away from a cluster's is refused."""

from __future__ import annotations

import pytest

from zk.cookies import looks_mistyped


@pytest.mark.parametrize(
    ("root", "cluster"),
    [
        ("/ledgerstor", "/ledgerstore"),  # a character left out
        ("/ledgerstoree", "/ledgerstore"),  # one too many
        ("/ledgerstroe", "/ledgerstore"),  # two swapped
        ("/LedgerStore", "/ledgerstore"),  # case
        ("/ledgerstore/prdo", "/ledgerstore/prod"),  # a nested root's last step
        ("/ledgerstroe/prod", "/ledgerstore/prod"),  # an earlier step
        ("/ledgerstore", "/ledgerstore/prod"),  # the nested part forgotten
        ("/ledgerstore/prod/ledgers", "/ledgerstore/prod"),  # a path inside the cluster
        ("/ledgerstore/", "/ledgerstor"),
    ],
)
def test_a_root_a_typo_away_above_or_below_a_cluster_looks_mistyped(root: str, cluster: str) -> None:
    assert looks_mistyped(root, cluster)


@pytest.mark.parametrize(
    ("root", "cluster"),
    [
        ("/ledgerstore", "/ledgerstore"),  # itself
        ("/ledgerstore/", "/ledgerstore"),
        ("/test-1", "/test-2"),  # numbered clusters: one per run
        ("/test-9", "/test-10"),
        ("/cluster1/prod", "/cluster2/prod"),
        ("/ledgerstore-test-0a458287488e", "/ledgerstore-test-9607c846a0be"),  # one per test, a random suffix
        ("/prod", "/staging"),
        ("/payments", "/ledgerstore"),
        ("/", "/ledgerstore"),  # the whole ZooKeeper
    ],
)
def test_another_cluster_beside_it_does_not(root: str, cluster: str) -> None:
    assert not looks_mistyped(root, cluster)
