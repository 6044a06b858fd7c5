"""Tests for the bugs planted in the audit of 1eb8e2e..ad7e892 (docs/architecture.md §11) that the tests of the
time let through: each fails with its bug planted and passes without it. Pure logic and in-process pieces."""

from __future__ import annotations

from pathlib import Path

import pytest

from bookie.auth import new_secret
from bookie.config_file import ConfigError
from ledgerstore.cli import build_parser


def test_broker_serve_refuses_a_previous_secret_without_a_secret(tmp_path: Path) -> None:
    """Given alone, the previous secret checks nothing (no token is checked without --auth-secret-file): the
    operator believes the rotation's old tokens are taken and no token is looked at. Refused, as bookie serve
    refuses it. Planted: the check dropped (the broker started, the flag ignored)."""
    from topic_broker.main import config_from_args

    old = tmp_path / "old"
    old.write_bytes(new_secret())
    old.chmod(0o600)
    args = build_parser().parse_args(["broker", "serve", "--auth-previous-secret-file", str(old)])
    with pytest.raises(ConfigError, match="--auth-previous-secret-file needs --auth-secret-file"):
        config_from_args(args)
