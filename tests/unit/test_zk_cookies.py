import json
import os
from pathlib import Path

import pytest

from zk.cookies import (
    COOKIE_FILE,
    Cookie,
    CookieVerdict,
    delete_local_cookie,
    read_local_cookie,
    verify_cookies,
    write_local_cookie,
)
from zk.errors import CookieMismatchError, MetadataFormatError

BID = "127.0.0.1:3181"
EXP = Cookie(bookie_id=BID, journal_dir="/d/journal", ledger_dirs=("/d/l1", "/d/l2"), instance_id="inst-A")
OTHER_INSTANCE = Cookie(BID, "/d/journal", ("/d/l1", "/d/l2"), "inst-B")
OTHER_BOOKIE = Cookie("127.0.0.1:3182", "/d/journal", ("/d/l1", "/d/l2"), "inst-A")
OTHER_DIRS = Cookie(BID, "/d/journal", ("/d/l1",), "inst-A")
MOVED_JOURNAL = Cookie(BID, "/e/journal", ("/d/l1", "/d/l2"), "inst-A")


def test_directories_order_and_dedup() -> None:
    assert EXP.directories() == ("/d/journal", "/d/l1", "/d/l2")
    assert Cookie(BID, "/x", ("/x", "/y"), "i").directories() == ("/x", "/y")


def test_ok_and_new() -> None:
    assert verify_cookies(None, [None, None, None], EXP) is CookieVerdict.NEW
    assert verify_cookies(EXP, [EXP, EXP, EXP], EXP) is CookieVerdict.OK
    # format_version differences do not matter
    newer = Cookie(BID, "/d/journal", ("/d/l1", "/d/l2"), "inst-A", format_version=1)
    assert verify_cookies(newer, [EXP, newer, EXP], EXP) is CookieVerdict.OK


@pytest.mark.parametrize(
    ("zk", "locals_", "must_mention"),
    [
        # ZooKeeper knows the bookie, its disks have no cookie: wiped / swapped
        (
            EXP,
            [None, None, None],
            ["wiped or swapped", "NO_ENTRY", f"ledgerstore bookie format --delete-cookie --bookie-id {BID}"],
        ),
        # one directory wiped
        (EXP, [EXP, None, EXP], ["wiped or swapped", "/d/l1", "--delete-cookie"]),
        # local cookie present, ZooKeeper has none
        (None, [EXP, EXP, EXP], ["no cookie in ZooKeeper", "--zk"]),
        (None, [None, EXP, None], ["no cookie in ZooKeeper", "/d/l1"]),
        # instance id mismatch: wrong ZooKeeper / re-created cluster
        (OTHER_INSTANCE, [OTHER_INSTANCE] * 3, ["inst-B", "inst-A", "wrong ZooKeeper"]),
        (EXP, [OTHER_INSTANCE, EXP, EXP], ["/d/journal", "inst-B"]),
        # directories swapped in from another bookie
        (EXP, [EXP, OTHER_BOOKIE, EXP], ["127.0.0.1:3182", "--bookie-id 127.0.0.1:3182"]),
        # directory list changed
        (OTHER_DIRS, [OTHER_DIRS, OTHER_DIRS, None], ["/d/l2"]),
        (
            OTHER_DIRS,
            [OTHER_DIRS, OTHER_DIRS, OTHER_DIRS],
            ["ledger_dirs=['/d/l1']", "added, removed or moved"],
        ),
        (MOVED_JOURNAL, [EXP, EXP, EXP], ["/e/journal", "added, removed or moved"]),
    ],
)
def test_mismatches(zk: Cookie | None, locals_: list[Cookie | None], must_mention: list[str]) -> None:
    with pytest.raises(CookieMismatchError) as ei:
        verify_cookies(zk, locals_, EXP)
    msg = str(ei.value)
    assert ei.value.code == "COOKIE_MISMATCH" and not ei.value.retriable
    for needle in must_mention:
        assert needle in msg, (needle, msg)


def test_bookie_id_mismatch_against_expected() -> None:
    renamed = Cookie("10.0.0.1:3181", "/d/journal", ("/d/l1", "/d/l2"), "inst-A")
    with pytest.raises(CookieMismatchError, match="bookie id changed"):
        verify_cookies(renamed, [renamed] * 3, EXP)


def test_wrong_number_of_locals() -> None:
    with pytest.raises(ValueError):
        verify_cookies(None, [None], EXP)


def test_local_cookie_files(tmp_path: Path) -> None:
    d = tmp_path / "journal"
    assert read_local_cookie(d) is None  # directory does not exist yet
    write_local_cookie(d, EXP)
    assert read_local_cookie(d) == EXP
    body = json.loads((d / COOKIE_FILE).read_text())
    assert body["format_version"] == 1 and body["bookie_id"] == BID
    assert [p.name for p in d.iterdir()] == [COOKIE_FILE]  # no temp file left behind
    write_local_cookie(d, OTHER_DIRS)  # overwrite atomically
    assert read_local_cookie(d) == OTHER_DIRS
    assert delete_local_cookie(d) and not delete_local_cookie(d)
    assert read_local_cookie(d) is None


@pytest.mark.parametrize("content", [b"garbage", b"{}", b'{"format_version": 99}', b""])
def test_unreadable_local_cookie_refuses(tmp_path: Path, content: bytes) -> None:
    (tmp_path / COOKIE_FILE).write_bytes(content)
    with pytest.raises(CookieMismatchError, match="unreadable"):
        read_local_cookie(tmp_path)


def test_cookie_json_round_trip() -> None:
    assert Cookie.from_json(EXP.to_json()) == EXP
    with pytest.raises(MetadataFormatError):
        Cookie.from_json({"bookie_id": BID})
    with pytest.raises(MetadataFormatError):
        Cookie(BID, "", ("/x",), "i")


def test_write_is_fsynced_via_replace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync")
        real_fsync(fd)

    def replace(a: str, b: str) -> None:
        calls.append("replace")
        real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_local_cookie(tmp_path, EXP)
    assert calls == ["fsync", "replace", "fsync"]
