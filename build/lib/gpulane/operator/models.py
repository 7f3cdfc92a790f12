"""What the operator learns of each GpuModel (load and run times, counts) and keeps on its status."""

from __future__ import annotations

from gpulane.api.contract import Body
from gpulane.core.dispatcher import Dispatcher
from gpulane.operator.observed import Observed

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
