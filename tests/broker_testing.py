"""pytest fixtures for tests that run topic broker processes beside the bookies of ``tests/conftest.py``.

tests/integration/conftest.py imports the fixtures; a test module imports ``Brokers`` for its annotations.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerstore.cluster import BrokerProcess, free_port


def admin_json(port: int, method: str, path: str, body: Any = None, timeout: float = 60.0) -> tuple[int, Any]:
    """One call to the admin REST on 127.0.0.1:``port``, a JSON body (or none): its status and parsed answer (None
    when empty), an HTTP error's as well."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return int(r.status), json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return int(e.code), json.loads(raw) if raw else None


def start_broker(
    bookies: Any, tmp: Path, session_timeout_s: float, *extra: str, env: dict[str, str] | None = None
) -> BrokerProcess:
    """A broker process on free ports against the bookies' ZooKeeper and metadata root (not waited for), ``env``
    added to its environment."""
    port = free_port()
    bp = BrokerProcess(
        zk=bookies.zk,
        zk_root=bookies.root,
        port=port,
        http_port=free_port(),
        extra_args=["--zk-session-timeout-s", f"{session_timeout_s:g}", *extra],
        log_path=tmp / f"broker-{port}.log",
        env=dict(env or {}),
    )
    return bp.start(wait=False)


class Brokers:
    """Broker processes on the bookies' ZooKeeper, each with its own ports and log file; stopped at the end."""

    def __init__(self, bookies: Any, tmp: Path) -> None:
        self.bookies = bookies
        self.tmp = tmp
        self.procs: list[BrokerProcess] = []

    def start(self, *extra: str, env: dict[str, str] | None = None) -> BrokerProcess:
        """A broker serving both its Pulsar port and its admin HTTP (``BrokerProcess.ready``)."""
        bp = start_broker(self.bookies, self.tmp, 4, *extra, env=env)
        self.procs.append(bp)
        bp.wait_ready(60)
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


def produce_consume(c: Any, topic: str, n: int = 5) -> list[bytes]:
    """``n`` messages ``m-<i>`` through a ``pulsar.Client``: subscribed from the earliest, sent, received, acked."""
    import pulsar

    consumer = c.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = c.create_producer(topic)
    for i in range(n):
        producer.send(f"m-{i}".encode())
    got = []
    for _ in range(n):
        m = consumer.receive(timeout_millis=10_000)
        consumer.acknowledge(m)
        got.append(m.data())
    return got


@contextlib.contextmanager
def module_cluster(zk_server: Any, tmp: Path, *broker_args: str) -> Iterator[Brokers]:
    """3 bookies on their own metadata root and one broker started (with ``broker_args``), for a module's tests
    to share (broker tests are slow); everything is stopped on exit."""
    from tests.conftest import BookieFactory
    from tests.zk_testing import unique_root

    bookies = BookieFactory(zk_server.connect_string, unique_root(), tmp)
    b = Brokers(bookies, tmp)
    try:
        bookies.start_many(3)
        b.start(*broker_args)
        yield b
    finally:
        try:
            b.stop_all()
        finally:
            bookies.stop_all()


def topic_opening_commands(topic: str) -> list[Any]:
    """What a client sends to open ``topic``, each command with its request id: PARTITIONED_METADATA 1, LOOKUP
    2, PRODUCER 3 and SUBSCRIBE 4 (subscription "s"), to send on one connection, so that every answer is seen
    (a client stops at the first refusal)."""
    from topic_broker import pulsar_api_pb2 as pb

    T = pb.BaseCommand
    sub = pb.CommandSubscribe(topic=topic, subscription="s", subType=pb.CommandSubscribe.Exclusive)
    sub.consumer_id, sub.request_id = 1, 4
    return [
        T(
            type=T.PARTITIONED_METADATA,
            partitionMetadata=pb.CommandPartitionedTopicMetadata(topic=topic, request_id=1),
        ),
        T(type=T.LOOKUP, lookupTopic=pb.CommandLookupTopic(topic=topic, request_id=2)),
        T(type=T.PRODUCER, producer=pb.CommandProducer(topic=topic, producer_id=1, request_id=3)),
        T(type=T.SUBSCRIBE, subscribe=sub),
    ]


@contextlib.contextmanager
def in_process_broker(brokers: Brokers, **config: Any) -> Iterator[tuple[Any, Callable[[Any], Any]]]:
    """A started ``BrokerService`` in this process (its event loop on a thread of its own) beside ``brokers``,
    on their ZooKeeper and free ports, ``config`` its other ``BrokerConfig`` fields; yields it and ``run``, which
    runs a coroutine on its loop and answers its result. Stopped at the end."""
    import asyncio
    import threading

    from topic_broker.service import BrokerConfig, BrokerService

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)

    service = BrokerService(
        BrokerConfig(
            zk=brokers.bookies.zk,
            zk_root=brokers.bookies.root,
            port=free_port(),
            http_port=free_port(),
            **config,
        )
    )
    try:
        run(service.start())
        try:
            yield service, run
        finally:
            run(service.stop())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


class CursorReadGate:
    """The ``nth`` read of a stored cursor through ``store.get_cursor`` (a broker's metadata store) held on the
    in-process broker's loop until released: a test holds one interleaving of two cursor openings in place so.
    ``loop`` is that broker's event loop (``run`` runs a coroutine on it, as :func:`in_process_broker` yields)."""

    def __init__(self, store: Any, run: Callable[[Any], Any], nth: int) -> None:
        import asyncio
        import threading

        async def running_loop() -> asyncio.AbstractEventLoop:
            return asyncio.get_running_loop()

        self.loop = run(running_loop())
        self.reached = threading.Event()
        self._open = asyncio.Event()
        self._store, self.read, self._nth, self._calls = store, store.get_cursor, nth, 0
        store.get_cursor = self._gate

    async def _gate(self, ml_name: str, sub: str) -> Any:
        self._calls += 1
        if self._calls == self._nth:
            self.reached.set()
            await self._open.wait()
        return await self.read(ml_name, sub)

    def release_after(self, other: Any, wait_s: float = 1.0) -> None:
        """Lets the held read go once ``other`` (a concurrent future run meanwhile) is done, or after ``wait_s``
        (it is held off by the gated operation then)."""
        import time

        deadline = time.monotonic() + wait_s
        while not other.done() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.loop.call_soon_threadsafe(self._open.set)

    def remove(self) -> None:
        self._store.get_cursor = self.read


@contextlib.contextmanager
def swapped(obj: Any, attr: str, value: Any) -> Iterator[None]:
    """``obj.attr`` set to ``value`` (a broker's metadata call failing as the test makes it) for the ``with``
    block, then the class's own again."""
    setattr(obj, attr, value)
    try:
        yield
    finally:
        delattr(obj, attr)


@contextlib.contextmanager
def before_first_call(
    obj: Any,
    attr: str,
    other: Callable[[], Awaitable[Any]],
    *,
    when: Callable[..., bool] = lambda *args, **kwargs: True,
) -> Iterator[list[Any]]:
    """``obj.attr`` (an async method, a broker's metadata call) wrapped for the ``with`` block: its first call for
    which ``when(*args)`` holds awaits ``other()`` first (a race test's other call, made in the window before this
    call goes on), then goes on. Yields the list that gets ``other()``'s result, or the exception it raised."""
    real = getattr(obj, attr)
    outcome: list[Any] = []
    started: list[bool] = []

    async def call(*args: Any, **kwargs: Any) -> Any:
        if not started and when(*args, **kwargs):
            started.append(True)
            try:
                outcome.append(await other())
            except Exception as e:
                outcome.append(e)
        return await real(*args, **kwargs)

    setattr(obj, attr, call)
    try:
        yield outcome
    finally:
        delattr(obj, attr)  # the class's method again


class ServedOnAThread:
    """``topic_broker.main.serve`` running on a thread of its own (see :func:`serve_on_a_thread`): its started
    ``service``, the ``thread``, ``rc`` (serve's exit status once it returned) and ``stop`` (its stop event)."""

    def __init__(self, service: Any, thread: Any, rc: list[int], stop: Any) -> None:
        self.service = service
        self.thread = thread
        self.rc = rc
        self.stop = stop

    def stop_and_join(self, timeout_s: float = 30.0) -> None:
        """Set ``stop`` on the service's loop and wait for serve to return."""
        self.service._loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(timeout_s)


def broker_config(bookies: Any, broker_id: str, **config: Any) -> Any:
    """A ``BrokerConfig`` for a broker in this process on the bookies' ZooKeeper and metadata root, on free ports
    (listening on 127.0.0.1), with id ``broker_id`` and ``config`` its other fields."""
    from topic_broker.service import BrokerConfig

    return BrokerConfig(
        **{
            "zk": bookies.zk,
            "zk_root": bookies.root,
            "port": free_port(),
            "http_port": free_port(),
            "listen_address": "127.0.0.1",
            "broker_id": broker_id,
            **config,
        }
    )


def serve_on_a_thread(config: Any, monkeypatch: pytest.MonkeyPatch) -> ServedOnAThread:
    """``broker serve``'s own ``serve(config, stop)`` (its start checks, its registration, its shutdown when it
    cannot register again) run on a thread, as a process would run it, with its ``BrokerService`` kept for the
    test; returns once the service has started (30 s at most)."""
    import asyncio
    import threading

    import topic_broker.main as broker_main
    from tests.zk_testing import wait_for
    from topic_broker.service import BrokerService

    services: list[BrokerService] = []

    class Captured(BrokerService):
        async def start(self) -> None:
            await super().start()
            services.append(self)

    monkeypatch.setattr(broker_main, "BrokerService", Captured)
    stop = asyncio.Event()
    rc: list[int] = []
    thread = threading.Thread(
        target=lambda: rc.append(asyncio.run(broker_main.serve(config, stop))), daemon=True
    )
    thread.start()
    assert wait_for(lambda: bool(services), 30), "the broker did not start"
    service = services[0]
    assert service.meta is not None and service.bk is not None
    return ServedOnAThread(service, thread, rc, stop)
