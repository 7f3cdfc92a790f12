"""A job the cluster refuses (an admission webhook, the schema, an outage): the caller gets an OpenAI error
with the cluster's message, and the call leaves no trace in the bridge's queue counts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer
from kubernetes.aio.client.exceptions import ApiException

from gpulane.bridge.app import Bridge, BridgeSettings
from gpulane.bridge.calls import CallError
from gpulane.bridge.catalog import Catalog
from gpulane.bridge.creates import Waiting
from gpulane.bridge.job_queue import JobProgress, Submission, _refusal
from gpulane.bridge.keys import KeyRing, KeysFile

KEY = {"name": "app", "key": "sk-app-000000", "member": "app", "maxPriority": 100}
DENIED = "admission webhook \"gpujob-defaults.gpulane.io\" denied the request: may not submit as member 'app'"


def api_error(status: int, message: str) -> ApiException:
    err = ApiException(status=status, reason="Refused")
    err.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return err


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [(403, 403, "permission_error"), (422, 400, "invalid_request_error"), (500, 503, "server_error")],
)
def test_the_apiservers_refusal_becomes_an_openai_error(status: int, code: int, kind: str) -> None:
    err = _refusal(api_error(status, DENIED))
    assert (err.status, err.kind) == (code, kind)
    assert DENIED in str(err)


def test_a_refusal_without_a_status_body_keeps_the_reason() -> None:
    err = ApiException(status=403, reason="Forbidden")
    err.body = "not json"
    assert "Forbidden" in str(_refusal(err))


class RefusingQueue:
    """The cluster refuses every job."""

    async def models(self) -> Catalog:
        return Catalog.of({"m"})

    async def submit(self, submission: Submission, waiting: Waiting | None = None) -> str:
        raise CallError(403, f"the cluster refused the job: {DENIED}", kind="permission_error")

    async def follow(self, name: str) -> AsyncIterator[JobProgress]:
        raise AssertionError("a refused job is never followed")
        yield  # pragma: no cover

    async def finish(self, name: str, succeeded: bool, message: str | None = None) -> None:
        raise AssertionError("a refused job is never finished")

    async def cancel(self, name: str) -> None:
        raise AssertionError("a refused job is never cancelled")


def test_a_refused_job_is_an_openai_error_and_frees_its_queue_slot() -> None:
    async def scenario() -> None:
        bridge = Bridge(RefusingQueue(), KeyRing(KeysFile.model_validate({"keys": [KEY]})),
                        BridgeSettings(max_queued_per_member=1))  # fmt: skip
        async with TestClient(TestServer(bridge.app())) as http:
            for _ in range(3):  # over the per-member cap of 1 if a refused call kept its slot
                resp = await http.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                    headers={"Authorization": f"Bearer {KEY['key']}"},
                )
                assert resp.status == 403
                error = (await resp.json())["error"]
                assert error["type"] == "permission_error" and DENIED in error["message"]
        assert sum(bridge._queued.values()) == 0

    asyncio.run(scenario())


@pytest.mark.parametrize(("headers", "status"), [({}, 401), ({"Authorization": "Bearer sk-wrong-000000"}, 401),
                                                 ({"Authorization": f"Bearer {KEY['key']}"}, 413)])  # fmt: skip
def test_the_key_is_checked_before_the_body_is_read(headers: dict[str, str], status: int) -> None:
    """Issue 16, item 10: only a known caller makes the bridge read (and parse) up to max_body_bytes."""

    async def scenario() -> None:
        bridge = Bridge(RefusingQueue(), KeyRing(KeysFile.model_validate({"keys": [KEY]})),
                        BridgeSettings(max_body_bytes=1000))  # fmt: skip
        async with TestClient(TestServer(bridge.app())) as http:
            resp = await http.post("/v1/chat/completions", data=b"{" * 5000, headers=headers)
            assert resp.status == status
            assert (await resp.json())["error"]["type"] == (
                "authentication_error" if status == 401 else "invalid_request_error"
            )

    asyncio.run(scenario())


def test_a_backend_the_bridge_may_not_read_queues_the_call_instead_of_a_500() -> None:
    """Review L7: without get on pods in the backend namespace (an install whose bridge runs no executor,
    before the chart always granted it), an /upstream call on an ignored path answered 500."""
    from gpulane.bridge.job_queue import KubeJobQueue

    class NoPodRights:
        namespace = "gpulane-system"

        async def list_cluster(self, plural: str) -> list[dict[str, object]]:
            return [{"metadata": {"name": "gpu-0"}, "status": {"residentModel": "m", "ready": True}}]

        async def get_pod(self, name: str, namespace: str | None = None) -> None:
            raise api_error(403, 'pods "gpulane-gpu-0" is forbidden: User "system:serviceaccount:x:bridge" cannot get')

    queue = KubeJobQueue(NoPodRights(), "r0")  # type: ignore[arg-type]
    assert asyncio.run(queue.resident("m")) is None


@pytest.mark.parametrize(
    ("path", "headers", "body", "status", "kind", "code"),
    [
        ("/v1/chat/completions", {}, b"{}", 401, "authentication_error", "invalid_api_key"),
        ("/v1/chat/completions", {"X-LlamaSwap-Member": "x"}, b"{}", 403, "permission_error", "permission_denied"),
        ("/v1/chat/completions", {"X-Gpulane-Queue-Timeout": "soon"}, b"{}", 400, "invalid_request_error",
         "invalid_request"),
        ("/v1/chat/completions", {}, b"{" * 5000, 413, "invalid_request_error", "request_too_large"),
        ("/v1/chat/completions", {}, b"[]", 400, "invalid_request_error", "invalid_request"),
        ("/v1/chat/completions", {}, b'{"model": "nope"}', 404, "invalid_request_error", "model_not_found"),
        ("/v1/nothing", {}, b"{}", 404, "invalid_request_error", "unknown_url"),
        ("/v1/chat/completions", {}, b'{"model": "m", "messages": []}', 403, "permission_error", "permission_denied"),
    ],
)  # fmt: skip
def test_every_refusal_is_an_openai_error_with_a_type_and_a_code(
    path: str, headers: dict[str, str], body: bytes, status: int, kind: str, code: str
) -> None:
    """Issue 33: clients branch on `type` and `code` (llama-swap's shed calls answer rate_limit_error), so every
    refusal carries both, whichever check made it."""

    async def scenario() -> None:
        bridge = Bridge(RefusingQueue(), KeyRing(KeysFile.model_validate({"keys": [KEY]})),
                        BridgeSettings(max_body_bytes=1000))  # fmt: skip
        auth = {} if status == 401 else {"Authorization": f"Bearer {KEY['key']}"}
        async with TestClient(TestServer(bridge.app())) as http:
            resp = await http.post(path, data=body, headers={**auth, **headers, "Content-Type": "application/json"})
            assert resp.status == status, await resp.text()
            error = (await resp.json())["error"]
            assert (error["type"], error["code"]) == (kind, code), error
            assert error["message"]

    asyncio.run(scenario())


def test_a_full_queue_is_a_rate_limit_error_saying_which() -> None:
    assert CallError(429, "x", kind="rate_limit_error").body()["error"]["code"] == "rate_limit_exceeded"
    assert CallError(503, "x", kind="server_error").body()["error"]["code"] == "unavailable"
    assert CallError(500, "x", kind="server_error").body()["error"]["code"] == "server_error"


class WaitingQueue(RefusingQueue):
    """Every job is taken and waits: its call holds its place in the bridge's queue."""

    def __init__(self) -> None:
        self.taken = asyncio.Event()

    async def submit(self, submission: Submission, waiting: Waiting | None = None) -> str:
        self.taken.set()
        return "call-1"

    async def follow(self, name: str) -> AsyncIterator[JobProgress]:
        await asyncio.Event().wait()  # never starts
        yield JobProgress("Pending")  # pragma: no cover

    async def cancel(self, name: str) -> None:
        pass


@pytest.mark.parametrize(
    ("settings", "second_key", "code"),
    [({"max_queued": 1}, "other", "queue_full"), ({"max_queued_per_member": 1}, "app", "member_queue_full")],
)
def test_a_full_queue_refuses_the_next_call_with_a_rate_limit_error_saying_which(
    settings: dict[str, int], second_key: str, code: str
) -> None:
    """The bridge's own caps (--max-queued, --max-queued-per-member): 429, Retry-After, and a code that says
    which cap, as llama-swap answers a shed call with rate_limit_error."""
    other = {"name": "other", "key": "sk-other-00000", "member": "other"}
    keys = {"app": KEY["key"], "other": other["key"]}

    async def scenario() -> None:
        queue = WaitingQueue()
        bridge = Bridge(queue, KeyRing(KeysFile.model_validate({"keys": [KEY, other]})),
                        BridgeSettings(**settings))  # type: ignore[arg-type]  # fmt: skip
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        async with TestClient(TestServer(bridge.app())) as http:
            first = asyncio.create_task(
                http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {keys['app']}"})
            )
            await asyncio.wait_for(queue.taken.wait(), 5)
            resp = await http.post("/v1/chat/completions", json=body,
                                   headers={"Authorization": f"Bearer {keys[second_key]}"})  # fmt: skip
            assert resp.status == 429 and resp.headers["Retry-After"] == "1"
            error = (await resp.json())["error"]
            assert (error["type"], error["code"]) == ("rate_limit_error", code), error
            first.cancel()

    asyncio.run(scenario())
