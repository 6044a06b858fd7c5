"""A bookie restarted with a flipped byte in its journal's last segment, in a batch it had synced and acknowledged
(later batches on disk after it): it must refuse to start, not cut the journal there and answer NO_ENTRY for
every entry after the damage."""

from __future__ import annotations

import asyncio
import subprocess

from tests.integration.rawbookie import RawBookie
from tests.integration.test_bookie_process import _add_entries
from tests.integration.test_bookie_storage_wiped import wrote_500


def test_a_flipped_byte_before_later_batches_of_the_last_segment_is_refused_not_cut(bookies) -> None:
    bp = bookies.start("--checkpoint-interval-s", "3600")  # the entries stay in the journal only
    wrote_500(bp)  # ledger 5's entries, synced and acknowledged before the next batches start

    async def more() -> None:
        raw = await RawBookie.open(bp.id)
        await _add_entries(raw, 6, 500)
        raw.close()

    asyncio.run(more())
    bp.kill9()
    (seg,) = sorted((bp.data_dir / "journal").glob("*.jnl"))
    size = seg.stat().st_size
    with open(seg, "r+b") as f:  # 200,000: in ledger 5's entries, ledger 6's after
        f.seek(200_000)
        b = f.read(1)
        f.seek(200_000)
        f.write(bytes([b[0] ^ 0x01]))
    bp.start(wait=False)
    try:  # before the change: it cut the segment and started, NO_ENTRY for 383 of the 500 entries
        rc = bp.wait_exit(30)
    except subprocess.TimeoutExpired:
        rc = None
    assert rc not in (None, 0), "the bookie started on a damaged journal"
    assert "not a torn tail" in bp.log_tail(40)
    assert seg.stat().st_size == size, "the damaged segment was cut"
