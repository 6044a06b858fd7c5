"""``ledgerstore demo``: the end-to-end story on a running cluster (what `make run` shows).

1. the bookies the cluster has; 2. a ledger written with quorum writes and read back (simpletest);
3. fencing: a second client recovers a ledger while its writer is still appending — the writer is fenced,
   and every entry it had acknowledged is in the recovered ledger; 4. a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm


def _zk_from_state(args: argparse.Namespace) -> str:
    st = Path(args.state_dir) / "cluster.json"
    if st.exists():
        return str(json.loads(st.read_text())["zk"])
    return str(args.zk)


async def _story(zk: str, root: str) -> dict[str, Any]:
    from ledger_client import BookKeeper, ClientConfig, LedgerFencedError

    cfg = ClientConfig(zk_root=root)
    bk = await BookKeeper.connect(zk, config=cfg)
    summary: dict[str, Any] = {}
    try:
        bookies = await bk.writable_bookies()
        print(f"[1/3] cluster: ZooKeeper {zk}, {len(bookies)} writable bookies: {', '.join(bookies)}")
        summary["bookies"] = len(bookies)

        n = 2000
        lh = await bk.create_ledger(3, 2, 2, password=b"demo")
        t0 = time.perf_counter()
        futs = []
        with tqdm(
            total=n,
            desc=f"[2/3] writing ledger {lh.ledger_id} (E=3 Qw=2 Qa=2)",
            unit="entry",
            file=sys.stderr,
            leave=False,
        ) as bar:
            for i in range(n):
                f = await lh.append_future(f"demo entry {i}".encode())
                f.add_done_callback(lambda _f: bar.update(1))
                futs.append(f)
            await asyncio.gather(*futs)
        wdt = time.perf_counter() - t0
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id, password=b"demo")
        ok = 0
        async for e in rh.read(0, rh.last_add_confirmed):
            ok += e.data == f"demo entry {e.entry_id}".encode()
        print(
            f"[2/3] ledger {lh.ledger_id}: wrote {n} entries in {wdt:.2f}s ({n / wdt:,.0f}/s), "
            f"read back {ok}/{n} identical; ensemble {', '.join(rh.metadata.ensembles[0].bookies)}"
        )
        summary.update(ledger=lh.ledger_id, written=n, verified=ok, write_rate=round(n / wdt))

        w = await bk.create_ledger(3, 3, 2, password=b"demo")
        acked: dict[int, bytes] = {}
        fenced_after: list[int] = []

        async def writer() -> None:
            i = 0
            try:
                while True:
                    eid = await w.append(f"fenced-writer {i}".encode())
                    acked[eid] = f"fenced-writer {i}".encode()
                    i += 1
            except LedgerFencedError:
                fenced_after.append(i)

        task = asyncio.create_task(writer())
        while len(acked) < 300:
            await asyncio.sleep(0.01)
        other = await BookKeeper.connect(zk, config=cfg)
        rec = await other.open_ledger(w.ledger_id, password=b"demo", recovery=True)
        await asyncio.wait_for(task, 30)
        md = rec.metadata
        survived = 0
        async for e in rec.read(0, md.last_entry_id):
            survived += acked.get(e.entry_id) == e.data
        await other.close()
        print(
            f"[3/3] ledger {w.ledger_id}: a second client recovered it while the writer appended; the writer "
            f"got LedgerFencedError after {len(acked)} acknowledged entries; the recovered ledger is "
            f"{md.state.value} at last_entry_id={md.last_entry_id} and holds {survived}/{len(acked)} of them"
        )
        summary.update(
            fenced_ledger=w.ledger_id,
            writer_acked=len(acked),
            recovered_last_entry_id=md.last_entry_id,
            acked_entries_survived=survived,
            writer_fenced=bool(fenced_after),
        )
    finally:
        await bk.close()
    return summary


def run(args: argparse.Namespace) -> int:
    from bookie.main import install_uvloop

    install_uvloop()
    zk = _zk_from_state(args)
    s = asyncio.run(_story(zk, args.zk_root))
    ok = (
        s["verified"] == s["written"]
        and s["writer_fenced"]
        and s["acked_entries_survived"] == s["writer_acked"]
    )
    line = "=" * 72
    print(line)
    print(f"  bookies                      {s['bookies']}")
    print(
        f"  quorum writes                {s['written']} entries, {s['write_rate']:,}/s, {s['verified']} verified"
    )
    print(
        f"  fencing + recovery           writer fenced: {s['writer_fenced']}, acknowledged entries kept: "
        f"{s['acked_entries_survived']}/{s['writer_acked']}"
    )
    print(f"  result                       {'OK' if ok else 'FAILED'}")
    print(line)
    print("  next: ledgerstore ledger list | ledgerstore ledger metadata <id> | ledgerstore bench bookie")
    print("        make cluster-down   (stops ZooKeeper and the bookies)")
    return 0 if ok else 1
