"""BookieRegistry against a real ZooKeeper: ephemeral registration, readonly moves, session expiry."""

import time

import pytest

from tests.zk_testing import TcpProxy, ZkTarget, expire_session, wait_for
from zk import layout
from zk.client import MetadataStore
from zk.errors import MetadataExistsError
from zk.launcher import ZooKeeperServer
from zk.registry import BookieRecord, BookieRegistry

BID = "127.0.0.1:3181"
INFO = {"host": "127.0.0.1", "port": 3181, "http_port": 8000}


def test_register_lists_and_disappears_on_close(zk_connect: ZkTarget, zk_store: MetadataStore) -> None:
    observer = BookieRegistry(zk_store)
    assert observer.available() == {} and observer.all() == {}
    bookie_store = MetadataStore.connect(*zk_connect)
    reg = BookieRegistry(bookie_store)
    reg.register(BID, INFO)
    reg.register("127.0.0.1:3182", {"port": 3182})
    assert observer.available() == {BID: INFO, "127.0.0.1:3182": {"port": 3182}}
    st = zk_store.stat(layout.available_bookie_path(BID))
    assert st is not None and st.ephemeral_owner == bookie_store.session_id
    bookie_store.close()  # process dies / closes its session
    assert observer.available() == {}


def test_readonly_moves_and_back(zk_store: MetadataStore) -> None:
    reg = BookieRegistry(zk_store)
    reg.register(BID, INFO)
    reg.register(BID, {**INFO, "disk": "full"}, readonly=True)
    assert reg.available() == {}
    assert reg.readonly() == {BID: {**INFO, "disk": "full"}}
    assert reg.all() == {BID: BookieRecord(BID, {**INFO, "disk": "full"}, True)}
    assert not zk_store.exists(layout.available_bookie_path(BID))
    reg.register(BID, INFO)  # back to writable
    assert reg.available() == {BID: INFO} and reg.readonly() == {}
    reg.register(BID, {**INFO, "port": 9})  # info update in place
    assert reg.available()[BID]["port"] == 9
    reg.unregister(BID)
    assert reg.all() == {}


def test_reregisters_after_session_expiry(zk_store: MetadataStore) -> None:
    reg = BookieRegistry(zk_store)
    reg.register(BID, INFO)
    reg.register("127.0.0.1:3190", {"port": 3190}, readonly=True)
    old = expire_session(zk_store)
    assert wait_for(lambda: reg.reregistrations == 2, 10)
    st = zk_store.stat(layout.available_bookie_path(BID))
    assert st is not None and st.ephemeral_owner == zk_store.session_id != old
    assert reg.available() == {BID: INFO}
    assert reg.readonly() == {"127.0.0.1:3190": {"port": 3190}}


def test_reregisters_after_partition_expires_session(zk_server: ZooKeeperServer, zk_root: str) -> None:
    """Fault path: the bookie is cut off from ZooKeeper for longer than its session timeout; the server expires
    the session (ephemeral znode gone), and on reconnect the registry puts the bookie back."""
    with TcpProxy("127.0.0.1", zk_server.port) as proxy:
        bookie = MetadataStore.connect(
            proxy.connect_string, zk_root, session_timeout_s=1.0, request_timeout_s=2.0
        )
        observer = MetadataStore.connect(zk_server.connect_string, zk_root)
        try:
            events: list[str] = []
            bookie.add_session_listener(events.append)
            reg = BookieRegistry(bookie)
            reg.register(BID, INFO)
            sid = bookie.session_id
            watcher = BookieRegistry(observer)
            proxy.partition()
            assert wait_for(lambda: watcher.available() == {}, 10)  # server expired the session
            proxy.heal()
            assert wait_for(lambda: reg.reregistrations >= 1, 10), events
            assert "LOST" in events and bookie.session_id != sid
            assert watcher.available() == {BID: INFO}
        finally:
            bookie.close()
            observer.close()


def test_duplicate_bookie_id_is_refused(zk_connect: ZkTarget, zk_store: MetadataStore) -> None:
    first = BookieRegistry(zk_store)
    first.register(BID, INFO)
    other_store = MetadataStore.connect(*zk_connect)
    try:
        second = BookieRegistry(other_store, stale_wait_s=0.3)
        with pytest.raises(MetadataExistsError, match="another live"):
            second.register(BID, INFO)
        second.unregister(BID)  # must not delete the first process's znode
        assert first.available() == {BID: INFO}
    finally:
        other_store.close()


def test_waits_for_stale_registration_of_previous_session(
    zk_connect: ZkTarget, zk_store: MetadataStore
) -> None:
    """A restarted bookie finds its old znode still there; it goes when the old session ends."""
    old_store = MetadataStore.connect(*zk_connect)
    BookieRegistry(old_store).register(BID, INFO)
    new = BookieRegistry(zk_store, stale_wait_s=10)
    import threading

    threading.Timer(0.5, old_store.close).start()
    t0 = time.monotonic()
    new.register(BID, INFO)
    assert 0.3 < time.monotonic() - t0 < 5
    st = zk_store.stat(layout.available_bookie_path(BID))
    assert st is not None and st.ephemeral_owner == zk_store.session_id


def test_close_unregisters_and_stops_reregistering(zk_store: MetadataStore) -> None:
    reg = BookieRegistry(zk_store)
    reg.register(BID, INFO)
    reg.close()
    assert reg.available() == {}
    expire_session(zk_store)
    time.sleep(0.3)
    assert reg.reregistrations == 0 and reg.available() == {}


def test_watch_available(zk_store: MetadataStore) -> None:
    reg = BookieRegistry(zk_store)
    seen: list[list[str]] = []
    cancel = reg.watch_available(seen.append)
    reg.register(BID, INFO)
    assert wait_for(lambda: seen[-1:] == [[BID]])
    reg.unregister(BID)
    assert wait_for(lambda: seen[-1:] == [[]])
    cancel()
