"""GpuModel spec.template (docs/models.md): how a pod template and the shorthand fields combine into a lane's
backend pod, and what a template may not set, refused with the field and the reason."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpulane.api.backend_pods import http_port
from gpulane.api.resources import GpuLaneSpec, GpuModelSpec
from gpulane.operator.pods import TemplateError, backend_pod

LLAMA_SERVER = {
    "metadata": {"labels": {"team": "chat"}, "annotations": {"prometheus.io/scrape": "true"}},
    "spec": {
        "runtimeClassName": "nvidia",
        "imagePullSecrets": [{"name": "regcred"}],
        "securityContext": {"runAsNonRoot": True, "fsGroup": 1000},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
        "volumes": [
            {"name": "weights", "hostPath": {"path": "/srv/models", "type": "Directory"}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
        ],
        "initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]}],
        "containers": [
            {
                "name": "backend",
                "image": "ghcr.io/ggml-org/llama.cpp:server-cuda",
                "args": ["-m", "/models/llama.gguf"],
                "env": [
                    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                    {"name": "LLAMA_ARG_CTX_SIZE", "value": "4096"},
                ],
                "volumeMounts": [{"name": "weights", "mountPath": "/models"}, {"name": "shm", "mountPath": "/dev/shm"}],
                "startupProbe": {"httpGet": {"path": "/health", "port": 8080}, "failureThreshold": 600},
                "resources": {"requests": {"memory": "16Gi"}},
            },
            {"name": "exporter", "image": "prom/exporter", "ports": [{"name": "metrics", "containerPort": 9100}]},
        ],
    },
}
LANE = GpuLaneSpec.model_validate(
    {"nodeName": "gpu-0", "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}
)


def pod(template: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    spec = GpuModelSpec.model_validate({"port": 8080, **({"template": template} if template else {}), **fields})
    return backend_pod(lane="gpu-0", lane_uid="u", lane_spec=LANE, model="llama", model_spec=spec, namespace="ns")


def serving(built: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in built["spec"]["containers"] if c["name"] == "backend")


def test_the_template_is_kept_and_gpulane_adds_what_makes_it_the_lanes_backend() -> None:
    built = pod(LLAMA_SERVER)
    spec = built["spec"]
    for field in ("runtimeClassName", "imagePullSecrets", "securityContext", "volumes", "initContainers"):
        assert spec[field] == LLAMA_SERVER["spec"][field], field
    assert [c["name"] for c in spec["containers"]] == ["backend", "exporter"]
    backend = serving(built)
    assert backend["image"] == "ghcr.io/ggml-org/llama.cpp:server-cuda"
    assert backend["volumeMounts"][1] == {"name": "shm", "mountPath": "/dev/shm"}
    assert backend["env"][0]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert "startupProbe" in backend and backend["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8080}
    assert backend["resources"] == {"requests": {"memory": "16Gi", "nvidia.com/gpu": "1"},
                                    "limits": {"nvidia.com/gpu": "1"}}  # fmt: skip
    assert http_port(built) == 8080
    # Pinned to the lane's node, with the lane's tolerations after the template's.
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "gpu-0"}
    assert [t["key"] for t in spec["tolerations"]] == ["dedicated", "nvidia.com/gpu"]
    meta = built["metadata"]
    assert meta["labels"]["team"] == "chat" and meta["labels"]["app.kubernetes.io/managed-by"] == "gpulane"
    assert meta["annotations"]["prometheus.io/scrape"] == "true" and meta["annotations"]["gpulane.io/lane"] == "gpu-0"
    assert meta["name"] == "gpulane-gpu-0" and meta["ownerReferences"][0]["kind"] == "GpuLane"


def test_the_shorthand_fields_win_on_the_serving_container() -> None:
    built = pod(LLAMA_SERVER, image="my/llama:2", args=["-m", "/models/other.gguf"], command=["/app/llama-server"],
                env=[{"name": "LLAMA_ARG_CTX_SIZE", "value": "8192"}, {"name": "EXTRA", "value": "1"}],
                resources={"limits": {"memory": "20Gi"}})  # fmt: skip
    backend = serving(built)
    assert (backend["image"], backend["command"], backend["args"]) == (
        "my/llama:2", ["/app/llama-server"], ["-m", "/models/other.gguf"])  # fmt: skip
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in backend["env"]}
    assert env == {"HF_TOKEN": {"secretKeyRef": {"name": "hf", "key": "token"}}, "LLAMA_ARG_CTX_SIZE": "8192",
                   "EXTRA": "1"}  # fmt: skip
    assert backend["resources"]["limits"] == {"memory": "20Gi", "nvidia.com/gpu": "1"}
    assert LLAMA_SERVER["spec"]["containers"][0]["image"] == "ghcr.io/ggml-org/llama.cpp:server-cuda", "not mutated"


def test_a_single_container_serves_whatever_its_name_and_without_a_template_gpulane_builds_one() -> None:
    one = {"spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]}}
    assert [c["name"] for c in pod(one)["spec"]["containers"]] == ["vllm"]
    assert pod(one)["spec"]["containers"][0]["ports"][0] == {"name": "http", "containerPort": 8080, "protocol": "TCP"}
    plain = pod(image="my/server")["spec"]
    assert [c["name"] for c in plain["containers"]] == ["backend"] and plain["restartPolicy"] == "Always"


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ({"spec": {"nodeName": "other"}}, "spec.template.spec.nodeName is gpulane's"),
        ({"spec": {"nodeSelector": {"a": "b"}}}, "spec.template.spec.nodeSelector is gpulane's"),
        ({"metadata": {"name": "mine"}}, "spec.template.metadata: the name, namespace and owner of a backend pod"),
        ({"metadata": {"labels": {"gpulane.io/lane": "x"}}}, "spec.template.metadata.labels: gpulane.io/lane are"),
        ({"metadata": {"annotations": {"gpulane.io/model": "x"}}}, "annotations: gpulane.io/model are gpulane's"),
        ({"spec": {"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]}},
         "name the serving container 'backend'"),
    ],
)  # fmt: skip
def test_a_template_that_sets_what_is_gpulanes_is_refused_saying_which_field(
    template: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValidationError, match=says.replace(".", r"\.")):
        GpuModelSpec.model_validate({"image": "i", "template": template})


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"serviceAccountName": "gpulane-operator"}, "spec.template.spec.serviceAccountName: a backend pod runs"),
        ({"serviceAccount": "default"}, "spec.template.spec.serviceAccountName: a backend pod runs with no"),
        ({"automountServiceAccountToken": True}, "spec.template.spec.automountServiceAccountToken: a backend pod runs"),
        ({"hostNetwork": True}, "spec.template.spec.hostNetwork: a backend pod shares nothing of its node's"),
        ({"hostPID": True}, "spec.template.spec.hostPID: a backend pod shares nothing"),
        ({"hostIPC": True}, "spec.template.spec.hostIPC: a backend pod shares nothing"),
        ({"containers": [{"name": "backend", "image": "i", "securityContext": {"privileged": True}}]},
         "container 'backend': securityContext.privileged: a backend pod runs no privileged container"),
        ({"initContainers": [{"name": "setup", "image": "i", "securityContext": {"privileged": True}}]},
         "container 'setup': securityContext.privileged"),
        ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, "hostPath /: the host's whole filesystem"),
        ({"volumes": [{"name": "d", "hostPath": {"path": "/var/run/docker.sock"}}]}, "/var/run is the host's own"),
        ({"volumes": [{"name": "k", "hostPath": {"path": "/var/lib/kubelet/pods"}}]}, "/var/lib/kubelet is the host's"),
        ({"volumes": [{"name": "e", "hostPath": {"path": "/srv/../etc"}}]}, "is absolute and plain"),
        ({"volumes": [{"name": "e", "hostPath": {"path": "//etc"}}]}, "is absolute and plain"),
    ],
)  # fmt: skip
def test_a_template_that_would_run_with_the_nodes_or_an_accounts_power_is_refused(
    spec: dict[str, Any], says: str
) -> None:
    """Whoever may write GpuModels must not get a pod with the operator's token, the node's namespaces or
    its root (issue 34's H2): each is refused, naming the field."""
    with pytest.raises(ValidationError, match=says.replace(".", r"\.")):
        GpuModelSpec.model_validate({"image": "i", "template": {"spec": spec}})


def test_what_a_backend_pod_may_have_of_the_host_is_kept_and_it_never_mounts_a_token() -> None:
    spec = {"automountServiceAccountToken": False, "hostNetwork": False,
            "volumes": [{"name": "w", "hostPath": {"path": "/srv/models/", "type": "Directory"}}],
            "containers": [{"name": "backend",
                            "securityContext": {"privileged": False, "runAsUser": 1000}}]}  # fmt: skip
    built = pod({"spec": spec}, image="i")
    assert built["spec"]["automountServiceAccountToken"] is False and "serviceAccountName" not in built["spec"]
    assert built["spec"]["volumes"] == spec["volumes"]
    assert serving(built)["securityContext"] == {"privileged": False, "runAsUser": 1000}
    assert pod(None, image="i")["spec"]["automountServiceAccountToken"] is False


def test_an_image_is_needed_from_the_shorthand_or_the_serving_container() -> None:
    with pytest.raises(ValidationError, match=r"spec\.image is required unless"):
        GpuModelSpec.model_validate({"template": {"spec": {"containers": [{"name": "backend"}]}}})
    GpuModelSpec.model_validate({"template": {"spec": {"containers": [{"name": "backend", "image": "x"}]}}})


BACKEND = {"name": "backend", "image": "i"}


@pytest.mark.parametrize(
    ("containers", "says"),
    [
        ([{**BACKEND, "resources": {"limits": {"nvidia.com/gpu": "2"}}}], "the serving container sets nvidia.com/gpu"),
        ([BACKEND, {"name": "side", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
         "container 'side' asks for nvidia.com/gpu"),
        ([BACKEND, {"name": "side", "image": "i", "ports": [{"name": "http", "containerPort": 1}]}],
         "the port name 'http' is the serving container's"),
    ],
)  # fmt: skip
def test_the_lanes_gpus_and_the_http_port_are_the_serving_containers(containers: list[Any], says: str) -> None:
    with pytest.raises(TemplateError, match=says):
        pod({"spec": {"containers": containers}})
