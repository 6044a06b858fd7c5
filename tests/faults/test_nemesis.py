"""The fault run: real ZooKeeper, 5 real bookie processes behind fault proxies (one on a small tmpfs), writer /
recoverer / reader client processes recording histories, and a seeded nemesis (kill -9 + restart on the same
directories, SIGSTOP/SIGCONT, partitions that reset or stall connections, disk full, ZooKeeper session loss of a
writer). Then: heal everything, recover every ledger, read everything back, check the histories (checker.py).

Bounded: ``LEDGERSTORE_NEMESIS_S`` seconds of faults (default 60), whole test ≈ 1.5–2 min on 2 cores.
Reproduce a schedule with ``LEDGERSTORE_NEMESIS_SEED=<seed>`` (printed at the start and in the summary; the
fault schedule and the workload's choices follow the seed, thread and network timing do not).
``LEDGERSTORE_NEMESIS_MUTANT=no_fence`` runs deliberately broken recoverers (recovery without the fence flag):
the run must then fail with ``ack_after_fence`` / ``lost`` / ``beyond_end`` violations — the harness' self-test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger_client import BookKeeper
from ledger_client.errors import LedgerError
from ledgerstore.cluster import free_port
from tests.faultproxy import FaultProxy, ProxyLoop
from tests.faults.checker import FinalLedger, check, excerpt, format_table, summarize
from tests.faults.history import History, digest, load_history
from tests.faults.nemesis import Nemesis, Node
from tests.faults.workload import PASSWORD, client_config

REPO = Path(__file__).resolve().parents[2]
N_BOOKIES = 5
WORKERS = (("writer", 3), ("recoverer", 2), ("reader", 2))
# small journal segments: they rotate, get checkpointed away and written over again all through the run, so
# kill -9 and disk faults land on recycled segments too
BOOKIE_ARGS = ("--checkpoint-interval-s", "2", "--journal-segment-mb", "1")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[tuple[Path | None, str]]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        yield None, f"disk faults skipped: cannot mount a tmpfs ({r.stderr.decode().strip()})"
        return
    try:
        yield mnt, ""
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _spawn(role: str, name: str, seed: int, zk: str, root: str, out: Path, run_until: float, stop: Path):
    log = open(out / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.faults.workload",
                role,
                "--name",
                name,
                "--zk",
                zk,
                "--root",
                root,
                "--out",
                str(out),
                "--seed",
                str(seed),
                "--run-until",
                repr(run_until),
                "--stop-file",
                str(stop),
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()


async def _final_reads(zk: str, root: str, hist: History, budget_s: float = 90.0) -> dict[int, FinalLedger]:
    """Recover every ledger (retrying: everything is healed, so it must succeed) and read it all back. Bounded by
    ``budget_s``: what is not recovered by then is reported (as ``unrecovered``), not waited for."""
    deadline = time.monotonic() + budget_s
    bk = await BookKeeper.connect(zk, config=client_config(root))
    final: dict[int, FinalLedger] = {}
    try:
        for lid in sorted(await bk.list_ledgers()):
            rh, error = None, ""
            for attempt in range(4):
                if time.monotonic() > deadline:
                    error = error or "final phase out of time"
                    break
                hist.record("recover", phase="invoke", ledger=lid)
                try:
                    rh = await asyncio.wait_for(bk.open_ledger(lid, password=PASSWORD, recovery=True), 30)
                    break
                except (LedgerError, TimeoutError) as e:
                    error = f"{type(e).__name__}: {e}"
                    hist.record("recover", phase="fail", ledger=lid, error=error, attempt=attempt)
                    await asyncio.sleep(1.0)
            if rh is None:
                md = await bk.ledger_metadata(lid)
                final[lid] = FinalLedger(md.state.value, md.last_entry_id, {}, error=error)
                continue
            md = rh.metadata
            hist.record(
                "recover", phase="ok", ledger=lid, last_entry_id=md.last_entry_id, state=md.state.value
            )
            entries: dict[int, str | None] = dict.fromkeys(range(md.last_entry_id + 1))
            nxt = 0
            while nxt <= md.last_entry_id and time.monotonic() < deadline:
                try:
                    async for e in rh.read(nxt, md.last_entry_id):
                        entries[e.entry_id] = digest(e.data)
                        nxt = e.entry_id + 1
                except (LedgerError, TimeoutError) as e:
                    hist.record("read_fail", ledger=lid, first=nxt, last=md.last_entry_id, error=repr(e))
                    nxt += 1  # retried one by one below
            for _attempt in range(3):
                missing = [e for e, d in entries.items() if d is None]
                if not missing or time.monotonic() > deadline:
                    break
                await asyncio.sleep(1.0)
                for eid in missing:
                    with contextlib.suppress(LedgerError, TimeoutError):
                        entry = await asyncio.wait_for(rh.read_entry(eid), 10)
                        entries[eid] = digest(entry.data)
            final[lid] = FinalLedger(md.state.value, md.last_entry_id, entries)
    finally:
        await asyncio.wait_for(bk.close(), 15)
    return final


@pytest.mark.timeout(290)
def test_nemesis(bookies, small_fs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seed = int(os.environ.get("LEDGERSTORE_NEMESIS_SEED") or random.SystemRandom().randrange(1 << 32))
    fault_s = float(os.environ.get("LEDGERSTORE_NEMESIS_S", "60"))
    rng = random.Random(seed)
    small, small_why = small_fs
    mutant = os.environ.get("LEDGERSTORE_NEMESIS_MUTANT", "")
    notes = [f"{fault_s:g}s of faults"] + [x for x in (small_why, mutant and f"MUTANT={mutant}") if x]
    with capsys.disabled():
        print(f"\nnemesis seed={seed} ({'; '.join(notes)})")
    out = tmp_path / "history"
    out.mkdir()
    hist = History(out / "nemesis.jsonl", "nemesis")
    t_begin = time.monotonic()

    ploop = ProxyLoop()
    nodes: list[Node] = []
    workers: list[subprocess.Popen[bytes]] = []
    stop = tmp_path / "stop"
    try:
        for i in range(N_BOOKIES):
            real_port = free_port()
            proxy = FaultProxy(ploop, real_port).start()
            use_small = small is not None and i == 0
            data_dir = (small / "bookie") if use_small and small else tmp_path / f"bookie-{i}"
            bp = bookies.start(
                *BOOKIE_ARGS,
                data_dir=data_dir,
                port=real_port,
                bookie_id=proxy.address,
                wait=False,
            )
            nodes.append(Node(bp, proxy, small if use_small else None))
        for n in nodes:
            n.bookie.wait_healthy(60)
        _wait_registered(bookies, N_BOOKIES)

        t_start = time.monotonic()
        run_until = t_start + fault_s + 4.0
        for role, count in WORKERS:
            for k in range(count):
                name = f"{role[0]}{k}"
                workers.append(
                    _spawn(role, name, rng.randrange(1 << 32), bookies.zk, bookies.root, out, run_until, stop)
                )
        writers = [w for w in workers if "writer" in w.args]
        nemesis = Nemesis(nodes, writers, random.Random(rng.randrange(1 << 32)), hist)
        nemesis.not_before(t_start + 2.0)  # let the clients get going first
        while time.monotonic() < t_start + fault_s:
            nemesis.step()
            if any(w.poll() not in (None, 0) for w in workers):
                break
            time.sleep(0.1)
        nemesis.heal_all()
        t_healed = time.monotonic()

        for w in workers:
            try:
                w.wait(max(5.0, run_until + 45 - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait(10)
        crashed = {w.args[5]: w.returncode for w in workers if w.returncode != 0}
        assert not crashed, f"client processes failed: {crashed}: " + "".join(
            (out / f"{name}.log").read_text()[-3000:] for name in crashed
        )
        t_workers = time.monotonic()

        final_hist = History(out / "final.jsonl", "final")
        final = asyncio.run(_final_reads(bookies.zk, bookies.root, final_hist))
        t_final = time.monotonic()
        final_hist.close()
        hist.close()
        history = load_history(sorted(out.glob("*.jsonl")))
        violations = check(history, final)
        summary = summarize(history, final)
        (tmp_path / "final.json").write_text(
            json.dumps({str(k): [v.state, v.last_entry_id] for k, v in final.items()})
        )
        timing = (
            f"setup {t_start - t_begin:.1f}s, faults {t_healed - t_start:.1f}s, clients done "
            f"{t_workers - t_healed:.1f}s, final recover+read {t_final - t_workers:.1f}s"
        )
        table = format_table(summary, violations, header=f"nemesis summary (seed={seed}; {timing})")
        with capsys.disabled():
            print(table)
        assert not nemesis.unexpected_exits, "bookies died by themselves:\n" + "\n".join(
            nemesis.unexpected_exits
        )
        if violations:
            lines = [f"{len(violations)} violations (seed={seed}, history in {out}):"]
            for kind in dict.fromkeys(v.kind for v in violations):
                for vio in [v for v in violations if v.kind == kind][:2]:
                    lines.append(f"  {vio}")
                    lines += [f"      {json.dumps(r)}" for r in excerpt(history, vio)]
            pytest.fail("\n".join(lines))
        assert summary["ops"].get("append ok", 0) > 500, summary
        assert summary["ledgers"] >= 5, summary
    finally:
        stop.touch()
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait(10)
        for n in nodes:
            n.proxy.heal()
            if n.small_fs is not None:
                (n.small_fs / "filler").unlink(missing_ok=True)
        bookies.stop_all()
        for n in nodes:
            n.proxy.stop()
        ploop.close()


def _wait_registered(bookies, n: int, timeout_s: float = 30.0) -> None:
    from zk import BookieRegistry, MetadataStore

    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        reg = BookieRegistry(store)
        deadline = time.monotonic() + timeout_s
        while len(reg.available()) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {sorted(reg.available())} registered")
            time.sleep(0.1)
    finally:
        store.close()
