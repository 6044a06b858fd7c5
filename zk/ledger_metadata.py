"""Ledger metadata: its value type, JSON form, state machine and CAS store (docs/architecture.md §7).

A ledger's znode (``layout.ledger_path``) holds::

    {"format_version": 1, "ledger_id": 7, "ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2,
     "state": "OPEN", "last_entry_id": -1, "length": 0,
     "ensembles": [{"first_entry_id": 0, "bookies": ["127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183"]}],
     "digest_type": "CRC32C", "password_digest": "v2$pbkdf2-sha256$100000$<salt hex>$<key hex>",
     "ctime_ms": 1700000000000, "custom_metadata": {"app": "eA=="}}

``password_digest`` has two formats, told apart by their shape (see :func:`password_hash`):

* version 2 (written by every ledger created now): ``v2$pbkdf2-sha256$<iterations>$<32 hex salt>$<64 hex key>``,
  PBKDF2-HMAC-SHA256 of the password with a random 16-byte salt: salted and slow, so a digest read from
  ZooKeeper is no cheap oracle for guessing the password;
* version 1 (ledgers created before): 64 lowercase hex characters, the unsalted SHA-256 of the password. Still
  read and checked, so old ledgers open and delete as before.

Every write through :class:`LedgerMetadataStore` is a compare-and-set that first runs :func:`check_transition`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import builtins
import dataclasses
import enum
import hashlib
import hmac
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from zk import layout
from zk.client import FORMAT_VERSION, SUPPORTED_FORMAT_VERSIONS, JsonDict, MetadataStore
from zk.errors import (
    InvalidMetadataError,
    MetadataExistsError,
    MetadataFormatError,
    MetadataTransitionError,
    MetadataVersionError,
)
from zk.idgen import IdGenerator
from zk.versioned import Versioned

_R = TypeVar("_R")

#: Compare-and-set conflicts in a row after which a metadata update gives up (``MetadataVersionError``).
CAS_RETRIES_MAX = 100

_HEX64 = re.compile(r"[0-9a-f]{64}")
_DIGEST_V2 = re.compile(r"v2\$pbkdf2-sha256\$([1-9][0-9]{0,8})\$([0-9a-f]{32})\$([0-9a-f]{64})")

#: PBKDF2 iterations of a version-2 password digest (its CPU cost: docs/benchmarks-history.md, "Password
#: digests"). Each digest records its own
#: count, so raising this later leaves existing ledgers readable. Every ``create_ledger`` pays it once; checks
#: that passed are remembered per process (``_VERIFIED``), so reopening a ledger does not pay it again.
PASSWORD_ITERATIONS = 100_000
PASSWORD_ITERATIONS_MAX = 10_000_000  # a digest asking for more is refused, not computed (a stored CPU bomb)
_VERIFIED_MAX = 4096
_VERIFIED: dict[tuple[str, bytes], None] = {}
_VERIFIED_LOCK = threading.Lock()


class LedgerState(enum.StrEnum):
    """A ledger's lifecycle state. Compares equal to its string value (``state == "OPEN"``)."""

    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


#: (old state, new state) pairs a metadata write may make (invariant 5).
ALLOWED_STATE_TRANSITIONS: frozenset[tuple[LedgerState, LedgerState]] = frozenset(
    {
        (LedgerState.OPEN, LedgerState.OPEN),
        (LedgerState.OPEN, LedgerState.IN_RECOVERY),
        (LedgerState.OPEN, LedgerState.CLOSED),
        (LedgerState.IN_RECOVERY, LedgerState.IN_RECOVERY),
        (LedgerState.IN_RECOVERY, LedgerState.CLOSED),
        (LedgerState.CLOSED, LedgerState.CLOSED),
    }
)

#: Fields fixed at creation.
IMMUTABLE_FIELDS = (
    "ledger_id",
    "ensemble_size",
    "write_quorum",
    "ack_quorum",
    "digest_type",
    "password_digest",
    "ctime_ms",
    "custom_metadata",
)


def password_digest_of(password: bytes) -> str:
    """The version-1 ``password_digest``: hex SHA-256 of the ledger password (unsalted; new ledgers store
    :func:`password_hash` instead; this stays for reading old ledgers and for tests that build metadata)."""
    if not isinstance(password, (bytes, bytearray, memoryview)):
        raise TypeError("password must be bytes")
    return hashlib.sha256(bytes(password)).hexdigest()


def password_hash(
    password: bytes, *, iterations: int = PASSWORD_ITERATIONS, salt: bytes | None = None
) -> str:
    """The version-2 ``password_digest`` of a new ledger: salted PBKDF2-HMAC-SHA256 (format in the module
    docstring)."""
    if not isinstance(password, (bytes, bytearray, memoryview)):
        raise TypeError("password must be bytes")
    if not 1 <= iterations <= PASSWORD_ITERATIONS_MAX:
        raise ValueError(f"iterations must be in 1..{PASSWORD_ITERATIONS_MAX}")
    salt = os.urandom(16) if salt is None else salt
    if len(salt) != 16:
        raise ValueError("salt must be 16 bytes")
    key = hashlib.pbkdf2_hmac("sha256", bytes(password), salt, iterations)
    return f"v2$pbkdf2-sha256${iterations}${salt.hex()}${key.hex()}"


def password_digest_version(digest: str) -> int:
    """1 or 2 for a well-formed ``password_digest``; 0 for anything else."""
    if not isinstance(digest, str):
        return 0
    if _HEX64.fullmatch(digest):
        return 1
    m = _DIGEST_V2.fullmatch(digest)
    if m and int(m.group(1)) <= PASSWORD_ITERATIONS_MAX:
        return 2
    return 0


def verify_password(digest: str, password: bytes) -> bool:
    """Whether ``password`` matches a stored ``password_digest`` of either version (constant-time compare).
    A match is remembered for the process (keyed by the digest and the password's SHA-256), so repeated
    opens of one ledger pay the slow hash once; a mismatch is never remembered."""
    if not isinstance(password, (bytes, bytearray, memoryview)):
        raise TypeError("password must be bytes")
    pw = bytes(password)
    memo = (digest, hashlib.sha256(pw).digest())
    with _VERIFIED_LOCK:
        if memo in _VERIFIED:
            return True
    if _HEX64.fullmatch(digest):
        ok = hmac.compare_digest(hashlib.sha256(pw).hexdigest(), digest)
    else:
        m = _DIGEST_V2.fullmatch(digest)
        if not m or int(m.group(1)) > PASSWORD_ITERATIONS_MAX:
            return False
        key = hashlib.pbkdf2_hmac("sha256", pw, bytes.fromhex(m.group(2)), int(m.group(1)))
        ok = hmac.compare_digest(key.hex(), m.group(3))
    if ok:
        _remember(memo)
    return ok


def remember_verified(digest: str, password: bytes) -> None:
    """Remember for this process that ``password`` matches ``digest``, as another process of the same job
    verified it (a Spark query's planning checks each ledger's password and hands the digest it checked to the
    query's tasks): :func:`verify_password` of that pair then costs no slow hash. A digest that is not the
    ledger's current one proves nothing: the memo is keyed by the digest, and another one is checked anew."""
    if not isinstance(password, (bytes, bytearray, memoryview)):
        raise TypeError("password must be bytes")
    _remember((digest, hashlib.sha256(bytes(password)).digest()))


def _remember(memo: tuple[str, bytes]) -> None:
    with _VERIFIED_LOCK:
        if memo not in _VERIFIED and len(_VERIFIED) >= _VERIFIED_MAX:
            _VERIFIED.pop(next(iter(_VERIFIED)))
        _VERIFIED[memo] = None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _invalid(msg: str) -> InvalidMetadataError:
    return InvalidMetadataError(msg)


@dataclass(frozen=True)
class Ensemble:
    """The bookies that store entries ``first_entry_id ..`` (up to the next ensemble's first entry - 1).
    Order matters: entry ``e`` goes to ``bookies[(e + i) % E]`` for ``i < Qw``."""

    first_entry_id: int
    bookies: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.bookies, tuple):
            if isinstance(self.bookies, (str, bytes)) or not isinstance(self.bookies, Sequence):
                raise _invalid(f"ensemble bookies must be a sequence of bookie ids, got {self.bookies!r}")
            object.__setattr__(self, "bookies", tuple(self.bookies))
        if not _is_int(self.first_entry_id) or self.first_entry_id < 0:
            raise _invalid(f"ensemble first_entry_id must be an int >= 0, got {self.first_entry_id!r}")
        if not self.bookies:
            raise _invalid("an ensemble needs at least one bookie")
        for b in self.bookies:
            try:
                layout.check_znode_name(b, "bookie id")
            except ValueError as e:
                raise _invalid(str(e)) from None
        if len(set(self.bookies)) != len(self.bookies):
            raise _invalid(f"ensemble at entry {self.first_entry_id} repeats a bookie: {list(self.bookies)}")

    def to_json(self) -> JsonDict:
        return {"first_entry_id": self.first_entry_id, "bookies": list(self.bookies)}

    @classmethod
    def from_json(cls, d: Any) -> Ensemble:
        if not isinstance(d, dict) or not isinstance(d.get("bookies"), list):
            raise MetadataFormatError(f"bad ensemble {d!r}: expected {{first_entry_id, bookies: [...]}}")
        try:
            return cls(first_entry_id=d.get("first_entry_id"), bookies=tuple(d["bookies"]))  # type: ignore[arg-type]
        except InvalidMetadataError as e:
            raise MetadataFormatError(e.message) from None


@dataclass(frozen=True, kw_only=True)
class LedgerMetadata:
    """Immutable ledger metadata. Construction validates every rule; use the ``with_*``/``close``/``replace``
    helpers to derive the next version."""

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ensembles: tuple[Ensemble, ...]
    password_digest: str
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    digest_type: str = "CRC32C"
    ctime_ms: int = field(default_factory=_now_ms)
    custom_metadata: dict[str, bytes] = field(default_factory=dict, hash=False)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for name in ("ledger_id", "ensemble_size", "write_quorum", "ack_quorum", "last_entry_id", "length"):
            if not _is_int(getattr(self, name)):
                raise _invalid(f"{name} must be an int, got {getattr(self, name)!r}")
        if not 0 <= self.ledger_id <= layout.MAX_LEDGER_ID:
            raise _invalid(f"ledger_id {self.ledger_id} out of range")
        e, qw, qa = self.ensemble_size, self.write_quorum, self.ack_quorum
        if not e >= qw >= qa >= 1:
            raise _invalid(
                f"need ensemble_size >= write_quorum >= ack_quorum >= 1, got E={e} Qw={qw} Qa={qa}"
            )
        try:
            set_(self, "state", LedgerState(self.state))
        except ValueError:
            raise _invalid(f"unknown ledger state {self.state!r}") from None
        if not isinstance(self.ensembles, tuple):
            set_(self, "ensembles", tuple(self.ensembles))
        if not self.ensembles:
            raise _invalid("a ledger needs at least one ensemble")
        prev = -1
        for ens in self.ensembles:
            if not isinstance(ens, Ensemble):
                raise _invalid(f"ensembles must hold Ensemble objects, got {ens!r}")
            if len(ens.bookies) != e:
                raise _invalid(
                    f"ensemble at entry {ens.first_entry_id} has {len(ens.bookies)} bookies, E={e}"
                )
            if ens.first_entry_id <= prev:
                raise _invalid("ensemble first_entry_ids must strictly increase")
            prev = ens.first_entry_id
        if self.ensembles[0].first_entry_id != 0:
            raise _invalid("the first ensemble must start at entry 0")
        if self.last_entry_id < -1 or self.length < 0:
            raise _invalid("last_entry_id must be >= -1 and length >= 0")
        if self.state is not LedgerState.CLOSED and (self.last_entry_id != -1 or self.length != 0):
            raise _invalid(f"a {self.state} ledger has last_entry_id -1 and length 0 (set only when closing)")
        if self.last_entry_id == -1 and self.length != 0:
            raise _invalid("an empty ledger (last_entry_id -1) has length 0")
        if not isinstance(self.digest_type, str) or not self.digest_type:
            raise _invalid("digest_type must be a non-empty string")
        if not password_digest_version(self.password_digest):
            raise _invalid(
                "password_digest must be 64 lowercase hex characters (sha256, version 1) or "
                "v2$pbkdf2-sha256$<iterations>$<32 hex salt>$<64 hex key> (version 2)"
            )
        if not _is_int(self.ctime_ms) or self.ctime_ms < 0:
            raise _invalid(f"ctime_ms must be an int >= 0, got {self.ctime_ms!r}")
        if not isinstance(self.custom_metadata, Mapping):
            raise _invalid("custom_metadata must be a mapping of str to bytes")
        cm = dict(self.custom_metadata)
        for k, v in cm.items():
            if not isinstance(k, str) or not isinstance(v, bytes):
                raise _invalid(f"custom_metadata must map str to bytes, got {k!r}: {type(v).__name__}")
        set_(self, "custom_metadata", cm)
        if not _is_int(self.format_version) or self.format_version not in SUPPORTED_FORMAT_VERSIONS:
            raise _invalid(f"unsupported format_version {self.format_version!r}")

    # --- derived views ----------------------------------------------------------------------------------------

    @property
    def last_ensemble(self) -> Ensemble:
        return self.ensembles[-1]

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def ensemble_at(self, entry_id: int) -> Ensemble:
        """The ensemble that stores ``entry_id`` (the last one starting at or before it)."""
        if not _is_int(entry_id) or entry_id < 0:
            raise ValueError(f"entry id must be an int >= 0, got {entry_id!r}")
        starts = [ens.first_entry_id for ens in self.ensembles]
        return self.ensembles[bisect.bisect_right(starts, entry_id) - 1]

    def check_password(self, password: bytes) -> bool:
        """Whether ``password`` is this ledger's (either digest version; slow for version 2 the first time)."""
        return verify_password(self.password_digest, password)

    # --- derivations (each returns a new, validated object) ---------------------------------------------------

    def replace(self, **changes: Any) -> LedgerMetadata:
        return dataclasses.replace(self, **changes)

    def with_state(self, state: LedgerState | str) -> LedgerMetadata:
        return self.replace(state=LedgerState(state))

    def with_new_ensemble(self, first_entry_id: int, bookies: Sequence[str]) -> LedgerMetadata:
        """Append an ensemble starting at ``first_entry_id``; if the last ensemble already starts there (no entry
        was written to it), replace it instead."""
        new = Ensemble(first_entry_id, tuple(bookies))
        if first_entry_id == self.last_ensemble.first_entry_id:
            return self.replace(ensembles=(*self.ensembles[:-1], new))
        return self.replace(ensembles=(*self.ensembles, new))

    def close(self, last_entry_id: int, length: int) -> LedgerMetadata:
        return self.replace(state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)

    # --- JSON -------------------------------------------------------------------------------------------------

    def to_json(self) -> JsonDict:
        return {
            "format_version": self.format_version,
            "ledger_id": self.ledger_id,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "state": self.state.value,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "ensembles": [ens.to_json() for ens in self.ensembles],
            "digest_type": self.digest_type,
            "password_digest": self.password_digest,
            "ctime_ms": self.ctime_ms,
            "custom_metadata": {
                k: base64.b64encode(v).decode("ascii") for k, v in sorted(self.custom_metadata.items())
            },
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LedgerMetadata:
        """Parse :meth:`to_json` output. Structural problems raise :class:`MetadataFormatError`, broken rules
        :class:`InvalidMetadataError`. Unknown keys are ignored (forward compatibility within a format)."""
        if not isinstance(d, Mapping):
            raise MetadataFormatError("ledger metadata must be a JSON object")
        required = (
            "format_version",
            "ledger_id",
            "ensemble_size",
            "write_quorum",
            "ack_quorum",
            "state",
            "last_entry_id",
            "length",
            "ensembles",
            "digest_type",
            "password_digest",
            "ctime_ms",
        )
        missing = [k for k in required if k not in d]
        if missing:
            raise MetadataFormatError(f"ledger metadata lacks {missing}")
        if not isinstance(d["ensembles"], list):
            raise MetadataFormatError("ledger metadata 'ensembles' must be a list")
        raw_cm = d.get("custom_metadata", {})
        if not isinstance(raw_cm, dict):
            raise MetadataFormatError("ledger metadata 'custom_metadata' must be an object")
        cm: dict[str, bytes] = {}
        for k, v in raw_cm.items():
            if not isinstance(v, str):
                raise MetadataFormatError(f"custom_metadata[{k!r}] must be a base64 string")
            try:
                cm[k] = base64.b64decode(v.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError) as e:
                raise MetadataFormatError(f"custom_metadata[{k!r}] is not base64: {e}") from None
        return cls(
            ledger_id=d["ledger_id"],
            ensemble_size=d["ensemble_size"],
            write_quorum=d["write_quorum"],
            ack_quorum=d["ack_quorum"],
            state=d["state"],
            last_entry_id=d["last_entry_id"],
            length=d["length"],
            ensembles=tuple(Ensemble.from_json(e) for e in d["ensembles"]),
            digest_type=d["digest_type"],
            password_digest=d["password_digest"],
            ctime_ms=d["ctime_ms"],
            custom_metadata=cm,
            format_version=d["format_version"],
        )


def check_transition(old: LedgerMetadata, new: LedgerMetadata) -> None:
    """Raise :class:`MetadataTransitionError` unless ``old -> new`` is a legal metadata write (invariant 5):

    * identical metadata is always fine (a no-op);
    * the fields fixed at creation (:data:`IMMUTABLE_FIELDS`) never change, ``format_version`` never decreases;
    * state moves only OPEN -> IN_RECOVERY -> CLOSED or OPEN -> CLOSED (or stays);
    * a CLOSED ledger's metadata never changes: not its last_entry_id, length nor ensembles, except that a bookie
      of an ensemble may be swapped, in place, for one not in that ensemble (re-replication, which copies the
      bookie's entries to its replacement first: :func:`check_bookie_swap`);
    * an OPEN ledger's *sealed* ensembles (all but the last: every entry they cover was acknowledged before the
      writer's ensemble change) take the same swap, in a write that changes nothing else (AutoRecovery
      re-replicating a lost bookie while the writer, alive, writes to its last ensemble);
    * ensembles are only appended, with first_entry_ids strictly increasing; earlier ensembles are unchanged,
      except that the *last* ensemble may be replaced by one starting at the same first_entry_id (an ensemble
      change before any entry reached it) - replace or append in one write, not both; except when
      recovery closes the ledger (IN_RECOVERY -> CLOSED): its write-back ensemble changes reach the metadata only
      with the close, so that one write may both replace the last ensemble and append more.
    """
    if new == old:
        return
    for name in IMMUTABLE_FIELDS:
        if getattr(old, name) != getattr(new, name):
            raise MetadataTransitionError(
                f"ledger {old.ledger_id}: {name} is fixed at creation and cannot change"
            )
    if new.format_version < old.format_version:
        raise MetadataTransitionError(f"ledger {old.ledger_id}: format_version cannot go backwards")
    if (old.state, new.state) not in ALLOWED_STATE_TRANSITIONS:
        raise MetadataTransitionError(
            f"ledger {old.ledger_id}: state {old.state} -> {new.state} is not allowed"
        )
    if old.state is LedgerState.CLOSED:
        if (new.last_entry_id, new.length) != (old.last_entry_id, old.length):
            raise MetadataTransitionError(
                f"ledger {old.ledger_id} is CLOSED at last_entry_id {old.last_entry_id}: "
                f"last_entry_id/length cannot change (to {new.last_entry_id}/{new.length})"
            )
        if new.ensembles != old.ensembles:
            check_bookie_swap(old, new)
        return
    o, n = old.ensembles, new.ensembles
    if len(n) < len(o):
        raise MetadataTransitionError(f"ledger {old.ledger_id}: ensembles cannot be removed")
    if (
        old.state is new.state is LedgerState.OPEN
        and len(n) == len(o)
        and n[-1] == o[-1]
        and n[:-1] != o[:-1]
        and (new.last_entry_id, new.length) == (old.last_entry_id, old.length)
    ):
        check_bookie_swap(old, new)  # a sealed ensemble's bookie swapped in place
        return
    if n[: len(o) - 1] != o[:-1]:
        raise MetadataTransitionError(f"ledger {old.ledger_id}: only the last ensemble may be replaced")
    cand = n[len(o) - 1]
    if cand != o[-1]:
        if cand.first_entry_id != o[-1].first_entry_id:
            raise MetadataTransitionError(
                f"ledger {old.ledger_id}: the last ensemble (from entry {o[-1].first_entry_id}) can only be replaced "
                f"by one starting at the same entry, not {cand.first_entry_id}"
            )
        recovery_close = old.state is LedgerState.IN_RECOVERY and new.state is LedgerState.CLOSED
        if len(n) > len(o) and not recovery_close:
            raise MetadataTransitionError(
                f"ledger {old.ledger_id}: replacing the last ensemble and appending another in one write"
            )
    # Appended ensembles start strictly after the previous ones: LedgerMetadata validation guarantees it.


def check_bookie_swap(old: LedgerMetadata, new: LedgerMetadata) -> None:
    """The one change a CLOSED ledger's ensembles (and an OPEN one's sealed ensembles) may take: re-replication
    moves a lost bookie's entries to another bookie, then swaps it in at the same position. Ensembles keep their count and first entry ids; in each,
    a changed position gets a bookie that was not in that ensemble, so no bookie changes position and every
    entry's write set keeps its other bookies (which still hold it)."""
    o, n = old.ensembles, new.ensembles
    if len(o) != len(n) or any(a.first_entry_id != b.first_entry_id for a, b in zip(o, n, strict=True)):
        raise MetadataTransitionError(
            f"ledger {old.ledger_id} is CLOSED: its ensembles cannot change, only have a bookie swapped in place"
        )
    for a, b in zip(o, n, strict=True):
        for was, now in zip(a.bookies, b.bookies, strict=True):
            if was != now and now in a.bookies:
                raise MetadataTransitionError(
                    f"ledger {old.ledger_id} is CLOSED: bookie {now} cannot move within the ensemble from entry "
                    f"{a.first_entry_id} (only a bookie not in it may take {was}'s place)"
                )


class LedgerMetadataStore:
    """CRUD + CAS for ledger metadata; every write is checked by :func:`check_transition`. Thread-safe.
    Async twins: ``acreate``, ``aread``, ``aupdate``, ``awrite``, ``adelete``, ``alist``."""

    def __init__(self, store: MetadataStore, *, idgen: IdGenerator | None = None) -> None:
        self.store = store
        self.idgen = idgen or IdGenerator(store)

    def create(
        self,
        *,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        bookies: Sequence[str],
        password: bytes | None = None,
        password_digest: str | None = None,
        digest_type: str = "CRC32C",
        custom_metadata: Mapping[str, bytes] | None = None,
        ledger_id: int | None = None,
        ctime_ms: int | None = None,
    ) -> Versioned[LedgerMetadata]:
        """Create an OPEN ledger whose first ensemble is ``bookies``. Give ``password`` (hashed here with
        :func:`password_hash`, version 2) or a ready ``password_digest`` (either version). Without ``ledger_id`` a fresh id comes from the id generator (an id that
        somebody created explicitly is skipped); with one, :class:`MetadataExistsError` if it is taken."""
        if (password is None) == (password_digest is None):
            raise ValueError("give exactly one of password / password_digest")
        digest = password_digest if password_digest is not None else password_hash(password or b"")

        def build(lid: int) -> LedgerMetadata:
            return LedgerMetadata(
                ledger_id=lid,
                ensemble_size=ensemble_size,
                write_quorum=write_quorum,
                ack_quorum=ack_quorum,
                ensembles=(Ensemble(0, tuple(bookies)),),
                password_digest=digest,
                digest_type=digest_type,
                custom_metadata=dict(custom_metadata or {}),
                ctime_ms=_now_ms() if ctime_ms is None else ctime_ms,
            )

        if ledger_id is not None:
            meta = build(ledger_id)
            self.store.create(layout.ledger_path(ledger_id), meta.to_json())
            return Versioned(meta, 0)
        build(0)  # validate before consuming an id
        for _ in range(100):
            meta = build(self.idgen.next_id())
            try:
                self.store.create(layout.ledger_path(meta.ledger_id), meta.to_json())
            except MetadataExistsError:
                continue
            return Versioned(meta, 0)
        raise MetadataExistsError("100 generated ledger ids in a row were already taken; is /idgen reset?")

    def _decode(self, ledger_id: int, v: Versioned[JsonDict]) -> Versioned[LedgerMetadata]:
        path = layout.ledger_path(ledger_id)
        try:
            meta = LedgerMetadata.from_json(v.value)
        except (MetadataFormatError, InvalidMetadataError) as e:
            raise MetadataFormatError(f"bad ledger metadata: {e.message}", path=path) from None
        if meta.ledger_id != ledger_id:
            raise MetadataFormatError(f"znode holds metadata of ledger {meta.ledger_id}", path=path)
        return Versioned(meta, v.version)

    def read(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        """Raises :class:`MetadataNotFoundError` if the ledger does not exist."""
        return self._decode(ledger_id, self.store.get(layout.ledger_path(ledger_id)))

    def exists(self, ledger_id: int) -> bool:
        return self.store.exists(layout.ledger_path(ledger_id))

    def write(
        self, ledger_id: int, new: LedgerMetadata, expected: int | Versioned[LedgerMetadata]
    ) -> Versioned[LedgerMetadata]:
        """One CAS attempt: write ``new`` if the znode is still at the expected version. ``expected`` is a version
        (the current value is then read to check the transition) or the ``Versioned`` you read (no extra read).
        Raises :class:`MetadataVersionError` on a conflict, :class:`MetadataTransitionError` if illegal."""
        if new.ledger_id != ledger_id:
            raise InvalidMetadataError(f"metadata of ledger {new.ledger_id} written to ledger {ledger_id}")
        if isinstance(expected, Versioned):
            old = expected
        else:
            old = self.read(ledger_id)
            if old.version != expected:
                raise MetadataVersionError(
                    f"ledger {ledger_id} is at version {old.version}, not {expected}",
                    path=layout.ledger_path(ledger_id),
                )
        check_transition(old.value, new)
        if new == old.value:
            return old
        written = self.store.set(layout.ledger_path(ledger_id), new.to_json(), old.version)
        return Versioned(new, written.version)

    def update(
        self,
        ledger_id: int,
        fn: Callable[[LedgerMetadata], LedgerMetadata],
        *,
        retries: int = CAS_RETRIES_MAX,
    ) -> Versioned[LedgerMetadata]:
        """CAS loop: read, ``new = fn(current)`` (raise to abort, return ``current`` for no write), check the
        transition, write; on a version conflict re-read and call ``fn`` again (:meth:`update_with`)."""
        return self.update_with(ledger_id, lambda md: (fn(md), None), retries=retries)[0]

    def update_with(
        self,
        ledger_id: int,
        transition: Callable[[LedgerMetadata], tuple[LedgerMetadata | None, _R]],
        *,
        current: Versioned[LedgerMetadata] | None = None,
        retries: int = CAS_RETRIES_MAX,
    ) -> tuple[Versioned[LedgerMetadata], _R]:
        """The compare-and-set loop every read-modify-write of a ledger's metadata goes through (the writer's
        close and ensemble changes, recovery's two state changes, re-replication's bookie swaps).

        Args:
            ledger_id: the ledger.
            transition: pure; maps the metadata found to ``(new, result)``: ``new`` is the metadata to write
                (``None``, or the same value: write nothing), ``result`` what the caller learns of it. It
                raises to give up (a state that forbids the change).
            current: the version the caller holds (no read before the first attempt), else a fresh read.
            retries: version conflicts after which to give up.

        Returns:
            The metadata as written (or as found, when nothing was written) and ``transition``'s result for it.

        Raises:
            MetadataVersionError: ``retries`` conflicts in a row.
            MetadataTransitionError: the new metadata is not a legal successor (:func:`check_transition`).
            MetadataNotFoundError: the ledger does not exist.
        """
        if current is None:
            current = self.read(ledger_id)
        for attempt in range(retries + 1):
            new, result = transition(current.value)
            if new is None or new == current.value:
                return current, result
            try:
                return self.write(ledger_id, new, current), result
            except MetadataVersionError:
                if attempt == retries:
                    break
                current = self.read(ledger_id)
        raise MetadataVersionError(
            f"ledger {ledger_id}: gave up after {retries} compare-and-set conflicts",
            path=layout.ledger_path(ledger_id),
        )

    def delete(self, ledger_id: int, version: int = -1, *, missing_ok: bool = False) -> bool:
        """Delete (unconditional unless ``version`` >= 0). :class:`MetadataNotFoundError` unless ``missing_ok``."""
        return self.store.delete(layout.ledger_path(ledger_id), version, missing_ok=missing_ok)

    def list(self) -> list[int]:
        """All ledger ids, sorted (one pipelined getChildren round per tree level)."""
        level: list[str] = [layout.LEDGERS]
        for _ in range(layout.ledger_bucket_depth()):
            found = self.store.children_many(level)
            level = [f"{parent}/{c}" for parent in level for c in (found.get(parent) or []) if c.isdigit()]
            if not level:
                return []
        leaves = self.store.children_many(level)
        ids: list[int] = []
        for parent in level:
            for leaf in leaves.get(parent) or []:
                try:
                    ids.append(layout.parse_ledger_path(f"{parent}/{leaf}"))
                except ValueError:
                    continue
        return sorted(ids)

    def watch(
        self, ledger_id: int, cb: Callable[[Versioned[LedgerMetadata] | None], object]
    ) -> Callable[[], None]:
        """Call ``cb`` now and on every change (``None`` once deleted). Returns a cancel function."""

        def on_change(v: Versioned[JsonDict] | None) -> None:
            if v is None:
                cb(None)
                return
            try:
                decoded = self._decode(ledger_id, v)
            except MetadataFormatError:
                return
            cb(decoded)

        return self.store.watch_data(layout.ledger_path(ledger_id), on_change)

    # --- async twins ------------------------------------------------------------------------------------------

    async def acreate(self, **kwargs: Any) -> Versioned[LedgerMetadata]:
        return await asyncio.to_thread(lambda: self.create(**kwargs))

    async def aread(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        return await asyncio.to_thread(self.read, ledger_id)

    async def awrite(
        self, ledger_id: int, new: LedgerMetadata, expected: int | Versioned[LedgerMetadata]
    ) -> Versioned[LedgerMetadata]:
        return await asyncio.to_thread(self.write, ledger_id, new, expected)

    async def aupdate(
        self,
        ledger_id: int,
        fn: Callable[[LedgerMetadata], LedgerMetadata],
        *,
        retries: int = CAS_RETRIES_MAX,
    ) -> Versioned[LedgerMetadata]:
        """``fn`` runs in the worker thread."""
        return await asyncio.to_thread(self.update, ledger_id, fn, retries=retries)

    async def adelete(self, ledger_id: int, version: int = -1, *, missing_ok: bool = False) -> bool:
        return await asyncio.to_thread(self.delete, ledger_id, version, missing_ok=missing_ok)

    async def alist(self) -> builtins.list[int]:
        return await asyncio.to_thread(self.list)
