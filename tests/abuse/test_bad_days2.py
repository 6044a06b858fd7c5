"""More of an operator's bad days against real processes: the broker's admin HTTP while its ZooKeeper is away."""

from __future__ import annotations

from pathlib import Path

from tests.abuse.helpers import http
from tests.broker_testing import start_broker
from tests.conftest import BookieFactory
from tests.zk_testing import make_test_server, unique_root


def test_the_brokers_admin_http_answers_503_with_the_reason_while_zookeeper_is_away(tmp_path: Path) -> None:
    with make_test_server() as zk:
        bookies = BookieFactory(zk.connect_string, unique_root(), tmp_path)
        broker = None
        try:
            bookies.start_many(1)
            broker = start_broker(bookies, tmp_path, 4)
            broker.wait_ready(60)
            assert http(broker, "PUT", "/admin/v2/persistent/public/default/t1")[0] == 204
            zk.stop()
            for method, path in (
                ("GET", "/admin/v2/tenants"),
                ("GET", "/admin/v2/persistent/public/default"),
                ("GET", "/admin/v2/persistent/public/default/t1/partitions"),
                ("PUT", "/admin/v2/persistent/public/default/t2"),
                ("GET", "/admin/v2/namespaces/public/default/retention"),
            ):
                status, body = http(broker, method, path)
                assert status == 503, (method, path, status, body)
                assert "ZooKeeper" in body["reason"], (method, path, body)
            log = broker.log_path.read_text(errors="replace") if broker.log_path else ""
            assert "Traceback" not in log, broker.log_tail(60)
            assert "admin GET /admin/v2/tenants: 503: ZooKeeper" in log, broker.log_tail(60)
        finally:
            if broker is not None:
                broker.kill9()
            for bp in bookies.procs:
                bp.kill9()
