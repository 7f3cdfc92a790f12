"""Backend pods as every component sees them: the one pod name a lane can have, and the state of a pod.

One lane owns at most one backend pod, and its name is derived from the lane alone. The apiserver
refuses a second pod of the same name, so two backend pods can never exist on one GPU, not during
a swap and not across operator restarts: the next model's pod can only be created once the
previous one is really gone. The operator builds these pods (``gpulane/operator/pods.py``); an executor
finds a running job's backend through them, never through a field of the job.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from gpulane.api.contract import LANE_LABEL, MODEL_LABEL

HTTP_PORT = "http"  # the backend container's port name


def pod_name(lane: str) -> str:
    """``gpulane-<lane>``; lane names that would not fit are shortened with a hash to stay unique."""
    name = f"gpulane-{lane}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(lane.encode()).hexdigest()[:8]
    return f"{name[:54].rstrip('-.')}-{digest}"


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


def http_port(body: dict[str, Any]) -> int | None:
    """The port of the backend container's ``http`` port, as the operator declared it."""
    for container in (body.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == HTTP_PORT and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return None
