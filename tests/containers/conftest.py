"""Container tier: ZooKeeper, bookies and a topic broker in Docker, driven from this (host) process.

Every cluster lives on its own user-defined Docker network. ZooKeeper is reachable inside it as ``zookeeper:2181``
and from the host on a published ``127.0.0.1`` port. Each bookie gets a free host port ``p``, listens on
``0.0.0.0:p`` inside its container, is published as ``127.0.0.1:p -> p`` and advertises ``127.0.0.1:p``: its id
(``127.0.0.1:p``) is then an address the host can dial, which is all the client in this process needs. Nothing
is published on any other interface.

A broker (``cluster_factory(n, broker=True)``) is published the same way on its own Pulsar port and admin port
and advertises ``127.0.0.1``, so ``pulsar.Client(cluster.broker_url)`` in this process gets a dialable address
back from its lookup. The broker itself dials bookie ids ``127.0.0.1:p`` too: the image's entrypoint relays its
container's loopback port ``p`` to the bookie's container (``LEDGERSTORE_LOOPBACK_RELAY``, docker/entrypoint.py),
exactly as docker/compose.yaml does in host mode. Bookies added after the broker are not relayed.

Bookies and the broker read the published deployment's settings: docker/bookie.toml and docker/broker.toml are
mounted read-only at /etc/ledgerstore/ and named by ``LEDGERSTORE_CONFIG``, as in docker/compose.yaml; a command
line carries only what differs per container (``--port``, ``--advertised-address``, the broker's ``--http-port``
and a test's ``broker_args``), which overrides the file.

Authentication is on, as in docker/compose.yaml: once per session the compose deployment's ``init`` step
(docker/init-secrets.sh, in the image, as root) creates the token secret, ZooKeeper credentials and tokens in a
volume of their own; bookies and brokers mount it read-only at /etc/ledgerstore/secrets (docker/bookie.toml and
docker/broker.toml name the files in it) and get ``LEDGERSTORE_ZK_AUTH_FILE``. This process gets copies
(``deployment_secrets``) and ``LEDGERSTORE_ZK_AUTH_FILE`` and ``LEDGERSTORE_AUTH_TOKEN_FILE`` (the ``admin`` token)
in its environment for the session, so its clients and the ``ledgerstore`` commands it runs are let in; a Pulsar
client passes ``cluster.pulsar_auth()``.

Images come from ``docker/build-offline.sh`` (run once per session: it is cached and takes seconds when nothing
changed; set ``LEDGERSTORE_SKIP_IMAGE_BUILD=1`` to use the images as they are). Without a reachable Docker engine
every test here is skipped with the reason; under CI (``CI=true``) or with ``LEDGERSTORE_DOCKER_AUTOSTART=1``
``scripts/docker-engine.sh`` is run first to start one.

testcontainers' Ryuk reaper is disabled (it would pull an image): clusters are removed by the fixtures.
"""

from __future__ import annotations

import importlib
import os

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

import io
import json
import socket
import subprocess
import tarfile
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from zk.launcher import free_port as zk_free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
APP_IMAGE = os.environ.get("LEDGERSTORE_IMAGE", "ledgerstore/ledgerstore:dev")
ZK_IMAGE = os.environ.get("LEDGERSTORE_ZK_IMAGE", "ledgerstore/zookeeper:dev")
ZK_ROOT = "/ledgerstore"
LABEL = "ledgerstore.test"
# The files docker/compose.yaml mounts, and where (LEDGERSTORE_CONFIG names them inside the container).
BOOKIE_CONFIG = REPO_ROOT / "docker" / "bookie.toml"
BROKER_CONFIG = REPO_ROOT / "docker" / "broker.toml"
CONFIG_DIR = "/etc/ledgerstore"
# Where docker/compose.yaml's `init` service writes the credentials and every other service mounts them.
SECRETS_DIR = f"{CONFIG_DIR}/secrets"
INIT_SCRIPT = REPO_ROOT / "docker" / "init-secrets.sh"
SECRET_FILES = ("token-secret", "zk-auth", "broker.token", "autorecovery.token", "admin.token")

BUILD_TIMEOUT_S = 1200
INIT_TIMEOUT_S = 120
ZK_HEALTHY_TIMEOUT_S = 90
BOOKIE_HEALTHY_TIMEOUT_S = 90
BROKER_HEALTHY_TIMEOUT_S = 90
REGISTER_TIMEOUT_S = 60
STOP_TIMEOUT_S = 20
LOG_TAIL_LINES = 60


# --- engine and images ---------------------------------------------------------------------------------------


def _engine() -> tuple[Any, str]:
    """A connected docker-py client, or None and the reason there is none."""
    try:
        # By name: a type checker run from the repository root would take the docker/ directory (it holds
        # docker/entrypoint.py) for the package; the import system prefers the installed regular package.
        docker: Any = importlib.import_module("docker")
    except ImportError:
        return None, "the `docker` package is not installed (pip install '.[docker]')"
    try:
        client = docker.from_env(timeout=60)
        client.ping()
        return client, ""
    except Exception as exc:  # any failure to reach the daemon means: no engine
        return (
            None,
            f"no Docker engine reachable ({type(exc).__name__}: {exc}); start one: scripts/docker-engine.sh",
        )


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[Any]:
    try:
        import testcontainers  # noqa: F401
    except ImportError:
        pytest.skip("testcontainers is not installed (pip install '.[docker]')")
    client, reason = _engine()
    autostart = os.environ.get("CI") == "true" or os.environ.get("LEDGERSTORE_DOCKER_AUTOSTART") == "1"
    if client is None and autostart:
        subprocess.run(["bash", str(REPO_ROOT / "scripts/docker-engine.sh")], check=False, timeout=600)
        client, reason = _engine()
    if client is None:
        pytest.skip(reason)
    yield client
    client.close()


@pytest.fixture(scope="session")
def ledgerstore_images(docker_engine: Any) -> tuple[str, str]:
    """Build (or refresh, cached) the images with docker/build-offline.sh, once per session."""
    if os.environ.get("LEDGERSTORE_SKIP_IMAGE_BUILD") != "1":
        proc = subprocess.run(
            ["bash", str(REPO_ROOT / "docker/build-offline.sh")],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        if proc.returncode != 0:
            pytest.fail(
                f"docker/build-offline.sh failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}"
            )
    for image in (APP_IMAGE, ZK_IMAGE):
        try:
            docker_engine.images.get(image)
        except Exception:
            pytest.fail(f"image {image} is missing: run docker/build-offline.sh")
    return APP_IMAGE, ZK_IMAGE


@dataclass(frozen=True)
class Secrets:
    """The deployment's credentials: ``volume`` (mounted read-only at SECRETS_DIR in the containers) and a copy
    of each file in ``host_dir`` (mode 600) for this process."""

    volume: str
    host_dir: Path

    def read(self, name: str) -> str:
        return (self.host_dir / name).read_text().strip()

    @property
    def zk_auth(self) -> str:
        """``user:password`` for ZooKeeper's digest scheme."""
        return self.read("zk-auth")

    @property
    def admin_token(self) -> str:
        return self.read("admin.token")


def make_secrets(client: Any, app_image: str, volume: str, host_dir: Path, labels: dict[str, str]) -> Secrets:
    """Run docker/init-secrets.sh as compose.yaml's `init` service does, into ``volume``, and copy the files it
    made to ``host_dir``."""
    client.volumes.create(name=volume, labels=labels)
    container = client.containers.create(
        app_image,
        entrypoint=["/bin/sh", f"{CONFIG_DIR}/init-secrets.sh"],
        user="0:0",
        labels=labels,
        volumes={
            volume: {"bind": SECRETS_DIR, "mode": "rw"},
            str(INIT_SCRIPT): {"bind": f"{CONFIG_DIR}/init-secrets.sh", "mode": "ro"},
        },
    )
    try:
        container.start()
        status = container.wait(timeout=INIT_TIMEOUT_S)
        if status.get("StatusCode") != 0:
            raise AssertionError(
                f"init-secrets.sh failed: {status}\n{container.logs().decode(errors='replace')}"
            )
        chunks, _ = container.get_archive(SECRETS_DIR)
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            for member in tar.getmembers():
                name = Path(member.name).name
                if member.isfile() and name in SECRET_FILES:
                    f = tar.extractfile(member)
                    assert f is not None
                    assert member.mode & 0o077 == 0, f"{name} is readable by others: {oct(member.mode)}"
                    assert member.uid == 10001, f"{name} belongs to uid {member.uid}, not the services' 10001"
                    target = host_dir / name
                    target.write_bytes(f.read())
                    target.chmod(0o600)
    finally:
        container.remove(force=True)
    missing = [n for n in SECRET_FILES if not (host_dir / n).exists()]
    assert not missing, f"init-secrets.sh made no {missing}"
    return Secrets(volume=volume, host_dir=host_dir)


@pytest.fixture(scope="session")
def deployment_secrets(
    docker_engine: Any, ledgerstore_images: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Secrets]:
    """The session's credentials (see the module's docstring); this process's environment points at them."""
    host_dir = tmp_path_factory.mktemp("secrets")
    host_dir.chmod(0o700)
    volume = f"ls-secrets-{uuid.uuid4().hex[:8]}"
    secrets = make_secrets(docker_engine, ledgerstore_images[0], volume, host_dir, {LABEL: volume})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEDGERSTORE_ZK_AUTH_FILE", str(host_dir / "zk-auth"))
        mp.setenv("LEDGERSTORE_AUTH_TOKEN_FILE", str(host_dir / "admin.token"))
        mp.delenv("LEDGERSTORE_ZK_AUTH", raising=False)
        mp.delenv("LEDGERSTORE_AUTH_TOKEN", raising=False)
        yield secrets
    try:
        docker_engine.volumes.get(volume).remove(force=True)
    except Exception:
        pass


# --- helpers -------------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now and not handed out before in this session (below the ephemeral range)."""
    return zk_free_port("127.0.0.1")


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.25) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def four_letter_word(port: int, word: str = "srvr", timeout_s: float = 3.0) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(word.encode())
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def assert_runs_with_config(admin_url: str, config: Path, from_flags: Collection[str] = ()) -> dict[str, Any]:
    """``GET {admin_url}/api/v1/config`` says the server read ``config`` mounted at /etc/ledgerstore/ and runs with
    every setting in it (source ``file``, the file's value), and that ``from_flags`` came from its command line.
    Returns the report."""
    with urllib.request.urlopen(f"{admin_url}/api/v1/config", timeout=10) as r:
        report: dict[str, Any] = json.loads(r.read())
    assert report["config_file"] == f"{CONFIG_DIR}/{config.name}", report
    with config.open("rb") as f:
        in_file = {key.replace("-", "_"): value for key, value in tomllib.load(f).items()}
    assert in_file, f"{config} sets nothing"
    settings, sources = report["settings"], report["sources"]
    for key, value in in_file.items():
        assert (sources.get(key), settings.get(key)) == ("file", value), (key, report)
    for key in from_flags:
        assert sources.get(key) == "flag", (key, report)
    return report


@dataclass
class Node:
    """One container of a cluster. For bookies and brokers, ``port`` (and the broker's ``http_port``) is both the
    container's and the published host port; a bookie's ``http_port`` is the host side of its admin port 8000."""

    name: str
    container: Any  # testcontainers DockerContainer
    port: int
    http_port: int | None = None
    volume: str | None = None

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def raw(self) -> Any:
        """The docker-py Container (kill, pause, start, logs...)."""
        return self.container.get_wrapped_container()

    def state(self) -> dict[str, Any]:
        self.raw.reload()
        return dict(self.raw.attrs["State"])

    def health(self) -> str:
        st = self.state()
        if not st.get("Running"):
            return "exited" if st.get("Status") in ("exited", "dead") else str(st.get("Status"))
        return str(st.get("Health", {}).get("Status", "none"))

    def logs(self, tail: int | str = "all") -> str:
        return self.raw.logs(tail=tail).decode(errors="replace")

    def answers_health(self) -> bool:
        """``GET /health`` on the published admin port answers 200 (what the image's health check asks, without
        waiting for Docker's next check)."""
        if self.http_port is None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/health", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False


class Cluster:
    """ZooKeeper + bookies (+ a broker) on a private Docker network; all removed by :meth:`close`."""

    def __init__(self, client: Any, app_image: str, zk_image: str, secrets: Secrets) -> None:
        from testcontainers.core.network import Network

        self.client = client
        self.app_image = app_image
        self.zk_image = zk_image
        self.secrets = secrets
        self.prefix = f"ls-{uuid.uuid4().hex[:8]}"
        self.labels = {LABEL: self.prefix}
        self.network = Network(docker_network_kw={"labels": self.labels}).create()
        self.zk: Node | None = None
        self.bookies: list[Node] = []
        self.broker: Node | None = None
        self._volumes: list[str] = []
        self._kazoo: Any = None
        self._seq = 0

    # -- lifecycle --

    @property
    def zk_connect(self) -> str:
        assert self.zk is not None
        return f"127.0.0.1:{self.zk.port}"

    @property
    def broker_url(self) -> str:
        assert self.broker is not None
        return f"pulsar://127.0.0.1:{self.broker.port}"

    @property
    def broker_admin(self) -> str:
        assert self.broker is not None
        return f"http://127.0.0.1:{self.broker.http_port}"

    def _container(self, image: str, name: str, alias: str, command: list[str]) -> Any:
        from testcontainers.core.container import DockerContainer

        return (
            DockerContainer(image)
            .with_name(name)
            .with_network(self.network)
            .with_network_aliases(alias)
            .with_command(command)
            # tini as PID 1 (signals, zombies); labels find leftovers of an interrupted run.
            .with_kwargs(init=True, labels=self.labels)
        )

    def pulsar_auth(self) -> Any:
        """``pulsar.AuthenticationToken`` with the ``admin`` token (a superuser in docker/broker.toml)."""
        import pulsar

        return pulsar.AuthenticationToken(self.secrets.admin_token)

    def _with_config(self, container: Any, config: Path) -> Any:
        """Mount ``config`` read-only at /etc/ledgerstore/<its name> and point LEDGERSTORE_CONFIG at it, and the
        secrets volume read-only at /etc/ledgerstore/secrets with LEDGERSTORE_ZK_AUTH_FILE (what
        docker/compose.yaml does for each bookie and the broker)."""
        target = f"{CONFIG_DIR}/{config.name}"
        return (
            container.with_volume_mapping(str(config), target, "ro")
            .with_env("LEDGERSTORE_CONFIG", target)
            .with_volume_mapping(self.secrets.volume, SECRETS_DIR, "ro")
            .with_env("LEDGERSTORE_ZK_AUTH_FILE", f"{SECRETS_DIR}/zk-auth")
        )

    @staticmethod
    def _publish_local(container: Any, container_port: int, host_port: int) -> None:
        # testcontainers' with_bind_ports binds every interface; docker-py takes (ip, port) for one interface.
        container.ports[f"{container_port}/tcp"] = ("127.0.0.1", host_port)

    def start_zookeeper(self) -> Node:
        port = free_port()
        c = self._container(self.zk_image, f"{self.prefix}-zookeeper", "zookeeper", ["/conf/zoo.cfg"])
        self._publish_local(c, 2181, port)
        c.start()
        self.zk = Node(name="zookeeper", container=c, port=port)
        self.wait_healthy(self.zk, ZK_HEALTHY_TIMEOUT_S)
        return self.zk

    def new_volume(self) -> str:
        name = f"{self.prefix}-data-{len(self._volumes)}"
        self.client.volumes.create(name=name, labels=self.labels)
        self._volumes.append(name)
        return name

    def add_bookie(self, *, port: int | None = None, volume: str | None = None, wait: bool = True) -> Node:
        """Start a bookie. ``port`` and ``volume`` default to fresh ones; reuse both to reuse a bookie's id."""
        port = port or free_port()
        volume = volume or self.new_volume()
        http_port = free_port()
        name = f"{self.prefix}-bookie-{self._seq}"
        self._seq += 1
        # zk, data_dir, http_port (8000), listen_address: docker/bookie.toml
        # --no-autorecovery: the tests decide what re-replicates (as ledgerstore.cluster.BookieProcess does)
        command = [
            "bookie",
            "serve",
            "--port",
            str(port),
            "--advertised-address",
            "127.0.0.1",
            "--no-autorecovery",
        ]
        c = self._with_config(self._container(self.app_image, name, name, command), BOOKIE_CONFIG)
        c = c.with_volume_mapping(volume, "/data", "rw")
        self._publish_local(c, port, port)
        self._publish_local(c, 8000, http_port)
        c.start()
        node = Node(name=name, container=c, port=port, http_port=http_port, volume=volume)
        self.bookies.append(node)
        if wait:
            self.wait_healthy(node, BOOKIE_HEALTHY_TIMEOUT_S)
            self.wait_registered([node.bookie_id])
        return node

    def add_broker(self, *extra_args: str, wait: bool = True) -> Node:
        """Start the broker, advertising 127.0.0.1 on free ports published as themselves; its container relays
        the bookies' ports on its loopback to their containers (so bookie ids ``127.0.0.1:p`` work inside it)."""
        assert self.broker is None, "one broker per cluster"
        port, http_port = free_port(), free_port()
        name = f"{self.prefix}-broker"
        command = [  # zk, listen_address: docker/broker.toml
            "broker",
            "serve",
            "--port",
            str(port),
            "--http-port",
            str(http_port),
            "--advertised-address",
            "127.0.0.1",
            *extra_args,
        ]
        c = (
            self._with_config(self._container(self.app_image, name, "broker", command), BROKER_CONFIG)
            .with_env("LEDGERSTORE_HEALTH_URL", f"http://127.0.0.1:{http_port}/health")
            .with_env(
                "LEDGERSTORE_LOOPBACK_RELAY", " ".join(f"{b.port}={b.name}:{b.port}" for b in self.bookies)
            )
        )
        self._publish_local(c, port, port)
        self._publish_local(c, http_port, http_port)
        c.start()
        self.broker = Node(name=name, container=c, port=port, http_port=http_port)
        if wait:
            self.wait_healthy(self.broker, BROKER_HEALTHY_TIMEOUT_S)
        return self.broker

    def start(self, bookies: int, broker: bool = False, broker_args: tuple[str, ...] = ()) -> Cluster:
        self.start_zookeeper()
        nodes = [self.add_bookie(wait=False) for _ in range(bookies)]
        for node in nodes:
            self.wait_healthy(node, BOOKIE_HEALTHY_TIMEOUT_S)
        self.wait_registered([n.bookie_id for n in nodes])
        if broker:
            self.add_broker(*broker_args)
        return self

    def close(self) -> None:
        if self._kazoo is not None:
            try:
                self._kazoo.stop()
                self._kazoo.close()
            except Exception:
                pass
        for node in [*([self.broker] if self.broker else []), *self.bookies, *([self.zk] if self.zk else [])]:
            try:
                node.container.stop(force=True, delete_volume=True)
            except Exception:
                pass
        for name in self._volumes:
            try:
                self.client.volumes.get(name).remove(force=True)
            except Exception:
                pass
        try:
            self.network.remove()
        except Exception:
            pass

    # -- observation --

    def wait_healthy(self, node: Node, timeout_s: float, docker_says: bool = False) -> None:
        """Until Docker reports the node healthy or (sooner: Docker checks every 5 s) its published /health
        answers 200; with ``docker_says``, until Docker's own health check reports it healthy. Fails at once if
        the container exits."""

        def healthy() -> bool:
            h = node.health()
            if h == "exited":
                raise AssertionError(f"{node.name} exited:\n{node.logs(tail=LOG_TAIL_LINES)}")
            return h == "healthy" or (not docker_says and h == "starting" and node.answers_health())

        try:
            wait_until(healthy, timeout_s, f"{node.name} to become healthy", interval_s=0.5)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n--- {node.name} log ---\n{node.logs(tail=LOG_TAIL_LINES)}"
            ) from None

    def kazoo(self) -> Any:
        if self._kazoo is None:
            from kazoo.client import KazooClient

            self._kazoo = KazooClient(
                hosts=self.zk_connect, timeout=10.0, auth_data=[("digest", self.secrets.zk_auth)]
            )
            self._kazoo.start(timeout=30)
        return self._kazoo

    def registered_bookies(self) -> set[str]:
        """Bookie ids registered as available or read-only (docs/architecture.md §7)."""
        from zk import layout

        zk = self.kazoo()
        found: set[str] = set()
        for rel in (layout.BOOKIES_AVAILABLE, layout.BOOKIES_READONLY):
            path = f"{ZK_ROOT}/{rel}"
            if zk.exists(path):
                found.update(layout.decode_name(c) for c in zk.get_children(path))
        return found

    def wait_registered(self, ids: list[str], timeout_s: float = REGISTER_TIMEOUT_S) -> None:
        wait_until(lambda: set(ids) <= self.registered_bookies(), timeout_s, f"bookies {ids} to register")

    def cookie_exists(self, bookie_id: str) -> bool:
        from zk import layout

        return self.kazoo().exists(f"{ZK_ROOT}/{layout.cookie_path(bookie_id)}") is not None

    def bookie(self, bookie_id: str) -> Node:
        for node in self.bookies:
            if node.bookie_id == bookie_id:
                return node
        raise KeyError(bookie_id)

    def wait_exit(self, node: Node, timeout_s: float) -> int:
        wait_until(lambda: not node.state().get("Running"), timeout_s, f"{node.name} to exit", interval_s=0.5)
        return int(node.state().get("ExitCode", -1))

    def log_tails(self) -> str:
        parts = []
        for node in [*([self.zk] if self.zk else []), *self.bookies, *([self.broker] if self.broker else [])]:
            try:
                parts.append(f"--- {node.name} ({node.health()}) ---\n{node.logs(tail=LOG_TAIL_LINES)}")
            except Exception as exc:
                parts.append(f"--- {node.name}: no log ({exc}) ---")
        return "\n".join(parts)

    # -- faults --

    def kill(self, node: Node) -> None:
        node.raw.kill()  # SIGKILL: no shutdown path runs

    def stop(self, node: Node) -> None:
        node.raw.stop(timeout=STOP_TIMEOUT_S)

    def restart_stopped(self, node: Node) -> None:
        """Start the same container again: same volume, same port, same id."""
        node.raw.start()

    def pause(self, node: Node) -> None:
        node.raw.pause()

    def unpause(self, node: Node) -> None:
        node.raw.unpause()

    def disconnect(self, node: Node) -> None:
        """Cut the node off the network: no ZooKeeper, and its published ports refuse connections."""
        self.client.networks.get(self.network.name).disconnect(node.raw.id)

    def connect(self, node: Node) -> None:
        self.client.networks.get(self.network.name).connect(node.raw.id, aliases=[node.name])


# --- fixtures ------------------------------------------------------------------------------------------------


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On a failure, attach the tails of the cluster's container logs while the containers still exist."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and report.when in ("setup", "call"):
        for cluster in getattr(item, "_ledgerstore_clusters", []):
            report.sections.append((f"container logs ({cluster.prefix})", cluster.log_tails()))


class ClusterFactory(Protocol):
    def __call__(
        self, bookies: int = 3, broker: bool = False, broker_args: tuple[str, ...] = ()
    ) -> Cluster: ...


@pytest.fixture
def cluster_factory(
    request: pytest.FixtureRequest,
    docker_engine: Any,
    ledgerstore_images: tuple[str, str],
    deployment_secrets: Secrets,
) -> Iterator[ClusterFactory]:
    """``cluster_factory(n, broker=False, broker_args=())``: a fresh ZooKeeper + n bookies (+ a broker started
    with ``broker_args``), removed after the test."""
    clusters: list[Cluster] = []
    request.node._ledgerstore_clusters = clusters

    def make(bookies: int = 3, broker: bool = False, broker_args: tuple[str, ...] = ()) -> Cluster:
        cluster = Cluster(docker_engine, *ledgerstore_images, deployment_secrets)
        clusters.append(cluster)
        return cluster.start(bookies, broker=broker, broker_args=broker_args)

    yield make
    for cluster in clusters:
        cluster.close()


@pytest.fixture
def cluster(cluster_factory: ClusterFactory) -> Cluster:
    """ZooKeeper + 3 bookies."""
    return cluster_factory(3)


@pytest.fixture(scope="module")
def shared_broker_cluster(
    docker_engine: Any, ledgerstore_images: tuple[str, str], deployment_secrets: Secrets
) -> Iterator[Cluster]:
    """ZooKeeper + 4 bookies + a broker, started once for a module (a cluster costs 15-20 s to start)."""
    cluster = Cluster(docker_engine, *ledgerstore_images, deployment_secrets)
    try:
        cluster.start(4, broker=True)
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def broker_cluster(request: pytest.FixtureRequest, shared_broker_cluster: Cluster) -> Cluster:
    """The module's ZooKeeper + 4 bookies + broker, whole: every bookie healthy and registered, the broker
    healthy. A test that harms a node heals it before it ends (E=3 leaves one spare bookie for its fault)."""
    cluster = shared_broker_cluster
    request.node._ledgerstore_clusters = [cluster]
    for node in cluster.bookies:
        cluster.wait_healthy(node, BOOKIE_HEALTHY_TIMEOUT_S)
    cluster.wait_registered([n.bookie_id for n in cluster.bookies])
    assert cluster.broker is not None
    cluster.wait_healthy(cluster.broker, BROKER_HEALTHY_TIMEOUT_S)
    return cluster


# --- strangers -----------------------------------------------------------------------------------------------


def assert_stranger_refused(
    zk_port: int, bookie_ports: Collection[int], broker_port: int | None, broker_http_port: int | None
) -> None:
    """A client with no token and no ZooKeeper credentials gets nothing: ZooKeeper answers NoAuth on the ledgers
    node and the root, each bookie UNAUTHORIZED (and closes) to a fence of ledger 0 with a bogus key, the broker
    refuses a Pulsar producer and an HTTP lookup (401), and a token signed by another key fares no better."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError

    from bookie import auth
    from bookie import protocol as p
    from tests.abuse.test_auth_abuse import _exchange as bookie_exchange

    zk = KazooClient(hosts=f"127.0.0.1:{zk_port}", timeout=10.0)
    zk.start(timeout=30)
    try:
        ledgers = f"{ZK_ROOT}/ledgers"
        assert zk.exists(ledgers) is not None, "no ledgers node yet: write a ledger first"
        refused: list[tuple[str, Callable[[], Any]]] = [
            ("get_children ledgers", lambda: zk.get_children(ledgers)),
            ("get ledgers", lambda: zk.get(ledgers)),
            ("get_children root", lambda: zk.get_children(ZK_ROOT)),
            ("get_acls ledgers", lambda: zk.get_acls(ledgers)),
            ("create under root", lambda: zk.create(f"{ZK_ROOT}/stranger", b"x")),
            ("set ledgers", lambda: zk.set(ledgers, b"")),
            ("delete ledgers", lambda: zk.delete(ledgers)),
        ]
        for what, call in refused:
            with pytest.raises(NoAuthError):
                call()
                raise AssertionError(f"ZooKeeper let a stranger {what}")
    finally:
        zk.stop()
        zk.close()

    fence = p.ReadEntryRequest(
        request_id=7,
        ledger_id=0,
        entry_id=p.LAST_ENTRY,
        master_key=p.master_key(b"a stranger's password"),
        flags=p.Flag.FENCE,
    )
    for port in bookie_ports:
        resps, closed = bookie_exchange(f"127.0.0.1:{port}", p.encode(fence), 10.0)
        assert closed and [r.status for r in resps] == [p.Status.UNAUTHORIZED], (port, resps)

    if broker_port is None or broker_http_port is None:
        return
    import pulsar

    topic = f"persistent://public/default/stranger-{uuid.uuid4().hex[:8]}"
    foreign = auth.create_token(auth.new_secret(), "admin")
    for authentication in (None, pulsar.AuthenticationToken(foreign)):
        c = pulsar.Client(
            f"pulsar://127.0.0.1:{broker_port}",
            authentication=authentication,
            operation_timeout_seconds=10,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
        try:
            with pytest.raises(Exception) as info:
                c.create_producer(topic)
            assert "Authentication" in type(info.value).__name__ or "uthentication" in str(info.value), (
                info.value
            )
        finally:
            c.close()
    lookup = f"http://127.0.0.1:{broker_http_port}/lookup/v2/topic/{topic.replace('://', '/')}"
    for headers in ({}, {"Authorization": f"Bearer {foreign}"}):
        try:
            urllib.request.urlopen(urllib.request.Request(lookup, headers=headers), timeout=10)
            raise AssertionError(f"the broker answered a stranger's lookup ({headers})")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401, exc
