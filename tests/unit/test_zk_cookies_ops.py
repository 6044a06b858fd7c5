"""Cookie verdicts an operator meets when starting a second bookie by mistake (pure: verify_cookies)."""

import pytest

from zk.cookies import Cookie, verify_cookies
from zk.errors import CookieMismatchError

EXP = Cookie(
    bookie_id="127.0.0.1:3185", journal_dir="/d/journal", ledger_dirs=("/d/ledgers",), instance_id="A"
)


def test_another_bookies_directories_in_the_same_cluster_name_that_bookie() -> None:
    """A bookie started on the data directory of bookie 3181 under another port has no ZooKeeper cookie of its
    own: the refusal names the bookie the directories belong to, not a wrong ZooKeeper."""
    theirs = Cookie("127.0.0.1:3181", "/d/journal", ("/d/ledgers",), "A")
    with pytest.raises(CookieMismatchError) as e:
        verify_cookies(None, [theirs, theirs], EXP)
    assert "belongs to bookie 127.0.0.1:3181" in str(e.value) and "--bookie-id 127.0.0.1:3181" in str(e.value)


def test_directories_of_another_cluster_still_say_which_zookeeper_to_check() -> None:
    theirs = Cookie("127.0.0.1:3181", "/d/journal", ("/d/ledgers",), "B")
    with pytest.raises(CookieMismatchError) as e:
        verify_cookies(None, [theirs, theirs], EXP)
    assert "no cookie in ZooKeeper" in str(e.value)
