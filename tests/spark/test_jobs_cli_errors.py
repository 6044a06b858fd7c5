"""``ledgerstore spark JOB`` refuses a wrong flag in the command's own words: the flag named (not the source
option it becomes), before Spark starts when the flag alone is wrong, and without advice to set
``failOnDataLoss``, which a job does not offer."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from ledger_client import ClientConfig
from ledger_client.sync import BookKeeper


def ledgerstore(bookies: Any, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "ledgerstore.cli",
        "spark",
        *args,
        "--zk",
        bookies.zk,
        "--zk-root",
        bookies.root,
    ]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


def small_ledger(bookies: Any) -> int:
    """3 bookies started and a closed ledger of 5 entries (empty password) written to them: its id."""
    bookies.start_many(3)
    bk = BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    try:
        lh = bk.create_ledger(3, 2, 2, password=b"")
        lh.append_many([b"x" * 10] * 5)
        lh.close()
        return int(lh.ledger_id)
    finally:
        bk.close()


def test_a_wrong_flag_is_named_as_given_and_fails_before_spark_starts(bookies: Any) -> None:
    started = time.monotonic()
    for args, named in [
        (
            ("entry-sizes", "--entries-per-partition", "0"),
            "option --entries-per-partition: must be between 1",
        ),
        (("ledger-health", "--ledgers", "3-x"), "option --ledgers: '3-x' is neither"),
        (("topic-volume", "--topics", "a,,b"), "option --topics: empty topic name"),
        (("topic-volume", "--topics-pattern", "orders-("), "option --topics-pattern: not a valid regular"),
    ]:
        r = ledgerstore(bookies, *args)
        assert r.returncode != 0 and named in r.stderr, r.stderr[-2000:]
        assert "source option" not in r.stderr and "log4j" not in r.stderr, "refused before Spark started"
    assert time.monotonic() - started < 60


def test_a_missing_ledger_is_named_with_the_flag_that_leaves_it_out(bookies: Any, tmp_path: Any) -> None:
    lid = small_ledger(bookies)
    r = ledgerstore(bookies, "ledger-health", "--ledgers", f"{lid},99999", "--out", str(tmp_path))
    assert r.returncode != 0
    assert "ledger 99999 does not exist (leave it out with --ledgers)" in r.stderr, r.stderr[-2000:]
    assert "failOnDataLoss" not in r.stderr
