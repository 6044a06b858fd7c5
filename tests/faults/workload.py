"""Client processes of the fault run; each appends its history to its own JSONL file (see ``history.py``).

    python -m tests.faults.workload writer|recoverer|reader --name w0 --zk HOST:PORT --root /ledgerstore-x \
        --out DIR --seed N --run-until MONOTONIC_DEADLINE [--stop-file PATH]

* writer    — creates ledgers (random E/Qw/Qa), appends pipelined unique payloads at a bounded rate, records every
              append's invoke and outcome; closes most ledgers, abandons some (like a crashed writer); on SIGUSR1
              it forces its own ZooKeeper session to expire (the nemesis' "ZooKeeper session loss" fault).
* recoverer — now and then opens an OPEN ledger (usually the newest) with ``recovery=True``, which fences its
              writer; records the outcome and reads the recovered ledger back.
* reader    — follows recent ledgers with ``recovery=False`` handles: LAC observations per handle and reads up
              to the LAC.

Every client call is bounded by a timeout, and the process stops by itself at ``--run-until``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ledger_client import BookKeeper, ClientConfig
from ledger_client.errors import LedgerError
from tests.faults.history import History, digest

PASSWORD = b"nemesis"
QUORUMS = ((3, 2, 2), (3, 3, 2), (4, 3, 2), (3, 3, 3))
OP_TIMEOUT_S = 30.0


def client_config(root: str) -> ClientConfig:
    return ClientConfig(
        zk_root=root,
        add_timeout_s=2.0,
        read_timeout_s=2.0,
        ensemble_change_timeout_s=8.0,
        recovery_attempts_max=3,
        zk_session_timeout_s=6.0,
    )


def _err(e: BaseException) -> str:
    """The error's stable code (or class name), then its message, shortened."""
    code = getattr(e, "code", None)
    head = str(code) if isinstance(code, str) else type(e).__name__
    msg = str(e).replace(f"[{head}] ", "")
    return f"{head}: {msg[:160]}" if msg else head


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name: str = args.name
        self.rng = random.Random(args.seed)
        self.hist = History(Path(args.out) / f"{self.name}.jsonl", self.name)
        self.run_until: float = args.run_until
        self.stop_file = Path(args.stop_file) if args.stop_file else None
        self.bk: BookKeeper | None = None

    def stopping(self) -> bool:
        return time.monotonic() >= self.run_until or (self.stop_file is not None and self.stop_file.exists())

    async def nap(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping() and time.monotonic() < end:
            await asyncio.sleep(min(0.1, end - time.monotonic()))

    async def main(self) -> None:
        self.bk = await asyncio.wait_for(
            BookKeeper.connect(self.args.zk, config=client_config(self.args.root)), OP_TIMEOUT_S
        )
        self.hist.record("start", role=self.args.role)
        try:
            await self.run()
        finally:
            self.hist.record("stop")
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.bk.close(), 10)
            self.hist.close()

    async def run(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    # shared by recoverer and reader
    async def read_range(self, lh: Any, first: int, last: int, handle: str) -> int:
        """Read first..last, recording each entry; returns the next entry id not read."""
        nxt = first
        try:

            async def go() -> None:
                nonlocal nxt
                async for e in lh.read(first, last):
                    self.hist.record(
                        "read",
                        ledger=lh.ledger_id,
                        entry_id=e.entry_id,
                        digest=digest(e.data),
                        handle=handle,
                    )
                    nxt = e.entry_id + 1

            await asyncio.wait_for(go(), OP_TIMEOUT_S)
        except (LedgerError, TimeoutError) as e:
            self.hist.record("read_fail", ledger=lh.ledger_id, first=nxt, last=last, error=_err(e))
        return nxt


class Writer(Worker):
    async def run(self) -> None:
        assert self.bk is not None
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, lambda: loop.create_task(self.expire_session()))
        self.op_ids = itertools.count()
        while not self.stopping():
            await self.one_ledger()

    async def expire_session(self) -> None:
        from tests.zk_testing import expire_session

        assert self.bk is not None
        self.hist.record("zk_expire", phase="invoke")
        try:
            old = await asyncio.to_thread(expire_session, self.bk.store, 15.0)
            self.hist.record("zk_expire", phase="ok", old_session=f"{old:x}")
        except Exception as e:
            self.hist.record("zk_expire", phase="fail", error=repr(e))

    async def one_ledger(self) -> None:
        assert self.bk is not None
        rng = self.rng
        e, qw, qa = rng.choice(QUORUMS)
        self.hist.record("create", phase="invoke", ensemble=e, write_quorum=qw, ack_quorum=qa)
        try:
            lh = await asyncio.wait_for(self.bk.create_ledger(e, qw, qa, password=PASSWORD), OP_TIMEOUT_S)
        except (LedgerError, TimeoutError) as ex:
            self.hist.record("create", phase="fail", error=_err(ex))
            await self.nap(0.5)
            return
        lid = lh.ledger_id
        self.hist.record("create", phase="ok", ledger=lid, bookies=list(lh.metadata.last_ensemble.bookies))
        n_target = rng.randint(50, 700)
        window = rng.choice((1, 4, 16, 32))
        rate = rng.uniform(40, 120)  # entries/s
        inflight: set[asyncio.Future[int]] = set()
        failed = False
        errors: list[str] = []

        def settle(op_id: str, fut: asyncio.Future[int]) -> None:
            inflight.discard(fut)
            if fut.cancelled():
                errors.append("CANCELLED")
                self.hist.record("append", phase="fail", ledger=lid, op_id=op_id, error="CANCELLED")
            elif fut.exception() is not None:
                errors.append(_err(fut.exception()))
                self.hist.record("append", phase="fail", ledger=lid, op_id=op_id, error=errors[-1])
            else:
                self.hist.record("append", phase="ok", ledger=lid, op_id=op_id, entry_id=fut.result())

        for seq in range(n_target):
            if self.stopping():
                break
            op_id = f"{self.name}-{next(self.op_ids)}"
            payload = f"{self.name}|{lid}|{seq}|".encode() + rng.randbytes(rng.randint(8, 300))
            self.hist.record(
                "append", phase="invoke", ledger=lid, op_id=op_id, digest=digest(payload), size=len(payload)
            )
            try:
                fut = await asyncio.wait_for(lh.append_future(payload), OP_TIMEOUT_S)
            except (LedgerError, TimeoutError) as ex:
                self.hist.record("append", phase="fail", ledger=lid, op_id=op_id, error=_err(ex))
                failed = True
                break
            inflight.add(fut)
            fut.add_done_callback(lambda f, op_id=op_id: settle(op_id, f))
            if len(inflight) >= window:
                await asyncio.wait(set(inflight), timeout=OP_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
            if errors:
                failed = True
                break
            await asyncio.sleep(rng.expovariate(rate))
        if inflight:
            await asyncio.wait(set(inflight), timeout=OP_TIMEOUT_S)
        if failed or errors or inflight:
            return  # fenced, closed or stuck: abandon the ledger (a recoverer or the final phase closes it)
        if rng.random() < 0.2:
            self.hist.record("abandon", ledger=lid)  # like a writer that crashed: left OPEN
            return
        self.hist.record("close", phase="invoke", ledger=lid)
        try:
            await asyncio.wait_for(lh.close(), OP_TIMEOUT_S)
            self.hist.record("close", phase="ok", ledger=lid, last_entry_id=lh.last_add_confirmed)
        except (LedgerError, TimeoutError) as ex:
            self.hist.record("close", phase="fail", ledger=lid, error=_err(ex))


class Recoverer(Worker):
    async def run(self) -> None:
        assert self.bk is not None
        n = 0
        while True:
            await self.nap(self.rng.uniform(0.8, 3.0))
            if self.stopping():
                return
            lid = await self.pick()
            if lid is None:
                continue
            n += 1
            self.hist.record("recover", phase="invoke", ledger=lid)
            try:
                rh = await asyncio.wait_for(
                    self.bk.open_ledger(lid, password=PASSWORD, recovery=True), OP_TIMEOUT_S * 2
                )
            except (LedgerError, TimeoutError) as e:
                self.hist.record("recover", phase="fail", ledger=lid, error=_err(e))
                continue
            md = rh.metadata
            self.hist.record(
                "recover",
                phase="ok",
                ledger=lid,
                last_entry_id=md.last_entry_id,
                state=md.state.value,
                lac=rh.last_add_confirmed,
            )
            if self.rng.random() < 0.5 and md.last_entry_id >= 0:
                await self.read_range(rh, 0, md.last_entry_id, handle=f"{self.name}-r{n}")

    async def pick(self) -> int | None:
        assert self.bk is not None
        try:
            ids = sorted(await asyncio.wait_for(self.bk.list_ledgers(), 10), reverse=True)[:12]
            open_ids = []
            for lid in ids:
                md = await asyncio.wait_for(self.bk.ledger_metadata(lid), 10)
                if md.state.value != "CLOSED":
                    open_ids.append(lid)
        except (LedgerError, TimeoutError):
            return None
        if open_ids:
            return open_ids[0] if self.rng.random() < 0.5 else self.rng.choice(open_ids)
        return ids[0] if ids and self.rng.random() < 0.3 else None


class Reader(Worker):
    async def run(self) -> None:
        assert self.bk is not None
        # ledger -> [handle name, handle, next entry to read]
        self.handles: dict[int, list[Any]] = {}
        self.done: set[int] = set()
        self.opened = itertools.count()
        last_list = 0.0
        while not self.stopping():
            if time.monotonic() - last_list > 1.0:
                last_list = time.monotonic()
                await self.refresh()
            for lid in list(self.handles):
                if self.stopping():
                    return
                await self.follow(lid)
            await self.nap(self.rng.uniform(0.05, 0.3))

    async def open(self, lid: int, nxt: int) -> None:
        assert self.bk is not None
        try:
            rh = await asyncio.wait_for(self.bk.open_ledger(lid, password=PASSWORD, recovery=False), 15)
        except (LedgerError, TimeoutError) as e:
            self.hist.record("read_fail", ledger=lid, first=-1, last=-1, error=_err(e))
            return
        name = f"{self.name}-h{next(self.opened)}"
        self.handles[lid] = [name, rh, nxt]
        self.hist.record("lac", ledger=lid, handle=name, lac=rh.last_add_confirmed, closed=rh.is_closed)

    async def refresh(self) -> None:
        assert self.bk is not None
        try:
            ids = sorted(await asyncio.wait_for(self.bk.list_ledgers(), 10), reverse=True)[:6]
        except (LedgerError, TimeoutError):
            return
        for lid in ids:
            if lid in self.done:
                continue
            cur = self.handles.get(lid)
            reopen = cur is not None and (cur[1].is_closed is False and self.rng.random() < 0.3)
            if cur is None or reopen:
                await self.open(lid, cur[2] if cur else 0)
        for lid in [x for x in self.handles if x not in ids]:
            del self.handles[lid]  # too old to follow

    async def follow(self, lid: int) -> None:
        name, rh, nxt = self.handles[lid]
        try:
            lac = await asyncio.wait_for(rh.read_last_add_confirmed(), 10)
        except (LedgerError, TimeoutError) as e:
            self.hist.record("read_fail", ledger=lid, first=-1, last=-1, error=_err(e), handle=name)
            return
        self.hist.record("lac", ledger=lid, handle=name, lac=lac, closed=rh.is_closed)
        if lac >= nxt:
            last = min(lac, nxt + 200)
            self.handles[lid][2] = await self.read_range(rh, nxt, last, handle=name)
        if rh.is_closed and self.handles[lid][2] > rh.metadata.last_entry_id:
            self.done.add(lid)
            del self.handles[lid]


ROLES = {"writer": Writer, "recoverer": Recoverer, "reader": Reader}


def install_mutant(name: str) -> None:
    """Deliberately broken clients, to show the harness catches real bugs (``LEDGERSTORE_NEMESIS_MUTANT``):

    * ``no_fence`` — recovery reads never carry the FENCE flag, so recovery does not stop the old writer.
    """
    import dataclasses

    from bookie import protocol as p

    if name == "no_fence":
        encode = p.encode

        def encode_without_fence(msg: Any) -> bytes:
            if isinstance(msg, p.ReadEntryRequest) and msg.flags & p.Flag.FENCE:
                msg = dataclasses.replace(msg, flags=msg.flags & ~p.Flag.FENCE)
            return encode(msg)

        p.encode = encode_without_fence
    else:
        raise ValueError(f"unknown mutant {name!r}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("role", choices=sorted(ROLES))
    ap.add_argument("--name", required=True)
    ap.add_argument("--zk", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--run-until", type=float, required=True, help="time.monotonic() deadline")
    ap.add_argument("--stop-file", default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    logging.getLogger("zk.kazoo").setLevel(logging.ERROR)
    mutant = os.environ.get("LEDGERSTORE_NEMESIS_MUTANT")
    if mutant and args.role == "recoverer":
        install_mutant(mutant)
    worker = ROLES[args.role](args)
    asyncio.run(worker.main())
    sys.stderr.flush()
    os._exit(0)  # do not wait for stray client threads: the history is fsynced already


if __name__ == "__main__":
    sys.exit(main())
