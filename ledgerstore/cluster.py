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

from ledgerstore.cli import EXIT_UNAVAILABLE, CommandError, UsageError, classify, counted, emit


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
    log_start = 0  # the log's size when the latest start began (the log is appended to across starts)

    @property
    def id(self) -> str:
        raise NotImplementedError

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, wait: bool = True, timeout_s: float = 60.0) -> ServiceProcess:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        self._wait_until(self.ready, timeout_s, "ready")

    def _spawn(self, log_path: Path) -> None:
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_start = log_path.stat().st_size if log_path.exists() else 0
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
                    f"{self.kind} {self.id} exited with {self.proc.returncode}: {self.started_log_tail()}"
                )
            if ready():
                return
            time.sleep(0.05)
        raise TimeoutError(f"{self.kind} {self.id} not {what} after {timeout_s}s: {self.started_log_tail()}")

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def log_tail(self, n: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def started_log_tail(self, n: int = 20) -> str:
        """The last ``n`` lines the process of the latest start wrote to its log (none of an earlier run's)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(self.log_start)
            text = f.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-n:])

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

    def ready(self) -> bool:
        return self.healthy()

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
    if getattr(args, "docker", False) and getattr(args, "zk_given", False):
        raise CommandError("--zk does not apply with --docker: the compose project runs its own ZooKeeper", 2)
    if getattr(args, "docker", False):
        import ledgerstore.docker_cluster as docker_cluster

        return docker_cluster.command(args)
    state_dir: Path = args.state_dir
    if args.action == "up":
        return _up(args, state_dir)
    if args.action == "down":
        return _down(args, state_dir)
    if args.action in ("stop", "start", "restart"):
        return _lifecycle(args, state_dir)
    return _status(args, state_dir)


def _check_recorded_zk(args: argparse.Namespace, st: dict[str, Any], state_dir: Path) -> None:
    """A command on the cluster a state file records (status, down, stop, start, restart) uses its ZooKeeper and
    root; --zk or --zk-root given on the command line must name those (a check, as they are for scripts that
    pass them to every command), and any other value is refused rather than ignored."""
    recorded = {"--zk": st.get("zk"), "--zk-root": st.get("zk_root", "/ledgerstore")}
    given = {
        "--zk": args.zk if getattr(args, "zk_given", False) else None,
        "--zk-root": args.zk_root if getattr(args, "zk_root_given", False) else None,
    }

    def norm(flag: str, value: str | None) -> str | None:  # (up records the root as typed: /r/ is /r)
        return (value.rstrip("/") or "/") if flag == "--zk-root" and value else value

    wrong = [
        f"{flag} {value}"
        for flag, value in given.items()
        if value is not None and norm(flag, value) != norm(flag, recorded[flag])
    ]
    if wrong:
        raise UsageError(
            f"{' and '.join(wrong)}: `cluster {args.action}` acts on the cluster {state_dir}/cluster.json records "
            f"(ZooKeeper {recorded['--zk']}, root {recorded['--zk-root']}); leave them out, or give the "
            "--state-dir of the cluster you mean"
        )


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


def _not_as_asked(args: argparse.Namespace, st: dict[str, Any]) -> list[str]:
    """The options of a `cluster up` that a running cluster's ``cluster.json`` does not match, as
    ``--flag <what runs>``."""
    bookies, brokers = st.get("bookies") or [], st.get("brokers") or []
    runs: list[tuple[str, object, object]] = [
        ("--bookies", args.bookies, len(bookies)),
        ("--brokers", getattr(args, "brokers", len(brokers)), len(brokers)),
    ]
    if not st.get("zk_external") and not getattr(args, "zk_given", False):
        runs.append(("--zk-port", args.zk_port, int(str(st["zk"]).rpartition(":")[2])))
    if bookies:
        runs.append(("--base-port", args.base_port, bookies[0]["port"]))
        http = getattr(args, "bookie_http_port", None)
        if http is not None:
            runs.append(("--bookie-http-port", http, bookies[0]["http_port"]))
    if brokers:
        runs.append(("--broker-port", args.broker_port, brokers[0]["port"]))
        runs.append(("--broker-http-port", args.broker_http_port, brokers[0]["http_port"]))
    return [f"{flag} {running}" for flag, asked, running in runs if asked != running]


def _check_named_zk(args: argparse.Namespace) -> None:
    """`cluster up --zk HOST:PORT` uses a ZooKeeper already running and starts none: --zk-port beside it naming
    another port, or nothing answering at --zk, is said at once, in one line, before anything starts (each bookie
    waited its 10 s for the ZooKeeper and `cluster up` failed 27 s later quoting a bookie's log)."""
    addrs = [a.strip() for a in str(args.zk).split("/", 1)[0].split(",") if a.strip()]
    ports = {a.rpartition(":")[2] for a in addrs}
    if getattr(args, "zk_port_given", False) and str(args.zk_port) not in ports:
        raise UsageError(
            f"--zk {args.zk} names a ZooKeeper already running (none is started) and --zk-port {args.zk_port} "
            "the port of one to start: give --zk-port alone to have `cluster up` start its ZooKeeper, or --zk alone"
        )
    for addr in addrs:
        host, _, port = addr.rpartition(":")
        with (
            contextlib.suppress(OSError, ValueError),
            socket.create_connection((host.strip("[]"), int(port)), 2),
        ):
            return
    raise CommandError(
        f"no ZooKeeper answers at --zk {args.zk}: --zk names one already running, and `cluster up` starts none "
        "then; start it first, or leave --zk out to have `cluster up` start its own (on --zk-port)",
        EXIT_UNAVAILABLE,
        kind="METADATA_CONNECTION",
    )


def _up(args: argparse.Namespace, state_dir: Path) -> int:
    from zk import launcher

    state_dir.mkdir(parents=True, exist_ok=True)
    st = _read_state(state_dir)
    if st and all(_pid_alive(b["pid"]) for b in st.get("bookies", [])) and st.get("bookies"):
        emit(args, f"cluster already running from {state_dir}: ZooKeeper {st['zk']}", st)  # idempotent
        differ = _not_as_asked(args, st)
        if differ:  # the ports a script then uses would be the wrong ones: say which run
            print(
                f"(not as asked: it runs with {', '.join(differ)}, as {state_dir / 'cluster.json'} records; "
                "`cluster down` first to start it otherwise)",
                file=sys.stderr,
            )
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
                f"`ledgerstore cluster start TARGET --state-dir {state_dir}` the stopped ones, or "
                f"`ledgerstore cluster down --state-dir {state_dir}` first, then `cluster up` again"
            )
    if getattr(args, "zk_given", False):
        _check_named_zk(args)
    bookie_http = getattr(args, "bookie_http_port", None) or 8000
    # this directory's ZooKeeper, from a `zk start` or an earlier up
    zk_was_running = launcher.status(state_dir).running
    starts_zk = not getattr(args, "zk_given", False) and not zk_was_running
    _check_ports_free(
        (
            [(args.zk_port, "ZooKeeper's port (--zk-port; or --zk HOST:PORT: one that runs)")]
            if starts_zk
            else []
        )
        + [(args.base_port + i, f"bookie-{i}'s port (--base-port)") for i in range(args.bookies)]
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
    # (the given ones reach the processes in a file of the state directory, not on their command lines)
    passwords, in_file = _split_passwords(getattr(args, "autorecovery_password", None) or [])
    given_file = _write_passwords(state_dir, in_file) if in_file else None
    password_file = getattr(args, "autorecovery_password_file", None)
    embedded = getattr(args, "autorecovery", True)
    recovery_args = [a for pw in passwords for a in ("--autorecovery-password", pw)]
    for path in (given_file, password_file):
        if path is not None:
            recovery_args += ["--autorecovery-password-file", str(path)]
    # each piece is a row of the state file first, and started from its row, as `cluster start` starts it again
    state: dict[str, Any] = {
        "zk": zk,
        "zk_external": bool(getattr(args, "zk_given", False)),  # `down` leaves a ZooKeeper it did not start
        "zk_root": args.zk_root,
        "bookies": [
            {
                "id": f"127.0.0.1:{args.base_port + i}",
                "pid": 0,
                "port": args.base_port + i,
                "http_port": bookie_http + i,
                "data_dir": str(state_dir / f"bookie-{i}"),
                "log": str(state_dir / f"bookie-{i}.log"),
                "autorecovery": embedded,
                "args": recovery_args if embedded else [],
            }
            for i in range(args.bookies)
        ],
        "brokers": [
            _broker_row(
                args.broker_port + i, args.broker_http_port + i, state_dir / f"broker-{i}.log", args.bookies
            )
            for i in range(getattr(args, "brokers", 0))
        ],
        "autorecovery": (  # a standalone one too, on request
            {
                "pid": 0,
                "metrics_port": args.autorecovery_port,
                "passwords": passwords,
                "password_file": str(password_file) if password_file is not None else None,
                "args": ["--password-file", str(given_file)] if given_file is not None else [],
                "log": str(state_dir / "autorecovery.log"),
            }
            if getattr(args, "autorecovery_process", False)
            else None
        ),
    }
    started: list[ServiceProcess] = []
    try:
        for kind in ("bookie", "broker"):  # the bookies first: a broker needs them
            group = []
            for row in state[kind + "s"]:
                group.append(_launch(state, kind, row))
                started.append(group[-1])
            for proc in group:
                proc.wait_ready(60)
        recovery = state["autorecovery"] and _launch(state, "autorecovery", state["autorecovery"])
        if recovery:
            started.append(recovery)
            recovery.wait_ready(60)
    except BaseException as e:
        # a half-started cluster has no state file for `cluster down` to stop it by, and its processes hold the
        # ports the next `cluster up` needs: stop what this one started (its logs stay)
        _stop_pids([p.proc.pid for p in reversed(started) if p.proc is not None])
        if starts_zk:
            launcher.cli_stop(state_dir)
        if not isinstance(e, Exception):
            raise
        status, code, message = classify(e)
        raise CommandError(
            f"cluster up failed, and stopped what it had started (logs in {state_dir}): {message}",
            status,
            kind=code,
        ) from e
    _write_state(state_dir, state)
    emit(
        args,
        lambda: (
            f"cluster up: ZooKeeper {zk}, bookies "
            + ", ".join(b["id"] for b in state["bookies"])
            + "".join(
                f"\n  broker {br['id']}: service URL {br['service_url']}, admin {br['web_service_url']}"
                + (f" ({' '.join(br['args'])}: only --bookies {args.bookies})" if br["args"] else "")
                for br in state["brokers"]
            )
            + ("\n  autorecovery: in every bookie (metrics on theirs)" if embedded else "")
            + (
                f"\n  autorecovery process: http://127.0.0.1:{state['autorecovery']['metrics_port']}/metrics"
                if recovery
                else ""
            )
            + env_hint(zk, args.zk_root, state["brokers"])
            + f"\n  (logs in {state_dir})"
        ),
        state,
    )
    return 0


def env_hint(zk: str, zk_root: str, brokers: list[dict[str, Any]]) -> str:
    """``cluster up``'s line naming the variables the other commands need to find this cluster, when it is not
    where they look by default (--zk-port, --zk, --zk-root, --broker-port, --broker-http-port); else ""."""
    from ledgerstore.cli import DEFAULT_ZK, DEFAULT_ZK_ROOT
    from ledgerstore.topic_cmd import DEFAULT_ADMIN_URL, DEFAULT_SERVICE_URL

    wanted = [("LEDGERSTORE_ZK", zk, DEFAULT_ZK), ("LEDGERSTORE_ZK_ROOT", zk_root, DEFAULT_ZK_ROOT)]
    if brokers:
        wanted += [
            ("LEDGERSTORE_BROKER_URL", brokers[0]["service_url"], DEFAULT_SERVICE_URL),
            ("LEDGERSTORE_BROKER_HTTP", brokers[0]["web_service_url"], DEFAULT_ADMIN_URL),
        ]
    pairs = [f"{name}={value}" for name, value, default in wanted if value != default]
    return f"\n  for the other commands: export {' '.join(pairs)}" if pairs else ""


def _broker_row(port: int, http_port: int, log: Path, bookies: int) -> dict[str, Any]:
    return {
        "id": f"127.0.0.1:{port}",
        "pid": 0,
        "port": port,
        "http_port": http_port,
        "service_url": f"pulsar://127.0.0.1:{port}",
        "web_service_url": f"http://127.0.0.1:{http_port}",
        "log": str(log),
        "args": _broker_quorum_args(bookies),
    }


def _broker_quorum_args(bookies: int) -> list[str]:
    """A broker's topics' ledgers on a cluster of fewer bookies than its default ensemble (3, with write and ack
    quorums of 2) use all there are: with the defaults no topic could ever be opened (NOT_ENOUGH_BOOKIES)."""
    from topic_broker.service import DEFAULT_ACK_QUORUM, DEFAULT_ENSEMBLE_SIZE, DEFAULT_WRITE_QUORUM

    if not 0 < bookies < DEFAULT_ENSEMBLE_SIZE:
        return []
    e, w, a = bookies, min(bookies, DEFAULT_WRITE_QUORUM), min(bookies, DEFAULT_ACK_QUORUM)
    return ["--ensemble-size", str(e), "--write-quorum", str(w), "--ack-quorum", str(a)]


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
    piece = _Piece(f"broker-{index}", "broker", st["brokers"][index])
    _stop_piece(state_dir, piece, kill=False)
    _start_piece(None, state_dir, st, piece)
    return dict(piece.row)


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    f = _state_file(state_dir)
    if not f.exists():
        return None
    data: dict[str, Any] = json.loads(f.read_text())
    return data


def _no_cluster(state_dir: Path) -> str:
    """What a command on a --state-dir without a cluster says (a cluster started with another --state-dir, most
    likely, as the default one is the working directory's ``.ledgerstore``)."""
    return (
        f"no cluster in {state_dir} (no cluster.json; a cluster started with `cluster up --state-dir DIR` is "
        "found with the same --state-dir DIR)"
    )


def _down(args: argparse.Namespace, state_dir: Path) -> int:
    from zk import launcher

    st = _read_state(state_dir) or {"bookies": []}
    if "zk" in st:
        _check_recorded_zk(args, st, state_dir)
    # pieces already gone (killed, crashed): named, so "2 bookies stopped" of a cluster of 3 is not a puzzle
    gone = [
        f"{kind} {row.get('id', row['pid'])}"
        for kind, rows in (("broker", st.get("brokers", [])), ("bookie", st["bookies"]))
        for row in rows
        if not _pid_alive(row["pid"])
    ]
    recovery = st.get("autorecovery")
    recovery_stopped = False
    if recovery:  # first: bookies stopping one by one must not look lost to it
        recovery_stopped = _stop_pid(recovery["pid"])
        if not recovery_stopped:
            gone.append("the AutoRecovery process")
    brokers_stopped = sum(_stop_pid(b["pid"]) for b in st.get("brokers", []))  # before the bookies
    stopped = _stop_pids([b["pid"] for b in st["bookies"]])
    zk_stopped = launcher.cli_stop(state_dir)
    _state_file(state_dir).unlink(missing_ok=True)
    (state_dir / "autorecovery-passwords").unlink(missing_ok=True)  # the other file holding them
    zk_said = "stopped" if zk_stopped else "not running"
    if st.get("zk_external"):
        zk_said = f"{st['zk']} left running (cluster up did not start it)"
    pieces = [counted(brokers_stopped, "broker"), counted(stopped, "bookie")]
    pieces += ["the AutoRecovery process"] if recovery_stopped else []
    human = f"cluster down: {', '.join(pieces[:-1])} and {pieces[-1]} stopped, ZooKeeper {zk_said}" + (
        f" (not running already: {', '.join(gone)})" if gone else ""
    )
    if "zk" not in st:  # no cluster.json: at most a ZooKeeper of `zk start` in this directory
        human = f"{_no_cluster(state_dir)}: nothing to stop" + (
            ", but its ZooKeeper: stopped" if zk_stopped else ""
        )
    emit(
        args,
        human,
        {
            "brokers_stopped": brokers_stopped,
            "bookies_stopped": stopped,
            "autorecovery_stopped": recovery_stopped,
            "zk_stopped": zk_stopped,
        },
    )
    return 0


# ----------------------------------------------------------------------------------------------------------
# `ledgerstore cluster stop|start|restart TARGET`: one piece of a `cluster up` cluster


@dataclass
class _Piece:
    """One process of the cluster as `cluster status` lists it: ``name`` (``bookie-1``, ``broker-0``,
    ``autorecovery``, ``zookeeper``), its kind and its row of the state file (the one ``cluster up`` wrote)."""

    name: str
    kind: str
    row: dict[str, Any]

    @property
    def label(self) -> str:
        ident = self.row.get("id")
        return f"{self.kind} {ident} ({self.name})" if ident else self.name

    def names(self) -> list[str]:
        """What picks it on the command line: its name, its id, a broker's service URL."""
        return [self.name, *(str(self.row[k]) for k in ("id", "service_url") if self.row.get(k))]


def _process_of(st: dict[str, Any], kind: str, row: dict[str, Any]) -> ServiceProcess:
    """The process a state row describes: the same ports, id, data directory, flags and log file whenever it is
    started (a bookie row older than its port and log fields gets them from its id and data directory; rows
    without the flags are refused first, :func:`_check_startable`)."""
    zk, zk_root = st["zk"], st.get("zk_root", "/ledgerstore")
    if kind == "bookie":
        data_dir = Path(row["data_dir"])
        embedded = row["autorecovery"]
        return BookieProcess(
            zk=zk,
            zk_root=zk_root,
            data_dir=data_dir,
            port=row.get("port") or int(str(row["id"]).rpartition(":")[2]),
            http_port=row["http_port"],
            log_path=Path(row.get("log") or data_dir.parent / f"{data_dir.name}.log"),
            autorecovery=embedded,
            extra_args=list(row["args"]),
        )
    if kind == "broker":
        return BrokerProcess(
            zk=zk,
            zk_root=zk_root,
            port=row["port"],
            http_port=row["http_port"],
            log_path=Path(row["log"]),
            extra_args=list(row.get("args", [])),  # (rows older than the field: started without any)
        )
    password_file = row.get("password_file")
    return AutoRecoveryProcess(
        zk=zk,
        zk_root=zk_root,
        metrics_port=row["metrics_port"],
        passwords=list(row["passwords"]),
        password_file=Path(password_file) if password_file else None,
        extra_args=list(row.get("args", [])),  # (rows older than the field: the passwords were flags)
        log_path=Path(row["log"]) if row.get("log") else None,
    )


def _launch(st: dict[str, Any], kind: str, row: dict[str, Any]) -> ServiceProcess:
    """Start the process ``row`` describes without waiting for it; its pid goes into ``row``."""
    proc = _process_of(st, kind, row).start(wait=False)
    assert proc.proc is not None
    row["pid"] = proc.proc.pid
    return proc


def _split_passwords(given: list[str]) -> tuple[list[str], list[str]]:
    """The AutoRecovery passwords given to `cluster up`: (those handed over as flags, the empty one first; those
    written to the file). The file is the rule: a flag stays in the long-running process's command line, which
    anyone on the host can read (`ps`). A password the file's readers would not read back as one line stays a
    flag: they split it with str.splitlines, which breaks at \\n and \\r and also at \\v, \\f, \\x1c-\\x1e, \\x85,
    \\u2028 and \\u2029."""
    flags = ["", *(pw for pw in given if pw and pw.splitlines() != [pw])]
    return flags, [pw for pw in dict.fromkeys(given) if pw and pw not in flags]


def _write_passwords(state_dir: Path, passwords: list[str]) -> Path:
    """The file of the AutoRecovery passwords given on `cluster up`'s command line, one a line, readable by its
    owner only (created so, never readable by others for a moment)."""
    f = state_dir / "autorecovery-passwords"
    _write_private(f, "".join(pw + "\n" for pw in passwords))
    return f


def _write_private(f: Path, text: str) -> None:
    """Replace ``f`` by ``text`` in a file created readable by its owner only: written first and chmod-ed
    after, it was readable by anyone for that moment."""
    tmp = f.with_name(f.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(tmp, f)


def _write_state(state_dir: Path, st: dict[str, Any]) -> None:
    """The state file, readable by its owner only (it holds AutoRecovery's ledger passwords)."""
    _write_private(_state_file(state_dir), json.dumps(st, indent=2))


def _pieces(st: dict[str, Any]) -> list[_Piece]:
    pieces = [_Piece(f"bookie-{i}", "bookie", row) for i, row in enumerate(st.get("bookies", []))]
    pieces += [_Piece(f"broker-{i}", "broker", row) for i, row in enumerate(st.get("brokers", []))]
    if st.get("autorecovery"):
        pieces.append(_Piece("autorecovery", "autorecovery", st["autorecovery"]))
    if not st.get("zk_external"):  # a ZooKeeper `cluster up` did not start is not its to stop
        pieces.append(_Piece("zookeeper", "zookeeper", {"zk": st["zk"]}))
    return pieces


def _find_piece(st: dict[str, Any], target: str) -> _Piece:
    pieces = _pieces(st)
    for piece in pieces:
        if target in piece.names():
            return piece
    valid = "; ".join(" or ".join(p.names()) for p in pieces)
    raise UsageError(f"no {target!r} in this cluster; the targets are: {valid}")


#: What a piece's row must hold to start it again as it was started: the fields `cluster up` records since
#: 417b1bc, which it did not before (a bookie's port and log file follow from its id and data directory; a
#: broker's row always had its ports and log).
_STARTED_WITH = {"bookie": ("autorecovery", "args"), "autorecovery": ("passwords", "password_file")}


def _check_startable(piece: _Piece, state_dir: Path) -> None:
    """Refuse (before anything is stopped) to stop or start a piece that a state file written by an older
    `cluster up` does not say how to start again (a bookie's AutoRecovery flags, the AutoRecovery process's
    passwords), saying what to do instead."""
    missing = [k for k in _STARTED_WITH.get(piece.kind, ()) if k not in piece.row]
    if missing:
        raise CommandError(
            f"{piece.label}: {state_dir}/cluster.json was written by an older `cluster up`, which did not record "
            f"the AutoRecovery flags it started it with, so it cannot be started again as it was: `ledgerstore "
            f"cluster down --state-dir {state_dir}`, then `ledgerstore cluster up --state-dir {state_dir}` with the "
            "options it was given then (the same ports: the data is kept); `cluster stop|start|restart` work on "
            "the cluster.json that writes (`cluster status` and `down` work on this one)"
        )


def _running(state_dir: Path, piece: _Piece) -> int | None:
    """The piece's pid if it runs."""
    if piece.kind == "zookeeper":
        from zk import launcher

        return launcher.status(state_dir).pid
    pid = int(piece.row.get("pid") or 0)
    return pid if pid and _pid_alive(pid) else None


def _stop_piece(state_dir: Path, piece: _Piece, kill: bool) -> bool:
    """SIGTERM (a clean stop; SIGKILL after 15 s) or, with ``kill``, SIGKILL (a crash); True if it ran."""
    pid = _running(state_dir, piece)
    if pid is None:
        return False
    if piece.kind == "zookeeper":
        from zk import launcher

        if not kill:
            return launcher.cli_stop(state_dir)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # the JVM and whatever it forked
    elif kill:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    else:
        return _stop_pid(pid)
    deadline = time.monotonic() + 10
    while _running(state_dir, piece) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


#: how long a started bookie's /health may answer "starting" (registering in ZooKeeper) before `cluster start`
#: says it waits for a crashed process's registration to go: a clean restart registers within a moment.
STARTING_NOTICE_S = 1.0


def _wait_bookie(args: argparse.Namespace | None, bp: ServiceProcess, timeout_s: float = 120.0) -> None:
    """Wait until a bookie started again is healthy. After a crash its /health says 503 "starting" until
    ZooKeeper expires the crashed process's session (its registration): say so, with a progress line on a
    terminal, rather than wait in silence. Said once /health has answered "starting" for STARTING_NOTICE_S,
    not counting the process's own start (its imports and journal replay, seconds on a loaded machine), after
    which a clean restart registers at once."""
    from ledgerstore.cli import progress_disabled

    assert isinstance(bp, BookieProcess)
    show = args is not None and not progress_disabled(args)
    said = False
    t0 = time.monotonic()
    first_starting: float | None = None

    def ready() -> bool:
        nonlocal said, first_starting
        health = _health(bp.http_port)
        starting = health is not None and health.get("status") == "starting"
        now = time.monotonic()
        if starting and first_starting is None:
            first_starting = now
        if (
            starting
            and args is not None
            and first_starting is not None
            and now - first_starting > STARTING_NOTICE_S
        ):
            if not said:
                print(
                    f"bookie {bp.id}: /health says starting ({health.get('reason', '?') if health else '?'}); "
                    "after a crash it registers once ZooKeeper has expired the crashed process's session",
                    file=sys.stderr,
                    flush=True,
                )
                said = True
            if show:
                print(
                    f"\r  waiting for bookie {bp.id}: {time.monotonic() - t0:.0f}s", end="", file=sys.stderr
                )
        return health is not None and health.get("bookie_id") == bp.id and health.get("status") == "ok"

    try:
        bp._wait_until(ready, timeout_s, "healthy")
    finally:
        if show and said:
            print(file=sys.stderr)


def _start_piece(args: argparse.Namespace | None, state_dir: Path, st: dict[str, Any], piece: _Piece) -> None:
    """Start a stopped piece as `cluster up` started it, wait until it is ready, record its new pid."""
    if piece.kind == "zookeeper":
        from zk import launcher

        launcher.cli_start(state_dir, int(st["zk"].rpartition(":")[2]))
        return
    proc = _launch(st, piece.kind, piece.row)
    try:
        if piece.kind == "bookie":
            _wait_bookie(args, proc)
        else:
            proc.wait_ready(60)
    except (RuntimeError, TimeoutError) as e:
        raise CommandError(f"{piece.label} did not come back: {e}") from e
    finally:
        _write_state(state_dir, st)  # its pid, even if it is not ready (so `status` and `down` find it)


def _lifecycle(args: argparse.Namespace, state_dir: Path) -> int:
    """``cluster stop|start|restart TARGET [--kill]``."""
    st = _read_state(state_dir)
    if not st:
        raise CommandError(f"{_no_cluster(state_dir)}; `ledgerstore cluster up` starts one")
    _check_recorded_zk(args, st, state_dir)
    piece = _find_piece(st, args.target)
    _check_startable(piece, state_dir)
    kill = getattr(args, "kill", False)
    data: dict[str, Any] = {"target": piece.name, "kind": piece.kind, "action": args.action}
    if args.action == "start":
        pid = _running(state_dir, piece)
        if pid is not None:
            emit(
                args, f"{piece.label} is running already (pid {pid})", {**data, "pid": pid, "started": False}
            )
            return 0
    else:
        data["was_running"] = _stop_piece(state_dir, piece, kill)
        how = "killed (SIGKILL)" if kill else "stopped"
        if args.action == "stop":
            said = how if data["was_running"] else "was not running"
            emit(args, f"{piece.label} {said}", data)
            return 0
    _start_piece(args, state_dir, st, piece)
    pid = _running(state_dir, piece)
    said = "started" if args.action == "start" else ("killed and " if kill else "stopped and ") + "started"
    emit(args, f"{piece.label} {said} (pid {pid})", {**data, "pid": pid, "started": True})
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


def _health(http_port: int) -> dict[str, Any] | None:
    """A bookie's /health answer (a 503 too: a failed or starting bookie says why), None if none came."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=1) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = None
        with contextlib.suppress(OSError, ValueError):
            body = json.loads(e.read())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


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


def _pid_row(row: dict[str, Any], alive: bool) -> dict[str, Any]:
    """A piece's row as ``cluster status`` shows it: the recorded pid while it runs; once it is down that pid
    runs nothing (or, reused, something else), so ``pid`` is None and ``last_pid`` keeps the recorded one."""
    if alive:
        return dict(row)
    return {**row, "pid": None, "last_pid": row["pid"]}


def _pid_text(row: dict[str, Any], why: str | None = None) -> str:
    """``1234    up`` or ``-       DOWN (was pid 1234)`` (``DOWN (<why>; was pid 1234)``): the pid column and the
    state of a piece's line."""
    if row["alive"]:
        return f"{row['pid']:<7} up"
    return f"{'-':<7} DOWN ({f'{why}; ' if why else ''}was pid {row['last_pid']})"


def _status(args: argparse.Namespace, state_dir: Path) -> int:
    st = _read_state(state_dir)
    if not st:
        emit(args, f"{_no_cluster(state_dir)}; `ledgerstore cluster up` starts one", {"running": False})
        return 1
    _check_recorded_zk(args, st, state_dir)
    rows = []
    for b in st["bookies"]:
        alive = _pid_alive(b["pid"])
        rows.append({**_pid_row(b, alive), "alive": alive, "health": _health(b["http_port"])})
    broker_rows = []
    for b in st.get("brokers", []):
        alive = _pid_alive(b["pid"])
        broker_rows.append({**_pid_row(b, alive), "alive": alive, "admin": health_ok(b["http_port"])})
    ar = st.get("autorecovery")
    ar_row = {**_pid_row(ar, alive := _pid_alive(ar["pid"])), "alive": alive} if ar else None
    zk_problem = _zk_unreachable(st, state_dir)
    if zk_problem is None and not all(r["alive"] for r in rows):
        retired = _decommissioned(st, [r["id"] for r in rows if not r["alive"]])
        for r in rows:
            r["decommissioned"] = r["id"] in retired
    emit(
        args,
        lambda: (
            f"ZooKeeper {st['zk']}"
            + (f" UNREACHABLE: {zk_problem}\n" if zk_problem else "\n")
            + "\n".join(
                f"  bookie {r['id']:<22} pid "
                + _pid_text(
                    r, "decommissioned: its data moved, cookie deleted" if r.get("decommissioned") else None
                )
                + _bookie_health(r["alive"], r["health"])
                for r in rows
            )
            + "".join(
                f"\n  broker {r['id']:<22} pid {_pid_text(r)}"
                f"  {r['service_url']}  {r['web_service_url']}"
                + ("" if r["admin"] else " (admin not answering)")
                for r in broker_rows
            )
            + (
                f"\n  autorecovery pid {_pid_text(ar_row)}  http://127.0.0.1:{ar_row['metrics_port']}/metrics"
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
    pieces = [*rows, *broker_rows, *([ar_row] if ar_row else [])]
    return 0 if all(r["alive"] or r.get("decommissioned") for r in pieces) else 1


def _decommissioned(st: dict[str, Any], bookies: list[str]) -> set[str]:
    """The bookies of ``bookies`` that were decommissioned (a ``bookies/decommissioning`` mark and no cookie: their
    data moved off), so that their being down is no fault; none when ZooKeeper cannot tell."""
    from zk import MetadataError, MetadataStore, read_zk_cookie
    from zk.underreplication import DECOMMISSIONING

    try:
        with MetadataStore.connect(st["zk"], st.get("zk_root", "/ledgerstore"), timeout_s=3.0) as store:
            marked = set(store.children_many([DECOMMISSIONING])[DECOMMISSIONING] or ())
            return {b for b in bookies if b in marked and read_zk_cookie(store, b) is None}
    except MetadataError:
        return set()


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
