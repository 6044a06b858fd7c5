"""Run a real Apache ZooKeeper (standalone) as a local subprocess: for tests, fault tests and ``ledgerstore zk``.

Two ways to use it:

* :class:`ZooKeeperServer` - owned by this process (tests): ``with ZooKeeperServer() as zk: zk.connect_string``.
  A temporary directory is used (and removed on stop) unless ``data_dir`` is given. ``pause()``/``resume()``
  (SIGSTOP/SIGCONT), ``kill()`` (SIGKILL) and ``restart()`` (same port, same data) serve fault tests.
* A daemon under a state directory (the CLI): :func:`start_daemon` / :func:`stop_daemon` / :func:`status`, or the
  CLI entry points :func:`cli_start` / :func:`cli_stop`. The daemon outlives the Python process; its pid, config,
  data and log live under the state directory::

      <state_dir>/zoo.cfg  <state_dir>/data/  <state_dir>/zookeeper.log  <state_dir>/zookeeper.pid

The server is ready when the four-letter word ``srvr`` answers ``Mode: standalone``. Java and the jars are found
from ``LEDGERSTORE_JAVA`` / ``JAVA_HOME`` / ``PATH`` and ``LEDGERSTORE_ZK_CLASSPATH`` / ``ZOOKEEPER_HOME`` /
Debian's ``/usr/share/java`` (whose ``zookeeper.jar`` manifest lists its own dependencies).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 2181
HOST = "127.0.0.1"
#: ZooKeeper's ``maxClientCnxns``: concurrent connections from one IP address (0 would be unlimited). Every
#: ledgerstore process holds one session (a bookie, a broker, a client, a CLI command, a Spark executor), so one
#: host needs tens; the test suite, all on 127.0.0.1, peaks far below this (see docs/operations.md). The bound
#: keeps one runaway or hostile address from taking every file descriptor and session of the server.
DEFAULT_MAX_CLIENT_CNXNS = 200
JAR_DIR = Path("/usr/share/java")
#: Jars put on the classpath when found in JAR_DIR (Debian: zookeeper.jar's manifest adds netty, jetty, ...).
DEBIAN_JARS = ("zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-simple.jar")
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
#: JVM options for any server: small heap, quick start. Tests add FAST_START_JVM_OPTS.
DEFAULT_JVM_OPTS: tuple[str, ...] = (
    "-Xms32m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-Djava.net.preferIPv4Stack=true",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
)
FAST_START_JVM_OPTS: tuple[str, ...] = ("-XX:TieredStopAtLevel=1", "-Xshare:auto")

CFG_NAME = "zoo.cfg"
LOG_NAME = "zookeeper.log"
PID_NAME = "zookeeper.pid"
DATA_NAME = "data"


class ZooKeeperLaunchError(RuntimeError):
    """The local ZooKeeper could not be started (or stopped); the message includes the log tail."""


# --- discovery ------------------------------------------------------------------------------------------------


def find_java() -> str:
    explicit = os.environ.get("LEDGERSTORE_JAVA")
    if explicit:
        return explicit
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise ZooKeeperLaunchError("no java found: install a JRE (>= 11) or set LEDGERSTORE_JAVA / JAVA_HOME")
    return found


def default_classpath() -> str:
    explicit = os.environ.get("LEDGERSTORE_ZK_CLASSPATH")
    if explicit:
        return explicit
    home = os.environ.get("ZOOKEEPER_HOME")
    if home:
        jars = sorted(Path(home).glob("*.jar")) + sorted((Path(home) / "lib").glob("*.jar"))
        if jars:
            return os.pathsep.join(str(j) for j in jars)
    jars = [JAR_DIR / name for name in DEBIAN_JARS if (JAR_DIR / name).exists()]
    if not any(j.name == "zookeeper.jar" for j in jars):
        raise ZooKeeperLaunchError(
            f"ZooKeeper jars not found in {JAR_DIR}: install ZooKeeper (Debian package 'zookeeper'), "
            "or set ZOOKEEPER_HOME to an unpacked release, or LEDGERSTORE_ZK_CLASSPATH"
        )
    return os.pathsep.join(str(j) for j in jars)


_PORTS_LOCK = threading.Lock()
_PORTS_HANDED_OUT: set[int] = set()
_PORT_LOW = 10_000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port(host: str = HOST) -> int:
    """A TCP port free on ``host`` now, for a server started a moment later.

    Chosen *below* the kernel's ephemeral range, so that outgoing connections (which take ephemeral ports) cannot
    grab it between this check and the server's bind — with many test clients and bookies connecting, a port
    from ``bind(0)`` is taken that way now and then. Never hands out the same port twice in one process.
    """
    high = _ephemeral_low()
    rng = random.Random()
    with _PORTS_LOCK:
        for _ in range(500 if high > _PORT_LOW + 1000 else 0):
            port = rng.randrange(_PORT_LOW, high)
            if port in _PORTS_HANDED_OUT:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _PORTS_HANDED_OUT.add(port)
            return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room below the ephemeral range
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        _PORTS_HANDED_OUT.add(port)
        return port


def port_is_free(port: int, host: str = HOST) -> bool:
    """True if nothing listens on ``host:port`` (SO_REUSEADDR: TIME_WAIT leftovers do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def four_letter(host: str, port: int, cmd: str, timeout: float = 2.0) -> str:
    """Send a ZooKeeper four-letter word (``srvr``, ``ruok``, ``stat``, ``mntr``) and return the whole answer.
    Raises ``OSError`` (incl. ``TimeoutError``) if the server does not answer."""
    if len(cmd) != 4:
        raise ValueError(f"four-letter words have four letters, got {cmd!r}")
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(cmd.encode("ascii"))
        chunks: list[bytes] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{cmd} to {host}:{port}: no complete answer within {timeout}s")
            s.settimeout(remaining)
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def server_mode(host: str, port: int, timeout: float = 1.0) -> str | None:
    """The ``Mode:`` line of ``srvr`` (``"standalone"``, ``"leader"``, ...), or None if nothing answers."""
    try:
        answer = four_letter(host, port, "srvr", timeout)
    except OSError:
        return None
    for line in answer.splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def _startup_cause(log_path: Path, data: Path) -> str:
    """What a ZooKeeper that exited at start said in its log since this start, when it is a cause an operator can
    act on without reading its Java traceback: its data directory full (it writes a snapshot as it starts, and
    exits when it cannot)."""
    since = log_tail(log_path, lines=200).rpartition("--- starting ZooKeeper")[2]
    if "No space left on device" not in since:
        return ""
    try:
        free = f"{shutil.disk_usage(data).free / 2**20:.1f} MiB free"
    except OSError:
        free = "its free space unknown"
    return (
        f": no space left on device in its data directory {data} ({free}); free space there and start it again "
        "(what it stored is kept)"
    )


def render_config(
    data_dir: Path,
    port: int,
    *,
    tick_time_ms: int = 500,
    max_session_timeout_ms: int = 60_000,
    force_sync: bool = True,
    max_client_cnxns: int = DEFAULT_MAX_CLIENT_CNXNS,
    extra: Mapping[str, str] | None = None,
) -> str:
    """The ``zoo.cfg`` text. ``forceSync=no`` is written only when ``force_sync`` is False (not durable!)."""
    cfg: dict[str, str] = {
        "tickTime": str(tick_time_ms),
        "initLimit": "10",
        "syncLimit": "5",
        "dataDir": str(data_dir),
        "clientPort": str(port),
        "clientPortAddress": HOST,
        "maxClientCnxns": str(max_client_cnxns),
        "minSessionTimeout": str(2 * tick_time_ms),
        "maxSessionTimeout": str(max_session_timeout_ms),
        "admin.enableServer": "false",
        "4lw.commands.whitelist": "srvr,ruok,stat,mntr",
        "preAllocSize": "4096",
        "snapCount": "10000",
        "autopurge.snapRetainCount": "3",
        "autopurge.purgeInterval": "1",
    }
    if not force_sync:
        cfg["forceSync"] = "no"
    cfg.update(extra or {})
    return "".join(f"{k}={v}\n" for k, v in cfg.items())


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """A preexec_fn making the child die with SIGKILL when this process dies (Linux only), resolved in the parent
    (nothing may be looked up between fork and exec)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:  # pragma: no cover - runs in the child
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return preexec


def _pid_alive(pid: int) -> bool:
    try:
        wpid, _ = os.waitpid(pid, os.WNOHANG)
        if wpid == pid:
            return False  # our child, now reaped
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    except (OSError, IndexError):
        pass
    return True


# --- a server owned by this process ---------------------------------------------------------------------------

_live_servers: weakref.WeakSet[ZooKeeperServer] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_live_servers):
        with contextlib.suppress(Exception):
            server.stop(timeout_s=3)


class ZooKeeperServer:
    """A standalone ZooKeeper subprocess on ``127.0.0.1``. Not thread-safe (drive it from one thread)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        *,
        tick_time_ms: int = 500,
        max_session_timeout_ms: int = 60_000,
        force_sync: bool = True,
        max_client_cnxns: int = DEFAULT_MAX_CLIENT_CNXNS,
        java: str | None = None,
        classpath: str | None = None,
        jvm_opts: Sequence[str] = DEFAULT_JVM_OPTS,
        extra_config: Mapping[str, str] | None = None,
        startup_timeout_s: float = 20.0,
        die_with_parent: bool = False,
    ) -> None:
        self._owns_dir = data_dir is None
        self._dir: Path | None = None if data_dir is None else Path(data_dir).resolve()
        self._requested_port = port
        self._port: int | None = port
        self.tick_time_ms = tick_time_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.force_sync = force_sync
        self.max_client_cnxns = max_client_cnxns
        self._java = java
        self._classpath = classpath
        self.jvm_opts = tuple(jvm_opts)
        self.extra_config = dict(extra_config or {})
        self.startup_timeout_s = startup_timeout_s
        self.die_with_parent = die_with_parent
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False

    # --- properties ---

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise ZooKeeperLaunchError("server not started yet: no port chosen")
        return self._port

    @property
    def connect_string(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def data_dir(self) -> Path:
        if self._dir is None:
            raise ZooKeeperLaunchError("server not started yet: no data dir")
        return self._dir

    @property
    def config_path(self) -> Path:
        return self.data_dir / CFG_NAME

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_NAME

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        return self._paused

    def is_ready(self) -> bool:
        return self.running and not self._paused and server_mode(HOST, self.port) == "standalone"

    # --- lifecycle ---

    def start(self) -> ZooKeeperServer:
        if self.running:
            return self
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="ledgerstore-zk-"))
        self._dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._requested_port is not None or self._port is not None else 3
        last: ZooKeeperLaunchError | None = None
        for _ in range(attempts):
            if self._port is None:
                self._port = free_port()
            try:
                self._launch()
                _live_servers.add(self)
                return self
            except ZooKeeperLaunchError as e:
                last = e
                if self._requested_port is None and "Address already in use" in str(e):
                    self._port = None  # lost a race for the port: pick another
                    continue
                break
        assert last is not None
        raise last

    def _launch(self) -> None:
        port = self.port
        if not port_is_free(port):
            raise ZooKeeperLaunchError(f"port {HOST}:{port} is already in use (another ZooKeeper?)")
        data = self.data_dir / DATA_NAME
        data.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            render_config(
                data,
                port,
                tick_time_ms=self.tick_time_ms,
                max_session_timeout_ms=self.max_session_timeout_ms,
                force_sync=self.force_sync,
                max_client_cnxns=self.max_client_cnxns,
                extra=self.extra_config,
            )
        )
        cmd = [
            self._java or find_java(),
            *self.jvm_opts,
            f"-Dzookeeper.log.dir={self.data_dir}",
            "-cp",
            self._classpath or default_classpath(),
            MAIN_CLASS,
            str(self.config_path),
        ]
        with open(self.log_path, "ab") as log:
            log.write(f"--- starting ZooKeeper on port {port}: {' '.join(cmd)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd,
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_pdeathsig_preexec() if self.die_with_parent else None,
            )
        self._paused = False
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise ZooKeeperLaunchError(
                    f"ZooKeeper exited with status {code} during startup{_startup_cause(self.log_path, data)}; "
                    f"log {self.log_path}:\n{log_tail(self.log_path)}"
                )
            if server_mode(HOST, port, timeout=0.5) == "standalone":
                return
            time.sleep(0.05)
        self._terminate(timeout_s=2)
        raise ZooKeeperLaunchError(
            f"ZooKeeper on port {port} not ready within {self.startup_timeout_s:g}s; log {self.log_path}:\n"
            f"{log_tail(self.log_path)}"
        )

    def _signal(self, sig: int) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)

    def _terminate(self, timeout_s: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if self._paused:
            self._signal(signal.SIGCONT)
            self._paused = False
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                proc.wait(timeout=10)
        self._proc = None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``. Removes the data dir if this object created it."""
        self._terminate(timeout_s)
        _live_servers.discard(self)
        if self._owns_dir and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def kill(self) -> None:
        """SIGKILL (crash); data dir kept, so :meth:`start` recovers from it."""
        if self._proc is not None:
            self._signal(signal.SIGKILL)
            self._proc.wait(timeout=10)
            self._proc = None
        self._paused = False

    def restart(self, timeout_s: float = 10.0) -> None:
        """Stop gracefully and start again on the same port with the same data."""
        self._terminate(timeout_s)
        self.start()

    def pause(self) -> None:
        """SIGSTOP the server: it neither answers nor expires sessions until :meth:`resume`."""
        if not self.running:
            raise ZooKeeperLaunchError("cannot pause: server not running")
        self._signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        if self._paused:
            self._signal(signal.SIGCONT)
            self._paused = False

    def four_letter(self, cmd: str, timeout: float = 2.0) -> str:
        return four_letter(HOST, self.port, cmd, timeout)

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ZooKeeperServer(port={self._port}, dir={self._dir}, pid={self.pid})"

    def _detach(self) -> subprocess.Popen[bytes] | None:
        """Forget the process without stopping it (daemon mode)."""
        proc, self._proc = self._proc, None
        _live_servers.discard(self)
        return proc


# --- a daemon under a state directory (the CLI) ---------------------------------------------------------------

# Popen objects of daemons started by this process, so they can be reaped (no zombies, no ResourceWarning).
_daemons: dict[int, subprocess.Popen[bytes]] = {}
_daemons_lock = threading.Lock()


@dataclass(frozen=True)
class DaemonStatus:
    running: bool
    pid: int | None
    port: int | None
    connect_string: str | None
    mode: str | None  # "standalone" when it answers srvr
    state_dir: Path


def _read_port(cfg: Path) -> int | None:
    try:
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "clientPort":
                return int(value.strip())
    except (OSError, ValueError):
        return None
    return None


def _read_pid(state_dir: Path) -> int | None:
    try:
        return int((state_dir / PID_NAME).read_text().strip())
    except (OSError, ValueError):
        return None


def _is_our_zookeeper(pid: int, cfg: Path) -> bool:
    """Guard against pid reuse: the process must be a ZooKeeper started with this state dir's config."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc: trust the pid file
    return MAIN_CLASS.encode() in argv and str(cfg).encode() in argv


def _daemon_alive(pid: int) -> bool:
    with _daemons_lock:
        proc = _daemons.get(pid)
    if proc is not None:
        if proc.poll() is None:
            return True
        with _daemons_lock:
            _daemons.pop(pid, None)
        return False
    return _pid_alive(pid)


def status(state_dir: str | os.PathLike[str]) -> DaemonStatus:
    """What runs under ``state_dir`` (a stale pid file reads as not running)."""
    sd = Path(state_dir).resolve()
    cfg = sd / CFG_NAME
    pid = _read_pid(sd)
    port = _read_port(cfg)
    running = pid is not None and _daemon_alive(pid) and _is_our_zookeeper(pid, cfg)
    mode = server_mode(HOST, port) if running and port is not None else None
    return DaemonStatus(
        running=running,
        pid=pid if running else None,
        port=port,
        connect_string=f"{HOST}:{port}" if port is not None else None,
        mode=mode,
        state_dir=sd,
    )


def start_daemon(
    state_dir: str | os.PathLike[str],
    port: int = DEFAULT_PORT,
    *,
    force_sync: bool = True,
    timeout_s: float = 20.0,
    jvm_opts: Sequence[str] = DEFAULT_JVM_OPTS,
    max_client_cnxns: int = DEFAULT_MAX_CLIENT_CNXNS,
) -> str:
    """Start a ZooKeeper that outlives this process, with its files under ``state_dir``; return once it is ready
    (idempotent: an already running one on the same port is reused). Returns the connect string."""
    sd = Path(state_dir).resolve()
    sd.mkdir(parents=True, exist_ok=True)
    st = status(sd)
    if st.running:
        if st.port == port:
            if st.mode is None:
                raise ZooKeeperLaunchError(
                    f"ZooKeeper pid {st.pid} under {sd} runs but does not answer on port {port}; "
                    f"log {sd / LOG_NAME}:\n{log_tail(sd / LOG_NAME)}"
                )
            return f"{HOST}:{port}"
        raise ZooKeeperLaunchError(
            f"a ZooKeeper from {sd} already runs on port {st.port} (pid {st.pid}); stop it first"
        )
    (sd / PID_NAME).unlink(missing_ok=True)
    server = ZooKeeperServer(
        data_dir=sd,
        port=port,
        force_sync=force_sync,
        startup_timeout_s=timeout_s,
        jvm_opts=jvm_opts,
        max_client_cnxns=max_client_cnxns,
    )
    server.start()
    proc = server._detach()
    assert proc is not None
    with _daemons_lock:
        _daemons[proc.pid] = proc
    tmp = sd / f"{PID_NAME}.tmp"
    tmp.write_text(f"{proc.pid}\n")
    os.replace(tmp, sd / PID_NAME)
    return f"{HOST}:{port}"


def stop_daemon(state_dir: str | os.PathLike[str], timeout_s: float = 10.0) -> bool:
    """Stop the daemon under ``state_dir`` (SIGTERM, SIGKILL after ``timeout_s``). True if one was running.
    The data stays; the pid file is removed."""
    sd = Path(state_dir).resolve()
    st = status(sd)
    pid_file = sd / PID_NAME
    if not st.running or st.pid is None:
        pid_file.unlink(missing_ok=True)
        return False
    pid = st.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGCONT)
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _daemon_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _daemon_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _daemon_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _daemon_alive(pid):
            raise ZooKeeperLaunchError(f"ZooKeeper pid {pid} under {sd} did not die")
    pid_file.unlink(missing_ok=True)
    return True


def cli_start(state_dir: Path, port: int) -> str:
    """``ledgerstore zk start``: start (or reuse) the daemon; returns the connect string. Prints nothing."""
    return start_daemon(state_dir, port)


def cli_stop(state_dir: Path) -> bool:
    """``ledgerstore zk stop``: True if a running ZooKeeper was stopped, False if none was running."""
    return stop_daemon(state_dir)
