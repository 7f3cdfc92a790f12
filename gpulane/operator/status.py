"""The one writer of queue status: positions, estimates and scores of waiting jobs, and the status of
lanes and models.

Writes are coalesced and rate-limited so that thousands of waiting jobs cause no patch storm:
- the first ``exact_positions`` jobs of each lane get exact positions and estimates, rewritten when
  they move or the estimate shifts noticeably;
- jobs beyond them get a position rounded up to the next bucket (``positionExact: false``), rewritten only
  when that bucket changes. Buckets widen with the distance from the head (``exact_positions`` times 1, 2,
  5, 10, 20, 50, ...), so a dispatch, which moves every job behind it by one, rewrites one job per bucket
  boundary: a number that grows with the logarithm of the queue, not its length;
- each pass writes the jobs that have no position yet first, then the rest, each head of the queue
  first, at most ``status_writes_per_second`` per second; whatever is left waits for the next pass,
  which recomputes from the newest state;
- a pass forecasts the whole queue only when its order changed beyond the head (a job arrived or went
  back to waiting, a lane, model or the policy changed: ``reorder``) or the last whole forecast has aged
  past its share of the loop; otherwise it forecasts the head of each lane alone. So a long queue's
  dispatches do not each pay for a forecast of all of it; far jobs' rounded positions then lag by up to
  that age, which their ``estimatedAt`` says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpulane.api.conditions import condition, merge_condition
from gpulane.api.contract import FINALIZER, Body
from gpulane.api.resources import GpuLaneStatus, GpuModelStatus
from gpulane.api.times import format_micro_time, format_time
from gpulane.core.dispatcher import Dispatcher
from gpulane.core.events import Effect, Event, JobCancelled, JobFinished, ModelLoaded, Requeued
from gpulane.core.forecast import forecasting
from gpulane.kube.client import Gone
from gpulane.kube.protocol import KubeClient
from gpulane.operator.history import DispatchHistory
from gpulane.operator.job_table import JobState, JobTable, JobView
from gpulane.operator.job_writes import JobWrites, job_status
from gpulane.operator.lanes import LaneRunner
from gpulane.operator.metrics import Metrics
from gpulane.operator.observed import Observed
from gpulane.operator.settings import Settings
from gpulane.operator.translate import band_label, score_fields

log = logging.getLogger(__name__)

# Even with nothing new, estimates and scores drift as time passes: refresh them this often.
REFRESH_SECONDS = 10.0
# Writes in flight at once. A job's first position is what its submitter waits for, and a burst of thousands
# is bound by the apiserver's latency, not its CPU: many at once (bench/operator.py scale, 1.4x with 32 than 8).
# Later rewrites are refreshes, so that they do not crowd a dispatch's Running write: one at a time from a
# settled queue (bench/operator.py latency, 300 dispatches at 1,000 pending: the slowest came with a pass's
# wave of refreshes, 4 in flight; with 1 the p99 was 0.70x), 4 in a burst, whose first positions go 32 at a
# time anyway and whose refreshes must keep pace.
FIRST_WRITES = 32
REFRESH_WRITES = 1
BURST_REFRESH_WRITES = 4
# While jobs wait for a first position, positions that moved are rewritten at most this often: in a burst each
# pass moved the head's exact positions again, and rewriting them every pass took a seventh of the writes
# (16,005 of 116,005 at 100,000 jobs) from the apiserver that the first positions and the creations share.
REFRESH_DEFER_SECONDS = 10.0
# Past this many places per lane from the queue's head (positions count the next jobs to start on any lane),
# exact positions that moved are rewritten at most every REFRESH_DEFER_SECONDS too, burst or not: each dispatch
# moves all of them by one, and with short jobs (a bridge's chat calls, a dispatch a second) rewriting every one
# every pass made a write per waiting job per dispatch. The head's, which its submitters watch count down, go
# every pass; estimatedAt says when each was computed.
HEAD_POSITIONS = 10
# And rounded positions whose bucket changed, this often: arrivals of several members interleave, so in a burst
# a bucket boundary is crossed by hundreds of jobs every few seconds (14,793 rewrites at 100,000 jobs with the
# 10 s above). A rounded position is a rough figure; its estimatedAt says how old it is.
ROUNDED_DEFER_SECONDS = 60.0
# And at most this many of them in one pass, head first: a pass waits for its writes, and a minute's rounded
# rewrites (thousands, 4 in flight) held the next pass's first positions back for as long.
BURST_REFRESHES = 100
DISPATCH_POLL_SECONDS = 0.005
# The forecast gives the event loop its turn this often, and takes at most this share of the loop's time.
FORECAST_SLICE_SECONDS = 0.003
FORECAST_SHARE = 0.25
# Its first step cannot be sliced: the dispatcher's fork (0.2 to 8 ms at 100,000 pending, what it shares lent
# rather than copied: bench/dispatch.py --forks), and a dispatch that arrives meanwhile waits for it. The longest
# hold of a pass spaces the passes so that holds take at most this share of the loop's time: a hold of 60 ms, a
# pass every 2 s.
HOLD_SHARE = 0.03
# The whole queue's forecast, when nothing reordered it, takes at most this share of the loop's time.
FULL_FORECAST_SHARE = 0.05
# A head pass forecasts until each lane has its exact positions, or this many times their sum at most.
HEAD_FORECAST_SPAN = 4
DISPATCH_WAIT_SECONDS = 1.0
# The most time one pass's write budget stands for.
BUDGET_SECONDS = 60.0

# (job, the state it must still be in, the status to merge, what the writer remembers having written)
Write = tuple[JobView, JobState, Body, tuple[Any, ...]]


def pause(interval: float, elapsed: float, forecast_seconds: float, held_seconds: float = 0.0) -> float:
    """How long the writer waits after a pass of ``elapsed`` seconds. Passes start at most once per interval,
    so a pass's budget is also a rate; and a long queue's forecast takes at most ``FORECAST_SHARE`` of the
    loop's time (positions and estimates then come less often: every 2.8 s for a 0.7 s forecast), and its longest
    hold of the loop, ``held_seconds``, at most ``HOLD_SHARE``."""
    return max(
        0.05, interval - elapsed, forecast_seconds / FORECAST_SHARE - elapsed, held_seconds / HOLD_SHARE - elapsed
    )


def bucket(position: int, exact: int) -> int:
    """``position`` rounded up to the next of ``exact`` times 1, 2, 5, 10, 20, 50, ...: the rounded positions
    of jobs far from the head, which change only when a job crosses one of these boundaries."""
    scale = exact
    while True:
        for step in (1, 2, 5):
            if position <= step * scale:
                return step * scale
        scale *= 10


def _exact(write: Write) -> bool:
    """A write of an exact position (or a parked job's reason), not of a rounded one."""
    return bool(write[2].get("positionExact", True))


def _deep(write: Write, head: int) -> bool:
    """A rewrite of an exact position past the queue's first ``head`` places, over a position, exact or rounded (a
    job that had none, or was parked, is written at once). A job that comes within the exact positions keeps its
    rounded one, an upper bound, until then: each dispatch brings one there, a write per dispatch otherwise."""
    written = write[0].written
    positioned = written is not None and len(written) == 5
    return positioned and write[2].get("positionExact") is True and write[2].get("position", 0) > head


@dataclass(frozen=True)
class StatusPorts:
    """What the status writer reads, and where it writes: nothing here is written but statuses (the controller
    builds it once)."""

    settings: Settings
    clock: Callable[[], float]
    kube: KubeClient  # the lanes' and models' status patches
    dispatcher: Dispatcher  # read: forecasts play a fork of it
    jobs: JobTable
    observed: Observed
    history: DispatchHistory
    lanes: dict[str, LaneRunner]
    writes: JobWrites  # the jobs' positions
    metrics: Metrics  # lane readiness, set where the lane's Ready condition is; the forecasts' cost


class StatusWriter:
    def __init__(self, ports: StatusPorts) -> None:
        self.ports = ports
        self.dirty = True
        self._lanes: set[str] = set()
        self._models: set[str] = set()
        self._depth: dict[str, dict[str, int]] = {}
        # What each lane's status shows, as last written: its queue depth per band and its conditions.
        self._written_depth: dict[str, dict[str, int]] = {}
        self._lane_conditions: dict[str, list[Body]] = {}
        self._last_pass = -math.inf
        self.monotonic = time.monotonic  # the passes' spacing (a test's own clock)
        self._began = self.monotonic()  # when the last pass began
        self._refreshed = -math.inf  # when the last pass that rewrote moved exact positions began
        self._rounded = -math.inf  # and rounded ones
        self._deep = -math.inf  # and exact ones past the head's places
        self._holds: dict[str, float] = {}  # each dispatch in flight: until when it holds positions back
        self.forecast_seconds = 0.0  # the last pass's forecast, slices included: what a pass costs the loop
        self.held_seconds = 0.0  # and the longest it held the loop at once (its first step: the fork)
        self._reordered = True  # the next pass forecasts the whole queue
        self._full_at = -math.inf  # when the last whole forecast began (monotonic)
        self._full_seconds = 0.0  # and what it cost
        self._policy = ports.dispatcher.policy  # the policy the last whole forecast ranked by

    def reorder(self) -> None:
        """The queue's order changed beyond its head, or a job waits without a position: the next pass
        forecasts all of it."""
        self._reordered = self.dirty = True

    def decided(self, effects: list[Effect], event: Event | None = None) -> None:
        """What the core did, and the event that made it: the lanes it touched are rewritten. A job's end or
        cancel, or a model loaded, moves the queue by one (each lane's head has it); any other event may reorder
        all of it, or bring a job that needs a position, and so does a job that waits again."""
        self._lanes.update(effect.lane for effect in effects if effect.lane is not None)
        moves = event is None or isinstance(event, JobFinished | JobCancelled | ModelLoaded)
        if not moves or any(isinstance(effect, Requeued) for effect in effects):
            self.reorder()
        self.dirty = True

    def _full_due(self) -> bool:
        if self.ports.dispatcher.policy is not self._policy:  # a new policy ranks the whole queue anew
            self._policy, self._reordered = self.ports.dispatcher.policy, True
        age = time.monotonic() - self._full_at
        return self._reordered or age >= max(REFRESH_SECONDS, self._full_seconds / FULL_FORECAST_SHARE)

    def lane_dirty(self, lane: str) -> None:
        self._lanes.add(lane)

    def model_dirty(self, model: str) -> None:
        self._models.add(model)

    def learned(self, model: str, what: str) -> None:
        """Bring the model's learned status in step with what the core has just learned from a ``load``, a
        ``switch`` (a load by the lane's running server) or a ``run``, and have it written; nothing for a model
        that has no GpuModel (any more)."""
        if model not in self.ports.observed.models:
            return
        spec = self.ports.dispatcher.model(model)
        stats = self.ports.observed.learned.setdefault(model, {})
        stats["loadSeconds"] = round(spec.load_seconds, 3)
        stats["runSeconds"] = round(spec.run_seconds, 3)
        if spec.switch_seconds is not None:
            stats["switchSeconds"] = round(spec.switch_seconds, 3)
        count = {"load": "loads", "switch": "switches"}.get(what, "runs")
        stats[count] = stats.get(count, 0) + 1
        self.model_dirty(model)

    def lane_seen(self, lane: str, status: Body) -> None:
        """A lane first seen: its conditions as its status shows them (their transition times carry on)."""
        self._lane_conditions[lane] = list(status.get("conditions") or [])
        self.lane_dirty(lane)

    def lane_gone(self, lane: str) -> None:
        for held in (self._written_depth, self._lane_conditions, self._depth):
            held.pop(lane, None)

    async def run(self) -> None:
        interval = self.ports.settings.status_interval
        while True:
            started = time.monotonic()
            try:
                await self.flush()
            except Exception:
                log.exception("status pass failed; retrying")
            elapsed = time.monotonic() - started
            await asyncio.sleep(pause(interval, elapsed, self.forecast_seconds, self.held_seconds))

    async def flush(self) -> None:
        ports = self.ports
        now, began = ports.clock(), self.monotonic()
        # The writes a pass may make stand for the time since the last one: passes are spaced when the queue is
        # long (every 16 s at 100,000 pending), and a budget of one interval's would then cap positions far below
        # the rate (30 a second: 100,000 new jobs positioned in an hour).
        since = min(max(began - self._began, ports.settings.status_interval), BUDGET_SECONDS)
        self._began = began
        budget = max(1, int(ports.settings.status_writes_per_second * since))
        writes: list[Write] = []
        firsts = 0  # jobs that wait for their first position: a burst
        if self.dirty or now - self._last_pass >= REFRESH_SECONDS:
            self.dirty = False
            self._last_pass = now
            # First positions before refreshes, each head first: in a burst a job with no position at all
            # goes before one whose position moved (refreshes wait for a pass with budget left).
            full = self._full_due()
            writes = sorted(await self._queue_writes(now, full), key=lambda w: w[0].written is not None)
            firsts = sum(1 for w in writes if w[0].written is None)
            head = HEAD_POSITIONS * max(1, len(ports.lanes))

            def deep(write: Write) -> bool:
                return _deep(write, head)

            if began - self._deep < REFRESH_DEFER_SECONDS:  # the next dispatch, or the pass every
                writes = [w for w in writes if not deep(w)]  # REFRESH_SECONDS, writes them when due
            if 0 < firsts < len(writes):  # a burst: the refreshes once it is written, or now and then
                exact_due = began - self._refreshed >= REFRESH_DEFER_SECONDS
                rounded_due = began - self._rounded >= ROUNDED_DEFER_SECONDS
                due = [w for w in writes[firsts:] if (exact_due if _exact(w) else rounded_due)]
                kept = writes[:firsts] + due[:BURST_REFRESHES]
                writes, self.dirty = kept, self.dirty or len(kept) < len(writes)
            cost = 0
            for i, (view, _, status, _) in enumerate(writes):
                # A job near the head also gets its finalizer: a second write.
                cost += 2 if status.get("positionExact") and FINALIZER not in view.finalizers else 1
                if cost > budget:
                    self.dirty = True  # the rest next pass, recomputed
                    self._reordered = self._reordered or full
                    writes = writes[:i]
                    break
            refreshed = writes[firsts:]
            if any(_exact(w) for w in refreshed):
                self._refreshed = began
            if any(not _exact(w) for w in refreshed):
                self._rounded = began
            if any(deep(w) for w in refreshed):
                self._deep = began
        first = asyncio.Semaphore(FIRST_WRITES)
        refresh = asyncio.Semaphore(BURST_REFRESH_WRITES if firsts else REFRESH_WRITES)

        async def job(view: JobView, state: JobState, status: Body, written: tuple[Any, ...]) -> None:
            async with first if view.written is None else refresh:
                await self._after_dispatches()
                await ports.writes.position(view, status, written, lambda: ports.jobs.holds(view, state))

        lanes, self._lanes = self._lanes, set()
        models, self._models = self._models, set()
        await asyncio.gather(
            *(job(*w) for w in writes),
            *(self._write_lane(name) for name in lanes if name in ports.lanes),
            *(self._write_model(name) for name in models if name in ports.observed.learned),
        )

    async def _after_dispatches(self) -> None:
        """Positions wait while a job dispatched to a warm backend is not yet written Running: that write
        is the one somebody waits for, and it must not queue behind a burst of position updates. Each dispatch
        holds them back for ``DISPATCH_WAIT_SECONDS`` in all, not each write for as long: one whose write keeps
        failing would otherwise let through one refresh a second (``REFRESH_WRITES`` in flight)."""
        while self.dispatch_in_flight():
            await asyncio.sleep(DISPATCH_POLL_SECONDS)

    def dispatch_in_flight(self) -> bool:
        """Whether a dispatch to a warm backend still holds positions back; a dispatch first seen here starts its
        ``DISPATCH_WAIT_SECONDS``."""
        pods, now = self.ports.observed.pods, self.monotonic()
        flying = [
            view.job.id for view, lane in self.ports.jobs.assigned() if (p := pods.get(lane)) is not None and p.ready
        ]
        self._holds = {job: self._holds.get(job, now + DISPATCH_WAIT_SECONDS) for job in flying}
        return any(now < until for until in self._holds.values())

    async def _queue_writes(self, now: float, full: bool = True) -> list[Write]:
        """The waiting jobs' status writes: of the whole queue if ``full``, else of each lane's head."""
        ports = self.ports
        dispatcher = ports.dispatcher
        exact_n = ports.settings.exact_positions
        per_lane: Counter[str | None] = Counter()
        depth: dict[str, Counter[str]] = {name: Counter() for name in ports.lanes}
        writes: list[Write] = []
        began, stopped = time.monotonic(), False
        if full:
            self._reordered = False
        head_span, short = HEAD_FORECAST_SPAN * exact_n * max(1, len(ports.lanes)), set(ports.lanes)
        # A long queue's forecast takes a while (0.6 s at 20,000): the loop gets its turn every slice, so a
        # dispatch that arrives meanwhile is not held behind the whole of it (its fork is a snapshot).
        sliced = begun = time.perf_counter()
        spent = held = 0.0  # the forecast's own time, without the loop's turns; its longest stretch
        for seen, f in enumerate(forecasting(dispatcher)):
            if (now_perf := time.perf_counter()) - sliced > FORECAST_SLICE_SECONDS:
                spent, held = spent + now_perf - sliced, max(held, now_perf - sliced)
                await asyncio.sleep(0)
                sliced = time.perf_counter()
            if not full and (not short or seen >= head_span):
                stopped = True  # every lane's head is done
                break
            view = ports.jobs.get(f.job_id)
            if view is None or view.state != JobState.PENDING:
                continue
            band = band_label(view.job.priority, dispatcher.policy)
            if f.lane in depth:
                depth[f.lane][band] += 1
            index = per_lane[f.lane]
            per_lane[f.lane] += 1
            exact = index < exact_n
            if not exact:
                short.discard(f.lane or "")
            position = f.position if exact else bucket(f.position, exact_n)
            if not exact and view.written is not None and view.written[:2] == (position, exact):
                continue  # a bucket is rewritten only when it changes: no need for its score
            score = dispatcher.score(view.job, f.lane, now)
            start = None if f.start is None else round(f.start if exact else f.start / 60) * (1 if exact else 60)
            desired = (position, exact, start, round(score.total), f.lane)
            if not self._changed(view.written, desired):
                continue
            queued = condition("Admitted", True, "Queued", "waiting for a lane", now)
            status = job_status(
                phase="Pending",
                submittedAt=format_micro_time(view.job.submitted_at),
                reason=None,  # clears ModelNotFound once the model exists
                message=None,
                observedGeneration=view.generation,
                position=position,
                positionExact=exact,
                estimatedStart=None if start is None else format_time(start),
                estimatedAt=format_time(now),
                expectedLane=f.lane,
                score=score_fields(score),
                conditions=merge_condition(view.conditions, queued),
            )
            writes.append((view, JobState.PENDING, status, desired))
        last = time.perf_counter() - sliced
        self.forecast_seconds, self.held_seconds = spent + last, max(held, last)
        ports.metrics.forecast.labels("heads" if stopped else "queue").observe(self.forecast_seconds)
        ports.metrics.forecast_hold.observe(self.held_seconds)
        if not stopped:  # the whole queue was forecast (a head pass of a short queue too)
            self._full_at, self._full_seconds = began, self.forecast_seconds
            self._depth = {name: dict(c) for name, c in depth.items()}  # a head pass counts only the heads
        log.debug("forecast of %d jobs: %.3fs of %.3fs", sum(per_lane.values()), self.forecast_seconds,
                  time.perf_counter() - begun)  # fmt: skip
        for view in ports.jobs.parked():
            refused = ports.observed.refused_models.get(view.model)
            if view.written != ("parked", refused):
                reason = "ModelNotFound" if refused is None else "ModelNotAccepted"
                message = (
                    f"no GpuModel named {view.model!r}; the job waits until one is created"
                    if refused is None
                    else f"GpuModel {view.model!r} is not accepted ({refused}); the job waits until it is fixed"
                )
                status = job_status(
                    phase="Pending",
                    submittedAt=format_micro_time(view.job.submitted_at),
                    reason=reason,
                    message=message,
                    conditions=merge_condition(view.conditions, condition("Admitted", False, reason, message, now)),
                )
                writes.append((view, JobState.PARKED, status, ("parked", refused)))
        for name in ports.lanes:
            if self._depth.get(name, {}) != self._written_depth.get(name, {}):
                self._lanes.add(name)
        return writes

    @staticmethod
    def _changed(written: tuple[Any, ...] | None, desired: tuple[Any, ...]) -> bool:
        if written is None or len(written) != len(desired):
            return True
        position, exact, start, score, lane = desired
        if (written[0], written[1]) != (position, exact):
            return True
        if not exact:
            return False  # a bucket is rewritten only when it changes
        if lane != written[4]:
            return True
        if (start is None) != (written[2] is None):
            return True
        moved = start is not None and abs(start - written[2]) > 30
        return moved or bool(abs(score - written[3]) >= 1)

    async def _write_lane(self, name: str) -> None:
        ports = self.ports
        runner = ports.lanes[name]
        core = ports.dispatcher.lane_state(name)
        pod = ports.observed.pods.get(name)
        spacing, now = ports.dispatcher.policy.band_spacing, ports.clock()
        depth = self._depth.get(name, {})
        # A merge patch merges maps: bands that emptied must be removed explicitly.
        queue_depth: dict[str, int | None] = {**dict.fromkeys(self._written_depth.get(name, {})), **depth}
        self._written_depth[name] = depth
        # A server's pod serves the models it holds: Ready is its pod's, with the serving model loaded.
        ready = bool(pod and pod.ready and core and core.ready and pod.model == runner.server_of(core.resident))
        if runner.node_problem is not None:
            ready, why, message = False, "NodeUnavailable", f"nothing is dispatched here: {runner.node_problem}"
        elif ready:
            why, message = "BackendReady", f"{pod.name if pod else ''} serves {core.resident if core else ''}"
        elif core is None or core.resident is None:
            why, message = "NoModel", runner.gave_back or "no model is loaded; the next dispatch loads one"
        else:
            why, message = "Loading", f"loading {core.resident}"
        ready_now = condition("Ready", ready, why, message, ports.clock())
        conditions = self._lane_conditions[name] = merge_condition(self._lane_conditions.get(name), ready_now)
        ports.metrics.lane_ready.labels(name).set(1 if ready else 0)
        model = GpuLaneStatus.model_validate(
            {
                "residentModel": core.resident if core else None,
                "loaded": sorted(core.loaded) if core else [],
                "pod": pod.name if pod else None,
                "ready": ready,
                "conditions": conditions,
                "observedGeneration": runner.generation,
                "history": ports.history.of_lane(name),
                "running": sorted(v.key for v in ports.jobs.on_lane(name)),
                "queueDepth": depth,
                "lastServed": [
                    {"member": member, "band": band * spacing, "at": format_time(at)}
                    for (member, band), at in sorted(ports.dispatcher.served().items())
                ],
                "usage": [
                    {"member": member, "band": band * spacing, "gpuSeconds": round(seconds, 3), "at": format_time(now)}
                    for (member, band), seconds in sorted(ports.dispatcher.usage(now).items())
                ],
                "teamUsage": [
                    {"namespace": team, "band": band * spacing, "gpuSeconds": round(seconds, 3), "at": format_time(now)}
                    for (team, band), seconds in sorted(ports.dispatcher.team_usage(now).items())
                ],
            }
        )
        status = model.model_dump(mode="json", by_alias=True, exclude_unset=True)
        status["queueDepth"] = queue_depth  # with the emptied bands as None, which the model does not allow
        with contextlib.suppress(Gone):
            await ports.kube.patch_cluster_status("gpulanes", name, {"status": status})

    async def _write_model(self, name: str) -> None:
        with contextlib.suppress(Gone):
            observed = self.ports.observed
            fields: dict[str, Any] = {
                **observed.learned[name],
                "observedGeneration": observed.model_generations.get(name),
            }
            if name in observed.model_conditions:
                fields["conditions"] = observed.model_conditions[name]
            lanes = self.ports.dispatcher.model(name).lanes
            fields["lanes"] = None if lanes is None else sorted(lanes)  # null removes a selector's old list
            status = GpuModelStatus.model_validate(fields).model_dump(mode="json", by_alias=True, exclude_unset=True)
            await self.ports.kube.patch_cluster_status("gpumodels", name, {"status": status})
