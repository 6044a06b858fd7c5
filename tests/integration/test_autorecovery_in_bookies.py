"""AutoRecovery inside the bookies (``bookie serve``'s default, BookKeeper's ``autoRecoveryDaemonEnabled``), with
no standalone AutoRecovery process: real ZooKeeper and bookie processes. A bookie killed for good is
re-replicated by the others' workers; the bookie holding the auditor role killed, another bookie's auditor takes
over and recovery completes; SIGTERM still stops a bookie within seconds; with ``--auth-required`` the bookies'
own secret signs the token their workers send."""

from __future__ import annotations

import asyncio
import json
import os
import time

from ledger_client import BookKeeper, ClientConfig
from ledgerstore.cluster import BookieProcess
from tests.integration.test_autorecovery import (
    ENTRIES,
    PW,
    _check_every_replica,
    _cli,
    _marks,
    _names,
    _victim_closed,
    _wait_recovered,
    _write_ledgers,
    kill_one_for_good,
    payload,
)
from tests.metrics_testing import scrape

#: the AutoRecovery settings of the test's bookies: a short session (quick take-over) and grace period
RECOVERY = (
    "--autorecovery-password",
    PW.decode(),
    "--autorecovery-zk-session-timeout-s",
    "4",
    "--autorecovery-poll-interval-s",
    "0.3",
    "--open-ledger-grace-period-s",
    "3",
)


def metrics(bp: BookieProcess) -> dict[str, float]:
    return scrape(f"http://127.0.0.1:{bp.http_port}/metrics", timeout=5)


def _status(bookies) -> dict:
    r = _cli(bookies, "autorecovery", "status", "--json")
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def _auditor(bookies, by_id: dict[str, BookieProcess], timeout_s: float = 30.0) -> str:
    """The id of the bookie whose AutoRecovery is the elected auditor (its /metrics says so too)."""
    deadline = time.monotonic() + timeout_s
    while True:
        owner = _status(bookies)["auditor"] or ""
        bid = owner.removeprefix("bookie-")
        if bid in by_id and by_id[bid].alive and metrics(by_id[bid])["autorecovery_is_auditor"] == 1:
            return bid
        assert time.monotonic() < deadline, f"no bookie is the auditor: {owner!r}"
        time.sleep(0.3)


def test_bookies_rereplicate_a_bookie_killed_for_good_with_no_autorecovery_process(bookies) -> None:
    """5 bookies, 20 ledgers (closed and open; E3/Qw2/Qa2 and E3/Qw3/Qa2), one bookie killed for good."""
    procs = bookies.start_many(5, *RECOVERY, autorecovery=True)
    victim, took = kill_one_for_good(bookies, procs)
    live = [bp for bp in procs if bp.id != victim]
    seen = [metrics(bp) for bp in live]
    assert sum(m["rereplicated_entries_total"] for m in seen) > 0
    assert sum(m["autorecovery_is_auditor"] for m in seen) == 1
    time.sleep(2.5)  # the gauges refresh every 2 s
    assert all(metrics(bp)["under_replicated_ledgers"] == 0 for bp in live)
    assert not _marks(bookies)
    print(f"recovered in {took:.1f}s after the kill")


def test_the_bookie_holding_the_auditor_role_killed_another_bookie_takes_over(bookies) -> None:
    procs = bookies.start_many(4, *RECOVERY, autorecovery=True)
    plain = bookies.start()  # --no-autorecovery: never a candidate, no AutoRecovery metrics
    assert "autorecovery_is_auditor" not in metrics(plain)
    by_id = {bp.id: bp for bp in procs}
    auditor = _auditor(bookies, by_id)
    assert _status(bookies)["candidates"] == 4
    ledgers = asyncio.run(_write_ledgers(bookies, 8, open_every=100))
    if not asyncio.run(_names(bookies, auditor)):  # the auditor's bookie holds nothing: write until it does
        ledgers |= asyncio.run(_write_ledgers(bookies, 8, open_every=100))
    assert asyncio.run(_names(bookies, auditor))
    by_id[auditor].kill9()
    _wait_recovered(bookies, auditor, 60)
    live = {b: bp for b, bp in by_id.items() if b != auditor}
    successor = _auditor(bookies, live)
    assert successor != auditor and _status(bookies)["under_replicated_ledgers"] == 0
    asyncio.run(_check_every_replica(bookies, dict.fromkeys(ledgers, ENTRIES), set(live) | {plain.id}))
    # SIGTERM still stops a bookie (and its AutoRecovery) within seconds
    t0 = time.monotonic()
    live[successor].stop()
    assert live[successor].proc is not None and live[successor].proc.returncode == 0
    assert time.monotonic() - t0 < 12, time.monotonic() - t0
    _auditor(bookies, {b: bp for b, bp in live.items() if b != successor})


def test_with_auth_required_the_bookies_sign_their_workers_token(bookies, tmp_path, monkeypatch) -> None:
    from bookie.auth import create_token, new_secret

    secret = tmp_path / "token-secret"
    secret.write_bytes(new_secret())
    os.chmod(secret, 0o600)
    monkeypatch.delenv("LEDGERSTORE_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("LEDGERSTORE_AUTH_TOKEN_FILE", raising=False)
    # given no token of their own, each bookie signs one for its AutoRecovery with its secret
    procs = bookies.start_many(
        4, *RECOVERY, "--auth-secret-file", str(secret), "--auth-required", autorecovery=True
    )
    monkeypatch.setenv(
        "LEDGERSTORE_AUTH_TOKEN", create_token(secret.read_bytes(), "test-client")
    )  # the test's
    by_id = {bp.id: bp for bp in procs}
    ledgers = asyncio.run(_write_ledgers(bookies, 4, open_every=100))
    victim = _victim_closed(bookies, ledgers)
    by_id[victim].kill9()
    _wait_recovered(bookies, victim, 60)
    live = {b for b in by_id if b != victim}
    asyncio.run(
        _read_back(bookies, ledgers, live)
    )  # with the test's token: raw reads without one are refused
    assert sum(metrics(by_id[b])["rereplicated_entries_total"] for b in live) > 0


async def _read_back(bookies, ledgers: dict[int, bool], live: set[str]) -> None:
    """Every ledger's ensembles name live bookies only and every entry reads back (each from the one bookie
    a read picks, with a token)."""
    bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
    try:
        for lid in ledgers:
            md = await bk.ledger_metadata(lid)
            assert all(set(ens.bookies) <= live for ens in md.ensembles), (lid, md.ensembles)
            # a ledger left OPEN (its writer gone) is recovered first: without recovery its last entry reads
            # only once the writer's explicit LAC reached the bookies, which a quick run may not have waited for
            h = await bk.open_ledger(lid, password=PW, recovery=not ledgers[lid])
            assert [e.data async for e in h.read(0, ENTRIES - 1)] == [payload(lid, i) for i in range(ENTRIES)]
    finally:
        await bk.close()


def test_a_sealed_fragment_of_an_open_ledger_is_rereplicated_while_its_writer_writes(bookies) -> None:
    """The writer replaced the killed bookie by an ensemble change and goes on writing; the bookies' AutoRecovery
    swaps it out of the sealed ensemble while the ledger is still OPEN, and the writer's close keeps that swap."""
    procs = bookies.start_many(5, *RECOVERY, autorecovery=True)
    by_id = {bp.id: bp for bp in procs}
    victim = procs[0].id

    async def go() -> tuple[int, int, bool]:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            lh = await bk.create_ledger(3, 2, 2, password=PW, bookies=[victim, procs[1].id, procs[2].id])
            n = 0
            for _ in range(30):
                await lh.append(payload(lh.ledger_id, n))
                n += 1
            by_id[victim].kill9()
            for _ in range(30):  # the writer's ensemble change replaces it from here on
                await lh.append(payload(lh.ledger_id, n))
                n += 1
            swapped_while_open = False
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                md = await bk.ledger_metadata(lh.ledger_id)
                assert md.state.value == "OPEN"
                if not any(victim in e.bookies for e in md.ensembles):
                    swapped_while_open = True
                    break
                await lh.append(payload(lh.ledger_id, n))  # the writer writes on meanwhile
                n += 1
                await asyncio.sleep(0.5)
            for _ in range(10):
                await lh.append(payload(lh.ledger_id, n))
                n += 1
            await lh.close()
            return lh.ledger_id, n, swapped_while_open
        finally:
            await bk.close()

    lid, n, swapped_while_open = asyncio.run(go())
    assert swapped_while_open, "the sealed ensemble still names the killed bookie"
    live = set(by_id) - {victim}
    asyncio.run(_check_every_replica(bookies, {lid: n}, live))
    deadline = time.monotonic() + 30
    while _marks(bookies):  # the mark goes once the swap is made
        assert time.monotonic() < deadline, _marks(bookies)
        time.sleep(0.5)
