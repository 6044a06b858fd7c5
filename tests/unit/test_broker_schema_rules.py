"""Which declared schema the broker refuses on a topic with stored schemas (Pulsar's ``IncompatibleSchema``)."""

from __future__ import annotations

import pytest

from topic_broker import pulsar_api_pb2 as pb
from topic_broker.service import schema_conflict

S = pb.Schema
NONE = pb.Schema.Type.Value("None")


@pytest.mark.parametrize(
    ("stored", "declared", "refused"),
    [
        ([], S.Json, False),  # the first schema of a topic
        ([S.String], S.String, False),
        ([S.String], NONE, False),  # bytes goes with anything
        ([NONE], S.Json, False),
        ([S.String], S.Json, True),
        ([S.Json, S.Avro], S.Json, True),  # the latest counts
        ([S.Avro, S.Json], S.Json, False),
    ],
)
def test_a_schema_of_another_type_than_the_latest_is_refused(
    stored: list[int], declared: int, refused: bool
) -> None:
    why = schema_conflict(stored, declared)
    assert (why is not None) is refused
    if why is not None:
        assert "incompatible schema" in why and pb.Schema.Type.Name(stored[-1]).upper() in why
