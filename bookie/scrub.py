"""The scrubber: a bookie reads back what it stores, at a bounded rate, and reports what is damaged or missing.

A pass walks every ledger the bookie holds whose metadata says CLOSED (an open ledger's entries may still be
on their way to storage; it is scrubbed once closed). For each it works out the entries this bookie should hold
(``expected_entries``: the entries of each fragment naming it, per the write set, up to the last entry), walks
the ledger's stored runs (``RunSource.runs``) and checks each entry:

* structure: the run decodes, and each entry's header names this ledger and the id it is stored under;
* digest: CRC32C, CRC32 and HMAC digests are verified; the bookie has the ledger's master key (it keys HMAC),
  so every digest type but DUMMY is checked.

A damaged entry is taken out of storage (``RunSource.drop_entries``: reads answer NO_ENTRY for it, never bad
bytes, and the copy a worker adds back is not refused as a duplicate); a damaged run that does not decode goes
whole. The entries that were expected and are now not held (damaged or missing) go to ``report(ledger id,
entry ids)``, which the bookie turns into an under-replication mark naming itself and the entry ranges
(``zk.underreplication``): AutoRecovery's workers then copy them back from another replica (a live bookie in
a mark is repaired in place).

Reads are paced by a token bucket (``rate_bytes_per_s``; 0 = unpaced); the storage walk runs in a thread, a
batch of runs at a time. Everything the scrubber needs is injected, so tests drive it without RocksDB or
ZooKeeper.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from zk.ledger_metadata import LedgerMetadata

from .entryformat import HEADER, HEADER_LEN, DigestMismatchError, DigestType, EntryCodec
from .storage import run_entries

__all__ = [
    "DEFAULT_SCRUB_INTERVAL_S",
    "DEFAULT_SCRUB_RATE_MB",
    "RunSource",
    "ScrubPass",
    "Scrubber",
    "check_entry",
    "expected_entries",
    "ranges",
]

log = logging.getLogger("ledgerstore.bookie.scrub")

DEFAULT_SCRUB_RATE_MB = 4.0  # MiB/s read back at most: a modest share of a disk
DEFAULT_SCRUB_INTERVAL_S = 3600.0  # a pass an hour at most (a pass over a big bookie takes longer anyway)
RUNS_PER_BATCH = 64


class RunSource(Protocol):
    def runs(self, ledger_id: int, after: int = -1, limit: int = 64) -> list[tuple[int, bytes]]: ...

    def drop_entries(self, ledger_id: int, first: int, entry_ids: Iterable[int] | None) -> int: ...


def _in_write_set(entry_id: int, index: int, ensemble_size: int, write_quorum: int) -> bool:
    """Whether bookie ``index`` stores ``entry_id``: the write set is ``(entry_id + i) % E`` for i < Qw, as
    ``ledger_client.quorum.write_set`` (the bookie does not import the client)."""
    return (index - entry_id) % ensemble_size < write_quorum


def expected_entries(md: LedgerMetadata, bookie: str) -> set[int]:
    """The entries ``bookie`` should store of a CLOSED ledger (empty for an open one)."""
    if not md.is_closed:
        return set()
    out: set[int] = set()
    ens = md.ensembles
    e, qw = md.ensemble_size, md.write_quorum
    for k, ensemble in enumerate(ens):
        if bookie not in ensemble.bookies:
            continue
        idx = ensemble.bookies.index(bookie)
        last = ens[k + 1].first_entry_id - 1 if k + 1 < len(ens) else md.last_entry_id
        last = min(last, md.last_entry_id)
        for eid in range(ensemble.first_entry_id, last + 1):
            if _in_write_set(eid, idx, e, qw):
                out.add(eid)
    return out


def ranges(ids: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted ids as inclusive (first, last) ranges of consecutive ids."""
    out: list[tuple[int, int]] = []
    for i in sorted(set(ids)):
        if out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def check_entry(codec: EntryCodec | None, ledger_id: int, entry_id: int, entry: bytes) -> str | None:
    """Why ``entry`` (stored as entry ``entry_id`` of ``ledger_id``) is damaged, or None. Without a codec
    (DUMMY digests, or a digest type the bookie cannot check) only the header is checked."""
    if len(entry) < HEADER_LEN:
        return f"{len(entry)} bytes, shorter than a header"
    lid, eid, _, _ = HEADER.unpack_from(entry)
    if lid != ledger_id or eid != entry_id:
        return f"header names ledger {lid} entry {eid}"
    if codec is None:
        return None
    try:
        codec.verify(entry, entry_id)
    except DigestMismatchError as e:
        return str(e)
    return None


@dataclass
class ScrubPass:
    ledgers: int = 0  # ledgers scrubbed (closed in metadata)
    skipped: int = 0  # ledgers not scrubbed (open, deleted, or not naming this bookie)
    entries: int = 0  # entries read and checked
    bytes: int = 0
    damaged: int = 0  # entries (or undecodable runs) taken out of storage
    missing: int = 0  # expected entries not held (damaged ones included)
    reported: dict[int, list[int]] = field(default_factory=dict)  # ledger id -> entry ids reported
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "ledgers": self.ledgers,
            "skipped": self.skipped,
            "entries": self.entries,
            "bytes": self.bytes,
            "damaged": self.damaged,
            "missing": self.missing,
            "reported": {str(k): ranges(v) for k, v in self.reported.items()},
            "seconds": round(self.seconds, 3),
        }


class _Pacer:
    def __init__(self, rate: float, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.clock = clock
        self.tokens = rate
        self.updated = clock()

    async def take(self, nbytes: int) -> None:
        if self.rate <= 0:
            return
        now = self.clock()
        self.tokens = min(self.rate, self.tokens + (now - self.updated) * self.rate) - nbytes
        self.updated = now
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)


class Scrubber:
    """One bookie's scrubber. ``metadata(lid)`` is the ledger's metadata (None when deleted), ``master_key(lid)``
    the key the bookie holds for it (None when it no longer holds the ledger), ``report(lid, ids)`` records the
    entries to copy back. The blocking ones run in threads."""

    def __init__(
        self,
        *,
        bookie_id: str,
        storage: RunSource,
        ledgers: Callable[[], Iterable[int]],
        master_key: Callable[[int], bytes | None],
        metadata: Callable[[int], LedgerMetadata | None],
        report: Callable[[int, list[int]], object],
        rate_bytes_per_s: float,
        clock: Callable[[], float] = time.monotonic,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self.bookie_id = bookie_id
        self.storage = storage
        self.ledgers = ledgers
        self.master_key = master_key
        self.metadata = metadata
        self.report = report
        self.rate = rate_bytes_per_s
        self.clock = clock
        self.should_stop = should_stop
        self.passes = 0
        self.last: ScrubPass | None = None
        self.totals = ScrubPass()

    async def _thread(self, fn: Callable[..., object], *args: object) -> object:
        return await asyncio.to_thread(fn, *args)

    async def run_pass(self) -> ScrubPass:
        t0 = self.clock()
        out = ScrubPass()
        pacer = _Pacer(self.rate, self.clock)
        for lid in sorted(self.ledgers()):
            if self.should_stop():
                break
            await self._scrub_ledger(lid, out, pacer)
        out.seconds = self.clock() - t0
        self.passes += 1
        self.last = out
        for name in ("ledgers", "skipped", "entries", "bytes", "damaged", "missing"):
            setattr(self.totals, name, getattr(self.totals, name) + getattr(out, name))
        if out.damaged or out.missing:
            log.warning("bookie=%s scrub: %s", self.bookie_id, out.as_dict())
        else:
            log.info(
                "bookie=%s scrub: %d entries of %d ledgers intact", self.bookie_id, out.entries, out.ledgers
            )
        return out

    async def _scrub_ledger(self, lid: int, out: ScrubPass, pacer: _Pacer) -> None:
        md = await self._thread(self.metadata, lid)
        key = self.master_key(lid)
        if not isinstance(md, LedgerMetadata) or not md.is_closed or key is None:
            out.skipped += 1
            return
        expected = expected_entries(md, self.bookie_id)
        if not expected:
            out.skipped += 1
            return
        out.ledgers += 1
        try:
            kind: DigestType | None = DigestType(md.digest_type)
        except ValueError:
            kind = None
        codec = None if kind in (None, DigestType.DUMMY) else EntryCodec(lid, kind, key)  # type: ignore[arg-type]
        held: set[int] = set()
        damaged: set[int] = set()
        after = -1
        while not self.should_stop():
            batch = await self._thread(self.storage.runs, lid, after, RUNS_PER_BATCH)
            assert isinstance(batch, list)
            if not batch:
                break
            for first, value in batch:
                after = first
                await pacer.take(len(value))
                out.bytes += len(value)
                try:
                    ids, entries = run_entries(first, value)
                except ValueError as e:
                    log.warning(
                        "bookie=%s scrub: ledger=%d run %d does not decode: %s", self.bookie_id, lid, first, e
                    )
                    await self._thread(self.storage.drop_entries, lid, first, None)
                    out.damaged += 1
                    continue
                bad = []
                for eid, entry in zip(ids, entries, strict=True):
                    out.entries += 1
                    why = check_entry(codec, lid, eid, entry)
                    if why is None:
                        held.add(eid)
                    else:
                        log.warning(
                            "bookie=%s scrub: ledger=%d entry=%d damaged: %s", self.bookie_id, lid, eid, why
                        )
                        bad.append(eid)
                if bad:
                    await self._thread(self.storage.drop_entries, lid, first, bad)
                    out.damaged += len(bad)
                    damaged.update(bad)
        lacking = sorted(expected - held)
        if lacking and not self.should_stop():
            out.missing += len(lacking)
            out.reported[lid] = lacking
            await self._thread(self.report, lid, lacking)
