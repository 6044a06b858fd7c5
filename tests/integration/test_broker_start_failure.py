"""A broker that registered and cannot keep its registration: its listener fails to start, or it cannot register
again after a lost session (real ZooKeeper, one bookie, the broker in this process)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import pytest

import topic_broker.main as broker_main
import zk
from bookie.server_gate import PortProblems
from tests.broker_testing import before_first_call, broker_config, serve_on_a_thread
from tests.zk_testing import expire_session, wait_for
from topic_broker.service import BrokerService
from zk import layout
from zk.errors import MetadataNotFoundError


def test_a_listener_failing_after_registration_unregisters_the_broker(
    bookies: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port is taken between the start-up check and the bind (the check is skipped here to make that race
    certain): serve() fails, and brokers/<id> is gone at once, not when the session times out."""
    bookies.start()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    monkeypatch.setattr(broker_main, "port_problems", lambda host, ports: PortProblems([], []))
    config = broker_config(bookies, "start-fails", port=port, zk_session_timeout_s=30.0)
    try:
        with pytest.raises(OSError):
            asyncio.run(broker_main.serve(config, asyncio.Event()))
    finally:
        taken.close()
    store = zk.MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        with pytest.raises(MetadataNotFoundError):
            store.get(layout.broker_path("start-fails"))
    finally:
        store.close()


def test_a_broker_that_cannot_register_again_after_a_lost_session_shuts_down(
    bookies: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its session expires and, before it registers again, another live session registers its id: the
    re-registration fails after the session timeout + 2 s, and the broker says so and exits 1 rather than go on
    serving unregistered (it went on serving, the failure of a background task nobody saw)."""
    bookies.start()
    served = serve_on_a_thread(
        broker_config(bookies, "re-register-fails", zk_session_timeout_s=3.0), monkeypatch
    )
    service, thread = served.service, served.thread
    other = zk.MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        path = layout.broker_path("re-register-fails")

        async def take_the_id() -> None:
            await asyncio.to_thread(
                other.create, path, {"service_url": "pulsar://elsewhere:1"}, ephemeral=True
            )

        with before_first_call(service.meta, "register_broker", take_the_id):
            expire_session(service.bk.store)
            thread.join(30)
        if thread.is_alive():  # (before: it went on serving)
            served.stop_and_join()
            pytest.fail("the broker went on serving unregistered")
        assert served.rc == [1]
        assert other.get(path).value["service_url"] == "pulsar://elsewhere:1"  # the other's left
    finally:
        other.close()


def test_a_zookeeper_error_while_registering_again_is_retried_not_a_shutdown(
    bookies: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its session expires and the first re-registration meets a ZooKeeper connection loss (ZooKeeper still
    flapping): it is tried again and the broker serves on, registered under its new session (it logged 'could
    not register again' and exited 1, a passing ZooKeeper error taken for another broker holding its id)."""
    bookies.start()
    served = serve_on_a_thread(
        broker_config(bookies, "re-register-flaps", zk_session_timeout_s=3.0), monkeypatch
    )
    thread, rc = served.thread, served.rc
    meta, store = served.service.meta, served.service.bk.store
    real = meta.register_broker
    failed: list[str] = []

    async def fails_once(*args: Any, **kwargs: Any) -> None:
        if not failed:
            failed.append("once")
            raise zk.MetadataConnectionError("connection lost (made by the test)")
        await real(*args, **kwargs)

    meta.register_broker = fails_once  # type: ignore[method-assign]
    path = layout.broker_path("re-register-flaps")
    old = store.session_id

    def registered_again() -> bool:
        st = store.stat(path)
        return st is not None and st.ephemeral_owner not in (0, old)

    try:
        with contextlib.suppress(TimeoutError):  # (a broker that shut down closed its store)
            expire_session(store)
        assert wait_for(lambda: not thread.is_alive() or registered_again(), 20)
        assert thread.is_alive() and not rc, f"the broker exited {rc}"  # (before: exit 1)
        assert failed and registered_again()
    finally:
        if thread.is_alive():
            served.stop_and_join()
    assert rc == [0]


def test_a_start_failing_after_registration_unregisters_the_broker(
    bookies: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """service.start() fails after brokers/<id> was written (the watch of the bookies meets a ZooKeeper error):
    serve() fails, and the registration is gone at once, not when the session times out (30 s here)."""
    from topic_broker.bookie_supply import BookieSupply

    bookies.start()

    async def watch_fails(self: Any, registry: Any) -> None:
        raise zk.MetadataConnectionError("connection lost (made by the test)")

    monkeypatch.setattr(BookieSupply, "watch", watch_fails)
    config = broker_config(bookies, "start-watch-fails", zk_session_timeout_s=30.0)
    with pytest.raises(zk.MetadataConnectionError):
        asyncio.run(broker_main.serve(config, asyncio.Event()))
    store = zk.MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        with pytest.raises(MetadataNotFoundError):
            store.get(layout.broker_path("start-watch-fails"))
    finally:
        store.close()


def test_a_session_lost_during_the_start_after_registration_is_followed_by_a_registration_again(
    bookies: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ZooKeeper session expires after brokers/<id> was written, while the start still watches the bookies:
    the broker registers again under its new session (the session listener was added only after that watch, so
    the loss went unseen and the broker served unregistered)."""
    from topic_broker.bookie_supply import BookieSupply

    bookies.start()
    real_watch = BookieSupply.watch
    expired: list[int] = []

    async def watch_after_expiry(self: Any, registry: Any) -> None:
        if not expired:
            expired.append(await asyncio.to_thread(expire_session, registry._store))
        await real_watch(self, registry)

    monkeypatch.setattr(BookieSupply, "watch", watch_after_expiry)
    config = broker_config(bookies, "session-lost-at-start", zk_session_timeout_s=3.0)
    path = layout.broker_path("session-lost-at-start")

    async def body() -> bool:
        service = BrokerService(config)
        await service.start()
        try:
            assert service.bk is not None and expired
            store = service.bk.store
            for _ in range(100):  # 10 s
                st = await asyncio.to_thread(store.stat, path)
                if st is not None and st.ephemeral_owner == store.session_id:
                    return True
                await asyncio.sleep(0.1)
            return False
        finally:
            await service.stop()

    assert asyncio.run(body()), "registered again under the new session"
