import pytest
from pydantic import ValidationError

from gpulane.core.policy import Policy, PolicyError


def test_defaults_follow_the_brief():
    policy = Policy()
    assert policy.tier_bonus == {"free": 0, "pro": 1, "max": 2}
    assert policy.affinity_bonus == 10
    assert policy.aging_divisor_seconds == 60
    assert policy.band_spacing == 100


def test_camel_case_fields_as_in_yaml():
    policy = Policy.model_validate({"agingDivisorSeconds": 30, "affinityBonus": 5, "tierBonus": {"a": 0, "b": 3}})
    assert policy.aging_divisor_seconds == 30
    assert policy.bonus_for_tier("b") == 3


def test_invariant_violation_is_rejected_with_the_numbers():
    with pytest.raises(ValidationError) as err:
        Policy.model_validate({"bandSpacing": 40, "affinityBonus": 10})
    message = str(err.value)
    assert "bandSpacing 40 is too small" in message
    assert "2 + 10 = 12" in message
    assert "(48)" in message


def test_spacing_must_exceed_the_offsets_even_when_large_tiers_are_configured():
    with pytest.raises(ValidationError, match="bandSpacing 100 is too small"):
        Policy.model_validate({"tierBonus": {"free": 0, "max": 30}})
    Policy.model_validate({"tierBonus": {"free": 0, "max": 15}})  # 15 + 10 = 25, 4 x 25 = 100: accepted


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"tierBonus": {}}, "at least one tier"),
        ({"tierBonus": {"free": -1}}, "must be >= 0"),
        ({"agingDivisorSeconds": 0}, "greater than 0"),
        ({"affinityBonus": -1}, "greater than or equal to 0"),
        ({"priorityBounds": {"min": 5, "max": -5}}, "greater than priorityBounds.max"),
        ({"agingDivisor": 60}, "Extra inputs are not permitted"),
    ],
)
def test_bad_policies_are_rejected(raw, message):
    with pytest.raises(ValidationError, match=message):
        Policy.model_validate(raw)


def test_unknown_tier_is_a_clear_error():
    with pytest.raises(PolicyError, match="unknown tier 'gold'; this policy knows free, max, pro"):
        Policy().bonus_for_tier("gold")


def test_priorities_outside_the_bounds_are_refused_with_the_bounds():
    policy = Policy.model_validate({"priorityBounds": {"min": -200, "max": 100}})
    assert policy.check_priority(100) == 100
    with pytest.raises(PolicyError, match=r"priority 101 is outside this policy's bounds \[-200, 100\]"):
        policy.check_priority(101)
    with pytest.raises(PolicyError, match=r"priority about 10\^18 is outside"):
        policy.check_priority(10**18)
    with pytest.raises(PolicyError, match="must be an integer, got bool"):
        policy.check_priority(True)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), "inf"])
def test_non_finite_aging_divisor_is_rejected(value):
    with pytest.raises(ValidationError, match="finite number"):
        Policy.model_validate({"agingDivisorSeconds": value})
