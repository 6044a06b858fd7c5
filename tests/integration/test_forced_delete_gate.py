"""``DELETE …/namespaces/{t}/{ns}?force=true`` and ``…/tenants/{t}?force=true`` delete every topic under them, data
included: as Pulsar's (forceDeleteNamespaceAllowed, forceDeleteTenantAllowed, both false by default) a broker refuses
them, 405, unless started with --force-delete-namespace-allowed / --force-delete-tenant-allowed (the forced deletes
themselves: test_broker_namespaces). In-process broker, real ZooKeeper and bookies, the admin REST over HTTP."""

from __future__ import annotations

import uuid

from tests.broker_testing import Brokers, admin_json, in_process_broker


def test_forced_deletes_are_refused_unless_the_broker_allows_them(cluster: Brokers) -> None:
    from topic_broker.admin import AdminServer

    with in_process_broker(cluster, tick_interval_s=3600.0) as (service, run):
        http = AdminServer(service)
        run(http.start())
        try:
            port = service.config.http_port
            tenant = f"gate-{uuid.uuid4().hex[:8]}"
            assert admin_json(port, "PUT", f"/admin/v2/tenants/{tenant}", {})[0] == 204
            assert admin_json(port, "PUT", f"/admin/v2/namespaces/{tenant}/ns")[0] == 204
            status, body = admin_json(port, "DELETE", f"/admin/v2/namespaces/{tenant}/ns?force=true")
            assert (status, body["reason"]) == (405, "Broker doesn't allow forced deletion of namespaces")
            status, body = admin_json(port, "DELETE", f"/admin/v2/tenants/{tenant}?force=true")
            assert (status, body["reason"]) == (405, "Broker doesn't allow forced deletion of tenants")
            assert admin_json(port, "GET", f"/admin/v2/namespaces/{tenant}/ns")[0] == 200  # nothing deleted
            assert (
                admin_json(port, "DELETE", f"/admin/v2/namespaces/{tenant}/ns")[0] == 204
            )  # unforced, as ever
            assert admin_json(port, "DELETE", f"/admin/v2/tenants/{tenant}")[0] == 204
        finally:
            run(http.stop())
