"""A piece that fails to start names what its own process wrote, not the lines an earlier run left in the log
that ``cluster up`` appends to (a second ``cluster up`` on the same state directory)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ledgerstore.cluster import ServiceProcess


@dataclass
class _Failing(ServiceProcess):
    said: str
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return "127.0.0.1:1"

    def command(self) -> list[str]:
        return [sys.executable, "-c", f"import sys; print({self.said!r}); sys.exit(3)"]

    def ready(self) -> bool:
        return False


def test_a_failed_start_reports_only_its_own_log_lines(tmp_path: Path) -> None:
    log = tmp_path / "bookie-0.log"
    log.write_text("".join(f"INFO an earlier run's line {i}\n" for i in range(30)))
    piece = _Failing("ERROR refusing to start: cookie mismatch")
    piece._spawn(log)
    with pytest.raises(RuntimeError) as e:
        piece.wait_ready(timeout_s=30)
    assert str(e.value) == "process 127.0.0.1:1 exited with 3: ERROR refusing to start: cookie mismatch"
    assert "earlier run" in piece.log_tail(40)  # the whole log is still there for whoever reads it


def test_bookie_recover_counts_one_entry_in_the_singular() -> None:
    from types import SimpleNamespace

    from ledgerstore.bookie_admin import recover_line

    one = SimpleNamespace(status="done", ledger_id=10, entries_copied=1, replacements={0: "127.0.0.1:3184"})
    assert recover_line(one) == "  ledger 10: 1 entry copied; ensemble 0 -> 127.0.0.1:3184"
    two = SimpleNamespace(
        status="planned", ledger_id=2, entries_copied=67, replacements={0: "127.0.0.1:3184"}
    )
    assert recover_line(two) == "  ledger 2: 67 entries to copy; ensemble 0 -> 127.0.0.1:3184"
