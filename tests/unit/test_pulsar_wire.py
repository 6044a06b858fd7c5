"""The Pulsar wire codec: frames, checksums, stored entries and batches, without sockets (one test talks to the
real pulsar-client over loopback to prove byte-level compatibility)."""

from __future__ import annotations

import asyncio
import struct
import sys
import threading
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topic_broker import pulsar_api_pb2 as pb
from topic_broker import wire

T = pb.BaseCommand


def _send_cmd(producer_id: int = 1, sequence_id: int = 0, num_messages: int | None = None) -> pb.BaseCommand:
    return T(
        type=T.SEND,
        send=pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id, num_messages=num_messages),
    )


def _metadata(sequence_id: int = 0, publish_time: int = 1_700_000_000_000, **kw: Any) -> pb.MessageMetadata:
    return pb.MessageMetadata(
        producer_name="prod-1", sequence_id=sequence_id, publish_time=publish_time, **kw
    )


def _batch_payload(items: list[tuple[str | None, bytes]]) -> bytes:
    out = bytearray()
    for key, payload in items:
        single = pb.SingleMessageMetadata(payload_size=len(payload), partition_key=key).SerializeToString()
        out += struct.pack(">I", len(single)) + single + payload
    return bytes(out)


def _stream() -> tuple[bytes, int]:
    """A stream of mixed frames and how many there are."""
    frames = [
        wire.ping(),
        wire.encode_send(_send_cmd(1, 0), _metadata(0), b"a" * 300),
        wire.success(7),
        wire.encode_send(_send_cmd(1, 1), _metadata(1), b"", with_checksum=False),
        wire.send_receipt(1, 0, 5, 0),
        wire.message(3, 5, 0, wire.make_entry(_metadata(0), b"xyz"), redelivery_count=2),
        wire.pong(),
    ]
    return b"".join(frames), len(frames)


# ---- frames ------------------------------------------------------------------------------------------------


def test_every_builder_round_trips_through_the_decoder() -> None:
    built = {
        T.CONNECTED: wire.connected("ledgerstore-0.1", 20, 1024000),
        T.PING: wire.ping(),
        T.PONG: wire.pong(),
        T.SUCCESS: wire.success(1),
        T.ERROR: wire.error(2, pb.ConsumerBusy, "busy"),
        T.PRODUCER_SUCCESS: wire.producer_success(3, "standalone-0-1"),
        T.SEND_RECEIPT: wire.send_receipt(1, 9, 10, 11, highest_sequence_id=9),
        T.SEND_ERROR: wire.send_error(1, 9, pb.ChecksumError, "bad checksum"),
        T.LOOKUP_RESPONSE: wire.lookup_response(4, broker_service_url="pulsar://127.0.0.1:6650"),
        T.PARTITIONED_METADATA_RESPONSE: wire.partitioned_metadata_response(5, 0),
        T.CLOSE_PRODUCER: wire.close_producer(1, 6),
        T.CLOSE_CONSUMER: wire.close_consumer(2, 7),
        T.ACTIVE_CONSUMER_CHANGE: wire.active_consumer_change(2, True),
        T.GET_LAST_MESSAGE_ID_RESPONSE: wire.get_last_message_id_response(8, 10, -1 & 0xFFFFFFFFFFFFFFFF),
        T.GET_SCHEMA_RESPONSE: wire.get_schema_response(9, error_code=pb.TopicNotFound, error_message="none"),
        T.GET_TOPICS_OF_NAMESPACE_RESPONSE: wire.get_topics_of_namespace_response(10, ["persistent://a/b/c"]),
        T.CONSUMER_STATS_RESPONSE: wire.consumer_stats_response(11, msgBacklog=4, consumerName="c"),
        T.ACK_RESPONSE: wire.ack_response(2, 12),
    }
    frames = wire.FrameDecoder().feed(b"".join(built.values()))
    assert [f.type for f in frames] == list(built)
    assert all(f.entry is None for f in frames)
    by_type = {f.type: f.command for f in frames}
    assert by_type[T.CONNECTED].connected.server_version == "ledgerstore-0.1"
    assert by_type[T.CONNECTED].connected.max_message_size == 1024000
    assert by_type[T.PRODUCER_SUCCESS].producer_success.last_sequence_id == -1
    assert by_type[T.SEND_RECEIPT].send_receipt.message_id.ledgerId == 10
    assert not by_type[T.SEND_RECEIPT].send_receipt.message_id.HasField("partition")
    assert by_type[T.CONSUMER_STATS_RESPONSE].consumerStatsResponse.msgBacklog == 4


def test_partitioned_metadata_response_always_sets_response() -> None:
    (ok,) = wire.FrameDecoder().feed(wire.partitioned_metadata_response(1, 0))
    assert ok.command.partitionMetadataResponse.HasField("response")
    assert ok.command.partitionMetadataResponse.response == pb.CommandPartitionedTopicMetadataResponse.Success
    assert ok.command.partitionMetadataResponse.HasField("partitions")
    (failed,) = wire.FrameDecoder().feed(wire.partitioned_metadata_response(2, error_code=pb.MetadataError))
    assert (
        failed.command.partitionMetadataResponse.response == pb.CommandPartitionedTopicMetadataResponse.Failed
    )


def test_encoder_refuses_a_command_missing_required_fields() -> None:
    from google.protobuf.message import EncodeError

    with pytest.raises(EncodeError):
        wire.encode_command(T(type=T.CONNECTED, connected=pb.CommandConnected(protocol_version=20)))


def test_send_with_checksum_is_stored_as_received() -> None:
    frame_bytes = wire.encode_send(_send_cmd(), _metadata(), b"payload")
    (frame,) = wire.FrameDecoder().feed(frame_bytes)
    assert frame.checksum_present and frame.checksum_ok
    assert frame.entry is not None and frame_bytes.endswith(frame.entry)
    assert frame.metadata.producer_name == "prod-1"
    assert bytes(frame.payload) == b"payload"


def test_send_without_checksum_gets_one_computed() -> None:
    (frame,) = wire.FrameDecoder().feed(wire.encode_send(_send_cmd(), _metadata(), b"p", with_checksum=False))
    assert not frame.checksum_present and frame.checksum_ok
    assert frame.entry == wire.make_entry(_metadata(), b"p")
    assert wire.entry_checksum_ok(frame.entry)


def test_checksum_mismatch_is_reported_not_raised() -> None:
    data = bytearray(wire.encode_send(_send_cmd(), _metadata(), b"payload"))
    data[-1] ^= 0xFF
    (frame,) = wire.FrameDecoder().feed(bytes(data))
    assert frame.checksum_present and not frame.checksum_ok
    assert frame.entry is not None
    with pytest.raises(wire.EntryFormatError, match="checksum"):
        wire.parse_entry(frame.entry)


def test_message_frame_carries_the_entry_unchanged() -> None:
    entry = wire.make_entry(_metadata(5), b"stored")
    data = wire.message(9, 100, 7, entry, redelivery_count=1, partition=2)
    assert data.endswith(entry)
    (frame,) = wire.FrameDecoder().feed(data)
    assert frame.entry == entry and frame.checksum_ok
    assert frame.command.message.redelivery_count == 1
    assert frame.command.message.message_id.partition == 2


def test_message_with_broker_entry_metadata_is_decoded() -> None:
    entry = wire.make_entry(_metadata(), b"x")
    bem = pb.BrokerEntryMetadata(broker_timestamp=5, index=6).SerializeToString()
    cmd = T(
        type=T.MESSAGE,
        message=pb.CommandMessage(consumer_id=1, message_id=pb.MessageIdData(ledgerId=1, entryId=2)),
    )
    body = cmd.SerializeToString()
    rest = struct.pack(">HI", wire.BROKER_ENTRY_METADATA_MAGIC, len(bem)) + bem + entry
    data = struct.pack(">II", 4 + len(body) + len(rest), len(body)) + body + rest
    (frame,) = wire.FrameDecoder().feed(data)
    assert frame.entry == entry and frame.broker_entry_metadata == bem


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1000])
def test_any_chunking_gives_the_same_frames(chunk: int) -> None:
    stream, count = _stream()
    decoder = wire.FrameDecoder()
    frames = []
    for i in range(0, len(stream), chunk):
        frames += decoder.feed(stream[i : i + chunk])
    assert len(frames) == count and decoder.buffered == 0
    assert frames == wire.FrameDecoder().feed(stream)


def test_every_split_point_of_a_stream() -> None:
    stream, count = _stream()
    whole = wire.FrameDecoder().feed(stream)
    for cut in range(len(stream) + 1):
        decoder = wire.FrameDecoder()
        frames = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert frames == whole, cut
        assert decoder.buffered == 0


def _frame(body: bytes, total: int | None = None, cmd_size: int | None = None, rest: bytes = b"") -> bytes:
    cmd_size = len(body) if cmd_size is None else cmd_size
    total = 4 + len(body) + len(rest) if total is None else total
    return struct.pack(">II", total, cmd_size) + body + rest


_PING_BODY = T(type=T.PING, ping=pb.CommandPing()).SerializeToString()
_SEND_BODY = _send_cmd().SerializeToString()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (struct.pack(">I", 6 * 1024 * 1024), "frame size"),
        (struct.pack(">I", 2) + b"\0\0", "frame size"),
        (_frame(_PING_BODY, cmd_size=len(_PING_BODY) + 1, total=4 + len(_PING_BODY)), "command size"),
        (_frame(b"\xff\xff\xff"), "unparsable"),
        (_frame(b"\x08\x63"), "without a known type"),  # type 99: not a command we know
        (_frame(T(type=T.PING).SerializeToString()), "without its ping"),
        (_frame(T(type=T.PING, pong=pb.CommandPong()).SerializeToString()), "without its ping"),
        (_frame(b"\x08\x06\x32\x02\x08\x01"), "lacks required"),  # SEND with producer_id only
        (_frame(_SEND_BODY), "without a payload"),
        (_frame(_PING_BODY, rest=b"\0\0\0\0"), "bytes after the command"),
        (_frame(_SEND_BODY, rest=b"\0\0"), "shorter than"),
        (_frame(_SEND_BODY, rest=b"\0\0\0\x09abc"), "metadata size"),
        (_frame(_SEND_BODY, rest=b"\0\0\0\0"), "metadata size"),
    ],
)
def test_malformed_frames_raise_frame_error(data: bytes, reason: str) -> None:
    decoder = wire.FrameDecoder()
    with pytest.raises(wire.FrameError, match=reason):
        decoder.feed(data)
    assert decoder.broken
    with pytest.raises(wire.FrameError):
        decoder.feed(wire.ping())


def test_oversize_frame_is_refused_before_it_is_buffered() -> None:
    decoder = wire.FrameDecoder(max_frame_size=1024)
    with pytest.raises(wire.FrameError, match="frame size"):
        decoder.feed(struct.pack(">I", 1025))


def test_truncated_frame_waits_for_more() -> None:
    data = wire.encode_send(_send_cmd(), _metadata(), b"x" * 100)
    decoder = wire.FrameDecoder()
    assert decoder.feed(data[:-1]) == []
    assert decoder.buffered == len(data) - 1
    assert len(decoder.feed(data[-1:])) == 1


def test_unknown_fields_from_newer_clients_parse() -> None:
    body = T(type=T.PING, ping=pb.CommandPing()).SerializeToString() + b"\xa8\x06\x01"  # field 101, varint
    (frame,) = wire.FrameDecoder().feed(_frame(body))
    assert frame.type == T.PING


def test_large_frame_fed_in_small_chunks_is_linear() -> None:
    data = wire.encode_send(_send_cmd(), _metadata(), b"z" * (4 * 1024 * 1024))
    decoder = wire.FrameDecoder()
    frames = []
    for i in range(0, len(data), 4096):
        frames += decoder.feed(data[i : i + 4096])
    assert len(frames) == 1 and frames[0].checksum_ok


# ---- entries and batches -----------------------------------------------------------------------------------


def test_entry_round_trip_and_publish_time() -> None:
    entry = wire.make_entry(_metadata(3, publish_time=42, event_time=7), b"body")
    metadata, payload = wire.parse_entry(entry)
    assert (metadata.sequence_id, metadata.publish_time, bytes(payload)) == (3, 42, b"body")
    assert wire.entry_publish_time(entry) == 42
    assert wire.entry_message_count(metadata) == 1
    assert list(wire.iter_batch(metadata, payload)) == [(None, b"body")]


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda e: b"\x0e\x02" + e[2:], "magic"),
        (lambda e: e[:5], "shorter"),
        (lambda e: e[:6] + b"\xff\xff\xff\xff" + e[10:], "metadata size"),
        (lambda e: e[:-1] + bytes([e[-1] ^ 1]), "checksum"),
    ],
)
def test_bad_entries_raise_entry_format_error(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(wire.EntryFormatError, match=reason):
        wire.parse_entry(mutate(wire.make_entry(_metadata(), b"body")))


def test_entry_with_unparsable_metadata_raises() -> None:
    with pytest.raises(wire.EntryFormatError, match="MessageMetadata"):
        wire.parse_entry(wire.make_entry(b"\x0a\x05ab", b""))
    with pytest.raises(wire.EntryFormatError, match="lacks"):
        wire.parse_entry(
            wire.make_entry(pb.MessageMetadata(producer_name="p").SerializePartialToString(), b"")
        )


def test_batch_unpacks_in_order() -> None:
    items = [("k1", b"one"), (None, b""), ("k3", b"three" * 10)]
    metadata = _metadata(num_messages_in_batch=3)
    entry = wire.make_entry(metadata, _batch_payload(items))
    parsed, payload = wire.parse_entry(entry)
    assert wire.entry_message_count(parsed) == 3
    out = list(wire.iter_batch(parsed, payload))
    assert [p for _, p in out] == [p for _, p in items]
    assert [s.partition_key if s and s.HasField("partition_key") else None for s, _ in out] == [
        "k1",
        None,
        "k3",
    ]


def test_zlib_batch_is_inflated() -> None:
    raw = _batch_payload([("a", b"x" * 100), ("b", b"y")])
    metadata = _metadata(num_messages_in_batch=2, compression=pb.ZLIB, uncompressed_size=len(raw))
    out = list(wire.iter_batch(metadata, zlib.compress(raw)))
    assert [p for _, p in out] == [b"x" * 100, b"y"]
    lying = _metadata(num_messages_in_batch=2, compression=pb.ZLIB, uncompressed_size=10)
    with pytest.raises(wire.EntryFormatError, match="uncompressed_size"):
        list(wire.iter_batch(lying, zlib.compress(raw)))


def test_a_zlib_payload_declaring_more_than_the_bound_is_refused_uninflated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """zlib inflates as far as ``uncompressed_size`` says (up to 4 GiB; 1 MiB of zeros fills 1 GiB): past
    :data:`wire.UNCOMPRESSED_MAX` it is refused, as the other codecs' payloads are."""
    monkeypatch.setattr(wire, "UNCOMPRESSED_MAX", 1000)  # the bound, made small for the test
    for size, refused in ((1000, False), (1001, True)):
        raw = _batch_payload([("a", bytes(size - 20)), ("b", b"y")])
        raw += bytes(size - len(raw))
        metadata = _metadata(num_messages_in_batch=2, compression=pb.ZLIB, uncompressed_size=size)
        for walk in (wire.uncompressed_payload, wire.iter_batch):
            if refused:
                with pytest.raises(wire.EntryFormatError, match="over 1000"):
                    list(walk(metadata, zlib.compress(raw)))
            else:
                list(walk(metadata, zlib.compress(raw)))


def test_the_send_path_walks_no_batch_declaring_more_than_a_ledger_entry() -> None:
    """Dedup's walk of a batch for its last id runs on the event loop: a ZLIB batch declaring more than a ledger
    entry (``SEND_WALK_UNCOMPRESSED_MAX``) is not inflated there, and dedup keeps its first id; peek and the
    Spark source still decompress it."""
    size = wire.SEND_WALK_UNCOMPRESSED_MAX + 1
    raw = _batch_payload([("a", bytes(size - 40)), ("b", b"y")])
    raw += bytes(size - len(raw))
    metadata = _metadata(num_messages_in_batch=2, compression=pb.ZLIB, uncompressed_size=size)
    packed = zlib.compress(raw)
    with pytest.raises(wire.EntryFormatError, match=f"over {wire.SEND_WALK_UNCOMPRESSED_MAX}"):
        wire.batch_last_sequence_id(metadata, packed)
    assert len(wire.uncompressed_payload(metadata, packed)) == size


def test_what_decompresses_off_the_event_loop() -> None:
    """pyarrow's codecs (unless not run, as on the send path) and ZLIB past ``INFLATE_ON_LOOP_MAX`` go to a
    worker thread; what is not compressed, a small ZLIB payload and a declared size refused go nowhere."""
    bound = wire.INFLATE_ON_LOOP_MAX
    assert not wire.inflates_off_loop(_metadata(uncompressed_size=bound + 1))  # not compressed
    assert not wire.inflates_off_loop(_metadata(compression=pb.ZLIB, uncompressed_size=bound))
    assert wire.inflates_off_loop(_metadata(compression=pb.ZLIB, uncompressed_size=bound + 1))
    assert not wire.inflates_off_loop(
        _metadata(compression=pb.ZLIB, uncompressed_size=wire.UNCOMPRESSED_MAX + 1)
    )
    assert wire.inflates_off_loop(_metadata(compression=pb.LZ4, uncompressed_size=10))
    assert not wire.inflates_off_loop(_metadata(compression=pb.LZ4, uncompressed_size=10), arrow=False)
    walked = _metadata(num_messages_in_batch=2, compression=pb.ZLIB, uncompressed_size=bound + 1)
    assert wire.batch_walk_off_loop(walked)
    walked.uncompressed_size = wire.SEND_WALK_UNCOMPRESSED_MAX + 1  # refused before any inflation
    assert not wire.batch_walk_off_loop(walked)


def test_truncated_batch_raises() -> None:
    raw = _batch_payload([("a", b"abc"), ("b", b"def")])
    with pytest.raises(wire.EntryFormatError, match="batch message 1"):
        list(wire.iter_batch(_metadata(num_messages_in_batch=2), raw[:-1]))
    with pytest.raises(wire.EntryFormatError, match="batch message 2"):
        list(wire.iter_batch(_metadata(num_messages_in_batch=3), raw))


@pytest.mark.parametrize("compression", [pb.LZ4, pb.ZSTD, pb.SNAPPY])
def test_lz4_zstd_and_snappy_batches_are_decompressed_with_pyarrow(compression: int) -> None:
    pa = pytest.importorskip("pyarrow")
    raw = _batch_payload([("a", b"x" * 100), ("b", b"y")])
    packed = pa.Codec(wire.ARROW_CODECS[compression]).compress(raw, asbytes=True)
    metadata = _metadata(num_messages_in_batch=2, compression=compression, uncompressed_size=len(raw))
    assert [p for _, p in wire.iter_batch(metadata, packed)] == [b"x" * 100, b"y"]
    assert wire.uncompressed_payload(metadata, packed) == raw
    name = pb.CompressionType.Name(compression)
    for size in (len(raw) - 1, len(raw) + 1):  # a declared size the payload does not decompress to
        lying = _metadata(num_messages_in_batch=2, compression=compression, uncompressed_size=size)
        with pytest.raises(wire.EntryFormatError, match=name):
            wire.uncompressed_payload(lying, packed)
    with pytest.raises(wire.EntryFormatError, match=name):
        wire.uncompressed_payload(_metadata(compression=compression, uncompressed_size=3), b"\xff\xfe\xfd")
    huge = _metadata(compression=compression, uncompressed_size=wire.UNCOMPRESSED_MAX + 1)
    with pytest.raises(wire.EntryFormatError, match="over"):  # refused, not allocated
        wire.uncompressed_payload(huge, packed)
    # the send path's walk for the last sequence id neither imports nor runs pyarrow
    with pytest.raises(wire.EntryFormatError, match="not supported here"):
        wire.batch_last_sequence_id(metadata, packed)


def test_lz4_without_pyarrow_names_the_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow then raises ImportError
    with pytest.raises(wire.CompressionUnavailableError, match="pyarrow"):
        wire.uncompressed_payload(_metadata(compression=pb.LZ4, uncompressed_size=3), b"abc")


# ---- properties --------------------------------------------------------------------------------------------

_payloads = st.binary(max_size=2048)


@settings(max_examples=200, deadline=None)
@given(
    sends=st.lists(st.tuples(_payloads, st.booleans(), st.integers(0, 2**63)), min_size=1, max_size=6),
    cuts=st.lists(st.integers(0, 20000), max_size=8),
)
def test_property_sends_survive_any_split(sends: list[tuple[bytes, bool, int]], cuts: list[int]) -> None:
    stream = b"".join(
        wire.encode_send(_send_cmd(1, i), _metadata(seq), payload, with_checksum=checked)
        for i, (payload, checked, seq) in enumerate(sends)
    )
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    decoder = wire.FrameDecoder()
    frames = []
    for a, b in zip(points, points[1:], strict=False):
        frames += decoder.feed(stream[a:b])
    assert len(frames) == len(sends)
    for frame, (payload, checked, seq) in zip(frames, sends, strict=True):
        assert frame.checksum_ok and frame.checksum_present == checked
        assert frame.metadata.sequence_id == seq and bytes(frame.payload) == payload
        assert frame.entry is not None and wire.entry_checksum_ok(frame.entry)


@settings(max_examples=200, deadline=None)
@given(
    items=st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=20)), _payloads), min_size=1, max_size=20)
)
def test_property_batches_round_trip(items: list[tuple[str | None, bytes]]) -> None:
    entry = wire.make_entry(_metadata(num_messages_in_batch=len(items)), _batch_payload(items))
    metadata, payload = wire.parse_entry(entry)
    assert [p for _, p in wire.iter_batch(metadata, payload)] == [p for _, p in items]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_property_garbage_raises_only_frame_error(data: bytes) -> None:
    decoder = wire.FrameDecoder(max_frame_size=4096)
    try:
        decoder.feed(data)
    except wire.FrameError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    publish_time=st.integers(0, 2**64 - 1), props=st.dictionaries(st.text(max_size=5), st.text(max_size=5))
)
def test_property_publish_time_scan_matches_parse(publish_time: int, props: dict[str, str]) -> None:
    metadata = _metadata(
        publish_time=publish_time, properties=[pb.KeyValue(key=k, value=v) for k, v in props.items()]
    )
    assert wire.entry_publish_time(wire.make_entry(metadata, b"")) == publish_time


# ---- the real client ---------------------------------------------------------------------------------------


def test_real_pulsar_client_connect_parses_and_accepts_connected() -> None:
    """The official client's CONNECT decodes; it accepts our CONNECTED and asks for partition metadata next."""
    pulsar = pytest.importorskip("pulsar")
    received: list[wire.Frame] = []
    done = threading.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = wire.FrameDecoder()
        try:
            while not done.is_set():
                data = await reader.read(65536)
                if not data:
                    return
                for frame in decoder.feed(data):
                    received.append(frame)
                    if frame.type == T.CONNECT:
                        writer.write(
                            wire.connected("ledgerstore-test", frame.command.connect.protocol_version)
                        )
                    elif frame.type == T.PARTITIONED_METADATA:
                        done.set()
                        writer.write(
                            wire.partitioned_metadata_response(
                                frame.command.partitionMetadata.request_id,
                                error_code=pb.ServiceNotReady,
                                message="test broker",
                            )
                        )
                await writer.drain()
        finally:
            writer.close()

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    client = pulsar.Client(
        f"pulsar://127.0.0.1:{port}", operation_timeout_seconds=3, connection_timeout_ms=3000
    )
    try:
        with pytest.raises(Exception):  # noqa: B017 - the test broker refuses the lookup
            client.create_producer("my-topic")
    finally:
        client.close()
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    assert received and received[0].type == T.CONNECT
    connect = received[0].command.connect
    assert connect.protocol_version >= 12
    assert connect.client_version
    lookups = [f for f in received if f.type == T.PARTITIONED_METADATA]
    assert lookups and lookups[0].command.partitionMetadata.topic == "persistent://public/default/my-topic"


def test_the_largest_message_announced_fits_a_ledger_entry_with_its_headers() -> None:
    from ledger_client.send_path import _PAYLOAD_MAX

    assert wire.DEFAULT_MAX_MESSAGE_SIZE + wire.FRAME_PADDING_SIZE <= _PAYLOAD_MAX


@pytest.mark.parametrize(
    ("chunk", "counts"),
    [(None, True), ((0, 3), False), ((1, 3), False), ((2, 3), True), ((0, 1), True)],
)
def test_only_the_last_chunk_of_a_message_counts_for_dedup(
    chunk: tuple[int, int] | None, counts: bool
) -> None:
    md = pb.MessageMetadata(producer_name="p", sequence_id=7, publish_time=1)
    if chunk is not None:
        md.chunk_id, md.num_chunks_from_msg = chunk
    assert wire.counts_for_dedup(md) is counts


def test_a_batch_without_highest_sequence_id_ends_at_its_first_id_plus_its_count() -> None:
    assert wire.highest_sequence_id(9000, None, 1000) == 9999  # the C++ client's batch
    assert wire.highest_sequence_id(9000, 9999, 1000) == 9999  # the Java client's
    assert wire.highest_sequence_id(5, None, 1) == 5
    assert wire.highest_sequence_id(5, 3, 1) == 5  # never below the first id


def test_deliver_at_is_read_from_a_stored_entry_without_parsing_it() -> None:
    md = pb.MessageMetadata(
        producer_name="p\x98\x01", sequence_id=1, publish_time=2
    )  # the tag's bytes, in a name
    assert wire.entry_deliver_at(wire.make_entry(md, b"x")) is None
    md.deliver_at_time = 1_700_000_000_123
    assert wire.entry_deliver_at(wire.make_entry(md, b"x")) == 1_700_000_000_123
