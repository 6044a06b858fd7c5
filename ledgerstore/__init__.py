"""The ``ledgerstore`` command and its verbs (docs/architecture.md §3).

``__version__`` has one source, the package metadata (``version`` in ``setup.cfg``); a source tree that was never
installed reports ``0+unknown``.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType


def _quiet_interrupt(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None, _previous=sys.excepthook
) -> None:
    """Ctrl-C while the command is still starting (importing its modules) ends it as Ctrl-C does later on: with
    no traceback (the interpreter still ends by SIGINT: status 130 in a shell)."""
    if not issubclass(kind, KeyboardInterrupt):
        _previous(kind, value, tb)


if os.path.basename(sys.argv[0]) in (
    "ledgerstore",
    "-m",
):  # the command (or `python -m ledgerstore.cli`) only
    sys.excepthook = _quiet_interrupt

from importlib.metadata import PackageNotFoundError, version  # noqa: E402

try:
    __version__ = version("ledgerstore")
except PackageNotFoundError:  # run from a source tree that pip never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
