"""What lanes run on: their backend pods, their nodes, and the executors' Leases that vouch for running
jobs. Watch events of these update ``Observed``; a lost backend or node takes its lane's work away. The
bridge's ``/unload`` comes as a Lease too. What a node's or a Lease's event tells the core comes back as an
``Intake``, for the controller to settle."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from gpulane.api.backend_pods import PodState, pod_state
from gpulane.api.contract import UNLOAD_LEASE, Body
from gpulane.api.times import parse_time
from gpulane.core.events import LaneUpdated, UnloadAll
from gpulane.core.lanes import LaneState
from gpulane.operator.job_table import Intake
from gpulane.operator.lanes import BackendFailed, LaneRunner
from gpulane.operator.nodes import lane_node_problem, node_state
from gpulane.operator.observed import Observed
from gpulane.operator.resync import Sightings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ports:
    """What this room reads and the one effect it asks for (a lost backend fails its lane's jobs); the controller
    builds it once."""

    namespace: str  # where the backend pods are
    unload_namespace: str | None  # where the bridge's /unload Lease is honoured (None: nowhere)
    clock: Callable[[], float]
    lane_state: Callable[[str], LaneState | None]  # the core's
    observed: Observed  # written here: pods, nodes, Leases, the last /unload
    lanes: dict[str, LaneRunner]
    sightings: Sightings
    lane_dirty: Callable[[str], None]  # the lane's status is to be written again
    backend_failed: BackendFailed


def pod_event(ports: Ports, kind: str | None, body: Body) -> None:
    if (body.get("metadata") or {}).get("namespace") != ports.namespace:
        return  # another operator's backend pods (another install, another backend namespace)
    state = pod_state(body)
    if state is not None:
        ports.sightings.note("pods", kind, body)
        pod_changed(ports, state, gone=kind == "DELETED")


def pod_changed(ports: Ports, state: PodState, gone: bool) -> None:
    """A backend pod changed, or is gone (also when found missing without a watch event)."""
    pods = ports.observed.pods
    current = pods.get(state.lane)
    runner = ports.lanes.get(state.lane)
    if runner is not None and state.uid in runner.retired and (current is None or current.uid != state.uid):
        # A late event of a pod this lane deleted and has replaced since (or is replacing): it neither stands
        # for the lane's pod nor fails the model that the new pod loads.
        if gone and runner.deleting == state.uid:
            runner.deleting = None
        runner.kick()
        return
    if not gone:
        pods[state.lane] = state
    elif current is not None and current.uid == state.uid:
        del pods[state.lane]
    if runner is None:
        return
    if gone and runner.deleting == state.uid:
        runner.deleting = None
    elif gone or state.failed:
        core = ports.lane_state(state.lane)
        if core is not None and core.resident == state.model and runner.deleting != state.uid:
            what = "was deleted" if gone else "failed"
            message = f"backend pod {state.name} for {state.model} {what}"
            ports.backend_failed(runner.name, "BackendLost", message, lost=True)
    if not gone and state.ready:
        ports.lane_dirty(state.lane)
    runner.kick()


def node_event(ports: Ports, kind: str | None, body: Body) -> Intake:
    """A node changed: lanes on it go offline or back online."""
    state = node_state(body)
    if kind == "DELETED":
        ports.observed.nodes.pop(state.name, None)
    else:
        ports.observed.nodes[state.name] = state
    intake = Intake()
    for runner in ports.lanes.values():
        check_node(ports, runner, intake)
    return intake


def check_node(ports: Ports, runner: LaneRunner, intake: Intake) -> None:
    """The lane's node may have gone or come back: the lane's new state for the core goes into ``intake``."""
    problem = lane_node_problem(runner.spec, ports.observed.nodes)
    if problem == runner.node_problem:
        return
    if problem is None:
        log.info("lane %s: its node is back (%s)", runner.name, runner.node_problem)
    else:
        log.warning("lane %s: offline: %s", runner.name, problem)
    runner.node_problem = problem
    core = ports.lane_state(runner.name)
    if core is not None:  # node events arrive after the rebuild (kopf's startup handler) took lanes online
        intake.events.append(LaneUpdated(runner.name, online=runner.online, resident=core.resident))
    ports.lane_dirty(runner.name)
    runner.kick()


def lease_event(ports: Ports, kind: str | None, body: Body) -> Intake:
    """An executor's Lease: until when it vouches for the jobs it runs."""
    meta, spec = body["metadata"], body.get("spec") or {}
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime")) or 0.0
    expiry = renewed + float(spec.get("leaseDurationSeconds") or 0)
    ports.observed.leases[(meta.get("namespace", ""), meta["name"])] = ports.clock() if kind == "DELETED" else expiry
    if meta["name"] == UNLOAD_LEASE and kind != "DELETED" and meta.get("namespace") == ports.unload_namespace:
        return _unload(ports, kind, renewed, str(spec.get("holderIdentity") or "someone"))
    return Intake()


def _unload(ports: Ports, kind: str | None, asked: float, by: str) -> Intake:
    """An /unload newer than the last one seen: every lane gives its GPU back once its jobs end. One found at
    the start (a restart, a takeover) is only remembered: it was acted on, or is moot."""
    if asked <= ports.observed.unload_seen:
        return Intake()
    ports.observed.unload_seen = asked
    if kind is None:
        return Intake()
    for runner in ports.lanes.values():
        runner.say("UnloadRequested", f"/unload by {by}: the lane takes no new job, and gives its GPU back once "
                   "its running jobs end")  # fmt: skip
        ports.lane_dirty(runner.name)
        runner.kick()
    return Intake(events=[UnloadAll()])
