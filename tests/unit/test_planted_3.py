"""Tests for the bugs planted in the audit of 2026-11-28 against 417011a that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of topic compaction and the fixes since"): each fails with its
bug planted and passes without it."""

from __future__ import annotations

import argparse
import struct
import zlib
from pathlib import Path

import pytest

from bookie import protocol as p
from ledgerstore.cli import UsageError
from ledgerstore.cluster import BrokerProcess, _broker_quorum_args, _check_recorded_zk, _process_of
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.compaction import PhaseOne, compacted_out_mask, last_kept_index, phase_two_entry
from topic_broker.managed_ledger import Position

# ---- a wave's ADD_ENTRY responses built by column (bookie/protocol.py, 6f9c73f) ----


@pytest.mark.parametrize("n", [8, 9, 64])
def test_a_wave_whose_first_and_last_adds_share_a_ledger_keeps_each_responses_ledger_id(n: int) -> None:
    """Adds to several ledgers in one wave, the first and the last to the same one: every response names its
    own ledger (the wave is one ledger only when every add is to it, not when its ends agree)."""
    rids = list(range(100, 100 + n))
    lids = [7 if i in (0, n - 1) else 8 + i % 3 for i in range(n)]
    eids = list(range(n))
    want = b"".join(
        p.encode_add_response(r, p.Status.OK, lid, e) for r, lid, e in zip(rids, lids, eids, strict=True)
    )
    assert p.encode_add_responses(rids, p.Status.OK, lids, eids) == want


# ---- cluster status|down|stop|start|restart: --zk-root against cluster.json (ledgerstore/cluster.py, cda28e4) ----


def _args(zk_root: str | None) -> argparse.Namespace:
    return argparse.Namespace(
        action="status",
        zk="127.0.0.1:2181",
        zk_given=False,
        zk_root=zk_root or "/ledgerstore",
        zk_root_given=zk_root is not None,
    )


@pytest.mark.parametrize(
    ("recorded", "given"),
    [("/r/", "/r"), ("/r", "/r/"), ("/r/", "/r/"), ("/r", "/r"), ("/", "/"), ("/r", None)],
)
def test_a_zk_root_given_with_or_without_its_trailing_slash_is_the_recorded_one(
    recorded: str, given: str | None
) -> None:
    """`cluster up --zk-root /r/` records the root as typed; a later command given /r (or /r/ after /r) names the
    same cluster and is accepted."""
    _check_recorded_zk(_args(given), {"zk": "127.0.0.1:2181", "zk_root": recorded}, Path("/tmp/c"))


def test_another_zk_root_than_the_recorded_one_is_refused_naming_both() -> None:
    with pytest.raises(UsageError, match=r"--zk-root /q: .*root /r/"):
        _check_recorded_zk(_args("/q"), {"zk": "127.0.0.1:2181", "zk_root": "/r/"}, Path("/tmp/c"))


# ---- compaction of a compressed batch (topic_broker/compaction.py, cda1941) ----


def test_a_compressed_batch_rewritten_by_compaction_reads_back_uncompressed() -> None:
    """A ZLIB batch that loses a message to compaction is stored again uncompressed, and says so: its messages
    (the one compacted out emptied) read back; flagged ZLIB still, the entry could not be read at all."""
    items = [("a", b"1" * 50), ("b", b"2" * 50), ("a", b"3" * 50)]
    parts = []
    for key, value in items:
        meta = pb.SingleMessageMetadata(partition_key=key, payload_size=len(value)).SerializeToString()
        parts += [struct.pack(">I", len(meta)), meta, value]
    raw = b"".join(parts)
    md = pb.MessageMetadata(
        producer_name="p",
        sequence_id=0,
        publish_time=1,
        num_messages_in_batch=len(items),
        compression=pb.ZLIB,
        uncompressed_size=len(raw),
    )
    entry = wire.make_entry(md, zlib.compress(raw))
    one = PhaseOne()
    one.add(Position(1, 0), entry)
    kept = phase_two_entry(one.latest, Position(1, 0), entry)
    assert kept is not None and kept != entry
    md2, payload = wire.parse_entry(kept)
    assert [(s.compacted_out, s.partition_key, data) for s, data in wire.iter_batch(md2, payload) if s] == [
        (True, "a", b""),
        (False, "b", b"2" * 50),
        (False, "a", b"3" * 50),
    ]
    assert compacted_out_mask(kept) == 0b001 and last_kept_index(kept) == 2


# ---- a broker row of cluster.json with or without its flags (ledgerstore/cluster.py, 4121848) ----


def test_a_broker_row_without_flags_starts_as_it_was_and_one_with_them_passes_them() -> None:
    """cluster start|restart of a broker: a row of a cluster.json older than the field starts the broker without
    flags, as before; a row of `cluster up --bookies 1` passes the quorum flags it records."""
    st = {"zk": "127.0.0.1:2181", "zk_root": "/r"}
    old = {"port": 6650, "http_port": 8080, "log": "/tmp/broker-0.log"}
    proc = _process_of(st, "broker", old)
    assert isinstance(proc, BrokerProcess) and "--ensemble-size" not in proc.command()
    one = _process_of(st, "broker", {**old, "args": _broker_quorum_args(1)})
    assert "--ensemble-size 1 --write-quorum 1 --ack-quorum 1" in " ".join(one.command())
