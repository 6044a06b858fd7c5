"""The image's HEALTHCHECK (docker/Dockerfile, docker/healthcheck.py) asks the admin port the container's server
resolves: a bookie run with `--http-port 52620` (`--network host`) was `unhealthy` while its /health answered 200,
as the check always asked 8000. The check's command is taken from the Dockerfile and run here against a process
whose command line is a bookie's and which answers /health (no container: a container run is CI's)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.zk_testing import wait_for

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("docker_healthcheck", REPO / "docker" / "healthcheck.py")
assert spec is not None and spec.loader is not None
hc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hc)

SERVER = textwrap.dedent(
    """
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    s = http.server.HTTPServer(("127.0.0.1", 0), H)
    print(s.server_address[1], flush=True)
    s.serve_forever()
    """
)


def _dockerfile() -> tuple[list[str], dict[str, str]]:
    """The HEALTHCHECK's command, with the image's paths mapped to the repository's, and the image's ENV."""
    text = (REPO / "docker" / "Dockerfile").read_text().replace("\\\n", " ")
    cmd = json.loads(re.search(r"^HEALTHCHECK .*? CMD (\[.*\])$", text, re.M).group(1))  # type: ignore[union-attr]
    runtime = text[text.index(" AS runtime") :]  # the final stage's ENV lines, the image's environment
    env = dict(kv.split("=", 1) for line in re.findall(r"^ENV (.*)$", runtime, re.M) for kv in line.split())
    cmd = [sys.executable if c.endswith("/python") else c for c in cmd]
    # the script the command names is in the build context and copied to where the command looks
    assert "!docker/healthcheck.py" in (REPO / "docker" / "Dockerfile.dockerignore").read_text().split()
    for c in cmd:
        if c.startswith("/opt/ledgerstore/") and c.endswith(".py"):
            copy = re.search(r"^COPY (?!--from)(.*) /opt/ledgerstore/$", text, re.M)
            assert copy is not None and f"docker/{Path(c).name}" in copy.group(1).split(), c
    return [c.replace("/opt/ledgerstore/", str(REPO / "docker") + "/") for c in cmd], env


def test_the_images_health_check_asks_the_port_the_bookie_was_given() -> None:
    """A process run as `... bookie serve --http-port P` answering /health on P: the Dockerfile's HEALTHCHECK
    (told that pid, as PID 1 in a container) says healthy; LEDGERSTORE_HEALTH_URL still overrides it."""
    # the server picks its port first; a second process with that port on its command line stands for the bookie
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    bookie = None
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        bookie = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)", "bookie", "serve", "--http-port", str(port)]
        )
        assert wait_for(lambda: b"serve" in Path(f"/proc/{bookie.pid}/cmdline").read_bytes(), 10)
        cmd, image_env = _dockerfile()
        base = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERSTORE_")}
        env = {**base, **{k: v for k, v in image_env.items() if k != "PATH"}}
        r = subprocess.run([*cmd, str(bookie.pid)], env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (cmd, image_env, r.stdout, r.stderr)
        dead = {**env, "LEDGERSTORE_HEALTH_URL": "http://127.0.0.1:1/health"}
        r = subprocess.run([*cmd, str(bookie.pid)], env=dead, capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and "127.0.0.1:1/health" in r.stderr, r.stderr
    finally:
        for p in (server, bookie):
            if p is not None:
                p.kill()
                p.wait()


def test_the_port_is_resolved_as_serve_resolves_it(tmp_path: Path) -> None:
    """--http-port > $LEDGERSTORE_HTTP_PORT > http_port in the --config file ($LEDGERSTORE_CONFIG) > the default."""
    conf = tmp_path / "bookie.toml"
    conf.write_text('zk = "zookeeper:2181"\nhttp_port = 8123\n')
    py = ["/opt/ledgerstore/bin/python", "/opt/ledgerstore/bin/ledgerstore"]
    bookie, broker = [*py, "bookie", "serve", "--zk", "z:2181"], [*py, "--zk", "z:2181", "broker", "serve"]
    assert hc.admin_port(bookie, {}) == 8000
    assert hc.admin_port(broker, {}) == 8080
    assert hc.admin_port([*py, "ledger", "list"], {}) == 8000  # no admin server: as before
    assert hc.admin_port([*bookie, "--http-port", "52620"], {}) == 52620
    assert hc.admin_port([*bookie, "--http-port=52620", "--port", "1"], {}) == 52620
    assert hc.admin_port([*bookie, "--http-port", "1", "--http-port", "2"], {}) == 2  # argparse: the last
    assert hc.admin_port(bookie, {"LEDGERSTORE_HTTP_PORT": "8005"}) == 8005
    assert hc.admin_port([*bookie, "--config", str(conf)], {}) == 8123
    assert hc.admin_port(broker, {"LEDGERSTORE_CONFIG": str(conf)}) == 8123
    assert hc.admin_port([*bookie, "--config", str(conf)], {"LEDGERSTORE_HTTP_PORT": "8005"}) == 8005
    assert (
        hc.admin_port([*bookie, "--http-port", "9", f"--config={conf}"], {"LEDGERSTORE_HTTP_PORT": "8"}) == 9
    )
    assert hc.health_url(bookie, {"LEDGERSTORE_HEALTH_URL": "http://h:1/health"}) == "http://h:1/health"
    assert hc.health_url(bookie, {"LEDGERSTORE_HEALTH_URL": ""}) == "http://127.0.0.1:8000/health"
    with pytest.raises(ValueError, match="--http-port: 'x'"):
        hc.admin_port([*bookie, "--http-port", "x"], {})
    with pytest.raises(ValueError, match="70000 is not a port"):
        hc.admin_port(bookie, {"LEDGERSTORE_HTTP_PORT": "70000"})


def test_the_host_is_the_address_the_admin_server_listens_on(tmp_path: Path) -> None:
    """A bookie's admin HTTP listens on its listen address, by default its advertised address: a container run with
    `--advertised-address bookie-1` (the container's name, as other containers reach it) is not on 127.0.0.1, so
    asking 127.0.0.1 was refused while its /health answered 200. A broker's listens on every interface by default."""
    conf = tmp_path / "bookie.toml"
    conf.write_text('listen_address = "0.0.0.0"\n')
    py = ["/opt/ledgerstore/bin/python", "/opt/ledgerstore/bin/ledgerstore"]
    bookie, broker = [*py, "bookie", "serve"], [*py, "broker", "serve"]
    assert hc.admin_address(bookie, {}) == ("127.0.0.1", 8000)
    assert hc.admin_address([*bookie, "--advertised-address", "bookie-1"], {}) == ("bookie-1", 8000)
    assert hc.admin_address(
        [*bookie, "--advertised-address=bookie-1", "--listen-address", "0.0.0.0"], {}
    ) == (
        "127.0.0.1",
        8000,
    )
    assert hc.admin_address([*bookie, "--advertised-address", "b1", "--config", str(conf)], {}) == (
        "127.0.0.1",
        8000,
    )
    assert hc.admin_address(bookie, {"LEDGERSTORE_ADVERTISED_ADDRESS": "b2"}) == ("b2", 8000)
    hyphens = tmp_path / "hyphens.toml"  # the config file's keys may be written as the flags are
    hyphens.write_text('http-port = 52620\nadvertised-address = "bookie-3"\n')
    assert hc.admin_address([*bookie, "--config", str(hyphens)], {}) == ("bookie-3", 52620)
    assert hc.admin_address(bookie, {"LEDGERSTORE_LISTEN_ADDRESS": "10.0.0.5"}) == ("10.0.0.5", 8000)
    assert hc.admin_address([*broker, "--advertised-address", "broker-1"], {}) == ("127.0.0.1", 8080)
    assert hc.admin_address([*broker, "--listen-address", "10.0.0.6"], {}) == ("10.0.0.6", 8080)
    assert hc.health_url([*bookie, "--listen-address", "::1"], {}) == "http://[::1]:8000/health"
    assert hc.health_url([*bookie, "--advertised-address", "bookie-1"], {}) == "http://bookie-1:8000/health"


def test_under_an_init_the_server_is_found_among_the_processes(tmp_path: Path) -> None:
    """`docker run --init`: PID 1 is the init; the server is the process whose command line runs `serve`."""
    for pid, argv in {
        "1": ["/sbin/docker-init", "--", "/bin/sh", "-c", "run"],
        "7": ["/opt/ledgerstore/bin/python", "/opt/ledgerstore/healthcheck.py"],
        "9": [
            "/opt/ledgerstore/bin/python",
            "/opt/ledgerstore/bin/ledgerstore",
            "bookie",
            "serve",
            "--http-port",
            "5",
        ],
    }.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (tmp_path / "self").mkdir()
    assert hc.admin_port(hc.server_argv(tmp_path), {}) == 5
    (tmp_path / "9" / "cmdline").write_bytes(b"")  # a kernel thread, or gone: PID 1's
    assert hc.server_argv(tmp_path) == ["/sbin/docker-init", "--", "/bin/sh", "-c", "run"]
