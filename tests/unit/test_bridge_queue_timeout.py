"""X-Gpulane-Queue-Timeout (issue 18, part 2): the caller's deadline goes on its GpuJob, a bad value is a
400 before anything exists, and a job that expired in the queue is answered as OpenAI clients expect:
a 503 with a retry hint, or an error event on a stream that had started. X-Gpulane-Max-Run-Seconds
lowers the bridge's --max-run-seconds for one call, and is refused the same way when malformed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpulane.api.run_limits import MAX_RUN_SECONDS
from gpulane.bridge.app import Bridge, BridgeSettings
from gpulane.bridge.catalog import Catalog
from gpulane.bridge.creates import Waiting
from gpulane.bridge.job_queue import JobProgress, Submission
from gpulane.bridge.keys import KeyRing, KeysFile

KEY = {"name": "app", "key": "sk-app-000000", "member": "app", "maxPriority": 100}
AUTH = {"Authorization": f"Bearer {KEY['key']}"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
EXPIRED = JobProgress(
    "Failed", reason="QueueTimeout", message="still waiting at its queue deadline, 30s after it was created"
)


class ExpiringQueue:
    """Every job waits once (position 3), then expires in the queue."""

    def __init__(self) -> None:
        self.submissions: list[Submission] = []

    async def models(self) -> Catalog:
        return Catalog.of({"m"})

    async def submit(self, submission: Submission, waiting: Waiting | None = None) -> str:
        self.submissions.append(submission)
        return f"call-{len(self.submissions)}"

    async def follow(self, name: str) -> AsyncIterator[JobProgress]:
        yield JobProgress("Pending", position=3)
        yield EXPIRED

    async def finish(self, name: str, succeeded: bool, message: str | None = None) -> None:
        raise AssertionError("an expired job has no outcome to write")

    async def cancel(self, name: str) -> None:
        raise AssertionError("an expired job is not cancelled")


def bridge(queue: ExpiringQueue) -> Bridge:
    return Bridge(queue, KeyRing(KeysFile.model_validate({"keys": [KEY]})), BridgeSettings())


def test_the_header_becomes_the_jobs_queue_timeout_and_an_expiry_is_a_503_with_retry_after() -> None:
    async def scenario() -> None:
        queue = ExpiringQueue()
        async with TestClient(TestServer(bridge(queue).app())) as http:
            resp = await http.post("/v1/chat/completions", json=CHAT, headers={**AUTH, "X-Gpulane-Queue-Timeout": "30"})
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "1"
            error = (await resp.json())["error"]
            assert (error["type"], error["code"]) == ("server_error", "queue_timeout")
            assert "ended Failed before it ran: still waiting at its queue deadline" in error["message"]
            await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert [s.queue_timeout_seconds for s in queue.submissions] == [30, None]

    asyncio.run(scenario())


def test_on_a_stream_the_expiry_is_an_error_event() -> None:
    async def scenario() -> None:
        async with TestClient(TestServer(bridge(ExpiringQueue()).app())) as http:
            resp = await http.post("/v1/chat/completions", json={**CHAT, "stream": True},
                                   headers={**AUTH, "X-Gpulane-Queue-Timeout": "30"})  # fmt: skip
            assert resp.status == 200  # the stream started while the job waited
            events = [line for line in (await resp.text()).splitlines() if line.startswith("data: ")]
            error = json.loads(events[-1].removeprefix("data: "))["error"]
            assert error["code"] == "queue_timeout"

    asyncio.run(scenario())


@pytest.mark.parametrize("header", ["X-Gpulane-Queue-Timeout", "X-Gpulane-Max-Run-Seconds"])
@pytest.mark.parametrize("value", ["0", "-5", "1.5", "soon", "", str(MAX_RUN_SECONDS + 1), "٣"])
def test_a_bad_header_is_a_400_and_no_job_is_created(header: str, value: str) -> None:
    async def scenario() -> None:
        queue = ExpiringQueue()
        async with TestClient(TestServer(bridge(queue).app())) as http:
            resp = await http.post("/v1/chat/completions", json=CHAT, headers={**AUTH, header: value})
            assert resp.status == 400
            error = (await resp.json())["error"]
            assert error["param"] == header
            assert f"must be a whole number of seconds from 1 to {MAX_RUN_SECONDS}" in error["message"]
        assert queue.submissions == []

    asyncio.run(scenario())


def test_a_call_may_lower_its_run_limit_but_never_raise_it() -> None:
    async def scenario() -> None:
        queue = ExpiringQueue()
        app = Bridge(queue, KeyRing(KeysFile.model_validate({"keys": [KEY]})), BridgeSettings(max_run_seconds=600))
        async with TestClient(TestServer(app.app())) as http:
            for asked in ("120", "6000", None):
                headers = AUTH if asked is None else {**AUTH, "X-Gpulane-Max-Run-Seconds": asked}
                await http.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert [s.max_run_seconds for s in queue.submissions] == [120, 600, 600]

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("reason", "code"), [("MemberQueueFull", "member_queue_full"), ("NamespaceQueueFull", "namespace_queue_full")]
)
def test_a_job_refused_for_a_full_queue_is_a_429_that_says_which(reason: str, code: str) -> None:
    """Issue 34's L5: the GpuPolicy's maxPendingPerMember (or maxPendingPerNamespace) refused the call's job on
    arrival: the caller gets a 429 with Retry-After, as for the bridge's own caps, not a 503."""

    class FullQueue(ExpiringQueue):
        async def follow(self, name: str) -> AsyncIterator[JobProgress]:
            yield JobProgress("Failed", reason=reason, message="member app already has 2 jobs waiting")

    async def scenario() -> None:
        async with TestClient(TestServer(bridge(FullQueue()).app())) as http:
            resp = await http.post("/v1/chat/completions", json=CHAT, headers=AUTH)
            error = (await resp.json())["error"]
            assert (resp.status, resp.headers["Retry-After"]) == (429, "1")
            assert (error["type"], error["code"]) == ("rate_limit_error", code)

    asyncio.run(scenario())
