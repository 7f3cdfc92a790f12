"""A bridge replica told to stop (SIGTERM: a rollout, a drain) takes no new call and fails readiness, and
lets the calls in hand finish; the executor gives back the kubectl jobs it claimed that have not started."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from gpulane.api.contract import EXECUTOR_LEASE
from gpulane.bridge.app import Bridge, BridgeSettings
from gpulane.bridge.catalog import Catalog
from gpulane.bridge.creates import Waiting
from gpulane.bridge.job_queue import JobProgress, Submission
from gpulane.bridge.keys import KeyRing, KeysFile
from gpulane.executor.manifests import ManifestExecutor

from .helpers import until

KEY = {"name": "app", "key": "sk-app-000000", "member": "app", "maxPriority": 100}
AUTH = {"Authorization": f"Bearer {KEY['key']}"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class HeldQueue:
    """Every job waits until the test lets it run; it then ends before it ran (the answer is a 503)."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.submitted = 0

    async def models(self) -> Catalog:
        return Catalog.of({"m"})

    async def submit(self, submission: Submission, waiting: Waiting | None = None) -> str:
        self.submitted += 1
        return f"call-{self.submitted}"

    async def follow(self, name: str) -> AsyncIterator[JobProgress]:
        yield JobProgress("Pending", position=1)
        await self.go.wait()
        yield JobProgress("Failed", reason="Test", message="ended by the test")

    async def finish(self, name: str, succeeded: bool, message: str | None = None) -> None:
        pass

    async def cancel(self, name: str) -> None:
        raise AssertionError("a call in hand must not be cancelled by the drain")


def test_a_draining_bridge_refuses_new_calls_fails_readiness_and_finishes_the_calls_in_hand() -> None:
    async def scenario() -> None:
        queue = HeldQueue()
        bridge = Bridge(queue, KeyRing(KeysFile.model_validate({"keys": [KEY]})), BridgeSettings())
        async with TestClient(TestServer(bridge.app())) as http:
            in_hand = asyncio.create_task(http.post("/v1/chat/completions", json=CHAT, headers=AUTH))
            await until(lambda: queue.submitted == 1, "the first call queued")
            drained = asyncio.create_task(bridge.drain(30))
            await until(lambda: bridge.draining, "the drain begun")
            assert (await http.get("/readyz")).status == 503
            late = await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
            assert late.status == 503 and late.headers["Retry-After"] == "1"
            assert (await late.json())["error"]["code"] == "draining"
            assert queue.submitted == 1, "the late call made no job"
            assert not drained.done(), "the drain waits for the call in hand"
            queue.go.set()
            first = await in_hand
            assert first.status == 503 and "ended by the test" in (await first.json())["error"]["message"]
            assert await asyncio.wait_for(drained, 5) == 0

    asyncio.run(scenario())


def test_a_drain_gives_up_at_its_deadline_with_the_calls_still_in_hand() -> None:
    async def scenario() -> None:
        queue = HeldQueue()
        bridge = Bridge(queue, KeyRing(KeysFile.model_validate({"keys": [KEY]})), BridgeSettings())
        async with TestClient(TestServer(bridge.app())) as http:
            in_hand = asyncio.create_task(http.post("/v1/chat/completions", json=CHAT, headers=AUTH))
            await until(lambda: queue.submitted == 1, "the call queued")
            assert await bridge.drain(0.3) == 1
            queue.go.set()
            await in_hand

    asyncio.run(scenario())


class PatchRecorder:
    namespace = "gpulane-system"

    def __init__(self) -> None:
        self.patches: list[tuple[str, str, Any]] = []

    async def patch_job(self, namespace: str, name: str, patch: Any) -> dict[str, Any]:
        self.patches.append((namespace, name, patch))
        return {}


async def no_models() -> Catalog:
    return Catalog.of(())


def test_a_draining_executor_claims_nothing_and_gives_back_what_has_not_started() -> None:
    async def scenario() -> None:
        kube = PatchRecorder()
        executor = ManifestExecutor(kube, "bridge-a", {}, ["team"], models=no_models)  # type: ignore[arg-type]
        ours = f"{kube.namespace}/bridge-a"

        def job(name: str, uid: str, phase: str, claimed: str | None) -> dict[str, Any]:
            annotations = {EXECUTOR_LEASE: claimed} if claimed else {}
            meta = {"name": name, "namespace": "team", "uid": uid, "resourceVersion": "7", "annotations": annotations}
            return {"metadata": meta, "spec": {"model": "m", "request": {"path": "/v1/x"}}, "status": {"phase": phase}}

        executor._seen(job("queued", "u1", "Pending", ours))
        await executor.drain(1)
        executor._seen(job("new", "u2", "Pending", None))  # unclaimed: left for another replica
        await asyncio.sleep(0)
        [(namespace, name, patch)] = kube.patches
        assert (namespace, name) == ("team", "queued")
        assert patch == {"metadata": {"resourceVersion": "7", "annotations": {EXECUTOR_LEASE: None}}}

    asyncio.run(scenario())
