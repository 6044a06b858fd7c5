"""A compaction's two phases parse the topic's entries (and inflate a ZLIB batch, up to 256 MiB an entry) in
worker threads, a chunk of entries at a time, not on the broker's event loop; the compacted ledger is the same.
Real ZooKeeper and bookie processes."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from ledger_client import BookKeeper, ClientConfig
from tests.faults.test_compaction_record_faults import keyed, keyed_topic
from topic_broker import compaction, wire


def test_a_compactions_phases_run_off_the_event_loop(bookies: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    bookies.start_many(2)
    threads: list[threading.Thread] = []
    real_add, real_entry = compaction.PhaseOne.add, compaction.phase_two_entry

    def add(self: compaction.PhaseOne, pos: Any, data: bytes) -> None:
        threads.append(threading.current_thread())
        real_add(self, pos, data)

    def entry(latest: Any, pos: Any, data: bytes) -> bytes | None:
        threads.append(threading.current_thread())
        return real_entry(latest, pos, data)

    monkeypatch.setattr(compaction.PhaseOne, "add", add)
    monkeypatch.setattr(compaction, "phase_two_entry", entry)

    async def body() -> list[bytes]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            _store, _config, ml, comp = await keyed_topic(bk)  # v0..v3 over keys k0, k1
            await ml.append(keyed("k0", b"v4"))
            await comp.compact()
            assert comp.view is not None
            kept = [compaction.decode_compacted(e.data)[1] async for e in comp.view.handle.read(0, 1)]
            await comp.close()
            await ml.close()
            return [bytes(wire.parse_entry(d, verify_checksum=False)[1]) for d in kept]
        finally:
            await bk.close()

    loop_thread = threading.current_thread()  # asyncio.run's loop runs on this thread
    assert asyncio.run(body()) == [b"v3", b"v4"]
    assert len(threads) == 10 and loop_thread not in threads  # 5 entries, each parsed in both phases
