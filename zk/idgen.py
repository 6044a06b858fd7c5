"""Cluster-wide unique ids (ledger ids) from a compare-and-set counter znode.

The counter lives at ``/idgen`` with the body ``{"format_version": 1, "next_id": N}``: the next id nobody has
been given. Allocating a block of ``k`` ids is one successful CAS ``N -> N + k``; the winner owns ``[N, N + k)``.
Because every allocation is a CAS on the same znode version, two allocations can never both succeed from the
same ``N``: ids are never handed out twice, across any number of threads, processes and sessions. Ids lost to a
crash (a process dies with part of its block unused) are simply skipped; ids are unique, not dense.

Why not ZooKeeper sequential znodes? Their counter is a signed 32-bit int per parent (it wraps after 2^31
creations); the CAS counter covers the full non-negative int64 range that ledger paths support.
"""

from __future__ import annotations

import asyncio
import threading

from zk import layout
from zk.client import JsonDict, MetadataStore
from zk.errors import InvalidMetadataError, MetadataFormatError

#: The first id ever handed out (0 is avoided so that "no id" bugs like ``if ledger_id:`` cannot bite).
FIRST_ID = 1


class IdGenerator:
    """Hands out unique ids. ``block_size`` > 1 reserves that many ids per CAS (fewer round trips, more ids
    skipped on a crash). Thread-safe."""

    def __init__(self, store: MetadataStore, path: str = layout.IDGEN, *, block_size: int = 1) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self._store = store
        self._path = path
        self._block_size = block_size
        self._lock = threading.Lock()
        self._next = 0
        self._end = 0  # exclusive end of the locally reserved block

    def next_id(self) -> int:
        with self._lock:
            if self._next >= self._end:
                self._next, self._end = self.reserve(self._block_size)
            value = self._next
            self._next += 1
            return value

    def reserve(self, count: int) -> tuple[int, int]:
        """Reserve ``count`` fresh ids with one CAS; returns the half-open range ``(start, end)``."""
        if count < 1:
            raise ValueError("count must be >= 1")

        def bump(value: JsonDict) -> JsonDict:
            nxt = value.get("next_id")
            if isinstance(nxt, bool) or not isinstance(nxt, int) or nxt < 0:
                raise MetadataFormatError(f"id counter holds a bad next_id {nxt!r}", path=self._path)
            if nxt + count - 1 > layout.MAX_LEDGER_ID:
                raise InvalidMetadataError("id space exhausted", path=self._path)
            value["next_id"] = nxt + count
            return value

        result = self._store.update(self._path, bump, retries=1000, default={"next_id": FIRST_ID})
        end = int(result.value["next_id"])
        return end - count, end

    async def anext_id(self) -> int:
        return await asyncio.to_thread(self.next_id)
