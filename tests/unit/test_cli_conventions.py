"""The command's conventions without a cluster: --version, global options anywhere, usage errors (as JSON with
--json), exit statuses of our error codes, help on every flag, passwords from a file or the environment
(docs/cli.md)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

import ledgerstore
from ledger_client.errors import BookieUnavailableError, NoSuchLedgerError, UnauthorizedError
from ledgerstore import cli
from zk.errors import MetadataAuthError, MetadataConnectionError, MetadataNotFoundError


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerstore.cli", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_version_is_the_package_version() -> None:
    r = _run("--version")
    assert r.returncode == 0
    assert r.stdout.strip() == f"ledgerstore {ledgerstore.__version__}"
    assert ledgerstore.__version__ and ledgerstore.__version__ != "0+unknown"


def test_usage_errors_exit_2_as_one_line_or_json() -> None:
    r = _run("ledger", "no-such-verb")
    assert r.returncode == cli.EXIT_USAGE
    assert r.stderr.startswith("ledgerstore: ") and "Traceback" not in r.stderr
    r = _run("--json", "ledger", "no-such-verb")
    assert r.returncode == cli.EXIT_USAGE
    err = json.loads(r.stdout)["error"]
    assert err["code"] == "USAGE" and err["exit_status"] == 2 and "no-such-verb" in err["message"]
    r = _run("ledger", "metadata", "--json")  # the ledger id is missing
    assert r.returncode == cli.EXIT_USAGE and json.loads(r.stdout)["error"]["code"] == "USAGE"


def test_global_options_anywhere_parse_the_same() -> None:
    parser = cli.build_parser()
    forms = [
        ["--json", "--zk", "h:1", "--zk-root", "/r", "-v", "ledger", "list"],
        ["ledger", "--json", "--zk=h:1", "list", "--zk-root", "/r", "-v"],
        ["ledger", "list", "--json", "--zk", "h:1", "--zk-root=/r", "--verbose"],
    ]
    for argv in forms:
        args = parser.parse_args(cli.normalise_argv(argv))
        assert (args.command, args.verb, args.json, args.zk, args.zk_root, args.verbose) == (
            "ledger",
            "list",
            True,
            "h:1",
            "/r",
            True,
        ), argv
    # after a `--` nothing moves
    assert cli.normalise_argv(["ledger", "write", "--", "--json"]) == ["ledger", "write", "--", "--json"]


def test_every_command_and_flag_has_help() -> None:
    missing = []
    for p, text in cli.walk_parsers(cli.build_parser()):
        if p.prog != "ledgerstore" and not text:
            missing.append(p.prog)
        for a in p._actions:
            if not isinstance(a, argparse._SubParsersAction) and not a.help:
                missing.append(f"{p.prog} {'/'.join(a.option_strings) or a.dest}")
    assert not missing, missing


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (NoSuchLedgerError("no ledger 7"), cli.EXIT_NOT_FOUND, "NO_SUCH_LEDGER"),
        (MetadataNotFoundError("gone", path="/x"), cli.EXIT_NOT_FOUND, "METADATA_NOT_FOUND"),
        (UnauthorizedError("bad password"), cli.EXIT_UNAUTHORIZED, "UNAUTHORIZED"),
        (MetadataAuthError("no auth"), cli.EXIT_UNAUTHORIZED, "METADATA_AUTH"),
        (BookieUnavailableError("down"), cli.EXIT_UNAVAILABLE, "BOOKIE_UNAVAILABLE"),
        (MetadataConnectionError("lost"), cli.EXIT_UNAVAILABLE, "METADATA_CONNECTION"),
        (ConnectionRefusedError("refused"), cli.EXIT_UNAVAILABLE, "UNAVAILABLE"),
        (RuntimeError("boom"), cli.EXIT_ERROR, "ERROR"),
        (
            cli.CommandError("x", cli.exit_status_for_http(404), kind="HTTP_404"),
            cli.EXIT_NOT_FOUND,
            "HTTP_404",
        ),
        (cli.CommandError("x", cli.exit_status_for_http(403)), cli.EXIT_UNAUTHORIZED, "UNAUTHORIZED"),
        (cli.CommandError("x", cli.exit_status_for_http(503)), cli.EXIT_UNAVAILABLE, "UNAVAILABLE"),
    ],
)
def test_errors_map_to_distinct_exit_statuses(exc: BaseException, status: int, code: str) -> None:
    got_status, got_code, message = cli.classify(exc)
    assert (got_status, got_code) == (status, code)
    assert not message.startswith("[")


def test_password_from_flag_file_or_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = cli.build_parser()
    pw_file = tmp_path / "pw"
    pw_file.write_text("from-file\n")
    monkeypatch.delenv(cli.PASSWORD_ENV, raising=False)

    def password(*extra: str) -> str:
        return cli.password_of(parser.parse_args(["ledger", "read", "1", *extra]))

    assert password() == ""
    assert password("--password", "flag") == "flag"
    assert password("--password-file", str(pw_file)) == "from-file"
    monkeypatch.setenv(cli.PASSWORD_ENV, "from-env")
    assert password() == "from-env"
    assert password("--password", "flag") == "flag"
    with pytest.raises(cli.UsageError):  # one or the other
        parser.parse_args(["ledger", "read", "1", "--password", "a", "--password-file", str(pw_file)])
    with pytest.raises(cli.CommandError):
        password("--password-file", str(tmp_path / "missing"))


def test_repeatable_passwords_from_flags_files_or_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = cli.build_parser()
    (tmp_path / "pws").write_text("a\nb\n")
    monkeypatch.delenv(cli.PASSWORD_ENV, raising=False)

    def passwords(*extra: str) -> list[str]:
        return cli.passwords_of(parser.parse_args(["bookie", "decommission", "h:1", *extra]))

    assert passwords() == [""]
    # the empty one always, last: the brokers' ledgers have it (a decommission --password pw left them behind)
    assert passwords("--password", "x", "--password-file", str(tmp_path / "pws")) == ["x", "a", "b", ""]
    assert passwords("--password", "x", "--password", "", "--password", "x") == ["x", ""]
    monkeypatch.setenv(cli.PASSWORD_ENV, "e")
    assert passwords() == ["e", ""]


def test_progress_bars_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty:
        def __init__(self, tty: bool) -> None:
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    monkeypatch.setattr(sys, "stderr", Tty(False))
    assert cli.progress_disabled(argparse.Namespace(json=False))
    monkeypatch.setattr(sys, "stderr", Tty(True))
    assert not cli.progress_disabled(argparse.Namespace(json=False))
    assert cli.progress_disabled(argparse.Namespace(json=True))


def test_a_bad_tenant_or_namespace_name_is_refused_in_its_own_words() -> None:
    """`tenant create a/b` said "a namespace is TENANT/NAMESPACE, got 'a/b/ns'" and `tenant create 'a b'` "invalid
    tenant 'a b' in 'a b/ns/t'": names the user never typed (the check went through a made-up topic name)."""
    for args, want in (
        (("tenant", "create", "a/b"), "a tenant name has no '/', got 'a/b'"),
        (("tenant", "delete", "a b"), "invalid tenant 'a b'"),
        (("namespace", "create", "acme/x y"), "invalid namespace 'x y' in namespace 'acme/x y'"),
        (("namespace", "create", "a/b/c"), "a namespace is TENANT/NAMESPACE, got 'a/b/c'"),
    ):
        r = _run(*args, "--url", "http://127.0.0.1:9")
        assert r.returncode == cli.EXIT_USAGE, (args, r.stderr)
        line = r.stderr.splitlines()[0]
        assert want in line, (args, line)
        assert "/ns'" not in line and "/t'" not in line, (args, line)


def test_a_broker_admin_that_does_not_answer_is_named_with_what_to_check() -> None:
    """`topic list` with no broker on --url: the refused connection, and where to look and what to set, not
    only "unreachable: <urlopen error [Errno 111] Connection refused>"."""
    from ledgerstore.cluster import free_port

    url = f"http://127.0.0.1:{free_port()}"
    r = _run("topic", "list", "--url", url)
    assert r.returncode == cli.EXIT_UNAVAILABLE, r.stderr
    assert r.stderr.startswith(
        f"ledgerstore: broker admin at {url} unreachable ([Errno 111] Connection refused): "
    ), r.stderr
    assert (
        "is the broker running? (`ledgerstore cluster status`; --url URL or $LEDGERSTORE_BROKER_HTTP)"
        in r.stderr
    )


def test_a_service_url_where_nothing_listens_is_said_at_once() -> None:
    """`topic produce` and `topic consume` with no broker on --service-url waited out pulsar-client's 30 s
    operation timeout, then said 'no answer within 30s'."""
    import time

    from ledgerstore.cluster import free_port

    url = f"pulsar://127.0.0.1:{free_port()}"
    for verb in (("produce", "t", "-m", "x"), ("consume", "t", "-s", "s", "-n", "1")):
        t0 = time.monotonic()
        r = _run("topic", *verb, "--service-url", url)
        assert r.returncode == cli.EXIT_UNAVAILABLE, r.stderr
        assert r.stderr.startswith(f"ledgerstore: no broker at {url} (connection refused): is it running?"), (
            r.stderr
        )
        assert "--service-url URL or $LEDGERSTORE_BROKER_URL" in r.stderr
        assert time.monotonic() - t0 < 25, verb


def test_counts_in_messages_take_the_singular_for_one() -> None:
    """`cluster down` printed "1 brokers"; counts in messages go through cli.counted."""
    assert [cli.counted(n, "broker") for n in (0, 1, 3)] == ["0 brokers", "1 broker", "3 brokers"]
    assert [cli.counted(n, "entry", "entries") for n in (1, 2)] == ["1 entry", "2 entries"]
