"""bookie/malloc.py: the bookie's glibc malloc thresholds (in a child process: they are process-wide)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from bookie import malloc

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")

# A child that tunes malloc (or not), then fills and frees 64 MiB in 8 MiB blocks over and over, as RocksDB's
# memtables (8 MiB arena blocks) are filled and freed after each flush, and prints how many minor page faults
# the rounds after the first two took.
_CHILD = textwrap.dedent(
    """
    import resource, sys
    from bookie import malloc
    tuned = malloc.tune() if sys.argv[1] == "tune" else False
    for _ in range(2):  # warm up (the first rounds fault in whatever they take)
        blocks = [bytearray(8 << 20) for _ in range(8)]
        del blocks
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        blocks = [bytearray(8 << 20) for _ in range(8)]
        del blocks
    print(int(tuned), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _child(mode: str, env: dict[str, str] | None = None) -> tuple[bool, int]:
    run_env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    run_env.update(env or {})
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    return out[0] == "1", int(out[1])


def test_tunables_in_the_environment_win() -> None:
    assert malloc.settings_from_env({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"})
    assert malloc.settings_from_env(
        {"GLIBC_TUNABLES": "glibc.cpu.x86_shstk=on:glibc.malloc.mmap_threshold=9"}
    )
    assert not malloc.settings_from_env({"GLIBC_TUNABLES": "glibc.cpu.x86_shstk=on"})
    assert not malloc.settings_from_env({})
    assert not malloc.tune({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"})


@linux_only
def test_tuned_process_reuses_freed_memory() -> None:
    """Untuned, every wave gives its blocks back and faults them in again; tuned, the heap keeps them."""
    tuned, tuned_faults = _child("tune")
    untuned, untuned_faults = _child("plain")
    assert tuned and not untuned
    # untuned, each round's 64 MiB is given back when freed and faulted in again (16,384 pages a round);
    # tuned, the heap keeps it
    assert untuned_faults > 10 * 8000
    assert tuned_faults < untuned_faults / 20


@linux_only
def test_environment_tunables_leave_malloc_alone() -> None:
    tuned, _ = _child("tune", {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"})
    assert not tuned
