"""Which configured password a ledger has: the metadata keeps only a salted digest, so AutoRecovery, like
BookKeeper's, is given the passwords (``--password``, repeatable) and tries each once per ledger."""

from __future__ import annotations

import asyncio

from zk.ledger_metadata import LedgerMetadata

__all__ = ["PasswordBook"]


class PasswordBook:
    def __init__(self, passwords: tuple[bytes, ...]) -> None:
        self.passwords = passwords
        self._found: dict[int, bytes | None] = {}

    async def of(self, md: LedgerMetadata) -> bytes | None:
        """The ledger's password among the configured ones (None: none is; remembered per ledger id)."""
        if md.ledger_id not in self._found:
            found = None
            for pw in self.passwords:
                if await asyncio.to_thread(md.check_password, pw):  # PBKDF2: keep it off the event loop
                    found = pw
                    break
            self._found[md.ledger_id] = found
        return self._found[md.ledger_id]
