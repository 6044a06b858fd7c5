"""LedgerMetadataStore and IdGenerator against a real ZooKeeper."""

import asyncio
import threading

import pytest

from tests.zk_testing import ZkTarget, wait_for
from zk import layout
from zk.client import MetadataStore
from zk.errors import (
    MetadataExistsError,
    MetadataFormatError,
    MetadataNotFoundError,
    MetadataTransitionError,
    MetadataVersionError,
)
from zk.idgen import FIRST_ID, IdGenerator
from zk.ledger_metadata import LedgerMetadata, LedgerMetadataStore, LedgerState
from zk.versioned import Versioned

B = [f"127.0.0.1:{3181 + i}" for i in range(6)]


def _create(lms: LedgerMetadataStore, **kw: object) -> Versioned[LedgerMetadata]:
    args: dict[str, object] = dict(
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        bookies=B[:3],
        password=b"pw",
        custom_metadata={"app": b"x"},
    )
    args.update(kw)
    return lms.create(**args)  # type: ignore[arg-type]


def test_create_read_list_delete(zk_store: MetadataStore) -> None:
    lms = LedgerMetadataStore(zk_store)
    a = _create(lms)
    b = _create(lms)
    assert a.version == 0 and a.value.ledger_id == FIRST_ID and b.value.ledger_id == FIRST_ID + 1
    assert a.value.state is LedgerState.OPEN and a.value.check_password(b"pw")
    assert a.value.password_digest.startswith("v2$pbkdf2-sha256$")
    assert lms.read(a.value.ledger_id) == a
    assert zk_store.exists(layout.ledger_path(a.value.ledger_id))
    big = _create(lms, ledger_id=123456789012)
    assert lms.list() == [a.value.ledger_id, b.value.ledger_id, 123456789012]
    with pytest.raises(MetadataExistsError):
        _create(lms, ledger_id=123456789012)
    assert lms.delete(big.value.ledger_id)
    with pytest.raises(MetadataNotFoundError):
        lms.read(big.value.ledger_id)
    assert lms.delete(big.value.ledger_id, missing_ok=True) is False
    assert lms.list() == [a.value.ledger_id, b.value.ledger_id]
    with pytest.raises(ValueError):
        _create(lms, write_quorum=4)  # invalid: nothing created, no id consumed
    assert lms.list() == [a.value.ledger_id, b.value.ledger_id]


def test_generated_ids_skip_taken_ones(zk_store: MetadataStore) -> None:
    lms = LedgerMetadataStore(zk_store)
    _create(lms, ledger_id=FIRST_ID)  # taken explicitly before the generator reaches it
    auto = _create(lms)
    assert auto.value.ledger_id == FIRST_ID + 1


def test_list_empty(zk_store: MetadataStore) -> None:
    assert LedgerMetadataStore(zk_store).list() == []


def test_write_is_a_single_checked_cas(zk_store: MetadataStore) -> None:
    lms = LedgerMetadataStore(zk_store)
    v0 = _create(lms)
    lid = v0.value.ledger_id
    v1 = lms.write(lid, v0.value.with_new_ensemble(10, B[3:6]), v0.version)
    assert v1.version == 1
    with pytest.raises(MetadataVersionError):
        lms.write(lid, v0.value.with_state(LedgerState.IN_RECOVERY), v0.version)  # stale
    with pytest.raises(MetadataVersionError):
        lms.write(lid, v1.value.with_state(LedgerState.IN_RECOVERY), v0)  # stale Versioned
    v2 = lms.write(lid, v1.value.close(20, 100), v1)
    assert lms.read(lid) == v2
    with pytest.raises(MetadataTransitionError):
        lms.write(lid, v2.value.replace(last_entry_id=25), v2.version)
    with pytest.raises(MetadataTransitionError):
        lms.write(lid, v1.value, v2.version)  # CLOSED -> OPEN
    assert lms.read(lid) == v2  # nothing was written


def test_update_loop_checks_transitions(zk_store: MetadataStore) -> None:
    lms = LedgerMetadataStore(zk_store)
    lid = _create(lms).value.ledger_id
    rec = lms.update(lid, lambda m: m.with_state(LedgerState.IN_RECOVERY))
    assert rec.value.state is LedgerState.IN_RECOVERY and rec.version == 1
    with pytest.raises(MetadataTransitionError):
        lms.update(lid, lambda m: m.with_state(LedgerState.OPEN))
    same = lms.update(lid, lambda m: m)
    assert same.version == 1
    closed = lms.update(lid, lambda m: m.close(9, 90))
    assert closed.value.last_entry_id == 9


def test_concurrent_recoverers_agree_on_first_close(zk_connect: ZkTarget) -> None:
    """Many clients race to close the same ledger with different last entry ids: exactly one close wins and
    everybody else observes it (the predicate aborts instead of overwriting)."""
    stores = [MetadataStore.connect(*zk_connect) for _ in range(4)]
    try:
        lid = _create(LedgerMetadataStore(stores[0])).value.ledger_id
        results: list[int] = []
        lock = threading.Lock()

        def recover(i: int) -> None:
            lms = LedgerMetadataStore(stores[i % 4])

            def fn(m: LedgerMetadata) -> LedgerMetadata:
                if m.is_closed:
                    return m  # somebody else closed it: accept their answer
                return m.close(100 + i, 1000 + i)

            v = lms.update(lid, fn)
            with lock:
                results.append(v.value.last_entry_id)

        threads = [threading.Thread(target=recover, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert len(results) == 8 and len(set(results)) == 1
        final = LedgerMetadataStore(stores[0]).read(lid)
        assert final.version == 1 and final.value.last_entry_id == results[0]
    finally:
        for s in stores:
            s.close()


def test_corrupt_ledger_znode(zk_store: MetadataStore) -> None:
    lms = LedgerMetadataStore(zk_store)
    zk_store.create(layout.ledger_path(5), {"ledger_id": 5})
    with pytest.raises(MetadataFormatError):
        lms.read(5)
    v = _create(lms, ledger_id=6)
    zk_store.create(layout.ledger_path(7), v.value.to_json())  # body says ledger 6
    with pytest.raises(MetadataFormatError, match="ledger 6"):
        lms.read(7)


def test_idgen_unique_across_clients_and_threads(zk_connect: ZkTarget) -> None:
    stores = [MetadataStore.connect(*zk_connect) for _ in range(4)]
    try:
        gens = [IdGenerator(s) for s in stores] + [IdGenerator(s, block_size=7) for s in stores]
        got: list[list[int]] = [[] for _ in range(16)]

        def worker(i: int) -> None:
            gen = gens[i % len(gens)]
            for _ in range(25):
                got[i].append(gen.next_id())

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        ids = [x for g in got for x in g]
        assert len(ids) == 400
        assert len(set(ids)) == 400, "an id was handed out twice"
        assert min(ids) >= FIRST_ID
        for g in got:
            assert g == sorted(g)  # one generator's ids increase
    finally:
        for s in stores:
            s.close()


def test_watch_ledger(zk_store: MetadataStore) -> None:
    lms = LedgerMetadataStore(zk_store)
    v = _create(lms)
    lid = v.value.ledger_id
    seen: list[object] = []
    cancel = lms.watch(lid, lambda x: seen.append(None if x is None else x.value.state))
    assert wait_for(lambda: seen == [LedgerState.OPEN])
    lms.update(lid, lambda m: m.close(-1, 0))
    assert wait_for(lambda: seen[-1:] == [LedgerState.CLOSED])
    lms.delete(lid)
    assert wait_for(lambda: seen[-1:] == [None])
    cancel()


def test_async_ledger_store(zk_store: MetadataStore) -> None:
    lms = LedgerMetadataStore(zk_store)

    async def main() -> None:
        v = await lms.acreate(ensemble_size=2, write_quorum=2, ack_quorum=1, bookies=B[:2], password=b"")
        lid = v.value.ledger_id
        assert (await lms.aread(lid)) == v
        v2 = await lms.aupdate(lid, lambda m: m.with_state("IN_RECOVERY"))
        v3 = await lms.awrite(lid, v2.value.close(3, 30), v2)
        assert v3.value.is_closed
        assert await lms.alist() == [lid]
        assert await lms.adelete(lid)

    asyncio.run(main())
