"""The asyncio ledger client's user-facing side: ``BookKeeper`` and ``LedgerHandle``; thin I/O around the pure
cores (``pending``, ``recovery``, ``handle_state``, ``quorum``).

``BookKeeper`` owns one ZooKeeper session (metadata, bookie discovery) and one connection per bookie.
``LedgerHandle`` is a writer (``create_ledger``) or a reader (``open_ledger``); both read.

The responsibilities live apart, as aiokafka splits its producer: the writer's send path (adds, acks, timeouts,
ensemble changes) is ``send_path.WriterSendPath``, the handle's base class; the recovery driver is
``recovery_driver``; every metadata read-modify-write goes through ``metadata.update_metadata``. The names other
packages import from here (``_meta``, ``_Routes``, ``resolve_auth_token``, ...) stay importable from here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import itertools
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bookie import protocol as p
from bookie.entryformat import DigestMismatchError as _RawDigestMismatch
from bookie.entryformat import DigestType, EntryCodec, peek_header
from zk.ledger_metadata import LedgerState

from . import errors as E
from .bookie_conn import BookiePool, Security, client_tls_context
from .handle_state import (
    HandleEvent,
    HandleState,
    HandleStateMachine,
    writer_close_transition,
)
from .metadata import _meta, read_metadata, update_metadata
from .pending import DEFAULT_OUTSTANDING_ADDS_MAX, WritePipeline
from .placement import choose_ensemble, replace_failed
from .quorum import CoverageSet, answer_for_status, validate_quorum, write_set
from .range_reader import BatchReader, RefreshAndRetry
from .read_conn import ReadPool
from .recovery_driver import recover
from .send_path import _OPEN, AddCallback, WriterSendPath, _ignore_add

log = logging.getLogger("ledgerstore.client")

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    zk_root: str = "/ledgerstore"
    add_timeout_s: float = 10.0
    read_timeout_s: float = 10.0
    outstanding_adds_max: int = DEFAULT_OUTSTANDING_ADDS_MAX
    ensemble_change_timeout_s: float = 30.0
    recovery_attempts_max: int = 5
    # Sequential reads: READ_RANGE batches of at most this many entries and bytes (the bytes also kept under the
    # frame limit), ``read_ahead_batches`` of them in flight
    read_batch_entries: int = 512
    read_batch_bytes: int = 1024 * 1024
    read_ahead_batches: int = 8
    # A bookie a read timed out on is asked last by this client's reads for this long (BookKeeper's bookie
    # failure history): a hung replica costs one read_timeout_s, not one per read.
    read_failure_history_s: float = 60.0
    # A read a bookie has not answered for this long is sent to the next replica of its entries too, and the
    # first to deliver wins (BookKeeper's speculativeReadTimeout); 0 disables. docs/client.md, "Reading"
    speculative_read_timeout_s: float = 2.0
    zk_session_timeout_s: float = 10.0
    # A writer sends its LAC explicitly (WRITE_LAC) this often while it has advanced, so tailing readers see
    # the latest entries without waiting for the next add to piggyback it (0 disables).
    explicit_lac_interval_s: float = 0.5
    # Token sent as each bookie connection's first frame (AUTH; docs/operations.md, "Authentication"). None:
    # $LEDGERSTORE_AUTH_TOKEN, else the file named by $LEDGERSTORE_AUTH_TOKEN_FILE, else no token
    auth_token: str | None = None
    # TLS to the bookies (they run with --tls-cert/--tls-key): the PEM file of the CA (or the bookies'
    # certificates) to verify them with. None: $LEDGERSTORE_TLS_CA, else plaintext
    tls_ca: str | None = None
    # ZooKeeper digest credentials ('user:password' or a zk.acl.ZkAuth; docs/operations.md, "ZooKeeper ACLs").
    # None: $LEDGERSTORE_ZK_AUTH, else the file named by $LEDGERSTORE_ZK_AUTH_FILE, else none. Never in repr
    zk_auth: Any = field(default=None, repr=False)
    # Once per process, at the first connect: collect, then move every object alive (modules, the application's
    # start-up state) to the collector's permanent generation (gc.freeze), so that CPython's full collections no
    # longer walk them. With hundreds of appends in flight as tasks those collections run every few thousand
    # entries; docs/client.md, "Many tasks and CPython's garbage collector". False leaves the collector alone
    freeze_heap: bool = True


_heap_frozen = False


def freeze_heap_once() -> bool:
    """``gc.collect()`` then ``gc.freeze()``, the first time it is called in this process (True then). The objects
    alive then are still freed by reference counting when released, but a reference cycle among them that is
    dropped later is not collected."""
    global _heap_frozen
    if _heap_frozen:
        return False
    _heap_frozen = True
    gc.collect()
    gc.freeze()
    return True


def resolve_auth_token(config: ClientConfig) -> str | None:
    """The token a client sends: the config's, else ``$LEDGERSTORE_AUTH_TOKEN``, else the contents of the file
    ``$LEDGERSTORE_AUTH_TOKEN_FILE`` names (what ``--auth-token-file`` sets), else none."""
    if config.auth_token:
        return config.auth_token.strip()
    token = os.environ.get("LEDGERSTORE_AUTH_TOKEN", "").strip()
    if token:
        return token
    path = os.environ.get("LEDGERSTORE_AUTH_TOKEN_FILE")
    if path:
        with open(path) as f:
            token = f.read().strip()
        if not token:
            raise E.IncorrectParameterError(f"token file {path} is empty")
        return token
    return None


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    ledger_id: int
    entry_id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class EntryBatch:
    """Consecutive entries of one ledger as a column: entry ``first_entry_id + k`` has payload ``payloads[k]``.
    What ``LedgerHandle.read_batches`` yields (one object per run of entries, none per entry). ``payloads`` is a
    list of ``bytes``; from ``read_batches(..., rows=True)`` a run of entries of one size is instead a read-only
    2-D numpy uint8 array, a row per entry (``entries`` is for lists)."""

    ledger_id: int
    first_entry_id: int
    payloads: Any  # list[bytes], or rows (see above)

    def __len__(self) -> int:
        return len(self.payloads)

    @property
    def last_entry_id(self) -> int:
        return self.first_entry_id + len(self.payloads) - 1

    def entries(self) -> Iterator[LedgerEntry]:
        """The batch as ``LedgerEntry`` objects, made as they are iterated."""
        first = self.first_entry_id
        n = len(self.payloads)
        return map(LedgerEntry, itertools.repeat(self.ledger_id, n), range(first, first + n), self.payloads)


class BookKeeper:
    """Entry point: ``bk = await BookKeeper.connect("127.0.0.1:2181")``."""

    def __init__(self, store: Any, config: ClientConfig) -> None:
        import zk

        self.config = config
        self.store = store
        self.ledgers = zk.LedgerMetadataStore(store)
        self.registry = zk.BookieRegistry(store)
        ca = config.tls_ca or os.environ.get("LEDGERSTORE_TLS_CA")
        security = Security(auth_token=resolve_auth_token(config), tls=client_tls_context(ca) if ca else None)
        self.pool = BookiePool(security=security)
        self.read_pool = ReadPool(security=security)  # batched reads' connections (apart from the writers')
        #: replies UNAUTHORIZED to a key the metadata vouches for, per bookie: a bookie whose key for a ledger
        #: is not the owner's (squatted, or its data replaced); readers go on with the other replicas
        self.odd_bookies: collections.Counter[str] = collections.Counter()
        #: bookie -> when (time.monotonic) a read from it last timed out; reads ask it last for
        #: ``read_failure_history_s`` (``slow_read_bookies``), and an answer from it forgets it
        self.read_timed_out: dict[str, float] = {}
        #: how many speculative reads this client sent (``speculative_read_timeout_s``)
        self.speculative_reads = 0
        self._rng = random.Random()
        self._handles: set[LedgerHandle] = set()
        self._closed = False

    @classmethod
    async def connect(cls, zk_connect: str, *, config: ClientConfig | None = None, **kw: Any) -> BookKeeper:
        import zk

        config = config or ClientConfig(**kw)
        if config.freeze_heap:
            # before this client's objects exist: frozen, its reference cycles (its ZooKeeper session's) were
            # never collected once it was closed
            freeze_heap_once()
        try:
            store = await asyncio.to_thread(
                zk.MetadataStore.connect,
                zk_connect,
                root=config.zk_root,
                session_timeout_s=config.zk_session_timeout_s,
                auth=config.zk_auth,
            )
        except zk.ZkConnectStringError:
            raise  # a bad argument (a ValueError), not a store that failed
        except zk.MetadataError as e:
            raise E.MetadataStoreError(f"cannot connect to ZooKeeper at {zk_connect}: {e}") from e
        return await asyncio.to_thread(cls, store, config)

    # -- bookies ---------------------------------------------------------------------------------------
    async def writable_bookies(self) -> list[str]:
        return sorted(await _meta(self.registry.available))

    async def readonly_bookies(self) -> list[str]:
        return sorted(await _meta(self.registry.readonly))

    async def _ask(
        self, bookie: str, build: Callable[[int], p.Request], timeout_s: float | None = None
    ) -> p.Response:
        """One request to ``bookie`` over its pooled connection (``read_timeout_s`` unless told); raises the
        client's ``LedgerError`` when the bookie cannot be reached or does not answer in time."""
        conn = await self.pool.get(bookie)
        return await conn.request(build, self.config.read_timeout_s if timeout_s is None else timeout_s)

    async def _ask_or_none(self, bookie: str, build: Callable[[int], p.Request]) -> p.Response | None:
        """``_ask``, with None for a bookie that cannot be reached or does not answer in time."""
        try:
            return await self._ask(bookie, build)
        except E.LedgerError:
            return None

    async def bookie_accepts_client(self, bookie: str) -> bool:
        """Whether ``bookie`` serves this client: it is asked for its info (BOOKIE_INFO, which every client may
        ask) over this client's pooled connection to it, which authenticates with the client's token when it has
        one. False: it answered UNAUTHORIZED (it requires a token and the client has none).

        Raises:
            UnauthorizedError: the bookie refused the client's token (signed with another secret, expired).
            LedgerError: the bookie cannot be reached or does not answer in time."""
        resp = await self._ask(bookie, lambda rid: p.BookieInfoRequest(request_id=rid))
        return getattr(resp, "status", p.Status.OK) != p.Status.UNAUTHORIZED

    def slow_read_bookies(self) -> frozenset[str]:
        """The bookies a read timed out on in the last ``read_failure_history_s``: reads ask them last."""
        if not self.read_timed_out:
            return frozenset()
        since = time.monotonic() - self.config.read_failure_history_s
        for b in [b for b, t in self.read_timed_out.items() if t < since]:
            del self.read_timed_out[b]
        return frozenset(self.read_timed_out)

    def report_unauthorized(self, bookie: str, ledger_id: int, what: str) -> None:
        """A bookie refused the key of a ledger whose password the metadata accepted: count it, log it; the
        caller reads from another replica instead of giving up."""
        self.odd_bookies[bookie] += 1
        log.warning(
            "ledger=%d bookie=%s answered UNAUTHORIZED to %s with the ledger's key: the bookie holds another key "
            "for it (squatted?); using the other replicas (%d such answers from it)",
            ledger_id,
            bookie,
            what,
            self.odd_bookies[bookie],
        )

    def _placement_inputs(self) -> tuple[set[str], set[str], dict[str, str]]:
        """What placement draws from (blocking; run in a thread): the writable bookies, the bookies being
        decommissioned (``bookies/decommissioning``: never chosen for a new ensemble or as a replacement, as
        BookKeeper keeps a decommissioning bookie out of placement) and the rack map (``bookies/racks``). The two
        listings are one pipelined ZooKeeper round; the racks' bodies one more, only when racks are set."""
        from zk.racks import RACKS, racks_of
        from zk.underreplication import DECOMMISSIONING

        available = set(self.registry.available())
        found = self.store.children_many([DECOMMISSIONING, RACKS])
        return available, set(found[DECOMMISSIONING] or ()), racks_of(self.store, found[RACKS] or ())

    async def draining_bookies(self) -> tuple[set[str], set[str]]:
        """(the writable bookies, those being decommissioned: ``bookies/decommissioning``), one ZooKeeper round.
        Placement leaves the second out, and a long-lived writer (a broker's topic) rolls its open ledger off
        them, which their decommission waits for, when the others can take a new ledger."""
        available, draining, _ = await _meta(self._placement_inputs)
        return available, draining

    async def _replacements(self, ensemble: Sequence[str], failed: Sequence[int]) -> list[str]:
        available, draining, racks = await _meta(self._placement_inputs)
        return replace_failed(ensemble, failed, available, exclude=draining, rng=self._rng, racks=racks)

    # -- ledgers ---------------------------------------------------------------------------------------
    async def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        password: bytes = b"",
        digest: DigestType = DigestType.CRC32C,
        custom_metadata: Mapping[str, bytes] | None = None,
        bookies: Sequence[str] | None = None,
        ledger_id: int | None = None,
    ) -> LedgerHandle:
        """Create a ledger and return its writer handle.

        Args:
            ensemble_size, write_quorum, ack_quorum: E bookies hold the ledger, each entry goes to Qw of them
                (round-robin) and is acknowledged once Qa of those have it (E >= Qw >= Qa >= 1).
            password: the ledger's password (readers and recoverers need it; stored as a salted digest).
            digest: the checksum each entry carries.
            custom_metadata: small opaque values kept with the ledger's metadata.
            bookies: the ensemble to use (``ensemble_size`` distinct bookies, e.g. one bookie for a sanity
                check); by default the placement policy picks it among the writable bookies not being
                decommissioned, spread over their racks (``zk.racks``).
            ledger_id: the ledger's id, one :meth:`new_ledger_id` handed out (BookKeeper's
                ``createLedgerAdv(ledgerId, ...)``): a caller records the id where it will look for the ledger
                before the ledger exists, so that a crash in between leaves no ledger nobody names; by default
                a fresh id.

        Returns:
            A writer ``LedgerHandle`` (``append*``, ``close``; it reads too).

        Raises:
            IncorrectParameterError: the quorums are not E >= Qw >= Qa >= 1.
            ValueError: ``bookies`` is not ``ensemble_size`` distinct bookies.
            NotEnoughBookiesError: fewer than ``ensemble_size`` writable bookies (outside decommissioning).
            MetadataStoreError: ZooKeeper could not be reached, or ``ledger_id`` names a ledger that exists.
        """
        validate_quorum(ensemble_size, write_quorum, ack_quorum)
        if bookies is not None:
            bookies = list(bookies)
            if len(bookies) != ensemble_size or len(set(bookies)) != ensemble_size:
                raise ValueError(f"an ensemble of {ensemble_size} distinct bookies is needed, got {bookies}")
        else:
            available, draining, racks = await _meta(self._placement_inputs)
            try:
                bookies = choose_ensemble(
                    ensemble_size, available, exclude=draining, rng=self._rng, racks=racks
                )
            except E.NotEnoughBookiesError:
                # bookies/available leaves the read-only ones out: name them ("read-only: []" said none were)
                readonly = set(await _meta(self.registry.readonly)) - available
                choose_ensemble(ensemble_size, available, readonly=readonly, exclude=draining)  # raises
                raise
        versioned = await _meta(
            functools.partial(
                self.ledgers.create,
                ensemble_size=ensemble_size,
                write_quorum=write_quorum,
                ack_quorum=ack_quorum,
                bookies=bookies,
                password=password,
                digest_type=digest.value,
                custom_metadata=dict(custom_metadata or {}),
                ledger_id=ledger_id,
            )
        )
        lh = LedgerHandle(self, versioned, password, writer=True)
        log.info(
            "ledger=%d created E=%d Qw=%d Qa=%d ensemble=%s",
            lh.ledger_id,
            ensemble_size,
            write_quorum,
            ack_quorum,
            bookies,
        )
        return lh

    async def new_ledger_id(self) -> int:
        """A fresh ledger id from the cluster's id generator, for :meth:`create_ledger` ``(ledger_id=...)``: no
        other creation is handed it (an id handed out and never used is skipped, as ids lost to a crash are)."""
        return await _meta(self.ledgers.idgen.next_id)

    async def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> LedgerHandle:
        """Open a ledger for reading.

        Args:
            ledger_id: the ledger.
            password: its password (as given to ``create_ledger``).
            recovery: for a ledger that is not CLOSED: fence it (its writer can no longer add), find its last
                entry, write the tail back to a write quorum and close it (BookKeeper's ``openLedger``). False
                leaves the writer alone and only learns the last add confirmed (``openLedgerNoRecovery``): the
                handle then reads up to it and can follow the ledger (``tail``, ``read_last_add_confirmed``).

        Returns:
            A reading ``LedgerHandle`` whose ``last_add_confirmed`` is the ledger's last entry once CLOSED.

        Raises:
            NoSuchLedgerError: no such ledger.
            UnauthorizedError: wrong password.
            LedgerRecoveryError: recovery failed ``recovery_attempts_max`` times (the ledger stays
                IN_RECOVERY; a later open retries).
            MetadataStoreError: ZooKeeper could not be reached.
        """
        versioned = await read_metadata(self.ledgers, ledger_id)
        md = versioned.value
        if not md.check_password(password):
            raise E.UnauthorizedError(f"wrong password for ledger {ledger_id}", ledger_id=ledger_id)
        lh = LedgerHandle(self, versioned, password, writer=False)
        if md.state is LedgerState.CLOSED:
            lh._lac = md.last_entry_id
            return lh
        if recovery:
            await lh._recover()
        else:
            with contextlib.suppress(E.LedgerError):
                await lh.read_last_add_confirmed()
        return lh

    async def delete_ledger(self, ledger_id: int, password: bytes | None = None) -> None:
        """Delete a ledger's metadata (its bookies then collect its entries). With ``password``, only if it is
        the ledger's (``UnauthorizedError`` otherwise), and only the metadata version that was checked."""
        if password is None:
            await _meta(functools.partial(self.ledgers.delete, ledger_id), ledger_id)
            return
        versioned = await read_metadata(self.ledgers, ledger_id)
        if not await asyncio.to_thread(versioned.value.check_password, password):
            raise E.UnauthorizedError(f"wrong password for ledger {ledger_id}", ledger_id=ledger_id)
        await _meta(functools.partial(self.ledgers.delete, ledger_id, versioned.version), ledger_id)

    async def list_ledgers(self) -> list[int]:
        return await _meta(self.ledgers.list)

    async def ledger_metadata(self, ledger_id: int) -> Any:
        return (await read_metadata(self.ledgers, ledger_id)).value

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for h in list(self._handles):
            h._stop_sweeper()
        await self.pool.close()
        self.read_pool.close()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.store.close)

    async def __aenter__(self) -> BookKeeper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# ----------------------------------------------------------------------------------------------------------


class LedgerHandle(WriterSendPath):
    """A ledger opened for writing (``create_ledger``) or reading (``open_ledger``)."""

    def __init__(self, bk: BookKeeper, versioned: Any, password: bytes, *, writer: bool) -> None:
        md = versioned.value
        self.bk = bk
        self.ledger_id: int = md.ledger_id
        self._versioned = versioned
        self._key = p.master_key(password)
        self._codec = EntryCodec(md.ledger_id, DigestType(md.digest_type), self._key)
        self._loop = asyncio.get_running_loop()
        self._lac = -1
        #: (entry id, cumulative ledger length through it) of the newest entry a LAC read saw (a reader's)
        self._tail: tuple[int, int] | None = None
        self._pipe: WritePipeline | None = None
        self._state = HandleStateMachine(
            HandleState.OPEN if writer else HandleState.CLOSED, ledger_id=self.ledger_id
        )
        if writer:
            self._init_writer(md)
            bk._handles.add(self)
        else:
            self._sweeper = None
            self._lac_task = None

    # -- properties ---------------------------------------------------------------------------------------
    @property
    def metadata(self) -> Any:
        return self._versioned.value

    @property
    def last_add_confirmed(self) -> int:
        return self._pipe.lac if self._pipe is not None else self._lac

    @property
    def length(self) -> int:
        if self._pipe is not None:
            return self._pipe.length
        return int(self.metadata.length)

    @property
    def tail_length(self) -> tuple[int, int] | None:
        """``(entry id, cumulative ledger length through that entry)`` from the header of the newest entry a
        :meth:`read_last_add_confirmed` got back (None before one got an entry): what a reader of an OPEN ledger,
        whose metadata has no length yet (``length`` 0), can tell of its size (the average entry size is
        ``length / (entry id + 1)``). Read from the header unverified: an estimate, not for the data path."""
        return self._tail

    @property
    def is_closed(self) -> bool:
        return self.metadata.state is LedgerState.CLOSED

    # -- writing ------------------------------------------------------------------------------------------
    async def append(self, data: bytes) -> int:
        """Append one entry and wait until it is acknowledged.

        Cheap enough to call once per entry from many tasks (``asyncio.create_task(lh.append(d))``): one
        coroutine and one future per entry, and the entries appended in one event-loop iteration leave in one
        write per bookie. ``append_many`` appends a list with one future for all of it.

        Args:
            data: the entry's payload (at most ``ENTRY_SIZE_MAX`` less the entry header).

        Returns:
            The entry's id, once Qa bookies of its write set acknowledged it and every earlier entry was
            acknowledged too.

        Raises:
            LedgerClosedError: the handle was opened for reading, or the ledger is closed.
            LedgerFencedError: another client is recovering the ledger (its bookies answered FENCED).
            NotEnoughBookiesError: a failed bookie could not be replaced.
            IncorrectParameterError: ``data`` is too large.
            LedgerError: any other failure of the writer (the handle accepts no more appends).
        """
        pipe = self._pipe
        if pipe is None or self._state.state is not _OPEN or not pipe.has_capacity or self._congested:
            await self._until_appendable()
        fut: asyncio.Future[int] = self._loop.create_future()
        self._add(data, fut)
        return await fut

    async def append_many(self, items: Sequence[bytes]) -> list[int]:
        """Append several entries, in order, and wait until all of them are acknowledged.

        One future for the whole list (acknowledgements come in entry-id order, so the last entry's settles
        them all); the entries go out with the frames of the same loop iteration. More items than
        ``outstanding_adds_max`` are sent as capacity frees up.

        Args:
            items: the payloads, each as for ``append``.

        Returns:
            Their entry ids (consecutive, in the order given), once every one is acknowledged.

        Raises:
            The errors of ``append``. On an error some leading entries may be acknowledged and durable (the
            handle's ``last_add_confirmed`` says how many); the rest are not.
        """
        n = len(items)
        if not n:
            return []
        last: asyncio.Future[int] = self._loop.create_future()
        first = -1
        pipe = self._pipe
        for i, data in enumerate(items):
            if pipe is None or self._state.state is not _OPEN or not pipe.has_capacity or self._congested:
                await self._until_appendable()
            eid = self._add(data, last if i == n - 1 else _ignore_add)
            if i == 0:
                first = eid
        await last
        return list(range(first, first + n))

    async def append_future(self, data: bytes) -> asyncio.Future[int]:
        """Like ``append`` but returns as soon as the entry is sent. Waits (back-pressure) while
        ``outstanding_adds_max`` adds are pending.

        Args:
            data: the entry's payload, as for ``append``.

        Returns:
            A future that resolves with the entry's id once it is acknowledged, or with the error of ``append``.

        Raises:
            The errors of ``append`` known before the entry is sent (a closed, fenced or failed handle, an
            entry too large); later ones reach the future.
        """
        pipe = self._pipe
        if pipe is None or self._state.state is not _OPEN or not pipe.has_capacity or self._congested:
            await self._until_appendable()
        fut: asyncio.Future[int] = self._loop.create_future()
        self._add(data, fut)
        return fut

    async def append_callback(self, data: bytes, callback: AddCallback) -> int:
        """Append one entry and return its id as soon as it is sent; ``callback(entry_id, None)`` runs once
        it is acknowledged (under the same rules as ``append``), ``callback(entry_id, error)`` if it fails.
        Callbacks run on the event loop, in entry-id order, and must not block (BookKeeper's
        ``asyncAddEntry``; cheaper than a future per entry). Waits (back-pressure) while
        ``outstanding_adds_max`` adds are pending.

        Args:
            data: the entry's payload, as for ``append``.
            callback: ``(entry_id, error)``, ``error`` None once acknowledged; an exception it raises is
                logged, not propagated.

        Returns:
            The entry's id (not yet acknowledged).

        Raises:
            The errors of ``append`` known before the entry is sent; later ones reach the callback.
        """
        pipe = self._pipe
        if pipe is None or self._state.state is not _OPEN or not pipe.has_capacity or self._congested:
            await self._until_appendable()
        return self._add(data, callback)

    async def close(self) -> None:
        """Writer: wait for pending adds, then CAS OPEN→CLOSED(LAC, length). Reader: release resources."""
        if self._pipe is None:
            self.bk._handles.discard(self)
            return
        pipe = self._pipe
        if self._state.state is HandleState.CLOSED:
            return
        self._state.handle(HandleEvent.CLOSE_START)
        while self._inflight and pipe.error is None:
            await self._drained()
        if self._ec_task is not None:
            with contextlib.suppress(Exception):
                await self._ec_task
        self._stop_sweeper()
        self.bk._handles.discard(self)
        self.bk.pool.remove_listener(self.ledger_id, self)
        if pipe.error is not None:
            raise pipe.error
        transition = functools.partial(
            writer_close_transition, last_add_confirmed=pipe.lac, length=pipe.length
        )
        self._versioned, ev = await update_metadata(
            self.bk.ledgers, self.ledger_id, transition, self._versioned
        )
        self._state.handle(HandleEvent.CLOSE_DONE if ev is None else ev)
        if self._state.state is HandleState.ERROR:
            assert self._state.error is not None
            raise self._state.error

    # -- reading ------------------------------------------------------------------------------------------
    async def read(self, first: int, last: int) -> AsyncIterator[LedgerEntry]:
        """Entries first..last (inclusive), in order, each verified against its digest.

        Args:
            first, last: entry ids, ``0 <= first``; ``last`` at most ``last_add_confirmed`` (an empty range
                when ``last < first``).

        Yields:
            ``LedgerEntry`` objects (``read_batches`` yields the same without an object per entry).

        Raises:
            ReadBeyondLacError: ``last`` is beyond the last add confirmed.
            IncorrectParameterError: ``first`` is negative.
            NoSuchEntryError: an entry is missing on every replica.
            BookieUnavailableError: an entry could not be read from any replica (unreachable, timed out or
                failing its digest check).
        """
        async for batch in self.read_batches(first, last):
            for e in batch.entries():
                yield e

    async def read_batches(self, first: int, last: int, rows: bool = False) -> AsyncIterator[EntryBatch]:
        """Entries first..last (inclusive), in order, as batches of consecutive entries (the runs that are
        ready, each payload verified against its digest): ``read`` without an object per entry, for bulk
        consumers.

        Args:
            first, last: as for ``read``.
            rows: hand out runs of entries of one size as 2-D arrays (``EntryBatch``) viewing the bookies'
                replies: no object or copy per entry, for a consumer that builds columns (needs numpy).

        Yields:
            ``EntryBatch`` objects covering first..last without gaps.

        Raises:
            The errors of ``read``.
        """
        if last > self.last_add_confirmed:
            raise E.ReadBeyondLacError(
                f"entry {last} is beyond the last add confirmed ({self.last_add_confirmed})",
                ledger_id=self.ledger_id,
            )
        async for batch in self._read_chunks(first, last, rows=rows):
            yield batch

    async def read_unconfirmed(self, first: int, last: int) -> AsyncIterator[LedgerEntry]:
        """Entries first..last even beyond the last add confirmed (a reader of an open ledger peeking ahead):
        stops, without an error, at the first entry every replica says it does not have.

        Args:
            first, last: entry ids, ``0 <= first``.

        Yields:
            ``LedgerEntry`` objects, in order, from ``first`` on.

        Raises:
            IncorrectParameterError: ``first`` is negative.
            BookieUnavailableError: an entry could not be read (no replica answered it has none).
        """
        async for batch in self._read_chunks(first, last, stop_on_missing=True):
            for e in batch.entries():
                yield e

    async def read_entry(self, entry_id: int) -> LedgerEntry:
        """One entry, as ``read(entry_id, entry_id)``.

        Raises:
            The errors of ``read``.
        """
        async for e in self.read(entry_id, entry_id):
            return e
        raise E.NoSuchEntryError(f"entry {entry_id}", ledger_id=self.ledger_id)

    async def read_replica(self, bookie: str, first: int, last: int) -> AsyncIterator[tuple[int, str, bytes]]:
        """One bookie's copy of entries first..last, for checking a replica by hand: yields
        ``(entry_id, status, payload)`` for each entry whose write set names ``bookie``, where status is ``OK``,
        a bookie status (``NO_ENTRY``, ...), ``DIGEST_MISMATCH`` or ``UNREACHABLE``; no failover, no fencing."""
        md = self.metadata
        for eid in range(first, last + 1):
            ens = md.ensemble_at(eid)
            if bookie not in [ens.bookies[i] for i in write_set(eid, md.ensemble_size, md.write_quorum)]:
                continue
            try:
                resp = await self.bk._ask(bookie, functools.partial(self._read_request, eid))
            except E.LedgerError:
                yield eid, "UNREACHABLE", b""
                continue
            assert isinstance(resp, p.ReadEntryResponse)
            if resp.status != p.Status.OK:
                yield eid, resp.status.name, b""
                continue
            try:
                _, payload = self._codec.verify(resp.entry, eid)
            except _RawDigestMismatch:
                yield eid, "DIGEST_MISMATCH", b""
                continue
            yield eid, "OK", payload

    def _read_request(self, entry_id: int, rid: int) -> p.ReadEntryRequest:
        return p.ReadEntryRequest(
            request_id=rid, ledger_id=self.ledger_id, entry_id=entry_id, master_key=self._key
        )

    async def _read_range(
        self, first: int, last: int, stop_on_missing: bool = False
    ) -> AsyncIterator[LedgerEntry]:
        async for batch in self._read_chunks(first, last, stop_on_missing):
            for e in batch.entries():
                yield e

    async def _read_chunks(
        self, first: int, last: int, stop_on_missing: bool = False, rows: bool = False
    ) -> AsyncIterator[EntryBatch]:
        """Entries first..last in order, yielded as runs of consecutive entries that are ready (one resumption
        of this generator per run, not per entry)."""
        if first < 0 or last < first:
            if last < first:
                return
            raise E.IncorrectParameterError(f"bad range {first}..{last}")
        nxt = first
        refreshed_at = -1
        while True:
            try:
                async for chunk in self._read_batched(
                    nxt, last, stop_on_missing, final=nxt == refreshed_at, rows=rows
                ):
                    n = len(chunk)  # (before the consumer holds the list)
                    yield EntryBatch(self.ledger_id, nxt, chunk)
                    nxt += n
                return
            except RefreshAndRetry as r:
                # The ledger is still open: a writer may have replaced bookies since this handle read its
                # metadata (an ensemble change moves entries from LAC+1 on to new bookies). Follow the
                # metadata, like a BookKeeper read handle does, and try that entry once more.
                await self._refresh_metadata()
                nxt = refreshed_at = r.entry_id

    async def _read_batched(
        self, first: int, last: int, stop_on_missing: bool, *, final: bool, rows: bool = False
    ) -> AsyncIterator[Any]:
        """The payloads of entries first..last from READ_RANGE batches (``ReadPlanner``), verified and in
        order, in runs of those ready. An entry no replica returned ends the read: silently
        (``stop_on_missing`` and every replica said it has none), with ``RefreshAndRetry`` (an open ledger,
        unless ``final``) or with the error."""
        reader = BatchReader(self, first, last, rows)
        try:
            reader.start()
            take = reader.ready.take
            eid = first
            while eid <= last:
                chunk = take(eid, last)
                if len(chunk):
                    eid += len(chunk)
                    reader.more(eid)
                    yield chunk
                    continue
                if reader.fatal is not None:
                    raise reader.fatal
                bad = reader.unreadable.get(eid)
                if bad is not None:
                    if stop_on_missing and bad.missing:
                        return
                    if not final and self.metadata.state is not LedgerState.CLOSED:
                        raise RefreshAndRetry(eid)
                    raise reader.error(bad)
                reader.more(eid)
                reader.wake.clear()
                await reader.wake.wait()
        finally:  # an error, the end of an unconfirmed read, or a consumer that stopped early
            reader.close()

    async def _refresh_metadata(self) -> None:
        fresh = await read_metadata(self.bk.ledgers, self.ledger_id)
        if fresh.version > self._versioned.version:
            self._versioned = fresh
            if self._pipe is None and fresh.value.state is LedgerState.CLOSED:
                self._lac = max(self._lac, fresh.value.last_entry_id)

    async def read_last_add_confirmed(self) -> int:
        """Ask the last ensemble for its LAC (max over a coverage set of answers); never goes backwards.

        Returns:
            The handle's ``last_add_confirmed``, raised to what the bookies reported (a CLOSED ledger's last
            entry id once the metadata says CLOSED).

        Raises:
            BookieUnavailableError: too few bookies answered to cover every entry's write set.
        """
        md = self.metadata
        if md.state is LedgerState.CLOSED:
            self._lac = max(self._lac, md.last_entry_id)
            return self.last_add_confirmed
        bookies = md.last_ensemble.bookies
        cov = CoverageSet(md.ensemble_size, md.write_quorum, md.ack_quorum)
        best = -1

        async def ask(i: int, bookie: str) -> tuple[int, p.Status | None, int]:
            try:
                resp = await self.bk._ask(bookie, functools.partial(self._read_request, p.LAST_ENTRY))
            except E.LedgerError:
                return i, None, -1
            assert isinstance(resp, p.ReadEntryResponse)
            lac = resp.lac
            if resp.status == p.Status.OK:
                with contextlib.suppress(Exception):
                    header = peek_header(resp.entry)
                    lac = max(lac, header.lac)
                    if header.ledger_id == self.ledger_id and (
                        self._tail is None or header.entry_id > self._tail[0]
                    ):
                        self._tail = (header.entry_id, header.length)
            return i, resp.status, lac

        tasks = [self._loop.create_task(ask(i, b)) for i, b in enumerate(bookies)]
        try:
            for fut in asyncio.as_completed(tasks):
                i, status, lac = await fut
                if status == p.Status.UNAUTHORIZED:
                    self.bk.report_unauthorized(bookies[i], self.ledger_id, "a LAC read")
                    status = None  # (no answer from that bookie)
                cov.add_response(i, answer_for_status(status))
                if status is not None:
                    best = max(best, lac)
                if cov.covered():
                    break
        finally:
            for t in tasks:
                t.cancel()
        if not cov.covered():
            raise E.BookieUnavailableError(
                "not enough bookies answered to learn the LAC", ledger_id=self.ledger_id
            )
        if self._pipe is None:
            self._lac = max(self._lac, best)
        return self.last_add_confirmed

    async def wait_for_lac(self, previous_lac: int, timeout_s: float) -> int:
        """Long-poll: wait until some bookie of the last ensemble reports a LAC above ``previous_lac``.

        The bookies are asked one at a time in random order, those a read timed out on lately last (the
        failure history). One that has not answered ``speculative_read_timeout_s`` after its long poll should
        have ended is hung or stalled: the next one is asked for its LAC at once (no long poll) beside it, the
        first answer wins, and the silent one is asked last by later reads. Each one's speculative timer runs
        from when it was asked: one that fails makes the next be asked once the newest still silent is overdue,
        at once if it is already."""
        md = self.metadata
        bookies = list(md.last_ensemble.bookies)
        random.shuffle(bookies)
        slow = self.bk.slow_read_bookies()
        if slow:
            bookies.sort(key=lambda b: b in slow)
        cfg = self.bk.config
        spec = cfg.speculative_read_timeout_s
        speculate = 0 < spec < cfg.read_timeout_s
        #: -> (bookie, when it is overdue: its long poll's end, or when asked, + ``spec``), in the order asked
        waiting: dict[asyncio.Task[p.Response], tuple[str, float]] = {}
        left = iter(bookies)

        def ask(long_poll: bool) -> bool:
            bookie = next(left, None)
            if bookie is None:
                return False
            req = functools.partial(
                p.ReadEntryRequest,
                ledger_id=self.ledger_id,
                entry_id=p.LAST_ENTRY,
                master_key=self._key,
                flags=p.Flag.LONG_POLL if long_poll else 0,
                previous_lac=previous_lac if long_poll else -1,
                timeout_ms=int(timeout_s * 1000) if long_poll else 0,
            )
            wait = timeout_s + cfg.read_timeout_s if long_poll else cfg.read_timeout_s
            task = self._loop.create_task(self.bk._ask(bookie, lambda rid: req(request_id=rid), wait))
            waiting[task] = (bookie, self._loop.time() + (timeout_s if long_poll else 0) + spec)
            return True

        ask(True)
        try:
            while waiting:
                # (from the newest still asked: when a speculative read failed at once, the one before it, hung
                # and overdue already, makes the next be asked now, not a whole poll later)
                overdue = list(waiting.values())[-1][1]
                done, _ = await asyncio.wait(
                    waiting,
                    timeout=max(0.0, overdue - self._loop.time()) if speculate else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:  # a speculative read: the silent one stays asked
                    if not ask(False):
                        speculate = False
                    continue
                asked = list(waiting)
                for task in done:
                    bookie, _ = waiting.pop(task)
                    try:
                        resp = task.result()
                    except E.LedgerError:
                        continue
                    assert isinstance(resp, p.ReadEntryResponse)
                    if resp.status not in (p.Status.OK, p.Status.NO_ENTRY):
                        continue
                    for t in asked[: asked.index(task)]:  # asked before it and still silent: slow
                        if t in waiting:
                            self.bk.read_timed_out[waiting[t][0]] = time.monotonic()
                    self.bk.read_timed_out.pop(bookie, None)
                    if self._pipe is None:
                        self._lac = max(self._lac, resp.lac)
                    return self.last_add_confirmed
                if not waiting:
                    ask(True)
        finally:
            for task in waiting:
                task.cancel()
        return self.last_add_confirmed

    async def tail(self, start: int = 0, poll_timeout_s: float = 2.0) -> AsyncIterator[LedgerEntry]:
        """Follow the ledger: yield entries from ``start`` as the LAC advances; ends once the ledger is closed
        and every entry was yielded."""
        nxt = start
        while True:
            lac = self.last_add_confirmed
            if nxt <= lac:
                async for e in self._read_range(nxt, lac):
                    yield e
                nxt = lac + 1
                continue
            if self.metadata.state is LedgerState.CLOSED and nxt > self.metadata.last_entry_id:
                return
            await self.wait_for_lac(lac, poll_timeout_s)
            if self.last_add_confirmed == lac:
                self._versioned = await read_metadata(self.bk.ledgers, self.ledger_id)
                if self.metadata.state is LedgerState.CLOSED:
                    self._lac = max(self._lac, self.metadata.last_entry_id)

    # -- recovery -----------------------------------------------------------------------------------------
    async def _recover(self) -> None:
        """Fence the ledger, find its end, write its tail back and close it (``recovery_driver``)."""
        await recover(self)
