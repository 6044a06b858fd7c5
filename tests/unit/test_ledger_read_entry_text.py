"""``ledger read``'s text output puts one entry on one line whatever its bytes (dc970e2): no character that
str.splitlines ends a line at (the C0 and C1 ones, and the Unicode line and paragraph separators) is left in it."""

from __future__ import annotations

from ledgerstore.ledger_cmd import entry_text

# every character str.splitlines splits at (its documented table)
LINE_BOUNDARIES = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def test_no_line_boundary_is_left_in_an_entrys_text() -> None:
    for ch in LINE_BOUNDARIES:
        data = f"a{ch}b".encode()
        text = entry_text(data)
        assert len(text.splitlines()) == 1, (ch, text)
    assert entry_text("a\u2028b\u2029c".encode()) == "a\\u2028b\\u2029c"
    assert entry_text("héllo\tw\xff".encode() + b"\xff") == "héllo\\tw\xff\\xff"
