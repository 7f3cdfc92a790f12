"""The manifest executor (gpulane/executor/manifests.py) against a real HTTP backend on 127.0.0.1 and an
in-memory Kube: every run ends in an outcome, and the answer stored is the answer sent."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web
from kubernetes.aio.client.exceptions import ApiException

from gpulane.api.backend_pods import pod_name
from gpulane.api.contract import EXECUTOR_LEASE, LANE_LABEL, MODEL_LABEL
from gpulane.bridge.catalog import Catalog, ServedModel
from gpulane.bridge.results import ResultStore
from gpulane.executor.manifests import BINARY_KEY, RESULT_KEY, ManifestExecutor
from gpulane.fakes.backend import fake_bytes
from gpulane.kube.client import Conflict, Gone

from .helpers import until

Body = dict[str, Any]
NS = "team-a"
LEASE = "gpulane-bridge-r1"
LANE = "gpu-0"
FORGED = "http://169.254.169.254:80"  # what someone with status patch rights wrote


class FakeKube:
    namespace = "gpulane-system"

    def __init__(self) -> None:
        self.config_maps: dict[str, Body] = {}
        self.outcomes: list[tuple[str, list[Body]]] = []
        self.status_attempts = 0
        self.fail_status: list[Exception] = []  # raised by the next status patches, in order
        self.fail_config_map: Exception | None = None
        self.pods: dict[str, Body] = {}  # backend pods, by namespace/name

    def serve(self, url: str, model: str = "m", lane: str = LANE, ready: bool = True) -> None:
        """The operator's backend pod of ``lane``, serving ``model`` at ``url`` (http://IP:PORT)."""
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.pods[f"{self.namespace}/{pod_name(lane)}"] = {
            "metadata": {"name": pod_name(lane), "annotations": {LANE_LABEL: lane, MODEL_LABEL: model}},
            "spec": {"containers": [{"name": "backend", "ports": [{"name": "http", "containerPort": int(port)}]}]},
            "status": {"podIP": host, "conditions": [{"type": "Ready", "status": str(ready)}]},
        }

    async def get_pod(self, name: str, namespace: str | None = None) -> Body:
        try:
            return self.pods[f"{namespace or self.namespace}/{name}"]
        except KeyError:
            raise Gone(f"pods {name!r} not found") from None

    async def create_config_map(self, namespace: str, manifest: Body) -> None:
        if self.fail_config_map is not None:
            raise self.fail_config_map
        name = manifest["metadata"]["name"]
        if f"{namespace}/{name}" in self.config_maps:
            raise Conflict("configmaps already exists")
        self.config_maps[f"{namespace}/{name}"] = manifest

    async def patch_job_status(self, namespace: str, name: str, patch: list[Body]) -> Body:
        self.status_attempts += 1
        if self.fail_status:
            raise self.fail_status.pop(0)
        self.outcomes.append((f"{namespace}/{name}", patch))
        return {}


def running_job(name: str, uid: str, path: str = "/v1/completions", output: str | None = None) -> Body:
    """A job Running on LANE, claimed by this executor. Its status.endpoint is a forgery the executor must
    never call: the backend is found through the lane's pod."""
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid, "resourceVersion": "7",
                     "annotations": {EXECUTOR_LEASE: f"{FakeKube.namespace}/{LEASE}"}},
        "spec": {"model": "m", "request": {"path": path, "body": {"prompt": "hi"},
                                           **({"output": output} if output else {})}},
        "status": {"phase": "Running", "lane": LANE, "endpoint": FORGED},
    }  # fmt: skip


PLAIN = Catalog.of({"m"})


def catalog(models: Catalog) -> Callable[[], Awaitable[Catalog]]:
    async def load() -> Catalog:
        return models

    return load


def outcome(patch: list[Body]) -> dict[str, Any]:
    """The JSON patch's added fields as a dict: phase, reason, message, result."""
    return {op["path"].removeprefix("/status/"): op["value"] for op in patch if op["op"] != "test"}


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def backend(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def execute(
    handler: Handler,
    kube: FakeKube,
    *jobs: tuple[str, str],
    max_bytes: int = 900 * 1024,
    results: ResultStore | None = None,
    output: str | None = None,
    models: Catalog = PLAIN,
    body: Body | None = None,
    job_priority: int | str = 0,
) -> None:
    """Runs each (name, uid) as a Running job claimed by this executor until its outcome is written."""
    async with backend(handler) as url:
        kube.serve(url)
        ex = ManifestExecutor(kube, LEASE, {}, ["ns"], max_answer_bytes=max_bytes, results=results,  # type: ignore[arg-type]
                              models=catalog(models))  # fmt: skip
        ex.session = ClientSession()
        try:
            for done, (name, uid) in enumerate(jobs, start=1):
                job = running_job(name, uid, output=output)
                job["spec"]["priority"] = job_priority
                if body is not None:
                    job["spec"]["request"]["body"] = body
                ex._seen(job)
                await until(functools.partial(lambda n: len(kube.outcomes) >= n, done), f"the outcome of {name}")
        finally:
            await ex.stop()


@pytest.mark.parametrize(
    ("passthrough", "priority", "sent"),
    [("LowerFirst", 50, -50), ("HigherFirst", 50, 50), (None, 50, -999), ("LowerFirst", "batch", 100)],
)
def test_a_kubectl_jobs_own_priority_in_its_body_never_reaches_a_passthrough_server(passthrough, priority, sent):
    """Review M2: the executor posts spec.request.body; with priorityPassthrough, the server gets the job's
    priority (50) in its own sense, not the -999 the job's author wrote to jump vLLM's queue. A priority
    left as an alias (no admission resolved it) is the alias's value."""
    received: list[Body] = []

    async def record(request: web.Request) -> web.StreamResponse:
        received.append(await request.json())
        return web.json_response({"ok": True})

    async def scenario() -> None:
        kube = FakeKube()
        models = Catalog([ServedModel("m", priority_passthrough=passthrough)])
        await execute(record, kube, ("jumper", "uid-1"), models=models, body={"prompt": "hi", "priority": -999},
                      job_priority=priority)  # fmt: skip

    asyncio.run(scenario())
    assert received == [{"prompt": "hi", "priority": sent, "model": "m"}]


def test_a_large_answer_sent_in_many_chunks_is_stored_whole():
    answer = json.dumps({"text": "x" * 600_000}).encode()

    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for i in range(0, len(answer), 4096):
            await resp.write(answer[i : i + 4096])
            await asyncio.sleep(0.0005)  # the client sees the answer arrive in pieces
        await resp.write_eof()
        return resp

    kube = FakeKube()
    asyncio.run(execute(slow, kube, ("big", "uid-1")))

    done = outcome(kube.outcomes[0][1])
    assert done["phase"] == "Succeeded"
    stored = kube.config_maps[f"{NS}/big-result-uid-1"]["data"][RESULT_KEY]
    assert stored.encode() == answer


def test_a_binary_answer_is_stored_byte_for_byte_as_binary_data():
    audio = bytes(range(256)) * 40  # not UTF-8

    async def wav(_: web.Request) -> web.Response:
        return web.Response(body=audio, content_type="audio/wav")

    kube = FakeKube()
    asyncio.run(execute(wav, kube, ("speech", "uid-1")))

    done = outcome(kube.outcomes[0][1])
    assert done["phase"] == "Succeeded"
    assert done["result"]["key"] == BINARY_KEY and done["result"]["contentType"] == "audio/wav"
    stored = kube.config_maps[f"{NS}/speech-result-uid-1"]
    assert "data" not in stored
    assert base64.b64decode(stored["binaryData"][BINARY_KEY]) == audio


async def ok(_: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def test_an_api_error_storing_the_answer_still_fails_the_job():
    kube = FakeKube()
    kube.fail_config_map = ApiException(status=403, reason="Forbidden")
    asyncio.run(execute(ok, kube, ("denied", "uid-1")))

    done = outcome(kube.outcomes[0][1])
    assert done["phase"] == "Failed" and "403" in done["message"]


def test_a_backend_that_drops_the_connection_mid_answer_fails_the_job():
    async def dropped(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": "100000"})
        await resp.prepare(request)
        await resp.write(b"{" * 100)
        assert request.transport is not None
        request.transport.close()  # the backend died mid-answer
        return resp

    kube = FakeKube()
    asyncio.run(execute(dropped, kube, ("cut", "uid-1")))

    done = outcome(kube.outcomes[0][1])
    assert done["phase"] == "Failed" and "the request failed" in done["message"]
    assert kube.config_maps == {}


def test_an_answer_over_the_limit_fails_the_job_and_stores_nothing():
    async def big(_: web.Request) -> web.Response:
        return web.Response(body=b"x" * 5000)

    kube = FakeKube()
    asyncio.run(execute(big, kube, ("huge", "uid-1"), max_bytes=1000))

    done = outcome(kube.outcomes[0][1])
    assert done["phase"] == "Failed" and "over the limit of 1000 bytes" in done["message"]
    assert kube.config_maps == {}


def test_a_job_created_again_under_the_same_name_runs_again():
    calls = 0

    async def counting(_: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.json_response({"call": calls})

    kube = FakeKube()
    asyncio.run(execute(counting, kube, ("same", "uid-1"), ("same", "uid-2")))

    assert calls == 2
    assert [outcome(p)["phase"] for _, p in kube.outcomes] == ["Succeeded", "Succeeded"]
    second = kube.config_maps[f"{NS}/same-result-uid-2"]  # the first job's stays until it is collected
    assert json.loads(second["data"][RESULT_KEY]) == {"call": 2}
    assert second["metadata"]["ownerReferences"][0]["uid"] == "uid-2"


def test_a_late_running_event_of_a_finished_job_does_not_send_its_request_again():
    async def scenario() -> None:
        async with backend(ok) as url:
            kube = FakeKube()
            kube.serve(url)
            ex = ManifestExecutor(kube, LEASE, {}, ["ns"], models=catalog(PLAIN))  # type: ignore[arg-type]
            ex.session = ClientSession()
            job = running_job("once", "uid-1")
            ex._seen(job)
            await until(lambda: len(kube.outcomes) == 1, "the outcome")
            await until(lambda: not ex._tasks, "the run to finish")
            ex._seen(job)  # the watch delivers an event from before the outcome was written
            assert not ex._tasks, "the stale Running event started the job again"
            await ex.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("transient", [ApiException(status=500, reason="Internal"), TimeoutError()])
def test_a_transient_error_writing_the_outcome_is_retried_until_it_lands(transient: Exception):
    kube = FakeKube()
    kube.fail_status = [transient, transient]
    asyncio.run(execute(ok, kube, ("flaky", "uid-1")))

    assert kube.status_attempts == 3
    assert outcome(kube.outcomes[0][1])["phase"] == "Succeeded"


def test_the_executor_watches_only_the_namespaces_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 16 item 12: no cluster-wide watch (namespace None), so no cluster-wide grant is needed."""
    watched: list[str | None] = []

    async def watch(kube: Any, namespace: str | None, selector: str | None, deliver: Any) -> None:
        watched.append(namespace)

    monkeypatch.setattr("gpulane.executor.manifests.watch_jobs", watch)

    async def scenario(namespaces: list[str]) -> list[str | None]:
        watched.clear()
        ex = ManifestExecutor(FakeKube(), LEASE, {}, namespaces, models=catalog(PLAIN))  # type: ignore[arg-type]
        ex.start()
        await until(lambda: len(watched) == len(set(namespaces)), "the watches started")
        await ex.stop()
        return sorted(watched)  # type: ignore[type-var]

    assert asyncio.run(scenario(["team-a", "team-b", "team-a"])) == ["team-a", "team-b"]
    assert asyncio.run(scenario([])) == []


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (None, "lane gpu-0 has no backend pod gpulane-system/gpulane-gpu-0"),
        ({"model": "other"}, "pod gpulane-system/gpulane-gpu-0 does not serve model m on lane gpu-0"),
        ({"lane": "gpu-1"}, "does not serve model m on lane gpu-0"),
        ({"ready": False}, "pod gpulane-system/gpulane-gpu-0 is not Ready"),
    ],
)
def test_without_a_ready_pod_of_its_model_on_its_lane_the_call_is_not_sent(pod: dict[str, Any] | None, why: str):
    """Issue 16 item 6: the backend comes from the lane's pod. status.endpoint (FORGED) is never a fallback."""
    sent: list[str] = []

    async def record(request: web.Request) -> web.Response:
        sent.append(request.path)
        return web.json_response({})

    async def scenario() -> FakeKube:
        kube = FakeKube()
        async with backend(record) as url:
            if pod is not None:
                kube.serve(url, **pod)
                if "lane" in pod:  # the pod of another lane, under this lane's pod name
                    kube.pods[f"{kube.namespace}/{pod_name(LANE)}"] = kube.pods.pop(
                        f"{kube.namespace}/{pod_name(pod['lane'])}"
                    )
            ex = ManifestExecutor(kube, LEASE, {}, ["ns"], models=catalog(PLAIN))  # type: ignore[arg-type]
            ex.session = ClientSession()
            ex._seen(running_job("lost", "uid-1"))
            await until(lambda: len(kube.outcomes) == 1, "the outcome")
            await ex.stop()
        return kube

    kube = asyncio.run(scenario())
    written = outcome(kube.outcomes[0][1])
    assert written["phase"] == "Failed", written
    assert written["message"].startswith("the request was not sent: ") and why in written["message"], written
    assert sent == []


def test_the_backend_pod_is_looked_up_in_the_backend_namespace():
    async def scenario() -> FakeKube:
        kube = FakeKube()
        async with backend(ok) as url:
            kube.serve(url)
            kube.pods[f"backends/{pod_name(LANE)}"] = kube.pods.pop(f"{kube.namespace}/{pod_name(LANE)}")
            ex = ManifestExecutor(kube, LEASE, {}, ["ns"], backend_namespace="backends", models=catalog(PLAIN))  # type: ignore[arg-type]
            ex.session = ClientSession()
            ex._seen(running_job("elsewhere", "uid-1"))
            await until(lambda: len(kube.outcomes) == 1, "the outcome")
            await ex.stop()
        return kube

    assert outcome(asyncio.run(scenario()).outcomes[0][1])["phase"] == "Succeeded"


def test_an_answer_with_output_volume_is_streamed_to_a_file_of_any_size(tmp_path: Path) -> None:
    """Issue 23: a video does not fit a ConfigMap; 50 MB lands on the results volume byte for byte."""
    size = 50 * 1024 * 1024

    async def video(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "video/mp4"})
        await resp.prepare(request)
        for chunk in fake_bytes(size):
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    kube = FakeKube()
    asyncio.run(execute(video, kube, ("film", "uid-12345678"), results=ResultStore(tmp_path), output="volume"))
    done = outcome(kube.outcomes[0][1])
    assert done["phase"] == "Succeeded", done
    volume = done["result"]["volume"]
    assert volume["path"] == f"{NS}/film-uid-1234/answer" and volume["bytes"] == size
    expected = hashlib.sha256(b"".join(fake_bytes(size))).hexdigest()
    assert volume["sha256"] == expected
    stored = tmp_path / volume["path"]
    assert stored.stat().st_size == size and hashlib.sha256(stored.read_bytes()).hexdigest() == expected
    assert not list(stored.parent.glob(".*")), "no partial file is left"
    assert done["result"]["contentType"] == "video/mp4" and kube.config_maps == {}


def test_output_volume_without_a_results_volume_fails_the_job_and_sends_nothing() -> None:
    sent: list[str] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        sent.append(request.path)
        return web.json_response({})

    kube = FakeKube()
    asyncio.run(execute(answer, kube, ("film", "uid-1"), output="volume"))
    done = outcome(kube.outcomes[0][1])
    assert done["phase"] == "Failed" and "no results volume (--results-dir)" in done["message"]
    assert sent == []


def test_a_volume_that_cannot_take_the_answer_fails_the_job_and_leaves_no_partial_file(tmp_path: Path) -> None:
    (tmp_path / NS).write_text("not a directory")  # the job's folder cannot be made

    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response({"ok": True})

    kube = FakeKube()
    asyncio.run(execute(answer, kube, ("film", "uid-1"), results=ResultStore(tmp_path), output="volume"))
    done = outcome(kube.outcomes[0][1])
    assert done["phase"] == "Failed" and "could not be stored on the results volume" in done["message"]


def test_answers_of_deleted_jobs_are_removed_and_the_rest_kept(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    for folder in ("a-11111111", "b-22222222"):
        (tmp_path / NS / folder).mkdir(parents=True)
        (tmp_path / NS / folder / "answer").write_bytes(b"x")
    store.remove({"metadata": {"namespace": NS, "name": "a", "uid": "11111111-rest"}})
    assert not (tmp_path / NS / "a-11111111").exists()
    (tmp_path / NS / "c-33333333").mkdir()
    assert store.sweep(NS, {"b-22222222"}) == [f"{NS}/c-33333333"]
    assert (tmp_path / NS / "b-22222222" / "answer").read_bytes() == b"x"
    b = {"metadata": {"namespace": NS, "name": "b", "uid": "22222222-rest"}}
    assert store.path(b, "../../etc/passwd") is None and store.path(b, f"{NS}/b-22222222/answer") is not None
