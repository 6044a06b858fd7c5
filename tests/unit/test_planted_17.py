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


def test_the_out_of_descriptors_warning_comes_while_a_few_are_left() -> None:
    """OpenFilesWatch warns once fewer than OPEN_FILES_SPARE descriptors are left under the soft limit, while the
    server still accepts connections, not only once none is left. Run in a child process whose limit is lowered.
    Planted: the spare ignored (no warning until the last descriptor was taken)."""
    import subprocess
    import sys

    child = """
import logging, os, resource, sys
from bookie.server_gate import OPEN_FILES_SPARE, OpenFilesWatch
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(levelname)s %(message)s")
used = len(os.listdir("/proc/self/fd"))
soft = used + 40
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = [open(os.devnull) for _ in range(40 - OPEN_FILES_SPARE // 2)]
print("used", OpenFilesWatch("bookie=b1").check(), "of", soft)
"""
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    warned = [line for line in r.stdout.splitlines() if line.startswith("WARNING bookie=b1: ")]
    assert len(warned) == 1 and "open files in use" in warned[0], r.stdout


def test_zookeeper_said_out_of_space_only_for_the_start_that_failed_so(tmp_path: Path) -> None:
    """A ZooKeeper that exits at start is said to have a full data directory only when its log says so since
    this start (the launcher marks each start in the log): a full disk of an earlier start, since freed, is not
    blamed for a later start's other failure. Planted: the whole tail of the log read."""
    from zk.launcher import _startup_cause

    log = tmp_path / "zookeeper.log"
    log.write_text(
        "--- starting ZooKeeper on port 2181: java ...\n"
        "java.io.IOException: No space left on device\n"
        "--- starting ZooKeeper on port 2181: java ...\n"
        "java.net.BindException: Address already in use\n"
    )
    assert _startup_cause(log, tmp_path) == ""
    with log.open("a") as f:
        f.write(
            "--- starting ZooKeeper on port 2181: java ...\njava.io.IOException: No space left on device\n"
        )
    assert _startup_cause(log, tmp_path).startswith(": no space left on device in its data directory")
