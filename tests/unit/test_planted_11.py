"""Tests for the bugs planted in the audit of 2026-11-29 against b698ba9 that the tests of the time let through
(docs/architecture.md §11): each fails with its bug planted and passes without it. No cluster: the command
line's and the broker's own code on what it is given."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerstore.cli import main
from tests.unit.test_broker_dedup_sequence_id import batch
from topic_broker import wire
from topic_broker.service import dedup_walk


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_cluster_down_names_a_broker_that_was_dead_already(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cluster down`` of a state file whose broker and bookie are no longer running (killed): both named as
    not running already, the broker too, and nothing counted as stopped."""
    state = tmp_path / "cluster"
    state.mkdir()
    st = {
        "zk": "127.0.0.1:1",
        "zk_root": "/ledgerstore",
        "bookies": [{"pid": _dead_pid(), "id": "127.0.0.1:30281"}],
        "brokers": [{"pid": _dead_pid(), "id": "broker-0"}],
    }
    (state / "cluster.json").write_text(json.dumps(st))
    assert main(["cluster", "down", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert "0 brokers and 0 bookies stopped" in out, out
    assert "(not running already: broker broker-0, bookie 127.0.0.1:30281)" in out, out


@pytest.mark.parametrize(
    ("ids", "with_ids", "kept"),
    [([10, 11, 12, 13, 14], True, 14), ([0, 2, 4, 5], True, 0), ([10, 11, 12], False, 10)],
)
def test_a_batch_walked_at_send_is_kept_by_the_id_a_walk_finds(
    ids: list[int], with_ids: bool, kept: int
) -> None:
    """An uncompressed batch is walked once at SEND (its count and sizes checked) and deduplication takes that
    walk's last id: the batch is kept by its last id when its messages are numbered one after the other, else
    by its first, as when deduplication walks it itself."""
    entry = batch(ids, with_ids=with_ids)
    md, payload = wire.parse_entry(entry, verify_checksum=False)
    walked = (wire.batch_last_sequence_id(md, payload),)  # as BrokerService.on_send walks it
    assert dedup_walk(ids[0], None, len(ids), entry, walked) == kept
    assert dedup_walk(ids[0], None, len(ids), entry) == kept
