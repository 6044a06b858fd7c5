"""Review findings checked without servers."""

from __future__ import annotations

from pathlib import Path

from ledgerstore.autorecovery_cmd import autorecovery_config
from ledgerstore.cli import build_parser
from ledgerstore.cluster import _split_passwords, _write_passwords


def test_cluster_up_hands_over_every_autorecovery_password_as_it_was_given(tmp_path: Path) -> None:
    """`cluster up --autorecovery-password PW` writes PW to STATE_DIR/autorecovery-passwords, one a line, unless
    it holds a line break. Its readers split the file with str.splitlines, which also breaks at \\v, \\f, \\x1c-\\x1e,
    \\x85, \\u2028 and \\u2029: a password holding one of those was read back as two passwords, neither of them the
    ledger's (AutoRecovery left its ledgers marked: none of the configured passwords is theirs). Such a password
    stays a flag, as one holding \\n does; what the processes parse is every password given."""
    given = ["pw", "tab\x0bbed", "sep\x1cd", "para\u2029graph", "two\nlines", "pw"]
    flags, in_file = _split_passwords(given)
    argv = ["autorecovery", "serve", "--password-file", str(_write_passwords(tmp_path, in_file))]
    for pw in flags:
        argv += ["--password", pw]
    got = autorecovery_config(build_parser().parse_args(argv), in_bookie=False).passwords
    assert sorted(got) == sorted({pw.encode() for pw in given} | {b""})
    assert in_file == ["pw"]
