"""Bookie rules that planted bugs showed unguarded (docs/architecture.md §11, "The bookie's and the ledger
client's planted-bug audit"): each test here fails with one of those bugs in ``bookie/``."""

from __future__ import annotations

from bookie import protocol as p
from bookie.entryformat import DigestType, EntryCodec
from tests.unit.test_bookie_core import KEY, Rig


def _read_lac(r: Rig, ledger: int) -> p.ReadLacResponse:
    r.rid += 1
    r.core.handle(p.ReadLacRequest(request_id=r.rid, ledger_id=ledger, master_key=KEY), r.reply)
    resp = r.replies[-1]
    assert isinstance(resp, p.ReadLacResponse)
    return resp


def test_read_lac_reports_the_highest_piggybacked_lac_exactly_before_and_after_a_restart() -> None:
    r = Rig()
    for e in range(3):
        r.add(1, e, lac=e - 1)  # entry e confirms e - 1
    r.settle()
    resp = _read_lac(r, 1)
    assert (resp.status, resp.lac, resp.explicit_lac) == (p.Status.OK, 1, -1)
    resp = _read_lac(r.restart(), 1)
    assert (resp.status, resp.lac, resp.explicit_lac) == (p.Status.OK, 1, -1)
    resp = _read_lac(r, 2)
    assert (resp.status, resp.lac, resp.explicit_lac) == (p.Status.NO_LEDGER, -1, -1)


def test_the_explicit_lac_never_goes_back_and_survives_a_restart() -> None:
    """Two WRITE_LACs arriving out of order (the writer sends one every ``explicit_lac_interval_s``, over
    different connections after a reconnect): the lower one changes nothing; a restart replays the higher."""
    r = Rig()
    for e in range(6):
        r.add(1, e, lac=e - 1)
    r.settle()
    codec = EntryCodec(1, DigestType.CRC32C)
    for lac in (4, 2):
        r.rid += 1
        req = p.WriteLacRequest(
            request_id=r.rid, ledger_id=1, lac=lac, master_key=KEY, lac_blob=codec.build_lac(lac)
        )
        r.core.handle(req, r.reply)
        r.settle()
        assert isinstance(r.replies[-1], p.WriteLacResponse) and r.replies[-1].status == p.Status.OK
    for rig in (r, r.restart()):
        resp = _read_lac(rig, 1)
        assert (resp.status, resp.lac, resp.explicit_lac) == (p.Status.OK, 4, 4)
        assert codec.verify_lac(resp.lac_blob) == 4
