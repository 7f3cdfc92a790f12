"""gpulane on the real node gpu-0: backend pods are real containers (``gpulane fake-backend`` from the
project's image), Ready through their readiness probe, and the bridge and the executor reach them on their
pod IPs. No endpoint override anywhere: the real ``openai`` client, the bridge, the operator, the kubelet
and the model server are all real processes."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from .operator_support import API, GROUP, OPERATOR_NAMESPACE, VERSION, BridgeProcess, OperatorProcess, World, pod_watch
from .support import Cluster, localcluster, wait_until
from .tiny_gguf import write_tiny_model

pytestmark = pytest.mark.e2e("gpu-0")

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


# -- llama.cpp's llama-server, the server llama-swap users run ----------------------------------------

CONTEXT = 8192  # room for a long generation, to be cut short by a client that leaves
NO_EOS = {"ignore_eos": True}  # random weights may draw the end-of-text token at any step
# One slot (one job at a time, as maxConcurrency 1 says); its port is the GpuModel's.
SERVER_ARGS = ("--host", "0.0.0.0", "--port", "8080", "-c", str(CONTEXT), "-np", "1", "--threads", "2")


@dataclass
class Llama:
    image: str
    weights: Path  # a host directory with the tiny models a.gguf and b.gguf


@pytest.fixture(scope="module")
def llama(cluster: Cluster) -> Iterator[Llama]:
    """llama-server's image in the real node's containerd (built by `make test`'s llama-server step, cached
    by content), and two tiny models of different weights on the host, for a hostPath volume."""
    built = localcluster.llama_server.build_image(print)
    localcluster.node.sync_images(localcluster.Layout(cluster.info.state_dir), cluster.bindir, [built], print)
    weights = Path(tempfile.mkdtemp(prefix="gpulane-tiny-models-"))
    weights.chmod(0o755)
    vocabulary = localcluster.llama_server.built_dir() / localcluster.llama_server.VOCAB
    for name, seed in (("a", 1), ("b", 2)):
        write_tiny_model(vocabulary, weights / f"{name}.gguf", seed=seed, context=CONTEXT)
    try:
        yield Llama(built.name, weights)
    finally:
        shutil.rmtree(weights)


def llama_model(world: World, llama: Llama, stem: str, weights: str) -> str:
    """A GpuModel served by llama-server from ``weights`` (a file of ``llama.weights``), one slot."""
    name = world.name(stem)
    container = {
        "name": "backend",
        "image": llama.image,
        "args": [*SERVER_ARGS, "-m", f"/models/{weights}", "-a", name],
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
    }
    volume = {"name": "models", "hostPath": {"path": str(llama.weights), "type": "Directory"}}
    spec = {"port": 8080, "readinessPath": "/health", "loadTimeoutSeconds": 120, "expectedRunSeconds": 5,
            "template": {"spec": {"volumes": [volume], "containers": [container]}}}  # fmt: skip
    world.apply({"apiVersion": API, "kind": "GpuModel", "metadata": {"name": name}, "spec": spec})
    world.cluster_objects.append(("gpumodels", name))
    return name


@pytest.mark.timeout(900)  # on a machine where `make test` did not build the image first: the build
def test_a_real_llama_server_streams_swaps_stops_when_the_client_leaves_and_serves_by_priority(
    real: Real, llama: Llama
) -> None:
    world, client = real.world, real.client()
    first, second = llama_model(world, llama, "llama-a", "a.gguf"), llama_model(world, llama, "llama-b", "b.gguf")
    hello: list[Any] = [{"role": "user", "content": "hello"}]

    # A real load, then tokens streamed one chunk each, as the server generates them.
    stream = client.chat.completions.create(model=first, messages=hello, stream=True, max_tokens=24,
                                            extra_body=NO_EOS)  # fmt: skip
    chunks = [chunk for chunk in stream if chunk.choices and chunk.choices[0].delta.content is not None]
    assert len(chunks) >= 20, f"{len(chunks)} chunks for 24 tokens"
    learned = wait_until(lambda: (s := world.cluster_status("gpumodels", first)).get("loads") and s,
                         timeout=30, what=f"GpuModel {first}'s learned load time")  # fmt: skip
    assert learned["loadSeconds"] > 0, learned

    # A swap: the other model's server replaces the first on the lane's one GPU.
    answer = client.chat.completions.create(model=second, messages=hello, max_tokens=8, extra_body=NO_EOS)
    assert answer.usage is not None and answer.usage.completion_tokens == 8
    [pod] = world.backend_pods(real.lane)
    assert pod.metadata.annotations["gpulane.io/model"] == second

    # A burst behind a long generation: the calls arrive lowest priority first, and run highest first once
    # the generation's client leaves, which stops the generation on the server.
    before = {job["metadata"]["name"] for job in world.jobs()}
    blocker = client.chat.completions.create(model=second, messages=hello, stream=True, max_tokens=CONTEXT - 64,
                                             extra_body=NO_EOS)  # fmt: skip
    next(iter(blocker))  # generating: its job is Running
    urgent: dict[int, Any] = {}

    def call(priority: int) -> None:
        urgent[priority] = client.chat.completions.create(
            model=second, messages=hello, max_tokens=4, extra_body=NO_EOS,
            extra_headers={"X-LlamaSwap-Priority": str(priority)},
        )  # fmt: skip

    callers: list[threading.Thread] = []
    for priority in (0, 50, 100):
        callers.append(threading.Thread(target=call, args=(priority,)))
        callers[-1].start()
        expected = len(before) + 1 + len(callers)
        wait_until(lambda n=expected: len(world.jobs()) == n, what=f"call {priority}'s job")
    burst = [job["metadata"]["name"] for job in world.jobs() if job["metadata"]["name"] not in before]
    phases = wait_until(lambda: len(seen := sorted(p for n in burst if (p := world.status(n).get("phase")))) == 4
                        and seen, what="the phases of the generation and the burst")  # fmt: skip
    assert phases == ["Pending", "Pending", "Pending", "Running"], "the burst waits behind the generation"
    blocker.close()
    for caller in callers:
        caller.join(timeout=60)
    assert sorted(urgent) == [0, 50, 100], "every call of the burst was answered"
    log = world.core.read_namespaced_pod_log(pod.metadata.name, OPERATOR_NAMESPACE)
    assert "cancel task" in log, "the server went on generating after its client left"

    def succeeded() -> list[dict[str, Any]]:
        new = [job for job in world.jobs() if job["metadata"]["name"] not in before]
        return [job for job in new if (job.get("status") or {}).get("phase") == "Succeeded"]

    # The bridge answers a call before it writes the job's outcome: wait for the three writes.
    ran = wait_until(lambda: len(jobs := succeeded()) == 3 and jobs, what="the burst's three jobs Succeeded")
    order = [job["spec"]["priority"] for job in sorted(ran, key=lambda job: job["status"]["startedAt"])]
    assert order == [100, 50, 0], order


# -- llama-server in router mode: one pod that holds several models (issue 36) ----------------------------

ROUTER_HELLO: list[Any] = [{"role": "user", "content": "hello"}]


def router_models(world: World, image: str, weights: str) -> tuple[str, dict[str, str]]:
    """The server (a GpuModel with a router) and the models it holds: alpha and beta of 4,000 MiB each, gamma
    of 6,000, and a corrupt one; returns the server's name and each held model's name by its file."""
    server = world.name("router")
    container = {
        "name": "backend",
        "image": image,
        "args": ["--threads", "2", "-np", "1"],
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
    }
    volume = {"name": "models", "hostPath": {"path": weights, "type": "Directory"}}
    spec = {"port": 8080, "readinessPath": "/health", "loadTimeoutSeconds": 120,
            "router": {"protocol": "LlamaServerRouter", "maxLoaded": 3},
            "template": {"spec": {"volumes": [volume], "containers": [container]}}}  # fmt: skip
    world.apply({"apiVersion": API, "kind": "GpuModel", "metadata": {"name": server}, "spec": spec})
    world.cluster_objects.append(("gpumodels", server))
    held = {}
    for stem, memory in (("alpha", 4000), ("beta", 4000), ("gamma", 6000), ("broken", 1000)):
        name = world.name(stem)
        body = {"server": server, "memoryMib": memory, "expectedRunSeconds": 5, "loadTimeoutSeconds": 60,
                "preset": {"model": f"/models/{stem}.gguf", "c": "512"}}  # fmt: skip
        world.apply({"apiVersion": API, "kind": "GpuModel", "metadata": {"name": name}, "spec": body})
        world.cluster_objects.append(("gpumodels", name))
        held[stem] = name
    return server, held


def serving(world: World, lane: str, model: str, loaded: list[str]) -> None:
    """The lane's status (the status writer's next pass) serving ``model`` with ``loaded`` held beside it, and
    Ready: the server's pod serves the models it holds."""
    wait_until(
        lambda: (
            (s := world.cluster_status("gpulanes", lane)).get("residentModel") == model
            and s.get("loaded") == loaded
            and s.get("ready") is True
        ),
        timeout=30,
        what=f"lane {lane}'s status serving {model} with {loaded} held",
    )


@pytest.mark.timeout(900)
def test_a_router_lane_switches_models_without_a_new_pod_and_evicts_what_does_not_fit(real: Real, llama: Llama) -> None:
    world, client = real.world, real.client()
    vocabulary = localcluster.llama_server.built_dir() / localcluster.llama_server.VOCAB
    for stem, seed in (("alpha", 11), ("beta", 12), ("gamma", 13)):
        write_tiny_model(vocabulary, llama.weights / f"{stem}.gguf", seed=seed, context=512)
    (llama.weights / "broken.gguf").write_bytes(b"GGUF, but not a model")
    world.custom.patch_cluster_custom_object(GROUP, VERSION, "gpulanes", real.lane, {"spec": {"memoryMib": 10000}})
    server, held = router_models(world, llama.image, str(llama.weights))

    def ask(stem: str) -> None:
        answer = client.chat.completions.create(
            model=held[stem], messages=ROUTER_HELLO, max_tokens=4, extra_body=NO_EOS
        )
        assert answer.usage is not None and answer.usage.completion_tokens == 4

    ask("alpha")
    [pod] = world.backend_pods(real.lane)
    assert pod.metadata.annotations["gpulane.io/model"] == server
    first_pod = pod.metadata.uid

    ask("beta")  # loaded by the server beside alpha: 8,000 of 10,000 MiB
    ask("alpha")  # held: a switch with no load
    serving(world, real.lane, held["alpha"], [held["beta"]])

    ask("gamma")  # 6,000 MiB: beside alpha (served last), not beside alpha and beta
    serving(world, real.lane, held["gamma"], [held["alpha"]])
    [pod] = world.backend_pods(real.lane)
    assert pod.metadata.uid == first_pod, "every switch happened inside the one server pod"
    learned = wait_until(
        lambda: (s := world.cluster_status("gpumodels", held["beta"])).get("switches") and s,
        timeout=30,
        what="beta's learned switch time",
    )
    assert learned["switchSeconds"] > 0, learned

    # Each load's cost is on the lane's status: beta's was a switch by the server, with no new pod.
    history = world.cluster_status("gpulanes", real.lane)["history"]
    [beta] = [r for r in history if r["model"] == held["beta"] and r["load"]]
    assert beta["switch"] is True and beta["loadSeconds"] > 0, beta

    world.job("corrupt", held["broken"])
    failed = world.wait_phase("corrupt", "Failed", timeout=90)
    assert failed["reason"] == "ModelLoadFailed", failed
    ask("alpha")  # the server goes on: what it held still answers, in the same pod
    [pod] = world.backend_pods(real.lane)
    assert pod.metadata.uid == first_pod, "a failed load left the server in place"
