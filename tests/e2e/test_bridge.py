"""The OpenAI-compatible bridge with the real ``openai`` client: operator, bridge and a fake model server
each as their own process, on the real control plane. Backend pods are kwok's and do not listen, so
the bridge is told where each model's server is (its endpoint override), as the docs describe."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
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

from .operator_support import (
    API,
    OPERATOR_NAMESPACE,
    BridgeProcess,
    FakeBackendProcess,
    OperatorProcess,
    World,
)
from .support import REPO, Cluster, wait_until
from .test_chains import chain_status

from suite_groups import free_port  # isort: skip  (tests/, put on sys.path by .support)

pytestmark = pytest.mark.e2e("kwok")

APP_KEY = "sk-e2e-app-key-123"  # trusted: an application that serves its own users
USER_KEY = "sk-e2e-user-key-456"  # an ordinary member, capped at normal priority
OPS_KEY = "sk-e2e-ops-key-789"  # admin: may call /unload


@dataclass
class Setup:
    world: World
    bridge: BridgeProcess
    backend: FakeBackendProcess
    model: str
    lane: str

    def client(self, key: str = USER_KEY, **headers: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.bridge.url}/v1", api_key=key, default_headers=headers, max_retries=0)

    def all_succeeded(self) -> list[dict[str, Any]]:
        """The jobs, once every one has its outcome: the bridge writes it just after the client's answer."""
        return wait_until(
            lambda: (
                (jobs := self.jobs())
                and all((j.get("status") or {}).get("phase") == "Succeeded" for j in jobs)
                and jobs
            ),
            what="every job Succeeded",
        )

    def jobs(self) -> list[dict[str, Any]]:
        return self.world.jobs()


@pytest.fixture
def setup(cluster: Cluster, world: World, operator: OperatorProcess, tmp_path: Path) -> Iterator[Setup]:
    # Its server answers ComfyUI's POST /prompt with a ticket too (the fake backend speaks both).
    model = world.model("chat", ready_delay="1s", ticket={"intervalSeconds": 0.2})
    lane = world.lane()
    backend = FakeBackendProcess(cluster, tmp_path, "--model", model, "--chunks", "6", "--chunk-delay", "0.2").launch()
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [
        {"name": "app", "key": APP_KEY, "member": "app", "tier": "pro", "maxPriority": 100, "trusted": True},
        {"name": "bob", "key": USER_KEY, "member": "bob", "maxPriority": 0},
        {"name": "ops", "key": OPS_KEY, "member": "ops", "admin": True},
    ]}))  # fmt: skip
    bridge = BridgeProcess(cluster, tmp_path, world.namespace, keys, "--endpoint", f"{model}={backend.url}",
                           "--lease-seconds", "3", "--backend-namespace", OPERATOR_NAMESPACE,
                           "--upstream-ignore-path", "^/stats$").launch()  # fmt: skip
    try:
        backend.wait_ready()  # the two start side by side
        bridge.wait_ready()
        yield Setup(world, bridge, backend, model, lane)
    finally:
        bridge.stop()
        backend.stop()


def test_chat_completions_through_the_bridge(setup: Setup) -> None:
    answer = setup.client().chat.completions.create(model=setup.model, messages=[{"role": "user", "content": "hello"}])
    assert setup.model in answer.choices[0].message.content
    [job] = setup.all_succeeded()
    assert (job["spec"]["member"], job["spec"]["priority"]) == ("bob", 0)
    # Each write named after its author (the apiserver takes the user agent): the bridge created the job and wrote
    # its outcome as its executor, the operator queued and dispatched it.
    writers = {(m["manager"], m.get("subresource")) for m in job["metadata"]["managedFields"]}
    assert {("gpulane-bridge", None), ("gpulane-bridge", "status"), ("gpulane-operator", "status")} <= writers, writers


def test_an_sdapi_call_and_an_upstream_call_are_queued_jobs_like_any_other(setup: Setup) -> None:
    """llama-swap's routes beyond OpenAI's (docs/bridge.md): a stable-diffusion server's txt2img, and
    /upstream/<model>/<path> to a server's own endpoint, each a GpuJob with the caller's priority."""

    def call(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {USER_KEY}", "Content-Type": "application/json",
                   "X-LlamaSwap-Priority": "-50"}  # fmt: skip
        request = urllib.request.Request(f"{setup.bridge.url}{path}", data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=60) as resp:
            return json.loads(resp.read()), resp.headers

    txt2img = {"model": setup.model, "prompt": "a lighthouse", "batch_size": 2}
    drawn, headers = call("POST", "/sdapi/v1/txt2img", txt2img)
    assert len(drawn["images"]) == 2 and drawn["parameters"]["prompt"] == "a lighthouse"
    props, _ = call("GET", f"/upstream/{setup.model}/props")
    assert props["model_path"] == setup.model
    jobs = setup.all_succeeded()
    assert len(jobs) == 2 and {j["spec"]["priority"] for j in jobs} == {-50}
    assert headers["X-Gpulane-Job"] in {j["metadata"]["name"] for j in jobs}
    # --upstream-ignore-path ^/stats$ (llama-swap's upstream.ignorePaths): once the lane's status says the model
    # is resident and Ready, the call skips the queue: no job, no X-Gpulane-Job header.
    wait_until(lambda: (s := setup.world.cluster_status("gpulanes", setup.lane)).get("ready")
               and s.get("residentModel") == setup.model, what="the lane's status: the model resident")  # fmt: skip
    stats, headers = call("GET", f"/upstream/{setup.model}/stats")
    assert "per_model" in stats and "X-Gpulane-Job" not in headers
    assert len(setup.jobs()) == 2


RENDER = {"3": {"class_type": "KSampler", "inputs": {"seed": 7}}, "9": {"class_type": "SaveImage", "inputs": {}}}


def test_a_chain_through_upstream_routes_holds_each_render_until_its_ticket_is_done(setup: Setup) -> None:
    """A film as ComfyUI renders it (issue 33): each step is POST /upstream/<model>/prompt, which the server
    answers at once with a ticket. The model's spec.ticket makes the executor poll /history/{prompt_id}: the
    step stays Running, holding the lane, until the render is done, and its stored answer is the finished
    render, not the ticket. A third step reads the server's own /props through /upstream with GET."""
    world = setup.world
    name = world.name("film")
    render = {"path": f"/upstream/{setup.model}/prompt", "body": {"prompt": RENDER, "client_id": "e2e"}}
    props = {"method": "GET", "path": f"/upstream/{setup.model}/props"}
    world.apply({"apiVersion": API, "kind": "GpuChain", "metadata": {"name": name, "namespace": world.namespace},
                 "spec": {"model": setup.model, "steps": [render, render, props]}})  # fmt: skip
    answers = []
    for index in range(3):
        done = world.wait_phase(f"{name}-{index}", "Succeeded", "Failed", timeout=60)
        assert done["phase"] == "Succeeded", done
        stored = world.core.read_namespaced_config_map(done["result"]["configMap"], world.namespace)
        answers.append(json.loads(stored.data["response.json"]))
    for entry in (next(iter(a.values())) for a in answers[:2]):
        assert entry["status"] == {**entry["status"], "status_str": "success", "completed": True}
        assert entry["outputs"]["9"]["images"][0]["type"] == "output"
    assert answers[2]["model_path"] == setup.model
    wait_until(lambda: chain_status(world, name).get("phase") == "Succeeded" or None, what="the chain Succeeded")
    # The bridge's own call to the same route answers with the finished render too.
    headers = {"Authorization": f"Bearer {USER_KEY}", "Content-Type": "application/json"}
    request = urllib.request.Request(f"{setup.bridge.url}/upstream/{setup.model}/prompt", method="POST",
                                     data=json.dumps({"prompt": RENDER}).encode(), headers=headers)  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as resp:
        (entry,) = json.loads(resp.read()).values()
    assert entry["status"]["completed"] is True


def test_streaming_chunks_arrive_one_by_one(setup: Setup) -> None:
    stream = setup.client().chat.completions.create(
        model=setup.model, messages=[{"role": "user", "content": "count"}], stream=True
    )
    arrivals = [time.monotonic() for chunk in stream if chunk.choices and chunk.choices[0].delta.content]
    assert len(arrivals) >= 5
    assert arrivals[-1] - arrivals[0] >= 0.6, f"the chunks came in a burst: {arrivals}"
    assert len(setup.all_succeeded()) == 1


def test_async_client_embeddings_images_and_models(setup: Setup) -> None:
    async def calls() -> tuple[Any, Any, Any]:
        client = openai.AsyncOpenAI(base_url=f"{setup.bridge.url}/v1", api_key=USER_KEY, max_retries=0)
        embedding = await client.embeddings.create(model=setup.model, input=["a", "b"])
        image = await client.images.generate(model=setup.model, prompt="a lane", n=1)
        models = await client.models.list()
        await client.close()
        return embedding, image, models

    embedding, image, models = asyncio.run(calls())
    assert len(embedding.data) == 2 and embedding.data[0].embedding
    assert image.data[0].b64_json
    assert setup.model in [m.id for m in models.data]
    assert len(setup.all_succeeded()) == 2  # embeddings and images; listing models runs no job


def test_the_interactive_call_overtakes_the_batch_call(setup: Setup) -> None:
    world = setup.world
    world.job("blocker", setup.model, member="film")
    world.wait_phase("blocker", "Running")
    finished: list[str] = []

    def queued(member: str) -> bool:
        return any(j["spec"]["member"] == member and j.get("status", {}).get("phase") == "Pending"
                   for j in setup.jobs())  # fmt: skip

    def call(name: str, priority: str) -> None:
        client = setup.client(APP_KEY, **{"X-LlamaSwap-Priority": priority, "X-LlamaSwap-Member": name})
        client.chat.completions.create(model=setup.model, messages=[{"role": "user", "content": name}])
        finished.append(name)

    batch = threading.Thread(target=call, args=("batch-user", "batch"))
    batch.start()
    wait_until(lambda: any(j["spec"]["member"] == "app/batch-user" for j in setup.jobs()), what="the batch job")
    interactive = threading.Thread(target=call, args=("image-user", "interactive"))
    interactive.start()
    # Pending is the operator's write: it has queued both before the GPU frees.
    wait_until(lambda: queued("app/batch-user") and queued("app/image-user"), what="both jobs queued")
    world.complete("blocker")
    batch.join(60)
    interactive.join(60)
    assert finished == ["image-user", "batch-user"]
    priorities = {j["spec"]["member"]: j["spec"]["priority"] for j in setup.jobs()}
    assert priorities["app/image-user"] == 100 and priorities["app/batch-user"] == -100  # counted under the key


def test_bad_calls_get_openai_errors_and_leave_no_job(setup: Setup) -> None:
    with pytest.raises(openai.AuthenticationError):
        setup.client("sk-nobody-knows-this").chat.completions.create(model=setup.model, messages=[])
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        setup.client().chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.PermissionDeniedError, match="may not set X-LlamaSwap-Member"):
        setup.client(USER_KEY, **{"X-LlamaSwap-Member": "carol"}).chat.completions.create(
            model=setup.model, messages=[{"role": "user", "content": "x"}]
        )
    request = urllib.request.Request(
        f"{setup.bridge.url}/v1/chat/completions", data=b"{not json", method="POST",
        headers={"Authorization": f"Bearer {USER_KEY}", "Content-Type": "application/json"},
    )  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=10)
    assert err.value.code == 400 and b'"type": "invalid_request_error"' in err.value.read()
    assert setup.jobs() == []
    assert setup.backend.stats()["total"] == 0, "no refused call reached the backend"


def test_a_capped_priority_is_reported_in_a_response_header(setup: Setup) -> None:
    client = setup.client(USER_KEY, **{"X-LlamaSwap-Priority": "interactive"})
    raw = client.chat.completions.with_raw_response.create(
        model=setup.model, messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.headers["X-Gpulane-Priority-Capped"] == "100 -> 0 (key bob)"
    [job] = setup.jobs()
    assert job["spec"]["priority"] == 0
    assert job["metadata"]["annotations"]["gpulane.io/requested-priority"] == "100"  # as the webhook records it


def test_a_client_that_leaves_frees_its_place_and_its_gpu(setup: Setup) -> None:
    world = setup.world
    world.job("blocker", setup.model, member="film")
    world.wait_phase("blocker", "Running")
    # Queued, then gone: its job leaves the queue.
    client = setup.client()
    with client.chat.completions.with_streaming_response.create(
        model=setup.model, messages=[{"role": "user", "content": "x"}], stream=True
    ) as response:
        first = next(response.iter_lines())
        assert first.startswith(": queued")
    wait_until(lambda: [j["metadata"]["name"] for j in setup.jobs()] == ["blocker"], what="the queued job deleted")
    world.complete("blocker")
    # Running, then gone mid-stream: its job is cancelled and the lane takes the next one.
    with client.chat.completions.with_streaming_response.create(
        model=setup.model, messages=[{"role": "user", "content": "y"}], stream=True
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                break
    world.job("next", setup.model, member="film")
    assert world.wait_phase("next", "Running", timeout=30)


def test_a_killed_bridge_frees_the_lane_within_its_lease(setup: Setup) -> None:
    world = setup.world

    def stream() -> None:
        try:
            chunks = setup.client().chat.completions.create(
                model=setup.model, messages=[{"role": "user", "content": "long"}], stream=True
            )
            for _ in chunks:
                pass
        except openai.APIError:
            pass  # the bridge died under it

    threading.Thread(target=stream, daemon=True).start()
    wait_until(lambda: [j for j in setup.jobs() if (j.get("status") or {}).get("phase") == "Running"],
               what="the call running")  # fmt: skip
    setup.bridge.kill()
    [job] = setup.jobs()
    lost = world.wait_phase(job["metadata"]["name"], "Failed", timeout=30)
    assert lost["reason"] == "DataPlaneLost"
    world.job("after", setup.model)
    assert world.wait_phase("after", "Running")


def test_a_manifest_job_with_a_request_is_executed_and_its_answer_stored(setup: Setup) -> None:
    world = setup.world
    body = {"model": setup.model, "messages": [{"role": "user", "content": "from kubectl"}]}
    world.job(
        "manifest", setup.model, request={"path": "/v1/chat/completions", "body": body}, ttlSecondsAfterFinished=30
    )
    done = world.wait_phase("manifest", "Succeeded", "Failed", timeout=60)
    assert done["phase"] == "Succeeded", done
    # Read before the CLI's own process starts: the answer goes with the job at its TTL, and on a loaded machine a
    # TTL of 8 s ran out while `gpulane result` started.
    result = done["result"]
    assert result["status"] == 200 and result["key"] == "response.json"
    stored = world.core.read_namespaced_config_map(result["configMap"], world.namespace)
    # `gpulane result` reads a ConfigMap answer with the caller's own kubeconfig.
    shown = subprocess.run(
        [str(REPO / ".venv" / "bin" / "gpulane"), "result", f"{world.namespace}/manifest", "--kubeconfig",
         str(world.cluster.kubeconfig)], capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shown.returncode == 0 and "from kubectl" in shown.stdout, shown.stderr
    answer = json.loads(stored.data["response.json"])
    assert "from kubectl" in answer["choices"][0]["message"]["content"]
    assert stored.metadata.owner_references[0].name == "manifest", "deleting the job deletes its answer"
    # Its ttlSecondsAfterFinished passed: the operator deletes the job, the garbage collector its answer.
    wait_until(lambda: "manifest" not in {j["metadata"]["name"] for j in world.jobs()}, timeout=30, what="job gone")
    selector = f"metadata.name={result['configMap']}"
    wait_until(lambda: not world.core.list_namespaced_config_map(world.namespace, field_selector=selector).items,
               timeout=30, what="its result ConfigMap gone")  # fmt: skip


def test_over_the_queue_cap_a_call_gets_429_with_retry_after(setup: Setup, cluster: Cluster, tmp_path: Path) -> None:
    world = setup.world
    tight = BridgeProcess(cluster, tmp_path, world.namespace, setup.bridge.keys_file, "--endpoint",
                          f"{setup.model}={setup.backend.url}", "--max-queued-per-member", "1").start()  # fmt: skip
    try:
        world.job("blocker", setup.model, member="film")
        world.wait_phase("blocker", "Running")
        client = openai.OpenAI(base_url=f"{tight.url}/v1", api_key=USER_KEY, max_retries=0)
        waiting = threading.Thread(
            target=lambda: client.chat.completions.create(
                model=setup.model, messages=[{"role": "user", "content": "1"}]
            ),
            daemon=True,
        )
        waiting.start()
        wait_until(lambda: len(setup.jobs()) == 2, what="the first call queued")
        with pytest.raises(openai.RateLimitError) as err:
            client.chat.completions.create(model=setup.model, messages=[{"role": "user", "content": "2"}])
        assert err.value.response.headers["Retry-After"] == "1"
        assert "has 1 calls waiting" in str(err.value)
        assert len(setup.jobs()) == 2, "the refused call created no job"
        world.complete("blocker")
        waiting.join(30)
        assert not waiting.is_alive()
    finally:
        tight.stop()


def test_multipart_calls_are_routed_by_their_form_field(setup: Setup, tmp_path: Path) -> None:
    audio = tmp_path / "hello.wav"
    audio.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt ")
    with audio.open("rb") as f:
        text = setup.client().audio.transcriptions.create(model=setup.model, file=f)
    assert setup.model in text.text
    [job] = setup.all_succeeded()
    assert job["spec"]["model"] == setup.model


def test_a_bridge_restarted_under_its_name_cancels_the_calls_its_last_run_left(
    setup: Setup, cluster: Cluster, tmp_path: Path
) -> None:
    """A crashed bridge container restarts with the same name and renews the same Lease, so the operator
    cannot tell its dead calls from live ones: the new run removes them, or they would hold the GPU with
    nobody to send their requests."""
    world = setup.world
    world.job("blocker", setup.model, member="film")
    world.wait_phase("blocker", "Running")
    argv = (world.namespace, setup.bridge.keys_file, "--endpoint", f"{setup.model}={setup.backend.url}")
    crashed = BridgeProcess(cluster, tmp_path, *argv, "--replica", "crashy").start()
    client = openai.OpenAI(base_url=f"{crashed.url}/v1", api_key=USER_KEY, max_retries=0)

    def call() -> None:
        with contextlib.suppress(openai.APIError):  # the bridge dies under it
            client.chat.completions.create(model=setup.model, messages=[{"role": "user", "content": "x"}])

    threading.Thread(target=call, daemon=True).start()

    def left() -> list[str]:
        return [j["metadata"]["name"] for j in world.jobs("gpulane.io/bridge-replica=crashy")]

    [orphan] = wait_until(left, what="the call queued behind the blocker")
    world.wait_phase(orphan, "Pending")
    crashed.kill()
    again = BridgeProcess(cluster, tmp_path, *argv, "--replica", "crashy").start()
    try:
        wait_until(lambda: not left(), timeout=30, what="the last run's call removed")
    finally:
        again.stop()
    world.complete("blocker")


def test_a_call_whose_queue_timeout_passes_behind_a_running_job_gets_a_503_and_its_job_fails(setup: Setup) -> None:
    """Issue 18, part 2: the caller's X-Gpulane-Queue-Timeout goes on its GpuJob; the operator fails the job
    with QueueTimeout at the deadline, and the caller gets OpenAI's 503 (the real client's error type)."""
    world = setup.world
    world.job("blocker", setup.model, member="film")
    world.wait_phase("blocker", "Running")
    client = setup.client(**{"X-Gpulane-Queue-Timeout": "3"})
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as refused:
        client.chat.completions.create(model=setup.model, messages=[{"role": "user", "content": "now or never"}])
    assert refused.value.status_code == 503 and refused.value.code == "queue_timeout", refused.value
    assert time.monotonic() - started >= 2.5, "answered before the deadline"
    [job] = [j for j in setup.jobs() if j["metadata"]["name"] != "blocker"]
    assert job["spec"]["queueTimeoutSeconds"] == 3
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Failed", "QueueTimeout")
    # A kubectl job with its own timeout meets the same end.
    world.job("batch", setup.model, queueTimeoutSeconds=2)
    assert world.wait_phase("batch", "Failed", timeout=30)["reason"] == "QueueTimeout"
    world.complete("blocker")


@contextlib.contextmanager
def unreachable_webhook(world: World) -> Iterator[None]:
    """A GpuJob webhook for this test's namespace that nothing answers (failurePolicy Fail): every create
    there fails with "failed calling webhook", as while a webhook's pods are replaced, until it is removed."""
    tag = f"t{time.monotonic_ns() % 10**8}"
    name = f"gpulane-e2e-outage-{tag}"
    world.cluster.kubectl("label", "namespace", world.namespace, f"gpulane.io/outage-test={tag}")
    port = free_port()  # bound by nobody: connection refused
    hook = {
        "name": "outage.gpulane.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
        "failurePolicy": "Fail", "timeoutSeconds": 2,
        "clientConfig": {"url": f"https://127.0.0.1:{port}/validate"},
        "namespaceSelector": {"matchLabels": {"gpulane.io/outage-test": tag}},
        "rules": [{"apiGroups": ["gpulane.io"], "apiVersions": ["*"], "operations": ["CREATE"],
                   "resources": ["gpujobs"]}],
    }  # fmt: skip
    world.apply({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                 "metadata": {"name": name}, "webhooks": [hook]})  # fmt: skip
    try:
        yield
    finally:
        world.cluster.kubectl("delete", "validatingwebhookconfiguration", name, "--ignore-not-found")
        world.cluster.kubectl("label", "namespace", world.namespace, "gpulane.io/outage-test-")


def test_a_call_waits_out_an_admission_outage_and_is_answered(setup: Setup) -> None:
    """Issue 39: a create refused because admission is unreachable is retried with backoff; a stream hears
    why meanwhile, and once the webhook is back (here: removed) the call is queued and answered."""
    with contextlib.ExitStack() as outage:
        outage.enter_context(unreachable_webhook(setup.world))
        body = json.dumps({"model": setup.model, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        request = urllib.request.Request(f"{setup.bridge.url}/v1/chat/completions", data=body.encode(),
                                         headers={"Authorization": f"Bearer {USER_KEY}",
                                                  "Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as stream:
            first = stream.readline().decode()
            assert first.startswith(": waiting for the cluster to take the job (HTTP 500"), first
            assert setup.jobs() == [], "no job while admission refuses it"
            outage.close()  # the webhook is back
            rest = stream.read().decode()
        assert '"content"' in rest and rest.rstrip().endswith("data: [DONE]"), rest
        assert stream.headers["X-Gpulane-Job"] in {j["metadata"]["name"] for j in setup.all_succeeded()}


def test_an_admission_outage_longer_than_the_calls_patience_gets_a_503_and_leaves_no_job(setup: Setup) -> None:
    with unreachable_webhook(setup.world):
        client = setup.client(**{"X-Gpulane-Queue-Timeout": "2"})  # the bound of its retries
        with pytest.raises(openai.InternalServerError) as refused:
            client.chat.completions.create(model=setup.model, messages=[{"role": "user", "content": "hi"}])
        assert refused.value.status_code == 503, refused.value
        assert refused.value.response.headers["Retry-After"] == "1"
        assert "the cluster cannot take the job now: HTTP 500" in refused.value.message, refused.value.message
        assert "failed calling webhook" in refused.value.message
        assert setup.jobs() == []


def test_an_admin_keys_unload_gives_every_gpu_back_and_the_next_call_loads_again(
    setup: Setup, cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """llama-swap's /unload (issue 33): an admin key's request reaches the operator as the Lease gpulane-unload
    in the bridge's namespace (its --unload-namespace); every lane stops its pod once its jobs end, and says
    so. Another key is refused, and unloads nothing."""
    world = setup.world
    operator.stop()  # the suite's operator honours no /unload; this one does, in the bridge's namespace
    unloading = OperatorProcess(cluster, tmp_path, "--unload-namespace", world.namespace).start()

    def unload(key: str) -> tuple[int, str]:
        request = urllib.request.Request(f"{setup.bridge.url}/unload", headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    try:
        hello = [{"role": "user", "content": "hello"}]
        setup.client().chat.completions.create(model=setup.model, messages=hello)
        [loaded] = wait_until(lambda: world.backend_pods(setup.lane), what="the model's pod")
        status, text = unload(USER_KEY)
        assert status == 403 and '"admin_only"' in text, text
        assert unload(OPS_KEY) == (200, "OK\n")
        wait_until(lambda: not world.backend_pods(setup.lane), what="the lane's pod stopped")
        selector = f"involvedObject.kind=GpuLane,involvedObject.name={setup.lane},reason=UnloadRequested"
        [event] = wait_until(lambda: world.core.list_namespaced_event("default", field_selector=selector).items,
                             what="the lane's UnloadRequested Event")  # fmt: skip
        assert "/unload by key ops" in event.message
        setup.client().chat.completions.create(model=setup.model, messages=hello)  # loads it again
        [again] = wait_until(lambda: world.backend_pods(setup.lane), what="the model's new pod")
        assert again.metadata.uid != loaded.metadata.uid
    finally:
        unloading.stop()
        operator.start()
