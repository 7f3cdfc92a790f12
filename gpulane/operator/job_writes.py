"""The API writes of a job: refusals, finalizers, queue positions, Dispatching, Running and the operator's
own outcomes. Each method writes and reports what happened; the controller decides what follows.

``JobWrites`` is also the one writer of what a job's view records of its object (``api_phase``,
``conditions``, ``written``, ``announced``), each set once its write landed.

Status bodies are built from the resource models (``api/resources.py``), so a field that the schema
would prune fails here, in a test, instead of vanishing silently on the apiserver.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from enum import Enum
from typing import Any

from gpulane.api.conditions import condition, merge_condition
from gpulane.api.contract import FINALIZER, Body
from gpulane.api.resources import API_VERSION, GpuJobStatus
from gpulane.api.times import format_duration, format_micro_time, format_time
from gpulane.core.events import Expired, Requeued
from gpulane.core.explain import describe_dispatch
from gpulane.kube.client import Conflict, Fenced, Gone, backoff
from gpulane.kube.protocol import KubeClient
from gpulane.operator.history import DispatchHistory, shown_in
from gpulane.operator.intake import DropFinalizer, Refuse
from gpulane.operator.job_table import JobView
from gpulane.operator.translate import Refusal, score_fields

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, Any]], None]
QUEUE_TIMEOUT = "QueueTimeout"  # the reason of a job still waiting at its queue deadline


def job_status(**fields: Any) -> Body:
    """A GpuJob status patch from its model's fields (camelCase); fields given as None are removed."""
    status = GpuJobStatus.model_validate(fields)
    return status.model_dump(mode="json", by_alias=True, exclude_unset=True)


def dispatched_fields(view: JobView, lane: str | None, history: DispatchHistory, now: float) -> Body:
    """What a job dispatched to ``lane`` says on its status: its lane, score, story and Dispatched condition."""
    decision = view.decision
    fields: Body = {
        "submittedAt": format_micro_time(view.job.submitted_at),
        "lane": lane,
        "dispatchedAt": format_time(view.dispatched_at or now),
        "position": None,
        "positionExact": None,
        "estimatedStart": None,
        "estimatedAt": None,
        "expectedLane": None,
    }
    if decision is not None:
        fields["score"] = score_fields(decision.score)
        queued, until = view.job.submitted_at, view.dispatched_at or now
        fields["story"] = history.story(view.key, queued, until, decision.load)
        reason = "ModelLoad" if decision.load else "Warm"
        text = describe_dispatch(decision, shown_in(view.namespace))
        fields["conditions"] = merge_condition(view.conditions, condition("Dispatched", True, reason, text, now))
    return fields


def refreshable(view: JobView) -> bool:
    """Whether a job's next position may go without its lock: our Pending status is on it, and its finalizer."""
    return view.api_phase == "Pending" and FINALIZER in view.finalizers and len(view.written or ()) == 5


def refreshed(status: Body, written: tuple[Any, ...] | None) -> list[Body]:
    """A refresh as a JSON patch: it applies only while the job is still Pending on the cluster. Fields left
    unset stay as the last queue write left them (it cleared reason and message); an estimate that went is
    removed."""
    patch: list[Body] = [{"op": "test", "path": "/status/phase", "value": "Pending"}]
    patch += [{"op": "add", "path": f"/status/{k}", "value": v} for k, v in status.items() if v is not None]
    for field, index in (("estimatedStart", 2), ("expectedLane", 4)):
        if status.get(field) is None and written is not None and written[index] is not None:
            patch.append({"op": "remove", "path": f"/status/{field}"})
    return patch


@dataclass(frozen=True, slots=True)
class Leave:
    """A job the core took off its lane, or out of its queue, on its own: back to Pending (``Requeued``), or
    Failed with QueueTimeout (``Expired``)."""

    view: JobView
    notice: Expired | Requeued


JobWrite = Refuse | DropFinalizer | Leave


class Ended(Enum):
    WRITTEN = "written"  # our outcome stands
    LOST = "lost"  # the job left the phase we knew: someone else's outcome stands
    GONE = "gone"  # the job no longer exists


@dataclass(frozen=True, slots=True)
class EndResult:
    ended: Ended
    fresh: Body | None = None  # the status that beat ours (LOST), when it could be read


class JobWrites:
    def __init__(self, kube: KubeClient, clock: Callable[[], float], spawn: Spawn) -> None:
        self.kube = kube
        self.clock = clock
        self.spawn = spawn

    async def perform(self, write: JobWrite) -> None:
        """One job's write that an event, or the core, asked for (``intake.py``)."""
        match write:
            case Refuse(body, refusal):
                await self.refuse(body, refusal)
            case DropFinalizer(namespace, name, finalizers):
                await self.drop_finalizer(namespace, name, finalizers)
            case Leave(view, Requeued() as notice):
                await self.requeued(view, notice)
            case Leave(view, Expired() as notice):
                await self.expired(view, notice)

    async def refuse(self, body: Body, refusal: Refusal) -> None:
        """The job cannot be queued: Failed with the refusal's reason, and a Warning Event."""
        meta = body["metadata"]
        now = self.clock()
        cond = condition("Admitted", False, refusal.reason, refusal.message, now, meta.get("generation"))
        status = job_status(
            phase="Failed",
            reason=refusal.reason,
            message=refusal.message,
            finishedAt=format_time(now),
            conditions=merge_condition((body.get("status") or {}).get("conditions"), cond),
            observedGeneration=meta.get("generation"),
        )
        try:
            await self.kube.patch_job_status(meta["namespace"], meta["name"], {"status": status})
        except Gone:
            return
        ref = {"apiVersion": API_VERSION, "kind": "GpuJob", "metadata": meta}
        await self.kube.event(ref, refusal.reason, refusal.message, warning=True, now=now)

    async def requeued(self, view: JobView, notice: Requeued) -> None:
        """Back to Pending after its lane's load yielded or was lost: no lane, no dispatch, the Dispatched
        condition false; its queue position follows from the status writer."""
        now = self.clock()
        if notice.to is None:
            reason = "LoadLost"
            message = f"lane {notice.lane}'s backend pod was lost before it was ready; it waits again, in its place"
        else:
            reason, to = "LoadYielded", shown_in(view.namespace)(notice.to)
            message = f"lane {notice.lane} stopped loading its model for {to}, which outscored it; it waits again"
        async with view.lock:
            view.conditions = merge_condition(view.conditions, condition("Dispatched", False, reason, message, now))
            fields = job_status(phase="Pending", lane=None, dispatchedAt=None, conditions=view.conditions)
            try:
                await self.kube.patch_job_status(view.namespace, view.name, {"status": fields})
            except Gone:
                return
            view.api_phase = "Pending"
        await self.kube.event(view.ref(), reason, message, now=now)

    async def expired(self, view: JobView, notice: Expired) -> None:
        """Failed with QueueTimeout: the core let the job go at its queue deadline, before it started (off the
        table already, so no tick or cancel ends it a second time); then its Event and its finalizer off."""
        now = self.clock()
        waited = format_duration(notice.deadline - notice.job.submitted_at)
        where = f", while lane {notice.lane} loaded its model" if notice.lane else ""
        message = f"still waiting at its queue deadline, {waited} after it was created{where}; it never started"
        async with view.lock:
            result = await self.end(view, "Failed", QUEUE_TIMEOUT, message, now)
        if result.ended is not Ended.WRITTEN:
            return
        await self.kube.event(view.ref(), QUEUE_TIMEOUT, message, warning=True, now=now)
        # On its own: the lane's next dispatch waits for this write, and the drop is retried until it lands.
        self.spawn(self.drop_finalizer(view.namespace, view.name, view.finalizers))

    async def add_finalizer(self, view: JobView) -> None:
        if FINALIZER in view.finalizers:
            return
        patch: list[Body] = [
            {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}
            if view.finalizers
            else {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}
        ]
        view.observe((await self.kube.patch_job(view.namespace, view.name, patch))["metadata"])

    async def drop_finalizer(self, namespace: str, name: str, finalizers: list[str]) -> None:
        """Our finalizer off, until it lands: nothing else asks again (no new event comes for an ended or deleted
        job), so a write lost to a restarting apiserver, or to an admission policy that cannot decide yet after
        one (a 422), would hold the job, and its deletion, until the operator's next start."""
        failed = f"removing the finalizer of {namespace}/{name} failed"
        async for attempt in backoff(log, failed, initial=0.2, max_backoff=10.0):
            # Gone, or no longer the leader (whose rebuild takes it off): nothing left to do.
            with attempt, contextlib.suppress(Gone, Fenced):
                await self._drop(namespace, name, finalizers)

    async def _drop(self, namespace: str, name: str, finalizers: list[str]) -> None:
        """One try at taking our finalizer off; a list that changed meanwhile is read again and tried at once."""
        while FINALIZER in finalizers:
            patch = [
                {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                {"op": "replace", "path": "/metadata/finalizers", "value": [f for f in finalizers if f != FINALIZER]},
            ]
            try:
                await self.kube.patch_job(namespace, name, patch)
                return
            except Conflict:
                finalizers = list((await self.kube.get_job(namespace, name))["metadata"].get("finalizers") or [])

    async def position(self, view: JobView, status: Body, written: tuple[Any, ...], holds: Callable[[], bool]) -> None:
        """A waiting job's queue status (``written`` says what it shows), while ``holds()`` says it still waits.
        Once our Pending status and its finalizer are on it, a new position takes no lock, only a test that it is
        still Pending on the cluster: the head job's refresh was often in flight, holding its lock, when the job
        was dispatched, and its Running write waited one apiserver trip behind it."""
        if refreshable(view):
            if not holds():
                return
            try:
                await self.kube.patch_job_status(view.namespace, view.name, refreshed(status, view.written))
            except (Gone, Conflict):
                return  # dispatched (its Running or Dispatching written first) or gone: nothing to show
            if holds():
                view.written, view.conditions = written, status["conditions"]
            return
        async with view.lock:
            if not holds():
                return  # dispatched or gone since the pass began
            try:
                if status.get("positionExact"):  # likely dispatched soon: take the finalizer off that path
                    await self.add_finalizer(view)
                await self.kube.patch_job_status(view.namespace, view.name, {"status": status})
            except Gone:
                return
            view.written, view.conditions, view.api_phase = written, status["conditions"], "Pending"

    async def dispatched(self, view: JobView, fields: Body) -> bool:
        """Dispatching or Running, with the finalizer first. False if the job is gone."""
        try:
            await self.add_finalizer(view)
            await self.kube.patch_job_status(view.namespace, view.name, {"status": job_status(**fields)})
        except Gone:
            return False
        view.api_phase, view.written = fields["phase"], None  # its position is cleared
        view.conditions = fields.get("conditions", view.conditions)
        self.announce(view)
        return True

    def announce(self, view: JobView) -> None:
        """The Dispatched Event, posted once the job's own status says so (it would delay the status), once
        per dispatch (a requeued job dispatched again is announced again)."""
        if view.decision is not None and view.announced is not view.decision:
            view.announced = view.decision
            text = describe_dispatch(view.decision, shown_in(view.namespace))
            self.spawn(self.kube.event(view.ref(), "Dispatched", text, now=view.decision.at))

    async def end(self, view: JobView, phase: str, reason: str, message: str, now: float) -> EndResult:
        """An outcome of the operator's own (deadline, cancel, lost backend). From a phase it knows, the
        write tests that phase, so an executor's outcome written first stands."""
        fields = job_status(phase=phase, reason=reason, message=message, finishedAt=format_time(now))
        expected = view.api_phase
        patch: Any
        if expected in ("Dispatching", "Running"):
            patch = [{"op": "test", "path": "/status/phase", "value": expected}]
            patch += [{"op": "add", "path": f"/status/{k}", "value": v} for k, v in fields.items()]
        else:
            patch = {"status": fields}
        try:
            await self.kube.patch_job_status(view.namespace, view.name, patch)
        except Conflict:
            # The executor's outcome won. Its event may already have been handled, or be late: read it
            # now rather than retrying a write that cannot succeed.
            fresh = None
            with contextlib.suppress(Gone):
                fresh = (await self.kube.get_job(view.namespace, view.name)).get("status") or {}
            return EndResult(Ended.LOST, fresh)
        except Gone:
            return EndResult(Ended.GONE)
        return EndResult(Ended.WRITTEN)

    async def cluster_status(self, plural: str, name: str, status: Body) -> None:
        with contextlib.suppress(Gone):
            await self.kube.patch_cluster_status(plural, name, {"status": status})
