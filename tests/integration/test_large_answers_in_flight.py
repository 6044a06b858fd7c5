"""Requests whose answer may be large (a namespace's topics), pipelined on one connection that reads no answer:
an in-process broker (real ZooKeeper, 3 bookies) and a raw socket."""

from __future__ import annotations

from tests.broker_testing import Brokers, cluster  # noqa: F401
from tests.integration.test_users17 import pipelined_get_topics_held
from topic_broker.service import LARGE_ANSWERS_IN_FLIGHT_MAX


def test_large_answers_are_begun_a_few_at_a_time_and_all_answered_in_the_end(cluster: Brokers) -> None:  # noqa: F811
    """200 GET_TOPICS_OF_NAMESPACE in one write: LARGE_ANSWERS_IN_FLIGHT_MAX begun, the rest held (before: all
    200 begun, as up to 1,000 were: their answers, each the namespace's whole topic list, all queued for a peer
    that read none, 132 MB for 3,000 such requests on a namespace of 2,000 topics); all answered in order."""
    pipelined_get_topics_held(cluster, 200, LARGE_ANSWERS_IN_FLIGHT_MAX)  # before: 200 begun
