"""The acks' direct resumption of the tasks awaiting ``append`` (``send_path._resume_appends``, 9b6a5d8) under
re-entrancy: a resumed task that appends again, raises, cancels a later one, awaits something already done, or
reads a context variable; a chunk whose OK rows are followed by FENCED; acks processed inside a task. On asyncio's
own loop and uvloop."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from bookie import protocol as p
from ledger_client.errors import LedgerError
from tests.unit.test_client_fastpath import _ack, _frames, _handle

pytestmark = pytest.mark.timeout(20)  # a task left unresumed hangs the loop: fail, not wait 300 s

_var: contextvars.ContextVar[int] = contextvars.ContextVar("_var", default=-1)


def _run(go: Callable[[], Coroutine[Any, Any, None]], loop: str) -> None:
    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        uvloop.run(go())
    else:
        asyncio.run(go())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_resumed_tasks_that_append_raise_cancel_and_read_their_context(loop: str) -> None:
    async def go() -> None:
        lh, conns = _handle(E=3, qw=3, qa=2)
        ev = asyncio.get_running_loop()
        done = ev.create_future()
        done.set_result(None)
        seen: list[
            tuple[int, int, int, bool]
        ] = []  # (task, entry, its context variable, it is the current task)
        tasks: dict[int, asyncio.Task[int]] = {}

        async def worker(i: int) -> int:
            _var.set(i)
            eid = await lh.append(b"t%d" % i)
            seen.append((i, eid, _var.get(), asyncio.current_task() is tasks[i]))
            if i == 0:
                await done  # completes at once: the step goes on
                return await lh.append(b"again")  # an append from inside the acks' processing
            if i == 1:
                raise ValueError("boom")
            if i == 2:
                tasks[4].cancel()  # a later one of the same chunk
            return eid

        for i in range(6):
            tasks[i] = asyncio.create_task(worker(i))
        await asyncio.sleep(0)
        states: list[list[bool]] = []

        def acks() -> None:  # as a connection's data_received: no task running
            _ack(lh, conns["b0"])
            _ack(lh, conns["b1"])
            states.append([tasks[i].done() for i in range(6)])

        ev.call_soon(acks)
        await asyncio.sleep(0)
        assert states == [[False, True, True, True, False, True]]  # 0 appended again; 4 ends cancelled next
        assert seen == [(0, 0, 0, True), (1, 1, 1, True), (2, 2, 2, True), (3, 3, 3, True), (5, 5, 5, True)]
        await asyncio.sleep(0)  # the re-entrant append goes out
        ev.call_soon(acks)
        results = await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), 5)
        assert results[0] == 6 and isinstance(results[1], ValueError) and results[2:4] == [2, 3]
        assert isinstance(results[4], asyncio.CancelledError) and results[5] == 5
        assert lh.last_add_confirmed == 6 and not lh._inflight
        lh._stop_sweeper()

    _run(go, loop)


def test_a_chunk_of_oks_then_fenced_fails_the_append_a_resumed_task_makes() -> None:
    async def go() -> None:
        lh, conns = _handle(E=3, qw=3, qa=2)
        again: list[object] = []

        async def worker(i: int) -> int:
            eid = await lh.append(b"x")
            if i == 0:
                try:
                    again.append(await lh.append(b"y"))
                except LedgerError as e:
                    again.append(e)
            return eid

        tasks = [asyncio.create_task(worker(i)) for i in range(2)]
        await asyncio.sleep(0)

        def chunk() -> None:  # b1's rows: OK for entry 0, FENCED for entry 1, in one chunk
            _ack(lh, conns["b0"])
            rows = [
                (
                    29,
                    1,
                    int(p.OpCode.ADD_ENTRY),
                    0,
                    rid,
                    int(p.Status.OK if eid == 0 else p.Status.FENCED),
                    7,
                    eid,
                )
                for buf in conns["b1"].written
                for rid, eid in _frames(buf)
            ]
            conns["b1"].written.clear()
            lh.on_add_rows("b1", rows)

        asyncio.get_running_loop().call_soon(chunk)
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        assert results[0] == 0 and isinstance(results[1], LedgerError)
        assert len(again) == 1 and isinstance(again[0], LedgerError)  # failed, not left waiting
        assert not lh._inflight
        lh._stop_sweeper()

    asyncio.run(go())


def test_acks_processed_inside_a_task_resume_the_appending_tasks_through_the_loop() -> None:
    async def go() -> None:
        lh, conns = _handle(E=3, qw=3, qa=2)
        tasks = [asyncio.create_task(lh.append(b"x%d" % i)) for i in range(3)]
        await asyncio.sleep(0)

        async def acks() -> list[bool]:  # as an ensemble change's resends: a task is running
            _ack(lh, conns["b0"])
            _ack(lh, conns["b1"])
            return [t.done() for t in tasks]

        assert await asyncio.create_task(acks()) == [False, False, False]
        assert await asyncio.wait_for(asyncio.gather(*tasks), 5) == [0, 1, 2]
        lh._stop_sweeper()

    asyncio.run(go())
