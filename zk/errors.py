"""The metadata layer's own exception hierarchy.

Kazoo exceptions never leave the ``zk`` package: :func:`translate` maps them onto these classes. Every class has a
stable ``code`` (a string other layers may put on the wire or in ``--json`` output) and a ``retriable`` flag that
says whether the *same* operation may succeed if tried again later (after re-reading, for CAS conflicts; after
reconnecting, for connection problems).

``MetadataError``
 ├─ ``MetadataVersionError``        CAS conflict: the znode version moved under us (re-read and retry)
 ├─ ``MetadataNotFoundError``       the znode does not exist
 ├─ ``MetadataExistsError``         the znode already exists
 ├─ ``MetadataNotEmptyError``       delete of a znode that still has children
 ├─ ``MetadataFormatError``         a body that is not our JSON, or an unknown ``format_version``
 ├─ ``InvalidMetadataError``        a value that breaks a validation rule (also a ``ValueError``)
 ├─ ``MetadataTransitionError``     a metadata write that breaks the ledger state machine (invariant 5)
 ├─ ``CookieMismatchError``         a bookie's identity check failed (see ``zk.cookies``)
 ├─ ``MetadataAuthError``           ZooKeeper refused our credentials (none, wrong, or malformed) on a znode
 └─ ``MetadataConnectionError``     connection loss / timeout (retriable)
     ├─ ``MetadataSessionExpiredError``  the session expired: ephemeral nodes are gone (retriable)
     └─ ``MetadataClosedError``          the store was closed by its owner (not retriable)
"""

from __future__ import annotations

from typing import ClassVar

from kazoo import exceptions as kex
from kazoo.handlers.threading import KazooTimeoutError


class MetadataError(Exception):
    """Base class of every error raised by the ``zk`` package."""

    code: ClassVar[str] = "METADATA"
    retriable: ClassVar[bool] = False

    def __init__(self, message: str = "", *, path: str | None = None) -> None:
        self.message = message or self.__class__.__doc__ or self.code
        self.path = path
        super().__init__(self.message if path is None else f"{self.message} (path {path})")


class MetadataVersionError(MetadataError):
    """Compare-and-set conflict: the znode changed since it was read."""

    code = "METADATA_VERSION"
    retriable = True


class MetadataNotFoundError(MetadataError):
    """The znode does not exist."""

    code = "METADATA_NOT_FOUND"


class MetadataExistsError(MetadataError):
    """The znode already exists."""

    code = "METADATA_EXISTS"


class MetadataNotEmptyError(MetadataError):
    """The znode still has children."""

    code = "METADATA_NOT_EMPTY"


class MetadataFormatError(MetadataError):
    """The znode body is not a JSON object with a supported format_version."""

    code = "METADATA_FORMAT"
    #: the version of the znode whose body was read, when a read raised it: a writer that replaces what it could
    #: not read deletes that version only (a value written meanwhile is kept)
    version: int | None = None


class InvalidMetadataError(MetadataError, ValueError):
    """A metadata value breaks a validation rule."""

    code = "METADATA_INVALID"


class ZkConnectStringError(MetadataError, ValueError):
    """The ZooKeeper connect string does not parse (``HOST:PORT[,HOST:PORT...][/chroot]``): a usage error, not an
    unreachable ZooKeeper."""

    code = "ZK_CONNECT_STRING"


class MetadataTransitionError(MetadataError):
    """A metadata update breaks the ledger state machine (docs/architecture.md invariant 5)."""

    code = "METADATA_TRANSITION"


class CookieMismatchError(MetadataError):
    """A bookie's cookies (identity) do not match; the bookie must not start."""

    code = "COOKIE_MISMATCH"


class MetadataAuthError(MetadataError):
    """ZooKeeper refused access to a znode (its ACL does not admit our credentials), or the configured credentials
    are malformed. Not retriable: the same credentials will be refused again."""

    code = "METADATA_AUTH"


class MetadataConnectionError(MetadataError):
    """ZooKeeper is unreachable (connection loss or timeout); the operation may or may not have been applied."""

    code = "METADATA_CONNECTION"
    retriable = True


class MetadataSessionExpiredError(MetadataConnectionError):
    """The ZooKeeper session expired; its ephemeral nodes are gone. The store reconnects with a new session."""

    code = "METADATA_SESSION_EXPIRED"
    retriable = True


class MetadataClosedError(MetadataConnectionError):
    """The metadata store has been closed."""

    code = "METADATA_CLOSED"
    retriable = False


def translate(exc: BaseException, path: str | None = None) -> MetadataError:
    """Map a kazoo (or socket/timeout) exception onto our hierarchy. Unknown kazoo errors become ``MetadataError``."""
    if isinstance(exc, MetadataError):
        return exc
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, kex.BadVersionError):
        return MetadataVersionError("znode version changed (compare-and-set conflict)", path=path)
    if isinstance(exc, kex.NoNodeError):
        return MetadataNotFoundError("znode does not exist", path=path)
    if isinstance(exc, kex.NodeExistsError):
        return MetadataExistsError("znode already exists", path=path)
    if isinstance(exc, kex.NotEmptyError):
        return MetadataNotEmptyError("znode has children", path=path)
    if isinstance(exc, kex.NoAuthError):
        return MetadataAuthError(
            "ZooKeeper refused access: this znode's ACL does not admit our credentials "
            "(set LEDGERSTORE_ZK_AUTH=user:password, or check the password)",
            path=path,
        )
    if isinstance(exc, kex.AuthFailedError):
        return MetadataAuthError(f"ZooKeeper rejected our credentials: {detail}", path=path)
    # ConnectionClosedError is a subclass of SessionExpiredError in kazoo: test it first.
    if isinstance(exc, kex.ConnectionClosedError):
        return MetadataClosedError(f"metadata store connection is closed: {detail}", path=path)
    if isinstance(exc, kex.SessionExpiredError):
        return MetadataSessionExpiredError(f"ZooKeeper session expired: {detail}", path=path)
    if isinstance(
        exc, (kex.ConnectionLoss, kex.OperationTimeoutError, KazooTimeoutError, TimeoutError, OSError)
    ):
        return MetadataConnectionError(f"ZooKeeper connection problem: {detail}", path=path)
    if isinstance(exc, kex.KazooException):
        return MetadataError(f"ZooKeeper error {type(exc).__name__}: {detail}", path=path)
    return MetadataError(f"unexpected error {type(exc).__name__}: {detail}", path=path)
