"""An operator's typing mistakes, without a cluster: a ZooKeeper connect string that does not parse."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ledgerstore import cli
from zk import MetadataStore, ZkConnectStringError


def test_a_connect_string_that_does_not_parse_is_a_usage_error() -> None:
    with pytest.raises(ZkConnectStringError, match="'127.0.0.1:2181x' is not a ZooKeeper connect string"):
        MetadataStore.connect("127.0.0.1:2181x", timeout_s=1.0)
    with pytest.raises(ValueError, match="is not a ZooKeeper connect string"):
        MetadataStore.connect("", timeout_s=1.0)
    for argv in (["--zk", "127.0.0.1:2181x", "ledger", "list"], ["--zk", "", "ledger", "read", "1"]):
        r = subprocess.run(
            [sys.executable, "-m", "ledgerstore.cli", *argv], capture_output=True, text=True, timeout=60
        )
        # was exit 1 "Port could not be cast to integer value as '2181x'", and 5 "bad hostname" for the ledger
        # commands (their client took it for an unreachable ZooKeeper)
        assert r.returncode == cli.EXIT_USAGE, r.stderr
        first = r.stderr.splitlines()[0]
        assert "is not a ZooKeeper connect string" in first and "--zk or $LEDGERSTORE_ZK" in first, r.stderr
        assert "Traceback" not in r.stderr


def test_autorecovery_always_tries_the_empty_password_the_brokers_ledgers_have() -> None:
    """`--password pw` (autorecovery serve, bookie decommission) and `--autorecovery-password pw` (bookie serve)
    replaced the empty password: the brokers' ledgers could not be opened, stayed marked, and a decommission
    never finished ("none of the configured passwords is the ledger's")."""
    from ledgerstore.autorecovery_cmd import autorecovery_config
    from ledgerstore.cli import build_parser

    parser = build_parser()
    serve = parser.parse_args(["autorecovery", "serve", "--password", "pw"])
    assert autorecovery_config(serve, in_bookie=False).passwords == (b"pw", b"")
    bookie = parser.parse_args(["bookie", "serve", "--data-dir", "/nowhere", "--autorecovery-password", "pw"])
    assert autorecovery_config(bookie, in_bookie=True).passwords == (b"pw", b"")
    bookie = parser.parse_args(["bookie", "serve", "--data-dir", "/nowhere", "--autorecovery-password", ""])
    assert autorecovery_config(bookie, in_bookie=True).passwords == (b"",)  # as `cluster up` gives it
