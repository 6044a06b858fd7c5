"""The ledger client's one exception hierarchy.

Every error raised to users of ``ledger_client`` is a :class:`LedgerError`. Each class carries a stable string
``code`` (safe to log, match on and put in ``--json`` output) and a ``retriable`` flag: ``True`` when the same
operation may succeed if simply tried again later, with no change by the caller (a bookie came back, a
metadata conflict was re-read, a recovery attempt can be repeated). ``for_code(code)`` maps a code back to its
class. Third-party exceptions (kazoo, socket, rocksdict) are translated at the I/O boundary, never leaked::

    LedgerError                                  code                 retriable
    ├── LedgerFencedError                        FENCED               no
    ├── LedgerClosedError                        CLOSED               no
    ├── NotEnoughBookiesError                    NOT_ENOUGH_BOOKIES   yes
    ├── UnauthorizedError                        UNAUTHORIZED         no
    ├── NoSuchLedgerError                        NO_SUCH_LEDGER       no
    ├── NoSuchEntryError                         NO_SUCH_ENTRY        no
    ├── BookieUnavailableError                   BOOKIE_UNAVAILABLE   yes
    ├── BookieInternalError                      BOOKIE_INTERNAL      yes
    ├── ReadOnlyBookieError                      READONLY             yes
    ├── TooManyRequestsError                     TOO_MANY_REQUESTS    yes
    ├── LedgerTimeoutError                       TIMEOUT              yes
    ├── BadRequestError                          BAD_REQUEST          no
    ├── ProtocolViolationError                   PROTOCOL_VIOLATION   no
    ├── DigestMismatchError                      DIGEST_MISMATCH      no   (also a bookie.entryformat.DigestMismatchError)
    ├── ReadBeyondLacError                       READ_BEYOND_LAC      no
    ├── LedgerRecoveryError                      RECOVERY_FAILED      yes
    ├── IncorrectParameterError                  INCORRECT_PARAMETER  no
    ├── IllegalStateTransitionError              ILLEGAL_STATE        no   (a bug in the caller of a protocol core)
    ├── MetadataVersionError                     METADATA_VERSION     yes
    └── MetadataStoreError                       METADATA_STORE       yes

``error_for_status(status)`` turns a non-OK bookie :class:`bookie.protocol.Status` into an instance.
"""

from __future__ import annotations

from typing import ClassVar

from bookie import entryformat
from bookie.protocol import Status

__all__ = [
    "BadRequestError",
    "BookieInternalError",
    "BookieUnavailableError",
    "DigestMismatchError",
    "IllegalStateTransitionError",
    "IncorrectParameterError",
    "LedgerClosedError",
    "LedgerError",
    "LedgerFencedError",
    "LedgerRecoveryError",
    "LedgerTimeoutError",
    "MetadataStoreError",
    "MetadataVersionError",
    "NoSuchEntryError",
    "NoSuchLedgerError",
    "NotEnoughBookiesError",
    "ProtocolViolationError",
    "ReadBeyondLacError",
    "ReadOnlyBookieError",
    "TooManyRequestsError",
    "UnauthorizedError",
    "error_for_status",
    "for_code",
]

_BY_CODE: dict[str, type[LedgerError]] = {}


class LedgerError(Exception):
    """Base of every ledger client error.

    Optional context (``ledger_id``, ``entry_id``, ``bookie``) is kept as attributes for structured logs.
    """

    code: ClassVar[str] = "LEDGER_ERROR"
    retriable: ClassVar[bool] = False

    def __init__(
        self,
        message: str = "",
        *,
        ledger_id: int | None = None,
        entry_id: int | None = None,
        bookie: str | None = None,
    ) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.bookie = bookie

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("code")
        if code is None:
            raise TypeError(f"{cls.__name__} must define its own stable `code`")
        if code in _BY_CODE:
            raise TypeError(f"duplicate error code {code!r}: {cls.__name__} and {_BY_CODE[code].__name__}")
        _BY_CODE[code] = cls

    @classmethod
    def for_code(cls, code: str) -> type[LedgerError]:
        """The class whose ``code`` is ``code`` (``LedgerError`` itself for unknown codes)."""
        return _BY_CODE.get(code, LedgerError)

    def __str__(self) -> str:
        ctx = [
            f"{k}={v}"
            for k, v in (("ledger", self.ledger_id), ("entry", self.entry_id), ("bookie", self.bookie))
            if v is not None
        ]
        return f"[{self.code}] {self.message}" + (f" ({', '.join(ctx)})" if ctx else "")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"

    def __reduce__(self) -> tuple[object, ...]:
        # Keep the context across pickling (Spark executors, multiprocessing).
        return (_rebuild, (type(self), self.message, self.ledger_id, self.entry_id, self.bookie))


def _rebuild(
    cls: type[LedgerError], message: str, ledger_id: int | None, entry_id: int | None, bookie: str | None
) -> LedgerError:
    return cls(message, ledger_id=ledger_id, entry_id=entry_id, bookie=bookie)


_BY_CODE[LedgerError.code] = LedgerError


def for_code(code: str) -> type[LedgerError]:
    """Module-level alias of :meth:`LedgerError.for_code`."""
    return LedgerError.for_code(code)


class LedgerFencedError(LedgerError):
    """The ledger was fenced by a recovering reader: this writer can get nothing more acknowledged."""

    code = "FENCED"


class LedgerClosedError(LedgerError):
    """The ledger (or this handle) is closed to writes."""

    code = "CLOSED"


class NotEnoughBookiesError(LedgerError):
    """Fewer writable bookies are available than an ensemble (or a replacement) needs."""

    code = "NOT_ENOUGH_BOOKIES"
    retriable = True


class UnauthorizedError(LedgerError):
    """Wrong password: the bookie's master key for the ledger differs."""

    code = "UNAUTHORIZED"


class NoSuchLedgerError(LedgerError):
    code = "NO_SUCH_LEDGER"


class NoSuchEntryError(LedgerError):
    code = "NO_SUCH_ENTRY"


class BookieUnavailableError(LedgerError):
    """A bookie could not be reached (connection refused or lost)."""

    code = "BOOKIE_UNAVAILABLE"
    retriable = True


class BookieInternalError(LedgerError):
    """A bookie answered INTERNAL (e.g. a storage error on its side)."""

    code = "BOOKIE_INTERNAL"
    retriable = True


class ReadOnlyBookieError(LedgerError):
    """A bookie is read-only (disk full) and refuses adds."""

    code = "READONLY"
    retriable = True


class TooManyRequestsError(LedgerError):
    """A bookie shed load; try again later."""

    code = "TOO_MANY_REQUESTS"
    retriable = True


class LedgerTimeoutError(LedgerError):
    """A request got no answer in time. (Deliberately not a builtin ``TimeoutError``.)"""

    code = "TIMEOUT"
    retriable = True


class BadRequestError(LedgerError):
    """A bookie rejected a request as malformed (a client bug)."""

    code = "BAD_REQUEST"


class ProtocolViolationError(LedgerError):
    """A peer broke the protocol (undecodable frame, answer to an unknown request, wrong ledger/entry)."""

    code = "PROTOCOL_VIOLATION"


class DigestMismatchError(LedgerError, entryformat.DigestMismatchError):
    """An entry whose digest does not match its bytes.

    Also a :class:`bookie.entryformat.DigestMismatchError`, so code catching the codec's error catches this too.
    """

    code = "DIGEST_MISMATCH"


class ReadBeyondLacError(LedgerError):
    """A (confirmed) read asked for an entry above the last add confirmed."""

    code = "READ_BEYOND_LAC"


class LedgerRecoveryError(LedgerError):
    """A recovery attempt could not decide (too many errors); the ledger stays IN_RECOVERY. Try again."""

    code = "RECOVERY_FAILED"
    retriable = True


class IncorrectParameterError(LedgerError):
    """An argument is invalid (e.g. quorum sizes with not E >= Qw >= Qa >= 1)."""

    code = "INCORRECT_PARAMETER"


class IllegalStateTransitionError(LedgerError):
    """A protocol core was fed an event its state does not allow: a bug in the code driving it."""

    code = "ILLEGAL_STATE"


class MetadataVersionError(LedgerError):
    """A metadata compare-and-set lost to a concurrent update; re-read and retry."""

    code = "METADATA_VERSION"
    retriable = True


class MetadataStoreError(LedgerError):
    """The metadata store (ZooKeeper) failed or is unreachable."""

    code = "METADATA_STORE"
    retriable = True


_FOR_STATUS: dict[Status, type[LedgerError]] = {
    Status.NO_LEDGER: NoSuchLedgerError,
    Status.NO_ENTRY: NoSuchEntryError,
    Status.FENCED: LedgerFencedError,
    Status.UNAUTHORIZED: UnauthorizedError,
    Status.READONLY: ReadOnlyBookieError,
    Status.TOO_MANY_REQUESTS: TooManyRequestsError,
    Status.BAD_REQUEST: BadRequestError,
    Status.INTERNAL: BookieInternalError,
}


def error_for_status(
    status: Status,
    message: str = "",
    *,
    ledger_id: int | None = None,
    entry_id: int | None = None,
    bookie: str | None = None,
) -> LedgerError:
    """The error for a non-OK bookie status. ``Status.OK`` is not an error: passing it raises ``ValueError``."""
    status = Status(status)
    if status is Status.OK:
        raise ValueError("Status.OK is not an error")
    cls = _FOR_STATUS[status]
    return cls(
        message or f"bookie answered {status.name}", ledger_id=ledger_id, entry_id=entry_id, bookie=bookie
    )
