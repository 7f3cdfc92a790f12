"""Backend pods: the pure builder (GpuModel + GpuLane -> pod manifest). Their names and how to read their
state are shared with executors, in ``gpulane/api/backend_pods.py``."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from gpulane.api.backend_pods import HTTP_PORT, pod_name
from gpulane.api.contract import COMPONENT_LABEL, LANE_LABEL, MANAGED_BY, MODEL_LABEL
from gpulane.api.resources import API_VERSION, GpuLaneSpec, GpuModelSpec

CONTAINER = "backend"
# Model servers hold no state worth a long shutdown; a short grace keeps swaps quick.
GRACE_SECONDS = 5


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
        "ports": [{"name": HTTP_PORT, "containerPort": model_spec.port, "protocol": "TCP"}],
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
