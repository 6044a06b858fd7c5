"""A broker whose listener fails to start after it registered (real ZooKeeper, one bookie, the broker in this
process)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

import topic_broker.main as broker_main
import zk
from ledgerstore.cluster import free_port
from topic_broker.service import BrokerConfig
from zk import layout
from zk.errors import MetadataNotFoundError


def test_a_listener_failing_after_registration_unregisters_the_broker(
    bookies: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port is taken between the start-up check and the bind (the check is skipped here to make that race
    certain): serve() fails, and brokers/<id> is gone at once, not when the session times out."""
    bookies.start()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    monkeypatch.setattr(broker_main, "ports_in_use", lambda host, ports: [])
    monkeypatch.setattr(broker_main, "ports_unbindable", lambda host, ports: [])
    config = BrokerConfig(
        zk=bookies.zk,
        zk_root=bookies.root,
        port=port,
        http_port=free_port(),
        listen_address="127.0.0.1",
        broker_id="start-fails",
        zk_session_timeout_s=30.0,
    )
    try:
        with pytest.raises(OSError):
            asyncio.run(broker_main.serve(config, asyncio.Event()))
    finally:
        taken.close()
    store = zk.MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        with pytest.raises(MetadataNotFoundError):
            store.get(layout.broker_path("start-fails"))
    finally:
        store.close()
