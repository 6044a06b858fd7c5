"""`ledgerstore cluster up|status|down|stop|start` as a user runs it: real ZooKeeper, bookie and AutoRecovery
processes; the state file as this version writes it and as older versions wrote it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerstore.cluster import _pid_alive as _alive
from ledgerstore.cluster import free_port, health_ok
from zk import launcher


def _ls(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerstore.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _ports(state: Path, bookie_http: int) -> list[str]:
    return [
        "--state-dir", str(state),
        "--bookies", "2",
        "--brokers", "0",
        "--no-autorecovery",
        "--zk-port", str(free_port()),
        "--base-port", str(free_port()),
        "--bookie-http-port", str(bookie_http),
    ]  # fmt: skip


def test_cluster_up_refuses_a_port_in_use_and_names_it_then_starts_on_free_ones(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    with socket.socket() as holder:  # another program on the port the second bookie's HTTP would take
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        r = _ls("cluster", "up", *_ports(state, taken - 1))
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"{taken} (bookie-1's admin HTTP port (--bookie-http-port))" in r.stderr + r.stdout
        assert not (state / "cluster.json").exists()  # nothing was started
        # ZooKeeper's: named with its option too (it said "already in use (another ZooKeeper?)", exit 1)
        r = _ls("cluster", "up", *_ports(state, free_port()), "--zk-port", str(taken))
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"{taken} (ZooKeeper's port (--zk-port; or --zk HOST:PORT: one that runs))" in r.stderr, (
            r.stderr
        )
        assert not launcher.status(state).running
    http = free_port()
    r = _ls("cluster", "up", *_ports(state, http))
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        st = json.loads((state / "cluster.json").read_text())
        assert [b["http_port"] for b in st["bookies"]] == [http, http + 1]
        s = _ls("cluster", "status", "--state-dir", str(state), "--json")
        assert s.returncode == 0, s.stderr
        rows = json.loads(s.stdout)["bookies"]
        assert [(b["alive"], b["health"]["status"], b["http_port"]) for b in rows] == [
            (True, "ok", http),
            (True, "ok", http + 1),
        ]
    finally:
        d = _ls("cluster", "down", "--state-dir", str(state))
        assert d.returncode == 0, d.stdout + d.stderr


def test_a_cluster_up_that_fails_half_way_stops_what_it_started(tmp_path: Path) -> None:
    """Its bookies up, its AutoRecovery process failing (a password file that is not there): `cluster up` left
    the bookies and ZooKeeper running without a cluster.json, so `cluster down` stopped none of them and the next
    `cluster up` was told their ports were in use. It stops what it started and says so, with the cause; then
    `cluster down` says there is no cluster there (it said '0 brokers and 0 bookies stopped', as if it had)."""
    state = tmp_path / "cluster"
    http = free_port()
    missing = tmp_path / "passwords"
    ar = ("--autorecovery-process", "--autorecovery-password-file", str(missing), "--autorecovery-port")
    r = _ls("cluster", "up", *_ports(state, http), *ar, str(free_port()))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"cluster up failed, and stopped what it had started (logs in {state}): autorecovery" in r.stderr
    assert f"--password-file: [Errno 2] No such file or directory: '{missing}'" in r.stderr, r.stderr
    assert (state / "bookie-1.log").exists()  # its bookies did start: their logs stay
    assert not (state / "cluster.json").exists()
    assert not health_ok(http) and not health_ok(http + 1)
    assert not launcher.status(state).running
    # a directory without a cluster: status and down say so, and where a cluster is found
    hint = f"no cluster in {state} (no cluster.json; a cluster started with `cluster up --state-dir DIR` is found"
    s = _ls("cluster", "status", "--state-dir", str(state))
    assert s.returncode == 1 and s.stdout.startswith(hint), s.stdout + s.stderr
    d = _ls("cluster", "down", "--state-dir", str(state))
    assert d.returncode == 0 and d.stdout.startswith(hint) and "nothing to stop" in d.stdout, (
        d.stdout + d.stderr
    )


def test_a_cluster_of_fewer_bookies_than_a_brokers_default_ensemble_serves_topics(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`cluster up --bookies 1`: its broker asked for ensembles of 3 (its default), so every producer was told
    NOT_ENOUGH_BOOKIES for ever, and no `cluster up` flag could change it. Its topics' ledgers now use the bookies
    there are, after a restart of the broker too (its flags are in its row)."""
    state = tmp_path / "cluster"
    request.addfinalizer(lambda: _ls("cluster", "down", "--state-dir", str(state)))
    broker, http = free_port(), free_port()
    ports = ("--broker-port", str(broker), "--broker-http-port", str(http))
    r = _ls("cluster", "up", *_ports(state, free_port()), "--bookies", "1", "--brokers", "1", *ports)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(--ensemble-size 1 --write-quorum 1 --ack-quorum 1: only --bookies 1)" in r.stdout, r.stdout
    urls = ("--service-url", f"pulsar://127.0.0.1:{broker}", "--url", f"http://127.0.0.1:{http}")
    p = _ls("topic", "produce", "t", "-m", "on one bookie", *urls, timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    assert _ls("cluster", "restart", "broker-0", "--state-dir", str(state)).returncode == 0
    c = _ls("topic", "consume", "t", "-s", "s", "-n", "1", *urls, timeout=90)
    assert c.returncode == 0 and "on one bookie" in c.stdout, c.stdout + c.stderr


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, list[str]]:
    """2 bookies and a standalone AutoRecovery process (its state directory and `cluster up` options); `down` at
    the end unless the test did it."""
    state = tmp_path / "cluster"
    request.addfinalizer(
        lambda: (state / "cluster.json").exists() and _ls("cluster", "down", "--state-dir", str(state))
    )
    options = [*_ports(state, free_port()), "--autorecovery-process", "--autorecovery-port", str(free_port())]
    r = _ls("cluster", "up", *options)
    assert r.returncode == 0, r.stdout + r.stderr
    return state, options


def test_zk_and_zk_root_other_than_the_recorded_ones_are_refused_not_ignored(
    cluster: tuple[Path, list[str]],
) -> None:
    """`cluster stop bookie-0 --zk OTHER` stopped the state file's bookie whatever --zk said: a --zk or --zk-root
    given to a command on a recorded cluster must name its own (a check for scripts that pass them everywhere)."""
    cluster, _ = cluster
    st = json.loads((cluster / "cluster.json").read_text())
    at = ("--state-dir", str(cluster))
    pid = st["bookies"][0]["pid"]
    for command in (
        ("stop", "bookie-0", "--zk", "127.0.0.1:1"),
        ("restart", "bookie-0", "--kill", "--zk-root", "/elsewhere"),
        ("start", "autorecovery", "--zk=127.0.0.1:1", "--zk-root", st["zk_root"]),
        ("status", "--zk-root", "/elsewhere"),
        ("down", "--zk", "127.0.0.1:1"),
    ):
        r = _ls("cluster", *command, *at)
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        assert (
            f"acts on the cluster {cluster}/cluster.json records (ZooKeeper {st['zk']}, root" in r.stderr
        ), r.stderr
        assert _alive(pid), command
    # the recorded ones, given, are accepted (before the subcommand too, as every global option)
    r = _ls("--zk", st["zk"], "cluster", "status", "--zk-root", st["zk_root"] + "/", *at)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _ls("cluster", "stop", "bookie-0", "--zk", st["zk"], *at)
    assert r.returncode == 0 and not _alive(pid), r.stdout + r.stderr


def test_a_state_file_of_an_older_cluster_up_is_listed_stopped_or_refused_saying_what_to_do(
    cluster: tuple[Path, list[str]],
) -> None:
    """cluster.json as `cluster up` wrote it before it recorded how it started each piece (417b1bc): no bookie
    port, log, AutoRecovery flags, no passwords of the AutoRecovery process. `status` and `down` work on it;
    `stop|start|restart` of a piece it cannot start again as it was refuse before stopping anything, and say to
    go down and up again with the same options, which keeps the data."""
    cluster, options = cluster
    f = cluster / "cluster.json"
    st = json.loads(f.read_text())
    old = {
        **{k: st[k] for k in ("zk", "zk_external", "zk_root", "brokers")},
        "bookies": [{k: b[k] for k in ("id", "pid", "http_port", "data_dir")} for b in st["bookies"]],
        "autorecovery": {k: st["autorecovery"][k] for k in ("pid", "metrics_port")},
    }
    f.write_text(json.dumps(old))
    at = ("--state-dir", str(cluster))
    s = _ls("cluster", "status", "--json", *at)
    assert s.returncode == 0, s.stdout + s.stderr
    assert [b["alive"] for b in json.loads(s.stdout)["bookies"]] == [True, True]
    for command in (
        ("stop", "bookie-1"),
        ("restart", "autorecovery", "--kill"),
        ("start", st["bookies"][0]["id"]),
    ):
        r = _ls("cluster", *command, *at)
        assert r.returncode == 1, (command, r.stdout, r.stderr)
        assert "was written by an older `cluster up`" in r.stderr, r.stderr
        assert f"`ledgerstore cluster down --state-dir {cluster}`, then `ledgerstore cluster up" in r.stderr
    assert all(_alive(p["pid"]) for p in [*old["bookies"], old["autorecovery"]])
    assert json.loads(f.read_text()) == old
    d = _ls("cluster", "down", *at)
    said = "2 bookies and the AutoRecovery process stopped, ZooKeeper stopped"  # (9e793d5 counts the latter)
    assert d.returncode == 0 and said in d.stdout, d.stdout + d.stderr
    assert not any(_alive(p["pid"]) for p in [*old["bookies"], old["autorecovery"]])
    # up again with the same options: the same bookies on their data, and now stop|start work
    r = _ls("cluster", "up", *options)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _ls("cluster", "restart", "bookie-1", *at)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _ls("cluster", "status", *at).returncode == 0


def test_the_zk_root_a_cluster_was_started_with_is_accepted_as_given_then(tmp_path: Path) -> None:
    """`cluster up --zk-root /r/` records the root as typed; `cluster status|down --zk-root /r/`, the same
    string, was refused as another root (the check compared it, trailing slash dropped, with the record as is)."""
    state = tmp_path / "cluster"
    root = f"/ls-{tmp_path.name[-12:]}/"
    up = _ls("cluster", "up", *_ports(state, free_port()), "--bookies", "1", "--zk-root", root)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        r = _ls("cluster", "status", "--zk-root", root, "--state-dir", str(state))
        assert r.returncode == 0, r.stdout + r.stderr
        r = _ls("cluster", "status", "--zk-root", root.rstrip("/") + "x", "--state-dir", str(state))
        assert r.returncode == 2, r.stdout + r.stderr  # another root is still refused
    finally:
        down = _ls("cluster", "down", "--zk-root", root, "--state-dir", str(state))
        if down.returncode != 0:
            _ls("cluster", "down", "--state-dir", str(state))  # (stop it all the same)
    assert down.returncode == 0, down.stdout + down.stderr
