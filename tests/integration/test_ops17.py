"""An operator's signals and mistakes against real ZooKeeper, bookie and broker processes (docs/operations.md)."""

from __future__ import annotations

import signal

from ledgerstore.cluster import BrokerProcess
from tests.conftest import BookieFactory


def test_sighup_stops_a_bookie_cleanly(bookies: BookieFactory) -> None:
    """A bookie whose terminal closed stops as on SIGTERM: unregistered at once, journal closed, exit 0. It died
    on the signal before (Python's default), still registered until its session expired, with no log line."""
    from zk import BookieRegistry, MetadataStore

    bp = bookies.start()
    store = MetadataStore.connect(bookies.zk, root=bookies.root)
    try:
        assert bp.id in BookieRegistry(store).available()
        assert bp.proc is not None
        bp.proc.send_signal(signal.SIGHUP)
        assert bp.wait_exit(30) == 0, bp.log_tail(20)
        assert bp.id not in BookieRegistry(store).available(), "unregistered at once, as on SIGTERM"
        log = bp.log_tail(10)
        assert "SIGHUP" in log and "stopped" in log, log
    finally:
        store.close()


def test_sighup_stops_a_broker_cleanly(broker: BrokerProcess) -> None:
    assert broker.proc is not None
    broker.proc.send_signal(signal.SIGHUP)
    assert broker.wait_exit(30) == 0, broker.log_tail(20)
    assert "SIGHUP" in broker.log_tail(20)
