"""``ledgerstore cluster up|down|status --docker``: the same cluster as containers (docker/compose.yaml).

Bookies advertise 127.0.0.1:<published port> so that clients on the host (this CLI, Spark in local mode) reach
them; see the addressing notes at the top of docker/compose.yaml.
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


def compose_command() -> list[str]:
    for docker in ("/usr/bin/docker", shutil.which("docker")):
        if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    if legacy:
        return [legacy]
    raise CommandError(
        "neither `docker compose` nor `docker-compose` is installed: `apt-get install docker-compose` "
        "(scripts/docker-engine.sh does it)"
    )


def _wait_healthy(urls: list[str], timeout_s: float) -> None:
    """Compose v1 has no --wait: poll the bookies' published admin ports."""
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
            f"bookies not healthy after {timeout_s:.0f}s: {pending} (see `docker compose logs`)"
        )


def _image_exists(name: str) -> bool:
    docker = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else (shutil.which("docker") or "docker")
    return subprocess.run([docker, "image", "inspect", name], capture_output=True).returncode == 0


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [*compose_command(), "-p", PROJECT, "-f", str(COMPOSE_FILE), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def command(args: argparse.Namespace) -> int:
    if not COMPOSE_FILE.exists():
        raise CommandError(f"{COMPOSE_FILE} not found (run from a source checkout)")
    env = {
        **os.environ,
        "LEDGERSTORE_ADVERTISED_HOST": "127.0.0.1",
        "ZK_PORT": str(args.zk_port),
        **{f"BOOKIE{i}_PORT": str(args.base_port + i) for i in range(3)},
    }
    if "ZOOKEEPER_IMAGE" not in env and _image_exists("ledgerstore/zookeeper:dev"):
        env["ZOOKEEPER_IMAGE"] = "ledgerstore/zookeeper:dev"  # built offline by docker/build-offline.sh
    if args.bookies != 3:
        raise CommandError("--docker runs the 3 bookies of docker/compose.yaml; add services there for more")
    if args.action == "up":
        legacy = compose_command()[0].endswith("docker-compose")
        r = _run(["up", "-d"] + ([] if legacy else ["--wait"]), env)
        if r.returncode != 0:
            raise CommandError(f"docker compose up failed: {r.stderr.strip().splitlines()[-1:]}")
        _wait_healthy([f"http://127.0.0.1:{8001 + i}/health" for i in range(3)], timeout_s=180)
        emit(
            args,
            f"cluster up (containers): ZooKeeper 127.0.0.1:{args.zk_port}",
            {"zk": f"127.0.0.1:{args.zk_port}"},
        )
        return 0
    if args.action == "down":
        r = _run(["down"], env)
        if r.returncode != 0:
            raise CommandError(f"docker compose down failed: {r.stderr.strip()}")
        emit(args, "cluster down (containers)", {"down": True})
        return 0
    r = _run(["ps"], env)
    emit(args, r.stdout.strip(), {"ps": r.stdout})
    return r.returncode
