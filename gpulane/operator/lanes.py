"""One ``LaneRunner`` per GpuLane: it makes the lane's backend pod match the model the core wants.

The runner is level-triggered: each pass reads what the core wants resident and what the pod watch
last saw, and takes the one next step (delete the wrong pod, create the right one, start the jobs
waiting for it, or give up on a load that took too long). Any event wakes it; a pass that has
nothing to do makes no API call, so waking it often is cheap and a missed event cannot wedge it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from kubernetes.aio.client.exceptions import ApiException

from gpulane.api.backend_pods import PodState, pod_state
from gpulane.api.resources import API_VERSION, GpuLaneSpec
from gpulane.core.dispatcher import Dispatcher
from gpulane.kube.client import Conflict, Gone, refusal_message
from gpulane.kube.protocol import KubeClient
from gpulane.operator.job_table import JobState, JobTable, JobView
from gpulane.operator.observed import Observed
from gpulane.operator.pods import TemplateError, backend_pod
from gpulane.operator.shards import Router

log = logging.getLogger(__name__)

DELETE_RECHECK_SECONDS = 3.0


class LaneHost(Protocol):
    """What a lane needs from the operator: the state it reads, and the transitions it asks for."""

    kube: KubeClient
    clock: Callable[[], float]
    dispatcher: Dispatcher
    jobs: JobTable
    observed: Observed
    router: Router

    async def mark_dispatching(self, view: JobView) -> None: ...
    async def start_job(self, view: JobView, pod: PodState) -> None: ...
    def model_loaded(self, lane: str, model: str, seconds: float | None) -> None: ...
    def backend_failed(self, lane: str, reason: str, message: str) -> None: ...
    def pod_gone(self, state: PodState) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...


class LaneRunner:
    def __init__(self, host: LaneHost, name: str, uid: str, spec: GpuLaneSpec, generation: int | None) -> None:
        self.host = host
        self.name = name
        self.uid = uid
        self.spec = spec
        self.load_started: float | None = None
        self.deleting: str | None = None  # uid of the pod we asked to delete
        # Every pod this lane asked to delete, latest last: kopf handles each pod (by uid) in a worker of its
        # own, so an old pod's last events may come after its replacement's first (backends.pod_changed).
        self.retired: deque[str] = deque(maxlen=16)
        self.delete_requested = 0.0
        self.generation = generation
        self.node_problem: str | None = None  # why its node cannot serve now (nodes.py); offline while set
        self.gave_back: str | None = None  # why it holds no model: its last one idled past its ttl
        self._leaving = 0  # writes of jobs the core took off this lane (requeued, expired) still in flight
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def pod(self) -> PodState | None:
        return self.host.observed.pods.get(self.name)

    @property
    def online(self) -> bool:
        return self.node_problem is None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"lane-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def kick(self) -> None:
        self._wake.set()

    def leave(self, write: Coroutine[Any, Any, Any]) -> None:
        """The write of a job the core took off this lane on its own (back to the queue, or expired while it
        loaded). The core may give the lane to another job at once: that job is written Dispatching only once
        this write has landed, so a lane's jobs never show more than its capacity on the cluster."""
        self._leaving += 1

        async def landed() -> None:
            try:
                await write
            finally:
                self._leaving -= 1
                self.kick()

        self.host.spawn(landed())

    def say(self, reason: str, message: str) -> None:
        """A Normal Event on the GpuLane."""
        lane = {"apiVersion": API_VERSION, "kind": "GpuLane", "metadata": {"name": self.name, "uid": self.uid}}
        self.host.spawn(self.host.kube.event(lane, reason, message, now=self.host.clock()))

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.reconcile()
            except Exception:
                log.exception("lane %s: reconcile failed; retrying", self.name)
                await asyncio.sleep(1.0)
                self._wake.set()

    async def reconcile(self) -> None:
        host = self.host
        core = host.dispatcher.lane_state(self.name)
        want = core.resident if core is not None else None
        pod = self.pod
        now = host.clock()
        if pod is not None and (pod.failed or pod.model != want or pod.uid == self.deleting):
            await self._remove(pod)  # a pod on its way out never serves again, even the same model
            return
        if want is None:
            return
        model = host.observed.models.get(want)
        assigned = host.jobs.on_lane(self.name, JobState.ASSIGNED)
        if assigned and self._leaving:
            return  # a job the core took off this lane is still written as on it: its write's end wakes us
        if pod is None or not pod.ready:
            await asyncio.gather(*(host.mark_dispatching(view) for view in assigned))
        if pod is None:
            refused = host.observed.refused_models.get(want)
            if refused is not None:
                host.backend_failed(self.name, "ModelNotAccepted", f"GpuModel {want!r} is not accepted: {refused}")
                return
            if model is None:
                host.backend_failed(self.name, "ModelNotFound", f"GpuModel {want!r} no longer exists")
                return
            try:
                manifest = backend_pod(
                    lane=self.name,
                    lane_uid=self.uid,
                    lane_spec=self.spec,
                    model=want,
                    model_spec=model,
                    namespace=host.kube.namespace,
                    shard_labels=host.router.shard.labels(),
                )
            except TemplateError as err:  # this lane's GPUs in the template (the model's check says it too)
                host.backend_failed(self.name, "InvalidTemplate", f"GpuModel {want!r}: spec.template: {err}")
                return
            try:
                created = await host.kube.create_pod(manifest)
            except Conflict:
                return  # the previous pod is still terminating; its deletion wakes us again
            except ApiException as err:
                if err.status not in (400, 403, 422):
                    raise
                message = f"the apiserver refuses GpuModel {want!r}'s pod: {refusal_message(err)}"
                host.backend_failed(self.name, "PodRefused", message)
                return
            self.load_started, self.gave_back = now, None
            state = pod_state(created)
            current = host.observed.pods.get(self.name)
            if state is not None and (current is None or current.uid in self.retired):
                host.observed.pods[self.name] = state
            log.info("lane %s: loading %s in pod %s", self.name, want, manifest["metadata"]["name"])
            return
        if pod.ready:
            if self.load_started is not None or (core is not None and not core.ready):
                seconds = None if self.load_started is None else now - self.load_started
                self.load_started = None
                host.model_loaded(self.name, want, seconds)
            # Afresh: the load just reported may have let the core dispatch more jobs here.
            await asyncio.gather(*(host.start_job(v, pod) for v in host.jobs.on_lane(self.name, JobState.ASSIGNED)))
            return
        if not assigned:
            return  # not Ready, but nobody waits for it (a readiness blip of a loaded model)
        if self.load_started is None:
            self.load_started = now  # found loading (after a restart) or unready: the wait starts now
        timeout = model.load_timeout_seconds if model is not None else 600
        if now - self.load_started > timeout:
            self.load_started = None
            host.backend_failed(
                self.name, "ModelLoadTimeout", f"backend pod {pod.name} for {want} was not Ready within {timeout}s"
            )
            self.kick()

    async def _remove(self, pod: PodState) -> None:
        """Delete a pod that serves the wrong model or is dead, once; its deletion event wakes us."""
        if self.deleting == pod.uid:
            # A deletion that completed between the start-up listing and the watch has no event:
            # look again now and then.
            if self.host.clock() - self.delete_requested > DELETE_RECHECK_SECONDS:
                self.delete_requested = self.host.clock()
                try:
                    await self.host.kube.get_pod(pod.name)
                except Gone:
                    self.host.pod_gone(pod)
            return
        running_on_it = [v for v in self.host.jobs.on_lane(self.name, JobState.RUNNING) if v.model == pod.model]
        if running_on_it and not pod.failed:
            return  # never interrupt running work: the core drains a lane before it swaps
        self.deleting, self.delete_requested = pod.uid, self.host.clock()
        self.retired.append(pod.uid)
        self.load_started = None
        gone = not pod.failed and pod.model not in self.host.observed.models
        why = "dead" if pod.failed else "its GpuModel was deleted" if gone else "idle past its ttl" if \
            self.gave_back else "swap"  # fmt: skip
        log.info("lane %s: deleting pod %s (%s)", self.name, pod.name, why)
        if gone:
            self.say("ModelDeleted", f"GpuModel {pod.model!r} was deleted: its pod {pod.name} is stopped and the GPU "
                     "given back")  # fmt: skip
        try:
            # Gone or replaced by a pod with another uid (Conflict): the watch tells us which.
            with contextlib.suppress(Gone, Conflict):
                await self.host.kube.delete_pod(pod.name, pod.uid)
        except BaseException:
            self.deleting = None  # a 500 or a timeout may have deleted nothing: the retry deletes again
            raise
