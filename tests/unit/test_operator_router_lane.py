"""The operator drives a lane whose pod is a server that holds several models (issue 36): it loads and unloads
them through the server's API as the core decides, starts their jobs on the server's endpoint and learns each
switch's time; a load the server fails fails the job with the reason. The server here answers as llama-server's
router documents it (``test_server_clients.Router``); the real one runs in tests/e2e/test_real_backends.py."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestServer

from gpulane.operator.controller import Controller
from gpulane.operator.settings import Settings

from .test_operator_controller import NS, SYSTEM, World
from .test_server_clients import Router


async def router_world(router: Router) -> tuple[World, TestServer]:
    server = TestServer(router.app(), host="127.0.0.1")
    await server.start_server()
    w = World()
    w.model("llama", port=server.port, router={"protocol": "LlamaServerRouter", "maxLoaded": 3})
    for name, memory in (("alpha", 4000), ("beta", 4000), ("gamma", 6000), ("delta", 1000)):
        w.model(name, server="llama", memoryMib=memory, preset={"model": f"/models/{name}.gguf"})
    w.pod(model="llama", ip="127.0.0.1")  # the server is up, holding nothing yet
    lane = w.kube.put(
        "gpulanes", {"metadata": {"name": "gpu-0", "uid": "lane-uid-gpu-0"}, "spec": {"memoryMib": 10000}}
    )
    w.ctl.lane_event("ADDED", lane)
    return w, server


async def run(w: World, name: str, model: str) -> dict[str, Any]:
    """Submit a job, let the lane act, and end it as its executor would: returns its status while it ran."""
    w.submit(name, model)
    for _ in range(3):
        await w.reconcile()
    status: dict[str, Any] = w.kube.job(name).get("status") or {}
    if status.get("phase") == "Running":
        w.ctl.job_event("MODIFIED", w.executor_finishes(name))
        await w.settle()
    return status


def test_the_lane_switches_models_inside_its_server_and_unloads_what_the_core_evicts() -> None:
    router = Router(["alpha", "beta", "gamma", "delta"])

    async def scenario() -> None:
        w, server = await router_world(router)
        try:
            for name, model in (("j1", "alpha"), ("j2", "beta"), ("j3", "alpha"), ("j4", "gamma")):
                status = await run(w, name, model)
                assert status.get("phase") == "Running", (name, status)
                assert status["endpoint"] == f"http://127.0.0.1:{server.port}"  # the server's, for every model
            learned = w.ctl.observed.learned
            assert learned["beta"]["switches"] == 1 and learned["beta"]["switchSeconds"] >= 0, (learned, router.asked)
            state = w.ctl.dispatcher.lane_state("gpu-0")
            assert state is not None and (state.resident, state.loaded) == ("gamma", frozenset({"alpha"}))
            # The lane's status says what each load cost: the server switched, with no new pod; j3 loaded nothing.
            await w.ctl.status.flush()
            history = {r["job"]: r for r in w.kube.objects["gpulanes/gpu-0"]["status"]["history"]}
            loads = {j: (r["load"], r.get("switch"), r.get("loadSeconds") is not None) for j, r in history.items()}
            assert loads == {f"{NS}/j1": (True, True, True), f"{NS}/j2": (True, True, True),
                             f"{NS}/j3": (False, None, False), f"{NS}/j4": (True, True, True)}  # fmt: skip
        finally:
            await server.close()

    asyncio.run(scenario())
    # j3 found alpha held (no load); gamma's 6,000 MiB fit beside alpha, served last, not beside beta too.
    assert router.asked == [("load", "alpha"), ("load", "beta"), ("unload", "beta"), ("load", "gamma")]


def test_a_model_the_server_cannot_load_fails_its_job_and_the_server_goes_on() -> None:
    """The server's load of delta fails: delta's job fails with the server's words, and the server, still holding
    alpha, keeps serving: no new pod, and alpha's next job loads nothing."""
    router = Router(["alpha", "delta"], broken=frozenset({"delta"}))

    async def scenario() -> dict[str, Any]:
        w, server = await router_world(router)
        try:
            assert (await run(w, "first", "alpha")).get("phase") == "Running"
            await run(w, "bad", "delta")
            status = w.kube.job("bad").get("status") or {}
            state = w.ctl.dispatcher.lane_state("gpu-0")
            assert state is not None and (state.resident, state.loaded) == ("llama", frozenset({"alpha"}))
            asked = len(router.asked)
            assert (await run(w, "again", "alpha")).get("phase") == "Running"
            assert router.asked[asked:] == [] and not w.kube.calls_of("delete_pod")
            return status
        finally:
            await server.close()

    status = asyncio.run(scenario())
    assert (status.get("phase"), status.get("reason")) == ("Failed", "ModelLoadFailed"), status
    assert "exited with code 1" in status["message"]
    assert NS  # the jobs live in the fake's namespace


def test_a_restarted_operator_knows_what_the_server_holds_from_the_lanes_status() -> None:
    """The operator restarts, the server does not: the lane's status (its own last write, for this pod) says
    beta serves with alpha held, so a job for alpha starts with no load asked of the server."""
    router = Router(["alpha", "beta", "gamma", "delta"])

    async def scenario() -> None:
        w, server = await router_world(router)
        try:
            for name, model in (("j1", "alpha"), ("j2", "beta")):
                assert (await run(w, name, model)).get("phase") == "Running"
            await w.ctl.status.flush()
            lane = w.kube.objects["gpulanes/gpu-0"]["status"]
            assert (lane["residentModel"], lane["loaded"], lane["ready"]) == ("beta", ["alpha"], True)
            w.ctl = Controller(w.kube, Settings(namespace=SYSTEM), clock=w.clock)  # the new process
            await w.ctl.rebuild()
            state = w.ctl.dispatcher.lane_state("gpu-0")
            assert state is not None and (state.resident, state.loaded) == ("beta", frozenset({"alpha"}))
            asked = len(router.asked)
            status = await run(w, "j3", "alpha")
            assert status.get("phase") == "Running" and status["score"]["affinity"] > 0, status
            assert router.asked[asked:] == []  # held: nothing to load
        finally:
            await server.close()

    asyncio.run(scenario())


def test_a_lane_status_of_another_pod_or_while_loading_is_not_taken() -> None:
    """What the status says is taken only for the pod that is there, and only as Ready: a server replaced
    meanwhile, or caught in a load, holds nothing the core may count on."""
    router = Router(["alpha", "beta", "gamma", "delta"])

    async def scenario() -> None:
        w, server = await router_world(router)
        try:
            assert (await run(w, "j1", "alpha")).get("phase") == "Running"
            await w.ctl.status.flush()
            lane = w.kube.objects["gpulanes/gpu-0"]
            for stale in ({"pod": "gpulane-gpu-0-old"}, {"ready": False}):
                w.kube.objects["gpulanes/gpu-0"] = {**lane, "status": {**lane["status"], **stale}}
                fresh = Controller(w.kube, Settings(namespace=SYSTEM), clock=w.clock)
                await fresh.rebuild()
                state = fresh.dispatcher.lane_state("gpu-0")
                assert state is not None and (state.resident, state.loaded) == ("llama", frozenset()), stale
        finally:
            await server.close()

    asyncio.run(scenario())
