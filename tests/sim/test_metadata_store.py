"""The simulator's metadata is the project's own ``zk.LedgerMetadataStore`` over a simulated ZooKeeper: its id
allocation (NodeExists skips a taken id), its compare-and-set (BadVersion on a stale version), its transition
check, and lost replies of applied writes, which the simulated clients must recognise."""

from __future__ import annotations

import pytest

from zk.client import CompareAndSetUpdate, MetadataStore
from zk.errors import (
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataTransitionError,
    MetadataVersionError,
)
from zk.layout import ledger_path
from zk.ledger_metadata import Ensemble, LedgerMetadata, password_digest_of

from .actors import Recoverer, Writer
from .schedule import PASSWORD, run
from .world import Mutations, SimConfig, World
from .zookeeper import SimZooKeeper


def _world(**mut: bool) -> World:
    w = World(0, SimConfig(), mutations=Mutations(**mut))
    for i in range(4):
        w.add_bookie(f"b{i}")
    return w


def _md(lid: int = 0) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=lid,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        ensembles=(Ensemble(0, ("b0", "b1", "b2")),),
        password_digest=password_digest_of(PASSWORD),
    )


def _create(w: World) -> int:
    v = w.meta.store.create(
        ensemble_size=3, write_quorum=3, ack_quorum=2, bookies=["b0", "b1", "b2"], password=b"x"
    )
    return v.value.ledger_id


def test_create_skips_an_id_taken_by_an_explicit_create() -> None:
    w = _world()
    w.meta.store.create(
        ledger_id=1, ensemble_size=3, write_quorum=3, ack_quorum=2, bookies=["b0", "b1", "b2"], password=b"x"
    )
    with pytest.raises(MetadataExistsError):
        w.meta.zk.create(ledger_path(1), {"x": 1})  # an existing znode: NodeExists
    assert _create(w) == 2  # the id generator handed out 1, the create hit NodeExists, 2 was next
    assert sorted(w.meta.ledgers) == [1, 2]


def test_a_write_at_a_stale_version_is_refused_and_a_closed_ledger_cannot_reopen() -> None:
    w = _world()
    lid = _create(w)
    v0 = w.meta.store.read(lid)
    v1 = w.meta.store.write(lid, v0.value.with_state("IN_RECOVERY"), v0)
    assert v1.version == 1 and w.meta.ledgers[lid].version == 1
    with pytest.raises(MetadataVersionError):
        w.meta.store.write(lid, v0.value.close(-1, 0), v0)  # v0 is stale: BadVersion
    v2 = w.meta.store.write(lid, v1.value.close(-1, 0), v1)
    with pytest.raises(MetadataTransitionError):
        w.meta.store.write(lid, v2.value.replace(state="OPEN", last_entry_id=-1, length=0), v2)
    assert w.meta.ledgers[lid].value.state == "CLOSED" and not w.checker.violations


def test_the_checker_sees_every_znode_change_even_one_that_bypasses_the_store() -> None:
    w = _world()
    lid = _create(w)
    v = w.meta.store.write(lid, w.meta.store.read(lid).value.close(-1, 0), 0)
    w.meta.zk.set(ledger_path(lid), v.value.replace(state="OPEN").to_json(), v.version)
    assert [str(x.message) for x in w.checker.violations] == [f"L{lid} went from CLOSED to OPEN"]


def test_unversioned_set_mutation_makes_the_simulated_zookeeper_ignore_versions() -> None:
    zk = SimZooKeeper()
    zk.create("a", {"n": 1})
    zk.set("a", {"n": 2}, 0)
    with pytest.raises(MetadataVersionError):
        zk.set("a", {"n": 3}, 0)
    zk.ignore_versions = True
    assert zk.set("a", {"n": 3}, 0).version == 2


def test_the_simulated_zookeeper_updates_through_the_real_compare_and_set_loop() -> None:
    """``update`` (what ``IdGenerator`` calls) is ``zk.client``'s loop, not a copy: its checks hold here too."""
    assert SimZooKeeper.update is MetadataStore.update is CompareAndSetUpdate.update
    zk = SimZooKeeper()
    with pytest.raises(MetadataNotFoundError):
        zk.update("n", lambda cur: cur)
    assert zk.update("n", lambda cur: {**cur, "n": cur["n"] + 1}, default={"n": 0}).version == 0
    assert zk.update("n", lambda cur: cur).version == 0  # unchanged: nothing written
    with pytest.raises(TypeError, match="must return a dict"):
        zk.update("n", lambda cur: [cur])  # type: ignore[arg-type, return-value]
    v = zk.update("n", lambda cur: {**cur, "n": cur["n"] + 1})
    assert (v.value["n"], v.version, zk.nodes["n"][1]) == (2, 1, 1)


def test_lost_replies_of_applied_metadata_writes_are_recognised() -> None:
    """Seeds with a flaky ZooKeeper connection (replies lost after the write applied) pass, and some of them
    lose the reply of a writer's ensemble change or of a close."""
    lost = found = 0
    for seed in range(300):
        out = run(seed)
        assert out.ok, out.report()
        lost += out.stats.get("meta op applied, reply lost", 0)
        found += out.stats.get("writer found its own lost ensemble change", 0)
        if lost and found:
            return
    pytest.fail(f"in 300 seeds: {lost} lost replies, {found} found by their writer")


def test_a_recoverer_and_a_writer_race_through_the_real_store() -> None:
    w = _world()
    wr = Writer(w, "w0", n_entries=20, password=PASSWORD, ensemble=["b0", "b1", "b2"])
    wr.start()
    w.at(0.05, lambda: Recoverer(w, "x0", 1, PASSWORD).start())
    w.run(10.0)
    assert not w.checker.violations, w.checker.violations
    md = w.meta.ledgers[1].value
    assert md.state == "CLOSED" and wr.outcome in ("FENCED", "CLOSED", "closed")
    assert md.length == sum(w.payload_sizes[(1, e)] for e in range(md.last_entry_id + 1))
    assert w.meta.zk.ops > 0
