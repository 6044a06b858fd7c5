"""Tests for the bugs planted in the audit of 2026-11-29 against 5e17900 that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of the topic-level policies, topic grants, TLS client
certificates, orphaned chunks and the Spark stream's guarded commit"): each fails with its bug planted and passes
without it. No broker, bookie or Spark."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from tests.tls_testing import needs_openssl, self_signed
from topic_broker.service import _Creation, _Creations
from topic_broker.tls import TlsFiles


@needs_openssl
def test_a_renewed_trusted_client_ca_is_reloaded_as_a_renewed_certificate_is(tmp_path: Path) -> None:
    """The trusted client CA (``--tls-trust-certs``) is one of the files the reload reads again: a CA file
    replaced (the certificate and key unchanged) builds a new context at the next check."""
    cert, key = self_signed(tmp_path, "served")
    ca_a, _ = self_signed(tmp_path, "ca-a")
    ca_b, _ = self_signed(tmp_path, "ca-b")
    trust = tmp_path / "trust.pem"
    shutil.copy(ca_a, trust)
    files = TlsFiles("b1", str(cert), str(key), str(trust), refresh_check_s=60)
    first = files.context.current
    checked = files._next_check
    assert not files.check(checked)  # unchanged
    shutil.copy(ca_b, trust)
    assert files.check(checked + 60) and files.context.current is not first and files.reloads == 1


def test_a_creation_closed_and_ending_late_leaves_the_next_creation_of_its_id_pending() -> None:
    """A PRODUCER's creation closed (CLOSE_PRODUCER) frees its id for a new PRODUCER; the first creation ending
    after that (its topic opened late) leaves the second one's entry, so that a third PRODUCER of the id while
    the second is pending is still refused (``busy``)."""
    creations = _Creations()

    async def main() -> None:
        first_done, second_done = asyncio.Event(), asyncio.Event()

        async def wait_for(event: asyncio.Event, _c: _Creation) -> None:
            await event.wait()

        first = asyncio.ensure_future(creations.run(1, lambda c: wait_for(first_done, c)))
        await asyncio.sleep(0)
        creations.close(1)
        assert not creations.busy(1)
        second = asyncio.ensure_future(creations.run(1, lambda c: wait_for(second_done, c)))
        first_done.set()
        await first
        assert creations.busy(1)  # the second's
        second_done.set()
        await second
        assert not creations.busy(1)

    asyncio.run(main())
