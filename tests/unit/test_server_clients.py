"""The clients of servers that switch models (issue 36), against small servers that answer as the documented
routes do: llama-server's router (``GET /models``, ``POST /models/load|unload``) and vLLM's sleep mode
(``POST /sleep``, ``POST /wake_up``, ``GET /is_sleeping``). The router client also runs against the real
binary in ``tests/e2e/test_llama_router.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from gpulane.servers.llama_router import LoadFailed, RouterClient, RouterError, statuses
from gpulane.servers.vllm_sleep import SleepClient, SleepError


class Router:
    """Models as llama-server lists them; a load takes ``steps`` polls, and ``broken`` ones exit with 1."""

    def __init__(self, names: list[str], broken: frozenset[str] = frozenset(), steps: int = 2) -> None:
        self.status = {name: {"value": "unloaded"} for name in names}
        self.broken, self.steps, self.pending = broken, steps, {}
        self.asked: list[tuple[str, str]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/models", self.models)
        app.router.add_post("/models/load", self.load)
        app.router.add_post("/models/unload", self.unload)
        return app

    async def models(self, request: web.Request) -> web.Response:
        for name in list(self.pending):
            self.pending[name] -= 1
            if self.pending[name] <= 0:
                del self.pending[name]
                failed = name in self.broken
                self.status[name] = (
                    {"value": "unloaded", "failed": True, "exit_code": 1} if failed else {"value": "loaded"}
                )
        return web.json_response({"data": [{"id": n, "object": "model", "status": s} for n, s in self.status.items()]})

    async def load(self, request: web.Request) -> web.Response:
        name = (await request.json())["model"]
        self.asked.append(("load", name))
        if name not in self.status:
            return web.json_response({"error": {"message": "File Not Found", "code": 404}}, status=404)
        self.status[name], self.pending[name] = {"value": "loading"}, self.steps
        return web.json_response({"success": True})

    async def unload(self, request: web.Request) -> web.Response:
        name = (await request.json())["model"]
        self.asked.append(("unload", name))
        self.status[name] = {"value": "unloaded"}
        return web.json_response({"success": True})


def serving(app: web.Application, check: Callable[[str, ClientSession], Awaitable[None]]) -> None:
    async def main() -> None:
        async with TestServer(app) as server, ClientSession() as session:
            await check(str(server.make_url("/")), session)

    asyncio.run(main())


def test_a_load_is_asked_then_waited_for_until_the_router_lists_it_loaded() -> None:
    router = Router(["alpha", "beta"])

    async def check(url: str, session: ClientSession) -> None:
        client = RouterClient(url, session)
        assert {n: s.value for n, s in (await client.models()).items()} == {"alpha": "unloaded", "beta": "unloaded"}
        await client.load("alpha")
        assert (await client.models())["alpha"].value == "loading"
        assert await client.wait_loaded("alpha", timeout=5, poll=0.001) >= 0
        await client.unload("alpha")
        assert (await client.models())["alpha"].value == "unloaded"

    serving(router.app(), check)
    assert router.asked == [("load", "alpha"), ("unload", "alpha")]


def test_a_model_whose_process_exits_is_a_failed_load_with_its_exit_code() -> None:
    router = Router(["broken"], broken=frozenset({"broken"}))

    async def check(url: str, session: ClientSession) -> None:
        client = RouterClient(url, session)
        await client.load("broken")
        with pytest.raises(LoadFailed, match="exited with code 1"):
            await client.wait_loaded("broken", timeout=5, poll=0.001)

    serving(router.app(), check)


def test_an_unknown_model_and_a_load_that_never_ends_are_errors_that_say_so() -> None:
    router = Router(["slow"], steps=10**9)

    async def check(url: str, session: ClientSession) -> None:
        client = RouterClient(url, session)
        with pytest.raises(RouterError, match="404"):
            await client.load("nope")
        with pytest.raises(RouterError, match="does not list model 'nope'"):
            await client.wait_loaded("nope", timeout=1)
        await client.load("slow")
        with pytest.raises(TimeoutError, match=r"'slow' still loading after 0\.05s"):
            await client.wait_loaded("slow", timeout=0.05, poll=0.01)

    serving(router.app(), check)


def test_a_server_that_is_gone_is_a_router_error() -> None:
    async def main() -> None:
        async with ClientSession() as session:
            with pytest.raises(RouterError, match="GET /models"):
                await RouterClient("http://127.0.0.1:9", session, timeout=2).models()

    asyncio.run(main())


def test_statuses_reads_what_get_models_documents() -> None:
    body: Any = {
        "data": [
            {"id": "a", "status": {"value": "loaded", "args": ["llama-server"]}},
            {"id": "b", "status": {"value": "unloaded", "failed": True, "exit_code": 1}},
            {"id": "c", "status": {"value": "sleeping"}},
        ]
    }
    got = statuses(body)
    assert [(s.value, s.failed, s.exit_code) for s in got.values()] == [
        ("loaded", False, None),
        ("unloaded", True, 1),
        ("sleeping", False, None),
    ]
    assert statuses(None) == {} and statuses({"data": None}) == {}


# -- vLLM's sleep mode ------------------------------------------------------------------------------


def vllm() -> tuple[web.Application, list[str]]:
    asked: list[str] = []
    state = {"sleeping": False}
    app = web.Application()

    async def sleep(request: web.Request) -> web.Response:
        asked.append(f"sleep {request.query.get('level', '1')}")
        state["sleeping"] = True
        return web.Response(status=200)  # no body, as vLLM answers

    async def wake_up(request: web.Request) -> web.Response:
        asked.append("wake_up")
        state["sleeping"] = False
        return web.Response(status=200)

    async def is_sleeping(request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": state["sleeping"]})

    app.router.add_post("/sleep", sleep)
    app.router.add_post("/wake_up", wake_up)
    app.router.add_get("/is_sleeping", is_sleeping)
    return app, asked


def test_vllm_sleeps_at_a_level_and_wakes_up() -> None:
    app, asked = vllm()

    async def check(url: str, session: ClientSession) -> None:
        client = SleepClient(url, session)
        assert await client.is_sleeping() is False
        await client.sleep(1)
        assert await client.is_sleeping() is True
        await client.wake_up()
        assert await client.is_sleeping() is False
        with pytest.raises(ValueError, match="level 1 or 2"):
            await client.sleep(3)

    serving(app, check)
    assert asked == ["sleep 1", "wake_up"]


def test_vllm_without_dev_mode_has_no_sleep_routes() -> None:
    async def check(url: str, session: ClientSession) -> None:
        with pytest.raises(SleepError, match="404"):
            await SleepClient(url, session).sleep(1)

    serving(web.Application(), check)
