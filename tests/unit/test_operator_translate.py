"""Unit tests of gpulane/operator/translate.py: Kubernetes bodies (plain dicts) to core values and back."""

import datetime

import pytest
from pydantic import ValidationError

from gpulane.api.resources import GpuJobSpec, GpuModelSpec
from gpulane.api.times import format_duration, format_time, parse_time
from gpulane.core.jobs import Job, ModelSpec
from gpulane.core.policy import Policy
from gpulane.core.score import ScoreBreakdown
from gpulane.core.validation import describe
from gpulane.operator import translate
from gpulane.operator.job_table import job_key
from gpulane.operator.translate import (
    Arrivals,
    Refusal,
    band_label,
    model_spec,
    score_fields,
)

# 2024-05-01T12:00:00Z
T0 = 1714564800.0
T0_TEXT = "2024-05-01T12:00:00Z"


def body(spec: object, *, name: str = "job-1", namespace: str = "team-a", created: str | None = T0_TEXT) -> dict:
    meta: dict = {"name": name, "namespace": namespace}
    if created is not None:
        meta["creationTimestamp"] = created
    return {"apiVersion": "gpulane.io/v1alpha1", "kind": "GpuJob", "metadata": meta, "spec": spec}


def job_from_body(b: dict, policy: Policy | None, seen: float, arrivals: Arrivals | None = None) -> Job | Refusal:
    """The translation under test, given the key the table gives the job."""
    return translate.job_from_body(b, job_key(b), policy, seen, arrivals)


def refusal(spec: object, policy: Policy | None = None) -> Refusal:
    result = job_from_body(body(spec), policy or Policy(), T0)
    assert isinstance(result, Refusal), f"expected a refusal, got {result!r}"
    return result


# -- job_from_body: accepted -------------------------------------------------------------------


def test_valid_body_becomes_a_core_job():
    spec = {"model": "llama-3.1-8b", "priority": "interactive", "tier": "pro", "member": "alice"}
    job = job_from_body(body(spec), Policy(), T0)
    assert job == Job(
        id="team-a/job-1",
        model="llama-3.1-8b",
        priority=100,
        tier="pro",
        member="alice",
        submitted_at=T0,
        expected_run_seconds=None,
        team="team-a",  # its namespace: fair share's upper level
    )


@pytest.mark.parametrize(
    ("priority", "expected"),
    [
        ("interactive", 100),
        ("normal", 0),
        ("batch", -100),
        ("-100", -100),
        ("+250", 250),
        (-7, -7),
        (1000, 1000),
        (-1000, -1000),
    ],
)
def test_priority_aliases_and_integer_strings_are_resolved(priority, expected):
    job = job_from_body(body({"model": "m", "priority": priority}), Policy(), T0)
    assert isinstance(job, Job)
    assert job.priority == expected
    assert isinstance(job.priority, int)


def test_defaults_priority_zero_tier_free_and_member_is_the_namespace():
    job = job_from_body(body({"model": "m"}, namespace="research"), Policy(), T0)
    assert isinstance(job, Job)
    assert job.priority == 0
    assert job.tier == "free"
    assert job.member == "research"


def test_explicit_member_wins_over_the_namespace():
    job = job_from_body(body({"model": "m", "member": "bob"}, namespace="research"), Policy(), T0)
    assert isinstance(job, Job)
    assert job.member == "bob"


def test_submitted_at_is_the_first_sight_inside_the_creation_second_to_the_millisecond():
    created = body({"model": "m"}, created="2024-05-01T12:00:30Z")
    for seen, expected in [(T0 + 30.4567, T0 + 30.457), (T0 + 95.0, T0 + 30.999), (T0 + 29.0, T0 + 30)]:
        job = job_from_body(created, Policy(), seen)
        assert isinstance(job, Job)
        assert job.submitted_at == pytest.approx(expected), seen


def test_a_written_submitted_at_wins_over_the_first_sight():
    """Issue 17: after a restart, two jobs of the same second keep the order the live operator gave them."""
    written = {
        **body({"model": "m"}, created="2024-05-01T12:00:30Z"),
        "status": {"submittedAt": "2024-05-01T12:00:30.250Z"},
    }
    job = job_from_body(written, Policy(), T0 + 500)
    assert isinstance(job, Job)
    assert job.submitted_at == pytest.approx(T0 + 30.25)


def test_without_a_creation_timestamp_the_first_sight_is_the_submission():
    job = job_from_body(body({"model": "m"}, created=None), Policy(), T0 + 1.5)
    assert isinstance(job, Job)
    assert job.submitted_at == T0 + 1.5


def test_expected_run_seconds_is_carried_as_a_float():
    job = job_from_body(body({"model": "m", "expectedRunSeconds": 90}), Policy(), T0)
    assert isinstance(job, Job)
    assert job.expected_run_seconds == 90.0
    assert isinstance(job.expected_run_seconds, float)


def test_expected_run_seconds_zero_is_kept_not_dropped():
    job = job_from_body(body({"model": "m", "expectedRunSeconds": 0}), Policy(), T0)
    assert isinstance(job, Job)
    assert job.expected_run_seconds == 0.0


def test_tier_known_only_to_a_custom_policy_is_accepted():
    policy = Policy.model_validate({"tierBonus": {"free": 0, "gold": 5}})
    job = job_from_body(body({"model": "m", "tier": "gold"}), policy, T0)
    assert isinstance(job, Job)
    assert job.tier == "gold"


def test_priority_inside_custom_bounds_is_accepted():
    policy = Policy.model_validate({"priorityBounds": {"min": -5000, "max": 5000}})
    job = job_from_body(body({"model": "m", "priority": 5000}), policy, T0)
    assert isinstance(job, Job)
    assert job.priority == 5000


# -- job_from_body: refused --------------------------------------------------------------------


def test_missing_model_is_an_invalid_spec_naming_the_field():
    r = refusal({"priority": 5})
    assert r.reason == "InvalidSpec"
    assert "spec.model" in r.message
    assert "required" in r.message.lower()


def test_missing_spec_is_an_invalid_spec_naming_the_model():
    r = job_from_body({"metadata": {"name": "j", "namespace": "ns"}}, Policy(), T0)
    assert isinstance(r, Refusal)
    assert r.reason == "InvalidSpec"
    assert "spec.model" in r.message


@pytest.mark.parametrize("model", ["Llama_3", "UPPER", "-leading", "trailing-", "has space", ""])
def test_bad_model_name_is_an_invalid_spec_naming_the_field(model):
    r = refusal({"model": model})
    assert r.reason == "InvalidSpec"
    assert r.message.startswith("spec.model: ")


def test_unknown_field_is_an_invalid_spec_naming_it():
    r = refusal({"model": "m", "maxRunSecs": 30})
    assert r.reason == "InvalidSpec"
    assert "spec.maxRunSecs" in r.message
    assert "not permitted" in r.message


def test_max_run_seconds_zero_is_an_invalid_spec_naming_the_field():
    r = refusal({"model": "m", "maxRunSeconds": 0})
    assert r.reason == "InvalidSpec"
    assert "spec.maxRunSeconds" in r.message
    assert "greater than or equal to 1" in r.message


def test_nested_field_path_is_dotted():
    r = refusal({"model": "m", "request": {"path": "not-v1"}})
    assert r.reason == "InvalidSpec"
    assert "spec.request.path" in r.message


def test_several_problems_are_all_reported_on_one_line():
    r = refusal({"maxRunSeconds": 0, "bogus": 1})
    assert r.reason == "InvalidSpec"
    assert "\n" not in r.message
    for path in ("spec.model", "spec.maxRunSeconds", "spec.bogus"):
        assert path in r.message
    assert r.message.count("; ") == 2


def test_unknown_priority_word_is_an_invalid_priority():
    r = refusal({"model": "m", "priority": "urgent"})
    assert r.reason == "InvalidPriority"
    assert "'urgent'" in r.message
    assert "interactive" in r.message and "batch" in r.message


@pytest.mark.parametrize("priority", [5000, "5000", -1001, "1001"])
def test_priority_outside_default_bounds_is_refused_with_the_bounds(priority):
    r = refusal({"model": "m", "priority": priority})
    assert r.reason == "PriorityOutOfBounds"
    assert str(int(priority)) in r.message
    assert "[-1000, 1000]" in r.message


def test_huge_priority_saturates_and_is_refused_out_of_bounds_not_crashing():
    r = refusal({"model": "m", "priority": "9" * 40})
    assert r.reason == "PriorityOutOfBounds"
    assert "[-1000, 1000]" in r.message


def test_priority_bounds_in_the_message_follow_the_policy():
    policy = Policy.model_validate({"priorityBounds": {"min": -10, "max": 10}})
    r = refusal({"model": "m", "priority": "interactive"}, policy)
    assert r.reason == "PriorityOutOfBounds"
    assert "priority 100" in r.message
    assert "[-10, 10]" in r.message


def test_unknown_tier_is_refused_listing_the_known_tiers():
    r = refusal({"model": "m", "tier": "gold"})
    assert r.reason == "UnknownTier"
    assert "'gold'" in r.message
    assert "free, max, pro" in r.message


def test_priority_is_checked_before_the_tier():
    r = refusal({"model": "m", "priority": "urgent", "tier": "gold"})
    assert r.reason == "InvalidPriority"


def test_boolean_priority_is_refused_like_resolve_priority_refuses_it():
    result = job_from_body(body({"model": "m", "priority": True}), Policy(), T0)
    assert isinstance(result, Refusal)
    assert result.reason in ("InvalidSpec", "InvalidPriority")


# -- describe (validation errors) ------------------------------------------------------------------------


def test_describe_prefixes_each_path_with_spec():
    with pytest.raises(ValidationError) as err:
        GpuJobSpec.model_validate({"model": "m", "tier": ""})
    assert describe(err.value, "spec").startswith("spec.tier: ")


def test_describe_for_a_spec_that_is_not_an_object_names_spec_once():
    r = refusal("not-an-object")
    assert r.reason == "InvalidSpec"
    assert r.message.startswith("spec: ")
    assert "spec.spec" not in r.message


# -- parse_time / format_time ------------------------------------------------------------------


def test_parse_time_reads_rfc3339_with_z():
    assert parse_time(T0_TEXT) == T0


def test_parse_time_reads_explicit_offsets():
    assert parse_time("2024-05-01T14:00:00+02:00") == T0


def test_parse_time_reads_fractional_seconds():
    assert parse_time("2024-05-01T12:00:00.250Z") == pytest.approx(T0 + 0.25)


@pytest.mark.parametrize("text", [None, ""])
def test_parse_time_of_nothing_is_none(text):
    assert parse_time(text) is None


def test_format_time_is_utc_with_milliseconds_and_z():
    assert format_time(T0) == "2024-05-01T12:00:00.000Z"
    assert format_time(T0 + 0.123) == "2024-05-01T12:00:00.123Z"


def test_format_time_is_parseable_as_a_date_time():
    text = format_time(T0 + 3.5)
    parsed = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert parsed.tzinfo is not None
    assert parsed.utcoffset() == datetime.timedelta(0)


@pytest.mark.parametrize("seconds", [T0, T0 + 0.001, T0 + 0.123, T0 + 59.999, 0.0, 1e9 + 0.5])
def test_format_then_parse_round_trips_to_the_millisecond(seconds):
    assert parse_time(format_time(seconds)) == pytest.approx(seconds, abs=1e-3)


def test_parse_then_format_round_trips_the_text():
    text = "2024-05-01T12:00:00.123Z"
    assert format_time(parse_time(text)) == text


# -- format_duration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (59, "59s"),
        (60, "1m00s"),
        (61, "1m01s"),
        (750, "12m30s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (3700, "1h01m"),
        (11100, "3h05m"),
        (90000, "25h00m"),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_format_duration_rounds_fractions_and_clamps_negatives():
    assert format_duration(59.6) == "1m00s"
    assert format_duration(0.4) == "0s"
    assert format_duration(-5) == "0s"


# -- model_spec --------------------------------------------------------------------------------

FALLBACK = ModelSpec("*", load_seconds=111.0, run_seconds=222.0)


def gpu_model(**fields) -> GpuModelSpec:
    return GpuModelSpec.model_validate({"image": "vllm/vllm-openai:latest", **fields})


def test_model_spec_uses_the_fallback_times_without_estimates_or_status():
    spec = model_spec("m", gpu_model(), None, FALLBACK, {})
    assert spec == ModelSpec("m", max_concurrency=1, load_seconds=111.0, run_seconds=222.0)


def test_model_spec_expected_times_beat_the_fallback():
    spec = model_spec("m", gpu_model(expectedLoadSeconds=30, expectedRunSeconds=12), {}, FALLBACK, {})
    assert spec.load_seconds == 30.0
    assert spec.run_seconds == 12.0


def test_model_spec_learned_times_beat_the_expected_ones():
    status = {"loadSeconds": 41.5, "runSeconds": 7.25, "loads": 3, "runs": 10}
    spec = model_spec("m", gpu_model(expectedLoadSeconds=30, expectedRunSeconds=12), status, FALLBACK, {})
    assert spec.load_seconds == 41.5
    assert spec.run_seconds == 7.25


def test_model_spec_precedence_is_per_field():
    spec = model_spec("m", gpu_model(expectedRunSeconds=12), {"loadSeconds": 41.5}, FALLBACK, {})
    assert spec.load_seconds == 41.5  # learned
    assert spec.run_seconds == 12.0  # expected


def test_model_spec_learned_zero_is_a_value_not_missing():
    spec = model_spec("m", gpu_model(expectedLoadSeconds=30), {"loadSeconds": 0}, FALLBACK, {})
    assert spec.load_seconds == 0.0


def test_model_spec_expected_zero_beats_the_fallback():
    spec = model_spec("m", gpu_model(expectedRunSeconds=0), None, FALLBACK, {})
    assert spec.run_seconds == 0.0


def test_model_spec_carries_name_and_max_concurrency():
    spec = model_spec("llama", gpu_model(maxConcurrency=8), None, FALLBACK, {})
    assert spec.name == "llama"
    assert spec.max_concurrency == 8


def test_model_spec_times_are_floats():
    spec = model_spec("m", gpu_model(expectedLoadSeconds=30), {"runSeconds": 5}, FALLBACK, {})
    assert isinstance(spec.load_seconds, float)
    assert isinstance(spec.run_seconds, float)


# -- band_label --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("priority", "label"),
    [(-100, "-100"), (-51, "-100"), (-50, "0"), (0, "0"), (49, "0"), (50, "100"), (130, "100"), (1000, "1000")],
)
def test_band_label_is_the_band_centre_with_default_spacing(priority, label):
    assert band_label(priority, Policy()) == label


def test_band_label_follows_the_policy_spacing():
    policy = Policy.model_validate({"bandSpacing": 200})
    assert band_label(130, policy) == "200"
    assert band_label(99, policy) == "0"


# -- score_fields ------------------------------------------------------------------------------


def test_score_fields_rounds_aging_and_total_to_two_decimals():
    score = ScoreBreakdown(priority=100, tier=1, affinity=10, aging=1.23456)
    fields = score_fields(score)
    assert fields == {"priority": 100, "tier": 1, "affinity": 10, "aging": 1.23, "total": 112.23}


def test_score_fields_with_a_negative_total_keeps_integer_terms():
    score = ScoreBreakdown(priority=-100, tier=0, affinity=0, aging=0.6789)
    fields = score_fields(score)
    assert fields["aging"] == 0.68
    assert fields["total"] == -99.32
    assert fields["priority"] == -100
    assert set(fields) == {"priority", "tier", "affinity", "aging", "total"}


def test_model_spec_pins_the_lanes_its_selector_matches():
    labels = {"gpu-0": {"gpu": "a100"}, "gpu-1": {"gpu": "l4"}, "gpu-2": {"gpu": "a100", "pool": "research"}}
    pinned = gpu_model(laneSelector={"matchLabels": {"gpu": "a100"}})
    assert model_spec("m", pinned, None, FALLBACK, labels).lanes == {"gpu-0", "gpu-2"}
    research = gpu_model(
        laneSelector={"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["research"]}]}
    )
    assert model_spec("m", research, None, FALLBACK, labels).lanes == {"gpu-0", "gpu-1"}
    assert model_spec("m", gpu_model(), None, FALLBACK, labels).lanes is None  # no selector: any lane
    nothing = gpu_model(laneSelector={"matchLabels": {"gpu": "h100"}})
    assert model_spec("m", nothing, None, FALLBACK, labels).lanes == frozenset()  # its jobs wait


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({"matchExpressions": [{"key": "gpu", "operator": "In"}]}, "In needs values"),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists", "values": ["x"]}]}, "Exists takes no values"),
        ({"matchExpressions": [{"key": "gpu", "operator": "Near", "values": ["x"]}]}, "operator"),
    ],
)
def test_a_bad_lane_selector_is_refused(selector, message):
    with pytest.raises(ValidationError, match=message):
        gpu_model(laneSelector=selector)
