"""An operator's and a stranger's mistakes against real ZooKeeper and bookie processes (docs/operations.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

from ledgerstore.cluster import BookieProcess, free_port
from tests.conftest import BookieFactory
from tests.integration.test_cluster_cli import _ls


def test_a_bookies_readonly_put_answers_deeply_nested_json_with_400(bookies: BookieFactory) -> None:
    """PUT /api/v1/bookie/state/readonly with a body nested 2,000 deep ({"a":{"a":...) was a 500 and a
    traceback in the bookie's log: the JSON parser's RecursionError is not a ValueError. It is a 400 now, and the
    bookie stays writable."""
    bp = bookies.start()
    url = f"http://127.0.0.1:{bp.http_port}/api/v1/bookie/state/readonly"
    req = urllib.request.Request(url, data=b'{"a":' * 2000, method="PUT")
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 400, (e.code, e.read())
        assert b"readOnly" in e.read()
    with urllib.request.urlopen(url, timeout=10) as r:
        assert json.loads(r.read()) == {"readOnly": False}


def test_cluster_up_with_zk_says_at_once_when_nothing_answers_there(tmp_path: Path) -> None:
    """`cluster up --zk HOST:PORT` starts no ZooKeeper: with nothing there each bookie waited 10 s for it and
    `cluster up` failed 27 s later quoting a bookie's log; --zk-port beside it was silently ignored. Both are said
    in one line before anything starts."""
    nobody = str(free_port())
    r = _ls(
        "cluster", "up", "--state-dir", str(tmp_path / "c"), "--zk", f"127.0.0.1:{nobody}", "--zk-port", "1"
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"--zk 127.0.0.1:{nobody} names a ZooKeeper already running (none is started)" in r.stderr
    r = _ls(
        "cluster",
        "up",
        "--state-dir",
        str(tmp_path / "c"),
        "--zk",
        f"127.0.0.1:{nobody}",
        "--zk-port",
        nobody,
    )
    assert r.returncode == 5, r.stdout + r.stderr
    assert r.stderr.startswith(f"ledgerstore: no ZooKeeper answers at --zk 127.0.0.1:{nobody}: "), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "c" / "cluster.json").exists() and not list((tmp_path / "c").glob("bookie-*"))


class _FileSizeLimited(BookieProcess):
    """A bookie whose files may not grow past 6 MiB (``ulimit -f``): its journal write fails with EFBIG."""

    def command(self) -> list[str]:
        limit = "import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (6 << 20, 6 << 20)); "
        return [sys.executable, "-c", limit + "os.execv(sys.argv[1], sys.argv[1:])", *super().command()]


def test_a_ledger_write_that_fails_half_way_says_what_it_stored(bookies: BookieFactory) -> None:
    """`ledger write` whose only bookie failed half way (its journal hit the file-size limit) said only
    'NOT_ENOUGH_BOOKIES: no replacement for …': not which ledger, nor how many entries were acknowledged, nor that
    it was left open. Now the line ends with them, and those entries are all read back once the bookie restarts."""
    bp = bookies.start("--journal-segment-mb", "64", "--journal-prealloc-mb", "1", process=_FileSizeLimited)

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "ledgerstore.cli", *argv, "--zk", bookies.zk, "--zk-root", bookies.root]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    r = cli("ledger", "write", "-E", "1", "-W", "1", "-A", "1", "-n", "1000", "--entry-size", "10000")
    assert r.returncode == 5 and r.stderr.startswith("ledgerstore: NOT_ENOUGH_BOOKIES: "), r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "fewer than -E 1" not in r.stderr, r.stderr
    m = re.search(
        r"\(ledger (\d+): (\d+) of 1000 entries acknowledged, ids 0\.\.(\d+); left open: ", r.stderr
    )
    assert m and int(m[2]) > 0 and int(m[3]) == int(m[2]) - 1, r.stderr
    bp.kill9()
    bookies.start(data_dir=bp.data_dir, port=bp.port)  # without the limit
    r = cli("ledger", "read", m[1], "--recover")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == int(m[2]), r.stderr


def test_the_auditor_does_not_say_nothing_marked_of_a_bookie_whose_ledgers_it_marked(bookies, caplog) -> None:
    """A bookie restarted with the default loss delay of 0: the auditor marked its ledgers, then said on its
    return 'is back before its loss delay ran out: nothing marked', which contradicts the line before it."""
    import asyncio
    import logging

    from autorecovery.auditor import Auditor
    from autorecovery.config import AutoRecoveryConfig
    from autorecovery.metrics import Metrics
    from ledger_client import BookKeeper, ClientConfig
    from ledger_client.client import _meta
    from tests.integration.test_autorecovery_planted import _unregistered, _write_ledger
    from zk.underreplication import UnderReplicationManager

    procs = bookies.start_many(3)
    lid, lost = asyncio.run(_write_ledger(bookies, 5))
    bp = next(bp for bp in procs if bp.id == lost)
    bp.stop()

    async def run() -> bool:
        bk = await BookKeeper.connect(bookies.zk, config=ClientConfig(zk_root=bookies.root))
        try:
            manager = UnderReplicationManager(bk.store)
            await _unregistered(bk, {lost})
            config = AutoRecoveryConfig(zk=bookies.zk, zk_root=bookies.root, passwords=(b"pw",))
            auditor = Auditor(bk, manager, config, Metrics(), "ops18")
            await auditor.step()  # elected; the ledger marked at once
            marked = await _meta(lambda: manager.get(lid)) is not None
            await asyncio.to_thread(bp.start)
            await auditor.step()
            return marked
        finally:
            await bk.close()

    with caplog.at_level(logging.INFO, logger="autorecovery.auditor"):
        assert asyncio.run(run())
    lines = [r.getMessage() for r in caplog.records if lost in r.getMessage()]
    assert (
        f"auditor: bookie {lost} is back after its ledgers were marked: the workers copy what it lacks"
        in lines
    )
    assert not [line for line in lines if "nothing marked" in line], lines


def test_cluster_down_names_a_dead_autorecovery_process(tmp_path: Path, capsys) -> None:
    """`cluster down` of a cluster whose standalone AutoRecovery process was killed named the dead broker and
    bookie ('not running already: …') but not it; and one it stopped was not counted. Both are said now."""
    from ledgerstore.cli import main
    from tests.unit.test_planted_11 import _dead_pid

    def down(recovery_pid: int) -> str:
        state = tmp_path / str(recovery_pid)
        state.mkdir()
        st = {
            "zk": "127.0.0.1:1",
            "zk_root": "/ledgerstore",
            "bookies": [{"pid": _dead_pid(), "id": "127.0.0.1:30281"}],
            "brokers": [],
            "autorecovery": {"pid": recovery_pid, "metrics_port": 1},
        }
        (state / "cluster.json").write_text(json.dumps(st))
        assert main(["cluster", "down", "--state-dir", str(state)]) == 0
        return capsys.readouterr().out

    out = down(_dead_pid())
    assert "0 brokers and 0 bookies stopped" in out, out
    assert "(not running already: bookie 127.0.0.1:30281, the AutoRecovery process)" in out, out
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    threading.Thread(target=alive.wait, daemon=True).start()  # reaped as it ends, as a process not ours is
    try:
        out = down(alive.pid)
    finally:
        alive.kill()
        alive.wait()
    assert "0 brokers, 0 bookies and the AutoRecovery process stopped" in out, out


def test_a_mistyped_bookie_decommission_names_the_known_bookies(bookies: BookieFactory) -> None:
    """`bookie decommission` of an id the cluster does not know said 'bookie … is neither registered nor has a
    cookie', exit 1, where `bookie recover` of the same typo says exit 4 and names the bookies there are."""
    bp = bookies.start()
    cmd = [sys.executable, "-m", "ledgerstore.cli", "bookie", "decommission", "127.0.0.1:1"]
    r = subprocess.run([*cmd, "--zk", bookies.zk, "--zk-root", bookies.root], capture_output=True, text=True)
    assert r.returncode == 4, r.stdout + r.stderr
    assert r.stderr.strip() == (
        f"ledgerstore: no bookie 127.0.0.1:1: not registered, no cookie (check the id; known bookies: {bp.id})"
    )


def test_autorecovery_status_under_a_root_with_no_cluster_says_so(bookies: BookieFactory) -> None:
    """`autorecovery status --zk-root /nope` (a root no bookie started in, not close enough to a cluster's root to
    be taken for its typo) answered 'enabled; auditor: none (0 candidates)' and nothing else: an operator read
    that AutoRecovery had no auditor. It now says there is no cluster there, as `ledger list` does."""
    root = "/ops18-nothing-" + bookies.root.rpartition("-")[2]
    cmd = [
        sys.executable,
        "-m",
        "ledgerstore.cli",
        "autorecovery",
        "status",
        "--zk",
        bookies.zk,
        "--zk-root",
        root,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"no cluster under {root} at {bookies.zk} (no bookie has started there)" in r.stdout, r.stdout
    bookies.start()
    cmd[-1] = bookies.root
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "no cluster" not in r.stdout, r.stdout + r.stderr


def test_a_topics_in_counters_do_not_go_down_when_it_is_unloaded(broker) -> None:
    """pulsar_in_messages_total and pulsar_in_bytes_total were the served topic's own counters: unloaded and
    opened again, its 50 messages in became 5 in the next scrape (a counter going down). They count what the
    broker stored for the topic now, like its out counters."""
    import pulsar

    from tests.metrics_testing import scrape

    topic = "persistent://public/default/ops18-in"
    url = f"http://127.0.0.1:{broker.http_port}"
    labels = f'cluster="ledgerstore",namespace="public/default",topic="{topic}"'

    def produce(n: int) -> None:
        c = pulsar.Client(broker.service_url)
        try:
            p = c.create_producer(topic)
            for _ in range(n):
                p.send(b"x" * 10)
        finally:
            c.close()

    produce(20)
    before = scrape(url + "/metrics")
    assert before[f"pulsar_in_messages_total{{{labels}}}"] == 20
    req = urllib.request.Request(f"{url}/admin/v2/persistent/public/default/ops18-in/unload", method="PUT")
    urllib.request.urlopen(req, timeout=30).close()
    produce(3)
    after = scrape(url + "/metrics")
    assert after[f"pulsar_in_messages_total{{{labels}}}"] == 23
    assert after[f"pulsar_in_bytes_total{{{labels}}}"] > before[f"pulsar_in_bytes_total{{{labels}}}"]


def test_quorums_that_do_not_fit_are_a_usage_error_in_the_flags_names() -> None:
    """`ledger write -E 1` (one bookie; -W and -A default to 2) connected to ZooKeeper and then said
    'INCORRECT_PARAMETER: need ensemble_size >= write_quorum >= ack_quorum >= 1, got E=1 Qw=2 Qa=2', exit 1. It is
    a usage error now, before anything is contacted, saying what to give."""
    cmd = [
        sys.executable,
        "-m",
        "ledgerstore.cli",
        "ledger",
        "write",
        "-n",
        "1",
        "--zk",
        "127.0.0.1:1",
        "-E",
        "1",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.splitlines()[0] == (
        "ledgerstore: -E 1 -W 2 -A 2: need -E >= -W >= -A >= 1 (-W and -A default to 2): with -E 1 give -W and -A "
        "at most 1"
    )
