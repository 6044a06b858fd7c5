"""``topic produce`` takes Ctrl-C between two of pulsar-client's calls (ledgerstore.topic_cmd): in the main thread
through a SIGINT handler; run from another thread (a program calling ``cli.main`` there) it must not fail,
``signal.signal`` being the main thread's only."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from ledgerstore.topic_cmd import _ctrl_c_between_calls


def test_ctrl_c_is_taken_between_calls_in_the_main_thread() -> None:
    before = signal.getsignal(signal.SIGINT)
    with _ctrl_c_between_calls() as interrupted:
        interrupted()  # nothing came
        os.kill(os.getpid(), signal.SIGINT)  # noted, not raised here
        with pytest.raises(KeyboardInterrupt):
            interrupted()
    assert signal.getsignal(signal.SIGINT) is before


def test_another_thread_runs_the_command_without_a_handler() -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with _ctrl_c_between_calls() as interrupted:
                interrupted()
        except BaseException as e:  # noqa: BLE001 (what the thread would die of)
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert errors == []
