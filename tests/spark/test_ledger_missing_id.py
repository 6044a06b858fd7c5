"""An id in option 'ledgers' that does not exist is refused at planning naming the option and the id; with
failOnDataLoss=false it is skipped. Real ZooKeeper and bookies, the planning alone (no Spark)."""

from __future__ import annotations

from typing import Any

import pytest

from spark.ledger_source import LedgerDataLossError, plan_partitions
from spark.options import parse_ledger_options
from tests.spark.test_jobs_cli_errors import small_ledger


def test_a_missing_ledger_id_names_option_ledgers_and_failondataloss_false_skips_it(bookies: Any) -> None:
    lid = small_ledger(bookies)
    options = {"zk": bookies.zk, "zkRoot": bookies.root, "password": "", "ledgers": f"{lid},99999"}
    with pytest.raises(LedgerDataLossError) as e:
        plan_partitions(parse_ledger_options(options))
    # before: "ledger 99999 does not exist (failOnDataLoss is true; ...)", the option at fault not named
    assert str(e.value).startswith("ledger source option 'ledgers': ledger 99999 does not exist"), e.value
    assert "set option failOnDataLoss=false to skip it with a warning" in str(e.value), e.value
    parts = plan_partitions(parse_ledger_options({**options, "failOnDataLoss": "false"}))
    assert [(p.ledger_id, p.first_entry_id, p.last_entry_id) for p in parts] == [(lid, 0, 4)]
