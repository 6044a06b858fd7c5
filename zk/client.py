"""``MetadataStore``: typed JSON znodes with versioned compare-and-set, on top of a kazoo client.

* Every body is a JSON object carrying ``"format_version"`` (added on write, checked on read).
* Every path is relative to the store root (``/ledgerstore`` by default); a leading ``/`` is ignored.
* Every call is synchronous and bounded by ``request_timeout_s``; kazoo exceptions are translated into
  :mod:`zk.errors` (they never leak).
* Async callers use the ``a``-prefixed twins (``aget``, ``acreate``, ``aset``, ``aupdate``, ...), which run the
  sync method in a worker thread via :func:`asyncio.to_thread`.
* Session state changes are delivered to listeners (``"CONNECTED"``, ``"SUSPENDED"``, ``"LOST"``) on a dedicated
  dispatcher thread, so a listener may block and may call the store (e.g. to re-create ephemeral znodes after the
  session expired: ``"LOST"`` is followed by ``"CONNECTED"`` once a new session is established).
* Credentials (:mod:`zk.acl`): ``connect(auth=...)``, else ``LEDGERSTORE_ZK_AUTH`` / ``LEDGERSTORE_ZK_AUTH_FILE``.
  With them the session authenticates (``digest``) on every connection and each znode created gets the digest
  ACL; a root its credentials do not admit fails ``connect`` with :class:`~zk.errors.MetadataAuthError`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import copy
import json
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from kazoo import exceptions as kex
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import ConnectionLoss
from kazoo.protocol.states import KeeperState
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.retry import KazooRetry
from kazoo.security import ACL

from zk import layout
from zk.acl import ACL_REFRESH_S, AclMode, AuthLike, ZkAuth, mode_of, resolve_auth
from zk.errors import (
    InvalidMetadataError,
    MetadataAuthError,
    MetadataClosedError,
    MetadataConnectionError,
    MetadataError,
    MetadataExistsError,
    MetadataFormatError,
    MetadataNotEmptyError,
    MetadataNotFoundError,
    MetadataVersionError,
    ZkConnectStringError,
    translate,
)
from zk.ratelog import LOG_EVERY_S, RepeatedLinesFilter
from zk.versioned import Versioned

log = logging.getLogger(__name__)

#: kazoo's own log: while ZooKeeper is away its retries say 'Connection dropped: ...' about once a second, in every
#: process; each kind of its lines comes at most once a minute (with how many were left out)
KAZOO_LOG = logging.getLogger("zk.kazoo")
KAZOO_LOG.addFilter(RepeatedLinesFilter(LOG_EVERY_S))

JsonDict = dict[str, Any]
SessionState = Literal["CONNECTED", "SUSPENDED", "LOST"]
SessionListener = Callable[[SessionState], object]

#: The body format written by this code.
FORMAT_VERSION = 1
#: Body formats this code can read.
SUPPORTED_FORMAT_VERSIONS = frozenset({1})
#: ZooKeeper's default jute.maxbuffer is 1 MiB; a larger request makes the server drop the connection.
MAX_BODY_BYTES = 1_000_000
DEFAULT_UPDATE_RETRIES = 100

#: At most this many requests wait in kazoo's queue while the session is not connected; more are refused at once
#: (ConnectionLoss). kazoo wakes its connection thread with one byte per request on a socket pair that it reads only
#: while connected, and that pair holds about 270 such bytes: past them every call blocked in ``send`` until
#: ZooKeeper came back, beyond ``request_timeout_s``, and a process asked to stop waited for ever.
WAITING_REQUESTS_MAX = 128

_R = TypeVar("_R")
_SERVING_STATES = (KeeperState.CONNECTED, KeeperState.CONNECTED_RO)


def _bound_waiting_requests(client: KazooClient) -> None:
    """Refuse a request at once (kazoo's own way: the exception set on its async result) when the session is not
    connected and :data:`WAITING_REQUESTS_MAX` requests already wait for it."""
    call = client._call

    def bounded_call(request: Any, async_object: Any) -> Any:
        if client._state not in _SERVING_STATES and len(client._queue) >= WAITING_REQUESTS_MAX:
            async_object.set_exception(
                ConnectionLoss(f"ZooKeeper is away and {len(client._queue)} requests already wait for it")
            )
            return False
        return call(request, async_object)

    client._call = bounded_call


#: The attribute of a KazooClient where :func:`_keep_negotiated_timeout` keeps the session timeout (ms) ZooKeeper
#: granted at the last session's start.
_NEGOTIATED = "_ledgerstore_negotiated_timeout_ms"


def _keep_negotiated_timeout(client: KazooClient) -> None:
    """Keep the session timeout ZooKeeper granted (it clamps the one asked for to its min/max session timeouts):
    kazoo only logs it. Its ``_connect`` returns the read timeout it sets, 2/3 of that timeout, on every session's
    (re)connection."""
    handler = client._connection
    connect = handler._connect

    def kept(*args: Any, **kwargs: Any) -> Any:
        out = connect(*args, **kwargs)
        with contextlib.suppress(TypeError, ValueError, IndexError):
            setattr(client, _NEGOTIATED, round(float(out[0]) * 3.0 / 2.0))
        return out

    handler._connect = kept


def encode_body(value: Mapping[str, Any]) -> bytes:
    """JSON-encode a znode body, adding ``format_version`` (a supported one may already be present)."""
    if not isinstance(value, Mapping):
        raise InvalidMetadataError(f"znode body must be a JSON object (a dict), got {type(value).__name__}")
    body = dict(value)
    fv = body.setdefault("format_version", FORMAT_VERSION)
    if isinstance(fv, bool) or fv not in SUPPORTED_FORMAT_VERSIONS:
        raise MetadataFormatError(
            f"cannot write format_version {fv!r} (supported: {sorted(SUPPORTED_FORMAT_VERSIONS)})"
        )
    try:
        data = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise InvalidMetadataError(f"znode body is not JSON-serialisable: {e}") from e
    if len(data) > MAX_BODY_BYTES:
        raise InvalidMetadataError(f"znode body is {len(data)} bytes, more than the {MAX_BODY_BYTES} allowed")
    return data


def decode_body(data: bytes | None, path: str | None = None) -> JsonDict:
    """Parse a znode body written by :func:`encode_body`; raise :class:`MetadataFormatError` otherwise."""
    if not data:
        raise MetadataFormatError(
            "znode has no body (a directory node, or not written by ledgerstore)", path=path
        )
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, ValueError) as e:
        raise MetadataFormatError(f"znode body is not JSON: {e}", path=path) from e
    if not isinstance(value, dict):
        raise MetadataFormatError(f"znode body is JSON {type(value).__name__}, not an object", path=path)
    fv = value.get("format_version")
    if isinstance(fv, bool) or fv not in SUPPORTED_FORMAT_VERSIONS:
        raise MetadataFormatError(
            f"unsupported format_version {fv!r} (this build reads {sorted(SUPPORTED_FORMAT_VERSIONS)}); "
            "was it written by a newer ledgerstore?",
            path=path,
        )
    return value


@dataclass(frozen=True)
class NodeStat:
    """The parts of a ZooKeeper ``Stat`` the rest of the system uses."""

    version: int
    ephemeral_owner: int  # session id owning an ephemeral znode, 0 for persistent znodes
    ctime_ms: int
    mtime_ms: int
    num_children: int
    data_length: int

    @property
    def ephemeral(self) -> bool:
        return self.ephemeral_owner != 0


def _node_stat(stat: Any) -> NodeStat:
    return NodeStat(
        version=stat.version,
        ephemeral_owner=stat.ephemeralOwner,
        ctime_ms=stat.ctime,
        mtime_ms=stat.mtime,
        num_children=stat.numChildren,
        data_length=stat.dataLength,
    )


def _check_root(root: str) -> str:
    if not root.startswith("/"):
        raise ValueError(f"root must be an absolute znode path, got {root!r}")
    root = root.rstrip("/") or "/"
    if root != "/":
        for comp in root[1:].split("/"):
            layout.check_znode_name(comp, "root path component")
        if root.split("/")[1] == "zookeeper":
            raise ValueError(f"invalid root {root!r}: /zookeeper is ZooKeeper's own")
    return root


class _CasPrimitives(Protocol):
    """What :class:`CompareAndSetUpdate` builds on."""

    def abs_path(self, path: str) -> str: ...

    def get_optional(self, path: str) -> Versioned[JsonDict] | None: ...

    def create(self, path: str, value: Mapping[str, Any]) -> str: ...

    def set(self, path: str, value: Mapping[str, Any], version: int) -> Versioned[JsonDict]: ...


class CompareAndSetUpdate:
    """``update``, the read-modify-CAS loop, over a store's ``get_optional``, ``create`` and ``set``: one
    implementation for :class:`MetadataStore` and the simulator's ZooKeeper (``tests/sim/zookeeper.py``), so the
    simulator runs this very loop."""

    def update(
        self: _CasPrimitives,
        path: str,
        fn: Callable[[JsonDict], Mapping[str, Any]],
        *,
        retries: int = DEFAULT_UPDATE_RETRIES,
        default: Mapping[str, Any] | None = None,
    ) -> Versioned[JsonDict]:
        """The compare-and-set loop: read, ``new = fn(current)``, write at the read version; on a conflict re-read
        and call ``fn`` again. ``fn`` gets a private copy; it may raise to abort (the exception propagates). If
        ``new == current`` nothing is written. With ``default``, a missing znode is treated as holding
        ``default`` and created (a concurrent create counts as a conflict, and so does a delete between the read
        and the write). Returns the final ``Versioned``.
        Raises :class:`MetadataVersionError` after ``retries`` conflicts. Connection errors are not retried
        (a lost reply may hide a successful write, and ``fn`` need not be idempotent)."""
        attempt = 0
        while True:
            current: Versioned[JsonDict] | None = self.get_optional(path)
            new = _updated(current, fn, default, self.abs_path(path))
            try:
                if current is None:
                    self.create(path, new)
                    return Versioned(json.loads(encode_body(new)), 0)
                if dict(new) == current.value:
                    return current
                return self.set(path, new, current.version)
            except MetadataVersionError:
                pass
            except MetadataExistsError:
                if current is not None:
                    raise
            except MetadataNotFoundError:
                if default is None:  # deleted since the read: without a default, gone is an error
                    raise
            attempt += 1
            _after_conflict(attempt, retries, path)


def _updated(
    current: Versioned[JsonDict] | None,
    fn: Callable[[JsonDict], Mapping[str, Any]],
    default: Mapping[str, Any] | None,
    full_path: str,
) -> Mapping[str, Any]:
    """A turn of the compare-and-set loop: ``fn`` of the value read (of ``default`` for a znode not there)."""
    if current is None and default is None:
        raise MetadataNotFoundError("znode does not exist", path=full_path)
    base: JsonDict = dict(default or {}) if current is None else current.value
    base.setdefault("format_version", FORMAT_VERSION)
    new = fn(copy.deepcopy(base))
    if not isinstance(new, Mapping):
        raise TypeError(f"update function must return a dict, got {type(new).__name__}")
    return new


def _after_conflict(attempt: int, retries: int, path: str) -> None:
    """The compare-and-set loop's pause before its next turn, or its end after ``retries`` conflicts."""
    if attempt > retries:
        raise MetadataVersionError(f"gave up after {retries} compare-and-set conflicts", path=path)
    time.sleep(random.uniform(0, min(0.05, 0.001 * 2 ** min(attempt, 10))))


def _unresolved_hosts(connect_string: str) -> list[str]:
    """The hosts of a connect string that do not resolve, each with the resolver's answer ("zk1: Name or service
    not known"): why a start timed out when a host name was mistyped, which kazoo's timeout does not say."""
    import socket

    from kazoo.hosts import collect_hosts

    unknown = []
    with contextlib.suppress(ValueError):
        for host, port in collect_hosts(connect_string)[0]:
            try:
                socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except socket.gaierror as e:
                unknown.append(f"{host}: {e.strerror}")
    return unknown


class MetadataStore(CompareAndSetUpdate):
    """A JSON-over-ZooKeeper store rooted at ``root``. Thread-safe. Use :meth:`connect` to build one."""

    def __init__(
        self,
        client: KazooClient,
        root: str = layout.DEFAULT_ROOT,
        *,
        request_timeout_s: float = 15.0,
        connect_string: str = "",
        owns_client: bool = True,
        auth: ZkAuth | None = None,
    ) -> None:
        """``auth``: the credentials ``client`` authenticates with (its ``auth_data``); new znodes get their ACL.
        Without: open ACLs."""
        self._client = client
        self._auth = auth
        # A fresh root made with credentials is secured; an existing one is looked at by _check_access().
        self._acl_mode: AclMode = "open" if auth is None else "secured"
        self._acl_checked_at = time.monotonic()
        self._root = _check_root(root)
        self._request_timeout_s = request_timeout_s
        self._connect_string = connect_string
        self._owns_client = owns_client
        self._closed = False
        #: the topmost znode of the root's path that connect() created (the root or an ancestor); None: all there
        self._created_root: str | None = None
        self._listeners: list[SessionListener] = []
        self._listeners_lock = threading.Lock()
        self._events: queue.SimpleQueue[SessionState | None] = queue.SimpleQueue()
        self._dispatcher = threading.Thread(
            target=self._dispatch_loop, name="zk-session-listeners", daemon=True
        )
        self._dispatcher.start()
        self._client.add_listener(self._on_kazoo_state)

    # --- lifecycle --------------------------------------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        connect_string: str,
        root: str = layout.DEFAULT_ROOT,
        *,
        timeout_s: float = 10.0,
        session_timeout_s: float = 10.0,
        request_timeout_s: float | None = None,
        auth: AuthLike = None,
    ) -> MetadataStore:
        """Connect (bounded by ``timeout_s``) and make sure ``root`` exists and is readable.

        ``session_timeout_s`` is what the client asks for; the server clamps it to [2, 20] x its tickTime unless
        configured otherwise (our launcher allows up to 60 s). ``request_timeout_s`` (default: max(session timeout,
        5 s)) bounds every later call. Raises :class:`MetadataConnectionError` if ZooKeeper does not answer.

        ``auth`` (see :func:`zk.acl.resolve_auth`): ``ZkAuth``, ``("user", "password")``, ``"user:password"``,
        ``False`` (none, whatever the environment says) or None (from ``LEDGERSTORE_ZK_AUTH`` /
        ``LEDGERSTORE_ZK_AUTH_FILE``, else none). Raises :class:`MetadataAuthError` if the root's ACL does not
        admit these credentials (none, a wrong password, another user).
        """
        _check_root(root)
        creds = resolve_auth(auth)
        # kazoo parses the hosts here: its "Port could not be cast to integer value as '2181x'" alone said nothing
        # of what to fix, and the ledger client took it for an unreachable ZooKeeper
        try:
            client = KazooClient(
                hosts=connect_string,
                timeout=session_timeout_s,
                auth_data=[("digest", creds.credential)] if creds is not None else None,
                connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
                logger=KAZOO_LOG,
            )
        except ValueError as e:
            raise ZkConnectStringError(
                f"{connect_string!r} is not a ZooKeeper connect string ({e}): HOST:PORT[,HOST:PORT...]"
            ) from None
        _bound_waiting_requests(client)
        _keep_negotiated_timeout(client)
        try:
            client.start(timeout=timeout_s)
        except Exception as e:
            with contextlib.suppress(Exception):
                client.stop()
                client.close()
            unknown = _unresolved_hosts(connect_string)
            raise MetadataConnectionError(
                f"could not connect to ZooKeeper at {connect_string} within {timeout_s:g}s "
                + (f"(no such host: {'; '.join(unknown)})" if unknown else f"({type(e).__name__}: {e})")
            ) from None
        # kazoo joins its callback threads at interpreter exit: one stuck retrying a watch's read while ZooKeeper
        # is away would keep a stopped process alive for ever (the threads are daemons; close() still stops them)
        atexit.unregister(client.handler.stop)
        store = cls(
            client,
            root,
            request_timeout_s=request_timeout_s
            if request_timeout_s is not None
            else max(session_timeout_s, 5.0),
            connect_string=connect_string,
            auth=creds,
        )
        try:
            store._created_root = store._make_root()
            store._check_access()
        except BaseException:
            store.close()
            raise
        return store

    def _make_root(self) -> str | None:
        """Create the root and its missing ancestors (empty bodies); the topmost one this created, None if the
        root was there (in which case this costs one exists call, as an ensure would)."""
        if self._root == "/" or self.stat("") is not None:
            return None
        steps = self._root[1:].split("/")
        created = None
        for i in range(1, len(steps) + 1):  # (the root itself is missing: one of these is the first)
            path = "/" + "/".join(steps[:i])
            if self._wait(self._client.exists_async(path), path) is None:
                created = path
                break
        self.ensure("")
        return created

    @property
    def created_root(self) -> str | None:
        """The topmost znode of the root's path that :meth:`connect` created (None: the root was there)."""
        return self._created_root

    def remove_created_root(self) -> bool:
        """Delete again what :meth:`connect` created of the root's path, from the root up to the topmost znode it
        created, each only while it has no body and no children (a znode another process has written or added
        to meanwhile stays, and so do its ancestors): a command that fails on a mistyped --zk-root leaves
        ZooKeeper as it found it. A root that was there stays. Whether all of it went."""
        if self._created_root is None:
            return False
        path = self._root
        while True:
            st = self._wait(self._client.exists_async(path), path)
            if st is not None:
                if st.dataLength != 0 or st.numChildren != 0:
                    return False
                try:
                    self._wait(self._client.delete_async(path, st.version), path)
                except (MetadataNotFoundError, MetadataVersionError, MetadataNotEmptyError):
                    return False
            if path == self._created_root:
                self._created_root = None
                return True
            path = path.rpartition("/")[0]

    def close(self) -> None:
        """Close the session (its ephemeral znodes disappear at once). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._client.remove_listener(self._on_kazoo_state)
        if self._owns_client:
            with contextlib.suppress(Exception):
                self._client.stop()
            with contextlib.suppress(Exception):
                self._client.close()
        self._events.put(None)
        if threading.current_thread() is not self._dispatcher:
            self._dispatcher.join(timeout=5)

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def root(self) -> str:
        return self._root

    @property
    def connect_string(self) -> str:
        return self._connect_string

    @property
    def auth(self) -> ZkAuth | None:
        """The credentials this store authenticates with (None: open ACLs)."""
        return self._auth

    @property
    def acl_mode(self) -> AclMode:
        """``open`` (no credentials), ``migrating`` (credentials, root still open) or ``secured``."""
        return self._acl_mode

    def _check_access(self) -> None:
        """Read the root's children (ZooKeeper checks READ there; it does not on ``exists``) so that refused
        credentials fail now, with a clear message; with credentials, learn the root's ACL mode."""
        full = self._root
        try:
            self._wait(self._client.get_children_async(full), full)
            if self._auth is not None:
                self._refresh_acl_mode()
        except MetadataAuthError:
            if self._auth is None:
                raise MetadataAuthError(
                    "this metadata root is protected by ZooKeeper ACLs and this process has no credentials: "
                    "set LEDGERSTORE_ZK_AUTH=user:password (or LEDGERSTORE_ZK_AUTH_FILE=/path)",
                    path=full,
                ) from None
            raise MetadataAuthError(
                f"ZooKeeper refused user {self._auth.user!r} on this metadata root: wrong password, or the tree "
                "is secured for another user",
                path=full,
            ) from None

    def _refresh_acl_mode(self) -> None:
        acls, _stat = self._wait(self._client.get_acls_async(self._root), self._root)
        self._acl_mode = mode_of(acls)
        self._acl_checked_at = time.monotonic()

    def _new_acl(self) -> list[ACL] | None:
        """The ACL for a znode created now (None: kazoo's open default)."""
        if self._auth is None:
            return None
        if self._acl_mode == "migrating" and time.monotonic() - self._acl_checked_at > ACL_REFRESH_S:
            self._acl_checked_at = time.monotonic()
            try:
                self._refresh_acl_mode()
            except MetadataError as e:  # keep the last mode: still readable by everybody
                log.warning("could not re-read the ACL of %s: %s", self._root, e)
        return self._auth.acl(self._acl_mode)

    @property
    def session_timeout_s(self) -> float:
        """The session timeout ZooKeeper granted this client's session (the one asked for clamped to the server's
        min/max session timeouts; the one asked for until a session started)."""
        granted = getattr(self._client, _NEGOTIATED, None)
        if isinstance(granted, int) and granted > 0:
            return granted / 1000.0
        return float(getattr(self._client, "_session_timeout", 10_000)) / 1000.0

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connected(self) -> bool:
        return not self._closed and bool(self._client.connected)

    @property
    def session_id(self) -> int | None:
        """The current ZooKeeper session id (changes after an expiry), or None when not connected."""
        cid = self._client.client_id
        return int(cid[0]) if cid else None

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """``(session id, session password)``; tests use it to force a session expiry."""
        cid = self._client.client_id
        return (int(cid[0]), bytes(cid[1])) if cid else None

    @property
    def kazoo(self) -> KazooClient:
        """The underlying kazoo client (escape hatch: its exceptions are *not* translated)."""
        return self._client

    def wait_connected(self, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.connected:
                return True
            time.sleep(0.02)
        return self.connected

    # --- session listeners ------------------------------------------------------------------------------------

    def add_session_listener(self, cb: SessionListener) -> None:
        """Call ``cb(state)`` on every session state change: ``"CONNECTED"``, ``"SUSPENDED"`` (connection lost,
        session may survive) or ``"LOST"`` (session expired: ephemeral znodes are gone; a new session follows
        with ``"CONNECTED"``). Callbacks run in order on one dispatcher thread; exceptions are logged."""
        with self._listeners_lock:
            self._listeners.append(cb)

    def remove_session_listener(self, cb: SessionListener) -> None:
        with self._listeners_lock, contextlib.suppress(ValueError):
            self._listeners.remove(cb)

    def _on_kazoo_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: must not block.
        mapping: dict[str, SessionState] = {
            KazooState.CONNECTED: "CONNECTED",
            KazooState.SUSPENDED: "SUSPENDED",
            KazooState.LOST: "LOST",
        }
        ours = mapping.get(state)
        if ours is not None and not self._closed:
            self._events.put(ours)

    def _dispatch_loop(self) -> None:
        while True:
            state = self._events.get()
            if state is None:
                return
            with self._listeners_lock:
                listeners = list(self._listeners)
            for cb in listeners:
                try:
                    cb(state)
                except Exception:
                    log.exception("session listener %r failed on %s", cb, state)

    # --- plumbing ---------------------------------------------------------------------------------------------

    def abs_path(self, path: str) -> str:
        """The absolute znode path of a store-relative ``path`` (``""`` is the root)."""
        rel = path.strip("/")
        if rel:
            for comp in rel.split("/"):
                if comp in ("", ".", ".."):
                    raise ValueError(f"invalid znode path {path!r}")
        if not rel:
            return self._root
        return f"{self._root}/{rel}" if self._root != "/" else f"/{rel}"

    def rel_path(self, abs_path: str) -> str:
        if self._root == "/":
            return abs_path.lstrip("/")
        if abs_path == self._root:
            return ""
        if not abs_path.startswith(self._root + "/"):
            raise ValueError(f"{abs_path!r} is outside the store root {self._root!r}")
        return abs_path[len(self._root) + 1 :]

    @contextlib.contextmanager
    def _translated(self, path: str | None) -> Iterator[None]:
        if self._closed:
            raise MetadataClosedError("metadata store is closed", path=path)
        try:
            yield
        except MetadataError:
            raise
        except Exception as e:
            raise translate(e, path) from e

    def _wait(self, async_result: Any, path: str) -> Any:
        with self._translated(path):
            try:
                return async_result.get(timeout=self._request_timeout_s)
            except self._client.handler.timeout_exception:
                raise MetadataConnectionError(
                    f"ZooKeeper did not answer within {self._request_timeout_s:g}s", path=path
                ) from None

    # --- typed JSON operations --------------------------------------------------------------------------------

    def get(self, path: str) -> Versioned[JsonDict]:
        """Read a JSON body. Raises :class:`MetadataNotFoundError` if absent, :class:`MetadataFormatError` if the
        body is not ours."""
        full = self.abs_path(path)
        with self._translated(full):
            data, stat = self._wait(self._client.get_async(full), full)
        try:
            return Versioned(decode_body(data, full), stat.version)
        except MetadataFormatError as e:
            e.version = stat.version
            raise

    def get_optional(self, path: str) -> Versioned[JsonDict] | None:
        try:
            return self.get(path)
        except MetadataNotFoundError:
            return None

    def stat(self, path: str) -> NodeStat | None:
        full = self.abs_path(path)
        st = self._wait(self._client.exists_async(full), full)
        return None if st is None else _node_stat(st)

    def exists(self, path: str) -> bool:
        return self.stat(path) is not None

    def create(
        self,
        path: str,
        value: Mapping[str, Any],
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = True,
    ) -> str:
        """Create a znode with a JSON body; returns its store-relative path (with the sequence suffix, if any).
        Missing parents are created as empty persistent znodes when ``makepath``. Raises
        :class:`MetadataExistsError` if it exists."""
        full = self.abs_path(path)
        data = encode_body(value)
        created = self._wait(
            self._client.create_async(
                full, data, acl=self._new_acl(), ephemeral=ephemeral, sequence=sequence, makepath=makepath
            ),
            full,
        )
        return self.rel_path(created)

    def ensure(self, path: str) -> None:
        """Make sure a (directory) znode exists, creating it and its parents with empty bodies."""
        full = self.abs_path(path)
        self._wait(self._client.ensure_path_async(full, self._new_acl()), full)

    def get_acl(self, path: str) -> tuple[list[ACL], int]:
        """A znode's ACL and its ACL version (``aversion``)."""
        full = self.abs_path(path)
        acls, stat = self._wait(self._client.get_acls_async(full), full)
        return list(acls), int(stat.aversion)

    def set_acl(self, path: str, acl: Sequence[ACL], version: int = -1) -> None:
        """Replace a znode's ACL (``version``: the expected ACL version, -1 = unconditional)."""
        full = self.abs_path(path)
        self._wait(self._client.set_acls_async(full, list(acl), version), full)

    def get_acl_many(self, paths: Sequence[str]) -> dict[str, tuple[list[ACL], int] | None]:
        """ACLs of many znodes with pipelined requests; ``None`` for znodes that do not exist."""
        fulls = [self.abs_path(p) for p in paths]
        with self._translated(None):
            pending = [self._client.get_acls_async(f) for f in fulls]
        out: dict[str, tuple[list[ACL], int] | None] = {}
        for p, f, res in zip(paths, fulls, pending, strict=True):
            try:
                acls, stat = self._wait(res, f)
                out[p] = (list(acls), int(stat.aversion))
            except MetadataNotFoundError:
                out[p] = None
        return out

    def set_acl_many(self, paths: Sequence[str], acl: Sequence[ACL]) -> int:
        """Set the same ACL on many znodes with pipelined requests; znodes gone meanwhile are skipped. Returns
        how many were set."""
        fulls = [self.abs_path(p) for p in paths]
        with self._translated(None):
            pending = [self._client.set_acls_async(f, list(acl), -1) for f in fulls]
        done = 0
        for f, res in zip(fulls, pending, strict=True):
            try:
                self._wait(res, f)
                done += 1
            except MetadataNotFoundError:
                pass
        return done

    def set(self, path: str, value: Mapping[str, Any], version: int) -> Versioned[JsonDict]:
        """Compare-and-set: write ``value`` only if the znode is still at ``version``. Raises
        :class:`MetadataVersionError` on a conflict, :class:`MetadataNotFoundError` if the znode is gone."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"set() needs the expected znode version (>= 0), got {version!r}")
        full = self.abs_path(path)
        data = encode_body(value)
        stat = self._wait(self._client.set_async(full, data, version), full)
        return Versioned(json.loads(data), stat.version)

    def update_guarded(
        self,
        path: str,
        fn: Callable[[JsonDict], Mapping[str, Any]],
        *,
        guard: str,
        retries: int = DEFAULT_UPDATE_RETRIES,
        default: Mapping[str, Any] | None = None,
    ) -> Versioned[JsonDict]:
        """:meth:`update` of ``path`` while the znode ``guard`` exists: each write is one ZooKeeper transaction
        with a check that ``guard`` is there, so that nothing is written once it is gone, even when it goes
        between the read and the write (what belongs to something deleted meanwhile is not created again).
        Raises :class:`MetadataNotFoundError` for ``guard`` when it is gone (with nothing written), else as
        :meth:`update`."""
        full, guard_full = self.abs_path(path), self.abs_path(guard)
        attempt = 0
        while True:
            current = self.get_optional(path)
            new = _updated(current, fn, default, full)
            if current is not None and dict(new) == current.value:
                if not self.exists(guard):
                    raise MetadataNotFoundError("znode does not exist", path=guard_full)
                return current
            data = encode_body(new)
            if current is None:
                self._ensure_parent(path, guard, guard_full)  # (a transaction's create makes no parents)
            with self._translated(full):
                tx = self._client.transaction()
                tx.check(guard_full, -1)  # any version: it exists
                if current is None:
                    tx.create(full, data, acl=self._new_acl())
                else:
                    tx.set_data(full, data, current.version)
            checked, written = self._wait(tx.commit_async(), full)
            # (a failed transaction answers an error for each operation: RolledBackError for one that would
            # have gone through)
            if isinstance(checked, Exception) and not isinstance(checked, kex.RolledBackError):
                raise translate(checked, guard_full)
            if not isinstance(written, Exception):
                return Versioned(json.loads(data), 0 if current is None else int(written.version))
            if not isinstance(written, (kex.BadVersionError, kex.NodeExistsError, kex.NoNodeError)):
                raise translate(written, full)
            attempt += 1  # a conflict (changed, created or deleted since the read): read again
            _after_conflict(attempt, retries, path)

    def create_checked(
        self,
        path: str,
        value: Mapping[str, Any],
        *,
        guard: str,
        guard_version: int,
        guard_write: Mapping[str, Any] | None = None,
    ) -> None:
        """Create ``path`` (its missing parents first) in one ZooKeeper transaction with a check that the znode
        ``guard`` is still at ``guard_version``, so that nothing is created once ``guard`` changed or went since
        the caller read it (a namespace marked deleted meanwhile). Raises :class:`MetadataVersionError` (changed)
        or :class:`MetadataNotFoundError` for ``guard`` (gone), :class:`MetadataExistsError` for ``path``;
        nothing created then (the parents made may stay, empty). ``guard_write``: ``guard`` written with this
        body at ``guard_version`` instead of checked, so that its version moves and another such create that
        read the same version fails (two creates counting the same room serialized)."""
        full, guard_full = self.abs_path(path), self.abs_path(guard)
        parent = path.rpartition("/")[0]
        if parent:
            self.ensure(parent)  # (a transaction's create makes no parents)
        data = encode_body(value)
        with self._translated(full):
            tx = self._client.transaction()
            if guard_write is None:
                tx.check(guard_full, guard_version)
            else:
                tx.set_data(guard_full, encode_body(guard_write), guard_version)
            tx.create(full, data, acl=self._new_acl())
        checked, created = self._wait(tx.commit_async(), full)
        if isinstance(checked, Exception) and not isinstance(checked, kex.RolledBackError):
            raise translate(checked, guard_full)
        if isinstance(created, Exception):
            raise translate(created, full)

    async def acreate_checked(self, path: str, value: Mapping[str, Any], **guarded: Any) -> None:
        """:meth:`create_checked` in a worker thread (``guarded``: its keywords, ``guard``, ``guard_version``,
        ``guard_write``)."""
        await self._run(self.create_checked, path, value, **guarded)

    def _ensure_parent(self, path: str, guard: str, guard_full: str) -> None:
        """The parents of ``path`` made for :meth:`update_guarded`. Those below ``guard`` (a managed ledger's
        ``cursors`` under its znode) are made one by one without their parents, so that a guard that is gone
        is never made again as their parent: :class:`MetadataNotFoundError` for ``guard`` instead."""
        parent = path.rpartition("/")[0]
        inside = guard.rstrip("/") + "/"
        if not (parent + "/").startswith(inside):
            self.ensure(parent)
            return
        below = parent[len(inside) :].split("/") if parent + "/" != inside else []
        at = guard.rstrip("/")
        for part in below:
            at = f"{at}/{part}"
            full = self.abs_path(at)
            try:
                self._wait(self._client.create_async(full, b"", acl=self._new_acl(), makepath=False), full)
            except MetadataExistsError:
                continue
            except MetadataNotFoundError:
                raise MetadataNotFoundError("znode does not exist", path=guard_full) from None

    async def aupdate_guarded(
        self,
        path: str,
        fn: Callable[[JsonDict], Mapping[str, Any]],
        *,
        guard: str,
        default: Mapping[str, Any] | None = None,
    ) -> Versioned[JsonDict]:
        """:meth:`update_guarded` in a worker thread (``fn`` runs there)."""
        return await self._run(self.update_guarded, path, fn, guard=guard, default=default)

    def delete(
        self, path: str, version: int = -1, *, recursive: bool = False, missing_ok: bool = False
    ) -> bool:
        """Delete a znode (``version`` -1 = unconditional). With ``recursive`` its whole subtree is removed
        (children first; the version check then applies to ``path`` itself). Returns False if it did not exist
        and ``missing_ok``; raises :class:`MetadataNotFoundError` otherwise."""
        full = self.abs_path(path)
        try:
            if recursive:
                for child in self._children_abs(full):
                    self._delete_tree(f"{full.rstrip('/')}/{child}")
            self._wait(self._client.delete_async(full, version), full)
            return True
        except MetadataNotFoundError:
            if missing_ok:
                return False
            raise

    def _children_abs(self, full: str) -> list[str]:
        return sorted(self._wait(self._client.get_children_async(full), full))

    def _delete_tree(self, full: str) -> None:
        for _attempt in range(10):
            try:
                for child in self._children_abs(full):
                    self._delete_tree(f"{full}/{child}")
                self._wait(self._client.delete_async(full), full)
                return
            except MetadataNotFoundError:
                return
            except MetadataNotEmptyError:  # a child appeared meanwhile: go again
                continue
        raise MetadataError("subtree keeps changing during a recursive delete", path=full)

    def children(self, path: str) -> list[str]:
        """Sorted child names. Raises :class:`MetadataNotFoundError` if ``path`` does not exist."""
        return self._children_abs(self.abs_path(path))

    def children_many(self, paths: Sequence[str]) -> dict[str, list[str] | None]:
        """Children of many znodes with pipelined requests; ``None`` for znodes that do not exist."""
        fulls = [self.abs_path(p) for p in paths]
        with self._translated(None):
            pending = [self._client.get_children_async(f) for f in fulls]
        out: dict[str, list[str] | None] = {}
        for p, f, res in zip(paths, fulls, pending, strict=True):
            try:
                out[p] = sorted(self._wait(res, f))
            except MetadataNotFoundError:
                out[p] = None
        return out

    def get_many(self, paths: Sequence[str]) -> dict[str, Versioned[JsonDict] | None]:
        """Bodies of many znodes with pipelined requests; ``None`` for znodes that do not exist."""
        fulls = [self.abs_path(p) for p in paths]
        with self._translated(None):
            pending = [self._client.get_async(f) for f in fulls]
        out: dict[str, Versioned[JsonDict] | None] = {}
        for p, f, res in zip(paths, fulls, pending, strict=True):
            try:
                data, stat = self._wait(res, f)
                out[p] = Versioned(decode_body(data, f), stat.version)
            except MetadataNotFoundError:
                out[p] = None
        return out

    # --- watches ----------------------------------------------------------------------------------------------

    def watch_data(self, path: str, cb: Callable[[Versioned[JsonDict] | None], object]) -> Callable[[], None]:
        """Call ``cb`` now and after every change of ``path`` with its ``Versioned`` body (``None`` while it does
        not exist). Runs on kazoo's callback thread: keep it short. Returns a function that cancels the watch."""
        full = self.abs_path(path)
        cancelled = threading.Event()

        def on_change(data: bytes | None, stat: Any) -> bool | None:
            if cancelled.is_set() or self._closed:
                return False
            try:
                value = None if stat is None else Versioned(decode_body(data, full), stat.version)
            except MetadataFormatError:
                log.warning("watch on %s: ignoring a body that is not ours", full)
                return None
            try:
                cb(value)
            except Exception:
                log.exception("data watch callback for %s failed", full)
            return None

        with self._translated(full):
            DataWatch(self._client, full, on_change)
        return cancelled.set

    def watch_children(self, path: str, cb: Callable[[list[str]], object]) -> Callable[[], None]:
        """Call ``cb(sorted children)`` now and after every change. ``path`` is created if missing (a children
        watch on a missing znode would stop). Returns a function that cancels the watch."""
        self.ensure(path)
        full = self.abs_path(path)
        cancelled = threading.Event()

        def on_change(children: list[str]) -> bool | None:
            if cancelled.is_set() or self._closed:
                return False
            try:
                cb(sorted(children))
            except Exception:
                log.exception("children watch callback for %s failed", full)
            return None

        with self._translated(full):
            ChildrenWatch(self._client, full, on_change)
        return cancelled.set

    # --- async twins (asyncio.to_thread) ----------------------------------------------------------------------

    async def _run(self, fn: Callable[..., _R], *args: Any, **kwargs: Any) -> _R:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def aget(self, path: str) -> Versioned[JsonDict]:
        return await self._run(self.get, path)

    async def aget_optional(self, path: str) -> Versioned[JsonDict] | None:
        return await self._run(self.get_optional, path)

    async def aexists(self, path: str) -> bool:
        return await self._run(self.exists, path)

    async def acreate(
        self,
        path: str,
        value: Mapping[str, Any],
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = True,
    ) -> str:
        return await self._run(
            self.create, path, value, ephemeral=ephemeral, sequence=sequence, makepath=makepath
        )

    async def aset(self, path: str, value: Mapping[str, Any], version: int) -> Versioned[JsonDict]:
        return await self._run(self.set, path, value, version)

    async def adelete(
        self, path: str, version: int = -1, *, recursive: bool = False, missing_ok: bool = False
    ) -> bool:
        return await self._run(self.delete, path, version, recursive=recursive, missing_ok=missing_ok)

    async def achildren(self, path: str) -> list[str]:
        return await self._run(self.children, path)

    async def aephemeral_ours(self, path: str) -> bool | None:
        """Whether the znode at ``path`` is an ephemeral of this client's current ZooKeeper session (False: of
        another session, or not ephemeral); None when there is no such znode or this client has no session."""
        st = await asyncio.to_thread(self.stat, path)
        session = self.session_id
        if st is None or session is None:
            return None
        return st.ephemeral_owner == session

    async def aowns_ephemeral(self, path: str) -> bool:
        """Whether the ephemeral znode at ``path`` is this client's current ZooKeeper session's."""
        return await self.aephemeral_ours(path) is True

    async def adelete_own_ephemeral(self, path: str) -> None:
        """Delete the ephemeral znode at ``path`` only while it is this session's, at the version read: another
        session's (another process of the same id, or one that took the name since) is left alone."""
        st = await asyncio.to_thread(self.stat, path)
        if st is not None and st.ephemeral_owner == self.session_id:
            with contextlib.suppress(MetadataVersionError):
                await self.adelete(path, st.version, missing_ok=True)

    async def aupdate(
        self,
        path: str,
        fn: Callable[[JsonDict], Mapping[str, Any]],
        *,
        retries: int = DEFAULT_UPDATE_RETRIES,
        default: Mapping[str, Any] | None = None,
    ) -> Versioned[JsonDict]:
        """Note: ``fn`` runs in the worker thread, not on the event loop."""
        return await self._run(self.update, path, fn, retries=retries, default=default)

    async def aclose(self) -> None:
        await self._run(self.close)
