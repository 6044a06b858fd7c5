"""Reading a process's ``/metrics`` in tests: ``prometheus_client``'s parser reads the exposition, so text it
cannot parse fails the test, and every sample is found by its name and labels."""

from __future__ import annotations

import urllib.request

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def parse(text: str) -> dict[str, float]:
    """Every sample by ``name`` or ``name{label="value",...}``, its labels sorted by name (as
    ``prometheus_client`` writes them)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def scrape(url: str, timeout: float = 10.0) -> dict[str, float]:
    """GET ``url`` (a ``/metrics`` address), check it is Prometheus text, and :func:`parse` it."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        assert r.headers["Content-Type"] == CONTENT_TYPE_LATEST, r.headers["Content-Type"]
        return parse(r.read().decode())


def starting(samples: dict[str, float], name: str) -> list[float]:
    """The values of the samples named ``name`` (any labels)."""
    return [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
