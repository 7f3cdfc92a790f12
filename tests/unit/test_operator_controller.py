"""Unit tests of gpulane/operator/controller.py (with lanes.py and status.py) against an in-memory Kube.

``FakeKube`` stands in for the only class that talks to the API: it stores objects, applies merge
patches and JSON patches (a failed ``test`` op raises ``Conflict``), raises ``Gone`` for missing
objects and records every call. Watch events are not delivered by the fake: each test feeds them to
the controller itself, from the stored objects, in the order it wants to examine.

Progress is driven by hand and is deterministic: the lane runners' loops are never started (the
``no_lane_loops`` fixture), ``World.reconcile`` runs one pass of a lane, ``World.settle`` runs every
task the controller spawned to completion, and ``ctl.status.flush()`` is one pass of the status writer.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import math
import time
import types
from collections import Counter
from typing import Any, NamedTuple

import pytest
from kubernetes.aio.client.exceptions import ApiException

from gpulane.api.contract import FINALIZER
from gpulane.api.resources import GpuLaneSpec, GpuModelSpec
from gpulane.api.times import format_time
from gpulane.core.policy import Policy
from gpulane.kube.client import STATUS_WRITE_KINDS, Conflict, Gone
from gpulane.operator import status as status_module
from gpulane.operator.controller import Controller
from gpulane.operator.history import HIDDEN_JOB, redacted
from gpulane.operator.job_table import JobState, JobTable
from gpulane.operator.lanes import LaneRunner
from gpulane.operator.pods import backend_pod
from gpulane.operator.settings import Settings
from gpulane.operator.status import (
    BURST_REFRESH_WRITES,
    DISPATCH_WAIT_SECONDS,
    FIRST_WRITES,
    FORECAST_SHARE,
    HOLD_SHARE,
    bucket,
    pause,
)

from .helpers import until

Body = dict[str, Any]

T0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z
NS = "team-a"  # where the jobs live
SYSTEM = "gpulane-system"  # where the backend pods live
_MISSING = object()


# -- the fake API -------------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Call(NamedTuple):
    verb: str  # the Kube method
    target: str  # "gpujobs/team-a/j1", "gpulanes/gpu-0", "pods/gpulane-system/gpulane-gpu-0"
    body: Any = None  # the patch, manifest or event (a deep copy)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge, ``None`` removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def json_patch(doc: Body, ops: list[Body]) -> Body:
    """RFC 6902 (add, replace, remove, test), applied atomically to a copy."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.get(part, _MISSING)
            if node is _MISSING:
                if op["op"] == "test":
                    raise Conflict(f"test failed: {op['path']} does not exist")
                raise ValueError(f"422: {op['path']}: parent does not exist")
        if op["op"] == "test":
            actual = node.get(last, _MISSING) if isinstance(node, dict) else node[int(last)]
            if actual != op["value"]:
                raise Conflict(f"test failed: {op['path']} is {actual!r}, not {op['value']!r}")
        elif op["op"] in ("add", "replace"):
            value = copy.deepcopy(op["value"])
            if isinstance(node, list):
                if last == "-":
                    node.append(value)
                elif op["op"] == "add":
                    node.insert(int(last), value)
                else:
                    node[int(last)] = value
            else:
                if op["op"] == "replace" and last not in node:
                    raise ValueError(f"422: replace {op['path']}: no such member")
                node[last] = value
        elif op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        else:
            raise ValueError(f"unsupported op {op['op']}")
    return doc


def selects(selector: str, body: Body) -> bool:
    """A label selector of ``key=value`` and ``!key`` terms, as the apiserver reads it."""
    labels = body["metadata"].get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if (term.startswith("!") and key[1:] in labels) or ("=" in term and labels.get(key) != value):
            return False
    return True


class FakeKube:
    """In-memory ``Kube``: the methods the controller, lanes and status writer call, nothing more."""

    def __init__(self, clock: Clock, namespace: str = SYSTEM) -> None:
        self.clock = clock
        self.namespace = namespace
        self.objects: dict[str, Body] = {}  # by target
        self.calls: list[Call] = []
        self.writes: Counter[str] = Counter()
        self.on_write: Any = lambda kind: None
        # Called (synchronously) at the start of a write, before it is applied: lets a test deliver
        # an event "while the request is in flight".
        self.before_write: Any = None
        self.fail_deletes = 0
        self.refuse: dict[str, str] = {}  # image -> the apiserver's message for a pod that serves it
        self._uids = itertools.count(1)

    # -- test side: objects appear and change without the operator -------------------------------

    def put(self, plural: str, body: Body) -> Body:
        meta = body["metadata"]
        meta.setdefault("uid", f"{plural}-uid-{next(self._uids)}")
        meta.setdefault("generation", 1)
        meta.setdefault("creationTimestamp", format_time(self.clock()))
        self.objects[self._target(plural, meta.get("namespace"), meta["name"])] = copy.deepcopy(body)
        return copy.deepcopy(body)

    def get(self, target: str) -> Body:
        return copy.deepcopy(self.objects[target])

    def job(self, name: str, ns: str = NS) -> Body:
        return self.get(f"gpujobs/{ns}/{name}")

    def update(self, target: str, patch: Body) -> Body:
        """A change made by someone else (the executor, the kubelet, a user): returns the new body."""
        self.objects[target] = merge_patch(self.objects[target], patch)
        return self.get(target)

    def vanish(self, target: str) -> Body:
        """The object is really gone (a pod finished terminating): returns its last body."""
        return self.objects.pop(target)

    # -- what the operator sees ------------------------------------------------------------------

    def calls_of(self, verb: str, target: str | None = None) -> list[Call]:
        return [c for c in self.calls if c.verb == verb and (target is None or c.target == target)]

    def index(self, verb: str, target: str, match: Any = lambda body: True) -> int:
        """Where the first matching call is in the call log (for asserting order)."""
        for i, c in enumerate(self.calls):
            if c.verb == verb and c.target == target and match(c.body):
                return i
        raise AssertionError(f"no {verb} on {target} matching; calls: {[c[:2] for c in self.calls]}")

    # -- the Kube interface ---------------------------------------------------------------------

    @staticmethod
    def _target(plural: str, namespace: str | None, name: str) -> str:
        return f"{plural}/{namespace}/{name}" if namespace else f"{plural}/{name}"

    def _read(self, verb: str, target: str) -> Body:
        self.calls.append(Call(verb, target))
        if target not in self.objects:
            raise Gone(target)
        return self.get(target)

    def _write(self, kind: str, verb: str, target: str, body: Any) -> None:
        self.calls.append(Call(verb, target, copy.deepcopy(body)))
        self.writes[kind] += 1
        self.on_write(kind)
        if self.before_write is not None:
            self.before_write(verb, target, body)

    def _patch(self, kind: str, verb: str, target: str, patch: Body | list[Body]) -> Body:
        self._write(kind, verb, target, patch)
        if target not in self.objects:
            raise Gone(target)
        current = self.objects[target]
        new = json_patch(current, patch) if isinstance(patch, list) else merge_patch(current, patch)
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self.objects[target]  # the last finalizer went: the deletion completes
        else:
            self.objects[target] = new
        return copy.deepcopy(new)

    async def list_cluster(self, plural: str, selector: str = "") -> list[Body]:
        self.calls.append(Call("list_cluster", plural))
        found = [t for t, body in self.objects.items() if t.startswith(f"{plural}/") and selects(selector, body)]
        return [self.get(t) for t in found]

    async def list_jobs(self, selector: str = "") -> list[Body]:
        return await self.list_cluster("gpujobs", selector)

    async def get_cluster(self, plural: str, name: str) -> Body:
        return self._read("get_cluster", f"{plural}/{name}")

    async def get_job(self, namespace: str, name: str) -> Body:
        return self._read("get_job", f"gpujobs/{namespace}/{name}")

    async def get_pod(self, name: str) -> Body:
        return self._read("get_pod", f"pods/{self.namespace}/{name}")

    async def list_leases(self, selector: str) -> list[Body]:
        self.calls.append(Call("list_leases", selector))
        return []

    async def list_nodes(self) -> list[Body]:
        self.calls.append(Call("list_nodes", ""))
        return [self.get(t) for t in self.objects if t.startswith("nodes/")]

    async def list_pods(self, selector: str) -> list[Body]:
        self.calls.append(Call("list_pods", selector))
        return [self.get(t) for t, body in self.objects.items()
                if t.startswith(f"pods/{self.namespace}/") and selects(selector, body)]  # fmt: skip

    async def patch_job_status(self, namespace: str, name: str, patch: Body | list[Body]) -> Body:
        return self._patch("job-status", "patch_job_status", f"gpujobs/{namespace}/{name}", patch)

    async def patch_job(self, namespace: str, name: str, patch: Body | list[Body]) -> Body:
        return self._patch("job-metadata", "patch_job", f"gpujobs/{namespace}/{name}", patch)

    async def patch_namespaced(
        self, plural: str, namespace: str, name: str, patch: Body | list[Body], kind: str = ""
    ) -> Body:
        return self._patch(kind or f"{plural}-metadata", "patch_namespaced", f"{plural}/{namespace}/{name}", patch)

    async def patch_cluster_status(self, plural: str, name: str, patch: Body | list[Body]) -> Body:
        return self._patch(STATUS_WRITE_KINDS[plural], "patch_cluster_status", f"{plural}/{name}", patch)

    async def check_pod(self, manifest: Body) -> str | None:
        """A server-side dry run: the apiserver's refusal of a pod whose serving image is in ``refuse``."""
        self.calls.append(Call("check_pod", f"pods/{self.namespace}", copy.deepcopy(manifest)))
        return self.refuse.get(manifest["spec"]["containers"][0].get("image", ""))

    async def create_job(self, manifest: Body) -> Body:
        meta = manifest["metadata"]
        target = f"gpujobs/{meta['namespace']}/{meta['name']}"
        self._write("job-create", "create_job", target, manifest)
        if target in self.objects:
            raise Conflict(f"409: {target} already exists")
        return self.put("gpujobs", copy.deepcopy(manifest))

    async def patch_chain_status(self, namespace: str, name: str, patch: Body | list[Body]) -> Body:
        return self._patch("chain-status", "patch_chain_status", f"gpuchains/{namespace}/{name}", patch)

    async def create_pod(self, manifest: Body) -> Body:
        target = f"pods/{self.namespace}/{manifest['metadata']['name']}"
        self._write("pod-create", "create_pod", target, manifest)
        if target in self.objects:
            raise Conflict(f"409: {target} already exists")
        body = copy.deepcopy(manifest)
        body["metadata"].update(uid=f"pod-uid-{next(self._uids)}", creationTimestamp=format_time(self.clock()))
        body["status"] = {"phase": "Pending"}
        self.objects[target] = body
        return copy.deepcopy(body)

    async def delete_pod(self, name: str, uid: str) -> None:
        """Graceful: the pod is marked and stays until the test calls ``vanish`` (it terminated)."""
        target = f"pods/{self.namespace}/{name}"
        self._write("pod-delete", "delete_pod", target, {"preconditions": {"uid": uid}})
        if target not in self.objects:
            raise Gone(target)
        if self.objects[target]["metadata"]["uid"] != uid:
            raise Conflict(f"409: precondition failed: uid {uid}")
        self.objects[target]["metadata"]["deletionTimestamp"] = format_time(self.clock())

    async def delete_job(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Gone at once (a finished job holds no finalizer of ours); ``fail_deletes`` makes the next ones fail."""
        target = f"gpujobs/{namespace}/{name}"
        self._write("job-delete", "delete_job", target, {"preconditions": {"uid": uid}})
        if self.fail_deletes:
            self.fail_deletes -= 1
            raise TimeoutError("the apiserver did not answer")
        if target not in self.objects:
            raise Gone(target)
        if uid is not None and self.objects[target]["metadata"]["uid"] != uid:
            raise Conflict(f"409: precondition failed: uid {uid}")
        del self.objects[target]

    async def event(self, involved: Body, reason: str, message: str, *, warning: bool = False, now: float) -> None:
        meta = involved["metadata"]
        target = self._target(involved.get("kind", "").lower() + "s", meta.get("namespace"), meta["name"])
        self._write("event", "event", target, {"reason": reason, "message": message, "warning": warning})


# -- objects --------------------------------------------------------------------------------------


def job_body(name: str, model: str = "m", *, created: float = T0, ns: str = NS, **spec: Any) -> Body:
    return {
        "apiVersion": "gpulane.io/v1alpha1",
        "kind": "GpuJob",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": format_time(created)},
        "spec": {"model": model, **spec},
    }


def pod_body(lane: str, model: str, *, ip: str = "10.0.0.7", ready: bool = True, created: float = T0 - 3600) -> Body:
    body = backend_pod(
        lane=lane,
        lane_uid=f"lane-uid-{lane}",
        lane_spec=GpuLaneSpec(),
        model=model,
        model_spec=GpuModelSpec(image="img"),
        namespace=SYSTEM,
    )
    body["metadata"]["creationTimestamp"] = format_time(created)
    body["status"] = ready_status(ip, ready)
    return body


def ready_status(ip: str, ready: bool = True) -> Body:
    state = "True" if ready else "False"
    return {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": state}]}


class World:
    """A controller on a fake API, with helpers that play the API's and the watch's part."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.clock = Clock()
        self.kube = FakeKube(self.clock)
        self.ctl = Controller(self.kube, settings or Settings(namespace=SYSTEM), clock=self.clock)
        self.node("node-0")  # the lanes' node (their empty selector matches it)

    # objects the operator watches, each created in the fake and its ADDED event delivered

    def model(self, name: str = "m", **spec: Any) -> None:
        """GpuModel ``name``, accepted before (its check is test_operator_model_check.py's)."""
        accepted = {"type": "Accepted", "status": "True", "reason": "Valid", "message": "", "observedGeneration": 1,
                    "lastTransitionTime": format_time(self.clock())}  # fmt: skip
        body = self.kube.put("gpumodels", {"metadata": {"name": name}, "spec": {"image": f"{name}:v1", **spec},
                                           "status": {"conditions": [accepted]}})  # fmt: skip
        self.ctl.model_event("ADDED", body)

    def node(self, name: str, ready: bool = True, gpus: str = "1") -> None:
        condition = {"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletNotReady"}
        status = {"conditions": [condition], "allocatable": {"nvidia.com/gpu": gpus}}
        body = self.kube.put("nodes", {"metadata": {"name": name}, "status": status})
        self.ctl.node_event("MODIFIED", body)

    def lane(self, name: str = "gpu-0") -> None:
        body = self.kube.put("gpulanes", {"metadata": {"name": name, "uid": f"lane-uid-{name}"}, "spec": {}})
        self.ctl.lane_event("ADDED", body)

    def pod(self, lane: str = "gpu-0", model: str = "m", **kw: Any) -> str:
        body = self.kube.put("pods", pod_body(lane, model, **kw))
        self.ctl.pod_event("ADDED", body)
        return body["metadata"]["name"]

    def submit(self, name: str, model: str = "m", **kw: Any) -> str:
        body = self.kube.put("gpujobs", job_body(name, model, **kw))
        self.ctl.job_event("ADDED", body)
        return f"{NS}/{name}"

    def claimed(self, name: str, lease: str) -> None:
        """Job ``name``, named by an executor as its own through ``lease`` (as the bridge does)."""
        body = job_body(name)
        body["metadata"]["annotations"] = {"gpulane.io/executor-lease": lease}
        self.ctl.job_event("ADDED", self.kube.put("gpujobs", body))

    def executor_finishes(self, name: str, phase: str = "Succeeded") -> Body:
        """The executor's JSON patch landed: returns the job's new body (not yet delivered)."""
        status = {"phase": phase, "finishedAt": format_time(self.clock())}
        return self.kube.update(f"gpujobs/{NS}/{name}", {"status": status})

    def phase(self, name: str) -> str | None:
        return (self.kube.job(name).get("status") or {}).get("phase")

    # driving progress

    async def settle(self) -> None:
        """Run every task the controller spawned, and those they spawned, to completion."""
        for _ in range(50):
            tasks = list(self.ctl._tasks)
            if not tasks:
                return
            for result in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(result, Exception):
                    raise result
        raise AssertionError("background tasks keep spawning")

    async def reconcile(self, lane: str = "gpu-0") -> None:
        await self.settle()
        await self.ctl.lanes[lane].reconcile()
        await self.settle()

    async def warm(self, *jobs: str, **job_spec: Any) -> None:
        """Lane gpu-0 with model m resident in a Ready pod, and ``jobs`` dispatched and Running on it."""
        self.model("m")
        self.pod()
        self.lane()
        for name in jobs:
            self.submit(name, **job_spec)
        await self.reconcile()
        for name in jobs:
            assert self.phase(name) == "Running"


def running_on(ctl: Controller, lane: str) -> set[str]:
    return {view.key for view in ctl.jobs.on_lane(lane, JobState.RUNNING)}


def statuses(kube: FakeKube, since: int = 0) -> list[tuple[str, Any]]:
    """The job status writes after call number ``since``: (job name, patch)."""
    return [(c.target.rsplit("/", 1)[1], c.body) for c in kube.calls[since:] if c.verb == "patch_job_status"]


def as_merge(patch: Any) -> Any:
    """A JSON patch (a position's refresh) as the merge patch of the fields it adds."""
    if not isinstance(patch, list):
        return patch
    added = [op for op in patch if op["op"] == "add" and op["path"].startswith("/status/")]
    return {"status": {op["path"].removeprefix("/status/"): op["value"] for op in added}}


def sets_phase(phase: str) -> Any:
    """Matches a status patch (merge or JSON) that writes ``phase``."""

    def match(patch: Any) -> bool:
        if isinstance(patch, list):
            return {"op": "add", "path": "/status/phase", "value": phase} in patch
        return patch["status"].get("phase") == phase

    return match


@pytest.fixture(autouse=True)
def no_lane_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lane runners do not start their loops: each test runs ``reconcile`` passes itself."""
    monkeypatch.setattr(LaneRunner, "start", lambda self: None)


# -- 1. a warm dispatch -----------------------------------------------------------------------------


def test_warm_lane_dispatches_straight_to_running():
    async def scenario() -> None:
        w = World()
        w.model("m", port=9000)
        w.pod(ip="10.1.2.3")
        w.lane()
        key = w.submit("j1")
        view = w.ctl.jobs[key]
        assert view.state == "assigned" and view.decision is not None and not view.decision.load

        await w.reconcile()

        job = w.kube.job("j1")
        assert job["status"]["phase"] == "Running"
        assert job["status"]["endpoint"] == "http://10.1.2.3:9000"
        assert job["status"]["pod"] == "gpulane-gpu-0"
        assert job["status"]["lane"] == "gpu-0"
        assert job["metadata"]["finalizers"] == [FINALIZER]
        phases = [p["status"].get("phase") for _, p in statuses(w.kube)]
        assert phases == ["Running"]  # no Dispatching write in between
        target = f"gpujobs/{NS}/j1"
        finalizer = w.kube.index("patch_job", target)
        assert w.kube.calls[finalizer].body == [{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]
        assert finalizer < w.kube.index("patch_job_status", target)
        (event,) = w.kube.calls_of("event", target)
        assert event.body["reason"] == "Dispatched" and not event.body["warning"]
        assert w.kube.index("patch_job_status", target) < w.kube.index("event", target)
        assert w.ctl.jobs[key].state == "running"
        assert running_on(w.ctl, "gpu-0") == {key}
        assert w.kube.calls_of("create_pod") == []

    asyncio.run(scenario())


# -- 2. a dispatch that loads the model ----------------------------------------------------------


async def _cold_dispatch(w: World, load_seconds: float) -> None:
    w.model("m")
    w.lane()
    w.submit("j1")
    await w.reconcile()
    w.clock.now += load_seconds
    pod = w.kube.update(f"pods/{SYSTEM}/gpulane-gpu-0", {"status": ready_status("10.0.0.9")})
    w.ctl.pod_event("MODIFIED", pod)
    await w.reconcile()


def test_pods_of_another_backend_namespace_are_not_ours():
    """Another install's operator keeps its backend pods in its own namespace, with the same labels and
    annotations: they never stand for this operator's lanes."""

    async def scenario() -> None:
        w = World()
        w.model("m")
        w.lane()
        other = pod_body("gpu-0", "m", ip="10.9.9.9")
        other["metadata"]["namespace"] = "another-install"
        w.ctl.pod_event("ADDED", other)
        assert "gpu-0" not in w.ctl.observed.pods
        w.submit("j1")
        await w.reconcile()
        assert w.kube.index("create_pod", f"pods/{SYSTEM}/gpulane-gpu-0") >= 0, "it loads its own pod"

    asyncio.run(scenario())


def test_cold_lane_creates_the_pod_then_runs_the_job_when_ready():
    async def scenario() -> None:
        w = World()
        w.model("m")
        w.lane()
        key = w.submit("j1")
        assert w.ctl.jobs[key].decision.load  # type: ignore[union-attr]

        await w.reconcile()

        (create,) = w.kube.calls_of("create_pod")
        assert create.target == f"pods/{SYSTEM}/gpulane-gpu-0"
        assert create.body["metadata"]["name"] == "gpulane-gpu-0"
        (owner,) = create.body["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "gpulane.io/v1alpha1",
            "kind": "GpuLane",
            "name": "gpu-0",
            "uid": "lane-uid-gpu-0",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert w.phase("j1") == "Dispatching"
        target = f"gpujobs/{NS}/j1"
        assert w.kube.index("patch_job", target) < w.kube.index("patch_job_status", target)
        assert w.kube.index("patch_job_status", target) < w.kube.index("create_pod", create.target)
        assert w.kube.index("patch_job_status", target) < w.kube.index("event", target)

        await w.reconcile()  # nothing new: no API call
        assert len(w.kube.calls_of("create_pod")) == 1
        assert len(statuses(w.kube)) == 1

        w.clock.now += 42
        pod = w.kube.update(create.target, {"status": ready_status("10.0.0.9")})
        w.ctl.pod_event("MODIFIED", pod)
        await w.reconcile()

        job = w.kube.job("j1")
        assert job["status"]["phase"] == "Running"
        assert job["status"]["endpoint"] == "http://10.0.0.9:8000"
        assert [p["status"]["phase"] for _, p in statuses(w.kube)] == ["Dispatching", "Running"]
        assert [c.body["reason"] for c in w.kube.calls_of("event", target)] == ["Dispatched"]  # posted once
        assert w.ctl.dispatcher.lanes["gpu-0"].ready

        await w.ctl.status.flush()
        (write,) = w.kube.calls_of("patch_cluster_status", "gpumodels/m")
        learned = write.body["status"]
        assert learned["loads"] == 1
        assert "loadSeconds" in learned and "runSeconds" in learned
        assert w.kube.get("gpumodels/m")["status"]["loads"] == 1
        # The lane's history says what this dispatch's load cost: a new pod's 42 s.
        (record,) = w.kube.get("gpulanes/gpu-0")["status"]["history"]
        assert (record["loadSeconds"], record["switch"]) == (42.0, False)
        # The CRD stores records as they come (nothing prunes a null): an unset field is left out.
        assert None not in record.values() and "changedBy" not in record

    asyncio.run(scenario())


@pytest.mark.parametrize("finished", [10**9, 0, -100, None], ids=["year-9999", "at-start", "before-start", "none"])
def test_an_executors_finished_at_does_not_poison_the_learned_run_time(finished: int | None):
    """Issue 16, item 6, and issue 34's L3: an executor writing finishedAt 9999-12-31, or one at or before
    startedAt (a run of 0 s that would lower every job's dispatch charge), is timed by the operator's own
    clock instead."""

    async def scenario() -> None:
        w = World()
        await w.warm("j1")
        before = w.ctl.dispatcher.models.get("m").run_seconds
        started = w.clock.now
        w.clock.now += 30
        stamp = {} if finished is None else {"finishedAt": format_time(started + finished)}
        status = {"phase": "Succeeded", **stamp}
        body = w.kube.update(f"gpujobs/{NS}/j1", {"status": status})
        w.ctl.job_event("MODIFIED", body)
        after = w.ctl.dispatcher.models.get("m").run_seconds
        smoothing = w.ctl.dispatcher.models.SMOOTHING
        assert after == pytest.approx(before + smoothing * (30 - before))  # blended toward the 30 s it really ran
        await w.ctl.status.flush()
        assert w.kube.get("gpumodels/m")["status"]["runSeconds"] == round(after, 3)

    asyncio.run(scenario())


def test_learned_load_seconds_written_are_the_cores_estimate():
    async def scenario() -> None:
        w = World()
        await _cold_dispatch(w, load_seconds=42)
        await w.ctl.status.flush()
        (write,) = w.kube.calls_of("patch_cluster_status", "gpumodels/m")
        core = w.ctl.dispatcher.models.get("m").load_seconds
        assert core == pytest.approx(60 + 0.2 * (42 - 60))  # the default 60 s blended with one 42 s load
        assert write.body["status"]["loadSeconds"] == round(core, 3)

    asyncio.run(scenario())


# -- 3. a swap --------------------------------------------------------------------------------------


def test_swap_waits_for_the_running_job_and_for_the_old_pod_to_be_gone():
    async def scenario() -> None:
        w = World()
        w.model("b")
        await w.warm("ja")
        old = w.kube.get(f"pods/{SYSTEM}/gpulane-gpu-0")
        kb = w.submit("jb", model="b", created=T0 + 1)
        assert w.ctl.jobs[kb].state == "pending"
        assert w.ctl.dispatcher.pending_count == 1
        await w.reconcile()
        assert w.kube.calls_of("delete_pod") == []
        assert statuses(w.kube)[-1][0] == "ja"  # nothing written for jb

        w.clock.now += 30
        w.ctl.job_event("MODIFIED", w.executor_finishes("ja"))
        assert w.ctl.jobs[kb].state == "assigned"
        assert w.ctl.jobs[kb].decision.replaces == "m"  # type: ignore[union-attr]
        await w.reconcile()

        assert w.kube.job("ja")["metadata"]["finalizers"] == []
        drop = w.kube.calls_of("patch_job", f"gpujobs/{NS}/ja")[-1].body
        assert drop[0] == {"op": "test", "path": "/metadata/finalizers", "value": [FINALIZER]}
        (delete,) = w.kube.calls_of("delete_pod")
        assert delete.body == {"preconditions": {"uid": old["metadata"]["uid"]}}
        assert w.kube.calls_of("create_pod") == []

        # The kubelet marks the pod terminating; the lane still waits.
        terminating = w.kube.get(delete.target)
        w.ctl.pod_event("MODIFIED", terminating)
        w.clock.now += 1
        await w.reconcile()
        assert w.kube.calls_of("create_pod") == []
        assert len(w.kube.calls_of("delete_pod")) == 1
        assert w.phase("jb") is None  # nothing written for jb until its pod is on the way

        w.ctl.pod_event("DELETED", w.kube.vanish(delete.target))
        await w.reconcile()
        (create,) = w.kube.calls_of("create_pod")
        assert create.body["metadata"]["annotations"]["gpulane.io/model"] == "b"
        assert w.kube.index("delete_pod", delete.target) < w.kube.index("create_pod", delete.target)
        assert w.phase("jb") == "Dispatching"
        assert w.kube.get(delete.target)["metadata"]["uid"] != old["metadata"]["uid"]

    asyncio.run(scenario())


def test_a_swap_whose_pod_delete_failed_deletes_the_pod_again():
    """etcd restarting under a swap answers the pod's delete with a 500 that deleted nothing: the lane must not
    take the pod as on its way out (it found one in a chaos round: the lane waited for a deletion event that
    never came, and no job ran again)."""

    async def scenario() -> None:
        w = World()
        w.model("b")
        await w.warm("ja")
        old = w.kube.get(f"pods/{SYSTEM}/gpulane-gpu-0")
        w.submit("jb", model="b", created=T0 + 1)
        w.clock.now += 30
        w.ctl.job_event("MODIFIED", w.executor_finishes("ja"))

        def unavailable(verb: str, target: str, body: Any) -> None:
            if verb == "delete_pod":
                w.kube.before_write = None  # once
                raise ApiException(status=500, reason="rpc error: code = Unavailable")

        w.kube.before_write = unavailable
        with pytest.raises(ApiException):
            await w.reconcile()
        assert "deletionTimestamp" not in w.kube.get(f"pods/{SYSTEM}/gpulane-gpu-0")["metadata"]

        await w.reconcile()
        first, second = w.kube.calls_of("delete_pod")
        assert first.body == second.body == {"preconditions": {"uid": old["metadata"]["uid"]}}
        assert "deletionTimestamp" in w.kube.get(f"pods/{SYSTEM}/gpulane-gpu-0")["metadata"]

    asyncio.run(scenario())


def test_a_late_event_of_a_replaced_pod_fails_nothing_and_stands_for_no_pod():
    """kopf handles each pod, by uid, in a worker of its own: the terminating event of the lane's first pod
    (model m) can be handled after a second swap brought m back in a new pod of the same name. It used to
    fail the new load with BackendLost (seen in the suite: a load-yield test's batch job never ran)."""

    async def scenario() -> None:
        w = World()
        w.model("b")
        await w.warm("ja")
        target = f"pods/{SYSTEM}/gpulane-gpu-0"
        first_uid = w.kube.get(target)["metadata"]["uid"]
        w.submit("jb", model="b", created=T0 + 1)
        w.clock.now += 30
        w.ctl.job_event("MODIFIED", w.executor_finishes("ja"))
        await w.reconcile()
        late = copy.deepcopy(w.kube.get(target))  # the first pod, terminating: its event is held back
        assert late["metadata"]["deletionTimestamp"] and late["metadata"]["uid"] == first_uid
        w.ctl.pod_event("DELETED", w.kube.vanish(target))
        await w.reconcile()
        second = w.kube.get(target)
        second["status"] = pod_body("gpu-0", "b")["status"]  # the new pod is Ready
        w.ctl.pod_event("MODIFIED", w.kube.put("pods", second))
        await w.reconcile()
        assert w.phase("jb") == "Running"

        w.submit("jc", model="m", created=T0 + 2)  # m again: a third pod, same name
        w.clock.now += 30
        w.ctl.job_event("MODIFIED", w.executor_finishes("jb"))
        await w.reconcile()
        w.ctl.pod_event("DELETED", w.kube.vanish(target))
        await w.reconcile()
        third_uid = w.kube.get(target)["metadata"]["uid"]
        assert third_uid not in (first_uid, second["metadata"]["uid"]) and w.phase("jc") == "Dispatching"

        w.ctl.pod_event("MODIFIED", late)  # the first pod's terminating event, at last
        await w.reconcile()
        assert w.phase("jc") == "Dispatching", w.kube.job("jc")["status"]
        assert w.ctl.observed.pods["gpu-0"].uid == third_uid
        assert [c for c in w.kube.calls_of("delete_pod") if c.body["preconditions"]["uid"] == third_uid] == []

    asyncio.run(scenario())


def test_a_pod_lost_while_loading_puts_its_job_back_once_then_fails_it():
    """A pod deleted, evicted or crashed before it was Ready says nothing of its model, and no call had
    reached it: its job waits again, in its place, and a new pod loads. Lost a second time, it fails."""

    async def scenario() -> None:
        w = World()
        w.model("m")
        w.lane()
        w.submit("j1")
        await w.reconcile()
        target = f"pods/{SYSTEM}/gpulane-gpu-0"
        first = w.kube.get(target)["metadata"]["uid"]
        assert w.phase("j1") == "Dispatching"

        w.clock.now += 5
        w.ctl.pod_event("DELETED", w.kube.vanish(target))  # not the operator's delete: someone else's
        await w.settle()
        job = w.kube.job("j1")
        dispatched = next(c for c in job["status"]["conditions"] if c["type"] == "Dispatched")
        assert (dispatched["status"], dispatched["reason"]) == ("False", "LoadLost"), dispatched
        assert [c.body["reason"] for c in w.kube.calls_of("event", f"gpujobs/{NS}/j1")][-1] == "LoadLost"
        await w.reconcile()
        second = w.kube.get(target)["metadata"]["uid"]
        assert second != first and w.phase("j1") == "Dispatching"

        w.clock.now += 5
        w.ctl.pod_event("DELETED", w.kube.vanish(target))
        await w.settle()
        failed = w.kube.job("j1")["status"]
        assert (failed["phase"], failed["reason"]) == ("Failed", "BackendLost"), failed
        assert w.ctl.dispatcher.running == {} and w.ctl.dispatcher.pending_count == 0

    asyncio.run(scenario())


# -- 4. rebuild -------------------------------------------------------------------------------------


def test_rebuild_decides_only_with_the_whole_queue_known():
    async def scenario() -> None:
        w = World()
        kube, ctl = w.kube, w.ctl
        kube.put("gpumodels", {"metadata": {"name": "m"}, "spec": {"image": "m:v1", "maxConcurrency": 2}})
        kube.put("gpulanes", {"metadata": {"name": "gpu-0", "uid": "lane-uid-gpu-0"}, "spec": {}})
        kube.put("pods", pod_body("gpu-0", "m", ip="10.0.0.5"))
        running = job_body("r1", created=T0 - 600)
        running["metadata"]["finalizers"] = [FINALIZER]
        running["status"] = {
            "phase": "Running",
            "lane": "gpu-0",
            "pod": "gpulane-gpu-0",
            "endpoint": "http://10.0.0.5:8000",
            "dispatchedAt": format_time(T0 - 300),
            "startedAt": format_time(T0 - 300),
            "score": {"priority": 0, "tier": 0, "affinity": 10, "aging": 5.0, "total": 15.0},
        }
        kube.put("gpujobs", running)
        # The lower priority job is the older one: replayed first, it would win a lane that is online.
        kube.put("gpujobs", job_body("low", created=T0 - 200, priority=0))
        kube.put("gpujobs", job_body("high", created=T0 - 100, priority=100))

        await ctl.rebuild()

        assert ctl.ready
        assert [d.job.id for d in ctl.dispatcher.history] == [f"{NS}/high"]
        assert set(ctl.dispatcher.running) == {f"{NS}/r1", f"{NS}/high"}
        assert ctl.jobs[f"{NS}/r1"].state == "running"
        assert ctl.jobs[f"{NS}/low"].state == "pending"
        assert ctl.dispatcher.pending_count == 1

        await w.reconcile()
        await ctl.status.flush()
        assert w.phase("high") == "Running"
        assert kube.job("high")["status"]["endpoint"] == "http://10.0.0.5:8000"
        assert kube.calls_of("patch_job_status", f"gpujobs/{NS}/r1") == []
        assert kube.calls_of("patch_job", f"gpujobs/{NS}/r1") == []
        assert kube.job("r1")["status"]["phase"] == "Running"
        assert w.phase("low") == "Pending"
        assert running_on(ctl, "gpu-0") == {f"{NS}/r1", f"{NS}/high"}
        assert kube.calls_of("create_pod") == [] and kube.calls_of("delete_pod") == []

        # r1 really holds a slot: when it ends, low takes it.
        w.ctl.job_event("MODIFIED", w.executor_finishes("r1"))
        await w.reconcile()
        assert w.phase("low") == "Running"

    asyncio.run(scenario())


# -- 5. load timeout ----------------------------------------------------------------------------


def test_load_timeout_fails_the_job_and_deletes_the_pod():
    async def scenario() -> None:
        w = World()
        w.model("m", loadTimeoutSeconds=30)
        w.lane()
        key = w.submit("j1")
        await w.reconcile()
        assert w.phase("j1") == "Dispatching"
        (create,) = w.kube.calls_of("create_pod")
        uid = w.kube.get(create.target)["metadata"]["uid"]

        w.clock.now += 29
        await w.reconcile()
        assert w.phase("j1") == "Dispatching"

        w.clock.now += 2
        await w.reconcile()  # the pass that gives up
        await w.reconcile()  # the pass that removes the pod

        job = w.kube.job("j1")
        assert job["status"]["phase"] == "Failed"
        assert job["status"]["reason"] == "ModelLoadTimeout"
        assert job["metadata"]["finalizers"] == []
        fail = [p for n, p in statuses(w.kube) if n == "j1"][-1]
        assert fail[0] == {"op": "test", "path": "/status/phase", "value": "Dispatching"}
        (delete,) = w.kube.calls_of("delete_pod")
        assert delete.body == {"preconditions": {"uid": uid}}
        assert w.ctl.dispatcher.lanes["gpu-0"].resident is None
        assert key not in w.ctl.jobs and w.ctl.dispatcher.running == {}
        (warning,) = [c for c in w.kube.calls_of("event", f"gpujobs/{NS}/j1") if c.body["warning"]]
        assert warning.body["reason"] == "ModelLoadTimeout"

    asyncio.run(scenario())


def test_after_a_load_timeout_the_next_job_gets_a_fresh_pod():
    async def scenario() -> None:
        w = World()
        w.model("m", loadTimeoutSeconds=30)
        w.lane()
        w.submit("j1")
        w.submit("j2", created=T0 + 1)
        await w.reconcile()
        w.clock.now += 31
        await w.ctl.lanes["gpu-0"].reconcile()  # gives up on j1's load and kicks itself...
        await w.ctl.lanes["gpu-0"].reconcile()  # ...so the loop runs again at once: the pod is deleted
        await w.settle()  # j1 failed and released: j2 is dispatched, its model loads again
        assert w.ctl.jobs[f"{NS}/j2"].state == "assigned"
        await w.reconcile()

        assert w.phase("j2") != "Failed"
        w.ctl.pod_event("DELETED", w.kube.vanish(f"pods/{SYSTEM}/gpulane-gpu-0"))
        await w.reconcile()
        assert len(w.kube.calls_of("create_pod")) == 2

    asyncio.run(scenario())


def test_a_readiness_blip_does_not_fail_running_jobs():
    async def scenario() -> None:
        w = World()
        await w.warm("j1")  # the pod was created an hour before T0
        w.clock.now += 5
        pod = w.kube.update(f"pods/{SYSTEM}/gpulane-gpu-0", {"status": ready_status("10.0.0.7", ready=False)})
        w.ctl.pod_event("MODIFIED", pod)
        await w.reconcile()

        assert w.phase("j1") == "Running"
        assert w.kube.calls_of("delete_pod") == []

    asyncio.run(scenario())


# -- 6. deadlines -----------------------------------------------------------------------------------


async def _one_tick(w: World) -> None:
    """One pass of the controller's 1-second loop (deadlines, then a kick of every lane), and its writes."""
    w.ctl.tick()
    await w.settle()


def test_deadline_fails_a_running_job_with_a_tested_patch():
    async def scenario() -> None:
        w = World()
        await w.warm("j1", maxRunSeconds=60)
        w.clock.now += 60
        await _one_tick(w)
        assert w.phase("j1") == "Running"

        w.clock.now += 1
        await _one_tick(w)

        job = w.kube.job("j1")
        assert job["status"]["phase"] == "Failed"
        assert job["status"]["reason"] == "DeadlineExceeded"
        assert job["metadata"]["finalizers"] == []
        patch = statuses(w.kube)[-1][1]
        assert isinstance(patch, list)
        assert patch[0] == {"op": "test", "path": "/status/phase", "value": "Running"}
        assert {"op": "add", "path": "/status/phase", "value": "Failed"} in patch
        assert f"{NS}/j1" not in w.ctl.jobs and w.ctl.dispatcher.running == {}

    asyncio.run(scenario())


def test_the_tick_reads_the_jobs_on_lanes_not_the_whole_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: each second the tick looked at every job for a deadline, 40 ms of a second at 100,000 waiting
    (py-spy on the operator). Only jobs holding a lane have one: it asks the core which those are."""

    async def scenario() -> None:
        w = World()
        await w.warm("j1", maxRunSeconds=60)
        for i in range(20):
            w.submit(f"q{i:02d}")
        await w.settle()

        def walk(self: JobTable) -> None:
            raise AssertionError("the tick walked every job")

        monkeypatch.setattr(JobTable, "__iter__", walk)
        w.clock.now += 61
        await _one_tick(w)
        assert w.kube.job("j1")["status"]["reason"] == "DeadlineExceeded"

    asyncio.run(scenario())


def run_limits(w: World, **limits: Any) -> None:
    body = w.kube.put("gpupolicies", {"metadata": {"name": "default", "generation": 2}, "spec": {"runLimits": limits}})
    w.ctl.policy_event("ADDED", body)


@pytest.mark.parametrize(
    ("spec", "scoped", "limit", "where"),
    [({}, {}, 120, "the GpuPolicy's runLimits.defaultSeconds"),
     ({"maxRunSeconds": 10_000}, {}, 600, "the GpuPolicy's runLimits.maxSeconds"),
     ({"maxRunSeconds": 60}, {}, 60, "maxRunSeconds"),
     # Issue 37: lower ceilings for a namespace or a member, whatever the job or the default says.
     ({}, {"namespaceMaxSeconds": {NS: 90}}, 90, f"the GpuPolicy's runLimits.namespaceMaxSeconds[{NS}]"),
     ({"maxRunSeconds": 500, "member": "ann"}, {"namespaceMaxSeconds": {NS: 90}, "memberMaxSeconds": {"ann": 30}},
      30, "the GpuPolicy's runLimits.memberMaxSeconds[ann]"),
     ({"maxRunSeconds": 500, "member": "bob"}, {"memberMaxSeconds": {"ann": 30}, "namespaceMaxSeconds": {"x": 9}},
      500, "maxRunSeconds")],
)  # fmt: skip
def test_the_policys_run_limits_end_jobs_without_a_deadline_and_cap_long_ones(
    spec: dict[str, Any], scoped: dict[str, Any], limit: int, where: str
):
    """Issue 16, item 1: a job with no maxRunSeconds (or a huge one) cannot hold the lane forever."""

    async def scenario() -> None:
        w = World()
        run_limits(w, defaultSeconds=120, maxSeconds=600, executorGraceSeconds=0, **scoped)
        await w.warm("j1", **spec)
        w.clock.now += limit
        await _one_tick(w)
        assert w.phase("j1") == "Running"

        w.clock.now += 1
        await _one_tick(w)
        status = w.kube.job("j1")["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "DeadlineExceeded")
        assert status["message"] == f"ran longer than {limit}s ({where})"

    asyncio.run(scenario())


def test_a_job_without_a_policy_gets_the_default_run_limit():
    async def scenario() -> None:
        w = World()
        lease = {"metadata": {"name": "runner", "namespace": NS},
                 "spec": {"renewTime": format_time(w.clock.now), "leaseDurationSeconds": 100_000}}  # fmt: skip
        w.ctl.lease_event("ADDED", lease)
        await w.warm()
        w.claimed("j1", "runner")
        await w.reconcile()
        w.clock.now += 3600
        await _one_tick(w)
        assert w.phase("j1") == "Running"
        w.clock.now += 1
        await _one_tick(w)
        assert w.kube.job("j1")["status"]["reason"] == "DeadlineExceeded"

    asyncio.run(scenario())


def test_a_running_job_that_names_no_executor_fails_after_the_grace_period():
    async def scenario() -> None:
        w = World()
        await w.warm("orphan")
        w.clock.now += 300
        await _one_tick(w)
        assert w.phase("orphan") == "Running"

        w.clock.now += 1
        await _one_tick(w)
        status = w.kube.job("orphan")["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "NoExecutor")
        assert "executorGraceSeconds=300" in status["message"]
        assert f"{NS}/orphan" not in w.ctl.jobs and w.ctl.dispatcher.running == {}

    asyncio.run(scenario())


def test_a_grace_of_zero_lets_a_job_without_an_executor_run_to_its_deadline():
    async def scenario() -> None:
        w = World()
        run_limits(w, executorGraceSeconds=0)
        await w.warm("batch")
        w.clock.now += 3600
        await _one_tick(w)
        assert w.phase("batch") == "Running"

    asyncio.run(scenario())


def test_a_failed_deadline_write_is_retried_by_the_next_tick():
    """A 500, a 429 or a timeout on the operator's own outcome must not freeze the slot: the job is not left
    marked as ending, so the next tick writes the outcome again and the lane is freed."""

    async def scenario() -> None:
        w = World()
        await w.warm("j1", maxRunSeconds=60)
        w.clock.now += 61

        def overloaded(verb: str, target: str, body: Any) -> None:
            w.kube.before_write = None  # once
            raise RuntimeError("HTTP 429: the apiserver is overloaded")

        w.kube.before_write = overloaded
        w.ctl.tick()
        with pytest.raises(RuntimeError):
            await w.settle()
        assert w.phase("j1") == "Running" and f"{NS}/j1" in w.ctl.jobs

        await _one_tick(w)

        assert w.phase("j1") == "Failed" and f"{NS}/j1" not in w.ctl.jobs
        assert w.ctl.dispatcher.running == {}

    asyncio.run(scenario())


def test_deadline_loses_to_the_executors_outcome():
    async def scenario() -> None:
        w = World()
        await w.warm("j1", maxRunSeconds=60)
        key = f"{NS}/j1"
        w.clock.now += 61
        done = w.executor_finishes("j1")  # on the object, not yet seen by the operator

        await w.ctl.end_job(w.ctl.jobs[key], "Failed", "DeadlineExceeded", "too long")
        await w.settle()

        job = w.kube.job("j1")
        assert job["status"]["phase"] == "Succeeded"
        assert "reason" not in job["status"]
        assert statuses(w.kube)[-1][1][0] == {"op": "test", "path": "/status/phase", "value": "Running"}
        assert key not in w.ctl.jobs  # the outcome was read back at once: the slot is free
        assert not [c for c in w.kube.calls_of("event") if c.body["reason"] == "DeadlineExceeded"]

        w.ctl.job_event("MODIFIED", done)
        await w.settle()
        assert key not in w.ctl.jobs and w.ctl.dispatcher.running == {}
        assert w.kube.job("j1")["metadata"]["finalizers"] == []
        assert w.phase("j1") == "Succeeded"

    asyncio.run(scenario())


def test_executor_outcome_arriving_during_the_deadline_write_frees_the_lane():
    async def scenario() -> None:
        w = World()
        await w.warm("j1", maxRunSeconds=60)
        w.submit("j2", created=T0 + 1)
        key = f"{NS}/j1"
        w.clock.now += 61

        def executor_wins(verb: str, target: str, body: Any) -> None:
            if verb == "patch_job_status" and target.endswith("/j1"):
                w.kube.before_write = None
                w.ctl.job_event("MODIFIED", w.executor_finishes("j1"))

        w.kube.before_write = executor_wins
        await w.ctl.end_job(w.ctl.jobs[key], "Failed", "DeadlineExceeded", "too long")
        await w.reconcile()

        assert w.phase("j1") == "Succeeded"
        assert key not in w.ctl.jobs
        assert w.phase("j2") == "Running"

    asyncio.run(scenario())


# -- 7. cancel --------------------------------------------------------------------------------------


def test_a_namespace_over_its_pending_cap_gets_its_new_jobs_failed():
    """Issue 16, item 16: one namespace cannot flood the queue; the cap counts waiting jobs only."""

    async def scenario() -> None:
        w = World()
        policy = {
            "metadata": {"name": "default", "generation": 3},
            "spec": {"admission": {"maxPendingPerNamespace": 2}},
        }
        w.ctl.policy_event("ADDED", w.kube.put("gpupolicies", policy))
        await w.warm("run")  # holds the lane: what follows waits
        for name in ("w1", "w2", "w3"):
            w.submit(name)
        other = w.kube.put("gpujobs", job_body("theirs", ns="team-b"))
        w.ctl.job_event("ADDED", other)
        await w.settle()
        status = w.kube.job("w3")["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "NamespaceQueueFull")
        assert "already has 2 jobs waiting" in status["message"]
        assert w.ctl.dispatcher.pending_count == 3  # w1, w2 and team-b's job

        w.ctl.job_event("MODIFIED", w.executor_finishes("run"))  # w1 is dispatched: one place frees up
        await w.reconcile()
        w.submit("w4")
        await w.settle()
        assert w.kube.job("w4").get("status", {}).get("phase") != "Failed"
        assert f"{NS}/w4" in w.ctl.jobs

    asyncio.run(scenario())


def test_a_member_over_its_pending_cap_gets_its_new_jobs_failed_and_other_members_of_its_namespace_do_not():
    """Issue 34's L5: the bridge's calls are all jobs of one namespace, one member per key. With
    admission.maxPendingPerMember, one key's full queue refuses that key's next call, never another key's."""

    async def scenario() -> None:
        w = World()
        policy = {"metadata": {"name": "default", "generation": 3},
                  "spec": {"admission": {"maxPendingPerMember": 2}}}  # fmt: skip
        w.ctl.policy_event("ADDED", w.kube.put("gpupolicies", policy))
        await w.warm("run")  # holds the lane: what follows waits
        for name in ("a1", "a2", "a3", "b1"):
            body = job_body(name)
            body["spec"]["member"] = "key-b" if name == "b1" else "key-a"
            w.ctl.job_event("ADDED", w.kube.put("gpujobs", body))
        await w.settle()
        status = w.kube.job("a3")["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "MemberQueueFull")
        assert "member key-a already has 2 jobs waiting" in status["message"]
        assert w.kube.job("b1").get("status", {}).get("phase") != "Failed"
        assert w.ctl.dispatcher.pending_count == 3  # a1, a2 and b1

    asyncio.run(scenario())


def test_a_finished_job_whose_status_is_forged_running_takes_no_lane():
    """Issue 16, item 6 (its adoption part): patching a Succeeded job back to Running on a lane must not
    make the operator adopt it and swap the lane to its model (reproduced with the README's tour)."""

    async def scenario() -> None:
        w = World()
        await w.ctl.rebuild()  # an operator that has started: from now on it knows every job it dispatched
        w.model("other")
        await w.warm("run")
        done = job_body("bobs-image", "other", created=T0 - 100)
        done["status"] = {"phase": "Succeeded", "finishedAt": format_time(T0 - 10)}
        w.ctl.job_event("ADDED", w.kube.put("gpujobs", done))
        forged = w.kube.update(f"gpujobs/{NS}/bobs-image", {"status": {"phase": "Running", "lane": "gpu-0"}})
        w.ctl.job_event("MODIFIED", forged)
        await w.settle()
        assert running_on(w.ctl, "gpu-0") == {f"{NS}/run"}
        assert f"{NS}/bobs-image" not in w.ctl.jobs and set(w.ctl.dispatcher.running) == {f"{NS}/run"}
        status = w.kube.job("bobs-image")["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "NotDispatched")

    asyncio.run(scenario())


def test_deleting_jobs_cancels_them():
    async def scenario() -> None:
        w = World()
        await w.warm("run")
        pending = job_body("wait", created=T0 + 1)
        pending["metadata"]["finalizers"] = ["example.com/keep"]  # someone else's: the deletion waits
        w.ctl.job_event("ADDED", w.kube.put("gpujobs", pending))
        assert w.ctl.dispatcher.pending_count == 1
        await w.ctl.status.flush()  # position 1, exact: the job gets gpulane's finalizer early
        assert w.kube.job("wait")["metadata"]["finalizers"] == ["example.com/keep", FINALIZER]
        mark = len(w.kube.calls)

        stamp = {"metadata": {"deletionTimestamp": format_time(w.clock())}}
        w.ctl.job_event("MODIFIED", w.kube.update(f"gpujobs/{NS}/wait", stamp))
        await w.reconcile()

        assert w.ctl.dispatcher.pending_count == 0
        assert f"{NS}/wait" not in w.ctl.jobs
        (drop,) = [c for c in w.kube.calls[mark:] if c.target.endswith("/wait")]  # only its finalizer goes
        assert (drop.verb, drop.body[-1]["value"]) == ("patch_job", ["example.com/keep"])
        assert w.kube.job("wait")["metadata"]["finalizers"] == ["example.com/keep"]
        assert w.ctl.jobs[f"{NS}/run"].state == "running"
        assert set(w.ctl.dispatcher.running) == {f"{NS}/run"}
        assert running_on(w.ctl, "gpu-0") == {f"{NS}/run"}

        w.ctl.job_event("MODIFIED", w.kube.update(f"gpujobs/{NS}/run", stamp))
        await w.reconcile()

        target = f"gpujobs/{NS}/run"
        assert target not in w.kube.objects  # the finalizer went: the deletion completed
        cancel = w.kube.index("patch_job_status", target, sets_phase("Cancelled"))
        assert w.kube.calls[cancel].body[0] == {"op": "test", "path": "/status/phase", "value": "Running"}
        drop = w.kube.index(
            "patch_job", target, lambda p: p[-1] == {"op": "replace", "path": "/metadata/finalizers", "value": []}
        )
        assert cancel < drop
        assert len(w.ctl.jobs) == 0 and w.ctl.dispatcher.running == {}
        assert [c.body["reason"] for c in w.kube.calls_of("event", target)][-1] == "Deleted"

    asyncio.run(scenario())


# -- 8. policy ----------------------------------------------------------------------------------


def test_policy_invalid_is_refused_and_valid_one_rejects_unknown_tiers():
    async def scenario() -> None:
        w = World()
        w.model("m")  # no lane: every job waits
        w.submit("free-job", tier="free")
        w.submit("max-job", tier="max", created=T0 + 1)
        old = w.ctl.dispatcher.policy
        bad = w.kube.put("gpupolicies", {"metadata": {"name": "default", "generation": 1}, "spec": {"bandSpacing": 20}})

        w.ctl.policy_event("ADDED", bad)
        await w.settle()

        assert w.ctl.dispatcher.policy is old
        (write,) = w.kube.calls_of("patch_cluster_status", "gpupolicies/default")
        (cond,) = write.body["status"]["conditions"]
        assert (cond["type"], cond["status"], cond["reason"]) == ("Accepted", "False", "InvalidPolicy")
        assert "bandSpacing 20" in cond["message"]
        assert write.body["status"]["observedGeneration"] == 1
        assert w.ctl.dispatcher.pending_count == 2

        spec = {"tierBonus": {"free": 0, "pro": 1}}
        w.kube.objects["gpupolicies/default"]["spec"] = spec  # an edit replaces the whole spec
        good = w.kube.update("gpupolicies/default", {"metadata": {"generation": 2}})
        w.ctl.policy_event("MODIFIED", good)
        await w.settle()

        assert w.ctl.dispatcher.policy == Policy.model_validate(spec)
        cond = w.kube.get("gpupolicies/default")["status"]["conditions"][0]
        assert (cond["status"], cond["reason"]) == ("True", "Valid")
        status = w.kube.job("max-job")["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "PolicyRejected")
        assert "max" in status["message"]
        assert f"{NS}/max-job" not in w.ctl.jobs
        assert [j.id for j in w.ctl.dispatcher.ranking.pending()] == [f"{NS}/free-job"]
        assert "status" not in w.kube.job("free-job")

        written = len(w.kube.calls_of("patch_cluster_status", "gpupolicies/default"))
        w.ctl.policy_event("MODIFIED", w.kube.get("gpupolicies/default"))  # its status write, seen back
        await w.settle()
        assert len(w.kube.calls_of("patch_cluster_status", "gpupolicies/default")) == written, "checked once"
        assert w.ctl.observed.policy_generation == 2

    asyncio.run(scenario())


def test_a_parked_job_the_new_policy_refuses_fails_when_its_model_appears():
    async def scenario() -> None:
        w = World()
        w.lane()
        w.submit("j1", model="ghost", tier="max")
        await w.ctl.status.flush()
        assert w.kube.job("j1")["status"]["reason"] == "ModelNotFound"
        spec = {"tierBonus": {"free": 0, "pro": 1}}
        w.ctl.policy_event("ADDED", w.kube.put("gpupolicies", {"metadata": {"name": "default"}, "spec": spec}))
        await w.settle()
        w.model("ghost")
        await w.reconcile()
        await w.ctl.status.flush()

        assert w.phase("j1") == "Failed"

    asyncio.run(scenario())


# -- 9. the status writer ---------------------------------------------------------------------------


def test_status_writer_is_rate_limited_head_first_and_rounds_far_positions():
    async def scenario() -> None:
        w = World(Settings(namespace=SYSTEM, exact_positions=50, status_writes_per_second=100, status_interval=1.0))
        await w.warm("run")
        names = [f"q{i:03d}" for i in range(120)]
        for i, name in enumerate(names):
            w.submit(name, created=T0 + 1 + i)
        mark = len(w.kube.calls)

        await w.ctl.status.flush()

        # The exact positions also get the finalizer early; both writes count against the budget of 100.
        first = statuses(w.kube, mark)
        assert [n for n, _ in first] == names[:50]
        assert first[0][1]["status"]["position"] == 1
        for i, (_, patch) in enumerate(first):
            assert patch["status"]["phase"] == "Pending"
            assert (patch["status"]["position"], patch["status"]["positionExact"]) == (i + 1, True)
        assert w.kube.job("q000")["status"]["estimatedStart"] is not None
        assert w.kube.job("q000")["status"]["expectedLane"] == "gpu-0"  # whose head it is (the web page's "next")
        assert [c.target.rsplit("/", 1)[1] for c in w.kube.calls[mark:] if c.verb == "patch_job"] == names[:50]
        mark = len(w.kube.calls)

        await w.ctl.status.flush()

        second = statuses(w.kube, mark)
        assert [n for n, _ in second] == names[50:]
        assert {(p["status"]["position"], p["status"]["positionExact"]) for _, p in second[:50]} == {(100, False)}
        # Buckets widen with the distance: 51-100 say 100, 101-250 say 250 (then 500, 1,000, 2,500, ...).
        assert {(p["status"]["position"], p["status"]["positionExact"]) for _, p in second[50:]} == {(250, False)}
        mark = len(w.kube.calls)

        w.ctl.status.dirty = True
        await w.ctl.status.flush()
        assert statuses(w.kube, mark) == []
        assert w.kube.writes["job-status"] == 1 + 120  # the Running write, then one per waiting job

    asyncio.run(scenario())


def test_a_long_forecast_spaces_the_passes_so_that_it_takes_at_most_a_quarter_of_the_loop() -> None:
    assert pause(1.0, 0.2, 0.01) == pytest.approx(0.8), "a short queue: a pass every interval"
    assert pause(1.0, 0.9, 0.7) == pytest.approx(0.7 / FORECAST_SHARE - 0.9), "20,000 pending: every 2.8 s"
    assert pause(1.0, 1.5, 0.0) == 0.05


def test_rounded_positions_widen_with_the_distance_from_the_head() -> None:
    assert [bucket(p, 50) for p in (1, 50, 51, 100, 101, 250, 251, 500, 501, 19_999, 20_001)] == [
        50, 50, 100, 100, 250, 250, 500, 500, 1000, 25_000, 25_000]  # fmt: skip
    assert all(bucket(p, 7) >= p for p in range(1, 5000))


async def paced_world(**settings: Any) -> tuple[World, list[float]]:
    """A warm lane running one job, the status writer's passes spaced by a clock the test moves (``clock[0]``)."""
    w = World(Settings(namespace=SYSTEM, **settings))
    clock = [1000.0]
    w.ctl.status.monotonic = lambda: clock[0]
    await w.warm("run")
    return w, clock


async def positioned_queue(jobs: int) -> World:
    """A warm lane running one job, ``jobs`` queued behind it (10 exact positions), every position written."""
    w = World(Settings(namespace=SYSTEM, exact_positions=10, status_writes_per_second=10_000))
    await w.warm("run")
    for i in range(jobs):
        w.submit(f"q{i:03d}", created=T0 + 1 + i)
    while w.ctl.status.dirty:
        await w.ctl.status.flush()
    return w


def test_a_dispatch_rewrites_the_far_positions_only_where_a_job_crosses_a_bucket_boundary():
    """Issue 35: a dispatch moves every waiting job by one. With buckets of one width (multiples of the exact
    count) that rewrote every one in ``exact`` of them: 400 writes per dispatch at 20,000 pending. With buckets
    that widen, one job per boundary: 10 exact positions and the 5 boundaries (20, 50, 100, 200, 500) of 600."""

    async def scenario() -> None:
        w = await positioned_queue(600)
        mark = len(w.kube.calls)
        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/q000"))  # as a dispatch: everyone moves up one
        await w.ctl.status.flush()
        moved = [(n, as_merge(p)) for n, p in statuses(w.kube, mark)]
        rounded = [p for _, p in moved if not p["status"]["positionExact"]]
        assert len(moved) - len(rounded) == 10 and len(rounded) <= 5, [p["status"]["position"] for _, p in rounded]

    asyncio.run(scenario())


def test_past_the_heads_places_moved_exact_positions_are_rewritten_now_and_then():
    """With a dispatch every second (short jobs), every exact position moves every pass: that rewrote each waiting
    job once per dispatch. The head's HEAD_POSITIONS places go every pass; the exact positions past them at most
    every REFRESH_DEFER_SECONDS, and then where the jobs are by then."""

    async def scenario() -> None:
        w, clock = await paced_world(exact_positions=50, status_writes_per_second=10_000)
        head, due = status_module.HEAD_POSITIONS, int(status_module.REFRESH_DEFER_SECONDS)
        names = [f"q{i:02d}" for i in range(head + due + 10)]
        for i, name in enumerate(names):
            w.submit(name, created=T0 + 1 + i)
        await w.ctl.status.flush()  # every first position
        passes = []
        for second in range(1, 2 * due + 1):
            clock[0] += 1
            w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/{names[second - 1]}"))  # everyone moves up
            mark = len(w.kube.calls)
            await w.ctl.status.flush()
            passes.append({n: as_merge(p)["status"]["position"] for n, p in statuses(w.kube, mark)})
        for second, written in enumerate(passes, start=1):
            waiting = names[second:]
            # The head's places every pass, each where it is.
            assert {n: written[n] for n in waiting[:head]} == {n: i + 1 for i, n in enumerate(waiting[:head])}
            past = {n: position for n, position in written.items() if n not in waiting[:head]}
            if (second - 1) % due:
                assert past == {}, (second, past)
            else:  # the first move at once, then every REFRESH_DEFER_SECONDS: all of them, where they are now
                assert past == {n: i + 1 for i, n in enumerate(waiting) if i >= head}, (second, past)

    asyncio.run(scenario())


def test_a_job_that_comes_within_the_exact_positions_past_the_head_waits_for_their_refresh():
    """Each dispatch brings one job from a rounded position to an exact one. Past the head's places that first
    exact position waits for the exact positions' refresh (every REFRESH_DEFER_SECONDS) as their moves do, with
    its rounded one, an upper bound, on it meanwhile: with a dispatch a second it was a write per dispatch."""

    async def scenario() -> None:
        exact = 20
        w, clock = await paced_world(exact_positions=exact, status_writes_per_second=10_000)
        due = int(status_module.REFRESH_DEFER_SECONDS)
        names = [f"q{i:02d}" for i in range(2 * exact)]
        for i, name in enumerate(names):
            w.submit(name, created=T0 + 1 + i)
        await w.ctl.status.flush()  # every first position: 21st to 40th rounded to 40
        for second in range(1, 2 * due + 1):
            clock[0] += 1
            w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/{names[second - 1]}"))  # everyone moves up
            mark = len(w.kube.calls)
            await w.ctl.status.flush()
            written = {n: as_merge(p)["status"] for n, p in statuses(w.kube, mark)}
            crossed = names[second - 1 + exact]  # now 20th: exact, past the head
            if (second - 1) % due:
                assert crossed not in written, (second, written.get(crossed))
            else:  # with the refresh of the exact positions past the head
                assert (written[crossed]["position"], written[crossed]["positionExact"]) == (exact, True), second

    asyncio.run(scenario())


def test_a_job_whose_model_appears_gets_its_position_at_once_even_past_the_heads_places():
    """A parked job (no GpuModel of its model yet) has a status written, but no position: when its model appears,
    its first position goes out at the next pass, although it is past the head's places and a refresh of those
    has just gone out."""

    async def scenario() -> None:
        w, clock = await paced_world(exact_positions=50, status_writes_per_second=10_000)
        for i in range(15):
            w.submit(f"q{i:02d}", created=T0 + 1 + i)
        w.submit("late", model="other", created=T0 + 100)
        await w.ctl.status.flush()  # positions, and late parked
        clock[0] += 1
        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/q00"))  # everyone moves up: a deep refresh
        mark = len(w.kube.calls)
        await w.ctl.status.flush()
        assert "q14" in dict(statuses(w.kube, mark))
        clock[0] += 1
        w.model("other")
        mark = len(w.kube.calls)
        await w.ctl.status.flush()
        written = {n: as_merge(p)["status"] for n, p in statuses(w.kube, mark)}
        assert written["late"]["position"] == 15 and written["late"]["positionExact"] is True, written

    asyncio.run(scenario())


def counted_forecasts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The forecast steps each status pass takes, one count per pass."""
    passes: list[int] = []
    real = status_module.forecasting

    def counting(dispatcher: Any) -> Any:
        passes.append(0)
        for step in real(dispatcher):
            passes[-1] += 1
            yield step

    monkeypatch.setattr(status_module, "forecasting", counting)
    return passes


def test_a_dispatch_forecasts_only_the_heads_until_a_job_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: every pass forecast the whole queue, so at 20,000 pending each dispatch paid for a forecast
    of all of it (CPU per dispatch 1.9x its value at 1,000). A job's end moves the queue by one: the next pass
    forecasts each lane's head (its exact positions) and stops; an arrival reorders it: the next pass forecasts
    all of it and gives the newcomer its position, with the time of that forecast."""
    passes = counted_forecasts(monkeypatch)

    async def scenario() -> None:
        w = await positioned_queue(600)
        assert passes[-1] >= 600
        mark = len(w.kube.calls)
        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/q000"))  # everyone moves up one
        await w.ctl.status.flush()
        assert passes[-1] <= status_module.HEAD_FORECAST_SPAN * 10
        assert sum(1 for _, p in statuses(w.kube, mark) if as_merge(p)["status"]["positionExact"]) == 10
        w.clock.now += 5
        w.submit("late", created=T0 + 700)
        await w.ctl.status.flush()
        assert passes[-1] >= 600
        late = [as_merge(p)["status"] for n, p in statuses(w.kube, mark) if n == "late"]
        assert late and (late[-1]["position"], late[-1]["positionExact"]) == (1000, False)  # the 600th, rounded
        assert late[-1]["estimatedAt"] == format_time(w.clock())

    asyncio.run(scenario())


def test_the_models_learned_figures_written_back_do_not_forecast_the_whole_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 35: at 100,000 pending a dispatch cost 15 ms of CPU in some runs and 73 to 85 ms in others. The slow
    ones wrote the model's learned run time: its watch event came back, the core was told the model again, and
    the next pass forecast the whole queue. The event of a status write alone now tells the core nothing."""
    passes = counted_forecasts(monkeypatch)

    async def scenario() -> None:
        w = await positioned_queue(600)
        w.clock.now += 30
        w.ctl.job_event("MODIFIED", w.executor_finishes("run"))  # a run time learned, the model's status written
        while w.ctl.status.dirty:
            await w.ctl.status.flush()
        learned = w.kube.get("gpumodels/m")
        assert learned["status"]["runs"] == 1  # the write whose event comes back
        core = w.ctl.dispatcher.models.get("m")
        w.ctl.model_event("MODIFIED", learned)
        assert w.ctl.dispatcher.models.get("m") == core  # not the rounded figures
        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/q001"))  # the queue moves by one
        await w.ctl.status.flush()
        assert passes[-1] <= status_module.HEAD_FORECAST_SPAN * 10, passes[-3:]

    asyncio.run(scenario())


def test_the_whole_queue_is_forecast_again_once_its_last_forecast_has_aged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Far jobs' rounded positions lag by at most the age of the last whole forecast: past it a pass forecasts
    all of the queue again even when nothing reordered it."""
    passes = counted_forecasts(monkeypatch)

    async def scenario() -> None:
        w = await positioned_queue(100)
        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/q000"))
        await w.ctl.status.flush()
        assert passes[-1] <= status_module.HEAD_FORECAST_SPAN * 10
        monkeypatch.setattr(status_module, "REFRESH_SECONDS", 0.0)
        monkeypatch.setattr(status_module, "FULL_FORECAST_SHARE", math.inf)  # any age is old enough
        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/q001"))
        await w.ctl.status.flush()
        assert passes[-1] == 98

    asyncio.run(scenario())


def test_a_long_forecast_lets_the_loop_run_between_its_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: a queue of 20,000 took 0.6 s to forecast in one piece, and a dispatch that arrived meanwhile
    waited for all of it (the p99 of 2.1 s). The pass now gives the loop its turn every slice."""
    monkeypatch.setattr(status_module, "FORECAST_SLICE_SECONDS", 0.0)

    async def scenario() -> list[bool]:
        w = World()
        await w.warm("run")
        for i in range(30):
            w.submit(f"q{i:03d}", created=T0 + 1 + i)
        w.ctl.status._depth = {"sentinel": {}}  # replaced once the forecast is done
        seen: list[bool] = []
        asyncio.get_running_loop().call_soon(lambda: seen.append("sentinel" in w.ctl.status._depth))
        await w.ctl.status.flush()
        return seen

    assert asyncio.run(scenario()) == [True], "the loop ran while the forecast was still going"


def test_a_pass_that_held_the_loop_long_is_followed_by_a_longer_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: the forecast's first step cannot be sliced: the dispatcher's fork copied the whole queue, 50 to
    66 ms at 100,000 pending, and a dispatch that arrived meanwhile waited for it, every pass (once a second). The
    pass measures its longest hold of the loop, and the next waits until holds take at most HOLD_SHARE of it."""
    real, skew = status_module.forecasting, [0.0]

    def slow_fork(dispatcher: Any) -> Any:
        skew[0] += 0.05  # the fork of a long queue takes 50 ms by the writer's clock, without a turn of the loop
        yield from real(dispatcher)

    clock = types.SimpleNamespace(monotonic=time.monotonic, perf_counter=lambda: time.perf_counter() + skew[0])
    monkeypatch.setattr(status_module, "time", clock)
    monkeypatch.setattr(status_module, "forecasting", slow_fork)

    async def scenario() -> tuple[float, float, Any]:
        w = World()
        await w.warm("run")
        for i in range(3):
            w.submit(f"q{i}", created=T0 + 1 + i)
        await w.ctl.status.flush()
        return w.ctl.status.held_seconds, w.ctl.status.forecast_seconds, w.ctl.metrics.registry

    held, forecast, registry = asyncio.run(scenario())
    assert 0.05 <= held <= forecast
    # Shown to whoever runs it: the hold and the forecast (of the whole queue: three jobs), one pass each.
    assert registry.get_sample_value("gpulane_forecast_hold_seconds_sum") == held
    assert registry.get_sample_value("gpulane_forecast_hold_seconds_bucket", {"le": "0.025"}) == 0
    assert registry.get_sample_value("gpulane_forecast_seconds_sum", {"scope": "queue"}) == forecast
    assert pause(1.0, 0.06, forecast, held) >= 0.05 / HOLD_SHARE - 0.06 > 1.0, "a pass every 1.7 s or more"
    assert pause(1.0, 0.06, 0.01, 0.012) == pytest.approx(0.94), "20,000 pending (a 12 ms fork): every interval"


def test_a_jobs_new_position_never_holds_back_its_dispatch() -> None:
    """Issue 35: the head job's position refresh was often in flight, holding its lock, when the job was
    dispatched, and its Running write waited one apiserver trip behind it (the warm dispatch p50's operator
    part, 20 ms at 20,000 pending). A refresh takes no lock: it tests that the job is still Pending, so the
    Running write goes at once, and a refresh that comes after it changes nothing."""

    async def scenario() -> None:
        w = World()
        await w.warm("run")
        w.submit("next", created=T0 + 1)
        await w.ctl.status.flush()
        assert w.kube.job("next")["status"]["position"] == 1
        started, gate, inner = asyncio.Event(), asyncio.Event(), w.kube.patch_job_status

        async def slow(namespace: str, name: str, patch: Any) -> Body:
            if isinstance(patch, list) and name == "next" and patch[0]["op"] == "test":
                started.set()
                await gate.wait()  # a refresh the apiserver is slow to take
            return await inner(namespace, name, patch)

        w.kube.patch_job_status = slow  # type: ignore[method-assign]
        w.clock.now += 120  # its estimate moved: a refresh to write
        w.ctl.status.dirty = True
        pass_ = asyncio.create_task(w.ctl.status.flush())
        await asyncio.wait_for(started.wait(), 5)
        w.ctl.job_event("MODIFIED", w.executor_finishes("run"))  # the lane frees: next is dispatched, warm
        await asyncio.wait_for(w.ctl.lanes["gpu-0"].reconcile(), 5)
        assert w.phase("next") == "Running", "the Running write did not wait for the refresh"
        gate.set()
        await pass_
        assert w.phase("next") == "Running", "the late refresh changed nothing"

    asyncio.run(scenario())


def test_first_positions_go_out_many_at_once_and_refreshes_one_at_a_time_but_in_a_burst():
    """A burst's first positions are bound by the apiserver's latency: many in flight. Rewrites of positions
    already written are refreshes: from a settled queue one at a time, so that a pass's wave of them does not
    crowd a dispatch's Running write (with 4 the slowest dispatches came with one); in a burst, whose first
    positions go many at once anyway, a few at a time, to keep pace with it."""

    async def scenario() -> None:
        w, clock = await paced_world(exact_positions=100, status_writes_per_second=1000)
        for i in range(80):
            w.submit(f"q{i:03d}", created=T0 + 1 + i)
        inner, flight = w.kube.patch_job_status, Counter[str]()
        peaks: list[Counter[str]] = []

        async def slow(namespace: str, name: str, patch: Any) -> Body:
            kind = "refresh" if (w.kube.job(name).get("status") or {}).get("position") else "first"
            flight[kind] += 1
            peaks[-1][kind] = max(peaks[-1][kind], flight[kind])
            try:
                await asyncio.sleep(0)  # a yield, no time: every write allowed in flight starts before one ends
                return await inner(namespace, name, patch)
            finally:
                flight[kind] -= 1

        async def flush() -> Counter[str]:
            peaks.append(Counter())
            clock[0] += 11  # past every deferral: each pass writes all that moved
            await w.ctl.status.flush()
            return peaks[-1]

        w.kube.patch_job_status = slow
        assert await flush() == {"first": FIRST_WRITES}
        assert w.kube.job("q079")["status"]["position"] == 80
        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/q000"))  # every later position moves up
        assert await flush() == {"refresh": 1}
        assert w.kube.job("q079")["status"]["position"] == 79
        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/q001"))  # and again, while 40 new jobs arrive
        for i in range(40):
            w.submit(f"r{i:03d}", created=T0 + 200 + i)
        assert await flush() == {"first": FIRST_WRITES, "refresh": BURST_REFRESH_WRITES}
        assert w.kube.job("q079")["status"]["position"] == 78
        assert w.kube.job("r000")["status"]["position"] == 79

    asyncio.run(scenario())


def test_a_burst_of_first_positions_goes_before_refreshes():
    """In a burst, a job with no position at all is written before one whose position moved, even one
    nearer the head: the refreshes wait for a pass with budget left (with 10 lanes, head-first order spent
    the budget on exact positions rewritten over and over while new jobs waited minutes for any)."""

    async def scenario() -> None:
        w = World(Settings(namespace=SYSTEM, exact_positions=100, status_writes_per_second=50))
        await w.warm("run")
        for i in range(10):
            w.submit(f"a{i}", created=T0 + 1 + i)
        await w.ctl.status.flush()
        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/a0"))  # a1..a9 move up one place
        for i in range(30):
            w.submit(f"b{i:02d}", created=T0 + 100 + i)
        mark = len(w.kube.calls)

        await w.ctl.status.flush()

        # A budget of 50: each exact first position costs two writes (with the finalizer).
        assert [n for n, _ in statuses(w.kube, mark)] == [f"b{i:02d}" for i in range(25)]
        mark = len(w.kube.calls)
        await w.ctl.status.flush()
        assert [n for n, _ in statuses(w.kube, mark)] == [
            *(f"b{i:02d}" for i in range(25, 30)),
            *(f"a{i}" for i in range(1, 10)),
        ]

    asyncio.run(scenario())


def test_while_jobs_keep_arriving_moved_positions_are_rewritten_now_and_then():
    """Arrivals that never stop would hold the refreshes back for good: they wait REFRESH_DEFER_SECONDS at most,
    then go out beside the first positions (in a burst, once per that time rather than every pass)."""

    async def scenario() -> None:
        w, clock = await paced_world(exact_positions=100, status_writes_per_second=1000)
        for i in range(5):
            w.submit(f"a{i}", created=T0 + 1 + i)
        await w.ctl.status.flush()
        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/a0"))  # a1..a4 move up one place
        w.submit("first-burst", created=T0 + 50)
        mark = len(w.kube.calls)
        await w.ctl.status.flush()  # the first refresh goes out at once
        assert {n for n, _ in statuses(w.kube, mark)} == {"first-burst", "a1", "a2", "a3", "a4"}
        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/a1"))  # a2..a4 move up again
        written = []
        for second in range(1, 13):
            clock[0] += 1
            w.submit(f"b{second:02d}", created=T0 + 100 + second)
            mark = len(w.kube.calls)
            await w.ctl.status.flush()
            names = [n for n, _ in statuses(w.kube, mark)]
            assert f"b{second:02d}" in names  # every arrival's first position at once
            written.append(sorted(n for n in names if n.startswith("a")))
        # Held back while arrivals pend, then written once, REFRESH_DEFER_SECONDS after the last refresh.
        assert written.count(["a2", "a3", "a4"]) == 1, written
        assert written.index(["a2", "a3", "a4"]) + 1 == status_module.REFRESH_DEFER_SECONDS, written

    asyncio.run(scenario())


def test_in_a_burst_rounded_positions_wait_longer_than_exact_ones():
    """Issue 35: in a burst of 100,000 jobs most rewrites beyond the first positions were rounded positions whose
    bucket changed as members' arrivals interleaved. While jobs wait for a first position, exact positions that
    moved go out every REFRESH_DEFER_SECONDS, rounded ones every ROUNDED_DEFER_SECONDS."""

    async def scenario() -> None:
        w, clock = await paced_world(exact_positions=2, status_writes_per_second=1000)
        for i in range(6):
            w.submit(f"a{i}", created=T0 + 1 + i)
        await w.ctl.status.flush()
        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/a0"))
        w.submit("first-burst", created=T0 + 50)
        await w.ctl.status.flush()  # both kinds of refresh go out at once, the first time
        # a2 and a3 move to the exact places 1 and 2; a5 from 5 (rounded to 10) to 4 (rounded to 4)
        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/a1"))
        exact_due, rounded_due = int(status_module.REFRESH_DEFER_SECONDS), int(status_module.ROUNDED_DEFER_SECONDS)
        written = []
        for second in range(1, rounded_due + 2):
            clock[0] += 1
            w.submit(f"b{second:02d}", created=T0 + 100 + second)
            mark = len(w.kube.calls)
            await w.ctl.status.flush()
            names = [n for n, _ in statuses(w.kube, mark)]
            assert f"b{second:02d}" in names  # every arrival's first position at once
            written.append(sorted(n for n in names if n.startswith("a")))
        assert [(i + 1, names) for i, names in enumerate(written) if names] == [
            (exact_due, ["a2", "a3"]),
            (rounded_due, ["a5"]),
        ], written

    asyncio.run(scenario())


def test_in_a_burst_a_pass_writes_few_refreshes_head_first(monkeypatch) -> None:
    """A pass waits for its writes, so a wave of refreshes (4 in flight) held the next first positions back: in a
    burst a pass writes at most BURST_REFRESHES of them, the head's first, and the rest in later passes."""
    monkeypatch.setattr(status_module, "BURST_REFRESHES", 3)

    async def scenario() -> None:
        w, clock = await paced_world(exact_positions=100, status_writes_per_second=1000)
        for i in range(8):
            w.submit(f"a{i}", created=T0 + 1 + i)
        await w.ctl.status.flush()
        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/a0"))  # a1..a7 move up one place
        passes = []
        for second in range(3):
            clock[0] += status_module.ROUNDED_DEFER_SECONDS
            w.submit(f"b{second}", created=T0 + 100 + second)
            mark = len(w.kube.calls)
            await w.ctl.status.flush()
            names = [n for n, _ in statuses(w.kube, mark)]
            assert f"b{second}" in names
            passes.append([n for n in names if n.startswith("a")])
        assert passes == [["a1", "a2", "a3"], ["a4", "a5", "a6"], ["a7"]]

    asyncio.run(scenario())


def test_a_pass_after_a_long_pause_may_write_for_all_of_it() -> None:
    """Issue 35: a long queue's passes are spaced (every 16 s at 100,000 pending), but each pass's budget was
    one interval's (500 writes), so positions went out at 30 a second while jobs arrived at 200. A pass's
    budget stands for the time since the last one began (at most a minute)."""

    async def scenario() -> list[int]:
        w = World(Settings(namespace=SYSTEM, exact_positions=10, status_writes_per_second=10, status_interval=1.0))
        await w.warm("run")
        mono = [1000.0]
        w.ctl.status.monotonic = lambda: mono[0]
        w.ctl.status._began = mono[0]
        counts = []
        for i in range(200):
            w.submit(f"q{i:03d}", created=T0 + 1 + i)
        for gap in (1.0, 5.0, 120.0):
            mono[0] += gap
            mark = len(w.kube.calls)
            await w.ctl.status.flush()
            counts.append(len(statuses(w.kube, mark)))
        return counts

    # 10 a second: an exact first position costs two writes (its finalizer), a rounded one one.
    assert asyncio.run(scenario()) == [5, 45, 150]  # the last: all that was left (a budget of 600)


def test_lane_queue_depth_removes_a_band_once_it_empties():
    async def scenario() -> None:
        w = World()
        await w.warm("run")
        w.submit("hi", created=T0 + 1, priority=100)
        w.submit("lo", created=T0 + 2, priority=0)
        await w.ctl.status.flush()
        assert w.kube.get("gpulanes/gpu-0")["status"]["queueDepth"] == {"100": 1, "0": 1}
        mark = len(w.kube.calls)

        w.ctl.job_event("DELETED", w.kube.vanish(f"gpujobs/{NS}/hi"))
        await w.ctl.status.flush()

        (write,) = [c for c in w.kube.calls[mark:] if c.target == "gpulanes/gpu-0"]
        assert write.body["status"]["queueDepth"] == {"100": None, "0": 1}
        assert w.kube.get("gpulanes/gpu-0")["status"]["queueDepth"] == {"0": 1}

    asyncio.run(scenario())


# -- 10. a job whose model does not exist (yet) ---------------------------------------------------


def test_parked_job_is_written_once_and_queued_when_its_model_appears():
    async def scenario() -> None:
        w = World()
        w.model("m")
        w.lane()
        key = w.submit("j1", model="ghost")
        assert w.ctl.jobs[key].state == "parked"
        assert w.ctl.dispatcher.pending_count == 0

        await w.ctl.status.flush()
        w.clock.now += 11  # past the refresh interval
        w.ctl.status.dirty = True
        await w.ctl.status.flush()

        (write,) = statuses(w.kube)
        status = write[1]["status"]
        assert (status["phase"], status["reason"]) == ("Pending", "ModelNotFound")
        (cond,) = status["conditions"]
        assert (cond["type"], cond["status"], cond["reason"]) == ("Admitted", "False", "ModelNotFound")

        w.model("ghost")
        assert w.ctl.jobs[key].state == "assigned"  # the idle lane takes it at once
        assert [d.job.id for d in w.ctl.dispatcher.history] == [key]
        await w.reconcile()
        assert w.phase("j1") == "Dispatching"
        (create,) = w.kube.calls_of("create_pod")
        assert create.body["metadata"]["annotations"]["gpulane.io/model"] == "ghost"

    asyncio.run(scenario())


def settles(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """From now on, each ``effects.settle`` as the names of the core events it hands over, in order."""
    from gpulane.operator import effects

    settled: list[list[str]] = []
    settle = effects.settle
    monkeypatch.setattr(effects, "settle", lambda ctl, intake: settled.append(
        [type(e).__name__ for e in intake.events]) or settle(ctl, intake))  # fmt: skip
    return settled


def test_the_jobs_that_waited_for_a_model_are_one_pass_of_the_core_when_it_appears(monkeypatch):
    """A GpuModel that 30 jobs waited for: the core hears the model, then its jobs in arrival order, and one
    ``settle`` applies it all, the refusal of the job the policy no longer ranks with it."""

    async def scenario() -> None:
        w = World()
        w.lane()
        w.ctl.use_policy(Policy(tier_bonus={"free": 0, "pro": 1, "max": 2}))
        keys = [w.submit(f"j{n}", model="ghost", tier="max" if n == 7 else "free") for n in range(30)]
        w.clock.now += 1
        w.ctl.use_policy(Policy(tier_bonus={"free": 0, "pro": 1}))  # j7's tier is gone while it waits
        settled = settles(monkeypatch)
        w.model("ghost")
        assert settled == [["ModelUpdated"] + ["JobSubmitted"] * 29], settled
        assert w.ctl.jobs[keys[0]].state == "assigned"  # the oldest, on the idle lane
        assert [j.id for j in w.ctl.dispatcher.pending()] == [k for k in keys[1:] if k != keys[7]]
        await w.settle()
        assert w.kube.job("j7")["status"]["reason"] == "PolicyRejected"

    asyncio.run(scenario())


def test_an_unparked_job_loses_its_model_not_found_status():
    async def scenario() -> None:
        w = World()
        await w.warm("busy")
        w.submit("j1", model="ghost")
        await w.ctl.status.flush()
        w.model("ghost")  # j1 queues behind busy
        await w.ctl.status.flush()

        status = w.kube.job("j1")["status"]
        assert status["phase"] == "Pending" and status["positionExact"] is True
        assert status.get("reason") is None
        (cond,) = [c for c in status["conditions"] if c["type"] == "Admitted"]
        assert cond["status"] == "True"

    asyncio.run(scenario())


# -- restarts: a running job the current policy would refuse -------------------------------------


@pytest.mark.parametrize(
    ("failure", "logged"),
    [
        (ApiException(status=429, reason="storage is (re)initializing"), "429"),
        (Gone("the server could not find the requested resource"), "CRDs are not installed"),
        (TimeoutError(), "TimeoutError"),
    ],
)
def test_a_rebuild_whose_reads_fail_retries_them_and_replays_once(
    failure: Exception, logged: str, caplog: pytest.LogCaptureFixture
):
    """Right after a CRD is created the apiserver answers 429 for a while; kopf would retry the startup
    only after 60 s. The rebuild retries its reads itself, and replays nothing until they all succeed."""

    async def scenario() -> None:
        w = World()
        kube, ctl = w.kube, w.ctl
        kube.put("gpumodels", {"metadata": {"name": "m"}, "spec": {"image": "m:v1"}})
        kube.put("gpulanes", {"metadata": {"name": "gpu-0", "uid": "lane-uid-gpu-0"}, "spec": {}})
        kube.put("gpujobs", job_body("a", created=T0 - 100))
        reads = kube.list_cluster
        failures = 0

        async def flaky(plural: str, selector: str = "") -> list[Body]:
            nonlocal failures
            if plural == "gpujobs" and failures < 2:  # the last read fails: the earlier ones are read again
                failures += 1
                raise failure
            return await reads(plural, selector)

        kube.list_cluster = flaky  # type: ignore[method-assign]
        with caplog.at_level("WARNING", logger="gpulane.operator.rebuild"):
            await ctl.rebuild(max_backoff=0.01)

        assert failures == 2 and ctl.ready
        assert len(kube.calls_of("list_cluster", "gpumodels")) == 3
        assert [d.job.id for d in ctl.dispatcher.history] == [f"{NS}/a"], "replayed once"
        assert sum(logged in r.getMessage() and "not ready" in r.getMessage() for r in caplog.records) == 2

    asyncio.run(scenario())


def test_rebuild_adopts_a_running_job_the_policy_now_refuses():
    async def scenario() -> None:
        w = World()
        kube, ctl = w.kube, w.ctl
        kube.put("gpupolicies", {"metadata": {"name": "default"}, "spec": {"tierBonus": {"free": 0}}})
        kube.put("gpumodels", {"metadata": {"name": "m"}, "spec": {"image": "m:v1"}})
        kube.put("gpumodels", {"metadata": {"name": "other"}, "spec": {"image": "other:v1"}})
        kube.put("gpulanes", {"metadata": {"name": "gpu-0", "uid": "lane-uid-gpu-0"}, "spec": {}})
        kube.put("pods", pod_body("gpu-0", "m"))
        running = job_body("r1", created=T0 - 600, tier="max")
        running["metadata"]["finalizers"] = [FINALIZER]
        running["status"] = {"phase": "Running", "lane": "gpu-0", "startedAt": format_time(T0 - 300)}
        kube.put("gpujobs", running)
        kube.put("gpujobs", job_body("next", "other", created=T0 - 100))

        await ctl.rebuild()
        await w.reconcile()

        assert f"{NS}/r1" in ctl.jobs
        assert ctl.jobs[f"{NS}/next"].state == "pending"
        assert kube.calls_of("delete_pod") == []

    asyncio.run(scenario())


@pytest.mark.parametrize("recorded", [True, False])
def test_a_rebuild_says_on_an_adopted_job_when_its_lanes_history_does_not_record_its_dispatch(recorded: bool):
    """Issue 34, item 6: a Running status written while no operator ran (someone with gpujobs/status rights,
    with the status hook down) is adopted, as a dispatch written just before a stop is, but the job says
    that the lane's history has no such dispatch (DispatchUnrecorded). A recorded one says nothing."""

    async def scenario() -> list[Any]:
        w = World()
        kube, ctl = w.kube, w.ctl
        kube.put("gpumodels", {"metadata": {"name": "m"}, "spec": {"image": "m:v1"}})
        record = {"job": f"{NS}/{'r1' if recorded else 'someone-else'}", "at": format_time(T0 - 400),
                  "lane": "gpu-0", "model": "m", "load": False, "priority": 0, "tier": "free",
                  "score": {"priority": 0, "tier": 0, "affinity": 0, "aging": 0, "total": 0}}  # fmt: skip
        kube.put("gpulanes", {"metadata": {"name": "gpu-0", "uid": "lane-uid-gpu-0"}, "spec": {},
                              "status": {"history": [record]}})  # fmt: skip
        kube.put("pods", pod_body("gpu-0", "m"))
        running = job_body("r1", created=T0 - 600)
        running["metadata"]["finalizers"] = [FINALIZER]
        running["status"] = {"phase": "Running", "lane": "gpu-0", "dispatchedAt": format_time(T0 - 400),
                             "startedAt": format_time(T0 - 300)}  # fmt: skip
        kube.put("gpujobs", running)
        await ctl.rebuild()
        await w.reconcile()
        assert f"{NS}/r1" in ctl.jobs, "adopted either way"
        return [c.body for c in kube.calls_of("event") if c.body["reason"] == "DispatchUnrecorded"]

    said = asyncio.run(scenario())
    if recorded:
        assert said == []
    else:
        [event] = said
        assert event["warning"] and "which the lane's history does not record" in event["message"]


def test_a_job_whose_executor_lease_expires_fails_with_data_plane_lost():
    async def scenario() -> None:
        w = World()
        lease = {"metadata": {"name": "bridge-a", "namespace": NS},
                 "spec": {"renewTime": format_time(w.clock.now), "leaseDurationSeconds": 10}}  # fmt: skip
        w.ctl.lease_event("ADDED", lease)
        await w.warm()
        w.claimed("call-1", "bridge-a")
        await w.reconcile()
        assert w.phase("call-1") == "Running"

        w.clock.now += 9  # still inside the Lease
        await _one_tick(w)
        assert w.phase("call-1") == "Running"

        w.clock.now += 5  # the executor stopped renewing: its Lease ran out 4 s ago
        await _one_tick(w)
        job = w.kube.job("call-1")
        assert (job["status"]["phase"], job["status"]["reason"]) == ("Failed", "DataPlaneLost")
        assert "Lease" in job["status"]["message"] and f"{NS}/call-1" not in w.ctl.jobs

    asyncio.run(scenario())


def test_an_executor_that_claims_a_job_after_it_was_seen_is_still_watched():
    """The bridge claims a kubectl job (spec.request) after the operator first saw it (issue 16, item 2)."""

    async def scenario() -> None:
        w = World()
        lease = {"metadata": {"name": "bridge-a", "namespace": NS},
                 "spec": {"renewTime": format_time(w.clock.now), "leaseDurationSeconds": 10}}  # fmt: skip
        w.ctl.lease_event("ADDED", lease)
        await w.warm()
        w.submit("kubectl-job")  # seen without an executor
        claimed = w.kube.update(
            f"gpujobs/{NS}/kubectl-job", {"metadata": {"annotations": {"gpulane.io/executor-lease": "bridge-a"}}}
        )
        w.ctl.job_event("MODIFIED", claimed)
        await w.reconcile()
        assert w.phase("kubectl-job") == "Running"

        w.clock.now += 14  # the bridge died with the job: its Lease ran out 4 s ago
        await _one_tick(w)
        job = w.kube.job("kubectl-job")
        assert (job["status"]["phase"], job["status"]["reason"]) == ("Failed", "DataPlaneLost")

    asyncio.run(scenario())


def test_a_deleted_executor_lease_fails_its_jobs_at_once():
    async def scenario() -> None:
        w = World()
        lease = {"metadata": {"name": "bridge-b", "namespace": NS},
                 "spec": {"renewTime": format_time(w.clock.now), "leaseDurationSeconds": 3600}}  # fmt: skip
        w.ctl.lease_event("ADDED", lease)
        await w.warm()
        w.claimed("call-2", "bridge-b")
        await w.reconcile()
        w.ctl.lease_event("DELETED", lease)
        w.clock.now += 1
        await _one_tick(w)
        assert w.kube.job("call-2")["status"]["reason"] == "DataPlaneLost"

    asyncio.run(scenario())


def test_a_job_whose_executor_lease_never_existed_fails_after_the_grace():
    """issue 34's L4: an executor-lease annotation naming a Lease nobody holds vouched for the job until its
    run limit; it counts as no executor at all."""

    async def scenario() -> None:
        w = World()
        await w.warm()
        w.claimed("ghostly", "never-made")
        await w.reconcile()
        assert w.phase("ghostly") == "Running"
        w.clock.now += 299
        await _one_tick(w)
        assert w.phase("ghostly") == "Running", "within the grace, the executor may still be making its Lease"
        w.clock.now += 2
        await _one_tick(w)
        status = w.kube.job("ghostly")["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "NoExecutor")
        assert f"its executor's Lease {NS}/never-made does not exist" in status["message"]

    asyncio.run(scenario())


def test_a_lane_whose_node_is_not_ready_gets_no_dispatch_until_it_is_back():
    async def scenario() -> None:
        w = World()
        w.model("m")
        w.lane()
        w.node("node-0", ready=False)
        key = w.submit("j1")
        await w.reconcile()
        assert w.ctl.jobs[key].state == "pending", "nothing is dispatched to a lane whose node is down"
        await w.ctl.status.flush()
        assert w.phase("j1") == "Pending"
        [ready] = [c for c in w.kube.get("gpulanes/gpu-0")["status"]["conditions"] if c["type"] == "Ready"]
        assert ready["status"] == "False" and ready["reason"] == "NodeUnavailable"
        assert "node node-0 is not Ready (KubeletNotReady)" in ready["message"]

        w.node("node-0")
        await w.reconcile()
        assert w.kube.index("create_pod", f"pods/{SYSTEM}/gpulane-gpu-0") >= 0, "back online: the job loads"

    asyncio.run(scenario())


def test_a_node_that_goes_down_takes_its_lanes_offline_in_one_pass_of_the_core(monkeypatch):
    """Two lanes on one node: the node's event tells the core both lanes' state, and one ``settle`` applies it."""

    async def scenario() -> None:
        w = World()
        w.model("m")
        w.lane("gpu-0")
        w.lane("gpu-1")
        settled = settles(monkeypatch)
        w.node("node-0", ready=False)
        assert settled == [["LaneUpdated", "LaneUpdated"]], settled
        assert not w.ctl.dispatcher.lanes["gpu-0"].online and not w.ctl.dispatcher.lanes["gpu-1"].online
        settled.clear()
        w.node("node-0", ready=False)  # nothing changed: nothing for the core
        assert settled == [[]], settled

    asyncio.run(scenario())


def test_after_a_restart_a_lane_on_a_missing_node_stays_offline():
    async def scenario() -> None:
        w = World()
        w.kube.objects.pop("nodes/node-0")
        w.kube.put("gpumodels", {"metadata": {"name": "m"}, "spec": {"image": "m:v1"}})
        w.kube.put("gpulanes", {"metadata": {"name": "gpu-0", "uid": "lane-uid-gpu-0"}, "spec": {"nodeName": "gone"}})
        w.kube.put("gpujobs", job_body("j1", "m"))
        fresh = Controller(w.kube, Settings(namespace=SYSTEM), clock=w.clock)
        await fresh.rebuild()
        assert fresh.lanes["gpu-0"].node_problem == "node gone does not exist"
        assert not fresh.dispatcher.lanes["gpu-0"].online
        assert fresh.jobs[f"{NS}/j1"].state == "pending"

    asyncio.run(scenario())


def lane_record(job: str, lane: str, at: float) -> dict[str, Any]:
    """A dispatch record of team-a's ``job`` as a lane's status.history keeps it (to the second)."""
    score = {"priority": 0, "tier": 0, "affinity": 0, "aging": 0, "total": 0}
    return {"job": f"{NS}/{job}", "lane": lane, "at": format_time(at), "model": "m", "load": False, "priority": 0,
            "tier": "free", "score": score}  # fmt: skip


def test_a_story_with_dispatches_at_the_same_instant_on_two_lanes():
    """Lane histories restored from status have whole-second times, so two lanes' records tie: the story
    must order them by time alone (comparing the records raised TypeError and stalled every lane)."""

    async def scenario() -> None:
        w = World()
        w.model("m")
        w.lane("gpu-0")
        w.lane("gpu-1")
        key = w.submit("late")
        view = w.ctl.jobs[key]
        at = view.job.submitted_at + 1
        for lane, job in (("gpu-0", "a"), ("gpu-1", "b")):
            w.ctl.history.restore(lane, [lane_record(job, lane, at)])
        story = w.ctl.history.story(key, view.job.submitted_at, at + 1, load=False)
        assert [r["job"] for r in story["ranAhead"]] == [f"{NS}/a", f"{NS}/b"]

    asyncio.run(scenario())


def test_a_lane_history_record_not_in_the_operators_shape_is_left_out_at_restore(caplog):
    """The CRD stores a lane's history unchecked: a record a hand edit left without its job (or not a record at
    all) would stall every story that reads it. The restore leaves it out, says so, and keeps the rest."""

    async def scenario() -> None:
        w = World()
        w.model("m")
        w.lane("gpu-0")
        key = w.submit("late")
        view = w.ctl.jobs[key]
        at = view.job.submitted_at + 1
        w.ctl.history.restore("gpu-0", [{"lane": "gpu-0", "at": format_time(at)}, 7, lane_record("a", "gpu-0", at)])
        story = w.ctl.history.story(key, view.job.submitted_at, at + 1, load=False)
        assert [r["job"] for r in story["ranAhead"]] == [f"{NS}/a"]
        assert "lane gpu-0: 2 record(s) of its status.history are not dispatch records; left out" in caplog.text

    asyncio.run(scenario())


def test_a_story_hides_the_name_and_member_of_another_namespaces_job():
    """Issue 16, item 15: team-b's job went ahead of ours; our story says why (its priority, tier, score)
    but not who (its name, its member), and neither does the Dispatched condition."""

    async def scenario() -> None:
        w = World()
        await w.warm("blocker")
        theirs = w.kube.put("gpujobs", job_body("secret-project", ns="team-b", member="carol", priority=100))
        w.ctl.job_event("ADDED", theirs)
        w.submit("mine")
        for ns, name in ((NS, "blocker"), ("team-b", "secret-project")):
            w.clock.now += 1
            status = {"phase": "Succeeded", "finishedAt": format_time(w.clock())}
            w.ctl.job_event("MODIFIED", w.kube.update(f"gpujobs/{ns}/{name}", {"status": status}))
            await w.reconcile()
        mine = w.kube.job("mine")["status"]
        assert mine["phase"] == "Running"
        [ahead] = mine["story"]["ranAhead"]
        assert ahead["job"] == HIDDEN_JOB and "member" not in ahead
        assert (ahead["priority"], ahead["tier"]) == (100, "free")
        assert "secret-project" not in str(mine) and "carol" not in str(mine)

    asyncio.run(scenario())


def test_a_records_deciding_jobs_of_other_namespaces_are_hidden_too():
    record = {"job": f"{NS}/a", "member": "alice", "changedBy": {"aging": "team-b/x", "affinity": f"{NS}/b"}}
    assert redacted(record, NS)["changedBy"] == {"aging": HIDDEN_JOB, "affinity": f"{NS}/b"}
    assert redacted(record, "team-b") == {"job": HIDDEN_JOB}


def test_a_dispatch_whose_running_write_does_not_land_holds_positions_back_once_not_each_write():
    """Each position write waited up to ``DISPATCH_WAIT_SECONDS`` for a dispatch still in flight: one whose
    Running write kept failing let through a refresh a second, with one refresh in flight at a time. Now the
    dispatch holds them back for that long in all."""

    async def scenario() -> None:
        w, clock = await paced_world(exact_positions=50, status_writes_per_second=1000)
        for i in range(20):
            w.submit(f"q{i:02d}", created=T0 + 1 + i)
        await w.ctl.status.flush()
        w.ctl.job_event("MODIFIED", w.executor_finishes("run"))  # q00 dispatched, its Running write not landed
        real, held = w.ctl.status.dispatch_in_flight, []

        def ticking() -> bool:  # each look at the dispatch takes a tenth of a second
            clock[0] += 0.1
            held.append(real())
            return held[-1]

        w.ctl.status.dispatch_in_flight = ticking  # type: ignore[method-assign]
        clock[0] += 11
        await w.ctl.status.flush()
        assert w.kube.job("q19")["status"]["position"] == 19  # every later position moved up, and was written
        assert w.phase("q00") != "Running"
        assert 0 < sum(held) <= DISPATCH_WAIT_SECONDS / 0.1 + 1, sum(held)

    asyncio.run(scenario())


def test_queue_positions_wait_for_a_warm_dispatch_in_flight():
    """The Running write of a job dispatched to a warm backend goes before a burst of position updates."""

    async def scenario() -> None:
        w = World()
        await w.warm("first")
        for name in ("a", "b"):
            w.submit(name)
        await w.ctl.status.flush()
        w.kube.update(f"gpujobs/{NS}/first", {"status": {"phase": "Succeeded", "finishedAt": format_time(T0)}})
        w.ctl.job_event("MODIFIED", w.kube.job("first"))  # frees the lane: `a` is dispatched, not yet Running
        assert w.ctl.status.dispatch_in_flight()
        since = len(w.kube.calls)
        asked = 0
        in_flight = w.ctl.status.dispatch_in_flight

        def counted() -> bool:
            nonlocal asked
            asked += 1
            return in_flight()

        w.ctl.status.dispatch_in_flight = counted  # type: ignore[method-assign]
        flush = asyncio.create_task(w.ctl.status.flush())
        # The writer looked, and looked again: it is waiting, not done.
        await until(lambda: asked >= 2, "the status writer to ask twice whether a dispatch is in flight", 5)
        assert statuses(w.kube, since) == [], "no position was written while `a` waits for its Running write"
        await w.reconcile()
        await flush
        written = statuses(w.kube, since)
        assert written[0][0] == "a" and sets_phase("Running")(written[0][1])
        assert written[-1][0] == "b" and as_merge(written[-1][1])["status"]["position"] == 1

    asyncio.run(scenario())
