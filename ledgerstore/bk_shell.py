"""BookKeeper shell verbs with the same meanings: ``cluster info``, ``bookie lastmark``, ``bookie sanity``
(``bookiesanity``), ``bookie updatecookie`` and ``bookie recover --ledger ID`` (``recover -l``)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledgerstore.cli import CommandError, cluster_store, emit, password_of

Common = Callable[[argparse.ArgumentParser], None]
MARK = re.compile(r"Journal Id - (\d+)\(([0-9a-f]+\.jnl)\), Pos - (\d+)")


def add_bookkeeper_verbs(bookie: Any, cluster: Any, common: Common) -> None:
    """Add the verbs to the ``bookie`` and ``cluster`` subcommand groups (argparse sub-parser actions)."""
    info = cluster.add_parser(
        "info",
        help="the cluster as ZooKeeper records it: instance id, bookies writable / read-only / down with a cookie, "
        "ledgers, brokers",
    )
    common(info)
    info.set_defaults(func=cluster_info)

    mark = bookie.add_parser(
        "lastmark", help="each bookie's journal checkpoint mark (GET /api/v1/bookie/last_log_mark)"
    )
    common(mark)
    mark.add_argument("--bookie-id", action="append", default=None, help="only this bookie (repeatable)")
    mark.set_defaults(func=lastmark)

    ro = bookie.add_parser(
        "readonly",
        help="make a bookie read-only (it serves reads, refuses adds, new ledgers leave it out) or, with "
        "--off, writable again (PUT /api/v1/bookie/state/readonly); until restarted",
    )
    common(ro)
    ro.add_argument("bookie_id", metavar="BOOKIE", help="the bookie's id (HOST:PORT), registered")
    ro.add_argument("--off", action="store_true", help="writable again")
    ro.set_defaults(func=bookie_readonly)

    sanity = bookie.add_parser(
        "sanity",
        help="BookKeeper's bookiesanity: on each bookie alone (E=Qw=Qa=1) create a ledger, write, read back "
        "and verify entries, delete it",
    )
    common(sanity)
    sanity.add_argument("--bookie-id", action="append", default=None, help="only this bookie (repeatable)")
    sanity.add_argument("-n", "--entries", type=int, default=10, help="entries to write (default 10)")
    sanity.set_defaults(func=bookie_sanity)

    cookie = bookie.add_parser(
        "updatecookie",
        help="give a stopped bookie's data a new bookie id (after an address change), or record the directories "
        "its data was moved to (same id): rewrite its cookie in ZooKeeper and in its directories; --dry-run first",
    )
    common(cookie)
    cookie.add_argument("--bookie-id", required=True, help="the new id (HOST:PORT), or its own")
    cookie.add_argument(
        "--data-dir", type=Path, required=True, help="the bookie's data directory (where it is now)"
    )
    cookie.add_argument("--journal-dir", type=Path, default=None, help="if not DATA_DIR/journal")
    cookie.add_argument("--dry-run", action="store_true", help="say what would change; change nothing")
    cookie.add_argument(
        "--update-ledgers",
        action="store_true",
        help="also rename the bookie in every CLOSED ledger's ensembles (BookKeeper's updateledgers)",
    )
    cookie.set_defaults(func=update_cookie)

    # BookKeeper's `recover -l LEDGER BOOKIE`: one ledger only
    recover = bookie.choices["recover"]
    recover.add_argument(
        "-l", "--ledger", type=int, default=None, help="re-replicate only this ledger's share of the bookie"
    )
    whole = recover.get_default("func")
    recover.set_defaults(
        func=lambda args: recover_ledger(args) if args.ledger is not None else _call(whole, args)
    )


def _call(fn: Any, args: argparse.Namespace) -> int:
    if fn is None:
        from ledgerstore.bookie_admin import recover_bookie

        return recover_bookie(args)
    return int(fn(args) or 0)


def _store(args: argparse.Namespace) -> Any:
    return cluster_store(args)  # (a mistyped --zk-root refused)


# ------------------------------------------------------------------------------------------------ cluster info
def cluster_info(args: argparse.Namespace) -> int:
    from zk import BookieRegistry, LedgerMetadataStore, cookies, layout
    from zk.errors import MetadataNotFoundError

    store = _store(args)
    try:
        try:
            instance = cookies.instance_id(store, create=False)
        except MetadataNotFoundError:
            instance = None
        registry = BookieRegistry(store)
        writable, readonly = sorted(registry.available()), sorted(registry.readonly())
        try:
            with_cookie = sorted(store.children(layout.COOKIES))
        except MetadataNotFoundError:
            with_cookie = []
        try:
            brokers = sorted(store.children(layout.BROKERS))
        except MetadataNotFoundError:
            brokers = []
        ledgers = len(list(LedgerMetadataStore(store).list()))
    finally:
        store.close()
    down = [b for b in with_cookie if b not in writable and b not in readonly]
    data = {
        "instance_id": instance,
        "bookies": {"writable": writable, "readonly": readonly, "down": down},
        "ledgers": ledgers,
        "brokers": brokers,
    }
    human = [
        f"instance id: {instance or '(none: no bookie has started)'}",
        f"bookies: {len(writable)} writable, {len(readonly)} read-only, {len(down)} down (cookie, not registered)",
        *(f"  {b}  writable" for b in writable),
        *(f"  {b}  read-only" for b in readonly),
        *(f"  {b}  DOWN" for b in down),
        f"ledgers: {ledgers}",
        f"brokers: {len(brokers)}" + (f" ({', '.join(brokers)})" if brokers else ""),
    ]
    emit(args, "\n".join(human), data)
    return 0


# ------------------------------------------------------------------------------------------------ lastmark
def lastmark(args: argparse.Namespace) -> int:
    from ledger_client.client import ClientConfig, resolve_auth_token
    from ledgerstore.bookie_admin import admin_url, registered_bookies

    token = resolve_auth_token(ClientConfig())
    results: dict[str, Any] = {}
    for bookie_id, info in registered_bookies(args).items():
        req = urllib.request.Request(admin_url(info, "/api/v1/bookie/last_log_mark"))
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                marks = json.load(r)
        except (urllib.error.URLError, OSError, ValueError) as e:
            results[bookie_id] = {"error": str(e)}
            continue
        for journal_dir, text in marks.items():
            m = MARK.search(text)
            results[bookie_id] = {
                "journal_dir": journal_dir,
                "mark": text,
                "segment": int(m.group(1)) if m else None,
                "file": m.group(2) if m else None,
                "offset": int(m.group(3)) if m else None,
            }

    def line(b: str, r: dict[str, Any]) -> str:
        if "error" in r:
            return f"{b}: failed: {r['error']}"
        return f"{b}: {r['journal_dir']}/{r['file']} offset {r['offset']} (segment {r['segment']})"

    emit(args, lambda: "\n".join(line(b, r) for b, r in results.items()), results)
    return 1 if any("error" in r for r in results.values()) else 0


# ------------------------------------------------------------------------------------------------ readonly
def bookie_readonly(args: argparse.Namespace) -> int:
    from ledger_client.client import ClientConfig, resolve_auth_token
    from ledgerstore.bookie_admin import admin_url, registered_bookies
    from ledgerstore.cli import EXIT_UNAVAILABLE, exit_status_for_http

    info = registered_bookies(argparse.Namespace(**{**vars(args), "bookie_id": [args.bookie_id]}))
    req = urllib.request.Request(
        admin_url(info[args.bookie_id], "/api/v1/bookie/state/readonly"),
        data=json.dumps({"readOnly": not args.off}).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    token = resolve_auth_token(ClientConfig())
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            answer = json.load(r)
    except urllib.error.HTTPError as e:
        try:
            why = json.load(e).get("error", e.reason)
        except ValueError:
            why = e.reason
        raise CommandError(f"bookie {args.bookie_id}: {why}", exit_status_for_http(e.code)) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise CommandError(
            f"bookie {args.bookie_id}: admin HTTP unreachable ({e})", EXIT_UNAVAILABLE
        ) from None
    state = "read-only" if answer.get("readOnly") else "writable"
    emit(args, f"bookie {args.bookie_id}: {state}", {"bookie": args.bookie_id, **answer})
    return 0


# ------------------------------------------------------------------------------------------------ sanity
def bookie_sanity(args: argparse.Namespace) -> int:
    from bookie.main import install_uvloop
    from ledger_client import BookKeeper, ClientConfig

    if args.entries < 1:
        raise CommandError("--entries must be at least 1", code=2)
    install_uvloop()

    async def one(bk: Any, bookie_id: str) -> dict[str, Any]:
        payloads = [f"bookiesanity {bookie_id} {i}".encode() for i in range(args.entries)]
        t0 = time.perf_counter()
        lh = await bk.create_ledger(1, 1, 1, bookies=[bookie_id])
        lid = lh.ledger_id
        try:
            await asyncio.wait_for(asyncio.gather(*[await lh.append_future(p) for p in payloads]), 30)
            await lh.close()
            ensembles = [list(e.bookies) for e in lh.metadata.ensembles]
            if ensembles != [[bookie_id]]:
                raise RuntimeError(
                    f"the writes moved to other bookies (ensembles {ensembles}): {bookie_id} refused them"
                )
            rh = await bk.open_ledger(lid, recovery=False)
            got = [e.data async for e in rh.read(0, args.entries - 1)]
            if got != payloads:
                raise RuntimeError(
                    f"read back {len(got)} entries that differ from the {len(payloads)} written"
                )
        finally:
            try:
                await bk.delete_ledger(lid)
            except Exception as e:  # reported; the ledger's metadata stays for `ledger delete`
                return {"ok": False, "ledger_id": lid, "error": f"delete failed: {e}"}
        return {
            "ok": True,
            "ledger_id": lid,
            "entries": args.entries,
            "seconds": round(time.perf_counter() - t0, 3),
        }

    async def go() -> dict[str, Any]:
        bk = await BookKeeper.connect(args.zk, config=ClientConfig(zk_root=args.zk_root))
        try:
            writable = await bk.writable_bookies()
            targets = args.bookie_id or writable
            if not targets:
                raise CommandError("no writable bookies")
            out: dict[str, Any] = {}
            for b in targets:
                if b not in writable:  # else its ledger would move to another bookie and "fail" misleadingly
                    readonly = b in await bk.readonly_bookies()
                    why = (
                        "read-only: it takes no writes"
                        if readonly
                        else "not registered (down, or another --zk-root?)"
                    )
                    out[b] = {"ok": False, "error": why}
                    continue
                try:
                    out[b] = await one(bk, b)
                except (Exception, TimeoutError) as e:
                    out[b] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            return out
        finally:
            await bk.close()

    results = asyncio.run(go())

    def line(b: str, r: dict[str, Any]) -> str:
        if r["ok"]:
            return f"{b}: OK ({r['entries']} entries written, read back, verified; ledger {r['ledger_id']} deleted; {r['seconds']}s)"
        return f"{b}: FAILED: {r['error']}"

    emit(args, lambda: "\n".join(line(b, r) for b, r in results.items()), results)
    return 0 if all(r["ok"] for r in results.values()) else 1


# ------------------------------------------------------------------------------------------------ updatecookie
def update_cookie(args: argparse.Namespace) -> int:
    from zk import BookieRegistry, LedgerMetadataStore, cookies

    data_dir = args.data_dir.resolve()
    journal_dir = (args.journal_dir or data_dir / "journal").resolve()
    ledger_dir = data_dir / "ledgers"
    local = [cookies.read_local_cookie(journal_dir), cookies.read_local_cookie(ledger_dir)]
    if any(c is None for c in local):
        raise CommandError(
            f"no cookie in {journal_dir} and {ledger_dir}: not a bookie's data (or --journal-dir?)"
        )
    cookie = local[0]
    assert cookie is not None
    if any(c != cookie for c in local):
        raise CommandError(f"the cookies in {journal_dir} and {ledger_dir} differ: {local}")
    old, new = cookie.bookie_id, args.bookie_id
    store = _store(args)
    try:
        zk_old = cookies.read_zk_cookie(store, old)
        if zk_old is None or zk_old.value != cookie:
            raise CommandError(
                f"ZooKeeper's cookie of {old} does not match this data directory's: refusing (another cluster "
                "or --zk-root? a formatted bookie?)"
            )
        registered = BookieRegistry(store).all()
        if old == new:
            return _update_cookie_dirs(
                args, store, zk_old.version, cookie, journal_dir, ledger_dir, registered
            )
        if old in registered:
            raise CommandError(f"bookie {old} is running (registered): stop it first")
        if new in registered or cookies.read_zk_cookie(store, new) is not None:
            raise CommandError(f"{new} is already a bookie's id (registered or with a cookie)")
        md_store = LedgerMetadataStore(store)
        naming: list[int] = []
        closed: list[int] = []
        for lid in md_store.list():
            try:
                md = md_store.read(lid).value
            except Exception:
                continue  # deleted meanwhile
            if any(old in e.bookies for e in md.ensembles):
                naming.append(lid)
                if md.is_closed:
                    closed.append(lid)
        renamed: list[int] = []
        if not args.dry_run:
            new_cookie = dataclasses.replace(cookie, bookie_id=new)
            cookies.write_zk_cookie(store, new_cookie)
            cookies.write_local_cookie(journal_dir, new_cookie)
            cookies.write_local_cookie(ledger_dir, new_cookie)
            cookies.delete_zk_cookie(store, old, zk_old.version)
            if args.update_ledgers:
                renamed = _rename_in_ledgers(md_store, closed, old, new)
    finally:
        store.close()
    data = {
        "old_bookie_id": old,
        "bookie_id": new,
        "dry_run": args.dry_run,
        "changed": not args.dry_run,
        "directories": [str(journal_dir), str(ledger_dir)],
        "ledgers_naming_old_id": naming,
        "closed_ledgers_renamed": renamed,
    }
    left = [lid for lid in naming if lid not in renamed]
    verb = "would rewrite" if args.dry_run else "rewrote"
    human = [
        f"{verb} the cookie of {old} as {new} (ZooKeeper and {journal_dir}, {ledger_dir})",
        f"{len(naming)} ledgers name {old} ({len(closed)} closed)"
        + (f"; {len(renamed)} closed ones now name {new}" if renamed else ""),
    ]
    if left and not args.dry_run:
        human.append(
            f"  {len(left)} still name {old}: their copies here are reachable only under that id; "
            f"`ledgerstore bookie recover {old}` (or AutoRecovery) re-replicates the closed ones"
        )
    if not args.dry_run:
        human.append(
            f"start the bookie as {new} (--bookie-id {new}, or the advertised address and port it names)"
        )
    emit(args, "\n".join(human), data)
    return 0


def _update_cookie_dirs(
    args: argparse.Namespace,
    store: Any,
    version: int,
    cookie: Any,
    journal_dir: Path,
    ledger_dir: Path,
    registered: Any,
) -> int:
    """Same id: record the directories the bookie's data was moved to (the journal onto its own disk, the data
    directory elsewhere; BookKeeper's cookie update), where the cookies were found with it. Nothing to do when
    the cookie already records them."""
    from zk import cookies

    moved = dataclasses.replace(cookie, journal_dir=str(journal_dir), ledger_dirs=(str(ledger_dir),))
    data = {
        "bookie_id": cookie.bookie_id,
        "dry_run": args.dry_run,
        "directories": [str(journal_dir), str(ledger_dir)],
    }
    if moved == cookie:
        emit(
            args,
            f"the cookie already names {cookie.bookie_id} and these directories: nothing to do",
            {**data, "changed": False},
        )
        return 0
    if cookie.bookie_id in registered:
        raise CommandError(f"bookie {cookie.bookie_id} is running (registered): stop it first")
    if not any(journal_dir.glob("*.jnl")) and not (journal_dir / "lastmark").exists():
        raise CommandError(
            f"{journal_dir} holds the cookie but no journal (no *.jnl segment, no lastmark): move the whole "
            f"journal directory there (it was {cookie.journal_dir})"
        )
    from bookie.main import storage_wiped

    if (wiped := storage_wiped(cookie.bookie_id, ledger_dir, journal_dir)) is not None:
        raise CommandError(
            f"{wiped} Move the whole ledger directory there (it was {', '.join(cookie.ledger_dirs)})"
        )
    was = f"journal {cookie.journal_dir}, ledgers {', '.join(cookie.ledger_dirs)}"
    now = f"journal {journal_dir}, ledgers {ledger_dir}"
    if not args.dry_run:
        cookies.write_zk_cookie(store, moved, version)  # a CAS: a cookie changed meanwhile is not overwritten
        cookies.write_local_cookie(journal_dir, moved)
        cookies.write_local_cookie(ledger_dir, moved)
    verb = "would record" if args.dry_run else "recorded"
    human = f"{verb} the moved directories of {cookie.bookie_id} in its cookie: {now} (was {was})"
    if not args.dry_run:
        human += f"\nstart the bookie with --data-dir {ledger_dir.parent}" + (
            f" --journal-dir {journal_dir}" if journal_dir != ledger_dir.parent / "journal" else ""
        )
    emit(args, human, {**data, "changed": not args.dry_run, "was": [cookie.journal_dir, *cookie.ledger_dirs]})
    return 0


def _renamed(cur: Any, *, old: str, new: str) -> Any:
    from ledger_client.rereplication import swapped

    if not cur.is_closed:
        raise ValueError(f"ledger {cur.ledger_id} is no longer closed")
    return swapped(cur, old, {k: new for k, e in enumerate(cur.ensembles) if old in e.bookies})


def _rename_in_ledgers(md_store: Any, ledger_ids: list[int], old: str, new: str) -> list[int]:
    """Rename ``old`` to ``new`` in each CLOSED ledger's ensembles (a CAS each); the ids done."""
    done = []
    for lid in ledger_ids:
        try:
            md_store.update(lid, functools.partial(_renamed, old=old, new=new))
        except Exception:
            continue  # left naming the old id (reported)
        done.append(lid)
    return done


# ------------------------------------------------------------------------------------------------ recover -l
def recover_ledger(args: argparse.Namespace) -> int:
    from bookie.main import install_uvloop
    from ledger_client import BookKeeper, ClientConfig
    from ledger_client.rereplicator import rereplicate_ledger
    from ledgerstore.bookie_admin import recover_line

    install_uvloop()

    async def go() -> Any:
        bk = await BookKeeper.connect(args.zk, config=ClientConfig(zk_root=args.zk_root))
        try:
            return await rereplicate_ledger(
                bk, args.ledger, args.bookie, password_of(args).encode(), dry_run=args.dry_run
            )
        finally:
            await bk.close()

    r = asyncio.run(go())
    if r.status == "not_on_bookie":
        raise CommandError(f"ledger {args.ledger} does not name bookie {args.bookie}")
    emit(
        args,
        f"bookie {args.bookie}, ledger {args.ledger}:\n{recover_line(r)}",
        {"bookie": args.bookie, "ledgers": [dataclasses.asdict(r)]},
    )
    return 0 if r.status in ("done", "planned") else 1
