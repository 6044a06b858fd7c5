"""The operator's bad day with the cluster commands, against real ZooKeeper and bookie processes: pieces of a
`cluster up` cluster stopped under it, or a bookie pointed at a mistyped --zk-root, get one clear line and the right
exit status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerstore import cli
from ledgerstore.cluster import BookieProcess, _pid_alive, free_port
from tests.broker_testing import start_broker
from tests.conftest import BookieFactory
from tests.integration.test_cluster_cli import _ports
from tests.zk_testing import make_test_server, wait_for
from zk import MetadataStore, cookies, launcher


def _ls(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerstore.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_cluster_status_says_once_that_zookeeper_is_unreachable_and_exits_unavailable(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    r = _ls("cluster", "up", *_ports(state, free_port()))
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        zk = json.loads((state / "cluster.json").read_text())["zk"]
        pid = launcher.status(state).pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # there but not answering
        try:
            s = _ls("cluster", "status", "--state-dir", str(state))
        finally:
            os.kill(pid, signal.SIGCONT)
        assert s.returncode == cli.EXIT_UNAVAILABLE, s.stdout + s.stderr
        assert s.stdout.count("ZooKeeper") == 1, s.stdout
        assert f"ZooKeeper {zk} UNREACHABLE: no session within" in s.stdout, s.stdout
        assert "bookie" in s.stdout  # the processes are still listed
        assert launcher.cli_stop(state)  # gone: the line says how to start it again
        s = _ls("cluster", "status", "--state-dir", str(state), "--json")
        assert s.returncode == cli.EXIT_UNAVAILABLE, s.stdout + s.stderr
        out = json.loads(s.stdout)
        assert out["zk_reachable"] is False, out
        assert f"`ledgerstore zk start --state-dir {state} --port {zk.rpartition(':')[2]}`" in out["zk_error"]
        s = _ls("cluster", "status", "--state-dir", str(state))
        assert s.stdout.splitlines()[0].startswith(f"ZooKeeper {zk} UNREACHABLE: not running"), s.stdout
        launcher.cli_start(state, int(zk.rpartition(":")[2]))
        s = _ls("cluster", "status", "--state-dir", str(state), "--json")
        assert s.returncode == 0 and json.loads(s.stdout)["zk_reachable"] is True, s.stdout + s.stderr
    finally:
        d = _ls("cluster", "down", "--state-dir", str(state))
        assert d.returncode == 0, d.stdout + d.stderr


def test_a_bookie_refuses_a_zk_root_that_holds_no_cluster_unless_told_to_create_one(
    bookies: BookieFactory, zk_store: MetadataStore, tmp_path: Path
) -> None:
    bookies.start()  # a cluster under bookies.root (BookieProcess gives --init-cluster, as cluster up)
    typo = bookies.root + "x"  # a typo (looks_mistyped), not another cluster
    bp = BookieProcess(
        zk=bookies.zk,
        zk_root=typo,
        data_dir=tmp_path / "lonely",
        port=free_port(),
        http_port=free_port(),
        init_cluster=False,
    )
    bp.start(wait=False)
    assert bp.wait_exit(60) == cli.EXIT_NOT_FOUND
    log = bp.log_tail(100)
    assert "Traceback" not in log, log
    refusal = [line for line in log.splitlines() if "refusing to start" in line]
    assert len(refusal) == 1, log
    assert f"no cluster under --zk-root {typo} in ZooKeeper {bookies.zk}" in refusal[0], refusal[0]
    assert bookies.root in refusal[0] and "--init-cluster" in refusal[0], refusal[0]
    with MetadataStore.connect(bookies.zk, "/") as top:  # nothing left behind under the mistyped root
        assert not top.exists(typo.lstrip("/")), top.children(typo.lstrip("/"))
    bp.init_cluster = True  # told to: a new cluster there, with its own instance id
    bp.start()
    try:
        with MetadataStore.connect(bookies.zk, typo) as other:
            assert cookies.instance_id(other, create=False) != cookies.instance_id(zk_store, create=False)
    finally:
        bp.stop()
        with MetadataStore.connect(bookies.zk, "/") as top:
            top.delete(typo.lstrip("/"), recursive=True, missing_ok=True)


def test_the_first_bookies_of_a_new_deployment_create_its_cluster_without_being_told(tmp_path: Path) -> None:
    """A ZooKeeper that holds no cluster at all (a new deployment: `docker run ... bookie serve --zk ...` as the
    image's comment shows) is no mistyped root: its first bookies create the cluster, and two started at once
    agree on it (one of them finds the other's instance id, not a cluster elsewhere to refuse for)."""
    zk = make_test_server()
    zk.start()
    procs = [
        BookieProcess(
            zk=zk.connect_string,
            zk_root="/ledgerstore",
            data_dir=tmp_path / f"b{i}",
            port=free_port(),
            http_port=free_port(),
            init_cluster=False,
        )
        for i in range(2)
    ]
    try:
        for bp in procs:
            bp.start(wait=False)
        for bp in procs:
            bp.wait_healthy(60)
        with MetadataStore.connect(zk.connect_string, "/ledgerstore") as store:
            iid = cookies.instance_id(store, create=False)
            for bp in procs:
                cookie = cookies.read_zk_cookie(store, bp.id)
                assert cookie is not None and cookie.value.instance_id == iid, (cookie, bp.log_tail(20))
    finally:
        for bp in procs:
            bp.stop()
        zk.stop()


def test_a_second_bookie_on_the_same_port_or_directory_says_which_and_the_first_serves_on(
    bookies: BookieFactory, tmp_path: Path
) -> None:
    first = bookies.start()

    def second(data_dir: Path, port: int) -> str:
        bp = BookieProcess(
            zk=bookies.zk,
            zk_root=bookies.root,
            data_dir=data_dir,
            port=port,
            http_port=free_port(),
            log_path=tmp_path / f"second-{port}-{data_dir.name}.log",
        )
        bp.start(wait=False)
        status = bp.wait_exit(60)
        log = bp.log_tail(100)
        assert "Traceback" not in log, log
        refusal = [line for line in log.splitlines() if "refusing to start" in line]
        assert len(refusal) == 1, log
        return f"{status} {refusal[0]}"

    # the same id (port), another directory
    line = second(tmp_path / "elsewhere", first.port)
    assert line.startswith("3 ") and f"bookie {first.id} is running already" in line, line
    # the same directory and id: RocksDB's lock says another process has it
    line = second(first.data_dir, first.port)
    assert (
        line.startswith("1 ") and f"its data directory {first.data_dir} is in use by another process" in line
    )
    # the same directory, another id: its cookie names the bookie it belongs to
    line = second(first.data_dir, free_port())
    assert line.startswith("3 ") and f"belongs to bookie {first.id}" in line, line
    assert first.healthy()


def test_cluster_up_over_a_cluster_whose_bookies_died_names_what_is_still_up(tmp_path: Path) -> None:
    """Every bookie gone, the broker still running: `cluster up` again says that the cluster is partly up and
    how to start it over, not that its own broker's ports are 'in use, pick free ones'."""
    state = tmp_path / "cluster"
    up = [*_ports(state, free_port()), "--brokers", "1"]
    up += ["--broker-port", str(free_port()), "--broker-http-port", str(free_port())]
    r = _ls("cluster", "up", *up)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        st = json.loads((state / "cluster.json").read_text())
        for b in st["bookies"]:
            os.kill(b["pid"], signal.SIGKILL)
        assert wait_for(lambda: not any(_pid_alive(b["pid"]) for b in st["bookies"]), timeout_s=30)
        again = _ls("cluster", "up", *up)
        assert again.returncode == cli.EXIT_ERROR, again.stdout + again.stderr
        assert "ports in use" not in again.stderr and len(again.stderr.strip().splitlines()) == 1, (
            again.stderr
        )
        broker = st["brokers"][0]["id"]
        assert f"a partial cluster is running from {state} (still up: broker {broker})" in again.stderr
        assert f"`ledgerstore cluster down --state-dir {state}` first" in again.stderr
    finally:
        d = _ls("cluster", "down", "--state-dir", str(state))
        assert d.returncode == 0, d.stdout + d.stderr


def test_topic_produce_to_a_broker_without_bookies_says_what_the_broker_answered(
    bookies: BookieFactory, tmp_path: Path
) -> None:
    """A broker started before any bookie answers each producer 'cannot create a ledger: NOT_ENOUGH_BOOKIES'
    (retryable) and the client retries: the command gives up after --timeout-s with that answer, once, and exit
    status 5; it said only 'no answer' and then aborted in pulsar-client's teardown (status 134)."""
    pytest.importorskip("pulsar")
    with MetadataStore.connect(bookies.zk, bookies.root) as store:  # a cluster whose bookies are all away (a
        cookies.instance_id(store)  # root with none while others hold one is refused as a mistyped --zk-root)
    broker = start_broker(bookies, tmp_path, 4)
    try:
        broker.wait_ready(60)
        url = ["--service-url", broker.service_url, "--timeout-s", "5"]
        for verb in (["produce", "t"], ["consume", "t", "-s", "s"]):
            r = _ls("topic", *verb, *url)
            assert r.returncode == cli.EXIT_UNAVAILABLE, (verb, r.returncode, r.stdout, r.stderr)
            assert "terminate called" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
            assert "no answer within 5s; the broker answered: " in r.stderr, r.stderr
            assert "NOT_ENOUGH_BOOKIES" in r.stderr, r.stderr
    finally:
        broker.kill9()


def test_topic_produce_whose_bookies_died_says_the_broker_could_not_store_it(
    bookies: BookieFactory, tmp_path: Path
) -> None:
    pytest.importorskip("pulsar")
    (bp,) = bookies.start_many(1)
    broker = start_broker(
        bookies, tmp_path, 4, "--ensemble-size", "1", "--write-quorum", "1", "--ack-quorum", "1"
    )
    try:
        broker.wait_ready(60)
        url = ["--service-url", broker.service_url, "--timeout-s", "5"]
        assert _ls("topic", "produce", "t", *url).returncode == 0
        bp.kill9()
        r = _ls("topic", "produce", "t", *url)
        assert r.returncode == cli.EXIT_UNAVAILABLE, (r.returncode, r.stdout, r.stderr)
        assert "terminate called" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "then none within 5s: the broker could not store it" in r.stderr, r.stderr
    finally:
        broker.kill9()


def test_a_bookie_restarted_right_after_a_crash_says_it_waits_for_its_old_registration(
    bookies: BookieFactory,
) -> None:
    bp = bookies.start()
    bp.kill9()
    bp.start(wait=False)
    # while it waits, /health says so (503 "starting"): whoever waits for a healthy bookie (the harness, `cluster
    # up`, a container's health check) must not take it for one that clients can find
    said = f"bookies/available/{bp.id} is registered by another ZooKeeper session"
    assert wait_for(lambda: said in bp.log_tail(200), timeout_s=30), bp.log_tail(200)
    answer = _health(bp.http_port)
    assert answer[0] == 503 and answer[1]["status"] == "starting", answer
    assert "registering" in answer[1]["reason"], answer
    assert not bp.healthy()
    bp.wait_healthy(60)  # registered once the crashed process's session has expired
    log = bp.log_tail(200)
    assert "waiting up to" in log and "Traceback" not in log, log
    assert _health(bp.http_port) == (200, {"status": "ok", "readonly": False, "bookie_id": bp.id})


def _health(http_port: int) -> tuple[int, dict[str, object]]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
