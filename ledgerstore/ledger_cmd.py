"""``ledgerstore ledger …``: the BookKeeper shell's everyday verbs, on the async client."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from tqdm import tqdm

from ledger_client import ENTRY_PAYLOAD_MAX
from ledger_client.client import BookKeeper, ClientConfig
from ledger_client.errors import NotEnoughBookiesError, UnauthorizedError
from ledgerstore.cli import (
    EXIT_NOT_FOUND,
    PASSWORD_ENV,
    CommandError,
    UsageError,
    add_password_arguments,
    emit,
    password_of,
    progress_disabled,
)
from zk.cookies import NoClusterError, existing_instance_id


def add_ledger_commands(
    parser: argparse.ArgumentParser, common: Callable[[argparse.ArgumentParser], None]
) -> None:
    sub = parser.add_subparsers(dest="verb", required=True)

    def verb(
        name: str, fn: Callable[[argparse.Namespace, BookKeeper], Coroutine[Any, Any, int]], help_text: str
    ) -> argparse.ArgumentParser:
        a = sub.add_parser(name, help=help_text)
        common(a)
        a.set_defaults(func=lambda args: _run(args, fn))
        return a

    verb("bookies", _bookies, "list writable and read-only bookies")
    verb("list", _list, "list ledger ids (with their state)")
    for name, fn, text in (
        ("metadata", _metadata, "show a ledger's metadata"),
        ("recover", _recover, "fence and recover a ledger (closes it)"),
        ("delete", _delete, "delete a ledger"),
    ):
        a = verb(name, fn, text)
        a.add_argument("ledger_id", type=int, help="the ledger's id")
        add_password_arguments(a)
    for name, fn, text in (
        ("create", _create, "create an empty ledger (and close it unless --keep-open)"),
        ("write", _write, "create a ledger and write entries to it"),
        ("simpletest", _simpletest, "write, read back and verify entries; delete the ledger"),
    ):
        a = verb(name, fn, text)
        a.add_argument("-E", "--ensemble", type=int, default=3, help="ensemble size: bookies the ledger uses")
        a.add_argument("-W", "--write-quorum", type=int, default=2, help="copies of each entry")
        a.add_argument("-A", "--ack-quorum", type=int, default=2, help="acks before an entry is acknowledged")
        add_password_arguments(a, "the new ledger's password")
        if name != "create":
            a.add_argument("-n", "--entries", type=int, default=1000, help="entries to write")
            a.add_argument("--entry-size", type=int, default=100, help="bytes per generated entry")
        if name == "write":
            a.add_argument(
                "--input", default=None, help="write one entry per line of this file ('-' = stdin)"
            )
        if name == "create":
            a.add_argument(
                "--keep-open", action="store_true", help="leave the ledger OPEN (no writer will close it)"
            )
    a = verb(
        "read",
        _read,
        "print a ledger's entries, one a line (control characters and bytes that are not UTF-8 as "
        "backslash escapes: \\n, \\x1b, \\xff; --json gives the text as it is)",
    )
    a.add_argument("ledger_id", type=int, help="the ledger's id")
    a.add_argument("--first", type=int, default=0, help="first entry id to print")
    a.add_argument("--last", type=int, default=None, help="last entry id to print (default: the LAC)")
    add_password_arguments(a)
    a.add_argument(
        "-r",
        "--recover",
        "--force-recovery",
        action="store_true",
        help="fence and recover an open ledger first (closes it; its writer gets no more acks)",
    )
    a.add_argument(
        "--bookie",
        default=None,
        metavar="ID",
        help="read only this bookie's copy (the entries its write sets name it for), with each one's status",
    )
    # Reading never fences by default; the old opt-out stays accepted so existing scripts keep working.
    a.add_argument("--no-recovery", action="store_true", help=argparse.SUPPRESS)


def _run(
    args: argparse.Namespace, fn: Callable[[argparse.Namespace, BookKeeper], Coroutine[Any, Any, int]]
) -> int:
    from bookie.main import install_uvloop

    if hasattr(args, "ensemble"):  # before connecting, in the flags' names (the client's names its fields)
        e, w, a = args.ensemble, args.write_quorum, args.ack_quorum
        if not e >= w >= a >= 1:
            fit = f": with -E {e} give -W and -A at most {e}" if e >= 1 and max(w, a) > e else ""
            raise UsageError(f"-E {e} -W {w} -A {a}: need -E >= -W >= -A >= 1 (-W and -A default to 2){fit}")
    install_uvloop()

    async def go() -> int:
        bk = await BookKeeper.connect(args.zk, config=ClientConfig(zk_root=args.zk_root))
        try:
            await asyncio.to_thread(
                existing_instance_id, bk.store
            )  # a mistyped --zk-root: said, not looked in
            return await fn(args, bk)
        except NoClusterError as e:
            raise CommandError(f"{e}: check --zk-root (or $LEDGERSTORE_ZK_ROOT)", EXIT_NOT_FOUND) from None
        except UnauthorizedError as e:
            if not e.message.startswith("wrong password") or password_of(args):
                raise
            hint = f"{e.message}: none was given (--password, --password-file or ${PASSWORD_ENV})"
            raise UnauthorizedError(hint, ledger_id=e.ledger_id) from e
        except NotEnoughBookiesError as e:
            if not hasattr(args, "ensemble"):  # (a verb that makes no ledger)
                raise
            hint = f"{e.message}: start more bookies (`ledgerstore cluster status` lists them)" + (
                f", or give the ledger fewer than -E {args.ensemble} (with -W and -A no larger)"
                if args.ensemble > 1
                else ""
            )
            again = NotEnoughBookiesError(hint, ledger_id=e.ledger_id)
            for note in getattr(e, "__notes__", ()):  # what the verb had written when it failed
                again.add_note(note)
            raise again from e
        finally:
            await bk.close()

    return asyncio.run(go())


def _md_json(md: Any) -> dict[str, Any]:
    d: dict[str, Any] = md.to_json()
    return d


def _progress(args: argparse.Namespace, total: int, desc: str) -> tqdm:
    return tqdm(
        total=total,
        desc=desc,
        unit="entry",
        disable=progress_disabled(args) or total < 200,
        file=sys.stderr,
        leave=False,
    )


def _nothing_under(args: argparse.Namespace, what: str) -> str:
    """Where an empty answer came from: a mistyped --zk-root or --zk shows an empty cluster, not an error."""
    return f"{what} under {args.zk_root} at {args.zk}: is that the cluster (--zk, --zk-root)?"


async def _bookies(args: argparse.Namespace, bk: BookKeeper) -> int:
    w, r = await bk.writable_bookies(), await bk.readonly_bookies()
    emit(
        args,
        "\n".join(
            [
                f"writable ({len(w)}):",
                *(f"  {b}" for b in w),
                f"read-only ({len(r)}):",
                *(f"  {b}" for b in r),
                *([] if w or r else [_nothing_under(args, "no bookie is registered")]),
            ]
        ),
        {"writable": w, "readonly": r},
    )
    return 0


async def _list(args: argparse.Namespace, bk: BookKeeper) -> int:
    ids = await bk.list_ledgers()
    rows = []
    for lid in ids:
        md = await bk.ledger_metadata(lid)
        rows.append(
            {
                "ledger_id": lid,
                "state": md.state.value,
                "last_entry_id": md.last_entry_id,
                "length": md.length,
            }
        )
    emit(
        args,
        "\n".join(
            f"{r['ledger_id']:>8}  {r['state']:<11} last_entry_id={r['last_entry_id']} length={r['length']}"
            for r in rows
        )
        or _nothing_under(args, "no ledgers"),
        rows,
    )
    return 0


async def _metadata(args: argparse.Namespace, bk: BookKeeper) -> int:
    from zk import racks as zk_racks

    md = await bk.ledger_metadata(args.ledger_id)
    known = await asyncio.to_thread(zk_racks.racks, bk.store)
    rack = {b: known.get(b, zk_racks.DEFAULT_RACK) for ens in md.ensembles for b in ens.bookies}
    d = {**_md_json(md), "racks": rack}
    human = [
        f"ledger {md.ledger_id}: {md.state.value}, E={md.ensemble_size} Qw={md.write_quorum} "
        f"Qa={md.ack_quorum}, last_entry_id={md.last_entry_id}, length={md.length}, digest={md.digest_type}"
    ]
    human += [
        f"  ensemble from entry {e.first_entry_id}: {', '.join(f'{b} ({rack[b]})' for b in e.bookies)}"
        for e in md.ensembles
    ]
    emit(args, "\n".join(human), d)
    return 0


async def _recover(args: argparse.Namespace, bk: BookKeeper) -> int:
    lh = await bk.open_ledger(args.ledger_id, password=password_of(args).encode(), recovery=True)
    md = lh.metadata
    emit(
        args,
        f"ledger {md.ledger_id} is {md.state.value}: last_entry_id={md.last_entry_id} length={md.length}",
        _md_json(md),
    )
    return 0


async def _delete(args: argparse.Namespace, bk: BookKeeper) -> int:
    # the password is checked against the ledger's stored digest: a wrong one deletes nothing
    await bk.delete_ledger(args.ledger_id, password=password_of(args).encode())
    emit(args, f"ledger {args.ledger_id} deleted", {"deleted": args.ledger_id})
    return 0


async def _create(args: argparse.Namespace, bk: BookKeeper) -> int:
    lh = await bk.create_ledger(
        args.ensemble, args.write_quorum, args.ack_quorum, password=password_of(args).encode()
    )
    if not args.keep_open:
        await lh.close()
    emit(args, f"created ledger {lh.ledger_id}", {"ledger_id": lh.ledger_id})
    return 0


def _payloads(args: argparse.Namespace) -> list[bytes]:
    """The entries to write, refused (exit 2) before a ledger is made when one is over the largest entry a bookie
    takes: the write failed on its first entry and left an empty ledger open, to be recovered."""
    if getattr(args, "input", None):
        try:
            src = sys.stdin if args.input == "-" else open(args.input)  # noqa: SIM115
        except OSError as e:
            raise CommandError(f"--input: {e.strerror}: {args.input}", code=4) from e
        with src:
            lines = [line.rstrip("\n").encode() for line in src]
        for i, line in enumerate(lines):
            if len(line) > ENTRY_PAYLOAD_MAX:
                raise CommandError(
                    f"--input: line {i + 1} is {len(line)} bytes, over the largest entry ({ENTRY_PAYLOAD_MAX} "
                    "bytes); nothing written",
                    code=2,
                )
        return lines
    if args.entry_size > ENTRY_PAYLOAD_MAX:
        raise CommandError(
            f"--entry-size {args.entry_size}: at most {ENTRY_PAYLOAD_MAX} bytes, the largest entry a bookie takes",
            code=2,
        )
    return [
        f"{i:08d}".encode().ljust(args.entry_size, b".")[: max(args.entry_size, 8)]
        for i in range(args.entries)
    ]


async def _write_entries(args: argparse.Namespace, lh: Any, payloads: list[bytes], desc: str) -> float:
    t0 = time.perf_counter()
    with _progress(args, len(payloads), desc) as bar:
        futs = []
        for data in payloads:
            fut = await lh.append_future(data)
            fut.add_done_callback(lambda _f: bar.update(1))
            futs.append(fut)
        # In order, one at a time: a settled future is awaited without a trip through the loop, where
        # asyncio.gather over two million of them blocked the loop for 31 s in one go
        try:
            for fut in futs:
                await fut
        except BaseException:
            _retrieve_all(futs)
            raise
    return time.perf_counter() - t0


def _retrieve_all(futs: list[asyncio.Future[int]]) -> None:
    """The command reports the first failed entry; the entries after it failed the same way, and their errors are
    taken here, not logged with a traceback each ('Future exception was never retrieved') as the loop closes."""

    def retrieve(f: asyncio.Future[int]) -> None:
        if not f.cancelled():
            f.exception()

    for f in futs:
        if f.done():
            retrieve(f)
        else:
            f.add_done_callback(retrieve)


async def _write(args: argparse.Namespace, bk: BookKeeper) -> int:
    payloads = _payloads(args)
    lh = await bk.create_ledger(
        args.ensemble, args.write_quorum, args.ack_quorum, password=password_of(args).encode()
    )
    try:
        dt = await _write_entries(args, lh, payloads, f"ledger {lh.ledger_id}")
    except Exception as e:  # what is stored, and where: the error alone named neither
        done = lh.last_add_confirmed + 1
        e.add_note(
            f"ledger {lh.ledger_id}: {done} of {len(payloads)} entries acknowledged"
            + (f", ids 0..{done - 1}" if done else "")
            + f"; left open: `ledgerstore ledger read {lh.ledger_id} --recover` reads them and closes it"
        )
        raise
    await lh.close()
    emit(
        args,
        f"wrote {len(payloads)} entries to ledger {lh.ledger_id} in {dt:.2f}s; closed at "
        f"last_entry_id={lh.last_add_confirmed}",
        {"ledger_id": lh.ledger_id, "entries": len(payloads), "seconds": dt},
    )
    return 0


#: control characters (C0, DEL, C1) as escapes in ``ledger read``'s text output: an entry holding a newline
#: took several lines, and an escape sequence in one (ESC [ ...) was run by the terminal. The Unicode line and
#: paragraph separators too: str.splitlines (and JavaScript) end a line at each, so one entry read as two
_CONTROL_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {
    0x09: "\\t",
    0x0A: "\\n",
    0x0D: "\\r",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def entry_text(data: bytes) -> str:
    """An entry on one line of text: UTF-8 as it is; bytes that are not UTF-8 and control characters as
    backslash escapes (``\\xff``, ``\\n``, ``\\x1b``)."""
    return data.decode("utf-8", "backslashreplace").translate(_CONTROL_ESCAPES)


async def _read(args: argparse.Namespace, bk: BookKeeper) -> int:
    # Like BookKeeper's `readledger`: a look at the data must never close a live writer's ledger; an open
    # ledger is read up to its LAC, and only --recover fences and closes it.
    if args.recover and args.no_recovery:
        raise CommandError("--recover and --no-recovery contradict each other", code=2)
    if args.first < 0:
        raise CommandError(f"--first {args.first}: entry ids start at 0", code=2)
    if args.last is not None and args.last < args.first:
        raise CommandError(f"--last {args.last} is before --first {args.first}", code=2)
    lh = await bk.open_ledger(args.ledger_id, password=password_of(args).encode(), recovery=args.recover)
    last = lh.last_add_confirmed if args.last is None else args.last
    if args.first > last and lh.last_add_confirmed >= 0:  # an empty ledger reads nothing, as it should
        raise CommandError(
            f"--first {args.first} is past ledger {args.ledger_id}'s last entry: its entries are "
            f"0..{lh.last_add_confirmed}" + (" (the LAC of an open ledger)" if not lh.is_closed else ""),
            kind="READ_BEYOND_LAC",
        )
    rows = []
    if args.bookie:
        return await _read_replica(args, lh, last)
    async for e in lh.read(args.first, last):
        if args.json:
            rows.append({"entry_id": e.entry_id, "data": e.data.decode("utf-8", "backslashreplace")})
        else:
            print(f"{e.entry_id}\t{entry_text(e.data)}")
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


async def _read_replica(args: argparse.Namespace, lh: Any, last: int) -> int:
    """``ledger read --bookie ID``: one replica's copy, entry by entry, with what that bookie answered."""
    md = lh.metadata
    if not any(args.bookie in ens.bookies for ens in md.ensembles):
        raise CommandError(f"bookie {args.bookie} is in no ensemble of ledger {lh.ledger_id}", code=4)
    rows, bad = [], 0
    async for eid, status, data in lh.read_replica(args.bookie, args.first, last):
        bad += status != "OK"
        if args.json:
            rows.append({"entry_id": eid, "status": status, "data": data.decode("utf-8", "backslashreplace")})
        else:
            print(f"{eid}\t{status}\t{entry_text(data)}")
    if args.json:
        print(json.dumps(rows, indent=2))
    return 1 if bad else 0


async def _simpletest(args: argparse.Namespace, bk: BookKeeper) -> int:
    pw = password_of(args).encode()
    payloads = _payloads(args)
    lh = await bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum, password=pw)
    wdt = await _write_entries(args, lh, payloads, f"write ledger {lh.ledger_id}")
    await lh.close()
    rh = await bk.open_ledger(lh.ledger_id, password=pw, recovery=True)
    t0 = time.perf_counter()
    n = 0
    with _progress(args, len(payloads), "read back") as bar:
        async for e in rh.read(0, rh.last_add_confirmed):
            if e.data != payloads[e.entry_id]:
                raise RuntimeError(f"entry {e.entry_id} read back different bytes")
            n += 1
            bar.update(1)
    rdt = time.perf_counter() - t0
    if n != len(payloads):
        raise RuntimeError(f"read back {n} entries, wrote {len(payloads)}")
    md = rh.metadata
    await bk.delete_ledger(lh.ledger_id)
    ensemble = list(md.ensembles[0].bookies)
    result = {
        "ledger_id": lh.ledger_id,
        "ensemble": ensemble,
        "E/Qw/Qa": f"{args.ensemble}/{args.write_quorum}/{args.ack_quorum}",
        "entries": n,
        "write_entries_per_s": round(n / wdt),
        "read_entries_per_s": round(n / rdt) if rdt else None,
        "verified": True,
    }
    emit(
        args,
        f"simpletest OK: ledger {lh.ledger_id} (E/Qw/Qa {result['E/Qw/Qa']}) on "
        f"{', '.join(ensemble)}: wrote {n} entries ({result['write_entries_per_s']:,}/s), "
        f"read back and verified ({result['read_entries_per_s']:,}/s), deleted",
        result,
    )
    return 0
