"""The controller routes watch events to the core and the core's decisions to the rooms that act on them.

A GpuJob's event is read by the table (``JobTable.enter``) into an ``Intake``: the core's events, the writes
and the records it asks for, as data; ``effects.settle`` applies it with the core's effects, in one place.
Every core event is applied synchronously on the event loop, so the dispatcher never sees two events at
once. API writes happen afterwards, in tasks: a job's writes are serialised by its lock (``job_writes``),
and a lane's pod work by its ``LaneRunner``. Which lane a job holds only the core knows; the ``JobTable`` keeps
what Kubernetes needs of each job. What the operator needs after a restart is on the API objects themselves
(``rebuild``), never only in memory.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import ValidationError

from gpulane.api.backend_pods import PodState
from gpulane.api.contract import FINALIZER, Body
from gpulane.api.resources import TERMINAL_PHASES, GpuLaneSpec
from gpulane.api.shards import Shard
from gpulane.api.times import format_duration, format_time
from gpulane.core.dispatcher import Dispatcher
from gpulane.core.events import (
    Event,
    LaneUpdated,
    LoadLost,
    ModelLoaded,
)
from gpulane.core.jobs import ModelCatalog
from gpulane.core.policy import Policy
from gpulane.core.validation import describe
from gpulane.kube.protocol import KubeClient
from gpulane.operator import backends, effects, lane_rules, models, policies, rebuild, resync
from gpulane.operator.deadlines import overdue
from gpulane.operator.history import DispatchHistory
from gpulane.operator.intake import Admission
from gpulane.operator.job_table import Intake, JobState, JobTable, JobView
from gpulane.operator.job_writes import Ended, JobWrites, dispatched_fields
from gpulane.operator.lanes import LanePorts, LaneRunner
from gpulane.operator.metrics import Metrics, queue_snapshot
from gpulane.operator.nodes import lane_node_problem
from gpulane.operator.observed import Observed
from gpulane.operator.retention import Expiries
from gpulane.operator.settings import Settings
from gpulane.operator.shards import Router
from gpulane.operator.status import StatusPorts, StatusWriter
from gpulane.operator.translate import policy_refusal

log = logging.getLogger(__name__)


class Controller:
    def __init__(
        self, kube: KubeClient, settings: Settings | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.kube = kube
        self.settings = settings or Settings()
        self.clock = clock
        self.dispatcher = Dispatcher(Policy(), clock, ModelCatalog())
        self.jobs = JobTable(self.dispatcher)
        self.observed = Observed()
        self.history = DispatchHistory()
        self.expiries = Expiries()
        self.sightings = resync.Sightings()
        self.lanes: dict[str, LaneRunner] = {}
        self.ready = False  # the state is rebuilt: lanes may take jobs
        self.synced = False  # and checked against a list taken after the watches listed (resync.py)
        self.metrics = Metrics(lambda: queue_snapshot(self.dispatcher, self.clock()))
        kube.on_write = lambda kind: self.metrics.api_writes.labels(kind).inc()
        self.writes = JobWrites(kube, clock, self.spawn)
        self.router = Router(Shard(self.settings.shard), kube, clock, self.spawn)  # the models of other shards
        self.status = StatusWriter(StatusPorts(
            settings=self.settings, clock=clock, kube=kube, dispatcher=self.dispatcher, jobs=self.jobs,
            observed=self.observed, history=self.history, lanes=self.lanes, writes=self.writes, metrics=self.metrics,
        ))  # fmt: skip
        # Each room gets the reads it needs and the effects it asks for, never the controller.
        dispatcher, observed, status = self.dispatcher, self.observed, self.status
        self._backends = backends.Ports(
            namespace=kube.namespace, unload_namespace=self.settings.unload_namespace, clock=clock,
            lane_state=dispatcher.lane_state, observed=observed, lanes=self.lanes, sightings=self.sightings,
            lane_dirty=status.lane_dirty, backend_failed=self.backend_failed,
        )  # fmt: skip
        self._lane_rules = lane_rules.Ports(lane_state=dispatcher.lane_state, model=dispatcher.model,
                                            observed=observed, model_dirty=status.model_dirty)  # fmt: skip
        self._policies = policies.Ports(
            clock=clock, observed=observed, use_policy=self.use_policy, spawn=self.spawn,
            write_status=functools.partial(self.writes.cluster_status, "gpupolicies"),
        )  # fmt: skip
        self._models = models.Ports(
            clock=clock, model=dispatcher.model, policy=lambda: dispatcher.policy, pending=dispatcher.pending,
            observed=observed, jobs=self.jobs, router=self.router, lanes=self.lanes, namespace=kube.namespace,
            check_pod=kube.check_pod, model_dirty=status.model_dirty, settle=self.settle, spawn=self.spawn,
        )  # fmt: skip
        self._effects = effects.Ports(
            clock=clock, dispatcher=dispatcher, jobs=self.jobs, lanes=self.lanes, status=status,
            writes=self.writes, metrics=self.metrics, history=self.history, observed=observed,
            expiries=self.expiries, router=self.router, spawn=self.spawn, end_job=self.end_job,
        )  # fmt: skip
        self._lanes = LanePorts(
            kube=kube, clock=clock, shard=self.router.shard, lane_state=dispatcher.lane_state, jobs=self.jobs,
            observed=observed, mark_dispatching=self.mark_dispatching, start_job=self.start_job,
            model_loaded=self.model_loaded, backend_failed=self.backend_failed, pod_gone=self.pod_gone,
            spawn=self.spawn,
        )  # fmt: skip
        deleted = {"gpupolicies": self.policy_event, "gpumodels": self.model_event, "nodes": self.node_event,
                   "gpulanes": self.lane_event}  # fmt: skip
        self._resync = resync.Ports(kube=kube, shard=self.router.shard, observed=observed, sightings=self.sightings,
                                   deleted=deleted, pod_gone=self.pod_gone)  # fmt: skip
        self._rebuild = rebuild.Ports(
            kube=kube, shard=self.router.shard, clock=clock, lane_state=dispatcher.lane_state, jobs=self.jobs,
            observed=observed, history=self.history, lanes=self.lanes, policy_event=self.policy_event,
            model_event=self.model_event, lease_event=self.lease_event, pod_event=self.pod_event,
            node_event=self.node_event, lane_event=self.lane_event, job_event=self.job_event, settle=self.settle,
            spawn=self.spawn, end_job=self.end_job, rebuilt=lambda: setattr(self, "ready", True),
        )  # fmt: skip
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []

    # -- plumbing -------------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background write failed", exc_info=task.exception())

    async def rebuild(self, *, max_backoff: float = 30.0) -> None:
        """Read the cluster's state and replay it (``rebuild.py``): before ``start``, and before any watch event."""
        await rebuild.rebuild(self._rebuild, max_backoff=max_backoff)

    def start(self) -> None:
        found = self.metrics.resync_deletions.labels
        sync = resync.run(self._resync, self.settings.resync_seconds, lambda kind: found(kind).inc(),
                          lambda: setattr(self, "synced", True))  # fmt: skip
        self._loops = [asyncio.create_task(loop) for loop in (self._tick(), self.status.run(), sync)]

    async def stop(self) -> None:
        for task in [*self._loops, *self._tasks]:
            task.cancel()
        for lane in self.lanes.values():
            await lane.stop()
        await asyncio.gather(*self._loops, *self._tasks, return_exceptions=True)

    async def _tick(self) -> None:  # one loop for all jobs: no per-object timers
        while True:
            await asyncio.sleep(self.settings.tick_seconds)
            self.tick()

    def tick(self) -> None:
        """One pass: active jobs past a deadline end (``deadlines``), waiting ones past theirs expire and idle
        models unload (``effects``), finished jobs past their TTL go (``retention``); every lane looks again."""
        now = self.clock()
        for view, _ in self.jobs.holding():
            if not view.ending and (why := overdue(view, now, self.observed)) is not None:
                self.spawn(self.end_job(view, "Failed", *why))
        effects.expire_due(self._effects, now)
        for namespace, name, uid in self.expiries.due(now):
            self.spawn(self._delete_finished(namespace, name, uid, now))
        for lane in self.lanes.values():
            lane.kick()

    def apply(self, event: Event) -> None:
        """One event for the core, and everything it returns applied."""
        self.settle(Intake(events=[event]))

    def settle(self, intake: Intake) -> None:
        """What a room read an object into, applied with the core's effects (``effects.settle``)."""
        effects.settle(self._effects, intake)

    # -- GpuJobs --------------------------------------------------------------------------------

    def job_event(self, kind: str | None, body: Body) -> None:
        """The table reads the event and says what follows; ``effects.settle`` applies it."""
        admission = Admission(self.dispatcher.policy, self.clock(), self.observed.models, self.router.elsewhere,
                              self.observed.pending_cap, self.observed.member_pending_cap)  # fmt: skip
        effects.settle(self._effects, self.jobs.enter(kind, body, admission))

    async def _delete_finished(self, namespace: str, name: str, uid: str, now: float) -> None:
        if await self.expiries.delete(self.kube, namespace, name, uid, now):
            self.metrics.jobs_expired.inc()

    def release(self, view: JobView, run_seconds: float | None) -> None:
        """The job no longer holds capacity: tell the core, and let the lane start the next."""
        effects.settle(self._effects, self.jobs.free(view, run_seconds, Intake()))

    # -- job transitions (asked for by lanes and the tick) --------------------------------------

    async def mark_dispatching(self, view: JobView) -> None:
        """Show a job that waits for its model to load as Dispatching."""
        if view.api_phase == "Dispatching":
            return
        async with view.lock:
            if not self.jobs.holds(view, JobState.ASSIGNED) or view.api_phase == "Dispatching":
                return
            lane = self.jobs.lane_of(view)
            fields = {"phase": "Dispatching", **dispatched_fields(view, lane, self.history, self.clock())}
            if not await self.writes.dispatched(view, fields):
                self.release(view, None)

    async def start_job(self, view: JobView, pod: PodState) -> None:
        """The job's backend is Ready: the job is Running, with the endpoint its executor calls."""
        async with view.lock:
            if not self.jobs.holds(view, JobState.ASSIGNED) or view.ending:
                return
            now = self.clock()
            lane = self.jobs.lane_of(view)
            runner = self.lanes.get(lane or "")  # a model its server holds is reached on the server's port
            spec = self.observed.models.get(runner.server_of(view.model) or "" if runner else view.model)
            fields = dispatched_fields(view, lane, self.history, now)
            fields.update(
                phase="Running",
                pod=pod.name,
                endpoint=pod.endpoint(spec.port if spec else 8000),
                startedAt=format_time(now),
                waited=format_duration(now - view.job.submitted_at),
            )
            if not await self.writes.dispatched(view, fields):
                self.release(view, None)
                return
            self.jobs.start(view, now)
            lane = lane or ""
            self.metrics.lane_busy.labels(lane).set(len(self.jobs.on_lane(lane, JobState.RUNNING)))
            if view.woke_at is not None and view.decision is not None and not view.decision.load:
                self.metrics.dispatch_latency.observe(time.monotonic() - view.woke_at)
            self.status.lane_dirty(lane)

    async def end_job(self, view: JobView, phase: str, reason: str, message: str, *, warning: bool = True) -> None:
        """End an active job (deadline, cancel, lost backend) unless its executor ended it first."""
        if view.ending:
            return
        view.ending = True
        async with view.lock:
            now = self.clock()
            try:
                result = await self.writes.end(view, phase, reason, message, now)
            finally:
                view.ending = False  # a failed write (a 429, a timeout) is retried by the next tick
            if result.ended == Ended.LOST:
                if (result.fresh or {}).get("phase") in TERMINAL_PHASES:
                    self.release(view, view.ran(self.clock()))
                return
            if phase == "Failed":
                self.metrics.job_failures.labels(reason).inc()
            self.release(view, None)
        self.spawn(self.kube.event(view.ref(), reason, message, warning=warning, now=now))
        if FINALIZER in view.finalizers:
            await self.writes.drop_finalizer(view.namespace, view.name, view.finalizers)

    # -- lanes' backends ------------------------------------------------------------------------

    def backend_failed(
        self, lane: str, reason: str, message: str, *, lost: bool = False, serving: str | None = None
    ) -> None:
        """The lane's backend cannot serve: fail its jobs and forget the resident model (a server that failed a
        load goes on ``serving`` itself). A ``lost`` pod says nothing of its model: its jobs wait again."""
        log.warning("lane %s: %s: %s", lane, reason, message)
        held = [(view, view.decision) for view in self.jobs.on_lane(lane)]
        self.apply(LoadLost(lane) if lost else LaneUpdated(lane, online=self.lanes[lane].online, resident=serving))
        for view, decision in held:
            if self.jobs.holds(view) and view.decision is decision:  # not requeued (and dispatched afresh)
                self.spawn(self.end_job(view, "Failed", reason, message))
        self.status.lane_dirty(lane)

    def model_loaded(self, lane: str, model: str, seconds: float | None, *, in_server: bool = False) -> None:
        self.apply(ModelLoaded(lane, model, seconds, in_server))
        if seconds is not None:
            self.metrics.model_load.observe(seconds)
            self.history.loaded(lane, model, seconds, in_server)
            self.status.learned(model, "switch" if in_server else "load")
        self.status.lane_dirty(lane)

    def pod_gone(self, state: PodState) -> None:
        backends.pod_changed(self._backends, state, gone=True)

    def pod_event(self, kind: str | None, body: Body) -> None:
        backends.pod_event(self._backends, kind, body)

    def node_event(self, kind: str | None, body: Body) -> None:
        self.sightings.note("nodes", kind, body)
        self.settle(backends.node_event(self._backends, kind, body))

    def lease_event(self, kind: str | None, body: Body) -> None:
        self.settle(backends.lease_event(self._backends, kind, body))

    # -- GpuLanes, GpuModels, GpuPolicy ---------------------------------------------------------

    def lane_event(self, kind: str | None, body: Body, *, online: bool = True) -> None:
        self.sightings.note("gpulanes", kind, body)
        meta = body["metadata"]
        name = meta["name"]
        runner = self.lanes.get(name)
        if kind == "DELETED":
            self.settle(lane_rules.lane_changed(self._lane_rules, name, None, None))
            if runner is not None:
                self.backend_failed(name, "LaneRemoved", f"GpuLane {name} was deleted")
                self.apply(LaneUpdated(name, online=False))
                del self.lanes[name]
                self.history.forget(name)
                self.status.lane_gone(name)
                self.spawn(runner.stop())
            return
        try:
            spec = GpuLaneSpec.model_validate(body.get("spec") or {})
        except ValidationError as err:
            log.error("GpuLane %s is invalid: %s", name, describe(err, "spec"))
            return
        self.settle(lane_rules.lane_changed(self._lane_rules, name, dict(meta.get("labels") or {}), spec))
        if runner is not None:
            runner.spec, runner.uid, runner.generation = spec, meta.get("uid", ""), meta.get("generation")
            intake = Intake()
            backends.check_node(self._backends, runner, intake)  # the lane may name another node now
            self.settle(intake)
            runner.kick()
            return
        runner = LaneRunner(self._lanes, name, meta.get("uid", ""), spec, meta.get("generation"))
        status = body.get("status") or {}
        self.status.lane_seen(name, status)
        self.history.restore(name, status.get("history") or [])
        self.lanes[name] = runner
        runner.node_problem = lane_node_problem(spec, self.observed.nodes)
        runner.start()
        pod = self.observed.pods.get(name)
        resident = pod.model if pod is not None and not pod.failed else None
        self.apply(LaneUpdated(name, online=online and runner.online, resident=resident))

    def model_event(self, kind: str | None, body: Body) -> None:
        self.sightings.note("gpumodels", kind, body)
        models.model_event(self._models, kind, body)

    def policy_event(self, kind: str | None, body: Body) -> None:
        self.sightings.note("gpupolicies", kind, body)
        policies.policy_event(self._policies, kind, body)

    def use_policy(self, policy: Policy) -> None:
        """A new policy: waiting jobs it cannot rank fail, and the lanes' next jobs are chosen by it."""
        intake = Intake(decide=True)
        for job, reason in self.dispatcher.replace_policy(policy):
            view = self.jobs.get(job.id)
            if view is not None:
                self.jobs.reject(view, reason, intake)
        for view in list(self.jobs.parked()):
            refusal = policy_refusal(policy, view.job.priority, view.job.tier)
            if refusal is not None:
                self.jobs.reject(view, refusal.message, intake)
        self.settle(intake)
