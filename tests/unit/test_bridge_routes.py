"""The routes the bridge takes over from llama-swap (gpulane/api/routes.py): every path llama-swap
dispatches by model, where each finds its model, and what the model server receives, through a real bridge
in front of a real aiohttp backend that records each request."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from gpulane.api import routes
from gpulane.bridge.app import Bridge, BridgeSettings
from gpulane.bridge.calls import CallError, read_call
from gpulane.bridge.catalog import Catalog
from gpulane.bridge.creates import Waiting
from gpulane.bridge.job_queue import JobProgress, LaneView, Submission
from gpulane.bridge.keys import KeyRing, KeysFile

KEY = {"name": "app", "key": "sk-app-000000", "member": "app", "maxPriority": 100}
AUTH = {"Authorization": f"Bearer {KEY['key']}"}


class Queue:
    """Every job runs at once; submissions and ends are recorded."""

    def __init__(self, catalog: Catalog | None = None) -> None:
        self.submitted: list[Submission] = []
        self.finished: list[bool] = []
        self.catalog = catalog or Catalog.of({"m", "sd"})
        self.loaded: set[str] = set()  # models Ready on a lane, served at ``url``
        self.url = ""

    async def models(self) -> Catalog:
        return self.catalog

    async def lanes(self) -> list[LaneView]:
        return [LaneView("gpu-0", "m", True), LaneView("gpu-1", "sd", False), LaneView("gpu-2", None, False)]

    async def resident(self, model: str) -> str | None:
        return self.url if model in self.loaded else None

    async def submit(self, submission: Submission, waiting: Waiting | None = None) -> str:
        self.submitted.append(submission)
        return f"job-{len(self.submitted)}"

    async def follow(self, name: str) -> AsyncIterator[JobProgress]:
        yield JobProgress("Running")

    async def finish(self, name: str, succeeded: bool, message: str | None = None) -> None:
        self.finished.append(succeeded)

    async def cancel(self, name: str) -> None:
        raise AssertionError("no call here is cancelled")


@contextlib.asynccontextmanager
async def bridged(
    catalog: Catalog | None = None, **settings: Any
) -> AsyncIterator[tuple[TestClient[web.Request, web.Application], list[dict[str, Any]], Queue]]:
    """A backend that echoes every request's method, path, query and body, and a bridge in front of it."""
    seen: list[dict[str, Any]] = []

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append({"method": request.method, "path": request.path, "query": request.query_string, "body": body})
        return web.json_response({"path": request.path})

    backend = web.Application()
    backend.router.add_route("*", "/{tail:.*}", echo)
    queue = Queue(catalog)
    async with TestServer(backend) as upstream:
        url = str(upstream.make_url("/"))
        queue.url = url
        config = BridgeSettings(endpoints=dict.fromkeys(queue.catalog.models, url), **settings)
        bridge = Bridge(queue, KeyRing(KeysFile.model_validate({"keys": [KEY]})), config)
        async with TestClient(TestServer(bridge.app())) as http:
            yield http, seen, queue


@pytest.mark.parametrize("path", routes.JSON_ROUTES)
def test_every_json_route_of_llama_swap_is_a_queued_call_by_the_bodys_model(path: str) -> None:
    async def scenario() -> None:
        async with bridged() as (http, seen, queue):
            resp = await http.post(path, json={"model": "sd", "prompt": "a lighthouse"}, headers=AUTH)
            assert resp.status == 200, await resp.text()
        assert [s.model for s in queue.submitted] == ["sd"] and queue.finished == [True]
        assert seen[0]["method"] == "POST" and seen[0]["path"] == path
        assert b'"prompt": "a lighthouse"' in seen[0]["body"]

    asyncio.run(scenario())


@pytest.mark.parametrize("path", routes.VERSIONLESS_ROUTES)
def test_a_versionless_route_reaches_the_server_without_its_v(path: str) -> None:
    async def scenario() -> None:
        async with bridged() as (http, seen, _):
            resp = await http.post(path, json={"model": "m", "messages": []}, headers=AUTH)
            assert resp.status == 200
        assert seen[0]["path"] == path.removeprefix("/v") and not seen[0]["path"].startswith("/v/")

    asyncio.run(scenario())


def test_get_routes_take_the_model_from_the_query_and_pass_the_query_on() -> None:
    async def scenario() -> None:
        async with bridged() as (http, seen, queue):
            resp = await http.get("/sdapi/v1/loras?model=sd&refresh=1", headers=AUTH)
            assert resp.status == 200
            missing = await http.get("/v1/audio/voices", headers=AUTH)
            assert missing.status == 400 and "needs the model as ?model=" in (await missing.json())["error"]["message"]
        assert (seen[0]["method"], seen[0]["path"], seen[0]["query"]) == (
            "GET",
            "/sdapi/v1/loras",
            "model=sd&refresh=1",
        )
        assert [s.model for s in queue.submitted] == ["sd"]

    asyncio.run(scenario())


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE"])
def test_upstream_passes_any_method_to_any_path_of_the_named_model_queued_like_a_call(method: str) -> None:
    async def scenario() -> None:
        async with bridged() as (http, seen, queue):
            resp = await http.request(method, "/upstream/sd/api/v1/queue/status?verbose=1", data=b"raw bytes",
                                      headers={**AUTH, "Content-Type": "application/octet-stream"})  # fmt: skip
            assert resp.status == 200, await resp.text()
            unknown = await http.get("/upstream/nope/x", headers=AUTH)
            assert unknown.status == 404 and "'nope' does not exist" in (await unknown.json())["error"]["message"]
        assert [s.model for s in queue.submitted] == ["sd"]
        sent = seen[0]
        assert (sent["method"], sent["path"], sent["query"]) == (method, "/api/v1/queue/status", "verbose=1")
        assert sent["body"] == (b"raw bytes" if method != "GET" else sent["body"])

    asyncio.run(scenario())


def test_an_ignored_upstream_path_skips_the_queue_only_while_its_model_is_resident() -> None:
    """llama-swap's upstream.ignorePaths: a web UI's static files load without a job while the model
    serves; the same path queues as any call when it does not, and other paths always queue."""

    async def scenario() -> None:
        async with bridged(upstream_ignore=(re.compile(r"\.(js|css)$"),)) as (http, seen, queue):
            queue.loaded.add("sd")
            assert (await http.get("/upstream/sd/assets/app.js?v=2", headers=AUTH)).status == 200
            assert queue.submitted == [] and queue.finished == [], "no job for a static file of a resident model"
            assert (await http.get("/upstream/sd/api/status", headers=AUTH)).status == 200
            assert [s.model for s in queue.submitted] == ["sd"], "a path that does not match queues"
            assert (await http.get("/upstream/m/style.css", headers=AUTH)).status == 200
            assert [s.model for s in queue.submitted] == ["sd", "m"], "a model not loaded queues, ignored path or not"
            assert (await http.get("/upstream/sd/app.js")).status == 401, "the key is still checked"
        assert [(s["path"], s["query"]) for s in seen] == [
            ("/assets/app.js", "v=2"), ("/api/status", ""), ("/style.css", "")
        ]  # fmt: skip

    asyncio.run(scenario())


def test_llama_swaps_own_health_and_running_endpoints() -> None:
    async def scenario() -> None:
        async with bridged() as (http, _, queue):
            assert await (await http.get("/health")).text() == "OK"
            running = await http.get("/running", headers=AUTH)
            assert await running.json() == {"running": [
                {"model": "m", "state": "ready", "lane": "gpu-0"},
                {"model": "sd", "state": "starting", "lane": "gpu-1"},
            ]}  # fmt: skip
            assert (await http.get("/running")).status == 401, "who runs what is for key holders"
        assert queue.submitted == []

    asyncio.run(scenario())


def test_a_route_llama_swap_does_not_dispatch_is_a_404_naming_it() -> None:
    with pytest.raises(CallError, match="unknown endpoint POST /v1/models/extra") as err:
        read_call("/v1/models/extra", "application/json", b"{}", 100)
    assert err.value.status == 404
    with pytest.raises(CallError, match="unknown endpoint GET /sdapi/v1/txt2img"):
        read_call("/sdapi/v1/txt2img", "", b"", 100, method="GET")
    assert routes.route("GET", "/upstream/") is None, "an upstream path must name its model"


@pytest.mark.parametrize(
    "path",
    ["/upstream/sd/health/%2e%2e/v1/chat/completions", "/upstream/sd/health/%2E%2E/v1/chat/completions",
     "/upstream/sd/health/%2e/x", "/upstream/sd/health//x", "/upstream/sd/health%3F/x", "/upstream/sd/health%23x"],
)  # fmt: skip
def test_an_upstream_path_with_dot_or_empty_segments_is_refused_not_resolved(path: str) -> None:
    """issue 34's M1: with /health ignored, /health/../v1/chat/completions matched the ignored path and
    reached the server, once resolved, as /v1/chat/completions, with no job and no priority."""

    async def scenario() -> None:
        async with bridged(upstream_ignore=(re.compile(r"^/health"),)) as (http, seen, queue):
            queue.loaded.add("sd")
            resp = await http.post(URL(path, encoded=True), json={"model": "sd"}, headers=AUTH)
            assert resp.status == 400, await resp.text()
            error = (await resp.json())["error"]
            assert error["code"] == "bad_path" and "is refused" in error["message"], error
            assert (await http.get("/upstream/sd/health", headers=AUTH)).status == 200, "a plain ignored path passes"
        assert queue.submitted == [] and [s["path"] for s in seen] == ["/health"]

    asyncio.run(scenario())
