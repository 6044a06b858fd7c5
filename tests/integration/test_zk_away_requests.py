"""A long ZooKeeper outage under many requests: kazoo wakes its connection thread with one byte per request on a
socket pair it reads only while connected, and about 270 such bytes fill it. Past that every call blocked in
``send`` until ZooKeeper came back, beyond ``request_timeout_s``, and closing the store (a broker or bookie asked
to stop) waited for ever. Requests beyond ``WAITING_REQUESTS_MAX`` are now refused at once."""

from __future__ import annotations

import threading
import time

from tests.zk_testing import TcpProxy, wait_for, zk_root, zk_server  # noqa: F401
from zk.client import WAITING_REQUESTS_MAX, MetadataStore
from zk.errors import MetadataConnectionError
from zk.launcher import ZooKeeperServer

CALLS = 600  # well past what the socket pair holds


def test_requests_while_zookeeper_is_away_stay_bounded_and_close_ends(
    zk_server: ZooKeeperServer,  # noqa: F811
    zk_root: str,  # noqa: F811
) -> None:
    with TcpProxy("127.0.0.1", zk_server.port) as proxy:
        store = MetadataStore.connect(
            proxy.connect_string, zk_root, session_timeout_s=4.0, request_timeout_s=3.0
        )
        proxy.partition()
        assert wait_for(lambda: not store.connected, 10)
        outcomes: list[str] = []
        lock = threading.Lock()

        def one(i: int) -> None:
            try:
                store.get_optional(f"away-{i}")
                what = "answered"
            except MetadataConnectionError as e:
                what = "waited" if "did not answer" in str(e) else "refused"
            with lock:
                outcomes.append(what)

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(CALLS)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, t0 + 30 - time.monotonic()))
        stuck = sum(t.is_alive() for t in threads)
        assert stuck == 0, f"{stuck} calls still blocked after 30 s (request timeout 3 s)"
        assert outcomes.count("refused") >= CALLS - WAITING_REQUESTS_MAX - 10, outcomes.count("refused")
        assert "answered" not in outcomes

        closing = threading.Thread(target=store.close, daemon=True)
        closing.start()
        closing.join(20)
        assert not closing.is_alive(), "closing the store waited on ZooKeeper"
