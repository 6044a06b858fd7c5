"""Tests for the bugs planted in the audit of 2026-11-29 against f2903da that the tests of the time let through
(docs/architecture.md §11, "The planted-bug audit of the SEND checks, the producer-name liveness check, topic
stats, the admin's new routes and headers, and the Spark source's encryption and password hand-over"): each fails
with its bug planted and passes without it. No broker, bookie or Spark: sockets on loopback at most."""

from __future__ import annotations

from aiohttp.http_writer import _serialize_headers
from multidict import CIMultiDict

from topic_broker.admin import sanitised_headers

#: Every character below space but tab, and DEL: what aiohttp refuses to write in a header
CONTROLS = [chr(c) for c in (*range(0x09), *range(0x0A, 0x20), 0x7F)]


def test_a_header_value_holding_any_control_character_is_written_as_spaces() -> None:
    """A property value (a producer name, a key) with an ANSI colour (ESC), a NUL or DEL is examined, not
    answered 500: aiohttp refuses every control character but tab in a header, CR and LF were not the only ones."""
    value = "red:\x1b[31mx\x1b[0m " + "".join(CONTROLS) + "\tend"
    out = sanitised_headers(CIMultiDict({"X-Pulsar-PROPERTY-log": value}))
    assert out["X-Pulsar-PROPERTY-log"] == "red: [31mx [0m " + " " * len(CONTROLS) + "\tend"
    _serialize_headers("HTTP/1.1 200 OK", out)  # what aiohttp does when it answers: raised ValueError
