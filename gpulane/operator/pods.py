"""Backend pods: the pure builder (GpuModel + GpuLane -> pod manifest). Their names and how to read their
state are shared with executors, in ``gpulane/api/backend_pods.py``."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from gpulane.api.backend_pods import HTTP_PORT, pod_name
from gpulane.api.contract import COMPONENT_LABEL, LANE_LABEL, MANAGED_BY, MODEL_LABEL, SERVER_PRESET
from gpulane.api.pod_templates import SERVING_CONTAINER
from gpulane.api.resources import API_VERSION, GpuLaneSpec, GpuModelSpec
from gpulane.operator.server_pods import PRESET_DIR, PRESET_FILE, router_args

# Model servers hold no state worth a long shutdown; a short grace keeps swaps quick.
GRACE_SECONDS = 5


def label_value(text: str) -> str:
    """A label-safe form of a name (object names may be longer than 63 characters or contain dots)."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)
    if len(value) > 63:
        value = f"{value[:54]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return value.strip("-_.") or "x"


class TemplateError(ValueError):
    """A GpuModel whose pod gpulane cannot build for a lane; the message says which field and why."""


def backend_pod(
    *,
    lane: str,
    lane_uid: str,
    lane_spec: GpuLaneSpec,
    model: str,
    model_spec: GpuModelSpec,
    namespace: str,
    shard_labels: dict[str, str] | None = None,
    preset: str | None = None,
) -> dict[str, Any]:
    """The pod that serves ``model`` on ``lane``: the model's template (if any) with its shorthand fields on
    the serving container, pinned to the lane's node and holding its GPUs (docs/models.md says how they
    combine). ``shard_labels`` put it in its shard's pod watch. A model that is a server (``spec.router``)
    runs with ``preset``, the models it holds (``server_pods.preset_ini``), as a file its flags name."""
    template = model_spec.template
    # Every field of the template's PodSpec, as written (its extra fields are kept by name).
    spec: dict[str, Any] = template.spec.model_dump(by_alias=True, exclude_none=True) if template else {}
    containers: list[dict[str, Any]] = spec.setdefault("containers", [])
    serving = next((c for c in containers if c.get("name") == SERVING_CONTAINER), None)
    if serving is None and len(containers) == 1:
        serving = containers[0]
    if serving is None:
        serving = {"name": SERVING_CONTAINER}
        containers.insert(0, serving)
    for other in (c for c in containers if c is not serving):
        if any(p.get("name") == HTTP_PORT for p in other.get("ports") or []):
            raise TemplateError(f"container {other.get('name')!r}: the port name {HTTP_PORT!r} is the serving "
                                "container's (gpulane reaches the model server by it)")  # fmt: skip
        if lane_spec.resource in _resource_names(other):
            raise TemplateError(f"container {other.get('name')!r} asks for {lane_spec.resource}: the lane's GPUs "
                                "go to the serving container only")  # fmt: skip
    if lane_spec.resource in _resource_names(serving):
        raise TemplateError(f"the serving container sets {lane_spec.resource}: the lane's GPUs are gpulane's to "
                            f"give (the GpuLane's resource and count)")  # fmt: skip
    _serve(serving, model_spec, lane_spec)
    annotations_extra: dict[str, str] = {}
    if model_spec.router is not None:
        _hold(spec, serving, model_spec, preset or "")
        annotations_extra[SERVER_PRESET] = preset or ""
    if lane_spec.node_name:
        spec["nodeSelector"] = {"kubernetes.io/hostname": lane_spec.node_name}
    else:
        spec["nodeSelector"] = dict(lane_spec.node_selector or {})
    if lane_spec.tolerations:
        spec["tolerations"] = [*spec.get("tolerations", []), *(dict(t) for t in lane_spec.tolerations)]
    if lane_spec.runtime_class_name:
        spec.setdefault("runtimeClassName", lane_spec.runtime_class_name)
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", GRACE_SECONDS)
    spec.setdefault("enableServiceLinks", False)
    spec["automountServiceAccountToken"] = False  # the template may only say false (pod_templates.py)
    labels = (template.metadata.labels if template else None) or {}
    annotations = (template.metadata.annotations if template else None) or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(lane),
            "namespace": namespace,
            "labels": {
                **labels,
                MANAGED_BY: "gpulane",
                COMPONENT_LABEL: "backend",
                LANE_LABEL: label_value(lane),
                MODEL_LABEL: label_value(model),
                **(shard_labels or {}),
            },
            "annotations": {
                **annotations,
                **(model_spec.pod_annotations or {}),
                **annotations_extra,
                MODEL_LABEL: model,
                LANE_LABEL: lane,
            },
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


def _hold(spec: dict[str, Any], serving: dict[str, Any], model_spec: GpuModelSpec, preset: str) -> None:
    """A server's flags after its own, and its preset: the pod's annotation, projected as a file (a changed
    preset is a new pod, as a changed template is)."""
    assert model_spec.router is not None
    serving["args"] = [*(serving.get("args") or []), *router_args(model_spec.router, model_spec.port)]
    item = {"path": PRESET_FILE, "fieldRef": {"fieldPath": f"metadata.annotations['{SERVER_PRESET}']"}}
    spec.setdefault("volumes", []).append({"name": "gpulane-server", "downwardAPI": {"items": [item]}})
    mount = {"name": "gpulane-server", "mountPath": PRESET_DIR, "readOnly": True}
    serving["volumeMounts"] = [*(serving.get("volumeMounts") or []), mount]


def _resource_names(container: dict[str, Any]) -> set[str]:
    resources = container.get("resources") or {}
    return {*(resources.get("requests") or {}), *(resources.get("limits") or {})}


def _serve(container: dict[str, Any], model_spec: GpuModelSpec, lane_spec: GpuLaneSpec) -> None:
    """The shorthand fields on the serving container (they win), its port, a readiness probe unless the
    template has one, and the lane's GPUs."""
    if model_spec.image:
        container["image"] = model_spec.image
    if model_spec.command:
        container["command"] = list(model_spec.command)
    if model_spec.args:
        container["args"] = list(model_spec.args)
    if model_spec.env:
        given = {e.name for e in model_spec.env}
        kept = [e for e in container.get("env") or [] if e.get("name") not in given]
        container["env"] = [*kept, *({"name": e.name, "value": e.value} for e in model_spec.env)]
    ports = [p for p in container.get("ports") or [] if p.get("name") != HTTP_PORT
             and p.get("containerPort") != model_spec.port]  # fmt: skip
    container["ports"] = [{"name": HTTP_PORT, "containerPort": model_spec.port, "protocol": "TCP"}, *ports]
    container.setdefault(
        "readinessProbe",
        {"httpGet": {"path": model_spec.readiness_path, "port": model_spec.port}, "periodSeconds": 1,
         "failureThreshold": 3},
    )  # fmt: skip
    gpus = {lane_spec.resource: str(lane_spec.count)}
    resources = container.setdefault("resources", {})
    short = model_spec.resources
    for bound, given_ in (("requests", short.requests if short else None), ("limits", short.limits if short else None)):
        merged = {**(resources.get(bound) or {}), **{k: str(v) for k, v in (given_ or {}).items()}}
        # Extended resources must be requested as limits (requests default to them).
        resources[bound] = {**merged, **gpus}
