"""The simulated ZooKeeper: a tree of versioned znodes with JSON bodies, under the real metadata-store code.

It offers the part of ``zk.client.MetadataStore`` (the kazoo-bound store) that ``zk.LedgerMetadataStore`` and
``zk.IdGenerator`` call — ``get``, ``get_optional``, ``exists``, ``create``, ``set``, ``update``, ``delete``,
``children_many`` — with ZooKeeper's own semantics and the project's errors: a create of an existing znode is
``MetadataExistsError`` (NodeExists), a ``set`` at another version ``MetadataVersionError`` (BadVersion), a
missing znode ``MetadataNotFoundError`` (NoNode); every successful ``set`` bumps the version by one. Bodies are
stored as the bytes ``zk.client.encode_body`` makes and read back through ``decode_body``, as over the wire.

So the simulator runs the project's real ledger-metadata logic (``LedgerMetadataStore.create/read/write``: id
allocation, the transition check, the compare-and-set on the znode version) instead of a copy of it. Every
operation here is instantaneous: the simulated network latency, lost replies and session expiry are applied
around it by ``tests.sim.world.MetadataStore``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from zk.client import CompareAndSetUpdate, JsonDict, decode_body, encode_body
from zk.errors import MetadataExistsError, MetadataNotFoundError, MetadataVersionError
from zk.versioned import Versioned

#: Called after every change of a znode: (path, old body or None, new body or None).
OnChange = Callable[[str, JsonDict | None, JsonDict | None], None]


class SimZooKeeper(CompareAndSetUpdate):
    """Znodes by store-relative path (no leading ``/``): path -> (body bytes, version). ``update`` is the real
    store's compare-and-set loop (``zk.client.CompareAndSetUpdate``) over ``get_optional``, ``create`` and
    ``set`` here; it makes one pass, as nothing else runs while a simulated operation applies."""

    def __init__(self, on_change: OnChange | None = None) -> None:
        self.nodes: dict[str, tuple[bytes, int]] = {}
        self.on_change = on_change
        self.ops = 0
        self.ignore_versions = False  # WRONG on purpose (mutation ``unversioned-set``): set never conflicts

    @staticmethod
    def _key(path: str) -> str:
        return path.strip("/")

    def abs_path(self, path: str) -> str:
        """The path errors name: the simulated tree has no root, so the store-relative one."""
        return self._key(path)

    def _changed(self, path: str, old: bytes | None, new: bytes | None) -> None:
        if self.on_change is not None:
            self.on_change(
                path,
                None if old is None else decode_body(old, path),
                None if new is None else decode_body(new, path),
            )

    # --- the MetadataStore subset ------------------------------------------------------------------------

    def get(self, path: str) -> Versioned[JsonDict]:
        self.ops += 1
        key = self._key(path)
        node = self.nodes.get(key)
        if node is None:
            raise MetadataNotFoundError("znode does not exist", path=key)
        return Versioned(decode_body(node[0], key), node[1])

    def get_optional(self, path: str) -> Versioned[JsonDict] | None:
        try:
            return self.get(path)
        except MetadataNotFoundError:
            return None

    def exists(self, path: str) -> bool:
        return self._key(path) in self.nodes

    def create(self, path: str, value: Mapping[str, Any], **_kwargs: Any) -> str:
        """NodeExists if the znode is there (missing parents are implied: the tree keeps leaves only)."""
        self.ops += 1
        key = self._key(path)
        if key in self.nodes:
            raise MetadataExistsError("znode exists", path=key)
        data = encode_body(value)
        self.nodes[key] = (data, 0)
        self._changed(key, None, data)
        return key

    def set(self, path: str, value: Mapping[str, Any], version: int) -> Versioned[JsonDict]:
        """Compare-and-set on the znode version (BadVersion otherwise); the version goes up by one."""
        self.ops += 1
        key = self._key(path)
        node = self.nodes.get(key)
        if node is None:
            raise MetadataNotFoundError("znode does not exist", path=key)
        if node[1] != version and not self.ignore_versions:
            raise MetadataVersionError(f"znode at version {node[1]}, not {version}", path=key)
        data = encode_body(value)
        self.nodes[key] = (data, node[1] + 1)
        self._changed(key, node[0], data)
        return Versioned(json.loads(data), node[1] + 1)

    def delete(self, path: str, version: int = -1, *, missing_ok: bool = False, **_kwargs: Any) -> bool:
        self.ops += 1
        key = self._key(path)
        node = self.nodes.get(key)
        if node is None:
            if missing_ok:
                return False
            raise MetadataNotFoundError("znode does not exist", path=key)
        if version >= 0 and node[1] != version:
            raise MetadataVersionError(f"znode at version {node[1]}, not {version}", path=key)
        del self.nodes[key]
        self._changed(key, node[0], None)
        return True

    def children_many(self, paths: Sequence[str]) -> dict[str, list[str] | None]:
        out: dict[str, list[str] | None] = {}
        for p in paths:
            prefix = self._key(p) + "/"
            kids = sorted({k[len(prefix) :].split("/")[0] for k in self.nodes if k.startswith(prefix)})
            out[p] = kids or None
        return out
