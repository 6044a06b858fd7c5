"""The bookie connection's AUTH step, without sockets (a recording transport): what is served before, with and
after a token, in each mode."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from bookie import protocol as p
from bookie.auth import TokenVerifier, create_token
from bookie.core import BookieCore
from bookie.entryformat import DigestType, EntryCodec
from bookie.memjournal import ManualScheduler, MemoryJournal
from bookie.server import BookieConnection, BookieServer, ServerAuth
from bookie.storage import MemoryLedgerStorage
from tests.unit.test_bookie_backpressure import KEY, RecordingTransport

SECRET = b"k" * 32
# A day: the module is imported at collection, and the whole suite may run for longer than minutes before this.
TOKEN = create_token(SECRET, "writer", expires_in_s=86_400)


class Rig:
    def __init__(self, auth: ServerAuth) -> None:
        self.journal = MemoryJournal()
        self.sched = ManualScheduler()
        self.core = BookieCore(MemoryLedgerStorage(), self.journal.append, self.sched)
        self.server = BookieServer(self.core, auth=auth)
        self.conn = BookieConnection(self.server)
        self.transport = RecordingTransport()
        self.conn.connection_made(self.transport)  # type: ignore[arg-type]

    async def send(self, *msgs: p.Request) -> list[p.Response]:
        self.conn.data_received(b"".join(p.encode(m) for m in msgs))
        self.journal.sync()
        self.sched.run_ready()
        await asyncio.sleep(0)
        dec = p.FrameDecoder()
        for chunk in self.transport.written:
            dec.feed(chunk)
        return list(dec.responses())


def _adds(n: int, first_rid: int = 10) -> list[p.Request]:
    codec = EntryCodec(1, DigestType.CRC32C)
    return [
        p.AddEntryRequest(
            request_id=first_rid + e,
            ledger_id=1,
            entry_id=e,
            master_key=KEY,
            entry=codec.build(e, e - 1, e, b"x"),
        )
        for e in range(n)
    ]


def _auth(token: str | None) -> p.AuthRequest:
    if token is None:
        return p.AuthRequest(request_id=1)
    return p.AuthRequest(request_id=1, method=p.AuthMethod.TOKEN, credential=token.encode())


def _sync(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test in its own loop (the connection needs a running loop)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return run


REQUIRED = ServerAuth(verifier=TokenVerifier(SECRET), required=True)
OPTIONAL = ServerAuth(verifier=TokenVerifier(SECRET))
OFF = ServerAuth()


@_sync
async def test_a_good_token_then_pipelined_adds_are_all_served() -> None:
    r = Rig(REQUIRED)
    resps = await r.send(_auth(TOKEN), *_adds(5))
    assert isinstance(resps[0], p.AuthResponse) and resps[0].subject == "writer"
    assert resps[0].mode == p.AuthMode.REQUIRED
    assert [x.status for x in resps] == [p.Status.OK] * 6
    assert r.conn.principal == "writer" and "close" not in r.transport.calls
    more = await r.send(*_adds(3, first_rid=100))  # later chunks take the add fast path
    assert len(more) == 9 and all(x.status == p.Status.OK for x in more)


@pytest.mark.parametrize("first", ["add", "none", "bad", "foreign"])
@_sync
async def test_with_auth_required_nothing_is_served_without_a_good_token(first: str) -> None:
    r = Rig(REQUIRED)
    leads: dict[str, list[p.Request]] = {
        "add": [],
        "none": [_auth(None)],
        "bad": [_auth(TOKEN[:-3] + "xyz")],
        "foreign": [_auth(create_token(b"z" * 32, "writer"))],
    }
    resps = await r.send(*leads[first], *_adds(4))
    assert [x.status for x in resps] == [p.Status.UNAUTHORIZED]  # one refusal, then the connection closes
    assert "close" in r.transport.calls and 1 not in r.core.ledgers
    assert r.server.auth_refused == 1


@_sync
async def test_with_a_secret_but_not_required_a_bad_token_is_refused_and_none_is_allowed() -> None:
    r = Rig(OPTIONAL)
    assert [x.status for x in await r.send(*_adds(2))] == [p.Status.OK] * 2
    r2 = Rig(OPTIONAL)
    assert [x.status for x in await r2.send(_auth(TOKEN[:-3] + "xyz"), *_adds(2))] == [p.Status.UNAUTHORIZED]
    r3 = Rig(OPTIONAL)
    resps = await r3.send(_auth(None), *_adds(1))
    assert (
        isinstance(resps[0], p.AuthResponse) and resps[0].mode == p.AuthMode.OPTIONAL and resps[1].status == 0
    )


@_sync
async def test_with_auth_off_any_auth_is_accepted_and_optional() -> None:
    r = Rig(OFF)
    resps = await r.send(_auth("not even a token"), *_adds(1))
    assert isinstance(resps[0], p.AuthResponse) and resps[0].mode == p.AuthMode.OFF and not resps[0].subject
    assert [x.status for x in resps] == [p.Status.OK] * 2


@_sync
async def test_auth_that_is_not_the_first_frame_closes_the_connection() -> None:
    r = Rig(OPTIONAL)
    resps = await r.send(*_adds(1), _auth(TOKEN), *_adds(1, first_rid=50))
    # (the add before it was taken, but its answer comes after the refusal closed the connection)
    assert [x.status for x in resps] == [p.Status.BAD_REQUEST]
    assert "close" in r.transport.calls


def test_auth_required_needs_a_secret() -> None:
    with pytest.raises(ValueError):
        ServerAuth(required=True)
