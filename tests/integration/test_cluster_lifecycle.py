"""`ledgerstore cluster stop|start|restart TARGET` on a `cluster up` cluster: real ZooKeeper, bookie, broker and
AutoRecovery processes, a ledger written through the client and a pulsar-client producer across the faults."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger_client import BookKeeper, ClientConfig
from ledgerstore.cluster import _pid_alive as _alive
from ledgerstore.cluster import free_port


def _ls(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerstore.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _status(state: Path) -> tuple[int, dict[str, object]]:
    s = _ls("cluster", "status", "--state-dir", str(state), "--json")
    return s.returncode, json.loads(s.stdout)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    """3 bookies (no AutoRecovery in them), a broker and a standalone AutoRecovery; `down` at the end."""
    state = tmp_path / "cluster"
    r = _ls(
        "cluster", "up",
        "--state-dir", str(state),
        "--bookies", "3",
        "--brokers", "1",
        "--no-autorecovery",
        "--autorecovery-process",
        "--zk-port", str(free_port()),
        "--base-port", str(free_port()),
        "--bookie-http-port", str(free_port()),
        "--broker-port", str(free_port()),
        "--broker-http-port", str(free_port()),
        "--autorecovery-port", str(free_port()),
    )  # fmt: skip
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        yield state
    finally:
        if (state / "cluster.json").exists():
            _ls("cluster", "down", "--state-dir", str(state))


def test_a_killed_bookie_is_started_again_while_a_ledger_is_written_then_down_stops_everything(
    cluster: Path,
) -> None:
    st = json.loads((cluster / "cluster.json").read_text())
    ids = [b["id"] for b in st["bookies"]]
    victim = st["bookies"][1]
    at = ("--state-dir", str(cluster))

    # an unknown target is a usage error naming the valid ones; starting a running piece changes nothing
    r = _ls("cluster", "stop", "bookie-7", "--state-dir", str(cluster))
    assert r.returncode == 2, r.stdout + r.stderr
    for name in (
        "bookie-0",
        ids[2],
        "broker-0",
        st["brokers"][0]["service_url"],
        "autorecovery",
        "zookeeper",
    ):
        assert name in r.stderr, r.stderr
    r = _ls("cluster", "start", ids[1], "--state-dir", str(cluster))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == f"bookie {ids[1]} (bookie-1) is running already (pid {victim['pid']})", (
        r.stdout
    )
    assert json.loads((cluster / "cluster.json").read_text()) == st

    def crash_and_start() -> list[subprocess.CompletedProcess[str]]:
        """kill -9, status, start at once: the crashed process's session has not expired when it starts"""
        return [
            _ls("cluster", "stop", "bookie-1", "--kill", *at),
            _ls("cluster", "status", "--json", *at),
            _ls("cluster", "start", "bookie-1", *at),
        ]

    async def write() -> tuple[int, list[list[str]], list[subprocess.CompletedProcess[str]]]:
        bk = await BookKeeper.connect(st["zk"], config=ClientConfig(zk_root=st["zk_root"]))
        try:
            lh = await bk.create_ledger(2, 2, 2, bookies=ids[:2])
            n = 0
            for _ in range(20):
                await lh.append(b"entry-%d" % n)
                n += 1
            # crashed and started again while the ledger is open and being written: the writes go on
            commands = asyncio.create_task(asyncio.to_thread(crash_and_start))
            while not commands.done() or n < 60:
                await lh.append(b"entry-%d" % n)
                n += 1
            await lh.close()
            md = await bk.ledger_metadata(lh.ledger_id)
            reader = await bk.open_ledger(lh.ledger_id, recovery=False)
            got = [e.data async for e in reader.read(0, n - 1)]
            assert got == [b"entry-%d" % i for i in range(n)]
            return n, [list(e.bookies) for e in md.ensembles], await commands
        finally:
            await bk.close()

    n, ensembles, (killed, down, r) = asyncio.run(write())
    assert n >= 60
    # an ensemble change; the sealed first ensemble may have been re-replicated off the killed bookie too (the
    # AutoRecovery process does so once the bookie is gone for its session timeout, as the start waits)
    assert len(ensembles) >= 2 and ensembles[-1] == [ids[0], ids[2]], ensembles
    assert ensembles[0] in (ids[:2], [ids[0], ids[2]]), ensembles
    assert not _alive(victim["pid"])
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert killed.stdout.strip() == f"bookie {ids[1]} (bookie-1) killed (SIGKILL)", killed.stdout
    assert down.returncode == 1, down.stdout + down.stderr
    assert [b["alive"] for b in json.loads(down.stdout)["bookies"]] == [True, False, True]

    # started right after the crash: ready once its crashed predecessor's session has expired, which it says
    assert r.returncode == 0, r.stdout + r.stderr
    new_pid = json.loads((cluster / "cluster.json").read_text())["bookies"][1]["pid"]
    assert new_pid != victim["pid"] and _alive(new_pid)
    assert r.stdout.strip() == f"bookie {ids[1]} (bookie-1) started (pid {new_pid})", r.stdout
    log_text = (cluster / "bookie-1.log").read_text()  # the same log file, appended to
    if "is registered by another ZooKeeper session" in log_text:
        # it waited for the crashed process's registration (not when that session expired before it started,
        # which a loaded machine can make happen): the start said so
        assert "/health says starting" in r.stderr and "session" in r.stderr, r.stderr
    assert "Traceback" not in log_text
    code, status = _status(cluster)
    assert code == 0, status
    rows = status["bookies"]
    assert [(b["id"], b["alive"], b["health"]["status"]) for b in rows] == [  # type: ignore[attr-defined]
        (i, True, "ok") for i in ids
    ]
    assert rows[1]["pid"] == new_pid  # type: ignore[index]
    assert rows[1]["data_dir"] == victim["data_dir"]  # type: ignore[index]

    # `down` stops every process, the one started again included
    pids = [b["pid"] for b in json.loads((cluster / "cluster.json").read_text())["bookies"]]
    pids += [st["brokers"][0]["pid"], st["autorecovery"]["pid"]]
    d = _ls("cluster", "down", *at)
    assert d.returncode == 0, d.stdout + d.stderr
    assert "1 broker, 3 bookies and the AutoRecovery process stopped, ZooKeeper stopped" in d.stdout, d.stdout
    assert [p for p in pids if _alive(p)] == []


def test_the_broker_restarted_and_a_producer_reconnects_stopped_pieces_show_down(cluster: Path) -> None:
    import pulsar

    at = ("--state-dir", str(cluster))
    st = json.loads((cluster / "cluster.json").read_text())
    broker = st["brokers"][0]
    client = pulsar.Client(
        broker["service_url"],
        operation_timeout_seconds=60,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        topic = "persistent://public/default/lifecycle"
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic, send_timeout_millis=60_000)
        producer.send(b"before")

        for target in ("broker-0", "autorecovery"):
            r = _ls("cluster", "stop", target, *at)
            assert r.returncode == 0, r.stdout + r.stderr
        code, status = _status(cluster)
        assert code == 1
        assert [b["alive"] for b in status["brokers"]] == [False]  # type: ignore[attr-defined]
        assert status["autorecovery"]["alive"] is False  # type: ignore[index]
        text = _ls("cluster", "status", *at).stdout
        assert f"broker {broker['id']:<22} pid -       DOWN (was pid {broker['pid']})" in text, text
        assert f"autorecovery pid -       DOWN (was pid {st['autorecovery']['pid']})" in text, text

        for target in ("broker-0", "autorecovery"):
            r = _ls("cluster", "start", target, *at)
            assert r.returncode == 0, r.stdout + r.stderr
        producer.send(b"after a clean stop")  # the producer reconnected to the broker on the same port

        r = _ls("cluster", "restart", broker["service_url"], "--kill", *at)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"broker {broker['id']} (broker-0) killed and started" in r.stdout, r.stdout
        producer.send(b"after a crash")

        got: list[bytes] = []
        while len(got) < 3:  # a message not acknowledged before a restart may come twice
            m = consumer.receive(timeout_millis=30_000)
            consumer.acknowledge(m)
            if m.data() not in got:
                got.append(m.data())
        assert got == [b"before", b"after a clean stop", b"after a crash"]
    finally:
        client.close()
    now = json.loads((cluster / "cluster.json").read_text())
    assert now["brokers"][0]["pid"] != broker["pid"] and _alive(now["brokers"][0]["pid"])
    assert {k: v for k, v in now["brokers"][0].items() if k != "pid"} == {
        k: v for k, v in broker.items() if k != "pid"
    }
    code, status = _status(cluster)
    assert code == 0, status

    # the ZooKeeper `cluster up` started is a piece too: stopped, status says it is unreachable (exit 5)
    r = _ls("cluster", "stop", "zookeeper", *at)
    assert (r.returncode, r.stdout.strip()) == (0, "zookeeper stopped"), r.stdout + r.stderr
    r = _ls("cluster", "stop", "zookeeper", *at)
    assert (r.returncode, r.stdout.strip()) == (0, "zookeeper was not running"), r.stdout + r.stderr
    code, status = _status(cluster)
    assert code == 5 and "not running" in str(status["zk_error"]), status
    r = _ls("cluster", "start", "zookeeper", *at)
    assert r.returncode == 0, r.stdout + r.stderr
    code, status = _status(cluster)
    assert code == 0, status
