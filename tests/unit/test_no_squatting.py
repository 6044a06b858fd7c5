"""No squatting (bookie/core.py): a fence or read binds no key; a fence of a ledger never written here holds for
the fencer's key only (invariant 4 for the real owner's recovery), survives restarts, and lets the first add of
another key bind it. READ_RANGE replies stay under the frame limit."""

from __future__ import annotations

from bookie import protocol as p
from bookie.core import FENCE_KEYS_MAX, UNBOUND_KEY, fence_keys
from tests.unit.test_bookie_core import KEY, OTHER, Rig

STRANGER = p.master_key(b"stranger")


def _statuses(r: Rig) -> list[p.Status]:
    """Replies' statuses in request order (refusals are answered at once, acceptances once durable)."""
    return [x.status for x in sorted(r.replies, key=lambda x: x.request_id)]


def test_a_strangers_fence_of_a_future_ledger_leaves_the_owner_able_to_write_it() -> None:
    r = Rig()
    r.read(9, -1, key=STRANGER, flags=p.Flag.FENCE)
    r.settle()
    assert _statuses(r) == [p.Status.NO_ENTRY]  # the stranger's fence is answered (and recorded)
    r.add(9, 0)
    r.add(9, 1, lac=0)
    r.settle()
    r.read(9, 1)
    r.settle()
    assert _statuses(r)[1:] == [p.Status.OK, p.Status.OK, p.Status.OK]
    assert r.core.ledgers[9].master_key == KEY and not r.core.ledgers[9].fenced
    r.add(9, 2, key=STRANGER)  # the stranger's key is now refused like any wrong key
    r.settle()
    assert r.replies[-1].status == p.Status.UNAUTHORIZED


def test_a_read_of_an_unknown_ledger_binds_nothing() -> None:
    r = Rig()
    r.read(4, 0, key=STRANGER)
    r.read(4, -1, key=STRANGER)
    r.settle()
    assert _statuses(r) == [p.Status.NO_LEDGER, p.Status.NO_LEDGER]
    assert 4 not in r.core.ledgers
    r.add(4, 0)
    r.settle()
    assert r.replies[-1].status == p.Status.OK


def test_the_owners_fence_of_an_unwritten_ledger_still_stops_the_owners_old_writer() -> None:
    """Invariant 4: recovery fenced a bookie that never received an entry; the old writer's add (same key) must
    be refused, even after a stranger fenced it too; recovery's own add binds the key and keeps the fence."""
    r = Rig()
    r.read(5, -1, key=STRANGER, flags=p.Flag.FENCE)
    r.read(5, -1, flags=p.Flag.FENCE)  # the owner's recovery
    r.settle()
    r.add(5, 0)  # the old writer
    r.settle()
    assert r.replies[-1].status == p.Status.FENCED
    r.add(5, 0, flags=p.Flag.RECOVERY_ADD)  # recovery writes the entry back
    r.add(5, 1)
    r.settle()
    assert _statuses(r)[-2:] == [p.Status.OK, p.Status.FENCED]
    info = r.core.ledgers[5]
    assert info.master_key == KEY and info.fenced


def test_unbound_fences_and_bindings_survive_a_restart() -> None:
    r = Rig()
    r.read(6, -1, key=STRANGER, flags=p.Flag.FENCE)
    r.read(7, -1, flags=p.Flag.FENCE)
    r.read(8, -1, key=STRANGER, flags=p.Flag.FENCE)
    r.settle()
    r.add(8, 0)  # binds KEY over the stranger's fence
    r.settle()
    r2 = r.restart()
    assert r2.core.ledgers[6].master_key == UNBOUND_KEY and fence_keys(r2.core.ledgers[6]) == [STRANGER]
    r2.add(6, 0)  # the owner of 6: allowed
    r2.add(7, 0)  # 7 was fenced by its owner's key: refused
    r2.add(8, 1, lac=0)  # 8 was bound to KEY before the crash
    r2.add(8, 2, key=STRANGER)
    r2.settle()
    assert _statuses(r2) == [p.Status.OK, p.Status.FENCED, p.Status.OK, p.Status.UNAUTHORIZED]


def test_to_other_keys_an_unbound_ledger_is_unknown_and_shows_no_fence_keys() -> None:
    r = Rig()
    r.read(3, -1, key=STRANGER, flags=p.Flag.FENCE)
    r.settle()
    r.read(3, 0)
    r.rid += 1
    r.core.handle(p.ReadLacRequest(request_id=r.rid, ledger_id=3, master_key=STRANGER), r.reply)
    r.rid += 1
    r.core.handle(
        p.WriteLacRequest(request_id=r.rid, ledger_id=3, lac=5, master_key=STRANGER, lac_blob=b"b"), r.reply
    )
    r.settle()
    read, lac, write_lac = r.replies[1:]
    assert read.status == p.Status.NO_LEDGER
    assert isinstance(lac, p.ReadLacResponse) and lac.status == p.Status.OK and lac.lac_blob == b""
    assert write_lac.status == p.Status.NO_LEDGER  # a WRITE_LAC binds nothing either


def test_fence_keys_of_an_unbound_ledger_are_bounded() -> None:
    r = Rig()
    for i in range(FENCE_KEYS_MAX + 1):
        r.read(2, -1, key=p.master_key(b"k%d" % i), flags=p.Flag.FENCE)
    r.settle()
    statuses = _statuses(r)
    assert statuses.count(p.Status.NO_ENTRY) == FENCE_KEYS_MAX
    # the last key is refused: its fencer counts this bookie as not fenced
    assert statuses[-1] == p.Status.UNAUTHORIZED
    assert len(fence_keys(r.core.ledgers[2])) == FENCE_KEYS_MAX
    r.add(2, 0)  # the owner still binds
    r.settle()
    assert _statuses(r)[-1] == p.Status.OK


def test_the_all_zero_key_is_never_bound() -> None:
    r = Rig()
    r.add(1, 0, key=UNBOUND_KEY)
    r.settle()
    assert r.replies[-1].status == p.Status.UNAUTHORIZED and 1 not in r.core.ledgers


def test_read_range_reply_is_trimmed_to_the_frame_limit() -> None:
    r = Rig()
    big = p.ENTRY_SIZE_MAX // 2 + 4096  # two of them do not fit one frame
    from bookie.entryformat import DigestType, EntryCodec

    codec = EntryCodec(1, DigestType.CRC32C)
    for eid in range(3):
        r.rid += 1
        r.core.add_entry(r.rid, 1, eid, KEY, codec.build(eid, -1, big * (eid + 1), b"x" * big), 0, r.reply)
    r.settle()
    frames: list[bytes] = []
    r.core.handle(
        p.ReadRangeRequest(
            request_id=99, ledger_id=1, first_entry_id=0, last_entry_id=2, master_key=KEY, max_bytes=2**32 - 1
        ),
        frames.append,
    )
    assert len(frames[0]) - 4 <= p.FRAME_SIZE_MAX
    resp = p.decode_one_response(frames[0])
    assert isinstance(resp, p.ReadRangeResponse) and resp.status == p.Status.OK and len(resp.entries) == 1
    assert OTHER != KEY
