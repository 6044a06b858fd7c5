"""Tests for the bugs planted in the audit of 2026-11-29 against b698ba9 that the tests of the time let through
(docs/architecture.md §11): each fails with its bug planted and passes without it. pulsar-spark's options of
the topic source: one without a cluster, one against a broker with authentication (the module cluster of
``test_pulsar_spark_compat``)."""

from __future__ import annotations

from pathlib import Path

from spark._pulsar_options import TOKEN_PLUGIN, parse_source_options
from tests.broker_testing import Brokers
from tests.spark.test_pulsar_spark_compat import _pulsar_spark, brokers

__all__ = ["brokers"]  # the module cluster, used by name


def test_a_zk_given_wins_over_admin_url_which_is_not_asked() -> None:
    """With ``zk`` given, ``admin.url`` is not asked for the metadata store (here nothing listens there): the
    source reads the ZooKeeper it was given."""
    options = {"zk": "127.0.0.1:2", "zkRoot": "/mine", "topic": "t", "admin.url": "http://127.0.0.1:1"}
    opts = parse_source_options(options, streaming=False)
    assert (opts.zk, opts.zk_root) == ("127.0.0.1:2", "/mine")


def test_the_admin_token_is_the_one_sent_to_admin_url(brokers: Brokers, tmp_path: Path) -> None:
    """``pulsar.admin.authParams``' token goes to ``admin.url`` where ``pulsar.client.authParams`` gives
    another (the bookies'): a broker whose superuser is the admin's role answers, and the bookies' token stays
    the client's."""
    from bookie.auth import create_token, new_secret

    secret = new_secret()
    (tmp_path / "secret").write_bytes(secret)
    (tmp_path / "secret").chmod(0o600)
    bp = brokers.start("--auth-secret-file", str(tmp_path / "secret"), "--superuser-roles", "admin")
    client_token = create_token(secret, "spark")
    options = {
        **_pulsar_spark(brokers),
        "admin.url": f"http://127.0.0.1:{bp.http_port}",
        "pulsar.client.authPluginClassName": TOKEN_PLUGIN,
        "pulsar.client.authParams": "token:" + client_token,
        "pulsar.admin.authPluginClassName": TOKEN_PLUGIN,
        "pulsar.admin.authParams": "token:" + create_token(secret, "admin"),
    }
    opts = parse_source_options(options, streaming=False)
    assert (opts.zk, opts.zk_root, opts.auth_token) == (
        brokers.bookies.zk,
        brokers.bookies.root,
        client_token,
    )
