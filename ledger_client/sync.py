"""Blocking facade with the same names as the async client (for scripts and Spark executors).

One background event-loop thread per ``BookKeeper``; every call submits the coroutine to it and waits.

    from ledger_client.sync import BookKeeper
    bk = BookKeeper.connect("127.0.0.1:2181")
    lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"p")
    lh.append(b"x"); lh.close()
    for entry in bk.open_ledger(lh.ledger_id, password=b"p").read(0, 0): ...
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from bookie.entryformat import DigestType

from . import client as _async
from .client import ClientConfig, LedgerEntry

_T = TypeVar("_T")

__all__ = ["BookKeeper", "DigestType", "LedgerEntry", "LedgerHandle"]


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="ledgerstore-client", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, _T], timeout_s: float | None = None) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


class LedgerHandle:
    def __init__(self, loop: _Loop, handle: _async.LedgerHandle) -> None:
        self._loop = loop
        self._h = handle

    @property
    def ledger_id(self) -> int:
        return self._h.ledger_id

    @property
    def metadata(self) -> Any:
        return self._h.metadata

    @property
    def last_add_confirmed(self) -> int:
        return self._h.last_add_confirmed

    @property
    def length(self) -> int:
        return self._h.length

    @property
    def tail_length(self) -> tuple[int, int] | None:
        return self._h.tail_length

    def append(self, data: bytes) -> int:
        return self._loop.run(self._h.append(data))

    def append_many(self, items: list[bytes]) -> list[int]:
        """Pipelined appends (one round trip of the facade for many entries); ids in order."""
        return self._loop.run(self._h.append_many(items))

    def close(self) -> None:
        self._loop.run(self._h.close())

    def read(self, first: int, last: int) -> Iterator[LedgerEntry]:
        return self._iterate(self._h.read(first, last))

    def read_unconfirmed(self, first: int, last: int) -> Iterator[LedgerEntry]:
        return self._iterate(self._h.read_unconfirmed(first, last))

    def read_entry(self, entry_id: int) -> LedgerEntry:
        return self._loop.run(self._h.read_entry(entry_id))

    def read_last_add_confirmed(self) -> int:
        return self._loop.run(self._h.read_last_add_confirmed())

    def wait_for_lac(self, previous_lac: int, timeout_s: float) -> int:
        return self._loop.run(self._h.wait_for_lac(previous_lac, timeout_s))

    def tail(self, start: int = 0, poll_timeout_s: float = 2.0) -> Iterator[LedgerEntry]:
        return self._iterate(self._h.tail(start, poll_timeout_s))

    def _iterate(self, agen: Any, batch: int = 512) -> Iterator[LedgerEntry]:
        async def take() -> list[LedgerEntry]:
            out: list[LedgerEntry] = []
            async for e in agen:
                out.append(e)
                if len(out) >= batch:
                    break
            return out

        while True:
            chunk = self._loop.run(take())
            yield from chunk
            if len(chunk) < batch:
                return


class BookKeeper:
    def __init__(self, loop: _Loop, bk: _async.BookKeeper) -> None:
        self._loop = loop
        self._bk = bk

    @classmethod
    def connect(cls, zk_connect: str, *, config: ClientConfig | None = None, **kw: Any) -> BookKeeper:
        loop = _Loop()
        try:
            bk = loop.run(_async.BookKeeper.connect(zk_connect, config=config, **kw))
        except BaseException:
            loop.stop()
            raise
        return cls(loop, bk)

    def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        password: bytes = b"",
        digest: DigestType = DigestType.CRC32C,
        custom_metadata: Mapping[str, bytes] | None = None,
    ) -> LedgerHandle:
        h = self._loop.run(
            self._bk.create_ledger(ensemble_size, write_quorum, ack_quorum, password, digest, custom_metadata)
        )
        return LedgerHandle(self._loop, h)

    def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> LedgerHandle:
        return LedgerHandle(self._loop, self._loop.run(self._bk.open_ledger(ledger_id, password, recovery)))

    def delete_ledger(self, ledger_id: int) -> None:
        self._loop.run(self._bk.delete_ledger(ledger_id))

    def list_ledgers(self) -> list[int]:
        return self._loop.run(self._bk.list_ledgers())

    def ledger_metadata(self, ledger_id: int) -> Any:
        return self._loop.run(self._bk.ledger_metadata(ledger_id))

    def writable_bookies(self) -> list[str]:
        return self._loop.run(self._bk.writable_bookies())

    def readonly_bookies(self) -> list[str]:
        return self._loop.run(self._bk.readonly_bookies())

    def bookie_accepts_client(self, bookie: str) -> bool:
        """Whether ``bookie`` serves this client (its token, or none): the async client's
        ``bookie_accepts_client``, with its errors."""
        return self._loop.run(self._bk.bookie_accepts_client(bookie))

    def cluster_initialized(self) -> bool:
        """Whether a bookie ever started under this client's ZooKeeper root (its ``INSTANCEID`` znode exists):
        False for a root nobody uses, such as a mistyped one, whose ledger list is merely empty."""
        from zk import layout

        return bool(self._bk.store.exists(layout.INSTANCEID))

    def close(self) -> None:
        try:
            self._loop.run(self._bk.close(), timeout_s=30)
        finally:
            self._loop.stop()

    def __enter__(self) -> BookKeeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
