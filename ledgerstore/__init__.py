"""The ``ledgerstore`` command and its verbs (docs/architecture.md §3).

``__version__`` has one source, the package metadata (``version`` in ``setup.cfg``); a source tree that was never
installed reports ``0+unknown``.
"""

from __future__ import annotations

import os
import signal
import sys
from types import TracebackType


def _quiet_interrupt(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None, _previous=sys.excepthook
) -> None:
    """Ctrl-C while the command is still starting (importing its modules) ends it as Ctrl-C does later on: with
    no traceback (the interpreter still ends by SIGINT: status 130 in a shell)."""
    if not issubclass(kind, KeyboardInterrupt):
        _previous(kind, value, tb)


def _interrupted_while_starting(signum: int, frame: object) -> None:
    """Ctrl-C before the command's ``main`` runs ends the process at once with 130, as a shell reports Ctrl-C.
    Python's own handler raises KeyboardInterrupt, which an import under way can lose ("Exception ignored in
    ... _get_module_lock"): the command then went on as if nothing had been typed. ``cli.main`` puts Python's
    handler back (:func:`started`)."""
    os._exit(128 + signum)


def started() -> None:
    """The command runs: Ctrl-C raises KeyboardInterrupt again (each verb ends on it in its own way)."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)


if os.path.basename(sys.argv[0]) in (
    "ledgerstore",
    "-m",
):  # the command (or `python -m ledgerstore.cli`) only
    sys.excepthook = _quiet_interrupt
    # (not where Ctrl-C is ignored: nohup, a background job)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_while_starting)

from importlib.metadata import PackageNotFoundError, version  # noqa: E402

try:
    __version__ = version("ledgerstore")
except PackageNotFoundError:  # run from a source tree that pip never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
