"""Certificates for TLS tests, made with the ``openssl`` CLI (tests using them skip where it is missing)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

needs_openssl = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="needs openssl to make a certificate"
)


def self_signed(tmp: Path, name: str = "bookie") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (``<name>.pem``) and its key (``<name>.key``, mode 600) in ``tmp``:
    the certificate is its own CA for the client's trust file."""
    cert, key = tmp / f"{name}.pem", tmp / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    os.chmod(key, 0o600)
    return cert, key
