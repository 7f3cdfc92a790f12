"""What a GpuLane's labels, ``reservedFor`` and ``memoryMib`` mean for scheduling: the models whose
``laneSelector`` matches the lane may run there, the namespaces it is reserved for go first on it (others borrow
it meanwhile), and the models of one server whose memory fits stay loaded there together. What a lane's event tells
the core comes back as an ``Intake``, for the controller to settle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from gpulane.api.resources import GpuLaneSpec
from gpulane.core.events import LaneMemory, LaneReserved, ModelUpdated
from gpulane.core.jobs import ModelSpec
from gpulane.core.lanes import LaneState
from gpulane.operator.job_table import Intake
from gpulane.operator.observed import Observed
from gpulane.operator.translate import pinned_lanes


@dataclass(frozen=True)
class Ports:
    """What the rules read (the core's lanes and models) and write (the lanes' labels seen, the models' status to
    write again); the controller builds it once."""

    lane_state: Callable[[str], LaneState | None]
    model: Callable[[str], ModelSpec]
    observed: Observed
    model_dirty: Callable[[str], None]


def lane_changed(ports: Ports, lane: str, labels: dict[str, str] | None, spec: GpuLaneSpec | None) -> Intake:
    """A GpuLane appeared or changed (its ``labels`` and ``spec``), or went (both None): what the core must hear
    of it, to settle at once."""
    owners = None if spec is None or spec.reserved_for is None else frozenset(spec.reserved_for.namespaces)
    core = ports.lane_state(lane)
    intake = Intake()
    if spec is not None and (core is None or core.owners != owners):
        intake.events.append(LaneReserved(lane, owners))
    if spec is not None and (core is None or core.memory_mib != (spec.memory_mib or 0)):
        intake.events.append(LaneMemory(lane, spec.memory_mib or 0))
    _repin(ports, lane, labels, intake)
    return intake


def _repin(ports: Ports, lane: str, labels: dict[str, str] | None, intake: Intake) -> None:
    """The models with a laneSelector serve the lanes that match now."""
    observed = ports.observed
    if labels is None:
        observed.lane_labels.pop(lane, None)
    elif observed.lane_labels.get(lane) != labels:
        observed.lane_labels[lane] = labels
    else:
        return
    for name, spec in observed.models.items():
        lanes = pinned_lanes(spec, observed.lane_labels)
        core = ports.model(name)
        if lanes != core.lanes:
            intake.events.append(ModelUpdated(replace(core, lanes=lanes)))
            ports.model_dirty(name)
