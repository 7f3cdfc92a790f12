"""The baselines gpulane is compared with (FIFO, strict priority, llama-swap, per-job aging), and every
ranking by name. They share the dispatcher and event loop with ``FairShareRanking``, so comparisons measure the
ranking and nothing else (plus, for llama-swap, its admission cap: ``sim/llamaswap.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from gpulane.core.jobs import Job
from gpulane.core.policy import Policy
from gpulane.core.ranked import RankedIndex
from gpulane.core.ranking import Affinity, Best, FairShareRanking, MemberLevel, Ranking
from gpulane.core.score import ScoreBreakdown


class OrderedRanking:
    """A baseline: one static key per job, ties to arrival, an optional bonus for the lane's models.

    ``priority`` ranks by priority + tier; ``aging`` adds aging from each job's own submission
    (the per-job aging that the burst pitfall is about); ``resident_bonus`` is in aging-seconds, given in
    proportion to a model's affinity; an infinite one (llama-swap's: the loaded models' requests first) only to
    the models loaded on the lane.
    """

    def __init__(self, name: str, policy: Policy, *, priority: bool, aging: bool, resident_bonus: float = 0.0) -> None:
        self.name = name
        self.policy = policy
        self._priority, self._aging, self._bonus = priority, aging, resident_bonus
        self._jobs: dict[str, Job] = {}
        self._index: RankedIndex[Job] = RankedIndex()

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def pending(self) -> Iterator[Job]:
        return iter(self._jobs.values())

    def waiting(self) -> dict[int, tuple[int, float]]:
        """Per band index, how many wait and the earliest submission (the simulator's baselines: by walking them)."""
        out: dict[int, tuple[int, float]] = {}
        for job in self._jobs.values():
            count, first = out.get(band := self.policy.band(job.priority), (0, math.inf))
            out[band] = (count + 1, min(first, job.submitted_at))
        return out

    def add(self, job: Job, seq: int) -> None:
        key = 0.0
        if self._priority:
            key += (job.priority + self.policy.bonus_for_tier(job.tier)) * self.policy.aging_divisor_seconds
        if self._aging:
            key -= job.submitted_at
        self._jobs[job.id] = job
        self._index.put(job.id, job.model, key, seq, job)

    def remove(self, job_id: str) -> Job | None:
        self._index.discard(job_id)
        return self._jobs.pop(job_id, None)

    def take(self, job: Job, now: float, charge: float = 0.0) -> float | None:
        self.remove(job.id)
        return None

    def untake(self, job: Job, seq: int, at: float, charge: float, served_before: float | None) -> None:
        self.add(job, seq)

    def note_served(self, member: str, priority: int, at: float) -> None:
        """Baselines keep no per-member clocks, nor usage."""

    def served(self) -> dict[MemberLevel, float]:
        return {}

    def correct_usage(self, job: Job, start: float, charged: float, used: float) -> None:
        """Baselines keep no usage."""

    def restore_usage(self, member: str, priority: int, seconds: float, at: float) -> None:
        """Baselines keep no usage."""

    def restore_team_usage(self, team: str, priority: int, seconds: float, at: float) -> None:
        """Baselines keep no usage."""

    def usage(self, now: float) -> dict[MemberLevel, float]:
        return {}

    def team_usage(self, now: float) -> dict[MemberLevel, float]:
        return {}

    def best(
        self,
        affinity: Affinity,
        now: float,
        excluded: frozenset[str] = frozenset(),
        teams: frozenset[str] | None = None,
    ) -> Best | None:
        """Baselines know no teams: a reserved lane's owners are not told apart (no scenario reserves lanes)."""
        return self._index.best(self._bonuses(affinity), excluded)

    def _bonuses(self, affinity: Affinity) -> dict[str, float]:
        if math.isinf(self._bonus):
            return {model: self._bonus for model, share in affinity.items() if share >= 1.0}
        return {model: share * self._bonus for model, share in affinity.items()} if self._bonus else {}

    def breakdown(self, job: Job, affinity: Affinity, now: float) -> ScoreBreakdown:
        share = affinity.get(job.model, 0.0) if 0 < self._bonus < math.inf else 0.0
        return ScoreBreakdown(
            job.priority,
            self.policy.bonus_for_tier(job.tier),
            self.policy.affinity_bonus * share,
            (now - job.submitted_at) / self.policy.aging_divisor_seconds if self._aging else 0.0,
        )

    def alternatives(self, affinity: Affinity, winner: Job, now: float) -> dict[str, str]:
        return {}

    def copy(self, explain: bool = True) -> OrderedRanking:
        clone = OrderedRanking(
            self.name, self.policy, priority=self._priority, aging=self._aging, resident_bonus=self._bonus
        )
        clone._jobs = dict(self._jobs)
        clone._index = self._index.copy()
        return clone


def make_ranking(name: str, policy: Policy) -> Ranking:
    """The named policy: ``gpulane``, a baseline it is compared against, or an ablation."""
    if name == "gpulane":
        return FairShareRanking(policy)
    if name == "gpulane-turns":  # an ablation: members of a band take turns whatever their jobs' lengths
        return FairShareRanking(policy.model_copy(update={"fair_share": "turns"}), name)
    if name == "fifo":  # arrival order: llama-swap as the design note describes it
        return OrderedRanking(name, policy, priority=False, aging=False)
    if name == "strict":  # priority + tier, then arrival: PriorityClass, Kueue StrictFIFO without preemption
        return OrderedRanking(name, policy, priority=True, aging=False)
    if name == "llama-swap":  # v250: requests for the loaded model first, then arrival order
        return OrderedRanking(name, policy, priority=False, aging=False, resident_bonus=math.inf)
    if name == "per-job-aging":
        affinity = policy.affinity_bonus * policy.aging_divisor_seconds
        return OrderedRanking(name, policy, priority=True, aging=True, resident_bonus=affinity)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(RANKINGS)}")


# The four compared in the brief, then gpulane's score without fair share (the burst pitfall), then
# gpulane with today's turns inside a band instead of GPU usage.
RANKINGS = ("fifo", "strict", "llama-swap", "gpulane", "per-job-aging", "gpulane-turns")
