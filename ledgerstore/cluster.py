"""A local cluster as processes (ZooKeeper, bookies, topic brokers, AutoRecovery), state under one directory.

``BookieProcess`` is also what integration and fault tests use to run real bookie processes: start, wait for
health, SIGTERM, kill -9, SIGSTOP/SIGCONT, restart on the same directories.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledgerstore.cli import EXIT_UNAVAILABLE, CommandError, emit


def free_port() -> int:
    from zk.launcher import free_port as _free_port

    return _free_port("127.0.0.1")


def health_ok(http_port: int, bookie_id: str | None = None) -> bool:
    """Whether ``http://127.0.0.1:<http_port>/health`` answers 200 (a bookie, a broker or AutoRecovery); with
    ``bookie_id``, only if the bookie answering is that one (not another process holding the port)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=1) as r:
            if r.status != 200:
                return False
            if bookie_id is None:
                return True
            body = json.loads(r.read() or b"{}")
    except (OSError, ValueError):
        return False
    return isinstance(body, dict) and body.get("bookie_id") == bookie_id


class ServiceProcess:
    """What a bookie and a broker process share: spawning with output to a log file, waiting until ready,
    SIGTERM (after a SIGCONT, so a paused process can exit), kill -9, SIGSTOP/SIGCONT. A subclass is a dataclass
    with ``proc``, ``log_path`` and ``env`` fields, an ``id`` and a ``command()``."""

    kind = "process"
    proc: subprocess.Popen[bytes] | None
    log_path: Path | None
    env: dict[str, str]

    @property
    def id(self) -> str:
        raise NotImplementedError

    def command(self) -> list[str]:
        raise NotImplementedError

    def _spawn(self, log_path: Path) -> None:
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(log_path, "ab")  # noqa: SIM115 - the child owns it
        try:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
        finally:
            logf.close()

    def _wait_until(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.kind} {self.id} exited with {self.proc.returncode}: {self.log_tail()}"
                )
            if ready():
                return
            time.sleep(0.05)
        raise TimeoutError(f"{self.kind} {self.id} not {what} after {timeout_s}s: {self.log_tail()}")

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def log_tail(self, n: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill9()

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class BookieProcess(ServiceProcess):
    zk: str
    data_dir: Path
    port: int
    http_port: int
    zk_root: str = "/ledgerstore"
    extra_args: list[str] = field(default_factory=list)
    bookie_id: str | None = None
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: run AutoRecovery inside the bookie (``bookie serve``'s default). Off here unless asked: tests and
    #: benchmarks decide themselves what re-replicates; ``cluster up`` asks for it.
    autorecovery: bool = False
    #: ``--init-cluster``: create the cluster's metadata under ``zk_root`` if missing (``cluster up``, tests and
    #: benchmarks start bookies on fresh roots). False: the bookie refuses a root that holds no cluster.
    init_cluster: bool = True

    @property
    def id(self) -> str:
        return self.bookie_id or f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "ledgerstore.cli",
            "bookie",
            "serve",
            "--zk",
            self.zk,
            "--zk-root",
            self.zk_root,
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--http-port",
            str(self.http_port),
            *([] if self.autorecovery else ["--no-autorecovery"]),
            *(["--init-cluster"] if self.init_cluster else []),
            *self.extra_args,
        ]
        if self.bookie_id:
            cmd += ["--bookie-id", self.bookie_id]
        return cmd

    kind = "bookie"

    def start(self, wait: bool = True, timeout_s: float = 30.0) -> BookieProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(self.log_path or self.data_dir.parent / f"bookie-{self.port}.log")
        if wait:
            self.wait_healthy(timeout_s)
        return self

    def healthy(self) -> bool:
        return health_ok(self.http_port, self.id)

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        self._wait_until(self.healthy, timeout_s, "healthy")

    def restart(self, wait: bool = True) -> BookieProcess:
        self.stop()
        return self.start(wait=wait)


# ----------------------------------------------------------------------------------------------------------
# `ledgerstore cluster up|down|status`


def _state_file(state_dir: Path) -> Path:
    return state_dir / "cluster.json"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def command(args: argparse.Namespace) -> int:
    if args.docker and getattr(args, "zk_given", False):
        raise CommandError("--zk does not apply with --docker: the compose project runs its own ZooKeeper", 2)
    if args.docker:
        import ledgerstore.docker_cluster as docker_cluster

        return docker_cluster.command(args)
    state_dir: Path = args.state_dir
    if args.action == "up":
        return _up(args, state_dir)
    if args.action == "down":
        return _down(args, state_dir)
    return _status(args, state_dir)


def _check_ports_free(ports: list[tuple[int, str]]) -> None:
    """Refuse to start when a port the cluster needs is taken (another cluster, another program): the process
    given it would fail to bind, and a health check could be answered by whoever holds the port."""
    from zk.launcher import port_is_free

    taken = []
    seen: dict[int, str] = {}
    for port, what in ports:
        if port in seen:
            raise CommandError(
                f"port {port} is both {seen[port]} and {what}: choose ports that do not overlap", 2
            )
        seen[port] = what
        if not port_is_free(port, "127.0.0.1"):
            taken.append(f"{port} ({what})")
    if taken:
        raise CommandError(
            "ports in use on 127.0.0.1: " + ", ".join(taken) + "; pick free ones with the options named", 2
        )


def _up(args: argparse.Namespace, state_dir: Path) -> int:
    from zk import launcher

    state_dir.mkdir(parents=True, exist_ok=True)
    st = _read_state(state_dir)
    if st and all(_pid_alive(b["pid"]) for b in st.get("bookies", [])) and st.get("bookies"):
        emit(args, f"cluster already running from {state_dir}: ZooKeeper {st['zk']}", st)  # idempotent
        return 0
    if st:
        up = [
            f"{kind} {p['id']}"
            for kind in ("bookie", "broker")
            for p in st.get(kind + "s", [])
            if _pid_alive(p["pid"])
        ]
        if st.get("autorecovery") and _pid_alive(st["autorecovery"]["pid"]):
            up.append("autorecovery")
        if up:  # its own processes hold ports a new start needs: not "ports in use, pick others"
            raise CommandError(
                f"a partial cluster is running from {state_dir} (still up: {', '.join(up)}): "
                f"`ledgerstore cluster down --state-dir {state_dir}` first, then `cluster up` again"
            )
    bookie_http = getattr(args, "bookie_http_port", 8000)
    _check_ports_free(
        [(args.base_port + i, f"bookie-{i}'s port (--base-port)") for i in range(args.bookies)]
        + [
            (bookie_http + i, f"bookie-{i}'s admin HTTP port (--bookie-http-port)")
            for i in range(args.bookies)
        ]
        + [
            (args.broker_port + i, f"broker-{i}'s port (--broker-port)")
            for i in range(getattr(args, "brokers", 0))
        ]
        + [
            (args.broker_http_port + i, f"broker-{i}'s admin HTTP port (--broker-http-port)")
            for i in range(getattr(args, "brokers", 0))
        ]
        + (
            [(args.autorecovery_port, "AutoRecovery's metrics port (--autorecovery-port)")]
            if getattr(args, "autorecovery_process", False)
            else []
        )
    )
    # --zk names a ZooKeeper to use; otherwise the cluster starts its own on --zk-port (and `down` stops it)
    zk = args.zk if getattr(args, "zk_given", False) else launcher.cli_start(state_dir, args.zk_port)
    # AutoRecovery runs in every bookie (an auditor candidate and a worker each), unless --no-autorecovery; the
    # passwords it may open ledgers with: the brokers' managed ledgers (empty) and the operator's
    passwords = ["", *(getattr(args, "autorecovery_password", None) or [])]
    password_file = getattr(args, "autorecovery_password_file", None)
    embedded = getattr(args, "autorecovery", True)
    recovery_args = [a for pw in passwords for a in ("--autorecovery-password", pw)]
    if password_file is not None:
        recovery_args += ["--autorecovery-password-file", str(password_file)]
    bookies = []
    for i in range(args.bookies):
        port = args.base_port + i
        http_port = bookie_http + i
        bp = BookieProcess(
            zk=zk,
            zk_root=args.zk_root,
            data_dir=state_dir / f"bookie-{i}",
            port=port,
            http_port=http_port,
            log_path=state_dir / f"bookie-{i}.log",
            autorecovery=embedded,
            extra_args=recovery_args if embedded else [],
        )
        bp.start(wait=False)
        bookies.append(bp)
    for bp in bookies:
        bp.wait_healthy(60)
    brokers = []
    for i in range(getattr(args, "brokers", 0)):
        br = BrokerProcess(
            zk=zk,
            zk_root=args.zk_root,
            port=args.broker_port + i,
            http_port=args.broker_http_port + i,
            log_path=state_dir / f"broker-{i}.log",
        )
        br.start(wait=False)
        brokers.append(br)
    for br in brokers:
        br.wait_ready(60)
    recovery = None
    if getattr(args, "autorecovery_process", False):  # a standalone one too, on request
        recovery = AutoRecoveryProcess(
            zk=zk,
            zk_root=args.zk_root,
            metrics_port=args.autorecovery_port,
            passwords=passwords,
            password_file=password_file,
            log_path=state_dir / "autorecovery.log",
        )
        recovery.start(wait=True)
    state = {
        "zk": zk,
        "zk_external": bool(getattr(args, "zk_given", False)),  # `down` leaves a ZooKeeper it did not start
        "zk_root": args.zk_root,
        "bookies": [
            {
                "id": b.id,
                "pid": b.proc.pid if b.proc else 0,
                "http_port": b.http_port,
                "data_dir": str(b.data_dir),
            }
            for b in bookies
        ],
        "brokers": [_broker_row(br) for br in brokers],
        "autorecovery": (
            {"pid": recovery.proc.pid if recovery.proc else 0, "metrics_port": recovery.metrics_port}
            if recovery
            else None
        ),
    }
    _state_file(state_dir).write_text(json.dumps(state, indent=2))
    emit(
        args,
        lambda: (
            f"cluster up: ZooKeeper {zk}, bookies "
            + ", ".join(b.id for b in bookies)
            + "".join(
                f"\n  broker {br.id}: service URL {br.service_url}, admin http://127.0.0.1:{br.http_port}"
                for br in brokers
            )
            + ("\n  autorecovery: in every bookie (metrics on theirs)" if embedded else "")
            + (
                f"\n  autorecovery process: http://127.0.0.1:{recovery.metrics_port}/metrics"
                if recovery
                else ""
            )
            + f"\n  (logs in {state_dir})"
        ),
        state,
    )
    return 0


def _broker_row(br: BrokerProcess) -> dict[str, Any]:
    return {
        "id": br.id,
        "pid": br.proc.pid if br.proc else 0,
        "port": br.port,
        "http_port": br.http_port,
        "service_url": br.service_url,
        "web_service_url": f"http://127.0.0.1:{br.http_port}",
        "log": str(br.log_path),
    }


def _stop_pid(pid: int, timeout_s: float = 15.0) -> bool:
    """SIGTERM, then SIGKILL after ``timeout_s``; True if it was running."""
    return _stop_pids([pid], timeout_s) == 1


def _stop_pids(pids: list[int], timeout_s: float = 15.0) -> int:
    """SIGTERM to every one at once, then SIGKILL to those still running after ``timeout_s``; how many ran.
    Bookies stop together: each stops its AutoRecovery first, so none is left to take the others for lost."""
    running = [pid for pid in pids if _pid_alive(pid)]
    for pid in running:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_pid_alive(pid) for pid in running):
        time.sleep(0.1)
    for pid in running:
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    return len(running)


def restart_broker(state_dir: Path, index: int = 0) -> dict[str, Any]:
    """Stop the cluster's ``index``-th broker (SIGTERM: it flushes cursors and closes its ledgers) and start it
    again on the same ports; returns its new state row."""
    st = _read_state(state_dir)
    if not st or len(st.get("brokers", [])) <= index:
        raise CommandError(f"no broker {index} in the cluster of {state_dir}")
    row = st["brokers"][index]
    _stop_pid(row["pid"])
    br = BrokerProcess(
        zk=st["zk"],
        zk_root=st.get("zk_root", "/ledgerstore"),
        port=row["port"],
        http_port=row["http_port"],
        log_path=Path(row["log"]),
    )
    br.start(wait=True)
    st["brokers"][index] = _broker_row(br)
    _state_file(state_dir).write_text(json.dumps(st, indent=2))
    return dict(st["brokers"][index])


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    f = _state_file(state_dir)
    if not f.exists():
        return None
    data: dict[str, Any] = json.loads(f.read_text())
    return data


def _down(args: argparse.Namespace, state_dir: Path) -> int:
    from zk import launcher

    st = _read_state(state_dir) or {"bookies": []}
    if st.get("autorecovery"):  # first: bookies stopping one by one must not look lost to it
        _stop_pid(st["autorecovery"]["pid"])
    brokers_stopped = sum(_stop_pid(b["pid"]) for b in st.get("brokers", []))  # before the bookies
    stopped = _stop_pids([b["pid"] for b in st["bookies"]])
    zk_stopped = launcher.cli_stop(state_dir)
    _state_file(state_dir).unlink(missing_ok=True)
    zk_said = "stopped" if zk_stopped else "not running"
    if st.get("zk_external"):
        zk_said = f"{st['zk']} left running (cluster up did not start it)"
    emit(
        args,
        f"cluster down: {brokers_stopped} brokers and {stopped} bookies stopped, ZooKeeper {zk_said}",
        {"brokers_stopped": brokers_stopped, "bookies_stopped": stopped, "zk_stopped": zk_stopped},
    )
    return 0


def _zk_unreachable(st: dict[str, Any], state_dir: Path, timeout_s: float = 3.0) -> str | None:
    """Why the cluster's ZooKeeper does not answer a session within ``timeout_s`` (and, for the one `cluster up`
    started, how to start it again), or None if it answers: the processes beside it may be up and still unable
    to do anything."""
    from zk import MetadataConnectionError, MetadataError, MetadataStore, launcher

    if not st.get("zk_external") and not launcher.status(state_dir).running:
        port = st["zk"].rpartition(":")[2]
        return f"not running (start it: `ledgerstore zk start --state-dir {state_dir} --port {port}`)"
    try:
        with MetadataStore.connect(st["zk"], "/", timeout_s=timeout_s, session_timeout_s=timeout_s):
            return None
    except MetadataConnectionError:
        return f"no session within {timeout_s:g}s"
    except MetadataError:
        return None  # it answered (and refused something): reachable


def _bookie_health(alive: bool, health: dict[str, Any] | None) -> str:
    """What ``cluster status`` adds to a bookie's line from its /health answer."""
    if not alive:
        return ""
    if health is None:  # a hung process (SIGSTOP, a stuck disk) is alive and says nothing
        return " NOT ANSWERING (/health)"
    if health.get("status") == "failed":
        return f" FAILED: {health.get('reason', '?')}"
    if health.get("status") == "starting":
        return f" STARTING: {health.get('reason', '?')}"
    return " read-only" if health.get("readonly") else ""


def _status(args: argparse.Namespace, state_dir: Path) -> int:
    st = _read_state(state_dir)
    if not st:
        emit(args, f"no cluster in {state_dir}", {"running": False})
        return 1
    rows = []
    for b in st["bookies"]:
        alive = _pid_alive(b["pid"])
        health = None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{b['http_port']}/health", timeout=1) as r:
                health = json.loads(r.read())
        except urllib.error.HTTPError as e:  # 503: a failed or starting bookie says why
            with contextlib.suppress(OSError, ValueError):
                health = json.loads(e.read())
        except (OSError, ValueError):
            pass
        rows.append({**b, "alive": alive, "health": health})
    broker_rows = []
    for b in st.get("brokers", []):
        broker_rows.append({**b, "alive": _pid_alive(b["pid"]), "admin": health_ok(b["http_port"])})
    ar = st.get("autorecovery")
    ar_row = {**ar, "alive": _pid_alive(ar["pid"])} if ar else None
    zk_problem = _zk_unreachable(st, state_dir)
    emit(
        args,
        lambda: (
            f"ZooKeeper {st['zk']}"
            + (f" UNREACHABLE: {zk_problem}\n" if zk_problem else "\n")
            + "\n".join(
                f"  bookie {r['id']:<22} pid {r['pid']:<7} {'up' if r['alive'] else 'DOWN'}"
                + _bookie_health(r["alive"], r["health"])
                for r in rows
            )
            + "".join(
                f"\n  broker {r['id']:<22} pid {r['pid']:<7} {'up' if r['alive'] else 'DOWN'}"
                f"  {r['service_url']}  {r['web_service_url']}"
                + ("" if r["admin"] else " (admin not answering)")
                for r in broker_rows
            )
            + (
                f"\n  autorecovery pid {ar_row['pid']:<7} {'up' if ar_row['alive'] else 'DOWN'}"
                f"  http://127.0.0.1:{ar_row['metrics_port']}/metrics"
                if ar_row
                else ""
            )
        ),
        {
            "zk": st["zk"],
            "zk_reachable": zk_problem is None,
            **({"zk_error": zk_problem} if zk_problem else {}),
            "bookies": rows,
            "brokers": broker_rows,
            "autorecovery": ar_row,
        },
    )
    if zk_problem:
        return EXIT_UNAVAILABLE
    return 0 if all(r["alive"] for r in [*rows, *broker_rows, *([ar_row] if ar_row else [])]) else 1


@dataclass
class BrokerProcess(ServiceProcess):
    """A topic broker process (``ledgerstore broker serve``): start, wait until its Pulsar port accepts
    connections, SIGTERM, kill -9, SIGSTOP/SIGCONT."""

    zk: str
    port: int
    http_port: int
    zk_root: str = "/ledgerstore"
    extra_args: list[str] = field(default_factory=list)
    broker_id: str | None = None
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    kind = "broker"

    @property
    def id(self) -> str:
        return self.broker_id or f"127.0.0.1:{self.port}"

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "ledgerstore.cli",
            "broker",
            "serve",
            "--zk",
            self.zk,
            "--zk-root",
            self.zk_root,
            "--port",
            str(self.port),
            "--http-port",
            str(self.http_port),
            "--advertised-address",
            "127.0.0.1",
            *self.extra_args,
        ]
        if self.broker_id:
            cmd += ["--broker-id", self.broker_id]
        return cmd

    def start(self, wait: bool = True, timeout_s: float = 60.0) -> BrokerProcess:
        self._spawn(self.log_path or Path(f"/tmp/broker-{self.port}.log"))
        if wait:
            self.wait_ready(timeout_s)
        return self

    def ready(self) -> bool:
        """Its Pulsar port accepts connections and its admin HTTP answers ``/health`` 200 (connected to
        ZooKeeper): both, since the admin server may start a moment after the Pulsar listener."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                pass
        except OSError:
            return False
        return health_ok(self.http_port)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        self._wait_until(self.ready, timeout_s, "ready")

    def restart(self, wait: bool = True) -> BrokerProcess:
        self.stop()
        return self.start(wait=wait)


@dataclass
class AutoRecoveryProcess(ServiceProcess):
    """A standalone AutoRecovery process (``ledgerstore autorecovery serve``): an auditor candidate and a
    replication worker; ready when its ``/health`` answers."""

    zk: str
    metrics_port: int
    zk_root: str = "/ledgerstore"
    passwords: list[str] = field(default_factory=lambda: [""])
    #: more passwords, one a line: handed over as a file, so they never show in `ps`
    password_file: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    kind = "autorecovery"

    @property
    def id(self) -> str:
        return f"autorecovery-{self.metrics_port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "ledgerstore.cli", "autorecovery", "serve", "--zk", self.zk]
        cmd += ["--zk-root", self.zk_root, "--metrics-port", str(self.metrics_port)]
        for pw in self.passwords:
            cmd += ["--password", pw]
        if self.password_file is not None:
            cmd += ["--password-file", str(self.password_file)]
        return cmd + self.extra_args

    def start(self, wait: bool = True, timeout_s: float = 60.0) -> AutoRecoveryProcess:
        self._spawn(self.log_path or Path(f"/tmp/autorecovery-{self.metrics_port}.log"))
        if wait:
            self.wait_ready(timeout_s)
        return self

    def ready(self) -> bool:
        return health_ok(self.metrics_port)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        self._wait_until(self.ready, timeout_s, "ready")
