"""A deleted model leaves its lanes (review finding: a deleted GpuModel's pod served on): the core drops it
from a lane at once when nothing runs there, else once its jobs end, and dispatches nothing there meanwhile."""

from __future__ import annotations

from gpulane.core.events import Expired, JobFinished, ModelLoaded, ModelRemoved, UnloadAll
from gpulane.core.jobs import ModelSpec

from .helpers import dispatcher, names, submit

MODELS = [ModelSpec("evil", load_seconds=10, run_seconds=100), ModelSpec("chat", load_seconds=10, run_seconds=10)]


def test_an_idle_lane_gives_a_removed_model_up_at_once():
    d, clock = dispatcher(lanes={"gpu-0": None}, models=MODELS)
    submit(d, clock, "one", model="evil")
    d.handle(ModelLoaded("gpu-0", "evil"))
    d.handle(JobFinished("one"))
    assert d.lanes["gpu-0"].resident == "evil"  # kept loaded for the next job, as always
    d.handle(ModelRemoved("evil"))
    lane = d.lanes["gpu-0"]
    assert (lane.resident, lane.evicting) == (None, False)


def test_a_busy_lane_takes_no_new_job_and_drops_the_model_when_its_jobs_end():
    d, clock = dispatcher(lanes={"gpu-0": None}, models=MODELS)
    submit(d, clock, "running", model="evil")
    d.handle(ModelLoaded("gpu-0", "evil"))
    d.handle(ModelRemoved("evil"))
    assert d.lanes["gpu-0"].resident == "evil" and d.lanes["gpu-0"].evicting  # never interrupts running work
    # A job of the same name (a GpuModel created again) or of another model waits: the lane is draining.
    assert submit(d, clock, "again", model="evil", member="b") == []
    assert submit(d, clock, "chat", model="chat", member="c") == []
    clock.now = 50
    after = d.handle(JobFinished("running"))
    # The model is gone from the lane; the best waiting job loads afresh (a new pod, from the new spec).
    assert names(after) == ["again"] and after[0].load and after[0].replaces is None
    assert d.lanes["gpu-0"].evicting is False


def test_a_removed_model_that_no_lane_holds_changes_nothing_and_an_expired_load_ends_the_drain():
    d, clock = dispatcher(lanes={"gpu-0": None}, models=MODELS)
    submit(d, clock, "loading", model="evil", queue_timeout_seconds=30)  # dispatched, its load not done
    d.handle(ModelRemoved("chat"))
    assert d.lanes["gpu-0"].resident == "evil" and not d.lanes["gpu-0"].evicting
    d.handle(ModelRemoved("evil"))
    assert d.lanes["gpu-0"].evicting
    assert d.fork(clock).lanes["gpu-0"].evicting  # a forecast sees the lane draining too
    # The job waits past its deadline before its load is done: it leaves the lane, which is then empty.
    clock.now = 31
    [expired] = d.decide()
    assert isinstance(expired, Expired) and (expired.job.id, expired.lane) == ("loading", "gpu-0")
    assert d.lanes["gpu-0"].resident is None and not d.lanes["gpu-0"].evicting


def test_unload_all_drains_every_lane_and_the_next_jobs_load_afresh():
    """llama-swap's /unload (issue 33): every lane gives its GPU back once its running jobs end."""
    d, clock = dispatcher(lanes={"gpu-0": None, "gpu-1": None}, models=MODELS)
    submit(d, clock, "busy", model="evil")
    submit(d, clock, "idle", model="chat", member="b")
    d.handle(ModelLoaded("gpu-0", "evil"))
    d.handle(ModelLoaded("gpu-1", "chat"))
    d.handle(JobFinished("idle"))
    d.handle(UnloadAll())
    assert d.lanes["gpu-1"].resident is None  # idle: at once
    assert d.lanes["gpu-0"].resident == "evil" and d.lanes["gpu-0"].evicting  # its job runs on
    [again] = submit(d, clock, "again", model="evil", member="c")
    assert again.lane == "gpu-1" and again.load  # not onto the draining lane, though it holds the model
    d.handle(JobFinished("busy"))
    assert d.lanes["gpu-0"].resident is None and not d.lanes["gpu-0"].evicting
