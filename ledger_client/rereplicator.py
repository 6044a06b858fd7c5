"""Re-replicate a lost bookie's entries (the I/O around ``rereplication``; BookKeeper's ``shell recover``).

``rereplicate_ledger`` restores the write quorum of one CLOSED ledger that a bookie held part of: for each of
its fragments, a replacement bookie (writable, not in that ensemble) receives every entry the lost bookie
stored, read from another bookie of the entry's write set and verified against its digest, then written
unchanged with the RECOVERY_ADD flag; the replacement is then fenced for the ledger (nothing more can be
added there), and one metadata CAS swaps the replacements in. Nothing is swapped unless every entry was
copied: a failure leaves the metadata as it was (copies already made are harmless: entries are immutable,
and a retry writes the same bytes). ``rereplicate_bookie`` does this for every ledger the bookie is in.

Open ledgers are left alone (reported): their writer replaces failed bookies itself, or, if the writer is gone,
``ledgerstore ledger recover`` closes the ledger, after which it can be re-replicated.

The copy (``copy_fragment``, also AutoRecovery's) is BookKeeper's ``LedgerFragmentReplicator``: the entries are
read in batches, READ_RANGE requests like the client's sequential reads (``ledger_client.read_planner``): the lost
bookie held whole residues mod E (every entry when Qw == E), each read as runs of ``step`` E from a surviving
bookie of its write set, failing over to the next one from the first entry not delivered, every entry verified
against its digest where it lies in the reply (``EntryCodec.verify_spans``). They are written to the new bookie
pipelined: RECOVERY_ADD frames on one connection, up to ``WRITE_WINDOW_ENTRIES`` entries or
``WRITE_WINDOW_BYTES`` unacknowledged, an optional throttle taken before each group is sent. The fragment counts
as copied only once the new bookie acknowledged every entry.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bookie import protocol as p
from bookie.entryformat import DigestMismatchError, DigestType, EntryCodec

from . import errors as E
from .placement import replace_failed
from .quorum import write_set
from .rereplication import Fragment, lost_fragments, swapped

if TYPE_CHECKING:
    from .bookie_conn import BookieConnection
    from .client import BookKeeper

__all__ = ["LedgerRereplication", "copy_fragment", "rereplicate_bookie", "rereplicate_ledger"]

log = logging.getLogger(__name__)

#: READ_RANGE batches of one fragment in flight at once (each up to ``ClientConfig.read_batch_entries`` entries
#: and ``read_batch_bytes`` bytes)
READS_IN_FLIGHT = 4
#: adds to the new bookie sent and not yet acknowledged, at most (entries, bytes)
WRITE_WINDOW_ENTRIES = 1000
WRITE_WINDOW_BYTES = 4 * 1024 * 1024
#: entries sent per throttle call (and per check of the window)
_SEND_GROUP = 64
#: READ_RANGE reply overhead: frame header, u8 status, u64 ledger, i64 first, u32 count (range_reader._RANGE_REPLY_FIXED)
_RANGE_REPLY_FIXED = 64

Throttle = Callable[[int], Awaitable[None]]


@dataclass
class LedgerRereplication:
    """What re-replicating one ledger did: ``status`` is ``done``, ``planned`` (a dry run: what it would copy,
    where), ``not_on_bookie``, ``open`` (skipped), ``unauthorized`` (another password) or ``failed`` (``error``
    says why; metadata unchanged)."""

    ledger_id: int
    status: str
    entries_copied: int = 0
    replacements: dict[int, str] = field(default_factory=dict)  # ensemble index -> new bookie
    error: str = ""


def _why(r: p.Response | None) -> str:
    return p.Status(r.status).name if r is not None else "unreachable"


async def _read_verified(
    bk: BookKeeper, codec: EntryCodec, key: bytes, entry_id: int, sources: list[str]
) -> bytes:
    """The entry's stored bytes from the first source that has a copy matching its digest."""
    lid = codec.ledger_id
    seen = []
    for bookie in sources:
        r = await bk._ask_or_none(
            bookie,
            lambda rid: p.ReadEntryRequest(request_id=rid, ledger_id=lid, entry_id=entry_id, master_key=key),
        )
        if isinstance(r, p.ReadEntryResponse) and r.status == p.Status.OK:
            try:
                codec.verify(r.entry, entry_id)
            except DigestMismatchError:
                seen.append(f"{bookie}: digest mismatch")
                continue
            return bytes(r.entry)
        seen.append(f"{bookie}: {_why(r)}")
    raise E.LedgerError(
        f"ledger {lid} entry {entry_id}: no readable copy ({'; '.join(seen) or 'no other bookie holds it'})",
        ledger_id=lid,
        entry_id=entry_id,
    )


async def _write(bk: BookKeeper, lid: int, key: bytes, bookie: str, entry_id: int, entry: bytes) -> None:
    r = await bk._ask_or_none(
        bookie,
        lambda rid: p.AddEntryRequest(
            request_id=rid,
            ledger_id=lid,
            entry_id=entry_id,
            master_key=key,
            entry=entry,
            flags=p.Flag.RECOVERY_ADD,
        ),
    )
    if r is None or r.status != p.Status.OK:
        raise E.LedgerError(
            f"ledger {lid} entry {entry_id}: writing to {bookie} failed: {_why(r)}", ledger_id=lid
        )


class _Writer:
    """Pipelined RECOVERY_ADDs of stored entries to one bookie: a bounded window of unacknowledged adds on its
    connection, acknowledgements counted by callbacks (no task or future per entry)."""

    def __init__(
        self,
        bk: BookKeeper,
        lid: int,
        key: bytes,
        target: str,
        throttle: Throttle | None,
        on_copied: Callable[[int, int], None],
    ) -> None:
        self.bk = bk
        self.lid = lid
        self.key = key
        self.target = target
        self.throttle = throttle
        self.on_copied = on_copied
        self.conn: BookieConnection | None = None
        self.pending = 0  # adds sent, not yet answered
        self.pending_bytes = 0
        self.acked = 0
        self.error: E.LedgerError | None = None
        self._room = asyncio.Event()
        self._room.set()
        self._timeout = bk.config.add_timeout_s
        self._pack = p.ADD_FRAME_PREFIX.pack
        self._fixed = p.ADD_FRAME_PREFIX.size - 4  # the frame length counts the bytes after itself

    def _on_ack(self, entry_id: int, size: int, status: p.Status | None, exc: BaseException | None) -> None:
        self.pending -= 1
        self.pending_bytes -= size
        if exc is None and status == p.Status.OK:
            self.acked += 1
            self.on_copied(1, size)
        elif self.error is None:
            why = status.name if status is not None else str(exc)
            self.error = E.LedgerError(
                f"ledger {self.lid} entry {entry_id}: writing to {self.target} failed: {why}",
                ledger_id=self.lid,
            )
        if self.error is not None or (
            self.pending < WRITE_WINDOW_ENTRIES and self.pending_bytes < WRITE_WINDOW_BYTES
        ):
            self._room.set()

    async def _wait_room(self, full: Callable[[], bool]) -> None:
        """Wait while ``full()``, failing when the bookie acknowledges nothing for ``add_timeout_s``."""
        while self.error is None and full():
            self._room.clear()
            before = self.acked
            try:
                await asyncio.wait_for(self._room.wait(), self._timeout)
            except TimeoutError:
                if self.acked == before and self.error is None:
                    self.error = E.LedgerError(
                        f"ledger {self.lid}: {self.target} acknowledged no add for {self._timeout:g}s",
                        ledger_id=self.lid,
                    )
        if self.error is not None:
            raise self.error

    async def send(self, data: bytes, bounds: list[int], first: int, step: int) -> None:
        """Write the stored entries ``data[bounds[2k]:bounds[2k + 1]]`` (entries ``first``, ``first + step``, ...)."""
        if self.conn is None or self.conn.closed:
            self.conn = await self.bk.pool.get(self.target)
        pack, fixed, lid, key, flags = self._pack, self._fixed, self.lid, self.key, int(p.Flag.RECOVERY_ADD)
        version, op = p.PROTOCOL_VERSION, int(p.OpCode.ADD_ENTRY)
        on_ack = self._on_ack
        with memoryview(data) as mv:
            for g in range(0, len(bounds), 2 * _SEND_GROUP):
                group = bounds[g : g + 2 * _SEND_GROUP]
                await self._wait_room(
                    lambda: self.pending >= WRITE_WINDOW_ENTRIES or self.pending_bytes >= WRITE_WINDOW_BYTES
                )
                if self.throttle is not None:
                    await self.throttle(sum(group[k + 1] - group[k] for k in range(0, len(group), 2)))
                conn = self.conn
                if conn.closed:
                    conn = self.conn = await self.bk.pool.get(self.target)
                eid = first + (g // 2) * step
                for k in range(0, len(group), 2):
                    a, b = group[k], group[k + 1]
                    rid = conn.next_id()
                    frame = b"".join((pack(fixed + b - a, version, op, flags, rid, lid, eid, key), mv[a:b]))
                    self.pending += 1
                    self.pending_bytes += b - a
                    conn.send_add(rid, frame, functools.partial(on_ack, eid, b - a))
                    eid += step
        if self.error is not None:
            raise self.error

    async def drain(self) -> None:
        await self._wait_room(lambda: self.pending > 0)


def _runs(fragment: Fragment, batch_entries: int) -> Iterator[tuple[int, int, int]]:
    """The lost bookie's entries of ``fragment`` as READ_RANGE batches ``(first, last, step)``: runs of one
    residue mod E (``step`` E) when Qw < E, consecutive entries when Qw == E; the residues' batches interleaved,
    so the surviving bookies serve them together."""
    e_size, qw, b = fragment.ensemble_size, fragment.write_quorum, fragment.bookie_index
    lo, hi = fragment.first_entry_id, fragment.last_entry_id
    step = e_size if qw < e_size else 1
    starts = [e for e in range(lo, min(lo + step, hi + 1)) if (b - e) % e_size < qw]
    span = batch_entries * step
    for offset in range(0, hi - lo + 1, span):
        for s in starts:
            first = s + offset
            if first > hi:
                continue
            last = min(hi, first + span - step)
            yield first, last - (last - first) % step, step


async def _read_range(
    bk: BookKeeper, bookie: str, lid: int, key: bytes, first: int, last: int, step: int, max_bytes: int
) -> p.ReadRangeSpans:
    conn = await bk.read_pool.get(bookie)
    fut: asyncio.Future[p.ReadRangeSpans] = asyncio.get_running_loop().create_future()

    def done(resp: p.ReadRangeSpans | None, exc: BaseException | None) -> None:
        if not fut.done():
            if resp is not None:
                fut.set_result(resp)
            else:
                fut.set_exception(exc or E.BookieUnavailableError(f"bookie {bookie}: no answer"))

    rid = conn.next_id()
    req = p.ReadRangeRequest(
        request_id=rid,
        ledger_id=lid,
        first_entry_id=first,
        last_entry_id=last,
        master_key=key,
        max_bytes=max_bytes,
        step=step,
    )
    conn.send_read_range(req, done)
    try:
        return await asyncio.wait_for(fut, bk.config.read_timeout_s)
    except TimeoutError:
        conn.forget(rid)
        raise E.BookieUnavailableError(
            f"bookie {bookie} did not answer within {bk.config.read_timeout_s}s"
        ) from None


async def _copy_run(
    bk: BookKeeper,
    codec: EntryCodec,
    key: bytes,
    run: tuple[int, int, int],
    sources: list[str],
    writer: _Writer,
    max_bytes: int,
) -> int:
    """Read the entries of one batch from ``sources`` (in that order of preference, failing over from the first
    entry not yet delivered), verified, and hand them to ``writer``; returns how many."""
    first, last, step = run
    lid = codec.ledger_id
    tried: set[int] = set()
    errors: list[str] = []
    i = 0
    copied = 0
    while first <= last:
        if len(tried) == len(sources):
            raise E.LedgerError(
                f"ledger {lid} entry {first}: no readable copy ({'; '.join(errors) or 'no other bookie holds it'})",
                ledger_id=lid,
                entry_id=first,
            )
        bookie = sources[i]
        count = (last - first) // step + 1
        failed = ""
        n = 0
        try:
            resp = await _read_range(bk, bookie, lid, key, first, last, step, max_bytes)
        except (E.LedgerError, OSError) as e:
            failed = getattr(e, "code", "") or str(e) or type(e).__name__
        else:
            if resp.status == p.Status.OK:
                bounds = resp.bounds if len(resp.bounds) <= 2 * count else resp.bounds[: 2 * count]
                payloads, bad = codec.verify_spans(resp.data, bounds, first, step)
                n = len(payloads)
                if n:
                    await writer.send(resp.data, bounds[: 2 * n], first, step)
                    first += n * step
                    copied += n
                    tried.clear()
                    errors.clear()
                if bad is not None:
                    log.error("ledger=%d bookie=%s: %s", lid, bookie, bad)
                    failed = "digest mismatch"
                elif n == 0:
                    failed = "returned no entry"
            else:
                if resp.status == p.Status.UNAUTHORIZED:
                    bk.report_unauthorized(bookie, lid, "a re-replication read")
                failed = resp.status.name
        if failed and first <= last:
            tried.add(i)
            errors.append(f"{bookie}: {failed}")
            for j in range(1, len(sources) + 1):  # the next source not yet tried for this entry
                if (i + j) % len(sources) not in tried:
                    i = (i + j) % len(sources)
                    break
    return copied


async def copy_fragment(
    bk: BookKeeper,
    codec: EntryCodec,
    key: bytes,
    fragment: Fragment,
    target: str,
    sources: Callable[[int], list[str]],
    *,
    throttle: Throttle | None = None,
    on_copied: Callable[[int, int], None] = lambda entries, nbytes: None,
) -> int:
    """Copy the entries ``fragment``'s lost bookie stored to ``target`` (RECOVERY_ADD, the stored bytes as they
    are): read in batches from ``sources(entry_id)`` (the bookies to read that entry from, in order of
    preference), written pipelined. Returns the number of entries copied once ``target`` acknowledged them all;
    raises ``LedgerError`` otherwise. ``throttle(nbytes)`` is awaited before each group of entries is sent,
    ``on_copied(entries, nbytes)`` called as ``target`` acknowledges them."""
    cfg = bk.config
    batch_entries = max(1, cfg.read_batch_entries)
    max_bytes = max(1, min(cfg.read_batch_bytes, p.FRAME_SIZE_MAX - _RANGE_REPLY_FIXED - 4 * batch_entries))
    writer = _Writer(bk, codec.ledger_id, key, target, throttle, on_copied)
    runs = _runs(fragment, batch_entries)
    expected = sum(1 for _ in fragment.entries())
    copied = 0

    async def reader() -> None:
        nonlocal copied
        for run in runs:  # (one iterator shared by the readers: each batch is read once)
            n = await _copy_run(bk, codec, key, run, sources(run[0]), writer, max_bytes)
            copied += n  # (not ``copied += await ...``: that reads ``copied`` before the await)

    tasks = [asyncio.ensure_future(reader()) for _ in range(READS_IN_FLIGHT)]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            if t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        await writer.drain()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if copied != expected or writer.acked != expected:
        raise E.LedgerError(
            f"ledger {codec.ledger_id}: copied {writer.acked} of the {expected} entries to {target}",
            ledger_id=codec.ledger_id,
        )
    return expected


def _others(ensemble: tuple[str, ...], fragment: Fragment, entry_id: int) -> list[str]:
    """The bookies of ``entry_id``'s write set other than the lost one."""
    lost = ensemble[fragment.bookie_index]
    return [
        ensemble[i]
        for i in write_set(entry_id, fragment.ensemble_size, fragment.write_quorum)
        if ensemble[i] != lost
    ]


async def _fence(bk: BookKeeper, lid: int, key: bytes, bookie: str) -> None:
    """Fence the ledger on its new bookie, as its other bookies were fenced when it was closed."""
    r = await bk._ask_or_none(
        bookie,
        lambda rid: p.ReadEntryRequest(
            request_id=rid, ledger_id=lid, entry_id=p.LAST_ENTRY, master_key=key, flags=p.Flag.FENCE
        ),
    )
    if r is None or r.status not in (p.Status.OK, p.Status.NO_ENTRY):
        raise E.LedgerError(f"ledger {lid}: fencing it on {bookie} failed: {_why(r)}", ledger_id=lid)


async def rereplicate_ledger(
    bk: BookKeeper,
    ledger_id: int,
    lost: str,
    password: bytes,
    on_entry: Callable[[int], None] = lambda n: None,
    *,
    dry_run: bool = False,
) -> LedgerRereplication:
    """Copy ``lost``'s share of a CLOSED ledger to replacement bookies and swap them into its metadata (with
    ``dry_run``, only choose the replacements and count the entries)."""
    from .metadata import _meta, update_metadata

    md = await bk.ledger_metadata(ledger_id)
    if not any(lost in ens.bookies for ens in md.ensembles):
        return LedgerRereplication(ledger_id, "not_on_bookie")
    if not md.is_closed:
        return LedgerRereplication(ledger_id, "open", error=f"ledger is {md.state.value}: not re-replicated")
    if not md.check_password(password):
        return LedgerRereplication(ledger_id, "unauthorized", error="another password")
    key = p.master_key(password)
    codec = EntryCodec(ledger_id, DigestType(md.digest_type), key)
    available = await _meta(bk.registry.available)
    result = LedgerRereplication(ledger_id, "planned" if dry_run else "done")
    try:
        for fragment in lost_fragments(md, lost):
            ensemble = md.ensembles[fragment.ensemble_index].bookies
            target = replace_failed(ensemble, [fragment.bookie_index], available, exclude={lost})[
                fragment.bookie_index
            ]
            result.replacements[fragment.ensemble_index] = target
            if dry_run:
                result.entries_copied += sum(1 for _ in fragment.entries())
                continue
            result.entries_copied += await copy_fragment(
                bk,
                codec,
                key,
                fragment,
                target,
                functools.partial(_others, ensemble, fragment),
                on_copied=lambda n, _nbytes: on_entry(n),
            )
            await _fence(bk, ledger_id, key, target)
        if not dry_run:
            await update_metadata(
                bk.ledgers, ledger_id, lambda cur: (swapped(cur, lost, result.replacements), None)
            )
    except (E.LedgerError, ValueError) as e:
        return LedgerRereplication(ledger_id, "failed", result.entries_copied, error=str(e))
    return result


async def rereplicate_bookie(
    bk: BookKeeper,
    lost: str,
    password: bytes,
    on_entry: Callable[[int], None] = lambda n: None,
    on_ledger: Callable[[LedgerRereplication], None] = lambda r: None,
    *,
    dry_run: bool = False,
) -> list[LedgerRereplication]:
    """``rereplicate_ledger`` for every ledger ``lost`` is in (ledgers it is not in are not reported)."""
    out = []
    for lid in await bk.list_ledgers():
        try:
            r = await rereplicate_ledger(bk, lid, lost, password, on_entry, dry_run=dry_run)
        except E.NoSuchLedgerError:
            continue  # deleted meanwhile
        if r.status != "not_on_bookie":
            out.append(r)
            on_ledger(r)
    return out
