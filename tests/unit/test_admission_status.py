"""Who may write a GpuJob's status: the operator anything, everyone else only an executor's outcome
(issue 16 item 6: forged lane, endpoint or phase)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes.aio.client.exceptions import ApiException

from gpulane.admission.configuration import webhook_configurations
from gpulane.admission.review import Refused, validate_status
from gpulane.admission.rules import Caller
from gpulane.admission.webhook import AdmissionState

OPERATOR = "system:serviceaccount:gpulane:gpulane-operator"
OPERATORS = frozenset({OPERATOR})
EXECUTOR = Caller("system:serviceaccount:team-a:batch", namespace="team-a")
RUNNING = {"phase": "Running", "lane": "gpu-0", "pod": "gpulane-gpu-0", "endpoint": "http://10.0.0.5:8000",
           "startedAt": "2026-12-02T01:00:00Z"}  # fmt: skip


def job(status: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": "shot", "namespace": "team-a"}, "spec": {"model": "sdxl"}}
    if status is not None:
        body["status"] = status
    return body


def refusal(new: dict[str, Any] | None, old: dict[str, Any] | None, caller: Caller = EXECUTOR) -> str:
    with pytest.raises(Refused) as err:
        validate_status(job(new), job(old), caller, OPERATORS)
    return str(err.value)


def test_an_executor_may_end_a_running_job() -> None:
    validate_status(job({**RUNNING, "phase": "Succeeded", "finishedAt": "2026-12-02T01:01:00Z",
                         "result": {"configMap": "shot-result"}}), job(RUNNING), EXECUTOR, OPERATORS)  # fmt: skip
    validate_status(job({**RUNNING, "phase": "Failed", "reason": "UpstreamError", "message": "500"}), job(RUNNING),
                    EXECUTOR, OPERATORS)  # fmt: skip


def test_an_unchanged_status_passes() -> None:
    validate_status(job(RUNNING), job(RUNNING), EXECUTOR, OPERATORS)
    validate_status(job(None), job(None), EXECUTOR, OPERATORS)


def test_the_operator_writes_anything() -> None:
    operator = Caller(OPERATOR, namespace="team-a")
    validate_status(job(RUNNING), job({"phase": "Pending"}), operator, OPERATORS)
    validate_status(job({**RUNNING, "endpoint": "http://10.0.0.6:8000"}), job(RUNNING), operator, OPERATORS)


def test_a_finished_job_cannot_be_made_running() -> None:
    done = {**RUNNING, "phase": "Succeeded", "finishedAt": "2026-12-02T01:01:00Z"}
    message = refusal(RUNNING, done)
    assert "may not write the status of a Succeeded job" in message
    assert EXECUTOR.username in message


def test_a_pending_job_cannot_be_dispatched_by_an_executor() -> None:
    assert "status of a Pending job" in refusal(RUNNING, {"phase": "Pending", "position": 1})
    assert "status of a new job" in refusal(RUNNING, None)


def test_the_endpoint_lane_and_pod_are_the_operators() -> None:
    forged = {**RUNNING, "phase": "Succeeded", "endpoint": "http://169.254.169.254", "lane": "gpu-1"}
    message = refusal(forged, RUNNING)
    assert "may not change status.endpoint, status.lane" in message
    assert "finishedAt, message, phase, reason, result" in message


def test_an_executor_may_only_end_a_job() -> None:
    assert "may not set status.phase 'Pending'" in refusal({**RUNNING, "phase": "Pending"}, RUNNING)
    assert "may not set status.phase 'Cancelled'" in refusal({**RUNNING, "phase": "Cancelled"}, RUNNING)
    # Rewriting a Running job's endpoint without ending it is not an outcome either.
    assert "may not set status.phase 'Running'" in refusal({**RUNNING, "endpoint": "http://evil"}, RUNNING)


def test_removing_a_field_counts_as_a_change() -> None:
    stripped = {k: v for k, v in RUNNING.items() if k != "startedAt"} | {"phase": "Failed"}
    assert "status.startedAt" in refusal(stripped, RUNNING)


def hooks(configs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {hook["name"]: hook for config in configs for hook in config["webhooks"]}


def test_the_status_hook_is_configured_only_with_the_operators_identity() -> None:
    assert "gpujob-status-validate.gpulane.io" not in hooks(webhook_configurations(url="https://h:1"))
    by_name = hooks(webhook_configurations(url="https://h:1", namespace_selector={"t": "x"}, operators=[OPERATOR]))
    hook = by_name["gpujob-status-validate.gpulane.io"]
    assert hook["clientConfig"]["url"] == "https://h:1/gpujob-status-validate"
    assert hook["rules"][0]["resources"] == ["gpujobs/status"]
    assert hook["rules"][0]["operations"] == ["UPDATE"]
    assert hook["namespaceSelector"] == {"matchLabels": {"t": "x"}}
    assert hook["failurePolicy"] == "Ignore"  # outcomes land while the webhook is down; the CRD rules hold
    assert [c["name"] for c in hook["matchConditions"]] == ["status-changed", "not-the-operator"]
    assert hook["matchConditions"][1]["expression"] == f'!(request.userInfo.username in ["{OPERATOR}"])'


def test_the_webhook_waits_out_a_429_while_it_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh install: the new CRDs' storage answers 429 for a moment; the webhook must not crash on it."""

    class Kube:
        calls = 0

        async def get_cluster(self, plural: str, name: str) -> dict[str, Any]:
            Kube.calls += 1
            if Kube.calls == 1:
                raise ApiException(status=429, reason="storage is (re)initializing")
            return {"spec": {"admission": {"defaultCap": 7}}}

        async def list_cluster(self, plural: str) -> list[dict[str, Any]]:
            return [{"metadata": {"name": "sdxl"}}]

    state = AdmissionState(Kube(), OPERATORS)  # type: ignore[arg-type]
    asyncio.run(asyncio.wait_for(state.load(), timeout=10))
    assert Kube.calls == 2
    assert state.models == {"sdxl"} and state.admission.default_cap == 7
