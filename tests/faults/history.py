"""History files of a fault run: one JSONL file per process, one JSON object per client operation event.

Every record has ``proc`` (who), ``t`` (``time.monotonic()``, comparable across processes on one Linux machine:
CLOCK_MONOTONIC is system-wide), ``op`` and usually ``phase`` (``invoke`` / ``ok`` / ``fail``) and ``ledger``.
Records are flushed to the kernel one by one, so a process killed at any instant leaves a valid prefix (a torn
last line is ignored by :func:`load_history`). Record kinds (see ``checker.py`` for what is checked):

=========  ======================================================================================================
op         fields
=========  ======================================================================================================
create     phase, ledger (ok), ensemble/write_quorum/ack_quorum, error (fail)
append     phase, ledger, op_id, digest + size (invoke), entry_id (ok), error (fail)
close      phase, ledger, last_entry_id (ok: the writer's LAC it closed with), error (fail)
recover    phase, ledger, last_entry_id (ok), error (fail)
read       ledger, entry_id, digest, handle (a successful read of one entry)
read_fail  ledger, first, last, error
lac        ledger, handle, lac (one read_last_add_confirmed observation of one reader handle)
zk_expire  phase (a forced ZooKeeper session expiry of this process's client)
fault      kind, target, phase (nemesis: ``start`` / ``end``)
=========  ======================================================================================================
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


class History:
    """Appends records to one JSONL file, flushed per record, fsynced on close."""

    def __init__(self, path: Path, proc: str) -> None:
        self.path = Path(path)
        self.proc = proc
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.count = 0

    def record(self, op: str, **fields: Any) -> dict[str, Any]:
        rec = {"proc": self.proc, "t": time.monotonic(), "op": op, **fields}
        self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self._f.flush()
        self.count += 1
        return rec

    def close(self) -> None:
        if self._f.closed:
            return
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line of a killed process


def load_history(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every record of every file, ordered by time."""
    out: list[dict[str, Any]] = []
    for p in paths:
        out.extend(read_jsonl(Path(p)))
    out.sort(key=lambda r: r.get("t", 0.0))
    return out
