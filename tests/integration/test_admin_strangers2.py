"""Strangers and careless operators against the admin routes of peek, skip, expire-messages, the namespace
message TTL and the compaction thresholds: every refusal is a 4xx with Pulsar's ``{"reason": …}``, and a refused
call moves nothing. One broker on 3 bookies for the module."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import module_cluster
from tests.integration.test_broker_admin import call, ok
from tests.integration.test_broker_compaction import wait_for
from tests.integration.test_broker_pulsar_client import client

pulsar = pytest.importorskip("pulsar")

T = "/admin/v2/persistent/public/default"
NS = "/admin/v2/namespaces/public/default"


@pytest.fixture(scope="module")
def bp(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("strangers2")) as b:
        yield b.procs[0]


def name() -> str:
    return f"st2-{uuid.uuid4().hex[:8]}"


def refused(bp: BrokerProcess, method: str, path: str, status: int, body: Any = None) -> str:
    """The reason of a call that must be refused with ``status``."""
    got, data, _ = call(bp, method, path, body)
    assert got == status, (method, path, got, data)
    assert isinstance(data, dict) and data.get("reason"), data
    return str(data["reason"])


def mark_deletes(bp: BrokerProcess, t: str) -> dict[str, str]:
    stats = ok(bp, "GET", f"{T}/{t}/internalStats")
    return {s: c["markDeletePosition"] for s, c in stats["cursors"].items()}


def test_the_compactors_subscription_is_not_moved_by_hand(bp: BrokerProcess) -> None:
    """Skip, expire-messages, reset-cursor and skip_all name ``__compaction``: 405, its horizon unmoved (moved, the
    entries it passed over were never compacted and left the compacted view with their ledger); peek reads it."""
    t = name()
    full = f"persistent://public/default/{t}"
    ok(bp, "PUT", f"{T}/{t}")
    with contextlib.closing(client(bp)) as c:
        producer = c.create_producer(full, batching_enabled=False)
        producer.send(b"a", partition_key="a")
        ok(bp, "PUT", f"{T}/{t}/compaction")
        wait_for("compaction", lambda: ok(bp, "GET", f"{T}/{t}/compaction")["status"] == "SUCCESS")
        for k in "bcd":
            producer.send(k.encode(), partition_key=k)
    before = mark_deletes(bp, t)
    assert "__compaction" in before
    sub = f"{T}/{t}/subscription/__compaction"
    for method, path, body in [
        ("POST", f"{sub}/skip/2", None),
        ("POST", f"{sub}/expireMessages/0", None),
        ("POST", f"{sub}/skip_all", None),
        ("POST", f"{sub}/resetcursor/0", None),
        ("POST", f"{sub}/resetcursor", "latest"),
    ]:
        assert "reserved for topic compaction" in refused(bp, method, path, 405, body)
    assert mark_deletes(bp, t) == before
    assert call(bp, "GET", f"{sub}/position/1")[0] == 200
