"""Dedup's skipped sequence ids (``Topic.fills_skipped_id``) across a failed write: a producer's send that fills
an id its stored sends jumped over, not stored because the write failed, is stored when sent again; a send that
jumps over ids, failed and sent again, leaves those ids to be filled once, not twice. An in-process broker (real
ZooKeeper and bookies), a raw producer that numbers its sends itself, the managed ledger's write failing once."""

from __future__ import annotations

import socket
import threading
import types
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.broker_testing import Brokers
from tests.integration.test_broker_gone_connection import _serving
from tests.integration.test_broker_pulsar_client import (
    _closed,
    _connect,
    _raw_answer,
    _raw_producer,
    _raw_send,
)
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import service as service_module
from topic_broker import wire
from topic_broker.managed_ledger import ManagedLedgerError

T = pb.BaseCommand


def stored(s: socket.socket, dec: Any) -> bool:
    """Whether the next receipt names a position: a send taken for a resend is answered -1:-1, not stored."""
    answer = _raw_answer(s, dec)
    assert answer.type == T.SEND_RECEIPT, answer
    return answer.send_receipt.message_id.ledgerId < 2**63  # (-1 in an unsigned field)


def first_stored(service: Any, prefix: str, name: str, payload: bytes) -> tuple[Any, str, socket.socket, Any]:
    """A new topic on the in-process broker's port, a raw producer ``name`` there, and its send of id 0 stored."""
    port = types.SimpleNamespace(port=service.config.port)
    t = f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:8]}"
    s, dec = _raw_producer(port, t, name)
    _raw_send(s, 0, payload)
    assert stored(s, dec)
    return port, t, s, dec


def fail_next_write(run: Callable[[Any], Any], ml: Any) -> None:
    """The managed ledger's next write (``append_from``) fails, as a write no bookie took."""

    async def fail() -> None:
        real = ml.append_from

        async def once(*_args: Any) -> None:
            ml.append_from = real
            raise ManagedLedgerError("injected write failure")

        ml.append_from = once

    run(fail())


def gated_walk(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """A SEND of sequence id 2 stands for a large compressed batch, walked in a worker thread: its walk waits
    for the first event; the second is set once the producer's held SENDs are taken."""
    gate = threading.Event()
    real_walk = service_module.dedup_walk

    def gated(seq: int, *args: Any) -> int | Callable[[], int]:
        found = real_walk(seq, *args)
        if seq != 2:
            return found

        def walk() -> int:
            assert gate.wait(60)
            return found if isinstance(found, int) else found()

        return walk

    monkeypatch.setattr(service_module, "dedup_walk", gated)
    held_done = threading.Event()
    real_held = service_module.Topic._publish_held

    async def observed(self: Any, p: Any) -> None:
        await real_held(self, p)
        held_done.set()

    monkeypatch.setattr(service_module.Topic, "_publish_held", observed)
    return gate, held_done


def test_a_send_filling_a_skipped_id_whose_write_failed_is_stored_when_sent_again(cluster: Brokers) -> None:
    with _serving(cluster) as (service, run):
        port = types.SimpleNamespace(port=service.config.port)
        t = f"persistent://public/default/skipped-{uuid.uuid4().hex[:8]}"
        s, dec = _raw_producer(port, t, "p")
        _raw_send(s, 0, b"m0")
        assert _raw_answer(s, dec).type == T.SEND_RECEIPT
        (fut,) = service.topics.values()
        ml = fut.result().ml

        def failing_once(s: socket.socket, seq: int) -> None:
            """``seq`` sent, its write failing: the broker closes the connection (as on any failed write)."""
            fail_next_write(run, ml)
            _raw_send(s, seq, f"m{seq}".encode())
            assert _closed(s)
            s.close()

        _raw_send(s, 2, b"m2")  # jumps over 1: stored
        assert stored(s, dec)
        failing_once(s, 1)  # fills 1: not stored
        s, dec = _raw_producer(port, t, "p")
        _raw_send(s, 1, b"m1")  # sent again: stored (was answered as a resend, and lost)
        assert stored(s, dec)
        failing_once(s, 4)  # jumps over 3: not stored
        s, dec = _raw_producer(port, t, "p")
        _raw_send(s, 4, b"m4")  # sent again, jumping over 3 again: stored
        assert stored(s, dec)
        _raw_send(s, 3, b"m3")  # fills 3: stored
        assert stored(s, dec)
        _raw_send(s, 3, b"m3")  # a resend of 3: not stored again (was, 3 being remembered twice as skipped)
        assert not stored(s, dec)
        s.close()


def test_sends_held_behind_a_walk_are_not_stored_after_a_failed_write_before_them(
    cluster: Brokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed write closes the connection so that nothing sent after it is stored before its resend (dedup
    would take that resend for a duplicate, or store it out of its order): the SENDs held behind a batch walked
    in a worker thread meanwhile are not stored either."""
    gate, held_done = gated_walk(monkeypatch)
    with _serving(cluster) as (service, run):
        port, t, s, dec = first_stored(service, "held", "p", b"m0")
        (fut,) = service.topics.values()
        fail_next_write(run, fut.result().ml)
        frames = []
        for seq in (1, 2, 3):  # read at once: 1's write fails; 2 is walked, 3 held behind it
            send = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=seq))
            md = pb.MessageMetadata(producer_name="x", sequence_id=seq, publish_time=1)
            frames.append(wire.encode_send(send, md, f"m{seq}".encode()))
        s.sendall(b"".join(frames))
        assert _closed(s)
        s.close()
        gate.set()
        assert held_done.wait(30)  # what was held is taken (or dropped) before the client sends again
        s, dec = _raw_producer(port, t, "p")
        for seq in (1, 2, 3):  # the client sends again what was not acknowledged
            _raw_send(s, seq, f"m{seq}".encode())
            # each stored now, in its order: 2 and 3 were stored before 1 (its resend filled a skipped id),
            # and their own resends answered as such
            assert stored(s, dec), seq
        s.close()


def test_sends_held_behind_a_walk_are_not_stored_after_their_producer_is_fenced(
    cluster: Brokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ExclusiveWithFencing producer closes the topic's other producers: what they sent is stored before its
    messages or not at all, also their SENDs held behind a batch walked in a worker thread meanwhile."""
    gate, held_done = gated_walk(monkeypatch)
    with _serving(cluster) as (service, run):
        port, t, s, dec = first_stored(service, "fenced", "a", b"a0")
        _raw_send(s, 2, b"a2")  # walked (held until the fencing producer has stored b0)
        f = socket.create_connection(("127.0.0.1", port.port), timeout=30)
        _connect(f)
        cmd = pb.CommandProducer(
            topic=t,
            producer_id=1,
            request_id=1,
            producer_name="b",
            producer_access_mode=pb.ExclusiveWithFencing,
        )
        f.sendall(wire.encode_command(T(type=T.PRODUCER, producer=cmd)))
        fdec = wire.FrameDecoder()
        frames: list[Any] = []
        while not frames:
            frames = fdec.feed(f.recv(65536))
        assert frames[0].command.type == T.PRODUCER_SUCCESS, frames[0].command
        _raw_send(f, 0, b"b0")
        assert stored(f, fdec)
        gate.set()
        assert held_done.wait(30)
        _raw_send(f, 1, b"b1")  # stored behind whatever the fenced producer's walk let through
        assert stored(f, fdec)
        (fut,) = service.topics.values()
        assert fut.result().ml.view().total_entries() == 3  # a0, b0, b1 (a2 was stored between them)
        s.close()
        f.close()


def test_a_batch_filling_skipped_ids_sent_again_is_not_stored_twice(cluster: Brokers) -> None:
    """The batch 1, 3, 5 of a producer whose delayed messages 0, 2, 4 went ahead of it fills 1 and 3 and is
    stored; sent again (its receipt lost with its connection), it is a resend. Its last id, 5, above the 4 of
    the delayed ones, was not remembered by the fill, so the resend was taken for new messages and stored twice."""
    broker = cluster.start()
    t = f"persistent://public/default/refill-{uuid.uuid4().hex[:8]}"
    s, dec = _raw_producer(broker, t, "p")
    for seq in (0, 2, 4):  # the delayed messages, each on its own
        _raw_send(s, seq, f"m{seq}".encode())
        assert stored(s, dec)

    def send_batch(s: socket.socket) -> None:
        send = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=1, highest_sequence_id=5))
        md = pb.MessageMetadata(producer_name="p", sequence_id=1, highest_sequence_id=5, publish_time=1)
        s.sendall(wire.encode_send(send, md, b"batch 1, 3, 5"))

    send_batch(s)
    assert stored(s, dec)
    s.close()
    s, dec = _raw_producer(broker, t, "p")
    send_batch(s)  # the same batch again, on a new connection
    assert not stored(s, dec)
    _raw_send(s, 6, b"m6")
    assert stored(s, dec)
    s.close()
