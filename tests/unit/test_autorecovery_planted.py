"""AutoRecovery's pure decisions on cases a reviewer's planted bugs got past the other tests with (see the
planted-bug audit in ``docs/architecture.md`` §11): a read-only bookie named by a mark, the throttle after an
idle spell."""

from __future__ import annotations

import pytest

from autorecovery.policy import Action, TokenBucket, decide
from zk.ledger_metadata import Ensemble, LedgerMetadata, LedgerState, password_digest_of
from zk.underreplication import UnderReplicationMark


def test_a_marked_bookie_that_is_up_but_read_only_is_replaced_not_repaired_in_place() -> None:
    """A read-only bookie (registered, not writable) takes no writes: its entries go to a new bookie."""
    md = LedgerMetadata(
        ledger_id=7,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        ensembles=(Ensemble(0, ("a", "b", "c")),),
        password_digest=password_digest_of(b""),
    ).replace(state=LedgerState.CLOSED, last_entry_id=9, length=100)
    mark = UnderReplicationMark(ledger_id=7, missing=("b", "c"), ctime_ms=0)
    writable = {"a", "c", "d"}
    d = decide(md, mark, writable, writable | {"b"}, now_ms=0, grace_ms=0)
    assert (d.action, set(d.replace), set(d.repair)) == (Action.REPLICATE, {"b"}, {"c"})


def test_the_throttle_after_an_idle_spell_allows_one_seconds_burst_not_the_idle_times_worth() -> None:
    b = TokenBucket(1000, now=0)
    assert b.take(1000, 0) == 0
    # idle for 60 s: the bucket holds 1000 bytes again, not 60,000
    assert b.take(1000, 60) == 0
    assert b.take(500, 60) == pytest.approx(0.5)
    assert b.take(500, 60.5) == pytest.approx(0.5)
