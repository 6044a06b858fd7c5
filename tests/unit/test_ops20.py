"""An operator's settings checks: values a bookie must refuse before it touches anything."""

from __future__ import annotations

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
    with caplog.at_level(logging.ERROR):
        assert serve(args) == 2
    assert said in caplog.text, caplog.text
    assert not data.exists()  # refused before it touched anything
