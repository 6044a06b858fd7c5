"""A batching producer's batch waiting behind its delayed message, with the official ``pulsar-client``, when the
topic changes owner in between: the next owner still knows that the delayed message jumped over the batch's id,
so the batch, sent to it after the client reconnects, is stored, not dropped as a resend (the last id stored is
above the batch's).

- ``kill9``: the restarted owner learns the skipped id from the tail ledger it scans at the topic's load;
- ``restart`` (SIGTERM) and ``unload``: the owner recorded it in the topic's properties at its clean close
  (before, the next owner took the batch for a resend and it was lost)."""

from __future__ import annotations

import datetime
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.broker_testing import start_broker

pulsar = pytest.importorskip("pulsar")


@pytest.mark.parametrize("move", ["kill9", "restart", "unload"])
@pytest.mark.timeout(120)
def test_a_batch_behind_a_delayed_message_is_stored_after_its_owner_changes(
    bookies, tmp_path: Path, move: str
) -> None:
    bookies.start_many(3)
    bp = start_broker(bookies, tmp_path, 4.0)
    bp.wait_ready(60)
    name = f"skipped-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/default/{name}"
    client = pulsar.Client(bp.service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(
            topic, producer_name="p", batching_enabled=True, batching_max_publish_delay_ms=600_000
        )
        answers: list[tuple[Any, Any]] = []
        producer.send_async(
            b"batched", lambda res, mid: answers.append((res, mid))
        )  # id 0, waits in its batch
        producer.send(b"delayed", deliver_after=datetime.timedelta(milliseconds=1))  # id 1, sent at once
        if move == "unload":
            url = f"http://127.0.0.1:{bp.http_port}/admin/v2/persistent/public/default/{name}/unload"
            urllib.request.urlopen(urllib.request.Request(url, method="PUT"), timeout=30).read()
        else:
            bp.kill9() if move == "kill9" else bp.stop()
            bp.start(wait=True, timeout_s=60)
        producer.flush()  # the batch goes to the next owner after the client's reconnection
        assert len(answers) == 1 and answers[0][0] == pulsar.Result.Ok
        assert answers[0][1].entry_id() >= 0, "the batch was answered as a resend of what is stored"
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(timeout_millis=10_000).data())
        assert sorted(got) == [b"batched", b"delayed"]
    finally:
        client.close()
        bp.stop()
