"""``ledgerstore bookie gc`` (ask registered bookies to collect garbage now, through their admin API) and
``ledgerstore bookie recover`` (re-replicate a lost bookie's entries: ``ledger_client.rereplicator``)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import urllib.error
import urllib.request
from typing import Any

from ledgerstore.cli import (
    EXIT_NOT_FOUND,
    CommandError,
    cluster_store,
    counted,
    emit,
    password_of,
    progress_disabled,
)

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


def registered_bookies(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The registrations (``info``) of the bookies ``--bookie-id`` names, or of every registered one;
    CommandError when one named is not registered or none is."""
    from zk import BookieRegistry

    store = cluster_store(args)
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
    return {b: bookies[b].info for b in wanted}


def trigger_gc(args: argparse.Namespace) -> int:
    bookies = registered_bookies(args)
    wanted = list(bookies)
    from ledger_client.client import ClientConfig, resolve_auth_token

    token = resolve_auth_token(ClientConfig())
    results: dict[str, dict[str, Any]] = {}
    for bookie_id in wanted:
        req = urllib.request.Request(admin_url(bookies[bookie_id], "/api/v1/gc"), method="PUT")
        if token:  # a bookie with a secret needs one for PUT (docs/operations.md, "Authentication")
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=args.timeout_s) as r:
                results[bookie_id] = json.load(r)
        except (urllib.error.URLError, OSError, ValueError) as e:
            results[bookie_id] = {"error": str(e)}
    emit(args, lambda: "\n".join(gc_line(b, results[b]) for b in wanted), results)
    return 1 if any("error" in r for r in results.values()) else 0


def recover_line(r: Any) -> str:
    """One line of ``bookie recover``'s summary for a ``LedgerRereplication``."""
    if r.status in ("done", "planned"):
        to = ", ".join(f"ensemble {k} -> {b}" for k, b in sorted(r.replacements.items()))
        verb = "copied" if r.status == "done" else "to copy"
        return f"  ledger {r.ledger_id}: {counted(r.entries_copied, 'entry', 'entries')} {verb}; {to}"
    if r.status == "open":
        return (
            f"  ledger {r.ledger_id}: not closed, left to its writer (or close it: ledgerstore ledger recover "
            f"{r.ledger_id})"
        )
    return f"  ledger {r.ledger_id}: {r.status}: {r.error} (metadata unchanged)"


def known_bookie_ids(args: argparse.Namespace) -> set[str]:
    """Every bookie id the cluster knows of: registered (writable or read-only), with a cookie, or being
    decommissioned."""
    from zk import BookieRegistry, layout
    from zk.underreplication import UnderReplicationManager

    store = cluster_store(args)
    try:
        return (
            set(BookieRegistry(store).all())
            | set(store.children_many([layout.COOKIES])[layout.COOKIES] or ())
            | UnderReplicationManager(store).decommissioning()
        )
    finally:
        store.close()


def check_bookie_known(args: argparse.Namespace, bookie_id: str) -> None:
    """CommandError (exit 4, NOT_FOUND) naming the known bookies when ``bookie_id`` is in no ledger's ensemble
    and the cluster does not know it either (a typo: "0 ledgers re-replicated" would read as done)."""
    known = known_bookie_ids(args)
    if bookie_id not in known:
        raise CommandError(
            f"no bookie {bookie_id}: not registered, no cookie, in no ledger's ensemble (check the id; known "
            f"bookies: {', '.join(sorted(known)) or 'none'})",
            EXIT_NOT_FOUND,
        )


def recover_bookie(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from bookie.main import install_uvloop
    from ledger_client import BookKeeper, ClientConfig
    from ledger_client.rereplicator import rereplicate_bookie

    install_uvloop()

    async def go() -> list[Any]:
        bk = await BookKeeper.connect(args.zk, config=ClientConfig(zk_root=args.zk_root))
        try:
            with tqdm(
                desc="re-replicating",
                unit="entry",
                disable=progress_disabled(args),
                file=sys.stderr,
                leave=False,
            ) as bar:
                return await rereplicate_bookie(
                    bk, args.bookie, password_of(args).encode(), bar.update, dry_run=args.dry_run
                )
        finally:
            await bk.close()

    results = asyncio.run(go())
    if not results:
        check_bookie_known(args, args.bookie)
    done = [r for r in results if r.status in ("done", "planned")]
    bad = [r for r in results if r.status not in ("done", "planned", "open")]
    head = (
        f"bookie {args.bookie}: {counted(len(done), 'ledger')} "
        f"{'to re-replicate' if args.dry_run else 're-replicated'} "
        f"({counted(sum(r.entries_copied for r in done), 'entry', 'entries')} "
        f"{'to copy' if args.dry_run else 'copied'}), "
        f"{sum(r.status == 'open' for r in results)} not closed, {len(bad)} not re-replicated"
        + (" (dry run: nothing copied, metadata unchanged)" if args.dry_run else "")
    )
    emit(
        args,
        lambda: "\n".join([head, *(recover_line(r) for r in results)]),
        {"bookie": args.bookie, "ledgers": [dataclasses.asdict(r) for r in results]},
    )
    return 1 if bad else 0
