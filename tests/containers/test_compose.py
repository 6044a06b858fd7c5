"""docker/compose.yaml as users run it: host mode (LEDGERSTORE_ADVERTISED_HOST=127.0.0.1), the broker service
reached by ``pulsar-client`` from the host, and the broker's own lookup pointing at 127.0.0.1. Every bookie runs
with the settings of the mounted docker/bookie.toml and the broker with docker/broker.toml.

Authentication is on, as published: the `init` service made the secrets on first start; this process takes the
``admin`` token and the ZooKeeper credentials out of its volume (``run --rm init cat-secret NAME``, as
docker/README.md says), the `cli` profile's simpletest passes with its own token, and a stranger (no token, no
ZooKeeper credentials) is refused by ZooKeeper, every bookie and the broker.

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
from dataclasses import dataclass
from typing import Any

import pytest

from ledgerstore.docker_cluster import answers_health

from .conftest import (
    BOOKIE_CONFIG,
    BROKER_CONFIG,
    REPO_ROOT,
    assert_runs_with_config,
    assert_stranger_refused,
    free_port,
    wait_until,
)

pulsar = pytest.importorskip("pulsar", reason="pulsar-client is not installed (pip install '.[pulsar]')")

pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(420)]

COMPOSE_FILE = REPO_ROOT / "docker" / "compose.yaml"
UP_TIMEOUT_S = 180


def compose_cli() -> list[str]:
    from ledgerstore.cli import CommandError
    from ledgerstore.docker_cluster import compose_command

    try:
        return compose_command()
    except CommandError as exc:
        pytest.skip(str(exc))


@dataclass
class Deployment:
    cmd: list[str]  # docker compose -p PROJECT -f compose.yaml
    env: dict[str, str]
    admin_token: str
    zk_auth: str

    def port(self, name: str) -> int:
        return int(self.env[name])

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.env['BROKER_HTTP_PORT']}"

    def compose(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.cmd, *args], env=self.env, capture_output=True, text=True, timeout=timeout_s
        )

    def logs(self) -> str:
        return self.compose("logs", "--tail", "40", timeout_s=60).stdout[-6000:]


@pytest.fixture(scope="module")
def deployment(ledgerstore_images: tuple[str, str]) -> Iterator[Deployment]:
    """compose.yaml up in host mode as its own project on free ports, the broker healthy; ``down -v`` after."""
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
    # This process's own credentials (the container tier's session ones) have nothing to do with this project.
    for name in (
        "LEDGERSTORE_ZK_AUTH_FILE",
        "LEDGERSTORE_AUTH_TOKEN_FILE",
        "LEDGERSTORE_ZK_AUTH",
        "LEDGERSTORE_AUTH_TOKEN",
    ):
        env.pop(name, None)
    d = Deployment(cmd=cmd, env=env, admin_token="", zk_auth="")
    try:
        up = d.compose("up", "-d", timeout_s=UP_TIMEOUT_S)
        assert up.returncode == 0, f"compose up failed:\n{up.stdout[-2000:]}\n{up.stderr[-2000:]}"
        try:
            wait_until(
                lambda: answers_health(d.admin + "/health"), UP_TIMEOUT_S, "the compose broker's /health"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{d.logs()}") from None
        secrets = {}
        for name in ("admin.token", "zk-auth"):
            r = d.compose("run", "--rm", "--no-deps", "-T", "init", "cat-secret", name)
            assert r.returncode == 0 and r.stdout.strip(), f"cat-secret {name}: {r.stderr[-2000:]}"
            secrets[name] = r.stdout.strip()
        d.admin_token, d.zk_auth = secrets["admin.token"], secrets["zk-auth"]
        yield d
    finally:
        d.compose("--profile", "tools", "down", "-v", "--timeout", "5")


def http_json(url: str, token: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as r:
        return json.loads(r.read())


def test_compose_broker_serves_a_pulsar_client_on_the_host(deployment: Deployment) -> None:
    d = deployment
    # The mounted files: each bookie and the broker runs with every setting in its file (authentication
    # included), its port and advertised address from its command line.
    for i in range(3):
        bookie_admin = f"http://127.0.0.1:{d.env[f'BOOKIE{i}_HTTP_PORT']}"
        report = assert_runs_with_config(
            bookie_admin, BOOKIE_CONFIG, from_flags=("port", "advertised_address")
        )
        assert report["settings"]["port"] == d.port(f"BOOKIE{i}_PORT")
        assert report["settings"]["auth_required"] is True
    assert_runs_with_config(d.admin, BROKER_CONFIG, from_flags=("port", "http_port", "advertised_address"))

    topic = f"persistent://public/default/compose-{uuid.uuid4().hex[:8]}"
    lookup = http_json(f"{d.admin}/lookup/v2/topic/{topic.replace('://', '/')}", d.admin_token)
    assert lookup["brokerUrl"] == f"pulsar://127.0.0.1:{d.env['BROKER_PORT']}"

    c = pulsar.Client(
        f"pulsar://127.0.0.1:{d.env['BROKER_PORT']}",
        authentication=pulsar.AuthenticationToken(d.admin_token),
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


def test_compose_cli_profile_simpletest_passes_with_its_token_and_a_stranger_is_refused(
    deployment: Deployment,
) -> None:
    d = deployment
    r = d.compose("--profile", "tools", "run", "--rm", "-T", "cli", timeout_s=240)
    assert r.returncode == 0, f"cli simpletest exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"

    # The same command without the token writes nothing: every bookie refuses it (the client, finding no bookie
    # that takes its adds, gives up with NOT_ENOUGH_BOOKIES or UNAUTHORIZED).
    r = d.compose(
        "--profile", "tools", "run", "--rm", "-T", "-e", "LEDGERSTORE_AUTH_TOKEN_FILE=", "cli", timeout_s=240
    )
    assert r.returncode != 0, f"cli without a token passed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "NOT_ENOUGH_BOOKIES" in r.stdout + r.stderr or "UNAUTHORIZED" in r.stdout + r.stderr, (
        r.stdout + r.stderr
    )

    assert_stranger_refused(
        d.port("ZK_PORT"),
        [d.port(f"BOOKIE{i}_PORT") for i in range(3)],
        d.port("BROKER_PORT"),
        d.port("BROKER_HTTP_PORT"),
    )
