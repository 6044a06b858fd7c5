"""Bookie request handling, without sockets: requests in, replies out through callbacks.

``BookieCore`` owns the in-memory ledger index and applies the rules of docs/architecture.md §5/§6:

* every request naming a ledger carries its master key; a mismatch is ``UNAUTHORIZED``;
* an add is acknowledged only after its journal record is fsynced (``journal_append``'s ``done``), and the
  entry is in ledger storage before the reply leaves (so a read that follows an ack sees the entry);
* a fencing read marks the ledger fenced in memory at once (later adds get ``FENCED``) and replies only
  after the FENCE record is durable; ``RECOVERY_ADD`` bypasses the fence; fences are never cleared;
* unknown ledgers can be fenced, and a fence binds no key (no squatting, below);
* long-poll reads of the LAC wait for the LAC to pass ``previous_lac`` or for their timeout.

No squatting (docs/protocol.md, "Keys and fences of unknown ledgers"). Only an ADD_ENTRY binds a ledger's
master key. A fencing read of a ledger the bookie never stored an entry of records the fence *for the key it
carries*, without binding it: the ledger is "unbound" (index row: the all-zero key ``UNBOUND_KEY``, fenced, and
the fence keys, at most ``FENCE_KEYS_MAX``, listed in the row's blob). Towards a key it was fenced with, an
unbound ledger is an empty fenced ledger: that key's adds are refused ``FENCED`` (invariant 4: a writer whose
ledger a recovery fenced here can add nothing more), reads answer ``NO_ENTRY``, and a ``RECOVERY_ADD`` binds the
key and keeps the fence. Towards any other key it is unknown (``NO_LEDGER``), and that key's first add binds it
(unfenced: the fences were another key's, whose later adds now get ``UNAUTHORIZED``, refused all the same). So a
stranger fencing future ledger ids with a bogus key no longer locks the owner out; with authentication
required, a stranger reaches none of this anyway, and only authenticated principals bind keys.

The server (``bookie/server.py``) and the simulator (``tests/sim``) drive the same object: they supply the
journal, the storage, a ``schedule(delay_s, fn)`` timer and one reply callback per request.
"""

from __future__ import annotations

import errno
import functools
import logging
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import protocol as p
from .entryformat import HEADER, HEADER_LEN
from .storage import LedgerInfo, LedgerStorage, entry_columns

log = logging.getLogger("ledgerstore.bookie")

Reply = Callable[[bytes], None]
BatchReply = Callable[[bytes, int], None]
Done = Callable[[BaseException | None], None]

# Journal record types (the journal module defines the same numbers; the core only needs them as ints).
REC_ENTRY = 1
REC_MASTER_KEY = 2
REC_FENCE = 3
REC_EXPLICIT_LAC = 4

#: The entry header's first three fields (ledger id, entry id, piggybacked LAC): what the core reads of an entry.
ENTRY_HEAD = struct.Struct(HEADER.format[: len(">Qqq")])
assert ENTRY_HEAD.format == ">Qqq" and HEADER.format.startswith(ENTRY_HEAD.format)

LONG_POLL_TIMEOUT_MS_MAX = 60_000

#: The index row key of an unbound ledger (fenced here, no entry ever added): no request binds this key.
UNBOUND_KEY = bytes(p.MASTER_KEY_LEN)
#: Distinct keys an unbound ledger records fences for; a fence with one more key is refused UNAUTHORIZED (the
#: fencer counts this bookie as not fenced, which is safe), so a row stays small whatever a stranger sends.
FENCE_KEYS_MAX = 8
_KEY_LEN = p.MASTER_KEY_LEN


def fence_keys(info: LedgerInfo) -> list[bytes]:
    """The keys an unbound ledger was fenced with (its index row's blob, ``MASTER_KEY_LEN`` bytes each)."""
    blob = info.lac_blob
    return [blob[i : i + _KEY_LEN] for i in range(0, len(blob), _KEY_LEN)]


def _fenced_for(info: LedgerInfo, key: bytes) -> bool:
    blob = info.lac_blob
    return any(blob[i : i + _KEY_LEN] == key for i in range(0, len(blob), _KEY_LEN))


def _bind(info: LedgerInfo, key: bytes) -> None:
    """An unbound ledger's first add: the key is bound; the ledger stays fenced only if this key fenced it."""
    info.fenced = _fenced_for(info, key)
    info.master_key = key
    info.lac_blob = b""
    info.explicit_lac = -1


def _unbound(fenced_with: bytes) -> LedgerInfo:
    return LedgerInfo(master_key=UNBOUND_KEY, fenced=True, lac_blob=fenced_with)


class JournalAppend(Protocol):
    def __call__(self, rtype: Any, ledger_id: int, entry_id: int, data: bytes, done: Done) -> None: ...


class JournalAppendEntries(Protocol):
    """Journal ``records`` (master keys of new ledgers) and then ``entries`` (whole entries, each naming its
    ledger and entry id in its header), with one completion once all are durable (``Journal.append_entries``)."""

    def __call__(
        self, entries: list[bytes], done: Done, records: list[tuple[int, int, int, bytes]] | None = None
    ) -> None: ...


#: One add as the server decodes it (``protocol.FrameDecoder.take_add_requests`` rows): (flags, request id,
#: ledger id, entry id, master key, entry bytes).
AddRow = tuple[int, int, int, int, bytes, bytes]


Schedule = Callable[[float, Callable[[], None]], Any]


@dataclass(slots=True)
class _Waiter:
    request: p.ReadEntryRequest
    reply: Reply
    handle: Any = None
    done: bool = False


@dataclass(slots=True)
class BookieStats:
    adds: int = 0
    add_bytes: int = 0
    adds_rejected: int = 0
    reads: int = 0
    read_bytes: int = 0
    fences: int = 0
    unauthorized: int = 0
    storage_read_errors: int = 0
    unbound_fences: int = 0  # fences recorded for a ledger without binding a key
    fences_refused_full: int = 0  # fences of an unbound ledger refused: FENCE_KEYS_MAX keys recorded already
    read_range_trimmed: int = 0  # READ_RANGE replies cut to fit the frame limit
    by_status: dict[str, int] = field(default_factory=dict)


class BookieCore:
    def __init__(
        self,
        storage: LedgerStorage,
        journal_append: JournalAppend,
        schedule: Schedule,
        *,
        bookie_id: str = "",
        disk_info: Callable[[], tuple[int, int]] = lambda: (0, 0),
        journal_append_entries: JournalAppendEntries | None = None,
    ) -> None:
        self.storage = storage
        self.journal_append = journal_append
        self.journal_append_entries = journal_append_entries or self._append_entries_one_by_one
        self.schedule = schedule
        self.bookie_id = bookie_id
        self.disk_info = disk_info
        self.ledgers: dict[int, LedgerInfo] = storage.load_index()
        self.readonly = False
        self.stats = BookieStats()
        # Replayed entries waiting to be written to storage in one batch (acked adds are stored at once).
        self._commit_entries: list[tuple[int, int, bytes]] = []
        self._commit_ledgers: dict[int, LedgerInfo] = {}
        self._commit_replies: list[Callable[[], None]] = []  # replies to send once the batch is stored
        self._commit_scheduled = False
        self._waiters: dict[int, list[_Waiter]] = {}
        self._fence_durable: set[int] = {lid for lid, info in self.ledgers.items() if info.fenced}
        # (ledger, key) of an unbound ledger's fences that are durable
        self._unbound_durable: set[tuple[int, bytes]] = {
            (lid, k)
            for lid, info in self.ledgers.items()
            if info.master_key == UNBOUND_KEY
            for k in fence_keys(info)
        }
        self.on_readonly_error: Callable[[BaseException], None] | None = None

    # ------------------------------------------------------------------------------------------ replay

    def replay(self, rtype: int, ledger_id: int, entry_id: int, data: bytes) -> None:
        """Apply one journal record at start-up (before any request)."""
        info = self.ledgers.get(ledger_id)
        if rtype == REC_MASTER_KEY:
            key = bytes(data)
            if info is None:
                info = self.ledgers[ledger_id] = (
                    _unbound(b"") if key == UNBOUND_KEY else LedgerInfo(master_key=key)
                )
            elif info.master_key == UNBOUND_KEY and key != UNBOUND_KEY:
                _bind(info, key)  # (a bound row in storage already: a record it reflects, ignored)
                if info.fenced:
                    self._fence_durable.add(ledger_id)
            else:
                return
            self._commit_ledgers[ledger_id] = info
            return
        if info is None:
            # A record for a ledger whose key record was checkpointed away and whose index row is gone: the
            # ledger was garbage-collected after this record was journaled. Nothing to restore.
            return
        if rtype == REC_ENTRY:
            self._commit_entries.append((ledger_id, entry_id, bytes(data)))
            self._note_entry(info, entry_id, data)
        elif rtype == REC_FENCE:
            key = bytes(data)
            if info.master_key == UNBOUND_KEY:
                if key and not _fenced_for(info, key):
                    info.lac_blob += key
                self._unbound_durable.add((ledger_id, key))
            elif not key or key == info.master_key:  # (a fence by another key, before this one bound: moot)
                info.fenced = True
                self._fence_durable.add(ledger_id)
        elif rtype == REC_EXPLICIT_LAC:
            lac = int.from_bytes(data[:8], "big", signed=True)
            if lac > info.explicit_lac:
                info.explicit_lac = lac
                info.lac_blob = bytes(data[8:])
        else:
            raise ValueError(f"unknown journal record type {rtype}")
        self._commit_ledgers[ledger_id] = info
        if len(self._commit_entries) >= 4096:
            self._flush_commit()

    def finish_replay(self) -> None:
        self._flush_commit()

    # ------------------------------------------------------------------------------------------ helpers

    @staticmethod
    def _note_entry(info: LedgerInfo, entry_id: int, data: bytes) -> bool:
        """Learn the last entry id and the piggybacked LAC from a stored entry; True if the LAC advanced."""
        if entry_id > info.last_entry_id:
            info.last_entry_id = entry_id
        if len(data) >= HEADER_LEN:
            lac = HEADER.unpack_from(data)[2]
            if lac > info.lac:
                info.lac = lac
                return True
        return False

    def _count(self, status: p.Status) -> None:
        name = status.name
        self.stats.by_status[name] = self.stats.by_status.get(name, 0) + 1

    def _view(self, ledger_id: int, key: bytes) -> tuple[LedgerInfo | None, bool]:
        """(the ledger as a request with ``key`` sees it, None: unknown; whether the key is refused). An unbound
        ledger is an empty fenced ledger to the keys it was fenced with, unknown to the others."""
        info = self.ledgers.get(ledger_id)
        if info is None:
            return None, False
        stored = info.master_key
        if stored == UNBOUND_KEY:
            return (_EMPTY_FENCED if _fenced_for(info, key) else None), False
        if stored != key:
            self.stats.unauthorized += 1
            return None, True
        return info, False

    def _get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self.storage.get_entry(ledger_id, entry_id)

    def _storage_failed(self, ledger_id: int, what: str, exc: Exception) -> p.Status:
        """A storage read raised (a corrupt value, an I/O error): the request gets INTERNAL, never NO_ENTRY, which
        a recovering client would count as this bookie not having the entry."""
        log.error("bookie=%s ledger=%d %s failed in storage: %r", self.bookie_id, ledger_id, what, exc)
        self.stats.storage_read_errors += 1
        self._count(p.Status.INTERNAL)
        return p.Status.INTERNAL

    def _queue_commit(self, send: Callable[[], None] | None = None) -> None:
        """Schedule one storage write of everything durable so far; ``send`` runs right after it."""
        if send is not None:
            self._commit_replies.append(send)
        if not self._commit_scheduled:
            self._commit_scheduled = True
            self.schedule(0.0, self._flush_commit)

    def _flush_commit(self) -> None:
        """Write durable entries and index rows to storage in one batch, then send their replies."""
        self._commit_scheduled = False
        entries, self._commit_entries = self._commit_entries, []
        ledgers, self._commit_ledgers = self._commit_ledgers, {}
        replies, self._commit_replies = self._commit_replies, []
        if entries or ledgers:
            self.storage.write(entries, ledgers.items())
        for send in replies:
            send()

    # ------------------------------------------------------------------------------------------ requests

    def handle(self, req: p.Request, reply: Reply) -> None:
        if isinstance(req, p.AddEntryRequest):
            self.add_entry(
                req.request_id, req.ledger_id, req.entry_id, req.master_key, req.entry, req.flags, reply
            )
        elif isinstance(req, p.ReadEntryRequest):
            self._read_entry(req, reply)
        elif isinstance(req, p.ReadLacRequest):
            self._read_lac(req, reply)
        elif isinstance(req, p.WriteLacRequest):
            self._write_lac(req, reply)
        elif isinstance(req, p.ReadRangeRequest):
            self._read_range(req, reply)
        elif isinstance(req, p.BookieInfoRequest):
            free, total = self.disk_info()
            reply(
                p.encode(
                    p.BookieInfoResponse(
                        request_id=req.request_id,
                        status=p.Status.OK,
                        free_bytes=free,
                        total_bytes=total,
                        readonly=self.readonly,
                        bookie_id=self.bookie_id,
                        extra={"ledgers": str(len(self.ledgers))},
                    )
                )
            )
        else:  # pragma: no cover - decode_request only returns the types above
            raise TypeError(type(req))

    def add_entry(
        self, rid: int, ledger_id: int, entry_id: int, key: bytes, entry: bytes, flags: int, reply: Reply
    ) -> None:
        """One add: the group path with a group of one (so the simulator exercises the server's hot path)."""
        self.add_entries([(flags, rid, ledger_id, entry_id, key, entry)], lambda frames, _n: reply(frames))

    def _append_entries_one_by_one(
        self, entries: list[bytes], done: Done, records: list[tuple[int, int, int, bytes]] | None = None
    ) -> None:
        # Records complete in order, so the last record's completion means the whole group is durable.
        recs = list(records or [])
        recs.extend((REC_ENTRY, *HEADER.unpack_from(e)[:2], e) for e in entries)
        for rec in recs[:-1]:
            self.journal_append(rec[0], rec[1], rec[2], rec[3], _ignore)
        last = recs[-1]
        self.journal_append(last[0], last[1], last[2], last[3], done)

    def add_entries(
        self, rows: list[AddRow], reply: BatchReply, heads: Sequence[tuple[int, int, int]] | None = None
    ) -> None:
        """Many adds at once (``AddRow`` each): the same rules as one add, with one journal record for the
        group's entries, one storage batch and one reply frame run for the lot. ``reply(frames, n)`` carries
        ``n`` responses; refusals are answered at once, acceptances once the group is durable and stored.

        ``heads``: when the decoder read them already (``FrameDecoder.take_add_run(ENTRY_HEAD)``), each
        entry's (ledger id, entry id, LAC) header fields, every entry of ``rows`` being of one length."""
        if len(rows) > 1 and self._add_run(rows, reply, heads):
            return
        ledgers = self.ledgers
        readonly = self.readonly
        unpack_hdr = HEADER.unpack_from
        recovery_add = p.Flag.RECOVERY_ADD
        accepted: list[AddRow] = []
        refused: list[bytes] = []
        new_keys: list[tuple[int, int, int, bytes]] = []
        # per ledger of the group: [info, highest entry id, highest piggybacked LAC]
        seen: dict[int, list[Any]] = {}
        last_lid = -1
        cur: list[Any] = []
        for row in rows:
            flags, rid, lid, eid, key, entry = row
            info = ledgers.get(lid)
            binding = info is None or info.master_key == UNBOUND_KEY
            if (
                readonly
                or eid < 0
                or len(entry) < HEADER_LEN
                or (
                    info is not None
                    and not binding
                    and (info.master_key != key or (info.fenced and not flags & recovery_add))
                )
            ):
                refused.append(self._refuse(info, row))
                continue
            if binding and key == UNBOUND_KEY:
                refused.append(self._refuse(info, row, p.Status.UNAUTHORIZED))
                continue
            if info is not None and binding and not flags & recovery_add and _fenced_for(info, key):
                refused.append(self._refuse(info, row, p.Status.FENCED))  # a recovery fenced it for this key
                continue
            hl, he, lac, _ = unpack_hdr(entry)
            if hl != lid or he != eid:
                refused.append(self._refuse(info, row, p.Status.BAD_REQUEST))
                continue
            if info is None:
                info = ledgers[lid] = LedgerInfo(master_key=key)
                new_keys.append((REC_MASTER_KEY, lid, -1, key))
            elif binding:
                self._bind_unbound(lid, info, key)
                new_keys.append((REC_MASTER_KEY, lid, -1, key))
            accepted.append(row)
            if lid != last_lid:
                last_lid = lid
                got = seen.get(lid)
                if got is None:
                    got = seen[lid] = [info, eid, lac]
                cur = got
            if eid > cur[1]:
                cur[1] = eid
            if lac > cur[2]:
                cur[2] = lac
        if refused:
            reply(b"".join(refused), len(refused))
        if not accepted:
            return
        _, rids, lids, eids, _, entries = zip(*accepted, strict=True)
        self._journal_group(rids, lids, eids, list(entries), seen, new_keys, reply)

    def _add_run(
        self, rows: list[AddRow], reply: BatchReply, heads: Sequence[tuple[int, int, int]] | None
    ) -> bool:
        """``add_entries`` for the common case, column by column: every row adds to one ledger (an open one, or
        a new one) with one master key and a well-formed entry. Returns False, having done nothing, when any
        row needs the general path (which then decides each row on its own)."""
        flags, rids, lids, eids, keys, entries = zip(*rows, strict=True)
        n = len(rows)
        lid, key = lids[0], keys[0]
        info = self.ledgers.get(lid)
        if (
            self.readonly
            or lids.count(lid) != n
            or keys.count(key) != n
            or (info is not None and (info.master_key != key or info.fenced))
            or key == UNBOUND_KEY
            or min(eids) < 0
            # a run's entries are all one size (take_add_run), so its first entry speaks for the lot
            or (len(entries[0]) if heads is not None else min(map(len, entries))) < HEADER_LEN
        ):
            return False
        hls, hes, lacs = zip(
            *(heads if heads is not None else map(ENTRY_HEAD.unpack_from, entries)), strict=True
        )
        if hes != eids or hls.count(lid) != n:
            return False  # an entry whose header names another entry
        new_keys: list[tuple[int, int, int, bytes]] = []
        if info is None:
            info = self.ledgers[lid] = LedgerInfo(master_key=key)
            new_keys.append((REC_MASTER_KEY, lid, -1, key))
        seen = {lid: [info, max(eids), max(lacs)]}
        self._journal_group(rids, lids, eids, list(entries), seen, new_keys, reply)
        return True

    def _journal_group(
        self,
        rids: Sequence[int],
        lids: Sequence[int],
        eids: Sequence[int],
        entries: list[bytes],
        seen: dict[int, list[Any]],
        new_keys: list[tuple[int, int, int, bytes]],
        reply: BatchReply,
    ) -> None:
        """Journal accepted adds (columns: request ids, ledger ids, entry ids, entries; ``seen``: per ledger
        [info, highest entry id, highest piggybacked LAC]) and, once durable, store them and reply."""
        n = len(rids)

        def done(exc: BaseException | None) -> None:
            if exc is not None:
                self._journal_failed(exc)
                status = p.Status.READONLY if _is_enospc(exc) else p.Status.INTERNAL
                reply(p.encode_add_responses(rids, status, lids, eids), n)
                return
            self._store_group(lids, eids, entries, seen)
            reply(p.encode_add_responses(rids, p.Status.OK, lids, eids), n)

        self.journal_append_entries(entries, done, new_keys)

    def _store_group(
        self, lids: Sequence[int], eids: Sequence[int], entries: Sequence[bytes], seen: dict[int, list[Any]]
    ) -> None:
        """A durable group: write its entries and the changed index rows to storage, advance last entry ids
        and LACs, wake long polls."""
        changed = []
        ledgers = self.ledgers
        for lid, (noted, last_eid, lac) in seen.items():
            info = ledgers.get(lid)
            if info is None or info is not noted:  # garbage-collected while the group was in the journal
                rows = zip(lids, eids, entries, strict=True)
                lids, eids, entries = entry_columns(r for r in rows if r[0] != lid)
                continue
            if last_eid > info.last_entry_id:
                info.last_entry_id = last_eid
            if lac > info.lac:
                info.lac = lac
                if lid in self._waiters:
                    self.schedule(0.0, functools.partial(self._wake, lid))
            changed.append((lid, info))
        self.storage.write_columns(lids, eids, entries, changed)
        st = self.stats
        st.adds += len(eids)
        st.add_bytes += sum(map(len, entries))

    def _bind_unbound(self, lid: int, info: LedgerInfo, key: bytes) -> None:
        fenced_durable = (lid, key) in self._unbound_durable
        for k in fence_keys(info):
            self._unbound_durable.discard((lid, k))
        _bind(info, key)
        if info.fenced and fenced_durable:
            self._fence_durable.add(lid)
        log.info(
            "bookie=%s ledger=%d: first add binds the key of a ledger fenced here before (%s)",
            self.bookie_id,
            lid,
            "fenced by this key" if info.fenced else "fences by other keys dropped",
        )

    def _refuse(self, info: LedgerInfo | None, row: AddRow, status: p.Status | None = None) -> bytes:
        flags, rid, lid, eid, key, _entry = row
        if status is None:
            bound = info is not None and info.master_key != UNBOUND_KEY
            if bound and info is not None and info.master_key != key:
                self.stats.unauthorized += 1
                status = p.Status.UNAUTHORIZED
            elif bound and info is not None and info.fenced and not flags & p.Flag.RECOVERY_ADD:
                status = p.Status.FENCED
            elif self.readonly:
                status = p.Status.READONLY
            else:
                status = p.Status.BAD_REQUEST
        self.stats.adds_rejected += 1
        self._count(status)
        return p.encode_add_response(rid, status, lid, eid)

    def _journal_failed(self, exc: BaseException) -> None:
        # called for each record of a failed batch (or whose storage write failed): the journal and the bookie
        # say what failed, once; a line here was one more ERROR for every record in flight
        if _is_enospc(exc):
            self.readonly = True
            if self.on_readonly_error is not None:
                self.on_readonly_error(exc)

    def _read_entry(self, req: p.ReadEntryRequest, reply: Reply) -> None:
        lid = req.ledger_id
        self.stats.reads += 1
        info, refused = self._view(lid, req.master_key)
        if refused:
            self._count(p.Status.UNAUTHORIZED)
            return reply(_read_resp(req, p.Status.UNAUTHORIZED))
        if req.flags & p.Flag.FENCE:
            self.stats.fences += 1
            if info is None or info is _EMPTY_FENCED:
                return self._fence_unbound(req, reply)
            info.fenced = True  # in memory at once: adds from now on are refused
            if lid not in self._fence_durable:
                return self._journal_fence(req, reply, info, b"")
        if info is None:
            return reply(_read_resp(req, p.Status.NO_LEDGER))
        if info is _EMPTY_FENCED:
            self._count(p.Status.NO_ENTRY)
            return reply(_read_resp(req, p.Status.NO_ENTRY))
        if (
            req.entry_id == p.LAST_ENTRY
            and req.flags & p.Flag.LONG_POLL
            and max(info.lac, info.explicit_lac) <= req.previous_lac
            and req.timeout_ms > 0
        ):
            w = _Waiter(request=req, reply=reply)
            self._waiters.setdefault(lid, []).append(w)
            timeout_s = min(req.timeout_ms, LONG_POLL_TIMEOUT_MS_MAX) / 1000.0
            w.handle = self.schedule(timeout_s, lambda: self._expire(lid, w))
            return
        self._answer_read(req, reply)

    def _fence_unbound(self, req: p.ReadEntryRequest, reply: Reply) -> None:
        """A fencing read of a ledger without a bound key: record the fence for the request's key only."""
        lid, key = req.ledger_id, req.master_key
        info = self.ledgers.get(lid)
        if info is None:
            info = self.ledgers[lid] = _unbound(b"")
            self.journal_append(REC_MASTER_KEY, lid, -1, UNBOUND_KEY, _ignore)
        if not _fenced_for(info, key):
            if len(info.lac_blob) >= FENCE_KEYS_MAX * _KEY_LEN:
                self.stats.fences_refused_full += 1
                self._count(p.Status.UNAUTHORIZED)
                log.warning(
                    "bookie=%s ledger=%d: fence refused, %d keys fenced it already without adding an entry",
                    self.bookie_id,
                    lid,
                    FENCE_KEYS_MAX,
                )
                return reply(_read_resp(req, p.Status.UNAUTHORIZED))
            info.lac_blob += key  # in memory at once: this key's adds are refused from now on
            self.stats.unbound_fences += 1
        if (lid, key) in self._unbound_durable:
            return reply(_read_resp(req, p.Status.NO_ENTRY))
        self._journal_fence(req, reply, info, key)

    def _journal_fence(self, req: p.ReadEntryRequest, reply: Reply, info: LedgerInfo, key: bytes) -> None:
        """Journal a fence (``key``: the fencer's, for an unbound ledger; empty for a bound one) and answer the
        read once it is durable, after the commit batch, so entries acked before the fence are in storage."""
        lid = req.ledger_id

        def fence_done(exc: BaseException | None) -> None:
            if exc is not None:
                self._journal_failed(exc)
                reply(_read_resp(req, p.Status.INTERNAL))
                return
            if self.ledgers.get(lid) is info:  # (else garbage-collected meanwhile: nothing to store)
                if info.master_key == UNBOUND_KEY:
                    self._unbound_durable.add((lid, key))
                elif not key or info.master_key == key:
                    self._fence_durable.add(lid)
                self._commit_ledgers[lid] = info
            self._queue_commit(lambda: self._answer_read(req, reply))

        self.journal_append(REC_FENCE, lid, -1, key, fence_done)

    def _answer_read(self, req: p.ReadEntryRequest, reply: Reply) -> None:
        info, refused = self._view(req.ledger_id, req.master_key)
        if refused:
            self._count(p.Status.UNAUTHORIZED)
            return reply(_read_resp(req, p.Status.UNAUTHORIZED))
        if info is None:
            return reply(_read_resp(req, p.Status.NO_LEDGER))
        eid = info.last_entry_id if req.entry_id == p.LAST_ENTRY else req.entry_id
        try:
            data = self._get_entry(req.ledger_id, eid) if eid >= 0 else None
        except Exception as e:
            return reply(_read_resp(req, self._storage_failed(req.ledger_id, f"reading entry {eid}", e)))
        if data is None:
            self._count(p.Status.NO_ENTRY)
            return reply(
                _read_resp(req, p.Status.NO_ENTRY, lac=max(info.lac, info.explicit_lac), entry_id=eid)
            )
        self.stats.read_bytes += len(data)
        reply(
            p.encode(
                p.ReadEntryResponse(
                    request_id=req.request_id,
                    status=p.Status.OK,
                    ledger_id=req.ledger_id,
                    entry_id=eid,
                    lac=max(info.lac, info.explicit_lac),
                    entry=data,
                )
            )
        )

    def _wake(self, ledger_id: int) -> None:
        info = self.ledgers.get(ledger_id)
        waiters = self._waiters.get(ledger_id)
        if info is None or not waiters:
            return
        keep = []
        for w in waiters:
            if w.done:
                continue
            if max(info.lac, info.explicit_lac) > w.request.previous_lac:
                w.done = True
                if w.handle is not None and hasattr(w.handle, "cancel"):
                    w.handle.cancel()
                self._answer_read(w.request, w.reply)
            else:
                keep.append(w)
        if keep:
            self._waiters[ledger_id] = keep
        else:
            del self._waiters[ledger_id]

    def _expire(self, ledger_id: int, w: _Waiter) -> None:
        if w.done:
            return
        w.done = True
        waiters = self._waiters.get(ledger_id, [])
        if w in waiters:
            waiters.remove(w)
            if not waiters:
                del self._waiters[ledger_id]
        self._answer_read(w.request, w.reply)

    def _read_lac(self, req: p.ReadLacRequest, reply: Reply) -> None:
        info, refused = self._view(req.ledger_id, req.master_key)
        if refused:
            status = p.Status.UNAUTHORIZED
        elif info is None:
            status = p.Status.NO_LEDGER
        else:
            status = p.Status.OK
        reply(
            p.encode(
                p.ReadLacResponse(
                    request_id=req.request_id,
                    status=status,
                    ledger_id=req.ledger_id,
                    lac=info.lac if info and status == p.Status.OK else -1,
                    explicit_lac=info.explicit_lac if info and status == p.Status.OK else -1,
                    lac_blob=info.lac_blob if info and status == p.Status.OK else b"",
                )
            )
        )

    def _write_lac(self, req: p.WriteLacRequest, reply: Reply) -> None:
        info, refused = self._view(req.ledger_id, req.master_key)

        def resp(status: p.Status) -> None:
            reply(
                p.encode(
                    p.WriteLacResponse(request_id=req.request_id, status=status, ledger_id=req.ledger_id)
                )
            )

        if refused:
            return resp(p.Status.UNAUTHORIZED)
        if info is None or info is _EMPTY_FENCED:  # (a WRITE_LAC binds no key)
            return resp(p.Status.NO_LEDGER)
        if self.readonly:
            return resp(p.Status.READONLY)
        ledger_info = info

        def done(exc: BaseException | None) -> None:
            if exc is not None:
                self._journal_failed(exc)
                return resp(p.Status.INTERNAL)
            if req.lac > ledger_info.explicit_lac:
                ledger_info.explicit_lac = req.lac
                ledger_info.lac_blob = req.lac_blob
                self._commit_ledgers[req.ledger_id] = ledger_info
                if req.ledger_id in self._waiters:
                    self.schedule(0.0, functools.partial(self._wake, req.ledger_id))
            self._queue_commit(functools.partial(resp, p.Status.OK))

        data = req.lac.to_bytes(8, "big", signed=True) + req.lac_blob
        self.journal_append(REC_EXPLICIT_LAC, req.ledger_id, -1, data, done)

    def _read_range(self, req: p.ReadRangeRequest, reply: Reply) -> None:
        info, refused = self._view(req.ledger_id, req.master_key)

        def resp(status: p.Status) -> None:
            reply(p.encode_read_range_response(req.request_id, status, req.ledger_id, req.first_entry_id, ()))

        if refused:
            return resp(p.Status.UNAUTHORIZED)
        if info is None:
            return resp(p.Status.NO_LEDGER)
        if req.first_entry_id < 0 or req.last_entry_id < req.first_entry_id or req.step < 1:
            return resp(p.Status.BAD_REQUEST)
        if info is _EMPTY_FENCED:
            return resp(p.Status.NO_ENTRY)
        # a legal request never gets a reply over the frame limit (which would close its own connection)
        max_bytes = min(req.max_bytes, p.READ_RANGE_BYTES_MAX, p.READ_RANGE_REPLY_BYTES_MAX)
        last = min(req.last_entry_id, info.last_entry_id)
        range_runs = getattr(self.storage, "range_runs", None)
        if range_runs is not None:  # the reply built from the stored runs (RocksDB storage)
            try:
                frame, n, size, trimmed = p.encode_read_range_pieces(
                    req.request_id,
                    req.ledger_id,
                    req.first_entry_id,
                    range_runs(req.ledger_id, req.first_entry_id, last, req.step),
                    max_bytes,
                    (last - req.first_entry_id) // req.step + 1,
                )
            except Exception as e:
                return resp(
                    self._storage_failed(req.ledger_id, f"reading entries {req.first_entry_id}-{last}", e)
                )
            if not n:
                return resp(p.Status.NO_ENTRY)
            self.stats.read_range_trimmed += trimmed
            self.stats.reads += 1
            self.stats.read_bytes += size
            return reply(frame)  # type: ignore[arg-type]  # a bytearray: the server writes it as it is
        try:
            if req.step == 1:
                entries = self.storage.get_range(req.ledger_id, req.first_entry_id, last, max_bytes)
            else:
                entries = self.storage.get_range(req.ledger_id, req.first_entry_id, last, max_bytes, req.step)
        except Exception as e:
            return resp(
                self._storage_failed(req.ledger_id, f"reading entries {req.first_entry_id}-{last}", e)
            )
        if not entries:
            return resp(p.Status.NO_ENTRY)
        fit = p.read_range_entries_fitting(entries)
        if fit < len(entries):  # max_bytes counts the entries, the frame their length fields too
            entries = entries[:fit]
            self.stats.read_range_trimmed += 1
        self.stats.reads += 1
        self.stats.read_bytes += sum(map(len, entries))
        reply(
            p.encode_read_range_response(
                req.request_id, p.Status.OK, req.ledger_id, req.first_entry_id, entries
            )
        )

    # ------------------------------------------------------------------------------------------ admin

    def delete_ledger(self, ledger_id: int) -> None:
        """Garbage-collect a ledger deleted from metadata."""
        self.delete_ledgers([ledger_id])

    def delete_ledgers(self, ledger_ids: Sequence[int]) -> None:
        """Garbage-collect ledgers deleted from metadata, in one storage deletion (all or none after a crash)."""
        gone = set(ledger_ids)
        for ledger_id in gone:
            info = self.ledgers.pop(ledger_id, None)
            if info is not None and info.master_key == UNBOUND_KEY:
                for k in fence_keys(info):
                    self._unbound_durable.discard((ledger_id, k))
            self._fence_durable.discard(ledger_id)
            self._commit_ledgers.pop(ledger_id, None)
        if self._commit_entries:
            self._commit_entries = [e for e in self._commit_entries if e[0] not in gone]
        self.storage.delete_ledgers(sorted(gone))

    def flush_pending(self) -> None:
        """Write everything durable to storage now (before a checkpoint)."""
        self._flush_commit()


#: What a key an unbound ledger was fenced with sees of it: an empty fenced ledger (never mutated).
_EMPTY_FENCED = LedgerInfo(master_key=UNBOUND_KEY, fenced=True)


def _ignore(exc: BaseException | None) -> None:
    if exc is not None:
        log.error("journal record failed: %s", exc)


def _is_enospc(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _read_resp(
    req: p.ReadEntryRequest, status: p.Status, *, lac: int = -1, entry_id: int | None = None
) -> bytes:
    return p.encode(
        p.ReadEntryResponse(
            request_id=req.request_id,
            status=status,
            ledger_id=req.ledger_id,
            entry_id=req.entry_id if entry_id is None else entry_id,
            lac=lac,
        )
    )
