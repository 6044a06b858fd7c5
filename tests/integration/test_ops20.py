"""An operator's checks of secrets and limits on real processes (`cluster up`, bookies, AutoRecovery)."""

from __future__ import annotations

import contextlib
import json
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerstore.cluster import free_port


def _ls(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerstore.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def test_cluster_up_hands_autorecovery_passwords_over_in_a_private_file_not_in_ps(tmp_path: Path) -> None:
    """`cluster up --autorecovery-password PW` put PW on every bookie's and the AutoRecovery process's command
    line (`--autorecovery-password PW`, `--password PW`), where `ps` showed it to every user of the host for as
    long as the cluster ran. They get it in STATE_DIR/autorecovery-passwords (mode 600) now, and still use it."""
    from ledgerstore.autorecovery_cmd import autorecovery_config
    from ledgerstore.cli import build_parser

    state = tmp_path / "cluster"
    secret = "s3cret-ledger-pw"
    r = _ls(
        "cluster", "up", "--state-dir", str(state), "--bookies", "1", "--brokers", "0",
        "--zk-port", str(free_port()), "--base-port", str(free_port()), "--bookie-http-port", str(free_port()),
        "--autorecovery-process", "--autorecovery-port", str(free_port()), "--autorecovery-password", secret,
    )  # fmt: skip
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        st = json.loads((state / "cluster.json").read_text())
        pids = {"bookie": st["bookies"][0]["pid"], "autorecovery": st["autorecovery"]["pid"]}
        for kind, pid in pids.items():
            argv = _cmdline(pid)
            assert secret not in " ".join(argv), f"{kind}: {shlex.join(argv)}"
            # what the process runs with: its own flags, parsed as it parsed them
            args = build_parser().parse_args(argv[argv.index("ledgerstore.cli") + 1 :])
            assert autorecovery_config(args, in_bookie=kind == "bookie").passwords == (secret.encode(), b"")
        assert secret not in (state / "cluster.json").read_text()
        held = state / "autorecovery-passwords"
        assert stat.S_IMODE(held.stat().st_mode) == 0o600
        # a piece started again starts with it as well
        assert _ls("cluster", "restart", "autorecovery", "--state-dir", str(state)).returncode == 0
        again = json.loads((state / "cluster.json").read_text())["autorecovery"]["pid"]
        assert again != pids["autorecovery"] and secret not in " ".join(_cmdline(again))
        assert f"--password-file {held}" in " ".join(_cmdline(again))
    finally:
        d = _ls("cluster", "down", "--state-dir", str(state))
        assert d.returncode == 0, d.stdout + d.stderr
    assert not held.exists()


def test_zookeeper_that_cannot_start_for_a_full_data_directory_says_so_in_one_line(tmp_path: Path) -> None:
    """ZooKeeper writes a snapshot as it starts and exits when its data directory is full; `zk start` (and
    `cluster up`) said only 'exited with status 10 during startup' above 30 lines of its Java traceback. The
    first line now names the cause and the directory; with room again it starts, its data kept."""
    from zk.launcher import DATA_NAME, ZooKeeperLaunchError, ZooKeeperServer

    data = tmp_path / "zk" / DATA_NAME
    data.mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(data)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.decode().strip()}")
    try:
        filler = data / "filler"
        with filler.open("wb") as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        zk = ZooKeeperServer(data_dir=tmp_path / "zk", port=free_port())
        with pytest.raises(ZooKeeperLaunchError) as refused:
            zk.start()
        first = str(refused.value).splitlines()[0]
        assert f"during startup: no space left on device in its data directory {data} (0.0 MiB free)" in first
        filler.unlink()
        zk.start()  # room again
        zk.stop()
    finally:
        subprocess.run(["umount", "-l", str(data)], check=False)
