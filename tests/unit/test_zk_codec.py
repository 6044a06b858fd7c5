import pytest
from kazoo import exceptions as kex
from kazoo.handlers.threading import KazooTimeoutError

from zk import errors
from zk.client import MAX_BODY_BYTES, decode_body, encode_body
from zk.errors import (
    InvalidMetadataError,
    MetadataAuthError,
    MetadataClosedError,
    MetadataConnectionError,
    MetadataError,
    MetadataExistsError,
    MetadataFormatError,
    MetadataNotEmptyError,
    MetadataNotFoundError,
    MetadataSessionExpiredError,
    MetadataVersionError,
)
from zk.versioned import Versioned


def test_encode_adds_format_version_and_decodes() -> None:
    data = encode_body({"b": 1, "a": [1, 2]})
    assert data == b'{"a":[1,2],"b":1,"format_version":1}'
    assert decode_body(data) == {"a": [1, 2], "b": 1, "format_version": 1}


@pytest.mark.parametrize(
    "data",
    [
        b"",
        None,
        b"not json",
        b"[1,2]",
        b'{"a":1}',
        b'{"format_version":2}',
        b'{"format_version":true}',
        b"\xff",
    ],
)
def test_decode_rejects(data: bytes | None) -> None:
    with pytest.raises(MetadataFormatError):
        decode_body(data, "/p")


def test_encode_rejects() -> None:
    with pytest.raises(MetadataFormatError):
        encode_body({"format_version": 2})
    with pytest.raises(InvalidMetadataError):
        encode_body({"x": b"bytes are not json"})
    with pytest.raises(InvalidMetadataError):
        encode_body({"x": float("nan")})
    with pytest.raises(InvalidMetadataError):
        encode_body({"x": "y" * MAX_BODY_BYTES})
    with pytest.raises(InvalidMetadataError):
        encode_body([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exc", "cls", "code", "retriable"),
    [
        (kex.BadVersionError(), MetadataVersionError, "METADATA_VERSION", True),
        (kex.NoNodeError(), MetadataNotFoundError, "METADATA_NOT_FOUND", False),
        (kex.NodeExistsError(), MetadataExistsError, "METADATA_EXISTS", False),
        (kex.NotEmptyError(), MetadataNotEmptyError, "METADATA_NOT_EMPTY", False),
        (kex.ConnectionLoss(), MetadataConnectionError, "METADATA_CONNECTION", True),
        (kex.OperationTimeoutError(), MetadataConnectionError, "METADATA_CONNECTION", True),
        (KazooTimeoutError(), MetadataConnectionError, "METADATA_CONNECTION", True),
        (kex.SessionExpiredError(), MetadataSessionExpiredError, "METADATA_SESSION_EXPIRED", True),
        (kex.ConnectionClosedError(), MetadataClosedError, "METADATA_CLOSED", False),
        (kex.NoAuthError(), MetadataAuthError, "METADATA_AUTH", False),
        (kex.AuthFailedError(), MetadataAuthError, "METADATA_AUTH", False),
        (kex.InvalidACLError(), MetadataError, "METADATA", False),
    ],
)
def test_translate(exc: Exception, cls: type, code: str, retriable: bool) -> None:
    out = errors.translate(exc, "/x")
    assert type(out) is cls
    assert out.code == code and out.retriable is retriable and out.path == "/x"
    assert not isinstance(out, kex.KazooException)


def test_session_expired_is_a_connection_error() -> None:
    assert issubclass(MetadataSessionExpiredError, MetadataConnectionError)
    assert issubclass(InvalidMetadataError, ValueError)


def test_versioned() -> None:
    v = Versioned({"a": 1}, 3)
    assert v.exists and not Versioned(None, -1).exists
    assert v.map(lambda d: d["a"]) == Versioned(1, 3)
    with pytest.raises(AttributeError):
        v.version = 4  # type: ignore[misc]
