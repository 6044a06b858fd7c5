"""Ledger password digests: version 2 is salted PBKDF2; version-1 (unsalted SHA-256) ledgers still check out."""

from __future__ import annotations

import hashlib

import pytest

from zk.errors import InvalidMetadataError
from zk.ledger_metadata import (
    PASSWORD_ITERATIONS_MAX,
    Ensemble,
    LedgerMetadata,
    password_digest_of,
    password_digest_version,
    password_hash,
    verify_password,
)


def _meta(digest: str) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=1,
        ensemble_size=1,
        write_quorum=1,
        ack_quorum=1,
        ensembles=(Ensemble(0, ("b:1",)),),
        password_digest=digest,
    )


def test_version_2_is_salted_slow_and_checks_only_the_right_password() -> None:
    a, b = password_hash(b"secret", iterations=1000), password_hash(b"secret", iterations=1000)
    assert a != b  # a fresh salt each time: equal passwords do not give equal digests
    assert a.startswith("v2$pbkdf2-sha256$1000$") and password_digest_version(a) == 2
    assert verify_password(a, b"secret") and verify_password(b, b"secret")
    assert not verify_password(a, b"wrong") and not verify_password(a, b"")
    salt = bytes(range(16))
    want = hashlib.pbkdf2_hmac("sha256", b"pw", salt, 1000).hex()
    assert password_hash(b"pw", iterations=1000, salt=salt) == f"v2$pbkdf2-sha256$1000${salt.hex()}${want}"


def test_version_1_digests_of_old_ledgers_still_check() -> None:
    old = password_digest_of(b"secret")
    assert password_digest_version(old) == 1
    m = _meta(old)
    assert m.check_password(b"secret") and not m.check_password(b"nope")
    assert LedgerMetadata.from_json(m.to_json()) == m


def test_metadata_round_trips_a_version_2_digest_and_refuses_malformed_ones() -> None:
    m = _meta(password_hash(b"x", iterations=10))
    assert LedgerMetadata.from_json(m.to_json()) == m and m.check_password(b"x")
    good = password_hash(b"x", iterations=10)
    for bad in (
        "abc",
        good.upper(),
        good.replace("v2$", "v3$"),
        good[:-1],
        f"v2$pbkdf2-sha256${PASSWORD_ITERATIONS_MAX + 1}${'0' * 32}${'0' * 64}",  # a stored CPU bomb
        f"v2$pbkdf2-sha256$0${'0' * 32}${'0' * 64}",
    ):
        assert password_digest_version(bad) == 0
        assert not verify_password(bad, b"x")
        with pytest.raises(InvalidMetadataError):
            _meta(bad)


def test_a_mismatch_is_never_remembered() -> None:
    d = password_hash(b"right", iterations=10)
    for _ in range(3):
        assert not verify_password(d, b"wrong")
    assert verify_password(d, b"right") and verify_password(d, b"right")
    assert not verify_password(d, b"wrong")
