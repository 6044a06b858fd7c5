"""``ledgerstore autorecovery serve|status|enable|disable|trigger-audit``, ``ledgerstore ledger underreplicated``,
``ledgerstore bookie decommission ID`` and ``ledgerstore bookie set-rack ID RACK`` (the ``autorecovery``
package, docs/operations.md "AutoRecovery")."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bookie.signals import add_stop_handlers
from ledgerstore.cli import (
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    CommandError,
    add_passwords_arguments,
    cluster_store,
    counted,
    emit,
    passwords_of,
    progress_disabled,
)

__all__ = [
    "add_autorecovery_commands",
    "add_autorecovery_settings",
    "autorecovery_config",
    "bookie_companions",
]

Common = Callable[[argparse.ArgumentParser], None]


def _subparsers(parser: argparse.ArgumentParser) -> Any:
    """The subcommand action of a parser that has one (argparse keeps no public handle on it)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise RuntimeError(f"{parser.prog} has no subcommands")


def add_autorecovery_commands(
    sub: Any, bookie_parser: argparse.ArgumentParser, ledger_parser: argparse.ArgumentParser, common: Common
) -> None:
    ap = sub.add_parser(
        "autorecovery", help="re-replicate lost bookies' data automatically (auditor + workers)"
    )
    asub = ap.add_subparsers(dest="action", required=True)
    serve = asub.add_parser(
        "serve", help="run an auditor candidate and replication workers in the foreground"
    )
    common(serve)
    add_autorecovery_settings(serve, in_bookie=False)
    add_passwords_arguments(serve, "a ledger password to try")
    serve.add_argument(
        "--metrics-port", type=int, default=None, help="serve /metrics and /health on this port"
    )
    serve.add_argument("--metrics-host", default="127.0.0.1", help="bind address of /metrics and /health")
    from bookie.config_file import enable as enable_config_file

    enable_config_file(
        serve, what="AutoRecovery process"
    )  # --config FILE, LEDGERSTORE_<SETTING>; after the last flag
    serve.set_defaults(func=_serve)
    for name, fn, text in (
        ("status", _status, "the auditor, marks, locks and bookies being decommissioned"),
        ("enable", _enable, "let the auditor and workers run"),
        ("disable", _disable, "pause the auditor and workers (marks stay)"),
        ("trigger-audit", _trigger, "ask the auditor to run its check now"),
    ):
        a = asub.add_parser(name, help=text)
        common(a)
        a.set_defaults(func=fn)

    lsub = _subparsers(ledger_parser)
    ur = lsub.add_parser("underreplicated", help="list ledgers marked under-replicated")
    common(ur)
    ur.set_defaults(func=_underreplicated)

    bsub = _subparsers(bookie_parser)
    dec = bsub.add_parser(
        "decommission",
        help="move a live bookie's data to other bookies (reading from it too), then delete its cookie",
    )
    common(dec)
    dec.add_argument("bookie", help="the bookie's id (HOST:PORT)")
    add_passwords_arguments(dec, "a ledger password to try")
    dec.add_argument("--timeout-s", type=float, default=3600.0, help="give up waiting after this long")
    dec.add_argument("--throttle-mb", type=float, default=0.0, help="MiB/s copied at most (0: no limit)")
    dec.add_argument(
        "--settle-s",
        type=float,
        default=None,
        help="the pass that ends it runs at least this long after the bookie was marked, so a ledger placed on "
        "a view older than the mark is drained too (default: 30, twice a client's ZooKeeper request timeout)",
    )
    dec.add_argument(
        "--cancel",
        action="store_true",
        help="end a decommission that will not finish (its command died or was stopped; stop it first if it "
        "runs): the bookie's decommissioning mark and its drain marks go, and placement may choose it again",
    )
    dec.set_defaults(func=_decommission)
    sr = bsub.add_parser("set-rack", help="put a bookie in a rack (/region/rack) for rack-aware placement")
    common(sr)
    sr.add_argument("bookie", help="the bookie's id (HOST:PORT)")
    sr.add_argument("rack", help="/region/rack")
    sr.set_defaults(func=_set_rack)
    rk = bsub.add_parser("racks", help="every registered or racked bookie with its rack")
    common(rk)
    rk.set_defaults(func=_racks)


def add_autorecovery_settings(p: argparse.ArgumentParser, *, in_bookie: bool) -> None:
    """AutoRecovery's settings, for ``autorecovery serve`` and (``in_bookie``) for ``bookie serve``, where the
    flags a bookie could mistake for its own carry an ``autorecovery-`` prefix and ``--no-autorecovery`` turns
    it off. In a bookie they are settings too: ``LEDGERSTORE_<NAME>`` and ``--config`` keys."""
    from autorecovery.config import (
        DEFAULT_AUDIT_INTERVAL_S,
        DEFAULT_GRACE_PERIOD_S,
        DEFAULT_LOST_BOOKIE_RECOVERY_DELAY_S,
        DEFAULT_THROTTLE_BYTES_PER_S,
    )

    own = "--autorecovery-" if in_bookie else "--"
    if in_bookie:
        p.add_argument(
            "--no-autorecovery",
            dest="autorecovery",
            action="store_false",
            help="run no AutoRecovery (auditor candidate and replication worker) in this bookie; by default it "
            "does, as BookKeeper's autoRecoveryDaemonEnabled",
        )
    p.add_argument(
        "--lost-bookie-recovery-delay-s",
        type=float,
        default=DEFAULT_LOST_BOOKIE_RECOVERY_DELAY_S,
        help="a bookie gone this long is lost and its ledgers marked (one back sooner: nothing is copied)",
    )
    p.add_argument(
        "--audit-interval-s",
        type=float,
        default=DEFAULT_AUDIT_INTERVAL_S,
        help="how often the auditor checks that live bookies hold their entries (default: a week)",
    )
    p.add_argument(
        "--check-all-entries", action="store_true", help="the check reads every entry, not first and last"
    )
    p.add_argument(
        "--open-ledger-grace-period-s",
        type=float,
        default=DEFAULT_GRACE_PERIOD_S,
        help="an open ledger still naming a lost bookie in its last ensemble after this is fenced and closed",
    )
    p.add_argument(
        f"{own}throttle-mb",
        type=float,
        default=DEFAULT_THROTTLE_BYTES_PER_S / 2**20,
        help="MiB/s each worker copies at most (0: no limit)",
    )
    p.add_argument(f"{own}workers", type=int, default=1, help="ledgers re-replicated at once")
    p.add_argument("--no-auditor", action="store_true", help="workers only: never take the auditor role")
    p.add_argument(
        "--min-racks", type=int, default=2, help="racks a ledger's ensemble should span (placement policy)"
    )
    p.add_argument(
        f"{own}zk-session-timeout-s",
        type=float,
        default=10.0,
        help="ZooKeeper session timeout of AutoRecovery: how soon another takes over its auditor role and locks",
    )
    p.add_argument(
        f"{own}poll-interval-s",
        type=float,
        default=1.0,
        help="seconds between looks for under-replicated ledgers",
    )
    if in_bookie:
        p.add_argument(
            "--autorecovery-password",
            action="append",
            default=None,
            help="a ledger password AutoRecovery may open ledgers with (repeatable; the empty one always too; "
            "prefer --autorecovery-password-file: a flag shows in `ps`)",
        )
        p.add_argument(
            "--autorecovery-password-file",
            type=Path,
            action="append",
            default=None,
            metavar="FILE",
            help="more such passwords, one a line (repeatable)",
        )


def autorecovery_config(args: argparse.Namespace, *, in_bookie: bool) -> Any:
    """The AutoRecoveryConfig of a parsed ``autorecovery serve`` or (``in_bookie``) ``bookie serve``."""
    from autorecovery import AutoRecoveryConfig

    def own(name: str) -> Any:
        return getattr(args, f"autorecovery_{name}" if in_bookie else name)

    if in_bookie:
        found = list(args.autorecovery_password or [])
        for path in args.autorecovery_password_file or []:
            found += [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line]
        # the empty one always, last (the brokers' ledgers'), as passwords_of does
        passwords = tuple(dict.fromkeys([*(pw.encode() for pw in found if pw), b""]))
    else:
        passwords = _passwords(args)
    return AutoRecoveryConfig(
        zk=args.zk,
        zk_root=args.zk_root,
        auditor=not args.no_auditor,
        workers=own("workers"),
        lost_bookie_recovery_delay_s=args.lost_bookie_recovery_delay_s,
        audit_interval_s=args.audit_interval_s,
        check_all_entries=args.check_all_entries,
        open_ledger_rereplication_grace_period_s=args.open_ledger_grace_period_s,
        throttle_bytes_per_s=own("throttle_mb") * 2**20,
        passwords=passwords,
        min_racks=args.min_racks,
        metrics_port=None if in_bookie else args.metrics_port,
        metrics_host="127.0.0.1" if in_bookie else args.metrics_host,
        zk_session_timeout_s=own("zk_session_timeout_s"),
        poll_interval_s=own("poll_interval_s"),
    )


def bookie_companions(args: argparse.Namespace) -> list[Any]:
    """What ``bookie serve`` runs beside the bookie (``bookie.main.serve``'s companions): AutoRecovery unless
    ``--no-autorecovery``."""
    if not args.autorecovery:
        return []
    from autorecovery.embedded import EmbeddedAutoRecovery

    return [EmbeddedAutoRecovery(autorecovery_config(args, in_bookie=True))]


# --- helpers ----------------------------------------------------------------------------------------------------


def _store(args: argparse.Namespace) -> Any:
    return cluster_store(args)  # (a mistyped --zk-root refused)


def _passwords(args: argparse.Namespace) -> tuple[bytes, ...]:
    return tuple(p.encode() for p in passwords_of(args))


# --- verbs ------------------------------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    from autorecovery import run_autorecovery
    from bookie.config_file import ConfigError, resolve
    from bookie.main import install_uvloop
    from zk.cookies import NoClusterError

    if not args.verbose:
        logging.getLogger().setLevel(logging.INFO)
    try:  # flags > LEDGERSTORE_<SETTING> > --config FILE > defaults, as bookie serve and broker serve
        resolve(args)
    except ConfigError as e:
        raise CommandError(f"autorecovery serve: {e}", EXIT_USAGE) from e
    config = autorecovery_config(args, in_bookie=False)
    install_uvloop()

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        add_stop_handlers(loop, stop.set, "autorecovery")
        await run_autorecovery(config, stop)

    try:
        asyncio.run(go())
    except NoClusterError as e:
        raise CommandError(
            f"autorecovery serve refusing to start: {e}: check --zk-root", EXIT_NOT_FOUND
        ) from None
    return 0


def _status(args: argparse.Namespace) -> int:
    from zk import layout
    from zk.underreplication import UnderReplicationManager

    store = _store(args)
    try:
        m = UnderReplicationManager(store)
        marks = m.list()
        data: dict[str, Any] = {
            "enabled": m.enabled(),
            "auditor": m.auditor(),
            "candidates": len(m.candidates()),
            "under_replicated_ledgers": len(marks),
            "oldest_mark_age_s": round(time.time() - min(v.value.ctime_ms for v in marks.values()) / 1000, 1)
            if marks
            else None,
            "locks": {str(k): v for k, v in sorted(m.locks().items())},
            "decommissioning": sorted(m.decommissioning()),
        }
        data["decommission_state"] = _decommission_states(store, data["decommissioning"])
        data["cluster"] = store.exists(layout.INSTANCEID)  # (a root no bookie has started in: a typo, likely)
    finally:
        store.close()

    def human() -> str:
        lines = [
            f"autorecovery: {'enabled' if data['enabled'] else 'DISABLED'}; auditor: {data['auditor'] or 'none'} "
            f"({data['candidates']} candidates)",
            f"under-replicated ledgers: {data['under_replicated_ledgers']}"
            + (f" (oldest marked {data['oldest_mark_age_s']}s ago)" if marks else ""),
        ]
        lines += [f"  ledger {k} locked by {v}" for k, v in data["locks"].items()]
        if data["decommissioning"]:
            lines.append("decommissioning:")
            lines += [f"  {b}  {data['decommission_state'][b]}" for b in data["decommissioning"]]
        if not data["cluster"]:
            lines.append(
                f"no cluster under {args.zk_root} at {args.zk} (no bookie has started there): is that the cluster "
                "(--zk, --zk-root)?"
            )
        return "\n".join(lines)

    emit(args, human, data)
    return 0


def _decommission_states(store: Any, bookies: list[str]) -> dict[str, str]:
    """What each decommissioning mark means now: the mark outlives a finished decommission (it keeps placement off
    the id until a bookie registers under it anew), so say which are finished (cookie deleted) and which not."""
    from zk import BookieRegistry, read_zk_cookie

    registered = BookieRegistry(store).all()
    states = {}
    for b in bookies:
        if read_zk_cookie(store, b) is not None:
            states[b] = "in progress, or unfinished (`bookie decommission ID` again, or --cancel)"
        elif b in registered:
            states[b] = "done: its data moved, cookie deleted; stop the bookie"
        else:
            states[b] = "done (stopped): its data moved, cookie deleted"
    return states


def _enable(args: argparse.Namespace) -> int:
    return _set_enabled(args, True)


def _disable(args: argparse.Namespace) -> int:
    return _set_enabled(args, False)


def _set_enabled(args: argparse.Namespace, enabled: bool) -> int:
    from zk.underreplication import UnderReplicationManager

    store = _store(args)
    try:
        UnderReplicationManager(store).set_enabled(enabled)
    finally:
        store.close()
    emit(args, f"autorecovery {'enabled' if enabled else 'disabled'}", {"enabled": enabled})
    return 0


def _trigger(args: argparse.Namespace) -> int:
    from zk.underreplication import UnderReplicationManager

    store = _store(args)
    try:
        m = UnderReplicationManager(store)
        m.request_audit()
        auditor = m.auditor()
    finally:
        store.close()
    emit(
        args,
        f"audit requested; auditor: {auditor or 'none running (it runs when one is elected)'}",
        {"requested": True, "auditor": auditor},
    )
    return 0


def _underreplicated(args: argparse.Namespace) -> int:
    from zk.underreplication import UnderReplicationManager

    store = _store(args)
    try:
        m = UnderReplicationManager(store)
        marks = m.list()
        locks = m.locks()
    finally:
        store.close()
    now = time.time()
    rows = [
        {
            **v.value.to_json(),
            "age_s": round(now - v.value.ctime_ms / 1000, 1),
            "locked_by": locks.get(lid),
        }
        for lid, v in sorted(marks.items())
    ]

    def human() -> str:
        if not rows:
            return "no under-replicated ledgers"
        return "\n".join(
            f"ledger {r['ledger_id']}: missing {', '.join(r['missing']) or '-'}"
            + (f"; draining {', '.join(r['drain'])}" if r["drain"] else "")
            + f"; marked {r['count']}x, first {r['age_s']}s ago"
            + (f"; locked by {r['locked_by']}" if r["locked_by"] else "")
            for r in rows
        )

    emit(args, human, {"ledgers": rows})
    return 0


def _decommission(args: argparse.Namespace) -> int:
    if args.cancel:
        return _cancel_decommission(args)
    from tqdm import tqdm

    from autorecovery import AutoRecoveryConfig, decommission
    from autorecovery.decommission import DEFAULT_SETTLE_S
    from ledger_client import BookKeeper, ClientConfig
    from ledgerstore.bookie_admin import known_bookie_ids
    from zk import BookieRegistry, read_zk_cookie
    from zk.underreplication import UnderReplicationManager

    store = _store(args)
    try:
        running = args.bookie in BookieRegistry(store).all()
        # still marked decommissioning (one that ended while the bookie ran, which has since been stopped): run
        # again, it ends at once and its mark goes
        known = (
            running
            or read_zk_cookie(store, args.bookie) is not None
            or args.bookie in UnderReplicationManager(store).decommissioning()
        )
    finally:
        store.close()
    if not known:  # a typo: named with the ids there are, as `bookie recover` does
        raise CommandError(
            f"no bookie {args.bookie}: not registered, no cookie (check the id; known bookies: "
            f"{', '.join(sorted(known_bookie_ids(args))) or 'none'})",
            EXIT_NOT_FOUND,
        )
    config = AutoRecoveryConfig(
        zk=args.zk,
        zk_root=args.zk_root,
        passwords=_passwords(args),
        throttle_bytes_per_s=args.throttle_mb * 2**20,
        poll_interval_s=0.5,
    )
    bar = tqdm(
        desc=f"decommissioning {args.bookie}",
        unit="ledger",
        total=0,
        file=sys.stderr,
        disable=progress_disabled(args),
        leave=False,
    )

    settle_s = DEFAULT_SETTLE_S if args.settle_s is None else args.settle_s

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        # all moved: the last pass runs --settle-s after the mark (a ledger placed just before it), say so
        bar.set_postfix_str(
            f"then a last pass {settle_s:g}s after the mark" if done == total else "", refresh=False
        )
        bar.refresh()

    async def go() -> Any:
        bk = await BookKeeper.connect(args.zk, config=ClientConfig(zk_root=args.zk_root))
        try:
            return await decommission(
                bk,
                args.bookie,
                config,
                timeout_s=args.timeout_s,
                on_progress=progress,
                settle_s=settle_s,
            )
        finally:
            await bk.close()

    try:
        result = asyncio.run(go())
    finally:
        bar.close()

    def human() -> str:
        head = (
            f"bookie {args.bookie}: "
            + ("decommissioned" if result.complete else "NOT decommissioned (timed out)")
            + f" in {result.seconds:.1f}s: {counted(len(result.ledgers_moved), 'ledger')} moved, "
            f"{counted(result.entries_copied, 'entry', 'entries')} ({result.bytes_copied / 2**20:.1f} MiB) copied"
            + (
                f"; cookie deleted ({'stop the bookie now' if running else 'it was not running'})"
                if result.cookie_deleted
                else ""
            )
        )
        return "\n".join(
            [head, *(f"  ledger {lid}: still names it: {why}" for lid, why in sorted(result.waiting.items()))]
        )

    emit(args, human, dataclasses.asdict(result))
    return 0 if result.complete else 1


def _cancel_decommission(args: argparse.Namespace) -> int:
    from zk.underreplication import UnderReplicationManager

    store = _store(args)
    try:
        was, ledgers = UnderReplicationManager(store).cancel_decommission(args.bookie)
    finally:
        store.close()
    if not was and not ledgers:
        raise CommandError(f"no decommission of bookie {args.bookie} to cancel", EXIT_NOT_FOUND)
    emit(
        args,
        f"decommission of bookie {args.bookie} cancelled: "
        + ("its decommissioning mark removed" if was else "it had no decommissioning mark")
        + f"; {counted(len(ledgers), 'ledger')} no longer drain"
        + ("s" if len(ledgers) == 1 else "")
        + " it"
        + (
            f" ({', '.join(map(str, ledgers[:20]))}{', ...' if len(ledgers) > 20 else ''})" if ledgers else ""
        ),
        {"bookie": args.bookie, "cancelled": True, "was_decommissioning": was, "ledgers": ledgers},
    )
    return 0


def _set_rack(args: argparse.Namespace) -> int:
    from zk import racks

    try:
        racks.check_rack(args.rack)
    except ValueError as e:
        raise CommandError(str(e)) from None
    store = _store(args)
    try:
        racks.set_rack(store, args.bookie, args.rack)
    finally:
        store.close()
    emit(args, f"bookie {args.bookie}: rack {args.rack}", {"bookie": args.bookie, "rack": args.rack})
    return 0


def _racks(args: argparse.Namespace) -> int:
    from zk import BookieRegistry, racks

    store = _store(args)
    try:
        mapping = racks.racks(store)
        registered = BookieRegistry(store).all()
    finally:
        store.close()
    rows = {b: mapping.get(b, racks.DEFAULT_RACK) for b in sorted(set(mapping) | set(registered))}
    emit(args, lambda: "\n".join(f"{b}  {r}" for b, r in rows.items()) or "no bookies", rows)
    return 0
