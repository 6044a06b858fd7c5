"""Tests for the bugs planted in the audit of 2026-11-30 against dc5e322 (the ledger client, the bookie and the
metadata store: docs/architecture.md §11) that the tests of the time let through: each fails with its bug planted
and passes without it. No cluster: the cores and the real metadata store over the simulator's ZooKeeper."""

from __future__ import annotations

import pytest

from bookie import protocol as p
from bookie.entryformat import DigestMismatchError, DigestType, EntryCodec
from bookie.memjournal import MemoryJournal
from tests.sim.world import Mutations, SimConfig, World
from tests.unit.test_bookie_core import KEY, Rig
from zk.errors import MetadataVersionError
from zk.ledger_metadata import password_digest_of, password_hash, verify_password


def test_a_password_digest_is_compared_whole() -> None:
    """A stored digest that differs from the password's in its last character only is a wrong password, in
    either digest version: a compare of a prefix would let a password in whose hash shares it."""
    for digest in (password_digest_of(b"secret"), password_hash(b"secret", iterations=1000)):
        near = digest[:-1] + ("0" if digest[-1] != "0" else "1")
        assert verify_password(digest, b"secret")
        assert not verify_password(near, b"secret")


def test_a_metadata_write_at_a_stale_version_number_is_refused() -> None:
    """``LedgerMetadataStore.write`` given the version as a number (not the ``Versioned`` read) is a
    compare-and-set on that number: a caller whose version is stale (another write came in between) gets
    MetadataVersionError and the other write stays. Ignoring the number wrote over it at whatever version
    the znode had now (a lost update: here a recoverer's IN_RECOVERY replaced by a writer's CLOSED)."""
    w = World(0, SimConfig(), mutations=Mutations())
    store = w.meta.store
    v0 = store.create(
        ensemble_size=3, write_quorum=3, ack_quorum=2, bookies=["b0", "b1", "b2"], password=b"x"
    )
    lid = v0.value.ledger_id
    v1 = store.write(lid, v0.value.with_state("IN_RECOVERY"), v0.version)  # the number, current: written
    assert v1.version == v0.version + 1
    with pytest.raises(MetadataVersionError):
        store.write(lid, v0.value.close(-1, 0), v0.version)  # the number read before v1: stale
    assert store.read(lid).value.state == "IN_RECOVERY"


def test_a_read_only_bookie_refuses_a_run_of_adds_too() -> None:
    """A read-only bookie (a full disk, ``bookie readonly``) answers READONLY to every add, the runs of one
    ledger's adds that ``add_entries`` decides column by column included: a run it took would be journaled and
    acknowledged by a bookie that placement no longer gives writers, onto the disk that is full."""
    r = Rig()
    r.add(1, 0)
    r.settle()
    r.core.readonly = True
    codec = EntryCodec(1, DigestType.CRC32C)
    rows = [(0, 100 + e, 1, e, KEY, codec.build(e, 0, 10 * (e + 1), b"x" * 10)) for e in (1, 2, 3)]
    got: list[tuple[bytes, int]] = []
    r.core.add_entries(rows, lambda frames, n: got.append((frames, n)))
    r.settle()
    dec = p.FrameDecoder()
    dec.feed(b"".join(frames for frames, _ in got))
    assert {m.request_id: m.status for m in dec.responses()} == dict.fromkeys(
        (101, 102, 103), p.Status.READONLY
    )
    assert sorted(r.storage.entries) == [(1, 0)] and r.core.ledgers[1].last_entry_id == 0


@pytest.mark.parametrize("kind", [DigestType.CRC32, DigestType.HMAC])
def test_an_entry_whose_bytes_changed_fails_its_digest_check_in_every_digest_type(kind: DigestType) -> None:
    """A read verifies each entry against its digest, whatever the ledger's digest type: an entry with one
    payload byte changed (a damaged disk, a bad copy) fails the check, in ``verify`` and in ``verify_spans``
    (a range reply), so the reader turns to another replica instead of handing the user the damaged bytes; an
    HMAC entry read with another ledger password's key fails too."""
    codec = EntryCodec(7, kind, b"k" * 32)
    first, good = codec.build(0, -1, 5, b"hello"), codec.build(1, -1, 10, b"world")
    bad = good[:-1] + bytes([good[-1] ^ 1])
    assert codec.verify(good, 1)[1] == b"world"
    with pytest.raises(DigestMismatchError):
        codec.verify(bad, 1)
    n = len(first)
    payloads, why = codec.verify_spans(first + bad, [0, n, n, 2 * n], 0)
    assert payloads == [b"hello"] and why == "digest mismatch for ledger 7 entry 1"
    if kind is DigestType.HMAC:
        with pytest.raises(DigestMismatchError):
            EntryCodec(7, kind, b"j" * 32).verify(good, 1)


def test_a_bookies_lac_never_goes_back_when_an_older_entry_is_written_after_a_newer_one() -> None:
    """The LAC a bookie answers is the highest any entry it stored piggybacked: entry 3 (LAC 2) written after
    entry 5 (LAC 4), as a recovery writes back the bytes it read or a resend after an ensemble change arrives,
    leaves it at 4, live and after a restart that replays the journal in that order. A LAC taken from the
    latest entry went back to 2: a LAC read or long poll was answered with less than the bookie knew."""
    r = Rig()
    r.add(1, 5, lac=4)
    r.settle()
    r.add(1, 3, lac=2, flags=p.Flag.RECOVERY_ADD)
    r.settle()
    assert [m.status for m in r.replies] == [p.Status.OK, p.Status.OK]
    for rig in (r, r.restart()):
        rig.read(1, p.LAST_ENTRY)
        assert rig.replies[-1].lac == 4 and rig.core.ledgers[1].lac == 4


def test_a_fence_reaches_storage_so_it_outlives_the_journal_a_checkpoint_trims() -> None:
    """A fence is journaled, then its ledger's index row (fenced) goes to storage with the next commit batch: a
    checkpoint (``flush_pending``, then the journal before its mark dropped) leaves it in storage alone, and a
    bookie restarted after it still refuses the old writer's adds FENCED. A fence kept only in the journal was
    lost with the trimmed journal: the restarted bookie took the fenced writer's adds again."""
    r = Rig()
    r.add(1, 0)
    r.settle()
    r.read(1, 0, flags=p.Flag.FENCE)
    r.settle()
    assert r.replies[-1].status == p.Status.OK
    r.core.flush_pending()  # the checkpoint: storage made current, then the journal up to here dropped
    after = Rig(r.storage, MemoryJournal())
    assert after.core.ledgers[1].fenced
    after.add(1, 1)
    after.settle()
    assert after.replies[-1].status == p.Status.FENCED


def test_an_entry_other_than_the_one_asked_for_fails_the_check() -> None:
    """The entry a bookie returns is checked to be the one asked for, not only its ledger's and intact: entry 2
    returned for entry 1 (storage handing out the next entry of a run), alone or in a range reply, is refused,
    so the reader turns to another replica instead of giving the user entry 2 as entry 1. An explicit LAC blob
    of another ledger is refused too (with CRC32C its digest needs no key: only the ledger id tells)."""
    codec = EntryCodec(7, DigestType.CRC32C)
    e0, e2 = codec.build(0, -1, 5, b"hello"), codec.build(2, 1, 15, b"again")
    with pytest.raises(DigestMismatchError):
        codec.verify(e2, 1)
    n = len(e0)
    payloads, why = codec.verify_spans(e0 + e2, [0, n, n, 2 * n], 0)
    assert payloads == [b"hello"] and why == "entry 1: header names ledger 7 entry 2"
    assert codec.verify_lac(codec.build_lac(4)) == 4
    with pytest.raises(DigestMismatchError):
        codec.verify_lac(EntryCodec(8, DigestType.CRC32C).build_lac(4))
