"""Tests for the bugs planted in the audit of 2026-11-29 against bd93ea4 that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of persisted skipped ids, Key_Shared's hash and replay index,
TLS and the Spark checks"): each fails with its bug planted and passes without it. Pure logic, no processes."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from bookie.config_file import ConfigError
from tests.unit.test_broker_connection import decode
from tests.unit.test_broker_skipped_ids import bookkeeping, recorded, stored
from tests.unit.test_subscription import FakeLog, delivered, run
from topic_broker import pulsar_api_pb2 as pb
from topic_broker.main import _tls_settings
from topic_broker.managed_ledger import ManagedLedger, ManagedLedgerError
from topic_broker.service import lookup_answer
from topic_broker.subscription import Subscription, SubType, key_hash, murmur3_32
from zk.managed_ledgers import OwnershipInfo


def test_keys_up_to_4_kib_get_pulsars_hash() -> None:
    """Keys of up to 4 KiB (as docs/broker.md says) take Pulsar's Murmur3 slot, so a sticky range holds them as
    with Pulsar's broker; BLAKE2b is for longer keys only."""
    for n in (257, 1025, 4096):
        key = bytes(i % 251 for i in range(n))
        assert key_hash(key) == (murmur3_32(key) & 0x7FFFFFFF) % 65536, n


def _tls_args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"port": 6650, "tls_port": None, "tls_cert": None, "tls_key": None, **kw})


@pytest.mark.parametrize("given", [{"tls_cert": "c.pem"}, {"tls_key": "k.pem"}])
def test_a_tls_certificate_or_key_without_a_tls_port_is_refused(given: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="needs? --tls-port"):
        _tls_settings(_tls_args(**given))


def test_a_tls_port_that_is_the_plaintext_port_is_refused() -> None:
    """Checked before the files are read: the message names the port, not a certificate that does not load."""
    with pytest.raises(ConfigError, match="not the plaintext --port"):
        _tls_settings(_tls_args(tls_port=6650, tls_cert="c.pem", tls_key="k.pem"))


def test_key_shared_entries_waiting_with_no_consumer_go_to_the_next_one() -> None:
    """The only consumer closes with a key's entries unacked: they wait with no consumer to go to, and go to the
    consumer that subscribes next, in order (a Key_Shared consumer restarted)."""
    sub = Subscription(SubType.KEY_SHARED, read_position=(1, 0))
    log = FakeLog(3, keys=[b"k"] * 3)
    sub.add_consumer(1, "a")
    assert delivered(run(sub, log, sub.flow(1, 2))) == [(1, (1, 0), 0), (1, (1, 1), 0)]
    assert run(sub, log, sub.remove_consumer(1)) == []
    sub.add_consumer(2, "b")
    out = delivered(run(sub, log, sub.flow(2, 10)))
    assert out == [(2, (1, 0), 1), (2, (1, 1), 1), (2, (1, 2), 0)]


def test_key_shared_entries_waiting_for_a_consumer_that_closes_go_to_another() -> None:
    """A key's entries read while its consumer has no permits wait for it (another consumer's permits started the
    read); that consumer closes: they go to the other consumer, in order."""
    sub = Subscription(SubType.KEY_SHARED, read_position=(1, 0))
    sub.add_consumer(1, "a")
    sub.add_consumer(2, "b")
    key = next(k for k in (b"k%d" % i for i in range(100)) if sub.consumer_for_key(k) == 1)
    log = FakeLog(2, keys=[key] * 2)
    assert delivered(run(sub, log, sub.flow(2, 10))) == []  # read, and waiting for consumer 1
    assert sub.replay_positions == [(1, 0), (1, 1)]
    out = delivered(run(sub, log, sub.remove_consumer(1)))
    assert [(c, p) for c, p, _ in out] == [(2, (1, 0)), (2, (1, 1))]


def test_the_newest_64_skipped_ranges_of_a_producer_are_recorded() -> None:
    """docs/broker.md: a producer's newest 64 ranges go to the topic's properties, so a batch window of 64
    delayed messages still has each of its ids filled after a clean change of owner."""
    t = bookkeeping()
    for seq in range(1, 2 * 70, 2):  # 70 delayed messages, each jumping over the id before it
        stored(t, "p", seq)
    ranges = recorded(t).split(",")
    assert len(ranges) == 64 and ranges[0] == f"{2 * 6}-{2 * 6}" and ranges[-1] == f"{2 * 69}-{2 * 69}"


def test_a_lookup_over_tls_of_a_topic_whose_owner_serves_no_tls_is_refused() -> None:
    """A client that connected over TLS is never sent to a plaintext port: the owner without a TLS port fails
    its lookup (ServiceNotReady, naming the owner); a plaintext client is sent to the plaintext port as ever."""
    plain = OwnershipInfo(broker_id="b1", service_url="pulsar://h:6650", web_service_url="http://h:8080")
    (cmd,) = decode(lookup_answer(7, plain, tls=True))
    answer = cmd.lookupTopicResponse
    assert answer.response == pb.CommandLookupTopicResponse.Failed and answer.error == pb.ServiceNotReady
    assert "b1" in answer.message and not answer.brokerServiceUrl and not answer.brokerServiceUrlTls
    (cmd,) = decode(lookup_answer(8, plain, tls=False))
    assert cmd.lookupTopicResponse.brokerServiceUrl == "pulsar://h:6650"


@pytest.mark.timeout(30)  # (replays newest first, it never ended)
@pytest.mark.parametrize("sub_type", [SubType.EXCLUSIVE, SubType.FAILOVER])
def test_an_exclusive_or_failover_consumer_gets_its_redelivered_entries_oldest_first(
    sub_type: SubType,
) -> None:
    """Redelivered with fewer permits than entries waiting: the oldest go first, one permit at a time."""
    sub = Subscription(sub_type, read_position=(1, 0))
    log = FakeLog(3)
    sub.add_consumer(1, "a")
    assert len(delivered(run(sub, log, sub.flow(1, 3)))) == 3
    assert run(sub, log, sub.redeliver(1, [(1, 0), (1, 1), (1, 2)])) == []
    out = [p for cmd in (sub.flow(1, 1) for _ in range(3)) for _, p, _ in delivered(run(sub, log, cmd))]
    assert out == [(1, 0), (1, 1), (1, 2)]


def test_a_failed_rollover_waits_half_a_second_doubling_to_five_and_starts_over_once_one_succeeds() -> None:
    """docs/broker.md: a failed rollover is tried again after 0.5 s, each failure doubling the wait up to 5 s;
    meanwhile a try fails at once. After a rollover that succeeds, the next failure waits 0.5 s again."""
    ml = ManagedLedger.__new__(ManagedLedger)  # only what _rollover_locked reads and writes
    ml.name, ml._rollover_wait_s, ml._rollover_retry_at, ml._rollover_error = "t", 0.0, 0.0, ""
    now = [100.0]
    ml._clock = lambda: now[0]  # type: ignore[method-assign]
    outcome: list[bool] = []

    async def attempt() -> None:
        outcome.append(True)
        if not ok:
            raise ManagedLedgerError("too few bookies")

    ml._rollover_attempt = attempt  # type: ignore[method-assign]

    def roll() -> bool:
        try:
            asyncio.run(ml._rollover_locked())
        except ManagedLedgerError:
            return False
        return True

    ok, waits = False, []
    for _ in range(7):
        tried = len(outcome)
        assert not roll() and len(outcome) == tried + 1
        waits.append(ml._rollover_retry_at - now[0])
        now[0] += waits[-1] / 2
        assert not roll() and len(outcome) == tried + 1  # waiting: not tried
        now[0] += waits[-1] / 2
    assert waits == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    ok = True
    assert roll()
    ok = False
    assert not roll() and ml._rollover_retry_at - now[0] == 0.5


def test_a_topic_read_whose_end_equals_its_start_is_refused() -> None:
    """The end is exclusive: an ``endingTime`` equal to ``startingTime`` reads nothing, and is refused as an end
    before the start is (the Spark topic source's options, checked before Spark runs)."""
    from spark._topic_options import TopicOptionError, parse_topic_options

    t = 1_700_000_000_000
    with pytest.raises(TopicOptionError, match=f"'endingTime': {t} is not after startingTime {t}"):
        parse_topic_options({"topic": "t", "startingTime": str(t), "endingTime": str(t)}, streaming=False)
    parse_topic_options({"topic": "t", "startingTime": str(t), "endingTime": str(t + 1)}, streaming=False)


def test_a_jobs_ledger_and_topic_sources_both_get_the_credential_files() -> None:
    """``ledgerstore spark JOB`` on a secured cluster: the files of its credentials go to the ledger source as to
    the topic source (its executors have neither the files nor the environment)."""
    from spark.jobs import JobOptions

    opts = JobOptions(auth_token_file="/run/token", zk_auth_file="/run/zk-auth")
    for source in (opts.source_options(), opts.topic_source_options()):
        assert (source["authTokenFile"], source["zkAuthFile"]) == ("/run/token", "/run/zk-auth")
