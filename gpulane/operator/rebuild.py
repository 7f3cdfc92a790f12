"""The rebuild at start: everything the operator knows, read back from the API before any watch event.

Lanes stay offline while jobs are replayed, so nothing is dispatched from a partial view: the first
decisions are taken with every pending job, running job and served clock known. Jobs found Dispatching
or Running are adopted: they hold their lane's capacity again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from gpulane.api.contract import BACKEND_SELECTOR, EXECUTOR_SELECTOR, Body
from gpulane.api.shards import Shard
from gpulane.api.times import parse_time
from gpulane.core.events import (
    JobAdopted,
    LaneUpdated,
    ModelRemoved,
    QueueServed,
    TeamUsageRestored,
    UsageRestored,
)
from gpulane.core.lanes import LaneState
from gpulane.kube.client import Gone, backoff, why
from gpulane.kube.protocol import KubeClient
from gpulane.operator.effects import EndJob
from gpulane.operator.history import DispatchHistory
from gpulane.operator.job_table import Intake, JobState, JobTable, JobView, job_key
from gpulane.operator.lanes import LaneRunner
from gpulane.operator.observed import Observed
from gpulane.operator.translate import Refusal, job_from_body

log = logging.getLogger(__name__)

ACTIVE_PHASES = ("Dispatching", "Running")


# A watch event's handler of the controller, which the rebuild replays an object through (``kind`` None).
Replay = Callable[[str | None, Body], None]


class ReplayLane(Protocol):
    def __call__(self, kind: str | None, body: Body, *, online: bool = True) -> None: ...


@dataclass(frozen=True)
class Ports:
    """What the rebuild reads, the controller's handlers it replays each object through as if a watch had just
    listed it, and the effects it asks for; the controller builds it once."""

    kube: KubeClient  # reads the world; an Event on a job whose status was forged
    shard: Shard  # reads only this shard's
    clock: Callable[[], float]
    lane_state: Callable[[str], LaneState | None]  # the core's
    jobs: JobTable  # adopts the jobs found active
    observed: Observed  # read: pods and models
    history: DispatchHistory  # read: whether a lane recorded an adopted job's dispatch
    lanes: dict[str, LaneRunner]
    policy_event: Replay
    model_event: Replay
    lease_event: Replay
    pod_event: Replay
    node_event: Replay
    lane_event: ReplayLane
    job_event: Replay
    settle: Callable[[Intake], None]
    spawn: Callable[[Coroutine[Any, Any, Any]], None]
    end_job: EndJob
    rebuilt: Callable[[], None]  # the state is whole: lanes may take jobs


@dataclass(frozen=True)
class World:
    """Everything the rebuild reads, read before anything is replayed: a failed read leaves no half-built
    state behind, so the whole read can simply be tried again."""

    policy: Body | None
    models: list[Body]
    leases: list[Body]
    pods: list[Body]
    nodes: list[Body]
    lanes: list[Body]
    jobs: list[Body]


async def read_world(kube: KubeClient, shard: Shard) -> World:
    """Every GpuModel (where each one's jobs belong), and the rest of this shard's."""
    try:
        policy: Body | None = await kube.get_cluster("gpupolicies", "default")
    except Gone:
        policy = None
    return World(
        policy=policy,
        models=await kube.list_cluster("gpumodels"),
        leases=await kube.list_leases(EXECUTOR_SELECTOR),
        pods=await kube.list_pods(f"{BACKEND_SELECTOR},{shard.selector}"),
        nodes=await kube.list_nodes(),
        lanes=await kube.list_cluster("gpulanes", shard.selector),
        jobs=await kube.list_jobs(shard.selector),
    )


def _unread(err: BaseException | None) -> str:
    if isinstance(err, Gone):  # a 404 on a list: the kind itself is not served
        return "gpulane's CRDs are not installed (`kubectl apply -f crds/`, or the chart)"
    return why(err)


async def rebuild(ports: Ports, *, max_backoff: float = 30.0) -> None:
    """Read the cluster's state until a read succeeds, then replay it. Until then /readyz says not ready:
    an apiserver that is starting (429 "storage is (re)initializing" right after a CRD is created), down,
    or missing the CRDs delays the start; it does not fail it."""
    unread = "not ready: cannot read the cluster's state"
    async for attempt in backoff(log, unread, initial=0.2, max_backoff=max_backoff, reason=_unread):
        with attempt:
            world = await read_world(ports.kube, ports.shard)
    replay(ports, world)


def replay(ports: Ports, world: World) -> None:
    observed = ports.observed
    if world.policy is not None:
        ports.policy_event(None, world.policy)
    for body in world.models:
        ports.model_event(None, body)
    for body in world.leases:
        ports.lease_event(None, body)
    for body in world.pods:
        ports.pod_event(None, body)  # before the lanes: it only records the pod
    for body in world.nodes:
        ports.node_event(None, body)  # before the lanes: it only records the node
    for body in world.lanes:
        ports.lane_event(None, body, online=False)
    jobs = sorted(world.jobs, key=lambda b: (b["metadata"].get("creationTimestamp", ""), job_key(b)))
    for body in jobs:
        if _adoptable(body):
            adopt(ports, body)
    # Fair share's clocks and usage, as the lanes' statuses kept them, in one pass of the core.
    restored = Intake()
    restored.events += (QueueServed(*clock) for clock in served_clocks(world.lanes, jobs))
    restored.events += (UsageRestored(*entry) for entry in usage_entries(world.lanes))
    restored.events += (TeamUsageRestored(*entry) for entry in usage_entries(world.lanes, "teamUsage", "namespace"))
    ports.settle(restored)
    for body in jobs:
        if not _adoptable(body):
            ports.job_event(None, body)
    statuses = {body["metadata"]["name"]: body.get("status") or {} for body in world.lanes}
    for name, runner in ports.lanes.items():
        _check_adopted(ports, name)
        resident, loaded = _serving(ports, name, statuses.get(name) or {})
        # Lane by lane: a model found removed drains the lanes that serve it, which the next lane's state reads.
        lane = Intake(events=[LaneUpdated(name, online=runner.online, resident=resident, loaded=loaded)])
        if resident is not None and resident not in observed.models:  # its GpuModel went while we were away
            lane.events.append(ModelRemoved(resident))
        ports.settle(lane)
        runner.kick()
    ports.rebuilt()
    log.info("rebuilt: %d jobs, %d of them active, %d lanes", len(ports.jobs), sum(1 for _ in ports.jobs.holding()),
             len(ports.lanes))  # fmt: skip


def _serving(ports: Ports, lane: str, status: Body) -> tuple[str | None, frozenset[str] | None]:
    """The model serving on a lane and the others its server holds. A pod serves its own model. A server's pod
    serves what the lane's status last said of this very pod while it was Ready (the operator's own write): a
    restart of the operator restarts no server, and the models it switched to are still loaded there."""
    pod = ports.observed.pods.get(lane)
    if pod is None or pod.failed:
        core = ports.lane_state(lane)
        return (core.resident if core else None), None
    models = ports.observed.models

    def held(model: object) -> bool:
        spec = models.get(model) if isinstance(model, str) else None
        return spec is not None and spec.server == pod.model

    said = status.get("residentModel")
    if status.get("pod") == pod.name and status.get("ready") and held(said):
        return said, frozenset(m for m in status.get("loaded") or [] if held(m))
    return pod.model, None


def _adoptable(body: Body) -> bool:
    """Dispatching or Running, and not being deleted (a deleted one only gives its finalizer up)."""
    return (body.get("status") or {}).get("phase") in ACTIVE_PHASES and not body["metadata"].get("deletionTimestamp")


def adopt(ports: Ports, body: Body) -> None:
    """A job found Dispatching or Running at the rebuild: it holds its lane's capacity again. (Once the
    operator runs, only its own dispatches are active: the controller fails any other that claims to be.)"""
    status, key = body.get("status") or {}, job_key(body)
    result = job_from_body(body, key, None, ports.clock())  # no policy check: it runs already, whatever the policy says
    if isinstance(result, Refusal):  # a spec that never validated cannot have been dispatched
        log.error("cannot adopt %s: %s", key, result.message)
        return
    lane = status.get("lane") or ""
    view = JobView.of(body, result)
    dispatched_at, started_at = (
        parse_time(status.get("dispatchedAt")) or ports.clock(),
        parse_time(status.get("startedAt")),
    )
    ports.jobs.adopt(view, status.get("phase") == "Running", dispatched_at, started_at)
    runner = ports.lanes.get(lane)
    if runner is None:
        ports.spawn(ports.end_job(view, "Failed", "BackendLost", f"its lane {lane!r} no longer exists"))
        return
    ports.settle(Intake(events=[JobAdopted(result, lane, started_at or dispatched_at)]))
    if ports.history.recorded(lane, result.id, dispatched_at) is False:
        # Adopted all the same (the lane's history is written a moment after the job's dispatch, so a stop in
        # between leaves one out), but a status that someone with gpujobs/status rights forged says so.
        why = (f"its status says it was dispatched to lane {lane} at {status.get('dispatchedAt')}, which the lane's "
               "history does not record: the operator adopted it as it is; if no operator wrote that status, "
               "someone with the right to patch gpujobs/status did")  # fmt: skip
        log.warning("%s: %s", key, why)
        ports.spawn(ports.kube.event(body, "DispatchUnrecorded", why, warning=True, now=ports.clock()))
    runner.kick()


def _check_adopted(ports: Ports, lane: str) -> None:
    """Running jobs whose backend pod is gone lost their backend while the operator was away."""
    pod = ports.observed.pods.get(lane)
    for view in ports.jobs.on_lane(lane, JobState.RUNNING):
        if pod is None or pod.failed or pod.model != view.model:
            ports.spawn(ports.end_job(view, "Failed", "BackendLost", "its backend pod was gone after a restart"))


def usage_entries(lanes: list[Body], field: str = "usage", who: str = "member") -> list[tuple[str, int, float, float]]:
    """Each (member, band)'s decayed GPU usage as the lanes last wrote it (each lane writes them all; the
    latest entry wins), for fair share by GPU time to go on where it was; each (namespace, band)'s from
    ``teamUsage``."""
    latest: dict[tuple[str, int], tuple[float, float]] = {}
    for lane in lanes:
        for entry in (lane.get("status") or {}).get(field) or []:
            at, seconds, band = parse_time(entry.get("at")), entry.get("gpuSeconds"), entry.get("band")
            if at is None or not isinstance(seconds, int | float) or seconds < 0 or not isinstance(band, int):
                continue  # the schema rules these out; an entry someone wrote by hand is skipped, not fatal
            key = (str(entry.get(who)), band)
            if key not in latest or at > latest[key][1]:
                latest[key] = (float(seconds), at)
    return [(member, band, seconds, at) for (member, band), (seconds, at) in latest.items()]


def served_clocks(lanes: list[Body], jobs: list[Body]) -> list[tuple[str, int, float]]:
    """When each (member, band) was last served: lanes record it, and dispatched jobs still show it. A member is
    fair share's ``namespace/member``."""
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
        namespace = body["metadata"]["namespace"]
        key = (f"{namespace}/{spec.get('member') or namespace}", int(score["priority"]))  # core.jobs.Job.account
        clocks[key] = max(at, clocks.get(key, at))
    return [(member, priority, at) for (member, priority), at in clocks.items()]
