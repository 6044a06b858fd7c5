"""The broker's client-certificate authentication (auth method ``tls`` in ``topic_broker.connection``) and the
reload of its TLS files (``topic_broker.tls.TlsFiles``): no sockets; certificates made with the ``openssl`` CLI."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from tests.tls_testing import needs_openssl, self_signed
from tests.unit.test_broker_connection_auth import NOW, conn, decode, lookup
from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire
from topic_broker.tls import TlsFiles

T = pb.BaseCommand


def _connect_tls() -> bytes:
    c = pb.CommandConnect(client_version="test", protocol_version=20, auth_method_name="tls")
    return wire.encode_command(T(type=T.CONNECT, connect=c))


def test_auth_method_tls_takes_the_verified_certificates_cn() -> None:
    c = conn(required=True)
    c.tls_role = "alice"  # the server sets it from the handshake's verified certificate
    c.receive_data(_connect_tls(), NOW)
    assert c.principal == "alice" and c.refused is None and c.auth_expires_at is None
    (reply,) = decode(c.data_to_send())
    assert reply.type == T.CONNECTED


@pytest.mark.parametrize("required", [True, False])
def test_auth_method_tls_without_a_verified_certificate_is_refused(required: bool) -> None:
    c = conn(required=required)
    c.receive_data(_connect_tls(), NOW)
    assert c.principal is None and c.refused and "client certificate" in c.refused
    decode(c.data_to_send())
    c.receive_data(lookup(7), NOW)
    (answer,) = decode(c.data_to_send())
    assert answer.lookupTopicResponse.error == pb.AuthenticationError and c.closed


@needs_openssl
def test_tls_files_reload_changed_files_and_keep_the_context_when_they_do_not_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a_cert, a_key = self_signed(tmp_path, "a")
    b_cert, b_key = self_signed(tmp_path, "b")
    cert, key = tmp_path / "served.pem", tmp_path / "served.key"
    shutil.copy(a_cert, cert)
    shutil.copy(a_key, key)
    files = TlsFiles("b1", str(cert), str(key), refresh_check_s=60)
    first = files.context.current
    assert not files.check(NOW)  # unchanged
    shutil.copy(b_cert, cert)
    shutil.copy(b_key, key)
    checked = files._next_check
    assert not files.check(checked - 1)  # not before the interval: never per connection
    assert files.check(checked) and files.context.current is not first and files.reloads == 1
    renewed = files.context.current
    cert.write_text("not a certificate\n")
    with caplog.at_level(logging.WARNING, logger="topic_broker.tls"):
        assert not files.check(checked + 60)
        assert not files.check(checked + 120)  # the same broken file: said once
    assert files.context.current is renewed
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "the certificate in use is kept" in caplog.text
    shutil.copy(b_cert, cert)  # mended
    assert files.check(checked + 180) and files.reloads == 2
