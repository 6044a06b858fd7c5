"""A real Spark standalone cluster (a master and one worker, from the pyspark install) runs a ledgerstore job
submitted to spark://127.0.0.1:PORT: the executors, in the worker's own JVM and Python, read the bookies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger_client import ClientConfig
from ledger_client.sync import BookKeeper
from ledgerstore.cluster import free_port

PW = "pw"


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _master_state(ui_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
        state: dict[str, Any] = json.loads(r.read())
    return state


class StandaloneCluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port, self.ui_port = free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            "SPARK_HOME": str(_spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_WORKER_DIR": str(tmp / "work"),
            "SPARK_LOG_DIR": str(tmp / "logs"),
        }

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        spark_class = str(_spark_home() / "bin" / "spark-class")
        proc = subprocess.Popen([spark_class, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)

    def start(self, timeout_s: float = 60.0) -> None:
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port),
        )  # fmt: skip
        self._spawn(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            "--host", "127.0.0.1", "--port", str(free_port()), "--webui-port", str(free_port()),
            "--cores", "2", "--memory", "1g", "--work-dir", str(self.tmp / "work"), self.url,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited ({p.args[1]}): see {self.tmp}/*.log")
            try:
                if _master_state(self.ui_port).get("aliveworkers", 0) >= 1:
                    return
            except OSError:
                pass
            except ValueError:  # an HTML page, not the JSON state: the master's UI not fully up yet
                pass
            time.sleep(0.5)
        raise TimeoutError(
            f"no live worker registered with {self.url} in {timeout_s} s; see {self.tmp}/*.log"
        )

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[StandaloneCluster]:
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("Java is not installed: a Spark standalone master and worker need a JVM")
    cluster = StandaloneCluster(tmp_path)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_ledger_health_job_runs_on_a_standalone_spark_cluster(
    bookies: Any, standalone: StandaloneCluster, tmp_path: Path
) -> None:
    procs = bookies.start_many(3)
    bk = BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    ids = []
    for n in range(2):
        lh = bk.create_ledger(3, 2, 2, password=PW.encode())
        lh.append_many([bytes([n]) * 200] * (1000 + n))
        lh.close()
        ids.append(lh.ledger_id)
    bk.close()

    out = tmp_path / "report"
    cmd = [
        sys.executable, "-m", "ledgerstore.cli", "spark", "ledger-health",
        "--master", standalone.url, "--zk", bookies.zk, "--zk-root", bookies.root, "--password", PW,
        "--entries-per-partition", "250", "--out", str(out), "--json",
        "--conf", "spark.executor.memory=512m", "--conf", "spark.driver.memory=512m",
    ]  # fmt: skip
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    run = subprocess.run(cmd, env=env, capture_output=True, timeout=240)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    report = json.loads(run.stdout)
    ledgers = {r["ledger"]: r for r in report["tables"]["Ledgers"]}
    assert {lid: (ledgers[lid]["entries"], ledgers[lid]["bytes"]) for lid in ids} == {
        ids[0]: (1000, 200_000),
        ids[1]: (1001, 200_200),
    }
    bookie_rows = report["tables"]["Entry replicas per bookie"]
    assert {r["bookie"] for r in bookie_rows} == {bp.id for bp in procs}
    assert sum(r["replicas"] for r in bookie_rows) == 2 * 2001
    assert (out / "ledger-health.png").stat().st_size > 1000
    assert (out / "ledger-health.txt").read_text().startswith("Ledgers")
    # it ran on the cluster: the master lists the finished application, whose executors ran on the worker
    apps = _master_state(standalone.ui_port)["completedapps"]
    assert any(a["name"] == "ledgerstore ledger-health" for a in apps), apps
    executor_logs = list((standalone.tmp / "work").glob("app-*/*/stderr"))
    assert executor_logs, "no executor ran on the worker"
