"""Servers that answer with a ticket (GpuModel spec.ticket, gpulane/bridge/tickets.py), against the fake
backend's ComfyUI protocol (gpulane/fakes/comfy.py): the executor and the bridge hold the job until the
render is done, and the answer is the finished render's. Also a job's request on every route
(gpulane/executor/job_calls.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient, TestServer

from gpulane.api.resources import Ticket
from gpulane.bridge.app import Bridge, BridgeSettings
from gpulane.bridge.calls import form_field
from gpulane.bridge.catalog import Catalog, ServedModel
from gpulane.bridge.keys import KeyRing, KeysFile
from gpulane.bridge.tickets import TicketError, lookup, settle
from gpulane.executor.job_calls import job_call
from gpulane.executor.manifests import RESULT_KEY, ManifestExecutor
from gpulane.fakes.backend import FakeBackendConfig, make_app
from gpulane.fakes.comfy import FAILING_NODE

from .helpers import until
from .test_bridge_executor import LEASE, FakeKube, catalog, outcome, running_job
from .test_bridge_routes import AUTH, KEY, Queue

RENDER = {"3": {"class_type": "KSampler", "inputs": {"seed": 7}}, "9": {"class_type": "SaveImage", "inputs": {}}}
COMFY = Ticket(interval_seconds=0.1)


@contextlib.asynccontextmanager
async def comfy(render_seconds: float = 0.3) -> AsyncIterator[str]:
    """The fake backend, answering ComfyUI's protocol; yields its URL."""
    async with TestServer(make_app(FakeBackendConfig(models=[], render_seconds=render_seconds))) as server:
        yield str(server.make_url("")).rstrip("/")


async def first_answer(session: ClientSession, url: str, prompt: dict[str, Any]) -> bytes:
    async with session.post(url + "/prompt", json={"prompt": prompt, "client_id": "c1"}) as resp:
        assert resp.status == 200
        return await resp.read()


def test_the_fake_answers_comfyuis_shapes_and_settle_waits_for_the_render() -> None:
    async def scenario() -> None:
        async with comfy() as url, ClientSession() as session:
            first = await first_answer(session, url, RENDER)
            ticket = json.loads(first)
            assert set(ticket) == {"prompt_id", "number", "node_errors"} and ticket["node_errors"] == {}
            async with session.get(f"{url}/history/{ticket['prompt_id']}") as early:
                assert await early.json() == {}  # not done yet: ComfyUI answers an empty object
            settled = await settle(session, url, COMFY, first)
            entry = json.loads(settled.answer)[ticket["prompt_id"]]
            assert entry["status"]["status_str"] == "success" and entry["status"]["completed"] is True
            assert entry["prompt"][1] == ticket["prompt_id"] and entry["prompt"][4] == ["9"]
            image = entry["outputs"]["9"]["images"][0]
            assert set(image) == {"filename", "subfolder", "type"} and image["type"] == "output"
            async with session.get(f"{url}/view", params={"filename": image["filename"]}) as view:
                assert view.status == 200 and view.content_type == "image/png"

    asyncio.run(scenario())


def test_a_failed_render_a_poll_that_fails_and_a_render_past_its_limit_are_errors() -> None:
    async def scenario() -> None:
        async with comfy(render_seconds=0.1) as url, ClientSession() as session:
            failing = {**RENDER, "5": {"class_type": FAILING_NODE, "inputs": {}}}
            with pytest.raises(TicketError, match=r"failed \(\{ticket\}.status.status_str: error\)"):
                await settle(session, url, COMFY, await first_answer(session, url, failing))
            with pytest.raises(TicketError, match="answered 404"):
                await settle(session, url, Ticket(poll="/nowhere/{ticket}"), await first_answer(session, url, RENDER))
            with pytest.raises(TicketError, match="has no ticket at 'id'"):
                await settle(session, url, Ticket(field="id"), await first_answer(session, url, RENDER))
        async with comfy(render_seconds=30) as url, ClientSession() as session:
            now = [0.0]

            async def tick(seconds: float) -> None:
                now[0] += seconds

            with pytest.raises(TicketError, match="was not done after 5 s"):
                await settle(session, url, Ticket(timeout_seconds=5), await first_answer(session, url, RENDER),
                             sleep=tick, clock=lambda: now[0])  # fmt: skip

    asyncio.run(scenario())


def test_lookup_follows_dotted_fields_and_keeps_a_ticket_with_a_dot_whole() -> None:
    answer = {"a.b": {"status": {"status_str": "error"}}}
    assert lookup(answer, "{ticket}.status.status_str", "a.b") == "error"
    assert lookup(answer, "{ticket}.missing.deeper", "a.b") is None and lookup([], "x", "") is None


def test_the_executor_holds_the_job_until_the_render_is_done_and_stores_the_finished_render() -> None:
    async def scenario() -> FakeKube:
        kube = FakeKube()
        async with comfy() as url:
            kube.serve(url, model="m")
            models = Catalog([ServedModel("m", ticket=COMFY)])
            ex = ManifestExecutor(kube, LEASE, {}, ["ns"], models=catalog(models))  # type: ignore[arg-type]
            ex.session = ClientSession()
            try:
                job = running_job("render", "uid-1", path="/upstream/m/prompt")
                job["spec"]["request"]["body"] = {"prompt": RENDER}
                ex._seen(job)
                await until(lambda: kube.outcomes, "the render's outcome")
            finally:
                await ex.stop()
        return kube

    kube = asyncio.run(scenario())
    done = outcome(kube.outcomes[0][1])
    assert done["phase"] == "Succeeded", done
    stored = json.loads(next(iter(kube.config_maps.values()))["data"][RESULT_KEY])
    (entry,) = stored.values()  # the finished render's history entry, not the ticket
    assert entry["status"]["completed"] is True and entry["outputs"]["9"]["images"]


def test_the_bridge_answers_a_ticket_call_with_the_finished_render_and_a_failed_one_with_502() -> None:
    async def scenario() -> None:
        async with comfy() as url:
            queue = Queue(Catalog([ServedModel("comfy", ticket=COMFY)]))
            settings = BridgeSettings(endpoints={"comfy": url})
            bridge = Bridge(queue, KeyRing(KeysFile.model_validate({"keys": [KEY]})), settings)
            async with TestClient(TestServer(bridge.app())) as http:
                resp = await http.post("/upstream/comfy/prompt", json={"prompt": RENDER}, headers=AUTH)
                assert resp.status == 200, await resp.text()
                (entry,) = (await resp.json()).values()
                assert entry["status"]["status_str"] == "success" and entry["outputs"]["9"]["images"]
                failing = {**RENDER, "5": {"class_type": FAILING_NODE}}
                failed = await http.post("/upstream/comfy/prompt", json={"prompt": failing}, headers=AUTH)
                error = (await failed.json())["error"]
                assert failed.status == 502 and "failed" in error["message"] and error["type"] == "server_error"
                # Any other call to the server is answered as it comes: its history, a 400 for no prompt.
                bad = await http.post("/upstream/comfy/prompt", json={}, headers=AUTH)
                assert bad.status == 400 and (await bad.json())["error"] == "no prompt"
        assert queue.finished == [True, False, False]

    asyncio.run(scenario())


def test_a_jobs_request_becomes_the_bridges_call_on_every_kind_of_route() -> None:
    chat = job_call({"path": "/v1/chat/completions", "body": {"messages": []}}, "m", 1 << 20)
    assert chat.source == "json" and json.loads(chat.body)["model"] == "m"
    versionless = job_call({"path": "/v/embeddings", "body": {"input": "x", "model": "other"}}, "m", 1 << 20)
    assert versionless.target == "/embeddings" and json.loads(versionless.body)["model"] == "m"
    loras = job_call({"method": "GET", "path": "/sdapi/v1/loras", "body": {"refresh": True}}, "sd", 1 << 20)
    assert loras.target == "/sdapi/v1/loras?refresh=true&model=sd" and loras.body == b""
    upstream = job_call({"method": "GET", "path": "/upstream/m/history/abc"}, "m", 1 << 20)
    assert (upstream.method, upstream.target, upstream.body) == ("GET", "/history/abc", b"")
    audio = {"file": {"dataBase64": "AAEC", "filename": "a.wav"}, "language": "en"}
    form = job_call({"path": "/v1/audio/transcriptions", "body": audio}, "w", 1 << 20)
    assert form.source == "form" and form_field(form.content_type, form.body, "model") == "w"
    assert form_field(form.content_type, form.body, "language") == "en" and b'filename="a.wav"' in form.body
    with pytest.raises(ValueError, match="another model's server"):
        job_call({"path": "/upstream/x/prompt"}, "m", 1 << 20)
