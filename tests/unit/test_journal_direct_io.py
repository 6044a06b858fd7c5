"""The journal's O_DIRECT writes (bookie/journal.py, "Direct I/O"): used where they can be, the same records on
disk either way, and a filesystem that refuses them costs nothing but the page cache."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
from pathlib import Path

import pytest

import bookie.journal as journal_mod
from bookie.journal import Journal, JournalRecord, RecordType
from bookie.storage import _supports_direct_io

from .test_journal import append_all, open_journal, segments

pytestmark = pytest.mark.skipif(
    not _supports_direct_io(Path(os.environ.get("TMPDIR", "/tmp"))),
    reason="a filesystem without O_DIRECT",
)


def _records(n: int, size: int = 1000) -> list[JournalRecord]:
    return [
        JournalRecord(type=RecordType.ENTRY, ledger_id=7, entry_id=i, data=os.urandom(size - i % 5))
        for i in range(n)
    ]


def _run(directory: Path, records: list[JournalRecord], **kw: object) -> dict[str, float]:
    async def main() -> dict[str, float]:
        j = await open_journal(directory, **kw)
        assert await append_all(j, records, chunk=3) == [None] * len(records)
        await j.close()
        return dict(j.stats)

    return asyncio.run(main())


def _replayed(directory: Path) -> list[JournalRecord]:
    return list(Journal(directory).replay())


def test_aligned_batches_are_written_with_o_direct_and_replay_the_same_as_buffered(tmp_path: Path) -> None:
    records = _records(300)
    direct = _run(tmp_path / "direct", records)
    buffered = _run(tmp_path / "buffered", records, direct_io=False)
    # every batch but each segment's first starts on a page boundary
    assert direct["direct_writes"] >= direct["syncs"] - 1 > 0
    assert buffered["direct_writes"] == 0
    assert _replayed(tmp_path / "direct") == _replayed(tmp_path / "buffered") == records
    seg_d, seg_b = segments(tmp_path / "direct")[-1], segments(tmp_path / "buffered")[-1]
    assert seg_d.read_bytes() == seg_b.read_bytes()  # byte for byte the same file


def test_segments_rotate_and_preallocate_through_direct_io(tmp_path: Path) -> None:
    records = _records(400, size=3000)
    stats = _run(tmp_path, records, segment_bytes=256 * 1024, preallocate_bytes=64 * 1024)
    assert len(segments(tmp_path)) > 2 and stats["direct_writes"] > 0
    assert _replayed(tmp_path) == records


def test_pages_kept_in_the_cache_on_request_means_no_direct_io(tmp_path: Path) -> None:
    stats = _run(tmp_path, _records(50), remove_pages_from_cache=False)
    assert stats["direct_writes"] == 0


def test_o_direct_refused_with_einval_falls_back_to_the_page_cache_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwrite
    refused: list[int] = []

    def pwrite(fd: int, data: object, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & journal_mod._O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, offset)  # type: ignore[arg-type]

    monkeypatch.setattr(journal_mod.os, "pwrite", pwrite)
    records = _records(100)
    stats = _run(tmp_path, records, preallocate_bytes=0)
    assert len(refused) == 1  # refused once, then never tried again
    assert stats["direct_writes"] == 0
    assert _replayed(tmp_path) == records


def test_o_direct_refused_while_writing_zeros_ahead_falls_back_like_a_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The zeros written ahead are the first O_DIRECT write of a segment (its first batch is not page-aligned):
    refused there with EINVAL, they are written through the page cache, direct I/O is off for good (one
    warning), and the journal appends, syncs and replays as before."""
    real = os.pwrite
    refused: list[bool] = []  # per refused write: was it zeros (a preallocation), not a batch

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & journal_mod._O_DIRECT:
            refused.append(not any(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, offset)

    monkeypatch.setattr(journal_mod.os, "pwrite", pwrite)
    records = _records(200)
    with caplog.at_level("WARNING", logger=journal_mod.logger.name):
        stats = _run(tmp_path, records, preallocate_bytes=256 * 1024)
    assert refused == [True]  # refused once, on the zeros, then never tried again
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "O_DIRECT writes refused" in warnings[0], warnings
    assert stats["preallocations"] >= 1 and stats["preallocated_bytes"] >= 256 * 1024
    assert stats["direct_writes"] == 0 and stats["syncs"] > 1 and stats["failed_syncs"] == 0
    assert _replayed(tmp_path) == records
