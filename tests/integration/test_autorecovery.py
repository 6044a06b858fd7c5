"""AutoRecovery with real processes: ZooKeeper, 5 bookie processes and ``ledgerstore autorecovery serve``
processes. A bookie killed for good is re-replicated with no command typed; the auditor's process killed
mid-recovery is replaced; a bookie back within the delay costs no copy; a live bookie is decommissioned under
write load."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from bookie import protocol as p
from ledger_client import BookKeeper, ClientConfig
from ledger_client.quorum import write_set
from ledgerstore.cluster import free_port
from tests.integration.test_rereplication import _raw_read
from tests.metrics_testing import scrape
from tests.zk_testing import wait_for
from zk import MetadataStore
from zk.underreplication import UnderReplicationManager

PW = b"secret"
ENTRIES = 60


def payload(lid: int, i: int) -> bytes:
    return f"L{lid}-entry-{i}-".encode() * 30


class AutoRecoveryProcess:
    def __init__(self, bookies, tmp: Path, name: str, *extra: str) -> None:
        self.metrics_port = free_port()
        self.log = tmp / f"autorecovery-{name}.log"
        cmd = [
            sys.executable,
            "-m",
            "ledgerstore.cli",
            "autorecovery",
            "serve",
            "--zk",
            bookies.zk,
            "--zk-root",
            bookies.root,
            "--password",
            PW.decode(),
            "--zk-session-timeout-s",
            "4",
            "--poll-interval-s",
            "0.3",
            "--open-ledger-grace-period-s",
            "3",
            "--metrics-port",
            str(self.metrics_port),
            *extra,
        ]
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.metrics()
                return
            except OSError:
                assert self.proc.poll() is None, self.log.read_text()
                time.sleep(0.1)
        raise TimeoutError(self.log.read_text())

    def metrics(self) -> dict[str, float]:
        return scrape(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2)

    def kill9(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill9()


def _cli(bookies, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ledgerstore.cli", *args, "--zk", bookies.zk, "--zk-root", bookies.root]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _client(bookies) -> ClientConfig:
    return ClientConfig(zk_root=bookies.root)


async def _write_ledgers(bookies, n: int, open_every: int = 3) -> dict[int, bool]:
    """``n`` ledgers of ENTRIES entries, E3/Qw2/Qa2 and E3/Qw3/Qa2 alternately; every ``open_every``-th left
    OPEN with its writer gone (the client closes without closing it). Returns ledger id -> closed."""
    bk = await BookKeeper.connect(bookies.zk, config=_client(bookies))
    out = {}
    try:
        for k in range(n):
            lh = await bk.create_ledger(3, 2 if k % 2 == 0 else 3, 2, password=PW)
            for i in range(ENTRIES):
                await lh.append(payload(lh.ledger_id, i))
            closed = k % open_every != 0
            if closed:
                await lh.close()
            out[lh.ledger_id] = closed
    finally:
        await bk.close()
    return out


async def _names(bookies, bookie: str) -> list[int]:
    bk = await BookKeeper.connect(bookies.zk, config=_client(bookies))
    try:
        out = []
        for lid in await bk.list_ledgers():
            md = await bk.ledger_metadata(lid)
            if any(bookie in ens.bookies for ens in md.ensembles):
                out.append(lid)
        return out
    finally:
        await bk.close()


async def _closed_async(bookies, lids: list[int]) -> list[bool]:
    bk = await BookKeeper.connect(bookies.zk, config=_client(bookies))
    try:
        return [(await bk.ledger_metadata(lid)).is_closed for lid in lids]
    finally:
        await bk.close()


def _closed(bookies, lids: list[int]):
    return _closed_async(bookies, lids)


def _marks(bookies) -> list[dict]:
    r = _cli(bookies, "ledger", "underreplicated", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ledgers"]


def _wait_recovered(bookies, victim: str, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if not asyncio.run(_names(bookies, victim)) and not _marks(bookies):
            return time.monotonic() - t0
        time.sleep(0.5)
    raise AssertionError(
        f"not recovered in {timeout_s}s: names {asyncio.run(_names(bookies, victim))}, marks {_marks(bookies)}"
    )


async def _check_every_replica(bookies, ledgers: dict[int, int], live: set[str]) -> None:
    """Every ledger CLOSED with all its entries (an open one the lost bookie was not in is closed here first);
    every entry identical on every bookie of its write set, all live."""
    bk = await BookKeeper.connect(bookies.zk, config=_client(bookies))
    try:
        for lid, n in ledgers.items():
            md = await bk.ledger_metadata(lid)
            if not md.is_closed:
                await bk.open_ledger(lid, password=PW, recovery=True)
                md = await bk.ledger_metadata(lid)
            assert md.is_closed and md.last_entry_id == n - 1, (lid, md.state, md.last_entry_id)
            for eid in range(n):
                ens = md.ensemble_at(eid).bookies
                members = [ens[i] for i in write_set(eid, md.ensemble_size, md.write_quorum)]
                assert set(members) <= live, (lid, eid, members)
                copies = [await _raw_read(b, lid, eid) for b in members]
                assert all(c.status == p.Status.OK for c in copies), (lid, eid, [c.status for c in copies])
                assert len({bytes(c.entry) for c in copies}) == 1
            h = await bk.open_ledger(lid, password=PW, recovery=False)
            assert [e.data async for e in h.read(0, n - 1)] == [payload(lid, i) for i in range(n)]
    finally:
        await bk.close()


def _victim(bookies, ledgers: dict[int, bool]) -> str:
    """A bookie in the last ensemble of an open ledger and in as many others as possible."""

    async def go() -> str:
        bk = await BookKeeper.connect(bookies.zk, config=_client(bookies))
        try:
            count: dict[str, int] = {}
            in_open: set[str] = set()
            for lid, closed in ledgers.items():
                md = await bk.ledger_metadata(lid)
                for b in md.last_ensemble.bookies:
                    count[b] = count.get(b, 0) + 1
                    if not closed:
                        in_open.add(b)
            return max(sorted(in_open), key=lambda b: count[b])
        finally:
            await bk.close()

    return asyncio.run(go())


def kill_one_for_good(bookies, procs) -> tuple[str, float]:
    """20 ledgers (closed and open; E3/Qw2/Qa2 and E3/Qw3/Qa2) on ``procs``, then kill -9 the bookie in most
    of them (and in an open one): within 60 s no ledger names it, no mark is left, the open ledgers it was in
    are closed, and every entry reads back identical from every replica. Returns (victim, seconds it took)."""
    by_id = {bp.id: bp for bp in procs}
    ledgers = asyncio.run(_write_ledgers(bookies, 20))
    victim = _victim(bookies, ledgers)
    hit = asyncio.run(_names(bookies, victim))
    by_id[victim].kill9()
    took = _wait_recovered(bookies, victim, 60)
    closed_by_autorecovery = [lid for lid in hit if not ledgers[lid]]
    assert closed_by_autorecovery and all(asyncio.run(_closed(bookies, closed_by_autorecovery)))
    asyncio.run(_check_every_replica(bookies, dict.fromkeys(ledgers, ENTRIES), set(by_id) - {victim}))
    return victim, took


def test_a_bookie_killed_for_good_is_rereplicated_with_no_command_typed(bookies, tmp_path) -> None:
    """5 bookies, 20 ledgers (closed and open; E3/Qw2/Qa2 and E3/Qw3/Qa2), one bookie killed for good."""
    procs = bookies.start_many(5)
    ar = AutoRecoveryProcess(bookies, tmp_path, "a")
    try:
        _, took = kill_one_for_good(bookies, procs)
        m = ar.metrics()
        assert m["rereplicated_entries_total"] > 0 and m["autorecovery_is_auditor"] == 1
        time.sleep(2.5)  # the gauges refresh every 2 s
        assert ar.metrics()["under_replicated_ledgers"] == 0
        print(f"recovered in {took:.1f}s after the kill")
    finally:
        ar.stop()


def test_the_auditor_and_a_worker_killed_mid_recovery_are_replaced(bookies, tmp_path) -> None:
    procs = bookies.start_many(5)
    by_id = {bp.id: bp for bp in procs}
    # A slow copier (about 12 entries/s) is elected first; B stands by.
    a = AutoRecoveryProcess(bookies, tmp_path, "a", "--throttle-mb", "0.005")
    b = AutoRecoveryProcess(bookies, tmp_path, "b")
    try:
        assert a.metrics()["autorecovery_is_auditor"] == 1 and b.metrics()["autorecovery_is_auditor"] == 0
        b.kill9()  # B's workers would finish everything at once; restart it once A is mid-copy
        ledgers = asyncio.run(_write_ledgers(bookies, 6, open_every=100))
        victim = _victim_closed(bookies, ledgers)
        by_id[victim].kill9()
        store = MetadataStore.connect(bookies.zk, root=bookies.root)
        try:
            deadline = time.monotonic() + 40
            while not (
                UnderReplicationManager(store).locks() and a.metrics()["rereplicated_entries_total"] > 0
            ):
                assert time.monotonic() < deadline, "no worker started copying"
                time.sleep(0.05)
        finally:
            store.close()
        assert a.metrics()["rereplicated_entries_total"] < 5 * 40  # mid-copy
        b = AutoRecoveryProcess(bookies, tmp_path, "b2")
        a.kill9()  # the auditor and the worker holding a lock, mid-copy
        _wait_recovered(bookies, victim, 60)
        assert b.metrics()["autorecovery_is_auditor"] == 1
        asyncio.run(_check_every_replica(bookies, dict.fromkeys(ledgers, ENTRIES), set(by_id) - {victim}))
        status = json.loads(_cli(bookies, "autorecovery", "status", "--json").stdout)
        assert status["auditor"] and status["under_replicated_ledgers"] == 0
    finally:
        a.stop()
        b.stop()


def _victim_closed(bookies, ledgers: dict[int, bool]) -> str:
    async def go() -> str:
        bk = await BookKeeper.connect(bookies.zk, config=_client(bookies))
        try:
            count: dict[str, int] = {}
            for lid in ledgers:
                for bk_id in (await bk.ledger_metadata(lid)).last_ensemble.bookies:
                    count[bk_id] = count.get(bk_id, 0) + 1
            return max(sorted(count), key=lambda x: count[x])
        finally:
            await bk.close()

    return asyncio.run(go())


def test_a_bookie_back_within_the_delay_costs_no_copy(bookies, tmp_path) -> None:
    procs = bookies.start_many(5)
    by_id = {bp.id: bp for bp in procs}
    # The delay leaves room for a loaded machine: the victim re-registers only once its old session has expired
    # and its restart (journal replay, RocksDB open) is done.
    delay_s = 20.0
    ar = AutoRecoveryProcess(bookies, tmp_path, "a", "--lost-bookie-recovery-delay-s", str(delay_s))
    try:
        ledgers = asyncio.run(_write_ledgers(bookies, 4, open_every=100))
        victim = _victim_closed(bookies, ledgers)
        before = asyncio.run(_names(bookies, victim))
        by_id[victim].kill9()
        # The auditor sees it gone first: a restarted bookie registers as soon as its old session has expired,
        # and a loss and return between two of the auditor's looks would leave it nothing to say.
        assert wait_for(lambda: f"bookie {victim} is gone" in ar.log.read_text(), timeout_s=60)
        gone = time.monotonic()  # the auditor's delay counts from no later than this
        by_id[victim].start()
        time.sleep(
            max(0.0, gone + delay_s + 2 - time.monotonic())
        )  # past the delay: marked, were it not back
        assert not _marks(bookies)
        assert ar.metrics()["rereplicated_entries_total"] == 0
        assert asyncio.run(_names(bookies, victim)) == before
        assert "back before its loss delay" in ar.log.read_text()
    finally:
        ar.stop()


def test_decommission_of_a_live_bookie_under_write_load(bookies, tmp_path) -> None:
    procs = bookies.start_many(5)
    by_id = {bp.id: bp for bp in procs}
    written: dict[int, int] = {}
    errors: list[BaseException] = []
    stop = threading.Event()
    first_ensemble: list[str] = []

    def load() -> None:
        async def go() -> None:
            bk = await BookKeeper.connect(bookies.zk, config=_client(bookies))
            try:
                while not stop.is_set():
                    lh = await bk.create_ledger(3, 2, 2, password=PW)
                    first_ensemble[:] = first_ensemble or list(lh.metadata.ensembles[0].bookies)
                    for i in range(40):
                        await lh.append(payload(lh.ledger_id, i))
                        written[lh.ledger_id] = i + 1
                    await lh.close()
            finally:
                await bk.close()

        try:
            asyncio.run(go())
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=load)
    t.start()
    try:
        while len(written) < 3:
            time.sleep(0.05)
        victim = first_ensemble[0]
        cmd = [
            sys.executable, "-m", "ledgerstore.cli", "bookie", "decommission", victim, "--password", PW.decode(),
            "--timeout-s", "60", "--zk", bookies.zk, "--zk-root", bookies.root, "--json",
        ]  # fmt: skip
        dec = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(4)  # writes go on while it drains
        stop.set()
        t.join(30)
        out, err = dec.communicate(timeout=90)
        assert dec.returncode == 0, (out, err)
        result = json.loads(out)
        assert result["complete"] and result["cookie_deleted"] and result["entries_copied"] > 0
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    assert not asyncio.run(_names(bookies, victim))
    by_id[victim].stop()  # it holds nothing needed any more
    asyncio.run(_check_every_replica(bookies, written, set(by_id) - {victim}))
