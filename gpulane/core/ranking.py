"""Rankings decide which waiting job a lane should run next.

``FairShareRanking`` is gpulane's policy; ``Ranking`` is what every ranking offers the dispatcher. The baselines
it is compared with, and the names of all of them, are in ``baselines.py``.
"""

from __future__ import annotations

import functools
import heapq
import math
import operator
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from gpulane.core.jobs import Job
from gpulane.core.lending import LentDict, writable
from gpulane.core.policy import Policy
from gpulane.core.ranked import RankedIndex, index_in
from gpulane.core.score import ScoreBreakdown
from gpulane.core.team_tops import Best as Best  # re-exported: what every ranking picks
from gpulane.core.team_tops import TeamTops
from gpulane.core.usage import NEGLIGIBLE, UsageLedger

MemberLevel = tuple[str, int]  # (member, band index)
# On one lane, the models whose jobs get affinity, each with its share of the bonus in (0, 1]: 1 for a model
# loaded there (no switch at all), less for one its server can load for less than a new pod costs.
Affinity = Mapping[str, float]
NO_AFFINITY: Affinity = {}


class Ranking(Protocol):
    name: str

    def __len__(self) -> int: ...
    def __contains__(self, job_id: object) -> bool: ...
    def pending(self) -> Iterator[Job]: ...
    def waiting(self) -> dict[int, tuple[int, float]]: ...
    def add(self, job: Job, seq: int) -> None: ...
    def remove(self, job_id: str) -> Job | None: ...
    def take(self, job: Job, now: float, charge: float = 0.0) -> float | None: ...
    def untake(self, job: Job, seq: int, at: float, charge: float, served_before: float | None) -> None: ...
    def note_served(self, member: str, priority: int, at: float) -> None: ...
    def served(self) -> dict[MemberLevel, float]: ...
    def correct_usage(self, job: Job, start: float, charged: float, used: float) -> None: ...
    def restore_usage(self, member: str, priority: int, seconds: float, at: float) -> None: ...
    def restore_team_usage(self, team: str, priority: int, seconds: float, at: float) -> None: ...
    def usage(self, now: float) -> dict[MemberLevel, float]: ...
    def team_usage(self, now: float) -> dict[MemberLevel, float]: ...
    def best(
        self,
        affinity: Affinity,
        now: float,
        excluded: frozenset[str] = frozenset(),
        teams: frozenset[str] | None = None,
    ) -> Best | None: ...
    def breakdown(self, job: Job, affinity: Affinity, now: float) -> ScoreBreakdown: ...
    def alternatives(self, affinity: Affinity, winner: Job, now: float) -> dict[str, str]: ...
    def copy(self, explain: bool = True) -> Ranking:
        """An independent copy; ``explain=False``: one that cannot give ``alternatives`` (a forecast's), without
        what only they read."""
        ...


QueueKey = tuple[str, int, str]
TEAM_CACHE = 4096  # (namespace, member) pairs whose team the ranking remembers
_K = TypeVar("_K", MemberLevel, QueueKey)
# A member queue's entry: ((-priority, submission), seq, job id); the oldest-job heap's: (submission, seq, id).
QueueEntry = tuple[tuple[int, float], int, str]
_E = TypeVar("_E", QueueEntry, tuple[float, int, str])


class FairShareRanking:
    """Priority + tier + affinity + aging, with aging measured per (member, band) queue.

    Each member has a queue per band (by priority, then submission), split by model so
    that affinity can pick the member's job for the resident model. Only the split queues'
    heads compete. Aging measures how long the member's queue has gone unserved: the clock of
    the member's oldest waiting job starts at the later of its submission and the member's last
    dispatch in that band, so a burst ages as one queue, not as hundreds of jobs. That is what
    keeps a 174-shot film from outranking fresh interactive work (brief section 2).

    The member's younger jobs keep their distance behind that oldest job (their clock starts
    later by the submission gap), so inside a member the order stays first-come first-served,
    and affinity can only pull forward a job submitted within ``affinity_bonus`` aging-points of
    the oldest. A member's own traffic can therefore never starve the member's other work.

    With ``fair_share: usage`` the members of one band are ranked by their decayed GPU usage
    instead of their turns: inside a band the queue clock starts at the member's usage clock
    (``core/usage.py``), so the member who used the least goes first whatever its jobs' lengths.
    Affinity is worth ``affinity_bonus * aging_divisor_seconds`` GPU-seconds there (``affinity_credit``),
    or its bonus on the usage clock if that is more: the resident model's job goes ahead of a less-used
    member's job when its member has used at most that much more, so a swap is not paid for a small usage
    lead, and a member who used far less still wins (``docs/policy.md``).
    Usage is a tree of two levels, as Slurm's Fair Tree: in a band the team (``Job.team``, the namespace, or the
    team ``fairShareTeams`` puts its namespace or member in) that used the least for its weight goes first, then
    inside it the member that used the least for its weight (``fairShareWeights``; a weight w divides usage by
    w, which shifts a usage clock by ``half_life * log2(w)``). A team's share therefore does not grow with its
    number of members. Each band then competes with the job it picked, at that job's own score: the band, tier,
    affinity and aging terms across bands are unchanged.
    """

    def __init__(self, policy: Policy, name: str = "gpulane") -> None:
        self.name = name
        self.policy = policy
        self._divisor = policy.aging_divisor_seconds
        self._by_usage = policy.fair_share == "usage"
        self.affinity_credit = policy.affinity_bonus * self._divisor  # GPU-seconds, under usage
        self._ledger: UsageLedger[MemberLevel] = UsageLedger(policy.fair_share_half_life_seconds)
        self._team_ledger: UsageLedger[MemberLevel] = UsageLedger(policy.fair_share_half_life_seconds)  # (team, band)
        # Asked at every decision and re-rank, and reading the policy's (pydantic) private mapping is slow. Bounded:
        # member names come from callers, and one who invents a new name per call must not grow it without end.
        self._teams = functools.lru_cache(maxsize=TEAM_CACHE)(policy.fair_share_team)
        # Each member with a job waiting (Job.account), forgotten with its last job: names come from callers.
        self._members: dict[str, _Member] = {}
        # Turns: every head by its score. Usage: per band and team, the heads by usage clock, and each head's score.
        self._heads: RankedIndex[Job] = RankedIndex()
        self._bands: dict[int, dict[str, RankedIndex[Job]]] = {}
        self._tops = TeamTops()  # usage: the bands' teams ranked, so that a decision need not scan them
        self._own_key: dict[QueueKey, float] = {}
        self._jobs: LentDict[str, tuple[Job, int, MemberLevel, int]] = LentDict()  # job, seq, level, priority + tier
        # Heaps with lazy deletion: an entry (..., seq, job id) is live while _jobs holds its job with its seq,
        # and seqs are never reused, so a job re-submitted under a cancelled job's id never revives old entries.
        self._queues: dict[QueueKey, list[QueueEntry]] = {}
        self._oldest: dict[MemberLevel, list[tuple[float, int, str]]] = {}
        # The heaps a copy shares with this ranking: each side copies one the first time it changes it (``copy``).
        self._lent_queues: set[QueueKey] = set()
        self._lent_levels: set[MemberLevel] = set()
        self._lent_teams: set[tuple[int, str]] = set()  # (band, team key) in _bands
        self._live_in_queue: dict[QueueKey, int] = {}
        self._live_in_level: dict[MemberLevel, int] = {}
        self._models: dict[MemberLevel, frozenset[str]] = {}  # frozen: a copy shares them
        self._last_dispatch: dict[MemberLevel, float] = {}
        # Read only by ``alternatives``: a forecast's copy keeps neither (at 100,000 waiting, a third of its cost).
        self._explain = True
        self._heads_no_aging: RankedIndex[Job] = RankedIndex()
        self._team_heads: dict[str, RankedIndex[Job]] = {}  # turns: the heads again by team (reserved lanes)
        self._no_fair_share: RankedIndex[Job] = RankedIndex()

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def pending(self) -> Iterator[Job]:
        # In arrival order (by seq): the index's parts keep no order of their own. A policy change re-adds them all.
        return (entry[0] for entry in sorted(self._jobs.values(), key=operator.itemgetter(1)))

    def waiting(self) -> dict[int, tuple[int, float]]:
        """Per band index, how many jobs wait and the earliest submission among them. Read from the (member, band)
        queues, whose oldest entry is always live (every removal refreshes its level), so that a metrics scrape
        costs the members, not the jobs: walking them took 75 ms a scrape at 100,000 waiting."""
        out: dict[int, tuple[int, float]] = {}
        for level, live in self._live_in_level.items():
            count, first = out.get(level[1], (0, math.inf))
            out[level[1]] = (count + live, min(first, self._oldest[level][0][0]))
        return out

    def add(self, job: Job, seq: int) -> None:
        level = (who := job.account, self.policy.band(job.priority))
        member = self._members.get(who)
        if member is None:
            team = self._team(job)
            member = self._members[who] = _Member(team, self.policy.fair_share_weights.of(team, job.member))
        member.waiting += 1
        base = job.priority + self.policy.bonus_for_tier(job.tier)
        self._jobs[job.id] = (job, seq, level, base)
        qkey = (*level, job.model)
        queue = writable(self._queues, self._lent_queues, qkey)
        # By submission inside a priority, not by seq: seq is the order the operator saw the jobs in, which a
        # restart or a takeover replays differently; the submission time is written and stays.
        heapq.heappush(queue, ((-job.priority, job.submitted_at), seq, job.id))
        self._live_in_queue[qkey] = self._live_in_queue.get(qkey, 0) + 1
        if job.model not in (models := self._models.get(level, frozenset())):
            self._models[level] = models | {job.model}
        oldest = writable(self._oldest, self._lent_levels, level)
        heapq.heappush(oldest, (job.submitted_at, seq, job.id))
        self._live_in_level[level] = self._live_in_level.get(level, 0) + 1
        if oldest[0][1] == seq:
            self._refresh_level(level)  # every clock in the level is measured from the oldest job
        elif queue[0][1] == seq:
            self._refresh_head(qkey)
        if self._explain:
            self._no_fair_share.put(job.id, job.model, base * self._divisor - job.submitted_at, seq, job)

    def remove(self, job_id: str) -> Job | None:
        if job_id not in self._jobs:
            return None
        job, level = self._forget(job_id)
        qkey = (*level, job.model)
        if self._is_stale(self._oldest[level][0]):
            self._refresh_level(level)
        elif self._is_stale(self._queues[qkey][0]):
            self._refresh_head(qkey)
        else:  # deep inside its heaps: rebuild them if such leftovers pile up
            self._compact(self._queues, self._lent_queues, qkey, self._live_in_queue[qkey])
            self._compact(self._oldest, self._lent_levels, level, self._live_in_level[level])
        return job

    def take(self, job: Job, now: float, charge: float = 0.0) -> float | None:
        """Dispatch ``job`` and charge ``charge`` GPU-seconds; returns the level's previous served time."""
        level = self._forget(job.id)[1]
        before = self._last_dispatch.get(level)
        if charge:
            self._ledger.charge_run(level, charge, now)
            if (team := self._team(job)) is not None:
                self._team_ledger.charge_run((team, level[1]), charge, now)
        self._served(level, now)
        return before

    def untake(self, job: Job, seq: int, at: float, charge: float, served_before: float | None) -> None:
        """Undo ``take(job, at, charge)``: the job waits again in its place, its member as if never served."""
        level = (job.account, self.policy.band(job.priority))
        if self._last_dispatch.get(level, at) == at:  # nobody in the level was served since
            if served_before is None:
                self._last_dispatch.pop(level, None)
            else:
                self._last_dispatch[level] = served_before
        if charge:
            self._ledger.correct_run(level, charge, 0.0, at)
            if (team := self._team(job)) is not None:
                self._team_ledger.correct_run((team, level[1]), charge, 0.0, at)
        self.add(job, seq)
        self._refresh_level(level)

    def note_served(self, member: str, priority: int, at: float) -> None:
        """A (member, band) queue was served at ``at``: restores fair-share clocks after a restart."""
        self._served((member, self.policy.band(priority)), at)

    def served(self) -> dict[MemberLevel, float]:
        """When each (member, band) queue was last served, for the levels whose aging it still affects."""
        return dict(self._last_dispatch)

    def correct_usage(self, job: Job, start: float, charged: float, used: float) -> None:
        """A job dispatched at ``start`` and charged ``charged`` GPU-seconds held its lane ``used``."""
        level = (job.account, self.policy.band(job.priority))
        self._ledger.correct_run(level, charged, used, start)
        if (team := self._team(job)) is not None:
            self._team_ledger.correct_run((team, level[1]), charged, used, start)
        self._usage_changed(level, team)

    def restore_usage(self, member: str, priority: int, seconds: float, at: float) -> None:
        """Set a (member, band)'s decayed usage as of ``at``: restores fair share after a restart."""
        level = (member, self.policy.band(priority))
        self._ledger.restore(level, seconds, at)
        known = self._members.get(member)  # a member without a job waiting heads no team
        self._usage_changed(level, None if known is None else known.team)

    def restore_team_usage(self, team: str, priority: int, seconds: float, at: float) -> None:
        """Set a (team, band)'s decayed usage as of ``at``: restores the tree's upper level after a restart."""
        band = self.policy.band(priority)
        self._team_ledger.restore((team, band), seconds, at)
        self._tops.touch(band, _tree_key("", team))

    def usage(self, now: float) -> dict[MemberLevel, float]:
        """Each (member, band)'s decayed GPU-seconds at ``now``, to persist (both modes keep it)."""
        return self._snapshot(self._ledger, now)

    def team_usage(self, now: float) -> dict[MemberLevel, float]:
        """Each (team, band)'s decayed GPU-seconds at ``now``, to persist."""
        return self._snapshot(self._team_ledger, now)

    def _snapshot(self, ledger: UsageLedger[MemberLevel], now: float) -> dict[MemberLevel, float]:
        had = len(ledger)
        out = ledger.snapshot(now)
        if len(out) < had:  # a clock decayed to nothing is dropped: rare, and every team is ranked anew
            self._tops.touch_all(self._bands)
        return out

    def best(
        self,
        affinity: Affinity,
        now: float,
        excluded: frozenset[str] = frozenset(),
        teams: frozenset[str] | None = None,
    ) -> Best | None:
        """The best waiting job for a lane whose models get ``affinity``, leaving out the ``excluded`` models;
        only of ``teams`` if given (a reserved lane's owners)."""
        bonus = self.policy.affinity_bonus * self._divisor
        only = None if teams is None else {_tree_key("", team) for team in teams}
        if self._by_usage:
            return self._best_by_usage(affinity, bonus, now, excluded, only)
        bonuses = {model: share * bonus for model, share in affinity.items()}
        if only is None:
            return self._heads.best(bonuses, excluded)
        chosen: Best | None = None
        for key in only & self._team_heads.keys():
            top = self._team_heads[key].best(bonuses, excluded)
            if top is not None and _better(top, chosen):
                chosen = top
        return chosen

    def breakdown(self, job: Job, affinity: Affinity, now: float) -> ScoreBreakdown:
        # Aging is negative for a member's job that sits its submission gap behind the member's
        # oldest waiting job, right after the member was served; reported as ranked.
        level = (job.account, self.policy.band(job.priority))
        return ScoreBreakdown(
            priority=job.priority,
            tier=self.policy.bonus_for_tier(job.tier),
            affinity=self.policy.affinity_bonus * affinity.get(job.model, 0.0),
            aging=(now - self._aging_start(job, level)) / self._divisor,
        )

    def alternatives(self, affinity: Affinity, winner: Job, now: float) -> dict[str, str]:
        """The winner without each term; a term appears only where it changed the winner."""
        if not self._explain:
            raise ValueError("this copy of the ranking keeps no alternatives (copy(explain=False))")
        bonus = self.policy.affinity_bonus
        candidates = {
            "aging": self._heads_no_aging.best({m: share * bonus for m, share in affinity.items()}),
            "affinity": self.best(NO_AFFINITY, now),
            "fairShare": self._no_fair_share.best({m: share * bonus * self._divisor for m, share in affinity.items()}),
        }
        return {term: alt[2].id for term, alt in candidates.items() if alt and alt[2].id != winner.id}

    def copy(self, explain: bool = True) -> FairShareRanking:
        clone = FairShareRanking(self.policy, self.name)
        clone._explain = self._explain and explain
        clone._ledger = self._ledger.copy()
        clone._team_ledger = self._team_ledger.copy()
        clone._members = {who: _Member(m.team, m.weights, m.waiting) for who, m in self._members.items()}
        clone._bands = {band: dict(teams) for band, teams in self._bands.items()}
        self._lent_teams = {(band, team) for band, teams in self._bands.items() for team in teams}
        clone._lent_teams = set(self._lent_teams)
        clone._tops = self._tops.copy()
        clone._own_key = dict(self._own_key)
        clone._jobs = self._jobs.copy()  # lent in parts (lending.py)
        # The heaps and the jobs' index hold every waiting job, the bands' indexes every queue's head (50 ms to copy
        # at 100,000 in 6,000 queues of 500 members, and the loop waits for it): lent to both sides instead, so
        # that a forecast copies only the queues and teams it plays, when it plays them. Reading a lent index may
        # drop entries stale for both; only a change (``put``, ``discard``) needs a copy of one's own.
        clone._queues, clone._oldest = dict(self._queues), dict(self._oldest)
        self._lent_queues, self._lent_levels = set(self._queues), set(self._oldest)
        clone._lent_queues, clone._lent_levels = set(self._lent_queues), set(self._lent_levels)
        clone._live_in_queue = dict(self._live_in_queue)
        clone._live_in_level = dict(self._live_in_level)
        clone._models = dict(self._models)
        clone._last_dispatch = dict(self._last_dispatch)
        clone._heads = self._heads.copy()
        clone._team_heads = {key: index.copy() for key, index in self._team_heads.items()}
        if clone._explain:
            clone._heads_no_aging = self._heads_no_aging.copy()
            clone._no_fair_share = self._no_fair_share.copy()
        return clone

    def _forget(self, job_id: str) -> tuple[Job, MemberLevel]:
        job, _, level, _ = self._jobs.pop(job_id)
        self._no_fair_share.discard(job_id)
        self._live_in_queue[(*level, job.model)] -= 1
        self._live_in_level[level] -= 1
        self._members[level[0]].waiting -= 1
        return job, level

    def _usage_changed(self, level: MemberLevel, team: str | None) -> None:
        if not self._by_usage:
            return
        # The team's clock moved too, and its other members' heads are ranked among the teams by it.
        self._tops.touch(level[1], _tree_key(level[0], team))
        if level in self._oldest:
            self._refresh_level(level)

    def _best_by_usage(
        self, affinity: Affinity, bonus: float, now: float, excluded: frozenset[str], only: set[str] | None
    ) -> Best | None:
        """Each band's job by usage (an affine model's if affinity covers the gap), then the best of those by
        their own scores."""
        chosen: Best | None = None
        scan = bool(excluded) or only is not None
        if not scan:
            self._tops.refresh(self._bands, self._in_tree)
        for band, teams in self._bands.items():
            if only is not None:
                teams = {key: teams[key] for key in only if key in teams}
            top = self._band_pick(band, teams, affinity, bonus, now, excluded, scan)
            if top is None:
                continue
            job = top[2]
            value = self._own_key[(job.account, band, job.model)] + bonus * affinity.get(job.model, 0.0)
            if chosen is None or value > chosen[0] or (value == chosen[0] and top[1] < chosen[1]):
                chosen = (value, top[1], job)
        return chosen

    def _band_pick(
        self,
        band: int,
        teams: dict[str, RankedIndex[Job]],
        affinity: Affinity,
        bonus: float,
        now: float,
        excluded: frozenset[str],
        scan: bool,
    ) -> Best | None:
        """The band's job under usage: the team that used least for its weight, its member that used least for
        its weight; or an affine model's best job, when its affinity beyond that job's covers what separates
        them (of several, the one it carries furthest). Read from the ranked teams, or with ``scan`` from each
        of ``teams`` (a lane that some models are pinned away from, or that serves some teams only)."""
        if scan:
            top, local = self._scan_heads(band, teams, affinity.keys() - excluded, excluded)
        else:
            top, local = self._tops.heads(band, affinity.keys())
        if top is None:
            return top
        chosen, beaten = top, (top[0], top[1])
        for model, mine in local.items():
            share = affinity[model] - affinity.get(top[2].model, 0.0)
            if share <= 0:
                continue
            value = self._credited(mine, top, band, bonus * share, share, now)
            if value > beaten[0] or (value == beaten[0] and mine[1] < beaten[1]):
                chosen, beaten = mine, (value, mine[1])
        return chosen

    def _scan_heads(
        self, band: int, teams: dict[str, RankedIndex[Job]], models: Iterable[str], excluded: frozenset[str]
    ) -> tuple[Best | None, dict[str, Best]]:
        top: Best | None = None
        local: dict[str, Best] = {}
        for index in teams.values():
            head = index.best(NO_AFFINITY, excluded)
            if head is not None and _better(head := self._in_tree(head, band), top):
                top = head
            for model in models:
                mine = index.best_of(model)
                if mine is not None and _better(mine := self._in_tree(mine, band), local.get(model)):
                    local[model] = mine
        return top, local

    def _in_tree(self, head: Best, band: int) -> Best:
        """A team's head ranked among the band's teams: its key with the team's usage clock for its member's."""
        job = head[2]
        if job.team is None and self._members[job.account].weights == (1.0, 1.0):
            return head  # a team of one at weight 1: its team's clock is its own
        return head[0] + self._member_start(job, band) - self._team_start(job, band), head[1], job

    def _credited(self, local: Best, top: Best, band: int, bonus: float, share: float, now: float) -> float:
        """An affine model's best job of the band against its best job by usage, on the latter's scale: its key
        moved forward by the bonus (as under turns, and always inside one member), or by what crediting its team
        (another team's job) or its member (a teammate's) ``share`` of ``affinity_credit`` GPU-seconds moves it,
        whichever is more."""
        job, other = local[2], top[2]
        mine, credit = local[0], bonus
        who = job.account
        if who != other.account:
            level = (who, band)
            team = self._team(job)
            if team is None or team != self._team(other):
                ledger, key = (self._ledger, level) if team is None else (self._team_ledger, (team, band))
                weight, start = self._members[who].weights[0], self._team_start
            else:  # teammates: by their own keys, as inside the team
                ledger, key, weight = self._ledger, level, self._members[who].weights[1]
                mine = self._own_usage_key(job, band) + top[0] - self._own_usage_key(other, band)
                start = self._member_start
            clock = ledger.clock(key)
            if clock is not None:
                rest = ledger.seconds(key, now) - self.affinity_credit * share  # real GPU-seconds, whatever the weight
                credited = None if rest < NEGLIGIBLE else now + ledger.half_life * math.log2(rest / weight)
                credit = max(bonus, start(job, band) - self._usage_start(job, level, credited))
        return mine + credit

    def _team(self, job: Job) -> str | None:
        """The job's team in the tree: its namespace, or the team ``fairShareTeams`` puts its member in."""
        return self._teams(job.team, job.member)

    def _weighted(self, clock: float | None, weight: float) -> float | None:
        """A usage clock for usage divided by ``weight``."""
        return clock if clock is None or weight == 1.0 else clock - self._ledger.half_life * math.log2(weight)

    def _member_clock(self, level: MemberLevel) -> float | None:
        return self._weighted(self._ledger.clock(level), self._members[level[0]].weights[1])

    def _member_start(self, job: Job, band: int) -> float:
        level = (job.account, band)
        return self._usage_start(job, level, self._member_clock(level))

    def _team_start(self, job: Job, band: int) -> float:
        """The member's queue clock at the tree's upper level: its team's usage for its weight (a member
        without a team: its own usage for its own weight)."""
        level = (job.account, band)
        team = self._team(job)
        clock = self._ledger.clock(level) if team is None else self._team_ledger.clock((team, band))
        return self._usage_start(job, level, self._weighted(clock, self._members[level[0]].weights[0]))

    def _own_usage_key(self, job: Job, band: int) -> float:
        base = self._jobs[job.id][3]
        return base * self._divisor - self._member_start(job, band)

    def _served(self, level: MemberLevel, at: float) -> None:
        self._last_dispatch[level] = max(at, self._last_dispatch.get(level, at))
        if level in self._oldest:
            self._refresh_level(level)  # the dispatch restarts the clock of the member's whole band

    def _is_stale(self, entry: QueueEntry | tuple[float, int, str]) -> bool:
        held = self._jobs.get(entry[2])
        return held is None or held[1] != entry[1]

    def _compact(self, heaps: dict[_K, list[_E]], lent: set[_K], key: _K, live: int) -> None:
        heap = heaps[key]
        if len(heap) > 2 * live + 16:
            kept = [e for e in heap if not self._is_stale(e)]
            heapq.heapify(kept)
            heaps[key] = kept  # a new list: a copy that shares the old one keeps it as it was
            lent.discard(key)

    def _aging_start(self, job: Job, level: MemberLevel) -> float:
        last = self._last_dispatch.get(level)
        if last is None:
            return job.submitted_at
        return max(job.submitted_at, last + job.submitted_at - self._oldest[level][0][0])

    def _usage_start(self, job: Job, level: MemberLevel, clock: float | None) -> float:
        """The queue clock inside the band under usage: the member's usage clock, not its last turn."""
        if clock is None:
            return job.submitted_at
        return max(job.submitted_at, clock + job.submitted_at - self._oldest[level][0][0])

    def _drop_if_idle(self, member: str) -> None:
        """Forget a member whose last job left, once its heads are out of the indexes that read its team."""
        if not self._members[member].waiting:
            del self._members[member]

    def _unlist(self, qkey: QueueKey) -> None:
        """Take an emptied member queue's head out of its band's team index."""
        band, team = qkey[1], _tree_key(qkey[0], self._members[qkey[0]].team)
        teams = self._bands[band]
        self._band_index(band, team).discard(qkey)
        self._tops.touch(band, team)
        if not len(teams[team]):
            del teams[team]
            self._lent_teams.discard((band, team))
            if not teams:
                del self._bands[band]

    def _band_index(self, band: int, team: str) -> RankedIndex[Job]:
        """The band's index of a team's heads, to change: made if missing, and first copied if a copy shares it."""
        teams = self._bands.get(band)
        if teams is None:
            teams = self._bands[band] = {}
        index = teams.get(team)
        if index is None:
            index = teams[team] = RankedIndex()
        elif (band, team) in self._lent_teams:
            self._lent_teams.discard((band, team))
            index = teams[team] = index.copy()
        return index

    def _refresh_level(self, level: MemberLevel) -> None:
        oldest = self._oldest[level]
        if oldest and self._is_stale(oldest[0]):
            oldest = writable(self._oldest, self._lent_levels, level)
            while oldest and self._is_stale(oldest[0]):
                heapq.heappop(oldest)
        if not oldest:
            # An empty level's clock is moot: a later job's own submission is after it.
            del self._oldest[level], self._live_in_level[level]
            self._lent_levels.discard(level)
            self._last_dispatch.pop(level, None)
        for model in self._models.get(level, ()):
            self._refresh_head((*level, model))

    # Keys with aging are kept in seconds, (priority + tier) * divisor - aging_start, which is the
    # score times the divisor minus a shared now: exact for whole-second clocks, so ties stay ties.
    def _refresh_head(self, qkey: QueueKey) -> None:
        queue = self._queues[qkey]
        if queue and self._is_stale(queue[0]):
            queue = writable(self._queues, self._lent_queues, qkey)
            while queue and self._is_stale(queue[0]):
                heapq.heappop(queue)
        if not queue:
            del self._queues[qkey], self._live_in_queue[qkey]
            self._lent_queues.discard(qkey)
            level = (qkey[0], qkey[1])
            if models := self._models[level] - {qkey[2]}:
                self._models[level] = models
            else:
                del self._models[level]
            self._heads_no_aging.discard(qkey)
            if not self._by_usage:
                self._heads.discard(qkey)
                team = _tree_key(qkey[0], self._members[qkey[0]].team)
                self._team_heads[team].discard(qkey)
                if not len(self._team_heads[team]):
                    del self._team_heads[team]
                self._drop_if_idle(qkey[0])
                return
            del self._own_key[qkey]
            self._unlist(qkey)
            self._drop_if_idle(qkey[0])
            return
        job, seq, level, base = self._jobs[queue[0][2]]
        own = base * self._divisor - self._aging_start(job, level)
        if self._by_usage:
            self._own_key[qkey] = own
            team = _tree_key(level[0], self._members[level[0]].team)
            index = self._band_index(level[1], team)
            index.put(qkey, job.model, base * self._divisor - self._member_start(job, level[1]), seq, job)
            self._tops.touch(level[1], team)
        else:
            self._heads.put(qkey, job.model, own, seq, job)
            team = _tree_key(level[0], self._members[level[0]].team)
            index_in(self._team_heads, team).put(qkey, job.model, own, seq, job)
        if self._explain and self._heads_no_aging.current(qkey) is not job:  # no clock: only a new head moves it
            self._heads_no_aging.put(qkey, job.model, base, seq, job)


@dataclass(slots=True)
class _Member:
    """What the ranking keeps of a member while it has jobs waiting."""

    team: str | None  # None: a team of one
    weights: tuple[float, float]  # its team's weight, its own
    waiting: int = 0


def _tree_key(member: str, team: str | None) -> str:
    """A band's index of teams: a namespace's, or a member's own when it has none (prefixes keep them apart)."""
    return f"m:{member}" if team is None else f"t:{team}"


def _better(a: Best, b: Best | None) -> bool:
    return b is None or a[0] > b[0] or (a[0] == b[0] and a[1] < b[1])
