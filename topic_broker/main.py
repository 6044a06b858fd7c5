"""``ledgerstore broker serve``: run a topic broker (Pulsar protocol) until SIGTERM/SIGINT/SIGHUP."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bookie.bk_http import add_config_routes
from bookie.config_file import ConfigError, Effective
from bookie.config_file import enable as enable_config_file
from bookie.config_file import resolve as resolve_config
from bookie.server import server_tls_context
from bookie.server_gate import (
    HTTP_CONNECTIONS_MAX,
    port_problems,
    ports_given_twice,
    raise_open_files_limit,
)
from bookie.signals import add_stop_handlers
from ledger_client import ENTRY_PAYLOAD_MAX
from zk.cookies import NoClusterError
from zk.errors import MetadataExistsError

from .admin import AdminServer
from .server import CONNECTIONS_MAX, BrokerServer
from .service import (
    DEFAULT_ACK_QUORUM,
    DEFAULT_COMPACTION_MONITOR_INTERVAL_S,
    DEFAULT_COMPACTION_THRESHOLD_BYTES,
    DEFAULT_ENSEMBLE_CHANGE_TIMEOUT_S,
    DEFAULT_ENSEMBLE_SIZE,
    DEFAULT_HTTP_PORT,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MAX_PARTITIONS_PER_TOPIC,
    DEFAULT_MESSAGE_EXPIRY_CHECK_INTERVAL_S,
    DEFAULT_PORT,
    DEFAULT_SUBSCRIPTION_EXPIRY_CHECK_INTERVAL_S,
    DEFAULT_TICK_INTERVAL_S,
    DEFAULT_TTL_DURATION_S,
    DEFAULT_WRITE_QUORUM,
    BrokerConfig,
    BrokerService,
)
from .tls import broker_tls_context

__all__ = ["add_serve_arguments", "config_from_args", "main", "serve"]

log = logging.getLogger(__name__)
#: Descriptors the broker needs beside its client connections: bookies, ZooKeeper, logs
OTHER_FILES = 1024

#: Where the admin API shows every setting as a string (Pulsar's names), beside ``/api/v1/config``.
CONFIG_VALUES_PATHS = ("/admin/v2/brokers/configuration/values", "/admin/v2/brokers/configuration/runtime")

#: Allocations between young-generation collections (CPython's default is 700).
GC_THRESHOLD_GEN0 = 50_000


#: An event-loop iteration or a garbage collection longer than this is logged (a stall of delivery).
STALL_LOG_S = 0.1
_gc_started = [0.0]


def _gc_watch(phase: str, info: dict[str, int]) -> None:
    """``gc.callbacks``: log a collection that held the interpreter for longer than ``STALL_LOG_S``."""
    if phase == "start":
        _gc_started[0] = time.perf_counter()
        return
    took = time.perf_counter() - _gc_started[0]
    if took > STALL_LOG_S:
        log.warning(
            "stall: gc of generation %d took %.0f ms (%d collected)",
            info.get("generation", -1),
            took * 1000,
            info.get("collected", 0),
        )


async def _loop_watch(interval_s: float = 0.05) -> None:
    """Log when the event loop wakes this task up more than ``STALL_LOG_S`` late: something held the loop
    (a long callback, a collection) or the process got no CPU, and no frame went out meanwhile."""
    clock = time.monotonic
    while True:
        t = clock()
        await asyncio.sleep(interval_s)
        late = clock() - t - interval_s
        if late > STALL_LOG_S:
            log.warning("stall: the event loop was %.0f ms late", late * 1000)


def _ports(config: BrokerConfig) -> dict[str, int]:
    ports = {"--port": config.port, "--http-port": config.http_port}
    if config.tls_port is not None:
        ports["--tls-port"] = config.tls_port
    if config.admin_tls_port is not None:
        ports["--admin-tls-port"] = config.admin_tls_port
    return ports


async def serve(
    config: BrokerConfig, stop: asyncio.Event | None = None, settings: Effective | None = None
) -> int:
    """Serve until ``stop`` is set (or SIGTERM/SIGINT/SIGHUP when none is given); ``settings``: what ``broker serve``
    resolved from flags, environment and ``--config``, shown (redacted) by the admin API."""
    # before it registers: a broker of the same id (its port) would lose its registration to this one
    ports = _ports(config)
    twice = ports_given_twice(ports)
    if twice:  # (each alone is free: the second listener's bind failed after the registration)
        log.error(
            "broker=%s refusing to start: %s; nothing registered: give each listener its own port",
            config.id,
            " and ".join(twice),
        )
        return 1
    busy, unbindable = port_problems(config.listen_address, ports)
    if busy:
        log.error(
            "broker=%s refusing to start: %s on %s in use by another process (a broker with this id?); nothing "
            "registered: stop it, or give this broker free ones",
            config.id,
            " and ".join(busy),
            config.listen_address,
        )
        return 1
    if unbindable:  # (an address this host does not have, a privileged port): as for a port in use
        log.error(
            "broker=%s refusing to start: cannot listen on %s: %s (check --listen-address and the ports); nothing "
            "registered",
            config.id,
            config.listen_address,
            "; ".join(unbindable),
        )
        return 1
    service = BrokerService(config)
    try:
        await service.start()
    except NoClusterError as e:
        from bookie.main import EXIT_NO_CLUSTER

        log.error("broker=%s refusing to start: %s: check --zk-root", config.id, e)
        await service.stop()
        return EXIT_NO_CLUSTER
    except MetadataExistsError as e:  # its id registered by another live broker
        log.error("broker=%s refusing to start: %s", config.id, e)
        await service.stop()
        return 1
    except BaseException as e:
        # anything else, after its registration too (the bookies' watch failing on ZooKeeper): left, brokers/<id>
        # stayed until the session timed out, which a restart under this id then waited out
        log.error("broker=%s failed to start: %r; unregistering and stopping", config.id, e)
        with contextlib.suppress(Exception):
            await service.stop()
        raise
    server = BrokerServer(service)
    admin = AdminServer(service)  # /admin/v2, /lookup/v2, /metrics, /health on the HTTP port
    try:
        await server.start()
        if settings is not None:
            add_config_routes(admin.app, lambda: settings, flat=CONFIG_VALUES_PATHS)
        await admin.start()
    except BaseException as e:
        # registered already: left, brokers/<id> would stay until the session timed out, and a restart under
        # this id would wait that out (a live registration of another session is refused)
        log.error("broker=%s failed to start: %r; unregistering and stopping", config.id, e)
        with contextlib.suppress(Exception):
            await admin.stop()
        with contextlib.suppress(Exception):
            await server.stop()
        await service.stop()
        raise
    # The hot path allocates many short-lived objects (frames, receipts, callbacks); collect young ones less
    # often, and leave what exists after start-up (modules, the service) out of every collection.
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD_GEN0, 20, 20)
    gc.callbacks.append(_gc_watch)
    watch = asyncio.get_running_loop().create_task(_loop_watch())
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError):
            add_stop_handlers(loop, stop.set, f"broker={config.id}")
    stopped = asyncio.ensure_future(stop.wait())
    failed = asyncio.ensure_future(service.registration_failed.wait())
    await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    failed.cancel()
    # said in the log, as a bookie does: a clean stop (cursors flushed, ledgers closed) from a crash
    log.info("broker=%s shutting down", config.id)
    t0 = time.monotonic()
    watch.cancel()
    gc.callbacks.remove(_gc_watch)
    await admin.stop()
    await server.stop()
    await service.stop()
    log.info("broker=%s stopped in %.1f s", config.id, time.monotonic() - t0)
    if service.registration_failed.is_set():
        log.error("broker=%s exiting: it could not keep its registration (see above)", config.id)
        return 1
    return 0


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zk", default="127.0.0.1:2181")
    p.add_argument("--zk-root", default="/ledgerstore")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT)
    p.add_argument("--listen-address", default="0.0.0.0")
    p.add_argument("--advertised-address", default="127.0.0.1")
    p.add_argument("--broker-id", default=None, help="defaults to <advertised address>:<port>")
    p.add_argument("--max-message-size", type=int, default=DEFAULT_MAX_MESSAGE_SIZE)
    p.add_argument("--ensemble-size", type=int, default=DEFAULT_ENSEMBLE_SIZE)
    p.add_argument("--write-quorum", type=int, default=DEFAULT_WRITE_QUORUM)
    p.add_argument("--ack-quorum", type=int, default=DEFAULT_ACK_QUORUM)
    p.add_argument(
        "--managed-ledger-password",
        default="",
        help="the password of the ledgers the broker creates (visible in `ps`: prefer "
        "--managed-ledger-password-file or $LEDGERSTORE_MANAGED_LEDGER_PASSWORD)",
    )
    p.add_argument(
        "--managed-ledger-password-file",
        default=None,
        help="a file whose first line is the password of the ledgers the broker creates",
    )
    p.add_argument("--max-entries-per-ledger", type=int, default=50_000)
    p.add_argument("--min-rollover-time-s", type=float, default=600.0)
    p.add_argument("--max-rollover-time-s", type=float, default=4 * 3600.0)
    p.add_argument("--no-dedup", action="store_true", help="deduplicate only where the namespace policy asks")
    p.add_argument("--zk-session-timeout-s", type=float, default=10.0)
    p.add_argument(
        "--ensemble-change-timeout-s",
        type=float,
        default=DEFAULT_ENSEMBLE_CHANGE_TIMEOUT_S,
        help="how long to look for a bookie to replace a failed one of a topic's ledger before the topic rolls "
        "over to a new ledger (with no spare bookie, one back from a restart serves the new ledger)",
    )
    p.add_argument(
        "--tick-interval-s",
        type=float,
        default=DEFAULT_TICK_INTERVAL_S,
        help="how often topics roll idle ledgers, flush cursors, apply namespace policies and trim",
    )
    p.add_argument(
        "--compaction-threshold-bytes",
        type=int,
        default=DEFAULT_COMPACTION_THRESHOLD_BYTES,
        help="compact a topic by itself once its backlog exceeds this many bytes, where neither the topic nor "
        "its namespace sets a compaction threshold (0: only when asked)",
    )
    p.add_argument(
        "--compaction-monitor-interval-s",
        type=float,
        default=DEFAULT_COMPACTION_MONITOR_INTERVAL_S,
        help="how often the broker compares the backlog of each topic it serves with its compaction threshold",
    )
    p.add_argument(
        "--message-expiry-check-interval-s",
        type=float,
        default=DEFAULT_MESSAGE_EXPIRY_CHECK_INTERVAL_S,
        help="how often the broker applies the message TTL of its topics (Pulsar's "
        "messageExpiryCheckIntervalInMinutes: 5 min)",
    )
    p.add_argument(
        "--subscription-expiry-check-interval-s",
        type=float,
        default=DEFAULT_SUBSCRIPTION_EXPIRY_CHECK_INTERVAL_S,
        help="how often the broker deletes the subscriptions of its topics idle longer than their namespace's "
        "subscriptionExpirationTime (Pulsar's subscriptionExpiryCheckIntervalInMinutes: 5 min)",
    )
    p.add_argument(
        "--ttl-duration-default-s",
        type=int,
        default=DEFAULT_TTL_DURATION_S,
        help="the message TTL in seconds of a topic where neither the topic nor its namespace sets one (Pulsar's "
        "ttlDurationDefaultInSeconds; 0: none)",
    )
    p.add_argument(
        "--force-delete-namespace-allowed",
        action="store_true",
        help="let DELETE …/namespaces/{t}/{ns}?force=true (pulsar-admin namespaces delete -f) delete the namespace's "
        "topics and their data (Pulsar's forceDeleteNamespaceAllowed; off: 405)",
    )
    p.add_argument(
        "--force-delete-tenant-allowed",
        action="store_true",
        help="let DELETE …/tenants/{t}?force=true (pulsar-admin tenants delete -f) delete the tenant's namespaces and "
        "their topics (Pulsar's forceDeleteTenantAllowed; off: 405; each namespace's forced delete needs "
        "--force-delete-namespace-allowed too)",
    )
    p.add_argument(
        "--max-partitions-per-topic",
        type=int,
        default=DEFAULT_MAX_PARTITIONS_PER_TOPIC,
        help="the most partitions a partitioned topic may be created or grown to through this broker (Pulsar's "
        "maxNumPartitionsPerPartitionedTopic; each partition is a managed ledger created at once; 0: no limit)",
    )
    a = p.add_argument
    a(
        "--auth-previous-secret-file",
        default=None,
        help="while the secret is rotated: the old secret, whose tokens are still taken beside the new one's "
        "(docs/operations.md, 'Rotating the secret')",
    )
    a(
        "--auth-secret-file",
        default=None,
        help="HS256 secret key (ledgerstore auth create-secret, as the bookies'): Pulsar clients' tokens "
        "(AuthenticationToken) are checked, and the admin HTTP API's mutating endpoints need one "
        "(none: authentication off)",
    )
    a(
        "--auth-required",
        action="store_true",
        help="refuse connections without a good token, and authorize produce/consume by the token's subject "
        "(namespace permissions; needs --auth-secret-file)",
    )
    a(
        "--superuser-roles",
        default="",
        help="comma-separated token subjects allowed everything (produce, consume, every admin call)",
    )
    a(
        "--admin-read-auth",
        action="store_true",
        help="the admin HTTP API's read-only endpoints need a token too (/health and /metrics stay open)",
    )
    a(
        "--bookie-auth-token-file",
        default=None,
        help="the token the broker's ledgers are written with, for bookies that require one "
        "(default: $LEDGERSTORE_AUTH_TOKEN, else the file $LEDGERSTORE_AUTH_TOKEN_FILE names)",
    )
    a(
        "--tls-port",
        type=int,
        default=None,
        help="serve the Pulsar protocol over TLS on this port too, for pulsar+ssl:// clients (Pulsar's "
        "brokerServicePortTls; needs --tls-cert and --tls-key); the plaintext --port stays",
    )
    a(
        "--tls-cert",
        default=None,
        help="the TLS port's certificate chain (PEM; Pulsar's tlsCertificateFilePath)",
    )
    a(
        "--tls-key",
        default=None,
        help="the TLS port's private key (PEM, unencrypted; Pulsar's tlsKeyFilePath)",
    )
    a(
        "--tls-trust-certs",
        default=None,
        help="CA certificates (PEM) the TLS port verifies client certificates against: clients are asked for one, "
        "and a client connecting with auth method tls (AuthenticationTLS) gets its certificate's CN as its role "
        "(Pulsar's tlsTrustCertsFilePath; needs --tls-port; tokens keep working beside it)",
    )
    a(
        "--tls-require-trusted-client-cert",
        action="store_true",
        help="the TLS handshake fails without a client certificate the --tls-trust-certs CA signed (Pulsar's "
        "tlsRequireTrustedClientCertOnConnect)",
    )
    a(
        "--tls-cert-refresh-check-s",
        type=float,
        default=300.0,
        help="how often the housekeeping reads --tls-cert, --tls-key and --tls-trust-certs again: changed files "
        "serve the connections accepted from then on, ones that do not load are logged and the certificate in use "
        "kept (Pulsar's tlsCertRefreshCheckDurationSec; 0: at every housekeeping pass, each second)",
    )
    a(
        "--admin-tls-port",
        type=int,
        default=None,
        help="serve the admin HTTP API over https on this port too, with the --tls-cert certificate (Pulsar's "
        "webServicePortTls; needs --tls-port); the plain --http-port stays",
    )
    enable_config_file(p, what="broker")  # --config FILE, LEDGERSTORE_<SETTING>; after the last flag


def _managed_ledger_password(args: argparse.Namespace) -> bytes:
    """--managed-ledger-password-file's first line, else --managed-ledger-password (or its environment
    variable, through the config layer)."""
    path = getattr(args, "managed_ledger_password_file", None)
    if path:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as e:
            raise ConfigError(f"--managed-ledger-password-file: {e}") from e
        if not lines or not lines[0]:
            raise ConfigError(f"--managed-ledger-password-file: {path} has no password on its first line")
        return lines[0].encode()
    return str(args.managed_ledger_password or "").encode()


@dataclass(frozen=True)
class _Tls:
    port: int | None = None
    cert: str | None = None
    key: str | None = None
    trust: str | None = None
    require: bool = False
    refresh_check_s: float = 300.0
    admin_port: int | None = None


def _tls_settings(args: argparse.Namespace) -> _Tls:
    """The TLS flags, checked: --tls-port, --tls-cert and --tls-key go together, the ports are ports of their
    own, the certificate, key and trusted client CA load (a broker that would fail every TLS handshake does not
    start), the client certificate flags and the admin's TLS port need the TLS port."""
    port = getattr(args, "tls_port", None)
    cert = getattr(args, "tls_cert", None) or None
    key = getattr(args, "tls_key", None) or None
    trust = getattr(args, "tls_trust_certs", None) or None
    require = bool(getattr(args, "tls_require_trusted_client_cert", False))
    refresh = float(getattr(args, "tls_cert_refresh_check_s", 300.0))
    admin_port = getattr(args, "admin_tls_port", None)
    if not refresh >= 0:
        raise ConfigError(
            f"--tls-cert-refresh-check-s {refresh}: must be 0 (every housekeeping pass) or more"
        )
    if require and not trust:
        raise ConfigError("--tls-require-trusted-client-cert needs --tls-trust-certs (the CA client certificates "
                          "are verified against)")  # fmt: skip
    if port is None:
        given = [f for f, v in (("--tls-cert", cert), ("--tls-key", key), ("--tls-trust-certs", trust)) if v]
        given += ["--admin-tls-port"] if admin_port is not None else []
        if given:
            verb = "need" if len(given) > 1 else "needs"
            raise ConfigError(f"{' and '.join(given)} {verb} --tls-port (the port that serves pulsar+ssl://)")
        return _Tls()
    port = int(port)
    if not (cert and key):
        raise ConfigError(
            f"--tls-port {port} needs --tls-cert and --tls-key (the certificate chain and its key)"
        )
    if not 0 < port < 65536 or port == args.port:
        raise ConfigError(f"--tls-port {port}: must be 1..65535 and not the plaintext --port")
    if admin_port is not None and (
        not 0 < int(admin_port) < 65536 or int(admin_port) in (args.port, port, args.http_port)
    ):
        raise ConfigError(
            f"--admin-tls-port {admin_port}: must be 1..65535 and none of --port, --tls-port, --http-port"
        )
    try:
        server_tls_context(cert, key)
    except (OSError, ssl.SSLError) as e:  # a missing file, not PEM, a key of another certificate
        raise ConfigError(f"--tls-cert {cert} / --tls-key {key} do not load: {e}") from e
    if trust:
        try:
            broker_tls_context(cert, key, trust, require)
        except (OSError, ssl.SSLError) as e:  # a missing file, no certificate in it
            raise ConfigError(f"--tls-trust-certs {trust} does not load: {e}") from e
    return _Tls(port, cert, key, trust, require, refresh, None if admin_port is None else int(admin_port))


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    from bookie.main import load_secret

    secret_file = getattr(args, "auth_secret_file", None)
    previous_file = getattr(args, "auth_previous_secret_file", None)
    auth_required = bool(getattr(args, "auth_required", False))
    if auth_required and not secret_file:
        raise ConfigError("--auth-required needs --auth-secret-file")
    if previous_file and not secret_file:
        raise ConfigError("--auth-previous-secret-file needs --auth-secret-file")
    token_file = getattr(args, "bookie_auth_token_file", None)
    bookie_token: str | None = None
    if token_file:
        bookie_token = Path(token_file).read_text().strip()
        if not bookie_token:
            raise ConfigError(f"token file {token_file} is empty")
    max_message_size = int(getattr(args, "max_message_size", DEFAULT_MAX_MESSAGE_SIZE))
    if not 0 < max_message_size <= DEFAULT_MAX_MESSAGE_SIZE:
        # one message (or chunk) is one ledger entry: a larger one could never be stored
        raise ConfigError(
            f"--max-message-size {max_message_size}: must be 1..{DEFAULT_MAX_MESSAGE_SIZE} (a ledger entry is at "
            f"most {ENTRY_PAYLOAD_MAX} bytes, and a stored message needs room for its headers)"
        )
    threshold = int(getattr(args, "compaction_threshold_bytes", DEFAULT_COMPACTION_THRESHOLD_BYTES))
    if threshold < 0:
        raise ConfigError(f"--compaction-threshold-bytes {threshold}: must be 0 (off) or more")
    interval = float(getattr(args, "compaction_monitor_interval_s", DEFAULT_COMPACTION_MONITOR_INTERVAL_S))
    if not interval > 0:
        raise ConfigError(f"--compaction-monitor-interval-s {interval}: must be more than 0")
    expiry = float(getattr(args, "message_expiry_check_interval_s", DEFAULT_MESSAGE_EXPIRY_CHECK_INTERVAL_S))
    if not expiry > 0:
        raise ConfigError(f"--message-expiry-check-interval-s {expiry}: must be more than 0")
    sub_expiry = float(
        getattr(args, "subscription_expiry_check_interval_s", DEFAULT_SUBSCRIPTION_EXPIRY_CHECK_INTERVAL_S)
    )
    if not sub_expiry > 0:
        raise ConfigError(f"--subscription-expiry-check-interval-s {sub_expiry}: must be more than 0")
    ttl_default = int(getattr(args, "ttl_duration_default_s", DEFAULT_TTL_DURATION_S))
    if not 0 <= ttl_default <= 2**31 - 1:  # Pulsar's Integer
        raise ConfigError(f"--ttl-duration-default-s {ttl_default}: must be 0 (none) to {2**31 - 1} seconds")
    max_partitions = int(getattr(args, "max_partitions_per_topic", DEFAULT_MAX_PARTITIONS_PER_TOPIC))
    if not 0 <= max_partitions <= 2**31 - 1:  # Pulsar's int, as a partition count
        raise ConfigError(f"--max-partitions-per-topic {max_partitions}: must be 0 (no limit) to {2**31 - 1}")
    tls = _tls_settings(args)
    superusers = tuple(
        r.strip() for r in (getattr(args, "superuser_roles", "") or "").split(",") if r.strip()
    )
    return BrokerConfig(
        auth_secret=load_secret(Path(secret_file)) if secret_file else None,
        auth_previous_secret=load_secret(Path(previous_file)) if previous_file else None,
        auth_required=auth_required,
        superuser_roles=superusers,
        admin_read_auth=bool(getattr(args, "admin_read_auth", False)),
        bookie_auth_token=bookie_token,
        zk=args.zk,
        zk_root=args.zk_root,
        port=args.port,
        http_port=args.http_port,
        listen_address=args.listen_address,
        advertised_address=args.advertised_address,
        broker_id=args.broker_id,
        max_message_size=max_message_size,
        ensemble_size=args.ensemble_size,
        write_quorum=args.write_quorum,
        ack_quorum=args.ack_quorum,
        managed_ledger_password=_managed_ledger_password(args),
        max_entries_per_ledger=args.max_entries_per_ledger,
        min_rollover_time_s=args.min_rollover_time_s,
        max_rollover_time_s=args.max_rollover_time_s,
        dedup_enabled=not args.no_dedup,
        zk_session_timeout_s=args.zk_session_timeout_s,
        ensemble_change_timeout_s=args.ensemble_change_timeout_s,
        tick_interval_s=args.tick_interval_s,
        compaction_threshold_bytes=threshold,
        compaction_monitor_interval_s=interval,
        message_expiry_check_interval_s=expiry,
        subscription_expiry_check_interval_s=sub_expiry,
        ttl_duration_default_s=ttl_default,
        max_partitions_per_topic=max_partitions,
        force_delete_namespace_allowed=bool(getattr(args, "force_delete_namespace_allowed", False)),
        force_delete_tenant_allowed=bool(getattr(args, "force_delete_tenant_allowed", False)),
        tls_port=tls.port,
        tls_cert_file=tls.cert,
        tls_key_file=tls.key,
        tls_trust_certs_file=tls.trust,
        tls_require_trusted_client_cert=tls.require,
        tls_cert_refresh_check_s=tls.refresh_check_s,
        admin_tls_port=tls.admin_port,
    )


def run(args: argparse.Namespace) -> int:
    from bookie.main import install_uvloop

    try:  # flags > LEDGERSTORE_<SETTING> > --config FILE > defaults (bookie/config_file.py)
        settings = resolve_config(args)
    except ConfigError as e:
        log.error("broker: %s", e)
        return 2
    try:
        config = config_from_args(args)
    except (ConfigError, OSError, ValueError) as e:
        log.error("broker: %s", e)
        return 2
    install_uvloop()
    needed = CONNECTIONS_MAX + HTTP_CONNECTIONS_MAX + OTHER_FILES
    raise_open_files_limit(needed, f"broker={config.id}")
    profile = os.environ.get("LEDGERSTORE_BROKER_PROFILE")
    if not profile:
        return asyncio.run(serve(config, settings=settings))
    import cProfile  # a cProfile of the whole run, written at exit (the bookie's is LEDGERSTORE_PROFILE)

    prof = cProfile.Profile()
    try:
        return prof.runcall(asyncio.run, serve(config, settings=settings))
    finally:
        prof.dump_stats(profile)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ledgerstore broker serve")
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
