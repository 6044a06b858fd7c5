"""docs/cli.md is generated from the parser (ledgerstore/cli_docs.py) and must be current."""

from __future__ import annotations

from ledgerstore import cli_docs


def test_cli_reference_is_current() -> None:
    committed = cli_docs.DOC_PATH.read_text(encoding="utf-8") if cli_docs.DOC_PATH.exists() else ""
    assert committed == cli_docs.render(), (
        f"docs/cli.md is stale: the parser changed. Refresh it with `{cli_docs.REFRESH}` and commit it."
    )
