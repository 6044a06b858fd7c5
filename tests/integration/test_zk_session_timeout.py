"""The session timeout ZooKeeper grants, and how long a restart waits for a dead broker's registration to go."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import zk
from tests.zk_testing import ZkTarget
from zk import layout
from zk.managed_ledgers import BrokerInfo, BrokerMetadataStore
from zk.registry import BookieRegistry

REPO = Path(__file__).resolve().parents[2]


def _registered_by_a_process_killed(zk_connect: ZkTarget, register: str) -> None:
    """Run ``register`` (code that registers with ``store``, a 6 s session) in a child process, then kill it (-9)
    once it has: its registration stays until ZooKeeper expires that session."""
    script = (
        textwrap.dedent(
            f"""
        import time
        import zk
        store = zk.MetadataStore.connect({zk_connect.connect_string!r}, {zk_connect.root!r}, session_timeout_s=6.0)
        """
        )
        + textwrap.dedent(register)
        + 'print("registered", flush=True)\ntime.sleep(60)\n'
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "registered"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)


def test_the_session_timeout_is_the_one_zookeeper_granted(zk_connect: ZkTarget) -> None:
    """The test server's minSessionTimeout is 1 s (2 x its 500 ms tick): a client asking for 0.2 s is granted 1 s,
    which the stale-registration waits must use (before: 0.2, what the client asked for)."""
    store = zk.MetadataStore.connect(zk_connect.connect_string, zk_connect.root, session_timeout_s=0.2)
    try:
        assert store.session_timeout_s == 1.0
    finally:
        store.close()


def test_a_restart_waits_out_the_dead_brokers_longer_session(zk_connect: ZkTarget) -> None:
    """A broker run with a 6 s session (an older --zk-session-timeout-s) registers and is killed (-9); the broker
    restarted under its id with a 1 s session waited only its own timeout + 2 s (3 s) and was refused, 'another
    live ZooKeeper session', on the dead one's registration. The registration keeps its session's timeout, and
    the restart waits for the longer one: it registers once the dead session expires."""
    _registered_by_a_process_killed(
        zk_connect,
        """
        import asyncio
        from zk.managed_ledgers import BrokerInfo, BrokerMetadataStore
        info = BrokerInfo(service_url="pulsar://dead:1", web_service_url="http://dead:2")
        asyncio.run(BrokerMetadataStore(store).register_broker("dead:1", info))
        """,
    )
    store = zk.MetadataStore.connect(zk_connect.connect_string, zk_connect.root, session_timeout_s=1.0)
    try:
        info = BrokerInfo(service_url="pulsar://new:1", web_service_url="http://new:2")
        asyncio.run(BrokerMetadataStore(store).register_broker("dead:1", info))
        body = store.get_optional(layout.broker_path("dead:1"))
        assert body is not None and BrokerInfo.from_json(body.value) == BrokerInfo(
            service_url="pulsar://new:1", web_service_url="http://new:2", session_timeout_ms=1000
        )
    finally:
        store.close()


def test_a_bookie_restart_waits_out_the_dead_bookies_longer_session(zk_connect: ZkTarget) -> None:
    """As brokers' (above), for bookies: a bookie whose session was granted 6 s registers and is killed (-9); the
    one restarted under its id with a 1 s session waited only 1 + 2 s and was refused ('already registered by
    another live ZooKeeper session'). Its registration now keeps the timeout and the restart waits for it; what
    discovery returns is the info alone, and an older registration without the timeout still reads."""
    bid, info = "127.0.0.1:3181", {"host": "127.0.0.1", "port": 3181, "http_port": 8000}
    _registered_by_a_process_killed(
        zk_connect,
        f"""
        from zk.registry import BookieRegistry
        BookieRegistry(store).register({bid!r}, {{"port": 1}})
        """,
    )
    store = zk.MetadataStore.connect(zk_connect.connect_string, zk_connect.root, session_timeout_s=1.0)
    try:
        registry = BookieRegistry(store)
        registry.register(bid, info)
        body = store.get_optional(layout.available_bookie_path(bid))
        assert body is not None and body.value["session_timeout_ms"] == 1000, body
        assert registry.available() == {bid: info}
        store.create(layout.available_bookie_path("127.0.0.1:3182"), {"port": 3182})  # an older bookie's
        assert registry.available() == {bid: info, "127.0.0.1:3182": {"port": 3182}}
    finally:
        store.close()
