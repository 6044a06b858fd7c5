"""``ledgerstore cluster up|down|status --docker``: the same cluster as containers (docker/compose.yaml).

ZooKeeper, three bookies and (unless ``--brokers 0``) one topic broker. Bookies and the broker advertise
127.0.0.1:<published port> so that clients on the host (this CLI, Spark in local mode, ``pulsar.Client(
"pulsar://127.0.0.1:6650")``) reach them; see the addressing notes at the top of docker/compose.yaml. ``down``
and ``status`` also cover an AutoRecovery service started with ``--profile autorecovery``. The bookies' shared
settings come from docker/bookie.toml and the broker's from docker/broker.toml, which compose.yaml mounts.

Authentication is on (docker/README.md, "Secure deployment"): compose.yaml's `init` service makes the secrets in a
volume; ``up`` copies the ``admin`` token and the ZooKeeper credentials to docker/secrets/ (mode 600, not in git)
and prints the two variables that let this host's clients in.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

from ledgerstore.cli import CommandError, emit

PROJECT = "ledgerstore"
COMPOSE_FILE = Path(__file__).resolve().parent.parent / "docker" / "compose.yaml"
HOST_SECRETS_DIR = COMPOSE_FILE.parent / "secrets"  # .gitignore'd
HOST_SECRETS = {"admin.token": "LEDGERSTORE_AUTH_TOKEN_FILE", "zk-auth": "LEDGERSTORE_ZK_AUTH_FILE"}


def compose_command() -> list[str]:
    for docker in ("/usr/bin/docker", shutil.which("docker")):
        if (
            docker
            and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode
            == 0
        ):
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    if legacy:
        return [legacy]
    raise CommandError(
        "neither `docker compose` nor `docker-compose` is installed: `apt-get install docker-compose` "
        "(scripts/docker-engine.sh does it)"
    )


COMPOSE_TIMEOUT_S = 600  # an `up` waits for health checks; pulling images (with a registry) can take a while
BOOKIE_SERVICES = ["bookie-0", "bookie-1", "bookie-2"]
ALL_PROFILES = ["--profile", "autorecovery"]  # down/status see the optional services too


def _wait_healthy(urls: list[str], timeout_s: float) -> None:
    """Compose v1 has no --wait: poll the published admin ports (bookies, broker)."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    pending = list(urls)
    while pending and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(pending[0], timeout=2) as r:
                if r.status == 200:
                    pending.pop(0)
                    continue
        except OSError:
            pass
        time.sleep(1)
    if pending:
        raise CommandError(
            f"not healthy after {timeout_s:.0f}s: {pending} (see `docker compose -p {PROJECT} logs`)"
        )


def _image_exists(name: str) -> bool:
    docker = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else (shutil.which("docker") or "docker")
    return subprocess.run([docker, "image", "inspect", name], capture_output=True, timeout=30).returncode == 0


def _run(
    args: list[str], env: dict[str, str], profiles: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [*compose_command(), "-p", PROJECT, "-f", str(COMPOSE_FILE), *(profiles or []), *args]
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=COMPOSE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CommandError(
            f"`{' '.join(cmd[-len(args) :])}` did not finish in {COMPOSE_TIMEOUT_S}s"
        ) from None


def copy_host_secrets(env: dict[str, str]) -> dict[str, str]:
    """The ``admin`` token and the ZooKeeper credentials, out of the `init` service's volume into
    docker/secrets/ (mode 600); returns the variables naming them."""
    HOST_SECRETS_DIR.mkdir(mode=0o700, exist_ok=True)
    exports: dict[str, str] = {}
    for name, variable in HOST_SECRETS.items():
        r = _run(["run", "--rm", "--no-deps", "-T", "init", "cat-secret", name], env)
        if r.returncode != 0 or not r.stdout.strip():
            raise CommandError(f"could not read {name} from the secrets volume: {r.stderr.strip()[-500:]}")
        target = HOST_SECRETS_DIR / name
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(r.stdout.strip() + "\n")
        target.chmod(0o600)
        exports[variable] = str(target)
    return exports


def answers_health(url: str) -> bool:
    """``GET url`` answers 200 within 2 s."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def compose_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment docker/compose.yaml is run with: host mode, and the ports the flags give."""
    env = {
        **os.environ,
        "LEDGERSTORE_ADVERTISED_HOST": "127.0.0.1",
        "ZK_PORT": str(args.zk_port),
        **{f"BOOKIE{i}_PORT": str(args.base_port + i) for i in range(3)},
        "BROKER_PORT": str(int(getattr(args, "broker_port", 6650))),
        "BROKER_HTTP_PORT": str(int(getattr(args, "broker_http_port", 8080))),
    }
    if getattr(args, "bookie_http_port", None) is not None:  # else compose's (8001..) or the environment's
        env.update({f"BOOKIE{i}_HTTP_PORT": str(args.bookie_http_port + i) for i in range(3)})
    return env


def command(args: argparse.Namespace) -> int:
    if not COMPOSE_FILE.exists():
        raise CommandError(f"{COMPOSE_FILE} not found (run from a source checkout)")
    brokers = int(getattr(args, "brokers", 1))
    broker_port = int(getattr(args, "broker_port", 6650))
    broker_http_port = int(getattr(args, "broker_http_port", 8080))
    env = compose_env(args)
    if "ZOOKEEPER_IMAGE" not in env and _image_exists("ledgerstore/zookeeper:dev"):
        env["ZOOKEEPER_IMAGE"] = "ledgerstore/zookeeper:dev"  # built offline by docker/build-offline.sh
    if args.bookies != 3:
        raise CommandError("--docker runs the 3 bookies of docker/compose.yaml; add services there for more")
    if brokers not in (0, 1):
        raise CommandError("--docker runs the one broker of docker/compose.yaml (--brokers 1, or 0 for none)")
    broker_health = f"http://127.0.0.1:{broker_http_port}/health"
    if args.action == "up":
        legacy = compose_command()[0].endswith("docker-compose")
        services = [] if brokers else ["zookeeper", *BOOKIE_SERVICES]
        r = _run(["up", "-d", *([] if legacy else ["--wait"]), *services], env)
        if r.returncode != 0:
            raise CommandError(f"docker compose up failed: {r.stderr.strip().splitlines()[-1:]}")
        admin_ports = [env.get(f"BOOKIE{i}_HTTP_PORT", str(8001 + i)) for i in range(3)]  # compose's defaults
        urls = [f"http://127.0.0.1:{port}/health" for port in admin_ports]
        _wait_healthy(urls + ([broker_health] if brokers else []), timeout_s=180)
        exports = copy_host_secrets(env)
        zk = f"127.0.0.1:{args.zk_port}"
        bookies = [f"127.0.0.1:{args.base_port + i}" for i in range(3)]
        doc: dict[str, object] = {"zk": zk, "bookies": bookies, "auth": exports}
        text = f"cluster up (containers): ZooKeeper {zk}, bookies {', '.join(bookies)}"
        if brokers:
            doc["broker"] = {
                "service_url": f"pulsar://127.0.0.1:{broker_port}",
                "admin": f"http://127.0.0.1:{broker_http_port}",
            }
            text += f"\n  broker: service URL pulsar://127.0.0.1:{broker_port}, admin http://127.0.0.1:{broker_http_port}"
            text += " (Pulsar clients: pulsar.AuthenticationToken with the admin token)"
        text += "\n  authentication on; for clients on this host:\n" + "\n".join(
            f"    export {variable}={path}" for variable, path in exports.items()
        )
        emit(args, text, doc)
        return 0
    if args.action == "down":
        r = _run(["down"], env, ALL_PROFILES)
        if r.returncode != 0:
            raise CommandError(f"docker compose down failed: {r.stderr.strip()}")
        emit(args, "cluster down (containers)", {"down": True})
        return 0
    r = _run(["ps"], env, ALL_PROFILES)
    healthy = answers_health(broker_health)
    text = r.stdout.strip() + f"\nbroker admin {broker_health}: {'ok' if healthy else 'not answering'}"
    emit(args, text, {"ps": r.stdout, "broker_healthy": healthy})
    return r.returncode
