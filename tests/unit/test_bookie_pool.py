"""BookiePool: one shared connection attempt per bookie, whoever among its callers gives up (real sockets on
127.0.0.1)."""

from __future__ import annotations

import asyncio

import pytest

from ledger_client.bookie_conn import BookiePool
from ledger_client.errors import BookieUnavailableError


async def _server() -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"127.0.0.1:{port}"


def test_the_first_caller_giving_up_does_not_cancel_the_attempt_others_wait_for() -> None:
    async def main() -> None:
        server, bookie = await _server()
        pool = BookiePool()
        try:
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
        finally:
            await pool.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_a_caller_whose_attempt_is_cancelled_by_close_gets_a_bookie_error() -> None:
    async def main() -> None:
        server, bookie = await _server()
        pool = BookiePool()
        try:
            waiter = asyncio.ensure_future(pool.get(bookie))
            await asyncio.sleep(0)
            await pool.close()  # cancels the attempt under the waiter
            with pytest.raises(BookieUnavailableError, match="cancelled"):
                await asyncio.wait_for(waiter, 5)
            assert pool.get_nowait(bookie) is None
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_a_failed_attempt_reaches_every_caller_and_the_next_get_tries_again() -> None:
    async def main() -> None:
        server, bookie = await _server()
        server.close()
        await server.wait_closed()  # nothing listens there any more: connection refused
        pool = BookiePool()
        results = await asyncio.gather(pool.get(bookie), pool.get(bookie), return_exceptions=True)
        assert all(isinstance(r, BookieUnavailableError) for r in results), results
        with pytest.raises(BookieUnavailableError):
            await pool.get(bookie)
        await pool.close()

    asyncio.run(main())
