"""The MessageId JSON bodies the admin routes parse (reset-cursor, create-subscription, get-backlog-size,
analyze-backlog) go through one helper, ``admin._message_id_from``: its position, the default of a field left
out, and its refusals (400, with what the route expected)."""

from __future__ import annotations

import pytest

from topic_broker.admin import INT64_MAX, AdminError, _message_id_from
from topic_broker.managed_ledger import Position


def test_a_message_id_body_is_its_ledger_and_entry() -> None:
    body = {"ledgerId": 12, "entryId": 3, "partitionIndex": -1, "batchIndex": 4, "isExcluded": False}
    assert _message_id_from(body) == Position(12, 3)
    assert _message_id_from({"ledgerId": 12}) == Position(12, -1)
    assert _message_id_from({}, INT64_MAX) == Position(INT64_MAX, INT64_MAX)


@pytest.mark.parametrize(
    "body", [None, [], "12:3", 12, {"ledgerId": "12"}, {"ledgerId": True}, {"entryId": 2**63}]
)
def test_anything_else_is_refused_400(body: object) -> None:
    with pytest.raises(AdminError) as e:
        _message_id_from(body, expected='a MessageId, "earliest" or "latest"')
    assert e.value.status == 400
    if not isinstance(body, dict):
        assert 'expected a MessageId, "earliest" or "latest"' in e.value.reason
