"""Leftovers of review 20: one bind per port in the start-up ports gate."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

import topic_broker.main as broker_main
from bookie import server_gate
from bookie.main import Bookie, BookieConfig, StartRefusal
from ledgerstore.cluster import free_port
from topic_broker.service import BrokerConfig

NOT_HERE = "10.255.255.1"  # an address this host does not have: every port unbindable


def _count_lookups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ports the gate looks up (one getaddrinfo per port and pass, then a bind per address)."""
    asked: list[int] = []
    real = socket.getaddrinfo

    def counted(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(port)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(server_gate.socket, "getaddrinfo", counted)
    return asked


def test_a_broker_start_tries_each_port_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`broker serve --listen-address 10.255.255.1`: refused (exit 1) before anything is registered, each of
    its two ports tried once (it was twice: a pass for ports in use, another for unbindable ones)."""
    asked = _count_lookups(monkeypatch)
    config = BrokerConfig(listen_address=NOT_HERE, port=free_port(), http_port=free_port())
    assert asyncio.run(broker_main.serve(config, asyncio.Event())) == 1
    assert sorted(asked) == sorted([config.port, config.http_port])


def test_a_bookie_start_tries_each_port_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A new bookie advertised at an address this host does not have: refused, each port tried once."""
    asked = _count_lookups(monkeypatch)
    config = BookieConfig(
        zk="127.0.0.1:1",
        data_dir=tmp_path,
        port=free_port(),
        http_port=free_port(),
        advertised_address=NOT_HERE,
    )
    with pytest.raises(StartRefusal, match=f"cannot listen on {NOT_HERE}: port {config.port} \\(--port\\): "):
        Bookie(config)._refuse_ports_in_use()
    assert sorted(asked) == sorted([config.port, config.http_port])


def test_port_problems_splits_ports_in_use_from_unbindable() -> None:
    """One pass gives both lists: a port another process listens on, and a free one, at an address here."""
    with socket.create_server(("127.0.0.1", 0)) as busy:
        taken = busy.getsockname()[1]
        free = free_port()
        assert server_gate.port_problems("127.0.0.1", {"--port": taken, "--http-port": free}) == (
            [f"port {taken} (--port)"],
            [],
        )
    found = server_gate.port_problems(NOT_HERE, {"--port": free})
    assert found.in_use == []
    assert [u.split(": ")[0] for u in found.unbindable] == [f"port {free} (--port)"]


def test_backoff_gives_the_pauses_the_retry_loops_had() -> None:
    """zk.backoff.backoff: the pauses of the bookie's and the broker's registration retries (0.1 s doubling to
    2 s), the admin's deleting/ znode removal (0.5 s to 5 s) and a ledger recovery's attempts (0.2 * 2**attempt
    up to 2 s, from the second attempt)."""
    from itertools import islice

    from zk.backoff import backoff

    assert list(islice(backoff(0.1, 2.0), 7)) == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert list(islice(backoff(0.5, 5.0), 5)) == [0.5, 1.0, 2.0, 4.0, 5.0]
    assert list(islice(backoff(0.4, 2.0), 6)) == [min(2.0, 0.2 * 2**a) for a in range(1, 7)]
    with pytest.raises(ValueError):
        next(backoff(0.0, 1.0))
    with pytest.raises(ValueError):
        next(backoff(2.0, 1.0))
