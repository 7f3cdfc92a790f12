"""Queue deadlines of jobs not started yet: a job still waiting at its deadline leaves the queue.

An index (job id -> (deadline, seq)) and a heap of the same entries with lazy deletion: an entry of the heap is
live while the index holds the same pair, so a job that starts or leaves costs one removal from the index. With
queue timeouts every waiting job has one, so a forecast's fork lends both (``copy``), and each side copies the
heap, or a part of the index, the first time it changes it (issue 35, as the ranking's stores: ``lending.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from gpulane.core.lending import LentDict


class QueueDeadlines:
    def __init__(self) -> None:
        self._at: LentDict[str, tuple[float, int]] = LentDict()
        self._heap: list[tuple[float, int, str]] = []
        self._lent = False  # the heap is shared with a copy

    def get(self, job_id: str) -> float | None:
        entry = self._at.get(job_id)
        return None if entry is None else entry[0]

    def set(self, job_id: str, deadline: float, seq: int) -> None:
        self._at[job_id] = (deadline, seq)
        heapq.heappush(self._writable(), (deadline, seq, job_id))

    def discard(self, job_id: str) -> None:
        self._at.discard(job_id)

    def earliest(self) -> float | None:
        while self._heap and not self._live(self._heap[0]):
            heapq.heappop(self._writable())
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> Iterator[tuple[str, float]]:
        """Each job whose deadline is at or before ``now``, earliest first, as (job id, deadline); it stays in
        the index until the caller discards it."""
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._writable())
            if self._live(entry):
                yield entry[2], entry[0]

    def copy(self) -> QueueDeadlines:
        clone = QueueDeadlines.__new__(QueueDeadlines)
        clone._at, clone._heap = self._at.copy(), self._heap
        self._lent = clone._lent = True
        return clone

    def _live(self, entry: tuple[float, int, str]) -> bool:
        return self._at.get(entry[2]) == entry[:2]

    def _writable(self) -> list[tuple[float, int, str]]:
        if self._lent:
            self._heap, self._lent = list(self._heap), False
        return self._heap
