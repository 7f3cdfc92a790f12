"""Every kind gpulane defines, as the CRD generator (``crd.py``) and the chart's values schema see it: its
names, scope, spec and status models, printer columns and CEL rules on the whole object."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpulane.api.chains import GpuChainSpec, GpuChainStatus
from gpulane.api.resources import (
    GpuJobSpec,
    GpuJobStatus,
    GpuLaneSpec,
    GpuLaneStatus,
    GpuModelSpec,
    GpuModelStatus,
    GpuPolicySpec,
    GpuPolicyStatus,
)
from gpulane.core.policy import CamelModel


class PrinterColumn(CamelModel):
    name: str
    type: Literal["string", "integer", "number", "boolean", "date"]
    json_path: str
    priority: int = 0
    description: str | None = None


class Kind(CamelModel):
    kind: str
    plural: str
    short_names: list[str]
    scope: Literal["Namespaced", "Cluster"]
    spec: type[CamelModel]
    status: type[CamelModel]
    columns: list[PrinterColumn] = Field(default_factory=list)
    # CEL rules on the whole object (for example, which names are allowed).
    rules: list[dict[str, str]] = Field(default_factory=list)
    spec_required: bool = True


def _col(name: str, kind: str, path: str, priority: int = 0) -> PrinterColumn:
    return PrinterColumn.model_validate({"name": name, "type": kind, "jsonPath": path, "priority": priority})


KINDS: tuple[Kind, ...] = (
    Kind(
        kind="GpuJob",
        plural="gpujobs",
        short_names=["gj"],
        scope="Namespaced",
        spec=GpuJobSpec,
        status=GpuJobStatus,
        # The spec's and the status's own rules sit on those objects (resources.py), where each reads fewer
        # fields than from the root: every field a CEL rule reads costs the apiserver on every status write
        # (docs/benchmarks.md, "what a status write costs the apiserver"). They only run when both the old and
        # the new object have the status; this one keeps a written status from being removed.
        rules=[
            {"rule": "!has(oldSelf.status) || has(self.status)", "message": "status cannot be removed once written"}
        ],
        columns=[
            _col("Phase", "string", ".status.phase"),
            _col("Model", "string", ".spec.model"),
            _col("Priority", "string", ".spec.priority"),
            _col("Tier", "string", ".spec.tier"),
            _col("Member", "string", ".spec.member"),
            _col("Position", "integer", ".status.position"),
            _col("Score", "number", ".status.score.total"),
            _col("Waited", "string", ".status.waited"),
            _col("Age", "date", ".metadata.creationTimestamp"),
            _col("Lane", "string", ".status.lane", priority=1),
            _col("Reason", "string", ".status.reason", priority=1),
        ],
    ),
    Kind(
        kind="GpuChain",
        plural="gpuchains",
        short_names=["gc"],
        scope="Namespaced",
        spec=GpuChainSpec,
        status=GpuChainStatus,
        rules=[
            {"rule": "has(self.spec.member) == has(oldSelf.spec.member)", "message": "spec.member is immutable"},
            {"rule": "has(self.spec.tier) == has(oldSelf.spec.tier)", "message": "spec.tier is immutable"},
        ],
        columns=[
            _col("Progress", "string", ".status.progress"),
            _col("Current", "string", ".status.current.job"),
            _col("Phase", "string", ".status.phase"),
            _col("ETA", "string", ".status.estimatedCompletion"),
            _col("Age", "date", ".metadata.creationTimestamp"),
            _col("Model", "string", ".spec.model", priority=1),
            _col("Priority", "string", ".spec.priority", priority=1),
            _col("GPU-Seconds", "number", ".status.gpuSeconds", priority=1),
        ],
    ),
    Kind(
        kind="GpuModel",
        plural="gpumodels",
        short_names=["gm"],
        scope="Cluster",
        spec=GpuModelSpec,
        status=GpuModelStatus,
        columns=[
            _col("Image", "string", ".spec.image"),
            # A model described by its template alone shows its serving container's image here (the first's).
            _col("Template", "string", ".spec.template.spec.containers[0].image"),
            _col("Accepted", "string", '.status.conditions[?(@.type=="Accepted")].status'),
            _col("Concurrency", "integer", ".spec.maxConcurrency"),
            _col("Load", "number", ".status.loadSeconds"),
            _col("Run", "number", ".status.runSeconds"),
            _col("Age", "date", ".metadata.creationTimestamp"),
        ],
    ),
    Kind(
        kind="GpuLane",
        plural="gpulanes",
        short_names=["gl"],
        scope="Cluster",
        spec=GpuLaneSpec,
        status=GpuLaneStatus,
        columns=[
            _col("Node", "string", ".spec.nodeName"),
            _col("Resident", "string", ".status.residentModel"),
            _col("Ready", "boolean", ".status.ready"),
            _col("Pod", "string", ".status.pod"),
            _col("Age", "date", ".metadata.creationTimestamp"),
        ],
        rules=[
            {
                "rule": "has(self.spec.nodeName) != has(self.spec.nodeSelector)",
                "message": "set exactly one of spec.nodeName and spec.nodeSelector",
            }
        ],
    ),
    Kind(
        kind="GpuPolicy",
        plural="gpupolicies",
        short_names=["gp"],
        scope="Cluster",
        spec=GpuPolicySpec,
        status=GpuPolicyStatus,
        columns=[
            _col("Accepted", "string", '.status.conditions[?(@.type=="Accepted")].status'),
            _col("Age", "date", ".metadata.creationTimestamp"),
        ],
        rules=[{"rule": "self.metadata.name == 'default'", "message": "the one GpuPolicy must be named 'default'"}],
        spec_required=False,
    ),
)
