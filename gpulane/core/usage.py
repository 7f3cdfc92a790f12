"""Decayed GPU usage per (member, band), kept so that comparing members never needs rescoring.

Every member's usage decays by the same factor over the same time, so between charges the order
of members by usage never changes. Each entry is therefore stored as one static number, its
*usage clock*: the time at which the member's decayed usage falls to one GPU-second,
``at + half_life * log2(usage(at))`` for any ``at``. A later clock means more usage.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# Below this many GPU-seconds a member counts as not having run at all (and the entry goes).
NEGLIGIBLE = 1e-6
# Exponents beyond this (a charge dated thousands of half-lives back) would overflow a float.
MAX_DOUBLINGS = 1000.0


class UsageLedger(Generic[K]):
    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self._clocks: dict[K, float] = {}

    def __len__(self) -> int:
        return len(self._clocks)

    def __contains__(self, key: object) -> bool:
        return key in self._clocks

    def clock(self, key: K) -> float | None:
        """The key's usage clock; None when it has no usage."""
        return self._clocks.get(key)

    def seconds(self, key: K, at: float) -> float:
        """Decayed GPU-seconds at ``at``."""
        clock = self._clocks.get(key)
        return 0.0 if clock is None else 2.0 ** min((clock - at) / self.half_life, MAX_DOUBLINGS)

    def charge(self, key: K, seconds: float, at: float) -> None:
        """Add ``seconds`` of GPU time used at ``at`` (negative to correct an earlier charge)."""
        self.restore(key, self.seconds(key, at) + seconds, at)

    def charge_run(self, key: K, seconds: float, start: float) -> None:
        """A run of ``seconds`` from ``start``, dated at its middle: by its end that is what using the
        GPU all along adds (to first order), so a long job's usage does not decay before it is used."""
        self.charge(key, seconds, start + seconds / 2)

    def correct_run(self, key: K, charged: float, used: float, start: float) -> None:
        """The run charged ``charged`` from ``start`` used ``used`` seconds instead."""
        self.charge(key, -charged, start + charged / 2)
        self.charge(key, used, start + used / 2)

    def restore(self, key: K, seconds: float, at: float) -> None:
        """Set the usage to ``seconds`` as of ``at`` (after a restart, or a policy change)."""
        if seconds < NEGLIGIBLE:
            self._clocks.pop(key, None)
        else:
            self._clocks[key] = at + self.half_life * math.log2(seconds)

    def snapshot(self, at: float) -> dict[K, float]:
        """Every key's decayed GPU-seconds at ``at``; entries that decayed to nothing are dropped."""
        for key in [k for k, clock in self._clocks.items() if self.seconds(k, at) < NEGLIGIBLE]:
            del self._clocks[key]
        return {key: self.seconds(key, at) for key in self._clocks}

    def copy(self) -> UsageLedger[K]:
        clone: UsageLedger[K] = UsageLedger(self.half_life)
        clone._clocks = dict(self._clocks)
        return clone
