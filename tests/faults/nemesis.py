"""The nemesis: injects and heals faults on real bookie processes, their network, their disk, and the writers'
ZooKeeper sessions, on a seeded schedule. Every fault is recorded (``op: fault``, ``phase: start|end``).

Each bookie sits behind a :class:`tests.faultproxy.FaultProxy`: it listens on its real port and registers
under ``--bookie-id 127.0.0.1:<proxy port>``, so every client connection goes through the proxy (the bookie's
ZooKeeper session does not: a partition cuts clients off while the bookie stays registered, the harder case).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ledgerstore.cluster import BookieProcess
from tests.faultproxy import FaultProxy
from tests.faults.history import History

BOOKIE_FAULTS = ("kill9", "pause", "partition_drop", "partition_stall")
DISK_FAULTS = ("disk_full", "disk_over_threshold")


@dataclass
class Node:
    bookie: BookieProcess
    proxy: FaultProxy
    small_fs: Path | None = None  # a tmpfs holding the data dir (disk faults), if we could mount one
    busy_until: float = 0.0  # a restarted bookie is left alone until it is healthy again


@dataclass
class ActiveFault:
    kind: str
    target: str
    end_t: float
    heal: Callable[[], None]
    node: Node | None = None


@dataclass
class Nemesis:
    nodes: list[Node]
    writers: list[subprocess.Popen[bytes]]
    rng: random.Random
    hist: History
    max_bookie_faults: int = 2
    mean_interval_s: float = 1.2
    active: list[ActiveFault] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    _next_t: float = 0.0
    _restarting: list[Node] = field(default_factory=list)

    # -- the schedule --------------------------------------------------------------------------------------
    def not_before(self, t: float) -> None:
        """No fault before ``time.monotonic()`` reaches ``t``."""
        self._next_t = t

    def step(self) -> None:
        now = time.monotonic()
        for f in [f for f in self.active if f.end_t <= now]:
            self._end(f)
        self._watch_processes()
        if now < self._next_t:
            return
        self._next_t = now + self.rng.expovariate(1.0 / self.mean_interval_s)
        kinds = ["zk_session_loss"]
        if sum(1 for f in self.active if f.node is not None) < self.max_bookie_faults:
            kinds += list(BOOKIE_FAULTS) * 2
            if any(n.small_fs for n in self.nodes):
                kinds += list(DISK_FAULTS)
        kind = self.rng.choice(kinds)
        if kind == "zk_session_loss":
            self._zk_session_loss()
        else:
            self._bookie_fault(kind, now)

    def _free_nodes(self, now: float) -> list[Node]:
        faulty = {id(f.node) for f in self.active if f.node is not None}
        return [
            n
            for n in self.nodes
            if id(n) not in faulty and n.bookie.alive and n.busy_until <= now and n not in self._restarting
        ]

    def _bookie_fault(self, kind: str, now: float) -> None:
        candidates = self._free_nodes(now)
        if kind in DISK_FAULTS:
            candidates = [n for n in candidates if n.small_fs is not None]
        if not candidates:
            return
        node = self.rng.choice(candidates)
        bp, px = node.bookie, node.proxy
        target = bp.id
        if kind == "kill9":
            bp.kill9()
            heal = self._restarter(node)
            dur = self.rng.uniform(0.5, 4.0)
        elif kind == "pause":
            bp.pause()
            heal = bp.resume
            dur = self.rng.uniform(0.5, 4.0)
        elif kind == "partition_drop":
            px.partition()
            heal = px.heal
            dur = self.rng.uniform(1.0, 5.0)
        elif kind == "partition_stall":
            px.stall()
            heal = px.heal
            dur = self.rng.uniform(1.0, 4.0)
        else:
            assert node.small_fs is not None
            filler = node.small_fs / "filler"
            fill(filler, leave_free=None if kind == "disk_full" else 1 << 20)
            heal = lambda: filler.unlink(missing_ok=True)  # noqa: E731
            dur = self.rng.uniform(2.0, 5.0)
        self.hist.record("fault", kind=kind, target=target, phase="start", duration_s=round(dur, 2))
        self.active.append(ActiveFault(kind, target, now + dur, heal, node))

    def _restarter(self, node: Node) -> Callable[[], None]:
        def restart() -> None:
            node.bookie.start(wait=False)
            node.busy_until = time.monotonic() + 30
            self._restarting.append(node)

        return restart

    def _zk_session_loss(self) -> None:
        alive = [w for w in self.writers if w.poll() is None]
        if not alive or any(f.kind == "zk_session_loss" for f in self.active):
            return
        w = self.rng.choice(alive)
        self.hist.record("fault", kind="zk_session_loss", target=f"pid {w.pid}", phase="start")
        with contextlib.suppress(ProcessLookupError):
            os.kill(w.pid, signal.SIGUSR1)
        self.active.append(
            ActiveFault("zk_session_loss", f"pid {w.pid}", time.monotonic() + 2.0, lambda: None)
        )

    def _end(self, f: ActiveFault) -> None:
        self.active.remove(f)
        f.heal()
        self.hist.record("fault", kind=f.kind, target=f.target, phase="end")

    def _watch_processes(self) -> None:
        now = time.monotonic()
        for n in list(self._restarting):
            if n.bookie.healthy():
                self._restarting.remove(n)
                n.busy_until = now + 0.5
            elif not n.bookie.alive:
                self._restarting.remove(n)
        killed = {id(f.node) for f in self.active if f.kind == "kill9"}
        for n in self.nodes:
            if id(n) not in killed and n not in self._restarting and not n.bookie.alive:
                msg = (
                    f"bookie {n.bookie.id} exited by itself ({n.bookie.proc and n.bookie.proc.returncode}):\n"
                )
                self.unexpected_exits.append(msg + n.bookie.log_tail(30))
                self.hist.record("fault", kind="unexpected_exit", target=n.bookie.id, phase="start")
                n.bookie.start(wait=False)
                self._restarting.append(n)

    # -- the end -------------------------------------------------------------------------------------------
    def heal_all(self, timeout_s: float = 60.0) -> None:
        for f in list(self.active):
            self._end(f)
        for n in self.nodes:
            n.proxy.heal()
            if n.small_fs is not None:
                (n.small_fs / "filler").unlink(missing_ok=True)
            if n.bookie.alive:
                n.bookie.resume()
            elif n not in self._restarting:
                n.bookie.start(wait=False)
        deadline = time.monotonic() + timeout_s
        for n in self.nodes:
            n.bookie.wait_healthy(max(1.0, deadline - time.monotonic()))
        self._restarting.clear()


def fill(path: Path, leave_free: int | None) -> None:
    """Fill the file system of ``path``: completely (None), or until ``leave_free`` bytes remain."""
    st = os.statvfs(path.parent)
    free = st.f_bavail * st.f_frsize
    target = None if leave_free is None else max(0, free - leave_free)
    chunk = b"\0" * (1 << 20)
    written = 0
    with open(path, "ab", buffering=0) as f, contextlib.suppress(OSError):
        while target is None or written < target:
            n = len(chunk) if target is None else min(len(chunk), target - written)
            f.write(chunk[:n])
            written += n
        f.flush()
        os.fsync(f.fileno())
