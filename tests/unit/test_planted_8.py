"""Tests for the bugs planted in the audit of 2026-11-29 against f2903da that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of the SEND checks, the producer-name liveness check, topic
stats, the admin's new routes and headers, and the Spark source's encryption and password hand-over"): each fails
with its bug planted and passes without it. No broker, bookie or Spark: sockets on loopback at most."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.http_writer import _serialize_headers
from multidict import CIMultiDict

from ledgerstore.cli import CommandError
from ledgerstore.spark_cmd import _check_master
from topic_broker.admin import sanitised_headers
from zk import ledger_metadata
from zk.ledger_metadata import password_hash, remember_verified, verify_password

#: Every character below space but tab, and DEL: what aiohttp refuses to write in a header
CONTROLS = [chr(c) for c in (*range(0x09), *range(0x0A, 0x20), 0x7F)]


def test_a_header_value_holding_any_control_character_is_written_as_spaces() -> None:
    """A property value (a producer name, a key) with an ANSI colour (ESC), a NUL or DEL is examined, not
    answered 500: aiohttp refuses every control character but tab in a header, CR and LF were not the only ones."""
    value = "red:\x1b[31mx\x1b[0m " + "".join(CONTROLS) + "\tend"
    out = sanitised_headers(CIMultiDict({"X-Pulsar-PROPERTY-log": value}))
    assert out["X-Pulsar-PROPERTY-log"] == "red: [31mx [0m " + " " * len(CONTROLS) + "\tend"
    _serialize_headers("HTTP/1.1 200 OK", out)  # what aiohttp does when it answers: raised ValueError


def test_a_header_name_keeps_its_token_characters_and_percent_encodes_the_others() -> None:
    """A property key of token characters (``my_key``, ``a.b-c``, any of RFC 9110's) is its header's name as
    it is; a ``/``, space or colon is percent-encoded, so the name stays one token a client reads back."""
    token = "my_key.a-b!#$%&'*+^`|~09AZaz"
    got = sanitised_headers(
        CIMultiDict({f"X-Pulsar-PROPERTY-{token}": "v", "X-Pulsar-PROPERTY-a/b c:d": "w"})
    )
    assert list(got.keys()) == [f"X-Pulsar-PROPERTY-{token}", "X-Pulsar-PROPERTY-a%2Fb%20c%3Ad"]


@contextlib.contextmanager
def _listening(family: socket.AddressFamily = socket.AF_INET) -> Iterator[int]:
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    with socket.socket(family) as s:
        s.bind((host, 0))
        s.listen()
        yield s.getsockname()[1]


@contextlib.contextmanager
def _refusing() -> Iterator[int]:
    """A port bound and not listening: a connection to it is refused while this holds it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_a_spark_master_that_answers_passes_the_check_also_after_one_that_does_not() -> None:
    """``--master spark://down,up`` (an HA pair whose first master is down): the check passes on the second."""
    with _listening() as up, _refusing() as down:
        _check_master(f"spark://127.0.0.1:{up}")
        _check_master(f"spark://127.0.0.1:{down},127.0.0.1:{up}")
        with pytest.raises(CommandError, match="no Spark master answers"):
            _check_master(f"spark://127.0.0.1:{down}")


def test_a_spark_master_given_by_its_ipv6_address_is_reached() -> None:
    with contextlib.ExitStack() as stack:
        try:
            up = stack.enter_context(_listening(socket.AF_INET6))
        except OSError:
            pytest.skip("no IPv6 loopback here")
        _check_master(f"spark://[::1]:{up}")


def test_a_spark_master_without_a_port_is_a_usage_error_not_a_traceback() -> None:
    with pytest.raises(CommandError, match=r"expected spark://HOST:PORT"):
        _check_master("spark://127.0.0.1")


def test_a_password_remembered_from_planning_opens_that_digest_alone_and_no_other_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Spark task remembers the digest planning checked with the query's password: that password then costs no
    hash, and neither another password nor the empty one passes for it (a wrong password must never read)."""
    d = password_hash(b"right", iterations=10)
    monkeypatch.setattr(ledger_metadata, "_VERIFIED", {})
    remember_verified(d, b"right")
    real = ledger_metadata.hashlib.pbkdf2_hmac
    hashed: list[bytes] = []

    def pbkdf2(name: str, pw: bytes, *args: Any) -> bytes:
        hashed.append(pw)
        return real(name, pw, *args)

    monkeypatch.setattr(ledger_metadata.hashlib, "pbkdf2_hmac", pbkdf2)
    assert verify_password(d, b"right") and hashed == []
    for wrong in (b"", b"wrong", b"righ"):
        assert not verify_password(d, wrong), wrong
    assert hashed == [b"", b"wrong", b"righ"]
