"""The ``ledger`` source's options: parsed and checked on the driver, before any task runs (no I/O but reading
the credentials' files).

    spark.read.format("ledger")
        .option("zk", "127.0.0.1:2181")          # ZooKeeper HOST:PORT[,HOST:PORT...]; default $LEDGERSTORE_ZK
        .option("zkRoot", "/ledgerstore")        # metadata root
        .option("ledgers", "all")                # "all" | "1,2,5" | "3-9" | "1,4-7,12"
        .option("password", "secret")            # the ledgers' password (UTF-8)
        .option("entriesPerPartition", 100000)   # one Spark partition per this many entries of a ledger
        .option("maxRecordsPerBatch", 8192)      # rows per Arrow record batch a reader yields
        .option("failOnDataLoss", "true")        # a ledger deleted under the query: error (true) or skip (false)
        .option("readTimeoutMs", 10000)          # one bookie request's timeout before the next replica is tried
        .option("authTokenFile", "/etc/ledgerstore/app.token")  # the bookies' token (--auth-required)
        .option("zkAuthFile", "/etc/ledgerstore/zk-auth")        # ZooKeeper digest credentials, user:password

Option names are case-insensitive (Spark passes them so). Every mistake raises :class:`LedgerOptionError`, whose
message names the option.

Credentials of a secured cluster (docs/operations.md, "Authentication", "ZooKeeper ACLs", "Spark"): ``authTokenFile`` names a file holding the
token the bookies check (``ledgerstore auth create-token``), ``zkAuthFile`` one holding ``user:password`` for
ZooKeeper's digest ACLs. Options name files, never the secrets, so nothing secret shows in Spark's plan or UI.
They are read where the query is planned (the only I/O here), and what they hold travels to the executors with
the query's tasks, so the files need not be on the workers (turn on ``spark.network.crypto.enabled`` where
Spark's own network is not trusted). Without them the environment is the fallback, in every process that
connects: ``LEDGERSTORE_AUTH_TOKEN[_FILE]`` and ``LEDGERSTORE_ZK_AUTH[_FILE]``, which a cluster's executors and
the Python workers that plan a query get only if the cluster passes them on (``spark.executorEnv.*``).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_ENTRIES_PER_PARTITION",
    "DEFAULT_MAX_RECORDS_PER_BATCH",
    "LedgerOptionError",
    "LedgerOptions",
    "LedgerSelection",
    "client_config",
    "parse_credentials",
    "parse_ledger_options",
    "parse_ledgers",
]

DEFAULT_ZK = "127.0.0.1:2181"
DEFAULT_ZK_ROOT = "/ledgerstore"
DEFAULT_ENTRIES_PER_PARTITION = 100_000
DEFAULT_MAX_RECORDS_PER_BATCH = 8192
#: A reader also cuts a batch once its payloads reach this many bytes, so one batch stays small in memory.
BATCH_BYTES_MAX = 16 * 1024 * 1024
DEFAULT_READ_TIMEOUT_MS = 10_000
#: A range selector may name at most this many ids (it is intersected with the existing ledgers anyway).
_MAX_LEDGER_ID = (1 << 63) - 1

KNOWN_OPTIONS = (
    "zk",
    "zkRoot",
    "ledgers",
    "password",
    "entriesPerPartition",
    "maxRecordsPerBatch",
    "failOnDataLoss",
    "readTimeoutMs",
    "authTokenFile",
    "zkAuthFile",
)
#: The options that name credentials' files (shared by the ``topic`` source).
CREDENTIAL_OPTIONS = ("authTokenFile", "zkAuthFile")

_HOSTPORT = re.compile(r"[A-Za-z0-9_.\-\[\]:]+:\d{1,5}")


class LedgerOptionError(ValueError):
    """A ``ledger`` source option is missing, unknown or malformed; ``option`` names it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"ledger source option '{option}': {message}")
        self.option = option


@dataclass(frozen=True, slots=True)
class LedgerSelection:
    """Which ledgers a query reads: every ledger (``all``), or explicit ids and inclusive id ranges.

    An explicit id that does not exist is data loss (``failOnDataLoss``); a range only selects the ledgers that
    exist inside it."""

    all: bool = False
    ids: tuple[int, ...] = ()
    ranges: tuple[tuple[int, int], ...] = ()

    def select(self, existing: list[int]) -> tuple[list[int], list[int]]:
        """(ledger ids to read, sorted; explicit ids that do not exist)."""
        have = set(existing)
        if self.all:
            return sorted(have), []
        chosen = {i for i in self.ids if i in have}
        for lo, hi in self.ranges:
            chosen.update(i for i in have if lo <= i <= hi)
        missing = sorted({i for i in self.ids if i not in have})
        return sorted(chosen), missing


@dataclass(frozen=True, slots=True)
class LedgerOptions:
    zk: str = DEFAULT_ZK
    zk_root: str = DEFAULT_ZK_ROOT
    ledgers: LedgerSelection = LedgerSelection(all=True)
    password: bytes = b""
    entries_per_partition: int = DEFAULT_ENTRIES_PER_PARTITION
    max_records_per_batch: int = DEFAULT_MAX_RECORDS_PER_BATCH
    fail_on_data_loss: bool = True
    read_timeout_ms: int = DEFAULT_READ_TIMEOUT_MS
    #: the bookies' token (``authTokenFile``); None: the environment of the process that connects
    auth_token: str | None = field(default=None, repr=False)
    #: ZooKeeper credentials (``zkAuthFile``, a ``zk.acl.ZkAuth``); None: the environment likewise
    zk_auth: Any = field(default=None, repr=False)


def parse_ledgers(text: str, option: str = "ledgers") -> LedgerSelection:
    """``all`` | comma-separated ledger ids and inclusive ranges ``lo-hi`` (``1,2,5``, ``3-9``, ``1,4-7``)."""
    s = text.strip()
    if s.lower() == "all":
        return LedgerSelection(all=True)
    if not s:
        raise LedgerOptionError(option, "is empty; give 'all', ids like '1,2,5' or a range like '3-9'")
    ids: list[int] = []
    ranges: list[tuple[int, int]] = []
    for raw in s.split(","):
        item = raw.strip()
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", item)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi:
                raise LedgerOptionError(option, f"range '{item}' runs backwards (from {lo} down to {hi})")
            if hi > _MAX_LEDGER_ID:
                raise LedgerOptionError(option, f"range '{item}' goes beyond the largest ledger id")
            ranges.append((lo, hi))
        elif re.fullmatch(r"\d+", item):
            if int(item) > _MAX_LEDGER_ID:
                raise LedgerOptionError(option, f"'{item}' is beyond the largest ledger id")
            ids.append(int(item))
        else:
            raise LedgerOptionError(
                option, f"'{item}' is neither a ledger id nor a range lo-hi (in {text!r}; or use 'all')"
            )
    return LedgerSelection(ids=tuple(dict.fromkeys(ids)), ranges=tuple(ranges))


def unknown_option(name: str, known: tuple[str, ...], *, pulsar_spark: tuple[str, ...] = ()) -> str:
    """The message for an unknown option ``name``: the known option it most likely misspells, and every one;
    ``pulsar_spark``, pulsar-spark's names the source takes too (``….*`` a prefix), are listed after them and
    may be the one it misspells."""
    by_lower = {k.lower(): k for k in (*known, *pulsar_spark) if not k.endswith("*")}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.75)
    hint = f"did you mean '{by_lower[close[0]]}'? " if close else ""
    also = f"; pulsar-spark's: {', '.join(pulsar_spark)}" if pulsar_spark else ""
    return f"unknown option; {hint}known options: {', '.join(known)}{also}"


def _int(opts: Mapping[str, str], name: str, default: int, minimum: int, maximum: int) -> int:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        v = int(str(raw).strip())
    except ValueError:
        raise LedgerOptionError(name, f"expected an integer, got {raw!r}") from None
    if not minimum <= v <= maximum:
        raise LedgerOptionError(name, f"must be between {minimum} and {maximum}, got {v}")
    return v


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    v = str(raw).strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise LedgerOptionError(name, f"expected true or false, got {raw!r}")


def client_config(opts: Any) -> Any:
    """The ledger client's configuration for a source's options (``LedgerOptions`` or the ``topic`` source's):
    metadata root, read timeout and credentials. The client leaves the process's heap alone: planning connects
    in the driver, a notebook's or an application's process whose objects (py4j proxies among them) must stay
    collectable; the Python workers freeze their own heap after their imports (``freeze_worker_heap``)."""
    from ledger_client import ClientConfig

    return ClientConfig(
        zk_root=opts.zk_root,
        read_timeout_s=opts.read_timeout_ms / 1000,
        auth_token=opts.auth_token,
        zk_auth=opts.zk_auth,
        freeze_heap=False,
    )


def _secret_file(opts: Mapping[str, str], name: str) -> str | None:
    """The contents of the file option ``name`` names (stripped), None when the option is not given."""
    raw = opts.get(name.lower())
    if raw is None:
        return None
    path = str(raw).strip()
    if not path:
        raise LedgerOptionError(name, "is empty; give the path of a file")
    try:
        text = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise LedgerOptionError(name, f"cannot read {path}: {e}") from None
    if not text:
        raise LedgerOptionError(name, f"{path} is empty")
    return text


def parse_credentials(opts: Mapping[str, str]) -> tuple[str | None, Any]:
    """(the token of ``authTokenFile``, the ``ZkAuth`` of ``zkAuthFile``); None for an option not given.
    ``opts``: lower-cased names."""
    from zk.acl import ZkAuth
    from zk.errors import MetadataAuthError

    token = _secret_file(opts, "authTokenFile")
    if token is not None and len(token.split()) != 1:
        raise LedgerOptionError(
            "authTokenFile", "the file must hold one token (ledgerstore auth create-token)"
        )
    zk_text = _secret_file(opts, "zkAuthFile")
    try:
        zk_auth = None if zk_text is None else ZkAuth.parse(zk_text, "the file")
    except MetadataAuthError as e:
        raise LedgerOptionError("zkAuthFile", f"{opts['zkauthfile']}: {e}") from None
    return token, zk_auth


def parse_ledger_options(options: Mapping[str, str]) -> LedgerOptions:
    """Check every option; raise :class:`LedgerOptionError` naming the first bad one."""
    opts = {str(k).lower(): v for k, v in options.items()}
    known = {k.lower(): k for k in KNOWN_OPTIONS}
    # Spark adds "path" when load(path) is given; we take no path.
    unknown = sorted(k for k in opts if k not in known and k != "path")
    if unknown:
        raise LedgerOptionError(unknown[0], unknown_option(unknown[0], KNOWN_OPTIONS))
    if "path" in opts:
        raise LedgerOptionError(
            "path", "the ledger source takes no path; select ledgers with option 'ledgers'"
        )
    zk = str(opts.get("zk") or os.environ.get("LEDGERSTORE_ZK") or DEFAULT_ZK).strip()
    for part in zk.split(","):
        if not _HOSTPORT.fullmatch(part.strip()):
            raise LedgerOptionError("zk", f"expected HOST:PORT[,HOST:PORT...], got {zk!r}")
    zk_root = str(opts.get("zkroot") or DEFAULT_ZK_ROOT).strip()
    if not zk_root.startswith("/") or zk_root.endswith("/") and zk_root != "/" or "//" in zk_root:
        raise LedgerOptionError(
            "zkRoot", f"expected an absolute znode path like /ledgerstore, got {zk_root!r}"
        )
    auth_token, zk_auth = parse_credentials(opts)
    return LedgerOptions(
        zk=zk,
        zk_root=zk_root,
        auth_token=auth_token,
        zk_auth=zk_auth,
        ledgers=parse_ledgers(str(opts.get("ledgers", "all"))),
        password=str(opts.get("password", "")).encode(),
        entries_per_partition=_int(opts, "entriesPerPartition", DEFAULT_ENTRIES_PER_PARTITION, 1, 1 << 40),
        max_records_per_batch=_int(opts, "maxRecordsPerBatch", DEFAULT_MAX_RECORDS_PER_BATCH, 1, 1 << 24),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        read_timeout_ms=_int(opts, "readTimeoutMs", DEFAULT_READ_TIMEOUT_MS, 1, 3_600_000),
    )
