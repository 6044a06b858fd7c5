"""Tests for the bugs planted in the audit of 2026-11-30 against 0260c38 that the tests of the time let through
(docs/architecture.md §11): each fails with its bug planted and passes without it. The topic stream's restart
with ``subscriptionName``, driven without a Spark session as ``test_user_scenarios6`` does."""

from __future__ import annotations

import time

from tests.spark import test_user_scenarios as users
from tests.spark.test_user_scenarios import Cluster, cluster
from tests.spark.test_user_scenarios6 import _batch_0_logged_then_stopped

__all__ = ["cluster"]  # the fixture (ZooKeeper, bookies, a broker), used by name


def test_the_batch_after_a_rerun_batch_0_of_a_named_subscription_starts_at_its_end(cluster: Cluster) -> None:
    """A restart with ``subscriptionName`` runs the logged batch 0 again from where the subscription stood before
    the restart (entries 5-7), Spark commits it, one more message comes: the next batch starts after batch 0's
    end (entries 8-10). Only batch 0 is planned from that earlier position: a later batch taken for a re-run of
    batch 0 too started there again, and entries 5-7 came twice."""
    local = "named-restarted-next-batch"
    again, (start, end) = _batch_0_logged_then_stopped(cluster, local, subscriptionName="etl-next")
    ledger = start[f"persistent://public/default/{local}"][0]
    try:
        restart = again.initialOffset()
        ranges = again.partitions(restart, end)
        assert [(t.ledger_id, t.first_entry_id, t.last_entry_id) for t in ranges] == [(ledger, 5, 7)]
        again.commit(end)
        users.produce(cluster, local, 1, batching_enabled=False)
        time.sleep(1.5)
        following = again.latestOffset(end, again.getDefaultReadLimit())
        ranges = again.partitions(end, following)
        assert [(t.ledger_id, t.first_entry_id, t.last_entry_id) for t in ranges] == [(ledger, 8, 10)]
    finally:
        again.stop()
