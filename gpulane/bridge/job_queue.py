"""The bridge's one seam to the cluster: create a job, follow its phase and position, report its
outcome, hold the executor Lease. ``JobQueue`` is the interface; ``KubeJobQueue`` puts it on GpuJobs.

One watch per bridge replica follows all of its jobs (selected by a label) and fans their changes out
to the calls waiting on them: no polling, and no watch per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.aio.client.exceptions import ApiException

from gpulane.api.contract import (
    API_KEY_LABEL,
    EXECUTOR_LEASE,
    FINALIZER,
    REPLICA_LABEL,
    REQUESTED_PRIORITY,
    UNLOAD_LEASE,
    Body,
)
from gpulane.api.resources import API_VERSION, TERMINAL_PHASES
from gpulane.api.shards import SHARD_LABEL
from gpulane.api.times import format_time
from gpulane.bridge.backends import NoBackend, lane_backend
from gpulane.bridge.calls import CallError
from gpulane.bridge.catalog import Catalog, ServedModel
from gpulane.bridge.creates import PATIENCE_SECONDS, Waiting, create_patiently, transient
from gpulane.kube.client import Gone, Kube, backoff, refusal_message, why, write_outcome
from gpulane.kube.watch import watch_jobs

log = logging.getLogger(__name__)

MODELS_TTL = 5.0


@dataclass(frozen=True, slots=True)
class Submission:
    model: str
    priority: int
    member: str
    tier: str
    max_run_seconds: int
    key: str  # the API key's name, as a label for whoever reads the queue
    queue_timeout_seconds: int | None = None  # X-Gpulane-Queue-Timeout
    requested_priority: int | None = None  # what the caller asked for, when its key capped it lower
    shard: str | None = None  # its model's shard: the job is created in that shard's watch, without a hand-over


@dataclass(frozen=True, slots=True)
class JobProgress:
    phase: str | None
    position: int | None = None
    estimated_start: str | None = None
    endpoint: str | None = None
    reason: str | None = None
    message: str | None = None

    @property
    def ended(self) -> bool:
        return self.phase in TERMINAL_PHASES


@dataclass(frozen=True, slots=True)
class LaneView:
    """A GPU lane as llama-swap's /running tells it: its name, the model loaded on it, and whether it serves."""

    name: str
    model: str | None
    ready: bool


class JobQueue(Protocol):
    async def models(self) -> Catalog: ...
    async def lanes(self) -> list[LaneView]: ...
    async def resident(self, model: str) -> str | None: ...
    async def submit(self, submission: Submission, waiting: Waiting | None = None) -> str: ...
    def follow(self, name: str) -> AsyncIterator[JobProgress]: ...
    async def finish(self, name: str, succeeded: bool, message: str | None = None) -> None: ...
    async def cancel(self, name: str) -> None: ...
    async def unload(self, by: str) -> None: ...


def _refusal(err: ApiException) -> CallError:
    """The apiserver refused the GpuJob (an admission webhook or policy, the schema, a quota): the caller
    gets its message as an OpenAI error; anything else means the cluster cannot take jobs right now."""
    message = refusal_message(err)
    if err.status == 403:
        return CallError(403, f"the cluster refused the job: {message}", kind="permission_error")
    if err.status in (400, 422):
        return CallError(400, f"the cluster refused the job: {message}")
    return _unavailable(f"HTTP {err.status} {message}")


def _unavailable(what: str) -> CallError:
    return CallError(503, f"the cluster cannot take the job now: {what}", kind="server_error",
                     code="cluster_unavailable", retry_after=1)  # fmt: skip


def _state(obj: dict[str, Any]) -> JobProgress:
    status = obj.get("status") or {}
    return JobProgress(
        phase=status.get("phase"),
        position=status.get("position"),
        estimated_start=status.get("estimatedStart"),
        endpoint=status.get("endpoint"),
        reason=status.get("reason"),
        message=status.get("message"),
    )


def outcome_patch(succeeded: bool, message: str | None = None, result: dict[str, Any] | None = None) -> list[Body]:
    """The executor's outcome (docs/job-lifecycle.md): only from Running, tested in the same patch."""
    patch: list[Body] = [
        {"op": "test", "path": "/status/phase", "value": "Running"},
        {"op": "replace", "path": "/status/phase", "value": "Succeeded" if succeeded else "Failed"},
        {"op": "add", "path": "/status/finishedAt", "value": format_time(time.time())},
    ]
    if not succeeded:
        patch += [
            {"op": "add", "path": "/status/reason", "value": "UpstreamError"},
            {"op": "add", "path": "/status/message", "value": (message or "the backend failed")[:1000]},
        ]
    if result is not None:
        patch.append({"op": "add", "path": "/status/result", "value": result})
    return patch


class KubeJobQueue:
    def __init__(self, kube: Kube, replica: str, lease_seconds: int = 10, backend_namespace: str | None = None) -> None:
        self.kube = kube
        self.namespace = kube.namespace
        self.backend_namespace = backend_namespace or kube.namespace
        self.replica = replica
        self.lease = f"gpulane-bridge-{replica}"
        self.lease_seconds = lease_seconds
        self._waiters: dict[str, asyncio.Queue[JobProgress]] = {}
        self._models = Catalog(())
        self._models_at = -MODELS_TTL
        self._tasks: list[asyncio.Task[None]] = []
        self.ready = False  # the watch is in step: follows it, so /readyz turns false while it is broken

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        # A 429 while the apiserver's storage of new CRDs initializes (a fresh install), a timeout: the
        # bridge waits them out instead of crashing at its first call.
        async for attempt in backoff(log, "starting the bridge's job queue failed", initial=0.2, max_backoff=10.0):
            with attempt:
                await self.kube.apply_lease(self.lease, self.replica, self.lease_seconds, time.time())
                await self._cancel_orphans()
        selector = f"{REPLICA_LABEL}={self.replica}"
        watching = watch_jobs(self.kube, self.namespace, selector, self._seen, self._in_step)
        self._tasks += [asyncio.create_task(watching), asyncio.create_task(self._renew())]

    async def _cancel_orphans(self) -> None:
        """Calls of this replica's previous incarnation (a crashed container restarts under the same name and
        renews the same Lease): their clients are gone, so their jobs go, as a disconnect's would. Left
        alone, they would be dispatched with nobody to send their requests, and hold the GPU until
        maxRunSeconds."""
        for job in await self.kube.list_namespaced_jobs(self.namespace, f"{REPLICA_LABEL}={self.replica}"):
            if (job.get("status") or {}).get("phase") not in TERMINAL_PHASES:
                name = job["metadata"]["name"]
                log.warning("cancelling %s: a call of this replica's previous run, whose client is gone", name)
                with contextlib.suppress(Gone):
                    await self.kube.delete_job(self.namespace, name)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(Gone):
            await self.kube.delete_lease(self.lease)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                await self.kube.apply_lease(self.lease, self.replica, self.lease_seconds, time.time())
            except Exception:
                log.exception("renewing the executor Lease failed; retrying")

    def _seen(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":  # gone while someone waits for it: to the waiter it ended
            obj = {**obj, "status": {**(obj.get("status") or {}), "phase": "Cancelled"}}
        waiter = self._waiters.get(obj["metadata"]["name"])
        if waiter is not None:
            waiter.put_nowait(_state(obj))

    def _in_step(self, listed: bool) -> None:
        self.ready = listed

    # -- the seam -------------------------------------------------------------------------------

    async def models(self) -> Catalog:
        if time.monotonic() - self._models_at > MODELS_TTL:
            self._models = Catalog(ServedModel.of(m) for m in await self.kube.list_cluster("gpumodels"))
            self._models_at = time.monotonic()
        return self._models

    async def lanes(self) -> list[LaneView]:
        lanes = await self.kube.list_cluster("gpulanes")
        return [
            LaneView(lane["metadata"]["name"], (lane.get("status") or {}).get("residentModel"),
                     bool((lane.get("status") or {}).get("ready")))
            for lane in sorted(lanes, key=lambda lane: lane["metadata"]["name"])
        ]  # fmt: skip

    async def resident(self, model: str) -> str | None:
        """The URL of a Ready backend pod serving ``model`` now, if a lane has one."""
        for lane in await self.lanes():
            if lane.model == model and lane.ready:
                try:
                    return await lane_backend(self.kube, self.backend_namespace, lane.name, model)
                except NoBackend:  # the lane's status is a moment older than its pod
                    continue
                except ApiException as err:  # no right to read the pod (an install without the chart's Role)
                    log.warning("the backend of lane %s cannot be read (%s): the call is queued", lane.name, why(err))
                    return None
        return None

    async def submit(self, submission: Submission, waiting: Waiting | None = None) -> str:
        """Create the call's job, waiting out a brief outage for up to its queue timeout (or 30 s)."""
        name = f"call-{uuid.uuid4().hex[:12]}"
        self._waiters[name] = asyncio.Queue()
        shard = {SHARD_LABEL: submission.shard} if submission.shard else {}  # no hand-over to its model's shard
        manifest: Body = {
            "apiVersion": API_VERSION,
            "kind": "GpuJob",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {REPLICA_LABEL: self.replica, API_KEY_LABEL: submission.key, **shard},
                "annotations": {EXECUTOR_LEASE: f"{self.namespace}/{self.lease}"},
                # Created with the operator's finalizer: one write less between dispatch and Running.
                "finalizers": [FINALIZER],
            },
            "spec": {
                "model": submission.model,
                "priority": submission.priority,
                "member": submission.member,
                "tier": submission.tier,
                "maxRunSeconds": submission.max_run_seconds,
            },
        }
        if submission.queue_timeout_seconds is not None:
            manifest["spec"]["queueTimeoutSeconds"] = submission.queue_timeout_seconds
        if submission.requested_priority is not None:  # as the webhook records its own caps
            manifest["metadata"]["annotations"][REQUESTED_PRIORITY] = str(submission.requested_priority)
        patience = submission.queue_timeout_seconds or PATIENCE_SECONDS
        try:
            await create_patiently(self.kube, manifest, patience, waiting)
        except BaseException as err:
            self._waiters.pop(name, None)
            if isinstance(err, asyncio.CancelledError) or transient(err):
                # An attempt may have landed with its answer lost: no job may stay behind without its call.
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.kube.delete_job(self.namespace, name))
            if transient(err):  # still unavailable at the bound: a 503 to retry, whatever the last status was
                what = f"HTTP {err.status} {refusal_message(err)}" if isinstance(err, ApiException) else why(err)
                raise _unavailable(what) from None
            if isinstance(err, ApiException):
                raise _refusal(err) from None
            raise
        return name

    async def follow(self, name: str) -> AsyncIterator[JobProgress]:
        """The job's states as the watch sees them, until it runs or ends."""
        waiter = self._waiters.setdefault(name, asyncio.Queue())
        try:
            while True:
                state = await waiter.get()
                yield state
                if state.phase == "Running" or state.ended:
                    return
        finally:
            self._waiters.pop(name, None)

    async def finish(self, name: str, succeeded: bool, message: str | None = None) -> None:
        """The executor's outcome, through the status, only from Running (docs/job-lifecycle.md), written until
        it lands: left unwritten, the job would hold its lane until its run limit."""
        await write_outcome(self.kube, self.namespace, name, outcome_patch(succeeded, message), log)

    async def cancel(self, name: str) -> None:
        """The client went away: deleting the job takes it out of the queue, or off its lane."""
        self._waiters.pop(name, None)
        with contextlib.suppress(Gone):
            await self.kube.delete_job(self.namespace, name)

    async def unload(self, by: str) -> None:
        """/unload: the Lease the operator watches for it, renewed now, in the bridge's namespace."""
        await self.kube.apply_lease(UNLOAD_LEASE, by, 1, time.time())
