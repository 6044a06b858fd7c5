"""Tests for the bugs planted in the audit of 2026-11-30 against 0260c38 that the tests of the time let through
(docs/architecture.md §11): each fails with its bug planted and passes without it. No cluster: the broker's and
the journal's own code on what it is given."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from bookie.journal import Journal, RecordType
from bookie.main import Bookie, BookieConfig
from tests.unit.test_reader_seek_grace import _reader_subscription
from topic_broker import service


def test_a_reader_that_came_back_within_the_grace_keeps_its_subscription(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader's subscription kept by a seek is dropped at the end of the grace only if its reader has not come
    back to it: one whose reader is attached again by then stays (dropped, the reader would be left on a
    subscription gone from its topic, which no longer dispatches to it nor sees its acknowledgements)."""
    monkeypatch.setattr(service, "READER_SEEK_GRACE_S", 0.2)

    async def run() -> bool:
        sub = _reader_subscription()
        sub.disconnect_consumers(keep=True)  # the seek
        sub.consumers = {1: object()}  # type: ignore[dict-item]  # its reader came back (add_consumer)
        await asyncio.sleep(0.4)  # past the grace
        return sub.topic.subscriptions.get(sub.name) is sub

    assert asyncio.run(run())


def test_a_seeks_grace_ending_drops_only_the_subscription_it_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The grace timer of a subscription kept by a seek drops that subscription only: one its reader came back to
    and left (a reader's subscription goes with its last consumer) and that a new reader of the same name made
    anew meanwhile is another, with a consumer, and stays. Dropped by name, the new reader was left on a
    subscription gone from its topic."""
    monkeypatch.setattr(service, "READER_SEEK_GRACE_S", 0.2)

    async def run() -> bool:
        kept = _reader_subscription()
        kept.disconnect_consumers(keep=True)  # the seek
        subs = kept.topic.subscriptions
        subs.pop(kept.name)  # its reader came back and closed (remove_consumer)
        anew = _reader_subscription()
        anew.topic, anew.consumers = kept.topic, {1: object()}  # type: ignore[dict-item]
        subs[anew.name] = anew  # a reader of the same name subscribed again
        await asyncio.sleep(0.4)  # past the kept one's grace
        return subs.get(anew.name) is anew

    assert asyncio.run(run())


@pytest.mark.parametrize("owner", [False, True])
def test_a_completion_that_failed_is_said_by_the_journal_unless_its_owner_is_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, owner: bool
) -> None:
    """A completion callback that raised on a durable record (storing it failed) is answered with the error and
    said once: by the journal's ERROR line when nobody else is told, by its ``on_error`` owner (the bookie, which
    fails in one line) when it has one, the journal then silent. Said by neither, a journal without an owner let
    a failed store pass unlogged; by both, each record in flight added a line to the bookie's."""
    told: list[tuple[BaseException, bool]] = []

    async def run() -> list[BaseException | None]:
        tmp_path.joinpath("journal").mkdir()
        j = Journal(tmp_path / "journal")
        await j.start()
        if owner:
            j.on_error = lambda exc, in_callback: told.append((exc, in_callback))
        answers: list[BaseException | None] = []

        def stored(exc: BaseException | None) -> None:
            answers.append(exc)
            if exc is None:
                raise OSError("the storage write failed")

        j.append(RecordType.ENTRY, 1, 0, b"x", stored)
        for _ in range(500):
            if len(answers) == 2:
                break
            await asyncio.sleep(0.01)
        await j.close()
        return answers

    with caplog.at_level(logging.ERROR, logger="bookie.journal"):
        answers = asyncio.run(run())
    assert answers[0] is None and isinstance(answers[1], OSError)  # answered again, with the error
    said = [r for r in caplog.records if "completion callback failed" in r.getMessage()]
    assert (len(said), [t[1] for t in told]) == ((0, [True]) if owner else (1, []))


def test_a_failed_bookie_says_so_in_one_line_whatever_reports_it_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bookie fails in one ERROR line; the same failure reported again by each record in flight and by the
    next checkpoints is a warning a minute, the first of them a minute on: none here. Before, each report was an
    ERROR line of its own (or the first checkpoint's warning came at once)."""
    bookie = Bookie(BookieConfig(zk="127.0.0.1:1", data_dir=tmp_path))
    with caplog.at_level(logging.WARNING, logger="ledgerstore.bookie"):
        for _ in range(3):  # the records in flight, each told of the failed write
            bookie.fail("journal write failed: OSError(5, 'Input/output error')")
        for _ in range(3):  # the next checkpoints
            bookie._checkpoint_failed("storage flush", OSError(5, "Input/output error"))
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "ledgerstore.bookie"]
    assert len(lines) == 1 and lines[0][0] == "ERROR" and "FAILED" in lines[0][1], lines
    assert bookie.failures == 3 and bookie.failed.startswith("journal write failed")
