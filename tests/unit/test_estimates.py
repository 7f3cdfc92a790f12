"""Accuracy of estimated starts in the simulator (issue 10): exact when the future holds no surprise,
late when later arrivals outrank the job."""

from gpulane.core.sim.accuracy import estimates, summary
from gpulane.core.sim.scenario import Scenario


def scenario(**extra) -> Scenario:
    return Scenario.model_validate({
        "name": "t", "seed": 1, "models": [{"name": "m", "loadSeconds": 30}], "initialModel": "m",
        "streams": [{"name": "burst", "member": "a", "priority": "batch", "model": "m", "runSeconds": 60,
                     "count": 5, "submit": "burst", "at": 0}],
        **extra,
    })  # fmt: skip


def test_estimates_are_exact_when_run_times_are_known_and_nothing_else_arrives():
    found = estimates(scenario())
    assert [e.job for e in found] == ["burst-1", "burst-2", "burst-3", "burst-4"]  # burst-0 started at once
    assert [e.waited for e in found] == [60.0, 120.0, 180.0, 240.0]
    assert all(e.error == 0 for e in found)
    assert summary(found)["median_abs_error_s"] == 0


def test_later_arrivals_that_outrank_a_job_make_it_start_later_than_estimated():
    late = {"jobs": [{"name": "vip", "at": 30, "member": "b", "priority": 100, "model": "m", "runSeconds": 60}]}
    found = {e.job: e for e in estimates(scenario(**late))}
    assert found["burst-1"].error == -60.0, "the estimate could not know that vip would come"
    assert summary(list(found.values()))["bias_s"] < 0
