"""An operator's checks of settings, limits and resources: what a server or a command must refuse or say."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from bookie.main import serve
from ledgerstore.cli import build_parser


@pytest.mark.parametrize(
    ("given", "file", "said"),
    [
        # a percentage: the bookie stayed writable until its disk was full
        (
            ["--disk-usage-threshold", "95"],
            "",
            "--disk-usage-threshold 95.0: must be a share of the disk's size",
        ),
        ([], "disk_usage_threshold = 95\n", "bookie.toml: disk_usage_threshold 95.0: must be a share"),
        (["--disk-usage-lwm", "0"], "", "--disk-usage-lwm 0.0: must be a share"),
        # a low-water mark over the threshold: read-only and writable again at every disk check
        ([], "disk_usage_lwm = 0.97\n", "bookie.toml: disk_usage_lwm 0.97 is over disk_usage_threshold 0.95"),
    ],
)
def test_bookie_serve_refuses_disk_usage_marks_that_are_not_shares(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, given: list[str], file: str, said: str
) -> None:
    data = tmp_path / "bookie"
    conf = tmp_path / "bookie.toml"
    conf.write_text(file)
    args = build_parser().parse_args(
        ["bookie", "serve", "--data-dir", str(data), "--config", str(conf), *given]
    )
    with caplog.at_level(logging.ERROR, logger="ledgerstore.bookie"):  # (the simulator quiets it in-process)
        assert serve(args) == 2
    assert said in caplog.text, caplog.text
    assert not data.exists()  # refused before it touched anything


def test_a_server_out_of_file_descriptors_says_so(tmp_path: Path) -> None:
    """A broker or bookie at its `ulimit -n` dropped every new connection unanswered (libuv accepts it on a spare
    descriptor and closes it) and logged nothing: a pulsar-client retried until its operation timeout (Timeout
    after 8 s, the broker's log silent). Their one-second loops now warn, once a minute while it lasts, and
    /metrics shows process_open_fds and process_max_fds. Run in a child process whose limit is lowered."""
    import subprocess
    import sys

    child = """
import logging, os, resource, sys
from bookie.metrics import ServerMetrics
from bookie.server_gate import OpenFilesWatch
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(levelname)s %(message)s")
used = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (used + 40, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
watch = OpenFilesWatch("broker=b1")
print("roomy", watch.check() is not None)
held = []
try:
    while True:
        held.append(open(os.devnull))
except OSError:
    pass
watch.check()
watch.check()  # the same condition: no second line within the minute
held.pop().close()
exposition = ServerMetrics().exposition().decode()
print([line.split()[0] for line in exposition.splitlines() if line.startswith("process_") and "fds" in line])
for f in held:
    f.close()
print("after", watch.check() is not None)
"""
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "roomy True"
    warned = [line for line in lines if line.startswith("WARNING")]
    assert len(warned) == 1, lines
    assert (
        warned[0].startswith("WARNING broker=b1: all of its ")
        and "open files in use: new connections" in warned[0]
    )
    assert "['process_open_fds', 'process_max_fds']" in lines
    assert lines[-1] == "after True"


def test_ledger_write_refuses_an_entry_over_the_bookies_limit_before_making_a_ledger(tmp_path: Path) -> None:
    """`ledger write --entry-size 6000000` made a ledger, failed on its first entry ('INCORRECT_PARAMETER: entry of
    6000000 bytes exceeds the maximum entry size', no number) and left the empty ledger open for a recovery. The
    entries are checked first now (exit 2, the limit named); the limit itself is taken."""
    from ledger_client import ENTRY_PAYLOAD_MAX
    from ledgerstore.cli import CommandError
    from ledgerstore.ledger_cmd import _payloads

    def write(*flags: str) -> argparse.Namespace:
        return build_parser().parse_args(["ledger", "write", *flags])

    with pytest.raises(CommandError, match=f"--entry-size 6000000: at most {ENTRY_PAYLOAD_MAX} bytes") as e:
        _payloads(write("-n", "2", "--entry-size", "6000000"))
    assert e.value.code == 2
    lines = tmp_path / "entries"
    lines.write_bytes(b"small\n" + b"x" * (ENTRY_PAYLOAD_MAX + 1) + b"\n")
    with pytest.raises(CommandError, match="--input: line 2 is 5242817 bytes, over the largest entry"):
        _payloads(write("--input", str(lines)))
    assert [len(p) for p in _payloads(write("-n", "1", "--entry-size", str(ENTRY_PAYLOAD_MAX)))] == [5242816]


def test_a_previous_secret_keeps_its_tokens_working_during_a_rotation() -> None:
    """A server checked tokens against one secret, so a rotation refused every client holding a token of the
    other one (a connected pulsar-client's sends timed out after the broker's restart with the new secret).
    With --auth-previous-secret-file, tokens of both verify; another key's are still refused, and an expired
    token of the old secret is refused as expired."""
    from bookie.auth import TokenError, TokenVerifier, create_token

    old, new, stranger = b"o" * 32, b"n" * 32, b"s" * 32
    verifier = TokenVerifier(new, clock=lambda: 1000.0, previous=[old])
    assert verifier.verify(create_token(old, "app")).subject == "app"
    assert verifier.verify(create_token(new, "app2")).subject == "app2"
    with pytest.raises(TokenError, match="signature does not verify"):
        verifier.verify(create_token(stranger, "app"))
    with pytest.raises(TokenError, match="expired"):
        verifier.verify(create_token(old, "app", expires_in_s=100, now=800))
    with pytest.raises(TokenError, match="signature does not verify"):
        TokenVerifier(new, clock=lambda: 1000.0).verify(create_token(old, "app"))  # without it, as before


def test_bookie_serve_refuses_a_previous_secret_without_a_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Given alone, the previous secret was looked at only once the bookie had made its directories and asked
    for ZooKeeper; it is refused first (exit 2), as broker serve refuses it."""
    data = tmp_path / "bookie"
    args = build_parser().parse_args(
        ["bookie", "serve", "--data-dir", str(data), "--auth-previous-secret-file", str(tmp_path / "old")]
    )
    with caplog.at_level(logging.ERROR, logger="ledgerstore.bookie"):  # (the simulator quiets it in-process)
        assert serve(args) == 2
    assert "--auth-previous-secret-file needs --auth-secret-file" in caplog.text
    assert not data.exists()
