"""``docs/cli.md`` from the parser itself, so the reference cannot drift from the command.

``scripts/gen-cli-docs.py`` writes it; ``tests/unit/test_cli_docs.py`` fails when the committed file is not what
:func:`render` gives. The parser is built with every ``LEDGERSTORE_*`` variable unset and a fixed terminal width,
so the page does not depend on who generates it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from ledgerstore import cli

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
REFRESH = "python scripts/gen-cli-docs.py"
_ENV = re.compile(r"\$?\b(LEDGERSTORE_[A-Z0-9_]+(?:\[_[A-Z]+\])?)")


@contextlib.contextmanager
def _clean_environment() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith("LEDGERSTORE_") or k == "COLUMNS"}
    for k in saved:
        del os.environ[k]
    os.environ["COLUMNS"] = "100"
    try:
        yield
    finally:
        os.environ.pop("COLUMNS", None)
        os.environ.update(saved)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    d = action.default
    if (
        d is None
        or d is argparse.SUPPRESS
        or action.nargs == 0
        or d == []
        or "default" in (action.help or "")
    ):
        return ""
    return f"`{d}`"


def _env(action: argparse.Action, config_settings: set[str]) -> str:
    names = list(dict.fromkeys(_ENV.findall(action.help or "")))
    if action.dest in config_settings:
        names.append("LEDGERSTORE_" + action.dest.upper())
    return ", ".join(f"`{n}`" for n in dict.fromkeys(names))


def _arguments(p: argparse.ArgumentParser, *, top: bool) -> list[str]:
    fmt = argparse.HelpFormatter(p.prog)
    settings = {getattr(s, "name", "") for s in p._defaults.get("_config_settings", ())}
    rows = []
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction | argparse._HelpAction) or a.help == argparse.SUPPRESS:
            continue
        if not top and a.option_strings and a.option_strings[0] in cli.GLOBAL_OPTIONS:
            continue  # the global options: once, at the top
        names = ", ".join(f"`{s}`" for s in a.option_strings) if a.option_strings else f"`{a.dest}`"
        if a.option_strings and a.nargs != 0:
            names += f" {a.metavar or a.dest.upper()}"
        if a.required:
            names += " (required)"
        text = fmt._expand_help(a) if a.help else ""
        if a.choices is not None and not isinstance(a, argparse._SubParsersAction):
            text += f" (one of: {', '.join(map(str, a.choices))})"
        rows.append(f"| {names} | {_cell(text)} | {_default(a)} | {_env(a, settings)} |")
    if not rows:
        return []
    return ["| argument | what | default | environment |", "|---|---|---|---|", *rows, ""]


def render() -> str:
    with _clean_environment():
        parser = cli.build_parser()
        out = [
            "# `ledgerstore` command reference",
            "",
            f"Generated from the parser by `scripts/gen-cli-docs.py`; do not edit by hand. Refresh with `{REFRESH}`",
            "(a test fails while this page and the parser disagree). Design: [architecture.md](architecture.md) §3.",
            "",
            "## Conventions",
            "",
            "- **Global options** `--zk`, `--zk-root`, `--json`, `-v/--verbose`, `--auth-token-file` are accepted",
            "  before or after the subcommand (`ledgerstore --json ledger list` = `ledgerstore ledger list --json`).",
            f"- **Defaults and environment**: `--zk` defaults to `$LEDGERSTORE_ZK` or `{cli.DEFAULT_ZK}`, `--zk-root` to",
            f"  `$LEDGERSTORE_ZK_ROOT` or `{cli.DEFAULT_ZK_ROOT}`; each command's table names the variables its flags read.",
            "  A flag given on the command line beats its variable.",
            "- **Output**: human text by default; `--json` prints one JSON document on stdout. With `--json` an error",
            "  is a JSON document on **stdout** too, so a pipe into `jq` always reads JSON and the exit status tells",
            '  success from failure: `{"error": {"code": "NO_SUCH_LEDGER", "message": "...", "exit_status": 4}}`.',
            "  `code` is the stable code of our error hierarchies (`ledger_client/errors.py`, `zk/errors.py`), `HTTP_<n>`",
            "  for an admin API's error status, or the exit status's name below. Without `--json`, errors are one line",
            "  on stderr (`-v` adds a traceback for unexpected ones).",
            "- **Pipes**: a reader that goes away (`ledgerstore ledger list | head -1`) ends the command quietly, status 0.",
            "- **Progress bars** are drawn on stderr only when it is a terminal, never into pipes, files or logs.",
            "- **Passwords**: every verb that takes `--password` also takes `--password-file FILE` and reads",
            f"  `${cli.PASSWORD_ENV}` when neither is given, so a password need not be visible in `ps`.",
            "",
            "## Exit status",
            "",
            "| status | name | meaning |",
            "|---|---|---|",
            *(f"| {n} | `{name}` | {_cell(text)} |" for n, (name, text) in sorted(cli.EXIT_CODES.items())),
            "",
            "Errors map onto them by code: `NO_SUCH_LEDGER`, `NO_SUCH_ENTRY`, `METADATA_NOT_FOUND`, HTTP 404: not found;",
            "`BOOKIE_UNAVAILABLE`, `NOT_ENOUGH_BOOKIES`, `TIMEOUT`, `TOO_MANY_REQUESTS`, `METADATA_STORE`,",
            "`METADATA_CONNECTION`, `METADATA_SESSION_EXPIRED`, HTTP 502/503/504, a refused connection: unavailable;",
            "`UNAUTHORIZED`, `METADATA_AUTH`, HTTP 401/403: unauthorized; `ZK_CONNECT_STRING` (a `--zk` or",
            "`$LEDGERSTORE_ZK` that is not `HOST:PORT[,HOST:PORT...]`): usage; any other code: 1.",
            "",
            "## Commands",
            "",
        ]
        for p, text in cli.walk_parsers(parser):
            out.append(f"{'#' * min(3 + p.prog.count(' ') - 1, 6) if p is not parser else '###'} `{p.prog}`")
            out.append("")
            about = text or p.description
            if about:
                out += [_cell(about), ""]
            subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
            for s in subs:
                out += ["| command | what |", "|---|---|"]
                out += [f"| `{p.prog} {c.dest}` | {_cell(c.help or '')} |" for c in s._choices_actions]
                out.append("")
            if not subs or p is parser:
                out += _arguments(p, top=p is parser)
        return "\n".join(out).rstrip() + "\n"


def main() -> int:
    DOC_PATH.write_text(render(), encoding="utf-8")
    print(f"wrote {DOC_PATH}")
    return 0
