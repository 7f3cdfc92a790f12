"""A ranked set of items with static keys, and bonuses for some models at lookup time.

Aging grows at the same rate for every waiting job, so between events the order of jobs
never changes: a job's score is ``static_key + now / divisor`` (plus affinity). Keys are
therefore computed once, at insertion, and lookups are heap peeks instead of rescoring.
Removal is lazy: an entry is live only while it is the one recorded for its item.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterable, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

# (-key, seq, unique counter, item, model, payload): the counter keeps comparisons away from the rest.
Entry = tuple[float, int, int, Hashable, str, T]


class RankedIndex(Generic[T]):
    """Highest key first, ties to the lowest seq; one heap overall and one per model."""

    def __init__(self) -> None:
        self._all: list[Entry[T]] = []
        self._by_model: dict[str, list[Entry[T]]] = {}
        self._live: dict[Hashable, Entry[T]] = {}
        self._counter = itertools.count()

    def put(self, item: Hashable, model: str, key: float, seq: int, payload: T) -> None:
        live = self._live.get(item)
        if live is not None and live[0] == -key and live[1] == seq and live[5] is payload and live[4] == model:
            return  # already there: re-ranking an unchanged item would only grow the heaps
        entry: Entry[T] = (-key, seq, next(self._counter), item, model, payload)
        self._live[item] = entry
        heapq.heappush(self._all, entry)
        heapq.heappush(self._by_model.setdefault(model, []), entry)
        if len(self._all) > 64 and len(self._all) > 4 * len(self._live):
            self._compact()

    def __len__(self) -> int:
        return len(self._live)

    def current(self, item: Hashable) -> T | None:
        entry = self._live.get(item)
        return None if entry is None else entry[5]

    def discard(self, item: Hashable) -> None:
        self._live.pop(item, None)

    def best(self, bonuses: Mapping[str, float], excluded: frozenset[str] = frozenset()) -> tuple[float, int, T] | None:
        """The best (value, seq, payload), where items of a model in ``bonuses`` get its bonus added (one peek per
        such model); items of the ``excluded`` models are left out (a lane they are pinned away from: one peek per
        model then)."""
        if excluded:
            return self._best_allowed(bonuses, excluded)
        top = self._peek(self._all)
        if top is None:
            return None
        value, seq, payload = -top[0], top[1], top[5]
        for model, bonus in bonuses.items():
            heap = self._by_model.get(model) if bonus else None
            local = self._peek(heap) if heap else None
            if local is not None:
                local_value = -local[0] + bonus
                if local_value > value or (local_value == value and local[1] < seq):
                    value, seq, payload = local_value, local[1], local[5]
        return value, seq, payload

    def _best_allowed(self, bonuses: Mapping[str, float], excluded: frozenset[str]) -> tuple[float, int, T] | None:
        chosen: tuple[float, int, T] | None = None
        for name, heap in self._by_model.items():
            top = self._peek(heap) if name not in excluded else None
            if top is None:
                continue
            value = -top[0] + bonuses.get(name, 0.0)
            if chosen is None or value > chosen[0] or (value == chosen[0] and top[1] < chosen[1]):
                chosen = (value, top[1], top[5])
        return chosen

    def best_of(self, model: str) -> tuple[float, int, T] | None:
        """The best (value, seq, payload) among the items of ``model``."""
        heap = self._by_model.get(model)
        top = self._peek(heap) if heap else None
        return None if top is None else (-top[0], top[1], top[5])

    def models(self) -> Iterable[str]:
        """The models it has held items of (some may have none left)."""
        return self._by_model.keys()

    def copy(self) -> RankedIndex[T]:
        clone: RankedIndex[T] = RankedIndex()
        clone._all = list(self._all)
        clone._by_model = {m: list(h) for m, h in self._by_model.items()}
        clone._live = dict(self._live)
        clone._counter = itertools.count(next(self._counter))
        return clone

    def _peek(self, heap: list[Entry[T]]) -> Entry[T] | None:
        while heap:
            top = heap[0]
            if self._live.get(top[3]) is top:
                return top
            heapq.heappop(heap)
        return None

    def _compact(self) -> None:
        """Lazy removal leaves stale entries behind; rebuild once they dominate."""
        live = list(self._live.values())
        heapq.heapify(live)
        self._all = live
        by_model: dict[str, list[Entry[T]]] = {}
        for entry in live:
            by_model.setdefault(entry[4], []).append(entry)
        for heap in by_model.values():
            heapq.heapify(heap)
        self._by_model = by_model


def index_in(indexes: dict[K, RankedIndex[T]], key: K) -> RankedIndex[T]:
    """The index under ``key``, made when missing (``setdefault`` would build one on every call)."""
    index = indexes.get(key)
    if index is None:
        index = indexes[key] = RankedIndex()
    return index
