"""Bookie identity: cookies in ZooKeeper (``cookies/<bookie id>``) and in every data directory (``COOKIE``).

A cookie records which bookie owns which directories in which cluster (``/INSTANCEID``). On start a bookie reads
the ZooKeeper cookie and the cookie of each of its directories and asks the pure :func:`verify_cookies`:

* nothing anywhere -> ``NEW``: a brand-new bookie; write the local cookies, then the ZooKeeper one;
* everything present and equal to what this start expects -> ``OK``;
* anything else -> :class:`CookieMismatchError` with an operator-facing explanation. The dangerous case is a
  ZooKeeper cookie with a missing local cookie: the disk was wiped or swapped, and a wiped bookie that answers
  NO_ENTRY during recovery can make the cluster lose acknowledged entries, so it must not start.

:func:`ensure_cookies` does the whole dance (reads, verdict, writes).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zk import layout
from zk.client import FORMAT_VERSION, JsonDict, MetadataStore, decode_body, encode_body
from zk.errors import (
    CookieMismatchError,
    MetadataError,
    MetadataExistsError,
    MetadataFormatError,
    MetadataNotFoundError,
)
from zk.versioned import Versioned

COOKIE_FILE = "COOKIE"


@dataclass(frozen=True)
class Cookie:
    bookie_id: str
    journal_dir: str
    ledger_dirs: tuple[str, ...]
    instance_id: str
    format_version: int = field(default=FORMAT_VERSION, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.ledger_dirs, tuple):
            object.__setattr__(self, "ledger_dirs", tuple(self.ledger_dirs))
        for name in ("bookie_id", "journal_dir", "instance_id"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise MetadataFormatError(f"cookie {name} must be a non-empty string")
        if not self.ledger_dirs or not all(isinstance(d, str) and d for d in self.ledger_dirs):
            raise MetadataFormatError("cookie ledger_dirs must be a non-empty list of paths")

    def directories(self) -> tuple[str, ...]:
        """Every directory that holds a local copy of this cookie: the journal dir, then the ledger dirs
        (duplicates removed, order kept). ``verify_cookies``'s ``locals`` follow this order."""
        return tuple(dict.fromkeys((self.journal_dir, *self.ledger_dirs)))

    def same_identity(self, other: Cookie) -> bool:
        return self == other  # format_version is not compared

    def to_json(self) -> JsonDict:
        return {
            "format_version": self.format_version,
            "bookie_id": self.bookie_id,
            "journal_dir": self.journal_dir,
            "ledger_dirs": list(self.ledger_dirs),
            "instance_id": self.instance_id,
        }

    @classmethod
    def from_json(cls, d: Any) -> Cookie:
        if not isinstance(d, dict) or not isinstance(d.get("ledger_dirs"), list):
            raise MetadataFormatError(f"not a cookie: {d!r}")
        return cls(
            bookie_id=d.get("bookie_id"),  # type: ignore[arg-type]
            journal_dir=d.get("journal_dir"),  # type: ignore[arg-type]
            ledger_dirs=tuple(d["ledger_dirs"]),
            instance_id=d.get("instance_id"),  # type: ignore[arg-type]
            format_version=d.get("format_version", FORMAT_VERSION),
        )


class CookieVerdict(enum.Enum):
    NEW = "NEW"  # no cookie anywhere: a new bookie; write them
    OK = "OK"  # all cookies present and matching


# --- cluster instance id --------------------------------------------------------------------------------------


def instance_id(store: MetadataStore, create: bool = True) -> str:
    """The cluster's instance id (a uuid at ``/INSTANCEID``), created on first use; concurrent creators agree
    (the first create wins, everybody then reads it). :class:`MetadataNotFoundError` if absent and not
    ``create``."""
    for _ in range(5):
        v = store.get_optional(layout.INSTANCEID)
        if v is not None:
            iid = v.value.get("instance_id")
            if not isinstance(iid, str) or not iid:
                raise MetadataFormatError("bad instance id body", path=store.abs_path(layout.INSTANCEID))
            return iid
        if not create:
            raise MetadataNotFoundError(
                "cluster has no instance id yet", path=store.abs_path(layout.INSTANCEID)
            )
        with contextlib.suppress(MetadataExistsError):
            store.create(layout.INSTANCEID, {"instance_id": str(uuid.uuid4())})
    raise MetadataNotFoundError("instance id keeps disappearing", path=store.abs_path(layout.INSTANCEID))


class NoClusterError(MetadataNotFoundError):
    """No cluster (instance id) under a root while a root of the same ZooKeeper that looks like it (a typo away,
    or above or below it) holds one: a mistyped --zk-root, most likely (the message names the roots that do)."""


def _edits(a: str, b: str, limit: int) -> int:
    """The number of single-character edits (insert, delete, replace, swap of two neighbours) from ``a`` to
    ``b``; any number above ``limit`` is returned as ``limit + 1``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if min(cur) > limit:
            return limit + 1
        prev2, prev = prev, cur
    return min(prev[-1], limit + 1)


def looks_mistyped(root: str, cluster_root: str) -> bool:
    """Whether ``root`` looks like a mistyped ``cluster_root``: the same but for case, one to two characters
    (``/ledgerstor``, ``/ledgerstore/prdo``), or above or below it (``/ledgerstore`` for ``/ledgerstore/prod``).
    Roots that differ only in their numbers (``/test-1``, ``/test-2``) or by more (one root per test run, per
    team) are separate clusters, which may share a ZooKeeper."""
    a, b = root.rstrip("/") or "/", cluster_root.rstrip("/") or "/"
    if a == b or "/" in (a, b):
        return False
    if a.lower() == b.lower() or a.startswith(b + "/") or b.startswith(a + "/"):
        return True
    if re.sub(r"\d+", "#", a) == re.sub(r"\d+", "#", b):
        return False
    return _edits(a, b, 2) <= 2


def cluster_roots(connect_string: str, near: str = "/") -> list[str]:
    """The roots of the ZooKeeper at ``connect_string`` that hold a cluster (an instance id): the top-level ones
    and, for a nested root ``near`` (``/ledgerstore/prod``), the children of each of its ancestors (its siblings
    ``/ledgerstore/…``) and of every top-level znode that is no cluster (``/ledgerstore/prod`` for a mistyped
    ``/ledgerstroe/prod``); none if it cannot be read."""
    steps = [s for s in near.split("/") if s]
    found: list[str] = []

    def look(top: MetadataStore, parents: list[str]) -> list[str]:
        """The children of ``parents`` that hold no cluster (those that do go to ``found``)."""
        others: list[str] = []
        try:
            listed = top.children_many(parents)
        except MetadataError:  # one of them unreadable (another cluster's ACL): the others one by one
            listed = {}
            for parent in parents:
                with contextlib.suppress(MetadataError):
                    listed[parent] = top.children(parent)
        for parent, children in listed.items():
            for c in children or ():
                path = f"{parent}/{c}" if parent else c
                if f"/{path}" in found:
                    continue
                if top.exists(f"{path}/{layout.INSTANCEID}"):
                    found.append(f"/{path}")
                elif not parent and c != "zookeeper":
                    others.append(path)
        return others

    with contextlib.suppress(MetadataError), MetadataStore.connect(connect_string, "/", timeout_s=5) as top:
        tops = look(top, [""])
        if len(steps) > 1:
            look(top, ["/".join(steps[:i]) for i in range(1, len(steps))])
            look(top, tops)
    return found


def existing_instance_id(store: MetadataStore) -> str | None:
    """The instance id of the cluster under ``store``'s root, or None when there is none and no root of its
    ZooKeeper that ``store``'s root looks like a typo of (``looks_mistyped``) holds one (a new deployment, or
    another cluster beside those there, whose first bookies have not created it yet). Raises
    :class:`NoClusterError`, naming those roots, when one does: ``store``'s root is then most likely a mistyped
    --zk-root, and what the connection and its client created there (znodes without a body: the root and those
    of its ancestors that were missing too, ``/ledgerstroe`` of ``/ledgerstroe/prod``) is removed again; under a
    root that was there before, nothing is (its znodes, bodiless or not, may be another process's)."""
    try:
        return instance_id(store, create=False)
    except MetadataNotFoundError:
        pass
    # (another process of this new cluster may have just created it under our own root)
    clusters = [
        root for root in cluster_roots(store.connect_string, store.root) if looks_mistyped(store.root, root)
    ]
    if not clusters:
        return None
    # (a root that was there is another process's, and so is all under it)
    if store.root != "/" and store.created_root is not None:
        with contextlib.suppress(MetadataError):
            for child in store.children(""):
                _remove_bodiless(store, child)
            store.remove_created_root()
    raise NoClusterError(
        f"no cluster under --zk-root {store.root} in ZooKeeper {store.connect_string} (no {store.root}/"
        f"{layout.INSTANCEID}; clusters there: {', '.join(clusters)})"
    )


def _remove_bodiless(store: MetadataStore, path: str) -> None:
    """Delete ``path`` and its descendants as long as none of them has a body: the directory znodes a connection
    and its client created to look in. A znode with a body stays, and so do its ancestors, as does anything
    another process adds meanwhile (the version and emptiness checks of the delete)."""
    for child in store.children(path):
        _remove_bodiless(store, f"{path}/{child}" if path else child)
    st = store.stat(path)
    if st is not None and st.data_length == 0 and st.num_children == 0:
        store.delete(path, st.version)


# --- ZooKeeper cookie -----------------------------------------------------------------------------------------


def read_zk_cookie(store: MetadataStore, bookie_id: str) -> Versioned[Cookie] | None:
    v = store.get_optional(layout.cookie_path(bookie_id))
    return None if v is None else v.map(Cookie.from_json)


def write_zk_cookie(store: MetadataStore, cookie: Cookie, version: int = -1) -> Versioned[Cookie]:
    """``version`` -1 creates (:class:`MetadataExistsError` if present); otherwise a CAS update.

    Creating a cookie makes a new bookie of that id: a decommission mark the id's previous bookie left
    (``bookies/decommissioning/<id>``, kept after its data moved off while it still ran) goes."""
    path = layout.cookie_path(cookie.bookie_id)
    if version == -1:
        from zk.underreplication import UnderReplicationManager

        store.create(path, cookie.to_json())
        UnderReplicationManager(store).end_decommission(cookie.bookie_id)
        return Versioned(cookie, 0)
    written = store.set(path, cookie.to_json(), version)
    return Versioned(cookie, written.version)


def delete_zk_cookie(store: MetadataStore, bookie_id: str, version: int = -1) -> bool:
    """True if a cookie was deleted."""
    return store.delete(layout.cookie_path(bookie_id), version, missing_ok=True)


# --- local cookie files ---------------------------------------------------------------------------------------


def read_local_cookie(directory: str | os.PathLike[str]) -> Cookie | None:
    """The cookie in ``directory/COOKIE``, or None if there is none (or the directory does not exist).
    An unreadable cookie raises :class:`CookieMismatchError`."""
    path = Path(directory) / COOKIE_FILE
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return Cookie.from_json(decode_body(data, str(path)))
    except MetadataFormatError as e:
        raise CookieMismatchError(
            f"cookie file {path} is unreadable ({e.message}); it was damaged or not written by ledgerstore. "
            "Refusing to start rather than guess this directory's identity."
        ) from None


def write_local_cookie(directory: str | os.PathLike[str], cookie: Cookie) -> None:
    """Atomically write ``directory/COOKIE`` (temp file + fsync + rename + fsync of the directory)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{COOKIE_FILE}.tmp.{os.getpid()}"
    encode_body(cookie.to_json())  # validates format_version
    with open(tmp, "wb") as f:
        f.write(json.dumps(cookie.to_json(), indent=2, sort_keys=True).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, d / COOKIE_FILE)
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def delete_local_cookie(directory: str | os.PathLike[str]) -> bool:
    try:
        (Path(directory) / COOKIE_FILE).unlink()
    except FileNotFoundError:
        return False
    return True


# --- the decision (pure) --------------------------------------------------------------------------------------


def format_hint(bookie_id: str) -> str:
    return f"ledgerstore bookie format --delete-cookie --bookie-id {bookie_id}"


def _dirs_text(c: Cookie) -> str:
    return f"journal_dir={c.journal_dir} ledger_dirs={list(c.ledger_dirs)}"


def _compare(found: Cookie, expected: Cookie, where: str) -> None:
    bid = expected.bookie_id
    if found.instance_id != expected.instance_id:
        raise CookieMismatchError(
            f"bookie {bid}: {where} belongs to cluster instance {found.instance_id}, but the ZooKeeper this bookie "
            f"uses is cluster instance {expected.instance_id}. The bookie points at the wrong ZooKeeper (check "
            "--zk and the root), or the cluster metadata was re-created. Refusing to start. If the old cluster is "
            f"gone for good, wipe this bookie's data directories and run `{format_hint(bid)}`."
        )
    if found.bookie_id != expected.bookie_id:
        raise CookieMismatchError(
            f"bookie {bid}: {where} belongs to bookie {found.bookie_id}. The bookie id changed (a different "
            "--advertised-address/--port/--bookie-id) or data directories were swapped between bookies. Restart "
            f"with --bookie-id {found.bookie_id} and its own directories; ledgers know bookies by id, so a renamed "
            "bookie would strand their data."
        )
    if found.directories() != expected.directories():
        raise CookieMismatchError(
            f"bookie {bid}: {where} records {_dirs_text(found)}, but this start uses {_dirs_text(expected)}. "
            "Directories were added, removed or moved. Start with the recorded directories; if they were moved "
            f"with their contents, `ledgerstore bookie updatecookie --bookie-id {bid} --data-dir DIR "
            "[--journal-dir DIR]` records the new ones; to change the layout otherwise, drain the bookie, wipe it "
            f"and run `{format_hint(bid)}`."
        )


def verify_cookies(zk: Cookie | None, locals: Sequence[Cookie | None], expected: Cookie) -> CookieVerdict:
    """Decide whether a bookie may start (pure: no I/O).

    ``zk`` is the cookie in ZooKeeper (or None), ``locals[i]`` the cookie found in ``expected.directories()[i]``
    (or None), ``expected`` what this start would write (its bookie id, directories and the cluster's current
    instance id). Returns ``NEW`` when there is no cookie anywhere, ``OK`` when every cookie matches
    ``expected``; raises :class:`CookieMismatchError` (with what happened and what to do) otherwise."""
    dirs = expected.directories()
    if len(locals) != len(dirs):
        raise ValueError(f"need one local cookie (or None) per directory {list(dirs)}, got {len(locals)}")
    bid = expected.bookie_id
    present = [(d, c) for d, c in zip(dirs, locals, strict=True) if c is not None]
    missing = [d for d, c in zip(dirs, locals, strict=True) if c is None]
    if zk is None:
        if not present:
            return CookieVerdict.NEW
        for d, c in present:  # another bookie's directories in this cluster (a second bookie on them)
            if c.instance_id == expected.instance_id and c.bookie_id != bid:
                _compare(c, expected, f"the cookie in {d}")
        raise CookieMismatchError(
            f"bookie {bid}: found a local cookie in {[d for d, _ in present]} but no cookie in ZooKeeper "
            f"(cookies/{bid}). Either this bookie points at a different ZooKeeper than the one that registered "
            "it (check --zk and the root), the cluster metadata was wiped, or the ZooKeeper cookie was deleted. "
            "Its data may belong to another cluster, so it will not start. Point it at the right ZooKeeper; to "
            f"reuse this machine as a new, empty bookie, wipe its data directories and run `{format_hint(bid)}`."
        )
    for d, c in present:
        _compare(c, expected, f"the cookie in {d}")
    if missing:
        raise CookieMismatchError(
            f"bookie {bid} is registered in ZooKeeper (cookies/{bid}) but has no cookie in {missing}: the data "
            "directory looks wiped or swapped (a new disk, a reformatted volume, or a wrong --data-dir). It may "
            "have lost entries it acknowledged, and a wiped bookie answering NO_ENTRY during recovery could lose "
            "acknowledged data for good, so it will not start. Restore the original directory; if you are "
            f"replacing this bookie on purpose, run `{format_hint(bid)}` first (and let the ledgers be "
            "re-replicated)."
        )
    _compare(zk, expected, f"its ZooKeeper cookie (cookies/{bid})")
    return CookieVerdict.OK


def ensure_cookies(store: MetadataStore, expected: Cookie) -> CookieVerdict:
    """Read every cookie, run :func:`verify_cookies`, and on ``NEW`` write the local cookies, then the ZooKeeper
    cookie (a concurrent start of the same bookie id that wins the ZooKeeper create makes this one re-verify and
    fail). Returns the verdict; raises :class:`CookieMismatchError` if the bookie must not start."""
    dirs = expected.directories()
    zk_cookie = read_zk_cookie(store, expected.bookie_id)
    found = [read_local_cookie(d) for d in dirs]
    verdict = verify_cookies(zk_cookie.value if zk_cookie else None, found, expected)
    if verdict is CookieVerdict.NEW:
        for d in dirs:
            write_local_cookie(d, expected)
        try:
            write_zk_cookie(store, expected)
        except MetadataExistsError:
            zk_cookie = read_zk_cookie(store, expected.bookie_id)
            return verify_cookies(zk_cookie.value if zk_cookie else None, [expected] * len(dirs), expected)
    return verdict
