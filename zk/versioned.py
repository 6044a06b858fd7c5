"""``Versioned[T]``: a value read from (or written to) a znode together with the znode's version."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
U = TypeVar("U")

#: The version of a znode that does not exist (also "any version" for unconditional deletes).
NOT_EXISTS = -1


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """``value`` as stored at znode ``version`` (ZooKeeper's data version, bumped by every set; -1 = no znode).

    Compare-and-set writes pass ``version`` back to ZooKeeper: the write succeeds only if nobody wrote in between.
    """

    value: T
    version: int

    def map(self, fn: Callable[[T], U]) -> Versioned[U]:
        """The same version with a converted value (e.g. a JSON dict into a dataclass)."""
        return Versioned(fn(self.value), self.version)

    @property
    def exists(self) -> bool:
        return self.version != NOT_EXISTS
