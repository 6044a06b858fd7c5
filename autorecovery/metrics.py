"""AutoRecovery's counters and gauges, rendered in Prometheus' text format on ``/metrics``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Metrics"]


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

    def render(self) -> str:
        rows = [
            (
                "under_replicated_ledgers",
                "gauge",
                "ledgers marked under-replicated",
                self.under_replicated_ledgers,
            ),
            (
                "under_replicated_oldest_mark_seconds",
                "gauge",
                "seconds since the oldest mark was made (0 without marks)",
                round(self.oldest_mark_age_s, 3),
            ),
            (
                "rereplicated_entries_total",
                "counter",
                "entries copied by this process",
                self.rereplicated_entries_total,
            ),
            (
                "rereplicated_bytes_total",
                "counter",
                "bytes copied by this process",
                self.rereplicated_bytes_total,
            ),
            (
                "ledgers_rereplicated_total",
                "counter",
                "ledgers this process re-replicated",
                self.ledgers_rereplicated_total,
            ),
            (
                "ledgers_marked_total",
                "counter",
                "marks this process made as auditor",
                self.ledgers_marked_total,
            ),
            ("autorecovery_audits_total", "counter", "lost-bookie audits run", self.audits_total),
            ("autorecovery_checks_total", "counter", "entry checks run", self.checks_total),
            (
                "autorecovery_is_auditor",
                "gauge",
                "1 while this process is the elected auditor",
                self.is_auditor,
            ),
        ]
        out = []
        for name, kind, help_text, value in rows:
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(out) + "\n"
