"""Assembles a bookie process: cookie check, journal replay, storage, server, admin HTTP, registration.

Start-up order matters for safety:

1. verify the cookie (ZooKeeper and every data directory) — a wiped or swapped directory refuses to start,
   because a bookie that lost its data but answers NO_ENTRY during recovery can make a ledger lose acked entries;
2. replay the journal into ledger storage (every acked entry, fence and master key comes back), then checkpoint;
3. listen, and only then register as available (or read-only) in ZooKeeper.

Companions: services the command above this package hands in (AutoRecovery, BookKeeper's
``autoRecoveryDaemonEnabled``; this package never imports them) start once the bookie serves and stop first on
shutdown, each within ``COMPANION_STOP_TIMEOUT_S``; one that fails to start is logged and the bookie serves on.

Shutdown (SIGTERM/SIGINT) reverses it: unregister, stop serving, flush and close the journal, checkpoint. A garbage
collection pass stops at its next step (a stopping bookie deletes nothing more), and the admin HTTP server waits
at most ``HTTP_STOP_TIMEOUT_S`` for its requests: SIGTERM exits within seconds.

Failing loudly: a storage write that fails (in the journal's completion of an add, in a deferred commit, in a
checkpoint) or a journal write that fails other than for a full disk *fails* the bookie: it answers what it can
with INTERNAL, goes read-only and re-registers so, drops its client connections once (so no request whose
reply was lost hangs), reports ``/health`` 503 with the reason and ``bookie_failed 1``, and stays so until it
is restarted (the restart replays the journal). It never stays registered writable while its adds go unanswered.
A failure caused by a full disk (RocksDB keeps refusing every write after one, until it is reopened) is cured
by the bookie itself: once the disk has room again it stops cleanly and executes itself anew with the same
command line (same process id, so a supervisor sees no exit), which reopens storage and replays the journal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from zk.backoff import backoff
from zk.errors import MetadataConnectionError, MetadataError
from zk.ratelog import LOG_EVERY_S, RateLimitedLog

from . import auth, malloc, server_gate
from . import server as srv
from .bk_http import add_bookkeeper_routes
from .config_file import ConfigError, Effective, resolve
from .core import BookieCore, _is_enospc
from .gc import DEFAULT_GC_DELETIONS_MAX, GcPass, LedgerCollector, ZkMetadataView
from .journal import Journal, JournalMark, mark_new_journal, never_written, stored_mark
from .scrub import DEFAULT_SCRUB_INTERVAL_S, DEFAULT_SCRUB_RATE_MB, Scrubber
from .scrub import ranges as scrub_ranges
from .server import AdminAuth, BookieServer, ServerAuth, ServerLimits, admin_app, register_core_metrics
from .signals import add_stop_handlers, remove_stop_handlers
from .startcheck import StorageCheck, storage_check
from .storage import DEFAULT_CACHE_MB, MEMTABLES_MAX, BlobGarbagePolicy, RocksLedgerStorage, storage_present

log = logging.getLogger("ledgerstore.bookie")


def _gauge(read: Callable[[], dict[str, int]], key: str) -> float:
    return read()[key]


EXIT_COOKIE_MISMATCH = 3
EXIT_NO_CLUSTER = 4  # no cluster under --zk-root (the CLI's "not found")
EXIT_RESTART = (
    -1
)  # run_until_signalled's answer when the bookie should run itself anew (never an exit status)
ZK_STOP_TIMEOUT_S = 2.0
HTTP_STOP_TIMEOUT_S = 2.0  # admin requests still running at shutdown get this long
GC_STOP_TIMEOUT_S = 10.0  # a ledger deletion under way at shutdown gets this long before storage closes
REGISTER_RETRY_S = 30.0  # how long registration retries while ZooKeeper is unreachable
COMPANION_START_TIMEOUT_S = 30.0  # a companion not started by then is given up (the bookie serves on)
COMPANION_STOP_TIMEOUT_S = 5.0  # each companion's stop at shutdown gets this long
RESTARTED_FOR_ROOM_ENV = "LEDGERSTORE_BOOKIE_RESTARTED_FOR_ROOM"  # set by _exec_self for the next run


class Companion(Protocol):
    """A service run in the bookie's process beside it (see the module docstring). ``start`` gets the running
    bookie (its id, config, ``server.metrics`` registry) and returns once the service runs; ``stop`` ends it."""

    name: str

    async def start(self, bookie: Bookie) -> None: ...

    async def stop(self) -> None: ...


#: Builds the companions of a ``bookie serve`` from its resolved settings (flags, environment, --config file).
CompanionFactory = Callable[[argparse.Namespace], Sequence[Companion]]


@dataclass(frozen=True, slots=True, kw_only=True)
class BookieConfig:
    zk: str
    data_dir: Path
    zk_root: str = "/ledgerstore"
    port: int = 3181
    http_port: int = 8000
    advertised_address: str = "127.0.0.1"
    listen_address: str | None = None
    bookie_id: str | None = None
    journal_max_wait_ms: float = 1.0
    journal_segment_mb: int = 256
    journal_reuse_segments: int = 4  # old segments kept to be written over
    journal_prealloc_mb: float = 2.0  # zeros an idle journal writes ahead of its records
    journal_direct_io: bool = True  # aligned batches written with O_DIRECT where the filesystem allows it
    fsync: bool = True
    disk_usage_threshold: float = 0.95
    disk_usage_lwm: float = 0.90
    disk_check_interval_s: float = 1.0
    gc_interval_s: float = 60.0
    checkpoint_interval_s: float = 10.0
    partial_frame_timeout_s: float = srv.DEFAULT_PARTIAL_FRAME_TIMEOUT_S
    inflight_max: int = srv.DEFAULT_INFLIGHT_MAX
    frame_grace_s: float = srv.DEFAULT_FRAME_GRACE_S
    frame_rate_min_kib: int = srv.DEFAULT_FRAME_RATE_MIN // 1024
    idle_timeout_s: float = srv.DEFAULT_IDLE_TIMEOUT_S
    connections_max: int = srv.DEFAULT_CONNECTIONS_MAX
    connections_per_peer_max: int = srv.DEFAULT_CONNECTIONS_PER_PEER_MAX
    connection_write_buffer_mb: int = srv.DEFAULT_WRITE_BUFFER_MAX // 2**20
    inflight_bytes_max_mb: int = srv.DEFAULT_INFLIGHT_BYTES_MAX // 2**20
    gc_deletions_max: int = DEFAULT_GC_DELETIONS_MAX
    journal_dir_override: Path | None = None  # put the journal on its own device (BookKeeper's advice)
    init_cluster: bool = False  # create the cluster's instance id under zk_root if missing (a new cluster)
    write_buffer_mb: int = 64  # RocksDB memtable size (up to 8 of them): acked entries held before a flush
    storage_write_rate_mb: int = 0  # pace RocksDB flush/compaction writes (MiB/s; 0 = unpaced)
    storage_flush_threads: int = 1  # memtable flushes RocksDB runs at once
    storage_blob_files: str = "auto"  # entries in blob files: auto (while ledgers interleave), on, off
    storage_flush_io: str = "direct"  # RocksDB flushes and compactions: direct (O_DIRECT) or page-cache
    # the entries' block cache, filled by each flush (0: RocksDB's own)
    storage_cache_mb: int = DEFAULT_CACHE_MB
    storage_blob_gc_ratio: float = 0.5  # collect blob files' garbage once it is this share of them...
    storage_blob_gc_min_mb: int = 64  # ...and at least this many MiB
    auth_secret_file: Path | None = None  # HS256 token secret: tokens are checked (data plane and admin HTTP)
    auth_previous_secret_file: Path | None = None  # during a rotation: tokens it signed are still taken
    auth_required: bool = False  # data plane: nothing served before AUTH with a good token
    admin_read_auth: str = "none"  # admin HTTP read-only endpoints that need a token too: none, api, all
    tls_cert_file: Path | None = None  # data plane TLS: certificate chain (PEM), with tls_key_file
    tls_key_file: Path | None = None
    scrub_interval_s: float = DEFAULT_SCRUB_INTERVAL_S  # between scrub passes; 0: no scrubbing
    scrub_rate_mb: float = DEFAULT_SCRUB_RATE_MB  # MiB/s a scrub pass reads at most
    rack: str | None = None  # registered in bookies/racks at start (None: leave it as the operator set it)

    @property
    def id(self) -> str:
        return self.bookie_id or f"{self.advertised_address}:{self.port}"

    @property
    def journal_dir(self) -> Path:
        return self.journal_dir_override or self.data_dir / "journal"

    @property
    def ledger_dir(self) -> Path:
        return self.data_dir / "ledgers"


class StartRefusal(RuntimeError):
    """The bookie will not start, for the reason in the message (one line), with ``exit_status``."""

    exit_status = 1


class CookieRefusal(StartRefusal):
    """The data directories do not belong to this bookie id / cluster (see the message)."""

    exit_status = EXIT_COOKIE_MISMATCH

    def __init__(self, message: str) -> None:
        super().__init__(f"cookie mismatch: {message}")


class JournalWipedRefusal(StartRefusal):
    """The cookies match but the journal directory holds no journal at all (see the message)."""

    exit_status = EXIT_COOKIE_MISMATCH


class StorageWipedRefusal(StartRefusal):
    """The cookies match but the ledger directory holds no ledger storage while the journal was checkpointed."""

    exit_status = EXIT_COOKIE_MISMATCH


def storage_wiped(bookie_id: str, ledger_dir: Path, journal_dir: Path) -> str | None:
    """Why a bookie whose cookies match must not start on these directories, None when it may: its ledger
    directory holds no ledger storage (RocksDB's files deleted, the cookie file left) while its journal was
    checkpointed. The entries the checkpoints dropped from the journal were in that storage only, and an empty
    one would answer NO_ENTRY for them. (With the mark at the start, nothing was ever dropped: the replay puts
    every entry back.) ``bookie serve`` refuses such a start and ``bookie updatecookie`` such a move."""
    from zk import cookies

    present = storage_present(ledger_dir)
    mark = JournalMark(0, 0) if present else stored_mark(journal_dir)  # (the mark is read only when needed)
    check = storage_check(
        journal_written=True, storage_present=present, journal_checkpointed=mark != JournalMark(0, 0)
    )
    if check is not StorageCheck.STORAGE_WIPED:
        return None
    return (
        f"bookie {bookie_id}: its ledger directory {ledger_dir} holds its cookie but no ledger storage "
        f"(no RocksDB CURRENT file) while its journal was checkpointed (mark {mark}): the storage was deleted, "
        "and with it every entry acknowledged before the last checkpoint. Answering NO_ENTRY for them during "
        "recovery could lose acknowledged data for good, so it will not start. Restore the ledger directory; if "
        f"it is gone for good, wipe the data directories, run `{cookies.format_hint(bookie_id)}` and let the "
        "ledgers be re-replicated."
    )


class NoClusterRefusal(StartRefusal):
    """No cluster under the bookie's ZooKeeper root and no --init-cluster (see the message)."""

    exit_status = EXIT_NO_CLUSTER


class Bookie:
    def __init__(self, config: BookieConfig, settings: Effective | None = None) -> None:
        self.config = config
        self.settings = settings  # what `bookie serve` resolved (flags, env, --config): GET /api/v1/config
        self.store: Any = None
        self.registry: Any = None
        self.journal: Journal | None = None
        self.storage: RocksLedgerStorage | None = None
        self.core: BookieCore | None = None
        self.server: BookieServer | None = None
        self._http: server_gate.HttpService | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._registered_readonly: bool | None = None
        self._registering = 0  # registrations (:meth:`_register`) running
        self._register_tasks: set[asyncio.Task[None]] = set()
        # read-only by an operator's word (PUT /api/v1/bookie/state/readonly, `bookie readonly`) until told
        # otherwise or restarted: the disk check does not make it writable again
        self.admin_readonly = False
        self.started_at = time.monotonic()  # uptime: a wall clock stepped back (NTP, an operator) made it < 0
        self.instance_id = ""
        self.collector: LedgerCollector | None = None
        self.scrubber: Scrubber | None = None
        self.stopping = False
        self.failed = ""  # why the bookie failed (storage or journal error); empty while it has not
        self.failures = 0
        self.restart_when_space = False  # the failure came from a full disk: restart once there is room again
        self.restart_requested = False
        self.stop_requested = asyncio.Event()
        # a failed bookie's "failed again" and "checkpoint skipped" lines
        self._still_failed_log = RateLimitedLog(log, LOG_EVERY_S)
        self._open_files = server_gate.OpenFilesWatch(f"bookie={config.id}")  # (checked with the disk)

    # ------------------------------------------------------------------------------------------ start
    async def start(self) -> None:
        cfg = self.config
        cfg.journal_dir.mkdir(parents=True, exist_ok=True)
        cfg.ledger_dir.mkdir(parents=True, exist_ok=True)
        from zk import MetadataStore

        self.store = await asyncio.to_thread(MetadataStore.connect, cfg.zk, root=cfg.zk_root)
        await asyncio.to_thread(self._check_cookies)

        loop = asyncio.get_running_loop()

        def guarded(fn: Callable[[], object]) -> None:
            try:
                fn()
            except Exception as e:  # a deferred storage write failed: its replies are lost; fail loudly
                self.fail(f"storage write failed: {e!r}", disk_full=_no_space(e))

        def schedule(delay_s: float, fn: Any) -> Any:
            call = functools.partial(guarded, fn)
            return loop.call_soon(call) if delay_s <= 0 else loop.call_later(delay_s, call)

        try:
            self.storage = RocksLedgerStorage(
                cfg.ledger_dir,
                write_buffer_mb=cfg.write_buffer_mb,
                write_rate_mb=cfg.storage_write_rate_mb,
                flush_threads=cfg.storage_flush_threads,
                blob_files=cfg.storage_blob_files,
                direct_io=cfg.storage_flush_io != "page-cache",
                cache_mb=cfg.storage_cache_mb,
                blob_gc=BlobGarbagePolicy(
                    cfg.storage_blob_gc_ratio, cfg.storage_blob_gc_min_mb * 1024 * 1024
                ),
            )
        except Exception as e:
            if "lock file" not in str(e):
                raise
            raise StartRefusal(  # RocksDB's own LOCK: another process has these directories open
                f"its data directory {cfg.data_dir} is in use by another process (RocksDB's lock on "
                f"{cfg.ledger_dir / 'LOCK'} is held): is this bookie running already? Stop that one first, or "
                "give this one its own --data-dir"
            ) from None
        self.journal = Journal(
            cfg.journal_dir,
            max_wait_ms=cfg.journal_max_wait_ms,
            segment_bytes=cfg.journal_segment_mb * 1024 * 1024,
            reuse_segments=cfg.journal_reuse_segments,
            preallocate_bytes=int(cfg.journal_prealloc_mb * 1024 * 1024),
            fsync=cfg.fsync,
            direct_io=cfg.journal_direct_io,
            on_sync=self._on_sync,
        )
        self.journal.on_error = self._on_journal_error
        # keep old journal segments to write over only while the disk has room to spare
        self.journal.may_reuse = lambda: _disk_usage(self.config) < cfg.disk_usage_lwm
        self.core = BookieCore(
            self.storage,
            self.journal.append,
            schedule,
            bookie_id=cfg.id,
            disk_info=self._disk_info,
            journal_append_entries=self.journal.append_entries,
        )
        t0 = time.monotonic()
        n = 0
        for rec in self.journal.replay():
            self.core.replay(int(rec.type), rec.ledger_id, rec.entry_id, rec.data)
            n += 1
        self.core.finish_replay()
        await asyncio.to_thread(self.storage.flush)
        await self.journal.start()
        await asyncio.to_thread(self.journal.checkpoint, self.journal.mark)
        log.info(
            "bookie=%s replayed %d journal records in %.2fs; %d ledgers",
            cfg.id,
            n,
            time.monotonic() - t0,
            len(self.core.ledgers),
        )
        self.core.on_readonly_error = lambda exc: self._set_readonly(True, f"journal write failed: {exc}")
        self._update_readonly(initial=True)

        limits = ServerLimits(
            inflight_max=cfg.inflight_max,
            partial_frame_timeout_s=cfg.partial_frame_timeout_s,
            frame_grace_s=cfg.frame_grace_s,
            frame_rate_min=cfg.frame_rate_min_kib * 1024,
            idle_timeout_s=cfg.idle_timeout_s,
            connections_max=cfg.connections_max,
            connections_per_peer_max=cfg.connections_per_peer_max,
            write_buffer_max=cfg.connection_write_buffer_mb * 2**20,
            inflight_bytes_max=cfg.inflight_bytes_max_mb * 2**20,
        )
        verifier = None
        if cfg.auth_secret_file is not None:
            previous = [load_secret(cfg.auth_previous_secret_file)] if cfg.auth_previous_secret_file else []
            verifier = auth.TokenVerifier(load_secret(cfg.auth_secret_file), previous=previous)
        self.server = BookieServer(
            self.core, limits, ServerAuth(verifier=verifier, required=cfg.auth_required)
        )
        log.info(
            "bookie=%s data plane authentication %s; admin HTTP: %s",
            cfg.id,
            self.server.auth.mode.name.lower(),
            "mutating endpoints need a token" if verifier else "open",
        )
        core = self.core
        self.collector = LedgerCollector(
            metadata=ZkMetadataView(self.store),
            local=lambda: core.ledgers,
            delete=core.delete_ledgers,
            deletions_max=cfg.gc_deletions_max,
            bookie_id=cfg.id,
        )
        journal = self.journal
        register_core_metrics(self.server, lambda: journal.stats)
        self._register_storage_metrics()
        self._register_safety_metrics()
        tls = None
        if cfg.tls_cert_file or cfg.tls_key_file:
            if not (cfg.tls_cert_file and cfg.tls_key_file):
                raise ValueError("--tls-cert and --tls-key go together")
            tls = srv.server_tls_context(str(cfg.tls_cert_file), str(cfg.tls_key_file))
        await self.server.listen(cfg.listen_address or cfg.advertised_address, cfg.port, tls)
        app = admin_app(
            self.server,
            self.info,
            gc=self.gc_now,
            failure=lambda: self.failed,
            auth=AdminAuth(verifier=verifier, read=cfg.admin_read_auth),
            starting=lambda: "" if self._registered_readonly is not None else "registering in ZooKeeper",
        )
        add_bookkeeper_routes(app, self)  # BookKeeper's route names (bookie/bk_http.py)
        # handler_cancellation: a GC request whose caller went away stops; shutdown_timeout: SIGTERM does not
        # wait a minute for admin requests; connection limits: server_gate.serve_http
        self._http = await server_gate.serve_http(
            f"bookie={cfg.id} admin HTTP",
            app,
            cfg.listen_address or cfg.advertised_address,
            cfg.http_port,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=HTTP_STOP_TIMEOUT_S,
        )
        http = self._http
        self.server.metrics.counter(
            "bookie_http_connections_refused_total",
            "Admin HTTP connections closed on arrival: too many open, or from one address",
            lambda: http.refused,
        )

        from zk import BookieRegistry

        self.registry = BookieRegistry(self.store)
        await self._register()
        if cfg.rack:
            from zk import racks

            await asyncio.to_thread(racks.set_rack, self.store, cfg.id, cfg.rack)
        self._tasks = [
            asyncio.create_task(self._every(cfg.checkpoint_interval_s, self.checkpoint)),
            asyncio.create_task(self._every(cfg.disk_check_interval_s, self._disk_check)),
            asyncio.create_task(self._every(cfg.gc_interval_s, self.gc)),
        ]
        self.scrubber = self._scrubber()
        if cfg.scrub_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._every(cfg.scrub_interval_s, self.scrubber.run_pass)))
        log.info(
            "bookie=%s serving on %s:%d (admin http :%d), data in %s",
            cfg.id,
            cfg.listen_address or cfg.advertised_address,
            cfg.port,
            cfg.http_port,
            cfg.data_dir,
        )

    def _scrubber(self) -> Scrubber:
        """The scrubber (bookie/scrub.py): damaged or missing entries of closed ledgers become an
        under-replication mark naming this bookie and the entry ranges, for AutoRecovery to copy back."""
        from zk import LedgerMetadataStore
        from zk.errors import MetadataNotFoundError
        from zk.underreplication import UnderReplicationManager

        cfg, core, storage = self.config, self.core, self.storage
        assert core is not None and storage is not None
        ledgers, marks = LedgerMetadataStore(self.store), UnderReplicationManager(self.store)

        def metadata(lid: int) -> Any:
            try:
                return ledgers.read(lid).value
            except MetadataNotFoundError:
                return None

        def key(lid: int) -> bytes | None:
            info = core.ledgers.get(lid)
            return None if info is None else info.master_key

        def report(lid: int, ids: list[int]) -> None:
            marks.mark(lid, entries=[(cfg.id, a, b) for a, b in scrub_ranges(ids)])

        return Scrubber(
            bookie_id=cfg.id,
            storage=storage,
            ledgers=lambda: list(core.ledgers),
            master_key=key,
            metadata=metadata,
            report=report,
            rate_bytes_per_s=cfg.scrub_rate_mb * 2**20,
            should_stop=lambda: self.stopping,
        )

    def _refuse_ports_in_use(self) -> None:
        """A new bookie whose port or admin HTTP port another process listens on is refused before its cookie
        is written: the listener's bind failed only after it, which left a cookie in ZooKeeper (`cluster info`:
        a bookie DOWN for good) and in the directories (the start with the port corrected: cookie mismatch)."""
        cfg = self.config
        host = cfg.listen_address or cfg.advertised_address
        ports = {"--port": cfg.port, "--http-port": cfg.http_port}
        twice = server_gate.ports_given_twice(ports)
        if twice:
            raise StartRefusal(
                f"{' and '.join(twice)}; nothing written (no cookie): give each listener its own port"
            )
        busy, unbindable = server_gate.port_problems(host, ports)
        if busy:
            raise StartRefusal(
                f"{' and '.join(busy)} on {host} in use by another process; nothing written (no cookie): stop "
                "it, or give this bookie a free one"
            )
        # (an address this host does not have, a privileged port): its bind failed after the cookie, for an id
        # that could never serve, and the start with the address or port corrected was a cookie mismatch
        if unbindable:
            raise StartRefusal(
                f"cannot listen on {host}: {'; '.join(unbindable)} (check --listen-address, --advertised-address "
                "and the ports); nothing written (no cookie)"
            )

    def _check_cookies(self) -> None:
        from zk import cookies

        cfg = self.config
        try:
            iid = (
                cookies.instance_id(self.store)
                if cfg.init_cluster
                else cookies.existing_instance_id(self.store)
            )
        except cookies.NoClusterError as e:
            raise NoClusterRefusal(
                f"{e}: check --zk-root, or start the first bookie of another cluster in this ZooKeeper with "
                "--init-cluster"
            ) from None
        if iid is None:  # a new deployment (no cluster under this root, nor one it looks mistyped from)
            log.info(
                "bookie=%s no cluster under %s in ZooKeeper %s yet: creating one", cfg.id, cfg.zk_root, cfg.zk
            )
            iid = cookies.instance_id(self.store)
        self.instance_id = iid
        expected = cookies.Cookie(
            bookie_id=cfg.id,
            journal_dir=str(cfg.journal_dir.resolve()),
            ledger_dirs=(str(cfg.ledger_dir.resolve()),),
            instance_id=self.instance_id,
        )
        zk_cookie = cookies.read_zk_cookie(self.store, cfg.id)
        try:  # (a damaged local cookie is a mismatch too)
            local = [cookies.read_local_cookie(cfg.journal_dir), cookies.read_local_cookie(cfg.ledger_dir)]
            verdict = cookies.verify_cookies(zk_cookie.value if zk_cookie else None, local, expected)
        except cookies.CookieMismatchError as e:
            from zk import BookieRegistry

            with contextlib.suppress(MetadataError):
                if cfg.id in BookieRegistry(self.store).all():  # the usual cause then: a second bookie
                    # ... or this very bookie, crashed moments ago, restarted on a wiped or swapped disk: its
                    # old registration outlives it by a session, so say what the directories show as well
                    raise CookieRefusal(
                        f"bookie {cfg.id} is running already (registered in ZooKeeper: another process has this "
                        "id, or one stopped less than its ZooKeeper session ago), and the data directories are "
                        "not its: a second bookie needs its own --port or --bookie-id. If no other process has "
                        f"this id (it stopped moments ago), its directories do not match: {e}"
                    ) from None
            raise CookieRefusal(str(e)) from None
        if verdict == cookies.CookieVerdict.NEW:
            self._refuse_ports_in_use()  # before a cookie names an id that could not serve
            # its journal's mark first: a start that stops before the journal opens (the ledger storage would
            # not open, a kill) leaves a cookie and a mark, not a journal that looks deleted at the next start
            mark_new_journal(cfg.journal_dir)
            cookies.write_zk_cookie(self.store, expected)
            cookies.write_local_cookie(cfg.journal_dir, expected)
            cookies.write_local_cookie(cfg.ledger_dir, expected)
            log.info("bookie=%s new cookie written (instance %s)", cfg.id, self.instance_id)
        elif (
            storage_check(
                journal_written=not never_written(cfg.journal_dir),
                storage_present=storage_present(cfg.ledger_dir),
                journal_checkpointed=False,  # (not asked for this answer; the mark is read below, when needed)
            )
            is StorageCheck.JOURNAL_WIPED
        ):
            # its cookies match, but the journal is gone (segments and mark deleted, the cookie file left):
            # what it acknowledged since its last checkpoint is lost, and it would answer NO_LEDGER for it
            raise JournalWipedRefusal(
                f"bookie {cfg.id}: its journal directory {cfg.journal_dir} holds its cookie but no journal (no "
                "*.jnl segment, no lastmark; a new bookie writes its lastmark before its cookie): the journal was "
                "deleted, and with it every entry acknowledged since the last checkpoint. Answering NO_ENTRY for "
                "them during recovery could lose acknowledged data for good, so it will not start. Restore the "
                "journal; if it is gone for good, wipe the data directories, run "
                f"`{cookies.format_hint(cfg.id)}` and let the ledgers be re-replicated."
            )
        elif (wiped := storage_wiped(cfg.id, cfg.ledger_dir, cfg.journal_dir)) is not None:
            raise StorageWipedRefusal(wiped)

    # ------------------------------------------------------------------------------------------ running
    def info(self) -> dict[str, Any]:
        cfg = self.config
        assert self.core is not None and self.journal is not None
        free, total = self._disk_info()
        return {
            "bookie_id": cfg.id,
            "address": f"{cfg.advertised_address}:{cfg.port}",
            "http_port": cfg.http_port,
            "readonly": self.core.readonly,
            "ledgers": len(self.core.ledgers),
            "data_dir": str(cfg.data_dir),
            "disk_free_bytes": free,
            "disk_total_bytes": total,
            "instance_id": self.instance_id,
            "uptime_s": round(time.monotonic() - self.started_at, 1),
            "journal": dict(self.journal.stats),
        }

    def _register_safety_metrics(self) -> None:
        assert self.server is not None and self.collector is not None
        m = self.server.metrics
        gc = self.collector.stats
        m.gauge(
            "bookie_failed", "1 once a storage or journal error failed the bookie (restart it)", self._failed
        )
        m.counter(
            "bookie_storage_failures_total",
            "Storage and journal write errors that failed the bookie",
            self._fails,
        )
        for name, attr, help_text in (
            ("passes", "passes", "Garbage collection passes over deleted ledgers"),
            ("deleted_ledgers", "deleted", "Ledgers deleted because their own znode is gone"),
            ("delete_batches", "delete_batches", "Storage deletions of GC (one range-delete batch each)"),
            (
                "refused",
                "refused",
                "GC passes refused: the ledgers node was missing or empty while this bookie stores ledgers",
            ),
            (
                "listed_short",
                "listed_short",
                "Ledgers missing from a metadata listing whose znode exists on a direct read (kept)",
            ),
            ("in_use", "in_use", "GC candidates kept because they were written or fenced since the snapshot"),
            ("bound_hits", "bound_hits", "GC passes that stopped at --gc-deletions-max"),
            ("stopped", "stopped", "GC passes stopped because the bookie stopped or the caller went away"),
            ("errors", "errors", "GC passes stopped by a metadata error"),
        ):
            m.counter(f"bookie_gc_{name}_total", help_text, functools.partial(getattr, gc, attr))

    def _failed(self) -> float:
        return 1.0 if self.failed else 0.0

    def _fails(self) -> float:
        return float(self.failures)

    def _register_storage_metrics(self) -> None:
        assert self.server is not None and self.storage is not None
        gauges = self.storage.gauges
        for key, help_text in (
            (
                "memtables_waiting",
                f"RocksDB memtables full and waiting for a flush (at {MEMTABLES_MAX - 1} RocksDB delays writes, "
                "and a delayed write pauses the whole bookie)",
            ),
            ("writes_delayed", "1 while RocksDB delays or stops writes"),
            ("sst_bytes", "Bytes of RocksDB SST files (keys, small entries)"),
            ("blob_bytes", "Bytes of live RocksDB blob files (entries)"),
            (
                "blob_garbage_bytes",
                "Bytes of the blob files that hold deleted entries (collected once they are "
                "--storage-blob-gc-ratio of the entries' bytes stored)",
            ),
            (
                "blob_files_on",
                "1 while flushes put entries in blob files (--storage-blob-files; auto: ledgers interleave)",
            ),
            ("blob_files_switches", "Times --storage-blob-files auto switched blob files on or off"),
            (
                "cache_bytes",
                "Bytes in the entries' RocksDB block cache (--storage-cache-mb; flushes fill it)",
            ),
        ):
            self.server.metrics.gauge(
                f"bookie_storage_{key}", help_text, functools.partial(_gauge, gauges, key)
            )
        storage = self.storage
        for name, help_text, attr in (
            ("blob_gc_passes_total", "Blob garbage collection passes run", "blob_gc_passes"),
            (
                "blob_gc_reclaimed_bytes_total",
                "Bytes of storage freed by those passes",
                "blob_gc_reclaimed_bytes",
            ),
            (
                "blob_gc_no_room_total",
                "Blob garbage passes due but not run: the disk had no room for their copies",
                "blob_gc_no_room",
            ),
        ):
            self.server.metrics.counter(
                f"bookie_storage_{name}", help_text, functools.partial(getattr, storage, attr)
            )
        assert self.journal is not None
        jstats = self.journal.stats
        for key, help_text in (
            ("segments_created", "Journal segments created as new files"),
            ("segments_reused", "Journal segments written over an old segment's file (cheaper fsyncs)"),
        ):
            self.server.metrics.counter(
                f"bookie_journal_{key}_total", help_text, functools.partial(jstats.__getitem__, key)
            )

    def _on_sync(self, nbytes: int, seconds: float) -> None:
        if self.server is not None:
            self.server.fsync_latency.observe(seconds)

    def _disk_info(self) -> tuple[int, int]:
        try:
            du = shutil.disk_usage(self.config.data_dir)
        except OSError:
            return 0, 0
        return du.free, du.total

    def _update_readonly(self, initial: bool = False) -> float:
        """Read-only at the disk usage threshold, writable again below the low-water mark; the usage seen."""
        assert self.core is not None
        usage = _disk_usage(self.config)
        if not self.core.readonly and usage >= self.config.disk_usage_threshold:
            self._set_readonly(True, f"disk usage {usage:.1%} >= {self.config.disk_usage_threshold:.0%}")
        elif (
            self.core.readonly
            and usage < self.config.disk_usage_lwm
            and not self.failed
            and not self.admin_readonly
        ):
            self._set_readonly(False, f"disk usage {usage:.1%} < {self.config.disk_usage_lwm:.0%}")
        return usage

    def set_admin_readonly(self, readonly: bool) -> str:
        """An operator's read-only (True) or writable (False) again, BookKeeper's PUT
        /api/v1/bookie/state/readonly: "" when the bookie is now so, else why it stays read-only (failed, or
        its disk is over the threshold). Read-only, it answers adds READONLY and registers under
        bookies/readonly, so writers replace it and new ledgers leave it out; it still serves reads."""
        assert self.core is not None
        self.admin_readonly = readonly
        if readonly:
            self._set_readonly(True, "set read-only by an operator (until set writable again or restarted)")
            return ""
        if self.failed:
            return f"it failed ({self.failed}) and stays read-only until restarted"
        usage = _disk_usage(self.config)
        if usage >= self.config.disk_usage_threshold:
            return (
                f"its disk usage {usage:.1%} is at or over --disk-usage-threshold "
                f"{self.config.disk_usage_threshold:.0%}: it goes writable once below --disk-usage-lwm"
            )
        self._set_readonly(False, "set writable by an operator")
        return ""

    def _set_readonly(self, readonly: bool, why: str) -> None:
        assert self.core is not None
        if self.core.readonly != readonly:
            log.warning(
                "bookie=%s going %s: %s", self.config.id, "read-only" if readonly else "writable", why
            )
            if readonly and self.journal is not None:
                asyncio.get_running_loop().run_in_executor(None, self.journal.release_free_segments)
        self.core.readonly = readonly
        if self.registry is not None and self._registered_readonly != readonly:
            self._spawn_register()

    def _spawn_register(self) -> None:
        task = asyncio.get_running_loop().create_task(self._register())
        self._register_tasks.add(task)
        task.add_done_callback(self._registered_done)

    def _registered_done(self, task: asyncio.Task[None]) -> None:
        self._register_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and not self.stopping:  # (closed registry)
            log.warning(
                "bookie=%s not registered as %s: %s; tried again at the next disk check",
                self.config.id,
                "read-only" if self.core is not None and self.core.readonly else "writable",
                task.exception(),
            )

    async def _register(self) -> None:
        """Registered as read-only or writable as the bookie is, again while that changed during the write: a
        change made then (read-only and writable again within a ZooKeeper round trip) started no registration
        of its own, the one under way not yet recorded, and that one's then stood (a writable bookie listed
        under bookies/readonly, or the reverse) until the next change."""
        assert self.core is not None
        self._registering += 1
        try:
            await self._register_as_it_is()
        finally:
            self._registering -= 1

    async def _register_as_it_is(self) -> None:
        assert self.core is not None
        from zk.errors import MetadataConnectionError

        cfg = self.config
        while True:
            readonly = self.core.readonly
            info = {
                "address": f"{cfg.advertised_address}:{cfg.port}",
                "http_port": cfg.http_port,
                "readonly": readonly,
            }
            pauses = backoff(0.1, 2.0)
            give_up = time.monotonic() + REGISTER_RETRY_S
            while True:
                try:
                    await asyncio.to_thread(self.registry.register, cfg.id, info, readonly)
                    break
                except MetadataConnectionError as e:  # ZooKeeper briefly unreachable: retry, within bounds
                    delay = next(pauses)
                    if time.monotonic() + delay > give_up:
                        raise
                    log.warning("bookie=%s registering in ZooKeeper failed (%s); retrying", cfg.id, e)
                    await asyncio.sleep(delay)
            self._registered_readonly = readonly
            if self.stopping or self.core is None or self.core.readonly == readonly:
                return

    async def _disk_check(self) -> None:
        self._open_files.check()
        usage = self._update_readonly()
        assert self.core is not None
        if (
            self.registry is not None
            and self._registered_readonly is not None
            and self._registered_readonly != self.core.readonly
            and not self._registering
            and not self.stopping
        ):
            # a registration that gave up (ZooKeeper unreachable past REGISTER_RETRY_S): nothing else tries again,
            # and the registry re-registers the state last written, so a read-only bookie stayed listed writable
            self._spawn_register()
        if self.restart_when_space and not self.restart_requested and usage < self.config.disk_usage_lwm:
            log.warning(
                "bookie=%s the disk has room again (%.1f%% used): restarting to reopen storage and replay the "
                "journal",
                self.config.id,
                usage * 100,
            )
            self.restart_requested = True
            self.stop_requested.set()

    async def checkpoint(self) -> None:
        """Flush ledger storage, then let the journal forget what storage now holds."""
        assert self.core is not None and self.journal is not None and self.storage is not None
        try:
            self.core.flush_pending()
            mark = self.journal.mark
            await asyncio.to_thread(self.storage.flush)
        except Exception as e:
            return self._checkpoint_failed("storage flush", e)
        try:
            await asyncio.to_thread(self.journal.checkpoint, mark)
        except Exception as e:  # (writing the journal's mark: its directory read-only, its disk full)
            self._checkpoint_failed("journal checkpoint", e)

    def _checkpoint_failed(self, what: str, e: Exception) -> None:
        """The first time fails the bookie (one ERROR line: read-only and unhealthy; on a full disk until there is
        room, then it restarts itself; otherwise, a read-only or failing disk, until it is restarted); after that,
        one warning line a minute, not an ERROR and a traceback every checkpoint."""
        full = _no_space(e)
        if not self.failed:
            self.fail(f"{what} failed: {e!r}", disk_full=full)
        else:
            self._still_failed_log.warning(
                "bookie=%s checkpoint skipped: %s (%s); read-only meanwhile",
                self.config.id,
                "the disk is still full" if full else "the bookie failed",
                e,
            )

    # ------------------------------------------------------------------------------------------ failing
    def _on_journal_error(self, exc: BaseException, in_callback: bool) -> None:
        """The journal's report: a write or fsync failed (``in_callback`` False), or a completion callback (a
        storage write of a durable add) raised and was answered with the error (True)."""
        if not in_callback and _is_enospc(exc):
            return  # a full disk: read-only until space comes back (the disk check), not a failure
        what = "storage write after the journal failed" if in_callback else "journal write failed"
        self.fail(f"{what}: {exc!r}", disk_full=in_callback and _no_space(exc))

    def fail(self, why: str, *, disk_full: bool = False) -> None:
        """A storage or journal error: read-only, unhealthy, re-registered so, connections dropped once (see the
        module docstring). ``disk_full``: the error was a full disk, so the bookie restarts itself once the disk
        has room again (only when that was the first failure: any other error waits for an operator)."""
        self.failures += 1
        if self.failed:  # (each record in flight may report it: a line a minute)
            self._still_failed_log.warning("bookie=%s failed again: %s", self.config.id, why)
            return
        self.failed = why
        self.restart_when_space = disk_full
        until = "the disk has room again" if disk_full else "restarted"
        log.error("bookie=%s FAILED, now read-only and unhealthy until %s: %s", self.config.id, until, why)
        self._still_failed_log.said()
        if self.core is not None:
            self._set_readonly(True, why)
        if self.server is not None:
            for c in list(self.server.connections):
                c._abort()

    # ------------------------------------------------------------------------------------------ gc
    async def gc(self) -> None:
        """Delete ledgers that no longer exist in metadata, then collect blob garbage if enough has built up."""
        result = await self._collect_ledgers(lambda: False)
        if result.refused or result.stopped or self.stopping:
            return
        assert self.storage is not None
        await asyncio.to_thread(self.storage.collect_blob_garbage)

    async def _collect_ledgers(self, caller_gone: Callable[[], bool]) -> GcPass:
        assert self.collector is not None
        return await self.collector.run_pass(lambda: self.stopping or caller_gone())

    async def gc_now(self, caller_gone: Callable[[], bool] = lambda: False) -> dict[str, Any]:
        """The admin API's ``PUT /api/v1/gc``: a garbage-collection round now, with a blob garbage pass whenever
        the blob files hold any garbage, and what it did. Stops when its caller goes away or the bookie stops."""
        assert self.storage is not None
        result = await self._collect_ledgers(caller_gone)
        if result.refused:
            body = {"error": f"gc refused: {result.refused}", "ledgers": result.as_dict()}
            raise web.HTTPConflict(text=json.dumps(body), content_type="application/json")
        done = None
        if not (result.stopped or self.stopping or caller_gone()):
            done = await asyncio.to_thread(self.storage.collect_blob_garbage, force=True)
        stored, garbage = self.storage.blob_garbage()
        out: dict[str, Any] = {
            "stored_bytes": stored,
            "blob_garbage_bytes": garbage,
            "blob_gc_pass": None,
            "ledgers": result.as_dict(),
        }
        if done is not None:
            out["blob_gc_pass"] = {
                "stored_bytes_before": done.stored_bytes_before,
                "garbage_bytes_before": done.garbage_bytes_before,
                "reclaimed_bytes": done.reclaimed_bytes,
                "seconds": round(done.seconds, 3),
            }
        return out

    async def _every(self, period_s: float, fn: Any) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except (
                MetadataConnectionError
            ) as e:  # ZooKeeper away for a while: expected, the next period retries
                log.warning("bookie=%s periodic task %s skipped: %s", self.config.id, fn.__name__, e)
            except Exception:
                log.exception("bookie=%s periodic task %s failed", self.config.id, fn.__name__)

    # ------------------------------------------------------------------------------------------ stop
    async def abandon_start(self) -> None:
        """Release what a start that failed before serving opened (storage, the ZooKeeper session), quietly:
        nothing was registered or served, and the journal is left as it is, to be replayed next time."""
        if self.storage is not None:
            with contextlib.suppress(Exception):
                self.storage.close()
        if self.store is not None:
            await _bounded(self.store.close, ZK_STOP_TIMEOUT_S, "closing the ZooKeeper session")

    async def stop(self) -> None:
        cfg = self.config
        log.info("bookie=%s shutting down", cfg.id)
        self.stopping = True  # a GC pass deletes nothing more
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self.collector is not None and not await self.collector.wait_idle(GC_STOP_TIMEOUT_S):
            log.warning("bookie=%s a ledger deletion is still running after %.0fs", cfg.id, GC_STOP_TIMEOUT_S)
        if self.registry is not None:
            await _bounded(lambda: self.registry.unregister(cfg.id), ZK_STOP_TIMEOUT_S, "unregistering")
        if self.server is not None:
            await self.server.close()
        if self._http is not None:
            await self._http.cleanup()
        if self.journal is not None:
            await self.journal.flush()
            if self.core is not None:
                self.core.flush_pending()
            with contextlib.suppress(Exception):
                await self.checkpoint()
            await self.journal.close()
        if self.storage is not None:
            try:
                self.storage.close()
            except Exception as e:  # a failed bookie's storage may refuse its last flush; the journal has it
                log.error("bookie=%s closing storage failed: %r", cfg.id, e)
        if self.store is not None:
            await _bounded(self.store.close, ZK_STOP_TIMEOUT_S, "closing the ZooKeeper session")
        log.info("bookie=%s stopped", cfg.id)


def _disk_usage(cfg: BookieConfig) -> float:
    """The fuller of the ledger disk and the journal disk (the same one unless --journal-dir says not)."""
    worst = 0.0
    for d in {cfg.data_dir, cfg.journal_dir}:
        try:
            du = shutil.disk_usage(d)
        except OSError:
            continue
        if du.total:
            worst = max(worst, 1.0 - du.free / du.total)
    return worst


async def _wait_for_room(cfg: BookieConfig) -> bool:
    """Until the disks' usage is below the low-water mark (True), or a stop signal (False; bookie.signals)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    sigs = add_stop_handlers(loop, stop.set, f"bookie={cfg.id}")
    try:
        while _disk_usage(cfg) >= cfg.disk_usage_lwm:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), cfg.disk_check_interval_s)
            if stop.is_set():
                return False
        return True
    finally:
        remove_stop_handlers(loop, sigs)


def _no_room_to_start(cfg: BookieConfig) -> str:
    """Why a start that met a full disk (opening storage, replaying the journal into it) gives up: the
    directories, their free space, and what the journal still holds (nothing acknowledged is lost)."""

    def free(d: Path) -> str:
        try:
            du = shutil.disk_usage(d)
        except OSError as e:
            return f"{d} ({e.strerror})"
        return f"{d} ({du.free / 2**20:.1f} MiB free of {du.total / 2**20:.1f} MiB)"

    try:
        journal_mib = sum(f.stat().st_size for f in cfg.journal_dir.iterdir() if f.is_file()) / 2**20
    except OSError:
        journal_mib = 0.0
    dirs = free(cfg.ledger_dir)
    if cfg.journal_dir_override is not None:
        dirs += f" and journal {free(cfg.journal_dir)}"
    return (
        f"no space left on device to open its storage and replay its journal ({journal_mib:.1f} MiB) in "
        f"{dirs}: free space there (or move the data directory to a larger disk) and start it again; the "
        "journal still holds every acknowledged entry"
    )


async def _bounded(fn: Callable[[], object], timeout_s: float, what: str) -> None:
    """Run a blocking ZooKeeper call in a daemon thread for at most ``timeout_s``: a stopping bookie whose
    ZooKeeper is unreachable must not wait on the client's retries (its registration is ephemeral and goes
    with the session anyway). A daemon thread, unlike the default executor's, does not hold up exit."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def run() -> None:
        try:
            fn()
        except Exception as e:  # reported below; shutdown goes on
            log.warning("bookie shutdown: %s failed: %s", what, e)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop may be gone already
                loop.call_soon_threadsafe(_resolve, done)

    threading.Thread(target=run, name=f"stop-{what.split()[0]}", daemon=True).start()
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout_s)
    except TimeoutError:
        log.warning("bookie shutdown: gave up %s after %.0fs (ZooKeeper unreachable?)", what, timeout_s)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def config_from_args(args: argparse.Namespace) -> BookieConfig:
    return BookieConfig(
        zk=args.zk,
        zk_root=args.zk_root,
        data_dir=args.data_dir,
        port=args.port,
        http_port=args.http_port,
        advertised_address=args.advertised_address,
        listen_address=args.listen_address,
        bookie_id=args.bookie_id,
        journal_max_wait_ms=args.journal_max_wait_ms,
        journal_segment_mb=getattr(args, "journal_segment_mb", 256),
        journal_reuse_segments=getattr(args, "journal_reuse_segments", 4),
        journal_prealloc_mb=getattr(args, "journal_prealloc_mb", 2.0),
        journal_direct_io=not getattr(args, "no_journal_direct_io", False),
        fsync=not args.no_fsync,
        init_cluster=getattr(args, "init_cluster", False),
        disk_usage_threshold=args.disk_usage_threshold,
        disk_usage_lwm=args.disk_usage_lwm,
        gc_interval_s=args.gc_interval_s,
        checkpoint_interval_s=args.checkpoint_interval_s,
        partial_frame_timeout_s=args.partial_frame_timeout_s,
        inflight_max=args.inflight_max,
        journal_dir_override=Path(args.journal_dir) if getattr(args, "journal_dir", None) else None,
        write_buffer_mb=getattr(args, "write_buffer_mb", 64),
        storage_write_rate_mb=getattr(args, "storage_write_rate_mb", 0),
        storage_flush_threads=getattr(args, "storage_flush_threads", 1),
        storage_blob_files=getattr(args, "storage_blob_files", "auto"),
        storage_flush_io=getattr(args, "storage_flush_io", "direct"),
        storage_cache_mb=getattr(args, "storage_cache_mb", DEFAULT_CACHE_MB),
        storage_blob_gc_ratio=getattr(args, "storage_blob_gc_ratio", 0.5),
        storage_blob_gc_min_mb=getattr(args, "storage_blob_gc_min_mb", 64),
        frame_grace_s=getattr(args, "frame_grace_s", srv.DEFAULT_FRAME_GRACE_S),
        frame_rate_min_kib=getattr(args, "frame_rate_min_kib", srv.DEFAULT_FRAME_RATE_MIN // 1024),
        idle_timeout_s=getattr(args, "idle_timeout_s", srv.DEFAULT_IDLE_TIMEOUT_S),
        connections_max=getattr(args, "connections_max", srv.DEFAULT_CONNECTIONS_MAX),
        connections_per_peer_max=getattr(
            args, "connections_per_peer_max", srv.DEFAULT_CONNECTIONS_PER_PEER_MAX
        ),
        connection_write_buffer_mb=getattr(
            args, "connection_write_buffer_mb", srv.DEFAULT_WRITE_BUFFER_MAX // 2**20
        ),
        inflight_bytes_max_mb=getattr(args, "inflight_bytes_max_mb", srv.DEFAULT_INFLIGHT_BYTES_MAX // 2**20),
        gc_deletions_max=getattr(args, "gc_deletions_max", DEFAULT_GC_DELETIONS_MAX),
        auth_secret_file=Path(args.auth_secret_file) if getattr(args, "auth_secret_file", None) else None,
        auth_previous_secret_file=(
            Path(args.auth_previous_secret_file) if getattr(args, "auth_previous_secret_file", None) else None
        ),
        auth_required=getattr(args, "auth_required", False),
        admin_read_auth=getattr(args, "admin_read_auth", "none"),
        tls_cert_file=Path(args.tls_cert) if getattr(args, "tls_cert", None) else None,
        tls_key_file=Path(args.tls_key) if getattr(args, "tls_key", None) else None,
        scrub_interval_s=0.0
        if getattr(args, "no_scrub", False)
        else getattr(args, "scrub_interval_s", 3600.0),
        scrub_rate_mb=getattr(args, "scrub_rate_mb", DEFAULT_SCRUB_RATE_MB),
        rack=getattr(args, "rack", None),
    )


def load_secret(path: Path) -> bytes:
    """The token secret in ``path`` (raw bytes or base64 text, ``auth.decode_secret``); a file others may
    read or write is refused (anyone who reads it can sign tokens)."""
    mode = path.stat().st_mode
    if mode & 0o077:
        raise PermissionError(f"secret key file {path} is readable or writable by others: chmod 600 it")
    return auth.decode_secret(path.read_bytes())


def add_auth_arguments(serve: argparse.ArgumentParser) -> None:
    """``bookie serve``'s authentication (docs/operations.md, "Authentication")."""
    a = serve.add_argument
    a(
        "--auth-secret-file",
        default=os.environ.get("LEDGERSTORE_AUTH_SECRET_FILE"),
        help="HS256 secret key (ledgerstore auth create-secret): tokens sent are checked, and the admin HTTP "
        "API's mutating endpoints need one (default $LEDGERSTORE_AUTH_SECRET_FILE; none: authentication off)",
    )
    a(
        "--auth-required",
        action="store_true",
        default=bool(os.environ.get("LEDGERSTORE_AUTH_REQUIRED")),
        help="serve nothing on the data plane before AUTH with a good token (needs --auth-secret-file)",
    )
    a(
        "--auth-previous-secret-file",
        default=None,
        help="while the secret is rotated: the old secret, whose tokens are still taken beside the new one's "
        "(docs/operations.md, 'Rotating the secret')",
    )
    a(
        "--admin-read-auth",
        choices=srv.ADMIN_READ_AUTH,
        default="none",
        help="admin HTTP read-only endpoints that need a token too: none (default), api (/api/...), all "
        "(also /health and /metrics)",
    )
    a("--tls-cert", default=None, help="data plane TLS: the bookie's certificate chain (PEM); off by default")
    a("--tls-key", default=None, help="data plane TLS: the certificate's private key (PEM)")


def add_scrub_arguments(serve: argparse.ArgumentParser) -> None:
    """``bookie serve``'s scrubber and rack (docs/operations.md, "AutoRecovery")."""
    a = serve.add_argument
    a(
        "--scrub-interval-s",
        type=float,
        default=DEFAULT_SCRUB_INTERVAL_S,
        help="seconds between scrub passes, which read back the closed ledgers' entries, check their digests and "
        "mark what is damaged or missing for AutoRecovery to copy back; 0: no scrubbing "
        f"(default {DEFAULT_SCRUB_INTERVAL_S:.0f})",
    )
    a(
        "--scrub-rate-mb",
        type=float,
        default=DEFAULT_SCRUB_RATE_MB,
        help=f"MiB/s a scrub pass reads at most; 0: unpaced (default {DEFAULT_SCRUB_RATE_MB:g})",
    )
    a("--no-scrub", action="store_true", help="no scrubbing (as --scrub-interval-s 0)")

    def rack(value: str) -> str:
        from zk.racks import check_rack

        try:
            return check_rack(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    a(
        "--rack",
        type=rack,
        default=None,
        help="the bookie's rack (/region/rack), registered at start for rack-aware placement (default: as "
        "set by ledgerstore bookie set-rack, else /default-region/default-rack)",
    )


def add_limit_arguments(serve: argparse.ArgumentParser) -> None:
    """``bookie serve``'s protections and limits (docs/operations.md, "Protections and limits")."""
    a = serve.add_argument
    a(
        "--connections-max",
        type=int,
        default=srv.DEFAULT_CONNECTIONS_MAX,
        help=f"client connections at most; one more is closed at once (default {srv.DEFAULT_CONNECTIONS_MAX})",
    )
    a(
        "--connections-per-peer-max",
        type=int,
        default=srv.DEFAULT_CONNECTIONS_PER_PEER_MAX,
        help="client connections from one IP address at most "
        f"(default {srv.DEFAULT_CONNECTIONS_PER_PEER_MAX})",
    )
    a(
        "--idle-timeout-s",
        type=float,
        default=srv.DEFAULT_IDLE_TIMEOUT_S,
        help="close a connection that sent nothing and has nothing in flight this long; 0: never "
        f"(default {srv.DEFAULT_IDLE_TIMEOUT_S:.0f})",
    )
    a(
        "--frame-grace-s",
        type=float,
        default=srv.DEFAULT_FRAME_GRACE_S,
        help="a started frame may take this long plus one second per --frame-rate-min-kib KiB of it "
        f"(default {srv.DEFAULT_FRAME_GRACE_S:.0f})",
    )
    a(
        "--frame-rate-min-kib",
        type=int,
        default=srv.DEFAULT_FRAME_RATE_MIN // 1024,
        help="KiB/s a partial frame must average after --frame-grace-s; 0: no minimum "
        f"(default {srv.DEFAULT_FRAME_RATE_MIN // 1024})",
    )
    a(
        "--connection-write-buffer-mb",
        type=int,
        default=srv.DEFAULT_WRITE_BUFFER_MAX // 2**20,
        help="unsent reply MiB per connection before its further requests wait "
        f"(default {srv.DEFAULT_WRITE_BUFFER_MAX // 2**20})",
    )
    a(
        "--inflight-bytes-max-mb",
        type=int,
        default=srv.DEFAULT_INFLIGHT_BYTES_MAX // 2**20,
        help="MiB the whole bookie holds for peers (unsent replies, adds in flight, partial frames) before "
        f"connections holding any stop being read (default {srv.DEFAULT_INFLIGHT_BYTES_MAX // 2**20})",
    )
    a(
        "--gc-deletions-max",
        type=int,
        default=DEFAULT_GC_DELETIONS_MAX,
        help=f"ledgers one garbage collection pass deletes at most (default {DEFAULT_GC_DELETIONS_MAX})",
    )


async def run_until_signalled(
    config: BookieConfig, settings: Effective | None = None, companions: Sequence[Companion] = ()
) -> int:
    # run anew by itself once its full disk had room (``_exec_self``): a disk filled again before storage
    # reopened is waited out, not an exit (an operator's start on a full disk is refused, below)
    restarted_for_room = os.environ.pop(RESTARTED_FOR_ROOM_ENV, None) is not None
    while True:
        bookie = Bookie(config, settings)
        try:
            await bookie.start()
            break
        except StartRefusal as e:
            log.error("bookie=%s refusing to start: %s", config.id, e)
            await bookie.abandon_start()
            return e.exit_status
        except Exception as e:
            if not _no_space(e):
                raise
            await bookie.abandon_start()
            if not restarted_for_room:
                log.error("bookie=%s refusing to start: %s", config.id, _no_room_to_start(config))
                return 1
            log.warning(
                "bookie=%s the disk filled again before storage reopened (%s); starting again once it has room",
                config.id,
                _no_room_to_start(config),
            )
            if not await _wait_for_room(config):
                return 0
    loop = asyncio.get_running_loop()
    add_stop_handlers(loop, bookie.stop_requested.set, f"bookie={config.id}")
    running = await _start_companions(bookie, companions)
    await bookie.stop_requested.wait()
    for c in reversed(running):  # first: a companion may be using the bookie (its worker copying to it)
        await _stop_companion(config.id, c)
    await bookie.stop()
    return EXIT_RESTART if bookie.restart_requested else 0


async def _start_companions(bookie: Bookie, companions: Sequence[Companion]) -> list[Companion]:
    running = []
    for c in companions:
        if bookie.stop_requested.is_set():
            break
        try:
            await asyncio.wait_for(c.start(bookie), COMPANION_START_TIMEOUT_S)
        except Exception as e:  # the data path matters more: serve on without it, loudly
            log.error(
                "bookie=%s %s did not start, the bookie serves without it: %r", bookie.config.id, c.name, e
            )
            await _stop_companion(bookie.config.id, c)
            continue
        running.append(c)
    return running


async def _stop_companion(bookie_id: str, c: Companion) -> None:
    try:
        await asyncio.wait_for(c.stop(), COMPANION_STOP_TIMEOUT_S)
    except TimeoutError:
        log.warning(
            "bookie=%s %s still stopping after %.0fs: going on", bookie_id, c.name, COMPANION_STOP_TIMEOUT_S
        )
    except Exception as e:
        log.warning("bookie=%s stopping %s failed: %r", bookie_id, c.name, e)


def _no_space(exc: BaseException) -> bool:
    """A full disk, as an OSError or as RocksDB's error text (rocksdict raises a plain Exception)."""
    return _is_enospc(exc) or "No space left on device" in str(exc)


def _exec_self() -> None:
    """Replace this process with a fresh run of the same command line (same pid, same open stdout/stderr),
    told that it runs anew because its disk has room again."""
    os.environ[RESTARTED_FOR_ROOM_ENV] = "1"
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def install_uvloop() -> None:
    if os.environ.get("LEDGERSTORE_NO_UVLOOP"):
        return
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def check_disk_usage_marks(settings: Effective) -> None:
    """Refuse a --disk-usage-threshold or --disk-usage-lwm that is not a share of the disk (over 0, at most 1),
    or a low-water mark over the threshold, naming the setting and where it came from. A percentage (95) left
    the bookie writable until the disk was full; a mark over the threshold made it read-only and writable again
    at every disk check (BookKeeper refuses both)."""

    def named(name: str) -> str:
        source = settings.sources.get(name, "default")
        where = {"flag": "--" + name.replace("_", "-"), "env": "$LEDGERSTORE_" + name.upper()}.get(source)
        return where or (f"config file {settings.file}: {name}" if source == "file" else name)

    for name in ("disk_usage_threshold", "disk_usage_lwm"):
        value = settings.values[name]
        if not 0 < value <= 1:
            raise ConfigError(
                f"{named(name)} {value}: must be a share of the disk's size, over 0 and at most 1 (0.95 for 95%)"
            )
    threshold, lwm = settings.values["disk_usage_threshold"], settings.values["disk_usage_lwm"]
    if lwm > threshold:
        raise ConfigError(
            f"{named('disk_usage_lwm')} {lwm} is over {named('disk_usage_threshold')} {threshold}: the bookie "
            "would go read-only at the threshold and writable again at the next disk check, over and over"
        )


#: Descriptors a bookie needs beside its connections: the journal, RocksDB's files, ZooKeeper, logs
OTHER_FILES = 1024


def serve(args: argparse.Namespace, companions: CompanionFactory | None = None) -> int:
    """``bookie serve``: run until SIGTERM/SIGINT, with the services ``companions`` builds beside the bookie."""
    try:  # flags > LEDGERSTORE_<SETTING> > --config FILE > defaults (bookie/config_file.py)
        settings = resolve(args)
        check_disk_usage_marks(settings)
        if settings.values.get("auth_previous_secret_file") and not settings.values.get("auth_secret_file"):
            raise ConfigError("--auth-previous-secret-file needs --auth-secret-file")
        extra = list(companions(args)) if companions is not None else []
    except (ConfigError, ValueError, OSError) as e:
        log.error("bookie: %s", e)
        return 2
    install_uvloop()
    malloc.tune()
    config = config_from_args(args)
    needed = config.connections_max + server_gate.HTTP_CONNECTIONS_MAX + OTHER_FILES
    server_gate.raise_open_files_limit(needed, f"bookie={config.id}")
    profile = os.environ.get("LEDGERSTORE_PROFILE")
    if not profile:
        rc = asyncio.run(run_until_signalled(config, settings, extra))
    else:
        import cProfile

        prof = cProfile.Profile()
        try:
            rc = prof.runcall(asyncio.run, run_until_signalled(config, settings, extra))
        finally:
            prof.dump_stats(profile)
    if rc == EXIT_RESTART:
        _exec_self()
    return rc
