"""The operator commands as a newcomer meets them (README.md, docs/operations.md, docs/cli.md), against real
ZooKeeper, bookie and broker processes: a mistake gets one clear line and the right exit status, never a
traceback, a hang or a success that did nothing."""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ledgerstore import cli
from ledgerstore.cluster import BrokerProcess
from tests.broker_testing import Brokers, start_broker
from tests.conftest import BookieFactory
from tests.zk_testing import make_test_server, unique_root
from zk import MetadataStore, cookies

LS = [sys.executable, "-m", "ledgerstore.cli"]


def _ls(bookies: BookieFactory, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [*LS, *args, "--zk", bookies.zk, "--zk-root", bookies.root]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr


def test_bookie_format_refuses_a_running_bookie_and_says_when_there_was_no_cookie(
    bookies: BookieFactory,
) -> None:
    (bp,) = bookies.start_many(1)
    r = _ls(bookies, "bookie", "format", "--bookie-id", bp.id, "--delete-cookie")
    assert r.returncode == cli.EXIT_ERROR, r.stdout + r.stderr
    assert "stop it first" in _one_line_error(r)
    with MetadataStore.connect(bookies.zk, root=bookies.root) as store:
        assert cookies.read_zk_cookie(store, bp.id) is not None  # the running bookie keeps its identity

    r = _ls(bookies, "bookie", "format", "--bookie-id", "127.0.0.1:1", "--delete-cookie", "--json")
    assert r.returncode == cli.EXIT_NOT_FOUND, r.stdout + r.stderr
    assert "no cookie" in json.loads(r.stdout)["error"]["message"]


def test_bookie_sanity_of_a_bookie_that_is_not_registered_says_so(bookies: BookieFactory) -> None:
    (bp,) = bookies.start_many(1)
    r = _ls(bookies, "bookie", "sanity", "--bookie-id", "127.0.0.1:1", "--bookie-id", bp.id, "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    got = json.loads(r.stdout)
    assert got[bp.id]["ok"] and not got["127.0.0.1:1"]["ok"]
    assert "not registered" in got["127.0.0.1:1"]["error"]  # not "the writes moved to other bookies"
    assert _ls(bookies, "ledger", "list", "--json").stdout.strip() == "[]"  # nothing left behind


def test_a_password_ledger_read_without_one_and_a_wrong_root_say_what_to_check(
    bookies: BookieFactory,
) -> None:
    bookies.start_many(3)
    r = _ls(bookies, "ledger", "write", "-n", "3", "--password", "pw", "--json")
    lid = json.loads(r.stdout)["ledger_id"]
    r = _ls(bookies, "ledger", "read", str(lid))
    assert r.returncode == cli.EXIT_UNAUTHORIZED, r.stdout + r.stderr
    assert "none was given (--password" in _one_line_error(r)
    r = _ls(bookies, "ledger", "read", str(lid), "--password", "wrong")
    assert r.returncode == cli.EXIT_UNAUTHORIZED and "none was given" not in _one_line_error(r)

    # no cluster there, while the bookies' root holds one: not an empty answer, an error
    wrong = bookies.root + "x"  # a typo of its root (looks_mistyped)
    for verb in ("list", "bookies"):
        r = subprocess.run(
            [*LS, "ledger", verb, "--zk", bookies.zk, "--zk-root", wrong], capture_output=True, text=True
        )
        assert r.returncode == cli.EXIT_NOT_FOUND, r.stdout + r.stderr
        line = _one_line_error(r)
        assert f"no cluster under --zk-root {wrong} in ZooKeeper {bookies.zk}" in line, line
        assert bookies.root in line and "check --zk-root" in line, line


def _subscription_stats(b: BrokerProcess, topic: str, sub: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{b.http_port}/admin/v2/persistent/public/default/{topic}/stats"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            stats: dict[str, Any] = json.loads(r.read())
    except OSError:
        return {}
    return dict(stats.get("subscriptions", {}).get(sub, {}))


def _consumers(b: BrokerProcess, topic: str, sub: str) -> int:
    return len(_subscription_stats(b, topic, sub).get("consumers", []))


def _backlog(b: BrokerProcess, topic: str, sub: str) -> int:
    return int(_subscription_stats(b, topic, sub).get("msgBacklog", 0))


def test_topic_consume_into_a_closed_pipe_or_interrupted_ends_quietly(cluster: Brokers) -> None:
    b = cluster.start()
    url = ["--service-url", b.service_url]
    r = subprocess.run(
        [*LS, "topic", "produce", "piped", "-m", "message", "-n", "1000", "--batching", *url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    # `head -1` exits after its line while consume still writes: the pipe closes in the middle of the loop
    consume = shlex.join([*LS, "topic", "consume", "piped", "-s", "sub", "-n", "1000", *url])
    r = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {consume} | head -1"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stderr == "" and len(r.stdout.splitlines()) == 1

    # Ctrl-C while it waits for messages: it ended only at --timeout-s, blocked in the client's receive
    waiting = subprocess.Popen(
        [*LS, "topic", "consume", "piped", "-s", "other", "-n", "0", "--timeout-s", "120", *url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: a suite started in the background by a non-interactive shell ignores SIGINT, and
        # a child keeps an ignored SIGINT ignored (Python does not install its handler then)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # subscribed, consumed the backlog and waiting (the broker shows its consumer); a fixed sleep sent the
    # interrupt before the subscription when the machine was loaded
    deadline = time.monotonic() + 60
    while not _consumers(b, "piped", "other") or _backlog(b, "piped", "other"):
        assert time.monotonic() < deadline and waiting.poll() is None, (
            "consume never subscribed and caught up"
        )
        time.sleep(0.2)
    time.sleep(0.5)
    waiting.send_signal(signal.SIGINT)
    try:
        rc = waiting.wait(15)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert rc == cli.EXIT_INTERRUPTED
    assert waiting.stderr is not None and "Traceback" not in waiting.stderr.read()


def test_produce_and_consume_give_up_when_the_brokers_zookeeper_is_down(tmp_path: Path) -> None:
    with make_test_server() as zk:
        bookies = BookieFactory(zk.connect_string, unique_root(), tmp_path)
        broker: BrokerProcess | None = None
        try:
            bookies.start_many(1)
            broker = start_broker(
                bookies, tmp_path, 4, "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1"
            )
            broker.wait_ready(60)
            url = ["--service-url", broker.service_url, "--timeout-s", "5"]
            r = subprocess.run(
                [*LS, "topic", "produce", "t", *url], capture_output=True, text=True, timeout=120
            )
            assert r.returncode == 0, r.stderr
            zk.stop()
            for verb in (["produce", "t"], ["consume", "t", "-s", "s"]):
                t0 = time.monotonic()
                r = subprocess.run([*LS, "topic", *verb, *url], capture_output=True, text=True, timeout=120)
                assert r.returncode == cli.EXIT_UNAVAILABLE, (verb, r.stdout, r.stderr)
                assert "no answer within 5s" in _one_line_error(r)
                assert time.monotonic() - t0 < 30  # it hung for good before
            # the broker says so in one line per request, without a traceback
            log = broker.log_path.read_text(errors="replace") if broker.log_path else ""
            assert "ZooKeeper unavailable" in log, broker.log_tail(40)
            assert "Traceback" not in log, broker.log_tail(40)
        finally:
            if broker is not None:
                broker.kill9()
            for bp in bookies.procs:
                bp.kill9()


def test_usage_errors_and_missing_files_name_what_is_wrong(bookies: BookieFactory, tmp_path: Path) -> None:
    r = _ls(bookies, "ledger", "read", "abc")  # usage: the line says "ledgerstore: " once
    assert r.returncode == cli.EXIT_USAGE
    assert r.stderr.startswith("ledgerstore: ledger read: argument ledger_id: invalid int value: 'abc'\n")
    r = _ls(bookies, "ledger", "read", "1", "--first", "-5")
    assert r.returncode == cli.EXIT_USAGE and "--first -5" in r.stderr
    r = _ls(bookies, "topic", "create", "t", "--partitions", "-1", "--url", "http://127.0.0.1:1")
    assert r.returncode == cli.EXIT_USAGE and "--partitions -1" in r.stderr

    r = _ls(bookies, "ledger", "list", "--auth-token-file", str(tmp_path / "nope"))
    assert r.returncode == cli.EXIT_NOT_FOUND and "--auth-token-file: No such file" in _one_line_error(r)
    secret = tmp_path / "secret"
    assert subprocess.run([*LS, "auth", "create-secret", str(secret)], capture_output=True).returncode == 0
    r = _ls(bookies, "ledger", "list", "--auth-token-file", str(secret))  # the secret, not a token
    assert r.returncode == cli.EXIT_ERROR and "holds no token" in _one_line_error(r)
    r = _ls(bookies, "ledger", "write", "--input", str(tmp_path / "nope"))
    assert r.returncode == cli.EXIT_NOT_FOUND and "--input: No such file" in _one_line_error(r)


def test_a_bookkeeper_shell_verb_is_answered_with_the_command_to_type(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv, expected in (
        (["listbookies"], "`ledgerstore ledger bookies`"),
        (["shell", "readledger", "7"], "`ledgerstore ledger read LEDGER_ID`"),
        (["--zk", "h:1", "shell", "listunderreplicated"], "`ledgerstore ledger underreplicated`"),
        (["shell", "nosuchverb"], "there is no `shell` command"),
    ):
        assert cli.main(argv) == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert expected in err and "Traceback" not in err, (argv, err)
    placeholders = {"LEDGER_ID": "1", "BOOKIE": "h:1", "NEW": "h:2", "ID": "h:1", "DIR": "/d"}
    for equivalent in cli.BOOKKEEPER_VERBS.values():  # every suggestion is a command line that parses
        words = re.sub(r"\[[^]]*\]", "", equivalent).split()
        cli.build_parser().parse_args([placeholders.get(w, w) for w in words])


def test_autorecovery_status_tells_a_finished_decommission_from_one_under_way(bookies: BookieFactory) -> None:
    from zk.underreplication import UnderReplicationManager

    (running,) = bookies.start_many(1)
    gone = "127.0.0.1:1"  # marked, no cookie, not registered: what a finished decommission leaves
    with MetadataStore.connect(bookies.zk, root=bookies.root) as store:
        m = UnderReplicationManager(store)
        m.start_decommission(running.id)  # marked and still holding its cookie: under way or unfinished
        m.start_decommission(gone)
    r = _ls(bookies, "autorecovery", "status")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert f"  {gone}  done (stopped): its data moved, cookie deleted" in lines, r.stdout
    assert any(line.startswith(f"  {running.id}  in progress, or unfinished") for line in lines), r.stdout
    states = json.loads(_ls(bookies, "autorecovery", "status", "--json").stdout)["decommission_state"]
    assert states[gone].startswith("done") and states[running.id].startswith("in progress")


def test_no_zookeeper_at_the_address_says_so_once_and_what_to_check() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run(
        [*LS, "ledger", "list", "--zk", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == cli.EXIT_UNAVAILABLE, r.stdout + r.stderr
    line = _one_line_error(r)
    assert line.count(f"127.0.0.1:{port}") == 1, line  # the address once, not once per wrapping layer
    assert "is it running? (`ledgerstore cluster status`; --zk HOST:PORT" in line
