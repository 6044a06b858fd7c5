"""The ledger client's error hierarchy: stable codes, retriable flags, status mapping."""

from __future__ import annotations

import pickle

import pytest

from bookie import entryformat
from bookie.protocol import Status
from ledger_client import errors as e

ALL = [
    e.LedgerFencedError,
    e.LedgerClosedError,
    e.NotEnoughBookiesError,
    e.UnauthorizedError,
    e.NoSuchLedgerError,
    e.NoSuchEntryError,
    e.BookieUnavailableError,
    e.BookieInternalError,
    e.MetadataVersionError,
    e.DigestMismatchError,
    e.ReadOnlyBookieError,
    e.TooManyRequestsError,
    e.LedgerTimeoutError,
    e.BadRequestError,
    e.ProtocolViolationError,
    e.ReadBeyondLacError,
    e.LedgerRecoveryError,
    e.IncorrectParameterError,
    e.IllegalStateTransitionError,
    e.MetadataStoreError,
]


def test_every_error_is_a_ledger_error_with_a_unique_stable_code():
    codes = [cls.code for cls in ALL]
    assert len(set(codes)) == len(codes)
    for cls in ALL:
        assert issubclass(cls, e.LedgerError)
        assert e.for_code(cls.code) is cls
        assert e.LedgerError.for_code(cls.code) is cls


def test_codes_that_are_contracts():
    assert e.LedgerFencedError.code == "FENCED"
    assert e.LedgerClosedError.code == "CLOSED"
    assert e.LedgerTimeoutError.code == "TIMEOUT"


def test_unknown_code_maps_to_the_base_class():
    assert e.for_code("NO_SUCH_CODE") is e.LedgerError


def test_retriable_flags():
    retriable = {cls for cls in ALL if cls.retriable}
    assert e.BookieUnavailableError in retriable
    assert e.TooManyRequestsError in retriable
    assert e.LedgerTimeoutError in retriable
    assert e.LedgerFencedError not in retriable
    assert e.UnauthorizedError not in retriable
    assert e.LedgerClosedError not in retriable


def test_a_subclass_without_its_own_code_is_refused():
    with pytest.raises(TypeError):

        class _NoCode(e.LedgerError):
            pass


def test_duplicate_codes_are_refused():
    with pytest.raises(TypeError):

        class _Dup(e.LedgerError):
            code = "FENCED"


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (Status.NO_LEDGER, e.NoSuchLedgerError),
        (Status.NO_ENTRY, e.NoSuchEntryError),
        (Status.FENCED, e.LedgerFencedError),
        (Status.UNAUTHORIZED, e.UnauthorizedError),
        (Status.READONLY, e.ReadOnlyBookieError),
        (Status.TOO_MANY_REQUESTS, e.TooManyRequestsError),
        (Status.BAD_REQUEST, e.BadRequestError),
        (Status.INTERNAL, e.BookieInternalError),
    ],
)
def test_error_for_status(status, cls):
    err = e.error_for_status(status, ledger_id=7, entry_id=3, bookie="b1:3181")
    assert type(err) is cls
    assert (err.ledger_id, err.entry_id, err.bookie) == (7, 3, "b1:3181")
    assert cls.code in str(err) and "ledger=7" in str(err)


def test_every_non_ok_status_has_an_error_and_ok_has_none():
    for status in Status:
        if status is Status.OK:
            with pytest.raises(ValueError):
                e.error_for_status(status)
        else:
            assert isinstance(e.error_for_status(status), e.LedgerError)


def test_digest_mismatch_is_also_the_codecs_error():
    with pytest.raises(entryformat.DigestMismatchError):
        raise e.DigestMismatchError("bad")


def test_errors_pickle_with_their_context():
    err = e.LedgerFencedError("fenced", ledger_id=1, entry_id=2, bookie="b")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is e.LedgerFencedError
    assert (back.message, back.ledger_id, back.entry_id, back.bookie) == ("fenced", 1, 2, "b")
