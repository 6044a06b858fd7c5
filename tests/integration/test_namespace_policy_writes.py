"""Two admins setting different policies of one namespace at once both keep their change: an in-process broker
and its admin HTTP port (real ZooKeeper, 3 bookies), the first writer's write held in place by a gate on the
broker's metadata store until the second's is done."""

from __future__ import annotations

import json
import threading
import urllib.request
import uuid
from typing import Any

from tests.broker_testing import Brokers, cluster, in_process_broker  # noqa: F401
from topic_broker.admin import AdminServer


def _call(port: int, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read()
    return json.loads(text) if text else None


def test_concurrent_writes_of_different_namespace_policies_both_kept(cluster: Brokers) -> None:  # noqa: F811
    """Retention set by one admin, its write held until another admin's messageTTL is written: both are stored
    and read back (before, the retention write put back the TTL it had read, none: the TTL was lost)."""
    with in_process_broker(cluster) as (service, run):
        admin = AdminServer(service)
        run(admin.start())
        try:
            port = service.config.http_port
            ns = f"ns-{uuid.uuid4().hex[:8]}"
            base = f"/admin/v2/namespaces/public/{ns}"
            _call(port, "PUT", base)
            store = service.meta.store
            original_set = store.set
            held, release = threading.Event(), threading.Event()

            def gated_set(path: str, value: Any, version: int) -> Any:
                first = value.get("retention_time_minutes") == 60 and not held.is_set()
                if path.endswith(f"/{ns}") and first:  # the first writer's first write
                    held.set()
                    assert release.wait(20)
                return original_set(path, value, version)

            store.set = gated_set
            first = threading.Thread(
                target=_call,
                args=(
                    port,
                    "POST",
                    f"{base}/retention",
                    {"retentionTimeInMinutes": 60, "retentionSizeInMB": 10},
                ),
            )
            first.start()
            try:
                assert held.wait(20), "the retention write reached the store"
                _call(port, "POST", f"{base}/messageTTL", 120)
            finally:
                release.set()
                first.join(30)
            del store.set
            assert _call(port, "GET", f"{base}/messageTTL") == 120
            assert _call(port, "GET", f"{base}/retention") == {
                "retentionTimeInMinutes": 60,
                "retentionSizeInMB": 10,
            }
        finally:
            run(admin.stop())
