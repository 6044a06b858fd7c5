"""Contracts of the repository itself: the design document's references resolve, nothing points outside the
repository, the lower packages never import the ones built on top of them or the test helpers, and the import
contracts ``lint-imports`` checks cover every package (docs/architecture.md §2)."""

from __future__ import annotations

import ast
import configparser
import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
SKIP_DIRS = {".venv", ".git", "__pycache__", "node_modules", "build", "dist"}

#: ``docs/architecture.md §8``, ``… §5/§6``, ``… §10.3``; ``docs/architecture.md invariant 5``.
SECTION_REF = re.compile(r"docs/architecture\.md\s+(§\d+(?:\.\d+)?(?:\s*/\s*§\d+(?:\.\d+)?)*)")
INVARIANT_REF = re.compile(r"docs/architecture\.md\s+invariants?\s+(\d+)")
#: The design document the repository no longer depends on, and the directory it came from. Spelled in pieces
#: so that this file does not match itself.
OUTSIDE_REF = re.compile(
    "|".join(
        (
            "ARCHITECTURE" + r"(?:\.md)?\s*(?:§|section\b|invariant\b)",
            r"\.\./" + "shared",
            "/work/" + "shared",
        )
    )
)


def _text_files() -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
        for name in filenames:
            if name.endswith((".py", ".md")):
                yield Path(dirpath) / name


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _sections() -> tuple[set[int], set[int]]:
    """The numbered sections of docs/architecture.md and the numbered invariants of its §10."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    sections = {int(m) for m in re.findall(r"^## (\d+)\. ", text, re.MULTILINE)}
    start = re.search(r"^## 10\. ", text, re.MULTILINE)
    end = re.search(r"^## 11\. ", text, re.MULTILINE)
    assert start and end, "docs/architecture.md lost its §10 or §11 heading"
    invariants = {int(m) for m in re.findall(r"^(\d+)\. ", text[start.end() : end.start()], re.MULTILINE)}
    return sections, invariants


def test_architecture_keeps_its_section_and_invariant_numbering() -> None:
    sections, invariants = _sections()
    assert sections == set(range(1, 12))
    assert invariants == set(range(1, 11))


def test_every_reference_to_the_architecture_names_an_existing_section() -> None:
    sections, invariants = _sections()
    bad = []
    for path in _text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in SECTION_REF.finditer(text):
            for ref in re.findall(r"§(\d+)(?:\.(\d+))?", m.group(1)):
                section, sub = int(ref[0]), ref[1]
                # §10.n names invariant n of §10.
                if section not in sections or (sub and (section != 10 or int(sub) not in invariants)):
                    bad.append(f"{_rel(path)}: {m.group(0)}")
        for m in INVARIANT_REF.finditer(text):
            if int(m.group(1)) not in invariants:
                bad.append(f"{_rel(path)}: {m.group(0)}")
    assert not bad, "references to sections docs/architecture.md does not have:\n" + "\n".join(bad)


def test_no_file_refers_to_documents_outside_the_repository() -> None:
    found = []
    for path in _text_files():
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE_REF.search(line):
                found.append(f"{_rel(path)}:{lineno}: {line.strip()}")
    assert not found, "cite docs/architecture.md instead:\n" + "\n".join(found)


LOWER_PACKAGES = ("ledger_client", "bookie", "zk")
UPPER_PACKAGES = frozenset({"ledgerstore", "topic_broker", "spark", "autorecovery", "tests"})


def _imported_modules(path: Path) -> Iterator[str]:
    """Every absolute module an import statement anywhere in the file names (function bodies included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            # ``from ledgerstore import cli`` imports ledgerstore.cli
            yield from (f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")


def _upward_imports() -> set[tuple[str, str]]:
    found = set()
    for package in LOWER_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for module in _imported_modules(path):
                if module.split(".")[0] in UPPER_PACKAGES:
                    found.add((_rel(path), module))
    return found


def test_lower_packages_never_import_the_packages_built_on_them() -> None:
    bad = sorted(_upward_imports())
    assert not bad, f"{', '.join(LOWER_PACKAGES)} must not import {', '.join(sorted(UPPER_PACKAGES))}: {bad}"


def test_the_import_contracts_cover_every_package_the_project_ships() -> None:
    """Every package of setup.cfg's ``packages.find`` is a root package of ``.importlinter`` and sits in its
    layers contract, so a new package cannot escape the layering that ``lint-imports`` checks."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg", encoding="utf-8")
    shipped = {p for p in setup["options.packages.find"]["include"].split() if "*" not in p}
    contracts = configparser.ConfigParser()
    contracts.read(ROOT / ".importlinter", encoding="utf-8")
    roots = set(contracts["importlinter"]["root_packages"].split())
    layered = set(re.split(r"[\s|:]+", contracts["importlinter:contract:layers"]["layers"])) - {""}
    assert shipped and shipped == roots == layered, (shipped, roots, layered)
