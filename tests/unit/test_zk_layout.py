import pytest
from hypothesis import given
from hypothesis import strategies as st

from zk import layout
from zk.client import _check_root


@pytest.mark.parametrize(
    ("ledger_id", "path"),
    [
        (0, "ledgers/000/0000/0000/0000/L0000"),
        (1, "ledgers/000/0000/0000/0000/L0001"),
        (123456789012, "ledgers/000/0000/1234/5678/L9012"),
        (2**63 - 1, "ledgers/922/3372/0368/5477/L5807"),
    ],
)
def test_ledger_path_examples(ledger_id: int, path: str) -> None:
    assert layout.ledger_path(ledger_id) == path
    assert layout.parse_ledger_path(path) == ledger_id
    assert layout.parse_ledger_path("/" + path) == ledger_id


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_ledger_path_round_trip(ledger_id: int) -> None:
    path = layout.ledger_path(ledger_id)
    assert layout.parse_ledger_path(path) == ledger_id
    comps = path.split("/")
    assert comps[0] == "ledgers" and len(comps) == 6
    # every directory level has a bounded fan-out (<= 10 000 children)
    assert all(len(c) <= 4 for c in comps[1:-1]) and len(comps[-1]) == 5


@given(st.integers(min_value=0, max_value=2**63 - 2))
def test_ledger_paths_sort_like_ids(ledger_id: int) -> None:
    assert layout.ledger_path(ledger_id) < layout.ledger_path(ledger_id + 1)


@pytest.mark.parametrize("bad", [-1, 2**63, True, "7", 1.0])
def test_ledger_path_rejects_bad_ids(bad: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        layout.ledger_path(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        "ledgers/000/0000/0000/0000",
        "ledgers/000/0000/0000/0000/X0001",
        "ledgers/000/0000/0000/0000/L001",
        "ledgers/00/0000/0000/0000/L0001",
        "ledgers/000/0000/0000/0000/L0001/extra",
        "bookies/000/0000/0000/0000/L0001",
        "ledgers/999/9999/9999/9999/L9999",  # > int64
        "ledgers/000/00a0/0000/0000/L0001",
        "",
    ],
)
def test_parse_ledger_path_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        layout.parse_ledger_path(bad)


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_underreplicated_round_trip(ledger_id: int) -> None:
    path = layout.underreplicated_ledger_path(ledger_id)
    assert path.startswith("underreplicated/ledgers/")
    assert layout.parse_underreplicated_ledger_path(path) == ledger_id
    with pytest.raises(ValueError):
        layout.parse_ledger_path(path)


def test_bookie_paths_accept_host_port_ids() -> None:
    assert layout.available_bookie_path("127.0.0.1:3181") == "bookies/available/127.0.0.1:3181"
    assert layout.readonly_bookie_path("127.0.0.1:3181") == "bookies/readonly/127.0.0.1:3181"
    assert layout.cookie_path("127.0.0.1:3181") == "cookies/127.0.0.1:3181"
    for bad in ["", "a/b", ".", "..", "x\ny"]:
        with pytest.raises(ValueError):
            layout.available_bookie_path(bad)


def test_zookeeper_is_a_name_below_the_root_but_no_root() -> None:
    """Only ``/zookeeper`` is ZooKeeper's: a tenant, namespace or topic named so has its znodes (the admin REST
    answered 500 'reserved by ZooKeeper' for each)."""
    assert layout.namespace_policies_path("zookeeper", "zookeeper") == "namespaces/zookeeper/zookeeper"
    assert layout.ml_info_path("zookeeper/ns/persistent/zookeeper").endswith(
        "/zookeeper/ns/persistent/zookeeper"
    )
    for root in ("/zookeeper", "/zookeeper/ledgers"):
        with pytest.raises(ValueError, match="ZooKeeper's own"):
            _check_root(root)
    assert _check_root("/ledgers/zookeeper") == "/ledgers/zookeeper"


@given(st.text(min_size=1))
def test_topic_names_encode_to_one_component(topic: str) -> None:
    comp = layout.encode_name(topic)
    assert "/" not in comp and comp not in (".", "..")
    assert layout.decode_name(comp) == topic


def test_underreplicated_lock_path() -> None:
    assert layout.underreplicated_lock_path(5) == "underreplicated/locks/urL0000000000000000005"
