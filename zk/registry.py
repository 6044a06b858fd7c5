"""Bookie discovery: ephemeral znodes ``bookies/available/<id>`` (writable) and ``bookies/readonly/<id>``.

A bookie registers once; the registry keeps the registration alive across ZooKeeper session expiry by
re-creating the znode when the store reports a new session (``"CONNECTED"`` after ``"LOST"``). Bookie ids look
like ``"127.0.0.1:3181"`` (``':'`` is fine in znode names). The body is the bookie's ``info`` dict (e.g. host,
port, http_port) plus ``format_version`` and ``session_timeout_ms``, the session timeout ZooKeeper granted the
session that registered it (a restart waits that long, at most ``REGISTERED_SESSION_TIMEOUT_MAX_S``, for a crashed
process's registration to go; a body without it, written by an older bookie, or with something else than a positive
number, reads as 0: not known). Discovery returns the ``info`` only.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from zk import layout
from zk.client import JsonDict, MetadataStore, SessionState
from zk.errors import (
    MetadataError,
    MetadataExistsError,
    MetadataFormatError,
    MetadataNotFoundError,
    MetadataVersionError,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BookieRecord:
    bookie_id: str
    info: JsonDict
    readonly: bool


#: The body's key for the session timeout (ms) ZooKeeper granted the session that registered the bookie.
SESSION_TIMEOUT_KEY = "session_timeout_ms"


def _strip(value: JsonDict) -> JsonDict:
    """A registration's ``info``: its body less what the registry adds."""
    return {k: v for k, v in value.items() if k not in ("format_version", SESSION_TIMEOUT_KEY)}


#: The longest session timeout a registration's body is believed (s): a restart waits for the old registration to
#: go (holding the registry's lock) for no longer than this + 2 s, whatever a corrupt or foreign body says. The
#: ZooKeeper this project starts grants at most 60 s (zk/launcher.py's maxSessionTimeout; ZooKeeper's own
#: default is 20 x tickTime, 40 s). A registration of a session granted more that is still there then is
#: refused as another live process's (MetadataExistsError), and a later restart succeeds.
REGISTERED_SESSION_TIMEOUT_MAX_S = 60.0


def registered_timeout_s(value: JsonDict) -> float:
    """The session timeout a registration's body (a bookie's or a broker's) says its session was granted (s), at
    most :data:`REGISTERED_SESSION_TIMEOUT_MAX_S`; 0 when it does not say (an older process's) or says something
    that is not a positive number (NaN too)."""
    ms = value.get(SESSION_TIMEOUT_KEY)
    if isinstance(ms, bool) or not isinstance(ms, int | float) or not ms > 0:
        return 0.0
    # (the bound first: an int too large for a float, or infinity, is the bound)
    return float(min(ms, REGISTERED_SESSION_TIMEOUT_MAX_S * 1000.0)) / 1000.0


class BookieRegistry:
    """Registration (for a bookie process) and discovery (for clients) of bookies. Thread-safe.

    ``stale_wait_s``: when a bookie restarts quickly, its previous session's znode may linger until that session
    expires; :meth:`register` waits up to this long for it to go away (default: the longer of the session timeouts
    ZooKeeper granted this session and the one that registered it, kept in its body, + 2 s) before failing with
    :class:`MetadataExistsError` ("another live process uses this bookie id")."""

    def __init__(self, store: MetadataStore, *, stale_wait_s: float | None = None) -> None:
        self._store = store
        self._stale_wait_s = stale_wait_s
        self._lock = threading.RLock()
        self._registered: dict[str, tuple[JsonDict, bool]] = {}
        self._closed = False
        #: Number of times a registration was re-created after a session expiry (for tests and metrics).
        self.reregistrations = 0
        store.ensure(layout.BOOKIES_AVAILABLE)
        store.ensure(layout.BOOKIES_READONLY)
        store.add_session_listener(self._on_session)

    # --- registration (bookie side) ---------------------------------------------------------------------------

    def register(self, bookie_id: str, info: Mapping[str, Any], readonly: bool = False) -> None:
        """Create (or update) this bookie's ephemeral znode; switching ``readonly`` moves it between
        ``available`` and ``readonly`` (the new znode is created before the old one is deleted)."""
        layout.check_znode_name(bookie_id, "bookie id")
        body = dict(info)
        with self._lock:
            if self._closed:
                raise MetadataError("bookie registry is closed")
            self._put(bookie_id, body, readonly)
            self._registered[bookie_id] = (body, readonly)

    def unregister(self, bookie_id: str) -> None:
        """Remove this process's registration of ``bookie_id`` (a znode owned by another session is left alone)."""
        with self._lock:
            self._registered.pop(bookie_id, None)
            for path in (layout.available_bookie_path(bookie_id), layout.readonly_bookie_path(bookie_id)):
                self._delete_if_ours(path)

    def registered(self) -> dict[str, bool]:
        """Bookie ids this registry keeps alive -> readonly flag."""
        with self._lock:
            return {bid: ro for bid, (_info, ro) in self._registered.items()}

    def close(self, *, unregister: bool = True) -> None:
        """Stop re-registering; with ``unregister`` also delete the znodes now (else they go with the session)."""
        with self._lock:
            self._closed = True
            self._store.remove_session_listener(self._on_session)
            if unregister and not self._store.closed:
                for bid in list(self._registered):
                    try:
                        self.unregister(bid)
                    except MetadataError as e:
                        log.warning("could not unregister bookie %s: %s", bid, e)
            self._registered.clear()

    def _wait_limit(self) -> float:
        if self._stale_wait_s is not None:
            return self._stale_wait_s
        return self._store.session_timeout_s + 2.0

    def _put(self, bookie_id: str, info: JsonDict, readonly: bool) -> None:
        target = (
            layout.readonly_bookie_path(bookie_id) if readonly else layout.available_bookie_path(bookie_id)
        )
        other = (
            layout.available_bookie_path(bookie_id) if readonly else layout.readonly_bookie_path(bookie_id)
        )
        self._ensure_ephemeral(target, info)
        self._delete_if_ours(other)

    def _ensure_ephemeral(self, path: str, info: JsonDict) -> None:
        body = {**info, SESSION_TIMEOUT_KEY: round(self._store.session_timeout_s * 1000)}
        began = time.monotonic()
        deadline = began + self._wait_limit()
        said = False
        holders: set[int] = set()  # the other sessions whose registration's body was read
        while True:
            try:
                self._store.create(path, body, ephemeral=True)
                return
            except MetadataExistsError:
                pass
            st = self._store.stat(path)
            if st is None:
                continue
            if (
                self._stale_wait_s is None
                and st.ephemeral_owner != self._store.session_id
                and st.ephemeral_owner not in holders
            ):
                # a crashed bookie's session lasts the timeout it was granted, longer than ours if ZooKeeper's
                # min/max session timeouts changed since, or it asked for more
                holders.add(st.ephemeral_owner)
                with contextlib.suppress(MetadataNotFoundError, MetadataFormatError):
                    old = self._store.get(path)
                    deadline = max(deadline, began + registered_timeout_s(old.value) + 2.0)
            if st.ephemeral_owner != self._store.session_id and not said:
                # said once: a restart right after a crash waits here up to a session timeout
                said = True
                log.warning(
                    "%s is registered by another ZooKeeper session (0x%x): waiting up to %.0fs for it to go (a "
                    "crashed bookie's registration goes when its session times out)",
                    self._store.abs_path(path),
                    st.ephemeral_owner,
                    max(0.0, deadline - time.monotonic()),
                )
            if st.ephemeral_owner == self._store.session_id:
                try:
                    current = self._store.get(path)
                    if {k: v for k, v in current.value.items() if k != "format_version"} != body:
                        self._store.set(path, body, current.version)
                    return
                except (MetadataNotFoundError, MetadataVersionError):
                    continue
            if time.monotonic() >= deadline:
                raise MetadataExistsError(
                    f"bookie id is already registered by another live ZooKeeper session (0x{st.ephemeral_owner:x}): "
                    "is another bookie running with the same id? (a crashed bookie's registration disappears "
                    "when its session times out)",
                    path=self._store.abs_path(path),
                )
            time.sleep(0.1)

    def _delete_if_ours(self, path: str) -> None:
        st = self._store.stat(path)
        if st is not None and st.ephemeral_owner == self._store.session_id:
            self._store.delete(path, st.version, missing_ok=True)

    def _on_session(self, state: SessionState) -> None:
        # Runs on the store's dispatcher thread; blocking is fine here.
        if state != "CONNECTED":
            return
        with self._lock:
            if self._closed:
                return
            for bid, (info, ro) in list(self._registered.items()):
                path = layout.readonly_bookie_path(bid) if ro else layout.available_bookie_path(bid)
                try:
                    st = self._store.stat(path)
                    if st is not None and st.ephemeral_owner == self._store.session_id:
                        continue
                    self._put(bid, info, ro)
                    self.reregistrations += 1
                    log.warning("re-registered bookie %s after a ZooKeeper session change", bid)
                except MetadataError as e:
                    log.error(
                        "could not re-register bookie %s: %s (will retry on the next reconnect)", bid, e
                    )

    # --- discovery (client side) ------------------------------------------------------------------------------

    def _list(self, parent: str) -> dict[str, JsonDict]:
        try:
            names = self._store.children(parent)
        except MetadataNotFoundError:
            return {}
        bodies = self._store.get_many([f"{parent}/{n}" for n in names])
        out: dict[str, JsonDict] = {}
        for n in names:
            v = bodies.get(f"{parent}/{n}")
            if v is not None:  # vanished between list and read
                out[n] = _strip(v.value)
        return out

    def available(self) -> dict[str, JsonDict]:
        """Writable bookies: id -> info (a bookie caught mid-move to readonly is not listed)."""
        avail = self._list(layout.BOOKIES_AVAILABLE)
        if avail:
            ro = set(self._store.children(layout.BOOKIES_READONLY))
            avail = {k: v for k, v in avail.items() if k not in ro}
        return avail

    def readonly(self) -> dict[str, JsonDict]:
        return self._list(layout.BOOKIES_READONLY)

    def all(self) -> dict[str, BookieRecord]:
        """Every registered bookie, writable or read-only."""
        out = {k: BookieRecord(k, v, False) for k, v in self._list(layout.BOOKIES_AVAILABLE).items()}
        out.update({k: BookieRecord(k, v, True) for k, v in self._list(layout.BOOKIES_READONLY).items()})
        return out

    def watch_available(self, cb: Callable[[list[str]], object]) -> Callable[[], None]:
        """``cb(sorted writable ids as listed under available/)`` now and on every change; returns a cancel fn."""
        return self._store.watch_children(layout.BOOKIES_AVAILABLE, cb)

    def watch_readonly(self, cb: Callable[[list[str]], object]) -> Callable[[], None]:
        return self._store.watch_children(layout.BOOKIES_READONLY, cb)
