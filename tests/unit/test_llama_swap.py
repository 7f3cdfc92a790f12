"""The llama-swap baseline's admission cap: 429 after concurrencyLimit admitted requests per model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpulane.cli import main
from gpulane.core.baselines import RANKINGS
from gpulane.core.sim.engine import SimResult, simulate
from gpulane.core.sim.llamaswap import AdmissionCap, LlamaSwapConfig
from gpulane.core.sim.report import comparison_table, percentile, summarize
from gpulane.core.sim.scenario import Scenario, load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def burst(count: int, model: str = "x", name: str = "s", at: float = 0) -> dict[str, Any]:
    return {"name": name, "member": "m", "model": model, "runSeconds": 60, "count": count, "submit": "burst", "at": at}


def run(streams: list[dict[str, Any]], clients: str = "reject", policy: str = "llama-swap", **extra: Any) -> SimResult:
    scenario = Scenario.model_validate(
        {"name": "t", "initialModel": "x", "streams": streams, "llamaSwap": {"clients": clients, **extra}}
    )
    return simulate(scenario, policy)


def by_name(result: SimResult) -> dict[str, Any]:
    return {j.name: j for j in result.jobs}


def test_the_eleventh_concurrent_request_is_refused_and_dropped_in_reject_mode():
    result = run([burst(11)])
    jobs = by_name(result)
    assert [name for name, j in jobs.items() if j.rejected] == ["s-10"]
    assert jobs["s-10"].dropped and jobs["s-10"].started_at is None and jobs["s-10"].admitted_at is None
    assert all(jobs[f"s-{i}"].finished_at is not None for i in range(10))
    stream = summarize(result, 100)["streams"]["s"]
    assert (stream["rejected"], stream["dropped"], stream["unfinished"]) == (1, 1, 0)


def test_in_retry_mode_every_job_completes_once_and_waits_from_its_first_attempt():
    result = run([burst(11)], clients="retry")
    jobs = by_name(result)
    assert len(result.jobs) == 11 and all(j.finished_at is not None for j in result.jobs)
    assert [name for name, j in jobs.items() if j.rejected] == ["s-10"]
    late = jobs["s-10"]
    assert not late.dropped
    assert late.admitted_at == 60  # the first request's end made room
    assert late.submitted_at == 0 and late.wait == 600  # ten runs of 60 s ahead of it
    assert sorted(j.dispatched_at for j in result.jobs) == [60.0 * i for i in range(11)]  # each dispatched once
    stream = summarize(result, 100)["streams"]["s"]
    assert (stream["jobs"], stream["rejected"], stream["dropped"]) == (11, 1, 0)
    assert stream["waitSeconds"]["max"] == 600


def test_the_cap_is_per_model_and_can_be_set_for_one_model():
    result = run([burst(4), burst(11, model="y", name="t")], models={"x": {"concurrencyLimit": 2}})
    assert [j.name for j in result.jobs if j.rejected] == ["s-2", "s-3", "t-10"]


def test_a_request_arriving_as_another_ends_gets_its_place():
    result = run([burst(10), burst(1, name="late", at=60)])
    assert not by_name(result)["late-0"].rejected


def test_retrying_clients_keep_their_order_ahead_of_an_arrival_at_the_instant_a_place_frees():
    result = run([burst(12), burst(1, name="new", at=60)], clients="retry")
    jobs = by_name(result)
    assert (jobs["s-10"].admitted_at, jobs["s-11"].admitted_at) == (60, 120)
    assert jobs["new-0"].rejected and jobs["new-0"].admitted_at == 180


def test_a_chain_moves_on_after_a_dropped_job():
    chain = {**burst(3, name="chain", at=30), "submit": "chain"}
    result = run([burst(10), chain])
    jobs = by_name(result)
    assert all(jobs[f"chain-{i}"].dropped for i in range(3))  # the model stays full until 60
    assert [jobs[f"chain-{i}"].submitted_at for i in range(3)] == [30, 30, 30]


@pytest.mark.parametrize("policy", [p for p in RANKINGS if p != "llama-swap"])
def test_only_the_llama_swap_baseline_refuses_work(policy):
    result = run([burst(30)], policy=policy)
    assert not any(j.rejected for j in result.jobs)


def test_admission_cap_hands_a_freed_place_to_the_first_retrying_client():
    cap = AdmissionCap(LlamaSwapConfig(concurrency_limit=1, clients="retry"))
    assert cap.admit("a", "x") and not cap.admit("b", "x") and not cap.admit("c", "x")
    assert cap.admit("y-job", "y")  # another model has its own places
    assert [cap.release("x"), cap.release("x"), cap.release("x")] == ["b", "c", None]
    assert cap.admit("d", "x")


def test_admission_cap_in_reject_mode_forgets_refused_jobs():
    cap = AdmissionCap(LlamaSwapConfig(concurrency_limit=1, clients="reject"))
    assert cap.admit("a", "x") and not cap.admit("b", "x")
    assert cap.release("x") is None
    assert cap.admit("c", "x")


def test_dropped_jobs_count_as_endless_waits_so_dropping_work_never_looks_better():
    assert percentile([1.0, 2.0, float("inf")], 50) == 2.0
    assert percentile([1.0, 2.0, float("inf")], 95) == float("inf")
    assert percentile([float("inf"), float("inf")], 50) == float("inf")
    result = run([burst(20)])
    waits = summarize(result, 100)["streams"]["s"]["waitSeconds"]
    assert waits["p50"] is None and waits["max"] is None and waits["mean"] is None  # half never ran
    table = comparison_table({"llama-swap": summarize(result, 100)})
    assert "dropped" in next(line for line in table.splitlines() if "wait p50" in line)


def test_reject_mode_loses_what_the_real_llama_swap_refused_on_the_shipped_scenarios():
    """Measured against llama-swap v250 (commit 0bdb3720) with fake backends: 164 of 174 film shots,
    328 of 348 on two films, 155 of 741 images on the saturated stream."""
    expected = {"film-burst-vs-interactive": 164, "two-films": 328, "saturated-interactive": 155}
    for name, lost in expected.items():
        scenario = load_scenario(SCENARIOS / f"{name}.yaml")
        rejecting = scenario.model_copy(update={"llama_swap": LlamaSwapConfig(clients="reject")})
        assert summarize(simulate(rejecting, "llama-swap"), 100)["overall"]["dropped"] == lost, name


@pytest.mark.parametrize(
    ("llama_swap", "message"),
    [
        ({"clients": "sometimes"}, "llamaSwap.clients"),
        ({"concurrencyLimit": 0}, "llamaSwap.concurrencyLimit"),
        ({"concurrencyLimit": True}, "llamaSwap.concurrencyLimit"),
        ({"models": {"x": {"concurrencyLimit": 1.5}}}, "llamaSwap.models.x.concurrencyLimit"),
        ({"queue": 3}, "llamaSwap.queue: Extra inputs"),
    ],
)
def test_bad_llama_swap_settings_are_refused_naming_the_field(tmp_path, capsys, llama_swap, message):
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({"name": "t", "streams": [burst(1)], "llamaSwap": llama_swap}))
    assert main(["simulate", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_a_limit_for_a_model_nobody_requests_is_a_warning():
    scenario = Scenario.model_validate(
        {
            "name": "t",
            "models": [{"name": "x"}],
            "streams": [burst(1)],
            "llamaSwap": {"models": {"xx": {"concurrencyLimit": 2}}},
        }
    )
    assert scenario.warnings() == [
        "llamaSwap.models names 'xx', which no stream or job requests; its limit has no effect"
    ]


def test_cli_counts_refusals_in_json_and_the_comparison(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"name": "t", "initialModel": "x", "streams": [burst(12)]}))
    assert (
        main(["simulate", str(path), "--compare", "llama-swap,gpulane", "--llama-swap-clients", "reject", "--json"])
        == 0
    )
    payload = json.loads(capsys.readouterr().out)
    assert payload["llamaSwap"] == {"concurrencyLimit": 10, "models": {}, "clients": "reject"}
    llama = payload["policies"]["llama-swap"]
    assert [j["name"] for j in llama["jobs"] if j["rejected"]] == ["s-10", "s-11"]
    assert llama["summary"]["streams"]["s"]["dropped"] == 2 and llama["summary"]["overall"]["rejected"] == 2
    assert payload["policies"]["gpulane"]["summary"]["overall"]["rejected"] == 0
    assert main(["simulate", str(path), "--compare", "llama-swap,gpulane"]) == 0
    out = capsys.readouterr().out
    assert "llama-swap: concurrencyLimit 10 per model, clients retry after a 429" in out
    assert next(line for line in out.splitlines() if "rejected (429)" in line).split()[-2:] == ["2", "0"]


def test_llama_swap_clients_without_the_llama_swap_policy_is_a_warning(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"name": "t", "models": [{"name": "x"}], "streams": [burst(1)]}))
    assert main(["simulate", str(path), "--policy", "gpulane", "--llama-swap-clients", "reject"]) == 0
    assert "warning: --llama-swap-clients has no effect" in capsys.readouterr().err
