"""Backend pods: the pure builder (GpuModel + GpuLane -> pod manifest) and how to read a pod's state.

One lane owns at most one backend pod, and its name is derived from the lane alone. The apiserver
refuses a second pod of the same name, so two backend pods can never exist on one GPU, not during
a swap and not across operator restarts: the next model's pod can only be created once the
previous one is really gone.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from gpulane.api.contract import COMPONENT_LABEL, LANE_LABEL, MANAGED_BY, MODEL_LABEL
from gpulane.api.resources import API_VERSION, GpuLaneSpec, GpuModelSpec

CONTAINER = "backend"
# Model servers hold no state worth a long shutdown; a short grace keeps swaps quick.
GRACE_SECONDS = 5


def pod_name(lane: str) -> str:
    """``gpulane-<lane>``; lane names that would not fit are shortened with a hash to stay unique."""
    name = f"gpulane-{lane}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(lane.encode()).hexdigest()[:8]
    return f"{name[:54].rstrip('-.')}-{digest}"


def label_value(text: str) -> str:
    """A label-safe form of a name (object names may be longer than 63 characters or contain dots)."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)
    if len(value) > 63:
        value = f"{value[:54]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return value.strip("-_.") or "x"


def backend_pod(
    *, lane: str, lane_uid: str, lane_spec: GpuLaneSpec, model: str, model_spec: GpuModelSpec, namespace: str
) -> dict[str, Any]:
    """The pod that serves ``model`` on ``lane``: pinned to the lane's node, holding its GPUs."""
    gpus = {lane_spec.resource: str(lane_spec.count)}
    resources = model_spec.resources
    requests = {k: str(v) for k, v in (resources.requests if resources and resources.requests else {}).items()}
    limits = {k: str(v) for k, v in (resources.limits if resources and resources.limits else {}).items()}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": model_spec.image,
        "ports": [{"name": "http", "containerPort": model_spec.port, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": model_spec.readiness_path, "port": model_spec.port},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        # Extended resources must be requested as limits (requests default to them).
        "resources": {"requests": {**requests, **gpus}, "limits": {**limits, **gpus}},
    }
    if model_spec.command:
        container["command"] = list(model_spec.command)
    if model_spec.args:
        container["args"] = list(model_spec.args)
    if model_spec.env:
        container["env"] = [{"name": e.name, "value": e.value} for e in model_spec.env]
    spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
    }
    if lane_spec.node_name:
        spec["nodeSelector"] = {"kubernetes.io/hostname": lane_spec.node_name}
    else:
        spec["nodeSelector"] = dict(lane_spec.node_selector or {})
    if lane_spec.tolerations:
        spec["tolerations"] = [dict(t) for t in lane_spec.tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(lane),
            "namespace": namespace,
            "labels": {
                MANAGED_BY: "gpulane",
                COMPONENT_LABEL: "backend",
                LANE_LABEL: label_value(lane),
                MODEL_LABEL: label_value(model),
            },
            "annotations": {**(model_spec.pod_annotations or {}), MODEL_LABEL: model, LANE_LABEL: lane},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "GpuLane",
                    "name": lane,
                    "uid": lane_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


@dataclass(frozen=True, slots=True)
class PodState:
    """What the operator needs to know of a backend pod."""

    name: str
    uid: str
    lane: str
    model: str
    ready: bool
    failed: bool  # it will not serve again: Failed or Succeeded, or being deleted
    ip: str | None
    created_at: str | None

    def endpoint(self, port: int) -> str | None:
        return None if self.ip is None else f"http://{self.ip}:{port}"


def pod_state(body: dict[str, Any]) -> PodState | None:
    """The state of a backend pod, or None for a pod that is not one of gpulane's."""
    meta = body.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    lane, model = annotations.get(LANE_LABEL), annotations.get(MODEL_LABEL)
    if not lane or not model:
        return None
    status = body.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    gone = status.get("phase") in ("Failed", "Succeeded") or meta.get("deletionTimestamp") is not None
    return PodState(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        lane=lane,
        model=model,
        ready=ready and not gone,
        failed=gone,
        ip=status.get("podIP") or None,
        created_at=meta.get("creationTimestamp"),
    )
