"""Token authentication in the broker's per-connection state machine (``topic_broker.connection``), no sockets."""

from __future__ import annotations

import pytest

from bookie.auth import TokenError, TokenVerifier, create_token
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.connection import AuthenticationFailed, ConnectionConfig, ConnState, ProtocolConnection

T = pb.BaseCommand
SECRET = b"s" * 32
NOW = 1_700_000_000.0


def authenticate(method: str, data: bytes, clock: list[float] | None = None) -> tuple[str, float | None]:
    t = NOW if clock is None else clock[0]
    try:
        p = TokenVerifier(SECRET, clock=lambda: t).verify(data)
    except TokenError as e:
        raise AuthenticationFailed(str(e)) from None
    return p.subject, p.expires_at


def connect(token: str | None = None, method: str | None = "token", refresh: bool = False) -> bytes:
    c = pb.CommandConnect(client_version="test", protocol_version=20)
    if refresh:
        c.feature_flags.supports_auth_refresh = True
    if token is not None:
        c.auth_data = token.encode()
        if method is not None:
            c.auth_method_name = method
    return wire.encode_command(T(type=T.CONNECT, connect=c))


def lookup(request_id: int = 7) -> bytes:
    return wire.encode_command(
        T(
            type=T.LOOKUP,
            lookupTopic=pb.CommandLookupTopic(topic="persistent://public/default/t", request_id=request_id),
        )
    )


def producer(request_id: int = 8) -> bytes:
    return wire.encode_command(
        T(
            type=T.PRODUCER,
            producer=pb.CommandProducer(
                topic="persistent://public/default/t", producer_id=1, request_id=request_id
            ),
        )
    )


def decode(data: bytes) -> list[pb.BaseCommand]:
    return [f.command for f in wire.FrameDecoder().feed(data)]


def conn(required: bool = False, **kw: object) -> ProtocolConnection:
    return ProtocolConnection(
        ConnectionConfig(authenticate=authenticate, auth_required=required, **kw),  # type: ignore[arg-type]
        NOW,
    )


def test_a_good_token_names_the_principal() -> None:
    c = conn(required=True)
    assert c.receive_data(connect(create_token(SECRET, "alice", now=NOW)), NOW) == []
    (reply,) = decode(c.data_to_send())
    assert reply.type == T.CONNECTED
    assert c.principal == "alice" and c.refused is None
    (req,) = c.receive_data(lookup(), NOW)
    assert req.handler == "on_lookup"


def test_a_token_without_the_method_name_is_checked_too() -> None:
    c = conn(required=True)
    c.receive_data(connect(create_token(SECRET, "bob", now=NOW), method=None), NOW)
    assert c.principal == "bob"


@pytest.mark.parametrize(
    "token",
    [
        create_token(SECRET, "alice", expires_in_s=10, now=NOW - 60),  # expired
        create_token(b"x" * 32, "alice", now=NOW),  # another secret
        "not.a.token",
    ],
)
@pytest.mark.parametrize("required", [True, False])
def test_a_bad_token_is_refused_in_the_first_requests_answer(token: str, required: bool) -> None:
    c = conn(required=required)
    c.receive_data(connect(token), NOW)
    (reply,) = decode(c.data_to_send())
    assert reply.type == T.CONNECTED  # the C++ client reports nothing but a timeout for an ERROR here
    assert c.principal is None and c.refused
    assert c.receive_data(lookup(7), NOW) == []  # nothing reaches the service
    (answer,) = decode(c.data_to_send())
    assert answer.type == T.LOOKUP_RESPONSE
    assert answer.lookupTopicResponse.response == pb.CommandLookupTopicResponse.Failed
    assert answer.lookupTopicResponse.error == pb.AuthenticationError
    assert c.closed


def test_a_refused_producer_gets_error_authentication_error() -> None:
    c = conn(required=True)
    c.receive_data(connect(None), NOW)
    c.data_to_send()
    assert c.receive_data(producer(8), NOW) == []
    (answer,) = decode(c.data_to_send())
    assert answer.type == T.ERROR and answer.error.error == pb.AuthenticationError
    assert answer.error.request_id == 8
    assert "required" in answer.error.message
    assert c.closed


def test_a_refused_connection_that_asks_nothing_is_closed() -> None:
    c = conn(required=True, refused_linger_s=5.0)
    c.receive_data(connect(None), NOW)
    c.tick(NOW + 1)
    assert not c.closed
    c.tick(NOW + 6)
    assert c.closed


def test_refusing_at_connect_as_pulsar_does() -> None:
    c = conn(required=True, refuse_after_connected=False)
    c.receive_data(connect(create_token(b"x" * 32, "alice", now=NOW)), NOW)
    (answer,) = decode(c.data_to_send())
    assert answer.type == T.ERROR and answer.error.error == pb.AuthenticationError
    assert c.state is ConnState.CLOSED


def test_without_auth_required_anonymous_clients_are_served() -> None:
    c = conn(required=False)
    c.receive_data(connect(None), NOW)
    assert c.principal is None and c.refused is None
    assert len(c.receive_data(lookup(), NOW)) == 1


def test_an_unknown_method_is_refused() -> None:
    c = conn(required=False)
    c.receive_data(connect("x", method="athenz"), NOW)
    assert c.refused and "athenz" in c.refused


def test_without_an_authenticator_tokens_are_ignored() -> None:
    c = ProtocolConnection(ConnectionConfig(), NOW)
    c.receive_data(connect("whatever"), NOW)
    assert c.principal is None and c.refused is None and not c.closed


# ---------------------------------------------------------------------- expiry and refresh (AUTH_CHALLENGE)


def auth_response(token: str, method: str = "token") -> bytes:
    r = pb.CommandAuthResponse(client_version="test", response=pb.AuthData(auth_method_name=method))
    r.response.auth_data = token.encode()
    return wire.encode_command(T(type=T.AUTH_RESPONSE, authResponse=r))


def expiring(refresh: bool, clock: list[float]) -> ProtocolConnection:
    """Connected as alice with a token valid 60 s from NOW; ``clock[0]`` is the verifier's wall clock."""
    c = ProtocolConnection(
        ConnectionConfig(
            authenticate=lambda m, d: authenticate(m, d, clock),
            auth_required=True,
            auth_refresh_timeout_s=5.0,
        ),
        0.0,
    )
    c.receive_data(connect(create_token(SECRET, "alice", expires_in_s=60, now=NOW), refresh=refresh), 0.0)
    (reply,) = decode(c.data_to_send())
    assert reply.type == T.CONNECTED and c.auth_expires_at == NOW + 60
    return c


def test_an_expired_token_is_challenged_and_a_fresh_one_for_the_same_subject_keeps_the_connection() -> None:
    clock = [NOW]
    c = expiring(True, clock)
    c.tick(10.0, NOW + 59)
    assert not c.has_data_to_send  # not expired yet
    clock[0] = NOW + 61
    c.tick(11.0, NOW + 61)
    (challenge,) = decode(c.data_to_send())
    assert (
        challenge.type == T.AUTH_CHALLENGE and challenge.authChallenge.challenge.auth_method_name == "token"
    )
    c.tick(12.0, NOW + 62)
    assert not c.has_data_to_send  # one challenge, then waiting for the answer
    assert (
        c.receive_data(auth_response(create_token(SECRET, "alice", expires_in_s=60, now=NOW + 61)), 12.5)
        == []
    )
    assert not c.closed and c.auth_expires_at == NOW + 121
    c.tick(30.0, NOW + 100)
    assert not c.closed and not c.has_data_to_send
    (req,) = c.receive_data(lookup(), 31.0)
    assert req.handler == "on_lookup"


@pytest.mark.parametrize(
    ("token", "why"),
    [
        (lambda: create_token(SECRET, "mallory", expires_in_s=60, now=NOW + 61), "not 'alice'"),
        (lambda: create_token(b"x" * 32, "alice", expires_in_s=60, now=NOW + 61), "signature"),
        (lambda: create_token(SECRET, "alice", expires_in_s=60, now=NOW), "expired"),  # the same token again
    ],
)
def test_a_refresh_with_another_subject_a_bad_or_the_same_token_closes_the_connection(
    token, why: str
) -> None:
    clock = [NOW]
    c = expiring(True, clock)
    clock[0] = NOW + 61
    c.tick(1.0, NOW + 61)
    decode(c.data_to_send())
    c.receive_data(auth_response(token()), 2.0)
    (err,) = decode(c.data_to_send())
    assert err.type == T.ERROR and err.error.error == pb.AuthenticationError and why in err.error.message
    assert c.closed


def test_no_answer_to_the_challenge_in_time_closes_the_connection() -> None:
    c = expiring(True, [NOW])
    c.tick(1.0, NOW + 61)
    decode(c.data_to_send())
    c.tick(5.5, NOW + 65)
    assert not c.closed
    c.tick(6.0, NOW + 66)
    assert c.closed and "in time" in (c.close_reason or "")


def test_a_client_that_cannot_refresh_is_closed_when_its_token_expires() -> None:
    c = expiring(False, [NOW])
    c.tick(1.0, NOW + 61)
    (err,) = decode(c.data_to_send())
    assert err.type == T.ERROR and "expired" in err.error.message and c.closed


def test_a_token_without_expiry_is_never_challenged() -> None:
    c = conn(required=True)
    c.receive_data(connect(create_token(SECRET, "alice", now=NOW), refresh=True), NOW)
    decode(c.data_to_send())
    assert c.auth_expires_at is None
    c.tick(NOW + 1, NOW + 10**9)
    assert not c.closed and not c.has_data_to_send
