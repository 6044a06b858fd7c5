"""docker/compose.yaml as users run it: host mode (LEDGERSTORE_ADVERTISED_HOST=127.0.0.1), the broker service
reached by ``pulsar-client`` from the host, and the broker's own lookup pointing at 127.0.0.1. Every bookie runs
with the settings of the mounted docker/bookie.toml and the broker with docker/broker.toml.

A project of its own (``ls-compose-<random>``) on free ports (ZK_PORT, BOOKIEi_PORT, BOOKIEi_HTTP_PORT,
BROKER_PORT, BROKER_HTTP_PORT), so a cluster the user runs with the defaults is left alone; ``down -v`` removes
everything. Skipped without `docker compose` or `docker-compose`.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ledgerstore.docker_cluster import answers_health

from .conftest import (
    BOOKIE_CONFIG,
    BROKER_CONFIG,
    REPO_ROOT,
    assert_runs_with_config,
    free_port,
    wait_until,
)

pulsar = pytest.importorskip("pulsar", reason="pulsar-client is not installed (pip install '.[pulsar]')")

pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(300)]

COMPOSE_FILE = REPO_ROOT / "docker" / "compose.yaml"
UP_TIMEOUT_S = 180


def compose_cli() -> list[str]:
    from ledgerstore.cli import CommandError
    from ledgerstore.docker_cluster import compose_command

    try:
        return compose_command()
    except CommandError as exc:
        pytest.skip(str(exc))


@pytest.fixture
def compose_project(ledgerstore_images: tuple[str, str]) -> Iterator[tuple[list[str], dict[str, str]]]:
    app_image, zk_image = ledgerstore_images
    project = f"ls-compose-{uuid.uuid4().hex[:8]}"
    cmd = [*compose_cli(), "-p", project, "-f", str(COMPOSE_FILE)]
    env = {
        **os.environ,
        "LEDGERSTORE_ADVERTISED_HOST": "127.0.0.1",
        "LEDGERSTORE_IMAGE": app_image,
        "ZOOKEEPER_IMAGE": zk_image,
        "ZK_PORT": str(free_port()),
        "BROKER_PORT": str(free_port()),
        "BROKER_HTTP_PORT": str(free_port()),
        **{f"BOOKIE{i}_PORT": str(free_port()) for i in range(3)},
        **{f"BOOKIE{i}_HTTP_PORT": str(free_port()) for i in range(3)},
    }
    try:
        yield cmd, env
    finally:
        subprocess.run([*cmd, "down", "-v", "--timeout", "5"], env=env, capture_output=True, timeout=120)


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_compose_broker_serves_a_pulsar_client_on_the_host(
    compose_project: tuple[list[str], dict[str, str]],
) -> None:
    cmd, env = compose_project
    up = subprocess.run([*cmd, "up", "-d"], env=env, capture_output=True, text=True, timeout=UP_TIMEOUT_S)
    assert up.returncode == 0, f"compose up failed:\n{up.stdout[-2000:]}\n{up.stderr[-2000:]}"
    admin = f"http://127.0.0.1:{env['BROKER_HTTP_PORT']}"

    def logs() -> str:
        r = subprocess.run(
            [*cmd, "logs", "--tail", "40"], env=env, capture_output=True, text=True, timeout=60
        )
        return r.stdout[-6000:]

    try:
        wait_until(lambda: answers_health(admin + "/health"), UP_TIMEOUT_S, "the compose broker's /health")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs()}") from None

    # The mounted files: each bookie and the broker runs with every setting in its file, its port and advertised
    # address from its command line (the broker starts once the bookies are healthy).
    for i in range(3):
        bookie_admin = f"http://127.0.0.1:{env[f'BOOKIE{i}_HTTP_PORT']}"
        report = assert_runs_with_config(
            bookie_admin, BOOKIE_CONFIG, from_flags=("port", "advertised_address")
        )
        assert report["settings"]["port"] == int(env[f"BOOKIE{i}_PORT"])
    assert_runs_with_config(admin, BROKER_CONFIG, from_flags=("port", "http_port", "advertised_address"))

    topic = f"persistent://public/default/compose-{uuid.uuid4().hex[:8]}"
    lookup = http_json(f"{admin}/lookup/v2/topic/{topic.replace('://', '/')}")
    assert lookup["brokerUrl"] == f"pulsar://127.0.0.1:{env['BROKER_PORT']}"

    c = pulsar.Client(
        f"pulsar://127.0.0.1:{env['BROKER_PORT']}",
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
    )
    try:
        consumer = c.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = c.create_producer(topic)
        sent = [b"compose-%d" % i for i in range(100)]
        for data in sent:
            producer.send(data)
        got = [consumer.receive(timeout_millis=10_000).data() for _ in sent]
        assert got == sent
    finally:
        c.close()
