"""An AutoRecovery process: the auditor candidate, replication workers and ``/metrics``, on one ZooKeeper session.

``run_autorecovery(config, stop_event)`` is the entry point, for ``ledgerstore autorecovery serve`` and for a
bookie that runs AutoRecovery beside itself (as BookKeeper's ``autoRecoveryDaemonEnabled``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time

from aiohttp import web

from bookie.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from bookie.server_gate import HttpService, serve_http
from ledger_client.client import BookKeeper, ClientConfig, _meta
from zk.cookies import NoClusterError, existing_instance_id
from zk.underreplication import UnderReplicationManager

from .auditor import Auditor
from .config import AutoRecoveryConfig
from .metrics import Metrics
from .worker import ReplicationWorker

__all__ = ["run_autorecovery"]

log = logging.getLogger(__name__)

GAUGE_REFRESH_S = 2.0


def default_owner() -> str:
    return f"autorecovery-{socket.gethostname()}-{os.getpid()}"


async def _refresh_gauges(manager: UnderReplicationManager, metrics: Metrics, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            marks = await _meta(manager.list)
            metrics.under_replicated_ledgers = len(marks)
            oldest = min((m.value.ctime_ms for m in marks.values()), default=None)
            metrics.oldest_mark_age_s = 0.0 if oldest is None else max(0.0, time.time() - oldest / 1000)
        except Exception as e:  # a gauge is not worth stopping for
            log.debug("gauge refresh failed: %s", e)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), GAUGE_REFRESH_S)


async def _serve_metrics(config: AutoRecoveryConfig, port: int, metrics: Metrics) -> HttpService:
    exported = ServerMetrics()
    metrics.register(exported)

    async def handle(_: web.Request) -> web.Response:
        return web.Response(body=exported.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "auditor": bool(metrics.is_auditor)})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    app.router.add_get("/health", health)
    return await serve_http("autorecovery HTTP", app, config.metrics_host, port, access_log=None)


async def run_autorecovery(
    config: AutoRecoveryConfig, stop_event: asyncio.Event, metrics: Metrics | None = None
) -> Metrics:
    """Run until ``stop_event`` is set; returns the final metrics (``metrics``, counted on, when given). Its
    ZooKeeper session (and with it the election znode and any worker lock) ends when it returns. Raises
    :class:`zk.cookies.NoClusterError` for a root without a cluster while other roots hold one."""
    owner = config.owner or default_owner()
    bk = await BookKeeper.connect(
        config.zk,
        config=ClientConfig(
            zk_root=config.zk_root,
            zk_session_timeout_s=config.zk_session_timeout_s,
            auth_token=config.auth_token,
        ),
    )
    try:  # a mistyped --zk-root is refused (NoClusterError) before anything is written under it
        await asyncio.to_thread(existing_instance_id, bk.store)
    except NoClusterError:
        await bk.close()
        raise
    metrics = Metrics() if metrics is None else metrics
    manager = UnderReplicationManager(bk.store)
    runner = None
    tasks: list[asyncio.Task[None]] = []
    try:
        if config.metrics_port is not None:
            runner = await _serve_metrics(config, config.metrics_port, metrics)
        if config.auditor:
            tasks.append(asyncio.create_task(Auditor(bk, manager, config, metrics, owner).run(stop_event)))
        for i in range(config.workers):
            worker = ReplicationWorker(bk, manager, config, metrics, f"{owner}/worker-{i}")
            tasks.append(asyncio.create_task(worker.run(stop_event)))
        tasks.append(asyncio.create_task(_refresh_gauges(manager, metrics, stop_event)))
        log.info(
            "autorecovery %s: auditor candidate %s, %d workers, lost bookie delay %gs, grace %gs, throttle %s",
            owner,
            config.auditor,
            config.workers,
            config.lost_bookie_recovery_delay_s,
            config.open_ledger_rereplication_grace_period_s,
            f"{config.throttle_bytes_per_s / 2**20:g} MiB/s" if config.throttle_bytes_per_s > 0 else "off",
        )
        await stop_event.wait()
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if runner is not None:
            await runner.cleanup()
        await bk.close()
    return metrics
