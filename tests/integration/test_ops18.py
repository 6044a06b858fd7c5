"""An operator's and a stranger's mistakes against real ZooKeeper and bookie processes (docs/operations.md)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from tests.conftest import BookieFactory


def test_a_bookies_readonly_put_answers_deeply_nested_json_with_400(bookies: BookieFactory) -> None:
    """PUT /api/v1/bookie/state/readonly with a body nested 2,000 deep ({"a":{"a":...) was a 500 and a
    traceback in the bookie's log: the JSON parser's RecursionError is not a ValueError. It is a 400 now, and the
    bookie stays writable."""
    bp = bookies.start()
    url = f"http://127.0.0.1:{bp.http_port}/api/v1/bookie/state/readonly"
    req = urllib.request.Request(url, data=b'{"a":' * 2000, method="PUT")
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 400, (e.code, e.read())
        assert b"readOnly" in e.read()
    with urllib.request.urlopen(url, timeout=10) as r:
        assert json.loads(r.read()) == {"readOnly": False}
