"""A model's ttl (issue 33, llama-swap's `ttl`): a lane idle that long with the model loaded gives it up, so
that the GPU is free for anything else on the box; the next job loads a model again."""

from __future__ import annotations

from gpulane.core.events import JobFinished, ModelLoaded, Unloaded
from gpulane.core.jobs import ModelSpec

from .helpers import dispatcher, names, submit

MODELS = [ModelSpec("chat", load_seconds=5, run_seconds=10, ttl_seconds=300), ModelSpec("kept", run_seconds=10)]


def test_an_idle_lane_gives_the_model_up_at_its_ttl_and_the_next_job_loads_it_again():
    d, clock = dispatcher(lanes={"gpu-0": None}, models=MODELS)
    submit(d, clock, "one", model="chat")
    d.handle(ModelLoaded("gpu-0", "chat"))
    clock.now = 20
    d.handle(JobFinished("one"))
    assert d.next_deadline() == 320  # the tick wakes the dispatcher then
    clock.now = 319
    assert d.decide() == [] and d.lanes["gpu-0"].resident == "chat"
    clock.now = 320
    assert d.decide() == [Unloaded("gpu-0", "chat", 300, 320)]
    assert d.lanes["gpu-0"].resident is None and d.next_deadline() is None
    clock.now = 400
    [again] = submit(d, clock, "two", model="chat")
    assert again.load and again.replaces is None  # a new pod: the lane held nothing


def test_a_job_within_the_ttl_keeps_the_model_and_a_running_job_is_never_idle():
    d, clock = dispatcher(lanes={"gpu-0": None}, models=MODELS)
    submit(d, clock, "one", model="chat")
    d.handle(ModelLoaded("gpu-0", "chat"))
    clock.now = 1000  # far past the ttl, but the job ran all along
    assert d.decide() == [] and d.next_deadline() is None
    d.handle(JobFinished("one"))
    clock.now = 1200
    [reused] = submit(d, clock, "two", model="chat")  # 200 s idle: still loaded
    assert not reused.load
    clock.now = 1250
    d.handle(JobFinished("two"))
    assert d.next_deadline() == 1550  # the idle time starts afresh at the last job's end


def test_a_model_without_a_ttl_stays_loaded():
    d, clock = dispatcher(lanes={"gpu-0": None}, models=MODELS)
    submit(d, clock, "one", model="kept")
    d.handle(ModelLoaded("gpu-0", "kept"))
    d.handle(JobFinished("one"))
    clock.now = 10**6
    assert d.next_deadline() is None and d.decide() == []
    assert d.lanes["gpu-0"].resident == "kept"
    assert names(submit(d, clock, "two", model="kept")) == ["two"]


def test_a_forecast_sees_the_idle_time():
    d, clock = dispatcher(lanes={"gpu-0": None}, models=MODELS)
    submit(d, clock, "one", model="chat")
    d.handle(ModelLoaded("gpu-0", "chat"))
    d.handle(JobFinished("one"))
    assert d.fork(clock).next_deadline() == d.next_deadline() == 300
