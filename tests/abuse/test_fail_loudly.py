"""Descriptor exhaustion: the bookie never stays registered writable while its writes fail silently."""

from __future__ import annotations

import asyncio
import os
import resource
import time

from bookie import protocol as p
from tests.abuse.helpers import http
from tests.integration.rawbookie import RawBookie
from zk import BookieRegistry, MetadataStore


def test_after_descriptors_run_out_and_come_back_the_bookie_serves_or_is_readonly_and_unhealthy(
    bookies,
) -> None:
    bp = bookies.start("--checkpoint-interval-s", "0.2")
    assert bp.proc is not None
    pid = bp.proc.pid

    async def go() -> None:
        raw = await RawBookie.open(bp.id)
        for e in range(20):
            assert await raw.add(21, e) == p.Status.OK
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        used = len(os.listdir(f"/proc/{pid}/fd"))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (used, hard))  # not one descriptor more
        statuses = []
        try:
            for e in range(20, 400):
                try:
                    statuses.append(await raw.add(21, e, size=64 * 1024))
                except Exception as ex:  # the connection dropped, or a request timed out
                    statuses.append(type(ex).__name__)
                    break
                if statuses[-1] != p.Status.OK:
                    break
                await asyncio.sleep(0.005)
            await asyncio.sleep(1.0)  # a checkpoint or two under the limit
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        raw.close()
        assert "TimeoutError" not in statuses, statuses  # never a silent hang

    asyncio.run(go())
    time.sleep(1.0)
    status, health = http(bp, "GET", "/health")
    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        writable = bp.id in BookieRegistry(store).available()
    finally:
        store.close()

    async def serves() -> bool:
        raw = await RawBookie.open(bp.id)
        try:
            return await raw.add(22, 0) == p.Status.OK
        finally:
            raw.close()

    if status == 200:  # it came through: registered writable and adds work
        assert writable and asyncio.run(serves()), health
    else:  # it failed loudly: unhealthy with a reason, registered read-only, refusing adds
        assert status == 503 and health["status"] == "failed" and health["reason"], health
        assert not writable
        assert not asyncio.run(serves())
    assert bp.alive
