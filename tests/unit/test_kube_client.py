"""Kube's mapping of the apiserver's refusals: a JSON patch whose ``test`` no longer holds is a Conflict,
whatever the 422's message says (seen in the chaos bench: a generic "error in our request")."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from gpulane.kube.client import Conflict, Gone, Kube

TESTED = [
    {"op": "test", "path": "/status/phase", "value": "Running"},
    {"op": "replace", "path": "/status/phase", "value": "Succeeded"},
]


def refuse(status: int, body: str) -> Any:
    async def fn(*args: Any, **kwargs: Any) -> None:
        err = ApiException(status=status, reason="Refused")
        err.body = body
        raise err

    return fn


def write(fn: Any, patch: Any) -> None:
    async def go() -> None:
        kube = Kube(client.ApiClient(), "ns")
        try:
            await kube._write("job-status", fn, "ns", "job", patch)
        finally:
            await kube.close()

    asyncio.run(go())


def test_a_failed_test_op_is_a_conflict_whatever_the_message():
    generic = '{"message":"the server rejected our request due to an error in our request","code":422}'
    with pytest.raises(Conflict):
        write(refuse(422, generic), TESTED)


def test_a_422_without_a_test_op_stays_an_error():
    with pytest.raises(ApiException):
        write(refuse(422, '{"message":"spec.x: Invalid value"}'), [{"op": "add", "path": "/x", "value": 1}])


def test_conflicts_and_missing_objects():
    with pytest.raises(Conflict):
        write(refuse(409, "conflict"), {"status": {}})
    with pytest.raises(Gone):
        write(refuse(404, "not found"), TESTED)


def test_every_call_has_a_request_timeout():
    seen: dict[str, Any] = {}

    async def fn(*args: Any, **kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs)
        return {"items": []}

    async def go() -> None:
        kube = Kube(client.ApiClient(), "ns", timeout=3.5)
        try:
            await kube.read(fn, "x")
        finally:
            await kube.close()

    asyncio.run(go())
    assert seen["_request_timeout"] == 3.5


def test_the_session_ignores_netrc_and_proxy_variables(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp's trust_env reads ~/.netrc and the proxy variables in a thread on every request (bench/client.py:
    most of a patch's CPU); like the sync client, gpulane's session takes a proxy only from the kubeconfig."""
    from gpulane.kube.client import load_client

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")

    async def go() -> bool:
        api = await load_client(str(kubeconfig))
        session = api.rest_client._create_pool_manager()
        try:
            return bool(session.trust_env)
        finally:
            await session.close()
            await api.close()

    assert asyncio.run(go()) is False


def test_a_list_comes_in_pages_each_with_the_request_timeout():
    """Review L8: the rebuild lists every GpuJob; one unpaginated call under a 10 s timeout could never end
    in time with tens of thousands of finished jobs."""
    pages = {None: (["a", "b"], "t1"), "t1": (["c"], "t2"), "t2": ([], None)}
    calls: list[dict[str, Any]] = []

    async def list_cluster_custom_object(group: str, version: str, plural: str, **kwargs: Any) -> Any:
        calls.append(kwargs)
        names, token = pages[kwargs.get("_continue")]
        return {"items": [{"metadata": {"name": n}} for n in names], "metadata": {"continue": token}}

    async def go() -> list[Any]:
        kube = Kube(client.ApiClient(), "ns")
        kube.custom.list_cluster_custom_object = list_cluster_custom_object  # type: ignore[method-assign]
        try:
            return await kube.list_cluster("gpujobs")
        finally:
            await kube.close()

    listed = asyncio.run(go())
    assert [o["metadata"]["name"] for o in listed] == ["a", "b", "c"]
    assert [c.get("_continue") for c in calls] == [None, "t1", "t2"]
    assert {c["limit"] for c in calls} == {500} and all(c["_request_timeout"] == 10.0 for c in calls)


@pytest.mark.parametrize(
    ("audiences", "who"),
    [(["gpulane-bridge"], ("alice", ["team-a"])), ([], None), (None, None), (["https://kubernetes.default.svc"], None)],
)
def test_a_token_counts_only_for_the_audience_asked(monkeypatch: pytest.MonkeyPatch, audiences: Any, who: Any):
    """Review M7: the bridge asks for its own audience, and takes a token only if the apiserver says it is one."""
    asked: list[Any] = []

    async def create_token_review(self: Any, review: Any, **kwargs: Any) -> Any:
        asked.append(review["spec"])
        user = client.V1UserInfo(username="alice", groups=["team-a"])
        return client.V1TokenReview(spec=client.V1TokenReviewSpec(token="tok"),
                                    status=client.V1TokenReviewStatus(authenticated=True, user=user,
                                                                      audiences=audiences))  # fmt: skip

    monkeypatch.setattr(client.AuthenticationV1Api, "create_token_review", create_token_review)

    async def go() -> Any:
        kube = Kube(client.ApiClient(), "ns")
        try:
            return await kube.authenticate("tok", "gpulane-bridge")
        finally:
            await kube.close()

    assert asyncio.run(go()) == who
    assert asked == [{"token": "tok", "audiences": ["gpulane-bridge"]}]


def test_a_tested_patch_that_admission_refused_is_no_conflict():
    """A restarted apiserver's admission policy that cannot decide yet refuses with a 422: read as a failed
    `test`, the bridge took it as "someone else ended the job" and never wrote the outcome, so the job held
    its lane until its run limit (seen in the chaos round)."""
    policy = json.dumps(
        {
            "code": 422,
            "message": 'gpujobs.gpulane.io "c" is forbidden: ValidatingAdmissionPolicy'
            " 'r-gpulane-status-outcomes' denied request: failed to configure policy",
        }
    )
    with pytest.raises(ApiException):
        write(refuse(422, policy), TESTED)
