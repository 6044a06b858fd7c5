"""Every status the admin answers an error with is in its error lists: the module docstring of
``topic_broker/admin.py`` and docs/broker.md's "Errors are JSON" paragraph (405 and 422 were in neither)."""

from __future__ import annotations

import re
from pathlib import Path

import topic_broker.admin as admin

REPO = Path(__file__).resolve().parents[2]


def _answered() -> set[str]:
    source = Path(admin.__file__).read_text()
    return set(re.findall(r"(?:AdminError|_error)\(\s*([45]\d\d)\b", source))


def test_the_admin_answers_the_statuses_looked_for() -> None:
    assert {"400", "404", "405", "409", "412", "422", "500", "503"} <= _answered()


def test_each_error_status_is_in_the_module_docstring() -> None:
    assert admin.__doc__ is not None
    missing = sorted(s for s in _answered() if not re.search(rf"\b{s}\b", admin.__doc__))
    assert missing == []


def test_each_error_status_is_in_the_broker_docs_error_list() -> None:
    text = (REPO / "docs" / "broker.md").read_text()
    start = text.index("Errors are JSON")
    paragraph = text[start : text.index("\n\n", start)]
    missing = sorted(s for s in _answered() if not re.search(rf"\b{s}\b", paragraph))
    assert missing == []
