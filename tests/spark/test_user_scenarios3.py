"""The Spark sources on a user's third day: odd data and many ledgers. A scan of many small ledgers
(``ledgers=all`` over thousands) spent most of its planning in the password check, a salted PBKDF2 of ~40 ms
per ledger, one ledger after the other, and each task hashed its ledgers' passwords once more."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest

import zk.ledger_metadata as ledger_metadata
from ledger_client import ClientConfig
from ledger_client.sync import BookKeeper
from tests.conftest import BookieFactory

pytest.importorskip("pyspark")


def test_planning_checks_the_passwords_on_threads_and_the_tasks_do_not_hash_them_again(
    bookies: BookieFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four closed ledgers of password ``pw``: planning hashes the password on at least two threads at once (a
    hash waits for a second one, up to 30 s), and reading every planned range in this process, its memo of
    checked passwords emptied as in a fresh executor, hashes nothing (before: planning hashed on the planning
    thread alone, and each range hashed its ledger's password again: 4 hashes)."""
    from spark.ledger_source import LEDGER_SCHEMA, plan_partitions, read_range
    from spark.options import parse_ledger_options

    bookies.start_many(3)
    bk = BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    ids = []
    try:
        for i in range(4):
            h = bk.create_ledger(password=b"pw")
            h.append_many([f"{i}-{j}".encode() * j for j in range(3)])  # sizes 0, 3, 6: odd ones too
            h.close()
            ids.append(h.ledger_id)
    finally:
        bk.close()
    opts = parse_ledger_options(
        {"zk": bookies.zk, "zkRoot": bookies.root, "password": "pw", "ledgers": ",".join(map(str, ids))}
    )
    real = ledger_metadata.hashlib.pbkdf2_hmac
    together = threading.Barrier(2, timeout=30)
    hashed_on: list[int] = []

    def pbkdf2(*args: Any) -> bytes:
        hashed_on.append(threading.get_ident())
        with contextlib.suppress(threading.BrokenBarrierError):
            together.wait()  # a second check runs meanwhile, or this waits 30 s and breaks the barrier
        return real(*args)

    monkeypatch.setattr(ledger_metadata, "_VERIFIED", {})
    monkeypatch.setattr(ledger_metadata.hashlib, "pbkdf2_hmac", pbkdf2)
    parts = plan_partitions(opts)
    assert len(hashed_on) == 4 and len(set(hashed_on)) >= 2, f"planning hashed on threads {hashed_on}"
    assert [p.ledger_id for p in parts] == ids

    ledger_metadata._VERIFIED.clear()  # a task's process, which has checked nothing
    hashed_on.clear()
    rows = [
        (p.ledger_id, bytes(d))
        for p in parts
        for b in read_range(opts, p, LEDGER_SCHEMA)
        for d in b.column("data").to_pylist()
    ]
    assert rows == [(lid, f"{i}-{j}".encode() * j) for i, lid in enumerate(ids) for j in range(3)]
    assert hashed_on == [], "the tasks hashed the password planning had checked"
