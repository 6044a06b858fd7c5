"""More of the operator's bad day against real ZooKeeper and processes: a bookie whose identity check fails, and
a broker, an AutoRecovery process or a ledger command pointed at a mistyped --zk-root, each get one clear line and
the usual exit status, with nothing left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledgerstore import cli
from ledgerstore.cluster import AutoRecoveryProcess, BookieProcess, BrokerProcess, free_port
from tests.broker_testing import start_broker
from tests.conftest import BookieFactory
from tests.integration.test_cluster_cli import _ports
from zk import MetadataStore, cookies


def _ls(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerstore.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _refusal(bp: BookieProcess) -> str:
    """The one line a bookie that refused to start logged, after checking that it logged nothing more about it
    (no traceback, no 'shutting down' of a bookie that never ran)."""
    log = bp.log_tail(100)
    assert "Traceback" not in log and "shutting down" not in log and " stopped\n" not in log + "\n", log
    lines = [line for line in log.splitlines() if "refusing to start" in line]
    assert len(lines) == 1, log
    return lines[0]


def test_a_bookie_whose_cookie_does_not_match_refuses_in_one_line_with_the_cookie_status(
    bookies: BookieFactory, tmp_path: Path
) -> None:
    """A damaged COOKIE file in a data directory ended the bookie with a traceback-free but unlogged 'ledgerstore:
    COOKIE_MISMATCH: ...' and exit status 1; a cookie that belongs to another process logged its refusal and
    then 'shutting down' and 'stopped' as if the bookie had run. Both are now the refusal of any other check:
    one 'refusing to start: cookie mismatch: ...' line, exit status 3."""
    first = bookies.start()
    damaged = tmp_path / "damaged"
    (damaged / "journal").mkdir(parents=True)
    (damaged / "journal" / "COOKIE").write_text("not a cookie\n")
    second_id = BookieProcess(
        zk=bookies.zk,
        zk_root=bookies.root,
        data_dir=tmp_path / "other",
        port=free_port(),
        http_port=free_port(),
    )
    second_id.bookie_id = first.id  # the running bookie's id, with directories that are not its
    for bp, why in (
        (
            BookieProcess(
                zk=bookies.zk, zk_root=bookies.root, data_dir=damaged, port=free_port(), http_port=free_port()
            ),
            "cookie file",
        ),
        (second_id, f"bookie {first.id} is running already"),
    ):
        bp.start(wait=False)
        assert bp.wait_exit(60) == cli.EXIT_COOKIE_MISMATCH, bp.log_tail(50)
        line = _refusal(bp)
        assert f"refusing to start: cookie mismatch: {why}" in line, line
    assert first.healthy()


def _nothing_under(zk: str, root: str) -> None:
    with MetadataStore.connect(zk, "/") as top:  # not even the root znode the connection created
        assert not top.exists(root.lstrip("/")), top.children(root.lstrip("/"))


def test_a_broker_autorecovery_and_ledger_commands_refuse_a_zk_root_without_a_cluster_naming_the_roots_with_one(
    bookies: BookieFactory, tmp_path: Path
) -> None:
    """A mistyped --zk-root beside a cluster in the same ZooKeeper: the broker served an empty cluster (its
    producers waited out their timeout for bookies), AutoRecovery audited nothing, `ledger list` answered 'no
    ledgers' and `ledger write` NOT_ENOUGH_BOOKIES, each writing its skeleton under the mistyped root. Like the
    bookie, each now refuses with one line naming the roots that hold a cluster, exit status 4, and leaves
    nothing behind."""
    bookies.start()
    typo = bookies.root + "x"  # a typo (looks_mistyped), not another cluster
    broker = BrokerProcess(
        zk=bookies.zk, zk_root=typo, port=free_port(), http_port=free_port(), log_path=tmp_path / "broker.log"
    ).start(wait=False)
    recovery = AutoRecoveryProcess(
        zk=bookies.zk, zk_root=typo, metrics_port=free_port(), log_path=tmp_path / "ar.log"
    ).start(wait=False)
    try:
        for proc in (broker, recovery):
            assert proc.wait_exit(60) == cli.EXIT_NOT_FOUND, proc.log_tail(50)
            log = proc.log_tail(100)
            assert "Traceback" not in log, log
            lines = [line for line in log.splitlines() if "refusing to start" in line]
            assert len(lines) == 1, log
            assert f"no cluster under --zk-root {typo} in ZooKeeper {bookies.zk}" in lines[0], lines[0]
            assert f"clusters there: {bookies.root}" in lines[0] and "check --zk-root" in lines[0], lines[0]
    finally:
        for proc in (broker, recovery):
            proc.kill9()
    _nothing_under(bookies.zk, typo)
    for verb in (["list"], ["write", "-n", "1", "--password", "pw"], ["metadata", "1"]):
        r = _ls("ledger", *verb, "--zk", bookies.zk, "--zk-root", typo, timeout=60)
        assert r.returncode == cli.EXIT_NOT_FOUND, (verb, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"no cluster under --zk-root {typo}" in r.stderr and bookies.root in r.stderr, r.stderr
    _nothing_under(bookies.zk, typo)


def test_topic_consume_interrupted_while_it_subscribes_exits_130_at_once_and_a_timeout_ends_on_time(
    bookies: BookieFactory, tmp_path: Path
) -> None:
    """Ctrl-C while pulsar-client was still subscribing (here: a broker without bookies, whose answer the client
    waits on) closed the client in the middle of the call, and the interpreter's teardown then aborted the process
    ('terminate called without an active exception', status 134). It ends at once with status 130 instead,
    whenever the interrupt comes."""
    pytest.importorskip("pulsar")
    with MetadataStore.connect(bookies.zk, bookies.root) as store:  # a cluster whose bookies are all away
        cookies.instance_id(store)
    broker = start_broker(bookies, tmp_path, 4)
    try:
        broker.wait_ready(60)
        for after_s in (0.0, 0.5, 2.0):
            p = subprocess.Popen(
                [sys.executable, "-m", "ledgerstore.cli", "topic", "consume", "t", "-s", "s", "-v"]
                + ["--service-url", broker.service_url, "--timeout-s", "60"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's process
            )
            assert p.stdout is not None
            seen: list[str] = []
            for line in p.stdout:  # the client's log (-v): the subscription is under way
                seen.append(line)
                if "Subscribing on Topic" in line:
                    break
            time.sleep(after_s)
            p.send_signal(signal.SIGINT)
            t0 = time.monotonic()
            try:
                rest, _ = p.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                rest, _ = p.communicate()
                raise AssertionError(f"still running 20 s after Ctrl-C: {''.join(seen) + rest}") from None
            out = "".join(seen) + rest
            assert p.returncode == cli.EXIT_INTERRUPTED, (after_s, p.returncode, out[-2000:])
            assert time.monotonic() - t0 < 10 and "terminate called" not in out and "Traceback" not in out, (
                out
            )
        # and a call given up after --timeout-s ends then, not some 5 s later still waiting for the closed client
        # (timed from the client's first line: the interpreter's start on a busy machine is not the command's)
        p = subprocess.Popen(
            [sys.executable, "-m", "ledgerstore.cli", "topic", "produce", "t", "-v"]
            + ["--service-url", broker.service_url, "--timeout-s", "8"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert p.stdout is not None
        seen = []
        for line in p.stdout:
            seen.append(line)
            if "Getting connection from pool" in line:
                break
        t0 = time.monotonic()
        out = "".join(seen) + p.communicate(timeout=60)[0]
        took = time.monotonic() - t0
        assert p.returncode == cli.EXIT_UNAVAILABLE and "no answer within 8s" in out, out[-3000:]
        assert took < 8 + 3, took
    finally:
        broker.kill9()


def test_ledger_writes_that_a_hung_bookie_fails_end_in_one_line_not_a_traceback_per_entry(
    bookies: BookieFactory,
) -> None:
    """A bookie that stops answering (SIGSTOP: a hung disk or process) under `ledger simpletest`, with no bookie to
    replace it: the command said NOT_ENOUGH_BOOKIES in one line, then asyncio logged 'Future exception was never
    retrieved' with a traceback for every other entry in flight as the loop closed."""
    procs = bookies.start_many(3)
    procs[0].pause()
    try:
        r = _ls(
            "ledger", "simpletest", "-n", "20", "--zk", bookies.zk, "--zk-root", bookies.root, timeout=180
        )
    finally:
        procs[0].resume()
    assert r.returncode == cli.EXIT_UNAVAILABLE, r.stdout + r.stderr
    assert "never retrieved" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("ledgerstore: ")]
    assert len(errors) == 1 and "NOT_ENOUGH_BOOKIES" in errors[0], r.stderr[-3000:]


def test_a_ledger_larger_than_the_bookies_there_is_refused_saying_what_to_change(
    bookies: BookieFactory,
) -> None:
    """One bookie (a first `bookie serve` by hand) and `ledger simpletest`'s default ensemble of 3: it said only
    'NOT_ENOUGH_BOOKIES: need 3 writable bookies, have 1'; now also what to do (more bookies, or -E)."""
    bookies.start_many(1)
    at = ("--zk", bookies.zk, "--zk-root", bookies.root)
    r = _ls("ledger", "simpletest", "-n", "10", *at)
    assert r.returncode == cli.EXIT_UNAVAILABLE, r.stdout + r.stderr
    assert r.stderr.startswith("ledgerstore: NOT_ENOUGH_BOOKIES: need 3 writable bookies, have 1"), r.stderr
    assert (
        "start more bookies (`ledgerstore cluster status` lists them), or give the ledger fewer than -E 3"
        in (r.stderr)
    )
    r = _ls("ledger", "simpletest", "-n", "10", "-E", "1", "-W", "1", "-A", "1", *at)
    assert r.returncode == 0 and "simpletest OK" in r.stdout, r.stdout + r.stderr


def test_cluster_status_names_a_bookie_that_is_running_but_not_answering(tmp_path: Path) -> None:
    """A hung bookie (SIGSTOP) was listed 'up' like the others: its process exists. `cluster status` now adds
    that its /health does not answer."""
    state = tmp_path / "cluster"
    r = _ls("cluster", "up", *_ports(state, free_port()), timeout=180)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        pid = json.loads((state / "cluster.json").read_text())["bookies"][0]["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            s = _ls("cluster", "status", "--state-dir", str(state), timeout=60)
        finally:
            os.kill(pid, signal.SIGCONT)
        lines = s.stdout.splitlines()
        assert "NOT ANSWERING" in lines[1] and str(pid) in lines[1], s.stdout
        assert "NOT ANSWERING" not in lines[2], s.stdout
    finally:
        d = _ls("cluster", "down", "--state-dir", str(state), timeout=120)
        assert d.returncode == 0, d.stdout + d.stderr


def _before_any_code_of_ours(err: str) -> bool:
    """A KeyboardInterrupt that Python reported from its own start (a fatal error while it sets itself up, or a
    traceback through the console script's first import whose frames are the interpreter's only): there is no
    code of ours yet to take Ctrl-C."""
    if "KeyboardInterrupt" not in err:
        return False
    if err.startswith("Fatal Python error: init_"):
        return True
    repo = str(Path(cli.__file__).resolve().parents[1]) + "/"
    frames = re.findall(r'File "([^"]+)"', err)
    return err.startswith("Traceback") and not any(f.startswith(repo) and "/.venv/" not in f for f in frames)


def test_ctrl_c_while_the_command_is_still_starting_ends_it_without_a_traceback() -> None:
    """Ctrl-C in the first tenths of a second, while the command imports its modules, printed Python's
    KeyboardInterrupt traceback; it ends quietly now (by SIGINT, or 130 once the command runs)."""
    command = Path(sys.executable).with_name("ledgerstore")  # the console script an operator types
    for after_s in (0.04, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2, 0.3):
        p = subprocess.Popen(
            [str(command), "ledger", "list", "--zk", "127.0.0.1:1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        time.sleep(after_s)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
        if p.returncode == 1 and _before_any_code_of_ours(err):
            continue  # (a busy machine) it came while the interpreter itself started, before any code of ours
        assert p.returncode in (cli.EXIT_INTERRUPTED, -signal.SIGINT), (after_s, p.returncode, err)
        assert "Traceback" not in err, (after_s, err)


def test_ctrl_c_while_topic_produce_sends_ends_it_with_130_not_a_crash(broker: BrokerProcess) -> None:
    """Ctrl-C while `topic produce --batching` was inside pulsar-client's send_async (waiting for room in the
    client's queue) crashed the process about one time in ten (SIGSEGV in the client's C++ code). Ctrl-C is now
    taken between two sends; twelve interrupts at different moments of the sending all end with status 130."""
    pytest.importorskip("pulsar")
    for i in range(12):
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ledgerstore.cli",
                "topic",
                "produce",
                "t",
                "-n",
                "500000",
                "--batching",
                "-v",
            ]
            + ["--service-url", broker.service_url, "--timeout-s", "60"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        assert p.stdout is not None
        for line in p.stdout:  # the client's log (-v): sending from now on
            if "Created producer on broker" in line:
                break
        time.sleep(0.05 * i)
        p.send_signal(signal.SIGINT)
        rest, _ = p.communicate(timeout=60)
        assert p.returncode == cli.EXIT_INTERRUPTED, (i, p.returncode, rest[-3000:])
