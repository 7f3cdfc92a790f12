"""What a copy of the ranking shares with the original until one side changes it.

A forecast plays a copy of the dispatcher while the operator goes on changing the original, and the copy is
made in one step of the operator's loop: copying 100,000 waiting jobs' heaps and index held the loop 50 ms
(issue 35). So the copy lends its parts instead: each side copies a part the first time it changes it, and the
first step costs the number of parts, not of jobs.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
PARTS = 64  # a part of 100,000 jobs' index holds about 1,600: a change after a copy copies that many


def writable(store: dict[K, list[V]], lent: set[K], key: K) -> list[V]:
    """``store[key]`` to change, made if missing, and first copied if a copy shares it (``key`` in ``lent``)."""
    items = store.get(key)
    if items is None:
        items = store[key] = []
    elif key in lent:
        lent.discard(key)
        items = store[key] = list(items)
    return items


class LentDict(Generic[K, V]):
    """A dict in ``PARTS`` parts by key hash, whose ``copy`` lends the parts to both sides."""

    def __init__(self) -> None:
        self._parts: list[dict[K, V]] = [{} for _ in range(PARTS)]
        self._lent: set[int] = set()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __contains__(self, key: object) -> bool:
        return key in self._parts[hash(key) % PARTS]

    def __getitem__(self, key: K) -> V:
        return self._parts[hash(key) % PARTS][key]

    def get(self, key: K) -> V | None:
        return self._parts[hash(key) % PARTS].get(key)

    def __setitem__(self, key: K, value: V) -> None:
        part = self._writable(key)
        self._len += key not in part
        part[key] = value

    def pop(self, key: K) -> V:
        value = self._writable(key).pop(key)
        self._len -= 1
        return value

    def discard(self, key: K) -> None:
        """Remove ``key`` if present; a part that does not hold it is not copied."""
        if key in self:
            self.pop(key)

    def values(self) -> Iterator[V]:
        return itertools.chain.from_iterable(part.values() for part in self._parts)

    def copy(self) -> LentDict[K, V]:
        clone: LentDict[K, V] = LentDict.__new__(LentDict)
        clone._parts, clone._len = list(self._parts), self._len
        self._lent, clone._lent = set(range(PARTS)), set(range(PARTS))
        return clone

    def _writable(self, key: K) -> dict[K, V]:
        at = hash(key) % PARTS
        part = self._parts[at]
        if at in self._lent:
            self._lent.discard(at)
            part = self._parts[at] = dict(part)
        return part
