"""A containerised cluster under faults: killed, paused, partitioned, restarted and wiped bookies.

The client runs in this process (host) against bookies published on 127.0.0.1 (see conftest.py). Every wait is
bounded; every test builds its own cluster.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    BOOKIE_CONFIG,
    Cluster,
    ClusterFactory,
    assert_runs_with_config,
    four_letter_word,
    wait_until,
)

pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(480)]

PASSWORD = b"p"
PROGRESS_TIMEOUT_S = 120
READ_BATCH = 500


def payload(i: int) -> bytes:
    """The bytes of the i-th append: deterministic, so any entry read back can be checked, acked or not."""
    return b"entry-%08d-" % i + bytes((i + k) % 251 for k in range(64))


class Writer(threading.Thread):
    """Appends payload(0), payload(1), ... to one ledger handle until told to stop; records what was acked."""

    def __init__(self, lh: Any, max_entries: int = 1_000_000) -> None:
        super().__init__(name="ledger-writer", daemon=True)
        self.lh = lh
        self.max_entries = max_entries
        self.acked: list[int] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            for i in range(self.max_entries):
                if self._halt.is_set():
                    return
                entry_id = self.lh.append(payload(i))
                if entry_id != i:
                    raise AssertionError(f"append #{i} returned entry id {entry_id}")
                self.acked.append(entry_id)
        except BaseException as exc:  # reported by wait_for/finish in the test thread
            self.error = exc

    def wait_for(self, count: int, timeout_s: float = PROGRESS_TIMEOUT_S, what: str = "") -> None:
        """Until at least ``count`` entries are acked; fails on a writer error or after ``timeout_s``."""

        def reached() -> bool:
            if self.error is not None:
                raise AssertionError(f"writer failed after {len(self.acked)} acks: {self.error!r}")
            return len(self.acked) >= count

        wait_until(
            reached, timeout_s, f"{count} acked entries {what}(have {len(self.acked)})", interval_s=0.05
        )

    def progress(self, more: int, what: str) -> None:
        self.wait_for(len(self.acked) + more, what=what)

    def finish(self, timeout_s: float = 60) -> list[int]:
        self._halt.set()
        self.join(timeout_s)
        assert not self.is_alive(), f"writer still blocked in append after {timeout_s}s"
        assert self.error is None, f"writer failed: {self.error!r}"
        return self.acked


def read_all(rh: Any, last: int) -> list[Any]:
    entries: list[Any] = []
    for first in range(0, last + 1, READ_BATCH):
        entries.extend(rh.read(first, min(last, first + READ_BATCH - 1)))
    return entries


def assert_nothing_lost(bk: Any, ledger_id: int, acked: list[int]) -> Any:
    """Recover-open the ledger; every acked entry is there with its bytes, ids are 0..LAC without a gap."""
    rh = bk.open_ledger(ledger_id, password=PASSWORD, recovery=True)
    last = rh.last_add_confirmed
    assert acked, "the writer acked nothing"
    assert last >= max(acked), f"acked entry {max(acked)} is beyond the recovered LAC {last}"
    entries = read_all(rh, last)
    assert [e.entry_id for e in entries] == list(range(last + 1))
    for e in entries:
        assert bytes(e.data) == payload(e.entry_id), f"entry {e.entry_id} has other bytes than were written"
    return rh


def connect(cluster: Cluster) -> Any:
    from ledger_client.sync import BookKeeper

    return BookKeeper.connect(cluster.zk_connect)


def ensembles(handle: Any) -> list[Any]:
    return list(handle.metadata.ensembles)


def test_cluster_is_healthy_and_simpletest_passes_from_the_host(cluster: Cluster) -> None:
    assert cluster.zk is not None
    assert "Mode: standalone" in four_letter_word(cluster.zk.port, "srvr")
    for b in cluster.bookies:  # the image's HEALTHCHECK (GET /health on the admin port) says so too
        cluster.wait_healthy(b, 30, docker_says=True)
    assert {b.bookie_id for b in cluster.bookies} <= cluster.registered_bookies()
    for b in cluster.bookies:  # docker/bookie.toml, as compose.yaml mounts it; per bookie only its flags
        assert_runs_with_config(
            f"http://127.0.0.1:{b.http_port}", BOOKIE_CONFIG, from_flags=("port", "advertised_address")
        )

    script = Path(sys.executable).with_name("ledgerstore")
    cli = [str(script)] if script.exists() else [shutil.which("ledgerstore") or "ledgerstore"]
    proc = subprocess.run(
        [*cli, "ledger", "simpletest", "--zk", cluster.zk_connect],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, (
        f"simpletest exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )


def test_killed_bookie_is_replaced_by_an_ensemble_change_and_no_acked_entry_is_lost(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(4)  # E=3 plus one spare for the replacement
    bk = connect(cluster)
    try:
        lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
        victim = cluster.bookie(ensembles(lh)[0].bookies[0])
        writer = Writer(lh)
        writer.start()
        writer.wait_for(200, what="before the kill ")
        cluster.kill(victim)
        writer.progress(300, what=f"after killing {victim.bookie_id} ")
        acked = writer.finish()
        lh.close()

        rh = assert_nothing_lost(bk, lh.ledger_id, acked)
        ens = ensembles(rh)
        assert len(ens) == 2, f"expected one ensemble change, metadata has {ens}"
        assert victim.bookie_id in ens[0].bookies
        assert victim.bookie_id not in ens[1].bookies
        assert 0 < ens[1].first_entry_id <= max(acked)
    finally:
        bk.close()


@pytest.mark.parametrize("fault", ["pause", "network-disconnect"])
def test_writers_continue_through_a_stalled_bookie_and_after_it_heals(
    cluster_factory: ClusterFactory, fault: str
) -> None:
    cluster = cluster_factory(4)
    inject, heal = {
        "pause": (cluster.pause, cluster.unpause),
        "network-disconnect": (cluster.disconnect, cluster.connect),
    }[fault]
    bk = connect(cluster)
    try:
        lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
        victim = cluster.bookie(ensembles(lh)[0].bookies[0])
        writer = Writer(lh)
        writer.start()
        writer.wait_for(100, what="before the fault ")

        inject(victim)
        t_fault = time.monotonic()
        writer.progress(200, what=f"while {victim.bookie_id} is under {fault} ")
        stalled_s = time.monotonic() - t_fault

        heal(victim)
        cluster.wait_healthy(victim, 60)
        cluster.wait_registered([victim.bookie_id])
        writer.progress(200, what=f"after {victim.bookie_id} healed ")
        acked = writer.finish()
        lh.close()

        rh = assert_nothing_lost(bk, lh.ledger_id, acked)
        ens = ensembles(rh)
        assert len(ens) >= 2, f"the stalled bookie was never replaced ({stalled_s:.1f}s under {fault}): {ens}"
        assert victim.bookie_id not in ens[1].bookies
    finally:
        bk.close()


def test_bookie_restarted_on_its_volume_after_sigkill_still_serves_every_entry(cluster: Cluster) -> None:
    bk = connect(cluster)
    try:
        # Qw = Qa = E = 3: every acked entry was fsynced by every bookie, the one we restart included.
        lh = bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3, password=PASSWORD)
        written = [lh.append(payload(i)) for i in range(300)]
        assert written == list(range(300))
        lh.close()
        ledger_id = lh.ledger_id
    finally:
        bk.close()

    target, *others = cluster.bookies
    cluster.kill(target)
    cluster.restart_stopped(target)  # same container: same volume, same id
    cluster.wait_healthy(target, 90)
    cluster.wait_registered([target.bookie_id])
    for other in others:
        cluster.kill(other)  # from now on, every read can only be served by the restarted bookie

    bk = connect(cluster)
    try:
        rh = bk.open_ledger(ledger_id, password=PASSWORD, recovery=False)
        last = rh.metadata.last_entry_id
        assert last == 299
        entries = read_all(rh, last)
        assert [e.entry_id for e in entries] == list(range(300))
        assert all(bytes(e.data) == payload(e.entry_id) for e in entries)
    finally:
        bk.close()


def test_bookie_on_a_wiped_volume_refuses_to_start_under_the_same_id(cluster: Cluster) -> None:
    old = cluster.bookies[0]
    assert cluster.cookie_exists(old.bookie_id), "the bookie registered no cookie in ZooKeeper"
    cluster.stop(old)
    wait_until(
        lambda: old.bookie_id not in cluster.registered_bookies(), 60, f"{old.bookie_id} to unregister"
    )

    # Same advertised address and port (so the same id), empty data volume: the disk was replaced or wiped.
    wiped = cluster.add_bookie(port=old.port, volume=cluster.new_volume(), wait=False)
    exit_code = cluster.wait_exit(wiped, 60)
    log = wiped.logs()
    assert exit_code != 0, f"a bookie on a wiped disk started (exit {exit_code}):\n{log[-3000:]}"
    assert "cookie" in log.lower(), f"the refusal does not mention the cookie:\n{log[-3000:]}"
    assert old.bookie_id not in cluster.registered_bookies()
