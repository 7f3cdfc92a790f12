"""A model pinned to some lanes (issue 37: its GpuModel's laneSelector): it is never dispatched on another lane,
and a lane it may not use takes the best job it may serve instead of idling."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulane.core.events import Dispatch, JobFinished, ModelLoaded, ModelUpdated
from gpulane.core.forecast import forecast
from gpulane.core.jobs import ModelSpec
from gpulane.core.policy import Policy

from .helpers import dispatcher, names, submit

BIG = ModelSpec("big", load_seconds=60, run_seconds=600, lanes=frozenset({"gpu-big"}))
SMALL = ModelSpec("small", load_seconds=10, run_seconds=30)


@pytest.mark.parametrize("fair_share", ["usage", "turns"])
def test_a_pinned_model_waits_for_its_lane_and_the_other_lane_serves_what_it_may(fair_share):
    d, clock = dispatcher(lanes={"gpu-0": None, "gpu-big": None}, models=[BIG, SMALL],
                          policy=Policy(fairShare=fair_share))  # fmt: skip
    first = submit(d, clock, "big-1", model="big", priority=100)
    assert [(x.job.id, x.lane) for x in first] == [("big-1", "gpu-big")]
    # gpu-0 is idle, but may not serve big: the second big job waits for gpu-big, and gpu-0 takes small.
    assert submit(d, clock, "big-2", model="big", priority=100) == []
    [small] = submit(d, clock, "small-1", model="small", priority=-100)
    assert small.lane == "gpu-0"
    d.handle(ModelLoaded("gpu-big", "big"))
    clock.now = 600
    [again] = d.handle(JobFinished("big-1"))
    assert (again.job.id, again.lane) == ("big-2", "gpu-big")
    assert [f.lane for f in forecast(d)] == []  # nothing waits


def test_a_lane_skips_a_better_job_it_may_not_serve_for_the_best_it_may():
    d, clock = dispatcher(lanes={"gpu-0": None}, models=[BIG, SMALL])
    submit(d, clock, "big", model="big", priority=100)  # the best job, pinned to a lane that does not exist
    [decision] = submit(d, clock, "small", model="small", priority=-100)
    assert decision.job.id == "small" and decision.lane == "gpu-0"
    assert d.pending_count == 1 and [f.lane for f in forecast(d)] == [None]  # big has no lane to wait for


def test_pinning_a_model_later_moves_its_next_jobs_and_the_loaded_lane_stops_taking_them():
    d, clock = dispatcher(lanes={"gpu-0": "small", "gpu-1": None}, models=[SMALL])
    d.handle(ModelLoaded("gpu-0", "small"))
    assert names(submit(d, clock, "a", model="small")) == ["a"]  # warm on gpu-0
    d.handle(ModelUpdated(replace(SMALL, lanes=frozenset({"gpu-1"}))))
    [b] = submit(d, clock, "b", model="small")
    assert (b.lane, b.load) == ("gpu-1", True)  # not gpu-0, though small is loaded there
    clock.now = 30
    assert d.handle(JobFinished("a")) == []  # gpu-0 has nothing it may serve


def test_the_catalog_names_what_a_lane_may_not_serve():
    d, _ = dispatcher(models=[BIG, SMALL])
    assert d.models.excluded_on("gpu-0") == {"big"} and d.models.excluded_on("gpu-big") == frozenset()
    d.handle(ModelUpdated(replace(BIG, lanes=None)))
    assert d.models.excluded_on("gpu-0") == frozenset()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["big", "small", "mid"]), st.integers(-100, 100), st.booleans()), max_size=40)
)
def test_a_pinned_model_is_never_dispatched_elsewhere(ops):
    mid = ModelSpec("mid", lanes=frozenset({"gpu-0", "gpu-big"}))
    d, clock = dispatcher(lanes={"gpu-0": None, "gpu-1": None, "gpu-big": None}, models=[BIG, SMALL, mid])
    allowed = {"big": {"gpu-big"}, "mid": {"gpu-0", "gpu-big"}, "small": {"gpu-0", "gpu-1", "gpu-big"}}
    for i, (model, priority, finish) in enumerate(ops):
        clock.now += 5
        decisions = names_lanes(submit(d, clock, f"j{i}", model=model, priority=priority, member=f"m{i % 3}"))
        if finish and d.running:
            decisions += names_lanes(d.handle(JobFinished(sorted(d.running)[0])))
        for job, lane in decisions:
            assert lane in allowed[job.model], f"{job.id} ({job.model}) on {lane}"
    for lane in d.lanes.values():
        if not lane.running and d.pending_count:  # an idle lane: nothing it may serve waits
            assert all(lane.id not in allowed[j.model] for j in d.pending()), lane.id


def names_lanes(effects):
    return [(e.job, e.lane) for e in effects if isinstance(e, Dispatch)]
