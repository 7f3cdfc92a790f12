"""The bridge's proxy to a real backend on 127.0.0.1: however the backend's answer ends, the job ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestClient, TestServer

from gpulane.bridge.app import Bridge, BridgeSettings
from gpulane.bridge.catalog import Catalog
from gpulane.bridge.creates import Waiting
from gpulane.bridge.job_queue import JobProgress, Submission
from gpulane.bridge.keys import KeyRing, KeysFile

from .helpers import until

KEY = {"name": "app", "key": "sk-app-000000", "member": "app", "maxPriority": 100}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
AUTH = {"Authorization": f"Bearer {KEY['key']}"}


class RunningQueue:
    """Every job runs at once; what the bridge then does with it is recorded."""

    def __init__(self) -> None:
        self.finished: list[tuple[bool, str | None]] = []
        self.cancelled: list[str] = []

    async def models(self) -> Catalog:
        return Catalog.of({"m"})

    async def submit(self, submission: Submission, waiting: Waiting | None = None) -> str:
        return "job-1"

    async def follow(self, name: str) -> AsyncIterator[JobProgress]:
        yield JobProgress("Running")

    async def finish(self, name: str, succeeded: bool, message: str | None = None) -> None:
        self.finished.append((succeeded, message))

    async def cancel(self, name: str) -> None:
        self.cancelled.append(name)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def proxied(handler: Handler, queue: RunningQueue) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """A backend serving ``handler`` and a bridge in front of it."""
    backend = web.Application()
    backend.router.add_post("/v1/chat/completions", handler)
    async with TestServer(backend) as upstream:
        settings = BridgeSettings(endpoints={"m": str(upstream.make_url("/"))})
        bridge = Bridge(queue, KeyRing(KeysFile.model_validate({"keys": [KEY]})), settings)
        async with TestClient(TestServer(bridge.app())) as http:
            yield http


def test_a_backend_that_disconnects_mid_answer_fails_the_job_at_once():
    async def dropped(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "5000"})
        await resp.prepare(request)
        await resp.write(b'{"choices": [')
        assert request.transport is not None
        request.transport.close()
        return resp

    async def scenario() -> None:
        queue = RunningQueue()
        async with proxied(dropped, queue) as http:
            resp = await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
            with contextlib.suppress(Exception):
                await resp.read()  # cut short: the bridge had already sent the backend's headers
            await until(lambda: bool(queue.finished or queue.cancelled), "the job's end")
        assert queue.cancelled == []
        [(ok, message)] = queue.finished
        assert not ok and message is not None and "the backend failed" in message

    asyncio.run(scenario())


def test_an_event_stream_whose_done_is_split_over_two_chunks_counts_as_answered():
    """The client hangs up on ``[DONE]`` while the backend still holds the connection: the job succeeded."""
    held = asyncio.Event()
    half_seen = asyncio.Event()  # the client has `data: [DO`: the bridge forwarded it as a chunk of its own

    async def split(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n')
        await resp.write(b"data: [DO")
        await half_seen.wait()  # so the rest reaches the bridge's reader as a second chunk
        await resp.write(b"NE]\n\n")
        await held.wait()  # a backend that is slow to close
        return resp

    async def scenario() -> None:
        queue = RunningQueue()
        try:
            async with proxied(split, queue) as http:
                async with ClientSession() as session:
                    url = str(http.make_url("/v1/chat/completions"))
                    async with session.post(url, json={**CHAT, "stream": True}, headers=AUTH) as resp:
                        seen = b""
                        async for chunk in resp.content.iter_any():
                            seen += chunk
                            if seen.endswith(b"data: [DO"):
                                half_seen.set()
                            if seen.endswith(b"data: [DONE]\n\n"):
                                break  # and hang up
                await until(lambda: bool(queue.finished or queue.cancelled), "the job's end")
        finally:
            held.set()
        assert queue.cancelled == [], "the client had the whole answer: its job must not be cancelled"
        assert queue.finished == [(True, None)]

    asyncio.run(scenario())
