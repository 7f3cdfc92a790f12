"""The operator's jobs: one ``JobTable`` holds every admitted GpuJob and what Kubernetes needs of it.

The core's Dispatcher is the one holder of what runs where: the table asks it which jobs hold a lane
(``Placements``) and keeps only what the core does not know: which jobs wait for their GpuModel (parked),
which ones the operator has shown Running, the phase and conditions written, finalizers and locks.
Nothing else keeps a set of jobs, and the table's methods are the only way to move a job's state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from gpulane.api.contract import EXECUTOR_LEASE, FINALIZER, Body
from gpulane.api.resources import API_VERSION, TERMINAL_PHASES
from gpulane.api.shards import HANDED_TO_SHARD
from gpulane.core.events import Dispatch, Effect, Event, Expired, JobCancelled, JobFinished, JobSubmitted, Requeued
from gpulane.core.jobs import Job
from gpulane.core.lanes import Running
from gpulane.operator.intake import Admission, DropFinalizer, Refuse
from gpulane.operator.translate import Arrivals, Refusal, job_from_body

log = logging.getLogger(__name__)


class JobState(StrEnum):
    PENDING = "pending"  # in the core's queue
    PARKED = "parked"  # waiting for a GpuModel of its model's name
    ASSIGNED = "assigned"  # dispatched by the core, waiting for its backend
    RUNNING = "running"  # shown Running: its executor calls its backend


class Placements(Protocol):
    """The core's answer to where jobs run (``Dispatcher``)."""

    @property
    def running(self) -> dict[str, Running]: ...
    def placed(self, job_id: str) -> Running | None: ...
    def on_lane(self, lane_id: str) -> list[Running]: ...


ACTIVE = frozenset({JobState.ASSIGNED, JobState.RUNNING})


@dataclass
class JobView:
    """What the operator tracks of one GpuJob it has admitted."""

    key: str
    namespace: str
    name: str
    uid: str
    job: Job
    max_run: int | None = None
    generation: int | None = None
    # Where it is, written only by JobTable's moves.
    state: JobState = JobState.PENDING
    decision: Dispatch | None = None
    dispatched_at: float | None = None
    started_at: float | None = None
    woke_at: float | None = None  # when the event that let it dispatch arrived (latency metric)
    # What its object says, written only by JobWrites once a write landed (``api_phase`` first from the
    # object), and by ``observe`` for what a watch event or a patch's answer tells.
    api_phase: str | None = None
    conditions: list[dict[str, Any]] = field(default_factory=list)
    written: tuple[Any, ...] | None = None  # the queue status on it (position, exact, start, score) or parked
    announced: Dispatch | None = None  # the dispatch whose Dispatched Event was posted
    finalizers: list[str] = field(default_factory=list)
    executor_lease: tuple[str, str] | None = None  # (namespace, name) of the Lease of whoever runs it
    # Written only by the controller's end_job.
    ending: bool = False  # a terminal write is in flight
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def model(self) -> str:
        return self.job.model

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def ran(self, now: float) -> float | None:
        """How long it ran, if it started, timed by the operator's own clock: an executor's finishedAt (at or before
        startedAt, say) would drag the model's learned run time, and with it every job's dispatch charge, to 0."""
        return None if self.started_at is None else max(0.0, now - self.started_at)

    def ref(self) -> Body:
        return {
            "apiVersion": API_VERSION,
            "kind": "GpuJob",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
        }

    def observe(self, meta: Body) -> None:
        """What a later event of the job, or a patch's answer, tells: its finalizers, and who runs it (the
        bridge claims jobs applied with kubectl after they are first seen)."""
        self.finalizers = list(meta.get("finalizers") or [])
        self.executor_lease = lease_of(meta)

    @classmethod
    def of(cls, body: Body, job: Job) -> JobView:
        meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
        return cls(
            key=job.id,
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta.get("uid", ""),
            job=job,
            api_phase=status.get("phase"),
            max_run=spec.get("maxRunSeconds"),
            executor_lease=lease_of(meta),
            generation=meta.get("generation"),
            finalizers=list(meta.get("finalizers") or []),
            # The shard that handed it here said so; this shard has it now, and its status says the rest.
            conditions=[c for c in status.get("conditions") or [] if c.get("reason") != HANDED_TO_SHARD],
        )


def job_key(body: Body) -> str:
    """A GpuJob's key in the table, and its core job's id: ``namespace/name``."""
    meta = body["metadata"]
    return f"{meta['namespace']}/{meta['name']}"


def lease_of(meta: Body) -> tuple[str, str] | None:
    """The executor Lease a job names: ``namespace/name``, or ``name`` in the job's own namespace."""
    value = (meta.get("annotations") or {}).get(EXECUTOR_LEASE)
    if not value:
        return None
    namespace, _, name = value.rpartition("/")
    return (namespace or meta["namespace"], name)


@dataclass(frozen=True, slots=True)
class Freed:
    """An active job left the table: its lane has room again (``run_seconds``: how long it ran, if it ended)."""

    view: JobView
    lane: str | None
    run_seconds: float | None


@dataclass(slots=True)
class Intake:
    """What one event asks of the operator beyond the table (a GpuJob's: ``JobTable.enter``), as data that
    ``effects.settle`` applies in order: the core's events, the jobs that gave their lane back, the active jobs
    to end (cancelled: the end is written, then they leave), the writes, and what the records keep: a finished
    job's expiry, a deleted one's uid, a job handed to another shard, a job parked."""

    events: list[Event] = field(default_factory=list)
    freed: list[Freed] = field(default_factory=list)
    cancel: list[JobView] = field(default_factory=list)
    writes: list[Refuse | DropFinalizer] = field(default_factory=list)
    finished: Body | None = None
    gone: str | None = None
    handed: Body | None = None
    parked: bool = False
    decide: bool = False  # the core decides afresh, without an event (a queue deadline passed, a new policy)


class JobTable:
    """Every admitted job by key and the parked ones by model; the core says which ones hold which lane."""

    def __init__(self, placements: Placements) -> None:
        self._placements = placements
        self._jobs: dict[str, JobView] = {}
        self._parked: dict[str, set[str]] = {}  # model -> keys
        # namespace, and (namespace, member) -> keys of the pending and parked jobs there
        self._waiting: dict[str | tuple[str, str], set[str]] = {}
        self.arrivals = Arrivals()  # the submission times given at first sight, to keep them apart

    def get(self, key: str) -> JobView | None:
        return self._jobs.get(key)

    def __getitem__(self, key: str) -> JobView:
        return self._jobs[key]

    def __contains__(self, key: object) -> bool:
        return key in self._jobs

    def __iter__(self) -> Iterator[JobView]:
        return iter(list(self._jobs.values()))

    def __len__(self) -> int:
        return len(self._jobs)

    def holds(self, view: JobView, state: JobState | None = None) -> bool:
        """``view`` is still the tracked job of its key (not released or replaced), in ``state`` if given."""
        return self._jobs.get(view.key) is view and (state is None or view.state == state)

    def on_lane(self, lane: str, state: JobState | None = None) -> list[JobView]:
        """The jobs holding ``lane``'s capacity, oldest dispatch first; only those in ``state`` if given."""
        views = (self._jobs.get(run.job.id) for run in self._placements.on_lane(lane))
        return [v for v in views if v is not None and v.active and (state is None or v.state == state)]

    def lane_of(self, view: JobView) -> str | None:
        """The lane whose capacity an active job holds."""
        run = self._placements.placed(view.key) if view.active else None
        return None if run is None else run.lane

    def holding(self) -> Iterator[tuple[JobView, str]]:
        """The jobs holding a lane's capacity, with their lanes: read from the core's placements, so that the
        tick's deadlines cost the running jobs, not the whole queue (40 ms a second at 100,000 waiting)."""
        for key, run in list(self._placements.running.items()):
            view = self._jobs.get(key)
            if view is not None and view.active:
                yield view, run.lane

    def assigned(self) -> Iterator[tuple[JobView, str]]:
        """Jobs dispatched by the core and not yet Running, with their lanes."""
        return ((view, lane) for view, lane in self.holding() if view.state == JobState.ASSIGNED)

    def parked(self) -> Iterator[JobView]:
        for keys in list(self._parked.values()):
            for key in list(keys):
                yield self._jobs[key]

    def full(self, body: Body, cap: int | None, member_cap: int | None = None) -> Refusal | None:
        """A refusal if the new job's namespace already has ``cap`` jobs waiting (the policy's
        ``admission.maxPendingPerNamespace``), or its member ``member_cap`` in that namespace
        (``admission.maxPendingPerMember``), else None."""
        namespace = body["metadata"]["namespace"]
        waiting = len(self._waiting.get(namespace, ()))
        if cap is not None and waiting >= cap:
            why = (
                f"namespace {namespace} already has {waiting} jobs waiting (admission.maxPendingPerNamespace is {cap})"
            )
            return Refusal("NamespaceQueueFull", why)
        member = str((body.get("spec") or {}).get("member") or namespace)
        mine = len(self._waiting.get((namespace, member), ()))
        if member_cap is not None and mine >= member_cap:
            why = (f"member {member} already has {mine} jobs waiting in namespace {namespace} "
                   f"(admission.maxPendingPerMember is {member_cap})")  # fmt: skip
            return Refusal("MemberQueueFull", why)
        return None

    # -- a GpuJob's watch event ---------------------------------------------------------------------

    def enter(self, kind: str | None, body: Body, admission: Admission) -> Intake:
        """Read one watch event of a GpuJob against the table, move the table, and return what else follows."""
        meta, status = body["metadata"], body.get("status") or {}
        key, phase = job_key(body), status.get("phase")
        seen = self.get(key)
        finalizers = list(meta.get("finalizers") or [])
        intake = Intake()
        if seen is not None and seen.uid != meta.get("uid", ""):  # deleted and created again under the same name
            self._forget(seen, intake)
            seen = None
        if kind == "DELETED":
            intake.gone = meta.get("uid", "")
            if seen is not None:
                self._forget(seen, intake)
            return intake
        if seen is not None:
            seen.observe(meta)
        if phase in TERMINAL_PHASES or (seen is None and meta.get("deletionTimestamp")):
            if seen is not None and seen.active:
                self.free(seen, seen.ran(admission.now), intake)
            if FINALIZER in finalizers:
                intake.writes.append(DropFinalizer(meta["namespace"], meta["name"], finalizers))
            if phase in TERMINAL_PHASES:
                intake.finished = body
        elif seen is None and phase in ("Dispatching", "Running"):
            # Once the operator runs, only its own dispatches are active (the rebuild adopted the others): a job
            # that claims to be (someone with gpujobs/status rights wrote it) takes no lane and is failed.
            lane = str(status.get("lane"))[:63]
            why = f"its status claimed phase {phase} on lane {lane}, but the operator never dispatched it"
            log.warning("not adopting %s: %s", key, why)
            intake.writes.append(Refuse(body, Refusal("NotDispatched", why)))
        elif seen is None:
            self._admit(key, body, admission, intake)
        elif meta.get("deletionTimestamp"):
            self._cancel(seen, intake)
        return intake

    def _admit(self, key: str, body: Body, admission: Admission, intake: Intake) -> None:
        if (body.get("spec") or {}).get("model") in admission.elsewhere:  # its model is another shard's
            intake.handed = body
            return
        full = self.full(body, admission.pending_cap, admission.member_pending_cap)
        result = full or job_from_body(body, key, admission.policy, admission.now, self.arrivals)
        if isinstance(result, Refusal):
            intake.writes.append(Refuse(body, result))
            return
        view = JobView.of(body, result)
        if result.model in admission.models:
            self.admit(view)
            intake.events.append(JobSubmitted(result))
        else:
            self.park(view)
            intake.parked = True

    def _cancel(self, view: JobView, intake: Intake) -> None:
        """The job is being deleted: out of the queue, or cancelled on its lane (the finalizer waits)."""
        if view.active:
            if not view.ending:
                intake.cancel.append(view)
            return
        self._forget(view, intake)
        if FINALIZER in view.finalizers:
            intake.writes.append(DropFinalizer(view.namespace, view.name, view.finalizers))

    def _forget(self, view: JobView, intake: Intake) -> None:
        """The job left (deleted or replaced): out of the queue or off its lane."""
        if view.active:
            self.free(view, None, intake)
        elif self.release(view) and view.state == JobState.PENDING:
            intake.events.append(JobCancelled(view.key))

    def free(self, view: JobView, run_seconds: float | None, intake: Intake) -> Intake:
        """An active job leaves: the core hears it finished (``run_seconds``: how long, if it ran to its end)."""
        lane = self.lane_of(view)
        if self.release(view):
            intake.events.append(JobFinished(view.key, run_seconds))
            intake.freed.append(Freed(view, lane, run_seconds))
        return intake

    def reject(self, view: JobView, reason: str, intake: Intake) -> None:
        """A waiting job the current policy cannot rank leaves; its write (failed with PolicyRejected) goes into
        ``intake``."""
        if self.release(view):
            body = {"metadata": {"namespace": view.namespace, "name": view.name, "uid": view.uid}}
            intake.writes.append(Refuse(body, Refusal("PolicyRejected", reason)))

    def _wait(self, view: JobView, waiting: bool) -> None:
        for bucket in (view.namespace, (view.namespace, view.job.member)):
            keys = self._waiting.setdefault(bucket, set())
            (keys.add if waiting else keys.discard)(view.key)

    # -- moves ----------------------------------------------------------------------------------

    def admit(self, view: JobView) -> None:
        """A new job in the core's queue."""
        self._jobs[view.key] = view
        view.state = JobState.PENDING
        self._wait(view, True)

    def park(self, view: JobView) -> None:
        """A new or waiting job whose GpuModel does not exist (any more)."""
        self._jobs[view.key] = view
        view.state = JobState.PARKED
        self._parked.setdefault(view.model, set()).add(view.key)
        self._wait(view, True)

    def unpark(self, model: str) -> list[JobView]:
        """The jobs that waited for ``model``, back to pending, in arrival order."""
        views = [self._jobs[k] for k in self._parked.pop(model, set())]
        for view in views:
            view.state = JobState.PENDING
        return sorted(views, key=lambda v: (v.job.submitted_at, v.key))

    def assign(self, view: JobView, decision: Dispatch, woke_at: float | None) -> None:
        """The core dispatched the job to a lane: it waits for its backend there."""
        view.state, view.decision = JobState.ASSIGNED, decision
        view.dispatched_at, view.woke_at = decision.at, woke_at
        self._wait(view, False)

    def moved_by(self, effects: list[Effect], woke_at: float | None) -> list[tuple[Effect, JobView]]:
        """The core's effects on jobs, in order, and the jobs they moved: a dispatched job is assigned to its lane,
        an expired one leaves (the core let it go already), a requeued one that still waited for its load waits
        again."""
        moved: list[tuple[Effect, JobView]] = []
        for effect in effects:
            if isinstance(effect, Dispatch):
                view = self._jobs[effect.job.id]  # the core dispatches only what the table gave it
                self.assign(view, effect, woke_at)
            elif isinstance(effect, Expired | Requeued) and (found := self._jobs.get(effect.job.id)) is not None:
                view = found
                if isinstance(effect, Expired):
                    self.release(view)
                elif self.holds(view, JobState.ASSIGNED):
                    self.requeue(view)
                else:
                    continue  # it started, or was requeued already
            else:
                continue
            moved.append((effect, view))
        return moved

    def adopt(self, view: JobView, running: bool, dispatched_at: float, started_at: float | None) -> None:
        """A job found active on a lane (after a restart): its ``JobAdopted`` gives the core its lane."""
        self._jobs[view.key] = view
        view.state = JobState.RUNNING if running else JobState.ASSIGNED
        view.dispatched_at, view.started_at = dispatched_at, started_at
        self._wait(view, False)

    def requeue(self, view: JobView) -> None:
        """An assigned job whose lane's load yielded to a better newcomer (the core took it off): back to waiting."""
        view.state, view.decision, view.dispatched_at = JobState.PENDING, None, None
        self._wait(view, True)

    def start(self, view: JobView, at: float) -> None:
        view.state, view.started_at = JobState.RUNNING, at

    def release(self, view: JobView) -> bool:
        """The job leaves the table (the caller tells the core). False if it had left already."""
        if not self.holds(view):
            return False
        del self._jobs[view.key]
        self._wait(view, False)
        if view.state == JobState.PARKED:
            self._parked.get(view.model, set()).discard(view.key)
        return True
