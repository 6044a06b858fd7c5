"""Bookie rules that planted bugs showed unguarded (docs/architecture.md §11, "The bookie's and the ledger
client's planted-bug audit"): each test here fails with one of those bugs in ``bookie/``."""

from __future__ import annotations

from bookie import protocol as p
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
