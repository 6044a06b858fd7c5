"""glibc malloc settings for the bookie process: freed memory kept for reuse instead of given back at once.

The add path allocates and frees large blocks all the time: each wave of adds makes a journal record of the
entries joined (hundreds of KiB), storage runs of up to 64 entries (~64 KiB each), RocksDB write batches, and
the memtables' 8 MiB arena blocks, freed after each flush. With glibc's defaults a block above the mmap
threshold (128 KiB, then adapting upwards to the largest block freed), or free space above the trim threshold
(twice that) at the top of the heap, goes back to the kernel when freed (``M_MMAP_THRESHOLD``,
``M_TRIM_THRESHOLD``). The next wave or memtable then takes the same memory back page by page: a page fault and
a zeroed page for every 4 KiB. With these settings a bookie under waves of adds spends less CPU per entry, the
kernel's share most (docs/benchmarks-history.md, "Bookie CPU per entry: the malloc thresholds and replies by
column, adopted").

``tune()`` fixes both thresholds: blocks up to ``MMAP_THRESHOLD`` come from the heap, and up to
``TRIM_THRESHOLD`` of free space stays in it, so the process's resident size can stay that much higher after a
burst. A ``GLIBC_TUNABLES`` variable that sets malloc tunables already wins: nothing is changed then."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger(__name__)

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

# glibc's bound; RocksDB's memtable arena blocks (8 MiB) come from the heap too
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 128 * 1024 * 1024  # two of the default 64 MiB memtables


def settings_from_env(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Whether the environment already sets glibc malloc tunables (then ``tune`` leaves malloc alone)."""
    return "glibc.malloc." in environ.get("GLIBC_TUNABLES", "")


def tune(environ: dict[str, str] | os._Environ[str] | None = None) -> bool:
    """Set the thresholds on glibc (Linux); whether they were set. Elsewhere, or with malloc tunables in
    ``GLIBC_TUNABLES``, does nothing."""
    if not sys.platform.startswith("linux"):
        return False
    if settings_from_env(os.environ if environ is None else environ):
        log.info("malloc: GLIBC_TUNABLES sets malloc tunables; the bookie's thresholds are not applied")
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt thresholds)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # (the mmap threshold first: setting it turns glibc's adaptive thresholds off)
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not ok:
        log.warning("malloc: mallopt refused the thresholds; glibc's defaults stay")
    return ok
