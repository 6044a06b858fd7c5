"""``--compaction-threshold-bytes`` and ``--compaction-monitor-interval-s``: Pulsar's defaults (0, off; 60 s), a
small interval settable (tests), and values that cannot work refused at start; the CLI's threshold sizes."""

from __future__ import annotations

import argparse

import pytest

from bookie.config_file import ConfigError
from ledgerstore.cli import CommandError
from ledgerstore.topic_cmd import parse_size
from topic_broker.admin import past_partition_limit
from topic_broker.main import add_serve_arguments, config_from_args


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    return p.parse_args(list(argv))


def test_defaults_are_pulsars_and_flags_are_taken() -> None:
    c = config_from_args(_args())
    assert (c.compaction_threshold_bytes, c.compaction_monitor_interval_s) == (0, 60.0)
    c = config_from_args(
        _args("--compaction-threshold-bytes", "104857600", "--compaction-monitor-interval-s", "0.5")
    )
    assert (c.compaction_threshold_bytes, c.compaction_monitor_interval_s) == (104857600, 0.5)
    assert (
        c.ttl_duration_default_s == 0
        and config_from_args(_args("--ttl-duration-default-s", "60")).ttl_duration_default_s == 60
    )
    assert c.max_partitions_per_topic == 1024  # docs/broker.md says why (Pulsar's 0 is no limit)
    assert config_from_args(_args("--max-partitions-per-topic", "0")).max_partitions_per_topic == 0


def test_a_partition_count_equal_to_the_limit_is_taken() -> None:
    """The create, grow and auto-creation checks' one rule: past the limit refused, the limit itself taken (a user
    asking for 1024 partitions of a 1024 limit gets them), 0 no limit."""
    assert [past_partition_limit(n, 4) for n in (1, 3, 4, 5, 2**31 - 1)] == [False, False, False, True, True]
    assert not past_partition_limit(2**31 - 1, 0)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (("--compaction-threshold-bytes", "-1"), "--compaction-threshold-bytes"),
        (("--compaction-monitor-interval-s", "0"), "--compaction-monitor-interval-s"),
        (("--compaction-monitor-interval-s", "-5"), "--compaction-monitor-interval-s"),
        (("--ttl-duration-default-s", "-1"), "--ttl-duration-default-s"),
        (("--ttl-duration-default-s", str(2**31)), "--ttl-duration-default-s"),
        (("--max-partitions-per-topic", "-1"), "--max-partitions-per-topic"),
        (("--max-partitions-per-topic", str(2**31)), "--max-partitions-per-topic"),
    ],
)
def test_values_that_cannot_work_are_refused(argv: tuple[str, ...], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        config_from_args(_args(*argv))


def test_threshold_sizes_as_pulsar_admin_writes_them() -> None:
    assert [parse_size(s) for s in ("0", "1500", "1k", "10M", "2g", "1T")] == [
        0, 1500, 1024, 10 * 1024**2, 2 * 1024**3, 1024**4,
    ]  # fmt: skip
    for bad in ("-1", "-1k", "ten", "", "1.5M", "M"):
        with pytest.raises(CommandError, match="--threshold"):
            parse_size(bad)
