"""The command's conventions against real bookies: exit statuses of not found and unauthorized, --json errors,
global options before the subcommand, a closed pipe, passwords from a file and the environment (docs/cli.md)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from ledgerstore import cli


def _ls(bookies, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # the global options go first here: accepted before the subcommand as well as after it
    cmd = [sys.executable, "-m", "ledgerstore.cli", "--zk", bookies.zk, "--zk-root", bookies.root, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_exit_statuses_and_json_errors(bookies) -> None:
    bookies.start_many(3)
    r = _ls(bookies, "ledger", "write", "-n", "5", "--password", "pw", "--json")
    assert r.returncode == 0, r.stderr
    lid = json.loads(r.stdout)["ledger_id"]

    r = _ls(bookies, "ledger", "metadata", "987654321")
    assert r.returncode == cli.EXIT_NOT_FOUND, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    r = _ls(bookies, "--json", "ledger", "metadata", "987654321")
    assert r.returncode == cli.EXIT_NOT_FOUND
    err = json.loads(r.stdout)["error"]
    assert err["exit_status"] == cli.EXIT_NOT_FOUND and err["code"] == "NO_SUCH_LEDGER" and err["message"]

    r = _ls(bookies, "ledger", "read", str(lid), "--password", "wrong", "--json")
    assert r.returncode == cli.EXIT_UNAUTHORIZED, r.stdout + r.stderr
    assert json.loads(r.stdout)["error"]["code"] == "UNAUTHORIZED"

    r = _ls(bookies, "ledger", "read", "--json")
    assert r.returncode == cli.EXIT_USAGE and json.loads(r.stdout)["error"]["code"] == "USAGE"

    # nothing listening: unavailable
    cmd = [sys.executable, "-m", "ledgerstore.cli", "ledger", "list", "--zk", "127.0.0.1:1", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == cli.EXIT_UNAVAILABLE, r.stdout + r.stderr
    assert json.loads(r.stdout)["error"]["exit_status"] == cli.EXIT_UNAVAILABLE


def test_a_closed_pipe_ends_the_command_quietly(bookies) -> None:
    bookies.start_many(3)
    for _ in range(3):
        assert _ls(bookies, "ledger", "create").returncode == 0
    ls = shlex.join([sys.executable, "-m", "ledgerstore.cli", "ledger", "list", "--zk", bookies.zk])
    # `head -1` exits after its line while `ledger list` still writes; read a lot so the pipe closes mid-output
    big = shlex.join([sys.executable, "-m", "ledgerstore.cli", "ledger", "read", "--zk", bookies.zk])
    r = _ls(bookies, "ledger", "write", "-n", "20000", "--entry-size", "20", "--json")
    lid = json.loads(r.stdout)["ledger_id"]
    for line in (
        f"{ls} --zk-root {bookies.root} | head -1",
        f"{big} {lid} --zk-root {bookies.root} | head -1",
    ):
        r = subprocess.run(
            ["bash", "-c", f"set -o pipefail; {line}"], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, (line, r.returncode, r.stderr)
        assert r.stderr == "", r.stderr
        assert len(r.stdout.splitlines()) == 1


def test_password_from_a_file_or_the_environment(bookies, tmp_path: Path) -> None:
    bookies.start_many(3)
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    r = _ls(bookies, "ledger", "write", "-n", "3", "--password-file", str(pw), "--json")
    assert r.returncode == 0, r.stderr
    lid = json.loads(r.stdout)["ledger_id"]
    env = dict(os.environ, LEDGERSTORE_PASSWORD="s3cret")
    r = _ls(bookies, "ledger", "read", str(lid), "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert [row["entry_id"] for row in json.loads(r.stdout)] == [0, 1, 2]
    r = _ls(bookies, "ledger", "read", str(lid), "--json")  # no password: the empty one is wrong
    assert r.returncode == cli.EXIT_UNAUTHORIZED
    r = _ls(bookies, "ledger", "delete", str(lid), "--password-file", str(pw))
    assert r.returncode == 0, r.stderr
