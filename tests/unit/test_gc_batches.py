"""The GC pass deletes confirmed ledgers in batches, checks each one's index row again just before its batch,
and deletes nothing more once stopped."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from bookie.gc import DELETE_BATCH, VERIFY_CHUNK, LedgerCollector


@dataclass
class Info:
    master_key: bytes = b"k"
    fenced: bool = False
    lac: int = -1
    explicit_lac: int = -1
    last_entry_id: int = -1


class Metadata:
    def __init__(self, ids: set[int], on_read: dict[int, object] | None = None) -> None:
        self.ids = ids
        self.on_read = on_read or {}

    def ledgers_parent(self) -> list[str] | None:
        return ["L1"]

    def list_ids(self) -> list[int]:
        return sorted(self.ids)

    def ledger_exists(self, ledger_id: int) -> bool:
        hook = self.on_read.get(ledger_id)
        if callable(hook):
            hook()
        return ledger_id in self.ids


def test_a_pass_deletes_in_batches_up_to_its_bound() -> None:
    local = {lid: Info() for lid in range(1, 2 * DELETE_BATCH + 11)}
    batches: list[list[int]] = []

    def delete(ids: list[int]) -> None:
        batches.append(ids)
        for lid in ids:
            del local[lid]

    c = LedgerCollector(Metadata({1}), lambda: local, delete, deletions_max=2 * DELETE_BATCH + 5)
    result = asyncio.run(c.run_pass())
    assert [len(b) for b in batches] == [DELETE_BATCH, DELETE_BATCH, 5]
    assert result.bound_hit and len(result.deleted) == 2 * DELETE_BATCH + 5 and c.stats.delete_batches == 3
    assert 1 in local and len(local) == 1 + 4


def test_a_ledger_fenced_after_it_was_confirmed_gone_is_kept_out_of_its_batch() -> None:
    n = VERIFY_CHUNK + 10
    local = {lid: Info() for lid in range(1, n + 1)}
    batches: list[list[int]] = []

    def fence_3() -> (
        None
    ):  # ledger 3 is confirmed gone (first chunk), then fenced while the next chunk is read
        local[3].fenced = True

    c = LedgerCollector(Metadata({n}, {VERIFY_CHUNK + 5: fence_3}), lambda: local, batches.append)
    result = asyncio.run(c.run_pass())
    expected = [lid for lid in range(1, n) if lid != 3]
    assert batches == [expected] and list(result.deleted) == expected
    assert c.stats.in_use == 1


def test_a_stopped_pass_deletes_nothing_more() -> None:
    local = {lid: Info() for lid in range(1, 3 * DELETE_BATCH)}
    batches: list[list[int]] = []
    c = LedgerCollector(Metadata({1}), lambda: local, batches.append)
    result = asyncio.run(c.run_pass(lambda: bool(batches)))
    assert result.stopped and len(batches) == 1 and result.deleted == tuple(batches[0])
