"""``autorecovery serve`` reads its settings like ``bookie serve`` and ``broker serve``: flag > LEDGERSTORE_<SETTING>
> --config FILE > default, and a config file with an unknown key is refused by name (exit status 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bookie.config_file import resolve
from ledgerstore.autorecovery_cmd import autorecovery_config
from ledgerstore.cli import build_parser

REPO = Path(__file__).resolve().parents[2]


def test_settings_come_from_the_file_unless_the_environment_or_a_flag_says_otherwise(tmp_path: Path) -> None:
    conf = tmp_path / "autorecovery.toml"
    conf.write_text('zk = "10.0.0.9:2181"\nthrottle_mb = 3.0\nmetrics_port = 9111\n')
    args = build_parser().parse_args(
        ["autorecovery", "serve", "--config", str(conf), "--metrics-port", "9222"]
    )
    eff = resolve(args, env={"LEDGERSTORE_THROTTLE_MB": "5"})
    config = autorecovery_config(args, in_bookie=False)
    assert args.zk == "10.0.0.9:2181" and eff.sources["zk"] == "file"
    assert config.throttle_bytes_per_s == 5 * 2**20 and eff.sources["throttle_mb"] == "env"
    assert args.metrics_port == 9222 and eff.sources["metrics_port"] == "flag"


def test_an_unknown_key_is_refused_by_name_with_exit_status_2(tmp_path: Path) -> None:
    conf = tmp_path / "autorecovery.toml"
    conf.write_text("lost_bookie_delay = 5\n")  # not a setting (lost_bookie_recovery_delay_s is)
    r = subprocess.run(
        [sys.executable, "-m", "ledgerstore.cli", "autorecovery", "serve", "--config", str(conf)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r
    assert "unknown setting 'lost_bookie_delay'" in r.stdout + r.stderr
