"""A range read that cannot be served: one clear error to the caller, nothing left running behind it."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from ledger_client import BookKeeper, ClientConfig, LedgerError

PW = b"secret"


def payload(i: int) -> bytes:
    return (f"entry-{i}-".encode() * 20)[:100]


async def _written_and_closed(bookies, n: int) -> tuple[BookKeeper, int]:
    bk = await BookKeeper.connect(
        bookies.zk,
        config=ClientConfig(
            zk_root=bookies.root, read_batch_entries=64, read_ahead_batches=8, read_timeout_s=2.0
        ),
    )
    lh = await bk.create_ledger(3, 2, 2, password=PW)
    await asyncio.gather(*[await lh.append_future(payload(i)) for i in range(n)])
    await lh.close()
    return bk, lh.ledger_id


@pytest.mark.parametrize("api", ["read", "read_batches"])
def test_a_range_read_with_entries_on_no_live_replica_raises_one_error_and_leaves_no_task(
    bookies, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    procs = bookies.start_many(3)
    unhandled: list[dict] = []

    async def go() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: unhandled.append(ctx))
        bk, lid = await _written_and_closed(bookies, 3000)
        rh = await bk.open_ledger(lid, password=PW, recovery=False)
        ensemble = rh.metadata.last_ensemble.bookies
        # with E3/Qw2 every third entry lives only on these two bookies
        for bp in procs:
            if bp.id in ensemble[:2]:
                bp.kill9()
        got: list[int] = []
        before = asyncio.all_tasks()

        async def consume() -> None:
            if api == "read":
                async for e in rh.read(0, 2999):
                    got.append(e.entry_id)
            else:
                async for b in rh.read_batches(0, 2999):
                    got.extend(range(b.first_entry_id, b.last_entry_id + 1))

        with pytest.raises(LedgerError) as info:  # an error, promptly: not a hang
            await asyncio.wait_for(consume(), 60)
        # the entries before the first unavailable one were delivered in order, none after a gap
        assert got == list(range(len(got)))
        assert str(info.value)
        # nothing the read started is still running, and nothing failed unobserved
        for _ in range(20):
            await asyncio.sleep(0.05)
        leftover = [t for t in asyncio.all_tasks() - before if not t.done()]
        assert leftover == []
        await bk.close()
        gc.collect()
        await asyncio.sleep(0.1)

    with caplog.at_level(logging.ERROR):
        asyncio.run(go())
    gc.collect()
    assert unhandled == []
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
