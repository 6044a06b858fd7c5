"""The bookie's admin HTTP routes under Apache BookKeeper's names (its ``HttpRouter``), so BookKeeper tooling and
habits work; the bookie's own routes (``/health``, ``/api/v1/info``, ``PUT /api/v1/gc``, ...) stay beside them.

| route | answers |
|---|---|
| ``GET /heartbeat`` | ``OK`` (text) while the process serves HTTP |
| ``GET /api/v1/bookie/info`` | ``freeSpace``, ``totalSpace`` (bytes) and the bookie's own ``/api/v1/info`` |
| ``GET /api/v1/bookie/state`` | ``running``, ``readOnly``, ``shuttingDown``, ``availableForHighPriorityWrites`` |
| ``GET|PUT /api/v1/bookie/state/readonly`` | ``{"readOnly": bool}``; a PUT of it sets it (an operator's read-only, kept until set writable again or restarted; 409 when it stays read-only: failed, disk full) |
| ``GET /api/v1/bookie/is_ready`` | 200 ``OK`` once registered in ZooKeeper; 503 before, failed or stopping |
| ``GET /api/v1/bookie/last_log_mark`` | ``{journal dir: "LastLogMark: Journal Id - N(segment), Pos - P"}`` |
| ``PUT /api/v1/bookie/gc`` | a garbage-collection round now (``PUT /api/v1/gc``) |
| ``GET /api/v1/bookie/gc`` | ``is_in_force_gc`` ("true"/"false"), ``is_in_gc`` and the collector's counters |
| ``GET /api/v1/bookie/gc_details`` | a list of one object: GC and blob garbage state |
| ``GET /api/v1/bookie/list_bookies?type=rw|ro&print_hostnames=true`` | ``{bookie id: hostname or null}`` |
| ``GET /api/v1/ledger/metadata?ledger_id=N`` | ``{"N": metadata}`` from ZooKeeper (404 when absent) |
| ``GET /api/v1/config/server_config`` | every setting as a string, secrets redacted (BookKeeper's flat map) |
| ``GET /api/v1/config`` | settings, where each came from (flag, env, file, default) and the config file |
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .config_file import Effective, is_secret

if TYPE_CHECKING:
    from .main import Bookie

__all__ = ["add_bookkeeper_routes", "add_config_routes", "effective_settings", "last_log_mark_text"]


def last_log_mark_text(seq: int, offset: int) -> str:
    """BookKeeper's rendering of a journal mark (segment ``seq`` is the file ``<seq as 16 hex digits>.jnl``)."""
    return f"LastLogMark: Journal Id - {seq}({seq:016x}.jnl), Pos - {offset}"


def effective_settings(bookie: Bookie) -> Effective:
    """The settings the bookie runs with: those ``bookie serve`` resolved, or its BookieConfig when it was built
    in-process (every value then counts as given by the program: source ``api``)."""
    if bookie.settings is not None:
        return bookie.settings
    values = {f.name: getattr(bookie.config, f.name) for f in dataclasses.fields(bookie.config)}
    return Effective(values, dict.fromkeys(values, "api"), None, frozenset(n for n in values if is_secret(n)))


def _hostname(bookie_id: str) -> str:
    host = bookie_id.rpartition(":")[0].strip("[]") or bookie_id
    try:
        return socket.gethostbyaddr(host)[0]
    except OSError:
        return host


def add_bookkeeper_routes(app: web.Application, bookie: Bookie) -> None:
    """Add the routes of the module docstring to ``app`` (before it starts)."""
    forced = {"running": 0}

    async def heartbeat(_: web.Request) -> web.Response:
        return web.Response(text="OK\n")

    async def info(_: web.Request) -> web.Response:
        body = bookie.info()
        return web.json_response(
            {"freeSpace": body["disk_free_bytes"], "totalSpace": body["disk_total_bytes"], **body}
        )

    async def state(_: web.Request) -> web.Response:
        core = bookie.core
        return web.json_response(
            {
                "running": core is not None and not bookie.stopping,
                "readOnly": bool(core is not None and core.readonly),
                "shuttingDown": bookie.stopping,
                "availableForHighPriorityWrites": not bookie.failed and not bookie.stopping,
            }
        )

    async def readonly_get(_: web.Request) -> web.Response:
        core = bookie.core
        return web.json_response({"readOnly": bool(core is not None and core.readonly)})

    async def readonly_put(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested deeper than the parser recurses
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("readOnly"), bool):
            return web.json_response(
                {"error": 'the body is {"readOnly": true} or {"readOnly": false}'}, status=400
            )
        if bookie.core is None or bookie.stopping:
            return web.json_response({"error": "the bookie is not serving"}, status=503)
        why = bookie.set_admin_readonly(body["readOnly"])
        if why:
            return web.json_response({"error": f"stays read-only: {why}", "readOnly": True}, status=409)
        return web.json_response({"readOnly": bookie.core.readonly})

    async def is_ready(_: web.Request) -> web.Response:
        why = ""
        if bookie.failed:
            why = f"Bookie failed: {bookie.failed}"
        elif bookie.stopping:
            why = "Bookie is shutting down"
        elif bookie._registered_readonly is None:
            why = "Bookie is not fully started yet"
        if why:
            return web.Response(text=why + "\n", status=503)
        return web.Response(text="OK\n")

    async def last_log_mark(_: web.Request) -> web.Response:
        journal = bookie.journal
        if journal is None:
            return web.json_response({"error": "the journal is not open yet"}, status=503)
        mark = journal.persisted_mark
        return web.json_response({str(bookie.config.journal_dir): last_log_mark_text(mark.seq, mark.offset)})

    async def gc_put(request: web.Request) -> web.Response:
        def caller_gone() -> bool:
            transport = request.transport
            return transport is None or transport.is_closing()

        forced["running"] += 1
        try:
            return web.json_response(await bookie.gc_now(caller_gone))
        finally:
            forced["running"] -= 1

    def _gc_state() -> dict[str, Any]:
        collector = bookie.collector
        lock = getattr(collector, "_lock", None)
        stats = dataclasses.asdict(collector.stats) if collector is not None else {}
        return {"is_in_gc": bool(lock is not None and lock.locked()), "stats": stats}

    async def gc_get(_: web.Request) -> web.Response:
        return web.json_response({"is_in_force_gc": str(forced["running"] > 0).lower(), **_gc_state()})

    async def gc_details(_: web.Request) -> web.Response:
        storage = bookie.storage
        stored, garbage = storage.blob_garbage() if storage is not None else (0, 0)
        gc = _gc_state()
        return web.json_response(
            [
                {
                    "forceCompacting": forced["running"] > 0,
                    "majorCompacting": False,
                    "minorCompacting": False,
                    "gcRunning": gc["is_in_gc"],
                    "storedBytes": stored,
                    "blobGarbageBytes": garbage,
                    "gcIntervalSeconds": bookie.config.gc_interval_s,
                    **gc["stats"],
                }
            ]
        )

    async def list_bookies(request: web.Request) -> web.Response:
        kind = request.query.get("type", "")
        if kind not in ("", "rw", "ro"):
            return web.json_response({"error": "type must be rw or ro"}, status=400)
        hostnames = request.query.get("print_hostnames", "false").lower() in ("true", "1", "yes")
        registry = bookie.registry
        if registry is None:
            return web.json_response({"error": "not registered yet"}, status=503)
        ids: list[str] = []
        if kind in ("", "rw"):
            ids += sorted(await asyncio.to_thread(registry.available))
        if kind in ("", "ro"):
            ids += sorted(await asyncio.to_thread(registry.readonly))
        names = await asyncio.gather(*(asyncio.to_thread(_hostname, b) for b in ids)) if hostnames else []
        return web.json_response({b: (names[i] if hostnames else None) for i, b in enumerate(ids)})

    async def ledger_metadata(request: web.Request) -> web.Response:
        try:
            lid = int(request.query["ledger_id"])
        except (KeyError, ValueError):
            return web.json_response({"error": "ledger_id=N (an integer) is required"}, status=400)
        from zk import LedgerMetadataStore
        from zk.errors import MetadataNotFoundError

        try:
            md = await asyncio.to_thread(LedgerMetadataStore(bookie.store).read, lid)
        except MetadataNotFoundError:
            return web.json_response({"error": f"no ledger {lid}"}, status=404)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({str(lid): md.value.to_json()})

    r = app.router
    r.add_get("/heartbeat", heartbeat)
    r.add_get("/api/v1/bookie/info", info)
    r.add_get("/api/v1/bookie/state", state)
    r.add_get("/api/v1/bookie/state/readonly", readonly_get)
    r.add_put("/api/v1/bookie/state/readonly", readonly_put)
    r.add_get("/api/v1/bookie/is_ready", is_ready)
    r.add_get("/api/v1/bookie/last_log_mark", last_log_mark)
    r.add_put("/api/v1/bookie/gc", gc_put)
    r.add_get("/api/v1/bookie/gc", gc_get)
    r.add_get("/api/v1/bookie/gc_details", gc_details)
    r.add_get("/api/v1/bookie/list_bookies", list_bookies)
    r.add_get("/api/v1/ledger/metadata", ledger_metadata)
    r.add_get("/api/v1/ledger/metadata/", ledger_metadata)
    add_config_routes(app, lambda: effective_settings(bookie), flat=("/api/v1/config/server_config",))


def add_config_routes(
    app: web.Application, settings: Callable[[], Effective], *, flat: tuple[str, ...] = ()
) -> None:
    """``GET /api/v1/config`` (settings, sources, file) and, at each ``flat`` path, every setting as a string
    (BookKeeper's ``server_config``, Pulsar's ``brokers/configuration/values``); secrets redacted in both."""

    async def flat_view(_: web.Request) -> web.Response:
        values = settings().redacted()
        return web.json_response({k: "" if v is None else str(v) for k, v in values.items()})

    async def report(_: web.Request) -> web.Response:
        return web.json_response(settings().report())

    for path in flat:
        app.router.add_get(path, flat_view)
    app.router.add_get("/api/v1/config", report)
