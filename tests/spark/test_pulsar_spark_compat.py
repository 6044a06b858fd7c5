"""A job written for StreamNative's pulsar-spark runs unmodified on the ``topic`` source: ``format("pulsar")``
with ``service.url`` and ``admin.url`` only (the metadata store from the broker's
``/admin/v2/brokers/internal-configuration``), pulsar-spark's other option names mapped, accepted or refused
naming the option. One cluster (ZooKeeper, 3 bookies, one broker) for the module; unit tests of the mapping
need none."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark._pulsar_options import TOKEN_PLUGIN, parse_source_options, split_pulsar_options
from spark._topic_options import PULSAR_SPARK_OPTIONS, TopicOptionError
from tests.broker_testing import Brokers, module_cluster

TOPIC = "persistent://public/default/from-pulsar-spark"


def _native(**options: str) -> dict[str, str]:
    return split_pulsar_options(options).native


# --- the option mapping (no cluster) ----------------------------------------------------------------------------


def test_pulsar_spark_names_map_to_the_sources_own() -> None:
    p = split_pulsar_options(
        {
            "service.url": "pulsar://b1:6650,b2:6650",
            "admin.url": "http://b1:8080/",
            "topic": "t",
            "predefinedSubscription": "etl",
            "startingOffsets": "earliest",
            "pollTimeoutMs": "120000",
            "pulsar.client.authPluginClassName": TOKEN_PLUGIN,
            "pulsar.client.authParams": "token:abc.def",
            "pulsar.client.operationTimeoutMs": "30000",
            "pulsar.reader.receiverQueueSize": "1000",
        }
    )
    assert p.native == {"topic": "t", "subscriptionName": "etl", "startingOffsets": "earliest"}
    assert p.admin_url == "http://b1:8080" and p.token == "abc.def" and p.admin_token is None
    assert p.ignored == (
        "pollTimeoutMs",
        "pulsar.client.operationTimeoutMs",
        "pulsar.reader.receiverQueueSize",
    )


def test_an_unknown_option_names_the_pulsar_spark_options_taken_too() -> None:
    """An unknown option's message lists pulsar-spark's names beside the source's own and may name one as the
    option meant (it listed the source's own only: a job from pulsar-spark misspelling service.url was told
    zk, zkRoot, … and not that service.url is taken); each name listed is taken."""
    with pytest.raises(TopicOptionError, match="did you mean 'service.url'") as e:
        parse_source_options({"topic": "t", "serviceUrl": "pulsar://b:6650"}, streaming=True)
    assert e.value.option == "serviceurl"
    assert str(e.value).endswith(
        "; pulsar-spark's: service.url, admin.url, predefinedSubscription, pollTimeoutMs, "
        "allowDifferentTopicSchemas, pulsar.client.authPluginClassName, pulsar.client.authParams, "
        "pulsar.admin.authPluginClassName, pulsar.admin.authParams, pulsar.client.*, pulsar.reader.*, "
        "pulsar.admin.*, pulsar.producer.*"
    )
    assert "known options: zk, zkRoot," in str(e.value)
    taken = {
        "service.url": "pulsar://b:6650",
        "admin.url": "http://b:8080",
        "predefinedSubscription": "etl",
        "pollTimeoutMs": "1",
        "allowDifferentTopicSchemas": "true",
        "pulsar.client.authPluginClassName": TOKEN_PLUGIN,
        "pulsar.client.authParams": "token:a.b",
        "pulsar.admin.authPluginClassName": TOKEN_PLUGIN,
        "pulsar.admin.authParams": "token:a.b",
    }
    listed = {name.replace("*", "x") for name in PULSAR_SPARK_OPTIONS}
    assert listed == {*taken, "pulsar.client.x", "pulsar.reader.x", "pulsar.admin.x", "pulsar.producer.x"}
    options = {"topic": "t", **taken, **{n: "1" for n in listed - set(taken)}}
    assert split_pulsar_options(options).native == {"topic": "t", "subscriptionName": "etl"}


@pytest.mark.parametrize(
    "params",
    ['{"token": "abc.def"}', "token:abc.def", "abc.def", "file:<f>", "file://<f>", '{"file": "<f>"}'],
)
def test_the_token_forms_authentication_token_reads(params: str, tmp_path: Path) -> None:
    f = tmp_path / "t"
    f.write_text("abc.def\n")
    p = split_pulsar_options(
        {
            "topic": "t",
            "pulsar.client.authPluginClassName": TOKEN_PLUGIN,
            "pulsar.client.authParams": params.replace("<f>", str(f)),
        }
    )
    assert p.token == "abc.def" and p.ignored == ()


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"service.url": "localhost:6650"}, "service.url"),
        ({"admin.url": "pulsar://b:6650"}, "admin.url"),
        ({"subscriptionPrefix": "x"}, "subscriptionPrefix"),
        ({"topic.schema.class": "a.B"}, "topic.schema.class"),
        ({"predefinedSubscription": "a", "subscriptionName": "b"}, "predefinedSubscription"),
        ({"pollTimeoutMs": "soon"}, "pollTimeoutMs"),
        ({"allowDifferentTopicSchemas": "maybe"}, "allowDifferentTopicSchemas"),
        ({"pulsar.client.authParams": "token:a"}, "pulsar.client.authPluginClassName"),
        (
            {
                "pulsar.client.authPluginClassName": "org.apache.pulsar.client.impl.auth.AuthenticationTls",
                "pulsar.client.authParams": "tlsCertFile:/c,tlsKeyFile:/k",
            },
            "pulsar.client.authPluginClassName",
        ),
        (
            {"pulsar.client.authPluginClassName": TOKEN_PLUGIN, "pulsar.client.authParams": "{}"},
            "pulsar.client.authParams",
        ),
        (
            {
                "pulsar.client.authPluginClassName": TOKEN_PLUGIN,
                "pulsar.client.authParams": "token:a",
                "authTokenFile": "/x",
            },
            "pulsar.client.authParams",
        ),
        ({"startOptionKey": "x"}, "startoptionkey"),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_the_option(options: dict[str, str], option: str) -> None:
    with pytest.raises(TopicOptionError) as e:
        parse_source_options({"topic": "t", "zk": "127.0.0.1:1", **options}, streaming=False)
    assert e.value.option == option, e.value


def test_the_token_becomes_the_bookies_token_and_ignored_options_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    options = {
        "zk": "127.0.0.1:1",
        "topic": "t",
        "service.url": "pulsar://b:6650",
        "pulsar.client.authPluginClassName": TOKEN_PLUGIN,
        "pulsar.client.authParams": '{"token": "abc.def"}',
        "pulsar.reader.readerName": "r",
        "pulsar.admin.connectionTimeoutMs": "1000",
    }
    with caplog.at_level(logging.WARNING, logger="spark._pulsar_options"):
        opts = parse_source_options(options, streaming=True)
        parse_source_options(options, streaming=True)
    assert opts.auth_token == "abc.def" and opts.zk == "127.0.0.1:1"
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "pulsar.admin.connectionTimeoutMs, pulsar.reader.readerName" in warning, warning


# --- against a cluster ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def brokers(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    with module_cluster(zk_server, tmp_path_factory.mktemp("pulsar-spark")) as b:
        admin = f"http://127.0.0.1:{b.procs[0].http_port}"
        req = urllib.request.Request(
            admin + "/admin/v2/namespaces/public/default/retention",
            method="POST",
            data=json.dumps({"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=30).close()
        pulsar = pytest.importorskip("pulsar")
        client = pulsar.Client(b.procs[0].service_url, operation_timeout_seconds=15)
        try:
            producer = client.create_producer(TOPIC, batching_enabled=False)
            for i in range(30):
                producer.send(f"m-{i}".encode())
        finally:
            client.close()
        # the explicit LAC: the last entry is readable from the bookies (as in test_user_scenarios)
        time.sleep(1.5)
        yield b


def _pulsar_spark(b: Brokers) -> dict[str, str]:
    """What a pulsar-spark job gives: the service and admin URLs and the topic (no zk, no zkRoot)."""
    bp = b.procs[0]
    return {
        "service.url": bp.service_url,
        "admin.url": f"http://127.0.0.1:{bp.http_port}",
        "topic": TOPIC,
    }


def test_the_broker_answers_its_internal_configuration(brokers: Brokers) -> None:
    bp = brokers.procs[0]
    url = f"http://127.0.0.1:{bp.http_port}/admin/v2/brokers/internal-configuration"
    with urllib.request.urlopen(url, timeout=30) as r:
        body = json.loads(r.read())
    assert body == {
        "metadataStoreUrl": f"zk:{brokers.bookies.zk}",
        "configurationMetadataStoreUrl": f"zk:{brokers.bookies.zk}",
        "ledgersRootPath": f"{brokers.bookies.root}/ledgers",
        "bookkeeperMetadataServiceUri": None,
        "stateStorageServiceUrl": None,
    }
    opts = parse_source_options(_pulsar_spark(brokers), streaming=False)
    assert (opts.zk, opts.zk_root) == (brokers.bookies.zk, brokers.bookies.root)


def test_the_internal_configuration_is_a_superusers(brokers: Brokers, tmp_path: Path) -> None:
    """As Pulsar's: with authentication on, 401 without a token, 403 for a role not a superuser; the source
    sends pulsar-spark's token (client's or admin's) and names admin.url when refused."""
    from bookie.auth import create_token, new_secret

    secret = new_secret()
    (tmp_path / "secret").write_bytes(secret)
    (tmp_path / "secret").chmod(0o600)
    bp = brokers.start("--auth-secret-file", str(tmp_path / "secret"), "--superuser-roles", "admin")
    options = {**_pulsar_spark(brokers), "admin.url": f"http://127.0.0.1:{bp.http_port}"}
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{options['admin.url']}/admin/v2/brokers/internal-configuration", timeout=30)
    assert e.value.code == 401
    auth = {"pulsar.admin.authPluginClassName": TOKEN_PLUGIN}
    with pytest.raises(TopicOptionError, match="answered 403 .*superuser only") as refused:
        parse_source_options(
            {**options, **auth, "pulsar.admin.authParams": "token:" + create_token(secret, "spark")},
            streaming=False,
        )
    assert refused.value.option == "admin.url"
    opts = parse_source_options(
        {**options, **auth, "pulsar.admin.authParams": "token:" + create_token(secret, "admin")},
        streaming=False,
    )
    assert (opts.zk, opts.zk_root, opts.auth_token) == (brokers.bookies.zk, brokers.bookies.root, None)


def test_a_pulsar_spark_batch_read(spark: Any, brokers: Brokers) -> None:
    """``spark.read.format("pulsar")`` with pulsar-spark's options only reads the topic (before: no such
    source, and service.url an unknown option)."""
    df = spark.read.format("pulsar").options(**_pulsar_spark(brokers)).load()
    rows = df.select("value", "__topic").collect()
    assert sorted(r.value for r in rows) == sorted(f"m-{i}".encode() for i in range(30))
    assert {r["__topic"] for r in rows} == {TOPIC}


def test_a_pulsar_spark_available_now_stream(spark: Any, brokers: Brokers, tmp_path: Path) -> None:
    """``spark.readStream.format("pulsar")``, Trigger.AvailableNow, into a memory table: every message once, and
    the durable subscription ``predefinedSubscription`` names."""
    stream = spark.readStream.format("pulsar").options(
        **_pulsar_spark(brokers), startingOffsets="earliest", predefinedSubscription="etl"
    )
    writer = stream.load().writeStream.queryName("pulsar_spark_etl").format("memory")
    q = writer.option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
    try:
        q.awaitTermination(180)
    finally:
        q.stop()
    assert q.exception() is None
    got = spark.table("pulsar_spark_etl").select("value").collect()
    assert sorted(r.value for r in got) == sorted(f"m-{i}".encode() for i in range(30))
    stats = json.loads(
        urllib.request.urlopen(
            f"http://127.0.0.1:{brokers.procs[0].http_port}/admin/v2/persistent/public/default/"
            "from-pulsar-spark/stats",
            timeout=30,
        ).read()
    )
    assert "etl" in stats["subscriptions"], stats["subscriptions"]  # the query's durable subscription
