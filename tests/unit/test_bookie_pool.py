"""BookiePool: one shared connection attempt per bookie, whoever among its callers gives up (real sockets on
127.0.0.1)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from ledger_client.bookie_conn import BookiePool
from ledger_client.errors import BookieUnavailableError


@contextlib.asynccontextmanager
async def _listening() -> AsyncIterator[str]:
    """The address of a server on 127.0.0.1 that accepts connections, for as long as the block runs."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


def test_the_first_caller_giving_up_does_not_cancel_the_attempt_others_wait_for() -> None:
    async def main() -> None:
        pool = BookiePool()
        async with _listening() as bookie:
            first = asyncio.ensure_future(pool.get(bookie))
            second = asyncio.ensure_future(pool.get(bookie))
            await asyncio.sleep(0)  # both are waiting on the one attempt
            first.cancel()
            conn = await asyncio.wait_for(second, 5)
            assert not conn.closed
            with pytest.raises(asyncio.CancelledError):
                await first
            assert pool.get_nowait(bookie) is conn  # the attempt finished and its connection is kept
            assert await pool.get(bookie) is conn
            await pool.close()

    asyncio.run(main())


def test_a_caller_whose_attempt_is_cancelled_by_close_gets_a_bookie_error() -> None:
    async def main() -> None:
        pool = BookiePool()
        async with _listening() as bookie:
            waiter = asyncio.ensure_future(pool.get(bookie))
            await asyncio.sleep(0)
            await pool.close()  # cancels the attempt under the waiter
            with pytest.raises(BookieUnavailableError, match="cancelled"):
                await asyncio.wait_for(waiter, 5)
            assert pool.get_nowait(bookie) is None

    asyncio.run(main())


def test_a_failed_attempt_reaches_every_caller_and_the_next_get_tries_again() -> None:
    async def main() -> None:
        async with _listening() as bookie:
            pass  # nothing listens there any more: connection refused
        pool = BookiePool()
        results = await asyncio.gather(pool.get(bookie), pool.get(bookie), return_exceptions=True)
        assert all(isinstance(r, BookieUnavailableError) for r in results), results
        with pytest.raises(BookieUnavailableError):
            await pool.get(bookie)
        await pool.close()

    asyncio.run(main())
