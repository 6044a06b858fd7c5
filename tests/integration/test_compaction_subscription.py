"""The compactor's ``__compaction`` subscription as Pulsar treats it: an admin DELETE of it deletes the compacted
ledger with the cursor (Pulsar's ``asyncDeleteCursorWithCleanCompactionLedger``). One broker on 3 bookies
(``test_broker_compaction``'s fixture, its own for this module)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.broker_testing import Brokers
from tests.integration.test_broker_client_features3 import admin
from tests.integration.test_broker_compaction import (
    brokers,
    c,
    compact,
    compacted_ledgers,
    read_compacted,
    send_all,
    topic_path,
)
from tests.integration.test_broker_pulsar_client import topic_name

pulsar = pytest.importorskip("pulsar")
__all__ = ["brokers", "c"]


def test_deleting_the_compaction_subscription_deletes_the_compacted_ledger(c: Any, brokers: Brokers) -> None:
    """An admin DELETE of ``__compaction`` (204, as Pulsar's) deletes its compacted ledger too and the topic no
    longer serves a compacted view; the next compaction starts again from the first entry."""
    bp = brokers.procs[0]
    t = topic_name()
    send_all(c.create_producer(t), [("k", b"v1"), ("k", b"v2"), ("j", b"w1")])
    compact(bp, t)
    (first,) = compacted_ledgers(brokers.bookies, t)
    assert [(k, v) for k, v, _ in read_compacted(c, t)] == [("k", b"v2"), ("j", b"w1")]
    admin(bp, "DELETE", topic_path(t) + "/subscription/__compaction")
    assert "__compaction" not in admin(bp, "GET", topic_path(t) + "/subscriptions")
    assert compacted_ledgers(brokers.bookies, t) == set()
    assert admin(bp, "GET", topic_path(t) + "/internalStats")["compactedLedger"]["ledgerId"] == -1
    assert [(k, v) for k, v, _ in read_compacted(c, t)] == [("k", b"v1"), ("k", b"v2"), ("j", b"w1")]
    compact(bp, t)
    (second,) = compacted_ledgers(brokers.bookies, t)
    assert second != first
    assert [(k, v) for k, v, _ in read_compacted(c, t)] == [("k", b"v2"), ("j", b"w1")]
