"""AutoRecovery's znodes: under-replication marks, worker locks, the auditor election, enable/disable, the
on-demand audit trigger and bookies being decommissioned (BookKeeper's ``/ledgers/underreplication``).

Paths (relative to the store root; ``layout.py`` reserved the first two)::

    underreplicated/ledgers/NNN/NNNN/NNNN/NNNN/urLNNNN   persistent  a mark: {"missing": [ids], "drain": [ids],
                                                                     "count": n, "ctime_ms": t, "mtime_ms": t,
                                                                     "entries": [[id, first, last], ...]}
    underreplicated/locks/urL<19 digits>                  ephemeral   {"owner": worker id}
    underreplicated/auditor/ID_<10 digits>                ephemeral sequential  {"owner": id}; lowest = auditor
    underreplicated/disabled                              persistent  present: workers and auditor pause
    underreplicated/audit-request                         persistent  {"requested_ms": t}: run an audit now
    bookies/decommissioning/<bookie id>                   persistent  {"requested_ms": t}: move its data off

A mark names the bookies a ledger lacks: ``missing`` are bookies gone (or found without entries they should
hold), ``drain`` bookies still up whose entries are to move elsewhere (decommission). ``count`` is how many
times the ledger was marked, ``ctime_ms`` when it was first marked (the open-ledger grace period and the
oldest-mark metric count from it). ``entries`` (optional) names, for a bookie that reported damage itself (its
scrubber, ``bookie/scrub.py``), the entry ranges it lacks; the bookie is in ``missing`` too. A worker clears a mark only at the version it read, so a mark that gained a
bookie while the worker copied stays for another pass.
"""

from __future__ import annotations

import builtins
import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from zk import layout
from zk.client import JsonDict, MetadataStore
from zk.errors import MetadataExistsError, MetadataNotFoundError, MetadataVersionError
from zk.versioned import Versioned

__all__ = [
    "AUDITOR_ELECTION",
    "AUDIT_REQUEST",
    "DECOMMISSIONING",
    "DISABLED",
    "UnderReplicationManager",
    "UnderReplicationMark",
]

AUDITOR_ELECTION = f"{layout.UNDERREPLICATED}/auditor"
AUDITOR_PREFIX = "ID_"
DISABLED = f"{layout.UNDERREPLICATED}/disabled"
AUDIT_REQUEST = f"{layout.UNDERREPLICATED}/audit-request"
DECOMMISSIONING = f"{layout.BOOKIES}/decommissioning"


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, kw_only=True)
class UnderReplicationMark:
    ledger_id: int
    missing: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()
    count: int = 1
    ctime_ms: int = 0
    mtime_ms: int = 0
    #: (bookie, first entry id, last entry id): ranges a bookie reported lacking (its scrubber)
    entries: tuple[tuple[str, int, int], ...] = ()

    @property
    def bookies(self) -> tuple[str, ...]:
        """Every bookie the mark names, missing first."""
        return self.missing + tuple(b for b in self.drain if b not in self.missing)

    def undrained(self, bookie: str) -> UnderReplicationMark:
        """This mark without ``bookie`` among the bookies to drain (a decommission cancelled)."""
        return replace(self, drain=tuple(b for b in self.drain if b != bookie))

    def to_json(self) -> JsonDict:
        return {
            "ledger_id": self.ledger_id,
            "missing": sorted(self.missing),
            "drain": sorted(self.drain),
            "count": self.count,
            "ctime_ms": self.ctime_ms,
            "mtime_ms": self.mtime_ms,
            **({"entries": [list(r) for r in self.entries]} if self.entries else {}),
        }

    @classmethod
    def from_json(cls, ledger_id: int, d: JsonDict) -> UnderReplicationMark:
        return cls(
            ledger_id=ledger_id,
            missing=tuple(sorted(str(b) for b in d.get("missing", []))),
            drain=tuple(sorted(str(b) for b in d.get("drain", []))),
            count=int(d.get("count", 1)),
            ctime_ms=int(d.get("ctime_ms", 0)),
            mtime_ms=int(d.get("mtime_ms", 0)),
            entries=tuple(sorted((str(b), int(f), int(la)) for b, f, la in d.get("entries", []))),
        )


def _undrain(ledger_id: int, bookie: str, cur: JsonDict) -> JsonDict:
    return UnderReplicationMark.from_json(ledger_id, cur).undrained(bookie).to_json()


class UnderReplicationManager:
    """Typed access to AutoRecovery's znodes (see the module docstring). Thread-safe; blocking calls."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    # --- marks ------------------------------------------------------------------------------------------------

    def mark(
        self,
        ledger_id: int,
        missing: Iterable[str] = (),
        drain: Iterable[str] = (),
        entries: Iterable[tuple[str, int, int]] = (),
    ) -> Versioned[UnderReplicationMark]:
        """Mark ``ledger_id`` as lacking ``missing`` (gone) and ``drain`` (to move off) bookies, merged into an
        existing mark (its ``count`` goes up by one, its ``ctime_ms`` stays). ``entries``: (bookie, first, last)
        ranges a bookie lacks; each such bookie is marked missing."""
        ranges = {(str(b), int(f), int(la)) for b, f, la in entries}
        missing, drain = set(missing) | {b for b, _, _ in ranges}, set(drain)
        now = _now_ms()

        def merge(cur: JsonDict) -> JsonDict:
            old = UnderReplicationMark.from_json(ledger_id, cur)
            new = UnderReplicationMark(
                ledger_id=ledger_id,
                missing=tuple(sorted(set(old.missing) | missing)),
                drain=tuple(sorted(set(old.drain) | drain)),
                count=old.count + 1 if cur.get("ctime_ms") else 1,
                ctime_ms=old.ctime_ms or now,
                mtime_ms=now,
                entries=tuple(sorted(set(old.entries) | ranges)),
            )
            return new.to_json()

        v = self.store.update(layout.underreplicated_ledger_path(ledger_id), merge, default={})
        return Versioned(UnderReplicationMark.from_json(ledger_id, v.value), v.version)

    def get(self, ledger_id: int) -> Versioned[UnderReplicationMark] | None:
        v = self.store.get_optional(layout.underreplicated_ledger_path(ledger_id))
        return None if v is None else Versioned(UnderReplicationMark.from_json(ledger_id, v.value), v.version)

    def clear(self, ledger_id: int, version: int = -1) -> bool:
        """Remove the mark (only at ``version`` unless -1). False when it changed meanwhile or is gone."""
        try:
            return self.store.delete(layout.underreplicated_ledger_path(ledger_id), version, missing_ok=True)
        except MetadataVersionError:
            return False

    def list_ids(self) -> builtins.list[int]:
        """Ids of the marked ledgers, ascending (one pipelined getChildren round per tree level)."""
        level = [layout.UNDERREPLICATED_LEDGERS]
        for _ in range(layout.ledger_bucket_depth()):
            found = self.store.children_many(level)
            level = [f"{parent}/{c}" for parent in level for c in (found.get(parent) or []) if c.isdigit()]
            if not level:
                return []
        leaves = self.store.children_many(level)
        ids = []
        for parent in level:
            for leaf in leaves.get(parent) or []:
                try:
                    ids.append(layout.parse_underreplicated_ledger_path(f"{parent}/{leaf}"))
                except ValueError:
                    continue
        return sorted(ids)

    def list(self) -> dict[int, Versioned[UnderReplicationMark]]:
        """Every mark, by ledger id."""
        ids = self.list_ids()
        paths = {layout.underreplicated_ledger_path(i): i for i in ids}
        bodies = self.store.get_many(list(paths))
        out: dict[int, Versioned[UnderReplicationMark]] = {}
        for path, lid in paths.items():
            v = bodies.get(path)
            if v is not None:
                out[lid] = Versioned(UnderReplicationMark.from_json(lid, v.value), v.version)
        return out

    # --- worker locks (ephemeral: a dead worker's lock goes with its session) ---------------------------------

    def try_lock(self, ledger_id: int, owner: str) -> bool:
        try:
            self.store.create(layout.underreplicated_lock_path(ledger_id), {"owner": owner}, ephemeral=True)
            return True
        except MetadataExistsError:
            return False

    def unlock(self, ledger_id: int) -> None:
        """Release this session's lock of ``ledger_id`` (another session's lock is left alone)."""
        path = layout.underreplicated_lock_path(ledger_id)
        st = self.store.stat(path)
        if st is not None and st.ephemeral_owner == self.store.session_id:
            self.store.delete(path, st.version, missing_ok=True)

    def locks(self) -> dict[int, str]:
        """Held locks: ledger id -> owner."""
        try:
            names = self.store.children(layout.UNDERREPLICATED_LOCKS)
        except MetadataNotFoundError:
            return {}
        bodies = self.store.get_many([f"{layout.UNDERREPLICATED_LOCKS}/{n}" for n in names])
        out = {}
        for n in names:
            v = bodies.get(f"{layout.UNDERREPLICATED_LOCKS}/{n}")
            if v is not None and n.startswith(layout.UNDERREPLICATED_LEAF_PREFIX):
                out[int(n[len(layout.UNDERREPLICATED_LEAF_PREFIX) :])] = str(v.value.get("owner", ""))
        return out

    # --- auditor election -------------------------------------------------------------------------------------

    def volunteer(self, owner: str) -> str:
        """Enter the auditor election (an ephemeral sequential znode); returns its name."""
        path = self.store.create(
            f"{AUDITOR_ELECTION}/{AUDITOR_PREFIX}", {"owner": owner}, ephemeral=True, sequence=True
        )
        return path.rsplit("/", 1)[1]

    def candidates(self) -> builtins.list[str]:
        """Election znode names, lowest sequence first (the first is the auditor)."""
        try:
            names = self.store.children(AUDITOR_ELECTION)
        except MetadataNotFoundError:
            return []
        return sorted(
            (n for n in names if n.startswith(AUDITOR_PREFIX)), key=lambda n: n[len(AUDITOR_PREFIX) :]
        )

    def auditor(self) -> str | None:
        """The owner of the elected auditor, or None when nobody volunteers."""
        for name in self.candidates():
            v = self.store.get_optional(f"{AUDITOR_ELECTION}/{name}")
            if v is not None:
                return str(v.value.get("owner", name))
        return None

    def watch_election(self, cb: Callable[[builtins.list[str]], object]) -> Callable[[], None]:
        return self.store.watch_children(AUDITOR_ELECTION, cb)

    # --- enable / disable, audit requests ---------------------------------------------------------------------

    def enabled(self) -> bool:
        return not self.store.exists(DISABLED)

    def set_enabled(self, enabled: bool) -> None:
        if enabled:
            self.store.delete(DISABLED, missing_ok=True)
        else:
            try:
                self.store.create(DISABLED, {"since_ms": _now_ms()})
            except MetadataExistsError:
                pass

    def request_audit(self) -> None:
        self.store.update(AUDIT_REQUEST, lambda cur: {**cur, "requested_ms": _now_ms()}, default={})

    def watch_audit_requests(self, cb: Callable[[Any], object]) -> Callable[[], None]:
        return self.store.watch_data(AUDIT_REQUEST, cb)

    # --- decommissioning --------------------------------------------------------------------------------------

    def start_decommission(self, bookie_id: str) -> None:
        path = f"{DECOMMISSIONING}/{layout.check_znode_name(bookie_id, 'bookie id')}"
        try:
            self.store.create(path, {"requested_ms": _now_ms()})
        except MetadataExistsError:
            pass

    def end_decommission(self, bookie_id: str) -> None:
        self.store.delete(
            f"{DECOMMISSIONING}/{layout.check_znode_name(bookie_id, 'bookie id')}", missing_ok=True
        )

    def cancel_decommission(self, bookie_id: str) -> tuple[bool, builtins.list[int]]:
        """End a decommission of ``bookie_id`` that will not finish (its command died or was stopped): its
        ``bookies/decommissioning`` mark goes, so placement may choose it again, and the bookie leaves every
        mark's ``drain`` (a mark left naming no bookie goes too; a copy a worker has under way may still finish
        and swap, which moves data and loses none). Returns (it was being decommissioned, the ledgers whose
        marks named it to drain)."""
        was = bookie_id in self.decommissioning()
        self.end_decommission(bookie_id)
        changed = []
        for lid, v in self.list().items():
            if bookie_id not in v.value.drain:
                continue
            path = layout.underreplicated_ledger_path(lid)
            try:
                new = self.store.update(path, functools.partial(_undrain, lid, bookie_id))
            except MetadataNotFoundError:  # a worker cleared it meanwhile
                continue
            if not UnderReplicationMark.from_json(lid, new.value).bookies:
                self.clear(lid, new.version)
            changed.append(lid)
        return was, changed

    def decommissioning(self) -> set[str]:
        try:
            return set(self.store.children(DECOMMISSIONING))
        except MetadataNotFoundError:
            return set()
