import pytest

from gpulane.core.events import JobFinished, LaneUpdated, ModelLoaded
from gpulane.core.forecast import forecast, forecasting
from gpulane.core.jobs import ModelSpec

from .helpers import dispatcher, submit

MODELS = [ModelSpec("sdxl", load_seconds=30, run_seconds=60), ModelSpec("h3", load_seconds=90, run_seconds=240)]


def by_id(items):
    return {f.job_id: f for f in items}


def test_positions_and_start_estimates_follow_the_dispatch_order():
    d, clock = dispatcher(lanes={"gpu-0": "h3"}, models=MODELS)
    submit(d, clock, "shot-1", model="h3", priority=-100, member="alice")  # runs now, ends at 240
    submit(d, clock, "shot-2", model="h3", priority=-100, member="alice")
    submit(d, clock, "image", model="sdxl", priority=100, member="bob")
    clock.now = 100
    result = by_id(forecast(d))
    assert [result[j].position for j in ("image", "shot-2")] == [1, 2]
    assert result["image"].start == pytest.approx(240 + 30)  # after the shot, plus loading sdxl
    assert result["shot-2"].start == pytest.approx(240 + 30 + 60 + 90)  # image runs, h3 reloads
    assert result["image"].lane == "gpu-0"


def test_forecast_does_not_touch_the_real_dispatcher():
    d, clock = dispatcher(models=MODELS)
    for i in range(5):
        submit(d, clock, f"j{i}", model="sdxl")
    before = (d.pending_count, dict(d.running), len(d.history), d.models.get("sdxl"))
    forecast(d)
    assert (d.pending_count, dict(d.running), len(d.history), d.models.get("sdxl")) == before
    assert [x.job.id for x in d.handle(JobFinished("j0"))] == ["j1"]


def test_a_forecast_taken_step_by_step_plays_the_queue_as_it_was_at_its_first_step():
    """Issue 35: the operator lets its loop run between the steps of a long queue's forecast; what changes
    meanwhile (a dispatch, a new job) belongs to the next forecast, not to this one."""
    d, clock = dispatcher(models=MODELS)
    for i in range(6):
        submit(d, clock, f"j{i}", model="sdxl")
    whole = forecast(d)
    steps = forecasting(d)
    first = next(steps)
    submit(d, clock, "late", model="sdxl", priority=100)  # would go first now
    d.handle(JobFinished("j0"))
    assert [first, *steps] == whole
    assert "late" not in {f.job_id for f in whole}


def test_overdue_running_jobs_are_assumed_to_end_now():
    d, clock = dispatcher(lanes={"gpu-0": "sdxl"}, models=MODELS)
    submit(d, clock, "slow", model="sdxl")
    submit(d, clock, "next", model="sdxl")
    clock.now = 1000  # "slow" was expected to end at 60
    assert by_id(forecast(d))["next"].start == pytest.approx(1000)


def test_jobs_without_an_online_lane_are_ranked_but_not_timed():
    d, clock = dispatcher(models=MODELS)
    d.handle(LaneUpdated("gpu-0", online=False))
    submit(d, clock, "low", model="sdxl", priority=-100)
    submit(d, clock, "high", model="sdxl", priority=100)
    result = forecast(d)
    assert [(f.job_id, f.position, f.lane, f.start) for f in result] == [
        ("high", 1, None, None),
        ("low", 2, None, None),
    ]


def test_expected_run_seconds_on_the_job_override_the_model():
    d, clock = dispatcher(lanes={"gpu-0": "sdxl"}, models=MODELS)
    submit(d, clock, "long", model="sdxl", expected_run_seconds=600)
    submit(d, clock, "after", model="sdxl")
    assert by_id(forecast(d))["after"].start == pytest.approx(600)


def test_two_lanes_forecast_in_parallel():
    d, clock = dispatcher(lanes={"gpu-0": "sdxl", "gpu-1": "sdxl"}, models=MODELS)
    for i in range(6):
        submit(d, clock, f"j{i}", model="sdxl")
    starts = sorted(f.start for f in forecast(d))
    assert starts == pytest.approx([60, 60, 120, 120])


def test_a_job_that_loaded_its_model_is_timed_from_the_end_of_the_load():
    d, clock = dispatcher(models=MODELS)
    submit(d, clock, "shot", model="h3")  # cold: 90 s load, then 240 s
    submit(d, clock, "next", model="h3")
    clock.now = 90
    d.handle(ModelLoaded("gpu-0", "h3"))
    clock.now = 100
    assert by_id(forecast(d))["next"].start == pytest.approx(90 + 240)


def test_a_job_joining_a_lane_that_is_still_loading_waits_for_the_load():
    models = [ModelSpec("llm", max_concurrency=2, load_seconds=90, run_seconds=240)]
    d, clock = dispatcher(models=models)
    submit(d, clock, "first", model="llm")
    clock.now = 30
    submit(d, clock, "second", model="llm")  # joins the free slot while the model loads
    submit(d, clock, "third", model="llm")
    assert d.running["second"].started_at is None
    # Both running jobs end at 90 + 240; the third starts then.
    assert by_id(forecast(d))["third"].start == pytest.approx(330)
    clock.now = 90
    d.handle(ModelLoaded("gpu-0", "llm"))
    assert d.running["second"].started_at == 90


def test_jobs_ending_at_one_instant_free_their_lanes_together_in_the_forecast():
    """Both lanes free at 240: the image goes to the lane with sdxl loaded, the shot to the h3 lane."""
    d, clock = dispatcher(lanes={"gpu-0": "h3", "gpu-1": "sdxl"}, models=MODELS)
    submit(d, clock, "shot-1", model="h3", member="alice", expected_run_seconds=240)  # gpu-0, first to end
    submit(d, clock, "image-1", model="sdxl", member="bob", expected_run_seconds=240)  # gpu-1, ends with it
    submit(d, clock, "image-2", model="sdxl", priority=100, member="bob")
    submit(d, clock, "shot-2", model="h3", member="alice")
    result = by_id(forecast(d))
    assert (result["image-2"].lane, result["image-2"].start) == ("gpu-1", 240)  # no swap
    assert (result["shot-2"].lane, result["shot-2"].start) == ("gpu-0", 240)
