"""The commands `ledgerstore demo` suggests at its end can be typed as printed: they parse, and they name the
cluster the demo ran on when it is not the default one."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import pytest

from ledgerstore import demo
from ledgerstore.cli import build_parser, normalise_argv


def _parse(line: str) -> argparse.Namespace:
    words = shlex.split(line.split("   (")[0])
    assert words[0].endswith("ledgerstore"), line
    return build_parser().parse_args(normalise_argv(words[1:]))


def test_default_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["ledgerstore"])
    args = argparse.Namespace(zk_root="/ledgerstore", state_dir=Path(".ledgerstore"))
    lines = demo.next_steps(
        args, "127.0.0.1:2181", 7, "http://127.0.0.1:8080", "persistent://public/default/d"
    )
    assert lines[-1].startswith("make cluster-down")
    parsed = [_parse(line) for line in lines[:-1]]
    assert [p.command for p in parsed] == ["ledger", "ledger", "ledger", "topic", "topic"]
    assert not any("--zk" in line or "--url" in line for line in lines), lines  # the defaults need none
    assert parsed[1].ledger_id == 7 and parsed[2].password == "demo"


def test_a_cluster_on_other_ports_is_named_in_every_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    venv_ls = tmp_path / ".venv" / "bin" / "ledgerstore"  # not on PATH: printed as the path it was run by
    monkeypatch.setattr(sys, "argv", [str(venv_ls)])
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(zk_root="/other", state_dir=tmp_path / "state")
    lines = demo.next_steps(args, "127.0.0.1:35181", 3, "http://127.0.0.1:35080", None)
    assert all(line.startswith(".venv/bin/ledgerstore ") for line in lines), lines
    for line in lines[:3]:
        p = _parse(line)
        assert (p.zk, p.zk_root) == ("127.0.0.1:35181", "/other")
    for line in lines[3:5]:
        assert _parse(line).url == "http://127.0.0.1:35080"
    p = _parse(lines[-1])
    assert (p.command, p.action, p.state_dir) == ("cluster", "down", tmp_path / "state")
