"""A stranger with a ZooKeeper client against a cluster secured with digest ACLs: real bookie processes and a real
ledger client (credentials from ``LEDGERSTORE_ZK_AUTH``) fill the tree; the stranger can read nothing and change
nothing under any top-level node, and a bookie started without credentials refuses to start instead of hanging."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from ledger_client.sync import BookKeeper
from ledgerstore.cluster import BookieProcess, free_port
from tests.abuse.helpers import http, ledger_ids
from tests.zk_testing import zk_auth  # noqa: F401 - the fixture
from zk import MetadataStore, layout
from zk.acl import ENV_AUTH, stranger_probe
from zk.managed_ledgers import BrokerInfo, BrokerMetadataStore, ManagedLedgerInfo, OwnershipInfo


def _snapshot(store: MetadataStore) -> dict[str, tuple[int, int, int]]:
    """Every znode under the root with (data version, children version, ACL version)."""
    out: dict[str, tuple[int, int, int]] = {}

    def walk(rel: str) -> None:
        _, st = store.kazoo.get(store.abs_path(rel))
        out[rel] = (st.version, st.cversion, st.aversion)
        for name in store.children(rel):
            walk(f"{rel}/{name}" if rel else name)

    walk("")
    return out


def _fill_broker_metadata(store: MetadataStore) -> None:
    bms = BrokerMetadataStore(store)
    ml = "t/ns/persistent/topic"

    async def go() -> None:
        await bms.create_ml_info(ml, ManagedLedgerInfo())
        await bms.create_partitioned_topic("t/ns/persistent/parted", 2)
        await bms.register_broker("broker-1", BrokerInfo(service_url="pulsar://x:1", web_service_url=""))
        await bms.acquire_ownership(
            ml, OwnershipInfo(broker_id="broker-1", service_url="pulsar://x:1", web_service_url="")
        )

    asyncio.run(go())


@pytest.mark.usefixtures("zk_auth")
def test_a_stranger_reads_nothing_and_changes_nothing_in_a_secured_cluster(bookies) -> None:
    procs = bookies.start_many(3)  # they inherit LEDGERSTORE_ZK_AUTH
    bk = BookKeeper.connect(bookies.zk, zk_root=bookies.root)
    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    raw = KazooClient(hosts=bookies.zk)
    raw.start(timeout=10)
    try:
        assert store.acl_mode == "secured"
        lh = bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw")
        lh.append_many([b"entry %d" % i for i in range(20)])
        lh.close()
        lid = lh.ledger_id
        _fill_broker_metadata(store)
        top = store.children("")
        for expected in (
            layout.LEDGERS,
            layout.BOOKIES,
            layout.COOKIES,
            layout.IDGEN,
            layout.INSTANCEID,
            layout.MANAGED_LEDGERS,
            layout.TOPICS,
            layout.BROKERS,
            layout.OWNERSHIP,
        ):
            assert expected in top, top
        before = _snapshot(store)
        assert len(before) > 30

        refused = 0
        for rel in before:
            full = store.abs_path(rel)
            ops: list[Callable[[], object]] = [
                lambda f=full: raw.get(f),
                lambda f=full: raw.get_children(f),
                lambda f=full: raw.get_acls(f),
                lambda f=full: raw.set(f, b'{"format_version":1}'),
                lambda f=full: raw.set_acls(f, OPEN_ACL_UNSAFE),
                lambda f=full: raw.create(f"{f}/evil", b"{}"),
            ]
            if rel:
                ops.append(lambda f=full: raw.delete(f))
            for op in ops:
                with pytest.raises(NoAuthError):
                    op()
                refused += 1
        assert refused >= 6 * len(before)
        with pytest.raises(NoAuthError):
            raw.delete(store.abs_path(""), recursive=True)

        # nothing changed: not in ZooKeeper, not on the bookies; the owner still reads every entry
        assert _snapshot(store) == before
        for bp in procs:
            status, _ = http(bp, "PUT", "/api/v1/gc")
            assert status == 200
            assert lid in ledger_ids(bp)
        rh = bk.open_ledger(lid, password=b"pw")
        assert [e.data for e in rh.read(0, 19)] == [b"entry %d" % i for i in range(20)]
        assert stranger_probe(bookies.zk, bookies.root, list(before)).secured
    finally:
        raw.stop()
        raw.close()
        bk.close()
        store.close()


@pytest.mark.usefixtures("zk_auth")
def test_a_bookie_without_or_with_wrong_credentials_refuses_to_start(bookies) -> None:
    bookies.start()  # secures the fresh root
    for env in ({ENV_AUTH: ""}, {ENV_AUTH: "ledgerstore-test:wrong"}):
        port = free_port()
        bp = BookieProcess(
            zk=bookies.zk,
            zk_root=bookies.root,
            data_dir=bookies.tmp / f"stranger-{port}",
            port=port,
            http_port=free_port(),
            env=env,
        )
        bp.start(wait=False)
        try:
            code = bp.wait_exit(30)
            assert code != 0
            assert "METADATA_AUTH" in bp.log_tail(50), bp.log_tail(50)
        finally:
            if bp.proc is not None and bp.proc.poll() is None:
                bp.kill9()
