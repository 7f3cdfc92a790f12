"""GpuModels: their watch events, and what the operator learns of each (load and run times, counts) and
keeps on its status."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpulane.api.conditions import condition, merge_condition
from gpulane.api.contract import Body
from gpulane.api.resources import GpuLaneSpec, GpuModelSpec
from gpulane.core.events import JobCancelled, JobSubmitted, ModelRemoved, ModelUpdated
from gpulane.core.jobs import Job, ModelSpec
from gpulane.core.policy import Policy
from gpulane.core.validation import describe
from gpulane.operator.job_table import Intake, JobTable
from gpulane.operator.lanes import LaneRunner
from gpulane.operator.observed import Observed
from gpulane.operator.pods import TemplateError, backend_pod
from gpulane.operator.server_pods import PresetError, preset_ini
from gpulane.operator.shards import Router
from gpulane.operator.translate import model_spec, policy_refusal

log = logging.getLogger(__name__)

LEARNED_FIELDS = ("loadSeconds", "runSeconds", "loads", "runs")


def model_status_fields(status: Body) -> dict[str, float]:
    """The learned fields of a GpuModel's status, as the operator wrote them before a restart."""
    return {k: status[k] for k in LEARNED_FIELDS if k in status}


@dataclass(frozen=True)
class Ports:
    """What the room reads (the core's models, policy and waiting jobs, the lanes) and the effects it asks for (an
    ``Intake`` settled, a model's status written again, the apiserver's dry run); the controller builds it once."""

    clock: Callable[[], float]
    model: Callable[[str], ModelSpec]  # the core's
    policy: Callable[[], Policy]  # the core's, in effect
    pending: Callable[[], Iterator[Job]]  # the core's waiting jobs
    observed: Observed  # written here: the models seen, checked, accepted and refused
    jobs: JobTable  # the jobs parked for their model (and moved back)
    router: Router  # the models other shards serve
    lanes: dict[str, LaneRunner]
    namespace: str  # where backend pods are
    check_pod: Callable[[Body], Awaitable[str | None]]  # the apiserver's dry run of a pod: why it refuses it
    model_dirty: Callable[[str], None]
    settle: Callable[[Intake], None]
    spawn: Callable[[Coroutine[Any, Any, Any]], None]


def model_event(ports: Ports, kind: str | None, body: Body) -> None:
    """A GpuModel appeared, changed or went: the core learns its spec, and jobs waiting for it join the queue.

    A new generation is checked first: the apiserver judges the pod it builds (a server-side dry run, a few
    milliseconds). A new model's jobs wait meanwhile; a changed one keeps serving with its last accepted
    spec until the new one passes, and keeps it if it fails. A generation accepted before (its Accepted
    condition says so: a restart, a takeover) is not checked again.

    Its consequences are read into one ``Intake`` (the model and the jobs that waited for it, for the core; a
    refusal to write for each the policy no longer ranks) that the controller settles once, like a GpuJob's."""
    name = body["metadata"]["name"]
    observed = ports.observed
    elsewhere = ports.router.model_event(kind, body)  # another shard's: as if deleted here, and its jobs follow it
    if kind == "DELETED" or elsewhere:
        observed.models.pop(name, None)
        for table in (observed.checking, observed.accepted, observed.refused_models, observed.model_conditions):
            table.pop(name, None)
        intake = _park_model(ports, name)
        if elsewhere:
            ports.router.hand_over_parked(ports.jobs, name)
        intake.events.append(ModelRemoved(name))  # a lane that holds it gives it up once its jobs there end
        _settle(ports, intake)
        return
    try:
        spec = GpuModelSpec.model_validate(body.get("spec") or {})
    except ValidationError as err:
        log.error("GpuModel %s is invalid: %s", name, describe(err, "spec"))
        return
    generation = body["metadata"].get("generation")
    if generation not in (observed.accepted.get(name), observed.checking.get(name)):
        if kind is None or _accepted_before(body, generation):  # the rebuild; or an operator before this one
            observed.accepted[name] = generation
        else:
            observed.checking[name] = generation
            ports.spawn(check_model(ports, name, spec, body))
            return  # its jobs wait meanwhile, or the last accepted spec serves on
    elif observed.checking.get(name) == generation:
        return  # a status write of ours while the new spec is checked
    _settle(ports, _serve(ports, name, spec, body))


def _settle(ports: Ports, intake: Intake) -> None:
    """The model's consequences applied, and every lane looks again (its pod may be of the model's old spec)."""
    ports.settle(intake)
    for lane in ports.lanes.values():
        lane.kick()


def _accepted_before(body: Body, generation: int | None) -> bool:
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == "Accepted" and c.get("status") == "True" and c.get("observedGeneration") == generation
        for c in conditions
    )


def _serve(ports: Ports, name: str, spec: GpuModelSpec, body: Body) -> Intake:
    """Give the core this spec of the model, and let the jobs that waited for it queue."""
    observed = ports.observed
    learned = observed.learned.setdefault(name, model_status_fields(body.get("status") or {}))
    changed = observed.models.get(name) != spec
    observed.models[name] = spec
    observed.refused_models.pop(name, None)
    if observed.model_generations.get(name) != body["metadata"].get("generation"):
        observed.model_generations[name] = body["metadata"].get("generation")
        ports.model_dirty(name)
        changed = True
    # A status alone changed: most often the operator's own write of what the core learned, which the core has
    # (unrounded). Told again, the core would take the rounded figures and the next pass forecast the whole
    # queue (seconds at 100,000 pending) for each learned run time written.
    intake = Intake()
    if changed:
        core = ports.model(name)
        intake.events.append(ModelUpdated(model_spec(name, spec, learned, core, observed.lane_labels)))
    for view in ports.jobs.unpark(name):
        refusal = policy_refusal(ports.policy(), view.job.priority, view.job.tier)
        if refusal is not None:  # the policy changed while it waited for its model
            ports.jobs.reject(view, refusal.message, intake)
        else:
            intake.events.append(JobSubmitted(view.job))
    return intake


async def check_model(ports: Ports, name: str, spec: GpuModelSpec, body: Body) -> None:
    """The apiserver's verdict on the pod this spec builds, on the model's Accepted condition; a refused
    spec never serves (its jobs wait, or the last accepted spec goes on)."""
    generation = body["metadata"].get("generation")
    refusal, reason = await pod_refusal(ports, name, spec)
    observed = ports.observed
    if observed.checking.get(name) != generation:
        return  # deleted, or a newer generation is being checked
    observed.checking.pop(name, None)
    now = ports.clock()
    if refusal is None:
        observed.accepted[name] = generation
        _settle(ports, _serve(ports, name, spec, body))
        serving = sorted(lane for lane, pod in observed.pods.items() if pod.model == name and not pod.failed)
        message = "each lane's next backend pod for this model is built from this spec"
        if serving and (generation or 1) > 1:
            message += (f"; {', '.join(serving)} serve(s) with a pod of an earlier spec until it is replaced (no "
                        "running job is stopped for it)")  # fmt: skip
        cond = condition("Accepted", True, reason, message, now, generation)
    else:
        log.error("GpuModel %s refused: %s", name, refusal)
        if name in observed.accepted:
            refusal += f"; generation {observed.accepted[name]} stays in effect"
        else:
            observed.models.pop(name, None)
            observed.refused_models[name] = refusal
            ports.settle(_park_model(ports, name))
        cond = condition("Accepted", False, reason, refusal, now, generation)
    observed.model_conditions[name] = merge_condition(
        observed.model_conditions.get(name) or (body.get("status") or {}).get("conditions"), cond
    )
    observed.model_generations[name] = generation
    observed.learned.setdefault(name, model_status_fields(body.get("status") or {}))  # what its status keeps
    ports.model_dirty(name)


async def pod_refusal(ports: Ports, name: str, spec: GpuModelSpec) -> tuple[str | None, str]:
    """Why the pod this spec builds cannot serve (None if it can), and the condition's reason: gpulane's own
    rules against every lane (its GPUs are the serving container's), then the apiserver's, for the first
    lane (or a lane of no node), without creating anything. A model a server holds has no pod of its own:
    its part of the server's preset is checked instead."""
    if spec.server is not None:  # its pod is its server's, checked with it: here, its part of the preset
        try:
            preset_ini({name: spec})
        except PresetError as err:
            return str(err), "InvalidPreset"
        return None, "Valid"
    lanes = [(lane, runner.spec) for lane, runner in sorted(ports.lanes.items())] or [("dry-run", GpuLaneSpec())]
    try:
        manifests = [
            backend_pod(lane=lane, lane_uid="dry-run", lane_spec=lane_spec, model=name, model_spec=spec,
                        namespace=ports.namespace)
            for lane, lane_spec in lanes
        ]  # fmt: skip
    except TemplateError as err:
        return f"spec.template: {err}", "InvalidTemplate"
    manifest = manifests[0]
    meta = manifest["metadata"]
    meta.pop("ownerReferences")  # the lane is gpulane's part; a dry run needs no owner
    meta["generateName"] = f"{meta.pop('name')}-check-"  # never clashes with the lane's live pod
    try:
        said = await ports.check_pod(manifest)
    except Exception as err:  # the apiserver could not judge now: serve; the pod's own creation will tell
        log.warning("GpuModel %s: the server-side dry run of its pod failed (%r); accepting it unchecked", name, err)
        return None, "Unchecked"
    if said is not None:
        return f"the apiserver refuses the pod it builds: {said}", "PodRefused"
    return None, "Valid"


def _park_model(ports: Ports, model: str) -> Intake:
    """Waiting jobs of a deleted model go back to waiting for a GpuModel of that name."""
    intake = Intake()
    for job in [j for j in ports.pending() if j.model == model]:
        intake.events.append(JobCancelled(job.id))
        ports.jobs.park(ports.jobs[job.id])
    return intake
