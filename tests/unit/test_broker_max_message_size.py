"""``--max-message-size``: one message (or chunk) is one ledger entry, so the broker refuses a larger limit."""

from __future__ import annotations

import argparse

import pytest

from bookie.config_file import ConfigError
from topic_broker import wire
from topic_broker.main import add_serve_arguments, config_from_args


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    return p.parse_args(list(argv))


def test_the_default_and_smaller_limits_are_taken() -> None:
    assert config_from_args(_args()).max_message_size == wire.DEFAULT_MAX_MESSAGE_SIZE
    assert config_from_args(_args("--max-message-size", "1048576")).max_message_size == 1048576


@pytest.mark.parametrize("size", [0, wire.DEFAULT_MAX_MESSAGE_SIZE + 1, 10 * 1024 * 1024])
def test_a_limit_no_ledger_entry_could_hold_is_a_configuration_error(size: int) -> None:
    with pytest.raises(ConfigError, match="--max-message-size"):
        config_from_args(_args("--max-message-size", str(size)))
