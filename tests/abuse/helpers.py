"""Helpers of the abuse tier: a bookie process's RSS, its (or a broker's) admin HTTP and metrics."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from ledgerstore.cluster import BookieProcess, BrokerProcess
from tests.metrics_testing import parse


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def http(
    bp: BookieProcess | BrokerProcess, method: str, path: str, timeout_s: float = 30.0
) -> tuple[int, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{bp.http_port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            body = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        body, status = e.read(), e.code
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")


def metric(bp: BookieProcess, name: str) -> float:
    _, text = http(bp, "GET", "/metrics")
    return parse(str(text))[name]


def ledger_ids(bp: BookieProcess) -> set[int]:
    _, body = http(bp, "GET", "/api/v1/ledgers")
    return {row["ledger_id"] for row in body["ledgers"]}
