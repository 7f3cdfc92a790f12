"""gpulane on the real node gpu-0: backend pods are real containers (``gpulane fake-backend`` from the
project's image), Ready through their readiness probe, and the bridge and the executor reach them on their
pod IPs. No endpoint override anywhere: the real ``openai`` client, the bridge, the operator, the kubelet
and the model server are all real processes."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import yaml

from .operator_support import BridgeProcess, OperatorProcess, World, pod_watch
from .support import Cluster, wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-e2e-real-node-key"


@dataclass
class Real:
    world: World
    bridge: BridgeProcess
    lane: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.bridge.url}/v1", api_key=KEY, max_retries=0, timeout=120)

    def ask(self, model: str, text: str) -> str:
        answer = self.client().chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
        return str(answer.choices[0].message.content)


@pytest.fixture
def real(cluster: Cluster, world: World, operator: OperatorProcess, tmp_path: Path) -> Iterator[Real]:
    lane = world.real_lane()
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"name": "e2e", "key": KEY, "member": "e2e", "maxPriority": 100}]}))
    bridge = BridgeProcess(cluster, tmp_path, world.namespace, keys).start()
    try:
        yield Real(world, bridge, lane)
    finally:
        bridge.stop()


def test_calls_run_in_real_backend_pods_and_a_swap_replaces_the_pod(real: Real) -> None:
    """Two models on the one GPU: the second call swaps the pod. The first pod is gone before the second
    is created, each becomes Ready only once its server has loaded, and each answer comes from the model's
    own server on its pod IP."""
    world = real.world
    first, second = world.real_model("alpha", load_seconds=1.0), world.real_model("beta", load_seconds=2.0)
    with pod_watch(world.core, real.lane) as seen:
        assert first in real.ask(first, "hello alpha")
        [job] = world.jobs()
        status = job["status"]
        assert status["lane"] == real.lane and status["endpoint"].startswith("http://10.250.0."), status
        with urllib.request.urlopen(f"{status['endpoint']}/v1/models", timeout=5) as resp:
            assert [m["id"] for m in json.loads(resp.read())["data"]] == [first], "the host reaches the pod IP"
        started = time.monotonic()
        assert second in real.ask(second, "hello beta")
        swap = time.monotonic() - started
    uids = list(dict.fromkeys(uid for _, _, uid in seen))
    assert len(uids) == 2, seen
    gone = seen.index(("DELETED", seen[0][1], uids[0]))
    created = next(i for i, (kind, _, uid) in enumerate(seen) if uid == uids[1] and kind == "ADDED")
    assert gone < created, f"the second pod was created before the first was gone: {seen}"
    [pod] = world.backend_pods(real.lane)
    assert pod.metadata.annotations["gpulane.io/model"] == second
    assert pod.spec.node_name == "gpu-0"
    assert swap >= 2.0, "Ready waits for the real server's load"
    # The model's status is the status writer's next pass, a moment after the answer.
    learned = wait_until(
        lambda: (status := world.cluster_status("gpumodels", second)).get("loads") and status,
        timeout=30,
        what=f"GpuModel {second}'s learned load time",
    )
    assert learned["loadSeconds"] >= 2.0, learned
    print(f"swap on the real node, call to answer: {swap:.2f}s; learned load {learned['loadSeconds']:.2f}s")


def test_a_kubectl_request_job_is_executed_on_the_real_backend(real: Real) -> None:
    world = real.world
    model = world.real_model("gamma")
    body = {"model": model, "messages": [{"role": "user", "content": "from kubectl, on gpu-0"}]}
    world.job("manifest", model, request={"path": "/v1/chat/completions", "body": body})
    done = world.wait_phase("manifest", "Succeeded", "Failed", timeout=90)
    assert done["phase"] == "Succeeded", done
    stored = world.core.read_namespaced_config_map(done["result"]["configMap"], world.namespace)
    answer = json.loads(stored.data["response.json"])
    assert answer["model"] == model
    assert "from kubectl, on gpu-0" in answer["choices"][0]["message"]["content"]


def test_a_backend_that_never_loads_fails_its_job_with_model_load_timeout(real: Real) -> None:
    """The readiness probe is real: a server still loading after loadTimeoutSeconds never becomes Ready,
    and the job fails with ModelLoadTimeout instead of waiting forever."""
    world = real.world
    model = world.real_model("stuck", load_seconds=3600, loadTimeoutSeconds=4)
    world.job("stuck", model)
    failed = world.wait_phase("stuck", "Failed", timeout=60)
    assert failed["reason"] == "ModelLoadTimeout", failed
