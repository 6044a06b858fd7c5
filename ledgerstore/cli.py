"""The ``ledgerstore`` command: one console script, subcommands per component (docs/architecture.md §3).

Conventions (the reference is ``docs/cli.md``, generated from this parser by ``scripts/gen-cli-docs.py``):

* global options (``--zk``, ``--zk-root``, ``--json``, ``-v``, ``--auth-token-file``) go before or after the
  subcommand: :func:`normalise_argv` moves them behind it, where every leaf command accepts them;
* human output by default, ``--json`` on request; with ``--json`` an error is a JSON document on stdout too,
  ``{"error": {"code": ..., "message": ..., "exit_status": ...}}``, so ``| jq`` always reads JSON (the exit
  status says which); without it, one line on stderr;
* the exit status says what kind of failure it was (:data:`EXIT_CODES`);
* a closed pipe (``ledgerstore ledger list | head -1``) ends the command quietly with status 0;
* progress bars only on a terminal (:func:`progress_disabled`); passwords from ``--password-file`` or
  ``$LEDGERSTORE_PASSWORD`` as well as ``--password`` (:func:`add_password_arguments`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ledgerstore import __version__, started

DEFAULT_ZK = "127.0.0.1:2181"
DEFAULT_ZK_ROOT = "/ledgerstore"
DEFAULT_STATE_DIR = ".ledgerstore"
PASSWORD_ENV = "LEDGERSTORE_PASSWORD"

# Exit statuses (docs/cli.md lists them; ``bookie serve`` keeps 3 for a refused identity, docs/architecture.md §6).
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_COOKIE_MISMATCH = 3
EXIT_NOT_FOUND = 4
EXIT_UNAVAILABLE = 5
EXIT_UNAUTHORIZED = 6
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[int, tuple[str, str]] = {
    EXIT_OK: ("OK", "success"),
    EXIT_ERROR: ("ERROR", "any other failure (the message says what)"),
    EXIT_USAGE: ("USAGE", "bad command line: unknown command or flag, missing or contradictory arguments"),
    EXIT_COOKIE_MISMATCH: ("COOKIE_MISMATCH", "`bookie serve` refused to start: its identity check failed"),
    EXIT_NOT_FOUND: ("NOT_FOUND", "no such ledger, entry, znode, topic or subscription"),
    EXIT_UNAVAILABLE: (
        "UNAVAILABLE",
        "ZooKeeper, bookies or the broker unreachable, too few bookies, a timeout (retrying may help)",
    ),
    EXIT_UNAUTHORIZED: ("UNAUTHORIZED", "wrong ledger password, token or ZooKeeper credentials"),
    EXIT_INTERRUPTED: ("INTERRUPTED", "interrupted (Ctrl-C)"),
}

#: The ``code`` of our error hierarchies (ledger_client/errors.py, zk/errors.py) -> exit status.
_STATUS_OF_ERROR_CODE: dict[str, int] = {
    **dict.fromkeys(("NO_SUCH_LEDGER", "NO_SUCH_ENTRY", "METADATA_NOT_FOUND"), EXIT_NOT_FOUND),
    **dict.fromkeys(
        (
            "BOOKIE_UNAVAILABLE",
            "NOT_ENOUGH_BOOKIES",
            "TIMEOUT",
            "TOO_MANY_REQUESTS",
            "METADATA_STORE",
            "METADATA_CONNECTION",
            "METADATA_SESSION_EXPIRED",
        ),
        EXIT_UNAVAILABLE,
    ),
    **dict.fromkeys(("UNAUTHORIZED", "METADATA_AUTH"), EXIT_UNAUTHORIZED),
    "ZK_CONNECT_STRING": EXIT_USAGE,
}


class CommandError(Exception):
    """A user-facing failure: printed as one line (a JSON document with --json), exit status ``code``.

    ``kind`` is the stable error code in JSON output (default: the exit status's name, e.g. ``NOT_FOUND``).
    """

    def __init__(self, message: str, code: int = EXIT_ERROR, *, kind: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.kind = kind or EXIT_CODES.get(code, ("ERROR", ""))[0]


class UsageError(CommandError):
    """A bad command line (argparse's own complaints included): exit status 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


def cluster_store(args: argparse.Namespace) -> Any:
    """A ``MetadataStore`` under ``--zk-root`` for a command on the cluster there. A root that holds no cluster but
    looks like a mistyped root of one that does (``zk.cookies.existing_instance_id``) is refused, exit 4, naming the
    roots that do, and what the connection made there is removed again: the command would read an empty cluster
    there and say all is well (`cluster info`, `autorecovery status`), or write where nothing reads it
    (`autorecovery disable`)."""
    from zk import MetadataStore
    from zk.cookies import NoClusterError, existing_instance_id

    store = MetadataStore.connect(args.zk, root=args.zk_root)
    try:
        existing_instance_id(store)
    except NoClusterError as e:
        store.close()
        raise CommandError(f"{e}: check --zk-root (or $LEDGERSTORE_ZK_ROOT)", EXIT_NOT_FOUND) from None
    except BaseException:
        store.close()
        raise
    return store


def exit_status_for_http(status: int) -> int:
    """The exit status for an HTTP error status of an admin API (the broker's /admin/v2, a bookie's /api)."""
    if status == 404:
        return EXIT_NOT_FOUND
    if status in (401, 403):
        return EXIT_UNAUTHORIZED
    if status in (502, 503, 504):
        return EXIT_UNAVAILABLE
    return EXIT_ERROR


def classify(exc: BaseException) -> tuple[int, str, str]:
    """(exit status, error code, message) for an exception that ends a command; the notes a command added to it
    on its way out (``exc.add_note``: what it had done when it failed) end the message in brackets."""
    status, code, message = _classify(exc)
    notes = [n for n in getattr(exc, "__notes__", ()) if isinstance(n, str)]
    return status, code, message + "".join(f" ({n})" for n in notes)


def _classify(exc: BaseException) -> tuple[int, str, str]:
    if isinstance(exc, CommandError):
        return exc.code, exc.kind, str(exc)
    code = getattr(exc, "code", None)
    if isinstance(code, str):  # one of our hierarchies: a stable code (LedgerError's text starts with it)
        message = str(exc).removeprefix(f"[{code}] ")
        if code in ("METADATA_STORE", "METADATA_CONNECTION") and "could not connect to ZooKeeper" in message:
            # the client's wrapper repeats the address the store's own error already names
            message = message[message.index("could not connect to ZooKeeper") :]
            if "(no such host: " in message:
                message += "; check the host name (--zk HOST:PORT or $LEDGERSTORE_ZK)"
            else:
                message += (
                    "; is it running? (`ledgerstore cluster status`; --zk HOST:PORT or $LEDGERSTORE_ZK)"
                )
        elif code == "ZK_CONNECT_STRING":
            message += " (--zk or $LEDGERSTORE_ZK)"
        return _STATUS_OF_ERROR_CODE.get(code, EXIT_ERROR), code, message
    if isinstance(exc, ConnectionError | TimeoutError):
        return EXIT_UNAVAILABLE, "UNAVAILABLE", str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return EXIT_NOT_FOUND, "NOT_FOUND", str(exc)
    return EXIT_ERROR, "ERROR", str(exc) or type(exc).__name__


def emit(args: argparse.Namespace, human: str | Callable[[], str], data: Any) -> None:
    """Print ``data`` as JSON with --json, else the human text."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print(human() if callable(human) else human)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and its noun, singular for 1 ("1 broker", "3 brokers", "0 brokers"); ``plural`` when not noun + s."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def progress_disabled(args: argparse.Namespace | None = None) -> bool:
    """Progress bars go to stderr only when it is a terminal (never into pipes and logs) and not with --json."""
    return bool(args is not None and getattr(args, "json", False)) or not sys.stderr.isatty()


# Global options ----------------------------------------------------------------------------------------------

#: option string -> takes a value. Accepted before or after the subcommand (see normalise_argv).
GLOBAL_OPTIONS: dict[str, bool] = {
    "--zk": True,
    "--zk-root": True,
    "--json": False,
    "-v": False,
    "--verbose": False,
    "--auth-token-file": True,
}


def _common(p: argparse.ArgumentParser) -> None:
    """The global options, on a leaf command (normalise_argv brings them there from anywhere on the line)."""
    have = p._option_string_actions

    def add(*flags: str, **kw: Any) -> None:
        if not any(f in have for f in flags):
            p.add_argument(*flags, **kw)

    add(
        "--zk",
        default=os.environ.get("LEDGERSTORE_ZK", DEFAULT_ZK),
        metavar="HOST:PORT",
        help=f"ZooKeeper connect string (default: {DEFAULT_ZK}; env LEDGERSTORE_ZK)",
    )
    add(
        "--zk-root",
        default=os.environ.get("LEDGERSTORE_ZK_ROOT", DEFAULT_ZK_ROOT),
        metavar="PATH",
        help=f"metadata root znode (default: {DEFAULT_ZK_ROOT}; env LEDGERSTORE_ZK_ROOT)",
    )
    add("--json", action="store_true", help="machine-readable output; errors as JSON on stdout too")
    add("-v", "--verbose", action="store_true", help="debug logging (and a traceback on errors)")
    add(
        "--auth-token-file",
        default=None,
        metavar="FILE",
        help="token sent to bookies, from `ledgerstore auth create-token` (default: none; env "
        "LEDGERSTORE_AUTH_TOKEN or LEDGERSTORE_AUTH_TOKEN_FILE)",
    )


def normalise_argv(argv: Sequence[str]) -> list[str]:
    """Move every global option (with its value) behind the subcommand, where the leaf command parses it:
    ``ledgerstore --json ledger list`` and ``ledgerstore ledger --json list`` become ``ledger list --json``.
    Nothing after a ``--`` is touched."""
    argv = list(argv)
    end = argv.index("--") if "--" in argv else len(argv)
    rest: list[str] = []
    moved: list[str] = []
    i = 0
    while i < end:
        tok = argv[i]
        name = tok.split("=", 1)[0] if tok.startswith("--") else tok
        if name in GLOBAL_OPTIONS:
            moved.append(tok)
            if GLOBAL_OPTIONS[name] and "=" not in tok and i + 1 < end:
                moved.append(argv[i + 1])
                i += 1
        else:
            rest.append(tok)
        i += 1
    if not rest or rest[0] in ("-h", "--help", "--version"):
        return argv  # nothing to move behind: let the top-level parser answer
    return rest + moved + argv[end:]


#: BookKeeper's shell verbs (``bookkeeper shell VERB``) -> the command that does the same here; typed as the top
#: command (or after ``shell``) they get a usage error naming it (docs/operations.md has the table).
BOOKKEEPER_VERBS: dict[str, str] = {
    "listbookies": "ledger bookies",
    "listledgers": "ledger list",
    "ledgermetadata": "ledger metadata LEDGER_ID",
    "readledger": "ledger read LEDGER_ID",
    "simpletest": "ledger simpletest",
    "deleteledger": "ledger delete LEDGER_ID",
    "recover": "bookie recover BOOKIE [-l LEDGER_ID]",
    "lastmark": "bookie lastmark",
    "bookiesanity": "bookie sanity",
    "updatecookie": "bookie updatecookie --bookie-id NEW --data-dir DIR",
    "updateledgers": "bookie updatecookie --bookie-id NEW --data-dir DIR --update-ledgers",
    "bookieformat": "bookie format --bookie-id ID --delete-cookie",
    "decommissionbookie": "bookie decommission BOOKIE",
    "listunderreplicated": "ledger underreplicated",
    "whoisauditor": "autorecovery status",
    "triggeraudit": "autorecovery trigger-audit",
}


def bookkeeper_verb_hint(argv: Sequence[str]) -> str | None:
    """The usage error for a BookKeeper shell verb typed as a command (``ledgerstore listbookies``,
    ``ledgerstore shell listbookies``), naming what to type instead; None for anything else."""
    words = normalise_argv(argv)
    if words[:1] == ["shell"]:
        words = words[1:]
        if not words or words[0] not in BOOKKEEPER_VERBS:
            return "there is no `shell` command: BookKeeper's shell verbs are commands of their own (docs/operations.md)"
    if not words or words[0] not in BOOKKEEPER_VERBS:
        return None
    return f"`{words[0]}` is BookKeeper's shell verb; here it is `ledgerstore {BOOKKEEPER_VERBS[words[0]]}`"


def add_password_arguments(p: argparse.ArgumentParser, help_text: str = "the ledger's password") -> None:
    """``--password PW``, ``--password-file FILE`` (first line) or ``$LEDGERSTORE_PASSWORD``; see password_of."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--password",
        default=None,
        help=f"{help_text} (visible in `ps`: prefer --password-file or env {PASSWORD_ENV}; default: empty)",
    )
    g.add_argument(
        "--password-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="read the password from the first line of FILE",
    )


def password_of(args: argparse.Namespace) -> str:
    """The password of a command with add_password_arguments: --password, else --password-file, else
    $LEDGERSTORE_PASSWORD, else empty."""
    if getattr(args, "password", None) is not None:
        return str(args.password)
    path = getattr(args, "password_file", None)
    if path is not None:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise CommandError(f"--password-file: {e}", EXIT_ERROR) from e
        return lines[0] if lines else ""
    return os.environ.get(PASSWORD_ENV, "")


def add_passwords_arguments(p: argparse.ArgumentParser, help_text: str) -> None:
    """Repeatable ``--password PW``, ``--password-file FILE`` (one password a line) and ``$LEDGERSTORE_PASSWORD``
    (used when neither flag is given); see passwords_of."""
    p.add_argument(
        "--password",
        action="append",
        default=None,
        help=f"{help_text} (repeatable; visible in `ps`: prefer --password-file or env {PASSWORD_ENV}; "
        "the empty password, the brokers' ledgers', is always tried too)",
    )
    p.add_argument(
        "--password-file",
        type=Path,
        action="append",
        default=None,
        metavar="FILE",
        help="read passwords from FILE, one a line (repeatable)",
    )


def passwords_of(args: argparse.Namespace) -> list[str]:
    """The passwords of a command with add_passwords_arguments, the empty one always among them (last): the
    brokers' ledgers have it, and a `bookie decommission --password pw` could not move them (their ledgers
    "still name it: none of the configured passwords is the ledger's", the decommission never finished)."""
    found = list(getattr(args, "password", None) or [])
    for path in getattr(args, "password_file", None) or []:
        try:
            found += [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line]
        except OSError as e:
            raise CommandError(f"--password-file: {e}", EXIT_ERROR) from e
    if not found and PASSWORD_ENV in os.environ:
        found = [os.environ[PASSWORD_ENV]]
    return [pw for pw in dict.fromkeys(found) if pw] + [""]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default unless its help says it already or there is nothing to show (flags, None)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or "%(default)" in text or not action.option_strings:
            return text
        if action.default in (None, argparse.SUPPRESS) or action.nargs == 0 or action.default == []:
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An argparse parser whose complaints raise UsageError (so --json can report them as JSON)."""

    def error(self, message: str) -> Any:
        where = self.prog.removeprefix("ledgerstore").strip()  # the line already starts "ledgerstore: "
        raise UsageError(f"{where}: {message}" if where else message)


def walk_parsers(parser: argparse.ArgumentParser) -> Iterator[tuple[argparse.ArgumentParser, str | None]]:
    """Every parser of the tree, depth first, with the help its parent gave it (None for the top)."""
    stack: list[tuple[argparse.ArgumentParser, str | None]] = [(parser, None)]
    while stack:
        p, text = stack.pop(0)
        yield p, text
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                children = [(sub, helps.get(name)) for name, sub in action.choices.items()]
                stack[0:0] = children


def _is_leaf(p: argparse.ArgumentParser) -> bool:
    return not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)


#: One help text for a flag many commands share, used where a command gave its flag none.
_STANDARD_HELP: dict[str, str] = {
    "--ensemble": "ensemble size: bookies each ledger uses",
    "--write-quorum": "copies of each entry",
    "--ack-quorum": "acks before an entry is acknowledged",
    "--entry-size": "bytes per entry",
    "--entries": "entries to write",
    "--outstanding": "appends (or requests) in flight",
    "--duration": "seconds each run lasts",
    "--runs": "runs; the median is reported",
    "--ledgers": "ledgers written at once",
    "--partitions": "partitions of the topic (0: not partitioned)",
    "--skip-e2e": "measure produce throughput only, not end-to-end latency",
    "--zk-session-timeout-s": "ZooKeeper session timeout: how soon others see this process gone",
    # broker serve
    "--port": "the service's TCP port",
    "--http-port": "the admin HTTP port",
    "--listen-address": "bind address",
    "--advertised-address": "the host clients are told to connect to",
    "--max-message-size": "largest message accepted, in bytes",
    "--ensemble-size": "ensemble size of the topics' ledgers",
    "--managed-ledger-password": "password of the topics' ledgers",
    "--max-entries-per-ledger": "roll a topic over to a new ledger after this many entries",
    "--min-rollover-time-s": "a topic's ledger is rolled over no sooner than this",
    "--max-rollover-time-s": "... and no later than this, however few its entries",
}


def _finish(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every parser shows defaults; every leaf command takes the global options; shared flags get one help."""
    for p, _ in walk_parsers(parser):
        p.formatter_class = HelpFormatter
        if _is_leaf(p) and p is not parser:
            _common(p)
        for action in p._actions:
            if not action.help:
                names = [_STANDARD_HELP[s] for s in action.option_strings if s in _STANDARD_HELP]
                if action.dest in ("zk", "zk_root"):
                    names = ["ZooKeeper connect string" if action.dest == "zk" else "metadata root znode"]
                if names:
                    action.help = names[0]
    return parser


_STATE_DIR_OF_A_CLUSTER = (
    "the `cluster up` state to use: its cluster.json names the cluster's ZooKeeper and root (--zk and --zk-root, "
    "if given, must be those)"
)


def _state_zk_options(p: argparse.ArgumentParser) -> None:
    """--zk and --zk-root of a `cluster` command that acts on the cluster its --state-dir records: a check only
    (ledgerstore.cluster refuses values other than the recorded ones, rather than ignore them)."""
    p.add_argument(
        "--zk",
        default=os.environ.get("LEDGERSTORE_ZK", DEFAULT_ZK),
        metavar="HOST:PORT",
        help="the ZooKeeper is the one --state-dir's cluster.json records; given, it must be that one (a check)",
    )
    p.add_argument(
        "--zk-root",
        default=os.environ.get("LEDGERSTORE_ZK_ROOT", DEFAULT_ZK_ROOT),
        metavar="PATH",
        help="the root is the one --state-dir's cluster.json records; given, it must be that one (a check)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="ledgerstore",
        description="A replicated, durable log store. Global options go before or after the subcommand.",
        epilog="Exit status: "
        + ", ".join(f"{n} {name.lower().replace('_', ' ')}" for n, (name, _) in sorted(EXIT_CODES.items()))
        + ". Reference: docs/cli.md.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ledgerstore {__version__}")
    _common(parser.add_argument_group("global options (before or after the subcommand)"))  # type: ignore[arg-type]
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # zk ------------------------------------------------------------------------------------------
    zkp = sub.add_parser("zk", help="a local ZooKeeper for development")
    zks = zkp.add_subparsers(dest="action", required=True)
    for name, text in (
        ("start", "start a local ZooKeeper in the background"),
        ("stop", "stop the local ZooKeeper"),
        ("status", "is the local ZooKeeper running, where, in which mode"),
    ):
        a = zks.add_parser(name, help=text)
        _common(a)
        a.add_argument(
            "--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR), help="where its data, pid and log are"
        )
        a.add_argument("--port", type=int, default=2181, help="client port")
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
    serve.add_argument(
        "--data-dir",
        type=Path,
        required=True,
        help="ledger storage, the journal (unless --journal-dir), the cookie",
    )
    serve.add_argument("--port", type=int, default=3181, help="the bookie protocol's TCP port")
    serve.add_argument(
        "--http-port", type=int, default=8000, help="admin HTTP: /health, /metrics, /api/v1/..."
    )
    serve.add_argument("--bookie-id", default=None, help="defaults to <advertised host>:<port>")
    serve.add_argument(
        "--init-cluster",
        action="store_true",
        help="create the cluster's metadata (its instance id) under --zk-root if it is not there, even when the "
        "root looks like a typo of another cluster's (`cluster up` does); without it a bookie refuses a root "
        "that holds no cluster but is a typo away from, above or below one that does (a mistyped --zk-root); "
        "under any other new root the first bookies create the cluster anyway",
    )
    serve.add_argument("--advertised-address", default="127.0.0.1", help="the host clients connect to")
    serve.add_argument(
        "--listen-address", default=None, help="bind address (default: the advertised address)"
    )
    serve.add_argument(
        "--journal-max-wait-ms",
        type=float,
        default=1.0,
        help="group commit: the longest a journal record waits for others to share its fsync",
    )
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
        "--journal-prealloc-mb",
        type=float,
        default=2.0,
        help="zeros an idle journal writes ahead of its records in a new segment, so a lone add's fdatasync "
        "does not also commit the file's growth (0: none)",
    )
    serve.add_argument(
        "--no-journal-direct-io",
        action="store_true",
        help="write the journal through the page cache (by default its page-aligned batches bypass it with "
        "O_DIRECT where the filesystem allows it: no copy into the cache and a shorter fdatasync)",
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
        "--storage-flush-io",
        choices=("direct", "page-cache"),
        default="direct",
        help="how RocksDB flushes and compactions write: direct (the default: O_DIRECT in 128 KiB requests, so a "
        "flush never queues much writeback in front of the journal's syncs) or page-cache (synced every 1 MiB; "
        "the entries just flushed also stay in the page cache, beyond --storage-cache-mb, but with the journal "
        "on the same disk the write tail at high load is about 3x longer)",
    )
    serve.add_argument(
        "--storage-cache-mb",
        type=int,
        default=256,
        help="MiB of RocksDB block cache for the entries, filled by each flush with the entries it writes, so "
        "the first read after a write (catch-up readers, scans, recovery) reads memory instead of the disk "
        "(default 256; 0: RocksDB's own small cache, not filled by flushes)",
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
    serve.add_argument(
        "--disk-usage-threshold",
        type=float,
        default=0.95,
        help="go read-only when a data disk is this full (share of its size)",
    )
    serve.add_argument(
        "--disk-usage-lwm", type=float, default=0.90, help="writable again below this share (low-water mark)"
    )
    serve.add_argument(
        "--gc-interval-s",
        type=float,
        default=60.0,
        help="seconds between garbage collections of deleted ledgers",
    )
    serve.add_argument(
        "--checkpoint-interval-s",
        type=float,
        default=10.0,
        help="seconds between checkpoints (flush ledger storage, advance the journal mark)",
    )
    serve.add_argument(
        "--partial-frame-timeout-s",
        type=float,
        default=30.0,
        help="close a connection whose partial frame makes no progress this long (slow loris)",
    )
    serve.add_argument("--inflight-max", type=int, default=10_000, help="requests in flight per connection")
    from bookie.main import add_limit_arguments

    add_limit_arguments(serve)
    from bookie.main import add_auth_arguments

    add_auth_arguments(serve)
    from bookie.main import add_scrub_arguments

    add_scrub_arguments(serve)
    from ledgerstore.autorecovery_cmd import add_autorecovery_settings

    add_autorecovery_settings(serve, in_bookie=True)  # AutoRecovery in the bookie (autorecovery/embedded.py)
    serve.add_argument(
        "--no-fsync", action="store_true", help="UNSAFE: skip fsync (benchmarks of the rest only)"
    )
    from bookie.config_file import enable as enable_config_file

    enable_config_file(serve, what="bookie")  # --config FILE, LEDGERSTORE_<SETTING>; after the last flag
    fmt = bs.add_parser(
        "format", help="delete a stopped bookie's cookie so a replaced bookie can register anew"
    )
    _common(fmt)
    fmt.add_argument("--bookie-id", required=True, help="the bookie whose cookie goes (HOST:PORT)")
    fmt.add_argument(
        "--delete-cookie",
        action="store_true",
        required=True,
        help="required: confirms that the cookie in ZooKeeper is to be deleted",
    )
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
    add_password_arguments(rec, "the ledgers' password (ledgers with another one are reported, not touched)")
    rec.add_argument(
        "--dry-run", action="store_true", help="only say what would be copied where; copy and change nothing"
    )
    bp.set_defaults(func=_cmd_bookie)

    # cluster -------------------------------------------------------------------------------------
    cp = sub.add_parser(
        "cluster", help="a whole local cluster (ZooKeeper + bookies + brokers) as processes or containers"
    )
    cs = cp.add_subparsers(dest="action", required=True)
    for name, text in (
        ("up", "start ZooKeeper (unless --zk names one), bookies (with AutoRecovery) and brokers"),
        ("down", "stop what `cluster up` started"),
        ("status", "what is running, where"),
    ):
        a = cs.add_parser(name, help=text)
        if name != "up":
            _state_zk_options(a)
        _common(a)
        a.add_argument(
            "--state-dir",
            type=Path,
            default=Path(DEFAULT_STATE_DIR),
            help="data directories, logs, pids" if name == "up" else _STATE_DIR_OF_A_CLUSTER,
        )
        a.add_argument("--bookies", type=int, default=3, help="bookie processes (ports from --base-port)")
        a.add_argument("--brokers", type=int, default=1, help="topic brokers (ports 6650.., HTTP 8080..)")
        a.add_argument(
            "--broker-port", type=int, default=6650, help="the first broker's Pulsar protocol port"
        )
        a.add_argument(
            "--broker-http-port", type=int, default=8080, help="the first broker's admin HTTP port"
        )
        a.add_argument(
            "--no-autorecovery",
            dest="autorecovery",
            action="store_false",
            help="bookies run no AutoRecovery (by default each runs an auditor candidate and a replication "
            "worker, which re-replicate a lost bookie's ledgers)",
        )
        a.add_argument(
            "--autorecovery-process",
            action="store_true",
            help="also start a standalone AutoRecovery process (`autorecovery serve`, /metrics on "
            "--autorecovery-port)",
        )
        a.add_argument(
            "--autorecovery-port", type=int, default=8100, help="the AutoRecovery process's /metrics port"
        )
        a.add_argument(
            "--autorecovery-password",
            action="append",
            default=None,
            help="a ledger password AutoRecovery may open ledgers with (repeatable; the empty one always; "
            "also the lines of --autorecovery-password-file; handed to the processes in STATE_DIR/"
            "autorecovery-passwords, mode 600, not on their command lines)",
        )
        a.add_argument(
            "--autorecovery-password-file",
            type=Path,
            default=None,
            metavar="FILE",
            help="more such passwords, one a line (AutoRecovery reads them from this file; not in `ps`)",
        )
        a.add_argument("--docker", action="store_true", help="run as containers (docker/compose.yaml)")
        a.add_argument(
            "--zk-port", type=int, default=2181, help="the port of the ZooKeeper it starts (not with --zk)"
        )
        a.add_argument(
            "--base-port", type=int, default=3181, help="the first bookie's port (the others follow)"
        )
        a.add_argument(
            "--bookie-http-port",
            type=int,
            default=None,
            help="the first bookie's admin HTTP port (/health, /metrics; the others follow; default 8000, with "
            "--docker 8001 as in docker/compose.yaml)",
        )
    one_piece = {
        "stop": "stop one piece of the cluster (SIGTERM; --kill: SIGKILL, a crash)",
        "start": "start a stopped piece again as `cluster up` started it; wait until it is ready",
        "restart": "stop one piece, then start it again",
    }
    for name, text in one_piece.items():
        a = cs.add_parser(name, help=text)
        a.add_argument(
            "target",
            help="what `cluster status` lists: a bookie by id (127.0.0.1:3182) or index (bookie-1), a broker "
            "(broker-0 or its service URL), autorecovery, zookeeper (if `cluster up` started it)",
        )
        if name != "start":
            a.add_argument(
                "--kill", action="store_true", help="SIGKILL (a crash, as kill -9) instead of SIGTERM"
            )
        a.add_argument(
            "--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR), help=_STATE_DIR_OF_A_CLUSTER
        )
        _state_zk_options(a)
        _common(a)
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
    from ledgerstore.bench_rereplication import add_bench_rereplication_command

    add_bench_rereplication_command(bench, _common)

    # spark (analysis jobs; ledgerstore/spark_cmd.py) -------------------------------------------
    from ledgerstore.spark_cmd import add_spark_command

    add_spark_command(sub, _common)

    # topic (pulsar-admin's everyday verbs; ledgerstore/topic_cmd.py) ---------------------------
    from ledgerstore.topic_cmd import add_namespace_commands, add_topic_commands

    add_topic_commands(sub, _common)
    add_namespace_commands(sub, _common)

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
    demo.add_argument(
        "--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR), help="the `cluster up` state to use"
    )
    demo.set_defaults(func=_cmd_demo)
    return _finish(parser)


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
        from ledgerstore.autorecovery_cmd import bookie_companions

        return bookie_main.serve(args, companions=bookie_companions)
    if args.action == "gc":
        from ledgerstore.bookie_admin import trigger_gc

        return trigger_gc(args)
    if args.action == "recover":
        from ledgerstore.bookie_admin import recover_bookie

        return recover_bookie(args)
    return _format_cookie(args)


def _format_cookie(args: argparse.Namespace) -> int:
    from zk import BookieRegistry, cookies

    store = cluster_store(args)
    try:
        if (
            args.bookie_id in BookieRegistry(store).all()
        ):  # its cookie is what keeps a wiped disk from rejoining
            raise CommandError(
                f"bookie {args.bookie_id} is registered (running, or stopped less than its ZooKeeper session "
                "timeout ago): stop it first"
            )
        if not cookies.delete_zk_cookie(store, args.bookie_id):
            raise CommandError(
                f"bookie {args.bookie_id} has no cookie in ZooKeeper (under {args.zk_root}): nothing deleted",
                EXIT_NOT_FOUND,
            )
    finally:
        store.close()
    emit(
        args,
        f"cookie of bookie {args.bookie_id} deleted; start it on an empty data directory to register anew",
        {"bookie_id": args.bookie_id, "cookie_deleted": True},
    )
    return 0


def _cmd_broker(args: argparse.Namespace) -> int:
    from topic_broker import main as broker_main

    return broker_main.run(args)


def _cmd_cluster(args: argparse.Namespace) -> int:
    from ledgerstore import cluster

    return cluster.command(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    import ledgerstore.demo as demo

    return demo.run(args)


def _report(args: argparse.Namespace | None, json_output: bool, exc: BaseException) -> int:
    status, code, message = classify(exc)
    if json_output:
        doc = {"error": {"code": code, "message": message, "exit_status": status}}
        _print_safely(json.dumps(doc, indent=2, sort_keys=True))
    else:
        prefix = "" if isinstance(exc, CommandError) or code in ("ERROR", "UNAVAILABLE") else f"{code}: "
        print(f"ledgerstore: {prefix}{message}", file=sys.stderr)
        if status == EXIT_USAGE:
            print("(ledgerstore --help, or COMMAND --help, for usage)", file=sys.stderr)
    return status


def _print_safely(text: str) -> None:
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _quiet_stdout()


def _quiet_stdout() -> None:
    """stdout's reader went away: point stdout at /dev/null so the interpreter's final flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    started()
    raw = list(sys.argv[1:] if argv is None else argv)
    before_dashes = raw[: raw.index("--")] if "--" in raw else raw
    json_output = "--json" in before_dashes
    args: argparse.Namespace | None = None
    try:
        hint = bookkeeper_verb_hint(raw)
        if hint:
            raise UsageError(hint)
        args = build_parser().parse_args(normalise_argv(raw))
        args.zk_given = any(t == "--zk" or t.startswith("--zk=") for t in before_dashes)
        args.zk_root_given = any(t == "--zk-root" or t.startswith("--zk-root=") for t in before_dashes)
        args.zk_port_given = any(t == "--zk-port" or t.startswith("--zk-port=") for t in before_dashes)
        status = _run(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at exit
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_OK  # `ledgerstore ledger list | head -1`: the reader had what it wanted
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as e:  # our errors carry a code; anything else is still one line, not a traceback
        if args is not None and getattr(args, "verbose", False) and not isinstance(e, CommandError):
            raise
        return _report(args, json_output, e)


def _check_token_file(path: str) -> None:
    """--auth-token-file is read later by each client: a wrong one is reported now, naming the flag."""
    try:
        Path(path).read_text(encoding="ascii")
    except OSError as e:
        raise CommandError(f"--auth-token-file: {e.strerror}: {path}", EXIT_NOT_FOUND) from e
    except UnicodeDecodeError as e:
        raise CommandError(
            f"--auth-token-file {path} holds no token (binary: the secret file?); a token is the text "
            "`ledgerstore auth create-token` prints"
        ) from e


def _run(args: argparse.Namespace) -> int:
    server = args.command in ("bookie", "broker", "autorecovery") and getattr(args, "action", "") == "serve"
    if getattr(args, "auth_token_file", None):  # read by every client this command makes (ClientConfig)
        _check_token_file(args.auth_token_file)
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
    return int(args.func(args) or 0)


if __name__ == "__main__":
    # `python -m ledgerstore.cli` runs this file as __main__; the command modules import ledgerstore.cli, a second
    # copy whose CommandError is another class. Run that copy's main, so one class is raised and classified.
    from ledgerstore.cli import main as _main

    sys.exit(_main())
