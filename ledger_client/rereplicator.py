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
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bookie import protocol as p
from bookie.entryformat import DigestMismatchError, DigestType, EntryCodec

from . import errors as E
from .placement import replace_failed
from .quorum import write_set
from .rereplication import Fragment, lost_fragments, swapped

if TYPE_CHECKING:
    from .client import BookKeeper

__all__ = ["LedgerRereplication", "rereplicate_bookie", "rereplicate_ledger"]

COPIES_IN_FLIGHT = 64


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


async def _copy_fragment(
    bk: BookKeeper,
    codec: EntryCodec,
    key: bytes,
    ensemble: tuple[str, ...],
    fragment: Fragment,
    target: str,
    on_entry: Callable[[int], None],
) -> int:
    lost = ensemble[fragment.bookie_index]
    e_size, qw = fragment.ensemble_size, fragment.write_quorum
    sem = asyncio.Semaphore(COPIES_IN_FLIGHT)

    async def copy(eid: int) -> None:
        async with sem:
            sources = [ensemble[i] for i in write_set(eid, e_size, qw) if ensemble[i] != lost]
            entry = await _read_verified(bk, codec, key, eid, sources)
            await _write(bk, codec.ledger_id, key, target, eid, entry)
            on_entry(1)

    ids = list(fragment.entries())
    for start in range(0, len(ids), 4 * COPIES_IN_FLIGHT):  # bounded: never a task per entry of a huge ledger
        await asyncio.gather(*(copy(e) for e in ids[start : start + 4 * COPIES_IN_FLIGHT]))
    return len(ids)


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
    from .client import _meta

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
            result.entries_copied += await _copy_fragment(
                bk, codec, key, ensemble, fragment, target, on_entry
            )
            await _fence(bk, ledger_id, key, target)
        if not dry_run:
            await _meta(
                functools.partial(
                    bk.ledgers.update, ledger_id, lambda cur: swapped(cur, lost, result.replacements)
                ),
                ledger_id,
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
