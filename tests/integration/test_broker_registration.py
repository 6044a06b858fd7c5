"""A broker started with the id of a broker that runs (real ZooKeeper, 3 bookies, two broker processes)."""

from __future__ import annotations

import subprocess

import zk
from tests.broker_testing import Brokers, cluster, start_broker  # noqa: F401
from zk import layout


def test_a_second_broker_with_a_running_brokers_id_is_refused(cluster: Brokers) -> None:  # noqa: F811
    """It took the first's brokers/<id> registration over (and served beside it); now it waits for a crashed
    broker's registration to go (its session timeout + 2 s), then refuses to start, exit 1, the first's left."""
    first = cluster.start("--broker-id", "dup-broker")
    second = start_broker(cluster.bookies, cluster.tmp, 2, "--broker-id", "dup-broker")
    assert second.proc is not None
    try:
        rc = second.proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        if second.proc.poll() is None:
            second.kill9()
    assert rc == 1
    assert "already registered by another live ZooKeeper session" in second.log_path.read_text()
    store = zk.MetadataStore.connect(cluster.bookies.zk, root=cluster.bookies.root)
    try:
        assert store.get(layout.broker_path("dup-broker")).value["service_url"] == first.service_url
    finally:
        store.close()
