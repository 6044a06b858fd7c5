"""A ZooKeeper connect string naming a host that does not resolve: the connect's timeout says so, and the CLI
asks for the host name to be checked rather than whether ZooKeeper runs."""

from __future__ import annotations

import pytest

from ledgerstore import cli
from zk import MetadataStore
from zk.errors import MetadataConnectionError


def test_a_host_that_does_not_resolve_is_named_by_the_connect_timeout() -> None:
    with pytest.raises(MetadataConnectionError) as e:
        MetadataStore.connect("zk-typo.invalid:2181", timeout_s=1.0)
    assert "(no such host: zk-typo.invalid: " in str(e.value), e.value
    code, kind, message = cli._classify(e.value)
    assert code == 5 and message.endswith("; check the host name (--zk HOST:PORT or $LEDGERSTORE_ZK)"), (
        message
    )

    with pytest.raises(MetadataConnectionError) as e:  # a host that resolves, nothing listening: as before
        MetadataStore.connect("127.0.0.1:1", timeout_s=1.0)
    assert "no such host" not in str(e.value) and "is it running?" in cli._classify(e.value)[2]
