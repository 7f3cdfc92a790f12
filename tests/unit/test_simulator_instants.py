"""Events at the same instant: the simulator applies them all before the dispatcher decides."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpulane.core.baselines import RANKINGS
from gpulane.core.sim.engine import SimResult, simulate
from gpulane.core.sim.report import jobs_json
from gpulane.core.sim.scenario import Scenario

FILM_AND_IMAGE: dict[str, Any] = {
    "name": "t",
    "initialModel": "h3",
    "models": [{"name": "h3", "loadSeconds": 90}, {"name": "sdxl", "loadSeconds": 30}],
    "streams": [
        {
            "name": "film",
            "member": "alice",
            "tier": "max",
            "priority": "batch",
            "model": "h3",
            "runSeconds": 240,
            "count": 3,
            "submit": "burst",
        }
    ],
    "jobs": [
        {"name": "image", "at": 240, "member": "bob", "priority": "interactive", "model": "sdxl", "runSeconds": 30}
    ],
}


def dispatched(result: SimResult, name: str) -> float | None:
    return next(j.dispatched_at for j in result.jobs if j.name == name)


@pytest.mark.parametrize(("policy", "at"), [("strict", 240), ("gpulane", 240), ("per-job-aging", 240), ("fifo", 720)])
def test_a_job_arriving_exactly_at_a_finish_wins_the_slot_when_it_scores_higher(policy, at):
    result = simulate(Scenario.model_validate(FILM_AND_IMAGE), policy)
    assert dispatched(result, "image") == at  # fifo serves arrival order: the image is last


def test_llama_swap_keeps_the_loaded_model_when_an_arrival_meets_a_finish():
    result = simulate(Scenario.model_validate(FILM_AND_IMAGE), "llama-swap")
    assert dispatched(result, "image") == 720


@pytest.mark.parametrize("policy", RANKINGS)
def test_a_chained_job_arrives_after_the_decision_on_its_predecessors_end(policy):
    """The next shot is the client's reaction to the end of the last one: a waiting image goes first."""
    scenario = Scenario.model_validate(
        {
            **FILM_AND_IMAGE,
            "streams": [{**FILM_AND_IMAGE["streams"][0], "submit": "chain"}],
            "jobs": [{**FILM_AND_IMAGE["jobs"][0], "at": 100}],
        }
    )
    result = simulate(scenario, policy)
    assert dispatched(result, "image") == 240
    assert [dispatched(result, f"film-{i}") for i in range(3)] == [0, 240 + 30 + 30, 240 + 30 + 30 + 90 + 240]


def test_a_run_with_many_coincident_events_is_reproduced_exactly():
    scenario = Scenario.model_validate(
        {
            "name": "t",
            "streams": [
                {
                    "name": f"s{i}",
                    "member": f"m{i}",
                    "priority": priority,
                    "model": model,
                    "runSeconds": 60,
                    "arrival": {"everySeconds": 60},
                    "until": "1h",
                }
                for i, (priority, model) in enumerate([(0, "a"), (0, "b"), (100, "a"), (-100, "b")])
            ],
        }
    )
    for policy in RANKINGS:
        assert json.dumps(jobs_json(simulate(scenario, policy))) == json.dumps(jobs_json(simulate(scenario, policy)))


# -- the property: ties between events never decide the outcome ---------------------------------

GRID = 60  # every time is a whole minute, so events coincide often
# Aging divisor = a minute times the golden ratio: a difference of n score points is then never
# within 0.05 s of a whole number of minutes (n <= 400), so only equal (priority + tier + affinity)
# can tie, and each stream below has its own member and a priority at least 25 from the others'.
DIVISOR = GRID * 1.6180339887
PRIORITIES = [-100, -60, -25, 0, 25, 60, 100, 150]

stream_specs = st.tuples(
    st.sampled_from(["free", "pro", "max"]),
    st.sampled_from(["a", "b", "c"]),
    st.integers(1, 6),  # run, minutes
    st.one_of(
        st.tuples(st.just("burst"), st.integers(1, 8), st.integers(0, 90)),  # count, at (minutes)
        st.tuples(st.just("arrival"), st.integers(1, 20), st.integers(0, 60)),  # every, from (minutes)
    ),
)


def random_scenario(specs: list, priorities: list[int], loads: list[int], initial: str | None) -> dict[str, Any]:
    streams = []
    for i, ((tier, model, run, (kind, n, start)), priority) in enumerate(zip(specs, priorities, strict=True)):
        stream: dict[str, Any] = {
            "name": f"s{i}",
            "member": f"m{i}",
            "tier": tier,
            "priority": priority,
            "model": model,
            "runSeconds": run * GRID,
        }
        if kind == "burst":
            stream |= {"submit": "burst", "count": n, "at": start * GRID}
        else:
            stream |= {"arrival": {"everySeconds": n * GRID}, "from": start * GRID, "until": (start + 150) * GRID}
        streams.append(stream)
    return {
        "name": "random",
        # A load yields to an arrival before its end, not at it: a boundary, not a tie, so it is off.
        "policy": {"agingDivisorSeconds": DIVISOR, "loadYield": False},
        "initialModel": initial,
        "models": [{"name": m, "loadSeconds": load * GRID} for m, load in zip("abc", loads, strict=True)],
        "streams": streams,
        # llama-swap really refuses a request that comes a millisecond before a place frees: a
        # boundary of its cap, not a tie between events, so the cap stays out of reach here.
        "llamaSwap": {"concurrencyLimit": 10_000},
    }


def dispatch_order(result: SimResult) -> list[tuple[float | None, str]]:
    return sorted((j.dispatched_at, j.name) for j in result.jobs)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(stream_specs, min_size=2, max_size=4),
    data=st.data(),
    loads=st.lists(st.integers(0, 3), min_size=3, max_size=3),
    initial=st.sampled_from([None, "a", "b"]),
    policy=st.sampled_from(RANKINGS),
)
def test_arrivals_that_coincide_with_other_events_dispatch_as_if_they_came_a_millisecond_earlier(
    specs, data, loads, initial, policy
):
    priorities = data.draw(st.permutations(PRIORITIES))[: len(specs)]
    raw = random_scenario(specs, priorities, loads, initial)
    result = simulate(Scenario.model_validate(raw), policy)
    # Ends and completed loads: the lane was busy just before them, so an arrival a millisecond
    # earlier waits for the same instant instead of starting on an idle lane.
    ends = {j.finished_at for j in result.jobs} | {j.started_at for j in result.jobs if j.started_at != j.dispatched_at}
    coinciding = {j.name for j in result.jobs if j.submitted_at in ends}
    assume(coinciding)
    # The same jobs as one-off jobs, the coinciding ones submitted a millisecond earlier.
    shifted = {
        **raw,
        "streams": [],
        "jobs": [
            {
                "name": j.name,
                "at": j.submitted_at - 0.001 if j.name in coinciding else j.submitted_at,
                "member": j.member,
                "tier": j.tier,
                "priority": j.priority,
                "model": j.model,
                "runSeconds": j.run_seconds,
            }
            for j in result.jobs  # in plan order, which orders arrivals within an instant
        ],
    }
    assert dispatch_order(simulate(Scenario.model_validate(shifted), policy)) == dispatch_order(result)
