"""A bookie whose ledger or journal directory turns read-only under it (chmod a-w, the bookie run without
CAP_DAC_OVERRIDE so that root obeys it): it fails read-only and says so on /health, /metrics and in ZooKeeper, in
one ERROR line, not an ERROR and a traceback at every checkpoint; it keeps serving reads, and a restart once the
directory is writable again replays every entry it acknowledged."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time

import pytest

from bookie import protocol as p
from ledger_client.errors import BookieUnavailableError
from ledgerstore.cluster import BookieProcess
from tests.integration.rawbookie import RawBookie, build
from tests.integration.test_bookie_disk_full import _health_any, _registered
from tests.metrics_testing import scrape


class _NoDacOverrideBookie(BookieProcess):
    def command(self) -> list[str]:
        return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *super().command()]


@pytest.mark.parametrize("directory", ["ledgers", "journal"])
def test_a_directory_turned_read_only_fails_the_bookie_in_one_line(bookies, directory: str) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    bp = bookies.start("--checkpoint-interval-s", "0.3", process=_NoDacOverrideBookie)

    async def write(first: int, n: int) -> list[p.Status]:
        raw = await RawBookie.open(bp.id)
        out = [await raw.add(6, e, size=1000) for e in range(first, first + n)]
        raw.close()
        return out

    async def read_back(ids: list[int]) -> None:
        raw = await RawBookie.open(bp.id)
        for e in ids:
            r = await raw.read(6, e)
            assert r.status == p.Status.OK and r.entry == build(6, e, 1000), e
        raw.close()

    assert asyncio.run(write(0, 20)) == [p.Status.OK] * 20
    acked = list(range(20))
    turned = bp.data_dir / directory  # ledgers: a new SST refused; journal: the checkpoint's mark refused
    turned.chmod(0o555)
    try:
        e = 20  # adds go on (the journal acknowledges them) until a checkpoint's flush fails the bookie
        deadline = time.monotonic() + 30
        while _health_any(bp).get("status") != "failed":
            assert time.monotonic() < deadline, "the bookie did not fail"
            with contextlib.suppress(BookieUnavailableError):  # failing, it drops its connections once
                if asyncio.run(write(e, 1)) == [p.Status.OK]:
                    acked.append(e)
            e += 1
        assert len(acked) > 20
        time.sleep(3)  # some 10 checkpoints more
        health = _health_any(bp)
        assert health["readonly"] and "Permission denied" in health["reason"], health
        m = scrape(f"http://127.0.0.1:{bp.http_port}/metrics", timeout=5)
        assert m["bookie_readonly"] == 1 and m["bookie_failed"] == 1
        assert _registered(bookies, "readonly") == [bp.id]
        assert asyncio.run(write(e, 1)) == [p.Status.READONLY]
        asyncio.run(read_back(acked))
        log = bp.started_log_tail(400)
        # before the fix: "failed again" and "periodic task checkpoint failed" with a traceback every 0.3 s
        assert "Traceback" not in log and "periodic task checkpoint failed" not in log, log[-3000:]
        errors = [line for line in log.splitlines() if " ERROR " in line]
        assert len(errors) == 1 and "FAILED" in errors[0], log[-3000:]
    finally:
        turned.chmod(0o755)
    bp.restart()
    asyncio.run(read_back(acked))
