"""Apache Pulsar's binary protocol without I/O: frames in and out, checksums, the stored entry format, batches.

A frame (all integers big-endian)::

    u32 total_size            bytes after this field: 4 + command_size [+ the payload part]
    u32 command_size
    BaseCommand               protobuf (topic_broker/pulsar_api.proto)
    -- only SEND (client -> broker) and MESSAGE (broker -> client) carry a payload part: --
    [u16 0x0e02][u32 size][BrokerEntryMetadata]    optional, broker -> client only (we never send it)
    [u16 0x0e01][u32 CRC32C]                       optional on SEND (sent when the broker speaks protocol >= 6)
    u32 metadata_size
    MessageMetadata
    payload                   a batch is N x [u32 size][SingleMessageMetadata][payload_i]

The CRC32C (Castagnoli) covers everything after the checksum field. A metadata size never starts with 0x0e01
or 0x0e02: that would be over 200 MiB, far above any frame limit, so the magics are unambiguous.

The stored entry (docs/broker.md, the contract with the Spark topic source) is the payload part from the checksum
on: ``[0x0e01][CRC32C][metadata size][MessageMetadata][payload]``. A SEND's entry is stored as received (with
the checksum the client computed, or one computed here when it sent none) and a MESSAGE re-sends it unchanged.

:class:`FrameDecoder` is fed arbitrary chunks and returns whole frames; malformed input raises
:class:`FrameError`, after which the connection must be closed (a length-prefixed stream cannot resynchronise).
Builders such as :func:`send_receipt` return encoded frames ready to write.

Errors::

    WireError (ValueError)
     ├── FrameError          a malformed frame; close the connection
     └── EntryFormatError    a stored entry or SEND payload that cannot be read (bad magic, checksum, metadata)
          └── CompressionUnavailableError   compressed with LZ4, ZSTD or SNAPPY, and pyarrow is not installed
"""

from __future__ import annotations

import base64
import datetime
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import crc32c as _crc32c
from google.protobuf.message import DecodeError

from ledger_client import ENTRY_PAYLOAD_MAX
from topic_broker import pulsar_api_pb2 as pb

__all__ = [
    "ARROW_CODECS",
    "CompressionUnavailableError",
    "CHECKSUM_MAGIC",
    "counts_for_dedup",
    "entry_deliver_at",
    "highest_sequence_id",
    "BROKER_ENTRY_METADATA_MAGIC",
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "FRAME_PADDING_SIZE",
    "NONE_KEY",
    "EntryFormatError",
    "Frame",
    "FrameDecoder",
    "FrameError",
    "WireError",
    "active_consumer_change",
    "ack_response",
    "checksum",
    "close_consumer",
    "close_producer",
    "command_name",
    "connected",
    "consumer_stats_response",
    "encode_command",
    "encode_message",
    "encode_send",
    "entry_checksum_ok",
    "entry_message_count",
    "entry_publish_time",
    "error",
    "get_last_message_id_response",
    "get_schema_response",
    "get_topics_of_namespace_response",
    "iter_batch",
    "batch_last_sequence_id",
    "batch_walk_off_loop",
    "inflates_off_loop",
    "lookup_response",
    "make_entry",
    "message",
    "message_head",
    "parse_entry",
    "partitioned_metadata_response",
    "ping",
    "pong",
    "producer_success",
    "signed64",
    "sticky_key",
    "send_error",
    "send_receipt",
    "success",
    "uncompressed_payload",
]

CHECKSUM_MAGIC: Final = 0x0E01
BROKER_ENTRY_METADATA_MAGIC: Final = 0x0E02
FRAME_PADDING_SIZE: Final = 10 * 1024  # room for the command and headers around a message of the maximum size
#: The largest message (metadata and payload) the broker announces in CONNECTED: what leaves room in a ledger
#: entry (ENTRY_PAYLOAD_MAX, the largest the ledger client appends; one SEND is one entry) for the stored headers and a chunk's metadata (the client cuts chunks of exactly this size). Pulsar's
#: default is 5 MiB; a ledger entry is at most 5 MiB, so ours is 10 KiB less.
DEFAULT_MAX_MESSAGE_SIZE: Final = ENTRY_PAYLOAD_MAX - FRAME_PADDING_SIZE
DEFAULT_MAX_FRAME_SIZE: Final = DEFAULT_MAX_MESSAGE_SIZE + FRAME_PADDING_SIZE

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_HEADER = struct.Struct(">II")  # total_size, command_size
_CHECKSUM_MAGIC_BYTES: Final = _U16.pack(CHECKSUM_MAGIC)
_ENTRY_HEADER_SIZE: Final = 2 + 4 + 4  # magic, CRC32C, metadata size
_PAYLOAD_TYPES: Final = frozenset({pb.BaseCommand.SEND, pb.BaseCommand.MESSAGE})

# Each BaseCommand.Type value is also the field number of its sub-command (where we define one).
_SUBCOMMAND_FIELD: Final[dict[int, str]] = {
    number: f.name for number, f in pb.BaseCommand.DESCRIPTOR.fields_by_number.items() if number != 1
}


class WireError(ValueError):
    """Input that is not valid Pulsar protocol."""


class FrameError(WireError):
    """A malformed frame. The stream is unusable afterwards: close the connection."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EntryFormatError(WireError):
    """A stored entry (or a SEND's payload part) whose magic, checksum, sizes or metadata are invalid."""


class CompressionUnavailableError(EntryFormatError):
    """An entry compressed with a codec this process cannot decompress: pyarrow, which LZ4, ZSTD and SNAPPY need,
    is not installed."""


def checksum(data: bytes | bytearray | memoryview) -> int:
    """CRC32C (Castagnoli) as Pulsar computes it over metadata size + metadata + payload."""
    return _crc32c.crc32c(data)


def command_name(command_type: int) -> str:
    """``BaseCommand.Type`` name for logs (``"SEND"``), or the number when it is not one we know."""
    try:
        return pb.BaseCommand.Type.Name(command_type)
    except ValueError:
        return str(command_type)


# ---- frames in ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    """One decoded frame.

    ``entry`` is set for SEND and MESSAGE: the stored-entry form of the payload part (see the module docstring).
    ``checksum_ok`` is False only when the sender put a checksum in the frame and it does not match;
    ``checksum_present`` says whether it put one there at all.
    """

    command: pb.BaseCommand
    entry: bytes | None = None
    checksum_ok: bool = True
    checksum_present: bool = False
    broker_entry_metadata: bytes | None = (
        None  # raw BrokerEntryMetadata of a MESSAGE, when the broker sent one
    )
    _parsed: tuple[pb.MessageMetadata, memoryview] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def type(self) -> int:
        return self.command.type

    def _parse(self) -> tuple[pb.MessageMetadata, memoryview]:
        parsed = self._parsed
        if parsed is None:
            if self.entry is None:
                raise EntryFormatError(f"{command_name(self.command.type)} carries no payload")
            # the decoder has already checked the checksum (see checksum_ok); do not pay for it twice
            parsed = parse_entry(self.entry, verify_checksum=False)
            object.__setattr__(self, "_parsed", parsed)  # a cache; the frame stays logically immutable
        return parsed

    @property
    def metadata(self) -> pb.MessageMetadata:
        """The entry's MessageMetadata, parsed on first use. Raises :class:`EntryFormatError`."""
        return self._parse()[0]

    @property
    def payload(self) -> memoryview:
        """The entry's payload (a batch's packed messages for a batch entry). Raises :class:`EntryFormatError`."""
        return self._parse()[1]


class FrameDecoder:
    """Incremental frame splitter: ``feed(chunk)`` returns the frames that chunk completed (pure, no I/O).

    Any split of the input gives the same frames. A frame whose declared size exceeds ``max_frame_size`` is
    refused as soon as its first 4 bytes arrive, before it is buffered.
    """

    __slots__ = ("_buf", "max_frame_size", "broken")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        assert max_frame_size >= 8, max_frame_size
        self._buf = bytearray()
        self.max_frame_size = max_frame_size
        self.broken = False

    @property
    def buffered(self) -> int:
        """Bytes received that are not yet part of a returned frame."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        if self.broken:
            raise FrameError("decoder already failed")
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        pos = 0
        n = len(buf)
        try:
            while n - pos >= 4:
                (total,) = _U32.unpack_from(buf, pos)
                if total < 4 or total > self.max_frame_size:
                    raise FrameError(f"frame size {total} outside [4, {self.max_frame_size}]")
                end = pos + 4 + total
                if end > n:
                    break
                frames.append(_decode_frame(buf, pos + 4, end))
                pos = end
        except FrameError:
            self.broken = True
            self._buf = bytearray()
            raise
        if pos:
            del buf[:pos]  # one move per feed of what is left (at most one partial frame)
        return frames


def _decode_frame(buf: bytearray, start: int, end: int) -> Frame:
    """Decode ``buf[start:end]`` (one frame without its total-size field). Slices of ``buf`` must not escape:
    the decoder resizes ``buf`` afterwards, which a live memoryview on it would forbid."""
    (cmd_size,) = _U32.unpack_from(buf, start)
    cmd_end = start + 4 + cmd_size
    if cmd_end > end:
        raise FrameError(f"command size {cmd_size} exceeds frame size {end - start}")
    command = pb.BaseCommand()
    try:
        command.ParseFromString(bytes(buf[start + 4 : cmd_end]))
    except DecodeError as e:
        raise FrameError(f"unparsable BaseCommand: {e}") from None
    if not command.HasField("type"):
        raise FrameError("BaseCommand without a known type")
    ctype = command.type
    sub = _SUBCOMMAND_FIELD.get(ctype)
    if sub is not None and not command.HasField(sub):
        raise FrameError(f"{command_name(ctype)} without its {sub} sub-command")
    if not command.IsInitialized():
        missing = ", ".join(command.FindInitializationErrors())
        raise FrameError(f"{command_name(ctype)} lacks required fields: {missing}")
    if cmd_end == end:
        if ctype in _PAYLOAD_TYPES:
            raise FrameError(f"{command_name(ctype)} without a payload")
        return Frame(command=command)
    if ctype not in _PAYLOAD_TYPES:
        raise FrameError(f"{command_name(ctype)} with {end - cmd_end} bytes after the command")
    return _decode_payload(command, buf, cmd_end, end)


def _decode_payload(command: pb.BaseCommand, buf: bytearray, p: int, end: int) -> Frame:
    broker_entry_metadata = None
    if end - p >= 6 and _U16.unpack_from(buf, p)[0] == BROKER_ENTRY_METADATA_MAGIC:
        if command.type != pb.BaseCommand.MESSAGE:
            raise FrameError("broker entry metadata on a frame other than MESSAGE")
        (size,) = _U32.unpack_from(buf, p + 2)
        if p + 6 + size > end:
            raise FrameError(f"broker entry metadata size {size} exceeds the frame")
        broker_entry_metadata = bytes(buf[p + 6 : p + 6 + size])
        p += 6 + size
    present = end - p >= 6 and _U16.unpack_from(buf, p)[0] == CHECKSUM_MAGIC
    expected = 0
    if present:
        (expected,) = _U32.unpack_from(buf, p + 2)
        p += 6
    if end - p < 4:
        raise FrameError("payload part shorter than its metadata size field")
    (meta_size,) = _U32.unpack_from(buf, p)
    if meta_size == 0 or p + 4 + meta_size > end:
        raise FrameError(f"metadata size {meta_size} outside [1, {end - p - 4}]")
    with memoryview(buf) as view:
        body = view[p:end]
        try:
            actual = _crc32c.crc32c(body)
            if present:
                entry = bytes(view[p - 6 : end])
            else:
                entry = b"".join((_CHECKSUM_MAGIC_BYTES, _U32.pack(actual), body))
        finally:
            body.release()
    return Frame(
        command=command,
        entry=entry,
        checksum_ok=not present or actual == expected,
        checksum_present=present,
        broker_entry_metadata=broker_entry_metadata,
    )


# ---- frames out --------------------------------------------------------------------------------------------


def encode_command(command: pb.BaseCommand) -> bytes:
    """A frame without payload. Raises protobuf's EncodeError when a required field is missing."""
    body = command.SerializeToString()
    n = len(body)
    return _HEADER.pack(4 + n, n) + body


def encode_message(command: pb.BaseCommand, entry: bytes | bytearray | memoryview) -> bytes:
    """A MESSAGE (or SEND) frame carrying a stored entry unchanged after the command."""
    assert command.type in _PAYLOAD_TYPES, command_name(command.type)
    assert bytes(entry[:2]) == _CHECKSUM_MAGIC_BYTES, "a stored entry starts with the checksum magic"
    body = command.SerializeToString()
    n = len(body)
    return b"".join((_HEADER.pack(4 + n + len(entry), n), body, entry))


def encode_send(
    command: pb.BaseCommand,
    metadata: pb.MessageMetadata | bytes,
    payload: bytes | bytearray | memoryview,
    *,
    with_checksum: bool = True,
) -> bytes:
    """A SEND frame as a client writes it (tests, tools); ``with_checksum=False`` as to a broker below v6."""
    meta = metadata if isinstance(metadata, bytes) else metadata.SerializeToString()
    body = command.SerializeToString()
    parts = [b"", body]
    if with_checksum:
        parts.append(_CHECKSUM_MAGIC_BYTES)
        parts.append(_U32.pack(checksum(_U32.pack(len(meta)) + meta + bytes(payload))))
    parts += [_U32.pack(len(meta)), meta, bytes(payload)]
    size = sum(len(part) for part in parts)
    parts[0] = _HEADER.pack(4 + size, len(body))
    return b"".join(parts)


def _frame(command: pb.BaseCommand) -> bytes:
    return encode_command(command)


_T = pb.BaseCommand


def connected(server_version: str, protocol_version: int, max_message_size: int | None = None) -> bytes:
    """CONNECTED: the first frame a broker sends on a connection (server_version is required by the client)."""
    return _frame(
        _T(
            type=_T.CONNECTED,
            connected=pb.CommandConnected(
                server_version=server_version,
                protocol_version=protocol_version,
                max_message_size=max_message_size,
            ),
        )
    )


_PING: Final = encode_command(_T(type=_T.PING, ping=pb.CommandPing()))
_PONG: Final = encode_command(_T(type=_T.PONG, pong=pb.CommandPong()))


def ping() -> bytes:
    return _PING


def pong() -> bytes:
    return _PONG


def auth_challenge(server_version: str, protocol_version: int, method: str) -> bytes:
    """AUTH_CHALLENGE: the client's credentials expired; it answers with AUTH_RESPONSE holding fresh ones."""
    return _frame(
        _T(
            type=_T.AUTH_CHALLENGE,
            authChallenge=pb.CommandAuthChallenge(
                server_version=server_version,
                protocol_version=protocol_version,
                challenge=pb.AuthData(auth_method_name=method, auth_data=b"refresh"),
            ),
        )
    )


def success(request_id: int, schema: pb.Schema | None = None) -> bytes:
    return _frame(_T(type=_T.SUCCESS, success=pb.CommandSuccess(request_id=request_id, schema=schema)))


def error(request_id: int, code: pb.ServerError, message: str) -> bytes:
    """ERROR: ``code`` is a ``pb.ServerError`` value."""
    return _frame(
        _T(type=_T.ERROR, error=pb.CommandError(request_id=request_id, error=code, message=message))
    )


def producer_success(
    request_id: int,
    producer_name: str,
    last_sequence_id: int = -1,
    *,
    schema_version: bytes | None = None,
    topic_epoch: int | None = None,
    producer_ready: bool = True,
) -> bytes:
    return _frame(
        _T(
            type=_T.PRODUCER_SUCCESS,
            producer_success=pb.CommandProducerSuccess(
                request_id=request_id,
                producer_name=producer_name,
                last_sequence_id=last_sequence_id,
                schema_version=schema_version,
                topic_epoch=topic_epoch,
                producer_ready=producer_ready,
            ),
        )
    )


_U64 = (1 << 64) - 1


def signed64(value: int) -> int:
    """A ``MessageIdData`` ledger or entry id (uint64 on the wire) as the signed id it stands for: the client's
    ``MessageId.earliest`` is (−1, −1), sent as 2**64 − 1."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _message_id(
    ledger_id: int, entry_id: int, partition: int = -1, batch_index: int = -1
) -> pb.MessageIdData:
    """Negative ids (an empty ledger's last entry −1) are sent as uint64, as Pulsar's Java broker does."""
    mid = pb.MessageIdData(ledgerId=ledger_id & _U64, entryId=entry_id & _U64)
    if partition >= 0:
        mid.partition = partition
    if batch_index >= 0:
        mid.batch_index = batch_index
    return mid


# -- hand-encoded hot frames ----------------------------------------------------------------------------------
# SEND_RECEIPT and MESSAGE leave once per entry: built directly as protobuf wire bytes (field tags and varints),
# byte for byte what SerializeToString gives for the same fields (tests compare them), without building
# message objects. Other cases fall back to protobuf.


def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _mid_bytes(ledger_id: int, entry_id: int, partition: int = -1) -> bytearray:
    mid = bytearray(b"\x08")  # ledgerId = 1 (varint)
    _varint(ledger_id & _U64, mid)
    mid.append(0x10)  # entryId = 2
    _varint(entry_id & _U64, mid)
    if partition >= 0:
        mid.append(0x18)  # partition = 3
        _varint(partition, mid)
    return mid


def _with_field(out: bytearray, tag: int, body: bytearray) -> None:
    out.append(tag)
    _varint(len(body), out)
    out += body


def _base_command(command_type: int, field_tag: int, body: bytearray) -> bytearray:
    out = bytearray(b"\x08")  # BaseCommand.type = 1
    _varint(command_type, out)
    _with_field(out, field_tag, body)
    return out


def send_receipt(
    producer_id: int,
    sequence_id: int,
    ledger_id: int,
    entry_id: int,
    *,
    highest_sequence_id: int | None = None,
    partition: int = -1,
) -> bytes:
    if partition < 0 and producer_id >= 0 and sequence_id >= 0 and (highest_sequence_id or 0) >= 0:
        r = bytearray(b"\x08")  # producer_id = 1
        _varint(producer_id, r)
        r.append(0x10)  # sequence_id = 2
        _varint(sequence_id, r)
        _with_field(r, 0x1A, _mid_bytes(ledger_id, entry_id))  # message_id = 3
        if highest_sequence_id is not None:
            r.append(0x20)  # highest_sequence_id = 4
            _varint(highest_sequence_id, r)
        cmd = _base_command(_T.SEND_RECEIPT, 0x3A, r)  # BaseCommand.send_receipt = 7
        return _HEADER.pack(4 + len(cmd), len(cmd)) + cmd
    return _frame(
        _T(
            type=_T.SEND_RECEIPT,
            send_receipt=pb.CommandSendReceipt(
                producer_id=producer_id,
                sequence_id=sequence_id,
                message_id=_message_id(ledger_id, entry_id, partition),
                highest_sequence_id=highest_sequence_id,
            ),
        )
    )


def send_error(producer_id: int, sequence_id: int, code: pb.ServerError, message: str) -> bytes:
    """SEND_ERROR. The client closes the connection on any code but ChecksumError (then reconnects, resends)."""
    return _frame(
        _T(
            type=_T.SEND_ERROR,
            send_error=pb.CommandSendError(
                producer_id=producer_id, sequence_id=sequence_id, error=code, message=message
            ),
        )
    )


def message_head(
    consumer_id: int,
    ledger_id: int,
    entry_id: int,
    entry_size: int,
    *,
    redelivery_count: int = 0,
    partition: int = -1,
) -> bytes:
    """The start of a MESSAGE frame (its sizes and command) for a stored entry of ``entry_size`` bytes at
    (ledger_id, entry_id), which follows it unchanged: the dispatcher writes the two as separate buffers, so
    the entry is not copied into the frame. ``partition``: the topic's partition index, carried in the message
    id as Pulsar's broker does (the client's MessageId then equals the one its producer was given)."""
    if consumer_id < 0 or not 0 <= redelivery_count < 2**32 or entry_size < _ENTRY_HEADER_SIZE:
        raise ValueError(
            f"no MESSAGE head for consumer {consumer_id}, redelivery count {redelivery_count}, "
            f"an entry of {entry_size} bytes"
        )
    m = bytearray(b"\x08")  # consumer_id = 1
    _varint(consumer_id, m)
    _with_field(m, 0x12, _mid_bytes(ledger_id, entry_id, partition))  # message_id = 2
    if redelivery_count:
        m.append(0x18)  # redelivery_count = 3
        _varint(redelivery_count, m)
    cmd = _base_command(_T.MESSAGE, 0x4A, m)  # BaseCommand.message = 9
    return b"".join((_HEADER.pack(4 + len(cmd) + entry_size, len(cmd)), cmd))


def message(
    consumer_id: int,
    ledger_id: int,
    entry_id: int,
    entry: bytes | bytearray | memoryview,
    *,
    redelivery_count: int = 0,
    partition: int = -1,
    ack_set: Iterable[int] | None = None,
    consumer_epoch: int | None = None,
) -> bytes:
    """A MESSAGE frame delivering the stored ``entry`` (unchanged) at (ledger_id, entry_id)."""
    if ack_set is None and consumer_epoch is None and consumer_id >= 0 and 0 <= redelivery_count < 2**32:
        assert bytes(entry[:2]) == _CHECKSUM_MAGIC_BYTES, "a stored entry starts with the checksum magic"
        head = message_head(
            consumer_id,
            ledger_id,
            entry_id,
            len(entry),
            redelivery_count=redelivery_count,
            partition=partition,
        )
        return b"".join((head, entry))
    command = _T(
        type=_T.MESSAGE,
        message=pb.CommandMessage(
            consumer_id=consumer_id,
            message_id=_message_id(ledger_id, entry_id, partition),
            redelivery_count=redelivery_count or None,
            ack_set=ack_set,
            consumer_epoch=consumer_epoch,
        ),
    )
    return encode_message(command, entry)


def lookup_response(
    request_id: int,
    *,
    broker_service_url: str | None = None,
    broker_service_url_tls: str | None = None,
    response: pb.CommandLookupTopicResponse.LookupType = pb.CommandLookupTopicResponse.Connect,
    authoritative: bool = True,
    proxy_through_service_url: bool = False,
    error_code: pb.ServerError | None = None,
    message: str | None = None,
) -> bytes:
    """LOOKUP_RESPONSE: Connect (use this broker), Redirect (ask ``broker_service_url``) or Failed (with
    ``error_code``/``message``; an error code makes it Failed, else clients read it as Connect)."""
    if error_code is not None:
        response = pb.CommandLookupTopicResponse.Failed
    return _frame(
        _T(
            type=_T.LOOKUP_RESPONSE,
            lookupTopicResponse=pb.CommandLookupTopicResponse(
                request_id=request_id,
                brokerServiceUrl=broker_service_url,
                brokerServiceUrlTls=broker_service_url_tls,
                response=response,
                authoritative=authoritative,
                proxy_through_service_url=proxy_through_service_url,
                error=error_code,
                message=message,
            ),
        )
    )


def partitioned_metadata_response(
    request_id: int,
    partitions: int = 0,
    *,
    error_code: pb.ServerError | None = None,
    message: str | None = None,
) -> bytes:
    """PARTITIONED_METADATA_RESPONSE; ``response`` is always set (Success, or Failed when ``error_code`` is
    given), since the client treats a missing one as a failure. 0 partitions = a non-partitioned topic."""
    failed = error_code is not None
    lookup_type = pb.CommandPartitionedTopicMetadataResponse
    return _frame(
        _T(
            type=_T.PARTITIONED_METADATA_RESPONSE,
            partitionMetadataResponse=pb.CommandPartitionedTopicMetadataResponse(
                request_id=request_id,
                partitions=None if failed else partitions,
                response=lookup_type.Failed if failed else lookup_type.Success,
                error=error_code,
                message=message,
            ),
        )
    )


def close_producer(
    producer_id: int, request_id: int, *, assigned_broker_service_url: str | None = None
) -> bytes:
    """CLOSE_PRODUCER from the broker: the client looks the topic up again and re-creates the producer."""
    return _frame(
        _T(
            type=_T.CLOSE_PRODUCER,
            close_producer=pb.CommandCloseProducer(
                producer_id=producer_id,
                request_id=request_id,
                assignedBrokerServiceUrl=assigned_broker_service_url,
            ),
        )
    )


def close_consumer(
    consumer_id: int, request_id: int, *, assigned_broker_service_url: str | None = None
) -> bytes:
    """CLOSE_CONSUMER from the broker: the client looks the topic up again and re-subscribes."""
    return _frame(
        _T(
            type=_T.CLOSE_CONSUMER,
            close_consumer=pb.CommandCloseConsumer(
                consumer_id=consumer_id,
                request_id=request_id,
                assignedBrokerServiceUrl=assigned_broker_service_url,
            ),
        )
    )


def active_consumer_change(consumer_id: int, is_active: bool) -> bytes:
    return _frame(
        _T(
            type=_T.ACTIVE_CONSUMER_CHANGE,
            active_consumer_change=pb.CommandActiveConsumerChange(
                consumer_id=consumer_id, is_active=is_active
            ),
        )
    )


def get_last_message_id_response(
    request_id: int,
    ledger_id: int,
    entry_id: int,
    *,
    batch_index: int = -1,
    partition: int = -1,
    mark_delete_position: tuple[int, int] | None = None,
) -> bytes:
    """GET_LAST_MESSAGE_ID_RESPONSE. ``entry_id`` is −1 when the current ledger is empty; ``batch_index`` is
    n − 1 when the last entry is a batch of n messages."""
    mark_delete = None if mark_delete_position is None else _message_id(*mark_delete_position)
    return _frame(
        _T(
            type=_T.GET_LAST_MESSAGE_ID_RESPONSE,
            getLastMessageIdResponse=pb.CommandGetLastMessageIdResponse(
                request_id=request_id,
                last_message_id=_message_id(ledger_id, entry_id, partition, batch_index),
                consumer_mark_delete_position=mark_delete,
            ),
        )
    )


def get_schema_response(
    request_id: int,
    *,
    schema: pb.Schema | None = None,
    schema_version: bytes | None = None,
    error_code: pb.ServerError | None = None,
    error_message: str | None = None,
) -> bytes:
    return _frame(
        _T(
            type=_T.GET_SCHEMA_RESPONSE,
            getSchemaResponse=pb.CommandGetSchemaResponse(
                request_id=request_id,
                schema=schema,
                schema_version=schema_version,
                error_code=error_code,
                error_message=error_message,
            ),
        )
    )


def get_topics_of_namespace_response(
    request_id: int,
    topics: Iterable[str],
    *,
    filtered: bool = False,
    topics_hash: str | None = None,
    changed: bool = True,
) -> bytes:
    return _frame(
        _T(
            type=_T.GET_TOPICS_OF_NAMESPACE_RESPONSE,
            getTopicsOfNamespaceResponse=pb.CommandGetTopicsOfNamespaceResponse(
                request_id=request_id,
                topics=list(topics),
                filtered=filtered,
                topics_hash=topics_hash,
                changed=changed,
            ),
        )
    )


def consumer_stats_response(
    request_id: int,
    *,
    error_code: pb.ServerError | None = None,
    error_message: str | None = None,
    **stats: float | int | str | bool,
) -> bytes:
    """CONSUMER_STATS_RESPONSE; ``stats`` use Pulsar's field names (``msgRateOut=…, msgBacklog=…``)."""
    response = pb.CommandConsumerStatsResponse(
        request_id=request_id, error_code=error_code, error_message=error_message
    )
    for name, value in stats.items():
        setattr(response, name, value)  # AttributeError/TypeError on a name or type Pulsar does not define
    return _frame(_T(type=_T.CONSUMER_STATS_RESPONSE, consumerStatsResponse=response))


def ack_response(
    consumer_id: int, request_id: int, *, error_code: pb.ServerError | None = None, message: str | None = None
) -> bytes:
    """ACK_RESPONSE to an ACK that carried a request_id (the client's ack receipts)."""
    return _frame(
        _T(
            type=_T.ACK_RESPONSE,
            ackResponse=pb.CommandAckResponse(
                consumer_id=consumer_id, request_id=request_id, error=error_code, message=message
            ),
        )
    )


# ---- stored entries ----------------------------------------------------------------------------------------


def make_entry(metadata: bytes | pb.MessageMetadata, payload: bytes | bytearray | memoryview) -> bytes:
    """The stored entry ``[0x0e01][CRC32C][metadata size][metadata][payload]`` for serialised metadata."""
    meta = metadata if isinstance(metadata, bytes) else metadata.SerializeToString()
    body = b"".join((_U32.pack(len(meta)), meta, payload))
    return b"".join((_CHECKSUM_MAGIC_BYTES, _U32.pack(checksum(body)), body))


def _check_entry(entry: bytes | bytearray | memoryview) -> int:
    """Check the magic and sizes; return where the payload starts."""
    if len(entry) < _ENTRY_HEADER_SIZE:
        raise EntryFormatError(f"entry of {len(entry)} bytes is shorter than its header")
    if _U16.unpack_from(entry, 0)[0] != CHECKSUM_MAGIC:
        raise EntryFormatError("entry does not start with the checksum magic 0x0e01")
    (meta_size,) = _U32.unpack_from(entry, 6)
    payload_start = _ENTRY_HEADER_SIZE + meta_size
    if meta_size == 0 or payload_start > len(entry):
        raise EntryFormatError(f"metadata size {meta_size} outside [1, {len(entry) - _ENTRY_HEADER_SIZE}]")
    return payload_start


def entry_checksum_ok(entry: bytes | bytearray | memoryview) -> bool:
    """Whether the entry's CRC32C matches its contents (the magic must be present)."""
    _check_entry(entry)
    with memoryview(entry) as view:
        return checksum(view[6:]) == _U32.unpack_from(view, 2)[0]


def parse_entry(
    entry: bytes | bytearray | memoryview, *, verify_checksum: bool = True
) -> tuple[pb.MessageMetadata, memoryview]:
    """(MessageMetadata, payload) of a stored entry. Raises :class:`EntryFormatError` on a bad magic, checksum,
    size or metadata (missing required fields included)."""
    payload_start = _check_entry(entry)
    view = memoryview(entry)
    if verify_checksum and checksum(view[6:]) != _U32.unpack_from(view, 2)[0]:
        raise EntryFormatError("entry checksum mismatch")
    metadata = pb.MessageMetadata()
    try:
        metadata.ParseFromString(view[_ENTRY_HEADER_SIZE:payload_start])
    except DecodeError as e:
        raise EntryFormatError(f"unparsable MessageMetadata: {e}") from None
    if not metadata.IsInitialized():
        raise EntryFormatError(f"MessageMetadata lacks {', '.join(metadata.FindInitializationErrors())}")
    return metadata, view[payload_start:]


#: The Key_Shared key of a message without an ordering or partition key (Pulsar's).
NONE_KEY: Final = b"NONE_KEY"


def sticky_key(metadata: pb.MessageMetadata) -> bytes:
    """The key a Key_Shared subscription routes an entry by, as Pulsar's ``Commands.peekStickyKey``: the ordering
    key, else the partition key (base64-decoded when ``partition_key_b64_encoded``: a KeyValue SEPARATED key),
    else :data:`NONE_KEY`."""
    if metadata.HasField("ordering_key"):
        return metadata.ordering_key
    if metadata.HasField("partition_key"):
        if metadata.partition_key_b64_encoded:
            try:
                return base64.b64decode(metadata.partition_key, validate=True)
            except ValueError:
                pass
        return metadata.partition_key.encode()
    return NONE_KEY


def entry_message_count(metadata: pb.MessageMetadata) -> int:
    """Messages in the entry: a batch's ``num_messages_in_batch``, else 1 (what permits and backlog count)."""
    return metadata.num_messages_in_batch if metadata.HasField("num_messages_in_batch") else 1


def highest_sequence_id(sequence_id: int, highest: int | None, num_messages: int) -> int:
    """The highest sequence id a SEND (or stored entry) carries: a batch of N messages numbered from
    ``sequence_id`` ends at ``sequence_id + N - 1``. The Java client says so (``highest_sequence_id``); the
    C++-based clients send only the batch's first id, so without this a producer reopened after batches would
    be told the first id of its last batch as its last sequence id."""
    return max(sequence_id + max(num_messages, 1) - 1, sequence_id if highest is None else highest)


#: A chunk's (uuid, chunk id, chunks of its message)
Chunk = tuple[str, int, int]


def chunk_of(metadata: pb.MessageMetadata) -> Chunk | None:
    """The chunk a message's metadata says it is, or None (not a chunk of a message of several)."""
    if not metadata.HasField("chunk_id") or not metadata.HasField("num_chunks_from_msg"):
        return None
    if metadata.num_chunks_from_msg <= 1:
        return None
    return metadata.uuid, metadata.chunk_id, metadata.num_chunks_from_msg


def counts_for_dedup(metadata: pb.MessageMetadata) -> bool:
    """Whether the message's sequence id takes part in deduplication. Every chunk of a chunked message carries
    the message's sequence id: only its last chunk counts (Pulsar's rule), or the chunks after the first would
    be dropped as resends of it."""
    if not metadata.HasField("chunk_id") or not metadata.HasField("num_chunks_from_msg"):
        return True
    return metadata.chunk_id >= metadata.num_chunks_from_msg - 1


#: MessageMetadata.deliver_at_time's tag (field 19, varint) as encoded: two bytes.
_DELIVER_AT_TAG: Final = bytes([(19 << 3) & 0x7F | 0x80, (19 << 3) >> 7])


def entry_deliver_at(entry: bytes) -> int | None:
    """``deliver_at_time`` (Unix ms) of a stored entry, or None: a quick search for the field's tag, then a scan
    of the metadata fields only where it appears (most entries have no delay). Raises :class:`EntryFormatError`."""
    payload_start = _check_entry(entry)
    if entry.find(_DELIVER_AT_TAG, _ENTRY_HEADER_SIZE, payload_start) < 0:
        return None
    return _scan_varint_field(entry, _ENTRY_HEADER_SIZE, payload_start, 19)


def entry_publish_time(entry: bytes | bytearray | memoryview) -> int:
    """``publish_time`` (ms) of a stored entry, read from the metadata bytes without parsing the whole message
    and without verifying the checksum. Raises :class:`EntryFormatError`."""
    payload_start = _check_entry(entry)
    value = _scan_varint_field(entry, _ENTRY_HEADER_SIZE, payload_start, 3)
    if value is None:
        raise EntryFormatError("MessageMetadata without publish_time")
    return value


def _read_varint(data: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while pos < end and shift < 70:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise EntryFormatError("truncated or overlong varint in MessageMetadata")


def _scan_varint_field(data: bytes | bytearray | memoryview, pos: int, end: int, number: int) -> int | None:
    """The last value of varint field ``number`` in the protobuf message ``data[pos:end]`` (proto semantics:
    last one wins), or None."""
    found = None
    while pos < end:
        key, pos = _read_varint(data, pos, end)
        wire_type = key & 7
        if wire_type == 0:
            value, pos = _read_varint(data, pos, end)
            if key >> 3 == number:
                found = value
        elif wire_type == 1:
            pos += 8
        elif wire_type == 2:
            size, pos = _read_varint(data, pos, end)
            pos += size
        elif wire_type == 5:
            pos += 4
        else:
            raise EntryFormatError(f"unsupported wire type {wire_type} in MessageMetadata")
    if pos != end:
        raise EntryFormatError("MessageMetadata field runs past its end")
    return found


#: Pulsar's other compressions by their Arrow codec names: LZ4 is the raw LZ4 block format, SNAPPY raw snappy,
#: ZSTD a zstd frame (what the Java and C++ clients write). pyarrow decompresses them, imported when first needed
#: (``pip install pyarrow``; the Spark extra has it): without it they raise :class:`CompressionUnavailableError`.
ARROW_CODECS: Final[dict[int, str]] = {pb.LZ4: "lz4_raw", pb.ZSTD: "zstd", pb.SNAPPY: "snappy"}
#: The largest ``uncompressed_size`` decompressed, whatever the codec: pyarrow allocates it whole before it reads,
#: and zlib inflates as far as it is declared (a ZLIB payload of 1 MiB of zeros fills 1 GiB), on the send path
#: too (dedup's walk of a batch): a hostile declaration up to 4 GiB is refused rather than allocated
UNCOMPRESSED_MAX: Final = 256 * 1024 * 1024
#: The send path's bound (dedup's walk of a batch for its last sequence id, on the event loop): a batch of two
#: messages or more holds what fits the client's batch size (128 KiB by default), so one that declares more than
#: a ledger entry is not walked (20 MiB of zeros inflated took 67 ms): dedup keeps its first id, as for any batch
#: it cannot read
SEND_WALK_UNCOMPRESSED_MAX: Final = ENTRY_PAYLOAD_MAX
#: The largest decompression run on the event loop: more (up to ``SEND_WALK_UNCOMPRESSED_MAX`` on the send path,
#: about 17 ms of a blocked loop for 5 MiB of ZLIB) goes to a worker thread (zlib lets go of the GIL while it
#: inflates), less stays inline, where a thread's hop would cost more than the work (256 KiB inflates in about
#: 1 ms; a client's batch holds 128 KiB by default)
INFLATE_ON_LOOP_MAX: Final = 256 * 1024


def inflates_off_loop(metadata: pb.MessageMetadata, *, arrow: bool = True, limit: int | None = None) -> bool:
    """Whether decompressing the payload, as :func:`uncompressed_payload` (``arrow`` and ``limit`` as
    ``_uncompressed`` takes them) would, is work for a worker thread: pyarrow's codecs always (its first import
    too), ZLIB over :data:`INFLATE_ON_LOOP_MAX`; a payload not compressed, refused for its declared size or of a
    codec not run here costs nothing to refuse."""
    compression = metadata.compression
    size = metadata.uncompressed_size
    if compression == pb.NONE or size > (UNCOMPRESSED_MAX if limit is None else limit):
        return False
    if compression in ARROW_CODECS:
        return arrow
    return compression == pb.ZLIB and size > INFLATE_ON_LOOP_MAX


def _arrow_decompressed(compression: int, payload: bytes | bytearray | memoryview, size: int) -> bytes:
    codec = ARROW_CODECS[compression]
    name = pb.CompressionType.Name(compression)
    try:
        import pyarrow as pa
    except ImportError:
        raise CompressionUnavailableError(
            f"{name} compressed payloads need the pyarrow package, which is not installed here"
        ) from None
    data = bytes(payload)
    arrow = pa.Codec(codec)
    try:
        out = arrow.decompress(data, decompressed_size=size, asbytes=True)
        # pyarrow answers a buffer of the size asked for, whatever the payload fills of it (LZ4 and snappy; a
        # zstd frame states its size): one that decompresses into less as well, or a snappy header stating
        # another size, is shorter than it declares, and the rest of the buffer is not its data
        shorter = compression == pb.LZ4 and size > 0 and _decompresses(arrow, data, size - 1, pa)
        if compression == pb.SNAPPY and _snappy_length(data) != size:
            shorter = True
    except (OSError, ValueError, pa.ArrowException) as e:
        raise EntryFormatError(f"{name} payload does not decompress to {size} bytes: {e}") from None
    if shorter or len(out) != size:
        raise EntryFormatError(f"{name} payload does not decompress to its uncompressed_size {size}")
    return bytes(out)


def _decompresses(arrow: Any, data: bytes, size: int, pa: Any) -> bool:
    try:
        arrow.decompress(data, decompressed_size=size)
    except (OSError, ValueError, pa.ArrowException):
        return False
    return True


def _snappy_length(data: bytes) -> int:
    """The uncompressed length a snappy block states first (a little-endian base-128 varint), -1 if none."""
    n = shift = 0
    for byte in data[:5]:
        n |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return n
        shift += 7
    return -1


def _uncompressed(
    metadata: pb.MessageMetadata,
    payload: bytes | bytearray | memoryview,
    *,
    arrow: bool = True,
    limit: int | None = None,
) -> bytes | memoryview:
    compression = metadata.compression
    if compression == pb.NONE:
        return memoryview(payload)
    size = metadata.uncompressed_size
    limit = UNCOMPRESSED_MAX if limit is None else limit
    if size > limit:
        raise EntryFormatError(
            f"{pb.CompressionType.Name(compression)} payload declares {size} bytes uncompressed, over {limit}"
        )
    if arrow and compression in ARROW_CODECS:
        return _arrow_decompressed(compression, payload, size)
    if compression == pb.ZLIB:
        decompressor = zlib.decompressobj()
        try:
            # bounded by the declared size, so a hostile payload cannot inflate without limit
            out = decompressor.decompress(bytes(payload), size)
        except zlib.error as e:
            raise EntryFormatError(f"zlib payload does not decompress: {e}") from None
        if len(out) != size or decompressor.unconsumed_tail:
            raise EntryFormatError(f"zlib payload inflates to other than its uncompressed_size {size}")
        return out
    raise EntryFormatError(
        f"{pb.CompressionType.Name(compression)} compressed payloads are not supported here"
    )


def uncompressed_payload(metadata: pb.MessageMetadata, payload: bytes | bytearray | memoryview) -> bytes:
    """An entry's payload decompressed (ZLIB here, LZ4, ZSTD and SNAPPY through pyarrow: :data:`ARROW_CODECS`), a
    batch's whole frame: what Pulsar's admin answers for an entry (peek). :class:`EntryFormatError` for a payload
    that does not decompress to its ``uncompressed_size``, :class:`CompressionUnavailableError` without pyarrow."""
    return bytes(_uncompressed(metadata, payload))


def batch_last_sequence_id(
    metadata: pb.MessageMetadata, payload: bytes | bytearray | memoryview
) -> int | None:
    """The sequence id the batch's messages state last (the last message's, when each states one), None when
    none does: what ``iter_batch`` would show. Read on the send path of every batch of a client that declares
    only its first id, so one metadata object is reused and no payload is copied (half the CPU).
    :class:`EntryFormatError` as ``iter_batch`` raises it. :func:`batch_walk_off_loop` says when it is work for
    a worker thread."""
    last = None
    # the send path: pyarrow is neither imported nor run, and what a ledger entry holds at most is inflated
    data = _uncompressed(metadata, payload, arrow=False, limit=SEND_WALK_UNCOMPRESSED_MAX)
    for single, _at, _size in _batch_messages(metadata, data, pb.SingleMessageMetadata()):
        if single.HasField("sequence_id"):
            last = single.sequence_id
    return last


def batch_walk_off_loop(metadata: pb.MessageMetadata) -> bool:
    """Whether :func:`batch_last_sequence_id` of the batch inflates enough to run in a worker thread
    (:func:`inflates_off_loop` of the send path)."""
    return inflates_off_loop(metadata, arrow=False, limit=SEND_WALK_UNCOMPRESSED_MAX)


def iter_batch(
    metadata: pb.MessageMetadata, payload: bytes | bytearray | memoryview, *, arrow: bool = True
) -> Iterator[tuple[pb.SingleMessageMetadata | None, bytes]]:
    """The messages of an entry: ``(None, payload)`` once for a non-batch entry, else ``(SingleMessageMetadata,
    payload_i)`` per message of the batch. Compressed payloads are decompressed first (:func:`uncompressed_payload`,
    and its errors; ``arrow`` False: LZ4, ZSTD and SNAPPY raise :class:`EntryFormatError`, pyarrow left alone);
    sizes that overrun the payload raise :class:`EntryFormatError`."""
    data = _uncompressed(metadata, payload, arrow=arrow)
    if not metadata.HasField("num_messages_in_batch"):
        yield None, bytes(data)
        return
    with memoryview(data) as view:
        for single, at, size in _batch_messages(metadata, view, None):
            yield single, bytes(view[at : at + size])


def _batch_messages(
    metadata: pb.MessageMetadata, data: bytes | bytearray | memoryview, reuse: pb.SingleMessageMetadata | None
) -> Iterator[tuple[pb.SingleMessageMetadata, int, int]]:
    """Each message of the (inflated) batch ``data``: its metadata (parsed into ``reuse`` when given, else into a
    new object each) and the offset and size of its payload in ``data``. :class:`EntryFormatError` for a
    negative count, and for sizes or metadata that overrun or cannot be read."""
    count = metadata.num_messages_in_batch
    if count < 0:
        raise EntryFormatError(f"num_messages_in_batch {count} is negative")
    unpack = _U32.unpack_from
    with memoryview(data) as view:
        n = len(view)
        pos = 0
        for index in range(count):
            if n - pos < 4:
                raise EntryFormatError(f"batch message {index} of {count}: truncated size field")
            (meta_size,) = unpack(view, pos)
            pos += 4
            if meta_size > n - pos:
                raise EntryFormatError(
                    f"batch message {index} of {count}: metadata size {meta_size} overruns"
                )
            single = reuse if reuse is not None else pb.SingleMessageMetadata()
            try:
                single.ParseFromString(view[pos : pos + meta_size])
            except DecodeError as e:
                raise EntryFormatError(
                    f"batch message {index} of {count}: unparsable metadata: {e}"
                ) from None
            if not single.HasField("payload_size"):  # its one required field (IsInitialized costs more)
                raise EntryFormatError(f"batch message {index} of {count}: metadata lacks payload_size")
            pos += meta_size
            size = single.payload_size
            if size < 0 or size > n - pos:
                raise EntryFormatError(f"batch message {index} of {count}: payload size {size} overruns")
            yield single, pos, size
            pos += size


#: Days in 400 Gregorian years: the calendar repeats itself after them, to the weekday.
_GREGORIAN_CYCLE_DAYS: Final = 146_097


def pulsar_date(ms: int) -> str:
    """A time as Pulsar's admin writes it (``X-Pulsar-publish-time``, the stats' ``connectedSince``;
    ``DateFormatter``: ISO 8601 with its offset, milliseconds), in UTC: what pulsar-admin parses back (a bare
    number fails there). A year past 9999 is signed as Java writes it (``+55840-11-08T22:15:23.456Z``: an event
    time given in microseconds): the times are the client's, any u64, and Python's dates end at year 9999."""
    days, rest = divmod(ms, 86_400_000)
    cycles, days = divmod(days, _GREGORIAN_CYCLE_DAYS)
    t = datetime.datetime(1970, 1, 1) + datetime.timedelta(days=days, milliseconds=rest)
    year = t.year + 400 * cycles
    signed = f"{year:04d}" if 0 <= year <= 9999 else f"{year:+05d}"
    return f"{signed}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}.{rest % 1000:03d}Z"
