"""A stateful property test of the subscription core (topic_broker/subscription.py), one machine per type.

Each machine drives a :class:`Subscription` the way ``topic_broker.service`` does: consumers attached and
closed, FLOW permits, entries appended to a managed ledger (single messages and batches, with keys, some of them
delayed), its ``Read``/``ReadReplay`` commands answered later (other events come between a read's start and its
answer; a read may fail and be resumed; a read of an epoch before a seek is answered and dropped), the reads
leaving out what the cursor has acknowledged, individual acks (whole entries, batch indexes, ack sets),
cumulative acks on Exclusive and Failover, redelivery of all or some of a consumer's messages (a negative ack
is a redelivery of one message), seek, and the consumer and subscription unacked limits changed at run time
(``BrokerService.apply_policies``: a raised limit resumes dispatch). A model kept beside it (what each consumer
holds, what the cursor acknowledged, the permits each consumer gave) checks every delivery and every step:

- the subscription's unacked count is the sum of its consumers', which is what they hold pending;
- every entry read and not acknowledged is pending on one consumer, or waits for replay, or is delayed: one of
  them, never lost; an acknowledged entry is never sent again (a seek before it makes it unacknowledged);
- a consumer is sent a message only with a permit left, only while its connection takes more, and on Shared
  and Key_Shared only under its unacked limit and the subscription's;
- Exclusive and Failover send to the active consumer only, always the first entry nobody holds; Key_Shared
  sends a key to one consumer at a time, and never past an older entry of that key waiting (delayed ones aside);
- the redelivery count and the ack set of a partly acknowledged batch are the ones the model expects;
- consumers that take and acknowledge everything are sent every entry (no stall), checked by a rule and at
  the end of each run.

CI runs a fixed set of examples (derandomized). For a long local run:
``SUBSCRIPTION_MACHINE_PROFILE=long pytest tests/unit/test_subscription_machine.py`` (random seeds, 2,000
examples of up to 80 steps each per type).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from topic_broker import subscription as core
from topic_broker.subscription import (
    ActiveConsumerChanged,
    Deliver,
    Read,
    ReadReplay,
    Subscription,
    SubType,
    unacked_set,
)

Position = tuple[int, int]
Command = Read | ReadReplay | Deliver | ActiveConsumerChanged

settings.register_profile(
    "subscription-machine-ci",
    max_examples=150,
    stateful_step_count=25,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile(
    "subscription-machine-long",
    max_examples=2000,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
MACHINE_SETTINGS = settings.get_profile(
    "subscription-machine-long"
    if os.environ.get("SUBSCRIPTION_MACHINE_PROFILE") == "long"
    else "subscription-machine-ci"
)

UNLIMITED = 2**63 - 1
KEYS = [b"k1", b"k2", b"k3", b"k4", b"k5"]
LOG_MAX = 40
INDIVIDUAL = (SubType.SHARED, SubType.KEY_SHARED)
ORDERED = (SubType.EXCLUSIVE, SubType.FAILOVER)

entry_specs = st.lists(
    st.tuples(
        st.sampled_from([1, 1, 1, 3]),  # messages in the entry (3: a batch)
        st.sampled_from(KEYS),
        st.sampled_from([None, None, None, 0, 40, 400]),  # delay (ms) of its deliver_at
    ),
    min_size=1,
    max_size=5,
)
index = st.integers(0, 1000)
#: a rule that clears much of the state (a seek, a catch-up) does something one time in four
RARE = st.integers(0, 3)


class SubscriptionMachine(RuleBasedStateMachine):
    SUB_TYPE = SubType.SHARED

    def __init__(self) -> None:
        super().__init__()
        self.sub = Subscription(self.SUB_TYPE)
        self.now = 1_000_000
        self.log: list[core.DispatchEntry] = []
        self.next_id = 1
        self.consumers: dict[int, dict[str, int | bool]] = {}  # id -> permits, writable
        self.active: int | None = None
        self.out_of_order = False
        self.inflight: list[Read | ReadReplay] = []
        #: reads answered at once (the service's reads of the cached tail), else by the rules, later
        self.sync_reads = False
        self._running = False
        # the model: what was read since the last seek, what the cursor acknowledged, who holds what
        self.read: set[Position] = set()
        self.acked: set[Position] = set()
        self.batch_acked: dict[Position, int] = {}
        self.held: dict[Position, int] = {}
        self.delayed: set[Position] = set()
        self.redeliveries: dict[Position, int] = {}
        self.consumer_max = UNLIMITED
        self.subscription_max = UNLIMITED

    # -- set up ---------------------------------------------------------------------------------------------

    @initialize(
        partition=st.sampled_from([-1, 0, 1, 2]),
        read_max=st.sampled_from([1, 2, 3, 100]),
        consumer_max=st.sampled_from([1, 2, 3, 5, UNLIMITED]),
        subscription_max=st.sampled_from([1, 2, 4, 7, UNLIMITED]),
        out_of_order=st.booleans(),
        entries=entry_specs,
        permits=st.integers(0, 8),
        sync_reads=st.booleans(),
    )
    def start(
        self,
        partition: int,
        read_max: int,
        consumer_max: int,
        subscription_max: int,
        out_of_order: bool,
        entries: list[tuple[int, bytes, int | None]],
        permits: int,
        sync_reads: bool,
    ) -> None:
        self.sync_reads = sync_reads
        self.sub = Subscription(
            self.SUB_TYPE,
            partition=partition,
            read_position=(1, 0),
            read_entries_max=read_max,
            unacked_messages_max=consumer_max,
        )
        self.sub.unacked_subscription_max = subscription_max
        self.consumer_max, self.subscription_max = consumer_max, subscription_max
        self.out_of_order = out_of_order and self.SUB_TYPE == SubType.KEY_SHARED
        self._append_entries(entries)
        self._add_consumer()
        self.flow(0, permits)

    # -- the broker's events --------------------------------------------------------------------------------

    @precondition(lambda self: len(self.consumers) < (1 if self.SUB_TYPE == SubType.EXCLUSIVE else 3))
    @rule(priority=st.sampled_from([0, 0, 1]))
    def add_consumer(self, priority: int) -> None:
        self._add_consumer(priority)

    @precondition(lambda self: self.consumers)
    @rule(i=index)
    def remove_consumer(self, i: int) -> None:
        cid = self._pick_consumer(i)
        cmds = self.sub.remove_consumer(cid)
        del self.consumers[cid]
        self._rewind([p for p, c in self.held.items() if c == cid], bump=True)
        if self.active == cid:
            self.active = None
        self._run(cmds)

    @precondition(lambda self: self.consumers)
    @rule(i=index, permits=st.integers(1, 6))
    def flow(self, i: int, permits: int) -> None:
        if permits <= 0:
            return
        cid = self._pick_consumer(i)
        self.consumers[cid]["permits"] = int(self.consumers[cid]["permits"]) + permits
        self._run(self.sub.flow(cid, permits))

    @precondition(lambda self: self.consumers)
    @rule(i=index, writable=st.booleans())
    def set_writable(self, i: int, writable: bool) -> None:
        cid = self._pick_consumer(i)
        self.consumers[cid]["writable"] = writable
        self._run(self.sub.set_writable(cid, writable))

    @precondition(lambda self: len(self.log) < LOG_MAX)
    @rule(entries=entry_specs)
    def append(self, entries: list[tuple[int, bytes, int | None]]) -> None:
        self._append_entries(entries)
        if self.sub.caught_up:  # Subscription.on_new_entries in the service
            self._run(self.sub.on_new_entries())

    @precondition(lambda self: self.inflight)
    @rule(i=index)
    def complete_read(self, i: int) -> None:
        self._complete(self.inflight.pop(i % len(self.inflight)))

    @precondition(lambda self: self.inflight)
    @rule(i=index)
    def fail_read(self, i: int) -> None:
        cmd = self.inflight.pop(i % len(self.inflight))
        assert self.sub.on_read_failed(cmd.epoch) == []
        self._run(self.sub.resume())  # the service resumes a second later

    @rule(dt=st.sampled_from([10, 50, 500]))
    def advance_time(self, dt: int) -> None:
        self.now += dt
        self.delayed = {p for p in self.delayed if self._entry(p).deliver_at > self.now}  # type: ignore[operator]
        self._run(self.sub.release_delayed(self.now))

    @precondition(lambda self: self.held or self._late_ackable())
    @rule(i=index, j=index, how=st.sampled_from(["entry", "entry", "index", "ack_set"]), late=st.booleans())
    def ack_individual(self, i: int, j: int, how: str, late: bool) -> None:
        """An ack of a message the consumer received; ``late``: one that was put back for redelivery since
        (the client acked it before its redelivery request or its consumer switch reached the broker)."""
        pool = sorted(self._late_ackable()) if late and self._late_ackable() else sorted(self.held)
        if not pool:
            return
        pos = pool[i % len(pool)]
        n = self._entry(pos).num_messages
        if how == "entry" or n == 1:
            item: tuple[Position, int, tuple[int, ...] | None] = (pos, -1, None)
            mask = (1 << n) - 1
        else:
            bi = j % n
            mask = self.batch_acked.get(pos, 0) | (1 << bi)
            item = (pos, bi, None) if how == "index" else (pos, -1, unacked_set(n, mask))
        out = self.sub.ack_individual([item])
        if mask == (1 << n) - 1:
            assert out.acked == [pos]
            self._ack(pos)
        else:
            assert out.acked == []
            self.batch_acked[pos] = mask
        self._run(out.commands)

    @precondition(lambda self: self.SUB_TYPE in ORDERED and self.held)
    @rule(i=index, j=index, partial=st.booleans())
    def ack_cumulative(self, i: int, j: int, partial: bool) -> None:
        pool = sorted(self.held)
        pos = pool[i % len(pool)]
        n = self._entry(pos).num_messages
        bi = j % (n - 1) if partial and n > 1 else -1
        out = self.sub.ack_cumulative(pos, bi)
        for p in [e.position for e in self.log if e.position < pos]:
            self._ack(p)
        if bi < 0:
            self._ack(pos)
            assert out.mark_delete == pos
        else:
            self.batch_acked[pos] = self.batch_acked.get(pos, 0) | ((1 << (bi + 1)) - 1)
            assert out.mark_delete == (pos[0], pos[1] - 1)
        self._run(out.commands)

    @precondition(lambda self: self.consumers)
    @rule(i=index)
    def redeliver_all(self, i: int) -> None:
        cid = self._pick_consumer(i)
        self._rewind([p for p, c in self.held.items() if c == cid], bump=True)
        self._run(self.sub.redeliver(cid, None))

    @precondition(lambda self: self.held)
    @rule(i=index, picks=st.lists(index, min_size=1, max_size=3))
    def redeliver_some(self, i: int, picks: list[int]) -> None:
        """REDELIVER_UNACKNOWLEDGED_MESSAGES naming messages (a negative ack names one); a name the consumer
        does not hold (another's, a message acked meanwhile) is ignored."""
        pool = sorted(self.held)
        cid = self.held[pool[i % len(pool)]]
        named = [pool[k % len(pool)] for k in picks]
        self._rewind([p for p in dict.fromkeys(named) if self.held.get(p) == cid], bump=True)
        self._run(self.sub.redeliver(cid, named))

    @rule(i=index, rare=RARE)
    def seek(self, i: int, rare: int) -> None:
        """SEEK / reset-cursor to an entry (or the end): the cursor's acks from there on are gone, those before
        it all acknowledged."""
        if rare:
            return
        start = (1, i % (len(self.log) + 1))
        self.read.clear()
        self.acked = {e.position for e in self.log if e.position < start}
        self.batch_acked.clear()
        self.held.clear()
        self.delayed.clear()
        self.redeliveries.clear()
        self._run(self.sub.reset(start))

    @rule(
        consumer_max=st.sampled_from([1, 2, 3, 5, UNLIMITED]),
        subscription_max=st.sampled_from([1, 2, 4, 7, UNLIMITED]),
    )
    def set_limits(self, consumer_max: int, subscription_max: int) -> None:
        """BrokerService.apply_policies: the limits in force set, dispatch resumed when one was raised."""
        raised = (
            consumer_max > self.sub.unacked_messages_max
            or subscription_max > self.sub.unacked_subscription_max
        )
        self.sub.unacked_messages_max = self.consumer_max = consumer_max
        self.sub.unacked_subscription_max = self.subscription_max = subscription_max
        if raised and self.consumers:
            self._run(self.sub.resume())

    @rule(rare=RARE)
    def catch_up(self, rare: int) -> None:
        if not rare:
            self._drain()

    def teardown(self) -> None:
        if self.log:
            self._drain()

    # -- invariants -----------------------------------------------------------------------------------------

    @invariant()
    def unacked_counts_agree(self) -> None:
        sub = self.sub
        per_consumer = {cid: sub.unacked_messages(cid) for cid in sub.consumer_ids}
        assert sub._unacked_total == sum(per_consumer.values())
        for cid, n in per_consumer.items():
            pending = sub.pending(cid)
            assert n == sum(self._entry(p).num_messages for p in pending)
            assert set(pending) == {p for p, c in self.held.items() if c == cid}
        assert sorted(sub.consumer_ids) == sorted(self.consumers)

    @invariant()
    def every_unacked_entry_is_in_one_place(self) -> None:
        sub = self.sub
        replay = set(sub.replay_positions)
        delayed = set(sub._delayed)
        assert delayed == self.delayed
        assert not replay & delayed and not replay & set(self.held) and not delayed & set(self.held)
        assert replay | delayed | set(self.held) == self.read - self.acked

    @invariant()
    def permits_agree(self) -> None:
        for cid, m in self.consumers.items():
            assert self.sub.permits(cid) == m["permits"]

    @invariant()
    def ready_permits_agree(self) -> None:
        """The permits a Shared or Key_Shared dispatch may spend, kept as they change (not summed at each
        dispatch): those of the writable consumers under their unacked limit, by the model."""
        unacked = {cid: 0 for cid in self.consumers}
        for pos, cid in self.held.items():
            unacked[cid] += self._entry(pos).num_messages
        assert self.sub._ready_permits == sum(
            int(m["permits"])
            for cid, m in self.consumers.items()
            if m["writable"] and int(m["permits"]) > 0 and unacked[cid] < self.consumer_max
        )

    @invariant()
    def one_read_at_a_time(self) -> None:
        current = [c for c in self.inflight if c.epoch == self.sub.epoch]
        assert len(current) <= 1
        assert self.sub.reading == bool(current)

    # -- the model ------------------------------------------------------------------------------------------

    def _append_entries(self, entries: list[tuple[int, bytes, int | None]]) -> None:
        for n, key, delay in entries:
            pos = (1, len(self.log))
            deliver_at = None if delay is None else self.now + delay
            self.log.append(core.DispatchEntry(pos, n, key, f"m{pos[1]}", deliver_at))

    def _entry(self, pos: Position) -> core.DispatchEntry:
        return self.log[pos[1]]

    def _pick_consumer(self, i: int) -> int:
        ids = sorted(self.consumers)
        return ids[i % len(ids)]

    def _add_consumer(self, priority: int = 0) -> None:
        cid = self.next_id
        self.next_id += 1
        cmds = self.sub.add_consumer(cid, f"c{cid}", priority, out_of_order=self.out_of_order)
        self.consumers[cid] = {"permits": 0, "writable": True}
        if self.SUB_TYPE == SubType.EXCLUSIVE:
            self.active = cid
        self._run(cmds)

    def _late_ackable(self) -> set[Position]:
        return self.read - self.acked - set(self.held) - self.delayed

    def _ack(self, pos: Position) -> None:
        self.acked.add(pos)
        self.held.pop(pos, None)
        self.batch_acked.pop(pos, None)
        self.redeliveries.pop(pos, None)
        self.delayed.discard(pos)

    def _rewind(self, positions: list[Position], *, bump: bool) -> None:
        for pos in positions:
            del self.held[pos]
            if bump and self.SUB_TYPE in INDIVIDUAL:
                self.redeliveries[pos] = self.redeliveries.get(pos, 0) + 1

    def _complete(self, cmd: Read | ReadReplay) -> None:
        current = cmd.epoch == self.sub.epoch
        if isinstance(cmd, ReadReplay):
            entries = [self._entry(p) for p in cmd.positions]
            cmds = self.sub.on_replay_read(cmd.epoch, entries)
            assert current or cmds == []
            self._run(cmds)
            return
        got = [e for e in self.log if e.position >= cmd.start][: cmd.max_entries]
        if not got:
            cmds = self.sub.on_read(cmd.epoch, [], cmd.start)
        else:
            last = got[-1].position
            entries = [e for e in got if e.position not in self.acked]  # what the cursor acked is left out
            if current:
                for e in entries:
                    self.read.add(e.position)
                    if self.SUB_TYPE in INDIVIDUAL and e.deliver_at is not None and e.deliver_at > self.now:
                        self.delayed.add(e.position)
            cmds = self.sub.on_read(cmd.epoch, entries, (last[0], last[1] + 1), at_end=False, now_ms=self.now)
        assert current or cmds == []
        self._run(cmds)

    def _run(self, cmds: list[Command]) -> None:
        self._execute(cmds)
        if self.sync_reads and not self._running:
            self._running = True
            try:
                while self.inflight:
                    self._complete(self.inflight.pop(0))
            finally:
                self._running = False

    def _execute(self, cmds: list[Command]) -> None:
        for cmd in cmds:
            if isinstance(cmd, Deliver):
                self._delivered(cmd)
            elif isinstance(cmd, ActiveConsumerChanged):
                if cmd.is_active and cmd.consumer_id != self.active:
                    old = self.active
                    # Pulsar rewinds on a switch: the old active consumer's unacked messages go to the new one
                    self._rewind([p for p, c in self.held.items() if c == old], bump=False)
                    self.active = cmd.consumer_id
            else:
                self.inflight.append(cmd)

    def _delivered(self, d: Deliver) -> None:
        cid, e = d.consumer_id, d.entry
        pos, n = e.position, e.num_messages
        assert cid in self.consumers, f"{pos} sent to {cid}, not attached"
        m = self.consumers[cid]
        assert pos in self.read, f"{pos} sent, not read since the last seek"
        assert pos not in self.acked, f"{pos} sent again after its ack"
        assert pos not in self.held, f"{pos} sent to {cid} while {self.held.get(pos)} holds it"
        assert pos not in self.delayed, f"{pos} sent before its deliver_at"
        assert m["writable"], f"{pos} sent to {cid}, whose connection takes nothing more"
        assert int(m["permits"]) > 0, f"{pos} sent to {cid} without a permit"
        if self.SUB_TYPE in INDIVIDUAL:
            mine = sum(self._entry(p).num_messages for p, c in self.held.items() if c == cid)
            total = sum(self._entry(p).num_messages for p in self.held)
            assert mine < self.consumer_max, f"{pos} sent to {cid} holding {mine} unacked"
            assert total < self.subscription_max, f"{pos} sent with {total} unacked on the subscription"
        else:
            assert cid == self.active, f"{pos} sent to {cid}, not the active consumer {self.active}"
            first = min(
                p for p in (x.position for x in self.log) if p not in self.acked and p not in self.held
            )
            assert pos == first, f"{pos} sent to {cid} before {first}"
        if self.SUB_TYPE == SubType.KEY_SHARED:
            others = {c for p, c in self.held.items() if self._entry(p).key == e.key and c != cid}
            assert not others, f"key {e.key!r} sent to {cid} while {others} hold some"
            if not self.out_of_order:
                older = [
                    p
                    for p in self.read - self.acked - set(self.held) - self.delayed
                    if p < pos and self._entry(p).key == e.key
                ]
                assert not older, f"{pos} of key {e.key!r} sent before {older}"
        assert d.redelivery_count == self.redeliveries.get(pos, 0)
        mask = self.batch_acked.get(pos, 0)
        assert d.ack_set == (unacked_set(n, mask) if mask and n > 1 else None)
        m["permits"] = int(m["permits"]) - n
        self.held[pos] = cid

    def _drain(self) -> None:
        """Consumers that are writable, keep giving permits and acknowledge all they get are sent every entry."""
        if not self.consumers:
            self._add_consumer()
        for cid, m in list(self.consumers.items()):
            if not m["writable"]:
                m["writable"] = True
                self._run(self.sub.set_writable(cid, True))
        for _ in range(3 * len(self.log) + 10):
            if all(e.position in self.acked for e in self.log):
                return
            self.now += 10_000
            self.delayed.clear()
            self._run(self.sub.release_delayed(self.now))
            for cid in list(self.consumers):
                self.consumers[cid]["permits"] = int(self.consumers[cid]["permits"]) + 3
                self._run(self.sub.flow(cid, 3))
            for _ in range(10 * LOG_MAX):
                if not self.inflight:
                    break
                self._complete(self.inflight.pop(0))
            assert not self.inflight, "reads never end"
            for cid in list(self.consumers):
                mine = sorted(p for p, c in self.held.items() if c == cid)
                if mine:
                    out = self.sub.ack_individual([(p, -1, None) for p in mine])
                    assert out.acked == mine
                    for p in mine:
                        self._ack(p)
                    self._run(out.commands)
        left = [e.position for e in self.log if e.position not in self.acked]
        raise AssertionError(
            f"stalled: {left} never delivered; replay {self.sub.replay_positions}, "
            f"reading {self.sub.reading}, caught up {self.sub.caught_up}"
        )


class ExclusiveMachine(SubscriptionMachine):
    SUB_TYPE = SubType.EXCLUSIVE


class FailoverMachine(SubscriptionMachine):
    SUB_TYPE = SubType.FAILOVER


class SharedMachine(SubscriptionMachine):
    SUB_TYPE = SubType.SHARED


class KeySharedMachine(SubscriptionMachine):
    SUB_TYPE = SubType.KEY_SHARED


TestExclusive = ExclusiveMachine.TestCase
TestFailover = FailoverMachine.TestCase
TestShared = SharedMachine.TestCase
TestKeyShared = KeySharedMachine.TestCase
TestExclusive.settings = TestFailover.settings = TestShared.settings = TestKeyShared.settings = (
    MACHINE_SETTINGS
)
