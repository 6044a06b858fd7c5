"""HS256 tokens (bookie/auth.py) and the admin HTTP rule (bookie/server.py AdminAuth), without sockets."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest

from bookie import auth
from bookie.server import AdminAuth

SECRET = bytes(range(32))
OTHER = bytes(range(1, 33))


def _b64(raw: bytes) -> bytes:
    return base64.urlsafe_b64encode(raw).rstrip(b"=")


def test_a_token_verifies_with_its_secret_and_names_its_subject() -> None:
    token = auth.create_token(SECRET, "writer-1", expires_in_s=60, now=1000)
    principal = auth.verify_token(SECRET, token, now=1059)
    assert principal == auth.Principal(subject="writer-1", expires_at=1060)
    header, payload, _ = token.split(".")
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {"alg": "HS256", "typ": "JWT"}
    assert json.loads(base64.urlsafe_b64decode(payload + "==")) == {
        "sub": "writer-1",
        "iat": 1000,
        "exp": 1060,
    }


def test_the_token_is_a_standard_hs256_jwt() -> None:
    """What a Pulsar client's AuthenticationToken carries: signature = HMAC-SHA256(secret, header.payload)."""
    token = auth.create_token(SECRET, "app").encode()
    signing_input, _, sig = token.rpartition(b".")
    assert _b64(hmac.new(SECRET, signing_input, hashlib.sha256).digest()) == sig


def test_expired_token_is_refused() -> None:
    token = auth.create_token(SECRET, "w", expires_in_s=60, now=1000)
    with pytest.raises(auth.TokenError, match="expired"):
        auth.verify_token(SECRET, token, now=1060)


def test_token_signed_by_another_key_is_refused() -> None:
    token = auth.create_token(OTHER, "w")
    with pytest.raises(auth.TokenError, match="signature"):
        auth.verify_token(SECRET, token)


def test_a_changed_payload_or_alg_none_is_refused() -> None:
    token = auth.create_token(SECRET, "reader", expires_in_s=60)
    head, _, sig = token.split(".")
    forged = _b64(json.dumps({"sub": "admin"}).encode()).decode()
    with pytest.raises(auth.TokenError):
        auth.verify_token(SECRET, f"{head}.{forged}.{sig}")
    none_head = _b64(b'{"alg":"none","typ":"JWT"}').decode()
    with pytest.raises(auth.TokenError):
        auth.verify_token(SECRET, f"{none_head}.{forged}.")
    # signed correctly, but not HS256: refused too
    alg_head = _b64(b'{"alg":"HS512"}')
    body = _b64(b'{"sub":"x"}')
    sig2 = _b64(hmac.new(SECRET, alg_head + b"." + body, hashlib.sha256).digest())
    with pytest.raises(auth.TokenError, match="HS256"):
        auth.verify_token(SECRET, alg_head + b"." + body + b"." + sig2)


@pytest.mark.parametrize("token", ["", "a.b", "a.b.c.d", "!!.??.**", "x" * (auth.TOKEN_LEN_MAX + 1)])
def test_malformed_tokens_are_refused_with_token_error(token: str) -> None:
    with pytest.raises(auth.TokenError):
        auth.verify_token(SECRET, token)


def test_short_secrets_are_refused() -> None:
    with pytest.raises(ValueError):
        auth.create_token(b"short", "w")
    with pytest.raises(ValueError):
        auth.TokenVerifier(b"short")


def test_durations() -> None:
    assert auth.parse_duration_s("30d") == 30 * 86400
    assert auth.parse_duration_s("90m") == 5400
    assert auth.parse_duration_s("3600") == 3600
    for bad in ("", "0d", "-1h", "3x", "1.5h"):
        with pytest.raises(ValueError):
            auth.parse_duration_s(bad)


def test_secret_files_raw_or_base64() -> None:
    raw = auth.new_secret()
    assert len(raw) == auth.SECRET_LEN
    assert auth.decode_secret(base64.b64encode(raw) + b"\n") == raw
    assert auth.decode_secret(b"data:;base64," + base64.b64encode(raw)) == raw
    printable = b"not-base64!" * 3  # printable, not base64: the bytes themselves
    assert auth.decode_secret(printable) == printable
    with pytest.raises(ValueError):
        auth.decode_secret(b"tiny")


def test_admin_http_needs_a_token_for_changes_and_as_configured_for_reads() -> None:
    verifier = auth.TokenVerifier(SECRET)
    good = "Bearer " + auth.create_token(SECRET, "ops")
    bad = "Bearer " + auth.create_token(OTHER, "ops")
    default = AdminAuth(verifier=verifier)
    assert default.check("PUT", "/api/v1/gc", None)
    assert default.check("PUT", "/api/v1/gc", bad)
    assert default.check("PUT", "/api/v1/gc", good) == ""
    assert default.check("GET", "/api/v1/ledgers", None) == ""
    assert default.check("GET", "/health", None) == ""
    api = AdminAuth(verifier=verifier, read="api")
    assert api.check("GET", "/api/v1/ledgers", None) and api.check("GET", "/metrics", None) == ""
    everything = AdminAuth(verifier=verifier, read="all")
    assert everything.check("GET", "/metrics", None) and everything.check("GET", "/metrics", good) == ""
    assert AdminAuth().check("PUT", "/api/v1/gc", None) == ""  # no secret: admin HTTP open, as before
