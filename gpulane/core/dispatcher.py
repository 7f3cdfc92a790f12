"""The dispatcher: a pure state machine from events to dispatch decisions.

It never sleeps, never calls out and reads time only from the injected clock, so hours of
scheduling run in milliseconds under test, and the simulator drives the very same code.
Besides dispatches it expires jobs past their queue deadline, lets a load that no job has started
on yield to a much better newcomer, puts the jobs of a lost load back in the queue and unloads a model
idle past its ttl. ``handle`` returns all of it as one ordered list of effects, and the core is the
only holder of what runs where: the shells apply the effects and ask it (``on_lane``, ``placed``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

from gpulane.core.baselines import make_ranking
from gpulane.core.events import (
    Dispatch,
    Effect,
    Event,
    Expired,
    JobAdopted,
    JobCancelled,
    JobFinished,
    JobSubmitted,
    LaneMemory,
    LaneReserved,
    LaneUpdated,
    LoadLost,
    ModelLoaded,
    ModelRemoved,
    ModelUpdated,
    QueueServed,
    Requeued,
    TeamUsageRestored,
    UnloadAll,
    Unloaded,
    UsageRestored,
)
from gpulane.core.jobs import Job, ModelCatalog, ModelSpec
from gpulane.core.lanes import Charge, Lane, LaneState, Running
from gpulane.core.policy import Policy, PolicyError
from gpulane.core.queue_deadlines import QueueDeadlines
from gpulane.core.ranking import NO_AFFINITY, MemberLevel, Ranking
from gpulane.core.score import ScoreBreakdown

Clock = Callable[[], float]


class DispatchError(ValueError):
    """An event the dispatcher cannot accept (for example a duplicate job id)."""


class Dispatcher:
    HISTORY = 10_000

    def __init__(
        self,
        policy: Policy,
        clock: Clock,
        models: ModelCatalog | None = None,
        ranking: Ranking | None = None,
        *,
        explain: bool = True,
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.models = models if models is not None else ModelCatalog()
        self.ranking = ranking if ranking is not None else make_ranking("gpulane", policy)
        self.lanes: dict[str, Lane] = {}
        self.history: deque[Dispatch] = deque(maxlen=self.HISTORY)
        self._explain = explain
        self._seq = 0
        self._deadlines = QueueDeadlines()  # of jobs not started yet
        self._yielded: set[str] = set()  # jobs whose load yielded once: their next load sticks
        self._reloaded: set[str] = set()  # jobs whose load was lost once: a second loss fails them
        self._effects: list[Effect] = []  # what happened since the last decision, returned by it

    # -- events -------------------------------------------------------------------------

    def handle(self, event: Event) -> list[Effect]:
        """Apply one event, then dispatch whatever the lanes now have room for: every consequence, in order."""
        self._apply(event)
        return self.decide()

    def handle_all(self, events: Iterable[Event]) -> list[Effect]:
        """Apply every event of one instant, in order, then decide once.

        A job submitted at the instant a slot frees then competes for that slot on its score,
        instead of losing it to whichever job was waiting when the finish was applied alone.
        An event the dispatcher refuses raises as in ``handle``: the events before it stay
        applied (they happened) and nothing is decided yet, so call ``decide`` next: it returns their effects.
        """
        for event in events:
            self._apply(event)
        return self.decide()

    def _apply(self, event: Event) -> None:
        """Take one event into the state without deciding."""
        match event:
            case JobSubmitted(job):
                self._submit(job)
            case JobCancelled(job_id):
                if self.ranking.remove(job_id) is not None:
                    self._forget(job_id)
            case JobFinished(job_id, run_seconds):
                self._finish(job_id, run_seconds)
            case JobAdopted(job, adopted_on, started_at):
                self._adopt(job, adopted_on, started_at)
            case QueueServed(member, priority, at):
                self.ranking.note_served(member, priority, at)
            case UsageRestored(member, priority, seconds, at):
                self.ranking.restore_usage(member, priority, seconds, at)
            case TeamUsageRestored(team, priority, seconds, at):
                self.ranking.restore_team_usage(team, priority, seconds, at)
            case LaneUpdated(lane_id, online, resident, loaded):
                self._update_lane(lane_id, online, resident, loaded)
            case LaneMemory(lane_id, memory_mib):  # a lane first seen here is offline until LaneUpdated says
                self.lanes.setdefault(lane_id, Lane(lane_id, online=False)).memory_mib = memory_mib
            case LaneReserved(lane_id, owners):  # a lane first seen here is offline until LaneUpdated says
                self.lanes.setdefault(lane_id, Lane(lane_id, online=False)).owners = owners
            case LoadLost(lane_id):
                self._lose_load(lane_id)
            case ModelLoaded(lane_id, model, load_seconds, in_server):
                self._loaded(lane_id, model)
                if load_seconds is not None:
                    (self.models.observe_switch if in_server else self.models.observe_load)(model, load_seconds)
            case ModelUpdated(spec):
                self.models.update(spec)
            case ModelRemoved(model):
                for lane in self.lanes.values():
                    lane.loaded.pop(model, None)  # the lane's runner has its server unload it
                self._drain(lane for lane in self.lanes.values() if lane.resident == model)
            case UnloadAll():
                self._drain(lane for lane in self.lanes.values() if lane.resident is not None or lane.loaded)

    def replace_policy(self, policy: Policy) -> list[tuple[Job, str]]:
        """Re-rank every waiting job under ``policy``, keeping arrival order and fair-share clocks.

        Returns the jobs the new policy refuses (an unknown tier, a priority out of bounds) with the
        reason; they leave the queue. Running jobs and lanes are untouched; call ``decide`` next.
        """
        old, spacing, now = self.ranking, self.policy.band_spacing, self.clock()
        self.policy = policy
        self.ranking = make_ranking(old.name, policy)
        for (member, band), at in old.served().items():
            self.ranking.note_served(member, band * spacing, at)
        for (member, band), seconds in old.usage(now).items():
            self.ranking.restore_usage(member, band * spacing, seconds, now)
        for (team, band), seconds in old.team_usage(now).items():
            self.ranking.restore_team_usage(team, band * spacing, seconds, now)
        rejected: list[tuple[Job, str]] = []
        for job in old.pending():  # in arrival order
            self._forget(job.id)
            try:
                policy.bonus_for_tier(job.tier)
                policy.check_priority(job.priority)
            except PolicyError as err:
                rejected.append((job, str(err)))
                continue
            self._seq += 1
            self.ranking.add(job, self._seq)
            self._set_deadline(job)  # the band defaults may have changed
        return rejected

    def next_deadline(self) -> float | None:
        """The earliest queue deadline of a job not started yet, or of a lane idle up to its model's ttl: call
        ``decide`` then, to expire the job or unload the model."""
        due = [d for lane in self.lanes.values() if (d := self._idle_deadline(lane)) is not None]
        if (queued := self._deadlines.earliest()) is not None:
            due.append(queued)
        return min(due, default=None)

    @property
    def pending_count(self) -> int:
        return len(self.ranking)

    # -- reads for the shells -----------------------------------------------------------

    @property
    def running(self) -> dict[str, Running]:
        """Every dispatched job that has not ended, by id (a copy)."""
        return {job_id: run for lane in self.lanes.values() for job_id, run in lane.running.items()}

    def placed(self, job_id: str) -> Running | None:
        """Where a dispatched job runs, or None when it waits or has ended."""
        lane = self._lane_of(job_id)
        return None if lane is None else lane.running[job_id]

    def on_lane(self, lane_id: str) -> list[Running]:
        """The jobs holding ``lane_id``'s capacity, in dispatch order."""
        lane = self.lanes.get(lane_id)
        return [] if lane is None else list(lane.running.values())

    def lane_state(self, lane_id: str) -> LaneState | None:
        lane = self.lanes.get(lane_id)
        if lane is None:
            return None
        return lane.state()

    def pending(self) -> Iterator[Job]:
        """The waiting jobs, in arrival order."""
        return self.ranking.pending()

    def waiting(self) -> dict[int, tuple[int, float]]:
        """Per band index, how many jobs wait and the earliest submission among them, without walking them."""
        return self.ranking.waiting()

    def score(self, job: Job, lane_id: str | None, now: float) -> ScoreBreakdown:
        """A waiting job's score at ``now`` on ``lane_id`` (its affinity is the lane's resident model's)."""
        lane = self.lanes.get(lane_id or "")
        return self.ranking.breakdown(job, NO_AFFINITY if lane is None else lane.affinity(self.models), now)

    def served(self) -> dict[MemberLevel, float]:
        """When each (member, band) queue was last served, to persist."""
        return self.ranking.served()

    def usage(self, now: float) -> dict[MemberLevel, float]:
        """Each (member, band)'s decayed GPU-seconds at ``now``, to persist."""
        return self.ranking.usage(now)

    def team_usage(self, now: float) -> dict[MemberLevel, float]:
        """Each (team, band)'s decayed GPU-seconds at ``now``, to persist."""
        return self.ranking.team_usage(now)

    def model(self, name: str) -> ModelSpec:
        """A model's spec with what was learned of its load and run times."""
        return self.models.get(name)

    def _lane_of(self, job_id: str) -> Lane | None:
        return next((lane for lane in self.lanes.values() if job_id in lane.running), None)

    def _submit(self, job: Job) -> None:
        if job.id in self.ranking or self._lane_of(job.id) is not None:
            raise DispatchError(f"job {job.id!r} is already known to the dispatcher")
        self.policy.bonus_for_tier(job.tier)  # rejects unknown tiers before they are queued
        self.policy.check_priority(job.priority)
        if not math.isfinite(job.submitted_at):
            raise DispatchError(f"job {job.id!r}: submission time {job.submitted_at} is not finite")
        expected = job.expected_run_seconds
        if expected is not None and not (math.isfinite(expected) and expected >= 0):
            raise DispatchError(f"job {job.id!r}: expected run seconds {expected} is not a finite number >= 0")
        timeout = job.queue_timeout_seconds
        if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
            raise DispatchError(f"job {job.id!r}: queue timeout {timeout} is not a finite number of seconds > 0")
        self._seq += 1
        self.ranking.add(job, self._seq)
        self._set_deadline(job)

    def _set_deadline(self, job: Job) -> None:
        timeout = self.policy.queue_timeout(job.priority, job.queue_timeout_seconds, job.team, job.member)
        if timeout is not None:
            self._deadlines.set(job.id, job.submitted_at + timeout, self._seq)

    def _forget(self, job_id: str) -> None:
        self._deadlines.discard(job_id)
        self._yielded.discard(job_id)
        self._reloaded.discard(job_id)

    def _finish(self, job_id: str, run_seconds: float | None) -> None:
        lane = self._lane_of(job_id)
        if lane is None:
            return  # finishing twice, or a job we never dispatched: nothing holds capacity
        done = lane.running.pop(job_id)
        self._forget(job_id)
        self._evict_if_idle(lane)
        if run_seconds is not None:
            self.models.observe_run(done.job.model, run_seconds)
        self._settle(done)

    def _settle(self, run: Running) -> None:
        """Correct the member's charge to the time the job really held its lane, load included."""
        if run.charge is not None:
            start, charged = run.charge.decision.at, run.charge.seconds
            used = max(0.0, self.clock() - start)
            if used != charged:
                self.ranking.correct_usage(run.job, start, charged, used)

    def _adopt(self, job: Job, lane_id: str, started_at: float) -> None:
        self.ranking.remove(job.id)
        self._forget(job.id)
        lane = self.lanes.setdefault(lane_id, Lane(lane_id))
        lane.resident, lane.loading_since, lane.idle_since = job.model, None, None
        lane.server = self.models.get(job.model).server
        lane.running[job.id] = Running(job, lane_id, started_at)
        self.ranking.note_served(job.account, job.priority, started_at)

    def _update_lane(self, lane_id: str, online: bool, resident: str | None, loaded: frozenset[str] | None) -> None:
        lane = self.lanes.setdefault(lane_id, Lane(lane_id))
        lane.online = online
        if resident != lane.resident:
            lane.resident, lane.loading_since, lane.evicting = resident, None, False
            lane.idle_since = None
        if resident is None and loaded is None:
            lane.loaded = {}  # nothing serves: its pod is gone, and whatever its server held
        elif loaded is not None and loaded != lane.loaded.keys():
            now = self.clock()
            lane.loaded = {model: lane.loaded.get(model, now) for model in loaded - {resident}}
        # The lane's server: the one its models belong to, or the resident itself when that is a server (its pod
        # up with no model known to serve, after a restart or a failed load).
        held = [self.models.get(m).server or (m if self.models.of_server(m) else None) for m in (resident, *lane.loaded)
                if m is not None]  # fmt: skip
        lane.server = next((s for s in held if s is not None), None)
        self._evict_if_idle(lane)  # a model found loaded with no job (a rebuild): its idle time starts now

    def _lose_load(self, lane_id: str) -> None:
        lane = self.lanes.get(lane_id)
        if lane is None:
            return
        if lane.loading_since is not None:
            now = self.clock()
            for job_id, run in sorted(lane.running.items()):
                if run.started_at is None and run.charge is not None and job_id not in self._reloaded:
                    self._unrun(lane, run, run.charge)
                    self._reloaded.add(job_id)
                    self._effects.append(Requeued(run.job, lane.id, now, None))
        lane.clear()

    def _drain(self, lanes: Iterable[Lane]) -> None:
        """These lanes take no new job and drop their model once their jobs end (at once when none runs)."""
        for lane in list(lanes):
            lane.evicting = True
            self._evict_if_idle(lane)

    def _evict_if_idle(self, lane: Lane) -> None:
        """A lane whose last job just left: it drops a removed model, else its idle time starts."""
        if lane.running:
            return
        if lane.evicting:
            lane.clear()
        if lane.resident is not None and lane.idle_since is None:
            lane.idle_since = self.clock()

    def _unload_idle(self, now: float) -> None:
        """Lanes idle past their model's ttl give the model up."""
        for lane in self.lanes.values():
            due = self._idle_deadline(lane)
            if due is not None and due <= now and lane.resident is not None and lane.idle_since is not None:
                self._effects.append(Unloaded(lane.id, lane.resident, now - lane.idle_since, now))
                lane.clear()  # its pod goes, and with a server's, every model it held

    def _idle_deadline(self, lane: Lane) -> float | None:
        if lane.running or lane.resident is None or lane.idle_since is None:
            return None
        ttl = self.models.get(lane.resident).ttl_seconds
        return None if ttl is None else lane.idle_since + ttl

    def _unrun(self, lane: Lane, run: Running, charge: Charge) -> None:
        """A job dispatched but never started waits again in its place, its charge undone."""
        del lane.running[run.job.id]
        self._evict_if_idle(lane)
        self.ranking.untake(run.job, charge.seq, charge.decision.at, charge.seconds, charge.served_before)

    def _loaded(self, lane_id: str, model: str) -> None:
        lane = self.lanes.get(lane_id)
        if lane is None or lane.resident != model or lane.ready:
            return  # a stale report: the lane has moved on, or already knows
        now = self.clock()
        lane.loading_since = None
        for job_id, run in lane.running.items():
            deadline = self._deadlines.get(job_id)
            if run.started_at is None and (deadline is None or deadline > now):  # else it expires instead
                lane.running[job_id] = replace(run, started_at=now)
                self._deadlines.discard(job_id)

    # -- decisions ----------------------------------------------------------------------

    def decide(self) -> list[Effect]:
        """Expire, unload and yield what is due, then dispatch whatever the lanes have room for; every effect
        since the last decision, in order (``handle`` and ``handle_all`` end with this)."""
        now = self.clock()
        self._expire(now)
        self._unload_idle(now)
        if self.policy.load_yield:
            self._yield_loads(now)
        while len(self.ranking):
            choice = self._best_pair(now)
            if choice is None:
                break
            self._effects.append(self._dispatch(*choice))
        effects, self._effects = self._effects, []
        return effects

    def _expire(self, now: float) -> None:
        """Jobs at their deadline leave the queue, or the lane whose load they were waiting for."""
        for job_id, deadline in self._deadlines.due(now):
            self._forget(job_id)
            job, lane = self.ranking.remove(job_id), None
            if job is None:  # dispatched to a lane still loading: it never starts
                on = self._lane_of(job_id)
                assert on is not None
                run = on.running.pop(job_id)
                self._evict_if_idle(on)
                self._settle(run)
                job, lane = run.job, run.lane
            self._effects.append(Expired(job, now, deadline, lane))

    def _yield_loads(self, now: float) -> None:
        """A load no job started on gives way to a newcomer that outscores its jobs past the offsets.

        Tier and affinity only break near-ties, so only a newcomer from a higher band (or aged far
        ahead) qualifies; the load's jobs wait again in their places. Once per job, then it sticks.
        """
        lanes = self.lanes.values()
        if any(lane.online and not lane.running for lane in lanes):
            return  # the newcomer has a lane without taking one away
        margin = max(self.policy.tier_bonus.values()) + self.policy.affinity_bonus
        for lane in lanes:
            if lane.loading_since is None or not lane.running or not lane.online:
                continue
            runs = list(lane.running.values())
            charges = [r.charge for r in runs if r.charge is not None and r.job.id not in self._yielded]
            if len(charges) < len(runs):
                continue
            best = self.ranking.best(NO_AFFINITY, now, self.models.excluded_on(lane.id))
            if best is None:
                continue
            _, seq, newcomer = best
            if seq <= max(c.last_arrival for c in charges):
                continue
            # The load's jobs as they would score now, had they kept waiting (without affinity).
            waiting = max(
                c.decision.score.total
                - c.decision.score.affinity
                + (now - c.decision.at) / self.policy.aging_divisor_seconds
                for c in charges
            )
            if self.ranking.breakdown(newcomer, NO_AFFINITY, now).total - waiting <= margin:
                continue
            for run, charge in zip(runs, charges, strict=True):
                self._unrun(lane, run, charge)
                self._yielded.add(run.job.id)
                self._effects.append(Requeued(run.job, lane.id, now, newcomer.id))

    def _best_pair(self, now: float) -> tuple[Lane, Job, int] | None:
        """The best (lane, job) pair a lane may start now.

        A lane with room starts its best job if that job uses the resident model. If the best
        job needs another model, a busy lane starts nothing below it: it drains, then swaps.
        """
        chosen: tuple[float, int, Lane, Job] | None = None
        for lane in self.lanes.values():
            if not lane.online or lane.evicting:
                continue
            if lane.running and len(lane.running) >= self.models.concurrency(lane.resident):
                continue
            excluded = self.models.excluded_on(lane.id)
            affinity = lane.affinity(self.models, excluded)
            best = None if lane.owners is None else self.ranking.best(affinity, now, excluded, lane.owners)
            if best is None:  # not reserved, or lent: none of its owners' jobs waits
                best = self.ranking.best(affinity, now, excluded)
            if best is None:
                if excluded:
                    continue  # nothing this lane may serve waits; another lane's models may
                return None
            value, seq, job = best
            if lane.running and job.model != lane.resident:
                continue
            if chosen is None or value > chosen[0] or (value == chosen[0] and seq < chosen[1]):
                chosen = (value, seq, lane, job)
        return None if chosen is None else (chosen[2], chosen[3], chosen[1])

    def _dispatch(self, lane: Lane, job: Job, seq: int) -> Dispatch:
        now = self.clock()
        affinity = lane.affinity(self.models)
        score = self.ranking.breakdown(job, affinity, now)
        changed = self.ranking.alternatives(affinity, job, now) if self._explain else {}
        spec = self.models.get(job.model)
        in_server = lane.server is not None and spec.server == lane.server
        evicts: tuple[str, ...] = ()
        load = job.model != lane.resident and not (in_server and job.model in lane.loaded)
        replaces = lane.resident if load and not in_server else None
        # Charged now, so that a burst's usage shows at once; corrected when the job ends. Never below the
        # model's learned run: a submitter's own low estimate (expectedRunSeconds: 0) would buy turns.
        cost = (
            (spec.load_seconds if spec.switch_seconds is None or not in_server else spec.switch_seconds)
            if load
            else 0.0
        )
        expected = max(self.models.expected_run(job), spec.run_seconds) + cost
        served_before = self.ranking.take(job, now, expected)
        if job.model != lane.resident:
            if in_server:
                evicts = lane.switch(job.model, now, load, self.models)
            else:
                lane.clear()
                lane.server = spec.server
            lane.resident, lane.loading_since = job.model, now if load else None
        lane.idle_since = None
        band = self.policy.band(job.priority) * self.policy.band_spacing
        decision = Dispatch(
            job, lane.id, job.model, load, replaces, now, score, changed, in_server and load, evicts, band
        )
        charge = Charge(decision, seq, expected, served_before, self._seq)
        started = now if lane.ready else None
        if started is not None:
            self._deadlines.discard(job.id)
        lane.running[job.id] = Running(job, lane.id, started, charge)
        if self._explain:
            self.history.append(decision)
        return decision

    # -- forecasts ----------------------------------------------------------------------

    def fork(self, clock: Clock) -> Dispatcher:
        """An independent copy on another clock, for forecasts (explanations off)."""
        clone = Dispatcher(self.policy, clock, self.models.copy(), self.ranking.copy(explain=False), explain=False)
        clone.lanes = {k: v.copy() for k, v in self.lanes.items()}
        clone._seq = self._seq
        clone._deadlines = self._deadlines.copy()  # lent: with queue timeouts it holds every waiting job
        clone._yielded = set(self._yielded)
        clone._reloaded = set(self._reloaded)
        return clone
