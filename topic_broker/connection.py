"""One client connection's protocol state: a pure core (no sockets, clocks or asyncio).

The server drives it like this (h11 style)::

    conn = ProtocolConnection(config)
    on bytes:   requests = conn.receive_data(data, now)   # CONNECT, PING and PONG are answered inside
                for r in requests: getattr(service, handler_name(r.type))(session, r)   # see HANDLERS
    replies:    conn.send(cmd) / conn.send_raw(frame_bytes)
    on a tick:  conn.tick(now)                             # keep-alive: PING when idle, close when silent
    after each: write conn.data_to_send(); if conn.closed: close the socket (reason in conn.close_reason)

States: AWAITING_CONNECT --CONNECT--> CONNECTED --error/close--> CLOSED.

- The first command must be CONNECT; anything else gets ERROR and the connection closes. A second CONNECT
  closes it too. CONNECTED carries server_version (the client requires it), the negotiated protocol version
  min(ours, the client's) and our max message size.
- Our protocol version is 17: keep-alive (1), checksums (6), GET_LAST_MESSAGE_ID and ACTIVE_CONSUMER_CHANGE
  (12), Key_Shared (14), ack receipts (17). Clients older than 12 are refused (their readers cannot work).
- A frame that cannot be decoded (too large, bad sizes, bad protobuf, a SEND without its payload) closes the
  connection: there is no way to resynchronise a byte stream. Nothing else is affected.
- Commands we do not serve (transactions, topic-list watchers, ...) are answered with ERROR NotAllowed when
  they carry a request id; the connection stays open.
- Authentication (Pulsar's ``AuthenticationProviderToken``): with an ``authenticate`` callback configured, a
  CONNECT with ``auth_method_name="token"`` (or ``auth_method=AuthMethodNone`` and ``auth_data``) has its token
  checked by it; the subject becomes :attr:`ProtocolConnection.principal`. A token that does not verify is
  refused whether or not authentication is required; with ``auth_required`` so is a CONNECT without a token.
  No callback: tokens are ignored.
- Client certificates (Pulsar's ``AuthenticationProviderTls``): a CONNECT with ``auth_method_name="tls"`` takes
  :attr:`ProtocolConnection.tls_role`, the CN of the certificate the TLS port verified, as its principal (never
  expiring); without one (plaintext, no certificate) it is refused as a bad token is.
- How a refusal is answered: Pulsar's broker sends ERROR AuthenticationError to the CONNECT and closes, but the
  C++-based clients (``pulsar-client`` for Python among them) drop any answer to CONNECT but CONNECTED and retry
  until their operation timeout, so the user sees a timeout. ``refuse_after_connected`` (on by default) answers
  CONNECTED instead and then the connection's first request with AuthenticationError in that request's own
  answer (the lookup's, the partition metadata's, or ERROR), and closes: the client reports
  ``AuthenticationError`` at once. Nothing is served on such a connection; one that asks nothing is closed
  after ``refused_linger_s``. Off: ERROR AuthenticationError to the CONNECT, as Pulsar does.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from . import pulsar_api_pb2 as pb
from . import wire

__all__ = [
    "DEFAULT_KEEPALIVE_INTERVAL_S",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "HANDLERS",
    "MIN_CLIENT_PROTOCOL_VERSION",
    "PROTOCOL_VERSION",
    "ConnState",
    "ConnectionConfig",
    "AuthenticationFailed",
    "ProtocolConnection",
    "Request",
]

T = pb.BaseCommand

PROTOCOL_VERSION = 17
MIN_CLIENT_PROTOCOL_VERSION = 12
DEFAULT_MAX_MESSAGE_SIZE = wire.DEFAULT_MAX_MESSAGE_SIZE  # what fits one ledger entry (wire.py)
DEFAULT_KEEPALIVE_INTERVAL_S = 30.0
SERVER_VERSION = "ledgerstore-broker"
#: The authentication methods served: Pulsar's ``AuthenticationToken`` sends the first name, ``AuthenticationTls``
#: (a client certificate the TLS port verified; its CN is the role) the second.
AUTH_METHOD_TOKEN = "token"
AUTH_METHOD_TLS = "tls"


class AuthenticationFailed(Exception):
    """Raised by an ``authenticate`` callback: the message goes to the client (never the token)."""


#: ``authenticate(method_name, auth_data) -> (subject, expires_at)``, ``expires_at`` in Unix seconds (None: the
#: credentials never expire); raises :class:`AuthenticationFailed`.
Authenticator = Callable[[str, bytes], tuple[str, float | None]]

#: Client command type -> (BaseCommand field, service handler method).
HANDLERS: dict[int, tuple[str, str]] = {
    T.PARTITIONED_METADATA: ("partitionMetadata", "on_partitioned_metadata"),
    T.LOOKUP: ("lookupTopic", "on_lookup"),
    T.PRODUCER: ("producer", "on_producer"),
    T.SEND: ("send", "on_send"),
    T.CLOSE_PRODUCER: ("close_producer", "on_close_producer"),
    T.SUBSCRIBE: ("subscribe", "on_subscribe"),
    T.FLOW: ("flow", "on_flow"),
    T.ACK: ("ack", "on_ack"),
    T.REDELIVER_UNACKNOWLEDGED_MESSAGES: ("redeliverUnacknowledgedMessages", "on_redeliver"),
    T.UNSUBSCRIBE: ("unsubscribe", "on_unsubscribe"),
    T.CLOSE_CONSUMER: ("close_consumer", "on_close_consumer"),
    T.SEEK: ("seek", "on_seek"),
    T.GET_LAST_MESSAGE_ID: ("getLastMessageId", "on_get_last_message_id"),
    T.GET_TOPICS_OF_NAMESPACE: ("getTopicsOfNamespace", "on_get_topics_of_namespace"),
    T.GET_SCHEMA: ("getSchema", "on_get_schema"),
    T.CONSUMER_STATS: ("consumerStats", "on_consumer_stats"),
}


class ConnState(enum.Enum):
    AWAITING_CONNECT = "awaiting-connect"
    CONNECTED = "connected"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class ConnectionConfig:
    server_version: str = SERVER_VERSION
    protocol_version: int = PROTOCOL_VERSION
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    keepalive_interval_s: float = DEFAULT_KEEPALIVE_INTERVAL_S
    authenticate: Authenticator | None = None
    auth_required: bool = False
    refuse_after_connected: bool = True
    refused_linger_s: float = 10.0
    #: how long a client has to answer AUTH_CHALLENGE once its token expired (Pulsar's
    #: ``authenticationRefreshCheckSeconds`` is how often the broker looks: here, every tick)
    auth_refresh_timeout_s: float = 30.0


@dataclass(slots=True)
class Request:
    """A client command for the service: ``body`` is the sub-command, ``frame`` the decoded frame (for SEND,
    its headers-and-payload are in it)."""

    type: int
    body: object
    frame: wire.Frame
    handler: str


class ProtocolConnection:
    def __init__(self, config: ConnectionConfig = ConnectionConfig(), now: float = 0.0) -> None:
        self.config = config
        self.state = ConnState.AWAITING_CONNECT
        self.protocol_version = 0
        self.client_version = ""
        self.principal: str | None = None  # the token's subject, once CONNECT carried a good one
        self.refused: str | None = None  # authentication failed: the first request is answered with this
        self.auth_expires_at: float | None = None  # Unix seconds when the principal's token expires
        #: the CN of the client certificate the TLS port verified (set by the server before any data): the role
        #: a CONNECT with auth method ``tls`` gets; None on plaintext or without a verified certificate
        self.tls_role: str | None = None
        self._supports_auth_refresh = False  # the client answers AUTH_CHALLENGE (its CONNECT's feature flags)
        self._challenge_sent_at: float | None = None
        self._connected_at = now
        self.close_reason: str | None = None
        self._decoder = wire.FrameDecoder(max_frame_size=config.max_message_size + wire.FRAME_PADDING_SIZE)
        self._out: list[bytes] = []
        self._last_received = now
        self._ping_sent_at: float | None = None
        #: whole frames received so far (a sign of life since a given moment: more of them than then)
        self.frames_received = 0

    @property
    def closed(self) -> bool:
        return self.state == ConnState.CLOSED

    @property
    def last_received(self) -> float:
        """When the last whole frame came (monotonic seconds): a sign of life of the peer."""
        return self._last_received

    # -- input ----------------------------------------------------------------------------------------------

    def receive_data(self, data: bytes, now: float) -> list[Request]:
        if self.closed:
            return []
        try:
            frames = self._decoder.feed(data)
        except wire.FrameError as e:
            self.close(f"bad frame: {e}")
            return []
        # only whole frames are signs of life: a trickled partial one must not hold the keep-alive off
        if frames:
            self._last_received = now
            self._ping_sent_at = None
            self.frames_received += len(frames)
        out: list[Request] = []
        for frame in frames:
            req = self._on_frame(frame)
            if self.closed:
                break
            if req is not None:
                out.append(req)
        return out

    def _on_frame(self, frame: wire.Frame) -> Request | None:
        cmd = frame.command
        t = cmd.type
        if self.state == ConnState.AWAITING_CONNECT:
            if t != T.CONNECT or not cmd.HasField("connect"):
                self._error(_request_id(cmd), pb.ServiceNotReady, "the first command must be CONNECT")
                self.close(f"{_type_name(t)} before CONNECT")
                return None
            self._on_connect(cmd.connect)
            return None
        if self.refused is not None:
            self._refuse_request(cmd)
            return None
        if t == T.PING:
            self.send_raw(wire.pong())
            return None
        if t == T.PONG:
            return None
        if t == T.CONNECT:
            self.close("a second CONNECT")
            return None
        if t == T.AUTH_RESPONSE and cmd.HasField("authResponse"):
            self._on_auth_response(cmd.authResponse)
            return None
        route = HANDLERS.get(t)
        if route is None:
            rid = _request_id(cmd)
            if rid is not None:
                self._error(rid, pb.NotAllowedError, f"{_type_name(t)} is not supported by this broker")
            return None
        field, handler = route
        if not cmd.HasField(field):
            self.close(f"{_type_name(t)} without its body")
            return None
        return Request(t, getattr(cmd, field), frame, handler)

    def _on_connect(self, c: pb.CommandConnect) -> None:
        version = c.protocol_version
        if version < MIN_CLIENT_PROTOCOL_VERSION:
            self._error(
                0,
                pb.UnsupportedVersionError,
                f"protocol version {version} < {MIN_CLIENT_PROTOCOL_VERSION} is not supported",
            )
            self.close(f"client protocol version {version}")
            return
        flags = c.feature_flags if c.HasField("feature_flags") else None
        self._supports_auth_refresh = bool(flags is not None and flags.supports_auth_refresh)
        if not self._authenticate(c):
            return
        self.protocol_version = min(version, self.config.protocol_version)
        self.client_version = c.client_version
        self.state = ConnState.CONNECTED
        self._connected_at = self._last_received
        self.send_raw(
            wire.connected(self.config.server_version, self.protocol_version, self.config.max_message_size)
        )

    def _authenticate(self, c: pb.CommandConnect) -> bool:
        authenticate = self.config.authenticate
        if authenticate is None:
            return True
        method = c.auth_method_name if c.HasField("auth_method_name") else ""
        data = c.auth_data if c.HasField("auth_data") else b""
        if not method and not data:
            if not self.config.auth_required:
                return True
            return self._refuse("authentication is required: connect with a token")
        if method == AUTH_METHOD_TLS:
            if self.tls_role is None:
                return self._refuse(
                    "authentication failed: auth method tls needs a client certificate verified by the broker's "
                    "TLS port (its --tls-trust-certs), and this connection has none"
                )
            self.principal, self.auth_expires_at = self.tls_role, None
            return True
        if method not in ("", AUTH_METHOD_TOKEN):
            return self._refuse(f"authentication method {method!r} is not supported (token and tls are)")
        try:
            self.principal, self.auth_expires_at = authenticate(AUTH_METHOD_TOKEN, data)
        except AuthenticationFailed as e:
            return self._refuse(f"authentication failed: {e}")
        return True

    def _on_auth_response(self, r: pb.CommandAuthResponse) -> None:
        """Fresh credentials after AUTH_CHALLENGE: they must verify and name the same subject, or the connection
        closes (Pulsar's broker does the same)."""
        authenticate = self.config.authenticate
        if authenticate is None or self.principal is None:
            return  # nothing was authenticated on this connection: nothing to refresh
        auth = r.response if r.HasField("response") else pb.AuthData()
        if auth.auth_method_name not in ("", AUTH_METHOD_TOKEN):
            return self._auth_refresh_failed(
                f"authentication method {auth.auth_method_name!r} is not supported"
            )
        try:
            subject, expires_at = authenticate(AUTH_METHOD_TOKEN, auth.auth_data)
        except AuthenticationFailed as e:
            return self._auth_refresh_failed(f"authentication refresh failed: {e}")
        if subject != self.principal:
            return self._auth_refresh_failed(
                f"authentication refresh failed: the new token is for {subject!r}, not {self.principal!r}"
            )
        self.auth_expires_at = expires_at
        self._challenge_sent_at = None

    def _auth_refresh_failed(self, message: str) -> None:
        self._error(None, pb.AuthenticationError, message)
        self.close(message)

    def _refuse(self, message: str) -> bool:
        if self.config.refuse_after_connected:
            self.refused = message
            return True  # CONNECTED now, the refusal in the answer to the first request
        self._error(None, pb.AuthenticationError, message)
        self.close(message)
        return False

    def _refuse_request(self, cmd: pb.BaseCommand) -> None:
        message = self.refused or "authentication failed"
        rid = _request_id(cmd)
        if cmd.type == T.PARTITIONED_METADATA and rid is not None:
            self.send_raw(
                wire.partitioned_metadata_response(rid, error_code=pb.AuthenticationError, message=message)
            )
        elif cmd.type == T.LOOKUP and rid is not None:
            self.send_raw(wire.lookup_response(rid, error_code=pb.AuthenticationError, message=message))
        else:
            self._error(rid, pb.AuthenticationError, message)
        self.close(message)

    # -- output ---------------------------------------------------------------------------------------------

    def send(self, cmd: pb.BaseCommand) -> None:
        if not self.closed:
            self._out.append(wire.encode_command(cmd))

    def send_raw(self, data: bytes) -> None:
        """An already encoded frame (MESSAGE frames are built by the dispatcher)."""
        if not self.closed:
            self._out.append(data)

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        return b"".join(self.take_frames())

    def take_frames(self) -> list[bytes]:
        """What to send, as the buffers queued (for ``transport.writelines``: nothing is copied to join them)."""
        out, self._out = self._out, []
        return out

    @property
    def buffered(self) -> int:
        """Bytes received that are not yet part of a whole frame (a partial frame)."""
        return self._decoder.buffered

    @property
    def has_data_to_send(self) -> bool:
        return bool(self._out)

    def close(self, reason: str) -> None:
        """No more input is processed; what is queued may still be written, then the socket closes."""
        if not self.closed:
            self.state = ConnState.CLOSED
            self.close_reason = reason

    def _error(self, request_id: int | None, code: int, message: str) -> None:
        self.send_raw(wire.error(request_id or 0, code, message))  # type: ignore[arg-type]

    # -- keep-alive -----------------------------------------------------------------------------------------

    def tick(self, now: float, wall: float | None = None, *, read: bool = True) -> None:
        """Keep-alive at monotonic time ``now``; with ``wall`` (Unix seconds), also the expiry of the token the
        connection authenticated with: AUTH_CHALLENGE when it expired (a client that cannot answer one is
        closed), and a close when the answer does not come within ``auth_refresh_timeout_s``. ``read`` False:
        the server does not read the connection for now, so no answer to a PING can be seen, and none missing
        closes it (as Pulsar's keep-alive with auto-read off); it is pinged again."""
        if self.closed:
            return
        if self.state == ConnState.AWAITING_CONNECT:
            # as Pulsar's broker: a handshake not completed within the keep-alive interval closes the connection
            if now - self._connected_at >= self.config.keepalive_interval_s:
                self.close(f"no CONNECT within {self.config.keepalive_interval_s:g}s")
            return
        if self.refused is not None:
            if now - self._connected_at >= self.config.refused_linger_s:
                self.close(self.refused)
            return
        if wall is not None and self.auth_expires_at is not None:
            self._check_auth_expiry(now, wall)
            if self.closed:
                return
        interval = self.config.keepalive_interval_s
        if self._ping_sent_at is not None:
            if now - self._ping_sent_at >= interval:
                if read:
                    self.close("keep-alive timeout: no answer to PING")
                else:
                    self._ping_sent_at = None  # pinged again at the next tick
        elif now - self._last_received >= interval:
            self._ping_sent_at = now
            self.send_raw(wire.ping())

    def _check_auth_expiry(self, now: float, wall: float) -> None:
        if self._challenge_sent_at is not None:
            if now - self._challenge_sent_at >= self.config.auth_refresh_timeout_s:
                self._auth_refresh_failed("the token expired and no fresh one came in time")
        elif self.auth_expires_at is not None and wall >= self.auth_expires_at:
            if not self._supports_auth_refresh:
                self._auth_refresh_failed("the token expired (the client cannot refresh it: reconnect)")
                return
            self._challenge_sent_at = now
            self.send_raw(
                wire.auth_challenge(self.config.server_version, self.protocol_version, AUTH_METHOD_TOKEN)
            )


def _request_id(cmd: pb.BaseCommand) -> int | None:
    """The request id of whatever sub-command is set, if it has one."""
    for desc, value in cmd.ListFields():
        if desc.name != "type" and hasattr(value, "request_id"):
            return int(value.request_id)
    return None


def _type_name(t: int) -> str:
    return wire.command_name(t)
