"""What the operator has seen of the objects it does not own: GpuModels, backend pods, nodes,
executors' Leases and the GpuPolicy (its limits, caps and retention, and the generation in effect). Watch events
and the rebuild fill it; lanes, the status writer and deadlines read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulane.api.admission import AdmissionPolicy
from gpulane.api.backend_pods import PodState
from gpulane.api.resources import GpuModelSpec
from gpulane.api.retention import Retention
from gpulane.api.run_limits import RunLimits
from gpulane.operator.nodes import NodeState


@dataclass
class Observed:
    models: dict[str, GpuModelSpec] = field(default_factory=dict)
    learned: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> status fields we keep up to date
    model_generations: dict[str, int | None] = field(default_factory=dict)
    # The apiserver's verdict on the pod each GpuModel builds (models.py): its Accepted condition, the generation
    # being checked, the last one accepted, and why a model that was never accepted is not served.
    model_conditions: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    checking: dict[str, int | None] = field(default_factory=dict)
    accepted: dict[str, int | None] = field(default_factory=dict)
    refused_models: dict[str, str] = field(default_factory=dict)
    pods: dict[str, PodState] = field(default_factory=dict)  # lane -> its backend pod as last seen
    lane_labels: dict[str, dict[str, str]] = field(default_factory=dict)  # GpuLane -> its labels (laneSelector)
    nodes: dict[str, NodeState] = field(default_factory=dict)
    leases: dict[tuple[str, str], float] = field(default_factory=dict)  # executor Lease -> when it expires
    unload_seen: float = 0.0  # the renewTime of the last /unload Lease acted on, or found at the start
    run_limits: RunLimits = field(default_factory=RunLimits)  # the GpuPolicy's, or the defaults without one
    admission: AdmissionPolicy = field(default_factory=AdmissionPolicy)  # the GpuPolicy's, as admission has it
    pending_cap: int | None = None  # the GpuPolicy's admission.maxPendingPerNamespace
    member_pending_cap: int | None = None  # and its admission.maxPendingPerMember
    retention: Retention = field(default_factory=Retention)  # the GpuPolicy's ttlSecondsAfterFinished
    policy_generation: int | None = None  # the GpuPolicy's generation in effect (a new one is validated again)
