"""The client's metadata boundary: zk errors become ledger_client errors here and nowhere else.

Every read-modify-write of a ledger's metadata (the writer's close and ensemble changes, recovery's
OPEN→IN_RECOVERY and IN_RECOVERY→CLOSED, re-replication's bookie swaps) goes through :func:`update_metadata`,
one compare-and-set loop (``zk.LedgerMetadataStore.update_with``) driving a pure transition: on a version
conflict it re-reads and applies the transition again; the transition gives up (raises, or writes nothing and
says why) on a state that forbids the change. The transitions are the pure cores' (``handle_state``,
``recovery``, ``rereplication``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from . import errors as E

if TYPE_CHECKING:
    from zk.ledger_metadata import LedgerMetadata, LedgerMetadataStore
    from zk.versioned import Versioned

_T = TypeVar("_T")
_R = TypeVar("_R")

__all__ = ["read_metadata", "update_metadata"]


async def _meta(call: Callable[[], _T], ledger_id: int | None = None) -> _T:
    """Run a blocking metadata call in a worker thread, with its zk errors as ledger_client errors."""
    import zk

    try:
        return await asyncio.to_thread(call)
    except zk.MetadataNotFoundError as e:
        raise E.NoSuchLedgerError(f"ledger {ledger_id} does not exist", ledger_id=ledger_id) from e
    except zk.MetadataVersionError as e:
        raise E.MetadataVersionError(str(e), ledger_id=ledger_id) from e
    except zk.MetadataError as e:
        raise E.MetadataStoreError(str(e), ledger_id=ledger_id) from e


async def read_metadata(ledgers: LedgerMetadataStore, ledger_id: int) -> Versioned[LedgerMetadata]:
    """The ledger's metadata as stored now.

    Raises:
        NoSuchLedgerError: no such ledger.
        MetadataStoreError: ZooKeeper could not be reached or answered something unreadable.
    """
    return await _meta(functools.partial(ledgers.read, ledger_id), ledger_id)


async def update_metadata(
    ledgers: LedgerMetadataStore,
    ledger_id: int,
    transition: Callable[[LedgerMetadata], tuple[LedgerMetadata | None, _R]],
    current: Versioned[LedgerMetadata] | None = None,
) -> tuple[Versioned[LedgerMetadata], _R]:
    """The compare-and-set loop on a ledger's metadata, in one worker-thread hop.

    Args:
        ledgers: the metadata store.
        ledger_id: the ledger.
        transition: pure (it runs in the worker thread): the metadata found -> ``(new, result)``, ``new`` the
            metadata to write or ``None`` to write nothing; raises to give up.
        current: the version the caller holds (the first attempt writes on it without a read), else read first.

    Returns:
        The metadata as written (or as found when nothing was written) and the transition's result for it.

    Raises:
        MetadataVersionError: too many conflicts in a row (``zk.ledger_metadata.CAS_RETRIES_MAX``).
        NoSuchLedgerError: no such ledger.
        MetadataStoreError: ZooKeeper could not be reached (the write may or may not have been applied), or the
            new metadata is not a legal successor.
        Whatever ``transition`` raises.
    """
    call: Any = functools.partial(ledgers.update_with, ledger_id, transition, current=current)
    result: tuple[Versioned[LedgerMetadata], _R] = await _meta(call, ledger_id)
    return result
