"""ZooKeeper access layer: znode layout, ``Versioned`` + CAS, ledger metadata, ids, bookie registry, cookies and a
launcher for a local ZooKeeper. See ``docs/metadata.md``.

Its pytest fixtures live with the tests (``tests/zk_testing.py``), not in this runtime package.
"""

from zk import layout
from zk.acl import ZkAuth, resolve_auth, secure_tree
from zk.client import (
    FORMAT_VERSION,
    JsonDict,
    MetadataStore,
    NodeStat,
    SessionState,
    decode_body,
    encode_body,
)
from zk.cookies import (
    Cookie,
    CookieVerdict,
    delete_local_cookie,
    delete_zk_cookie,
    ensure_cookies,
    instance_id,
    read_local_cookie,
    read_zk_cookie,
    verify_cookies,
    write_local_cookie,
    write_zk_cookie,
)
from zk.errors import (
    CookieMismatchError,
    InvalidMetadataError,
    MetadataAuthError,
    MetadataClosedError,
    MetadataConnectionError,
    MetadataError,
    MetadataExistsError,
    MetadataFormatError,
    MetadataNotEmptyError,
    MetadataNotFoundError,
    MetadataSessionExpiredError,
    MetadataTransitionError,
    MetadataVersionError,
    ZkConnectStringError,
)
from zk.idgen import IdGenerator
from zk.launcher import ZooKeeperLaunchError, ZooKeeperServer, cli_start, cli_stop, four_letter
from zk.ledger_metadata import (
    Ensemble,
    LedgerMetadata,
    LedgerMetadataStore,
    LedgerState,
    check_transition,
    password_digest_of,
)
from zk.registry import BookieRecord, BookieRegistry
from zk.versioned import Versioned

__all__ = [
    "FORMAT_VERSION",
    "BookieRecord",
    "BookieRegistry",
    "Cookie",
    "CookieMismatchError",
    "CookieVerdict",
    "Ensemble",
    "IdGenerator",
    "InvalidMetadataError",
    "JsonDict",
    "LedgerMetadata",
    "LedgerMetadataStore",
    "LedgerState",
    "MetadataAuthError",
    "MetadataClosedError",
    "MetadataConnectionError",
    "MetadataError",
    "MetadataExistsError",
    "MetadataFormatError",
    "MetadataNotEmptyError",
    "MetadataNotFoundError",
    "MetadataSessionExpiredError",
    "MetadataStore",
    "MetadataTransitionError",
    "MetadataVersionError",
    "NodeStat",
    "SessionState",
    "Versioned",
    "ZkConnectStringError",
    "ZooKeeperLaunchError",
    "ZkAuth",
    "ZooKeeperServer",
    "check_transition",
    "cli_start",
    "cli_stop",
    "decode_body",
    "delete_local_cookie",
    "delete_zk_cookie",
    "encode_body",
    "ensure_cookies",
    "four_letter",
    "instance_id",
    "layout",
    "password_digest_of",
    "read_local_cookie",
    "read_zk_cookie",
    "resolve_auth",
    "secure_tree",
    "verify_cookies",
    "write_local_cookie",
    "write_zk_cookie",
]
