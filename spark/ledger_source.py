"""The ``ledger`` PySpark data source: ledger entries read straight from the bookies, in parallel.

    from spark import register
    register(spark)
    df = (spark.read.format("ledger").option("zk", "127.0.0.1:2181").option("ledgers", "all")
          .option("password", "secret").load())

Columns: ``ledger_id`` long, ``entry_id`` long, ``data`` binary, ``length`` int (payload bytes), ``ctime``
timestamp (the ledger's creation time), ``state`` string (the ledger's state when the query was planned),
``custom_metadata`` map<string, binary>. Options: :mod:`spark.options`.

Planning (driver): list the selected ledgers, read each one's metadata and, for a ledger not CLOSED, its last add
confirmed from the bookies with a non-fencing open (``recovery=False``), so a live writer keeps writing. A
CLOSED ledger is read to ``last_entry_id``, any other to that LAC. Each ledger is cut into entry ranges of
``entriesPerPartition``; one Spark partition per range.

Reading (executors): each partition connects its own client (the blocking facade), opens the ledger without
fencing, reads its range (the client reads each entry from the bookies of its write set, trying the next
replica when one fails, and follows ensemble changes), yields Arrow record batches of at most
``maxRecordsPerBatch`` rows and ``BATCH_BYTES_MAX`` payload bytes, and closes the client.

A ledger that disappears (deleted) under a query: with ``failOnDataLoss`` true the query fails with
:class:`LedgerDataLossError`; with false it is skipped (what was already read of it stays) and a warning is
logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
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

from spark.options import BATCH_BYTES_MAX, LedgerOptionError, LedgerOptions, parse_ledger_options
from spark.planning import entry_ranges, readable_last_entry

__all__ = ["LEDGER_SCHEMA", "LedgerDataLossError", "LedgerDataSource", "LedgerRange", "LedgerReader"]

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

    def __init__(self, ledger_id: int, what: str) -> None:
        super().__init__(
            f"ledger {ledger_id} {what} (failOnDataLoss is true; set option failOnDataLoss=false to skip such "
            "ledgers with a warning)"
        )
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


def _client(opts: LedgerOptions) -> Any:
    from ledger_client import ClientConfig
    from ledger_client.sync import BookKeeper

    return BookKeeper.connect(
        opts.zk, config=ClientConfig(zk_root=opts.zk_root, read_timeout_s=opts.read_timeout_ms / 1000)
    )


def _data_loss(opts: LedgerOptions, ledger_id: int, what: str) -> None:
    """Raise for lost data, or log and return when the query skips it."""
    if opts.fail_on_data_loss:
        raise LedgerDataLossError(ledger_id, what)
    log.warning("ledger=%d %s; skipped (failOnDataLoss=false)", ledger_id, what)


def plan_partitions(opts: LedgerOptions) -> list[LedgerRange]:
    """Driver side: the selected ledgers' metadata and readable ends, cut into entry ranges."""
    from ledger_client import LedgerError, NoSuchLedgerError, UnauthorizedError

    bk = _client(opts)
    try:
        chosen, missing = opts.ledgers.select(bk.list_ledgers())
        for lid in missing:
            _data_loss(opts, lid, "does not exist")
        out: list[LedgerRange] = []
        for lid in chosen:
            try:
                md = bk.ledger_metadata(lid)
                if not md.check_password(opts.password):
                    raise LedgerOptionError("password", f"wrong password for ledger {lid}")
                lac = md.last_entry_id
                if md.state.value != "CLOSED":
                    lh = bk.open_ledger(lid, opts.password, recovery=False)  # never fences a live writer
                    lac = lh.read_last_add_confirmed()
            except NoSuchLedgerError:
                _data_loss(opts, lid, "was deleted while the query was planned")
                continue
            except UnauthorizedError as e:
                raise LedgerOptionError("password", f"refused for ledger {lid}: {e}") from None
            except LedgerError as e:
                raise RuntimeError(f"ledger {lid}: cannot learn how far to read: {e}") from e
            last = readable_last_entry(md.state.value, md.last_entry_id, lac)
            for first, end in entry_ranges(last, opts.entries_per_partition):
                out.append(
                    LedgerRange(lid, first, end, md.state.value, md.ctime_ms, dict(md.custom_metadata))
                )
        return out
    finally:
        bk.close()


def read_range(opts: LedgerOptions, part: LedgerRange, schema: StructType) -> Iterator[Any]:
    """Executor side: the range's entries as Arrow record batches. Stateless: its own client, closed at the
    end (also when Spark stops consuming early)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from ledger_client import NoSuchEntryError, NoSuchLedgerError

    pa_schema = to_arrow_schema(schema, timezone="UTC")
    types = [f.type for f in pa_schema]
    ctime_us = part.ctime_ms * 1000
    meta_items = list(part.custom_metadata.items())
    limit_rows = opts.max_records_per_batch

    def batch(ids: list[int], data: list[bytes]) -> Any:
        n = len(ids)
        lengths = [len(d) for d in data]
        cols = [
            pa.array([part.ledger_id] * n, type=types[0]),
            pa.array(ids, type=types[1]),
            pa.array(data, type=types[2]),
            pa.array(lengths, type=types[3]),
            pa.array([ctime_us] * n, type=types[4]),
            pa.array([part.state] * n, type=types[5]),
            pa.array([meta_items] * n, type=types[6]),
        ]
        return pa.RecordBatch.from_arrays(cols, schema=pa_schema)

    bk = _client(opts)
    try:
        try:
            lh = bk.open_ledger(part.ledger_id, opts.password, recovery=False)
        except NoSuchLedgerError:
            _data_loss(opts, part.ledger_id, "was deleted during the query")
            return
        if lh.last_add_confirmed < part.last_entry_id:
            # Planned from a LAC some bookies reported; the LAC never goes backwards, so ask again.
            lh.read_last_add_confirmed()
        ids: list[int] = []
        data: list[bytes] = []
        size = 0
        expected = part.first_entry_id
        try:
            for entry in lh.read(part.first_entry_id, part.last_entry_id):
                assert entry.entry_id == expected, (entry.entry_id, expected)  # in order, no gaps
                expected += 1
                ids.append(entry.entry_id)
                data.append(entry.data)
                size += len(entry.data)
                if len(ids) >= limit_rows or size >= BATCH_BYTES_MAX:
                    yield batch(ids, data)
                    ids, data, size = [], [], 0
        except (NoSuchEntryError, NoSuchLedgerError):
            if _exists(bk, part.ledger_id):
                raise
            _data_loss(
                opts, part.ledger_id, f"was deleted during the query (read up to entry {expected - 1})"
            )
            return
        if ids:
            yield batch(ids, data)
    finally:
        bk.close()


def _exists(bk: Any, ledger_id: int) -> bool:
    from ledger_client import NoSuchLedgerError

    try:
        bk.ledger_metadata(ledger_id)
    except NoSuchLedgerError:
        return False
    return True


class LedgerReader(DataSourceReader):  # type: ignore[misc]
    """Holds only the parsed options and the schema: it is pickled to the executors."""

    def __init__(self, opts: LedgerOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> list[LedgerRange]:
        return plan_partitions(self.opts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
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
        if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in LEDGER_SCHEMA]:
            raise LedgerOptionError(
                "schema", f"the ledger source has a fixed schema: {LEDGER_SCHEMA.simpleString()}"
            )
        return LedgerReader(opts, schema)
