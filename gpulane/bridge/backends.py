"""A lane's backend as the bridge finds it: through the lane's pod, the one pod the operator runs for the
lane, Ready and serving the model. Never a job's ``status.endpoint``: whoever may write a job's status
could point it anywhere."""

from __future__ import annotations

from gpulane.api.backend_pods import http_port, pod_name, pod_state
from gpulane.kube.client import Gone, Kube


class NoBackend(Exception):
    """The lane has no Ready pod of the model: nothing is sent anywhere."""


async def lane_backend(kube: Kube, namespace: str, lane: object, model: str) -> str:
    """The URL of ``lane``'s pod serving ``model`` in ``namespace``, or NoBackend saying why not."""
    if not isinstance(lane, str) or not lane:
        raise NoBackend("the job runs on no lane")
    name = pod_name(lane)
    where = f"{namespace}/{name}"
    try:
        body = await kube.get_pod(name, namespace)
    except Gone:
        raise NoBackend(f"lane {lane} has no backend pod {where}") from None
    pod, port = pod_state(body), http_port(body)
    if pod is None or pod.lane != lane or pod.model != model:
        raise NoBackend(f"pod {where} does not serve model {model} on lane {lane}")
    endpoint = pod.endpoint(port) if pod.ready and port is not None else None
    if endpoint is None:
        raise NoBackend(f"pod {where} is not Ready")
    return endpoint
