"""pytest fixtures for tests that run topic broker processes beside the bookies of ``tests/conftest.py``.

tests/integration/conftest.py imports the fixtures; a test module imports ``Brokers`` for its annotations.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess, free_port, health_ok


class Brokers:
    """Broker processes on the bookies' ZooKeeper, each with its own ports and log file; stopped at the end."""

    def __init__(self, bookies: Any, tmp: Path) -> None:
        self.bookies = bookies
        self.tmp = tmp
        self.procs: list[BrokerProcess] = []

    def start(self, *extra: str, timeout_s: float = 30.0) -> BrokerProcess:
        """A broker serving both its Pulsar port and its admin HTTP (``/health`` 200)."""
        port = free_port()
        bp = BrokerProcess(
            zk=self.bookies.zk,
            zk_root=self.bookies.root,
            port=port,
            http_port=free_port(),
            extra_args=["--zk-session-timeout-s", "4", *extra],
            log_path=self.tmp / f"broker-{port}.log",
        )
        self.procs.append(bp)
        bp.start()
        deadline = time.monotonic() + timeout_s
        while not health_ok(bp.http_port):
            if time.monotonic() > deadline:
                raise TimeoutError(f"broker admin not up: {bp.log_tail()}")
            time.sleep(0.1)
        return bp

    def stop_all(self) -> None:
        for bp in self.procs:
            try:
                bp.stop()
            except Exception:
                bp.kill9()


@pytest.fixture
def cluster(bookies: Any, tmp_path: Path) -> Iterator[Brokers]:
    """3 bookies and no broker yet: ``cluster.start()`` starts one."""
    bookies.start_many(3)
    b = Brokers(bookies, tmp_path)
    yield b
    b.stop_all()


@pytest.fixture
def broker(cluster: Brokers) -> BrokerProcess:
    """One broker on 3 bookies."""
    return cluster.start()
