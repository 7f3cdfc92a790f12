"""A forecast plays a copy of the ranking while the operator goes on changing the ranking itself. The copy lends
its heaps, its bands' team indexes and its jobs' index to both sides (issue 35: copying them held the loop 50 ms
at 100,000 waiting), and each side copies one (a part of the index) only when it changes it. Neither side may
then see the other's changes: each must pick, after every change, what a ranking that played its history alone
from the start picks."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulane.core.jobs import Job
from gpulane.core.policy import Policy
from gpulane.core.ranking import NO_AFFINITY, FairShareRanking

MEMBERS = {"ann": "lab", "ben": "lab", "cai": None, "dan": "ops"}
MODELS = "abc"
NOBODYS = frozenset({"nobody-asks-for-this"})  # excluded: every team is scanned instead of read from its index
AFFINITIES = [NO_AFFINITY, {"a": 1.0}, {"b": 1.0, "c": 0.4}]
POLICIES = {
    "usage": Policy(fairShareHalfLifeSeconds=600.0, fairShareWeights={"namespaces": {"lab": 2}}),
    "turns": Policy(fairShare="turns"),
}
Change = tuple[str, Job, float]  # ("add", job, seq), ("take", job, at) or ("remove", job, 0)


def play(ranking: FairShareRanking, change: Change) -> None:
    what, job, value = change
    if what == "add":
        ranking.add(job, int(value))
    elif what == "take":
        ranking.take(job, value, 60.0)
    else:
        ranking.remove(job.id)


@dataclass
class Side:
    """A ranking, its history, and a ranking that played that history alone from the start."""

    ranking: FairShareRanking
    policy: Policy
    history: list[Change] = field(default_factory=list)
    waiting: list[Job] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.alone = FairShareRanking(self.policy)
        for change in self.history:
            play(self.alone, change)

    def change(self, rng: random.Random, clock: list[float]) -> None:
        """A job arrives, the pick runs, or a job leaves."""
        clock[0] += rng.choice([0.0, 1.0, 30.0])
        roll = rng.random()
        if roll < 0.5 or not self.waiting:
            clock[1] += 1
            member = rng.choice(list(MEMBERS))
            job = Job(f"j{clock[1]:.0f}", rng.choice(MODELS), rng.choice([-100, 0, 20]), "free", member, clock[0],
                      team=MEMBERS[member])  # fmt: skip
            change: Change = ("add", job, clock[1])
            self.waiting.append(job)
        elif roll < 0.8:
            best = self.ranking.best(rng.choice(AFFINITIES), clock[0])
            assert best is not None
            change = ("take", best[2], clock[0])
            self.waiting.remove(best[2])
        else:
            change = ("remove", self.waiting.pop(rng.randrange(len(self.waiting))), 0.0)
        self.history.append(change)
        play(self.ranking, change)
        play(self.alone, change)

    def agree(self, now: float) -> None:
        for affinity in AFFINITIES:
            for excluded in (frozenset(), NOBODYS):
                got, alone = self.ranking.best(affinity, now, excluded), self.alone.best(affinity, now, excluded)
                assert got == alone, f"{affinity}, excluding {set(excluded)}: {got}, alone {alone}"

    def copied(self, *, explain: bool) -> Side:
        return Side(self.ranking.copy(explain=explain), self.policy, list(self.history), list(self.waiting))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**9), mode=st.sampled_from(sorted(POLICIES)))
def test_a_copy_and_its_original_never_see_each_others_changes(seed: int, mode: str) -> None:
    rng, clock = random.Random(seed), [0.0, 0.0]  # the time, the last seq
    original = Side(FairShareRanking(POLICIES[mode]), POLICIES[mode])
    for _ in range(60):
        original.change(rng, clock)
    # Each goes its own way; a copy of the copy and a second copy of the original join midway.
    sides = [original, original.copied(explain=False)]
    for round_ in range(3):
        for _ in range(25):
            for side in sides:
                side.change(rng, clock)
                side.agree(clock[0])
        sides.append(sides[round_].copied(explain=round_ != 1))
