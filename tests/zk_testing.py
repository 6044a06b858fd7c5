"""pytest fixtures and helpers for code that needs a real ZooKeeper.

Use from ``tests/conftest.py``::

    from tests.zk_testing import zk_connect, zk_root, zk_server, zk_store  # noqa: F401

* ``zk_server`` (session scope): one :class:`~zk.launcher.ZooKeeperServer` for the whole run (tickTime 500 ms,
  so sessions may be as short as 1 s). Do not pause/stop it in a test: start a private ``ZooKeeperServer``.
* ``zk_root`` (function scope): a fresh, unique root path ``/ledgerstore-test-<hex>`` (deleted afterwards).
* ``zk_connect`` (function scope): ``ZkTarget(connect_string, root)`` for that server and root.
* ``zk_store`` (function scope): a connected :class:`~zk.client.MetadataStore` on that root (4 s sessions).
* ``zk_auth`` (function scope): puts :data:`TEST_ZK_AUTH` in ``LEDGERSTORE_ZK_AUTH`` for the test, so every store
  and every process started meanwhile (bookies, CLI) authenticates and secures the test's root; returns it.
  ``zk_root``'s cleanup authenticates too, so a secured root is removed like any other.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
from kazoo.client import KazooClient

from zk.acl import ENV_AUTH, ENV_AUTH_FILE, ZkAuth, resolve_auth
from zk.client import MetadataStore
from zk.errors import MetadataConnectionError, MetadataError
from zk.launcher import DEFAULT_JVM_OPTS, FAST_START_JVM_OPTS, ZooKeeperServer

TEST_SESSION_TIMEOUT_S = 4.0
#: The credentials the ``zk_auth`` fixture configures.
TEST_ZK_AUTH = ZkAuth("ledgerstore-test", "test-secret")


class ZkTarget(NamedTuple):
    connect_string: str
    root: str


def make_test_server(**kwargs: object) -> ZooKeeperServer:
    """A (not yet started) private server tuned for tests: fast JVM start, dies with the test process."""
    opts: dict[str, object] = {"jvm_opts": DEFAULT_JVM_OPTS + FAST_START_JVM_OPTS, "die_with_parent": True}
    opts.update(kwargs)
    return ZooKeeperServer(**opts)  # type: ignore[arg-type]


def unique_root(prefix: str = "/ledgerstore-test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZooKeeperServer]:
    server = make_test_server()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_root(zk_server: ZooKeeperServer) -> Iterator[str]:
    root = unique_root()
    yield root
    if zk_server.running and not zk_server.paused:
        # With credentials, open and secured znodes alike can be deleted (the environment's own, if set).
        auth = TEST_ZK_AUTH
        with contextlib.suppress(MetadataError):
            auth = resolve_auth() or TEST_ZK_AUTH
        with (
            contextlib.suppress(MetadataError),
            MetadataStore.connect(zk_server.connect_string, "/", timeout_s=3, auth=auth) as s,
        ):
            s.delete(root.lstrip("/"), recursive=True, missing_ok=True)


@pytest.fixture
def zk_auth(zk_root: str) -> Iterator[ZkAuth]:
    """:data:`TEST_ZK_AUTH` in the environment for this test (restored afterwards)."""
    saved = {k: os.environ.get(k) for k in (ENV_AUTH, ENV_AUTH_FILE)}
    os.environ[ENV_AUTH] = TEST_ZK_AUTH.credential
    os.environ.pop(ENV_AUTH_FILE, None)
    try:
        yield TEST_ZK_AUTH
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def zk_connect(zk_server: ZooKeeperServer, zk_root: str) -> ZkTarget:
    return ZkTarget(zk_server.connect_string, zk_root)


@pytest.fixture
def zk_store(zk_connect: ZkTarget) -> Iterator[MetadataStore]:
    store = MetadataStore.connect(
        zk_connect.connect_string, zk_connect.root, session_timeout_s=TEST_SESSION_TIMEOUT_S
    )
    try:
        yield store
    finally:
        store.close()


def expire_session(store: MetadataStore, timeout_s: float = 10.0) -> int:
    """Force the store's ZooKeeper session to expire (the classic trick: a second client attaches to the same
    session and closes it), then wait until the store has a new session. Returns the old session id."""
    cid = store.client_id
    if cid is None:
        raise RuntimeError("store is not connected")
    old_sid, passwd = cid
    other = KazooClient(
        hosts=store.connect_string, client_id=(old_sid, passwd), timeout=store.session_timeout_s
    )
    other.start(timeout=timeout_s)
    other.stop()
    other.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if store.connected and store.session_id not in (None, old_sid):
            return old_sid
        time.sleep(0.02)
    raise TimeoutError(f"store did not get a new session within {timeout_s}s")


def wait_for(predicate: object, timeout_s: float = 10.0, interval_s: float = 0.02) -> bool:
    """Poll ``predicate()`` until it is truthy or the timeout passes; returns the last result as a bool."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(interval_s)


class TcpProxy:
    """A loopback TCP proxy for partition tests: clients connect to ``proxy.port``; :meth:`partition` drops every
    connection and refuses new ones (accepts and closes at once) until :meth:`heal`. Start with ``with`` or
    :meth:`start`."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._partitioned = threading.Event()
        self._stopped = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name="tcp-proxy", daemon=True)

    @property
    def connect_string(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def partition(self) -> None:
        self._partitioned.set()
        self._drop_all()

    def heal(self) -> None:
        self._partitioned.clear()

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._drop_all()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _drop_all(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                c.close()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._partitioned.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=2)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or self._partitioned.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def failing_deletes(store: MetadataStore, prefix: str, times: int = 1) -> Iterator[list[str]]:
    """``store.adelete`` failing as on a connection lost (:class:`MetadataConnectionError`) for its first ``times``
    calls on a path under ``prefix``, then deleting as before, for the ``with`` block; yields the paths it
    failed."""
    real = store.adelete
    failed: list[str] = []

    async def adelete(path: str, *args: Any, **kwargs: Any) -> bool:
        if path.startswith(prefix) and len(failed) < times:
            failed.append(path)
            raise MetadataConnectionError("connection lost (made by the test)")
        return await real(path, *args, **kwargs)

    store.adelete = adelete  # type: ignore[method-assign]
    try:
        yield failed
    finally:
        del store.adelete  # the class's method again
