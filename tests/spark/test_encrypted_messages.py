"""The ``topic`` source on end-to-end encrypted messages, which it cannot decrypt (it holds no keys):
``cryptoFailureAction`` as Pulsar's consumers have it. FAIL (the default) fails the query naming the entry and
the option, DISCARD skips them, CONSUME gives each encrypted entry as one row holding its payload as stored. Before
the option, an encrypted compressed message or batch failed the query as "malformed" and an encrypted plain
message came out as ciphertext in ``value``, as if it were the message. The module's cluster is
``test_user_scenarios``'."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from spark._topic_options import TopicOptionError, parse_topic_options
from tests.spark import test_user_scenarios as users
from tests.spark.test_user_scenarios import Cluster

pulsar = pytest.importorskip("pulsar")
cluster = users.cluster


def test_crypto_failure_action_takes_pulsars_names_and_refuses_others() -> None:
    base = {"zk": "127.0.0.1:2181", "topic": "t"}
    assert parse_topic_options(base, streaming=False).crypto_failure_action == "FAIL"
    for given, want in (("discard", "DISCARD"), ("Consume", "CONSUME"), ("FAIL", "FAIL")):
        opts = parse_topic_options({**base, "cryptoFailureAction": given}, streaming=False)
        assert opts.crypto_failure_action == want
    with pytest.raises(TopicOptionError, match="cryptoFailureAction.*FAIL, DISCARD, CONSUME, got 'decrypt'"):
        parse_topic_options({**base, "cryptoFailureAction": "decrypt"}, streaming=False)


def _key_reader(where: Path) -> Any:
    private, public = where / "k.pem", where / "k.pub.pem"
    subprocess.run(["openssl", "genrsa", "-out", str(private), "2048"], check=True, capture_output=True)
    subprocess.run(
        ["openssl", "rsa", "-in", str(private), "-pubout", "-out", str(public)],
        check=True,
        capture_output=True,
    )
    return pulsar.CryptoKeyReader(str(public), str(private))


def test_encrypted_messages_fail_the_query_by_default_or_are_skipped_or_given_as_stored(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    """Two plain messages, an encrypted single message, an encrypted LZ4 message and an encrypted batch of 3."""
    from pyspark.errors import PythonException

    topic = "persistent://public/default/spark-encrypted"
    client = cluster.client()
    try:
        keys = _key_reader(tmp_path)
        plain = client.create_producer(topic, batching_enabled=False)
        plain.send(b"plain-0")
        enc = client.create_producer(
            topic, encryption_key="app-key", crypto_key_reader=keys, batching_enabled=False
        )
        enc.send(b"secret-single", partition_key="k1")
        lz4 = client.create_producer(
            topic,
            encryption_key="app-key",
            crypto_key_reader=keys,
            batching_enabled=False,
            compression_type=pulsar.CompressionType.LZ4,
        )
        lz4.send(b"secret-lz4" * 20)
        batched = client.create_producer(
            topic,
            encryption_key="app-key",
            crypto_key_reader=keys,
            batching_enabled=True,
            batching_max_messages=3,
            batching_max_publish_delay_ms=60_000,
        )
        for i in range(3):
            batched.send_async(f"secret-batch-{i}".encode(), None)
        batched.flush()
        plain.send(b"plain-1")
    finally:
        client.close()

    with pytest.raises(PythonException) as failed:
        cluster.read(spark, topic=topic).collect()
    assert "is end-to-end encrypted (keys: app-key)" in str(failed.value)
    assert "cryptoFailureAction=DISCARD" in str(failed.value)

    rows = cluster.read(spark, topic=topic, cryptoFailureAction="DISCARD").collect()
    assert [bytes(r.value) for r in rows] == [b"plain-0", b"plain-1"]

    rows = cluster.read(spark, topic=topic, cryptoFailureAction="CONSUME").orderBy("__entryId").collect()
    assert len(rows) == 5  # one row per entry: the batch whole
    values = [bytes(r.value) for r in rows]
    assert values[0] == b"plain-0" and values[4] == b"plain-1"
    for r, secret in zip(rows[1:4], (b"secret-single", b"secret-lz4", b"secret-batch-0"), strict=True):
        assert secret not in bytes(r.value)  # ciphertext, never mistaken for the message
        assert r["__batchIndex"] == -1
    assert rows[1]["__key"] == "k1"
