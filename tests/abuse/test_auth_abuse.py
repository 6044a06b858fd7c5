"""Authentication and squatting against real bookie processes (docs/operations.md, "Authentication").

With ``--auth-required`` a stranger with nothing but a socket is answered UNAUTHORIZED and cut off whatever it
sends, and nothing changes on the bookies; a token that expired or was signed by another key fares no better; an
honest client with a token works, with every request pipelined behind its AUTH. With authentication off, a
stranger's fences of future ledger ids no longer lock their owner out, and a reader goes on with the other
replicas when one answers UNAUTHORIZED.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from bookie import auth
from bookie import protocol as p
from ledger_client import BookKeeper as AsyncBookKeeper
from ledger_client import ClientConfig, UnauthorizedError
from ledger_client.bookie_conn import BookiePool, Security, client_tls_context
from ledger_client.sync import BookKeeper
from tests.abuse.helpers import http, ledger_ids, metric
from tests.integration.rawbookie import KEY, build
from tests.tls_testing import needs_openssl, self_signed
from zk import MetadataStore
from zk.ledger_metadata import Ensemble, LedgerMetadataStore

BOGUS = p.master_key(b"a stranger's password")


def _secret(tmp: Path, name: str = "secret") -> tuple[Path, bytes]:
    path = tmp / name
    key = auth.new_secret()
    path.write_bytes(key)
    os.chmod(path, 0o600)
    return path, key


def _exchange(address: str, frames: bytes, timeout_s: float = 5.0) -> tuple[list[p.Response], bool]:
    """Send raw frames; the responses received, and whether the bookie closed the connection."""
    host, _, port = address.rpartition(":")
    dec = p.FrameDecoder()
    out: list[p.Response] = []
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(frames)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                return out, False
            except ConnectionResetError:
                return out, True
            if not chunk:
                return out, True
            dec.feed(chunk)
            out.extend(dec.responses())
    return out, False


def _stranger_requests(ledger: int, future: int) -> list[p.Request]:
    """One of every request type a stranger can send: writes, reads, fences (of a real and a future ledger)."""
    return [
        p.AddEntryRequest(
            request_id=1, ledger_id=future, entry_id=0, master_key=BOGUS, entry=build(future, 0)
        ),
        p.AddEntryRequest(
            request_id=2, ledger_id=ledger, entry_id=99, master_key=KEY, entry=build(ledger, 99)
        ),
        p.ReadEntryRequest(request_id=3, ledger_id=ledger, entry_id=0, master_key=KEY),
        p.ReadEntryRequest(
            request_id=4, ledger_id=future, entry_id=p.LAST_ENTRY, master_key=BOGUS, flags=p.Flag.FENCE
        ),
        p.ReadEntryRequest(
            request_id=5, ledger_id=ledger, entry_id=p.LAST_ENTRY, master_key=KEY, flags=p.Flag.FENCE
        ),
        p.ReadLacRequest(request_id=6, ledger_id=ledger, master_key=KEY),
        p.WriteLacRequest(request_id=7, ledger_id=ledger, lac=50, master_key=KEY, lac_blob=b"x" * 20),
        p.ReadRangeRequest(request_id=8, ledger_id=ledger, first_entry_id=0, last_entry_id=9, master_key=KEY),
        p.BookieInfoRequest(request_id=9),
    ]


def test_with_auth_required_a_stranger_is_refused_everything_and_changes_nothing(
    bookies, tmp_path: Path
) -> None:
    secret_file, secret = _secret(tmp_path)
    flags = ("--auth-secret-file", str(secret_file), "--auth-required", "--gc-interval-s", "3600")
    procs = bookies.start_many(3, *flags)
    token = auth.create_token(secret, "owner", expires_in_s=3600)
    bk = BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root, auth_token=token))
    try:
        # the honest client with a token: write and read (its requests pipelined behind AUTH)
        lh = bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"secret")
        lh.append_many([b"entry %d" % i for i in range(10)])
        lid = lh.ledger_id
        before = {bp.id: ledger_ids(bp) for bp in procs}
        future = range(lid + 1, lid + 6)

        # a stranger with a socket: every request type, alone or pipelined, is answered UNAUTHORIZED and cut off
        for bp in procs:
            for req in _stranger_requests(lid, future[0]):
                resps, closed = _exchange(bp.id, p.encode(req))
                assert closed and [r.status for r in resps] == [p.Status.UNAUTHORIZED], (req, resps)
                assert resps[0].request_id == req.request_id
            everything = b"".join(p.encode(r) for r in _stranger_requests(lid, future[1]))
            resps, closed = _exchange(bp.id, everything)
            assert closed and [r.status for r in resps] == [p.Status.UNAUTHORIZED]
            for fid in future:  # the attack: fence the next ids with a bogus key
                fence = p.ReadEntryRequest(
                    request_id=1, ledger_id=fid, entry_id=p.LAST_ENTRY, master_key=BOGUS, flags=p.Flag.FENCE
                )
                resps, closed = _exchange(bp.id, p.encode(fence))
                assert closed and resps[0].status == p.Status.UNAUTHORIZED

        # tokens that must not work: expired, signed by another key, garbage; and AUTH with no token
        other = auth.new_secret()
        bad_tokens = [
            auth.create_token(secret, "owner", expires_in_s=1, now=time.time() - 10),
            auth.create_token(other, "owner", expires_in_s=3600),
            token[:-2] + ("AA" if not token.endswith("AA") else "BB"),
        ]
        pipelined_add = p.encode(_stranger_requests(lid, future[2])[0])
        for bad in bad_tokens:
            req = p.AuthRequest(request_id=77, method=p.AuthMethod.TOKEN, credential=bad.encode())
            resps, closed = _exchange(procs[0].id, p.encode(req) + pipelined_add)
            assert closed and len(resps) == 1, resps
            assert isinstance(resps[0], p.AuthResponse) and resps[0].status == p.Status.UNAUTHORIZED
        resps, closed = _exchange(procs[0].id, p.encode(p.AuthRequest(request_id=1)) + pipelined_add)
        assert closed and [r.status for r in resps] == [p.Status.UNAUTHORIZED]

        # a client whose token is refused: its requests fail with UnauthorizedError, not a hang
        async def with_bad_token() -> None:
            pool = BookiePool(security=Security(auth_token=bad_tokens[1]))
            try:
                conn = await pool.get(procs[0].id)
                await conn.request(lambda rid: p.BookieInfoRequest(request_id=rid), 10)
            finally:
                await pool.close()

        with pytest.raises(UnauthorizedError, match="refused the client's token"):
            asyncio.run(with_bad_token())

        # nothing changed on any bookie: no new ledger, no fence, no entry, no LAC
        for bp in procs:
            assert ledger_ids(bp) == before[bp.id]
            _, row = http(bp, "GET", f"/api/v1/ledgers/{lid}")
            assert row["fenced"] is False and row["explicit_lac"] < 50 and row["last_entry_id"] == 9
            assert metric(bp, "bookie_auth_refused_total") >= 11
            assert "unauthenticated" in bp.log_tail(400)

        # the owner goes on: writes more, creates the ledgers whose ids the stranger tried, and recovers one
        lh.append(b"entry 10")
        assert [e.data for e in lh.read(0, 10)][-1] == b"entry 10"
        new_ids = []
        for _ in range(3):
            nl = bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"secret")
            nl.append_many([b"a", b"b"])
            new_ids.append(nl.ledger_id)
        assert set(new_ids) & set(future)
        other_bk = BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root, auth_token=token))
        try:
            recovered = other_bk.open_ledger(new_ids[0], password=b"secret")  # fences and recovers it
            assert recovered.last_add_confirmed == 1
            assert [e.data for e in recovered.read(0, 1)] == [b"a", b"b"]
        finally:
            other_bk.close()

        # admin HTTP: the mutating endpoint needs the token; read-only ones stay open by default
        status, _ = http(procs[0], "PUT", "/api/v1/gc")
        assert status == 401
        assert (
            http(procs[0], "GET", "/api/v1/ledgers")[0] == 200 and http(procs[0], "GET", "/health")[0] == 200
        )
        hreq = urllib.request.Request(
            f"http://127.0.0.1:{procs[0].http_port}/api/v1/gc",
            method="PUT",
            headers={"Authorization": f"Bearer {bad_tokens[1]}"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(hreq, timeout=30)
        assert refused.value.code == 401
        hreq = urllib.request.Request(
            f"http://127.0.0.1:{procs[0].http_port}/api/v1/gc",
            method="PUT",
            headers={"Authorization": f"Bearer {token}"},
        )
        with urllib.request.urlopen(hreq, timeout=30) as r:
            assert r.status == 200
        assert metric(procs[0], "bookie_admin_unauthorized_total") == 2
    finally:
        bk.close()


def test_a_strangers_wrong_password_delete_is_refused(bookies) -> None:
    bookies.start_many(1)
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    try:
        lh = bk.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1, password=b"secret")
        lh.append(b"kept")
        lh.close()

        async def stranger_delete() -> None:
            async with await AsyncBookKeeper.connect(bookies.zk, zk_root=bookies.root) as sbk:
                await sbk.delete_ledger(lh.ledger_id, password=b"guess")

        with pytest.raises(UnauthorizedError):
            asyncio.run(stranger_delete())
        assert [e.data for e in bk.open_ledger(lh.ledger_id, password=b"secret").read(0, 0)] == [b"kept"]
    finally:
        bk.close()


def test_with_auth_off_a_strangers_fences_of_future_ids_do_not_lock_the_owner_out(bookies) -> None:
    procs = bookies.start_many(3, "--gc-interval-s", "3600")
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    try:
        first = bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"secret")
        future = range(first.ledger_id + 1, first.ledger_id + 6)
        for bp in procs:  # the attack, with auth off: fence the next ledger ids with a bogus key
            frames = b"".join(
                p.encode(
                    p.ReadEntryRequest(
                        request_id=i,
                        ledger_id=fid,
                        entry_id=p.LAST_ENTRY,
                        master_key=BOGUS,
                        flags=p.Flag.FENCE,
                    )
                )
                for i, fid in enumerate(future, 1)
            )
            resps, _ = _exchange(bp.id, frames, timeout_s=2.0)
            assert [r.status for r in resps] == [p.Status.NO_ENTRY] * len(
                future
            )  # answered: fenced for BOGUS
        made = []
        for _ in range(len(future)):
            lh = bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"secret")
            lh.append_many([b"x%d" % i for i in range(5)])
            made.append(lh)
        assert {lh.ledger_id for lh in made} & set(future)
        # recovery by another client (the writer still open): fences with the owner's key and closes at 4
        other = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
        try:
            for lh in made:
                rec = other.open_ledger(lh.ledger_id, password=b"secret")
                assert rec.last_add_confirmed == 4
                assert [e.data for e in rec.read(0, 4)] == [b"x%d" % i for i in range(5)]
        finally:
            other.close()
        for bp in procs:
            assert metric(bp, "bookie_unauthorized_total") == 0
    finally:
        bk.close()


def test_a_reader_goes_on_with_other_replicas_when_one_answers_unauthorized(bookies) -> None:
    """A bookie holding another key for a ledger (squatted before the owner wrote to it, here by adding an entry
    with a bogus key): the reader counts it as odd, logs it, and reads from the other replica."""
    a, b, c = bookies.start_many(3, "--gc-interval-s", "3600")
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        lh = bk.create_ledger(ensemble_size=2, write_quorum=2, ack_quorum=2, password=b"secret")
        lh.append_many([b"e%d" % i for i in range(20)])
        lid, ens = lh.ledger_id, lh.metadata.last_ensemble.bookies
        lh.close()
        odd = next(x for x in (a, b, c) if x.id not in ens)
        add = p.AddEntryRequest(
            request_id=1, ledger_id=lid, entry_id=0, master_key=BOGUS, entry=build(lid, 0)
        )
        resps, _ = _exchange(odd.id, p.encode(add), timeout_s=2.0)
        assert resps[0].status == p.Status.OK  # (auth off: an add binds the stranger's key)
        # the metadata now names the squatted bookie as a replica of every entry
        lms = LedgerMetadataStore(store)
        lms.update(lid, lambda md: md.replace(ensembles=(Ensemble(0, (ens[0], odd.id)),)))
        reader = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
        try:
            rh = reader.open_ledger(lid, password=b"secret")
            assert [e.data for e in rh.read(0, 19)] == [b"e%d" % i for i in range(20)]
            assert reader._bk.odd_bookies[odd.id] >= 1
        finally:
            reader.close()
    finally:
        bk.close()
        store.close()


@needs_openssl
def test_tls_data_plane_with_tokens_and_a_plaintext_stranger_gets_nothing(bookies, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    secret_file, secret = _secret(tmp_path)
    flags = ("--tls-cert", str(cert), "--tls-key", str(key), "--auth-secret-file", str(secret_file))
    (bp,) = bookies.start_many(1, *flags, "--auth-required")
    token = auth.create_token(secret, "owner", expires_in_s=600)
    cfg = ClientConfig(zk_root=bookies.root, auth_token=token, tls_ca=str(cert))
    bk = BookKeeper.connect(bookies.zk, config=cfg)
    try:
        lh = bk.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1, password=b"secret")
        lh.append_many([b"over tls %d" % i for i in range(100)])
        assert [e.data for e in lh.read(98, 99)] == [b"over tls 98", b"over tls 99"]
        # plaintext to a TLS port: no frame is ever answered
        info = p.encode(p.BookieInfoRequest(request_id=1))
        resps, _ = _exchange(bp.id, info, timeout_s=2.0)
        assert resps == []

        # TLS without a token: refused by the AUTH step as over plaintext
        async def tls_without_token() -> None:
            pool = BookiePool(security=Security(tls=client_tls_context(str(cert))))
            try:
                conn = await pool.get(bp.id)
                resp = await conn.request(lambda rid: p.BookieInfoRequest(request_id=rid), 10)
                assert resp.status == p.Status.UNAUTHORIZED
            finally:
                await pool.close()

        asyncio.run(tls_without_token())
        assert len(ledger_ids(bp)) == 1
    finally:
        bk.close()


def test_the_sync_client_says_whether_a_bookie_serves_it(bookies, tmp_path: Path) -> None:
    """``bookie_accepts_client`` (what a Spark query's planning asks to name a missing or wrong token): a bookie
    with ``--auth-required`` serves a client with a token signed with its secret, answers UNAUTHORIZED to one with
    none (False), refuses a token signed with another secret (UnauthorizedError); one not there is a LedgerError."""
    from ledger_client import LedgerError

    secret_file, secret = _secret(tmp_path)
    (bp,) = bookies.start_many(1, "--auth-secret-file", str(secret_file), "--auth-required")
    other = auth.create_token(auth.new_secret(), "owner", expires_in_s=3600)
    for token, serves in [(auth.create_token(secret, "owner", expires_in_s=3600), True), (None, False)]:
        with BookKeeper.connect(
            bookies.zk, config=ClientConfig(zk_root=bookies.root, auth_token=token)
        ) as bk:
            assert bk.bookie_accepts_client(bp.id) is serves
    with BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root, auth_token=other)) as bk:
        with pytest.raises(UnauthorizedError):
            bk.bookie_accepts_client(bp.id)
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            gone = f"127.0.0.1:{free.getsockname()[1]}"  # (bound, not listening: refused)
            with pytest.raises(LedgerError):
                bk.bookie_accepts_client(gone)
