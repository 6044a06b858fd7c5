"""A tiny protocol-level client for bookie tests (no ledger client logic: raw adds and reads)."""

from __future__ import annotations

from bookie import protocol as p
from bookie.entryformat import DigestType, EntryCodec
from ledger_client.bookie_conn import BookieConnection, connect

KEY = p.master_key(b"secret")
WRONG = p.master_key(b"not-the-password")
TIMEOUT_S = 10.0


def payload_for(ledger: int, entry: int, size: int = 100) -> bytes:
    seed = f"L{ledger}E{entry}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


def build(ledger: int, entry: int, size: int = 100) -> bytes:
    return EntryCodec(ledger, DigestType.CRC32C).build(
        entry, entry - 1, (entry + 1) * size, payload_for(ledger, entry, size)
    )


class RawBookie:
    def __init__(self, conn: BookieConnection) -> None:
        self.conn = conn

    @classmethod
    async def open(cls, address: str) -> RawBookie:
        return cls(await connect(address))

    async def add(
        self, ledger: int, entry: int, *, key: bytes = KEY, flags: int = 0, size: int = 100
    ) -> p.Status:
        data = build(ledger, entry, size)
        resp = await self.conn.request(
            lambda rid: p.AddEntryRequest(
                request_id=rid, ledger_id=ledger, entry_id=entry, master_key=key, entry=data, flags=flags
            ),
            TIMEOUT_S,
        )
        return resp.status

    async def read(self, ledger: int, entry: int, *, key: bytes = KEY, flags: int = 0) -> p.ReadEntryResponse:
        resp = await self.conn.request(
            lambda rid: p.ReadEntryRequest(
                request_id=rid, ledger_id=ledger, entry_id=entry, master_key=key, flags=flags
            ),
            TIMEOUT_S,
        )
        assert isinstance(resp, p.ReadEntryResponse)
        return resp

    async def fence(self, ledger: int, *, key: bytes = KEY) -> p.ReadEntryResponse:
        return await self.read(ledger, p.LAST_ENTRY, key=key, flags=p.Flag.FENCE)

    def close(self) -> None:
        self.conn.close()
