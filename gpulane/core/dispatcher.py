"""The dispatcher: a pure state machine from events to dispatch decisions.

It never sleeps, never calls out and reads time only from the injected clock, so hours of
scheduling run in milliseconds under test, and the simulator drives the very same code.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from gpulane.core.events import (
    Dispatch,
    Event,
    JobAdopted,
    JobCancelled,
    JobFinished,
    JobSubmitted,
    LaneUpdated,
    ModelLoaded,
    ModelUpdated,
    QueueServed,
)
from gpulane.core.jobs import Job, ModelCatalog
from gpulane.core.policy import Policy, PolicyError
from gpulane.core.ranking import Ranking, make_ranking

Clock = Callable[[], float]


@dataclass(slots=True)
class Lane:
    """One GPU. ``resident`` is the model loaded or loading; ``running`` holds its jobs' ids."""

    id: str
    online: bool = True
    resident: str | None = None
    running: set[str] = field(default_factory=set)
    loading_since: float | None = None  # when the resident model's load began, until it is ready

    @property
    def ready(self) -> bool:
        return self.resident is not None and self.loading_since is None


@dataclass(frozen=True, slots=True)
class Running:
    job: Job
    lane: str
    started_at: float | None  # None while it waits for its model to load


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
        self.running: dict[str, Running] = {}
        self.history: deque[Dispatch] = deque(maxlen=self.HISTORY)
        self._explain = explain
        self._seq = 0

    # -- events -------------------------------------------------------------------------

    def handle(self, event: Event) -> list[Dispatch]:
        """Apply one event, then dispatch whatever the lanes now have room for."""
        self._apply(event)
        return self.decide()

    def handle_all(self, events: Iterable[Event]) -> list[Dispatch]:
        """Apply every event of one instant, in order, then decide once.

        A job submitted at the instant a slot frees then competes for that slot on its score,
        instead of losing it to whichever job was waiting when the finish was applied alone.
        An event the dispatcher refuses raises as in ``handle``: the events before it stay
        applied (they happened) and nothing is decided yet, so call ``decide`` next.
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
                self.ranking.remove(job_id)
            case JobFinished(job_id, run_seconds):
                self._finish(job_id, run_seconds)
            case JobAdopted(job, adopted_on, started_at):
                self._adopt(job, adopted_on, started_at)
            case QueueServed(member, priority, at):
                self.ranking.note_served(member, priority, at)
            case LaneUpdated(lane_id, online, resident):
                self._update_lane(lane_id, online, resident)
            case ModelLoaded(lane_id, model, load_seconds):
                self._loaded(lane_id, model)
                if load_seconds is not None:
                    self.models.observe_load(model, load_seconds)
            case ModelUpdated(spec):
                self.models.update(spec)

    def replace_policy(self, policy: Policy) -> list[tuple[Job, str]]:
        """Re-rank every waiting job under ``policy``, keeping arrival order and fair-share clocks.

        Returns the jobs the new policy refuses (an unknown tier, a priority out of bounds) with the
        reason; they leave the queue. Running jobs and lanes are untouched; call ``decide`` next.
        """
        old, spacing = self.ranking, self.policy.band_spacing
        self.policy = policy
        self.ranking = make_ranking(old.name, policy)
        for (member, band), at in old.served().items():
            self.ranking.note_served(member, band * spacing, at)
        rejected: list[tuple[Job, str]] = []
        for job in old.pending():  # in arrival order
            try:
                policy.bonus_for_tier(job.tier)
                policy.check_priority(job.priority)
            except PolicyError as err:
                rejected.append((job, str(err)))
                continue
            self._seq += 1
            self.ranking.add(job, self._seq)
        return rejected

    @property
    def pending_count(self) -> int:
        return len(self.ranking)

    def _submit(self, job: Job) -> None:
        if job.id in self.ranking or job.id in self.running:
            raise DispatchError(f"job {job.id!r} is already known to the dispatcher")
        self.policy.bonus_for_tier(job.tier)  # rejects unknown tiers before they are queued
        self.policy.check_priority(job.priority)
        if not math.isfinite(job.submitted_at):
            raise DispatchError(f"job {job.id!r}: submission time {job.submitted_at} is not finite")
        expected = job.expected_run_seconds
        if expected is not None and not (math.isfinite(expected) and expected >= 0):
            raise DispatchError(f"job {job.id!r}: expected run seconds {expected} is not a finite number >= 0")
        self._seq += 1
        self.ranking.add(job, self._seq)

    def _finish(self, job_id: str, run_seconds: float | None) -> None:
        done = self.running.pop(job_id, None)
        if done is None:
            return  # finishing twice, or a job we never dispatched: nothing holds capacity
        lane = self.lanes.get(done.lane)
        if lane is not None:
            lane.running.discard(job_id)
        if run_seconds is not None:
            self.models.observe_run(done.job.model, run_seconds)

    def _adopt(self, job: Job, lane_id: str, started_at: float) -> None:
        self.ranking.remove(job.id)
        lane = self.lanes.setdefault(lane_id, Lane(lane_id))
        lane.resident, lane.loading_since = job.model, None
        lane.running.add(job.id)
        self.running[job.id] = Running(job, lane_id, started_at)
        self.ranking.note_served(job.member, job.priority, started_at)

    def _update_lane(self, lane_id: str, online: bool, resident: str | None) -> None:
        lane = self.lanes.setdefault(lane_id, Lane(lane_id))
        lane.online = online
        if resident != lane.resident:
            lane.resident, lane.loading_since = resident, None

    def _loaded(self, lane_id: str, model: str) -> None:
        lane = self.lanes.get(lane_id)
        if lane is None or lane.resident != model or lane.ready:
            return  # a stale report: the lane has moved on, or already knows
        now = self.clock()
        lane.loading_since = None
        for job_id in lane.running:
            run = self.running[job_id]
            if run.started_at is None:
                self.running[job_id] = replace(run, started_at=now)

    # -- decisions ----------------------------------------------------------------------

    def decide(self) -> list[Dispatch]:
        """Dispatch whatever the lanes have room for (``handle`` and ``handle_all`` end with this)."""
        decisions: list[Dispatch] = []
        while len(self.ranking):
            choice = self._best_pair()
            if choice is None:
                break
            decisions.append(self._dispatch(*choice))
        return decisions

    def _best_pair(self) -> tuple[Lane, Job] | None:
        """The best (lane, job) pair a lane may start now.

        A lane with room starts its best job if that job uses the resident model. If the best
        job needs another model, a busy lane starts nothing below it: it drains, then swaps.
        """
        chosen: tuple[float, int, Lane, Job] | None = None
        for lane in self.lanes.values():
            if not lane.online:
                continue
            if lane.running and len(lane.running) >= self.models.concurrency(lane.resident):
                continue
            best = self.ranking.best(lane.resident)
            if best is None:
                return None
            value, seq, job = best
            if lane.running and job.model != lane.resident:
                continue
            if chosen is None or value > chosen[0] or (value == chosen[0] and seq < chosen[1]):
                chosen = (value, seq, lane, job)
        return None if chosen is None else (chosen[2], chosen[3])

    def _dispatch(self, lane: Lane, job: Job) -> Dispatch:
        now = self.clock()
        score = self.ranking.breakdown(job, lane.resident, now)
        changed = self.ranking.alternatives(lane.resident, job) if self._explain else {}
        load = job.model != lane.resident
        replaces = lane.resident if load else None
        self.ranking.take(job, now)
        if load:
            lane.resident, lane.loading_since = job.model, now
        lane.running.add(job.id)
        self.running[job.id] = Running(job, lane.id, now if lane.ready else None)
        decision = Dispatch(job, lane.id, job.model, load, replaces, now, score, changed)
        if self._explain:
            self.history.append(decision)
        return decision

    # -- forecasts ----------------------------------------------------------------------

    def fork(self, clock: Clock) -> Dispatcher:
        """An independent copy on another clock, for forecasts (explanations off)."""
        clone = Dispatcher(self.policy, clock, self.models.copy(), self.ranking.copy(), explain=False)
        clone.lanes = {
            k: Lane(v.id, v.online, v.resident, set(v.running), v.loading_since) for k, v in self.lanes.items()
        }
        clone.running = dict(self.running)
        clone._seq = self._seq
        return clone
