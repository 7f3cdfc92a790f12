import pytest

from gpulane.core.sim.engine import plan_jobs, simulate
from gpulane.core.sim.scenario import Scenario, ScenarioError, load_scenario

BASE = {
    "name": "t",
    "streams": [{"name": "s", "member": "m", "model": "x", "runSeconds": "1m", "submit": "burst", "count": 3}],
}


def write(tmp_path, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: [unclosed", "not valid YAML"),
        ("- just\n- a list\n", "a scenario is a mapping"),
        ("name: x\n", "at least one stream or job"),
        (
            "name: x\njobs: [{name: a, model: m, runSeconds: 5, priority: urgent}]\n",
            "jobs.0.priority: priority 'urgent' is neither an integer nor one of",
        ),
        ("name: x\njobs: [{name: a, model: m, runSeconds: soon}]\n", "jobs.0.runSeconds"),
        ("name: x\njobs: [{name: a, model: m, runSeconds: 5, tier: gold}]\n", "unknown tier(s) gold"),
        ("name: x\njobs: [{name: a, model: m, runSeconds: 5}, {name: a, model: m, runSeconds: 5}]\n", "repeated: a"),
        ("name: x\nstreams: [{name: s, member: m, model: x, runSeconds: 5, submit: chain}]\n", "needs a count"),
        ("name: x\nstreams: [{name: s, member: m, model: x, runSeconds: 5}]\n", "exactly one of submit"),
        (
            "name: x\nstreams: [{name: s, model: x, runSeconds: 5, count: 1, submit: burst}]\n",
            "exactly one of member or members",
        ),
        (
            "name: x\nstreams: [{name: s, member: m, model: x, runSeconds: 5, arrival: {everySeconds: 9}}]\n",
            "until or count",
        ),
        (
            "name: x\nstreams: [{name: s, member: m, model: x, runSeconds: {min: 9, max: 1}, count: 1,"
            " submit: burst}]\n",
            "min (9.0) is greater than max (1.0)",
        ),
        (
            "name: x\npolicy: {bandSpacing: 20}\njobs: [{name: a, model: m, runSeconds: 5}]\n",
            "bandSpacing 20 is too small",
        ),
        ("name: x\ncolour: blue\njobs: [{name: a, model: m, runSeconds: 5}]\n", "colour: Extra inputs"),
        (
            "name: x\njobs: [{name: a, model: m, runSeconds: 5, priority: 5000}]\n",
            "a: priority 5000 is outside this policy's bounds [-1000, 1000]",
        ),
        (
            "name: x\nmodels: [{name: m}, {name: m}]\njobs: [{name: a, model: m, runSeconds: 5}]\n",
            "model names must be unique, repeated: m",
        ),
        ("name: x\njobs: [{name: a, model: m, runSeconds: 5, member: ''}]\n", "jobs.0.member"),
        (
            "name: x\nstreams: [{name: s, members: [a, ''], model: x, runSeconds: 5, count: 1, submit: burst}]\n",
            "streams.0.members.1",
        ),
        (
            "name: x\nstreams: [{name: s, member: m, model: x, runSeconds: 5, arrival: {everySeconds: 9}, from: 2h,"
            " until: 1h}]\n",
            "until (3600s) must be after from (7200s)",
        ),
        ("name: x\njobs: [{name: a, model: m, runSeconds: 1.0e+300}]\n", "longer than 10 years"),
        (
            "name: x\nmodels: [{name: m, maxConcurrency: 0}]\njobs: [{name: a, model: m, runSeconds: 5}]\n",
            "models.0.maxConcurrency",
        ),
    ],
)
def test_bad_scenarios_get_a_clear_error_naming_the_file_and_field(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(path) in str(err.value)
    assert message in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "nope.yaml")


def test_members_are_used_in_turn_and_names_follow_stream_index():
    scenario = Scenario.model_validate(
        {**BASE, "streams": [{**BASE["streams"][0], "member": None, "members": ["a", "b"]}]}
    )
    records = [p.record for p in plan_jobs(scenario)]
    assert [(r.name, r.member) for r in records] == [("s-0", "a"), ("s-1", "b"), ("s-2", "a")]


def test_every_seconds_arrivals_respect_from_until():
    scenario = Scenario.model_validate(
        {
            "name": "t",
            "streams": [
                {
                    "name": "s",
                    "member": "m",
                    "model": "x",
                    "runSeconds": 1,
                    "arrival": {"everySeconds": "10m"},
                    "from": "1h",
                    "until": "2h",
                }
            ],
        }
    )
    assert [p.at for p in plan_jobs(scenario)] == [3600 + 600 * i for i in range(6)]


def test_chain_submits_the_next_job_when_the_previous_ends():
    scenario = Scenario.model_validate(
        {
            "name": "t",
            "models": [{"name": "x", "loadSeconds": 30}],
            "streams": [{**BASE["streams"][0], "submit": "chain", "at": 100}],
        }
    )
    jobs = simulate(scenario).jobs
    assert [j.submitted_at for j in jobs] == [100, 190, 250]  # first job pays the 30 s load
    assert [j.cold_start for j in jobs] == [True, False, False]


def test_initial_model_is_warm_at_t0():
    scenario = Scenario.model_validate({**BASE, "initialModel": "x"})
    assert not any(j.cold_start for j in simulate(scenario).jobs)


def test_undeclared_models_use_the_default_model():
    scenario = Scenario.model_validate({**BASE, "defaultModel": {"loadSeconds": 7}})
    first = simulate(scenario).jobs[0]
    assert first.started_at - first.dispatched_at == 7


def test_too_many_jobs_is_refused_before_memory_runs_out():
    scenario = Scenario.model_validate(
        {
            "name": "t",
            "streams": [
                {
                    "name": "flood",
                    "member": "m",
                    "model": "x",
                    "runSeconds": 1,
                    "arrival": {"poissonPerHour": 1e6},
                    "until": "12h",
                }
            ],
        }
    )
    with pytest.raises(ScenarioError, match="plans more than 200,000 jobs"):
        plan_jobs(scenario)


def test_undeclared_models_are_a_warning_not_an_error():
    scenario = Scenario.model_validate({**BASE, "models": [{"name": "y"}], "initialModel": "z"})
    assert scenario.warnings() == [
        "model 'x' is not declared under models; it loads in 30s (defaultModel)",
        "model 'z' is not declared under models; it loads in 30s (defaultModel)",
    ]
