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
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import ClientSession
from kubernetes.aio.client.exceptions import ApiException

from gpulane.api.backend_pods import PodState, pod_state
from gpulane.api.resources import API_VERSION, GpuLaneSpec
from gpulane.api.shards import Shard
from gpulane.core.lanes import LaneState
from gpulane.kube.client import Conflict, Gone, refusal_message
from gpulane.kube.protocol import KubeClient
from gpulane.operator.job_table import JobState, JobTable, JobView
from gpulane.operator.observed import Observed
from gpulane.operator.pods import TemplateError, backend_pod
from gpulane.operator.server_pods import PresetError, preset_ini
from gpulane.servers.llama_router import LOADED, LOADING, LoadFailed, RouterClient, RouterError

log = logging.getLogger(__name__)

DELETE_RECHECK_SECONDS = 3.0


class BackendFailed(Protocol):
    """The lane's backend cannot serve (``Controller.backend_failed``): a ``lost`` pod's jobs wait again; a server
    that failed a load goes on ``serving`` its model."""

    def __call__(
        self, lane: str, reason: str, message: str, *, lost: bool = False, serving: str | None = None
    ) -> None: ...


class Loaded(Protocol):
    def __call__(self, lane: str, model: str, seconds: float | None, *, in_server: bool = False) -> None: ...


@dataclass(frozen=True)
class LanePorts:
    """What a lane reads (the core's lane, the jobs holding it, the objects seen) and the transitions it asks the
    operator for; the controller builds it once, for every lane."""

    kube: KubeClient  # its pod's calls and Events
    clock: Callable[[], float]
    shard: Shard  # labels its pods carry
    lane_state: Callable[[str], LaneState | None]  # the core's
    jobs: JobTable  # read: the jobs holding the lane
    observed: Observed  # read: models, refusals, pods
    mark_dispatching: Callable[[JobView], Coroutine[Any, Any, None]]
    start_job: Callable[[JobView, PodState], Coroutine[Any, Any, None]]
    model_loaded: Loaded
    backend_failed: BackendFailed
    pod_gone: Callable[[PodState], None]
    spawn: Callable[[Coroutine[Any, Any, Any]], None]


class LaneRunner:
    def __init__(self, ports: LanePorts, name: str, uid: str, spec: GpuLaneSpec, generation: int | None) -> None:
        self.ports = ports
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
        self._session: ClientSession | None = None  # to a server that holds several models
        self._switching = False  # a load by the server is in flight: a pass meanwhile leaves it be

    @property
    def pod(self) -> PodState | None:
        return self.ports.observed.pods.get(self.name)

    @property
    def online(self) -> bool:
        return self.node_problem is None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"lane-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

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

        self.ports.spawn(landed())

    def say(self, reason: str, message: str) -> None:
        """A Normal Event on the GpuLane."""
        lane = {"apiVersion": API_VERSION, "kind": "GpuLane", "metadata": {"name": self.name, "uid": self.uid}}
        self.ports.spawn(self.ports.kube.event(lane, reason, message, now=self.ports.clock()))

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

    def server_of(self, model: str | None) -> str | None:
        """The model whose pod serves ``model``: the server that holds it (its spec.server, a model with a
        router), else the model itself."""
        spec = self.ports.observed.models.get(model or "")
        server = self.ports.observed.models.get(spec.server) if spec is not None and spec.server else None
        return spec.server if spec is not None and server is not None and server.router is not None else model

    async def reconcile(self) -> None:
        ports = self.ports
        core = ports.lane_state(self.name)
        held = core.resident if core is not None else None
        want = self.server_of(held)  # the pod's model: the server, for a model it holds
        pod = self.pod
        now = ports.clock()
        if pod is not None and (pod.failed or pod.model != want or pod.uid == self.deleting):
            await self._remove(pod)  # a pod on its way out never serves again, even the same model
            return
        if want is None:
            return
        model = ports.observed.models.get(want)
        assigned = ports.jobs.on_lane(self.name, JobState.ASSIGNED)
        if assigned and self._leaving:
            return  # a job the core took off this lane is still written as on it: its write's end wakes us
        if pod is None or not pod.ready:
            await asyncio.gather(*(ports.mark_dispatching(view) for view in assigned))
        if pod is None:
            refused = ports.observed.refused_models.get(want)
            if refused is not None:
                ports.backend_failed(self.name, "ModelNotAccepted", f"GpuModel {want!r} is not accepted: {refused}")
                return
            if model is None:
                ports.backend_failed(self.name, "ModelNotFound", f"GpuModel {want!r} no longer exists")
                return
            try:
                manifest = backend_pod(
                    lane=self.name,
                    lane_uid=self.uid,
                    lane_spec=self.spec,
                    model=want,
                    model_spec=model,
                    namespace=ports.kube.namespace,
                    shard_labels=ports.shard.labels(),
                    preset=self._preset(want) if model.router is not None else None,
                )
            except TemplateError as err:  # this lane's GPUs in the template (the model's check says it too)
                ports.backend_failed(self.name, "InvalidTemplate", f"GpuModel {want!r}: spec.template: {err}")
                return
            except PresetError as err:
                ports.backend_failed(self.name, "InvalidPreset", f"GpuModel {want!r}'s server: {err}")
                return
            try:
                created = await ports.kube.create_pod(manifest)
            except Conflict:
                return  # the previous pod is still terminating; its deletion wakes us again
            except ApiException as err:
                if err.status not in (400, 403, 422):
                    raise
                message = f"the apiserver refuses GpuModel {want!r}'s pod: {refusal_message(err)}"
                ports.backend_failed(self.name, "PodRefused", message)
                return
            self.load_started, self.gave_back = now, None
            state = pod_state(created)
            current = ports.observed.pods.get(self.name)
            if state is not None and (current is None or current.uid in self.retired):
                ports.observed.pods[self.name] = state
            log.info("lane %s: loading %s in pod %s", self.name, want, manifest["metadata"]["name"])
            return
        if pod.ready:
            if held != want and held is not None and core is not None:
                if not core.ready:  # the server loads the model it holds: a switch, or a new pod's first load
                    seconds = await self._switch(pod, held, core.loaded, model.port if model else 8080)
                    if seconds is None:
                        return
                    cold, self.load_started = self.load_started, None
                    if cold is None:
                        ports.model_loaded(self.name, held, seconds, in_server=True)
                    else:
                        ports.model_loaded(self.name, held, ports.clock() - cold)
            elif self.load_started is not None or (core is not None and not core.ready):
                seconds = None if self.load_started is None else now - self.load_started
                self.load_started = None
                ports.model_loaded(self.name, want, seconds)
            # Afresh: the load just reported may have let the core dispatch more jobs here.
            await asyncio.gather(*(ports.start_job(v, pod) for v in ports.jobs.on_lane(self.name, JobState.ASSIGNED)))
            return
        if not assigned:
            return  # not Ready, but nobody waits for it (a readiness blip of a loaded model)
        if self.load_started is None:
            self.load_started = now  # found loading (after a restart) or unready: the wait starts now
        timeout = model.load_timeout_seconds if model is not None else 600
        if now - self.load_started > timeout:
            self.load_started = None
            ports.backend_failed(
                self.name, "ModelLoadTimeout", f"backend pod {pod.name} for {want} was not Ready within {timeout}s"
            )
            self.kick()

    def _preset(self, server: str) -> str:
        models = self.ports.observed.models
        return preset_ini({name: spec for name, spec in models.items() if spec.server == server})

    async def _switch(self, pod: PodState, model: str, keep: frozenset[str], port: int) -> float | None:
        """The lane's server loads ``model``, after what it holds beyond ``keep`` (the core's evictions) goes.
        The seconds the load took, or None when it failed (the lane's jobs fail with the reason) or another pass
        has it in hand."""
        endpoint = pod.endpoint(port)
        if endpoint is None or self._switching:
            return None
        self._switching = True
        try:
            return await self._load_in_server(pod, RouterClient(endpoint, self._client()), model, keep)
        finally:
            self._switching = False

    def _client(self) -> ClientSession:
        if self._session is None:
            self._session = ClientSession()
        return self._session

    async def _load_in_server(
        self, pod: PodState, client: RouterClient, model: str, keep: frozenset[str]
    ) -> float | None:
        spec = self.ports.observed.models.get(model)
        timeout = spec.load_timeout_seconds if spec is not None else 600
        try:
            held = await client.models()
            for name, status in held.items():
                if status.value in (LOADED, LOADING) and name != model and name not in keep:
                    await client.unload(name)
            current = held.get(model)
            if current is None or current.value != LOADED:
                await client.load(model)
            seconds = await client.wait_loaded(model, timeout)
        except LoadFailed as err:  # the server goes on, holding what it held: only this model is not there
            self.ports.backend_failed(self.name, "ModelLoadFailed", f"{pod.name}: {err}", serving=pod.model)
            return None
        except TimeoutError as err:
            self.ports.backend_failed(self.name, "ModelLoadTimeout", f"{pod.name}: {err}")
            return None
        except RouterError as err:
            self.ports.backend_failed(self.name, "ServerUnreachable", f"{pod.name}: {err}")
            return None
        log.info("lane %s: %s loaded by its server %s in %.3fs", self.name, model, pod.name, seconds)
        return seconds

    async def _remove(self, pod: PodState) -> None:
        """Delete a pod that serves the wrong model or is dead, once; its deletion event wakes us."""
        if self.deleting == pod.uid:
            # A deletion that completed between the start-up listing and the watch has no event:
            # look again now and then.
            if self.ports.clock() - self.delete_requested > DELETE_RECHECK_SECONDS:
                self.delete_requested = self.ports.clock()
                try:
                    await self.ports.kube.get_pod(pod.name)
                except Gone:
                    self.ports.pod_gone(pod)
            return
        running_on_it = [v for v in self.ports.jobs.on_lane(self.name, JobState.RUNNING) if v.model == pod.model]
        if running_on_it and not pod.failed:
            return  # never interrupt running work: the core drains a lane before it swaps
        self.deleting, self.delete_requested = pod.uid, self.ports.clock()
        self.retired.append(pod.uid)
        self.load_started = None
        gone = not pod.failed and pod.model not in self.ports.observed.models
        why = "dead" if pod.failed else "its GpuModel was deleted" if gone else "idle past its ttl" if \
            self.gave_back else "swap"  # fmt: skip
        log.info("lane %s: deleting pod %s (%s)", self.name, pod.name, why)
        if gone:
            self.say("ModelDeleted", f"GpuModel {pod.model!r} was deleted: its pod {pod.name} is stopped and the GPU "
                     "given back")  # fmt: skip
        try:
            # Gone or replaced by a pod with another uid (Conflict): the watch tells us which.
            with contextlib.suppress(Gone, Conflict):
                await self.ports.kube.delete_pod(pod.name, pod.uid)
        except BaseException:
            self.deleting = None  # a 500 or a timeout may have deleted nothing: the retry deletes again
            raise
