"""GpuModel spec.template on the real node gpu-0 (docs/models.md): a model server's pod with its weights
on a hostPath volume, an in-memory /dev/shm and a token from a Secret; and templates that Kubernetes or
gpulane refuse, refused when the GpuModel is applied."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from .operator_support import API, OPERATOR_NAMESPACE, World
from .support import wait_until

pytestmark = pytest.mark.e2e("kwok")

CHECK = (
    "import os; print(open('/models/tiny.gguf').read().strip()); print(os.environ['HF_TOKEN']);"
    "print([line.split()[2] for line in open('/proc/mounts') if line.split()[1] == '/dev/shm'][0])"
)


@pytest.fixture
def weights() -> Iterator[Path]:
    """A weights directory on gpu-0 (this host), readable by the pod's user."""
    path = Path(tempfile.mkdtemp(prefix="gpulane-weights-", dir="/tmp"))
    path.chmod(0o755)
    (path / "tiny.gguf").write_text("GGUF tiny weights\n")
    (path / "tiny.gguf").chmod(0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def accepted(world: World, model: str) -> dict[str, Any]:
    status = world.cluster_status("gpumodels", model)
    return next((c for c in status.get("conditions") or [] if c["type"] == "Accepted"), {})


@pytest.mark.e2e("gpu-0")  # its pods run on the real node
def test_a_template_serves_with_its_weights_shm_and_secret_on_gpu_0(
    world: World, core_v1: client.CoreV1Api, weights: Path
) -> None:
    lane = world.real_lane()
    secret = world.name("hf")
    core_v1.create_namespaced_secret(
        OPERATOR_NAMESPACE,
        client.V1Secret(metadata=client.V1ObjectMeta(name=secret), string_data={"token": "hf_e2e_token"}),
    )
    try:
        template = {
            "metadata": {"labels": {"team": "e2e"}},
            "spec": {
                "volumes": [
                    {"name": "weights", "hostPath": {"path": str(weights), "type": "Directory"}},
                    {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
                ],
                "containers": [
                    {
                        "name": "backend",
                        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}}],
                        "volumeMounts": [
                            {"name": "weights", "mountPath": "/models", "readOnly": True},
                            {"name": "shm", "mountPath": "/dev/shm"},
                        ],
                    }
                ],
            },
        }
        model = world.real_model("tpl", template=template)
        wait_until(lambda: accepted(world, model).get("status") == "True", what="the model accepted")
        world.job("j", model)
        world.wait_phase("j", "Running", timeout=90)
        [pod] = world.backend_pods(lane)
        assert pod.metadata.labels["team"] == "e2e" and pod.spec.node_name == "gpu-0"
        seen = world.cluster.kubectl("exec", pod.metadata.name, "-n", OPERATOR_NAMESPACE, "-c", "backend", "--",
                                     "python3", "-c", CHECK).stdout.split()  # fmt: skip
        assert seen == ["GGUF", "tiny", "weights", "hf_e2e_token", "tmpfs"], seen
        world.complete("j")
    finally:
        core_v1.delete_namespaced_secret(secret, OPERATOR_NAMESPACE)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"serviceAccountName": "gpulane-operator"}, "spec.template.spec.serviceAccountName: a backend pod runs"),
        ({"automountServiceAccountToken": True}, "spec.template.spec.automountServiceAccountToken: a backend pod"),
        ({"hostPID": True}, "spec.template.spec.hostNetwork, hostPID and hostIPC: a backend pod shares nothing"),
        ({"containers": [{"name": "backend", "securityContext": {"privileged": True}}]},
         "securityContext.privileged: a backend pod runs no privileged container"),
        ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, "a hostPath is absolute and plain, and not"),
        ({"volumes": [{"name": "sock", "hostPath": {"path": "/run/containerd/containerd.sock"}}]}, "host's own"),
        ({"volumes": [{"name": "dots", "hostPath": {"path": "/srv/../etc/"}}]}, "a hostPath is absolute and plain"),
    ],
)  # fmt: skip
def test_a_template_with_an_accounts_or_the_nodes_power_is_refused_at_apply_naming_the_field(
    world: World, spec: dict[str, Any], says: str
) -> None:
    """The CRD's own rules refuse it before anything runs (issue 34's H2): with no webhook, as written."""
    doc = {"apiVersion": API, "kind": "GpuModel", "metadata": {"name": world.name("power")},
           "spec": {"image": "example.invalid/x:1", "template": {"spec": spec}}}  # fmt: skip
    refused = world.cluster.kubectl("apply", "-f", "-", input=json.dumps(doc), check=False)
    assert refused.returncode != 0 and says in refused.stderr, refused.stderr
    fine = {**doc, "spec": {**doc["spec"], "template": {"spec": {"automountServiceAccountToken": False,
            "volumes": [{"name": "w", "hostPath": {"path": "/srv/models/", "type": "Directory"}}]}}}}  # fmt: skip
    world.cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(fine))


def test_a_template_that_sets_gpulanes_fields_is_refused_at_apply_and_a_bad_pod_on_its_condition(
    world: World,
) -> None:
    name = world.name("bad")
    doc = {"apiVersion": API, "kind": "GpuModel", "metadata": {"name": name},
           "spec": {"image": "example.invalid/x:1", "template": {"spec": {"nodeName": "elsewhere"}}}}  # fmt: skip
    refused = world.cluster.kubectl("apply", "-f", "-", input=json.dumps(doc), check=False)
    assert refused.returncode != 0
    assert "spec.template.spec.nodeName is gpulane's: the backend pod runs on its lane's node" in refused.stderr
    # Kubernetes refuses the pod it builds (a volume name is not a DNS label): the apiserver says so on the
    # model's Accepted condition, and its jobs wait, saying why.
    volume = {"name": "Bad_Volume", "emptyDir": {}}
    model = world.model("badpod", template={"spec": {"volumes": [volume]}})
    cond = wait_until(lambda: (c := accepted(world, model)).get("status") == "False" and c, what="the refusal")
    assert cond["reason"] == "PodRefused" and "Bad_Volume" in cond["message"], cond
    world.lane()
    world.job("waits", model)
    status = wait_until(lambda: (s := world.status("waits")).get("reason") == "ModelNotAccepted" and s,
                        what="the job saying why it waits")  # fmt: skip
    assert "Bad_Volume" in status["message"] and status["phase"] == "Pending"


def test_a_llama_swap_configurations_import_is_what_the_apiserver_accepts(world: World, tmp_path: Path) -> None:
    """`gpulane import-llama-swap` on a configuration using every key of llama-swap's format: its GpuModels
    and lane pass a server-side dry run (the CRD's schema and rules, admission), and nothing is created; its
    `--values` pass the chart's values schema and render the same models."""
    config = Path(__file__).resolve().parents[1] / "unit" / "data" / "llama-swap-config.yaml"
    secret = "hf_never_in_a_manifest"

    def imported(*extra: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "gpulane.cli", "import-llama-swap", str(config),
             "--image", "/app/llama-server=ghcr.io/ggml-org/llama.cpp:server-cuda", "--expand-env", "MODELS_DIR",
             "--runtime-class", "nvidia", "--node", "gpu-0", *extra],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "MODELS_DIR": "/srv/models", "HF_TOKEN": secret},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert secret not in proc.stdout + proc.stderr and "secretKeyRef" in proc.stdout
        return proc.stdout

    manifests = imported()
    applied = world.cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifests)
    assert applied.stdout.count("(server dry run)") == 4, applied.stdout
    assert "gpumodel.gpulane.io/qwen-coder-7b" in applied.stdout and "gpulane.gpulane.io/gpu-0" in applied.stdout
    (values := tmp_path / "values.yaml").write_text(imported("--values"))
    chart = Path(__file__).resolve().parents[2] / "charts" / "gpulane"
    out = world.cluster.helm("template", "r", str(chart), "-n", "gpulane-system", "-f", str(values)).stdout
    rendered = {(d["kind"], d["metadata"]["name"]): d.get("spec") for d in yaml.safe_load_all(out) if d}
    for doc in yaml.safe_load_all(manifests):
        assert rendered[doc["kind"], doc["metadata"]["name"]] == doc["spec"], doc["metadata"]["name"]
