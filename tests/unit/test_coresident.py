"""Issue 36 in the core: a lane whose server holds several models, switches between them without a new pod,
and gives the least recently served up when a new one does not fit its memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulane.cli import main
from gpulane.core.events import (
    Dispatch,
    JobFinished,
    JobSubmitted,
    LaneMemory,
    LaneUpdated,
    ModelLoaded,
    ModelRemoved,
    dispatches,
)
from gpulane.core.forecast import forecast
from gpulane.core.jobs import Job, ModelSpec
from gpulane.core.policy import Policy
from gpulane.core.sim.engine import simulate
from gpulane.core.sim.report import summarize
from gpulane.core.sim.scenario import Scenario, load_scenario

from .helpers import dispatcher

LLAMA = "llama"


def router_models(switch: float | None = 1.0) -> list[ModelSpec]:
    """Three models of one server on a lane of 10,000 MiB: a and b fit together, c beside one of them."""
    return [
        ModelSpec("a", load_seconds=5, server=LLAMA, memory_mib=4000, switch_seconds=switch),
        ModelSpec("b", load_seconds=5, server=LLAMA, memory_mib=4000, switch_seconds=switch),
        ModelSpec("c", load_seconds=5, server=LLAMA, memory_mib=6000, switch_seconds=switch),
        ModelSpec("solo", load_seconds=5),  # a pod of its own
    ]


def router_lane(memory: int | None = 10_000, switch: float | None = 1.0, **kw):  # type: ignore[no-untyped-def]
    d, clock = dispatcher(lanes={}, models=router_models(switch), **kw)
    d.handle(LaneMemory("gpu-0", memory or 0))
    d.handle(LaneUpdated("gpu-0"))
    return d, clock


def run(d, clock, name: str, model: str, **kw) -> Dispatch:  # type: ignore[no-untyped-def]
    """Submit one job, take its dispatch, let its model load if it must, and end it."""
    clock.now += 1
    (decision,) = dispatches(d.handle(JobSubmitted(Job(name, model, submitted_at=clock.now, **kw))))
    if decision.load:
        clock.now += 1
        d.handle(ModelLoaded("gpu-0", model, 1.0, in_server=decision.in_server))
    clock.now += 10
    d.handle(JobFinished(name, 10.0))
    return decision


def test_a_server_switches_to_a_model_it_holds_without_a_load_and_evicts_the_least_recently_served():
    d, clock = router_lane()
    first = run(d, clock, "j1", "a")
    assert (first.load, first.in_server, first.replaces) == (True, False, None)  # a new pod, its server starts

    second = run(d, clock, "j2", "b")
    assert (second.load, second.in_server, second.replaces, second.evicts) == (True, True, None, ())
    assert d.lane_state("gpu-0").loaded == {"a"}  # a stays loaded beside b

    back = run(d, clock, "j3", "a")
    assert (back.load, back.replaces) == (False, None)  # held already: no load at all
    assert d.lane_state("gpu-0").resident == "a" and d.lane_state("gpu-0").loaded == {"b"}

    big = run(d, clock, "j4", "c")  # 6,000 MiB: beside a (served last), not beside a and b
    assert (big.load, big.in_server, big.evicts) == (True, True, ("b",))
    assert d.lane_state("gpu-0").loaded == {"a"}


def test_a_switch_starts_the_job_at_once_and_charges_no_load():
    d, clock = router_lane()
    run(d, clock, "j1", "a")
    run(d, clock, "j2", "b")
    clock.now += 1
    (decision,) = dispatches(d.handle(JobSubmitted(Job("j3", "a", submitted_at=clock.now))))
    assert not decision.load
    assert d.placed("j3").started_at == clock.now  # the lane is ready: no ModelLoaded to wait for


def test_a_model_outside_the_server_replaces_the_pod_and_everything_it_held():
    d, clock = router_lane()
    run(d, clock, "j1", "a")
    run(d, clock, "j2", "b")
    solo = run(d, clock, "j3", "solo")
    assert (solo.load, solo.in_server, solo.replaces) == (True, False, "b")
    state = d.lane_state("gpu-0")
    assert state.resident == "solo" and state.loaded == frozenset()
    after = run(d, clock, "j4", "a")  # no server runs any more: a new pod again
    assert (after.load, after.in_server) == (True, False)


def test_a_lane_that_states_no_memory_holds_one_model_but_still_switches_in_its_server():
    d, clock = router_lane(memory=None)
    run(d, clock, "j1", "a")
    second = run(d, clock, "j2", "b")
    assert (second.load, second.in_server, second.evicts) == (True, True, ("a",))
    assert d.lane_state("gpu-0").loaded == frozenset()


def test_a_switch_is_learned_apart_from_a_cold_load():
    d, clock = router_lane(switch=None)
    run(d, clock, "j1", "a")
    assert d.models.get("a").switch_seconds is None
    clock.now += 1
    d.handle(JobSubmitted(Job("j2", "b", submitted_at=clock.now)))
    d.handle(ModelLoaded("gpu-0", "b", 0.5, in_server=True))
    assert d.models.get("b").switch_seconds == 0.5  # the first, as it is: a cold load's time says little of it
    assert d.models.get("b").load_seconds == 5  # a cold load is learned apart
    d.models.observe_switch("c", 1.5)
    d.models.observe_switch("c", 0.5)
    assert d.models.get("c").switch_seconds == 1.5 + 0.2 * (0.5 - 1.5)  # then an average


def test_affinity_is_all_of_the_bonus_for_a_loaded_model_and_what_a_switch_saves_for_the_others():
    policy = Policy(affinityBonus=10)
    d, clock = router_lane(policy=policy)
    run(d, clock, "j1", "a")
    run(d, clock, "j2", "b")  # a and b held, c not
    now = clock.now
    share = 1 - 1.0 / 5  # a switch of 1 s against a new pod's 5 s
    scores = {m: d.score(Job(f"x-{m}", m, submitted_at=now), "gpu-0", now).affinity for m in ("a", "b", "c", "solo")}
    assert scores == {"a": 10, "b": 10, "c": 10 * share, "solo": 0}


def test_a_cheap_switch_lets_an_older_job_go_ahead_of_the_loaded_models_newer_one():
    """With a new pod to pay for, affinity keeps the lane on its model for a job 9 aging-points younger; with a
    switch that saves 80% of it, the resident model's lead is 2 points, and the older job goes first."""

    def winner(models: list[ModelSpec]) -> str:
        policy = Policy(affinityBonus=10)
        d, clock = dispatcher(lanes={}, models=models, policy=policy)
        d.handle(LaneMemory("gpu-0", 4000))
        d.handle(LaneUpdated("gpu-0"))
        run(d, clock, "warm", "a")
        clock.now += 1
        old_at, young_at = clock.now, clock.now + 9 * policy.aging_divisor_seconds
        clock.now = young_at
        (decision,) = dispatches(
            d.handle_all(
                [
                    JobSubmitted(Job("old", "c", submitted_at=old_at)),
                    JobSubmitted(Job("young", "a", submitted_at=young_at)),
                ]
            )
        )
        return decision.job.id

    pods = [ModelSpec("a", load_seconds=5), ModelSpec("c", load_seconds=5)]
    assert winner(pods) == "young"
    assert winner(router_models()) == "old"


def test_a_removed_model_leaves_the_servers_held_models():
    d, clock = router_lane()
    run(d, clock, "j1", "a")
    run(d, clock, "j2", "b")
    d.handle(ModelRemoved("a"))
    assert d.lane_state("gpu-0").loaded == frozenset()
    assert d.lane_state("gpu-0").resident == "b"


def test_the_forecast_plays_switches_at_their_cost():
    """Three jobs alternating between two held models: no load between them in the forecast."""
    d, clock = router_lane()
    run(d, clock, "j1", "a")
    run(d, clock, "j2", "b")
    clock.now += 1
    d.handle(JobSubmitted(Job("busy", "b", submitted_at=clock.now)))  # holds the lane
    for i, model in enumerate("aba"):
        d.handle(JobSubmitted(Job(f"q{i}", model, submitted_at=clock.now + i + 1)))
    starts = [f.start for f in forecast(d)]
    runs = d.models.get("a").run_seconds
    assert starts == [clock.now + runs * k for k in (1, 2, 3)]


# -- the simulated day --------------------------------------------------------------------------------

DAY = Path(__file__).resolve().parents[2] / "scenarios" / "gpu-day.yaml"


def test_the_day_on_a_server_that_switches_spends_less_gpu_time_loading_than_a_pod_per_model():
    """scenarios/gpu-day.yaml: with the chat and embedding models in one llama-server, fewer pods are replaced
    and less GPU time goes to loading than on today's lanes, under gpulane and under llama-swap (groups)."""
    scenario = load_scenario(DAY)
    for policy in ("gpulane", "llama-swap"):
        served = summarize(simulate(scenario, policy), 100)["overall"]
        restart = summarize(simulate(scenario.without_servers(), policy), 100)["overall"]
        assert served["switches"] > 0 and restart["switches"] == 0
        assert served["swaps"] < restart["swaps"] / 2
        assert served["loadingGpuSeconds"] < 0.85 * restart["loadingGpuSeconds"]


def test_a_switch_in_the_simulator_takes_the_switch_time_and_a_held_model_none():
    scenario = Scenario.model_validate(
        {
            "name": "two",
            "laneMemoryMib": 10_000,
            "models": [
                {"name": "a", "loadSeconds": 10, "server": "s", "memoryMib": 4000, "switchSeconds": 2},
                {"name": "b", "loadSeconds": 10, "server": "s", "memoryMib": 4000, "switchSeconds": 3},
            ],
            "jobs": [
                {"name": "j1", "at": 0, "member": "m", "model": "a", "runSeconds": 5},
                {"name": "j2", "at": 100, "member": "m", "model": "b", "runSeconds": 5},
                {"name": "j3", "at": 200, "member": "m", "model": "a", "runSeconds": 5},
            ],
        }
    )
    jobs = {j.name: j for j in simulate(scenario).jobs}
    assert [jobs[n].load_seconds for n in ("j1", "j2", "j3")] == [10, 3, 0]  # a new pod, a switch, held
    assert [jobs[n].switched for n in ("j1", "j2", "j3")] == [False, True, True]
    assert jobs["j3"].wait == 0


def test_compare_runs_a_policy_on_todays_lanes_too(capsys):  # type: ignore[no-untyped-def]
    assert main(["simulate", str(DAY), "--compare", "gpulane,gpulane:restart"]) == 0
    out = capsys.readouterr().out
    assert "gpulane:restart" in out and "switches in the server" in out and "GPU time loading" in out


def test_compare_refuses_an_unknown_policy_with_restart():
    with pytest.raises(SystemExit):
        main(["simulate", str(DAY), "--compare", "lottery:restart"])


def test_a_lane_whose_pod_is_gone_or_idled_out_holds_nothing_any_more():
    """The runner stops the pod of a lane that has no model serving: the core must not think its server still
    holds models (a job for one would start on a fresh server that never loaded it)."""
    d, clock = router_lane()
    run(d, clock, "j1", "a")
    run(d, clock, "j2", "b")
    d.handle(LaneUpdated("gpu-0", resident=None))  # its pod was lost
    state = d.lane_state("gpu-0")
    assert state is not None and (state.resident, state.loaded) == (None, frozenset())
    after = run(d, clock, "j3", "a")
    assert (after.load, after.in_server) == (True, False)  # a new pod, which loads it


def test_a_lane_whose_server_serves_no_known_model_still_switches_inside_it() -> None:
    """After a restart or a failed load the lane's resident is the server itself (its pod is up, holding a):
    a job for a model of that server is a switch inside it, not a new pod in place of the server."""
    d, clock = dispatcher(lanes={}, models=[*router_models(), ModelSpec(LLAMA, load_seconds=5)])
    d.handle(LaneMemory("gpu-0", 10_000))
    d.handle(LaneUpdated("gpu-0", resident=LLAMA, loaded=frozenset({"a"})))
    held = run(d, clock, "j1", "a")
    assert (held.load, held.replaces) == (False, None)  # a is held: no load at all
    switch = run(d, clock, "j2", "b")
    assert (switch.load, switch.in_server, switch.replaces) == (True, True, None)
