"""AutoRecovery's configuration: one frozen dataclass with BookKeeper's names where it has them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_AUDIT_INTERVAL_S",
    "DEFAULT_GRACE_PERIOD_S",
    "DEFAULT_LOST_BOOKIE_RECOVERY_DELAY_S",
    "DEFAULT_THROTTLE_BYTES_PER_S",
    "AutoRecoveryConfig",
]

DEFAULT_LOST_BOOKIE_RECOVERY_DELAY_S = 0.0  # BookKeeper's lostBookieRecoveryDelay default
DEFAULT_AUDIT_INTERVAL_S = 604_800.0  # BookKeeper's auditorPeriodicCheckInterval: a week
DEFAULT_GRACE_PERIOD_S = 30.0  # BookKeeper's openLedgerRereplicationGracePeriod
DEFAULT_THROTTLE_BYTES_PER_S = 50 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class AutoRecoveryConfig:
    zk: str = "127.0.0.1:2181"
    zk_root: str = "/ledgerstore"
    #: Who this process is in locks and the election (default: ``autorecovery-<host>-<pid>``).
    owner: str = ""
    auditor: bool = True
    workers: int = 1
    lost_bookie_recovery_delay_s: float = DEFAULT_LOST_BOOKIE_RECOVERY_DELAY_S
    audit_interval_s: float = DEFAULT_AUDIT_INTERVAL_S
    #: The periodic check reads every entry of every live bookie's share (True) or the first and last (False).
    check_all_entries: bool = False
    open_ledger_rereplication_grace_period_s: float = DEFAULT_GRACE_PERIOD_S
    #: Bytes per second each worker copies at most (0: no limit).
    throttle_bytes_per_s: float = DEFAULT_THROTTLE_BYTES_PER_S
    #: Ledger passwords to try (the metadata holds only a salted digest; BookKeeper's AutoRecovery also needs it).
    passwords: tuple[bytes, ...] = (b"",)
    #: Rack-aware replacements: an ensemble spans this many racks when that many exist.
    min_racks: int = 2
    #: How often idle workers and the auditor look again without a ZooKeeper event.
    poll_interval_s: float = 1.0
    #: Port of the /metrics HTTP endpoint (None: none).
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    zk_session_timeout_s: float = 10.0
    #: The token sent to bookies (None: the client's own sources, ``$LEDGERSTORE_AUTH_TOKEN[_FILE]``).
    auth_token: str | None = None
