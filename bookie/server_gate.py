"""A listener's connection caps, in all and per peer address: pure but for the clock and the log, and light to
import (the broker's Pulsar port uses it too, without the bookie's storage)."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("ledgerstore.bookie.server")

LOG_REFUSALS_EVERY_S = (
    5.0  # refusals are logged at most this often (a stranger in a loop must not flood the log)
)


class ConnectionGate:
    """Counts a listener's connections, in all and per peer host, and refuses one more beyond either cap with a
    log line (at most one per ``LOG_REFUSALS_EVERY_S``) headed by ``name``; ``refused`` counts refusals."""

    def __init__(self, name: str, connections_max: int, per_peer_max: int) -> None:
        self.name = name
        self.connections_max = connections_max
        self.per_peer_max = per_peer_max
        self.open = 0
        self.per_peer: dict[str, int] = {}
        self.refused = 0
        self._last_log = 0.0
        self._unlogged = 0

    def admit(self, host: str) -> bool:
        why = ""
        if self.open >= self.connections_max:
            why = f"{self.open} connections open (at most {self.connections_max})"
        elif self.per_peer.get(host, 0) >= self.per_peer_max:
            why = f"{self.per_peer[host]} connections from {host} (at most {self.per_peer_max} from one address)"
        if not why:
            self.open += 1
            self.per_peer[host] = self.per_peer.get(host, 0) + 1
            return True
        self.refused += 1
        now = time.monotonic()
        if now - self._last_log >= LOG_REFUSALS_EVERY_S:
            log.warning(
                "%s: refusing connection from %s: %s (%d more refused since the last such line)",
                self.name,
                host,
                why,
                self._unlogged,
            )
            self._last_log = now
            self._unlogged = 0
        else:
            self._unlogged += 1
        return False

    def release(self, host: str) -> None:
        self.open -= 1
        left = self.per_peer.get(host, 1) - 1
        if left > 0:
            self.per_peer[host] = left
        else:
            self.per_peer.pop(host, None)
