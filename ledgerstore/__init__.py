"""The ``ledgerstore`` command and its verbs (docs/architecture.md §3).

``__version__`` has one source, the package metadata (``version`` in ``setup.cfg``); a source tree that was never
installed reports ``0+unknown``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ledgerstore")
except PackageNotFoundError:  # run from a source tree that pip never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
