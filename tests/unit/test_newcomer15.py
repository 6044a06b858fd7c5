"""A piece that fails to start names what its own process wrote, not the lines an earlier run left in the log
that ``cluster up`` appends to (a second ``cluster up`` on the same state directory)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ledgerstore.cluster import ServiceProcess


@dataclass
class _Failing(ServiceProcess):
    said: str
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return "127.0.0.1:1"

    def command(self) -> list[str]:
        return [sys.executable, "-c", f"import sys; print({self.said!r}); sys.exit(3)"]

    def ready(self) -> bool:
        return False


def test_a_failed_start_reports_only_its_own_log_lines(tmp_path: Path) -> None:
    log = tmp_path / "bookie-0.log"
    log.write_text("".join(f"INFO an earlier run's line {i}\n" for i in range(30)))
    piece = _Failing("ERROR refusing to start: cookie mismatch")
    piece._spawn(log)
    with pytest.raises(RuntimeError) as e:
        piece.wait_ready(timeout_s=30)
    assert str(e.value) == "process 127.0.0.1:1 exited with 3: ERROR refusing to start: cookie mismatch"
    assert "earlier run" in piece.log_tail(40)  # the whole log is still there for whoever reads it


def test_bookie_recover_counts_one_entry_in_the_singular() -> None:
    from types import SimpleNamespace

    from ledgerstore.bookie_admin import recover_line

    one = SimpleNamespace(status="done", ledger_id=10, entries_copied=1, replacements={0: "127.0.0.1:3184"})
    assert recover_line(one) == "  ledger 10: 1 entry copied; ensemble 0 -> 127.0.0.1:3184"
    two = SimpleNamespace(
        status="planned", ledger_id=2, entries_copied=67, replacements={0: "127.0.0.1:3184"}
    )
    assert recover_line(two) == "  ledger 2: 67 entries to copy; ensemble 0 -> 127.0.0.1:3184"


def test_cluster_up_docker_publishes_the_bookies_admin_ports_bookie_http_port_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ledgerstore import cli
    from ledgerstore.docker_cluster import compose_env

    args = cli.build_parser().parse_args(
        [
            "cluster",
            "up",
            "--docker",
            "--zk-port",
            "30181",
            "--base-port",
            "30281",
            "--bookie-http-port",
            "30301",
        ]
    )
    env = compose_env(args)
    assert [env[f"BOOKIE{i}_HTTP_PORT"] for i in range(3)] == ["30301", "30302", "30303"]
    assert [env[f"BOOKIE{i}_PORT"] for i in range(3)] == ["30281", "30282", "30283"]
    for i in range(3):
        monkeypatch.delenv(f"BOOKIE{i}_HTTP_PORT", raising=False)
    default = compose_env(cli.build_parser().parse_args(["cluster", "up", "--docker"]))
    assert "BOOKIE0_HTTP_PORT" not in default  # compose's own: 8001..8003


def test_spark_jobs_show_sparks_progress_bar_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from ledgerstore import cli
    from ledgerstore.spark_cmd import progress_conf

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    args = cli.build_parser().parse_args(["spark", "ledger-health"])
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert progress_conf(args) == [("spark.ui.showConsoleProgress", "true")]
    assert progress_conf(cli.build_parser().parse_args(["spark", "ledger-health", "--json"])) == []
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a pipe or a log file: no bar
    assert progress_conf(args) == []


def test_a_spark_jobs_failure_is_told_by_the_sources_own_error_line() -> None:
    from ledgerstore.spark_cmd import _in_flags, _one_line

    wrapped = RuntimeError(
        "An error occurred while calling o52.load.\n"
        ": org.apache.spark.SparkException: Python worker failed\n"
        "Traceback (most recent call last):\n"
        '  File "/work/main/spark/ledger_source.py", line 293, in _plan_ledger\n'
        "spark.options.LedgerOptionError: option 'password': wrong password for ledger 2 (one query reads "
        "ledgers of one password: select the ones it opens with option 'ledgers')\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:572)\n"
        "pyspark.errors.exceptions.captured.PythonException: [PYTHON_DATA_SOURCE_ERROR] planning failed\n"
    )
    assert _in_flags(_one_line(wrapped)) == (
        "LedgerOptionError: option --password: wrong password for ledger 2 (one query reads ledgers of one "
        "password: select the ones it opens with option --ledgers)"
    )


def test_cluster_up_on_other_ports_says_how_the_other_commands_find_it() -> None:
    from ledgerstore.cluster import env_hint

    moved = [{"service_url": "pulsar://127.0.0.1:30650", "web_service_url": "http://127.0.0.1:30080"}]
    assert env_hint("127.0.0.1:30181", "/ledgerstore", moved) == (
        "\n  for the other commands: export LEDGERSTORE_ZK=127.0.0.1:30181 "
        "LEDGERSTORE_BROKER_URL=pulsar://127.0.0.1:30650 LEDGERSTORE_BROKER_HTTP=http://127.0.0.1:30080"
    )
    usual = [{"service_url": "pulsar://127.0.0.1:6650", "web_service_url": "http://127.0.0.1:8080"}]
    assert env_hint("127.0.0.1:2181", "/ledgerstore", usual) == ""
    assert (
        env_hint("127.0.0.1:2181", "/other", [])
        == "\n  for the other commands: export LEDGERSTORE_ZK_ROOT=/other"
    )
