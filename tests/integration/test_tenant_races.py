"""A tenant's delete and a namespace's create of that tenant at once: an in-process broker and its admin HTTP port
(real ZooKeeper, 3 bookies), the other admin's call made in the window between the broker's check and its write
(a wrapper of the broker's metadata read that makes it there)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from typing import Any

from tests.broker_testing import Brokers, cluster, in_process_broker  # noqa: F401
from topic_broker.admin import AdminServer


def _status(port: int, method: str, path: str) -> tuple[int, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"" if method != "GET" else None)
    req.method = method
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_tenant_delete_and_namespace_create_at_once(cluster: Brokers) -> None:  # noqa: F811
    """A namespace created between the tenant delete's check and its delete: 409 "The tenant still has
    namespaces", both kept (before: 500). A tenant deleted between the namespace create's check and its create:
    404 "Tenant does not exist", the tenant not made again (before: 204, the deleted tenant back as the
    namespace's parent)."""
    with in_process_broker(cluster) as (service, run):
        admin = AdminServer(service)
        run(admin.start())
        try:
            port = service.config.http_port
            meta, store = service.meta, service.meta.store
            tenant = f"t-{uuid.uuid4().hex[:8]}"
            assert _status(port, "PUT", f"/admin/v2/tenants/{tenant}")[0] == 204

            real_list = meta.list_namespaces

            async def list_then_other_admin_creates(t: str) -> list[str]:
                found = await real_list(t)
                await store.acreate(f"namespaces/{tenant}/late", {})
                return found  # type: ignore[no-any-return]

            meta.list_namespaces = list_then_other_admin_creates
            try:
                status, body = _status(port, "DELETE", f"/admin/v2/tenants/{tenant}")
            finally:
                del meta.list_namespaces
            assert (status, body) == (409, {"reason": "The tenant still has namespaces"})
            assert _status(port, "GET", f"/admin/v2/namespaces/{tenant}/late")[0] == 200

            assert _status(port, "DELETE", f"/admin/v2/namespaces/{tenant}/late")[0] == 204
            real_exists = store.aexists

            async def exists_then_other_admin_deletes(path: str) -> bool:
                found = await real_exists(path)
                if path == f"namespaces/{tenant}":
                    await store.adelete(path)
                return found  # type: ignore[no-any-return]

            store.aexists = exists_then_other_admin_deletes
            try:
                status, body = _status(port, "PUT", f"/admin/v2/namespaces/{tenant}/ns")
            finally:
                del store.aexists
            assert (status, body) == (404, {"reason": "Tenant does not exist"})
            assert _status(port, "GET", f"/admin/v2/tenants/{tenant}")[0] == 404
        finally:
            run(admin.stop())
