"""Unit tests of gpulane/operator/pods.py (the backend pod builder) and gpulane/api/backend_pods.py (reading
a pod's state)."""

import re

import pytest

from gpulane.api.backend_pods import PodState, pod_name, pod_state
from gpulane.api.contract import BACKEND_SELECTOR, LANE_LABEL, MODEL_LABEL
from gpulane.api.pod_templates import SERVING_CONTAINER as CONTAINER
from gpulane.api.resources import API_VERSION, GpuLaneSpec, GpuModelSpec
from gpulane.operator.pods import GRACE_SECONDS, backend_pod, label_value

# RFC 1123 label / DNS-1123 subdomain, and a label value (https://kubernetes.io/docs/concepts/overview/
# working-with-objects/labels/#syntax-and-character-set).
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def lane_spec(**fields) -> GpuLaneSpec:
    return GpuLaneSpec.model_validate(fields or {"nodeName": "gpu-node-1"})


def model(**fields) -> GpuModelSpec:
    return GpuModelSpec.model_validate({"image": "vllm/vllm-openai:v0.5", **fields})


def build(*, lane: str = "lane-a", spec: GpuLaneSpec | None = None, gpu_model: GpuModelSpec | None = None) -> dict:
    return backend_pod(
        lane=lane,
        lane_uid="uid-1234",
        lane_spec=spec or lane_spec(),
        model="llama-3.1-8b",
        model_spec=gpu_model or model(),
        namespace="gpulane-system",
    )


def container(pod: dict) -> dict:
    (c,) = pod["spec"]["containers"]
    return c


# -- backend_pod -------------------------------------------------------------------------------


def test_backend_pod_identity():
    pod = build()
    assert pod["apiVersion"] == "v1"
    assert pod["kind"] == "Pod"
    assert pod["metadata"]["name"] == "gpulane-lane-a"
    assert pod["metadata"]["namespace"] == "gpulane-system"


def test_pod_with_node_name_lane_is_pinned_by_hostname():
    pod = build(spec=lane_spec(nodeName="gpu-node-7"))
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "gpu-node-7"}


def test_pod_with_node_selector_lane_uses_the_lanes_selector():
    selector = {"gpulane.io/gpu": "a100", "topology.kubernetes.io/zone": "z1"}
    spec = lane_spec(nodeSelector=selector)
    pod = build(spec=spec)
    assert pod["spec"]["nodeSelector"] == selector
    # A copy: editing the pod does not edit the lane's spec.
    pod["spec"]["nodeSelector"]["x"] = "y"
    assert spec.node_selector == selector


def test_pod_requests_and_limits_the_lanes_gpus():
    pod = build(spec=lane_spec(nodeName="n", resource="amd.com/gpu", count=2))
    resources = container(pod)["resources"]
    assert resources["requests"] == {"amd.com/gpu": "2"}
    assert resources["limits"] == {"amd.com/gpu": "2"}


def test_pod_default_gpu_resource_is_one_nvidia_gpu():
    resources = container(build())["resources"]
    assert resources["requests"] == {"nvidia.com/gpu": "1"}
    assert resources["limits"] == {"nvidia.com/gpu": "1"}


def test_pod_adds_the_models_resources_stringified():
    gpu_model = model(resources={"requests": {"cpu": 4, "memory": "16Gi"}, "limits": {"memory": "32Gi", "cpu": 8}})
    resources = container(build(gpu_model=gpu_model))["resources"]
    assert resources["requests"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
    assert resources["limits"] == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}
    assert all(isinstance(v, str) for part in resources.values() for v in part.values())


def test_the_lanes_gpu_count_wins_over_a_models_own_gpu_request():
    gpu_model = model(resources={"requests": {"nvidia.com/gpu": 8}, "limits": {"nvidia.com/gpu": 8}})
    resources = container(build(spec=lane_spec(nodeName="n", count=1), gpu_model=gpu_model))["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == "1"
    assert resources["limits"]["nvidia.com/gpu"] == "1"


def test_pod_with_only_model_requests_still_limits_the_gpus():
    gpu_model = model(resources={"requests": {"cpu": "500m"}})
    resources = container(build(gpu_model=gpu_model))["resources"]
    assert resources["requests"] == {"cpu": "500m", "nvidia.com/gpu": "1"}
    assert resources["limits"] == {"nvidia.com/gpu": "1"}


def test_container_image_port_and_readiness_probe():
    c = container(build(gpu_model=model(port=9000, readinessPath="/v1/models")))
    assert c["name"] == CONTAINER
    assert c["image"] == "vllm/vllm-openai:v0.5"
    assert c["ports"] == [{"name": "http", "containerPort": 9000, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/v1/models", "port": 9000}


def test_readiness_probe_defaults_to_health_on_8000():
    c = container(build())
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert c["ports"][0]["containerPort"] == 8000


def test_labels_name_lane_and_model_and_match_the_backend_selector():
    labels = build(lane="lane-a")["metadata"]["labels"]
    assert labels[LANE_LABEL] == "lane-a"
    assert labels[MODEL_LABEL] == "llama-3.1-8b"
    for term in BACKEND_SELECTOR.split(","):
        key, value = term.split("=")
        assert labels[key] == value


def test_labels_are_valid_label_values_even_for_long_names():
    lane = "lane-" + "x" * 100
    labels = build(lane=lane)["metadata"]["labels"]
    assert labels[LANE_LABEL] != lane
    for value in labels.values():
        assert len(value) <= 63
        assert LABEL_VALUE.match(value), value


def test_annotations_name_lane_and_model_unshortened():
    lane = "lane-" + "x" * 100
    annotations = build(lane=lane)["metadata"]["annotations"]
    assert annotations["gpulane.io/lane"] == lane
    assert annotations["gpulane.io/model"] == "llama-3.1-8b"


def test_models_pod_annotations_are_merged_in():
    gpu_model = model(podAnnotations={"prometheus.io/scrape": "true", "team": "ml"})
    annotations = build(gpu_model=gpu_model)["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["team"] == "ml"
    assert annotations["gpulane.io/lane"] == "lane-a"


def test_models_pod_annotations_cannot_override_gpulanes_own():
    gpu_model = model(podAnnotations={"gpulane.io/lane": "other", "gpulane.io/model": "other"})
    pod = build(gpu_model=gpu_model)
    assert pod["metadata"]["annotations"]["gpulane.io/lane"] == "lane-a"
    assert pod["metadata"]["annotations"]["gpulane.io/model"] == "llama-3.1-8b"
    state = pod_state(pod)
    assert state is not None
    assert (state.lane, state.model) == ("lane-a", "llama-3.1-8b")


def test_owner_reference_is_the_gpulane_as_controller():
    (owner,) = build(lane="lane-a")["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": API_VERSION,
        "kind": "GpuLane",
        "name": "lane-a",
        "uid": "uid-1234",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_tolerations_are_copied():
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    spec = lane_spec(nodeName="n", tolerations=tolerations)
    pod = build(spec=spec)
    assert pod["spec"]["tolerations"] == tolerations
    pod["spec"]["tolerations"][0]["effect"] = "NoExecute"
    assert spec.tolerations is not None
    assert spec.tolerations[0]["effect"] == "NoSchedule"


def test_no_tolerations_key_without_tolerations():
    assert "tolerations" not in build()["spec"]


def test_command_args_and_env_only_when_set():
    c = container(build())
    assert "command" not in c
    assert "args" not in c
    assert "env" not in c


def test_command_args_and_env_when_set():
    gpu_model = model(
        command=["python", "-m", "vllm.entrypoints.openai.api_server"],
        args=["--model", "meta-llama/Llama-3.1-8B"],
        env=[{"name": "HF_HOME", "value": "/cache"}, {"name": "EMPTY"}],
    )
    c = container(build(gpu_model=gpu_model))
    assert c["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert c["args"] == ["--model", "meta-llama/Llama-3.1-8B"]
    assert c["env"] == [{"name": "HF_HOME", "value": "/cache"}, {"name": "EMPTY", "value": ""}]


def test_pod_spec_settings():
    spec = build()["spec"]
    assert spec["restartPolicy"] == "Always"
    assert spec["terminationGracePeriodSeconds"] == GRACE_SECONDS
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False


def test_backend_pod_is_deterministic():
    assert build() == build()


# -- pod_name ----------------------------------------------------------------------------------


def test_pod_name_for_a_short_lane():
    assert pod_name("lane-a") == "gpulane-lane-a"


def test_pod_name_is_deterministic():
    long = "l" * 200
    assert pod_name(long) == pod_name(long)


def test_pod_name_that_just_fits_is_not_hashed():
    lane = "a" * (63 - len("gpulane-"))
    assert pod_name(lane) == f"gpulane-{lane}"
    assert len(pod_name(lane)) == 63


@pytest.mark.parametrize("length", [56, 64, 100, 253])
def test_long_pod_names_fit_in_63_characters_and_stay_valid(length):
    lane = ("gpu-node.rack-" * 30)[:length].rstrip("-.") + "z"
    name = pod_name(lane)
    assert len(name) <= 63
    assert name.startswith("gpulane-")
    assert DNS_SUBDOMAIN.match(name), name


def test_long_lane_names_sharing_a_prefix_get_distinct_pod_names():
    prefix = "datacenter-eu-west-1-rack-17-node-042-gpu-"
    a, b = prefix + "a" * 40, prefix + "b" * 40
    assert pod_name(a) != pod_name(b)
    assert len(pod_name(a)) <= 63
    assert len(pod_name(b)) <= 63


def test_hashed_pod_name_does_not_end_a_segment_with_a_dash_or_dot():
    # Character 54 of "gpulane-<lane>" is a dash: it is trimmed before the hash is appended.
    lane = "a" * 45 + "-" + "b" * 40
    name = pod_name(lane)
    assert "--" not in name
    assert ".-" not in name
    assert len(name) <= 63


# -- label_value -------------------------------------------------------------------------------


def test_label_value_keeps_valid_names():
    assert label_value("llama-3.1-8b") == "llama-3.1-8b"
    assert label_value("Model_A") == "Model_A"


def test_label_value_replaces_invalid_characters():
    assert label_value("org/model:v1") == "org-model-v1"


def test_label_value_strips_non_alphanumeric_ends():
    assert label_value("-_.name._-") == "name"
    assert label_value("/model/") == "model"


def test_label_value_of_nothing_valid_is_a_placeholder():
    assert label_value("") == "x"
    assert label_value("///") == "x"


def test_label_value_shortens_long_text_with_a_hash():
    a, b = "m" * 70 + "a", "m" * 70 + "b"
    assert len(label_value(a)) <= 63
    assert label_value(a) != label_value(b)
    assert label_value(a) == label_value(a)


@pytest.mark.parametrize("text", ["a" * 63, "a" * 64, "x/" * 40, "-" * 70 + "a", "Ünïcödé-model", "a.b_c-d"])
def test_label_value_is_always_a_valid_label_value(text):
    value = label_value(text)
    assert len(value) <= 63
    assert LABEL_VALUE.match(value), value
    assert value  # never empty


# -- pod_state ---------------------------------------------------------------------------------


def pod_body(*, phase: str = "Running", ready: str | None = "True", ip: str | None = "10.0.0.7", **meta) -> dict:
    conditions = [{"type": "PodScheduled", "status": "True"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready})
    status: dict = {"phase": phase, "conditions": conditions}
    if ip is not None:
        status["podIP"] = ip
    metadata = {
        "name": "gpulane-lane-a",
        "uid": "pod-uid",
        "creationTimestamp": "2024-05-01T12:00:00Z",
        "annotations": {"gpulane.io/lane": "lane-a", "gpulane.io/model": "llama"},
        **meta,
    }
    return {"metadata": metadata, "status": status}


def test_pod_state_of_a_ready_running_pod():
    state = pod_state(pod_body())
    assert state == PodState(
        name="gpulane-lane-a",
        uid="pod-uid",
        lane="lane-a",
        model="llama",
        ready=True,
        failed=False,
        ip="10.0.0.7",
        created_at="2024-05-01T12:00:00Z",
    )


@pytest.mark.parametrize("ready", ["False", "Unknown", None])
def test_pod_without_a_true_ready_condition_is_not_ready(ready):
    state = pod_state(pod_body(ready=ready))
    assert state is not None
    assert state.ready is False
    assert state.failed is False


def test_other_true_conditions_do_not_make_a_pod_ready():
    body = pod_body(ready=None)
    body["status"]["conditions"].append({"type": "ContainersReady", "status": "True"})
    state = pod_state(body)
    assert state is not None
    assert state.ready is False


def test_pending_pod_without_status_is_neither_ready_nor_failed():
    body = pod_body()
    del body["status"]
    state = pod_state(body)
    assert state is not None
    assert state.ready is False
    assert state.failed is False
    assert state.ip is None


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_finished_pod_is_failed_and_never_ready(phase):
    state = pod_state(pod_body(phase=phase, ready="True"))
    assert state is not None
    assert state.failed is True
    assert state.ready is False


def test_deleting_pod_is_failed_and_never_ready():
    state = pod_state(pod_body(deletionTimestamp="2024-05-01T12:05:00Z"))
    assert state is not None
    assert state.failed is True
    assert state.ready is False


def test_explicit_null_deletion_timestamp_is_not_deleting():
    state = pod_state(pod_body(deletionTimestamp=None))
    assert state is not None
    assert state.failed is False
    assert state.ready is True


def test_pod_ip_empty_string_is_none():
    state = pod_state(pod_body(ip=""))
    assert state is not None
    assert state.ip is None


@pytest.mark.parametrize(
    "annotations",
    [
        None,
        {},
        {"gpulane.io/lane": "lane-a"},
        {"gpulane.io/model": "llama"},
        {"gpulane.io/lane": "", "gpulane.io/model": "m"},
    ],
)
def test_pods_without_gpulanes_annotations_are_not_backend_pods(annotations):
    body = pod_body()
    body["metadata"]["annotations"] = annotations
    assert pod_state(body) is None


def test_body_without_metadata_is_not_a_backend_pod():
    assert pod_state({}) is None


def test_pod_state_reads_a_built_pod():
    pod = build(lane="lane-a")
    state = pod_state(pod)
    assert state is not None
    assert state.name == pod_name("lane-a")
    assert state.lane == "lane-a"
    assert state.model == "llama-3.1-8b"
    assert state.ready is False
    assert state.ip is None


# -- PodState.endpoint -------------------------------------------------------------------------


def test_endpoint_is_http_on_the_pod_ip():
    state = pod_state(pod_body(ip="10.1.2.3"))
    assert state is not None
    assert state.endpoint(8000) == "http://10.1.2.3:8000"
    assert state.endpoint(9000) == "http://10.1.2.3:9000"


def test_endpoint_without_ip_is_none():
    state = pod_state(pod_body(ip=None))
    assert state is not None
    assert state.endpoint(8000) is None


def test_the_lanes_runtime_class_runs_its_pods_unless_the_model_names_its_own():
    """Issue 33: a k3s or GPU Operator node runs GPU containers with RuntimeClass nvidia; the lane says so once
    for all its models."""
    lane = GpuLaneSpec(nodeName="box", runtimeClassName="nvidia")
    assert build(spec=lane)["spec"]["runtimeClassName"] == "nvidia"
    own = GpuModelSpec.model_validate({"image": "img", "template": {"spec": {"runtimeClassName": "kata-gpu"}}})
    assert build(spec=lane, gpu_model=own)["spec"]["runtimeClassName"] == "kata-gpu"
    assert "runtimeClassName" not in build(spec=GpuLaneSpec(nodeName="box"))["spec"]
