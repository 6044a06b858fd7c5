"""The ``ledger`` data source against a live ZooKeeper and bookie processes, through a local[2] SparkSession."""

from __future__ import annotations

import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from ledger_client import ClientConfig
from ledger_client.sync import BookKeeper
from tests.metrics_testing import scrape

PW = b"secret"


def payload(ledger: int, i: int, size: int = 100) -> bytes:
    # sizes vary per entry so a length or offset mix-up shows
    return (f"L{ledger}-E{i}-".encode() * (size // 4 + 8))[: size + (i * 7) % 50]


@pytest.fixture
def client(bookies: Any) -> Iterator[BookKeeper]:
    bk = BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root, add_timeout_s=3.0))
    yield bk
    bk.close()


def reader(spark: Any, bookies: Any, **options: Any) -> Any:
    r = spark.read.format("ledger").option("zk", bookies.zk).option("zkRoot", bookies.root)
    r = r.option("password", PW.decode())
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def wait_for_lac(client: BookKeeper, ledger_id: int, lac: int, timeout_s: float = 10.0) -> None:
    """Until the bookies report ``lac`` for an open ledger: an add carries the LAC of when it was sent, and the
    writer sends its LAC on its own within 0.5 s."""
    rh = client.open_ledger(ledger_id, PW, recovery=False)
    deadline = time.monotonic() + timeout_s
    while rh.read_last_add_confirmed() < lac:
        assert time.monotonic() < deadline, f"ledger {ledger_id}: LAC {rh.last_add_confirmed} < {lac}"
        time.sleep(0.1)


def summary(df: Any) -> dict[int, tuple[int, int, int, int, int]]:
    """ledger id -> (count, min id, max id, total bytes, sum of crc32 of the data)."""
    from pyspark.sql import functions as F

    rows = (
        df.groupBy("ledger_id")
        .agg(
            F.count("*"),
            F.min("entry_id"),
            F.max("entry_id"),
            F.sum("length"),
            F.sum(F.crc32("data")),
        )
        .collect()
    )
    return {r[0]: (r[1], r[2], r[3], r[4], r[5]) for r in rows}


def expected(entries: list[bytes]) -> tuple[int, int, int, int, int]:
    return (
        len(entries),
        0,
        len(entries) - 1,
        sum(map(len, entries)),
        sum(zlib.crc32(e) for e in entries),
    )


def test_a_batchs_columns_hold_every_payload_its_length_and_id_in_order() -> None:
    """The reader's Arrow batch (built from joined payloads and offsets), without Spark: empty and varied
    payloads, the full schema and a subset of it."""
    from pyspark.sql.types import StructType

    from spark.ledger_source import LEDGER_SCHEMA, LedgerRange, _Columns

    part = LedgerRange(7, 0, 99, "CLOSED", 1_234, {"app": b"x"})
    data = [payload(7, i) for i in range(5)] + [b"", b"\x00" * 3, payload(7, 9, 3000)]
    batch = _Columns(part, LEDGER_SCHEMA, 16).batch(10, [data])
    batch.validate(full=True)
    assert batch.column("data").to_pylist() == data
    assert batch.column("length").to_pylist() == [len(d) for d in data]
    assert batch.column("entry_id").to_pylist() == list(range(10, 10 + len(data)))
    assert set(batch.column("ledger_id").to_pylist()) == {7}
    assert batch.column("custom_metadata").to_pylist()[-1] == [("app", b"x")]
    narrow = StructType([LEDGER_SCHEMA["entry_id"], LEDGER_SCHEMA["data"]])
    small = _Columns(part, narrow, 16).batch(0, [data[:2]])
    assert small.schema.names == ["entry_id", "data"]
    assert small.column("data").to_pylist() == data[:2]


def _rows(payloads: list[bytes]) -> Any:
    """Payloads of one size as ``read_batches(..., rows=True)`` hands them out: a read-only 2-D array viewing a
    larger buffer (each row followed by bytes that are not its payload)."""
    import numpy as np

    width = len(payloads[0])
    buf = np.frombuffer(b"".join(p + b"#gap" for p in payloads), np.uint8).reshape(len(payloads), width + 4)
    return buf[:, :width]


def test_a_batch_from_rows_and_lists_holds_every_payload_in_order() -> None:
    """Chunks of rows (one size) gathered into the data column, and rows mixed with lists or with rows of
    another width: the same columns as the payloads joined."""
    from spark.ledger_source import LEDGER_SCHEMA, LedgerRange, _Columns

    part = LedgerRange(7, 0, 99, "CLOSED", 1_234, {})
    a = [bytes([i]) * 6 for i in range(5)]
    b = [bytes([100 + i]) * 6 for i in range(3)]
    c = [payload(7, i) for i in range(4)]
    for chunks, want in [
        ([_rows(a)], a),
        ([_rows(a), _rows(b)], a + b),
        ([_rows(a), c, _rows(b)], a + c + b),
        ([_rows(a), _rows([b"z" * 9, b"y" * 9])], a + [b"z" * 9, b"y" * 9]),
    ]:
        batch = _Columns(part, LEDGER_SCHEMA, 16).batch(3, chunks)
        batch.validate(full=True)
        assert batch.column("data").to_pylist() == want
        assert batch.column("length").to_pylist() == [len(d) for d in want]
        assert batch.column("entry_id").to_pylist() == list(range(3, 3 + len(want)))


def test_payloads_are_handed_out_in_batches_of_at_most_max_rows_and_max_bytes() -> None:
    """``_Payloads.take`` cuts rows and lists alike at the row limit and after the entry that reaches the byte
    limit, and hands out every entry once, in order."""
    import asyncio

    from ledger_client.client import EntryBatch
    from spark.ledger_source import _Payloads

    ids = list(range(20, 40))
    pay = [i.to_bytes(2, "big") * 5 for i in ids]  # 10 bytes each

    async def batches() -> Any:
        yield EntryBatch(1, 20, _rows(pay[:7]))
        yield EntryBatch(1, 27, pay[7:12])
        yield EntryBatch(1, 32, _rows(pay[12:]))

    async def take_all(max_rows: int, max_bytes: int) -> list[list[bytes]]:
        src = _Payloads(batches(), 20)
        out = []
        while chunks := await src.take(max_rows, max_bytes):
            out.append([bytes(p) for c in chunks for p in c])
        return out

    for max_rows, max_bytes, sizes in [
        (8, 1000, [8, 8, 4]),
        (7, 1000, [7, 7, 6]),  # cuts at the chunks' ends
        (12, 1000, [12, 8]),
        (100, 35, [4, 4, 4, 4, 4]),
        (3, 25, [3] * 6 + [2]),
    ]:
        got = asyncio.run(take_all(max_rows, max_bytes))
        assert [len(g) for g in got] == sizes
        assert [p for g in got for p in g] == pay


def test_closed_and_open_ledgers_read_exactly_what_was_written_and_the_writer_keeps_appending(
    bookies: Any, client: BookKeeper, spark: Any
) -> None:
    bookies.start_many(3)
    closed = client.create_ledger(3, 2, 2, password=PW, custom_metadata={"app": b"\x00\xffx"})
    closed_data = [payload(1, i) for i in range(2500)]
    closed.append_many(closed_data)
    closed.close()
    live = client.create_ledger(3, 3, 2, password=PW)
    live_data = [payload(2, i) for i in range(700)]
    live.append_many(live_data)
    wait_for_lac(client, live.ledger_id, 699)

    df = reader(spark, bookies, ledgers="all", entriesPerPartition=600, maxRecordsPerBatch=256)
    got = summary(df)
    assert got[closed.ledger_id] == expected(closed_data)
    assert got[live.ledger_id] == expected(live_data)  # an open ledger reads to its LAC
    rows = (
        df.where(f"ledger_id = {live.ledger_id} and entry_id < 50")
        .orderBy("entry_id")
        .select("entry_id", "data", "length", "state")
        .collect()
    )
    assert [(r.entry_id, bytes(r.data), r.length, r.state) for r in rows] == [
        (i, live_data[i], len(live_data[i]), "OPEN") for i in range(50)
    ]
    meta = df.where("entry_id = 0").select("ledger_id", "state", "custom_metadata", "ctime").collect()
    by_id = {r.ledger_id: r for r in meta}
    assert by_id[closed.ledger_id].state == "CLOSED"
    assert by_id[closed.ledger_id].custom_metadata == {"app": b"\x00\xffx"}
    md = client.ledger_metadata(closed.ledger_id)
    assert abs(by_id[closed.ledger_id].ctime.timestamp() * 1000 - md.ctime_ms) < 1.0

    # the scan fenced nothing: the writer keeps appending and closes normally
    assert client.ledger_metadata(live.ledger_id).state.value == "OPEN"
    assert live.append(b"after the scan") == 700
    live.close()
    md_live = client.ledger_metadata(live.ledger_id)
    assert md_live.state.value == "CLOSED" and md_live.last_entry_id == 700
    assert summary(reader(spark, bookies, ledgers=str(live.ledger_id)))[live.ledger_id] == expected(
        [*live_data, b"after the scan"]
    )


def test_ledger_with_an_ensemble_change_inside_one_partition(
    bookies: Any, client: BookKeeper, spark: Any
) -> None:
    procs = bookies.start_many(4)
    lh = client.create_ledger(3, 2, 2, password=PW)
    data = [payload(1, i) for i in range(600)]
    lh.append_many(data[:300])
    victim = next(bp for bp in procs if bp.id == lh.metadata.last_ensemble.bookies[0])
    victim.stop()
    lh.append_many(data[300:])
    lh.close()
    md = client.ledger_metadata(lh.ledger_id)
    assert len(md.ensembles) == 2 and 0 < md.ensembles[1].first_entry_id <= 300
    victim.start()  # its entries of the first ensemble are readable from it again
    df = reader(spark, bookies, ledgers=str(lh.ledger_id), entriesPerPartition=1000)
    assert df.rdd.getNumPartitions() == 1
    assert summary(df) == {lh.ledger_id: expected(data)}


def test_a_bookie_killed_during_the_scan_reads_fail_over(
    bookies: Any, client: BookKeeper, spark: Any
) -> None:
    procs = bookies.start_many(3)
    ledgers = []
    for n in range(2):
        lh = client.create_ledger(3, 2, 2, password=PW)
        data = [payload(n, i, 1000) for i in range(6000)]
        lh.append_many(data)
        lh.close()
        ledgers.append((lh.ledger_id, data))
    victim = procs[1]
    killed_at: list[float] = []
    reads_before = _reads_served(victim)

    def kill_once_reading() -> None:  # mid-scan, however fast the machine: at the victim's first read request
        deadline = time.monotonic() + 60
        while _reads_served(victim) <= reads_before and time.monotonic() < deadline:
            time.sleep(0.005)
        victim.kill9()
        killed_at.append(time.monotonic())

    # small partitions: a scan of 120 tasks outlasts the few milliseconds between the first read and the kill
    df = reader(spark, bookies, entriesPerPartition=100, readTimeoutMs=3000)
    t = threading.Thread(target=kill_once_reading)
    t.start()
    try:
        got = summary(df)
        finished = time.monotonic()
    finally:
        t.join()
    assert got == {lid: expected(data) for lid, data in ledgers}
    # every write set of a 3/2 ledger on 3 bookies has the victim in 2 of 3 entries: the scan read some entries
    # from it, then read the rest from the other replica
    assert killed_at and killed_at[0] < finished
    assert summary(reader(spark, bookies, entriesPerPartition=1000)) == got


def _reads_served(bp: Any) -> int:
    """The bookie's ``bookie_reads_total`` (read requests it has served)."""
    return int(scrape(f"http://127.0.0.1:{bp.http_port}/metrics", timeout=2)["bookie_reads_total"])


def test_ledger_selection_all_ids_and_ranges(bookies: Any, client: BookKeeper, spark: Any) -> None:
    bookies.start_many(3)
    ids = []
    for n in range(4):
        lh = client.create_ledger(3, 2, 2, password=PW)
        lh.append_many([payload(n, i) for i in range(10 + n)])
        lh.close()
        ids.append(lh.ledger_id)
    empty_lh = client.create_ledger(3, 2, 2, password=PW)  # open and empty: no rows, no error
    empty = empty_lh.ledger_id
    a, b, c, d = ids

    def counts(sel: str) -> dict[int, int]:
        rows = reader(spark, bookies, ledgers=sel).select("ledger_id").collect()  # no shuffle: quicker here
        return dict(Counter(r[0] for r in rows))

    assert counts("all") == {a: 10, b: 11, c: 12, d: 13}
    assert counts(f"{b}-{c}") == {b: 11, c: 12}
    assert counts(f"{a},{d}") == {a: 10, d: 13}
    assert counts(f"{a},{c}-{empty + 100}") == {a: 10, c: 12, d: 13}
    assert counts(f"{empty}") == {}
    # an explicit id that does not exist is data loss; a range over nothing is just empty
    assert counts(f"{empty + 50}-{empty + 60}") == {}
    with pytest.raises(Exception, match=f"ledger {empty + 50} does not exist"):
        counts(f"{a},{empty + 50}")
    missing_ok = reader(spark, bookies, ledgers=f"{a},{empty + 50}", failOnDataLoss="false")
    assert len(missing_ok.select("entry_id").collect()) == 10
    empty_lh.close()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"ledgers": "1,two"}, "ledgers"),
        ({"entriesPerPartition": "0"}, "entriesPerPartition"),
        ({"failOnDataLoss": "sometimes"}, "failOnDataLoss"),
        ({"zk": "no-port"}, "zk"),
        ({"bogus": "1"}, "bogus"),
    ],
)
def test_bad_options_fail_when_the_dataframe_is_defined_naming_the_option(
    spark: Any, options: dict[str, str], named: str
) -> None:
    r = spark.read.format("ledger")
    for k, v in options.items():
        r = r.option(k, v)
    with pytest.raises(Exception, match=f"option '{named}'"):
        r.load()


def test_wrong_password_fails_at_plan_time_naming_the_option(
    bookies: Any, client: BookKeeper, spark: Any
) -> None:
    bookies.start_many(3)
    lh = client.create_ledger(3, 2, 2, password=PW)
    lh.append(b"x")
    lh.close()
    df = (
        spark.read.format("ledger")
        .option("zk", bookies.zk)
        .option("zkRoot", bookies.root)
        .option("password", "not-it")
        .load()
    )
    with pytest.raises(Exception, match="option 'password'.*select the ones it opens with option 'ledgers'"):
        df.count()


def test_a_ledger_deleted_under_a_query_fails_or_is_skipped_by_fail_on_data_loss(
    bookies: Any, client: BookKeeper
) -> None:
    """Planned, then deleted before its partition is read (the source's reader driven directly, as Spark would).
    The two small ledgers are packed into one partition: the lost one is skipped or fails the task, and the
    other one in the same pack is read either way."""
    from spark.ledger_source import LEDGER_SCHEMA, LedgerDataLossError, LedgerDataSource, LedgerRanges

    bookies.start_many(3)
    keep = client.create_ledger(3, 2, 2, password=PW)
    keep.append_many([b"k"] * 5)
    keep.close()
    gone = client.create_ledger(3, 2, 2, password=PW)
    gone.append_many([b"g"] * 5)
    gone.close()
    base = {"zk": bookies.zk, "zkRoot": bookies.root, "password": PW.decode(), "ledgers": "all"}
    strict = LedgerDataSource(dict(base)).reader(LEDGER_SCHEMA)
    lenient = LedgerDataSource({**base, "failOnDataLoss": "false"}).reader(LEDGER_SCHEMA)
    (pack,) = strict.partitions()
    assert isinstance(pack, LedgerRanges)
    assert [r.ledger_id for r in pack.ranges] == sorted([keep.ledger_id, gone.ledger_id])
    client.delete_ledger(gone.ledger_id)
    batches = list(lenient.read(pack))
    assert sum(b.num_rows for b in batches) == 5
    assert {lid for b in batches for lid in b.column("ledger_id").to_pylist()} == {keep.ledger_id}
    with pytest.raises(LedgerDataLossError, match=f"ledger {gone.ledger_id} was deleted"):
        list(strict.read(pack))


def test_a_ledger_of_empty_entries_reads_as_rows_of_empty_data(
    bookies: Any, client: BookKeeper, spark: Any
) -> None:
    """A ledger whose entries are all empty (a reply of same-size entries of zero bytes: rows of width 0) failed
    the scan with ZeroDivisionError since 34aa168 (the offsets of rows are arithmetic, with the width as step);
    it reads as rows of empty data, and so does a run of empty entries between others."""
    bookies.start_many(3)
    empty = client.create_ledger(3, 3, 2, password=PW)
    empty.append_many([b""] * 300)
    empty.close()
    mixed_data = [b""] * 100 + [b"x" * 10] * 100 + [b""] * 100
    mixed = client.create_ledger(3, 3, 2, password=PW)
    mixed.append_many(mixed_data)
    mixed.close()
    got = summary(reader(spark, bookies, ledgers="all", maxRecordsPerBatch=64))
    assert got[empty.ledger_id] == expected([b""] * 300)
    assert got[mixed.ledger_id] == expected(mixed_data)
