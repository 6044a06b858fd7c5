"""The ``ledgerstore`` command: one console script, subcommands per component (docs/architecture.md §3).

Every command takes ``--zk`` (default ``$LEDGERSTORE_ZK`` or ``127.0.0.1:2181``) and ``--json``, prints human
output by default, and exits non-zero with a one-line reason on error (``CommandError`` or any error of ours).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_ZK = "127.0.0.1:2181"
DEFAULT_STATE_DIR = ".ledgerstore"


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit status ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def emit(args: argparse.Namespace, human: str | Callable[[], str], data: Any) -> None:
    """Print ``data`` as JSON with --json, else the human text."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print(human() if callable(human) else human)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zk", default=os.environ.get("LEDGERSTORE_ZK", DEFAULT_ZK), help="ZooKeeper HOST:PORT")
    p.add_argument(
        "--zk-root", default=os.environ.get("LEDGERSTORE_ZK_ROOT", "/ledgerstore"), help="metadata root"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument(
        "--auth-token-file",
        default=None,
        help="token sent to bookies (ledgerstore auth create-token; default $LEDGERSTORE_AUTH_TOKEN[_FILE])",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ledgerstore", description="A replicated, durable log store.")
    sub = parser.add_subparsers(dest="command", required=True)

    # zk ------------------------------------------------------------------------------------------
    zkp = sub.add_parser("zk", help="a local ZooKeeper for development")
    zks = zkp.add_subparsers(dest="action", required=True)
    for name in ("start", "stop", "status"):
        a = zks.add_parser(name)
        _common(a)
        a.add_argument("--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR))
        a.add_argument("--port", type=int, default=2181)
    sec = zks.add_parser("secure", help="put the digest ACL on every znode under the root (migration)")
    _common(sec)
    sec.add_argument("--auth", default=None, help="user:password (default: LEDGERSTORE_ZK_AUTH[_FILE])")
    sec.add_argument("--dry-run", action="store_true", help="count the znodes to change, change nothing")
    zkp.set_defaults(func=_cmd_zk)

    # bookie --------------------------------------------------------------------------------------
    bp = sub.add_parser("bookie", help="run or administer a bookie")
    bs = bp.add_subparsers(dest="action", required=True)
    serve = bs.add_parser("serve", help="run a bookie server in the foreground")
    _common(serve)
    serve.add_argument("--data-dir", type=Path, required=True)
    serve.add_argument("--port", type=int, default=3181)
    serve.add_argument("--http-port", type=int, default=8000)
    serve.add_argument("--bookie-id", default=None, help="defaults to <advertised host>:<port>")
    serve.add_argument("--advertised-address", default="127.0.0.1")
    serve.add_argument(
        "--listen-address", default=None, help="bind address (default: the advertised address)"
    )
    serve.add_argument("--journal-max-wait-ms", type=float, default=1.0)
    serve.add_argument(
        "--journal-segment-mb", type=int, default=256, help="journal segment size in MiB (a new one after it)"
    )
    serve.add_argument(
        "--journal-reuse-segments",
        type=int,
        default=4,
        help="old journal segments kept to be written over (writing over a file's blocks is much cheaper "
        "than growing a file; 0: delete them)",
    )
    serve.add_argument(
        "--write-buffer-mb",
        type=int,
        default=64,
        help="RocksDB memtable size in MiB (up to 8 in memory): bigger means rarer flushes competing with "
        "the journal for the disk",
    )
    serve.add_argument(
        "--storage-write-rate-mb",
        type=int,
        default=0,
        help="also pace RocksDB flushes and compactions to this many MiB/s (0: off, the default; when the "
        "limiter falls behind, RocksDB stalls writes and the bookie with them)",
    )
    serve.add_argument(
        "--storage-flush-threads",
        type=int,
        default=1,
        help="RocksDB memtable flushes run at once (2 helps when the journal has its own disk; on one disk "
        "shared with the journal it made the tail longer)",
    )
    serve.add_argument(
        "--storage-blob-files",
        choices=("on", "auto", "off"),
        default="auto",
        help="keep entries in RocksDB blob files: auto (the default: only while more than one ledger is being "
        "written, so compacting interleaved ledgers rewrites references, not entries; a lone ledger stays in "
        "its SSTs, which saves the blob files' CRC), on (always: deleting a ledger reads nothing back), or off",
    )
    serve.add_argument(
        "--storage-blob-gc-ratio",
        type=float,
        default=0.5,
        help="collect the garbage in blob files (deleted ledgers' entries) once it is this share of them: a pass "
        "copies the live entries out, at most (1 - ratio) / ratio bytes per byte freed (default 0.5)",
    )
    serve.add_argument(
        "--storage-blob-gc-min-mb",
        type=int,
        default=64,
        help="... and once it is at least this many MiB (default 64)",
    )
    serve.add_argument(
        "--journal-dir",
        default=None,
        help="journal directory (default: DATA_DIR/journal); on its own disk, journal fsyncs do not queue "
        "behind ledger storage flushes",
    )
    serve.add_argument("--disk-usage-threshold", type=float, default=0.95)
    serve.add_argument("--disk-usage-lwm", type=float, default=0.90)
    serve.add_argument("--gc-interval-s", type=float, default=60.0)
    serve.add_argument("--checkpoint-interval-s", type=float, default=10.0)
    serve.add_argument("--partial-frame-timeout-s", type=float, default=30.0)
    serve.add_argument("--inflight-max", type=int, default=10_000, help="requests in flight per connection")
    from bookie.main import add_limit_arguments

    add_limit_arguments(serve)
    from bookie.main import add_auth_arguments

    add_auth_arguments(serve)
    serve.add_argument(
        "--no-fsync", action="store_true", help="UNSAFE: skip fsync (benchmarks of the rest only)"
    )
    from bookie.config_file import enable as enable_config_file

    enable_config_file(serve, what="bookie")  # --config FILE, LEDGERSTORE_<SETTING>; after the last flag
    fmt = bs.add_parser("format", help="delete a bookie's cookie so a replaced bookie can register anew")
    _common(fmt)
    fmt.add_argument("--bookie-id", required=True)
    fmt.add_argument("--delete-cookie", action="store_true", required=True)
    gc = bs.add_parser(
        "gc",
        help="run garbage collection on registered bookies now: delete ledgers gone from metadata and collect "
        "blob garbage (PUT /api/v1/gc on each)",
    )
    _common(gc)
    gc.add_argument("--bookie-id", action="append", default=None, help="only this bookie (repeatable)")
    gc.add_argument("--timeout-s", type=float, default=600.0, help="per bookie: a pass can take minutes")
    rec = bs.add_parser(
        "recover",
        help="re-replicate a lost bookie's entries of every CLOSED ledger to other bookies and swap them into "
        "the ledgers' metadata (open ledgers are reported, not touched)",
    )
    _common(rec)
    rec.add_argument("bookie", help="the lost bookie's id (HOST:PORT)")
    rec.add_argument(
        "--password",
        default="",
        help="the ledgers' password (ledgers with another one are reported, not touched)",
    )
    rec.add_argument(
        "--dry-run", action="store_true", help="only say what would be copied where; copy and change nothing"
    )
    bp.set_defaults(func=_cmd_bookie)

    # cluster -------------------------------------------------------------------------------------
    cp = sub.add_parser(
        "cluster", help="a whole local cluster (ZooKeeper + bookies + brokers) as processes or containers"
    )
    cs = cp.add_subparsers(dest="action", required=True)
    for name in ("up", "down", "status"):
        a = cs.add_parser(name)
        _common(a)
        a.add_argument("--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR))
        a.add_argument("--bookies", type=int, default=3)
        a.add_argument("--brokers", type=int, default=1, help="topic brokers (ports 6650.., HTTP 8080..)")
        a.add_argument("--broker-port", type=int, default=6650)
        a.add_argument("--broker-http-port", type=int, default=8080)
        a.add_argument(
            "--no-autorecovery",
            dest="autorecovery",
            action="store_false",
            help="start no AutoRecovery process (by default one re-replicates a lost bookie's ledgers)",
        )
        a.add_argument("--autorecovery-port", type=int, default=8100, help="AutoRecovery's /metrics port")
        a.add_argument(
            "--autorecovery-password",
            action="append",
            default=None,
            help="a ledger password AutoRecovery may open ledgers with (repeatable; the empty one always)",
        )
        a.add_argument("--docker", action="store_true", help="run as containers (docker/compose.yaml)")
        a.add_argument("--zk-port", type=int, default=2181)
        a.add_argument("--base-port", type=int, default=3181)
    cp.set_defaults(func=_cmd_cluster)

    # ledger --------------------------------------------------------------------------------------
    lp = sub.add_parser("ledger", help="the BookKeeper shell's everyday verbs")
    from ledgerstore.ledger_cmd import add_ledger_commands

    add_ledger_commands(lp, _common)

    # autorecovery, bookie decommission|set-rack|racks, ledger underreplicated (ledgerstore/autorecovery_cmd.py)
    from ledgerstore.autorecovery_cmd import add_autorecovery_commands

    add_autorecovery_commands(sub, bp, lp, _common)

    # cluster info, bookie lastmark|sanity|updatecookie, bookie recover -l (ledgerstore/bk_shell.py)
    from ledgerstore.bk_shell import add_bookkeeper_verbs

    add_bookkeeper_verbs(bs, cs, _common)

    # bench ---------------------------------------------------------------------------------------
    bench = sub.add_parser("bench", help="throughput/latency benchmarks")
    from ledgerstore.bench import add_bench_commands

    add_bench_commands(bench, _common)
    from ledgerstore.bench_spark import add_bench_spark_command

    add_bench_spark_command(bench, _common)
    from ledgerstore.bench_topic import add_bench_topic_command

    add_bench_topic_command(bench, _common)

    # spark (analysis jobs; ledgerstore/spark_cmd.py) -------------------------------------------
    from ledgerstore.spark_cmd import add_spark_command

    add_spark_command(sub, _common)

    # topic (pulsar-admin's everyday verbs; ledgerstore/topic_cmd.py) ---------------------------
    from ledgerstore.topic_cmd import add_topic_commands

    add_topic_commands(sub, _common)

    # broker --------------------------------------------------------------------------------------
    brp = sub.add_parser("broker", help="run a topic broker (Apache Pulsar's binary protocol)")
    brs = brp.add_subparsers(dest="action", required=True)
    br_serve = brs.add_parser("serve", help="run a broker in the foreground")
    from topic_broker.main import add_serve_arguments

    add_serve_arguments(br_serve)
    brp.set_defaults(func=_cmd_broker)

    # auth (ledgerstore/auth_cmd.py) -------------------------------------------------------------
    from ledgerstore.auth_cmd import add_auth_command

    add_auth_command(sub)

    # demo ----------------------------------------------------------------------------------------
    demo = sub.add_parser("demo", help="the end-to-end story (what `make run` shows)")
    _common(demo)
    demo.add_argument("--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR))
    demo.set_defaults(func=_cmd_demo)
    return parser


def _cmd_zk(args: argparse.Namespace) -> int:
    from zk import launcher

    if args.action == "secure":
        from zk.acl import cli_secure

        human, data = cli_secure(args.zk, args.zk_root, auth=args.auth, dry_run=args.dry_run)
        emit(args, human, data)
        return 0 if args.dry_run or not data["stranger_readable"] else 1
    if args.action == "start":
        cs = launcher.cli_start(args.state_dir, args.port)
        emit(args, f"ZooKeeper serving at {cs} (state in {args.state_dir})", {"connect": cs})
    elif args.action == "stop":
        stopped = launcher.cli_stop(args.state_dir)
        emit(args, "ZooKeeper stopped" if stopped else "ZooKeeper was not running", {"stopped": stopped})
    else:
        st = launcher.status(args.state_dir)
        emit(
            args,
            f"ZooKeeper {'running' if st.running else 'not running'}"
            + (f" at {st.connect_string} (pid {st.pid}, {st.mode})" if st.running else ""),
            {"running": st.running, "pid": st.pid, "connect": st.connect_string, "mode": st.mode},
        )
    return 0


def _cmd_bookie(args: argparse.Namespace) -> int:
    from bookie import main as bookie_main

    if args.action == "serve":
        return bookie_main.serve(args)
    if args.action == "gc":
        from ledgerstore.bookie_admin import trigger_gc

        return trigger_gc(args)
    if args.action == "recover":
        from ledgerstore.bookie_admin import recover_bookie

        return recover_bookie(args)
    return bookie_main.format_cookie(args)


def _cmd_broker(args: argparse.Namespace) -> int:
    from topic_broker import main as broker_main

    return broker_main.run(args)


def _cmd_cluster(args: argparse.Namespace) -> int:
    from ledgerstore import cluster

    return cluster.command(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    import ledgerstore.demo as demo

    return demo.run(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    server = args.command in ("bookie", "broker") and getattr(args, "action", "") == "serve"
    if getattr(args, "auth_token_file", None):  # read by every client this command makes (ClientConfig)
        os.environ["LEDGERSTORE_AUTH_TOKEN_FILE"] = args.auth_token_file
    logging.basicConfig(
        level=logging.DEBUG
        if getattr(args, "verbose", False)
        else logging.INFO
        if server
        else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for name in ("kazoo", "zk.kazoo"):  # connection retries are reported by our own one-line error
        logging.getLogger(name).setLevel(logging.WARNING if server else logging.CRITICAL)
    try:
        return int(args.func(args) or 0)
    except CommandError as e:
        print(f"ledgerstore: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # our errors carry a code; anything else is still one line, not a traceback
        code = getattr(e, "code", None)
        prefix = f"{code}: " if isinstance(code, str) and not str(e).startswith(f"[{code}]") else ""
        print(f"ledgerstore: {prefix}{e}", file=sys.stderr)
        if getattr(args, "verbose", False):
            raise
        return 1


if __name__ == "__main__":
    sys.exit(main())
