"""The bookie: wire codec (``protocol``), entry format, journal, RocksDB ledger storage, request handling
(``core``), server and admin HTTP (``server``), and the process (``main``)."""

from .entryformat import DigestType, EntryCodec
from .protocol import OpCode, ProtocolError, Status

__all__ = ["DigestType", "EntryCodec", "OpCode", "ProtocolError", "Status"]
