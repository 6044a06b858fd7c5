"""The ``ledger`` and ``topic`` sources against a secured cluster (docs/operations.md, "Security"): bookies with
``--auth-secret-file --auth-required``, ZooKeeper digest ACLs, a broker requiring tokens. The query names its
credentials' files with options ``authTokenFile`` and ``zkAuthFile``: a cluster's executors and the Python
workers planning a query have no credentials in their environment unless the job passes them on, and the
environment holds none for this cluster (the fixture clears this process's own), so the options are the only
way in. A missing or wrong credential fails the query when it is
planned, naming the option."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bookie.auth import create_token, new_secret
from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import start_broker
from tests.conftest import BookieFactory
from tests.spark.test_user_scenarios import Cluster
from tests.zk_testing import TEST_ZK_AUTH, unique_root
from zk.acl import ENV_AUTH_FILE

pulsar = pytest.importorskip("pulsar")

#: ledgerstore's credentials in the environment (docs/operations.md, "Security"): the container tier's session
#: fixtures leave some in this process for their own cluster.
CREDENTIAL_VARS = (
    "LEDGERSTORE_ZK_AUTH",
    ENV_AUTH_FILE,
    "LEDGERSTORE_AUTH_TOKEN",
    "LEDGERSTORE_AUTH_TOKEN_FILE",
)

N = 50
BASE = "secured"


@dataclass
class Secured:
    bookies: BookieFactory
    broker: BrokerProcess
    admin_token: str
    files: dict[str, str]  # name -> path: token, zk, bad-token, bad-zk

    def options(self, **extra: str) -> dict[str, str]:
        return {"zk": self.bookies.zk, "zkRoot": self.bookies.root, **extra}

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        """The broker's admin REST with the superuser's token."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.broker.http_port}/admin/v2/{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.admin_token}"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read()
            return json.loads(text) if text else None


def _secret_file(path: Path, text: str | bytes) -> str:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def secured(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    # None of this process's own credentials (the container tier's session sets some) reach this cluster.
    with pytest.MonkeyPatch.context() as mp:
        for var in CREDENTIAL_VARS:
            mp.delenv(var, raising=False)
        yield from _secured(zk_server, tmp_path_factory)


def _secured(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    tmp = tmp_path_factory.mktemp("secured")
    secret = new_secret()
    files = {
        "secret": _secret_file(tmp / "token-secret", secret),
        "token": _secret_file(tmp / "spark.token", create_token(secret, "spark", expires_in_s=3600)),
        "broker": _secret_file(tmp / "broker.token", create_token(secret, "broker")),
        "zk": _secret_file(tmp / "zk-auth", TEST_ZK_AUTH.credential),
        "bad-token": _secret_file(tmp / "bad.token", create_token(new_secret(), "spark", expires_in_s=3600)),
        "bad-zk": _secret_file(tmp / "bad-zk-auth", f"{TEST_ZK_AUTH.user}:not-the-password"),
    }
    admin = create_token(secret, "admin", expires_in_s=3600)
    bookies = BookieFactory(zk_server.connect_string, unique_root(), tmp)
    secured_args = ["--auth-secret-file", files["secret"], "--auth-required"]
    broker_args = [*secured_args, "--superuser-roles", "admin", "--bookie-auth-token-file", files["broker"]]
    with pytest.MonkeyPatch.context() as mp:  # the cluster's processes only: they inherit it
        mp.setenv(ENV_AUTH_FILE, files["zk"])
        bookies.start_many(3, *secured_args)
        rollover = ["--max-entries-per-ledger", "20", "--min-rollover-time-s", "0"]
        broker = start_broker(bookies, tmp, 10.0, *broker_args, *rollover)
    c = Secured(bookies, broker, admin, files)
    try:
        broker.wait_ready(60)
        c.admin(
            "POST",
            "namespaces/public/default/retention",
            {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1},
        )
        client = pulsar.Client(
            broker.service_url,
            authentication=pulsar.AuthenticationToken(admin),
            operation_timeout_seconds=15,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
        try:
            producer = client.create_producer(f"persistent://public/default/{BASE}", batching_enabled=False)
            for i in range(N):
                producer.send(f"m{i}".encode())
        finally:
            client.close()
        yield c
    finally:
        with contextlib.suppress(Exception):
            broker.stop()
        bookies.stop_all()


def test_a_query_reads_a_secured_cluster_with_its_credentials_files(
    secured: Secured, spark: Any, tmp_path: Path
) -> None:
    """Batch reads of the ledgers and the topic (closed ledgers read by the executors, the open one planned
    from its bookies), and an AvailableNow stream whose commits move its durable subscription in ZooKeeper."""
    creds = {"authTokenFile": secured.files["token"], "zkAuthFile": secured.files["zk"]}
    deadline = time.monotonic() + 30
    while True:  # the last messages are readable once the broker's explicit LAC reached the bookies
        values = {
            bytes(r["value"])
            for r in spark.read.format("topic")
            .options(**secured.options(topic=BASE, **creds))
            .load()
            .collect()
        }
        if len(values) >= N or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert values == {f"m{i}".encode() for i in range(N)}
    data = [
        bytes(r["data"])
        for r in spark.read.format("ledger").options(**secured.options(**creds)).load().collect()
    ]
    assert all(any(d.endswith(f"m{i}".encode()) for d in data) for i in range(N))  # the broker's entries

    stream = Cluster(
        secured.bookies, secured.broker
    )  # its AvailableNow run to parquet, here with credentials
    opts = {"topic": BASE, "subscriptionName": "secured-q", "maxEntriesPerTrigger": "20", **creds}
    assert stream.available_now(spark, tmp_path, **opts) == N
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(bytes(r["value"]) for r in rows) == sorted(f"m{i}".encode() for i in range(N))
    assert (
        secured.admin("GET", f"persistent/public/default/{BASE}/stats")["subscriptions"]["secured-q"][
            "msgBacklog"
        ]
        == 0
    )


NOTHING: dict[str, str] = {}
WRONG_ZK = {"zkAuthFile": "bad-zk", "authTokenFile": "token"}
NO_TOKEN = {"zkAuthFile": "zk"}
WRONG_TOKEN = {"zkAuthFile": "zk", "authTokenFile": "bad-token"}


@pytest.mark.parametrize(
    ("source", "given", "named"),
    [
        ("ledger", NOTHING, "zkAuthFile"),
        ("ledger", WRONG_ZK, "zkAuthFile"),
        ("ledger", NO_TOKEN, "authTokenFile"),
        ("ledger", WRONG_TOKEN, "authTokenFile"),
        ("topic", WRONG_ZK, "zkAuthFile"),
        ("topic", NO_TOKEN, "authTokenFile"),
        ("stream", NOTHING, "zkAuthFile"),
        ("stream", WRONG_TOKEN, "authTokenFile"),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items()) or "none",
)
def test_a_missing_or_wrong_credential_fails_the_query_when_planned_naming_the_option(
    secured: Secured, spark: Any, tmp_path: Path, source: str, given: dict[str, str], named: str
) -> None:
    opts = secured.options(**{k: secured.files[v] for k, v in given.items()})
    if source == "stream":
        q = (
            spark.readStream.format("topic")
            .options(**opts, topic=BASE, startingOffsets="earliest")
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(Exception) as caught:
            try:
                q.awaitTermination(120)
            finally:
                q.stop()
        error = str(caught.value)
    else:
        extra = {"topic": BASE} if source == "topic" else {}
        with pytest.raises(Exception) as caught:
            spark.read.format(source).options(**opts, **extra).load().count()
        error = str(caught.value)
    kind = "ledger" if source == "ledger" else "topic"
    assert f"{kind} source option '{named}'" in error, error
