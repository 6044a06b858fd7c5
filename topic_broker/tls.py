"""The broker's TLS port: its context (certificate, key, trusted client CA) and the reload of renewed files.

- Client certificates (Pulsar's ``tlsTrustCertsFilePath``, ``tlsRequireTrustedClientCertOnConnect``): with a
  trusted client CA the port asks each client for a certificate and verifies it against that CA; a certificate
  that does not verify fails the handshake. Without ``require`` a client may bring none (it authenticates with a
  token then); with it, the handshake fails. :func:`client_role` is the verified certificate's CN, the role of
  Pulsar's ``AuthenticationProviderTls`` (CONNECT with auth method ``tls``).
- Reload (Pulsar's ``tlsCertRefreshCheckDurationSec``): :meth:`TlsFiles.check`, called on the broker's
  housekeeping, reads the files again at most every ``refresh_check_s`` and, when they changed, builds a new
  context for the connections accepted from then on; connections already served keep theirs. Files that do not
  load (a certificate written before its key, a broken file) are logged once and the context in force is kept.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import time
from typing import Any

from bookie.server import server_tls_context

log = logging.getLogger(__name__)

__all__ = ["SwappableContext", "TlsFiles", "broker_tls_context", "client_role"]

#: Pulsar's tlsCertRefreshCheckDurationSec default
DEFAULT_REFRESH_CHECK_S = 300.0


def broker_tls_context(
    cert_file: str, key_file: str, trust_file: str | None = None, require_client_cert: bool = False
) -> ssl.SSLContext:
    """The TLS port's context: the bookie's (TLS 1.2 at least) and, with ``trust_file``, client certificates
    asked for (required with ``require_client_cert``) and verified against it. Raises OSError or SSLError where
    a file does not load."""
    ctx = server_tls_context(cert_file, key_file)
    if trust_file:
        ctx.load_verify_locations(cafile=trust_file)
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return ctx


class SwappableContext(ssl.SSLContext):
    """The context the server is created with: each new connection is wrapped by the context in force
    (``current``; asyncio's and uvloop's SSL protocols call ``wrap_bio`` once per connection), so a reloaded
    certificate serves the next connection without a new listening socket."""

    current: ssl.SSLContext

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:  # type: ignore[override]
        return self.current.wrap_bio(*args, **kwargs)


def client_role(transport: Any) -> str | None:
    """The CN of the client certificate the TLS handshake verified (None: plaintext, no certificate, no CN)."""
    cert = transport.get_extra_info("peercert")
    if not cert:  # None on plaintext; {} where the client sent no certificate
        return None
    for rdn in cert.get("subject", ()):
        for name, value in rdn:
            if name == "commonName" and value:
                return str(value)
    return None


class TlsFiles:
    """The TLS port's files, their context and its reload."""

    def __init__(
        self,
        broker_id: str,
        cert_file: str,
        key_file: str,
        trust_file: str | None = None,
        require_client_cert: bool = False,
        refresh_check_s: float = DEFAULT_REFRESH_CHECK_S,
    ) -> None:
        self.broker_id = broker_id
        self.files = (cert_file, key_file, trust_file)
        self.require_client_cert = require_client_cert
        self.refresh_check_s = refresh_check_s
        self.reloads = 0
        self.context = SwappableContext(ssl.PROTOCOL_TLS_SERVER)
        self._seen = self._digest()
        self.context.current = self._build()
        self._next_check = time.monotonic() + refresh_check_s

    def _build(self) -> ssl.SSLContext:
        cert, key, trust = self.files
        return broker_tls_context(cert, key, trust, self.require_client_cert)

    def _digest(self) -> tuple[str | None, ...]:
        """Each file's SHA-256 (None: unreadable): what tells a renewed file, whatever its mtime."""
        out: list[str | None] = []
        for path in self.files:
            if path is None:
                continue
            try:
                with open(path, "rb") as f:
                    out.append(hashlib.sha256(f.read()).hexdigest())
            except OSError:
                out.append(None)
        return tuple(out)

    def check(self, now: float) -> bool:
        """On the broker's housekeeping: every ``refresh_check_s`` at most, the files read again; changed ones
        loaded into a new context for new connections. True when the context was replaced."""
        if now < self._next_check:
            return False
        self._next_check = now + self.refresh_check_s
        digest = self._digest()
        if digest == self._seen:
            return False
        self._seen = digest  # a broken file is said once, not at every check
        cert, key, trust = self.files
        try:
            new = self._build()
        except (OSError, ssl.SSLError) as e:
            log.warning(
                "broker=%s TLS files changed but do not load (%s / %s%s): %s; the certificate in use is kept",
                self.broker_id,
                cert,
                key,
                f" / trusted client CA {trust}" if trust else "",
                e,
            )
            return False
        self.context.current = new
        self.reloads += 1
        log.info(
            "broker=%s TLS certificate reloaded from %s%s: new connections get it",
            self.broker_id,
            cert,
            f" (trusted client CA {trust})" if trust else "",
        )
        return True
