"""The ``ledger`` PySpark data source: ledger entries read straight from the bookies, in parallel.

    from spark import register
    register(spark)
    df = (spark.read.format("ledger").option("zk", "127.0.0.1:2181").option("ledgers", "all")
          .option("password", "secret").load())

Columns: ``ledger_id`` long, ``entry_id`` long, ``data`` binary, ``length`` int (payload bytes), ``ctime``
timestamp (the ledger's creation time), ``state`` string (the ledger's state when the query was planned),
``custom_metadata`` map<string, binary>. Options: :mod:`spark.options`. A scan that needs only some columns can
say so with a schema naming a subset of them (``.schema("entry_id long, data binary")``): the other columns are
not built, and Spark skips converting them (the constant metadata columns, the map above all, cost Spark more
per row than the payload).

Planning (driver): list the selected ledgers, read each one's metadata, check the query's password against its
digest (a salted PBKDF2: the ledgers are planned on :data:`PLAN_THREADS` threads, and each range carries the
digest checked, which its task then does not hash again) and, for a ledger not CLOSED, read its last add
confirmed from the bookies with a non-fencing open (``recovery=False``), so a live writer keeps writing. A
CLOSED ledger is read to ``last_entry_id``, any other to that LAC. Each ledger is cut into entry ranges of
``entriesPerPartition``; one Spark partition per range, except that small ranges (small ledgers) are packed
together, in ledger order, into partitions of up to ``PACK_ENTRIES_MAX`` entries and ``PACK_RANGES_MAX`` ranges:
a Spark task costs far more than reading a few entries, so a thousand small ledgers are a few tens of tasks, not
a thousand.

Reading (executors): a Python worker's first task connects a client (the async client on a private event loop
in the reading thread, uvloop where installed) that the worker's next tasks of the same cluster and credentials
reuse (PySpark reuses its Python workers): a scan of many partitions opens one ZooKeeper session and one
connection per bookie per worker, not per partition, and a task starts reading at once (a task that fails closes
it, and the next one connects anew; in a worker Spark does not reuse, and outside a Spark task, as in the driver,
each range has a client of its own, closed at its end). Each range opens its ledger without fencing, reads its range with ``read_batches``
(batched range reads from the bookies of its write sets, trying the next replica when one fails, following
ensemble changes; ``rows=True``: the payloads of a reply of same-size entries as one 2-D array viewing the
reply, no object per entry), yields Arrow record batches of at most ``maxRecordsPerBatch`` rows and
``BATCH_BYTES_MAX`` payload bytes (the metadata columns built once per partition, the data column gathered
from those rows by one vectorized copy with arithmetic offsets, or from payloads of mixed sizes joined, ids
from the batch's first id).

A secured cluster's credentials come from options ``authTokenFile`` and ``zkAuthFile`` (:mod:`spark.options`);
planning asks a registered bookie for its info with the query's token, so a credential missing or refused fails
there naming the option, not in the executors' tasks.

A ledger that disappears (deleted) under a query: with ``failOnDataLoss`` true the query fails with
:class:`LedgerDataLossError`; with false it is skipped (what was already read of it stays) and a warning is
logged. So is an id given in option ``ledgers`` that does not exist, at planning: the error names the option and
the id (``ledger source option 'ledgers': ledger 99999 does not exist (failOnDataLoss is true; ...)``).
"""

from __future__ import annotations

import asyncio
import atexit
import bisect
import contextlib
import functools
import itertools
import logging
import os
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark.options import (
    BATCH_BYTES_MAX,
    LedgerOptionError,
    LedgerOptions,
    client_config,
    parse_ledger_options,
)
from spark.planning import bookies_tried, entry_ranges, readable_last_entry

__all__ = [
    "LEDGER_SCHEMA",
    "LedgerDataLossError",
    "LedgerDataSource",
    "LedgerRange",
    "LedgerReader",
    "freeze_worker_heap",
]

log = logging.getLogger("spark.ledger_source")

LEDGER_SCHEMA = StructType(
    [
        StructField("ledger_id", LongType(), False),
        StructField("entry_id", LongType(), False),
        StructField("data", BinaryType(), False),
        StructField("length", IntegerType(), False),
        StructField("ctime", TimestampType(), False),
        StructField("state", StringType(), False),
        StructField("custom_metadata", MapType(StringType(), BinaryType(), False), False),
    ]
)


class LedgerDataLossError(RuntimeError):
    """A ledger the query reads was deleted (or lost entries) while ``failOnDataLoss`` is true."""

    def __init__(self, ledger_id: int, what: str, *, option: str | None = None) -> None:
        if option is None:
            message = (
                f"ledger {ledger_id} {what} (failOnDataLoss is true; set option failOnDataLoss=false to skip such "
                "ledgers with a warning)"
            )
        else:  # a ledger the option named that is not there: the option is what to fix
            message = (
                f"ledger source option '{option}': ledger {ledger_id} {what} (failOnDataLoss is true; set option "
                "failOnDataLoss=false to skip it with a warning)"
            )
        super().__init__(message)
        self.ledger_id = ledger_id


@dataclass(frozen=True)
class LedgerRange(InputPartition):  # type: ignore[misc]
    """One partition: entries ``first_entry_id..last_entry_id`` of one ledger, and the ledger's metadata
    columns as planned. Picklable (plain fields only)."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    state: str
    ctime_ms: int
    custom_metadata: dict[str, bytes] = field(default_factory=dict)
    #: The ledger's password digest that planning checked the query's password against: the task opening the
    #: ledger does not hash the password again (a salted PBKDF2, ~40 ms of CPU a ledger) for that digest.
    #: Not in the range's printed form (Spark's logs and UI): an old-style digest is an unsalted SHA-256.
    password_digest: str = field(default="", repr=False)


@dataclass(frozen=True)
class LedgerRanges(InputPartition):  # type: ignore[misc]
    """One partition of several short ranges (small ledgers), read one after the other."""

    ranges: tuple[LedgerRange, ...]


#: Small ranges are packed into partitions of at most this many entries and ranges (see the module docstring):
#: small enough that a scan of a few medium ledgers keeps its parallelism, large enough that a task's own cost
#: (tens of ms in Spark, a few ms per ledger opened) is spread over many entries.
PACK_ENTRIES_MAX = 10_000
PACK_RANGES_MAX = 64


def pack_ranges(
    ranges: list[LedgerRange],
    entries_per_partition: int,
    pack_entries: int = PACK_ENTRIES_MAX,
    pack_ranges_max: int = PACK_RANGES_MAX,
) -> list[LedgerRange | LedgerRanges]:
    """Spark's partitions for planned ranges: a range of ``min(entries_per_partition, pack_entries)`` entries or
    more is a partition by itself; shorter ones are packed, in the given order, into partitions of at most that
    many entries and ``pack_ranges_max`` ranges (a pack of one stays a ``LedgerRange``). Pure."""
    limit = min(entries_per_partition, pack_entries)
    out: list[LedgerRange | LedgerRanges] = []
    pack: list[LedgerRange] = []
    size = 0

    def close_pack() -> None:
        nonlocal size
        if len(pack) == 1:
            out.append(pack[0])
        elif pack:
            out.append(LedgerRanges(tuple(pack)))
        pack.clear()
        size = 0

    for r in ranges:
        n = r.last_entry_id - r.first_entry_id + 1
        if n >= limit:
            out.append(r)
            continue
        if size + n > limit or len(pack) == pack_ranges_max:
            close_pack()
        pack.append(r)
        size += n
    close_pack()
    return out


def _client(opts: LedgerOptions) -> Any:
    from ledger_client.sync import BookKeeper

    with credentials_checked(opts, LedgerOptionError):
        return BookKeeper.connect(opts.zk, config=client_config(opts))


@contextlib.contextmanager
def credentials_checked(opts: Any, error: type[ValueError]) -> Iterator[None]:
    """Planning: ZooKeeper's refusal of a query without credentials (or with wrong ones) becomes ``error`` (the
    source's option error) naming option ``zkAuthFile``, not a connection failure from deep in the client."""
    from ledger_client import MetadataStoreError
    from zk.errors import MetadataAuthError

    try:
        yield
    except (MetadataAuthError, MetadataStoreError) as e:
        cause = e if isinstance(e, MetadataAuthError) else e.__cause__
        if not isinstance(cause, MetadataAuthError):
            raise
        given = "the credentials of option zkAuthFile" if opts.zk_auth else "no option zkAuthFile"
        raise error(  # type: ignore[call-arg]
            "zkAuthFile",
            f"ZooKeeper at {opts.zk} refused the query ({given}): {cause}; give option zkAuthFile, the path of a "
            "file holding the cluster's user:password",
        ) from None


#: Bookies a planning query asks whether they serve its token, at most (one answer settles it).
ACCESS_PROBES_MAX = 3


def check_bookie_access(bk: Any, opts: Any, error: type[ValueError]) -> None:
    """Planning: ask a registered bookie for its info (BOOKIE_INFO, which every client may ask) over a
    connection that sends the query's token, so that bookies run with ``--auth-required`` refusing it (no token,
    or a token signed with another secret) fail the query here as ``error`` naming option ``authTokenFile``:
    else the planning of an open ledger reported only that too few bookies answered, and a scan of closed ones
    failed in the executors' tasks. A bookie that cannot be reached proves nothing: the next one is asked."""
    from ledger_client import LedgerError, UnauthorizedError

    bookies = [*bk.writable_bookies(), *bk.readonly_bookies()][:ACCESS_PROBES_MAX]
    for bookie in bookies:
        try:
            if bk.bookie_accepts_client(bookie):
                return
            refused = f"bookie {bookie} requires a token and the query sent none"
        except UnauthorizedError as e:
            refused = f"{e}"
        except LedgerError:
            continue
        given = "the token of option authTokenFile" if opts.auth_token else "no option authTokenFile"
        raise error(  # type: ignore[call-arg]
            "authTokenFile",
            f"{refused} ({given}); give option authTokenFile, the path of a file holding a token the bookies "
            "accept (ledgerstore auth create-token)",
        )


def _check_cluster_root(bk: Any, opts: LedgerOptions) -> None:
    """A ``zkRoot`` no bookie ever started under (no ``INSTANCEID``: a typo) fails naming the option; it read
    no ledger there and gave an empty result."""
    if not bk.cluster_initialized():
        raise LedgerOptionError(
            "zkRoot",
            f"no ledgerstore cluster under {opts.zk_root} at {opts.zk} (no bookie ever started there: a typo? "
            "give the root the bookies run with, their --zk-root)",
        )


def _data_loss(opts: LedgerOptions, ledger_id: int, what: str, *, option: str | None = None) -> None:
    """Raise for lost data (naming ``option`` when one named the ledger), or log and return when the query skips
    it."""
    if opts.fail_on_data_loss:
        raise LedgerDataLossError(ledger_id, what, option=option)
    log.warning("ledger=%d %s; skipped (failOnDataLoss=false)", ledger_id, what)


#: Planning reads the selected ledgers' metadata and checks their password on this many threads: each check of a
#: ledger's salted PBKDF2 digest costs about 40 ms of CPU (docs/benchmarks-history.md, "Password digests"; hashlib
#: releases the GIL meanwhile), and each metadata read a ZooKeeper round trip.
PLAN_THREADS = 8


def plan_partitions(opts: LedgerOptions) -> list[LedgerRange]:
    """Driver side: the selected ledgers' metadata and readable ends, cut into entry ranges (the ledgers planned
    on :data:`PLAN_THREADS` threads, the ranges in ledger order)."""
    bk = _client(opts)
    try:
        _check_cluster_root(bk, opts)
        check_bookie_access(bk, opts, LedgerOptionError)
        chosen, missing = opts.ledgers.select(bk.list_ledgers())
        for lid in missing:
            _data_loss(opts, lid, "does not exist", option="ledgers")
        out: list[LedgerRange] = []
        pool = ThreadPoolExecutor(max_workers=PLAN_THREADS, thread_name_prefix="ledger-plan")
        try:
            for ranges in pool.map(functools.partial(_plan_ledger, bk, opts), chosen):
                out.extend(ranges)
        finally:
            pool.shutdown(cancel_futures=True)  # a failure stops the planning of the ledgers not started
        return out
    finally:
        bk.close()


def _unreadable(run: Any, bk: Any, lh: Any, what: str, err: BaseException, first: int) -> RuntimeError:
    """A task's read error of ``what`` (entries ``first`` on), naming the ledger and the bookies tried (those of
    the handle's ensembles holding them; each one not registered now marked so)."""
    try:
        up: set[str] | None = set(run(bk.writable_bookies())) | set(run(bk.readonly_bookies()))
    except Exception:  # noqa: BLE001 - then the bookies are listed without saying which are down
        up = None
    bookies = bookies_tried([(x.first_entry_id, x.bookies) for x in lh.metadata.ensembles], first, up)
    return RuntimeError(f"ledger {lh.ledger_id} could not be read ({what}): {err}; {bookies}")


def _plan_ledger(bk: Any, opts: LedgerOptions, lid: int) -> list[LedgerRange]:
    """One ledger's ranges; [] for one deleted meanwhile that the query skips."""
    from ledger_client import LedgerError, NoSuchLedgerError, UnauthorizedError

    try:
        md = bk.ledger_metadata(lid)
        if not md.check_password(opts.password):
            raise LedgerOptionError(
                "password",
                f"wrong password for ledger {lid} (one query reads ledgers of one password: "
                "select the ones it opens with option 'ledgers')",
            )
        lac = md.last_entry_id
        if md.state.value != "CLOSED":
            lh = bk.open_ledger(lid, opts.password, recovery=False)  # never fences a live writer
            lac = lh.read_last_add_confirmed()
    except NoSuchLedgerError:
        _data_loss(opts, lid, "was deleted while the query was planned")
        return []
    except UnauthorizedError as e:
        raise LedgerOptionError("password", f"refused for ledger {lid}: {e}") from None
    except LedgerError as e:
        try:
            up: set[str] | None = set(bk.writable_bookies()) | set(bk.readonly_bookies())
        except Exception:  # noqa: BLE001 - then the bookies are listed without saying which are down
            up = None
        bookies = bookies_tried([(x.first_entry_id, x.bookies) for x in md.ensembles], 0, up)
        raise RuntimeError(f"ledger {lid}: cannot learn how far to read: {e}; {bookies}") from e
    last = readable_last_entry(md.state.value, md.last_entry_id, lac)
    return [
        LedgerRange(
            lid, first, end, md.state.value, md.ctime_ms, dict(md.custom_metadata), md.password_digest
        )
        for first, end in entry_ranges(last, opts.entries_per_partition)
    ]


def freeze_worker_heap() -> None:
    """Once per Python worker process, after the reader's imports: move the objects alive now (the modules of
    pyspark, pyarrow, numpy and the client: some 50,000 objects) to the collector's permanent generation
    (``ledger_client``'s ``freeze_heap_once``, which collects first and does it once per process). PySpark's
    worker daemon runs a full ``gc.collect()`` after every task (about 10 ms each over those objects alone);
    frozen, they are no longer walked (they are still freed by reference counting when released)."""
    from ledger_client.client import freeze_heap_once

    freeze_heap_once()


def _event_loop() -> asyncio.AbstractEventLoop:
    """A private event loop for one partition's client: uvloop where installed (as the bookies and the bench
    run), unless ``LEDGERSTORE_NO_UVLOOP`` is set."""
    if not os.environ.get("LEDGERSTORE_NO_UVLOOP"):
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _chunk_sizes(chunk: Any) -> Iterator[int]:
    """The payload sizes of a chunk of ``read_batches(..., rows=True)``: a list of payloads, or a 2-D array of one
    row per entry."""
    return map(len, chunk) if isinstance(chunk, list) else itertools.repeat(chunk.shape[1], len(chunk))


def _chunk_bytes(chunk: Any) -> int:
    return sum(map(len, chunk)) if isinstance(chunk, list) else int(chunk.size)


class _Payloads:
    """A range's payloads from the client's ``read_batches(..., rows=True)`` (a chunk per run of entries the
    bookies returned: a 2-D array of rows where the entries of a run have one size, else a list), handed out as
    chunks of at most ``max_rows`` entries and ``max_bytes`` (the entry that reaches it included): chunks are
    sliced, never walked entry by entry."""

    def __init__(self, batches: AsyncIterator[Any], first: int) -> None:
        self.batches = batches
        self.expected = first  # the id of the first entry not handed out
        self.carry: list[Any] = []  # chunks read, not yet handed out

    async def take(self, max_rows: int, max_bytes: int) -> list[Any]:
        out, self.carry = self.carry, []
        rows = sum(map(len, out))
        size = sum(map(_chunk_bytes, out))
        while rows < max_rows and size < max_bytes:
            try:
                b = await anext(self.batches)
            except StopAsyncIteration:
                break
            due = self.expected + rows
            if b.first_entry_id != due:  # in order, no gaps
                raise RuntimeError(f"read entry {b.first_entry_id} where {due} was due")
            out.append(b.payloads)
            rows += len(b.payloads)
            size += _chunk_bytes(b.payloads)
        n = min(rows, max_rows)
        if size >= max_bytes:
            sizes = itertools.chain.from_iterable(map(_chunk_sizes, out))
            n = min(n, bisect.bisect_left(list(itertools.accumulate(sizes)), max_bytes) + 1)
        if n < rows:
            kept: list[Any] = []
            for i, chunk in enumerate(out):
                if n <= len(chunk):
                    if n:
                        kept.append(chunk[:n])
                    self.carry = [c for c in (chunk[n:], *out[i + 1 :]) if len(c)]
                    break
                kept.append(chunk)
                n -= len(chunk)
            out = kept
        self.expected += sum(map(len, out))
        return out


class _Columns:
    """Builds a partition's Arrow record batches in the query's schema (all of :data:`LEDGER_SCHEMA` or a subset
    of its columns): the payloads per batch, ids and lengths from the batch's offsets, and the metadata columns
    (the same value in every row) once per partition, sliced to each batch's length."""

    def __init__(self, part: LedgerRange, schema: StructType, max_rows: int) -> None:
        import numpy as np
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        self.pa = pa
        self.np = np
        self.schema = to_arrow_schema(schema, timezone="UTC")
        self.names = [f.name for f in self.schema]
        zeros = pa.array(np.zeros(max_rows, dtype=np.int32))
        constant = {
            "ledger_id": part.ledger_id,
            "ctime": part.ctime_ms * 1000,
            "state": part.state,
            "custom_metadata": list(part.custom_metadata.items()),
        }
        self.constants = {
            f.name: pa.array([constant[f.name]], type=f.type).take(zeros)
            for f in self.schema
            if f.name in constant
        }

    def batch(self, first: int, chunks: list[Any]) -> Any:
        pa, np = self.pa, self.np
        n = sum(map(len, chunks))
        if not any(isinstance(c, list) for c in chunks) and len({c.shape[1] for c in chunks}) == 1:
            # rows of one size (the usual case): the data column is the rows gathered into one buffer (a
            # vectorized copy out of the bookies' replies), offsets and lengths arithmetic
            width = chunks[0].shape[1]
            rows = np.concatenate(chunks) if len(chunks) > 1 else np.ascontiguousarray(chunks[0])
            lengths = np.full(n, width, dtype=np.int32)
            offsets = np.arange(n + 1, dtype=np.int32) * np.int32(width)  # (width 0: empty entries)
            body = pa.py_buffer(rows)
        else:
            # The binary column from its buffers: the payloads joined (one copy each, no per-element
            # conversion) and offsets from their lengths; cheaper per row than pa.array over the list.
            data = [p for c in chunks for p in (c if isinstance(c, list) else map(bytes, c))]
            lengths = np.fromiter(map(len, data), dtype=np.int32, count=n)
            offsets = np.empty(n + 1, dtype=np.int32)
            offsets[0] = 0
            np.cumsum(lengths, out=offsets[1:])
            body = pa.py_buffer(b"".join(data))
        cols: dict[str, Any] = {
            "data": pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), body])
        }
        if "length" in self.names:
            cols["length"] = pa.array(lengths)
        if "entry_id" in self.names:
            cols["entry_id"] = pa.array(np.arange(first, first + n, dtype=np.int64))
        for name, a in self.constants.items():
            cols[name] = a if len(a) == n else a.slice(0, n)
        return pa.RecordBatch.from_arrays([cols[name] for name in self.names], schema=self.schema)


#: A Spark Python worker's client, kept for its next tasks (see the module docstring and :func:`_range_client`):
#: (the options it was connected with, its event loop, the client).
_worker_client: tuple[tuple[Any, ...], asyncio.AbstractEventLoop, Any] | None = None


def _in_reused_spark_worker() -> bool:
    """Whether this thread runs a Spark task in a Python worker that Spark reuses for its next tasks
    (``spark.python.worker.reuse``, on by default: the JVM then sets ``SPARK_REUSE_WORKER`` for its workers), where
    the worker's client is kept. A worker not reused ends after its task: it closes its client as before."""
    if not os.environ.get("SPARK_REUSE_WORKER"):
        return False
    try:
        from pyspark import TaskContext
    except ImportError:
        return False
    return TaskContext.get() is not None


def _close_client(loop: asyncio.AbstractEventLoop, bk: Any) -> None:
    try:
        if bk is not None:
            with contextlib.suppress(Exception):
                loop.run_until_complete(bk.close())
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


def _drop_worker_client() -> None:
    global _worker_client
    kept, _worker_client = _worker_client, None
    if kept is not None:
        _close_client(kept[1], kept[2])


@functools.cache
def _close_at_exit() -> None:
    """Once per process: a worker that exits normally (PySpark's daemon ends its workers with ``os._exit``)
    closes its client."""
    atexit.register(_drop_worker_client)


@contextlib.contextmanager
def _range_client(opts: LedgerOptions) -> Iterator[tuple[asyncio.AbstractEventLoop, Any]]:
    """(event loop, client) to read a range with. In a Spark task, the Python worker's client: connected by its
    first task and kept for the next ones of the same cluster and credentials (another cluster's task replaces
    it), so that a task does not pay a ZooKeeper session, connections to the bookies and their close; a task that
    fails (or stops early) closes it, and the next one connects anew. Elsewhere a client of its own, closed at the
    end. Its loop runs only while a task collects a batch (between tasks ZooKeeper's pings run in the session's
    own thread; what the bookies sent meanwhile is handled on the next run)."""
    from ledger_client import BookKeeper

    global _worker_client
    shared = _in_reused_spark_worker()
    key = (opts.zk, opts.zk_root, opts.read_timeout_ms, opts.auth_token, opts.zk_auth)
    if shared and _worker_client is not None and _worker_client[0] == key:
        _, loop, bk = _worker_client
    else:
        if shared:
            _drop_worker_client()
        loop = _event_loop()
        try:
            bk = loop.run_until_complete(BookKeeper.connect(opts.zk, config=client_config(opts)))
        except BaseException:
            _close_client(loop, None)
            raise
        if shared:
            _worker_client = (key, loop, bk)
            _close_at_exit()
    done = False
    try:
        yield loop, bk
        done = True
    finally:
        if not shared:
            _close_client(loop, bk)
        elif not done:
            _drop_worker_client()


def read_range(opts: LedgerOptions, part: LedgerRange, schema: StructType) -> Iterator[Any]:
    """Executor side: the range's entries as Arrow record batches, read with :func:`_range_client`'s client on
    its event loop in this thread (no thread hop per batch). The loop runs while a batch is collected; the
    client's read-ahead keeps the next batches in flight. The range's read is closed at the end (also when Spark
    stops consuming early)."""
    from zk.ledger_metadata import remember_verified

    max_rows = max(1, min(opts.max_records_per_batch, part.last_entry_id - part.first_entry_id + 1))
    columns = _Columns(part, schema, max_rows)
    freeze_worker_heap()
    if part.password_digest:
        remember_verified(part.password_digest, opts.password)
    with _range_client(opts) as (loop, bk):
        yield from _read_range(loop, bk, opts, part, columns, max_rows)


def _read_range(
    loop: asyncio.AbstractEventLoop,
    bk: Any,
    opts: LedgerOptions,
    part: LedgerRange,
    columns: _Columns,
    max_rows: int,
) -> Iterator[Any]:
    from ledger_client import LedgerError, NoSuchEntryError, NoSuchLedgerError

    run = loop.run_until_complete
    batches: Any = None
    try:
        try:
            lh = run(bk.open_ledger(part.ledger_id, opts.password, recovery=False))
        except NoSuchLedgerError:
            _data_loss(opts, part.ledger_id, "was deleted during the query")
            return
        expected = part.first_entry_id
        try:
            if lh.last_add_confirmed < part.last_entry_id:
                # Planned from a LAC some bookies reported; the LAC never goes backwards, so ask again.
                run(lh.read_last_add_confirmed())
        except LedgerError as e:
            raise _unreadable(run, bk, lh, "its last add confirmed", e, expected) from e
        batches = lh.read_batches(part.first_entry_id, part.last_entry_id, rows=True)
        payloads = _Payloads(batches, part.first_entry_id)
        while expected <= part.last_entry_id:
            try:
                data = run(payloads.take(max_rows, BATCH_BYTES_MAX))
            except (NoSuchEntryError, NoSuchLedgerError):
                if run(_exists(bk, part.ledger_id)):
                    raise
                _data_loss(
                    opts, part.ledger_id, f"was deleted during the query (read up to entry {expected - 1})"
                )
                return
            except LedgerError as e:
                what = f"entries {expected}..{part.last_entry_id}"
                raise _unreadable(run, bk, lh, what, e, expected) from e
            if not data:
                break
            batch = columns.batch(expected, data)
            yield batch
            expected += batch.num_rows
    finally:
        if batches is not None:  # its reads stop (a consumer that stopped early, an error)
            run(batches.aclose())


async def _exists(bk: Any, ledger_id: int) -> bool:
    from ledger_client import NoSuchLedgerError

    try:
        await bk.ledger_metadata(ledger_id)
    except NoSuchLedgerError:
        return False
    return True


class LedgerReader(DataSourceReader):  # type: ignore[misc]
    """Holds only the parsed options and the schema: it is pickled to the executors."""

    def __init__(self, opts: LedgerOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> list[LedgerRange | LedgerRanges]:
        return pack_ranges(plan_partitions(self.opts), self.opts.entries_per_partition)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if isinstance(partition, LedgerRanges):
            return itertools.chain.from_iterable(
                read_range(self.opts, r, self.schema) for r in partition.ranges
            )
        if not isinstance(partition, LedgerRange):  # Spark hands us InputPartition(None) for an empty plan
            return iter(())
        return read_range(self.opts, partition, self.schema)


class LedgerDataSource(DataSource):  # type: ignore[misc]
    """``spark.read.format("ledger")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "ledger"

    def schema(self) -> StructType:
        parse_ledger_options(self.options)  # bad options fail when the DataFrame is defined
        return LEDGER_SCHEMA

    def reader(self, schema: StructType) -> LedgerReader:
        opts = parse_ledger_options(self.options)
        known = {f.name: f.dataType for f in LEDGER_SCHEMA.fields}
        fields = [(f.name, f.dataType) for f in schema.fields]
        if not fields or len(set(fields)) != len(fields) or any(known.get(n) != t for n, t in fields):
            raise LedgerOptionError(
                "schema",
                f"the ledger source's schema is {LEDGER_SCHEMA.simpleString()}, or a subset of its columns "
                f"with their types; got {schema.simpleString()}",
            )
        return LedgerReader(opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        # Without it PySpark's streaming runner fails with its own UnboundLocalError ('reader'), which says
        # nothing of why: a reader that refuses at the query's first call says it.
        return _NoStreamReader()


class _NoStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    """``spark.readStream.format("ledger")``: the source reads ledgers in batches only."""

    @staticmethod
    def _refuse() -> LedgerOptionError:
        return LedgerOptionError(
            "readStream",
            "the ledger source reads batches only (spark.read.format('ledger')); to stream a topic's messages use "
            "spark.readStream.format('topic')",
        )

    def initialOffset(self) -> dict[str, Any]:
        raise self._refuse()

    def latestOffset(self, start: dict[Any, Any] | None = None, limit: Any = None) -> dict[Any, Any]:
        raise self._refuse()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        raise self._refuse()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        raise self._refuse()
