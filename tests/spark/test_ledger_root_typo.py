"""A ``zkRoot`` with a typo fails the ``ledger`` source's plan naming the option: it read no ledger under the
misspelt root (the client even made that znode) and returned an empty DataFrame, as if the cluster had none."""

from __future__ import annotations

from typing import Any

import pytest

from tests.spark.test_jobs_cli_errors import small_ledger


def test_a_misspelt_zk_root_is_refused_and_the_right_one_reads(bookies: Any, spark: Any) -> None:
    small_ledger(bookies)

    def count(root: str) -> int:
        n: int = spark.read.format("ledger").option("zk", bookies.zk).option("zkRoot", root).load().count()
        return n

    assert count(bookies.root) == 5
    for _ in range(2):  # the second time the misspelt root's znode exists (the first attempt made it)
        with pytest.raises(Exception, match=f"option 'zkRoot': no ledgerstore cluster under {bookies.root}x"):
            count(bookies.root + "x")
