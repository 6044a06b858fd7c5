"""MetadataStore against a real ZooKeeper: CAS, the update loop, error translation, sessions, async twins."""

import asyncio
import socket
import threading
import time

import pytest

from tests.zk_testing import ZkTarget, expire_session, make_test_server, wait_for
from zk.client import MetadataStore
from zk.errors import (
    MetadataClosedError,
    MetadataConnectionError,
    MetadataExistsError,
    MetadataFormatError,
    MetadataNotEmptyError,
    MetadataNotFoundError,
    MetadataVersionError,
)


def test_crud_and_format_version(zk_store: MetadataStore) -> None:
    assert zk_store.create("a/b/c", {"x": 1}) == "a/b/c"  # parents made
    v = zk_store.get("a/b/c")
    assert v.value == {"x": 1, "format_version": 1} and v.version == 0
    raw, _ = zk_store.kazoo.get(zk_store.abs_path("a/b/c"))
    assert b'"format_version":1' in raw
    assert zk_store.abs_path("a/b/c") == f"{zk_store.root}/a/b/c"
    assert zk_store.exists("a/b/c") and not zk_store.exists("nope")
    assert zk_store.children("a/b") == ["c"]
    v2 = zk_store.set("a/b/c", {"x": 2}, 0)
    assert v2.version == 1 and zk_store.get("a/b/c") == v2
    with pytest.raises(MetadataExistsError):
        zk_store.create("a/b/c", {"x": 3})
    with pytest.raises(MetadataNotFoundError):
        zk_store.get("nope")
    with pytest.raises(MetadataNotFoundError):
        zk_store.children("nope")
    with pytest.raises(MetadataNotEmptyError):
        zk_store.delete("a")
    with pytest.raises(MetadataFormatError):
        zk_store.get("a/b")  # a directory node has no JSON body
    assert zk_store.get_optional("nope") is None
    seq = zk_store.create("q/item-", {"n": 1}, sequence=True)
    assert seq.startswith("q/item-") and seq[-10:].isdigit()
    assert zk_store.get_many(["a/b/c", "nope"]) == {"a/b/c": v2, "nope": None}
    assert zk_store.children_many(["a", "nope"]) == {"a": ["b"], "nope": None}
    assert zk_store.delete("a", recursive=True)
    assert not zk_store.exists("a/b/c") and not zk_store.exists("a")
    assert zk_store.delete("a", missing_ok=True) is False
    with pytest.raises(MetadataNotFoundError):
        zk_store.delete("a")


def test_foreign_body_is_refused(zk_store: MetadataStore) -> None:
    zk_store.kazoo.create(zk_store.abs_path("foreign"), b'{"format_version": 9}', makepath=True)
    with pytest.raises(MetadataFormatError, match="format_version"):
        zk_store.get("foreign")


def test_cas_conflict_raises_version_error(zk_store: MetadataStore) -> None:
    zk_store.create("cas", {"n": 0})
    v = zk_store.get("cas")
    zk_store.set("cas", {"n": 1}, v.version)
    with pytest.raises(MetadataVersionError) as ei:
        zk_store.set("cas", {"n": 99}, v.version)  # stale version
    assert ei.value.code == "METADATA_VERSION" and ei.value.retriable
    assert zk_store.get("cas").value["n"] == 1
    with pytest.raises(MetadataVersionError):
        zk_store.delete("cas", version=v.version)
    with pytest.raises(ValueError):
        zk_store.set("cas", {"n": 2}, -1)  # no unconditional sets


def test_update_loop_converges_under_contention(zk_connect: ZkTarget) -> None:
    stores = [MetadataStore.connect(*zk_connect) for _ in range(4)]
    try:
        stores[0].create("counter", {"n": 0})
        conflicts = [0]
        errors: list[BaseException] = []

        def incr(d: dict) -> dict:
            d["n"] += 1
            return d

        def worker(store: MetadataStore) -> None:
            try:
                for _ in range(25):
                    store.update("counter", incr, retries=1000)
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        orig_set = MetadataStore.set

        def counting_set(self: MetadataStore, path: str, value: dict, version: int):  # type: ignore[no-untyped-def]
            try:
                return orig_set(self, path, value, version)
            except MetadataVersionError:
                conflicts[0] += 1
                raise

        MetadataStore.set = counting_set  # type: ignore[method-assign,assignment]
        try:
            threads = [threading.Thread(target=worker, args=(stores[i % 4],)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
        finally:
            MetadataStore.set = orig_set  # type: ignore[method-assign]
        assert not errors
        final = stores[0].get("counter")
        assert final.value["n"] == 200
        assert final.version == 200  # exactly one successful write per increment
        assert conflicts[0] > 0  # the loop really had to retry
    finally:
        for s in stores:
            s.close()


def test_update_semantics(zk_store: MetadataStore) -> None:
    zk_store.create("u", {"n": 1})
    same = zk_store.update("u", lambda d: d)
    assert same.version == 0  # unchanged -> no write
    seen = []

    def mutate_in_place_no_change(d: dict) -> dict:
        seen.append(d)
        return dict(d)

    assert zk_store.update("u", mutate_in_place_no_change).version == 0
    with pytest.raises(RuntimeError):
        zk_store.update("u", lambda d: (_ for _ in ()).throw(RuntimeError("abort")))
    assert zk_store.get("u").version == 0
    with pytest.raises(MetadataNotFoundError):
        zk_store.update("missing", lambda d: d)
    created = zk_store.update("missing", lambda d: {**d, "n": d["n"] + 1}, default={"n": 41})
    assert created.value == {"n": 42, "format_version": 1} and created.version == 0
    assert zk_store.get("missing") == created
    # fn gets a private copy: mutating it does not touch what update compares against
    v = zk_store.update("u", lambda d: d.update(n=5) or d)
    assert v.value["n"] == 5 and v.version == 1


def test_update_gives_up_after_retries(zk_store: MetadataStore) -> None:
    zk_store.create("hot", {"n": 0})

    def always_conflict(d: dict) -> dict:
        cur = zk_store.get("hot")
        zk_store.set("hot", {"n": cur.value["n"] + 1}, cur.version)  # someone else wins every time
        d["n"] = -1
        return d

    with pytest.raises(MetadataVersionError, match="gave up"):
        zk_store.update("hot", always_conflict, retries=3)
    assert zk_store.get("hot").value["n"] == 4


def test_update_with_a_default_creates_the_znode_deleted_under_it(zk_store: MetadataStore) -> None:
    """With ``default``, a znode deleted between the loop's read and its write is a conflict like any other: the
    next turn finds it missing and creates it from ``default`` (a topic's policy set while its last other policy
    is removed, which deletes the znode, answered 404 'znode does not exist' and was not set)."""
    zk_store.create("gone", {"a": 1})
    calls = []

    def deleted_meanwhile(d: dict) -> dict:
        if not calls:
            zk_store.delete("gone")  # someone else removes it after this turn's read
        calls.append(dict(d))
        return {**d, "b": 2}

    v = zk_store.update("gone", deleted_meanwhile, default={})
    assert v.value == {"b": 2, "format_version": 1} and zk_store.get("gone") == v
    assert [c.get("a") for c in calls] == [1, None]
    calls.clear()
    zk_store.delete("gone")
    zk_store.create("gone", {"a": 1})
    with pytest.raises(MetadataNotFoundError):  # without a default a znode that is gone stays an error
        zk_store.update("gone", deleted_meanwhile)


def test_connect_to_dead_port_is_bounded() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    t0 = time.monotonic()
    with pytest.raises(MetadataConnectionError) as ei:
        MetadataStore.connect(f"127.0.0.1:{port}", timeout_s=1.5)
    assert time.monotonic() - t0 < 5
    assert ei.value.retriable and f"127.0.0.1:{port}" in str(ei.value)


def test_closed_store_raises_closed(zk_connect: ZkTarget) -> None:
    s = MetadataStore.connect(*zk_connect)
    s.close()
    s.close()  # idempotent
    with pytest.raises(MetadataClosedError) as ei:
        s.get("x")
    assert isinstance(ei.value, MetadataConnectionError) and not ei.value.retriable


def test_ephemeral_disappears_on_close(zk_connect: ZkTarget, zk_store: MetadataStore) -> None:
    other = MetadataStore.connect(*zk_connect)
    other.create("eph", {"me": 1}, ephemeral=True)
    st = zk_store.stat("eph")
    assert st is not None and st.ephemeral and st.ephemeral_owner == other.session_id
    other.close()
    assert not zk_store.exists("eph")


def test_session_listener_sees_expiry_and_new_session(zk_store: MetadataStore) -> None:
    events: list[str] = []
    zk_store.add_session_listener(events.append)
    zk_store.create("eph", {}, ephemeral=True)
    old = expire_session(zk_store)
    assert zk_store.session_id != old
    assert wait_for(lambda: events[-1:] == ["CONNECTED"] and "LOST" in events)
    assert events.index("LOST") < len(events) - 1
    assert not zk_store.exists("eph")  # ephemeral died with the old session
    zk_store.create("after", {"ok": True})  # the store keeps working


def test_request_timeout_while_server_paused() -> None:
    with make_test_server() as server:
        store = MetadataStore.connect(
            server.connect_string, "/t", session_timeout_s=2.0, request_timeout_s=1.0
        )
        try:
            events: list[str] = []
            store.add_session_listener(events.append)
            server.pause()
            t0 = time.monotonic()
            with pytest.raises(MetadataConnectionError):
                store.get_optional("x")
            assert time.monotonic() - t0 < 3
            assert wait_for(lambda: "SUSPENDED" in events, 5)
            server.resume()
            assert store.wait_connected(10)
            assert store.get_optional("x") is None
        finally:
            server.resume()
            store.close()


def test_watch_data_and_children(zk_store: MetadataStore) -> None:
    seen: list[object] = []
    kids: list[list[str]] = []
    cancel = zk_store.watch_data("w", lambda v: seen.append(None if v is None else v.value["n"]))
    cancel_kids = zk_store.watch_children("dir", kids.append)
    zk_store.create("w", {"n": 1})
    assert wait_for(lambda: seen[-1:] == [1])
    zk_store.set("w", {"n": 2}, 0)
    assert wait_for(lambda: seen[-1:] == [2])
    zk_store.create("dir/a", {})
    assert wait_for(lambda: kids[-1:] == [["a"]])
    zk_store.delete("w")
    assert wait_for(lambda: seen[-1:] == [None])
    assert seen[0] is None  # first call: did not exist yet
    cancel()
    cancel_kids()
    zk_store.create("w", {"n": 3})
    zk_store.create("dir/b", {})
    time.sleep(0.3)
    assert 3 not in seen and ["a", "b"] not in kids


def test_async_twins(zk_store: MetadataStore) -> None:
    async def main() -> None:
        assert await zk_store.acreate("as", {"n": 1}) == "as"
        v = await zk_store.aget("as")
        v = await zk_store.aset("as", {"n": 2}, v.version)
        v = await zk_store.aupdate("as", lambda d: {**d, "n": d["n"] + 1})
        assert v.value["n"] == 3 and await zk_store.aexists("as")
        assert await zk_store.achildren("") == ["as"]
        assert await zk_store.adelete("as")
        with pytest.raises(MetadataNotFoundError):
            await zk_store.aget("as")

    asyncio.run(main())


def test_a_guarded_update_writes_nothing_once_its_guard_is_gone(zk_store: MetadataStore) -> None:
    """``update_guarded``: the update while the guard znode exists (a znode created, then changed, with a
    conflict re-read), MetadataNotFoundError naming the guard and nothing written once it is gone, also when
    it goes between the update's read and its write (deleted by the update function here)."""
    zk_store.create("thing", {})
    made = zk_store.update_guarded("of/thing", lambda d: {**d, "n": 1}, guard="thing", default={})
    assert made.value["n"] == 1 and made.version == 0
    calls = []

    def bump_after_a_conflict(d: dict) -> dict:
        calls.append(d["n"])
        if len(calls) == 1:
            zk_store.set("of/thing", {"n": 10}, 0)  # written by another meanwhile
        return {**d, "n": d["n"] + 1}

    assert zk_store.update_guarded("of/thing", bump_after_a_conflict, guard="thing").value["n"] == 11
    assert calls == [1, 10]
    assert zk_store.update_guarded("of/thing", lambda d: d, guard="thing").version == 2  # unchanged
    zk_store.delete("of/thing")

    def delete_the_guard(d: dict) -> dict:
        zk_store.delete("thing", missing_ok=True)
        return {**d, "n": 2}

    with pytest.raises(MetadataNotFoundError, match="thing"):
        zk_store.update_guarded("of/thing", delete_the_guard, guard="thing", default={})
    assert zk_store.get_optional("of/thing") is None
    zk_store.create("of/thing", {"n": 3})
    for fn in (delete_the_guard, lambda d: d):
        with pytest.raises(MetadataNotFoundError) as e:
            zk_store.update_guarded("of/thing", fn, guard="thing")
        assert e.value.path is not None and e.value.path.endswith("/thing")
    assert zk_store.get("of/thing").value["n"] == 3
