"""Unit tests of gpulane/core/chains.py (the chain's state machine, its ETA and its step builder) and of the
step jobs the operator makes of them (gpulane/operator/chains.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpulane.api.chains import ATTEMPT_LABEL, CHAIN_LABEL, STEP_LABEL, STEPS_MESSAGE, TEMPLATE_MESSAGE, GpuChainSpec
from gpulane.api.contract import FINALIZER
from gpulane.core.chains import (
    ChainRules,
    StepJob,
    estimated_completion,
    format_steps,
    parse_steps,
    plan,
    render,
    step_name,
)
from gpulane.core.policy import Policy
from gpulane.explain import report
from gpulane.operator.chains import step_manifest, step_of


def eta(rules: ChainRules, steps: list[StepJob], step_seconds: float, now: float,
        succeeded: frozenset[int] | set[int] = frozenset()) -> float | None:  # fmt: skip
    """The ETA as the operator computes it: from ``plan``'s verdict on the same steps."""
    return estimated_completion(rules, plan(rules, steps, now, succeeded), steps, step_seconds, now)


def job(index: int, phase: str | None = None, attempt: int = 0, **times: float) -> StepJob:
    return StepJob(index, attempt, step_name("film", index, attempt), phase, **times)


def test_a_new_chain_creates_its_first_step_only() -> None:
    decided = plan(ChainRules(total=174), [], now=0)
    assert decided.create == ((0, 0),) and decided.phase == "Running" and decided.current is None


def test_the_next_step_is_created_when_one_ends_not_before() -> None:
    rules = ChainRules(total=3)
    assert plan(rules, [job(0, "Pending")], 0).create == ()
    assert plan(rules, [job(0, "Running", started_at=1)], 5).create == ()
    after = plan(rules, [job(0, "Succeeded", started_at=1, finished_at=4)], 5)
    assert after.create == ((1, 0),) and after.completed == 1 and after.gpu_seconds == 3


def test_in_flight_keeps_that_many_steps_queued_or_running() -> None:
    rules = ChainRules(total=10, in_flight=3)
    assert plan(rules, [], 0).create == ((0, 0), (1, 0), (2, 0))
    decided = plan(rules, [job(0, "Succeeded"), job(1, "Running", started_at=0), job(2, "Pending")], 9)
    assert decided.create == ((3, 0),) and decided.current is not None and decided.current.index == 1


def test_a_failed_step_is_retried_then_fails_or_pauses_the_chain() -> None:
    rules = ChainRules(total=3, retries=1)
    first = plan(rules, [job(0, "Failed")], 0)
    assert first.create == ((0, 1),), "its second attempt, before any later step"
    out = [job(0, "Failed"), job(0, "Failed", attempt=1)]
    failed = plan(rules, out, 0)
    assert failed.phase == "Failed" and failed.create == () and failed.failed == 1 and failed.retried == 1
    assert "step 0 failed after 2 attempt(s)" in failed.message
    paused = plan(ChainRules(total=3, retries=1, exhausted="Pause"), out, 0)
    assert paused.phase == "Paused" and paused.create == ()


def test_a_chain_that_failed_stays_failed_when_its_steps_jobs_are_deleted() -> None:
    """Review M5: the TTL deletes failed steps' jobs; rebuilt from the jobs alone, the chain came back to
    Running with a fresh retry budget, an endless create-and-fail loop with a small TTL."""
    rules = ChainRules(total=3, retries=1)
    out = plan(rules, [job(0, "Failed"), job(0, "Failed", attempt=1)], 0)
    assert out.phase == "Failed" and out.gave_up == {0}
    after_ttl = plan(rules, [], 10, succeeded=out.succeeded, gave_up=out.gave_up)
    assert (after_ttl.phase, after_ttl.create, after_ttl.failed) == ("Failed", (), 1)
    assert "step 0 failed with no attempt left (its jobs are gone)" in after_ttl.message
    paused = plan(ChainRules(total=3, exhausted="Pause"), [], 10, gave_up={0})
    assert (paused.phase, paused.create) == ("Paused", ())


@pytest.mark.parametrize("reason", ["NamespaceQueueFull", "MemberQueueFull"])
def test_a_step_refused_for_a_full_queue_spends_no_retries(reason: str) -> None:
    """Review M5: NamespaceQueueFull (or MemberQueueFull) fails a step at once; retrying it at once meets the
    same full queue, and with in-flight 64 and retries 100 made thousands of failed jobs in seconds."""
    full = StepJob(0, 0, step_name("film", 0, 0), "Failed", reason=reason)
    decided = plan(ChainRules(total=3, retries=100, exhausted="Pause"), [full], 0)
    assert (decided.phase, decided.create, decided.gave_up) == ("Paused", (), {0})
    assert reason in decided.message


def test_a_cancelled_step_counts_as_failed_and_a_deleted_one_is_made_again() -> None:
    assert plan(ChainRules(total=2, retries=1), [job(0, "Cancelled")], 0).create == ((0, 1),)
    assert plan(ChainRules(total=2), [job(1, "Succeeded")], 0).create == ((0, 0),), "step 0's job is gone"


def test_suspend_stops_new_steps_and_the_last_success_ends_the_chain() -> None:
    assert plan(ChainRules(total=2, suspend=True), [job(0, "Succeeded")], 0).phase == "Suspended"
    assert plan(ChainRules(total=2, suspend=True), [job(0, "Succeeded")], 0).create == ()
    done = plan(ChainRules(total=2), [job(0, "Succeeded"), job(1, "Succeeded")], 0)
    assert done.phase == "Succeeded" and done.create == () and done.completed == 2


def test_steps_beyond_a_shrunk_total_are_ignored() -> None:
    assert plan(ChainRules(total=1), [job(0, "Succeeded"), job(5, "Running")], 0).phase == "Succeeded"


def test_the_eta_follows_the_chains_own_pace_once_steps_ended() -> None:
    rules = ChainRules(total=10)
    # 2 steps of 240 s with a 60 s gap between them (interactive work went ahead): a 270 s pace.
    steps = [job(0, "Succeeded", started_at=0, finished_at=240), job(1, "Succeeded", started_at=300,
             finished_at=540), job(2, "Pending")]  # fmt: skip
    assert eta(rules, steps, step_seconds=240, now=550) == 540 + 8 * 270


def test_before_any_step_ended_the_eta_is_the_forecast_start_plus_every_step() -> None:
    rules = ChainRules(total=4, in_flight=2)
    waiting = [job(0, "Pending", estimated_start=100.0), job(1, "Pending", estimated_start=130.0)]
    assert eta(rules, waiting, step_seconds=60, now=10) == 100 + 2 * 60
    assert eta(rules, [], step_seconds=60, now=10) == 10 + 2 * 60
    assert eta(ChainRules(total=1), [job(0, "Succeeded")], 60, 0) is None, "it is over"


def test_a_template_renders_index_step_and_total_in_every_string() -> None:
    template = {"path": "/v1/images/generations", "body": {"prompt": "shot {step} of {total} {json: {index}}",
                "seed": 7, "tags": ["s{index}"]}}  # fmt: skip
    body = {"prompt": "shot 37 of 174 {json: 36}", "seed": 7, "tags": ["s36"]}
    assert render(template, 36, 174) == {"path": "/v1/images/generations", "body": body}


def test_step_names_are_the_chains_and_stay_within_a_name() -> None:
    assert step_name("film", 3, 0) == "film-3" and step_name("film", 3, 2) == "film-3-r2"
    assert len(step_name("x" * 253, 99999, 100)) == 253


def test_a_spec_has_steps_or_a_count() -> None:
    with pytest.raises(ValidationError, match=STEPS_MESSAGE):
        GpuChainSpec.model_validate({"model": "m"})
    with pytest.raises(ValidationError, match=TEMPLATE_MESSAGE):
        GpuChainSpec.model_validate({"model": "m", "steps": [{"path": "/v1/completions"}],
                                      "template": {"path": "/v1/embeddings"}})  # fmt: skip
    assert GpuChainSpec.model_validate({"model": "m", "count": 5}).total == 5


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"steps": [{"path": "/upstream/m/prompt"}, {"path": "/upstream/other/prompt"}]}, "another model's server"),
        ({"count": 2, "template": {"path": "/upstream/other/x"}}, "another model's server"),
        ({"steps": [{"path": "/v1/models"}]}, "POST /v1/models: method and path must be a route"),
        ({"steps": [{"path": "/upstream/m/../v1/chat/completions"}]}, "String should match pattern"),
    ],
)
def test_a_chains_steps_use_the_bridges_routes_and_their_own_models_server(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        GpuChainSpec.model_validate({"model": "m", **spec})
    ok = {
        "steps": [{"path": "/upstream/m/prompt", "body": {"prompt": {}}}, {"method": "GET", "path": "/sdapi/v1/loras"}]
    }
    assert GpuChainSpec.model_validate({"model": "m", **ok}).request(1) == {"method": "GET", "path": "/sdapi/v1/loras"}


def test_a_step_job_carries_the_chains_fields_labels_owner_and_request() -> None:
    chain = {"metadata": {"name": "film", "namespace": "studio", "uid": "u1"}}
    spec = GpuChainSpec.model_validate({"model": "sdxl", "priority": "batch", "member": "alice", "count": 174,
                                        "template": {"path": "/v1/images/generations",
                                                     "body": {"prompt": "shot {step}"}}})  # fmt: skip
    made = step_manifest(chain, spec, 36, 1)
    assert made["metadata"]["name"] == "film-36-r1" and made["metadata"]["namespace"] == "studio"
    assert made["metadata"]["labels"] == {CHAIN_LABEL: "film", STEP_LABEL: "36", ATTEMPT_LABEL: "1"}
    assert made["metadata"]["finalizers"] == [FINALIZER]
    [owner] = made["metadata"]["ownerReferences"]
    assert owner["kind"] == "GpuChain" and owner["uid"] == "u1" and owner["controller"]
    assert made["spec"] == {"model": "sdxl", "priority": "batch", "member": "alice",
                            "request": {"path": "/v1/images/generations", "body": {"prompt": "shot 37"}}}  # fmt: skip
    made["status"] = {"phase": "Running", "startedAt": "2026-12-03T10:00:00Z"}
    key, step = step_of(made) or (None, None)
    assert key == ("studio", "film") and step is not None and (step.index, step.attempt) == (36, 1)
    assert step_of({"metadata": {"name": "j", "namespace": "n", "labels": {CHAIN_LABEL: "c"}}}) is None


def test_the_chains_table_and_a_chains_story() -> None:
    current = {"index": 2, "attempt": 0, "job": "film-2", "phase": "Pending", "position": 3}
    chain = {"metadata": {"name": "film", "namespace": "studio"},
             "status": {"phase": "Running", "progress": "2/10", "gpuSeconds": 480.0, "current": current,
                        "estimatedCompletion": "2026-12-03T12:00:00Z", "message": "2 of 10 steps done"}}  # fmt: skip
    now = 1796299200.0 - 3600  # 11:00Z: an hour before the ETA
    [row] = report.chains([chain], now)
    assert (row["progress"], row["current"], row["position"], row["etaIn"]) == ("2/10", "film-2", 3, 3600)
    text = report.render_chains([row])
    assert "studio/film" in text and "in 1h" in text and "8m" in text  # GPU time 480 s
    steps = [
        {"metadata": {"name": f"film-{i}", "namespace": "studio", "creationTimestamp": f"2026-12-03T10:0{i}:00Z"},
         "spec": {"model": "m", "priority": -100},
         "status": {"phase": "Succeeded", "story": {"ranAheadTotal": i, "ranAhead": [], "queuedAt": "x", "load": False}}
         if i < 2 else {"phase": "Pending", "position": 3}}
        for i in range(3)
    ]  # fmt: skip
    lines = report.why_chain(chain, steps, [], Policy(), now)
    assert lines[0].startswith("studio/film (Running): 2/10 steps done") and "estimated end 12:00:00" in lines[0]
    assert "  film-1: Succeeded, 1 job(s) dispatched ahead of it." in lines
    assert lines[lines.index("The latest step:") + 1].startswith("  studio/film-2")


def test_a_succeeded_step_is_never_made_again_when_its_job_is_gone() -> None:
    """Its job deleted after its TTL, or by hand: the chain's status remembers it succeeded."""
    rules = ChainRules(total=4)
    gone = plan(rules, [job(2, "Running", started_at=5)], 9, succeeded={0, 1})
    assert gone.create == () and gone.completed == 2 and gone.succeeded == {0, 1}
    after = plan(rules, [job(2, "Succeeded", started_at=5, finished_at=8)], 9, succeeded={0, 1})
    assert after.create == ((3, 0),) and after.succeeded == {0, 1, 2}
    assert plan(rules, [], 9, succeeded={0, 1, 2, 3, 7}).phase == "Succeeded", "an index past the total is ignored"
    end = eta(rules, [job(2, "Succeeded", started_at=5, finished_at=8)], 60, 9, succeeded={0, 1})
    assert end == 8 + 1 * 3, "one step left, at the pace of the jobs still there"


def test_succeeded_steps_are_kept_as_ranges() -> None:
    assert format_steps([5, 0, 1, 2, 3, 7, 8, 10]) == "0-3,5,7-8,10"
    assert format_steps([]) == ""
    assert parse_steps("0-3,5,7-8,10", total=9) == {0, 1, 2, 3, 5, 7, 8}
    assert parse_steps("x,3-,-2,4", total=9) == {4}, "malformed parts are skipped"
    assert parse_steps(None, total=3) == frozenset()
