"""The broker's managed-ledger password: from --managed-ledger-password-file (first line) before the flag, and a
clear configuration error for a missing or empty file."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bookie.config_file import ConfigError
from topic_broker.main import add_serve_arguments, config_from_args


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    return p.parse_args(list(argv))


def test_the_password_file_wins_over_the_flag_and_only_its_first_line_counts(tmp_path: Path) -> None:
    f = tmp_path / "pw"
    f.write_text("from-file\nnot this\n")
    args = _args("--managed-ledger-password", "from-flag", "--managed-ledger-password-file", str(f))
    assert config_from_args(args).managed_ledger_password == b"from-file"
    assert (
        config_from_args(_args("--managed-ledger-password", "from-flag")).managed_ledger_password
        == b"from-flag"
    )
    assert config_from_args(_args()).managed_ledger_password == b""


@pytest.mark.parametrize("content", [None, "", "\nsecond line\n"])
def test_a_missing_or_empty_password_file_is_a_configuration_error(
    tmp_path: Path, content: str | None
) -> None:
    f = tmp_path / "pw"
    if content is not None:
        f.write_text(content)
    with pytest.raises(ConfigError, match="--managed-ledger-password-file"):
        config_from_args(_args("--managed-ledger-password-file", str(f)))
