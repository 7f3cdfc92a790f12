"""GpuModels: their watch events, and what the operator learns of each (load and run times, counts) and
keeps on its status."""

from __future__ import annotations

import logging
from typing import Protocol

from pydantic import ValidationError

from gpulane.api.contract import Body
from gpulane.api.resources import GpuModelSpec
from gpulane.core.dispatcher import Dispatcher
from gpulane.core.events import Event, JobCancelled, JobSubmitted, ModelUpdated
from gpulane.core.validation import describe
from gpulane.operator.jobs import JobTable, JobView
from gpulane.operator.lanes import LaneRunner
from gpulane.operator.observed import Observed
from gpulane.operator.status import StatusWriter
from gpulane.operator.translate import model_spec, policy_refusal

log = logging.getLogger(__name__)

LEARNED_FIELDS = ("loadSeconds", "runSeconds", "loads", "runs")


def model_status_fields(status: Body) -> dict[str, float]:
    """The learned fields of a GpuModel's status, as the operator wrote them before a restart."""
    return {k: status[k] for k in LEARNED_FIELDS if k in status}


def learn(observed: Observed, dispatcher: Dispatcher, model: str, what: str) -> bool:
    """Bring the model's learned status in step with what the core has just learned from a ``load`` or a
    ``run``. False when the model has no GpuModel (any more), so there is nothing to write."""
    if model not in observed.models:
        return False
    spec = dispatcher.models.get(model)
    stats = observed.learned.setdefault(model, {})
    stats["loadSeconds"] = round(spec.load_seconds, 3)
    stats["runSeconds"] = round(spec.run_seconds, 3)
    count = "loads" if what == "load" else "runs"
    stats[count] = stats.get(count, 0) + 1
    return True


class Host(Protocol):
    dispatcher: Dispatcher
    observed: Observed
    jobs: JobTable
    lanes: dict[str, LaneRunner]
    status: StatusWriter

    def apply(self, event: Event, woke_at: float | None = None) -> None: ...
    def reject(self, view: JobView, reason: str) -> None: ...


def model_event(host: Host, kind: str | None, body: Body) -> None:
    """A GpuModel appeared, changed or went: the core learns its spec, and jobs waiting for it join the queue."""
    name = body["metadata"]["name"]
    if kind == "DELETED":
        host.observed.models.pop(name, None)
        _park_model(host, name)
        return
    try:
        spec = GpuModelSpec.model_validate(body.get("spec") or {})
    except ValidationError as err:
        log.error("GpuModel %s is invalid: %s", name, describe(err, "spec"))
        return
    observed = host.observed
    learned = observed.learned.setdefault(name, model_status_fields(body.get("status") or {}))
    observed.models[name] = spec
    if observed.model_generations.get(name) != body["metadata"].get("generation"):
        observed.model_generations[name] = body["metadata"].get("generation")
        host.status.model_dirty(name)
    host.apply(ModelUpdated(model_spec(name, spec, learned, host.dispatcher.models.get(name))))
    for view in host.jobs.unpark(name):
        refusal = policy_refusal(host.dispatcher.policy, view.job.priority, view.job.tier)
        if refusal is not None:  # the policy changed while it waited for its model
            host.reject(view, refusal.message)
        else:
            host.apply(JobSubmitted(view.job))
    for lane in host.lanes.values():
        lane.kick()


def _park_model(host: Host, model: str) -> None:
    """Waiting jobs of a deleted model go back to waiting for a GpuModel of that name."""
    for job in [j for j in host.dispatcher.ranking.pending() if j.model == model]:
        host.apply(JobCancelled(job.id))
        host.jobs.park(host.jobs[job.id])
