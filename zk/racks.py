"""Bookie racks: ``bookies/racks/<bookie id>`` (persistent) ``{"rack": "/region/rack"}``, set by the operator
(``ledgerstore bookie set-rack ID RACK``), as BookKeeper's racks come from a mapping outside the bookies. A bookie
without a znode is in :data:`DEFAULT_RACK`. The placement policy (``ledger_client.placement``) reads the map.
"""

from __future__ import annotations

from collections.abc import Iterable

from zk import layout
from zk.client import MetadataStore
from zk.errors import MetadataNotFoundError

__all__ = ["DEFAULT_RACK", "RACKS", "check_rack", "delete_rack", "racks", "racks_of", "set_rack"]

DEFAULT_RACK = "/default-region/default-rack"
RACKS = f"{layout.BOOKIES}/racks"


def check_rack(rack: str) -> str:
    """A rack is ``/region/rack`` (or deeper): a leading ``/`` and non-empty components without spaces."""
    parts = rack.split("/")
    if (
        not rack.startswith("/")
        or len(parts) < 2
        or any(not p or p.strip() != p or " " in p for p in parts[1:])
    ):
        raise ValueError(f"invalid rack {rack!r}: expected /region/rack")
    return rack


def rack_path(bookie_id: str) -> str:
    return f"{RACKS}/{layout.check_znode_name(bookie_id, 'bookie id')}"


def set_rack(store: MetadataStore, bookie_id: str, rack: str) -> None:
    check_rack(rack)
    store.update(rack_path(bookie_id), lambda cur: {**cur, "rack": rack}, default={})


def delete_rack(store: MetadataStore, bookie_id: str) -> bool:
    return store.delete(rack_path(bookie_id), missing_ok=True)


def racks(store: MetadataStore) -> dict[str, str]:
    """Bookie id -> rack, for every bookie with a rack znode (others are in :data:`DEFAULT_RACK`)."""
    try:
        names = store.children(RACKS)
    except MetadataNotFoundError:
        return {}
    return racks_of(store, names)


def racks_of(store: MetadataStore, names: Iterable[str]) -> dict[str, str]:
    """:func:`racks` for the rack znodes ``names`` (children of :data:`RACKS` already listed): one pipelined
    read of their bodies, none when there are none."""
    names = list(names)
    if not names:
        return {}
    bodies = store.get_many([f"{RACKS}/{n}" for n in names])
    out = {}
    for n in names:
        v = bodies.get(f"{RACKS}/{n}")
        if v is not None and isinstance(v.value.get("rack"), str):
            out[n] = v.value["rack"]
    return out
