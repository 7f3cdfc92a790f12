"""The effective score of a waiting job, kept as its terms so that it can be explained."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class ScoreBreakdown:
    priority: int
    tier: int
    affinity: float
    aging: float

    @property
    def total(self) -> float:
        return self.priority + self.tier + self.affinity + self.aging

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}
