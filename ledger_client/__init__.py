"""The ledgerstore ledger client (async). ``ledger_client.sync`` has the blocking twin.

bk = await BookKeeper.connect("127.0.0.1:2181")
lh = await bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"secret")
await lh.append(b"payload"); await lh.close()
rh = await bk.open_ledger(lh.ledger_id, password=b"secret", recovery=True)
"""

from bookie.entryformat import DigestType
from zk.ledger_metadata import LedgerState

from .client import BookKeeper, ClientConfig, EntryBatch, LedgerEntry, LedgerHandle
from .errors import (
    BookieUnavailableError,
    DigestMismatchError,
    LedgerClosedError,
    LedgerError,
    LedgerFencedError,
    LedgerRecoveryError,
    MetadataStoreError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    ReadBeyondLacError,
    UnauthorizedError,
)
from .send_path import ENTRY_PAYLOAD_MAX

__all__ = [
    "BookKeeper",
    "BookieUnavailableError",
    "ClientConfig",
    "DigestMismatchError",
    "DigestType",
    "ENTRY_PAYLOAD_MAX",
    "EntryBatch",
    "LedgerClosedError",
    "LedgerEntry",
    "LedgerError",
    "LedgerFencedError",
    "LedgerHandle",
    "LedgerRecoveryError",
    "LedgerState",
    "MetadataStoreError",
    "MetadataVersionError",
    "NoSuchEntryError",
    "NoSuchLedgerError",
    "NotEnoughBookiesError",
    "ReadBeyondLacError",
    "UnauthorizedError",
]
