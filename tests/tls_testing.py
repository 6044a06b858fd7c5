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


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def signed_by(ca: tuple[Path, Path], tmp: Path, name: str, cn: str) -> tuple[Path, Path]:
    """A certificate for ``cn`` (also valid for 127.0.0.1) signed by ``ca`` (a :func:`self_signed` pair), as
    ``<name>.pem`` and ``<name>.key`` in ``tmp``: a client certificate whose CN is its role, or a server's."""
    cert, key, csr, ext = tmp / f"{name}.pem", tmp / f"{name}.key", tmp / f"{name}.csr", tmp / f"{name}.ext"
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}", "-keyout", str(key),
             "-out", str(csr))  # fmt: skip
    ext.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-days", "2", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    os.chmod(key, 0o600)
    return cert, key
