"""ZooKeeper digest ACLs: the credentials every process reads from its configuration, the ACL each znode gets, and
the migration of an existing (open) tree.

Credentials (:func:`resolve_auth`, called by :meth:`zk.client.MetadataStore.connect`): an explicit ``auth``
argument (``ZkAuth``, ``("user", "password")`` or ``"user:password"``; ``False`` = none, ignoring the
environment), else ``LEDGERSTORE_ZK_AUTH=user:password``, else ``LEDGERSTORE_ZK_AUTH_FILE=/path`` (the file holds
``user:password``). Without any, everything is as before: open (``world:anyone``) znodes.

With credentials the session authenticates with the ``digest`` scheme (kazoo re-sends it on every reconnect and
new session) and the ACL of every znode it creates follows the root's (:func:`mode_of`):

* ``secured`` - the root admits only digest identities: new znodes get ``digest:<user>:<base64 sha1>`` with ALL
  permissions and nothing for ``world``. A fresh cluster started with credentials is secured from the start (the
  root is created that way).
* ``migrating`` - the root is still open (an existing cluster whose processes are being restarted with
  credentials): new znodes get the digest ACL *plus* ``world:anyone`` ALL, so processes not yet restarted can still
  read them. :func:`secure_tree` (``ledgerstore zk secure``) ends this phase; a migrating store re-reads the root's
  ACL at most every :data:`ACL_REFRESH_S` seconds when it creates a znode, and switches to ``secured``.

ZooKeeper's digest authentication itself never fails (a wrong password is just another identity), so a wrong
password shows up as ``NoAuth`` on the first read: ``MetadataStore.connect`` reads the root's children to turn that
into a :class:`~zk.errors.MetadataAuthError` at connect time. Note that ZooKeeper does not check ACLs on
``exists``: a stranger can still learn that a znode exists (and its stat), never its data or children.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeAlias

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import ACL, OPEN_ACL_UNSAFE, make_digest_acl, make_digest_acl_credential

from zk.errors import MetadataAuthError, MetadataNotFoundError

if TYPE_CHECKING:
    from zk.client import MetadataStore

ENV_AUTH = "LEDGERSTORE_ZK_AUTH"
ENV_AUTH_FILE = "LEDGERSTORE_ZK_AUTH_FILE"
#: How often (at most) a store in ``migrating`` mode re-reads the root's ACL before creating a znode.
ACL_REFRESH_S = 10.0
#: How many requests :func:`secure_tree` keeps in flight.
PIPELINE = 500

AclMode = Literal["open", "migrating", "secured"]


@dataclass(frozen=True)
class ZkAuth:
    """Digest credentials. ``repr`` never shows the password."""

    user: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.user or ":" in self.user or any(c.isspace() for c in self.user):
            raise MetadataAuthError(f"ZooKeeper user {self.user!r} must be non-empty, without ':' or spaces")
        if not self.password or "\n" in self.password or "\r" in self.password:
            raise MetadataAuthError("ZooKeeper password must be non-empty and on one line")

    @classmethod
    def parse(cls, text: str, source: str = "credentials") -> ZkAuth:
        """``user:password`` (the password may contain ``:``; surrounding whitespace is dropped)."""
        user, sep, password = text.strip().partition(":")
        if not sep:
            raise MetadataAuthError(f"{source}: expected 'user:password'")
        return cls(user, password)

    @property
    def credential(self) -> str:
        """What ``addauth digest`` sends: ``user:password``."""
        return f"{self.user}:{self.password}"

    @property
    def digest_id(self) -> str:
        """The identity ZooKeeper stores in ACLs: ``user:<base64 sha1(user:password)>``."""
        return str(make_digest_acl_credential(self.user, self.password))

    def acl(self, mode: AclMode = "secured") -> list[ACL]:
        """The ACL for a new znode in ``mode`` (``open``: world ALL)."""
        if mode == "open":
            return list(OPEN_ACL_UNSAFE)
        ours = make_digest_acl(self.user, self.password, all=True)
        return [ours] if mode == "secured" else [ours, *OPEN_ACL_UNSAFE]


#: What ``MetadataStore.connect(auth=...)`` accepts.
AuthLike: TypeAlias = ZkAuth | tuple[str, str] | str | Literal[False] | None


def resolve_auth(
    auth: AuthLike = None,
    env: Mapping[str, str] | None = None,
) -> ZkAuth | None:
    """The credentials to use: explicit ``auth``, else ``LEDGERSTORE_ZK_AUTH``, else the file named by
    ``LEDGERSTORE_ZK_AUTH_FILE``; None if there are none (or ``auth`` is False). Malformed or unreadable
    credentials raise :class:`MetadataAuthError` (never silently run without them)."""
    if auth is False:
        return None
    if isinstance(auth, ZkAuth):
        return auth
    if isinstance(auth, tuple):
        return ZkAuth(*auth)
    if isinstance(auth, str):
        return ZkAuth.parse(auth, "zk auth")
    if auth is not None:
        raise TypeError(
            f"auth must be ZkAuth, (user, password), 'user:password', False or None, not {auth!r}"
        )
    env = os.environ if env is None else env
    text = env.get(ENV_AUTH, "")
    if text.strip():
        return ZkAuth.parse(text, ENV_AUTH)
    path = env.get(ENV_AUTH_FILE, "")
    if path.strip():
        try:
            content = Path(path).read_text()
        except OSError as e:
            raise MetadataAuthError(f"{ENV_AUTH_FILE}={path}: cannot read the credentials ({e})") from None
        return ZkAuth.parse(content, f"{ENV_AUTH_FILE}={path}")
    return None


def mode_of(root_acl: Iterable[ACL]) -> AclMode:
    """``migrating`` while the root still admits ``world:anyone``, else ``secured``."""
    return "migrating" if any(a.id.scheme == "world" for a in root_acl) else "secured"


# --- migrating an existing tree -----------------------------------------------------------------------------


@dataclass
class SecureReport:
    """What :func:`secure_tree` found (and, unless ``dry_run``, changed). Paths are store-relative (``""`` =
    the root); ``changed_sample`` keeps the first 20."""

    dry_run: bool
    digest_id: str
    visited: int = 0
    changed: int = 0
    already: int = 0
    vanished: int = 0
    passes: int = 0
    changed_sample: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "dry_run": self.dry_run,
            "acl": f"digest:{self.digest_id}:cdrwa",
            "visited": self.visited,
            "changed": self.changed,
            "already": self.already,
            "vanished": self.vanished,
            "passes": self.passes,
            "changed_sample": self.changed_sample,
        }


def _same_acl(a: Sequence[ACL], b: Sequence[ACL]) -> bool:
    return sorted((x.perms, x.id.scheme, x.id.id) for x in a) == sorted(
        (x.perms, x.id.scheme, x.id.id) for x in b
    )


def _secure_pass(
    store: MetadataStore,
    target: list[ACL],
    report: SecureReport,
    progress: Callable[[SecureReport], object] | None,
) -> None:
    level = [""]  # the root first: from then on, running stores switch to creating secured znodes
    while level:
        nxt: list[str] = []
        for start in range(0, len(level), PIPELINE):
            chunk = level[start : start + PIPELINE]
            acls = store.get_acl_many(chunk)
            to_set = []
            for rel in chunk:
                got = acls[rel]
                if got is None:
                    report.vanished += 1
                    continue
                report.visited += 1
                if _same_acl(got[0], target):
                    report.already += 1
                    continue
                report.changed += 1
                if len(report.changed_sample) < 20:
                    report.changed_sample.append(rel)
                to_set.append(rel)
            if not report.dry_run:
                store.set_acl_many(to_set, target)
            kids = store.children_many(chunk)
            for rel in chunk:
                names = kids[rel]
                if names:
                    nxt.extend(f"{rel}/{n}" if rel else n for n in names)
            if progress is not None:
                progress(report)
        level = nxt
    report.passes += 1


def secure_tree(
    store: MetadataStore,
    *,
    dry_run: bool = False,
    settle_s: float = ACL_REFRESH_S + 2.0,
    progress: Callable[[SecureReport], object] | None = None,
) -> SecureReport:
    """Give every znode under the store's root (the root included, first) the store's digest ACL, ALL permissions,
    nothing for ``world``. Idempotent: znodes that already have exactly that ACL are left alone. ``dry_run``
    only counts.

    A second pass runs after ``settle_s`` (unless ``dry_run`` or ``settle_s`` is 0): processes still in
    ``migrating`` mode notice the secured root within :data:`ACL_REFRESH_S`; znodes they created meanwhile (with a
    ``world`` entry) are secured by that pass. The store must have been connected with credentials."""
    auth = store.auth
    if auth is None:
        raise MetadataAuthError(
            f"securing {store.root} needs credentials: pass --auth user:password or set {ENV_AUTH}"
        )
    target = auth.acl("secured")
    report = SecureReport(dry_run=dry_run, digest_id=auth.digest_id)
    _secure_pass(store, target, report, progress)
    if not dry_run and settle_s > 0:
        time.sleep(settle_s)
        second = SecureReport(dry_run=False, digest_id=auth.digest_id)
        _secure_pass(store, target, second, progress)
        report.changed += second.changed
        report.changed_sample.extend(second.changed_sample[: max(0, 20 - len(report.changed_sample))])
        report.passes += 1
    return report


# --- what a stranger sees -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StrangerReport:
    """What a client without credentials could do under the root: ``readable`` lists the store-relative paths
    whose data or children it read (empty = secured)."""

    checked: tuple[str, ...]
    readable: tuple[str, ...]

    @property
    def secured(self) -> bool:
        return not self.readable


def stranger_probe(
    connect_string: str, root: str, paths: Sequence[str] = ("",), *, timeout_s: float = 10.0
) -> StrangerReport:
    """Connect without credentials and try to read the data and the children of each store-relative path (the
    root by default). A path that does not exist counts as not readable."""
    client = KazooClient(hosts=connect_string, timeout=timeout_s)
    readable: list[str] = []
    try:
        client.start(timeout=timeout_s)
        for rel in paths:
            full = root.rstrip("/") + "/" + rel.strip("/") if rel.strip("/") else root
            for op in (client.get, client.get_children):
                try:
                    op(full)
                except (NoAuthError, NoNodeError):
                    continue
                readable.append(rel)
                break
    finally:
        with contextlib.suppress(Exception):
            client.stop()
            client.close()
    return StrangerReport(tuple(paths), tuple(readable))


def top_level(store: MetadataStore) -> list[str]:
    """The root's children (what ``zk secure`` probes as a stranger), or [] if the root is gone."""
    try:
        return store.children("")
    except MetadataNotFoundError:
        return []


def cli_secure(
    connect_string: str,
    root: str,
    *,
    auth: AuthLike = None,
    dry_run: bool = False,
    settle_s: float = ACL_REFRESH_S + 2.0,
    timeout_s: float = 10.0,
) -> tuple[str, dict[str, object]]:
    """``ledgerstore zk secure``: :func:`secure_tree` with ``auth`` (``user:password``; default: the
    environment), then :func:`stranger_probe` of the root and its children. Returns the human text and the JSON
    data (``stranger_readable`` lists what a client without credentials could still read: empty when secured)."""
    from zk.client import MetadataStore

    with MetadataStore.connect(connect_string, root, timeout_s=timeout_s, auth=auth) as store:
        if store.auth is None:
            raise MetadataAuthError(
                f"securing {root} needs credentials: pass --auth user:password or set {ENV_AUTH}"
            )
        report = secure_tree(store, dry_run=dry_run, settle_s=settle_s)
        probe = stranger_probe(connect_string, root, ["", *top_level(store)], timeout_s=timeout_s)
    data: dict[str, object] = {**report.to_json(), "root": root, "stranger_readable": list(probe.readable)}
    verb = "would change" if dry_run else "changed"
    human = (
        f"{root}: {report.visited} znodes, {verb} {report.changed}, already secured {report.already}"
        f" ({report.passes} pass{'es' if report.passes != 1 else ''}); a client without credentials "
        + (
            "reads nothing"
            if probe.secured
            else f"still reads {', '.join(p or '(root)' for p in probe.readable)}"
        )
    )
    return human, data
