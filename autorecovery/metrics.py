"""AutoRecovery's counters and gauges: plain numbers its auditor and workers update, exported through
``prometheus_client`` at scrape time on its own ``/metrics`` (a standalone process, ``service.py``) or on its
bookie's (AutoRecovery inside a bookie, ``autorecovery/embedded.py``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from bookie.metrics import ServerMetrics

__all__ = ["ROWS", "Metrics"]

#: metric name, Prometheus type, attribute of Metrics, help
_TABLE = """
under_replicated_ledgers             gauge    under_replicated_ledgers    ledgers marked under-replicated
under_replicated_oldest_mark_seconds gauge    oldest_mark_age_s           seconds since the oldest mark was made (0 without marks)
rereplicated_entries_total           counter  rereplicated_entries_total  entries copied by this process
rereplicated_bytes_total             counter  rereplicated_bytes_total    bytes copied by this process
ledgers_rereplicated_total           counter  ledgers_rereplicated_total  ledgers this process re-replicated
ledgers_marked_total                 counter  ledgers_marked_total        marks this process made as auditor
autorecovery_audits_total            counter  audits_total                lost-bookie audits run
autorecovery_checks_total            counter  checks_total                entry checks run
autorecovery_is_auditor              gauge    is_auditor                  1 while this process is the elected auditor
"""

#: (metric name, Prometheus type, help, attribute of Metrics)
ROWS: tuple[tuple[str, str, str, str], ...] = tuple(
    (name, kind, help_text, attr)
    for name, kind, attr, help_text in (line.split(maxsplit=3) for line in _TABLE.strip().splitlines())
)


@dataclass
class Metrics:
    under_replicated_ledgers: int = 0
    oldest_mark_age_s: float = 0.0
    rereplicated_entries_total: int = 0
    rereplicated_bytes_total: int = 0
    ledgers_rereplicated_total: int = 0
    ledgers_marked_total: int = 0
    audits_total: int = 0
    checks_total: int = 0
    is_auditor: int = 0

    def value(self, attr: str) -> float:
        v = getattr(self, attr)
        return round(v, 3) if isinstance(v, float) else float(v)

    def register(self, metrics: ServerMetrics, help_prefix: str = "") -> None:
        """Export every row of the table through ``metrics`` (read at each scrape)."""
        for name, kind, help_text, attr in ROWS:
            add = metrics.counter if kind == "counter" else metrics.gauge
            add(name, help_prefix + help_text, functools.partial(self.value, attr))
