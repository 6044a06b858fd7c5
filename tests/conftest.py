"""Shared fixtures: a real ZooKeeper per session (tests/zk_testing.py) and real bookie processes per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from ledgerstore.cluster import BookieProcess, free_port
from tests.zk_testing import zk_connect, zk_root, zk_server, zk_store  # noqa: F401

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

# Property tests check results, never speed: on a shared 2-core machine one example can take longer than
# hypothesis's default 200 ms deadline without anything being wrong.
settings.register_profile("shared-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-machine")


class BookieFactory:
    """Starts bookie processes against the session's ZooKeeper under a per-test metadata root."""

    def __init__(self, zk: str, root: str, tmp: Path) -> None:
        self.zk = zk
        self.root = root
        self.tmp = tmp
        self.procs: list[BookieProcess] = []

    def start(
        self,
        *extra: str,
        data_dir: Path | None = None,
        wait: bool = True,
        port: int | None = None,
        bookie_id: str | None = None,
        autorecovery: bool = False,
        process: type[BookieProcess] = BookieProcess,
    ) -> BookieProcess:
        """``process``: a subclass of BookieProcess (one that runs the bookie under another command, say)."""
        port = port or free_port()
        bp = process(
            zk=self.zk,
            zk_root=self.root,
            data_dir=data_dir or self.tmp / f"bookie-{port}",
            port=port,
            http_port=free_port(),
            extra_args=list(extra),
            bookie_id=bookie_id,
            autorecovery=autorecovery,
        )
        self.procs.append(bp)
        return bp.start(wait=wait)

    def start_many(self, n: int, *extra: str, autorecovery: bool = False) -> list[BookieProcess]:
        """``n`` bookies; ``autorecovery``: each runs AutoRecovery inside (off by default, as BookieProcess)."""
        procs = [self.start(*extra, wait=False, autorecovery=autorecovery) for _ in range(n)]
        for bp in procs:
            bp.wait_healthy(60)
        return procs

    def stop_all(self) -> None:
        for bp in self.procs:
            try:
                bp.stop()
            except Exception:
                bp.kill9()


@pytest.fixture
def bookies(zk_server, zk_root: str, tmp_path: Path) -> Iterator[BookieFactory]:  # noqa: F811
    f = BookieFactory(zk_server.connect_string, zk_root, tmp_path)
    yield f
    f.stop_all()
