"""AutoRecovery: an elected auditor marks ledgers that lost replicas, workers copy the missing entries to other
bookies and swap them into the metadata (BookKeeper's ``replication`` package). Above the client in the layers:
CLI (``ledgerstore``) -> AutoRecovery -> ``ledger_client`` -> wire codec. ``ledgerstore autorecovery serve`` runs
:func:`run_autorecovery`; every bookie runs it too, in its own thread (``embedded.EmbeddedAutoRecovery``, a
companion ``ledgerstore bookie serve`` hands to the bookie). Operations: docs/operations.md, section AutoRecovery.
"""

from .config import AutoRecoveryConfig
from .decommission import DecommissionResult, decommission
from .metrics import Metrics
from .policy import Action, Decision, LostBookieTracker, decide, entries_to_check, ledgers_to_mark
from .service import run_autorecovery

__all__ = [
    "Action",
    "AutoRecoveryConfig",
    "Decision",
    "DecommissionResult",
    "LostBookieTracker",
    "Metrics",
    "decide",
    "decommission",
    "entries_to_check",
    "ledgers_to_mark",
    "run_autorecovery",
]
