"""Tokens: HMAC-SHA256 signed JSON Web Tokens (HS256), made and checked with the standard library only.

A token is ``base64url(header) "." base64url(payload) "." base64url(signature)`` (RFC 7519, no padding), the
header ``{"alg": "HS256", "typ": "JWT"}``, the payload ``{"sub": NAME, "exp": UNIX_SECONDS[, "iat": ...]}``,
the signature HMAC-SHA256 over ``header "." payload`` keyed by the cluster's secret. This is the token format of
Pulsar's ``AuthenticationProviderToken`` with a secret key, so a Pulsar client's ``AuthenticationToken`` carries
the same string. A token without ``exp`` never expires (as Pulsar's ``tokens create`` without ``--expiry-time``).

The secret key file holds the raw key bytes (``create_secret``: 32 random bytes), or, for files made by Pulsar's
``tokens create-secret-key --base64``, their base64 text. Pure: the callers read the files; no imports from above
``bookie``.

Callers: the bookie's AUTH step and admin HTTP (``bookie/server.py``), the client (``ledger_client``), the CLI
(``ledgerstore auth``), later the topic broker.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

SECRET_LEN = 32  # bytes of a new secret key (HS256 wants at least the hash's 32)
SECRET_LEN_MIN = 16  # shorter secrets are refused: a guessable key signs anything
TOKEN_LEN_MAX = 4096  # bytes; a longer token is refused before any parsing (bounded work per AUTH)
SUBJECT_LEN_MAX = 256
CLOCK_SKEW_S = 0  # tokens are checked against the verifier's clock as is (Pulsar does the same)
_HEADER = {"alg": "HS256", "typ": "JWT"}
_B64URL = re.compile(rb"^[A-Za-z0-9_-]*$")


class TokenError(ValueError):
    """A token that does not verify: malformed, signed by another key, expired, or with a bad subject. The
    message says which, and never contains the token or the key."""


class TokenSignatureError(TokenError):
    """A well-formed token whose signature the key does not verify: signed by another key (during a rotation,
    perhaps the previous one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """Who a verified token speaks for."""

    subject: str
    expires_at: int | None = None  # unix seconds; None: never


def _b64encode(raw: bytes) -> bytes:
    return base64.urlsafe_b64encode(raw).rstrip(b"=")


def _b64decode(part: bytes) -> bytes:
    if not _B64URL.match(part) or len(part) % 4 == 1:
        raise TokenError("token part is not base64url")
    try:
        return base64.urlsafe_b64decode(part + b"=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise TokenError("token part is not base64url") from None


def _check_secret(secret: bytes) -> None:
    if len(secret) < SECRET_LEN_MIN:
        raise ValueError(f"secret key of {len(secret)} bytes; at least {SECRET_LEN_MIN} are needed")


def create_token(
    secret: bytes, subject: str, *, expires_in_s: float | None = None, now: float | None = None
) -> str:
    """A token for ``subject`` signed with ``secret``, valid for ``expires_in_s`` seconds (None: forever)."""
    _check_secret(secret)
    _check_subject(subject)
    issued = int(time.time() if now is None else now)
    payload: dict[str, object] = {"sub": subject, "iat": issued}
    if expires_in_s is not None:
        if expires_in_s <= 0:
            raise ValueError("expiry must be positive")
        payload["exp"] = issued + int(expires_in_s)
    head = _b64encode(json.dumps(_HEADER, separators=(",", ":")).encode())
    body = _b64encode(json.dumps(payload, separators=(",", ":")).encode())
    signing_input = head + b"." + body
    sig = _b64encode(hmac.new(secret, signing_input, hashlib.sha256).digest())
    return (signing_input + b"." + sig).decode("ascii")


def _check_subject(subject: object) -> str:
    if not isinstance(subject, str) or not subject or len(subject.encode()) > SUBJECT_LEN_MAX:
        raise TokenError(f"token subject must be a non-empty string of at most {SUBJECT_LEN_MAX} bytes")
    if any(ch in subject for ch in "\n\r\0"):
        raise TokenError("token subject contains a control character")
    return subject


def verify_token(secret: bytes, token: str | bytes, *, now: float | None = None) -> Principal:
    """The principal of a token signed with ``secret`` and not expired at ``now``; ``TokenError`` otherwise.

    The signature is checked (in constant time) before the header or payload is parsed, so an unsigned or
    forged token costs one HMAC and no JSON parsing. Only ``alg: HS256`` is accepted (never ``none``)."""
    # a token is ASCII: an HTTP header's bytes that are not UTF-8 come as surrogates, which encode() refuses
    if isinstance(token, str) and not token.isascii():
        raise TokenError("token is not base64url")
    raw = token.encode() if isinstance(token, str) else bytes(token)
    if len(raw) > TOKEN_LEN_MAX:
        raise TokenError(f"token of {len(raw)} bytes (at most {TOKEN_LEN_MAX})")
    parts = raw.strip().split(b".")
    if len(parts) != 3:
        raise TokenError("token is not three dot-separated parts")
    head_b, body_b, sig_b = parts
    expected = hmac.new(secret, head_b + b"." + body_b, hashlib.sha256).digest()
    if not hmac.compare_digest(expected, _b64decode(sig_b)):
        raise TokenSignatureError("token signature does not verify (signed by another key?)")
    try:
        header = json.loads(_b64decode(head_b))
        payload = json.loads(_b64decode(body_b))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise TokenError("token header or payload is not JSON") from None
    if not isinstance(header, dict) or header.get("alg") != "HS256":
        raise TokenError("token algorithm is not HS256")
    if not isinstance(payload, dict):
        raise TokenError("token payload is not an object")
    subject = _check_subject(payload.get("sub"))
    exp = payload.get("exp")
    if exp is not None:
        if not isinstance(exp, int | float) or isinstance(exp, bool):
            raise TokenError("token exp is not a number")
        t = time.time() if now is None else now
        if t >= exp + CLOCK_SKEW_S:
            raise TokenError(f"token of {subject!r} expired {int(t - exp)}s ago")
        return Principal(subject=subject, expires_at=int(exp))
    return Principal(subject=subject)


class TokenVerifier:
    """``verify(token)`` with one secret and a clock (``time.time`` unless told): what the bookie holds. During a
    rotation, ``previous`` secrets (``--auth-previous-secret-file``) verify a token the secret does not sign, so
    tokens of the old and the new secret both work until every client holds a new one."""

    def __init__(
        self, secret: bytes, clock: Callable[[], float] = time.time, previous: Sequence[bytes] = ()
    ) -> None:
        for key in (secret, *previous):
            _check_secret(key)
        self._secret = secret
        self._previous = tuple(previous)
        self._clock = clock

    def verify(self, token: str | bytes) -> Principal:
        now = self._clock()
        try:
            return verify_token(self._secret, token, now=now)
        except TokenSignatureError:
            for key in self._previous:
                # signed by this one, but expired or malformed (another TokenError): that is the answer
                with contextlib.suppress(TokenSignatureError):
                    return verify_token(key, token, now=now)
            raise


_DURATION = re.compile(r"^(\d+)([smhdwy]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def parse_duration_s(text: str) -> int:
    """``30d``, ``12h``, ``90m``, ``3600`` (seconds), ``1y`` -> seconds (Pulsar's ``--expiry-time`` units)."""
    m = _DURATION.match(text.strip())
    if not m or int(m.group(1)) <= 0:
        raise ValueError(f"bad duration {text!r}: a positive number with an optional unit s, m, h, d, w or y")
    return int(m.group(1)) * _UNIT_S[m.group(2)]


def decode_secret(raw: bytes) -> bytes:
    """A secret key file's contents -> the key: raw bytes as written by ``create_secret``, or base64 text
    (Pulsar's ``create-secret-key --base64``, or a ``data:;base64,`` URL) when the file is printable."""
    text = raw.strip()
    if text.startswith(b"data:;base64,"):
        text = text[len(b"data:;base64,") :]
    elif len(raw) == SECRET_LEN and not raw.isascii():
        return raw
    if text and all(32 < c < 127 for c in text):
        try:
            key = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) >= SECRET_LEN_MIN:
            return key
    _check_secret(raw)
    return raw


def new_secret() -> bytes:
    return os.urandom(SECRET_LEN)
