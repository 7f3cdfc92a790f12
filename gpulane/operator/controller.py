"""The controller owns the dispatcher. Watch events come in translated; the core's decisions go out
as job transitions and lane work.

Every core event is applied synchronously on the event loop, so the dispatcher never sees two
events at once. API writes happen afterwards, in tasks: a job's writes are serialised by its lock,
and a lane's pod work by its ``LaneRunner``. What the operator needs after a restart is on the API
objects themselves (see ``rebuild``), never only in memory.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gpulane.admission.review import Refused, validate_policy
from gpulane.api.resources import (
    API_VERSION,
    STORY_LIMIT,
    TERMINAL_PHASES,
    GpuLaneSpec,
    GpuModelSpec,
    GpuPolicySpec,
)
from gpulane.core.dispatcher import Dispatcher, DispatchError
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
from gpulane.core.explain import describe_dispatch
from gpulane.core.jobs import Job, ModelCatalog
from gpulane.core.policy import Policy, PolicyError
from gpulane.operator.kube import EXECUTOR_LABEL, Conflict, Gone, Kube
from gpulane.operator.lanes import LaneRunner
from gpulane.operator.metrics import Metrics
from gpulane.operator.nodes import NodeState, lane_node_problem, node_state
from gpulane.operator.pods import BACKEND_SELECTOR, PodState, pod_state
from gpulane.operator.status import FINALIZER, StatusWriter
from gpulane.operator.translate import (
    Body,
    Refusal,
    band_label,
    condition,
    dispatch_record,
    format_duration,
    format_time,
    job_from_body,
    job_key,
    merge_condition,
    model_spec,
    parse_time,
    policy_refusal,
    score_fields,
    validation_message,
)

log = logging.getLogger(__name__)

ACTIVE = ("assigned", "running")
EXECUTOR_LEASE = "gpulane.io/executor-lease"  # annotation naming the executor's Lease: "namespace/name"
EXECUTOR_SELECTOR = f"{EXECUTOR_LABEL}=true"


@dataclass
class Settings:
    namespace: str = "gpulane-system"  # where backend pods live
    exact_positions: int = 50  # per lane; positions beyond are rounded up to a multiple of this
    status_writes_per_second: float = 200.0
    status_interval: float = 1.0
    tick_seconds: float = 1.0


@dataclass
class JobView:
    """What the operator tracks of one GpuJob it has admitted."""

    key: str
    namespace: str
    name: str
    uid: str
    job: Job
    state: str = "pending"  # pending | parked | assigned | running
    api_phase: str | None = None  # the phase on the object, as last written or seen
    lane: str | None = None
    decision: Dispatch | None = None
    dispatched_at: float | None = None
    started_at: float | None = None
    max_run: int | None = None
    finalizers: list[str] = field(default_factory=list)
    conditions: list[dict[str, Any]] = field(default_factory=list)
    generation: int | None = None
    executor_lease: tuple[str, str] | None = None  # (namespace, name) of the Lease of whoever runs it
    woke_at: float | None = None  # when the event that let it dispatch arrived (latency metric)
    ending: bool = False  # a terminal write is in flight
    announced: bool = False  # the Dispatched Event was posted
    written: tuple[Any, ...] | None = None  # the last queue status written (StatusWriter)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def model(self) -> str:
        return self.job.model

    def ref(self) -> Body:
        return {
            "apiVersion": API_VERSION,
            "kind": "GpuJob",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
        }


class Controller:
    def __init__(self, kube: Kube, settings: Settings | None = None, clock: Callable[[], float] = time.time) -> None:
        self.kube = kube
        self.settings = settings or Settings()
        self.clock = clock
        self.dispatcher = Dispatcher(Policy(), clock, ModelCatalog())
        self.policy_generation: int | None = None
        self.jobs: dict[str, JobView] = {}
        self.parked: dict[str, set[str]] = {}  # model -> jobs waiting for its GpuModel
        self.models: dict[str, GpuModelSpec] = {}
        self.learned: dict[str, dict[str, float]] = {}  # model -> status fields we keep up to date
        self.model_generations: dict[str, int | None] = {}
        self.lanes: dict[str, LaneRunner] = {}
        self.pods: dict[str, PodState] = {}  # lane -> its backend pod as last seen
        self.nodes: dict[str, NodeState] = {}
        self.leases: dict[tuple[str, str], float] = {}  # executor Lease -> when it expires
        self.dispatch_times: deque[float] = deque(maxlen=100_000)  # to count what ran ahead of a job
        self.ready = False
        self.metrics = Metrics(self.queue_snapshot)
        kube.on_write = lambda kind: self.metrics.api_writes.labels(kind).inc()
        self.status = StatusWriter(self)
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

    def start(self) -> None:
        self._loops = [asyncio.create_task(self._tick()), asyncio.create_task(self.status.run())]

    async def stop(self) -> None:
        for task in [*self._loops, *self._tasks]:
            task.cancel()
        for lane in self.lanes.values():
            await lane.stop()
        await asyncio.gather(*self._loops, *self._tasks, return_exceptions=True)

    async def _tick(self) -> None:
        """Deadlines and load timeouts: one loop for all jobs, no per-object timers."""
        while True:
            await asyncio.sleep(self.settings.tick_seconds)
            self.check_deadlines()
            for lane in self.lanes.values():
                lane.kick()

    def check_deadlines(self) -> None:
        """Jobs past maxRunSeconds, and jobs whose executor's Lease expired (it died with the job)."""
        now = self.clock()
        for view in list(self.jobs.values()):
            if view.state not in ACTIVE or view.ending:
                continue
            started, limit = view.started_at, view.max_run
            if view.state == "running" and started is not None and limit is not None and now - started > limit:
                message = f"ran longer than maxRunSeconds={limit}"
                self.spawn(self.end_job(view, "Failed", "DeadlineExceeded", message))
                continue
            expiry = None if view.executor_lease is None else self.leases.get(view.executor_lease)
            if expiry is not None and now > expiry:
                lease = "/".join(view.executor_lease or ())
                message = f"its executor's Lease {lease} expired {now - expiry:.0f}s ago: the executor is gone"
                self.spawn(self.end_job(view, "Failed", "DataPlaneLost", message))

    def node_event(self, kind: str | None, body: Body) -> None:
        """A node changed: lanes on it go offline or back online."""
        state = node_state(body)
        if kind == "DELETED":
            self.nodes.pop(state.name, None)
        else:
            self.nodes[state.name] = state
        for runner in self.lanes.values():
            self._check_node(runner)

    def _check_node(self, runner: LaneRunner) -> None:
        problem = lane_node_problem(runner.spec, self.nodes)
        if problem == runner.node_problem:
            return
        if problem is None:
            log.info("lane %s: its node is back (%s)", runner.name, runner.node_problem)
        else:
            log.warning("lane %s: offline: %s", runner.name, problem)
        runner.node_problem = problem
        core = self.dispatcher.lanes.get(runner.name)
        if core is not None:  # node events arrive after the rebuild (kopf's startup handler) took lanes online
            self.apply(LaneUpdated(runner.name, online=problem is None, resident=core.resident))
        self.status.lane_dirty(runner.name)
        runner.kick()

    def lease_event(self, kind: str | None, body: Body) -> None:
        """An executor's Lease: until when it vouches for the jobs it runs."""
        meta, spec = body["metadata"], body.get("spec") or {}
        key = (meta.get("namespace", ""), meta["name"])
        renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime")) or 0.0
        expiry = renewed + float(spec.get("leaseDurationSeconds") or 0)
        self.leases[key] = self.clock() if kind == "DELETED" else expiry

    def apply(self, event: Event, woke_at: float | None = None) -> None:
        """Hand one event to the core and act on every decision it returns."""
        try:
            decisions = self.dispatcher.handle(event)
        except (DispatchError, PolicyError) as err:
            log.error("the dispatcher refused %s: %s", type(event).__name__, err)
            return
        self._act(decisions, woke_at)

    def _act(self, decisions: list[Dispatch], woke_at: float | None = None) -> None:
        for decision in decisions:
            self._route(decision, woke_at)
        self.status.dirty = True

    def _route(self, decision: Dispatch, woke_at: float | None) -> None:
        view = self.jobs[decision.job.id]
        view.state, view.lane, view.decision = "assigned", decision.lane, decision
        view.dispatched_at, view.woke_at = decision.at, woke_at
        band = band_label(decision.job.priority, self.dispatcher.policy)
        self.metrics.dispatches.labels(band).inc()
        self.metrics.wait.labels(band).observe(max(0.0, decision.at - decision.job.submitted_at))
        for term in decision.changed_by:
            self.metrics.order_changes.labels(term).inc()
        if decision.replaces is not None:
            self.metrics.swaps.inc()
        lane = self.lanes[decision.lane]
        lane.assigned.add(view.key)
        lane.history.append((decision.at, dispatch_record(decision)))
        self.dispatch_times.append(decision.at)
        self.status.lane_dirty(lane.name)
        lane.kick()

    def story(self, view: JobView, now: float) -> Body:
        """The dispatches that went ahead of ``view`` while it waited, for ``gpulane why`` after it ran."""
        queued, until = view.job.submitted_at, view.dispatched_at or now
        ahead = sorted(  # by time alone: records restored from status share whole seconds
            (
                (at, record)
                for lane in self.lanes.values()
                for at, record in lane.history
                if queued < at < until and record["job"] != view.key
            ),
            key=lambda pair: pair[0],
        )
        total = len(self.dispatch_times) - bisect.bisect_right(self.dispatch_times, queued)
        total -= len(self.dispatch_times) - bisect.bisect_left(self.dispatch_times, until)
        return {
            "queuedAt": format_time(queued),
            "ranAhead": [record for _, record in ahead[-STORY_LIMIT:]],
            "ranAheadTotal": max(total, len(ahead)),
            "load": bool(view.decision and view.decision.load),
        }

    def queue_snapshot(self) -> dict[str, tuple[int, float]]:
        now, policy = self.clock(), self.dispatcher.policy
        out: dict[str, tuple[int, float]] = {}
        for job in self.dispatcher.ranking.pending():
            band = band_label(job.priority, policy)
            count, oldest = out.get(band, (0, 0.0))
            out[band] = (count + 1, max(oldest, now - job.submitted_at))
        return out

    # -- GpuJobs --------------------------------------------------------------------------------

    def job_event(self, kind: str | None, body: Body) -> None:
        meta = body["metadata"]
        key, uid = job_key(body), meta.get("uid", "")
        view = self.jobs.get(key)
        if view is not None and view.uid != uid:  # deleted and created again under the same name
            self._forget(view)
            view = None
        if kind == "DELETED":
            if view is not None:
                self._forget(view)
            return
        status = body.get("status") or {}
        phase = status.get("phase")
        finalizers = list(meta.get("finalizers") or [])
        if view is not None:
            view.finalizers = finalizers
        if phase in TERMINAL_PHASES:
            if view is not None and view.state in ACTIVE:
                log.debug("%s reported %s", key, phase)
                self._executor_finished(view, status)
            if FINALIZER in finalizers:
                self.spawn(self._drop_finalizer(meta["namespace"], meta["name"], finalizers))
            return
        if view is None:
            if meta.get("deletionTimestamp"):
                if FINALIZER in finalizers:
                    self.spawn(self._drop_finalizer(meta["namespace"], meta["name"], finalizers))
                return
            if phase in ("Dispatching", "Running"):
                self._adopt(body)
            else:
                self._admit(body)
            return
        if meta.get("deletionTimestamp"):
            self._cancel(view)

    def _admit(self, body: Body) -> None:
        meta = body["metadata"]
        result = job_from_body(body, self.dispatcher.policy)
        if isinstance(result, Refusal):
            self.spawn(self._refuse(body, result))
            return
        view = self._view(body, result)
        self.jobs[view.key] = view
        if result.model not in self.models:
            view.state = "parked"
            self.parked.setdefault(result.model, set()).add(view.key)
            self.status.dirty = True
            return
        log.debug("queued %s (generation %s)", view.key, meta.get("generation"))
        self.apply(JobSubmitted(result))

    def _view(self, body: Body, job: Job) -> JobView:
        meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
        return JobView(
            key=job.id,
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta.get("uid", ""),
            job=job,
            api_phase=status.get("phase"),
            max_run=spec.get("maxRunSeconds"),
            executor_lease=_lease_of(meta),
            generation=meta.get("generation"),
            finalizers=list(meta.get("finalizers") or []),
            conditions=list(status.get("conditions") or []),
        )

    async def _refuse(self, body: Body, refusal: Refusal) -> None:
        meta = body["metadata"]
        now = self.clock()
        cond = condition("Admitted", False, refusal.reason, refusal.message, now, meta.get("generation"))
        patch = {
            "status": {
                "phase": "Failed",
                "reason": refusal.reason,
                "message": refusal.message,
                "finishedAt": format_time(now),
                "conditions": merge_condition((body.get("status") or {}).get("conditions"), cond),
                "observedGeneration": meta.get("generation"),
            }
        }
        self.metrics.job_failures.labels(refusal.reason).inc()
        try:
            await self.kube.patch_job_status(meta["namespace"], meta["name"], patch)
        except Gone:
            return
        ref = {"apiVersion": API_VERSION, "kind": "GpuJob", "metadata": meta}
        await self.kube.event(ref, refusal.reason, refusal.message, warning=True, now=now)

    def _adopt(self, body: Body) -> None:
        """A job found Dispatching or Running (after a restart): it holds its lane's capacity again."""
        result = job_from_body(body, None)  # no policy check: it runs already, whatever the policy now says
        status = body.get("status") or {}
        if isinstance(result, Refusal):  # a spec that never validated cannot have been dispatched
            log.error("cannot adopt %s: %s", job_key(body), result.message)
            return
        lane = status.get("lane")
        view = self._view(body, result)
        runner = self.lanes.get(lane or "")
        if runner is None:
            self.jobs[view.key] = view
            view.state = "assigned"
            self.spawn(self.end_job(view, "Failed", "BackendLost", f"its lane {lane!r} no longer exists"))
            return
        view.lane = lane
        view.dispatched_at = parse_time(status.get("dispatchedAt")) or self.clock()
        view.started_at = parse_time(status.get("startedAt"))
        view.state = "running" if status.get("phase") == "Running" else "assigned"
        self.jobs[view.key] = view
        (runner.running if view.state == "running" else runner.assigned).add(view.key)
        self.apply(JobAdopted(result, runner.name, view.started_at or view.dispatched_at))
        runner.kick()

    def _executor_finished(self, view: JobView, status: Body) -> None:
        finished = parse_time(status.get("finishedAt")) or self.clock()
        run = None if view.started_at is None else max(0.0, finished - view.started_at)
        self.release(view, run)

    def _cancel(self, view: JobView) -> None:
        """The job is being deleted: out of the queue, or cancelled on its lane (the finalizer waits)."""
        if view.state in ACTIVE:
            if not view.ending:
                self.spawn(self.end_job(view, "Cancelled", "Deleted", "the GpuJob was deleted"))
            return
        self._forget(view)
        if FINALIZER in view.finalizers:
            self.spawn(self._drop_finalizer(view.namespace, view.name, view.finalizers))

    def _forget(self, view: JobView) -> None:
        """The job left (deleted or replaced): take it out of the queue or off its lane."""
        if view.state == "pending":
            self.jobs.pop(view.key, None)
            self.apply(JobCancelled(view.key))
        elif view.state == "parked":
            self.jobs.pop(view.key, None)
            self.parked.get(view.model, set()).discard(view.key)
        else:
            self.release(view, None)

    def release(self, view: JobView, run_seconds: float | None) -> None:
        """The job no longer holds capacity: tell the core, and let the lane start the next."""
        if self.jobs.get(view.key) is not view:
            return
        del self.jobs[view.key]
        lane = self.lanes.get(view.lane or "")
        if lane is not None:
            lane.assigned.discard(view.key)
            lane.running.discard(view.key)
            self.metrics.lane_busy.labels(lane.name).set(len(lane.running))
        self.apply(JobFinished(view.key, run_seconds), woke_at=time.monotonic())
        if run_seconds is not None:
            self._learn(view.model, "run")
        if lane is not None:
            lane.kick()

    async def _drop_finalizer(self, namespace: str, name: str, finalizers: list[str]) -> None:
        remaining = [f for f in finalizers if f != FINALIZER]
        patch = [
            {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
            {"op": "replace", "path": "/metadata/finalizers", "value": remaining},
        ]
        try:
            await self.kube.patch_job(namespace, name, patch)
        except Gone:
            pass
        except Conflict:  # the list changed meanwhile: read it again and retry once
            try:
                fresh = await self.kube.get_job(namespace, name)
            except Gone:
                return
            current = list(fresh["metadata"].get("finalizers") or [])
            if FINALIZER in current:
                await self._drop_finalizer(namespace, name, current)

    async def add_finalizer(self, view: JobView) -> None:
        if FINALIZER in view.finalizers:
            return
        patch: list[Body] = [
            {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}
            if view.finalizers
            else {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}
        ]
        body = await self.kube.patch_job(view.namespace, view.name, patch)
        view.finalizers = list(body["metadata"].get("finalizers") or [])

    # -- job transitions (called by lanes and the tick) -----------------------------------------

    def _dispatched_fields(self, view: JobView, now: float) -> Body:
        decision = view.decision
        fields: Body = {
            "lane": view.lane,
            "dispatchedAt": format_time(view.dispatched_at or now),
            "position": None,
            "positionExact": None,
            "estimatedStart": None,
        }
        if decision is not None:
            fields["score"] = score_fields(decision.score)
            fields["story"] = self.story(view, now)
            reason = "ModelLoad" if decision.load else "Warm"
            text = describe_dispatch(decision)
            view.conditions = merge_condition(view.conditions, condition("Dispatched", True, reason, text, now))
            fields["conditions"] = view.conditions
        return fields

    def _announce(self, view: JobView) -> None:
        """The Dispatched Event, posted once the job's own status says so (it would delay the status)."""
        if view.decision is not None and not view.announced:
            view.announced = True
            self.spawn(
                self.kube.event(view.ref(), "Dispatched", describe_dispatch(view.decision), now=view.decision.at)
            )

    async def mark_dispatching(self, key: str) -> None:
        """Show a job that waits for its model to load as Dispatching."""
        view = self.jobs.get(key)
        if view is None or view.state != "assigned" or view.api_phase == "Dispatching":
            return
        async with view.lock:
            if self.jobs.get(key) is not view or view.state != "assigned" or view.api_phase == "Dispatching":
                return
            now = self.clock()
            try:
                await self.add_finalizer(view)
                await self.kube.patch_job_status(
                    view.namespace,
                    view.name,
                    {"status": {"phase": "Dispatching", **self._dispatched_fields(view, now)}},
                )
            except Gone:
                self.release(view, None)
                return
            view.api_phase = "Dispatching"
            self._announce(view)

    async def start_job(self, key: str, lane: str, pod: PodState) -> None:
        """The job's backend is Ready: the job is Running, with the endpoint its executor calls."""
        view = self.jobs.get(key)
        if view is None or view.state != "assigned":
            return
        async with view.lock:
            if self.jobs.get(key) is not view or view.state != "assigned" or view.ending:
                return
            now = self.clock()
            spec = self.models.get(view.model)
            fields = self._dispatched_fields(view, now)
            fields.update(
                phase="Running",
                pod=pod.name,
                endpoint=pod.endpoint(spec.port if spec else 8000),
                startedAt=format_time(now),
                waited=format_duration(now - view.job.submitted_at),
            )
            try:
                await self.add_finalizer(view)
                await self.kube.patch_job_status(view.namespace, view.name, {"status": fields})
            except Gone:
                self.release(view, None)
                return
            view.state, view.api_phase, view.started_at = "running", "Running", now
            self._announce(view)
            runner = self.lanes.get(lane)
            if runner is not None:
                runner.assigned.discard(key)
                runner.running.add(key)
                self.metrics.lane_busy.labels(lane).set(len(runner.running))
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
            fields = {"phase": phase, "reason": reason, "message": message, "finishedAt": format_time(now)}
            expected = view.api_phase
            if expected in ("Dispatching", "Running"):
                # Only from the phase we know: if the executor already wrote an outcome, it stands.
                patch: Any = [{"op": "test", "path": "/status/phase", "value": expected}]
                patch += [{"op": "add", "path": f"/status/{k}", "value": v} for k, v in fields.items()]
            else:
                patch = {"status": fields}
            try:
                await self.kube.patch_job_status(view.namespace, view.name, patch)
            except Conflict:
                # The executor's outcome won. Its event may already have been handled, or be late:
                # read it now rather than retrying a write that cannot succeed.
                with contextlib.suppress(Gone):
                    fresh = (await self.kube.get_job(view.namespace, view.name)).get("status") or {}
                    if fresh.get("phase") in TERMINAL_PHASES:
                        self._executor_finished(view, fresh)
                view.ending = False
                return
            except Gone:
                pass
            if phase == "Failed":
                self.metrics.job_failures.labels(reason).inc()
            self.release(view, None)
        self.spawn(self.kube.event(view.ref(), reason, message, warning=warning, now=now))
        if FINALIZER in view.finalizers:
            await self._drop_finalizer(view.namespace, view.name, view.finalizers)

    # -- backend pods ---------------------------------------------------------------------------

    def pod_gone(self, state: PodState) -> None:
        """A pod found missing without a watch event (its deletion fell between listing and watching)."""
        self._pod_changed(state, gone=True)

    def pod_event(self, kind: str | None, body: Body) -> None:
        if (body.get("metadata") or {}).get("namespace") != self.kube.namespace:
            return  # another operator's backend pods (another install, another backend namespace)
        state = pod_state(body)
        if state is not None:
            self._pod_changed(state, gone=kind == "DELETED")

    def _pod_changed(self, state: PodState, gone: bool) -> None:
        current = self.pods.get(state.lane)
        if gone:
            if current is not None and current.uid == state.uid:
                del self.pods[state.lane]
        else:
            self.pods[state.lane] = state
        runner = self.lanes.get(state.lane)
        if runner is None:
            return
        if gone and runner.deleting == state.uid:
            runner.deleting = None
        elif gone or state.failed:
            core = self.dispatcher.lanes.get(state.lane)
            if core is not None and core.resident == state.model and runner.deleting != state.uid:
                what = "was deleted" if gone else "failed"
                self.backend_failed(runner, "BackendLost", f"backend pod {state.name} for {state.model} {what}")
        if not gone and state.ready:
            self.status.lane_dirty(state.lane)
        runner.kick()

    def backend_failed(self, runner: LaneRunner, reason: str, message: str) -> None:
        """The lane's backend cannot serve: fail its jobs and forget the resident model."""
        log.warning("lane %s: %s: %s", runner.name, reason, message)
        for key in [*runner.assigned, *runner.running]:
            view = self.jobs.get(key)
            if view is not None:
                self.spawn(self.end_job(view, "Failed", reason, message))
        self.apply(LaneUpdated(runner.name, online=runner.node_problem is None, resident=None))
        self.status.lane_dirty(runner.name)

    def model_loaded(self, lane: str, model: str, seconds: float | None) -> None:
        self.apply(ModelLoaded(lane, model, seconds))
        if seconds is not None:
            self.metrics.model_load.observe(seconds)
            self._learn(model, "load")
        self.status.lane_dirty(lane)

    def _learn(self, model: str, what: str) -> None:
        """Keep the model's status in step with what the core has just learned."""
        if model not in self.models:
            return
        spec = self.dispatcher.models.get(model)
        stats = self.learned.setdefault(model, {})
        stats["loadSeconds"] = round(spec.load_seconds, 3)
        stats["runSeconds"] = round(spec.run_seconds, 3)
        count = "loads" if what == "load" else "runs"
        stats[count] = stats.get(count, 0) + 1
        self.status.model_dirty(model)

    # -- GpuLanes, GpuModels, GpuPolicy ---------------------------------------------------------

    def lane_event(self, kind: str | None, body: Body, *, online: bool = True) -> None:
        meta = body["metadata"]
        name = meta["name"]
        runner = self.lanes.get(name)
        if kind == "DELETED":
            if runner is not None:
                self.backend_failed(runner, "LaneRemoved", f"GpuLane {name} was deleted")
                self.apply(LaneUpdated(name, online=False))
                del self.lanes[name]
                self.spawn(runner.stop())
            return
        try:
            spec = GpuLaneSpec.model_validate(body.get("spec") or {})
        except ValidationError as err:
            log.error("GpuLane %s is invalid: %s", name, validation_message(err))
            return
        if runner is not None:
            runner.spec, runner.uid, runner.generation = spec, meta.get("uid", ""), meta.get("generation")
            self._check_node(runner)  # the lane may name another node now
            runner.kick()
            return
        runner = LaneRunner(self, name, meta.get("uid", ""), spec)
        runner.generation = meta.get("generation")
        status = body.get("status") or {}
        runner.conditions = list(status.get("conditions") or [])
        for record in status.get("history") or []:  # what it remembered before a restart
            at = parse_time(record.get("at"))
            if at is not None:
                runner.history.append((at, record))
        self.lanes[name] = runner
        runner.node_problem = lane_node_problem(spec, self.nodes)
        runner.start()
        pod = self.pods.get(name)
        resident = pod.model if pod is not None and not pod.failed else None
        self.apply(LaneUpdated(name, online=online and runner.node_problem is None, resident=resident))
        self.status.lane_dirty(name)

    def model_event(self, kind: str | None, body: Body) -> None:
        name = body["metadata"]["name"]
        if kind == "DELETED":
            self.models.pop(name, None)
            self._park_model(name)
            return
        try:
            spec = GpuModelSpec.model_validate(body.get("spec") or {})
        except ValidationError as err:
            log.error("GpuModel %s is invalid: %s", name, validation_message(err))
            return
        if name not in self.learned:
            status = body.get("status") or {}
            self.learned[name] = {k: status[k] for k in ("loadSeconds", "runSeconds", "loads", "runs") if k in status}
        self.models[name] = spec
        if self.model_generations.get(name) != body["metadata"].get("generation"):
            self.model_generations[name] = body["metadata"].get("generation")
            self.status.model_dirty(name)
        fallback = self.dispatcher.models.get(name)
        self.apply(ModelUpdated(model_spec(name, spec, self.learned[name], fallback)))
        waiting = self.parked.pop(name, set())
        for view in sorted((self.jobs[k] for k in waiting), key=lambda v: (v.job.submitted_at, v.key)):
            refusal = policy_refusal(self.dispatcher.policy, view.job.priority, view.job.tier)
            if refusal is not None:  # the policy changed while it waited for its model
                self._reject(view, refusal.message)
                continue
            view.state, view.written = "pending", None
            self.apply(JobSubmitted(view.job))
        for lane in self.lanes.values():
            lane.kick()

    def _park_model(self, model: str) -> None:
        """Waiting jobs of a deleted model go back to waiting for a GpuModel of that name."""
        for job in [j for j in self.dispatcher.ranking.pending() if j.model == model]:
            view = self.jobs[job.id]
            self.apply(JobCancelled(job.id))
            view.state, view.written = "parked", None
            self.parked.setdefault(model, set()).add(job.id)

    def policy_event(self, kind: str | None, body: Body) -> None:
        meta = body["metadata"]
        if kind == "DELETED":
            self._use_policy(Policy())
            self.policy_generation = None
            return
        generation = meta.get("generation")
        if generation == self.policy_generation:
            return
        now = self.clock()
        spec = body.get("spec") or {}
        try:
            validate_policy(spec)  # the webhook's own check, for clusters that run none
        except Refused as err:
            log.error("GpuPolicy %s refused: %s", meta["name"], err)
            message = f"{err}; the previous policy stays in effect"
            cond = condition("Accepted", False, "InvalidPolicy", message, now, generation)
        else:
            self._use_policy(GpuPolicySpec.model_validate(spec).scoring())
            cond = condition("Accepted", True, "Valid", "the policy is in effect", now, generation)
        self.policy_generation = generation
        conditions = merge_condition((body.get("status") or {}).get("conditions"), cond)
        self.spawn(
            self._write_cluster_status(
                "gpupolicies", meta["name"], {"conditions": conditions, "observedGeneration": generation}
            )
        )

    def _use_policy(self, policy: Policy) -> None:
        for job, reason in self.dispatcher.replace_policy(policy):
            view = self.jobs.get(job.id)
            if view is not None:
                self._reject(view, reason)
        for keys in self.parked.values():
            for key in list(keys):
                view = self.jobs[key]
                refusal = policy_refusal(policy, view.job.priority, view.job.tier)
                if refusal is not None:
                    keys.discard(key)
                    self._reject(view, refusal.message)
        self._act(self.dispatcher.decide())

    def _reject(self, view: JobView, reason: str) -> None:
        """A waiting job the current policy cannot rank: it fails with PolicyRejected."""
        self.jobs.pop(view.key, None)
        body = {"metadata": {"namespace": view.namespace, "name": view.name, "uid": view.uid}}
        self.spawn(self._refuse(body, Refusal("PolicyRejected", reason)))

    async def _write_cluster_status(self, plural: str, name: str, status: Body) -> None:
        with contextlib.suppress(Gone):
            await self.kube.patch_cluster_status(plural, name, {"status": status})

    # -- start --------------------------------------------------------------------------------

    async def rebuild(self) -> None:
        """Rebuild everything from the API, before any watch event is handled.

        Lanes stay offline while jobs are replayed, so nothing is dispatched from a partial view:
        the first decisions are taken with every pending job, running job and served clock known.
        """
        with contextlib.suppress(Gone):
            self.policy_event(None, await self.kube.get_cluster("gpupolicies", "default"))
        for body in await self.kube.list_cluster("gpumodels"):
            self.model_event(None, body)
        for body in await self.kube.list_leases(EXECUTOR_SELECTOR):
            self.lease_event(None, body)
        for body in await self.kube.list_pods(BACKEND_SELECTOR):
            state = pod_state(body)
            if state is not None:
                self.pods[state.lane] = state
        for body in await self.kube.list_nodes():
            node = node_state(body)
            self.nodes[node.name] = node
        lanes = await self.kube.list_cluster("gpulanes")
        for body in lanes:
            self.lane_event(None, body, online=False)
        jobs = sorted(
            await self.kube.list_jobs(),
            key=lambda b: (b["metadata"].get("creationTimestamp", ""), job_key(b)),
        )
        for body in jobs:
            if (body.get("status") or {}).get("phase") in ("Dispatching", "Running"):
                self.job_event(None, body)
        for member, priority, at in _served_clocks(lanes, jobs):
            self.apply(QueueServed(member, priority, at))
        for body in jobs:
            if (body.get("status") or {}).get("phase") not in ("Dispatching", "Running"):
                self.job_event(None, body)
        for name, runner in self.lanes.items():
            self._check_adopted(runner)
            pod = self.pods.get(name)
            core = self.dispatcher.lanes[name]
            resident = pod.model if pod is not None and not pod.failed else core.resident
            self.apply(LaneUpdated(name, online=runner.node_problem is None, resident=resident))
            runner.kick()
        self.ready = True
        log.info(
            "rebuilt: %d jobs waiting, %d active, %d lanes",
            self.dispatcher.pending_count,
            len(self.dispatcher.running),
            len(self.lanes),
        )

    def _check_adopted(self, runner: LaneRunner) -> None:
        """Running jobs whose backend pod is gone lost their backend while the operator was away."""
        pod = self.pods.get(runner.name)
        for key in list(runner.running):
            view = self.jobs[key]
            if pod is None or pod.failed or pod.model != view.model:
                self.spawn(self.end_job(view, "Failed", "BackendLost", "its backend pod was gone after a restart"))


def _lease_of(meta: Body) -> tuple[str, str] | None:
    """The executor Lease a job names: ``namespace/name``, or ``name`` in the job's own namespace."""
    value = (meta.get("annotations") or {}).get(EXECUTOR_LEASE)
    if not value:
        return None
    namespace, _, name = value.rpartition("/")
    return (namespace or meta["namespace"], name)


def _served_clocks(lanes: list[Body], jobs: list[Body]) -> list[tuple[str, int, float]]:
    """When each (member, band) was last served: lanes record it, and dispatched jobs still show it."""
    clocks: dict[tuple[str, int], float] = {}
    for lane in lanes:
        for entry in (lane.get("status") or {}).get("lastServed") or []:
            at = parse_time(entry.get("at"))
            if at is not None:
                key = (entry["member"], int(entry["band"]))
                clocks[key] = max(at, clocks.get(key, at))
    for body in jobs:
        status, spec = body.get("status") or {}, body.get("spec") or {}
        at = parse_time(status.get("dispatchedAt"))
        score = status.get("score") or {}
        if at is None or "priority" not in score:
            continue
        key = (spec.get("member") or body["metadata"]["namespace"], int(score["priority"]))
        clocks[key] = max(at, clocks.get(key, at))
    return [(member, priority, at) for (member, priority), at in clocks.items()]
