"""``ledgerstore bookie gc``: ask registered bookies to collect garbage now, through their admin API."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from typing import Any

from ledgerstore.cli import CommandError, emit

MIB = 1024 * 1024


def admin_url(info: dict[str, Any], path: str) -> str:
    """The admin API URL of a bookie from its registration (``address`` host:port, ``http_port``)."""
    host = str(info["address"]).rpartition(":")[0]
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    return f"http://{host}:{info['http_port']}{path}"


def gc_line(bookie_id: str, result: dict[str, Any]) -> str:
    """One line of the human summary for a bookie's ``PUT /api/v1/gc`` answer (or its ``error``)."""
    if "error" in result:
        return f"{bookie_id}: failed: {result['error']}"
    done = result.get("blob_gc_pass")
    now = f"stored {result['stored_bytes'] / MIB:.1f} MiB, blob garbage {result['blob_garbage_bytes'] / MIB:.1f} MiB"
    if done is None:
        return f"{bookie_id}: no blob garbage pass ({now})"
    return (
        f"{bookie_id}: pass freed {done['reclaimed_bytes'] / MIB:.1f} MiB in {done['seconds']:.2f}s "
        f"(garbage before {done['garbage_bytes_before'] / MIB:.1f} MiB; now {now})"
    )


def trigger_gc(args: argparse.Namespace) -> int:
    from zk import BookieRegistry, MetadataStore

    store = MetadataStore.connect(args.zk, root=args.zk_root)
    try:
        bookies = BookieRegistry(store).all()
    finally:
        store.close()
    wanted = args.bookie_id or sorted(bookies)
    unknown = [b for b in wanted if b not in bookies]
    if unknown:
        raise CommandError(f"not registered (down, or another --zk-root?): {', '.join(unknown)}")
    if not wanted:
        raise CommandError("no bookies registered")
    results: dict[str, dict[str, Any]] = {}
    for bookie_id in wanted:
        req = urllib.request.Request(admin_url(bookies[bookie_id].info, "/api/v1/gc"), method="PUT")
        try:
            with urllib.request.urlopen(req, timeout=args.timeout_s) as r:
                results[bookie_id] = json.load(r)
        except (urllib.error.URLError, OSError, ValueError) as e:
            results[bookie_id] = {"error": str(e)}
    emit(args, lambda: "\n".join(gc_line(b, results[b]) for b in wanted), results)
    return 1 if any("error" in r for r in results.values()) else 0
