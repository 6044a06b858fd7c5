"""Server settings from --config, LEDGERSTORE_<SETTING> and flags, and the bookie's BookKeeper-named admin routes,
against real bookie and broker processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ledger_client.sync import BookKeeper
from ledgerstore.cluster import BookieProcess, BrokerProcess, free_port


def _get(port: int, path: str, method: str = "GET") -> tuple[int, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, body = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read().decode()
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def test_bookie_settings_flag_over_env_over_file_over_default(bookies, tmp_path: Path) -> None:
    conf = tmp_path / "bookie.toml"
    conf.write_text(
        "journal_max_wait_ms = 3.0\n"  # the flag wins
        "gc_interval_s = 120.0\n"  # the environment wins
        "disk-usage-lwm = 0.85\n"  # from the file (dashes work too)
        'storage_blob_files = "on"\n'
    )
    port = free_port()
    bp = BookieProcess(
        zk=bookies.zk,
        zk_root=bookies.root,
        data_dir=tmp_path / "b",
        port=port,
        http_port=free_port(),
        extra_args=["--config", str(conf), "--journal-max-wait-ms", "2"],
        env={"LEDGERSTORE_GC_INTERVAL_S": "90", "LEDGERSTORE_JOURNAL_MAX_WAIT_MS": "4"},
    )
    bookies.procs.append(bp)
    bp.start()
    status, body = _get(bp.http_port, "/api/v1/config")
    assert status == 200
    settings, sources = body["settings"], body["sources"]
    assert body["config_file"] == str(conf)
    assert (settings["journal_max_wait_ms"], sources["journal_max_wait_ms"]) == (2.0, "flag")
    assert (settings["gc_interval_s"], sources["gc_interval_s"]) == (90.0, "env")
    assert (settings["disk_usage_lwm"], sources["disk_usage_lwm"]) == (0.85, "file")
    assert (settings["storage_blob_files"], sources["storage_blob_files"]) == ("on", "file")
    assert (settings["checkpoint_interval_s"], sources["checkpoint_interval_s"]) == (10.0, "default")
    assert sources["port"] == "flag" and settings["port"] == bp.port
    status, flat = _get(bp.http_port, "/api/v1/config/server_config")
    assert status == 200 and flat["gc_interval_s"] == "90.0" and flat["storage_blob_files"] == "on"


def test_config_file_with_an_unknown_key_is_refused_naming_it(bookies, tmp_path: Path) -> None:
    conf = tmp_path / "bookie.toml"
    conf.write_text("journal_max_wait_ms = 1.0\njournal_max_wait_mss = 2.0\n")
    bp = bookies.start("--config", str(conf), wait=False)
    assert bp.proc is not None and bp.proc.wait(60) == 2
    assert "unknown setting 'journal_max_wait_mss' (did you mean 'journal_max_wait_ms'?)" in bp.log_tail()


def test_broker_settings_from_a_file_with_the_password_redacted(bookies, tmp_path: Path) -> None:
    bookies.start_many(3)
    conf = tmp_path / "broker.toml"
    conf.write_text('managed_ledger_password = "s3cret"\nmax_entries_per_ledger = 777\n')
    http = free_port()
    broker = BrokerProcess(
        zk=bookies.zk,
        zk_root=bookies.root,
        port=free_port(),
        http_port=http,
        extra_args=[],
        log_path=tmp_path / "broker.log",
        env={"LEDGERSTORE_CONFIG": str(conf), "LEDGERSTORE_TICK_INTERVAL_S": "2.5"},
    )
    broker.start()
    try:
        status, body = _get(http, "/api/v1/config")
        assert status == 200 and body["config_file"] == str(conf)
        assert body["settings"]["managed_ledger_password"] == "***"
        assert body["settings"]["max_entries_per_ledger"] == 777
        assert body["sources"]["tick_interval_s"] == "env" and body["settings"]["tick_interval_s"] == 2.5
        status, values = _get(http, "/admin/v2/brokers/configuration/values")
        assert status == 200 and values["managed_ledger_password"] == "***"
        assert "s3cret" not in json.dumps(values) and values["max_entries_per_ledger"] == "777"
    finally:
        broker.stop()


def test_bookkeeper_named_routes(bookies) -> None:
    procs = bookies.start_many(3)
    bp = procs[0]
    status, text = _get(bp.http_port, "/heartbeat")
    assert status == 200 and text.strip() == "OK"
    status, info = _get(bp.http_port, "/api/v1/bookie/info")
    assert status == 200 and info["totalSpace"] >= info["freeSpace"] > 0 and info["bookie_id"] == bp.id
    status, state = _get(bp.http_port, "/api/v1/bookie/state")
    assert status == 200
    assert state == {
        "running": True,
        "readOnly": False,
        "shuttingDown": False,
        "availableForHighPriorityWrites": True,
    }
    status, text = _get(bp.http_port, "/api/v1/bookie/is_ready")
    assert status == 200 and text.strip() == "OK"

    status, listed = _get(bp.http_port, "/api/v1/bookie/list_bookies?type=rw")
    assert status == 200 and listed == dict.fromkeys(sorted(p.id for p in procs))
    status, listed = _get(bp.http_port, "/api/v1/bookie/list_bookies?type=ro")
    assert status == 200 and listed == {}
    status, listed = _get(bp.http_port, "/api/v1/bookie/list_bookies?type=rw&print_hostnames=true")
    assert status == 200 and all(isinstance(v, str) and v for v in listed.values())
    assert _get(bp.http_port, "/api/v1/bookie/list_bookies?type=xx")[0] == 400

    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    try:
        lh = bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"p")
        lh.append_many([b"a", b"b"])
        lh.close()
        lid = lh.ledger_id
    finally:
        bk.close()
    status, md = _get(bp.http_port, f"/api/v1/ledger/metadata?ledger_id={lid}")
    assert status == 200 and md[str(lid)]["state"] == "CLOSED" and md[str(lid)]["last_entry_id"] == 1
    assert _get(bp.http_port, "/api/v1/ledger/metadata?ledger_id=987654")[0] == 404
    assert _get(bp.http_port, "/api/v1/ledger/metadata?ledger_id=x")[0] == 400

    # the journal's checkpoint mark: BookKeeper's "LastLogMark: Journal Id - N(...), Pos - P" per journal dir
    status, mark = _get(bp.http_port, "/api/v1/bookie/last_log_mark")
    assert status == 200 and list(mark) == [str(bp.data_dir / "journal")]
    assert re.fullmatch(
        r"LastLogMark: Journal Id - \d+\([0-9a-f]{16}\.jnl\), Pos - \d+", mark[str(bp.data_dir / "journal")]
    )

    status, gc = _get(bp.http_port, "/api/v1/bookie/gc")
    assert status == 200 and gc["is_in_force_gc"] == "false"
    passes = gc["stats"]["passes"]
    status, done = _get(bp.http_port, "/api/v1/bookie/gc", method="PUT")
    assert status == 200 and "blob_garbage_bytes" in done
    status, gc = _get(bp.http_port, "/api/v1/bookie/gc")
    assert gc["stats"]["passes"] == passes + 1
    status, details = _get(bp.http_port, "/api/v1/bookie/gc_details")
    assert status == 200 and details[0]["forceCompacting"] is False
    # today's routes stay
    assert _get(bp.http_port, "/api/v1/info")[0] == 200 and _get(bp.http_port, "/health")[0] == 200


@pytest.mark.parametrize("path", ["/heartbeat", "/health"])
def test_heartbeat_is_open_like_health_when_api_reads_need_a_token(
    bookies, tmp_path: Path, path: str
) -> None:
    secret = tmp_path / "secret"
    r = subprocess.run(
        [sys.executable, "-m", "ledgerstore.cli", "auth", "create-secret", str(secret)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    bp = bookies.start("--auth-secret-file", str(secret), "--admin-read-auth", "api")
    assert _get(bp.http_port, path)[0] == 200
    assert _get(bp.http_port, "/api/v1/bookie/state")[0] == 401
