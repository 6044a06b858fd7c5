"""The ledger source's option parsing and planning math, without Spark or a cluster."""

from __future__ import annotations

import itertools

import pytest

from spark.options import LedgerOptionError, LedgerSelection, parse_ledger_options, parse_ledgers
from spark.planning import entry_ranges, readable_last_entry, replicas_per_bookie


@pytest.mark.parametrize(
    ("text", "existing", "chosen", "missing"),
    [
        ("all", [3, 1, 2], [1, 2, 3], []),
        ("1,2,5", [1, 2, 3, 4], [1, 2], [5]),
        ("3-9", [1, 3, 4, 10], [3, 4], []),
        (" 1 , 4-7,12", [1, 5, 6, 12, 13], [1, 5, 6, 12], []),
        ("2,2-3", [2, 3], [2, 3], []),
    ],
)
def test_ledger_selection(text: str, existing: list[int], chosen: list[int], missing: list[int]) -> None:
    assert parse_ledgers(text).select(existing) == (chosen, missing)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"ledgers": "1,x"}, "ledgers"),
        ({"ledgers": "9-3"}, "ledgers"),
        ({"ledgers": ""}, "ledgers"),
        ({"entriesPerPartition": "0"}, "entriesPerPartition"),
        ({"entriesperpartition": "ten"}, "entriesPerPartition"),
        ({"maxRecordsPerBatch": "-1"}, "maxRecordsPerBatch"),
        ({"failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"zk": "localhost"}, "zk"),
        ({"zkRoot": "ledgerstore"}, "zkRoot"),
        ({"readTimeoutMs": "0"}, "readTimeoutMs"),
        ({"ledgerz": "1"}, "ledgerz"),
        ({"path": "/x"}, "path"),
    ],
)
def test_bad_option_names_the_option(options: dict[str, str], named: str) -> None:
    with pytest.raises(LedgerOptionError) as err:
        parse_ledger_options(options)
    assert err.value.option.lower() == named.lower()
    assert f"'{named.lower()}'" in str(err.value).lower()


def test_options_defaults_and_case_insensitive_names() -> None:
    o = parse_ledger_options({"ZK": "10.0.0.1:2181,10.0.0.2:2181", "ZKROOT": "/ls", "Password": "pw"})
    assert (o.zk, o.zk_root, o.password) == ("10.0.0.1:2181,10.0.0.2:2181", "/ls", b"pw")
    assert o.ledgers == LedgerSelection(all=True) and o.fail_on_data_loss
    assert parse_ledger_options({"failOnDataLoss": "False"}).fail_on_data_loss is False


def test_entry_ranges_cover_the_ledger_without_overlap() -> None:
    assert entry_ranges(-1, 10) == []
    assert entry_ranges(0, 10) == [(0, 0)]
    assert entry_ranges(24, 10) == [(0, 9), (10, 19), (20, 24)]
    assert entry_ranges(19, 10) == [(0, 9), (10, 19)]
    assert readable_last_entry("CLOSED", 99, 50) == 99
    assert readable_last_entry("OPEN", -1, 50) == 50


@pytest.mark.parametrize(("e", "qw"), [(3, 2), (3, 3), (5, 2), (4, 1), (2, 2)])
def test_replicas_per_bookie_matches_the_write_sets(e: int, qw: int) -> None:
    names = [f"b{i}" for i in range(e + 3)]
    for last in (-1, 0, 1, 7, 23):
        for starts in ([0], [0, 5], [0, 2, 9]):
            ensembles = [(s, names[k : k + e]) for k, s in enumerate(starts)]
            expected: dict[str, int] = {}
            for entry in range(last + 1):
                first, bookies = next(x for x in reversed(ensembles) if x[0] <= entry)
                for i in range(qw):
                    b = bookies[(entry + i) % e]
                    expected[b] = expected.get(b, 0) + 1
            got = replicas_per_bookie(ensembles, qw, last)
            assert dict(got) == expected, (e, qw, last, starts)
            assert sum(got.values()) == qw * (last + 1)
    assert list(itertools.islice(iter(replicas_per_bookie([(0, ["a"])], 1, 3).items()), 1)) == [("a", 4)]


def test_small_ranges_are_packed_in_order_and_large_ones_stand_alone() -> None:
    from spark.ledger_source import LedgerRange, LedgerRanges, pack_ranges

    def r(lid: int, first: int, last: int) -> LedgerRange:
        return LedgerRange(lid, first, last, "CLOSED", 0)

    big = [r(1, 0, 99), r(1, 100, 199)]
    small = [r(lid, 0, 9) for lid in range(2, 10)]  # eight ledgers of 10 entries
    tail = r(10, 0, 49)
    parts = pack_ranges([*big, *small, tail], entries_per_partition=100, pack_entries=35, pack_ranges_max=3)
    # at least the limit (min(100, 35) entries): alone
    assert [p for p in parts if isinstance(p, LedgerRange)] == [*big, tail]
    # the small ones in order, at most 3 ranges and 35 entries a pack
    packs = [p for p in parts if isinstance(p, LedgerRanges)]
    assert [[x.ledger_id for x in p.ranges] for p in packs] == [[2, 3, 4], [5, 6, 7], [8, 9]]
    # every range planned is in exactly one partition
    flat = [x for p in parts for x in (p.ranges if isinstance(p, LedgerRanges) else (p,))]
    assert sorted(flat, key=lambda x: (x.ledger_id, x.first_entry_id)) == [*big, *small, tail]
    # a pack of one stays a plain range; nothing planned, nothing to read
    assert pack_ranges([r(3, 0, 0)], 100) == [r(3, 0, 0)]
    assert pack_ranges([], 100) == []
    # the entries limit: 4 ranges of 10 under a limit of 25 entries make packs of 2
    assert [len(p.ranges) for p in pack_ranges(small[:4], 25) if isinstance(p, LedgerRanges)] == [2, 2]


def test_a_ranges_printed_form_leaves_out_the_password_digest() -> None:
    """Spark prints partitions in its logs and UI; an old-style digest is an unsalted SHA-256 of the password."""
    from spark.ledger_source import LedgerRange

    r = LedgerRange(
        7, 0, 9, "CLOSED", 0, {}, "sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
    )
    assert "5e884898" not in repr(r) and "ledger_id=7" in repr(r)
    assert r.password_digest.endswith("1542d8")  # still carried to the task
