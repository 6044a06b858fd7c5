"""`cluster start`'s wait for a bookie: the "after a crash ..." notice is for a /health that keeps answering
"starting" (a crashed predecessor's registration), not for a process slow to start that then registers at once."""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time

import pytest

from ledgerstore.cluster import _health, _wait_bookie
from tests.conftest import BookieFactory
from zk import layout
from zk.client import MetadataStore


def test_a_bookie_slow_to_start_that_registers_at_once_gets_no_crash_notice(
    bookies: BookieFactory, zk_store: MetadataStore, capsys: pytest.CaptureFixture[str]
) -> None:
    bookies.start().stop()  # the cluster's metadata made; a clean stop: nothing of this bookie registered
    bp = bookies.procs[0]
    path = layout.available_bookie_path(bp.id)
    # another session's registration holds the new process at "starting" until it is deleted, which happens
    # as soon as /health says "starting"; the process is paused for its first 1.5 s (a start slow as on a
    # loaded machine)
    zk_store.create(path, {"address": bp.id}, ephemeral=True)
    bp.start(wait=False)
    assert bp.proc is not None
    os.kill(bp.proc.pid, signal.SIGSTOP)
    threading.Timer(1.5, os.kill, (bp.proc.pid, signal.SIGCONT)).start()
    released = threading.Event()

    def release() -> None:
        while not released.is_set():
            h = _health(bp.http_port)
            if h is not None and h.get("status") == "starting":
                zk_store.delete(path, missing_ok=True)
                released.set()
            time.sleep(0.02)

    t = threading.Thread(target=release, daemon=True)
    t.start()
    try:
        _wait_bookie(argparse.Namespace(json=False), bp, timeout_s=60)
    finally:
        released.set()
        t.join()
    assert "/health says starting" not in capsys.readouterr().err
