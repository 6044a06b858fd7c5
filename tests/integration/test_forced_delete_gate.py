"""``DELETE …/namespaces/{t}/{ns}?force=true`` and ``…/tenants/{t}?force=true`` delete every topic under them, data
included: as Pulsar's (forceDeleteNamespaceAllowed, forceDeleteTenantAllowed, both false by default) a broker refuses
them, 405, unless started with --force-delete-namespace-allowed / --force-delete-tenant-allowed (the forced deletes
themselves: test_broker_namespaces). In-process broker, real ZooKeeper and bookies, the admin REST over HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from typing import Any

from tests.broker_testing import Brokers, in_process_broker


def _admin(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return int(r.status), json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return int(e.code), json.loads(raw) if raw else None


def test_forced_deletes_are_refused_unless_the_broker_allows_them(cluster: Brokers) -> None:
    from topic_broker.admin import AdminServer

    with in_process_broker(cluster, tick_interval_s=3600.0) as (service, run):
        http = AdminServer(service)
        run(http.start())
        try:
            port = service.config.http_port
            tenant = f"gate-{uuid.uuid4().hex[:8]}"
            assert _admin(port, "PUT", f"/admin/v2/tenants/{tenant}", {})[0] == 204
            assert _admin(port, "PUT", f"/admin/v2/namespaces/{tenant}/ns")[0] == 204
            status, body = _admin(port, "DELETE", f"/admin/v2/namespaces/{tenant}/ns?force=true")
            assert (status, body["reason"]) == (405, "Broker doesn't allow forced deletion of namespaces")
            status, body = _admin(port, "DELETE", f"/admin/v2/tenants/{tenant}?force=true")
            assert (status, body["reason"]) == (405, "Broker doesn't allow forced deletion of tenants")
            assert _admin(port, "GET", f"/admin/v2/namespaces/{tenant}/ns")[0] == 200  # nothing deleted
            assert _admin(port, "DELETE", f"/admin/v2/namespaces/{tenant}/ns")[0] == 204  # unforced, as ever
            assert _admin(port, "DELETE", f"/admin/v2/tenants/{tenant}")[0] == 204
        finally:
            run(http.stop())
