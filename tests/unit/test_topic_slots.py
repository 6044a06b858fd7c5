"""``Topic`` keeps the attributes its methods set in its slots: the send and dispatch paths read them for every
entry, and one left out lives in the instance's ``__dict__``, a dict lookup at every access (``Topic`` keeps a
``__dict__`` so that one left out still works, which no other test would notice)."""

from __future__ import annotations

import ast
import inspect
import textwrap

from topic_broker.service import Topic


def _attributes_set(cls: type) -> set[str]:
    """The ``self.<name>`` the class's methods assign (plain, annotated or augmented assignments)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for t in ast.walk(target):
                # (stored, not read: ``self._skipped_ranges(name)[:] = …`` sets no attribute)
                stored = isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)
                if stored and isinstance(t.value, ast.Name) and t.value.id == "self":  # type: ignore[attr-defined]
                    out.add(t.attr)  # type: ignore[attr-defined]
    return out


def test_every_attribute_a_topic_sets_is_one_of_its_slots() -> None:
    """The chunk tracking's ``open_chunks`` (read at every SEND) and ``orphans`` (at every entry dispatched) went
    to the instance dict: they were added beside the slotting of the class, not in its list."""
    missing = _attributes_set(Topic) - set(Topic.__slots__)
    assert missing == set(), f"Topic attributes not in Topic.__slots__: {sorted(missing)}"
