"""Fair share by usage ranks each band's teams in an index kept as the queue changes (core/team_tops.py). A lane
that some model is pinned away from still scans every team, so excluding a model no job asks for must pick the
same job: the indexed pick against the scan, after every kind of change to the queue and to usage."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulane.core.jobs import Job
from gpulane.core.policy import Policy
from gpulane.core.ranking import NO_AFFINITY, TEAM_CACHE, FairShareRanking

MEMBERS = {"ann": "lab", "ben": "lab", "cai": "lab", "dan": None, "eve": "ops", "fay": None}
MODELS = "abc"
NOBODYS = frozenset({"nobody-asks-for-this"})
POLICY = Policy(fairShareHalfLifeSeconds=600.0, fairShareWeights={"namespaces": {"lab": 2}, "members": {"ben": 3}})
AFFINITIES = [NO_AFFINITY, {"a": 1.0}, {"b": 1.0, "c": 0.4}, {"a": 0.3, "b": 0.3, "c": 0.3}]


def agree(ranking: FairShareRanking, now: float) -> None:
    for affinity in AFFINITIES:
        indexed, scanned = ranking.best(affinity, now), ranking.best(affinity, now, NOBODYS)
        assert indexed == scanned, f"with affinity {affinity}: {indexed} indexed, {scanned} scanned"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**9))
def test_the_indexed_pick_is_the_scans_after_every_change(seed):
    rng = random.Random(seed)
    ranking = FairShareRanking(POLICY)
    now, seq = 0.0, 0
    waiting: list[Job] = []
    ran: list[tuple[Job, float, float]] = []  # (job, start, charged)
    for _ in range(80):
        now += rng.choice([0.0, 1.0, 30.0, 300.0])
        roll = rng.random()
        if roll < 0.45 or not waiting:
            seq += 1
            member = rng.choice(list(MEMBERS))
            job = Job(f"j{seq}", rng.choice(MODELS), rng.choice([-100, 0, 20]), rng.choice(["free", "max"]),
                      member, now, team=MEMBERS[member])  # fmt: skip
            ranking.add(job, seq)
            waiting.append(job)
        elif roll < 0.7:  # the pick runs, charged what it is expected to take
            best = ranking.best(rng.choice(AFFINITIES), now)
            assert best is not None
            charge = rng.choice([0.0, 60.0, 900.0])
            ranking.take(best[2], now, charge)
            waiting.remove(best[2])
            ran.append((best[2], now, charge))
        elif roll < 0.8:  # cancelled while it waits, anywhere in its queue
            job = waiting.pop(rng.randrange(len(waiting)))
            assert ranking.remove(job.id) is job
        elif roll < 0.88 and ran:  # one that ran ends: its charge corrected to what it used
            job, start, charged = ran.pop(rng.randrange(len(ran)))
            ranking.correct_usage(job, start, charged, rng.choice([0.0, now - start, 2 * charged]))
        elif roll < 0.94:  # usage as a restart restores it
            ranking.restore_team_usage(
                rng.choice(["lab", "ops"]), rng.choice([-100, 0, 20]), rng.choice([0.0, 50.0, 5000.0]), now
            )
            member, team = rng.choice(list(MEMBERS.items()))
            who = member if team is None else f"{team}/{member}"  # as fair share names its members
            ranking.restore_usage(who, rng.choice([-100, 0, 20]), rng.choice([0.0, 10.0, 900.0]), now)
        else:  # usage persisted long after: decayed clocks are dropped
            now += rng.choice([0.0, 60_000.0])
            ranking.usage(now)
            ranking.team_usage(now)
        agree(ranking, now)
        agree(ranking.copy(), now)
        agree(ranking.copy(explain=False), now)  # a forecast's: it picks the same, without the explanations' indexes
        assert ranking._members.keys() == {job.account for job in waiting}, "a member is kept while a job waits"


def test_a_decision_ranks_the_teams_it_touched_not_every_team():
    """300 members, each a team of its own: a dispatch re-ranks its member's team, not the 300 (the scan did)."""
    ranking = FairShareRanking(POLICY)
    for seq in range(1, 601):
        ranking.add(Job(f"j{seq}", MODELS[seq % 3], 0, "free", f"user-{seq % 300}", float(seq)), seq)
    ranking.best(NO_AFFINITY, 1000.0)  # the first decision ranks every team once
    ranked = []
    in_tree = ranking._in_tree
    ranking._in_tree = lambda head, band: ranked.append(head[2].member) or in_tree(head, band)
    for n in range(20):
        ranked.clear()
        best = ranking.best({"a": 1.0}, 1000.0 + n)
        assert best is not None
        ranking.take(best[2], 1000.0 + n, 60.0)
        assert len(ranked) <= 2 * (1 + len(MODELS)), f"decision {n} ranked {len(ranked)} heads"


def test_members_invented_per_call_do_not_grow_the_team_lookup_without_end():
    ranking = FairShareRanking(POLICY)
    for seq in range(1, TEAM_CACHE + 501):
        ranking.add(Job(f"j{seq}", "a", 0, "free", f"made-up-{seq}", float(seq), team="lab"), seq)
        ranking.best(NO_AFFINITY, float(seq))
    assert ranking._teams.cache_info().currsize == TEAM_CACHE


def test_members_invented_per_call_are_forgotten_with_their_last_job():
    """A trusted caller naming a new member per call: what the ranking keeps of each goes once its jobs have,
    and a correction that comes after still re-ranks the team, which the property test above checks."""
    ranking = FairShareRanking(POLICY)
    for seq in range(1, 2001):
        job = Job(f"j{seq}", "a", 0, "free", f"made-up-{seq}", float(seq), team="lab")
        ranking.add(job, seq)
        ranking.take(job, float(seq), 60.0)
        ranking.correct_usage(job, float(seq), 60.0, 30.0)
    two = [Job(f"k{n}", "b", 0, "free", "ann", 3000.0 + n, team="lab") for n in range(2)]
    for n, job in enumerate(two):
        ranking.add(job, 3000 + n)
    ranking.remove("k0")
    assert {who: m.team for who, m in ranking._members.items()} == {"lab/ann": "lab"}
    ranking.remove("k1")
    assert not ranking._members


def test_a_forecasts_copy_keeps_no_alternatives_and_says_so():
    """The fork a forecast plays explains nothing, so it leaves out the indexes only ``alternatives`` reads (a
    third of a fork at 100,000 waiting: ``bench/dispatch.py --forks``); asking it fails instead of answering wrong."""
    ranking = FairShareRanking(POLICY)
    job = Job("j1", "a", 0, "free", "ann", 0.0, team="lab")
    ranking.add(job, 1)
    assert ranking.alternatives(NO_AFFINITY, job, 1.0) == {}
    fork = ranking.copy(explain=False)
    with pytest.raises(ValueError, match="keeps no alternatives"):
        fork.alternatives(NO_AFFINITY, job, 1.0)
    assert fork.copy().best(NO_AFFINITY, 1.0) == ranking.best(NO_AFFINITY, 1.0)  # and nor does its own copy
    with pytest.raises(ValueError):
        fork.copy().alternatives(NO_AFFINITY, job, 1.0)
